"""Evaluation of CarRacing experts: the shipped PPO expert, any PPO zip, the privileged
teacher or planner, or a random actor, scored on a run of consecutive track seeds (by default the
held-out tracks 900000, 900001, ...)."""

from __future__ import annotations

from dataclasses import dataclass

from nac_drive.devices import device_arg
from nac_drive.fields import MAX_EPISODES, MAX_SEED, REQUIRED, arg, check_fields
from nac_drive.simulators.carracing import EVAL_SEED_BASE
from nac_drive.simulators.perturbations import check_perturb_flag, perturb_arg


@dataclass
class ExpertEvalArgs:
    """Arguments of ``nac-drive expert eval``."""

    expert: str | None = arg(None, "SB3 zip of a PPO expert, 'teacher' (privileged, continuous), "
                                   "'teacher-discrete', 'planner' (privileged minimum-time speed profile), "
                                   "'planner-discrete', 'random' or 'random-discrete'; default: the shipped PPO expert")
    episodes: int = arg(20, "number of tracks", min=1, max=MAX_EPISODES)
    seed_base: int = arg(EVAL_SEED_BASE, "seed of the first track (held-out tracks start at 900000)", min=0,
                         max=MAX_SEED)
    max_steps: int | None = arg(None, "cap each episode at this many env frames (default: the env's 1000)", min=1)
    gas: float | None = arg(None, "teacher-, planner- and random-discrete: what the GAS action presses (default 0.2, "
                                  "gymnasium's discrete env); a PPO zip drives with the gas its zip records "
                                  "('compare --gas' drives it with another)", above=0, max=1)
    video: str | None = arg(None, "write the episodes to a WebM (VP8) video", metavar="WEBM")
    perturb: str | None = perturb_arg()
    device: str = device_arg()

    def __post_init__(self):
        check_fields(self)
        check_perturb_flag(self.perturb)

    def ignored(self) -> dict[str, str]:
        """The fields this evaluation would not use, each with why."""
        from nac_drive.agents.experts import runs_network

        return {} if runs_network(self.expert) else {"device": f"{self.expert} runs no network (a PPO expert does)"}


@dataclass
class ExpertCompareArgs:
    """Arguments of ``nac-drive expert compare``."""

    zips: list[str] = arg(REQUIRED, "SB3 zips of PPO experts", positional=True, metavar="ZIP")
    episodes: int = arg(20, "number of tracks", min=1, max=MAX_EPISODES)
    seed_base: int = arg(70_000, "seed of the first track (inside the expert training range, clear of its "
                                 "training and validation tracks)", min=0, max=MAX_SEED)
    gas: float | None = arg(None, "drive every zip with the GAS action pressing this instead of the gas its zip "
                                  "records (discrete experts; see 'ship --gas')", above=0, max=1)
    device: str = device_arg()

    def __post_init__(self):
        check_fields(self)


def evaluate_expert(args: ExpertEvalArgs, progress: bool = True):
    """Drive ``args.expert`` (see :func:`~nac_drive.agents.experts.load_expert`; None: the
    shipped PPO expert) on ``args.episodes`` tracks from ``args.seed_base``; returns (its
    name, EpisodeResults). ``gas``: what a discrete teacher's or random actor's GAS presses
    (default ``DISCRETE_GAS``); a PPO zip drives with its own."""
    from nac_drive.agents.experts import load_expert
    from nac_drive.simulators.carracing import eval_seeds, run_episodes

    actor, continuous = load_expert(args.expert, gas=args.gas, device=args.device)
    seeds = eval_seeds(args.episodes, base=args.seed_base)
    results = run_episodes(actor, seeds, continuous=continuous, max_steps=args.max_steps, video_path=args.video,
                           progress=progress, perturb=args.perturb)
    return actor.name, results


def compare_experts(args: ExpertCompareArgs, progress: bool = True) -> dict:
    """Score PPO zips on the same tracks in the training's evaluation env (only the frames
    the expert sees are drawn; same returns as :func:`evaluate_expert`). Every zip is
    checked before any drives; one line per zip as it finishes, and with ``progress`` a bar.
    ``gas``: every zip drives with GAS pressing it instead of its own; ``device``: where their
    networks run. Returns {path: EpisodeResults}."""
    from tqdm import tqdm

    from nac_drive.agents.ppo_lab.training import score_checkpoint
    from nac_drive.agents.ppo_lab.expert_zip import load_expert_zip
    from nac_drive.devices import resolve_device

    resolve_device(args.device)   # a device this machine lacks is refused before any zip is read
    for path in args.zips:
        load_expert_zip(path, args.gas)   # a bad zip fails before any other is driven
    scored = {}
    for path in tqdm(args.zips, desc="zips", unit="zip", disable=not progress):
        scored[path] = score_checkpoint(path, args.episodes, args.seed_base, args.gas, args.device)
        tqdm.write(f"{path}: {scored[path].format()}")
    return scored
