"""A synthetic recorded run, for tests and benchmarks (a dashboard with no simulator).

Frames are procedural top-down roads (grey road on textured grass, a red car at the
bottom) whose curve drifts over time, so they compress like real driving frames.
The NAC traces are real: a small causal NAC layer (with a window) is stepped over
features of each frame with :meth:`NAC.step(return_trace=True)`, exactly as the
driving loop does.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from nac_drive.interpret.trace import RunRecorder


def road_frame(rng: np.random.Generator, offset: float, curve: float, size: tuple[int, int] = (96, 96),
               noise: float = 12.0) -> np.ndarray:
    """uint8 RGB ``[H, W, 3]``: a road centred ``offset`` (-1..1 of half the width) at
    the car, bending by ``curve`` towards the top of the image."""
    h, w = size
    y = np.arange(h, dtype=np.float32)[:, None] / max(h - 1, 1)         # 0 top .. 1 bottom
    x = np.arange(w, dtype=np.float32)[None, :] / max(w - 1, 1)
    centre = 0.5 + 0.5 * offset * 0.6 + curve * (1.0 - y) ** 2 * 0.5
    on_road = np.abs(x - centre) < 0.17
    img = np.empty((h, w, 3), dtype=np.float32)
    img[...] = (102, 204, 102)                                           # grass
    img[on_road] = (105, 105, 105)                                       # road
    edge = np.abs(np.abs(x - centre) - 0.17) < 0.015
    img[edge] = (230, 230, 230)                                          # kerbs
    img += rng.normal(0.0, noise, size=(h, w, 1))
    car_y, car_x = int(0.78 * h), w // 2
    img[car_y:car_y + max(2, h // 12), car_x - max(1, w // 40):car_x + max(1, w // 40) + 1] = (204, 0, 0)
    return np.clip(img, 0, 255).astype(np.uint8)


class TinyFrameModel(nn.Module):
    """A small CNN ``[B, 3, H, W] -> [B, 3]`` (steer, gas, brake) standing in for a policy."""

    def __init__(self, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.features = nn.Sequential(nn.Conv2d(3, 8, 5, stride=2, padding=2), nn.ReLU(),
                                      nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU())
        self.head = nn.Linear(16, 3)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


def make_synthetic_run(run_dir: str | os.PathLike, steps: int = 200, seed: int = 0,
                       frame_size: tuple[int, int] = (96, 96), d_model: int = 16, num_heads: int = 2,
                       topk: int = 4, window: int = 8, input_dim: int = 24, with_expert: bool = True,
                       with_saliency: bool = True, progress: bool = False, episodes: int = 1,
                       with_cte: bool = True) -> Path:
    """Record ``steps`` steps of a synthetic drive into ``run_dir``; returns the trace path.

    ``episodes``: the steps are split into this many episodes (the last takes the
    remainder), each starting with ``RunRecorder.new_episode()`` and a fresh NAC cache,
    its timestamps from 0, as the driving loop records them. ``with_cte``: record the
    cross-track error (a bridge-driven Udacity run has none).

    With ``with_saliency`` also writes ``saliency.npz`` (Grad-CAM of a small random CNN).
    Runs on one torch thread (restored afterwards): these models are tiny, and two
    threads on a shared 2-core machine are ten times slower.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _record(run_dir, steps, seed, frame_size, d_model, num_heads, topk, window, input_dim, with_expert,
                       with_saliency, progress, episodes, with_cte)
    finally:
        torch.set_num_threads(threads)


def _record(run_dir, steps, seed, frame_size, d_model, num_heads, topk, window, input_dim, with_expert,
            with_saliency, progress, episodes=1, with_cte=True) -> Path:
    from nac_drive import NAC
    from nac_drive.interpret.saliency import compute_run_saliency

    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    layer = NAC(input_dim, d_model=d_model, num_heads=num_heads, topk=topk, causal=True, window=window, seed=seed)
    layer.eval()
    projection = torch.from_numpy(rng.normal(0, 1, size=(64 * 3, input_dim)).astype(np.float32) / 8.0)
    meta = {"policy": {"kind": "synthetic", "core": "nac", "d_model": d_model, "num_heads": num_heads,
                       "topk": topk, "window": window},
            "env": {"id": "synthetic-road", "frame_size": list(frame_size)}, "seed": seed}
    recorder = RunRecorder(run_dir, metadata=meta, nac=layer, action_names=["steer", "gas", "brake"],
                           expert_action_names=["steer", "gas", "brake"])
    offset, curve = 0.0, 0.0
    length = max(1, steps // max(1, episodes))
    with torch.no_grad():
        for i in range(steps):
            if i % length == 0 and i // length < episodes:   # a new episode: the policy resets
                recorder.new_episode()
                cache, start = layer.init_cache(1), i
            # The road drifts (curve, offset: where the road is relative to the car); the
            # expert steers towards it and the policy copies the expert with noise.
            curve = float(np.clip(0.97 * curve + rng.normal(0, 0.08), -1, 1))
            expert_steer = float(np.clip(0.8 * curve + 0.6 * offset, -1, 1))
            steer = float(np.clip(expert_steer + rng.normal(0, 0.15), -1, 1))
            offset = float(np.clip(0.9 * offset + 0.1 * (steer - expert_steer) + rng.normal(0, 0.05), -1, 1))
            frame = road_frame(rng, offset, curve, frame_size)
            small = torch.from_numpy(frame[:: max(1, frame_size[0] // 8), :: max(1, frame_size[1] // 8)][:8, :8])
            x = (small.reshape(-1).float() / 255.0 - 0.5) @ projection + 0.05 * torch.randn(input_dim)
            _, cache, trace = layer.step(x[None], cache, return_trace=True)
            gas = float(np.clip(0.6 - abs(curve) * 0.4 + rng.normal(0, 0.05), 0, 1))
            recorder.add(frame=frame, policy_action=np.array([steer, gas, 0.0], dtype=np.float32),
                         expert_action=np.array([expert_steer, 0.6 - abs(curve) * 0.4, 0.0]) if with_expert else None,
                         reward=float(1.0 - abs(offset)), cross_track_error=offset if with_cte else None,
                         nac_trace=trace, timestamp=(i - start) * 0.05)
    path = recorder.save()
    if with_saliency:
        model = TinyFrameModel(seed)
        compute_run_saliency(run_dir, lambda i: model, target="steer", progress=progress)
    return path
