"""How far from uniform the shipped policies' NAC attention is, while they drive.

    python benchmarks/attention_entropy.py                  # CarRacing (1 track) and Udacity (emulator)
    python benchmarks/attention_entropy.py --frames 300 --json

In mode exact every logit lies in (0, 1), so the weights a query gives its selected
keys differ by less than a factor e; this measures what that leaves. Each shipped
policy drives with ``--trace`` (CarRacing: the first held-out track; Udacity: the
headless emulator on the lakeside track through the bridge), and for every traced
step and head the entropy of the weights is divided by its maximum, log(selected
keys): 1 is uniform. Printed beside it, as the reference: the same ratio for weights
whose logits are spread over the widest interval exact mode allows, (0, 1) evenly.
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


def widest_reference(keys: int) -> float:
    """Entropy / log K of weights whose logits are spread evenly over (0, 1)."""
    w = np.exp(np.linspace(0, 1, keys))
    w /= w.sum()
    return float(-(w * np.log(w)).sum() / np.log(keys))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", type=int, default=400, help="frames each policy drives")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of text")
    args = p.parse_args()

    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        results = {"carracing": summarise(carracing_trace(Path(tmp), args.frames)),
                   "udacity": summarise(udacity_trace(Path(tmp), args.frames))}
    for r in results.values():
        r["widest_spread_reference"] = widest_reference(r["keys"])
    if args.json:
        print(json.dumps(results))
        return 0
    print("| shipped policy | traced steps | keys | mode | entropy / log K: median | 5th pct | min "
          "| largest weight ratio | reference: logits spread evenly over (0, 1) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['steps']} | {r['keys']} | {r['mode']} | {r['entropy_median']:.4f} | "
              f"{r['entropy_p5']:.4f} | {r['entropy_min']:.4f} | {r['max_weight_ratio']:.3f} | "
              f"{r['widest_spread_reference']:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
