"""The shipped CarRacing policy exported to ONNX beside its torch self: parity, returns, latency.

    python benchmarks/onnx_policy.py [--tracks 3] [--parity-frames 1000] [--latency-frames 500]

* parity: the torch policy drives the held-out tracks 900000, ... and keeps every frame and
  its head's output; each exported graph (``step``: one frame, the NAC cache in and out;
  ``window``: the forward over the last 16 frames) replays the first ``--parity-frames`` of
  them on onnxruntime: the largest |difference| of the outputs and how many actions agree;
* returns: the torch policy and the ``step`` export each drive the same held-out tracks;
* latency per frame, one thread each (torch ``set_num_threads(1)``, onnxruntime one intra-op
  thread): ``select_action`` on held-out frames with the window full (after 64 warm-up
  frames), median over ``--latency-frames``; and one window forward ``[1, 16]``.
Needs the ``onnx`` extra.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import support_path  # noqa: F401  (tests/support: the held-out drive)
from held_out_drive import drive_recording, replay

from nac_drive.policy.loading import load_driving_policy
from nac_drive.policy.onnx_export import export_onnx
from nac_drive.policy.onnx_policy import OnnxPolicy
from nac_drive.simulators.carracing import EVAL_SEED_BASE

WARMUP = 64


def median_ms(step, frames: np.ndarray, n: int) -> float:
    """Median ms of ``step(frame)`` over ``n`` frames after :data:`WARMUP` (cycling ``frames``)."""
    times = []
    for i in range(WARMUP + n):
        t0 = time.perf_counter()
        step(frames[i % len(frames)])
        if i >= WARMUP:
            times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def window_ms(policy, run, frames: np.ndarray, n: int) -> tuple[float, float]:
    """Median ms of one ``[1, 16]`` window forward: torch, onnxruntime."""
    window = torch.from_numpy(frames[:16]).permute(0, 3, 1, 2)[None].contiguous()
    t = torch.arange(16, dtype=torch.float32)[None] * policy.config.frame_dt
    feed = {"frames": window.numpy(), "t": t.numpy()}
    with torch.inference_mode():
        torch_ms = median_ms(lambda _: policy(window, t), frames, n)
    return torch_ms, median_ms(lambda _: run.run(None, feed), frames, n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tracks", type=int, default=3)
    parser.add_argument("--parity-frames", type=int, default=1000)
    parser.add_argument("--latency-frames", type=int, default=500)
    args = parser.parse_args()
    torch.set_num_threads(1)
    policy = load_driving_policy()
    seeds = list(range(EVAL_SEED_BASE, EVAL_SEED_BASE + args.tracks))
    with tempfile.TemporaryDirectory() as tmp:
        paths = {g: Path(tmp) / f"{g}.onnx" for g in ("step", "window")}
        for graph, path in paths.items():
            export_onnx(policy, path, graph=graph)
        onnx = {g: OnnxPolicy(p, threads=1) for g, p in paths.items()}

        drive = drive_recording(policy, seeds)
        n = min(args.parity_frames, len(drive.frames))
        print(f"## Parity on {n} held-out frames (tracks {seeds[0]}-{seeds[-1]}, torch drives)\n")
        print("| graph | max abs diff | same action |")
        print("|---|---:|---:|")
        for graph, runtime in onnx.items():
            got, expected = replay(runtime, drive, n), drive.outputs[:n]
            same = int((got.argmax(1) == expected.argmax(1)).sum())
            print(f"| {graph} | {np.abs(got - expected).max():.2g} | {same}/{n} |")

        onnx_drive = drive_recording(onnx["step"], seeds)
        print(f"\n## Returns on held-out tracks {seeds[0]}-{seeds[-1]}\n")
        print("| track | torch | onnxruntime (step graph) |")
        print("|---|---:|---:|")
        for seed, a, b in zip(seeds, drive.returns, onnx_drive.returns):
            print(f"| {seed} | {a:.2f} | {b:.2f} |")

        frames = drive.frames
        print("\n## Latency per frame, one thread (median ms)\n")
        print("| | torch | onnxruntime | torch / onnxruntime |")
        print("|---|---:|---:|---:|")
        policy.reset()
        torch_step = median_ms(policy.select_action, frames, args.latency_frames)
        for graph, runtime in onnx.items():
            runtime.reset()
            ms = median_ms(runtime.select_action, frames, args.latency_frames)
            print(f"| select_action ({graph} graph) | {torch_step:.3f} | {ms:.3f} | {torch_step / ms:.2f}x |")
        torch_win, ort_win = window_ms(policy, onnx["window"].session, frames, args.latency_frames)
        print(f"| window forward [1, 16] | {torch_win:.3f} | {ort_win:.3f} | {torch_win / ort_win:.2f}x |")


if __name__ == "__main__":
    main()
