"""What one validation pass of ``nac-drive train`` costs: each held-out frame encoded once
(``train.evaluate``) against each window run whole (every frame encoded again for each of
the ``--window`` windows that hold it), on the same windows, side by side.

    python benchmarks/validation_cost.py             # a markdown table (its figures: BENCHMARKS.md §2)

Both tasks at ``train``'s defaults (window 16, 1024 validation windows, batches of 32), one
torch thread, the best of ``--rounds``:

* Udacity: PilotNet on ``--udacity-frames`` of the emulator's scripted recording (``collect
  udacity --driver scripted``), read from JPEG as training reads them;
* CarRacing: the CNN on ``--carracing-frames`` synthetic frames in episodes of 1000, in memory
  as loaded from Minari.

The defaults are what ``compare`` holds out (15%) of the data of its first comparison (docs/findings.md): of 20 CarRacing
demonstrations of about 1000 frames, 3; of 7 Udacity recordings of 1000 frames, 2 (a recording
is held out whole).

The two must agree on the loss (printed); the table gives the seconds and the ratio.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import support_path  # noqa: F401  (tests/support: the window-by-window reference)
from nac_drive.data_collection.carracing_dataset import Episode, WindowDataset
from nac_drive.data_collection.udacity_dataset import UdacityWindowDataset, segments_from_log
from nac_drive.pipeline.train import evaluate, validation_windows
from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig
from nac_drive.simulators.udacity_emulator import record_training
from window_by_window import window_by_window

WINDOW, WINDOWS, BATCH = 16, 1024, 32


def udacity(folder: Path, frames: int):
    record_training(folder, track="gentle", frames=frames, seed=1, progress_bar=False)
    policy = DrivingPolicy(PolicyConfig(task="udacity", encoder="pilotnet", action="continuous", num_outputs=1,
                                        frame_dt=1 / 15))
    return policy, UdacityWindowDataset(segments_from_log(folder / "driving_log.csv"), WINDOW)


def carracing(frames: int):
    rng = np.random.default_rng(0)
    episodes = [Episode(frames=rng.integers(0, 256, (n, 96, 96, 3), dtype=np.uint8), actions=rng.integers(0, 5, n),
                        rewards=np.zeros(n), timestamps=np.arange(n) * 0.02, seed=k, expert="synthetic",
                        source="synthetic")
                for k, n in enumerate(np.diff(np.r_[0:frames:1000, frames]))]
    return DrivingPolicy(PolicyConfig()), WindowDataset(episodes, WINDOW)


def best_seconds(run, rounds: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(rounds):
        t0 = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - t0)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--udacity-frames", type=int, default=2000, help="held-out Udacity frames")
    parser.add_argument("--carracing-frames", type=int, default=3000, help="held-out CarRacing frames")
    parser.add_argument("--rounds", type=int, default=3, help="timed passes of each way (the best is kept)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| task | held-out frames / windows scored | window by window, s | each frame once, s | speed-up | "
          "loss (both) |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for task, frames, (policy, dataset) in (
                ("Udacity", args.udacity_frames, udacity(Path(tmp), args.udacity_frames)),
                ("CarRacing", args.carracing_frames, carracing(args.carracing_frames))):
            policy.eval()
            idx = validation_windows(len(dataset), WINDOWS, 0)
            whole, (loss_whole, _) = best_seconds(lambda: window_by_window(policy, dataset, idx, BATCH, None),
                                                  args.rounds)
            once, scores = best_seconds(lambda: evaluate(policy, dataset, None, WINDOWS, BATCH, 0), args.rounds)
            if not np.isclose(scores["loss"], loss_whole, rtol=1e-5):
                raise SystemExit(f"{task}: the two disagree: loss {scores['loss']} vs {loss_whole}")
            print(f"| {task} | {frames} / {len(idx)} | {whole:.2f} | {once:.2f} | {whole / once:.1f}x | "
                  f"{scores['loss']:.5f} / {loss_whole:.5f} |", flush=True)


if __name__ == "__main__":
    main()
