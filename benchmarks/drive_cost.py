"""What ``--video`` or ``--trace`` costs a drive: the same drive with and without it, side by side.

    python benchmarks/drive_cost.py --add video             # drive carracing --episodes 3 --trace, +- --video
    python benchmarks/drive_cost.py --add trace --episodes 20 --rounds 1 --json   # drive carracing, +- --trace

Each round runs the drive without the option and the same command with it (``--add video``:
``nac-drive drive carracing --episodes N --trace RUN_DIR`` and ``--video RUN_DIR.webm`` added;
``--add trace``: ``nac-drive drive carracing --episodes N`` and ``--trace RUN_DIR`` added), each
in a fresh process (one torch thread, as drive sets), the order alternating from round to round
so that a change in the machine's load falls on both alike. Per command: the wall time and the
CPU time (user + system, all its threads) of the process, start-up included; min and median of
the rounds, and the ratio with / without. The load average before and after says how busy the
machine was. Goals (issue 43): with video <= 1.25x, with trace <= 1.10x.
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


def drive_command(episodes: int, run_dir: Path, add: str, added: bool) -> list[str]:
    """The ``nac-drive drive carracing`` command line, with the option ``add`` when ``added``."""
    command = ["nac-drive", "drive", "carracing", "--episodes", str(episodes)]
    if add == "video":
        return command + ["--trace", str(run_dir)] + (["--video", f"{run_dir}.webm"] if added else [])
    return command + (["--trace", str(run_dir)] if added else [])


def timed(command: list[str]) -> tuple[float, float]:
    """Run ``command`` (``nac-drive`` as ``python -m nac_drive.cli``, from outside the checkout, whose
    folders ``-m`` would otherwise import) -> (wall s, CPU s of the process)."""
    argv = [sys.executable, "-m", "nac_drive.cli", *command[1:]]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tempfile.gettempdir())
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(episodes: int, rounds: int, add: str, tmp: Path) -> dict[str, dict[str, list[float]]]:
    """{"plain" | "with": {"wall": [s per round], "cpu": [s per round]}}, alternating the order."""
    out = {name: {"wall": [], "cpu": []} for name in ("plain", "with")}
    for r in range(rounds):
        for name in (("plain", "with") if r % 2 == 0 else ("with", "plain")):
            wall, cpu = timed(drive_command(episodes, tmp / f"run-{r}-{name}", add, name == "with"))
            out[name]["wall"].append(wall)
            out[name]["cpu"].append(cpu)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--add", choices=("video", "trace"), default="video", help="the option whose cost is measured")
    p.add_argument("--episodes", type=int, default=3, help="tracks per drive")
    p.add_argument("--rounds", type=int, default=3, help="drives of each command, alternating")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        times = measure(args.episodes, args.rounds, args.add, Path(tmp))
    load = {"before": load_before, "after": os.getloadavg()[0], "cpus": os.cpu_count()}
    summary = {name: {f"{kind}_{stat}": fn(values) for kind, values in t.items()
                      for stat, fn in (("min", min), ("median", statistics.median))}
               for name, t in times.items()}
    ratios = {key: summary["with"][key] / summary["plain"][key] for key in summary["plain"]}
    if args.json:
        print(json.dumps({"times": times, "summary": summary, "ratio": ratios, "load": load}))
        return 0
    print(f"{args.rounds} rounds, alternating; load average {load['before']:.2f} before, {load['after']:.2f} "
          f"after, {load['cpus']} CPUs")
    for name in ("plain", "with"):
        command = " ".join(drive_command(args.episodes, Path("RUN_DIR"), args.add, name == "with"))
        s = summary[name]
        print(f"  {command}\n    wall min {s['wall_min']:6.1f} s  median {s['wall_median']:6.1f} s   "
              f"CPU min {s['cpu_min']:6.1f} s  median {s['cpu_median']:6.1f} s")
    print(f"  with / without {args.add}: wall {ratios['wall_min']:.2f}x (min), {ratios['wall_median']:.2f}x (median); "
          f"CPU {ratios['cpu_min']:.2f}x (min), {ratios['cpu_median']:.2f}x (median)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
