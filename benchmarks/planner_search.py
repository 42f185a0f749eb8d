"""The minimum-time planner's settings, searched on the validation tracks 800000-800019 only.

    python benchmarks/planner_search.py --action discrete --gas 1.0 --configs 120
    python benchmarks/planner_search.py --action continuous --configs 120
    python benchmarks/planner_search.py --action discrete --gas 1.0 --set a_lat=200 curvature_window=20
    python benchmarks/planner_search.py --configs 40 --set a_lat=200 --space '{"steer_gain": [1.0, 1.5]}'

Each configuration draws one value per searched field of ``agents/planner.py``'s
``PlannerConfig`` (the grid ``SPACE``, and ``CONTINUOUS_SPACE`` for continuous actions; the
first configuration is the defaults) and drives
the validation tracks; one line per configuration, then the best by mean return. The
episodes are those of ``nac-drive expert eval`` (same seeds, same actions, same returns:
the planner reads the env's state, not its pixels) with the observations not drawn, ~15x
faster (``--check`` drives the first track both ways and asserts the same return).
One torch thread, one process.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import numpy as np

SEED_BASE = 800_000   # the validation tracks; the held-out ones (900000-) are never searched on
SPACE = {
    "a_lat": [120.0, 150.0, 180.0, 200.0, 230.0, 260.0],
    "curvature_window": [15.0, 20.0, 25.0, 30.0, 40.0],
    "a_brake": [80.0, 120.0, 150.0, 180.0, 219.0],
    "preview": [0.0, 0.1, 0.2, 0.3],
    "brake_margin": [0.0, 3.0, 6.0, 10.0],
    "lookahead": [6.0, 8.0, 10.0, 12.0],
    "lookahead_per_speed": [0.1, 0.15, 0.2, 0.25],
    "steer_gain": [1.5, 2.5, 3.5],
    "steer_deadband": [0.06, 0.09, 0.12, 0.16],
    "steer_tolerance": [0.03, 0.05, 0.08],
}
CONTINUOUS_SPACE = {   # also drawn for the continuous planner (the discrete one only reads whether gas > 0)
    "gas_gain": [0.05, 0.1, 0.2],
    "gas_steer_cut": [0.3, 0.5, 0.7, 0.9],
    "brake": [0.4, 0.6, 0.8],
}


def drive(planner, seeds, continuous: bool, gas: float, draw: bool = False) -> list[float]:
    """Returns of ``planner`` on ``seeds``, as :func:`~nac_drive.simulators.carracing.run_episodes`
    counts them; ``draw=False`` skips drawing the observations the planner never reads."""
    from nac_drive.simulators.carracing import make_carracing

    env = make_carracing(continuous=continuous, gas=gas)
    if not draw:
        env.unwrapped._render = lambda mode: None   # instance attribute shadows the method
    returns = []
    for seed in seeds:
        env.reset(seed=int(seed))
        planner.reset()
        planner.reset_env(env)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(planner.act(None))
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    env.close()
    return returns


def main() -> None:
    import torch

    from nac_drive.agents.planner import MinimumTimePlanner, default_config
    from nac_drive.simulators.carracing import DISCRETE_GAS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--action", choices=("discrete", "continuous"), default="discrete")
    parser.add_argument("--gas", type=float, default=DISCRETE_GAS, help="discrete: what GAS presses")
    parser.add_argument("--configs", type=int, default=1, help="configurations drawn (the first: the defaults)")
    parser.add_argument("--episodes", type=int, default=20, help="validation tracks from 800000 (at most 20)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the draws")
    parser.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                        help="fixed settings on top of the defaults (not searched)")
    parser.add_argument("--space", type=json.loads, default=None, metavar="JSON",
                        help='the grid to draw from instead of SPACE, e.g. \'{"steer_gain": [1.0, 1.5]}\'')
    parser.add_argument("--check", action="store_true", help="also drive the first track drawn and compare")
    args = parser.parse_args()
    if not 1 <= args.episodes <= 20:
        parser.error("--episodes: the validation tracks are 800000-800019 (1 to 20)")
    torch.set_num_threads(1)
    continuous = args.action == "continuous"
    gas = DISCRETE_GAS if continuous else args.gas
    fixed = {k: float(v) for k, v in (item.split("=", 1) for item in args.set)}
    seeds = range(SEED_BASE, SEED_BASE + args.episodes)
    rng = random.Random(args.seed)
    space = args.space or ({**SPACE, **CONTINUOUS_SPACE} if continuous else SPACE)
    results = []
    for c in range(args.configs):
        drawn = {} if c == 0 else {k: rng.choice(v) for k, v in space.items() if k not in fixed}
        cfg = default_config(continuous)
        for k, v in {**drawn, **fixed}.items():
            if not hasattr(cfg, k):
                parser.error(f"--set: PlannerConfig has no field {k}")
            setattr(cfg, k, v)
        start = time.perf_counter()
        returns = np.array(drive(MinimumTimePlanner(continuous, cfg, gas), seeds, continuous, gas))
        if args.check and c == 0:
            drawn_return = drive(MinimumTimePlanner(continuous, cfg, gas), seeds[:1], continuous, gas, draw=True)[0]
            assert drawn_return == returns[0], (drawn_return, returns[0])
        results.append((returns.mean(), drawn))
        print(json.dumps(drawn), f"mean {returns.mean():.1f} std {returns.std():.1f} worst {returns.min():.1f} "
              f">=900 {(returns >= 900).sum()}/{len(returns)} ({time.perf_counter() - start:.0f} s)", flush=True)
    best = max(results, key=lambda r: r[0])
    print(f"best: mean {best[0]:.1f} with {json.dumps({**best[1], **fixed})}")


if __name__ == "__main__":
    main()
