"""Steps per second of the Udacity emulator env (``nac_drive/UdacityEmulator-v0``).

    python benchmarks/udacity_env_speed.py                  # 2000 steps per row
    python benchmarks/udacity_env_speed.py --steps 5000 --json

Rows: the env through ``gymnasium.make`` (its TimeLimit and checkers) stepped with a
pure-pursuit driver, with the observation's JPEG round trip (the default: what the bridge
decodes) and without it (``jpeg_quality=None``); then the shipped PilotNet+NAC policy
driving it through ``SpeedControl`` (policy time included). One thread. Reported: steps/s
by the wall clock and by this process's CPU time (the second is less sensitive to other
load on the machine).
"""

from __future__ import annotations

import argparse
import json
import time


def _run(env, act, steps: int, on_reset=lambda: None) -> dict:
    obs, _ = env.reset(seed=0)
    on_reset()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        obs, _, terminated, truncated, _ = env.step(act(obs))
        if terminated or truncated:
            obs, _ = env.reset()
            on_reset()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"steps": steps, "steps_per_s_wall": round(steps / wall, 1), "steps_per_s_cpu": round(steps / cpu, 1)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--track", default="lakeside")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    import gymnasium as gym
    import torch

    from nac_drive.policy.loading import load_driving_policy
    from nac_drive.simulators.udacity_env import ENV_ID, SpeedControl
    from nac_drive.simulators.udacity_track import pure_pursuit

    torch.set_num_threads(1)
    rows = {}
    for name, quality in (("env, JPEG round trip (default)", 85), ("env, raw frames (jpeg_quality=None)", None)):
        env = gym.make(ENV_ID, track=args.track, jpeg_quality=quality)
        u = env.unwrapped
        rows[name] = _run(env, lambda obs: [pure_pursuit(u.track, u.car, u.progress.index), 0.3], args.steps)
    policy = load_driving_policy(task="udacity")
    env = SpeedControl(gym.make(ENV_ID, track=args.track))
    rows["env + shipped PilotNet+NAC policy (SpeedControl)"] = _run(env, lambda obs: [policy.select_action(obs)],
                                                                    args.steps, on_reset=policy.reset)
    if args.json:
        print(json.dumps(rows))
    else:
        for name, row in rows.items():
            print(f"{name:52s} {row['steps_per_s_wall']:8.1f} steps/s wall  {row['steps_per_s_cpu']:8.1f} steps/s CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
