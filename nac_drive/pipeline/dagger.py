"""DAgger (Ross et al. 2011) for CarRacing: the student drives, an oracle labels.

Each round drives the current policy on fresh collection tracks while the oracle (by
default the privileged pure-pursuit teacher; ``--oracle planner``: the privileged minimum-time
planner, which labelled the shipped policy's rounds; ``--oracle ppo``: the PPO expert, which sees
the frames the student sees) answers, for every state the student reached, what it would
have done; those labels join the dataset as a new Minari dataset
(``nac_drive/dagger-r<round>-s<seed>``, recorded in the student's env, its ActionBursts
wrapper, if any, and its DiscreteActions gas, which its env spec keeps; one process per
core drives a run of the round's tracks and writes it as one shard) and the
policy is fine-tuned on everything. Student mistakes thus become training data, which
plain behaviour cloning never sees. ``--disturb-rate`` adds bursts of a random action
(after DART, Laskey et al. 2017) that push the car off its line; the teacher then labels
how to recover, a state a good student rarely reaches by itself.

    nac-drive dagger --policy runs/train/<run>/best --data runs/demos --rounds 3 --episodes 5
    nac-drive dagger ... --disturb-rate 0.01 --disturb-frames 10
    nac-drive dagger ... --oracle ppo          # or --oracle path/to/expert.zip
    nac-drive dagger ... --workers 8 --ray     # each round's 8 shards as Ray tasks (or --ray HEAD:6379)
    nac-drive dagger ... --resume              # the same flags again, after a kill

A killed run goes on with ``--resume`` and the same flags: a round whose dataset is in
``--data`` is not driven again, and its fine-tuning continues from its ``last/`` (a whole one
trains no epoch more).

With ``--ray`` each round's runs of tracks are driven and labelled as Ray tasks, on this
machine or a cluster, split as the worker processes split them (the same shards); their
episodes come back to this process, which writes them and fine-tunes. The nodes must see
``--policy``, ``--out`` (each round's checkpoint) and a zip ``--oracle`` at the same paths.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from nac_drive.fields import MAX_EPISODES, REQUIRED, arg, check_fields
from nac_drive.pipeline.ray_tasks import ray_arg
from nac_drive.pipeline.train_args import TrainArgs
from nac_drive.policy.tasks import DISCRETE_GAS
from nac_drive.torch_threads import check_workers

DAGGER_SEED_OFFSET = 50_000   # within the collection range, clear of `nac-drive collect --seed-base`'s default runs
OFF_PLAYFIELD_REWARD = -100.0   # CarRacing's last reward when the car leaves the playfield (gymnasium's car_racing.py)


@dataclass
class DaggerArgs:
    """Arguments of ``nac-drive dagger`` besides its fine-tuning's (:class:`TrainArgs`, whose
    ``data`` also receives each round's dataset and whose ``seed`` picks the rounds' tracks).
    Each round fine-tunes the checkpoint it starts from: its architecture, never another."""

    policy: str = arg(REQUIRED, "checkpoint folder to start from")
    rounds: int = arg(3, "DAgger rounds", min=1)
    episodes: int = arg(5, "student episodes per round", min=1, max=MAX_EPISODES)
    max_steps: int | None = arg(None, "cap each student episode (env frames)", min=1)
    disturb_rate: float = arg(0.0, "chance per undisturbed frame that a burst of one random action replaces the "
                                   "student's, so the teacher labels recoveries (after DART; 0: none)", min=0, max=1)
    disturb_frames: int = arg(10, "frames per disturbance burst", min=1)
    workers: int | None = arg(None, "processes that drive a round's tracks, one shard each (default: one per core; "
                                    "at most the cores; with --ray, the Ray tasks of a round)", min=1)
    oracle: str = arg("teacher", "who labels: 'teacher' (privileged pure pursuit), 'planner' (the privileged "
                                 "minimum-time planner), 'ppo' (the shipped PPO expert, from the frames the student "
                                 "sees) or the path of a PPO expert zip; a PPO oracle must drive the student's env "
                                 "(the same gas)")
    ray: str | None = ray_arg()
    resume: bool = arg(False, "go on with a killed run of these flags: a round whose dataset is in --data is not "
                              "driven again, and its fine-tuning continues from its last/")

    def __post_init__(self):
        check_fields(self)
        check_oracle(self.oracle)
        if self.workers is not None and self.ray is None:
            check_workers(self.workers)

    def ignored(self) -> dict[str, str]:
        """The fields these rounds would not use, each with why."""
        return {} if self.disturb_rate else {"disturb_frames": "only with --disturb-rate > 0 (no bursts without it)"}


def dagger(args: DaggerArgs, fine_tune: TrainArgs, threads: int | None = None, on_round=None) -> Path:
    """Run ``args.rounds`` of DAgger from ``args.policy``; returns the final checkpoint folder.

    Each round's dataset goes into ``fine_tune.data`` (its tracks picked by ``fine_tune.seed``),
    then the round's student is fine-tuned on all of it with ``fine_tune`` (its ``init_from``
    the student, its architecture the student's). ``disturb_rate`` > 0 wraps the student's
    env in :class:`ActionBursts` (the chance per undisturbed frame that a
    ``disturb_frames``-frame burst of one random action starts). ``oracle``: who labels, see
    :func:`make_oracle`. Each round's tracks are driven in ``workers`` processes (default:
    one per core), one shard of the round's dataset each, or with ``ray`` as that many Ray tasks
    (:func:`~nac_drive.pipeline.ray_tasks.ray_jobs`; the same shards). ``threads``: the
    fine-tuning's torch threads (:func:`~nac_drive.pipeline.train.train`'s). ``on_round(r, checkpoint, results)``,
    if given, is called after each round with its fine-tuned checkpoint and the student's
    EpisodeResults of that round's drive (the frames it added). With ``resume`` a round whose
    dataset is whole in ``data`` keeps it (its EpisodeResults read back from it, without
    latencies) and its fine-tuning goes on from its ``last/``; see :func:`_resumable`.

    The fine-tuning runs on ``fine_tune.device``; the rounds' drives run on the CPU, one
    frame at a time in forked workers (a forked child cannot use a CUDA context its parent
    made, and one frame is the numba kernels' case).
    """
    from nac_drive.policy.loading import checkpoint_folder, load_driving_policy
    from nac_drive.data_collection.carracing_dataset import refuse_existing, refuse_other_gas
    from nac_drive.devices import resolve_device
    from nac_drive.pipeline.processes import split_runs
    from nac_drive.pipeline.ray_tasks import everywhere, ray_jobs
    from nac_drive.pipeline.train import train
    from nac_drive.pipeline.run_log import log_closed_loop
    from nac_drive.torch_threads import available_cores

    resolve_device(fine_tune.device)   # a device this machine lacks is refused before the first round drives
    data, seed, progress = fine_tune.data, fine_tune.seed, fine_tune.progress
    workers = available_cores() if args.workers is None else args.workers
    runs = [split_runs(round_seeds(r, seed, args.episodes), workers) for r in range(args.rounds)]
    kept = []   # a round is kept only after kept ones: one driven again changes every round after it
    for r in range(args.rounds):
        kept.append(args.resume and (r == 0 or kept[-1]) and recorded(data, dataset_name(r, seed),
                                                                      round_seeds(r, seed, args.episodes)))
    for r in range(args.rounds):   # before driving: the rounds' datasets must be new, or kept
        for run in runs[r] if not kept[r] else ():
            refuse_existing(data, dataset_name(r, seed), run)
    policy_path = Path(checkpoint_folder(args.policy))   # a run folder: its best/, before anything is driven
    oracle = args.oracle if args.oracle in ORACLES else everywhere(args.oracle)   # as a Ray worker names it
    config = load_driving_policy(policy_path).config
    teacher = make_oracle(args.oracle, config.action == "continuous", gas=config.gas)   # fails before any driving
    refuse_other_gas(data, config.gas, "--data")
    if kept and kept[0]:   # the kept rounds were driven with these flags
        refuse_other_rounds(args, fine_tune)
    else:
        record_rounds(args, fine_tune)
    rate, frames = args.disturb_rate, args.disturb_frames
    bursts = f", random-action bursts of {frames} frames at rate {rate}/frame" if rate else ""
    disturbed = " (with random-action bursts)" if rate else ""
    with ray_jobs(args.ray) as ray:
        for r in range(args.rounds):
            if kept[r]:
                results = recorded_round(data, dataset_name(r, seed))
                print(f"DAgger round {r}: kept from a killed run, the student drove {results.format()}", flush=True)
            else:
                results = drive_round(runs[r], policy_path=everywhere(policy_path), oracle=oracle, data=data,
                                      name=dataset_name(r, seed), max_steps=args.max_steps, disturb_rate=rate,
                                      disturb_frames=frames, progress=progress, ray=ray,
                                      description=f"DAgger round {r}: {policy_path} drove, {teacher.name} "
                                                  f"labelled{bursts}")
                print(f"DAgger round {r}: the student drove{disturbed} {results.format()}", flush=True)
            round_args = dataclasses.replace(fine_tune, init_from=str(policy_path),
                                             run_name=round_run_name(fine_tune.run_name, r))
            resume, finished = _resumable(round_args, kept[r]) if args.resume else (False, False)
            if finished:
                run_dir = Path(round_args.out) / round_args.run_name
            else:
                run_dir = train(dataclasses.replace(round_args, resume=resume), threads=threads)
                log_closed_loop(run_dir, results.summary())   # the policy the round started from, as it drove
            policy_path = run_dir / "best"
            if on_round is not None:
                on_round(r, policy_path, results)
    return policy_path


def drive_round(runs: list[list[int]], *, policy_path: str | Path, oracle: str, data: str | Path, name: str,
                max_steps: int | None, disturb_rate: float, disturb_frames: int, description: str, progress: bool,
                ray=None):
    """One round's drive: the student at ``policy_path`` drives each run of track seeds in a
    process of its own, or with ``ray`` (an open :class:`~nac_drive.pipeline.ray_tasks.RayJobs`)
    as a Ray task (:func:`~nac_drive.pipeline.shards.record_shards`), while ``oracle`` labels;
    each run becomes one shard of dataset ``name`` in ``data``. Returns the student's
    EpisodeResults over all runs. The bursts of an episode depend on the round's first track and
    its own, not on how the round is split nor where it runs."""
    from functools import partial

    from nac_drive.data_collection.carracing_dataset import ensure_namespace
    from nac_drive.pipeline.shards import record_shards
    from nac_drive.simulators.carracing import EpisodeResults

    ensure_namespace(data, name)   # before the workers, which would race to create it
    drive = partial(_drive_shard, policy_path=str(policy_path), oracle=oracle, max_steps=max_steps,
                    disturb_rate=disturb_rate, disturb_frames=disturb_frames, burst_seed=runs[0][0],
                    description=description)
    results = EpisodeResults()
    for part in record_shards(drive, runs, root=str(data), name=name, progress=progress, ray=ray):
        results.extend(part)
    return results


def _drive_shard(seeds: list[int], *, policy_path: str, oracle: str, max_steps: int | None, disturb_rate: float,
                 disturb_frames: int, burst_seed: int, description: str, progress: bool = False):
    """One run of :func:`drive_round`: the student drives ``seeds`` while the oracle labels; a
    :class:`~nac_drive.pipeline.shards.DrivenShard` of the student's EpisodeResults and the
    labelled episodes."""
    from nac_drive.agents.driver import PolicyDriver
    from nac_drive.pipeline.shards import DrivenShard
    from nac_drive.policy.loading import load_driving_policy
    from nac_drive.simulators.carracing import run_episodes

    policy = load_driving_policy(policy_path)
    continuous = policy.config.action == "continuous"
    teacher = make_oracle(oracle, continuous, gas=policy.config.gas)
    env = student_env(teacher, continuous, gas=policy.config.gas, disturb_rate=disturb_rate,
                      disturb_frames=disturb_frames, seed=burst_seed)
    try:
        results = run_episodes(PolicyDriver(policy), seeds, continuous=continuous, max_steps=max_steps, env=env,
                               progress=progress)
        return DrivenShard(results, env.take_episodes(), env.env.spec, teacher.name, description)
    finally:
        env.close()


def recorded(data: str | Path, name: str, seeds: list[int]) -> bool:
    """Whether a round's dataset ``name`` in ``data`` holds every one of its tracks ``seeds``
    (its shards are committed together, :func:`drive_round`; however many workers split them)."""
    from nac_drive.data_collection.carracing_dataset import recorded_tracks

    return set(seeds) <= recorded_tracks(data, name)


def rounds_record(fine_tune: TrainArgs) -> Path:
    """The file beside a DAgger run's round folders that records what its rounds were driven
    with: ``<out>/<run_name>.json``."""
    return Path(fine_tune.out) / f"{fine_tune.run_name or 'dagger'}.json"


def driven_with(args: DaggerArgs, fine_tune: TrainArgs) -> dict:
    """What decides a round's dataset: the DAgger flags but how it runs (``resume``, ``workers``,
    ``ray``) and how many rounds (a resumed run may add some), the data and the seed (which tracks)."""
    return {**{name: value for name, value in dataclasses.asdict(args).items()
               if name not in ("resume", "workers", "ray", "rounds")},
            "policy": str(Path(args.policy).resolve()), "data": str(Path(fine_tune.data).resolve()),
            "seed": fine_tune.seed}


def record_rounds(args: DaggerArgs, fine_tune: TrainArgs) -> None:
    """Write :func:`rounds_record` before the first round drives."""
    from nac_drive.io.checkpoint import write_json

    record = rounds_record(fine_tune)
    record.parent.mkdir(parents=True, exist_ok=True)
    write_json(record, driven_with(args, fine_tune))


def refuse_other_rounds(args: DaggerArgs, fine_tune: TrainArgs) -> None:
    """``--resume`` keeps rounds only driven with these flags (:func:`driven_with`, as
    :func:`rounds_record` holds them): any other is refused in one line, naming them. A run from
    before the record was kept is taken as it is, and recorded now."""
    from nac_drive.fields import changed_fields
    from nac_drive.io.checkpoint import read_json

    record, now = rounds_record(fine_tune), driven_with(args, fine_tune)
    if not record.is_file():
        record_rounds(args, fine_tune)
        return
    differ = changed_fields(read_json(record), now)
    if differ:
        raise ValueError(f"--resume: the rounds kept in --data were driven with other {', '.join(differ)} ({record}); "
                         "resume with the killed run's flags, or give another --run-name or --out")


def recorded_round(data: str | Path, name: str):
    """The student's EpisodeResults of a round, read back from its dataset ``name`` in ``data``:
    its tracks, returns, lengths and laps (no latencies: they were not recorded)."""
    from nac_drive.data_collection.carracing_dataset import dataset_folder, load_episodes
    from nac_drive.simulators.carracing import EpisodeResults

    episodes = sorted(load_episodes(dataset_folder(data, name)), key=lambda episode: episode.seed)
    return EpisodeResults(seeds=[e.seed for e in episodes], returns=[e.total_reward for e in episodes],
                          lengths=[len(e) for e in episodes], laps=[lap_finished(e) for e in episodes])


def lap_finished(episode) -> bool:
    """Whether a recorded CarRacing episode ended with its lap finished: the env ended it (not
    the time limit) and not for leaving the playfield, whose last reward is exactly -100."""
    return episode.terminated and float(episode.rewards[-1]) != OFF_PLAYFIELD_REWARD


def _resumable(round_args: TrainArgs, kept: bool) -> tuple[bool, bool]:
    """(resume, finished) for a round's fine-tuning in a resumed run: it goes on from its
    ``last/`` if its dataset was kept (``finished``: every epoch trained). A folder of the round
    without a ``last/`` (killed before its first epoch) is removed, so that the round trains in
    its own place, never into ``<run>-2``. One with a checkpoint is refused in one line if its
    dataset was not kept (another run's folder) or it was trained with other arguments."""
    import shutil

    from nac_drive.io.checkpoint import read_json
    from nac_drive.pipeline.train import trained_otherwise

    run_dir = Path(round_args.out) / round_args.run_name
    state = run_dir / "last" / "train_state.json"
    if not state.is_file():
        shutil.rmtree(run_dir, ignore_errors=True)
        return False, False
    if not kept:
        raise ValueError(f"--resume: {run_dir} holds a checkpoint, but its round's dataset is not in --data (another "
                         "run's, or one driven again): give another --run-name or --out")
    differ = trained_otherwise(run_dir, round_args)
    if differ:
        raise ValueError(f"--resume: {run_dir} was fine-tuned with other {', '.join(differ)}; resume with the killed "
                         "run's flags, or give another --run-name or --out")
    return True, read_json(state).get("epoch", -1) + 1 >= round_args.epochs


def round_run_name(run_name: str | None, round_index: int) -> str:
    """The run folder of a round's fine-tuning: ``--run-name`` (default "dagger") and ``-r<round>``."""
    return f"{run_name or 'dagger'}-r{round_index}"


def round_seeds(round_index: int, seed: int, episodes: int) -> list[int]:
    """The collection-range tracks a DAgger round drives."""
    from nac_drive.simulators.carracing import COLLECT_SEED_BASE

    first = COLLECT_SEED_BASE + DAGGER_SEED_OFFSET + 1000 * seed + episodes * round_index
    return list(range(first, first + episodes))


def dataset_name(round_index: int, seed: int) -> str:
    """Name of the dataset a DAgger round adds to ``--data``."""
    return f"dagger-r{round_index}-s{seed}"


ORACLES = ("teacher", "planner", "ppo")   # by name; or the path of a PPO expert zip


def check_oracle(spec: str) -> None:
    """Refuse an ``--oracle`` that is neither a known name nor an existing file, before any driving."""
    if spec not in ORACLES and not Path(spec).is_file():
        raise ValueError(f"--oracle {spec}: not one of {', '.join(ORACLES)} nor a PPO expert zip that exists")


def make_oracle(spec: str, continuous: bool, *, gas: float = DISCRETE_GAS):
    """The DAgger oracle: ``"teacher"`` (privileged pure pursuit, reads the env's state),
    ``"planner"`` (the privileged minimum-time planner), ``"ppo"`` (the shipped PPO expert)
    or the path of a PPO expert zip. A privileged oracle labels in the student's action space
    (its discrete twin for a discrete student, set for the student's ``gas``). A PPO oracle
    sees the frames the student sees (it preprocesses them itself) and, between its
    decisions, labels the action it is holding, as it would drive. It must drive the
    student's env: the same actions (``continuous``) with the same ``gas``."""
    if spec in ("teacher", "planner"):
        from nac_drive.agents.experts import load_expert

        return load_expert(spec if continuous else f"{spec}-discrete", gas=None if continuous else gas)[0]
    from nac_drive.agents.ppo_expert import PPOExpert

    expert = PPOExpert(None if spec == "ppo" else spec)
    if expert.continuous != continuous:
        kind = lambda c: "continuous" if c else "discrete"   # noqa: E731
        raise ValueError(f"--oracle {spec}: the expert has {kind(expert.continuous)} actions, "
                         f"the student {kind(continuous)} ones")
    if expert.gas != gas:
        raise ValueError(f"--oracle {spec}: the expert's GAS presses {expert.gas}, the student's {gas} "
                         "(they must drive the same env)")
    return expert


def student_env(teacher, continuous: bool, *, gas: float = DISCRETE_GAS, disturb_rate: float = 0.0,
                disturb_frames: int = 10, seed: int = 0):
    """The env a DAgger round drives: CarRacing (see :func:`make_carracing`), with random-action
    bursts if ``disturb_rate`` > 0, recorded with the oracle ``teacher``'s action as every
    frame's label."""
    from nac_drive.data_collection.episode_recorder import RecordEpisodes
    from nac_drive.simulators.carracing import FPS, ActionBursts, make_carracing

    env = make_carracing(continuous=continuous, gas=gas)
    if disturb_rate:
        env = ActionBursts(env, disturb_rate, disturb_frames, seed=seed)
    return RecordEpisodes(env, fps=FPS, oracle=teacher)
