"""Udacity bridge latency: telemetry -> steer round trip, as the simulator sees it.

    python benchmarks/udacity_latency.py                       # trivial policy (steer 0)
    python benchmarks/udacity_latency.py --policy nac_drive.agents.udacity_scripted:LaneMarkingPolicy
    python benchmarks/udacity_latency.py --policy my.module:make_policy --frames 2000 --json

The bridge runs in its own process (one OS thread: eventlet green threads; torch limited to
one thread) with the policy built by ``--policy module:callable``. The headless emulator
sends real 320x160 JPEG frames of a procedural road over a websocket on 127.0.0.1, one in
flight at a time (``single_chain``, so the time the emulator spends rendering is not
counted), and measures send -> steer received. Reported: p50/p95 of that round trip, and
the bridge's own handler time (telemetry arrival -> steer emitted: decode + policy +
speed control), after ``--warmup`` frames.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
from bridge_process import free_port, start_listening
from support_path import SUPPORT


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", default="nac_drive.agents.udacity_scripted:ConstantPolicy")
    p.add_argument("--frames", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--track", default="lakeside")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of text")
    args = p.parse_args()

    from nac_drive.simulators.udacity_emulator import EmulatorConfig, run_emulator

    port = free_port()
    bridge = start_listening([sys.executable, str(SUPPORT / "bridge_main.py"), "--policy", args.policy,
                              "--port", str(port), "--json", "--exit-on-disconnect"], port)
    report = run_emulator(EmulatorConfig(port=port, track=args.track, frames=args.frames + args.warmup,
                                         single_chain=True, answer_timeout=30))
    out, _ = bridge.communicate(timeout=60)
    server = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    rt = np.array(report.round_trip_ms[args.warmup:])
    result = {
        "policy": args.policy,
        "frames": int(rt.size),
        "round_trip_ms_p50": round(float(np.percentile(rt, 50)), 3),
        "round_trip_ms_p95": round(float(np.percentile(rt, 95)), 3),
        "bridge_handler_ms_p50": server["latency_ms_p50"],
        "bridge_handler_ms_p95": server["latency_ms_p95"],
        "answered": server["answered"],
        "messages": server["messages"],
        "policy_errors": server["policy_errors"],
    }
    if server["policy_errors"]:
        raise SystemExit(f"the policy failed on {server['policy_errors']} frames: the figures are not its latency")
    if args.json:
        print(json.dumps(result))
    else:
        print(f"policy {args.policy}: telemetry -> steer round trip p50 {result['round_trip_ms_p50']} ms, "
              f"p95 {result['round_trip_ms_p95']} ms over {result['frames']} frames; bridge handler p50 "
              f"{result['bridge_handler_ms_p50']} ms (answered {server['answered']}/{server['messages']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
