"""What a DAgger round spends outside training, the old way and the new, side by side.

    python benchmarks/dagger_round.py                     # 20 demos of 1000 frames, a round of 4 tracks
    python benchmarks/dagger_round.py --demos 30 --tracks 4 --json

1. **Loading the datasets.** Each round re-trains on every dataset after adding its own
   small one. Timed: reading everything (what every round did, and the first load still
   does) against the load after a new 4-episode shard joined the folder, which reads only
   that shard (``load_episodes`` keeps the previous call's unchanged datasets). The demos
   are synthetic frames of the real size (uint8 96x96x3, stored uncompressed as the real
   ones are).
2. **The student's drive.** The shipped CNN+NAC policy drives ``--tracks`` collection
   tracks with random-action bursts while its oracle, the privileged teacher, labels (the
   shipped policy learned the teacher's env; a PPO oracle labels the same way), in one process
   (as every round did) and in one process per core (``dagger --workers``), writing the
   same episodes.

Reported: seconds of each, and the ratio old / new.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import support_path  # noqa: F401  (tests/support: synthetic demonstrations)


def load_times(folder: Path, demos: int, frames: int, new_episodes: int) -> dict:
    """Seconds to read ``demos`` episodes, and to load again after a shard of ``new_episodes`` joined."""
    from demos import synthetic_episodes

    from nac_drive.data_collection import carracing_dataset
    from nac_drive.simulators.carracing import make_carracing

    env = make_carracing()
    for first in range(0, demos, 5):   # shards of 5: the synthetic episodes' seeds start at 100000
        episodes = synthetic_episodes(min(5, demos - first), frames, seed=first)
        for i, episode in enumerate(episodes):
            episode["seed"] = 100_000 + first + i
        carracing_dataset.write_dataset(folder, "demos", episodes, env, expert="synthetic", description="")
    start = time.perf_counter()
    everything = carracing_dataset.load_episodes(folder)
    read_all = time.perf_counter() - start
    carracing_dataset.write_dataset(folder, "round", synthetic_episodes(new_episodes, frames), env,
                                    expert="synthetic", description="")
    start = time.perf_counter()
    after_round = carracing_dataset.load_episodes(folder)
    kept = time.perf_counter() - start
    assert len(after_round) == len(everything) + new_episodes
    return {"episodes": len(after_round), "read_all_s": round(read_all, 2), "new_shard_only_s": round(kept, 2),
            "ratio": round(read_all / kept, 1)}


def drive_times(folder: Path, tracks: int, workers: int) -> dict:
    """Seconds for one round's drive of ``tracks`` tracks in one process and in ``workers``."""
    from nac_drive.policy.loading import shipped_policy_path
    from nac_drive.pipeline.dagger import drive_round, round_seeds
    from nac_drive.pipeline.processes import split_runs

    seeds = round_seeds(0, 0, tracks)
    seconds, returns = {}, {}
    for n in sorted({1, workers}):
        start = time.perf_counter()
        results = drive_round(split_runs(seeds, n), policy_path=shipped_policy_path(), oracle="teacher",
                              data=folder / f"workers{n}", name="round", max_steps=None, disturb_rate=0.02,
                              disturb_frames=8, description="benchmark", progress=False)
        seconds[n] = time.perf_counter() - start
        returns[n] = [round(r, 1) for r in results.returns]
    assert returns[1] == returns[workers], returns   # the same episodes either way
    return {"tracks": tracks, "one_process_s": round(seconds[1], 1),
            f"{workers}_processes_s": round(seconds[workers], 1), "ratio": round(seconds[1] / seconds[workers], 2),
            "returns": returns[1]}


def main() -> int:
    from nac_drive.torch_threads import available_cores

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--demos", type=int, default=20, help="demonstration episodes already in the folder")
    p.add_argument("--frames", type=int, default=1000, help="frames per synthetic episode")
    p.add_argument("--tracks", type=int, default=4, help="tracks the student drives in the round")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    workers = available_cores()
    with tempfile.TemporaryDirectory() as tmp:
        load = load_times(Path(tmp) / "demos", args.demos, args.frames, args.tracks)
        drive = drive_times(Path(tmp), args.tracks, workers)
    if args.json:
        print(json.dumps({"load": load, "drive": drive}))
        return 0
    print(f"loading {load['episodes']} episodes of {args.frames} frames: everything {load['read_all_s']} s, "
          f"after a {args.tracks}-episode shard joined {load['new_shard_only_s']} s ({load['ratio']}x)")
    print(f"the student's drive of {args.tracks} tracks, the teacher labelling: one process "
          f"{drive['one_process_s']} s, {workers} processes {drive[f'{workers}_processes_s']} s ({drive['ratio']}x); "
          f"returns {drive['returns']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
