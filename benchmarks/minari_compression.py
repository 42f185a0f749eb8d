"""Does compressing the Minari observations keep an episode fast to read?

    python benchmarks/minari_compression.py                 # 1000 CarRacing steps, 5 reads each
    python benchmarks/minari_compression.py --steps 300 --repeats 3

Records one CarRacing episode (gymnasium's env, the car driven by a fixed gas and a slow
steering sweep: the frames are real road, grass and car), writes its observations
``uint8 [N+1, 96, 96, 3]`` to HDF5 as Minari 0.5 does (``chunks=True``, uncompressed) and
compressed with lzf and with gzip (levels 1 and 4), each in its own file, and times reading
the whole array back (``np.asarray(f["observations"])``, what loading an episode does),
best of ``--repeats`` after one warm-up read (the file in the page cache, as after the first
epoch). Prints size and read time per way, and the ratio to the uncompressed read: the
rule for shipping compression is a read within ~1.5x of it.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

WAYS = {"none (Minari's)": {}, "lzf": {"compression": "lzf"}, "gzip 1": {"compression": "gzip", "compression_opts": 1},
        "gzip 4": {"compression": "gzip", "compression_opts": 4}}


def carracing_frames(steps: int, seed: int = 0) -> np.ndarray:
    """``uint8 [steps + 1, 96, 96, 3]``: the observations of one CarRacing episode."""
    import gymnasium as gym

    env = gym.make("CarRacing-v3")
    obs, _ = env.reset(seed=seed)
    frames = [obs]
    for i in range(steps):
        obs, _, terminated, truncated, _ = env.step(np.array([0.5 * np.sin(i / 40), 0.3, 0.0], dtype=np.float32))
        frames.append(obs)
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()
    return np.stack(frames)


def read_seconds(path: Path, repeats: int) -> float:
    import h5py

    times = []
    for _ in range(repeats + 1):            # the first read warms the page cache
        start = time.perf_counter()
        with h5py.File(path, "r") as f:
            np.asarray(f["observations"])
        times.append(time.perf_counter() - start)
    return min(times[1:])


def main() -> None:
    import h5py

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    frames = carracing_frames(args.steps)
    print(f"{len(frames)} CarRacing frames, {frames.nbytes / 1e6:.1f} MB raw")
    with tempfile.TemporaryDirectory() as folder:
        baseline = None
        for name, options in WAYS.items():
            path = Path(folder) / f"{name.split()[0]}{options.get('compression_opts', '')}.hdf5"
            with h5py.File(path, "w") as f:
                f.create_dataset("observations", data=frames, chunks=True, **options)
            seconds = read_seconds(path, args.repeats)
            baseline = baseline or seconds
            print(f"{name:16s} {path.stat().st_size / 1e6:7.2f} MB   read {1000 * seconds:7.1f} ms "
                  f"({seconds / baseline:.2f}x)")


if __name__ == "__main__":
    main()
