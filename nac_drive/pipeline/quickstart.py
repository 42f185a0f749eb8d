"""The main job on built-in defaults: drive a policy on unseen tracks, record its traces
and Grad-CAM overlays, and build the dashboard; ``full`` first makes that policy with the
shipped recipe, from an expert: collect -> behaviour cloning -> DAgger with disturbances
(the expert labels the student's states while random-action bursts push it off its line).

Everything goes into a fresh output folder (``out``, or ``out-2``, ... if it exists):
``drive.webm``, ``run/trace/`` (+ ``run/saliency.npz``) and ``dashboard.html``, of the
first ``recorded`` tracks driven (all are scored); ``full`` adds ``demos/`` (Minari
datasets: the expert's and each DAgger round's) and ``train/`` (the run folders), and also
scores the expert on the tracks the policy drove, so the summary says what share of its
expert the policy reached.

How big each stage is comes from ``budget`` (:data:`BUDGETS`); a flag given explicitly
overrides its budget's value.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from pathlib import Path

from nac_drive.fields import MAX_EPISODES, MAX_SEED, arg, check_fields, flag_name
from nac_drive.pipeline.processes import process_pool

VIDEO = "drive.webm"
TRACKS = 3         # held-out tracks the shipped policy drives (without --full)
DAGGER_LR = 2e-4   # DAgger's fine-tuning, as in the shipped recipe (BENCHMARKS.md §3)
FULL = "--full (make the policy first)"   # the flags of --full alone


@dataclass(frozen=True)
class Budget:
    """Sizes of the stages of ``quickstart --full``."""

    collect_episodes: int      # expert demonstrations (one track each)
    epochs: int                # behaviour cloning: passes over ...
    windows_per_epoch: int     # ... this many sampled windows
    dagger_rounds: int         # DAgger rounds after behaviour cloning (0: none)
    dagger_episodes: int       # student episodes per round
    dagger_epochs: int         # fine-tuning epochs per round ...
    dagger_windows: int        # ... of this many windows
    episodes: int              # held-out tracks the policy and its expert are scored on


# "standard": the shipped CNN+NAC recipe's stages, scored on 20 held-out tracks, sized to reach
# 95% of the shipped PPO expert within 45 minutes on 2 CPU cores (97.0% in 36-44 minutes there, two runs);
# "small": the same stages smaller, scored on 3, a first look. Timings and scores: BENCHMARKS.md §3.
# The PPO expert steers in one-frame pulses: behaviour cloning needs about 8k windows before
# it predicts more than its most common action (gas), and the student needs DAgger rounds to stop
# spinning out. Smaller, in single runs: 8 behaviour-cloning epochs gave 91.2% of the expert, 6 and
# 2 fine-tuning epochs a round 84.2%; 20 demonstrations and 4 rounds 91.3%.
BUDGETS = {
    "small": Budget(collect_episodes=5, epochs=4, windows_per_epoch=2048, dagger_rounds=1, dagger_episodes=2,
                    dagger_epochs=1, dagger_windows=1024, episodes=3),
    "standard": Budget(collect_episodes=30, epochs=10, windows_per_epoch=4096, dagger_rounds=10, dagger_episodes=4,
                       dagger_epochs=3, dagger_windows=3072, episodes=20),
}


@dataclass
class QuickstartArgs:
    """Arguments of ``nac-drive quickstart`` (one flag per field)."""

    out: str = arg("runs/quickstart", "output folder (<out>-2, -3, ... if it exists)")
    episodes: int | None = arg(None, "held-out tracks to drive and score (default: 3; with --full the budget's, "
                                     "20 for 'standard' so the share of the expert is not 3 tracks' luck)", min=1,
                                 max=MAX_EPISODES)
    recorded: int = arg(3, "of the driven tracks, the first this many go into the video, traces, Grad-CAM "
                           "overlays and dashboard", min=1)
    max_steps: int | None = arg(None, "cap every episode, driven or collected (env frames; default the env's 1000)",
                                min=1)
    saliency: bool = arg(True, "Grad-CAM overlays of the driven frames (--no-saliency skips them)")
    full: bool = arg(False, "make the policy first (collect -> train -> DAgger) instead of driving the shipped one")
    budget: str = arg("standard", "stage sizes, 'small' (a first look) or 'standard' (~95% of the expert "
                                  "on 20 held-out tracks); --episodes and the flags below override them (DAgger's "
                                  "fine-tuning sizes come from the budget alone)", choices=tuple(BUDGETS), group=FULL)
    expert: str = arg("ppo", "expert that demonstrates and labels (ppo, teacher, teacher-discrete or a "
                             "PPO zip)", group=FULL)
    collect_episodes: int | None = arg(None, "demonstration episodes (default: the budget's)", min=1,
                                       max=MAX_EPISODES, group=FULL)
    core: str = arg("nac", "temporal core (nac, lstm, gru, cfc, ltc, mha)", group=FULL)
    epochs: int | None = arg(None, "behaviour-cloning epochs (default: the budget's)", min=1, group=FULL)
    windows_per_epoch: int | None = arg(None, "windows per epoch, 0: all (default: the budget's)", min=0, group=FULL)
    dagger_rounds: int | None = arg(None, "DAgger rounds, 0: none (default: the budget's)", min=0, group=FULL)
    disturb_rate: float = arg(0.02, "chance per frame of a random-action burst in DAgger", min=0, max=1, group=FULL)
    disturb_frames: int = arg(8, "frames per burst", min=1, group=FULL)
    seed: int = arg(0, "seed of collection, training and DAgger", min=0, group=FULL, max=MAX_SEED)

    def __post_init__(self):
        check_fields(self)
        if not self.full:   # a flag of --full alone would silently do nothing
            for f in fields(self):
                if f.metadata["group"] == FULL and getattr(self, f.name) != f.default:
                    raise ValueError(f"{flag_name(f.name)}: only with --full")

    def ignored(self) -> dict[str, str]:
        """The fields this run would not use, each with why (the flags of --full alone are
        refused by ``__post_init__``)."""
        if self.full and not self.stages().dagger_rounds:
            return {name: "only with DAgger rounds (--dagger-rounds 0 runs none)"
                    for name in ("disturb_rate", "disturb_frames")}
        return {}

    def stages(self) -> Budget:
        """The budget's stage sizes, with the ones given explicitly in their place."""
        given = {f.name: value for f in fields(Budget) if (value := getattr(self, f.name, None)) is not None}
        return replace(BUDGETS[self.budget], **given)

    def tracks(self) -> int:
        """Held-out tracks to drive and score."""
        if self.full:
            return self.stages().episodes
        return TRACKS if self.episodes is None else self.episodes


def quickstart(args: QuickstartArgs, progress: bool = True) -> dict:
    """Run the quickstart; returns the drive summary with the paths it wrote, ``seconds``
    (wall time) and ``stage_seconds``; with ``full`` also ``expert`` (the expert's summary on
    the same tracks) and ``share_of_expert`` (the policy's mean return over the expert's)."""
    from nac_drive.interpret.trace import TRACE_DIR
    from nac_drive.io.atomic import fresh_dir
    from nac_drive.pipeline.drive import DriveArgs, drive_carracing

    if args.full:
        _check_recipe(args)
    out = fresh_dir(args.out)
    print(f"output folder: {out}", flush=True)
    started = time.perf_counter()
    stage_seconds: dict[str, float] = {}
    policy_path = _make_policy(args, out, progress, stage_seconds) if args.full else None
    tracks = args.tracks()
    print(f"driving {'the shipped policy' if policy_path is None else policy_path} on {tracks} held-out tracks "
          f"(recording the first {min(args.recorded, tracks)}) ...", flush=True)
    with process_pool(1) as pool:   # a pool starts no process before a submit
        expert_scored = None
        if args.full:   # the expert drives the same tracks on the other core meanwhile
            print(f"(the {args.expert} expert drives them beside it, to score it)", flush=True)
            expert_scored = pool.submit(_score_expert, args, tracks)
        with _timed(stage_seconds, "drive"):
            summary = drive_carracing(DriveArgs(policy=policy_path, episodes=tracks, max_steps=args.max_steps,
                                                video=str(out / VIDEO), trace=str(out / "run")),
                                      progress=progress, recorded=args.recorded)
        print(summary.pop("text"))
        if expert_scored is not None:
            with _timed(stage_seconds, "expert"):   # what the drive did not hide of the expert's scoring
                expert = expert_scored.result()
    if args.full:
        from nac_drive.simulators.episode_stats import format_return_stats

        # a share of a return <= 0 (e.g. episodes cut short by max_steps) means nothing: None
        share = round(summary["mean_return"] / expert["mean_return"], 4) if expert["mean_return"] > 0 else None
        summary.update(expert=expert, share_of_expert=share)
        print(f"the expert on the same tracks: {format_return_stats(expert)}; the policy reached "
              f"{'n/a' if share is None else f'{100 * share:.1f}%'} of it", flush=True)
    run = Path(summary["trace"])
    with _timed(stage_seconds, "dashboard"):
        dashboard = _dashboard(policy_path, run, out, with_saliency=args.saliency, progress=progress)
    summary.update(video=str(out / VIDEO), trace=str(run / TRACE_DIR), dashboard=str(dashboard),
                   seconds=round(time.perf_counter() - started, 1), stage_seconds=stage_seconds)
    return summary


@contextmanager
def _timed(stage_seconds: dict[str, float], name: str):
    """Record the wall time of the block as ``stage_seconds[name]``."""
    start = time.perf_counter()
    yield
    stage_seconds[name] = round(time.perf_counter() - start, 1)


def _make_policy(args: QuickstartArgs, out: Path, progress: bool, stage_seconds: dict[str, float]) -> Path:
    """collect -> behaviour cloning -> DAgger with disturbances; returns the final checkpoint
    (each stage's wall time goes into ``stage_seconds``)."""
    from nac_drive.pipeline.collect import CollectArgs, collect_carracing
    from nac_drive.pipeline.dagger import DaggerArgs, dagger
    from nac_drive.pipeline.train import train
    from nac_drive.pipeline.train_args import TrainArgs
    from nac_drive.simulators.carracing import COLLECT_SEED_BASE
    from nac_drive.torch_threads import available_cores

    sizes = args.stages()
    demos = out / "demos"
    print(f"collecting {sizes.collect_episodes} episodes with the {args.expert} expert ...", flush=True)
    with _timed(stage_seconds, "collect"):
        _, results = collect_carracing(CollectArgs(expert=args.expert, episodes=sizes.collect_episodes,
                                                   seed_base=COLLECT_SEED_BASE + args.seed,
                                                   out=str(demos), max_steps=args.max_steps,
                                                   name=f"quickstart-s{args.seed}", workers=available_cores()),
                                       progress=progress)
    print(results.format())
    print(f"training a CNN+{args.core} policy on {demos} ...", flush=True)
    common = dict(data=str(demos), out=str(out / "train"), seed=args.seed, progress=progress)
    with _timed(stage_seconds, "train"):
        policy = train(TrainArgs(**common, core=args.core, epochs=sizes.epochs,
                                 windows_per_epoch=sizes.windows_per_epoch)) / "best"
    if sizes.dagger_rounds:
        print(f"{sizes.dagger_rounds} DAgger rounds, the {args.expert} expert labelling ...", flush=True)
        rounds = DaggerArgs(policy=str(policy), rounds=sizes.dagger_rounds, episodes=sizes.dagger_episodes,
                            max_steps=args.max_steps, disturb_rate=args.disturb_rate,
                            disturb_frames=args.disturb_frames, oracle=_oracle(args.expert))
        fine_tune = TrainArgs(**common, epochs=sizes.dagger_epochs, windows_per_epoch=sizes.dagger_windows,
                              lr=DAGGER_LR, run_name="dagger")   # the architecture: each round's student's
        with _timed(stage_seconds, "dagger"):
            policy = dagger(rounds, fine_tune)
    return policy


def _check_recipe(args: QuickstartArgs) -> None:
    """Refuse a core, expert or oracle that cannot work before any folder or stage: each
    stage takes minutes."""
    from nac_drive.agents.experts import load_expert
    from nac_drive.policy.cores import CORES
    from nac_drive.pipeline.dagger import make_oracle
    from nac_drive.simulators.carracing import actor_gas

    if args.core not in CORES:
        raise ValueError(f"--core: must be one of {', '.join(CORES)}, got {args.core!r}")
    actor, continuous = load_expert(args.expert)
    if args.stages().dagger_rounds:
        make_oracle(_oracle(args.expert), continuous, gas=actor_gas(actor))


def _oracle(expert: str) -> str:
    """The DAgger oracle that labels as ``expert`` demonstrated (``nac-drive dagger --oracle``)."""
    if expert.startswith("random"):
        raise ValueError(f"--expert {expert}: random actions cannot label DAgger rounds (--dagger-rounds 0 "
                         "skips them)")
    return "teacher" if expert in ("teacher", "teacher-discrete") else expert


def _score_expert(args: QuickstartArgs, tracks: int) -> dict:
    """The expert's summary on the ``tracks`` held-out tracks the policy drove (no progress
    bar: it runs beside the drive's)."""
    from nac_drive.pipeline.evaluate import ExpertEvalArgs, evaluate_expert

    # in a forked worker, which cannot use a CUDA context: the CPU (one frame at a time is its case anyway)
    name, results = evaluate_expert(ExpertEvalArgs(expert=args.expert, episodes=tracks, max_steps=args.max_steps,
                                                   device="cpu"), progress=False)
    return {"name": name, **results.summary()}


def _dashboard(policy_path, run: Path, out: Path, with_saliency: bool, progress: bool) -> Path:
    from nac_drive.policy.loading import load_driving_policy
    from nac_drive.interpret.dashboard import build_dashboard

    if with_saliency:
        from nac_drive.interpret.policy_saliency import policy_saliency

        policy_saliency(load_driving_policy(policy_path), run, progress=progress)
    return build_dashboard(run, out / "dashboard.html", title="nac-drive quickstart", video=out / VIDEO)
