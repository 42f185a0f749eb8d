"""How far from uniform the shipped policies' NAC attention is, while they drive, and the
range of its logits in each mode.

    python benchmarks/attention_entropy.py                  # CarRacing (1 track) and Udacity (emulator)
    python benchmarks/attention_entropy.py --frames 300 --json
    python benchmarks/attention_entropy.py --policy RUN/best  # also a trained CarRacing checkpoint (e.g. mode steady)

In mode exact every logit lies in (0, 1), so the weights a query gives its selected
keys differ by less than a factor e; this measures what that leaves. Each shipped
policy drives with ``--trace`` (CarRacing: the first held-out track; Udacity: the
headless emulator on the lakeside track through the bridge), and for every traced
step and head the entropy of the weights is divided by its maximum, log(selected
keys): 1 is uniform. Printed beside it, as the reference: the same ratio for weights
whose logits are spread over the widest interval exact mode allows, (0, 1) evenly.

Then the traced frames are replayed through each policy with its layer in each mode
(exact, euler, steady: the modes share the parameters), and per mode the logits' 1st-99th
percentile and each query's spread (its largest logit minus its smallest: the weights'
largest ratio is e to that power) are printed: median, 95th percentile, largest.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from bridge_process import free_port, start_listening


def carracing_trace(folder: Path, frames: int) -> Path:
    from nac_drive.pipeline.drive import DriveArgs, drive_carracing

    return Path(drive_carracing(DriveArgs(episodes=1, max_steps=frames, trace=str(folder / "carracing")),
                                progress=False)["trace"])


def udacity_trace(folder: Path, frames: int) -> Path:
    from nac_drive.simulators.udacity_emulator import EmulatorConfig, run_emulator

    port, run = free_port(), folder / "udacity"
    bridge = start_listening([sys.executable, "-m", "nac_drive.cli", "drive", "udacity", "--port", str(port),
                              "--trace", str(run)], port, stdout=subprocess.DEVNULL)
    try:
        run_emulator(EmulatorConfig(port=port, frames=frames, track="lakeside"))
    finally:
        bridge.send_signal(signal.SIGINT)          # the bridge writes its trace when it stops
        bridge.wait(timeout=120)
    return run


def summarise(run: Path) -> dict:
    from nac_drive.interpret.trace import load_trace

    trace = load_trace(run)
    entropy = trace.attention_entropy()
    ratio = np.nanmax(np.where(trace.key_step >= 0, trace.weights, np.nan), axis=-1) / np.nanmin(
        np.where(trace.key_step >= 0, trace.weights, np.nan), axis=-1)
    keys = int((trace.key_step >= 0).sum(-1).max())
    return {"steps": trace.num_steps, "keys": keys, "mode": trace.metadata["nac"]["mode"],
            "entropy_median": float(np.nanmedian(entropy)), "entropy_p5": float(np.nanpercentile(entropy, 5)),
            "entropy_min": float(np.nanmin(entropy)), "max_weight_ratio": float(np.nanmax(ratio))}


def mode_ranges(policy, run: Path) -> dict:
    """Per mode: the logits' 1st/99th percentile and each query's spread (median, p95, max),
    over the traced frames of ``run`` replayed through ``policy`` (queries with >= 2 keys)."""
    import torch
    from nac_drive.interpret.neuron_atlas import PolicyReplay
    from nac_drive.interpret.trace import load_trace

    replay = PolicyReplay(policy, load_trace(run))
    nac, before = policy.core.nac, policy.core.nac.mode
    out = {}
    try:
        for mode in ("exact", "euler", "steady"):
            nac.mode = mode
            try:
                with torch.inference_mode():
                    _, trace = nac(replay.features, replay.times, return_trace=True)
            except ValueError as e:   # euler past its stability limit says so
                out[mode] = {"error": str(e)}
                continue
            valid = (trace.topk_idx >= 0) & replay.valid[:, None, :, None]
            logits = trace.logits.masked_fill(~valid, float("nan")).numpy()
            spread = np.nanmax(logits, -1) - np.nanmin(logits, -1)
            spread = spread[valid.sum(-1).numpy() >= 2]
            out[mode] = {"logit_p1": float(np.nanpercentile(logits, 1)), "logit_p99": float(np.nanpercentile(logits, 99)),
                         "spread_median": float(np.median(spread)), "spread_p95": float(np.percentile(spread, 95)),
                         "spread_max": float(spread.max())}
    finally:
        nac.mode = before
    return out


def widest_reference(keys: int) -> float:
    """Entropy / log K of weights whose logits are spread evenly over (0, 1)."""
    w = np.exp(np.linspace(0, 1, keys))
    w /= w.sum()
    return float(-(w * np.log(w)).sum() / np.log(keys))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", type=int, default=400, help="frames each policy drives")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of text")
    p.add_argument("--policy", action="append", default=[], help="also this CarRacing checkpoint (repeatable)")
    args = p.parse_args()

    import torch
    from nac_drive.policy.loading import load_driving_policy

    torch.set_num_threads(1)
    results, ranges = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        runs = {"carracing": carracing_trace(Path(tmp), args.frames), "udacity": udacity_trace(Path(tmp), args.frames)}
        policies = {"carracing": load_driving_policy(None), "udacity": load_driving_policy(None, task="udacity")}
        for path in args.policy:
            policies[path] = load_driving_policy(path)
            runs[path] = runs["carracing"]   # the same frames
        for name, run in runs.items():
            if name in ("carracing", "udacity"):
                results[name] = summarise(run)
            ranges[name] = mode_ranges(policies[name], run)
    for r in results.values():
        r["widest_spread_reference"] = widest_reference(r["keys"])
    if args.json:
        print(json.dumps({**results, "logit_ranges": ranges}))
        return 0
    print("| shipped policy | traced steps | keys | mode | entropy / log K: median | 5th pct | min "
          "| largest weight ratio | reference: logits spread evenly over (0, 1) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['steps']} | {r['keys']} | {r['mode']} | {r['entropy_median']:.4f} | "
              f"{r['entropy_p5']:.4f} | {r['entropy_min']:.4f} | {r['max_weight_ratio']:.3f} | "
              f"{r['widest_spread_reference']:.4f} |")
    print("\n| policy | mode | logits p1 - p99 | a query's spread: median | p95 | max | largest weight ratio |")
    print("|---|---|---|---|---|---|---|")
    for name, modes in ranges.items():
        for mode, r in modes.items():
            if "error" in r:
                print(f"| {name} | {mode} | {r['error']} | | | | |")
                continue
            print(f"| {name} | {mode} | {r['logit_p1']:.3f} - {r['logit_p99']:.3f} | {r['spread_median']:.3f} | "
                  f"{r['spread_p95']:.3f} | {r['spread_max']:.3f} | {np.exp(r['spread_max']):.3g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
