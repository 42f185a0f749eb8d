"""``nac-drive collect``: record demonstrations, from CarRacing or the Udacity simulator.

    nac-drive collect carracing --expert ppo --episodes 20 --seed 0 --out runs/demos
    nac-drive collect carracing --expert teacher-discrete --episodes 200 --workers 2   # one process per core
    nac-drive collect carracing --expert teacher-discrete --gas 0.4        # the teacher, GAS pressing 0.4
    nac-drive collect udacity --out runs/udacity/my_drive                  # you drive the Udacity simulator
    nac-drive collect udacity --driver scripted --out runs/udacity/lakeside --frames 3000   # headless

CarRacing:

Track seeds are ``100000 + seed + i`` (the collection range: never used by expert
training, nor by evaluation, which starts at 900000). Every frame stores the raw RGB
observation the student will see and the expert's action, in the env the expert drives (a
PPO zip whose GAS presses another gas than gymnasium's 0.2 drives DiscreteActions, which
the dataset's env spec keeps, and the policy trained on it learns).

The dataset ``--name`` is a Minari namespace ``nac_drive/<name>`` of shards, one per
worker, each named by its tracks (``seeds-<first>-<last>-v1``). Machines that collect
other ``--seed`` ranges under the same name write shards that never collide: copy their
``nac_drive/<name>`` folders into one and train on it. A shard whose tracks are already
in the dataset is refused before driving.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from nac_drive.arguments import COUNT, PEDAL, PORT, POSITIVE, SEED, number


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("collect", help="record demonstrations (CarRacing expert, Udacity driving)",
                                   description=__doc__)
    sub = parser.add_subparsers(dest="collect_target", metavar="SIMULATOR", required=True)
    car = sub.add_parser("carracing", help="CarRacing-v3 demonstrations (Minari dataset)")
    car.add_argument("--expert", default="ppo",
                     help="'ppo' (the shipped PPO expert), a PPO zip path, 'teacher' or 'teacher-discrete'")
    car.add_argument("--episodes", type=COUNT, default=20, help="episodes (one track each)")
    car.add_argument("--seed", type=SEED, default=0, help="first track is 100000 + SEED")
    car.add_argument("--max-steps", type=COUNT, default=None, help="cap each episode (env frames; default 1000)")
    car.add_argument("--gas", type=PEDAL, default=None,
                     help="teacher-discrete and random-discrete: what the GAS action presses (default 0.2, "
                          "gymnasium's discrete env); a PPO zip records its own")
    car.add_argument("--out", default="runs/demos", help="dataset root folder (Minari's MINARI_DATASETS_PATH)")
    car.add_argument("--name", default=None, help="dataset name (default: carracing-<expert>)")
    car.add_argument("--workers", type=COUNT, default=1,
                     help="processes driving episodes in parallel (one per core), one shard each")
    car.set_defaults(func=run)

    uda = sub.add_parser("udacity", help="Udacity driving logs (driving_log.csv + IMG/): you in the simulator, "
                                         "or the headless emulator's scripted driver")
    uda.add_argument("--out", required=True, metavar="DIR", help="recording folder (driving_log.csv + IMG/)")
    uda.add_argument("--driver", choices=["human", "scripted"], default="human",
                     help="human: serve the Udacity simulator (it connects to --host:--port; start it in "
                          "training mode) and record what you drive, centre camera, until Ctrl-C; scripted: "
                          "the headless emulator's pure-pursuit driver records --frames frames, three cameras")
    human = uda.add_argument_group("--driver human")
    human.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    human.add_argument("--port", type=PORT, default=None, help="port the simulator connects to (default 4567)")
    human.add_argument("--exit-on-disconnect", action="store_true", help="stop when the simulator disconnects")
    scripted = uda.add_argument_group("--driver scripted")
    scripted.add_argument("--track", default=None,
                          help="gentle, lakeside, serpentine, canyon, or random-<seed> (default lakeside)")
    scripted.add_argument("--frames", type=COUNT, default=None, help="frames to record (default 1000)")
    scripted.add_argument("--seed", type=SEED, default=None, help="start position and steering noise (default 0)")
    scripted.add_argument("--noise", type=number(float, min=0), default=None,
                          help="steering noise of the scripted driver (default 0.3)")
    scripted.add_argument("--speed", type=POSITIVE, default=None, help="target speed, mph (default 9)")
    scripted.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                          help="show the frames recorded on stderr (default: when stderr is a terminal)")
    uda.add_argument("--json", action="store_true", help="print the final summary as one JSON line")
    uda.set_defaults(func=run_udacity)


# flags of one --driver only, with the defaults they stand for
_DRIVER_FLAGS = {
    "human": {"host": "127.0.0.1", "port": 4567, "exit_on_disconnect": False},
    "scripted": {"track": "lakeside", "frames": 1000, "seed": 0, "noise": 0.3, "speed": 9.0, "progress": None},
}


def run_udacity(args: argparse.Namespace) -> int:
    """``collect udacity``: a human's driving through the bridge, or the emulator's scripted driver."""
    from nac_drive.arguments import flag_name

    other_driver = "scripted" if args.driver == "human" else "human"
    for name in _DRIVER_FLAGS[other_driver]:
        if getattr(args, name) not in (None, False):
            raise ValueError(f"{flag_name(name)}: only with --driver {other_driver}")
    values = {name: default if getattr(args, name) is None else getattr(args, name)
              for name, default in _DRIVER_FLAGS[args.driver].items()}
    if args.driver == "human":
        import logging

        from nac_drive.simulators.udacity_session import record_udacity

        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        return record_udacity(args.out, values["host"], values["port"], args.json, values["exit_on_disconnect"])

    import sys

    from nac_drive.commands.sim import check_track, print_summary
    from nac_drive.simulators.udacity_emulator import record_training

    check_track(values["track"])
    progress = sys.stderr.isatty() if values["progress"] is None else values["progress"]
    summary = record_training(args.out, track=values["track"], frames=values["frames"], seed=values["seed"],
                              speed_mph=values["speed"], noise=values["noise"], progress_bar=progress)
    print_summary(summary, args.json)
    return 0


def run(args: argparse.Namespace) -> int:
    from nac_drive.pipeline.collect import collect_carracing

    path, results = collect_carracing(args.expert, args.episodes, args.seed, args.out, args.max_steps, args.name,
                                      workers=args.workers, gas=args.gas)
    print(results.format())
    print(f"dataset: {path} (shards: {', '.join(sorted(p.name for p in Path(path).iterdir() if p.is_dir()))})")
    return 0
