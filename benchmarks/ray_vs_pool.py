"""The same small collection on the process pool and as Ray tasks on a local Ray: wall times.

    python benchmarks/ray_vs_pool.py                         # 4 tracks of 300 frames, 2 workers
    python benchmarks/ray_vs_pool.py --episodes 8 --max-steps 1000

Both drive the same tracks split into the same ``--workers`` shards (``collect carracing
--workers N`` and ``--workers N --ray``); Ray's time includes starting it (a local Ray of this
machine's cores) and handing the frames back to this process, which writes the shards. Needs
the ``cluster`` extra (``pip install 'nac-drive[cluster]'``).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


def collect_seconds(out: Path, episodes: int, max_steps: int, workers: int, ray: str | None) -> float:
    from nac_drive.pipeline.collect import CollectArgs, collect_carracing

    start = time.perf_counter()
    collect_carracing(CollectArgs(expert="teacher-discrete", episodes=episodes, max_steps=max_steps, out=str(out),
                                  workers=workers, ray=ray), progress=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=300)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        pool = collect_seconds(Path(folder) / "pool", args.episodes, args.max_steps, args.workers, None)
        ray = collect_seconds(Path(folder) / "ray", args.episodes, args.max_steps, args.workers, "local")
    print(f"{args.episodes} tracks x {args.max_steps} frames, {args.workers} workers: process pool {pool:.1f} s, "
          f"local Ray {ray:.1f} s (Ray / pool: {ray / pool:.2f})")


if __name__ == "__main__":
    main()
