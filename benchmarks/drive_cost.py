"""What ``--video`` or ``--trace`` costs a drive: the same drive with and without it, side by side.

    python benchmarks/drive_cost.py --add trace --episodes 20              # per track, in one process
    python benchmarks/drive_cost.py --add video --episodes 5
    python benchmarks/drive_cost.py --add trace --episodes 20 --method processes --rounds 2

Two methods:

* ``tracks`` (default): one process drives every track twice, without and with the option,
  one right after the other (the order alternating from track to track), through the same
  runner ``nac-drive drive`` uses. What the option costs is the sum of the times with it over
  the sum without, and each track's ratio; a change in the machine's speed falls on both
  drives of a track alike. ``--add trace``: the plain driver against one with the trace
  recorder (frames, NAC traces, the teacher's labels; one recording across all its tracks,
  as ``drive --trace`` makes). ``--add video``: a traced driver against the same with each
  track's video written (one WebM a track).
* ``processes``: the whole commands, each in a fresh process (one torch thread, as drive
  sets), order alternating from round to round: ``--add video``: ``nac-drive drive carracing
  --episodes N --trace RUN_DIR`` and ``--video RUN_DIR.webm`` added; ``--add trace``: ``nac-drive
  drive carracing --episodes N`` and ``--trace RUN_DIR`` added. Start-up included, min and
  median of the rounds. On this 2-core VM one command's time varies by +-20% from run to run
  (a 6-track drive took 28.4, 39.5 and 35.3 s), so the ratio of two needs many rounds.

Per drive: the wall time and the process's CPU time (all its threads). The load average
before and after says how busy the machine was. Goals (issue 43): with video <= 1.25x, with
trace <= 1.10x.
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


# ------------------------------------------------------------------------ per track
def per_track(add: str, episodes: int, tmp: Path) -> dict[str, dict[str, list[float]]]:
    """{"plain" | "with": {"wall": [s per track], "cpu": [s per track]}}: each held-out track
    driven without and with ``add``, adjacent in time, the order alternating."""
    import torch

    from nac_drive.agents.driver import PolicyDriver
    from nac_drive.policy.loading import load_driving_policy
    from nac_drive.agents.teacher import PurePursuitTeacher
    from nac_drive.pipeline.drive import policy_recorder
    from nac_drive.simulators.carracing import ACTION_NAMES, eval_seeds, make_carracing, run_episodes

    torch.set_num_threads(1)
    policy = load_driving_policy()
    env = make_carracing(continuous=False)

    def traced_driver(run_dir: Path) -> PolicyDriver:
        recorder = policy_recorder(run_dir, policy, None, "CarRacing-v3", list(ACTION_NAMES))
        return PolicyDriver(policy, recorder=recorder, oracle=PurePursuitTeacher(continuous=False))

    if add == "trace":
        drivers = {"plain": PolicyDriver(policy), "with": traced_driver(tmp / "run-with")}
    else:   # video: both traced, as drive --trace with and without --video
        drivers = {"plain": traced_driver(tmp / "run-plain"), "with": traced_driver(tmp / "run-with")}
    run_episodes(drivers["plain"], [1], env=env, max_steps=50)   # warm: numba's cache, first allocations
    out = {name: {"wall": [], "cpu": []} for name in drivers}
    for i, seed in enumerate(eval_seeds(episodes)):
        for name in (("plain", "with") if i % 2 == 0 else ("with", "plain")):
            driver = drivers[name]
            video = tmp / f"track-{i}.webm" if add == "video" and name == "with" else None
            on_step = driver.on_step if driver.recorder is not None else None
            wall, cpu = time.perf_counter(), time.process_time()
            run_episodes(driver, [seed], env=env, on_step=on_step, video_path=video)
            if i == episodes - 1 and driver.recorder is not None:
                driver.recorder.save()   # the last chunk, as drive waits for it
            out[name]["wall"].append(time.perf_counter() - wall)
            out[name]["cpu"].append(time.process_time() - cpu)
    return out


def per_track_summary(times: dict[str, dict[str, list[float]]]) -> dict:
    """Sums and ratios (with / without) of the per-track times."""
    out = {}
    for kind in ("wall", "cpu"):
        plain, added = times["plain"][kind], times["with"][kind]
        out[f"{kind}_plain_s"], out[f"{kind}_with_s"] = sum(plain), sum(added)
        out[f"{kind}_ratio"] = sum(added) / sum(plain)
        out[f"{kind}_ratio_track_median"] = statistics.median(b / a for a, b in zip(plain, added))
    return out


# ------------------------------------------------------------------------ processes
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


def processes(episodes: int, rounds: int, add: str, tmp: Path) -> dict[str, dict[str, list[float]]]:
    """{"plain" | "with": {"wall": [s per round], "cpu": [s per round]}}, alternating the order."""
    out = {name: {"wall": [], "cpu": []} for name in ("plain", "with")}
    for r in range(rounds):
        for name in (("plain", "with") if r % 2 == 0 else ("with", "plain")):
            wall, cpu = timed(drive_command(episodes, tmp / f"run-{r}-{name}", add, name == "with"))
            out[name]["wall"].append(wall)
            out[name]["cpu"].append(cpu)
    return out


def processes_summary(times: dict[str, dict[str, list[float]]]) -> dict:
    """Min and median of the rounds, and their ratios (with / without)."""
    summary = {name: {f"{kind}_{stat}": fn(values) for kind, values in t.items()
                      for stat, fn in (("min", min), ("median", statistics.median))}
               for name, t in times.items()}
    summary["ratio"] = {key: summary["with"][key] / summary["plain"][key] for key in summary["plain"]}
    return summary


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--add", choices=("video", "trace"), default="trace", help="the option whose cost is measured")
    p.add_argument("--episodes", type=int, default=20, help="held-out tracks of each drive")
    p.add_argument("--method", choices=("tracks", "processes"), default="tracks",
                   help="each track twice in one process, or whole commands in fresh processes")
    p.add_argument("--rounds", type=int, default=3, help="--method processes: drives of each command, alternating")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        if args.method == "tracks":
            times = per_track(args.add, args.episodes, Path(tmp))
            summary = per_track_summary(times)
        else:
            times = processes(args.episodes, args.rounds, args.add, Path(tmp))
            summary = processes_summary(times)
    load = {"before": load_before, "after": os.getloadavg()[0], "cpus": os.cpu_count()}
    if args.json:
        print(json.dumps({"method": args.method, "add": args.add, "times": times, "summary": summary, "load": load}))
        return 0
    print(f"--add {args.add}, {args.episodes} tracks, method {args.method}; load average {load['before']:.2f} "
          f"before, {load['after']:.2f} after, {load['cpus']} CPUs")
    if args.method == "tracks":
        s = summary
        print(f"  wall: without {s['wall_plain_s']:.1f} s, with {s['wall_with_s']:.1f} s: {s['wall_ratio']:.3f}x "
              f"(median of the tracks' ratios {s['wall_ratio_track_median']:.3f}x)\n"
              f"  CPU:  without {s['cpu_plain_s']:.1f} s, with {s['cpu_with_s']:.1f} s: {s['cpu_ratio']:.3f}x "
              f"(median of the tracks' ratios {s['cpu_ratio_track_median']:.3f}x)")
        return 0
    for name in ("plain", "with"):
        command = " ".join(drive_command(args.episodes, Path("RUN_DIR"), args.add, name == "with"))
        s = summary[name]
        print(f"  {command}\n    wall min {s['wall_min']:6.1f} s  median {s['wall_median']:6.1f} s   "
              f"CPU min {s['cpu_min']:6.1f} s  median {s['cpu_median']:6.1f} s")
    ratio = summary["ratio"]
    print(f"  with / without {args.add}: wall {ratio['wall_min']:.2f}x (min), {ratio['wall_median']:.2f}x (median); "
          f"CPU {ratio['cpu_min']:.2f}x (min), {ratio['cpu_median']:.2f}x (median)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
