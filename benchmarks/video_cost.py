"""What ``--video`` costs a drive: the same drive with and without it, side by side.

    python benchmarks/video_cost.py                         # drive carracing --episodes 3 --trace, 3 rounds
    python benchmarks/video_cost.py --episodes 1 --rounds 5 --json

Each round runs ``nac-drive drive carracing --episodes N --trace RUN_DIR`` and the same
command with ``--video RUN_DIR.webm``, each in a fresh process (one torch thread, as drive
sets), the order alternating from round to round so that a change in the machine's load
falls on both alike. Per command: the wall time and the CPU time (user + system, all its
threads) of the process, start-up included; min and median of the rounds, and the ratio
with video / without. The load average before and after says how busy the machine was.
Goal (issue 43): with video <= 1.25x without.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def drive_command(episodes: int, run_dir: Path, video: Path | None) -> list[str]:
    """The ``nac-drive drive carracing`` command line (``--video`` when ``video``)."""
    command = ["nac-drive", "drive", "carracing", "--episodes", str(episodes), "--trace", str(run_dir)]
    return command + (["--video", str(video)] if video is not None else [])


def timed(command: list[str]) -> tuple[float, float]:
    """Run ``command`` (``nac-drive`` as ``python -m nac_drive.cli``) -> (wall s, CPU s of the process)."""
    argv = [sys.executable, "-m", "nac_drive.cli", *command[1:]]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(episodes: int, rounds: int, tmp: Path) -> dict[str, dict[str, list[float]]]:
    """{"plain" | "video": {"wall": [s per round], "cpu": [s per round]}}, alternating the order."""
    out = {name: {"wall": [], "cpu": []} for name in ("plain", "video")}
    for r in range(rounds):
        for name in (("plain", "video") if r % 2 == 0 else ("video", "plain")):
            run = tmp / f"run-{r}-{name}"
            wall, cpu = timed(drive_command(episodes, run, run.with_suffix(".webm") if name == "video" else None))
            out[name]["wall"].append(wall)
            out[name]["cpu"].append(cpu)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=3, help="tracks per drive")
    p.add_argument("--rounds", type=int, default=3, help="drives of each command, alternating")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        times = measure(args.episodes, args.rounds, Path(tmp))
    load = {"before": load_before, "after": os.getloadavg()[0], "cpus": os.cpu_count()}
    summary = {name: {f"{kind}_{stat}": fn(values) for kind, values in t.items()
                      for stat, fn in (("min", min), ("median", statistics.median))}
               for name, t in times.items()}
    ratios = {key: summary["video"][key] / summary["plain"][key] for key in summary["plain"]}
    if args.json:
        print(json.dumps({"times": times, "summary": summary, "ratio": ratios, "load": load}))
        return 0
    print(f"{args.rounds} rounds, alternating; load average {load['before']:.2f} before, {load['after']:.2f} "
          f"after, {load['cpus']} CPUs")
    for name in ("plain", "video"):
        command = " ".join(drive_command(args.episodes, Path("RUN_DIR"), Path("RUN_DIR.webm") if name == "video"
                                         else None))
        s = summary[name]
        print(f"  {command}\n    wall min {s['wall_min']:6.1f} s  median {s['wall_median']:6.1f} s   "
              f"CPU min {s['cpu_min']:6.1f} s  median {s['cpu_median']:6.1f} s")
    print(f"  with / without video: wall {ratios['wall_min']:.2f}x (min), {ratios['wall_median']:.2f}x (median); "
          f"CPU {ratios['cpu_min']:.2f}x (min), {ratios['cpu_median']:.2f}x (median)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
