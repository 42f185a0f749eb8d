"""What keeping a training step's large buffers (``nac_drive.allocator``) is worth, as a user meets
it: ``nac-drive train`` on the same demonstrations, by default against ``NAC_DRIVE_KEEP_BUFFERS=0``
(glibc's own thresholds), in fresh processes alternating round by round.

    python benchmarks/train_allocator.py               # a markdown table (its figures: BENCHMARKS.md §2)
    python benchmarks/train_allocator.py --data runs/demos --rounds 3

Without ``--data``: 8 synthetic CarRacing episodes of 400 frames (tests/support's bands). Each
run trains one epoch of ``--windows`` windows (batches of 32 windows x 16 frames) on every core;
the table gives its training frames a second (``metrics.csv``), its wall time (startup, data and
validation included) and its peak RSS, each the median of the rounds, and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import support_path  # noqa: F401  (tests/support: synthetic demonstrations)
from demos import synthetic_episodes
from nac_drive.data_collection.carracing_dataset import write_dataset

# `nac-drive train` in this process, then the process's peak RSS (KiB) and wall seconds on one line.
_RUN = """
import resource, sys, time
from nac_drive.cli.main import main
start = time.perf_counter()
try:
    main(["train", *sys.argv[1:]])
except SystemExit as end:
    if end.code:
        raise
print("PEAK", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter() - start)
"""


def run(data: Path, out: Path, windows: int, keep: bool) -> dict[str, float]:
    env = {**os.environ, "NAC_DRIVE_KEEP_BUFFERS": "1" if keep else "0"}
    done = subprocess.run([sys.executable, "-c", _RUN, "--data", str(data), "--out", str(out), "--epochs", "1",
                           "--windows-per-epoch", str(windows), "--val-windows", "256", "--no-progress", "--json"],
                          env=env, capture_output=True, text=True, check=True).stdout.splitlines()
    summary = json.loads(next(line for line in done if line.startswith("{")))
    _, peak_kib, wall = next(line for line in done if line.startswith("PEAK")).split()
    return {"frames/s": summary["best_epoch"]["frames_per_s"], "wall s": float(wall), "peak RSS MB": int(peak_kib) / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="a Minari dataset folder (default: synthetic episodes)")
    parser.add_argument("--windows", type=int, default=1536, help="windows in the one epoch")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data
        if data is None:
            data = Path(tmp) / "demos"
            write_dataset(data, "synthetic", synthetic_episodes(n_episodes=8, length=400), "CarRacing-v3",
                          expert="bands", description="benchmark")
        figures = {True: [], False: []}
        for r in range(args.rounds):
            for keep in ((True, False) if r % 2 == 0 else (False, True)):
                figures[keep].append(run(data, Path(tmp) / f"runs-{keep}-{r}", args.windows, keep))
    print(f"| `nac-drive train`, one epoch of {args.windows} windows (median of {args.rounds} rounds) | frames/s | "
          f"wall s | peak RSS MB |\n|---|---|---|---|")
    medians = {keep: {k: statistics.median(f[k] for f in runs) for k in runs[0]} for keep, runs in figures.items()}
    for keep, name in ((False, "glibc's thresholds (`NAC_DRIVE_KEEP_BUFFERS=0`)"), (True, "large buffers kept (default)")):
        print(f"| {name} | " + " | ".join(f"{v:.0f}" if k != "wall s" else f"{v:.1f}" for k, v in medians[keep].items())
              + " |")
    print("| kept / glibc's | " + " | ".join(f"{medians[True][k] / medians[False][k]:.2f}x" for k in medians[True])
          + " |")


if __name__ == "__main__":
    main()
