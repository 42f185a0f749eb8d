"""``nac-drive collect``: record demonstrations, from CarRacing or the Udacity simulator.

    nac-drive collect carracing --expert ppo --episodes 20 --seed-base 100000 --out runs/demos
    nac-drive collect carracing --expert teacher-discrete --episodes 200 --workers 2   # one process per core
    nac-drive collect carracing --expert teacher-discrete --gas 0.4        # the teacher, GAS pressing 0.4
    nac-drive collect udacity --out runs/udacity/my_drive                  # you drive the Udacity simulator
    nac-drive collect udacity --driver scripted --out runs/udacity/lakeside --frames 3000   # headless

``nac-drive collect carracing --help`` tells how CarRacing tracks are numbered and datasets named.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from pathlib import Path

from nac_drive.fields import MAX_SEED, REQUIRED, arg, check_fields

HUMAN, SCRIPTED = "--driver human", "--driver scripted"

CARRACING = """Record an expert's CarRacing-v3 episodes as a Minari dataset.

Tracks ``--seed-base`` + i, from 100000 by default (the collection range: never used by expert
training; the validation tracks from 800000 and the held-out ones from 900000 are refused). Every frame stores the raw RGB
observation the student will see and the expert's action, in the env the expert drives (a
PPO zip whose GAS presses another gas than gymnasium's 0.2 drives DiscreteActions, which
the dataset's env spec keeps, and the policy trained on it learns).

The dataset ``--name`` is a Minari namespace ``nac_drive/<name>`` of shards, one per
worker, each named by its tracks (``seeds-<first>-<last>-v1``). Machines that collect
other ``--seed-base`` ranges under the same name write shards that never collide: copy their
``nac_drive/<name>`` folders into one and train on it. A shard whose tracks are already
in the dataset is refused before driving, and so is a collect started while another one
records some of its tracks into the same ``--out`` and ``--name``.
"""


@dataclass
class CollectUdacityArgs:
    """Arguments of ``nac-drive collect udacity``: the flags of each ``--driver`` in its group."""

    out: str = arg(REQUIRED, "recording folder (driving_log.csv + IMG/)", metavar="DIR")
    driver: str = arg("human", "human: serve the Udacity simulator (it connects to --host:--port; start it in "
                               "training mode) and record what you drive, centre camera, until Ctrl-C; scripted: "
                               "the headless emulator's pure-pursuit driver records --frames frames, three cameras",
                      choices=("human", "scripted"))
    host: str = arg("127.0.0.1", "address to bind", group=HUMAN)
    port: int = arg(4567, "port the simulator connects to", min=1, max=65535, group=HUMAN)
    exit_on_disconnect: bool = arg(False, "stop when the simulator disconnects", group=HUMAN)
    track: str = arg("lakeside", "gentle, lakeside, serpentine, canyon, or random-<seed>; with the suffix -cw the "
                                 "same loop mirrored, driven clockwise (lakeside-cw)", group=SCRIPTED)
    frames: int = arg(1000, "frames to record", min=1, group=SCRIPTED)
    seed: int = arg(0, "start position and steering noise", min=0, group=SCRIPTED, max=MAX_SEED)
    noise: float = arg(0.3, "steering noise of the scripted driver", min=0, group=SCRIPTED)
    speed: float = arg(9.0, "target speed, mph", above=0, max=30, group=SCRIPTED)   # 30: the simulator's top speed
    progress: bool | None = arg(None, "show the frames recorded on stderr (default: when stderr is a terminal)",
                                group=SCRIPTED)

    def __post_init__(self):
        check_fields(self)

    def ignored(self) -> dict[str, str]:
        """The other driver's fields: this one does not use them."""
        other = SCRIPTED if self.driver == "human" else HUMAN
        return {f.name: f"only with {other}" for f in fields(self) if f.metadata["group"] == other}


def add_parser(subparsers) -> None:
    from nac_drive.cli.arguments import JsonOutput, add_dataclass_arguments
    from nac_drive.pipeline.collect import CollectArgs

    parser = subparsers.add_parser("collect", help="record demonstrations (CarRacing expert, Udacity driving)",
                                   description=__doc__)
    sub = parser.add_subparsers(dest="collect_target", metavar="SIMULATOR", required=True)
    car = sub.add_parser("carracing", help="CarRacing-v3 demonstrations (Minari dataset)",
                         description=CARRACING)
    for cls in (CollectArgs, JsonOutput):
        add_dataclass_arguments(car, cls)
    car.set_defaults(func=run)

    uda = sub.add_parser("udacity", help="Udacity driving logs (driving_log.csv + IMG/): you in the simulator, "
                                         "or the headless emulator's scripted driver")
    for cls in (CollectUdacityArgs, JsonOutput):
        add_dataclass_arguments(uda, cls)
    uda.set_defaults(func=run_udacity)


def run_udacity(namespace: argparse.Namespace) -> int:
    """``collect udacity``: a human's driving through the bridge, or the emulator's scripted driver."""
    from nac_drive.cli.arguments import JsonOutput, from_namespace

    args, output = from_namespace(CollectUdacityArgs, namespace), from_namespace(JsonOutput, namespace)
    if args.driver == "human":
        import logging

        from nac_drive.simulators.udacity_session import record_udacity

        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        return record_udacity(args.out, args.host, args.port, output.json, args.exit_on_disconnect)

    import sys

    from nac_drive.cli.commands.sim import check_track, print_summary
    from nac_drive.simulators.udacity_emulator import record_training

    check_track(args.track)
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    summary = record_training(args.out, track=args.track, frames=args.frames, seed=args.seed, speed_mph=args.speed,
                              noise=args.noise, progress_bar=progress)
    print_summary(summary, output)
    return 0


def run(namespace: argparse.Namespace) -> int:
    from nac_drive.cli.arguments import JsonOutput, from_namespace
    from nac_drive.pipeline.collect import CollectArgs, collect_carracing

    args, output = from_namespace(CollectArgs, namespace), from_namespace(JsonOutput, namespace)
    path, results = collect_carracing(args)
    shards = sorted(p.name for p in Path(path).iterdir() if p.is_dir())
    print(results.format())
    print(f"dataset: {path} (shards: {', '.join(shards)})")
    output.emit({**results.summary(), "dataset": str(path), "shards": shards})
    return 0
