"""What the live Rerun view costs a drive, beside the same drive without it.

    python benchmarks/live_view.py                 # 300 CarRacing steps, 60 Udacity frames
    python benchmarks/live_view.py --steps 1000 --json

CarRacing: the shipped CNN+NAC policy drives held-out track 900000 for ``--steps`` env steps
(one torch thread, in this process, after a warm-up drive), the whole closed loop timed (env step, policy, sinks):
plain; with the teacher labelling and the trace recorded; with the live view saved to a
``.rrd`` (the same sinks a viewer gets) without and with the per-frame Grad-CAM overlay.
Udacity: the shipped PilotNet+NAC policy's time per telemetry frame (emulator frames fed to
the driver as the bridge does), plain and with the live view and its saliency, against the
simulator's 15 Hz (66.7 ms a frame).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np


def carracing(steps: int, tmp: Path) -> dict[str, float]:
    from nac_drive.agents.driver import PolicyDriver
    from nac_drive.policy.loading import load_driving_policy
    from nac_drive.agents.teacher import PurePursuitTeacher
    from nac_drive.interpret.live_view import open_view
    from nac_drive.pipeline.drive import policy_recorder
    from nac_drive.simulators.carracing import ACTION_NAMES, EVAL_SEED_BASE, run_episodes

    policy = load_driving_policy()
    heads = policy.core.nac.num_heads
    variants = {
        "plain": lambda: (PolicyDriver(policy), None),
        "trace": lambda: (PolicyDriver(policy, recorder=policy_recorder(tmp / "trace", policy, None, "CarRacing-v3",
                                                                        list(ACTION_NAMES)),
                                       oracle=PurePursuitTeacher(continuous=False)), None),
        "rerun": lambda: _live(policy, open_view(tmp / "a.rrd", num_heads=heads, saliency=False)),
        "rerun+saliency": lambda: _live(policy, open_view(tmp / "b.rrd", num_heads=heads, saliency=True)),
    }
    warm, view = _live(policy, open_view(tmp / "warm.rrd", num_heads=heads, saliency=True))
    run_episodes(warm, [EVAL_SEED_BASE], max_steps=30, on_step=warm.on_step)   # imports, numba, first calls
    view.close()
    out = {}
    for name, make in variants.items():
        driver, view = make()
        t0 = time.perf_counter()
        results = run_episodes(driver, [EVAL_SEED_BASE], max_steps=steps, on_step=driver.on_step)
        elapsed = time.perf_counter() - t0
        if view is not None:
            view.close()
        out[name] = results.lengths[0] / elapsed
    return out


def _live(policy, view):
    from nac_drive.agents.driver import PolicyDriver
    from nac_drive.agents.teacher import PurePursuitTeacher

    return PolicyDriver(policy, oracle=PurePursuitTeacher(continuous=False), live=view), view


def udacity(frames: int, tmp: Path) -> dict[str, float]:
    """ms per telemetry frame (p50) of the driver's act(), as the bridge calls it."""
    import gymnasium as gym

    from nac_drive.agents.driver import PolicyDriver
    from nac_drive.policy.loading import load_driving_policy
    from nac_drive.interpret.live_view import open_view

    policy = load_driving_policy(task="udacity")
    env = gym.make("nac_drive/UdacityEmulator-v0")
    images = []
    obs, _ = env.reset(seed=0)
    for _ in range(frames):
        images.append(obs)
        obs, *_ = env.step(np.array([0.0, 0.3], dtype=np.float32))
    out = {}
    for name, view in (("plain", None), ("rerun+saliency", open_view(tmp / "u.rrd", num_heads=policy.core.nac.num_heads))):
        driver = PolicyDriver(policy, live=view)
        driver.reset()
        for image in images[:5]:   # first calls
            driver.act({"image": image, "timestamp": 0.0})
        driver.reset()
        times = []
        for i, image in enumerate(images):
            t0 = time.perf_counter()
            driver.act({"image": image, "timestamp": i / 15.0})
            times.append((time.perf_counter() - t0) * 1e3)
        if view is not None:
            view.close()
        out[name] = float(np.percentile(times, 50))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300, help="CarRacing env steps per variant")
    p.add_argument("--frames", type=int, default=60, help="Udacity frames per variant")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)   # as a control loop drives (the Udacity half times act() outside one)
    with tempfile.TemporaryDirectory() as tmp:
        car = carracing(args.steps, Path(tmp))
        uda = udacity(args.frames, Path(tmp))
    if args.json:
        print(json.dumps({"carracing_fps": car, "udacity_ms_per_frame": uda}))
        return 0
    print(f"CarRacing closed loop, {args.steps} steps, one torch thread (frames/s, ms/frame, vs plain):")
    for name, fps in car.items():
        print(f"  {name:16s} {fps:7.1f} fps  {1e3 / fps:6.2f} ms  {fps / car['plain']:.2f}x")
    print(f"Udacity, {args.frames} telemetry frames, the driver's time per frame (p50; 66.7 ms at 15 Hz):")
    for name, ms in uda.items():
        print(f"  {name:16s} {ms:7.2f} ms  {ms / uda['plain']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
