"""Training a PPO expert (stable-baselines3), resuming a run, and scoring its checkpoints.

Training recipe (measured on a 2-core CPU, see :class:`ExpertTrainArgs`): PPO with
NatureCNN and [256] heads, 2 SubprocVecEnv workers, reward normalisation only, a
linearly decayed learning rate, and a training-only truncation after a streak of
negative rewards (an episode stuck on the grass teaches nothing). Checkpoints vary a
lot between updates, so the best one is chosen by evaluation on fixed validation
tracks (from the training seed range); every evaluated checkpoint is kept, with what
:func:`resume` needs to go on from it.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from stable_baselines3.common.callbacks import BaseCallback, EvalCallback

from nac_drive.agents.ppo_lab.env import Preprocessing, make_vec_env
from nac_drive.agents.ppo_lab.kickstarted_ppo import KickstartedPPO
from nac_drive.agents.ppo_lab.expert_zip import (LoadedPolicy, load_expert_zip, read_tensors, trained_agent_steps,
                                         trained_gamma)
from nac_drive.agents.ppo_lab.training_args import FRAME_SIZE, ExpertTrainArgs
from nac_drive.devices import resolve_device
from nac_drive.io.atomic import atomic_write, fresh_dir
from nac_drive.io.checkpoint import dataclass_from_json, read_json
from nac_drive.simulators.carracing import DISCRETE_GAS, EpisodeResults
from nac_drive.torch_threads import available_cores


def train_expert(args: ExpertTrainArgs, from_checkpoint: Path | None = None) -> Path:
    """Train a PPO expert; returns the path of the best checkpoint's zip.

    ``from_checkpoint``: a checkpoint the run ``args.out/args.run_name`` kept at an
    evaluation, to go on from (see :func:`resume`) instead of starting."""
    from stable_baselines3 import PPO

    device = resolve_device(args.device)   # a device this machine lacks is refused before the run folder exists
    torch.set_num_threads(1)
    kind = "continuous" if args.continuous else "discrete"
    run_name = args.run_name or (
        f"ppo_{kind}_s{args.seed}_{args.total_frames // 1000}kf_{time.strftime('%Y%m%d-%H%M%S')}")
    start = load_expert_zip(args.init_from) if args.init_from and from_checkpoint is None else None  # fails early
    if start is not None:   # a fine-tune sees, acts and discounts as its start was trained to, unless told
        _check_kind(start, args)
        seen = {name: getattr(args, name) or getattr(start.preprocessing, name)
                for name in ("action_repeat", "frame_stack", "gas")}
        args = replace(args, gamma=args.gamma or trained_gamma(args.init_from), **seen)
    if from_checkpoint is None:   # a new run never writes into an existing run's folder
        run_dir = fresh_dir(Path(args.out) / run_name)
        args = replace(args, run_name=run_dir.name)
        print(f"run folder: {run_dir}", flush=True)
    else:
        run_dir = Path(args.out) / run_name
    atomic_write(run_dir / "args.json", lambda tmp: Path(tmp).write_text(json.dumps(asdict(args), indent=2)))

    view = dict(continuous=args.continuous, skip_render=args.skip_render,
                preprocessing=Preprocessing(FRAME_SIZE, args.frame_stack, args.action_repeat, gas=args.gas))
    venv = make_vec_env(n_envs=args.n_envs, patience=args.negative_patience, reward_gamma=args.gamma,
                        teacher_labels=bool(args.teacher_fit_lr), **view)
    venv.seed(args.seed)
    eval_env = make_vec_env(**view)

    lr0 = args.learning_rate
    algorithm, kickstart = PPO, {}
    if args.teacher_fit_lr:
        algorithm = KickstartedPPO
        kickstart = dict(teacher_fit_lr=args.teacher_fit_lr, teacher_fit_epochs=args.teacher_fit_epochs)
    model = algorithm(
        "CnnPolicy", venv,
        learning_rate=lambda progress: lr0 * progress,  # progress: 1 -> 0
        n_steps=args.n_steps, batch_size=args.batch_size, n_epochs=args.n_epochs,
        gamma=args.gamma, gae_lambda=args.gae_lambda, clip_range=args.clip_range,
        ent_coef=args.ent_coef,
        policy_kwargs=dict(net_arch=dict(pi=[args.head_units], vf=[args.head_units]),
                           **({"log_std_init": args.log_std_init} if args.continuous else {})),
        tensorboard_log=str(run_dir / "tb"), seed=args.seed, device=device, verbose=0,
        **kickstart,
    )
    # Saved into the zip's JSON `data` (SB3 ignores it): every reader sees and acts as in training.
    model.preprocessing = view["preprocessing"].to_json()
    callback = FixedSeedEval(
        eval_env, seed=args.eval_seed, n_eval_episodes=args.eval_episodes,
        eval_freq=_eval_freq(args), log_path=str(run_dir / "eval"), deterministic=True, verbose=1,
        callback_on_new_best=SaveAtomically(run_dir / "best_model.zip"),
        callback_after_eval=KeepEvaluated(run_dir / "evaluated", args.action_repeat)
        if args.keep_evaluated or from_checkpoint else None)
    if from_checkpoint is not None:
        _restore(model, from_checkpoint, callback)
        model.set_random_seed(resume_seed(args, model.num_timesteps))
    elif args.init_from:
        _start_from(model.policy, start, args)
        model.save(run_dir / "init_model.zip")
    model.learn(args.total_frames // args.action_repeat - model.num_timesteps,
                callback=[callback, UpdateThreads(args.update_threads)], tb_log_name=run_dir.name,
                reset_num_timesteps=from_checkpoint is None, progress_bar=args.progress_bar)
    model.save(run_dir / "final_model.zip")
    venv.close()
    eval_env.close()
    best = run_dir / "best_model.zip"
    return best if best.exists() else run_dir / "final_model.zip"


def _eval_freq(args: ExpertTrainArgs) -> int:
    """Agent steps per worker between evaluations."""
    return max(1, args.eval_every_frames // (args.action_repeat * args.n_envs))


def resume_expert(run_dir: str | Path, total_frames: int | None = None) -> Path:
    """Continue a run that was stopped (one session is rarely enough for millions of
    frames) from the last checkpoint it kept at an evaluation: weights, Adam state, reward
    normalisation, frame count, evaluation history and best score. What it did after that
    evaluation is lost, ``final_model.zip`` included, and a kickstarted run's teacher fit
    (``--teacher-fit-lr``) starts with a fresh Adam.

    Every argument comes from the run's ``args.json``; ``total_frames`` sets a new target
    (written back to it). The learning rate decays linearly to 0 at the target, so it
    goes on where it was only if the target is unchanged. Returns the best zip."""
    run_dir = Path(run_dir)
    saved = run_dir / "args.json"
    if not saved.is_file():
        raise FileNotFoundError(f"resume: {saved} not found (is {run_dir} a run folder of `expert train`?)")
    # runs from before --gas existed drove gymnasium's discrete env
    saved_args = {"gas": DISCRETE_GAS, **_without_retired(read_json(saved), saved)}
    args = dataclass_from_json(ExpertTrainArgs, {**saved_args, "out": str(run_dir.parent), "run_name": run_dir.name},
                               str(saved))
    if total_frames is not None:
        args.total_frames = total_frames
    kept = _last_kept(run_dir / "evaluated")
    done = trained_agent_steps(kept) * args.action_repeat
    if done >= args.total_frames:
        raise ValueError(f"resume: {kept} is at {done} frames, the run's target is {args.total_frames}; "
                         "set a larger one with --total-frames")
    return train_expert(args, from_checkpoint=kept)


# Options runs once had (their experiments did not ship; BENCHMARKS.md §10), with the
# value under which a run is the same without them (None: any value, they acted only at the start).
_RETIRED = {"combined_actions": False, "negative_streak_terminates": False,
            "transfer_steps": None, "released_brake": None}


def _without_retired(saved: dict[str, Any], path: Path) -> dict[str, Any]:
    """A run's ``args.json`` without the retired options; ``ValueError`` if the run used one."""
    for name, neutral in _RETIRED.items():
        if neutral is not None and saved.get(name, neutral) != neutral:
            raise ValueError(f"resume: {path} has {name}={saved[name]!r}, an option removed after commit "
                             "9f5ea65; resume this run with that commit")
    return {name: value for name, value in saved.items() if name not in _RETIRED}


def resume_seed(args: ExpertTrainArgs, agent_steps_done: int) -> int:
    """Seed of a run resumed after ``agent_steps_done``: new tracks and new noise for each
    evaluation interval, inside the training seed range and clear of the validation tracks."""
    from nac_drive.simulators.carracing import COLLECT_SEED_BASE

    interval = agent_steps_done // (_eval_freq(args) * args.n_envs)
    seed = args.seed + args.n_envs * interval
    # worker i is seeded with seed + i; the validation tracks are eval_seed + j, j < eval_episodes
    if seed < args.eval_seed + args.eval_episodes and args.eval_seed < seed + args.n_envs:
        seed = args.eval_seed + args.eval_episodes
    if seed + args.n_envs > COLLECT_SEED_BASE:
        raise ValueError(f"resume: seed {seed} would leave the training seed range [0, {COLLECT_SEED_BASE})")
    return seed


_KEPT = re.compile(r"frames_(\d+)\.zip")
# What a kept checkpoint's JSON holds besides the best score: VecNormalize's reward
# statistics, and EvalCallback's history.
_REWARD_NORM = ("mean", "var", "count")
_EVAL_HISTORY = ("evaluations_timesteps", "evaluations_results", "evaluations_length")
_EVAL_TRACKS = "consecutive"  # evaluations on eval_seed, eval_seed + 1, ... (ConsecutiveTrackSeeds)


def _last_kept(folder: Path) -> Path:
    """The kept checkpoint with the most frames (kept files are written atomically)."""
    kept = [(int(m.group(1)), p) for p in folder.glob("frames_*.zip") if (m := _KEPT.fullmatch(p.name))]
    if not kept:
        raise FileNotFoundError(f"resume: no kept checkpoint in {folder} (runs keep one at each "
                                "evaluation unless started with --no-keep-evaluated)")
    return max(kept)[1]


def _restore(model, kept: Path, callback: EvalCallback) -> None:
    """Put ``model`` and ``callback`` back in the state they were in when ``kept`` was saved."""
    from nac_drive.io.checkpoint import restore_optimizer

    state_path = kept.with_suffix(".json")
    if not state_path.is_file():
        raise FileNotFoundError(f"resume: {state_path} not found: without it {kept.name} cannot be "
                                "resumed (start a new run from it with --init-from)")
    state = _kept_state(state_path)
    policy = load_expert_zip(kept).policy
    try:
        model.policy.load_state_dict(policy.state_dict())
    except RuntimeError as exc:
        raise ValueError(f"resume: {kept} does not fit the run's args.json: {exc}") from exc
    model.num_timesteps = trained_agent_steps(kept)
    restore_optimizer(model.policy.optimizer, read_tensors(kept, "policy.optimizer.pth"),
                      f"{kept}: policy.optimizer.pth")
    rms = model.get_vec_normalize_env().ret_rms
    for name in _REWARD_NORM:
        setattr(rms, name, np.float64(state["reward_norm"][name]))
    for name in _EVAL_HISTORY:
        setattr(callback, name, state[name])
    callback.best_mean_reward = state["best_mean_reward"]
    if state.get("eval_tracks") != _EVAL_TRACKS:
        # kept before evaluations drove consecutive track seeds: its scores are from other tracks
        print(f"resume: {kept.name} was evaluated on other validation tracks; its best score "
              f"({callback.best_mean_reward:.1f}) is not carried over")
        callback.best_mean_reward = -np.inf
    print(f"resume: from {kept.name}, {model.num_timesteps} agent steps done")


def _kept_state(path: Path) -> dict[str, Any]:
    """The JSON beside a kept checkpoint (see :class:`KeepEvaluated`), its fields checked."""
    state = read_json(path)

    def numbers(value, depth: int) -> bool:   # a number, or nested lists of numbers
        if depth == 0:
            return isinstance(value, (int, float)) and not isinstance(value, bool)
        return isinstance(value, list) and all(numbers(v, depth - 1) for v in value)

    norm = state.get("reward_norm")
    checks = {"reward_norm": isinstance(norm, dict) and all(numbers(norm.get(n), 0) for n in _REWARD_NORM),
              "best_mean_reward": numbers(state.get("best_mean_reward"), 0),
              "evaluations_timesteps": numbers(state.get("evaluations_timesteps"), 1),
              "evaluations_results": numbers(state.get("evaluations_results"), 2),
              "evaluations_length": numbers(state.get("evaluations_length"), 2)}
    for name, ok in checks.items():
        if not ok:
            raise ValueError(f"{path}: field {name!r} is missing or not what a kept checkpoint writes")
    return state


def _check_kind(start: LoadedPolicy, args: ExpertTrainArgs) -> None:
    """``ValueError`` unless ``start`` (the policy of ``args.init_from``) has the run's kind of actions."""
    run_kind = "continuous" if args.continuous else "discrete"
    start_kind = "continuous" if start.continuous else "discrete"
    if start_kind != run_kind:
        raise ValueError(f"init_from: {args.init_from} has {start_kind} actions; a {run_kind} run "
                         f"can only start from a {run_kind} expert")


def _start_from(policy, start: LoadedPolicy, args: ExpertTrainArgs) -> None:
    """Load ``start`` (the policy of ``args.init_from``) into ``policy``."""
    try:
        policy.load_state_dict(start.policy.state_dict())
    except RuntimeError as exc:
        raise ValueError(f"init_from: {args.init_from} does not fit this run's network "
                         f"(--frame-stack, --head-units): {exc}") from exc


def score_checkpoint(path: str | Path, episodes: int, seed_base: int, gas: float | None = None,
                     device: str = "cpu") -> EpisodeResults:
    """Drive an expert zip's most likely actions on tracks ``seed_base, seed_base + 1, ...``
    in the training's evaluation env (with GAS pressing ``gas`` if given), its network on
    ``device``, for choosing among kept checkpoints.

    Only the frames the expert sees are drawn, so this runs ~4x faster than
    ``run_episodes`` on the raw env with ``PPOExpert``, and gives the same
    returns, lengths and laps (tested). Latencies are per decision (one policy forward).
    """
    if episodes < 1:
        raise ValueError(f"score_checkpoint: episodes must be >= 1, got {episodes}")
    torch.set_num_threads(1)  # a small CNN: more threads only contend with the env
    device = resolve_device(device)
    loaded = load_expert_zip(path, gas)
    loaded.policy.to(device)   # SB3's predict takes the observations there and the actions back
    venv = make_vec_env(continuous=loaded.continuous, preprocessing=loaded.preprocessing)
    venv.seed(seed_base)
    results = EpisodeResults()
    try:
        obs, frames = venv.reset(), 0
        while len(results.returns) < episodes:
            start = time.perf_counter()
            with torch.no_grad():
                action, _ = loaded.policy.predict(obs, deterministic=True)
            results.latencies_ms.append((time.perf_counter() - start) * 1e3)
            obs, _, done, info = venv.step(action)
            frames += info[0]["frames"]
            if done[0]:
                results.seeds.append(seed_base + len(results.returns))
                results.returns.append(float(info[0]["episode"]["r"]))  # Monitor's float64 sum
                results.lengths.append(frames)
                results.laps.append(bool(info[0].get("lap_finished", False)))
                frames = 0
    finally:
        venv.close()
    return results


class UpdateThreads(BaseCallback):
    """One torch thread while the workers drive (more would only take their cores), and
    ``threads`` (0: every core) for the PPO update between rollouts, when the workers wait.
    The thread count of before training is restored at its end."""

    def __init__(self, threads: int = 0):
        super().__init__()
        self.threads = threads or available_cores()
        self.threads_before: int | None = None   # set when training starts

    def _on_training_start(self) -> None:
        self.threads_before = torch.get_num_threads()

    def _on_rollout_start(self) -> None:
        torch.set_num_threads(1)

    def _on_rollout_end(self) -> None:
        torch.set_num_threads(self.threads)

    def _on_training_end(self) -> None:
        torch.set_num_threads(self.threads_before)

    def _on_step(self) -> bool:
        return True


class FixedSeedEval(EvalCallback):
    """EvalCallback that re-seeds the eval env before each evaluation, so every
    checkpoint is scored on the same validation tracks."""

    def __init__(self, eval_env, seed: int, **kwargs):
        super().__init__(eval_env, **kwargs)
        self.seed = seed

    def _on_step(self) -> bool:
        if self.eval_freq > 0 and self.n_calls % self.eval_freq == 0:
            self.eval_env.seed(self.seed)
        return super()._on_step()


class SaveAtomically(BaseCallback):
    """Saves the model to ``path`` whenever it is called (by EvalCallback on a new best),
    atomically: a run killed while saving keeps its previous best."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = Path(path)

    def _on_step(self) -> bool:
        atomic_write(self.path, self.model.save)
        return True


class KeepEvaluated(BaseCallback):
    """Run after each evaluation: keeps what :func:`resume` needs to go on from there.

    ``folder/frames_<env frames>.zip``: the evaluated model with its Adam state (about
    10 MB); ``folder/frames_<env frames>.json``: the reward normalisation and the
    evaluation history. Both are written atomically, the zip last. The evaluation tracks
    are few and returns vary a lot between tracks, so the best checkpoint is a noisy pick;
    kept checkpoints can also be compared later on more tracks.
    """

    def __init__(self, folder: Path, action_repeat: int):
        super().__init__()
        self.folder = Path(folder)
        self.action_repeat = action_repeat

    def _on_step(self) -> bool:
        frames = self.num_timesteps * self.action_repeat  # num_timesteps counts agent steps of all workers
        zip_path = self.folder / f"frames_{frames}.zip"
        evaluation = self.parent  # the EvalCallback that just evaluated
        rms = self.model.get_vec_normalize_env().ret_rms
        # JSON rather than VecNormalize.save's pickle: reading it runs no code.
        state = {
            "reward_norm": {name: float(getattr(rms, name)) for name in _REWARD_NORM},
            **{name: np.asarray(getattr(evaluation, name)).tolist() for name in _EVAL_HISTORY},
            "best_mean_reward": float(evaluation.best_mean_reward),
            "eval_tracks": _EVAL_TRACKS,
        }
        atomic_write(zip_path.with_suffix(".json"), lambda tmp: Path(tmp).write_text(json.dumps(state)))
        atomic_write(zip_path, self.model.save)  # last: a kept zip has its state beside it
        return True
