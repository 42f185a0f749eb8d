"""Steps per second of CarRacing-v3: stock drawing against ``make_carracing``'s (the
vectorised road, and the score's font loaded once), and the road alone, side by side,
with the same actions on the same tracks.

    python benchmarks/carracing_env_speed.py               # 3 tracks x 500 frames per row
    python benchmarks/carracing_env_speed.py --frames 900 --json

Every frame is drawn (as at action repeat 1, what PPO and the kickstart train at). The
two envs are stepped in alternating blocks of 100 frames, so that other load on the
machine hits every row alike. One thread. Reported: steps/s by the wall clock and by this
process's CPU time, and each row's ratio to the stock env (CPU time).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

BLOCK = 100


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", type=int, default=500, help="frames per track and row")
    p.add_argument("--tracks", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if not 0 < args.frames < 1000:
        p.error("--frames must be in [1, 999]: CarRacing ends an episode at 1000")

    from nac_drive.simulators.carracing import GAS, LEFT, NOOP, RIGHT, make_carracing
    from nac_drive.simulators.road_drawing import stock_drawing_is_replicated

    if not stock_drawing_is_replicated():
        raise SystemExit("this gymnasium/pygame is not the replicated one: make_carracing draws the stock way")
    stock, road = make_carracing(), make_carracing()
    del stock.unwrapped._render_road, stock.unwrapped._render, road.unwrapped._render   # the class's own drawing
    envs = {"stock CarRacing-v3": stock, "vectorised road alone": road, "make_carracing (road + font)": make_carracing()}
    actions = np.random.default_rng(0).choice([NOOP, LEFT, RIGHT, GAS, GAS, GAS], args.frames).tolist()
    totals = {name: [0, 0.0, 0.0] for name in envs}   # steps, wall, cpu
    for track in range(args.tracks):
        for env in envs.values():
            env.reset(seed=1000 + track)
        for start in range(0, args.frames, BLOCK):
            block = actions[start:start + BLOCK]
            for name, env in envs.items():
                wall, cpu = time.perf_counter(), time.process_time()
                for action in block:
                    env.step(action)
                totals[name][0] += len(block)
                totals[name][1] += time.perf_counter() - wall
                totals[name][2] += time.process_time() - cpu
    rows = {name: {"steps": steps, "steps_per_s_wall": round(steps / wall, 1), "steps_per_s_cpu": round(steps / cpu, 1)}
            for name, (steps, wall, cpu) in totals.items()}
    stock = rows["stock CarRacing-v3"]["steps_per_s_cpu"]
    for row in rows.values():
        row["over_stock_cpu"] = round(row["steps_per_s_cpu"] / stock, 2)
    if args.json:
        print(json.dumps({"rows": rows}))
    else:
        for name, row in rows.items():
            print(f"{name:30s} {row['steps_per_s_wall']:8.1f} steps/s wall  {row['steps_per_s_cpu']:8.1f} steps/s CPU"
                  f"  {row['over_stock_cpu']:5.2f}x stock")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
