"""``nac-drive collect carracing``: record expert demonstrations as a Minari dataset.

    nac-drive collect carracing --expert ppo --episodes 20 --seed 0 --out runs/demos

Track seeds are ``100000 + seed + i`` (the collection range: never used by expert
training, nor by evaluation, which starts at 900000). Every frame stores the raw RGB
observation the student will see and the expert's action.
"""

from __future__ import annotations

import argparse

from nac_drive.arguments import COUNT, SEED


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("collect", help="record expert demonstrations", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="collect_target", metavar="SIMULATOR", required=True)
    car = sub.add_parser("carracing", help="CarRacing-v3 demonstrations (Minari dataset)",
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    car.add_argument("--expert", default="ppo",
                     help="'ppo' (the shipped PPO expert), a PPO zip path, 'teacher' or 'teacher-discrete'")
    car.add_argument("--episodes", type=COUNT, default=20, help="episodes (one track each)")
    car.add_argument("--seed", type=SEED, default=0, help="first track is 100000 + SEED")
    car.add_argument("--max-steps", type=COUNT, default=None, help="cap each episode (env frames; default 1000)")
    car.add_argument("--out", default="runs/demos", help="dataset root folder")
    car.add_argument("--name", default=None, help="dataset name (default: carracing-<expert>-s<seed>)")
    car.set_defaults(func=run)


def collect_carracing(expert: str, episodes: int, seed: int, out: str, max_steps: int | None = None,
                      name: str | None = None, progress: bool = True):
    """Record ``episodes`` expert episodes; returns (dataset path, EpisodeResults)."""
    from nac_drive.agents.experts import load_expert
    from nac_drive.data_collection.carracing_dataset import refuse_existing, write_dataset
    from nac_drive.data_collection.episode_recorder import RecordEpisodes
    from nac_drive.simulators.carracing import COLLECT_SEED_BASE, FPS, make_carracing, run_episodes

    if episodes < 1:
        raise ValueError(f"episodes: must be >= 1, got {episodes}")
    actor, continuous = load_expert(None if expert == "ppo" else expert)
    safe_name = name or f"carracing-{actor.name.replace(':', '-').replace('/', '-')}-s{seed}"
    refuse_existing(out, safe_name)   # before driving: a name that is taken would waste the collection
    env = RecordEpisodes(make_carracing(continuous=continuous), fps=FPS)
    seeds = [COLLECT_SEED_BASE + seed + i for i in range(episodes)]
    try:
        results = run_episodes(actor, seeds, continuous=continuous, max_steps=max_steps, env=env, progress=progress)
        recorded = env.take_episodes()
        path = write_dataset(out, safe_name, recorded, env.unwrapped, expert=actor.name,
                             description=f"CarRacing-v3 demonstrations by {actor.name}, tracks {seeds[0]}..{seeds[-1]}")
    finally:
        env.close()
    return path, results


def run(args: argparse.Namespace) -> int:
    path, results = collect_carracing(args.expert, args.episodes, args.seed, args.out, args.max_steps, args.name)
    print(results.format())
    print(f"dataset: {path}")
    return 0
