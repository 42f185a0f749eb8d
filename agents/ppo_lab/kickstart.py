"""Kickstarting a PPO expert: DAgger from the privileged teacher into the SB3 policy itself.

PPO from scratch needs millions of frames here, and an expert acting every 4th frame is
capped by its action repeat (the teacher itself scores 628 acting every 4th frame, ~890
every frame). So the expert's network is first taught by imitation, at the rate the
teacher acts (``--action-repeat 1`` by default), and only then improved by PPO
(``nac-drive expert train --init-from <kickstart zip> --action-repeat 1 ...``).

Each round the current policy drives fresh tracks of the training range (the *student*,
seeing what :class:`~nac_drive.agents.ppo_expert.PPOExpert` sees) while the teacher labels
every decision it makes (DAgger, Ross et al. 2011). With probability ``beta`` per decision
the teacher's action is executed instead (``beta0 * beta_decay**round``: round 0 is
behaviour cloning when ``beta0`` is 1), and random-action bursts (``--disturb-rate``, as in
``nac-drive dagger``) push the car off its line so that recoveries get labelled. The labels
of all rounds are aggregated and the policy's action logits are fitted to them by
cross-entropy. After each round the policy is scored on fixed validation tracks; the best
one is kept.

Finally the value head is warmed up, so that PPO's first updates follow a value that
already fits the policy instead of a random one: the kept policy drives a few more tracks,
and the value head (the CNN left as it is) is fitted to its discounted returns, scaled as
the reward normalisation of ``expert train`` will scale them.

``--gas`` teaches it in an env whose GAS presses more than gymnasium's 0.2 (the discrete
teacher scores more there: BENCHMARKS.md): teacher and student drive the same env, and the
zip records the gas, so ``expert train --init-from`` goes on in it.

    nac-drive expert kickstart --rounds 8 --episodes 4 --out runs/expert --run-name kick
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from nac_drive.agents.ppo_lab.training_args import FRAME_STACK
from nac_drive.devices import device_arg, resolve_device
from nac_drive.fields import MAX_EPISODES, MAX_SEED, arg, check_fields
from nac_drive.simulators.carracing import COLLECT_SEED_BASE, DISCRETE_GAS, MAX_EPISODE_FRAMES

TRACKS_BASE = 10_000        # kickstart tracks: TRACKS_BASE + TRACKS_PER_SEED * seed + i
TRACKS_PER_SEED = 1_000


@dataclass
class KickstartArgs:
    """Arguments of ``nac-drive expert kickstart``."""

    out: str = arg("runs/expert", "folder for runs")
    run_name: str | None = arg(None, "subfolder name (default kickstart_r{action_repeat}_s{seed}); "
                                     "a taken name gets a -2, -3, ... suffix")
    action_repeat: int = arg(1, "env frames per decision (1: every frame, as the teacher acts)", min=1, max=100)
    frame_stack: int = arg(FRAME_STACK, "observations stacked as channels", min=1, max=64)
    gas: float = arg(DISCRETE_GAS, f"what the GAS action presses, for the teacher and the student alike "
                                   f"({DISCRETE_GAS}: gymnasium's discrete env; more drives the continuous "
                                   f"env through DiscreteActions); the zip records it", above=0, max=1)
    head_units: int = arg(256, "units of the hidden layer of the policy and value heads", min=1, max=4096)
    rounds: int = arg(8, "DAgger rounds (drive, label, aggregate, fit)", min=1)
    episodes: int = arg(4, "episodes driven per round", min=1, max=MAX_EPISODES)
    max_frames: int = arg(MAX_EPISODE_FRAMES, "cap each driven episode at this many env frames", min=1,
                          max=MAX_EPISODE_FRAMES)
    beta0: float = arg(1.0, "round 0: chance per decision that the teacher's action is executed instead of "
                            "the student's (1: round 0 is behaviour cloning)", min=0, max=1)
    beta_decay: float = arg(0.5, "that chance is beta0 * beta_decay**round", min=0, max=1)
    disturb_rate: float = arg(0.02, "chance per undisturbed frame that a burst of one random action replaces "
                                    "the executed one (recoveries get labelled; 0: none)", min=0, max=1)
    disturb_frames: int = arg(8, "frames per disturbance burst", min=1)
    updates: int = arg(500, "minibatch updates of the fit after each round (drawn from all labelled decisions)",
                       min=1)
    batch_size: int = arg(128, "minibatch size of the fit", min=1)
    learning_rate: float = arg(3e-4, "Adam learning rate of the fit", above=0)
    max_samples: int = arg(100_000, "keep at most this many labelled decisions (the oldest go first; "
                                    "8 kB each)", min=1)
    value_episodes: int = arg(4, "episodes the kept policy drives to warm up the value head (0: skip)", min=0,
                              max=MAX_EPISODES)
    value_epochs: int = arg(10, "passes of the value head's fit", min=1)
    gamma: float = arg(0.99, "discount per decision of the PPO run that will continue from the zip "
                             "(the value head is fitted with it; the zip records it and `expert train "
                             "--init-from` trains with it)", above=0, max=1)
    seed: int = arg(0, "seed of the tracks driven, the network's init and the fit's shuffling", min=0,
                    max=(COLLECT_SEED_BASE - TRACKS_BASE) // TRACKS_PER_SEED - 1)
    eval_episodes: int = arg(8, "validation tracks scored after each round (0: keep the last round)", min=0,
                             max=MAX_EPISODES)
    eval_seed: int = arg(50_000, "seed of the first validation track (training range, clear of the "
                                 "kickstart tracks)", min=0, max=MAX_SEED)
    progress_bar: bool = arg(True, "show progress bars")
    device: str = device_arg()

    def __post_init__(self):
        check_fields(self)
        drives = self.rounds * self.episodes + self.value_episodes
        if drives > TRACKS_PER_SEED:
            raise ValueError(f"--rounds x --episodes + --value-episodes: at most {TRACKS_PER_SEED} tracks "
                             f"per seed, got {drives}")
        first = track_seed(self.seed, 0)
        if self.eval_episodes and first < self.eval_seed + self.eval_episodes and self.eval_seed < first + drives:
            raise ValueError(f"--eval-seed: validation tracks {self.eval_seed}.."
                             f"{self.eval_seed + self.eval_episodes - 1} overlap the kickstart tracks "
                             f"{first}..{first + drives - 1}")
        if self.eval_episodes and self.eval_seed + self.eval_episodes > COLLECT_SEED_BASE:
            raise ValueError(f"--eval-seed: validation tracks must stay in the training range "
                             f"[0, {COLLECT_SEED_BASE})")


def track_seed(seed: int, index: int) -> int:
    """The ``index``-th track a kickstart run with ``seed`` drives (inside the training range)."""
    return TRACKS_BASE + TRACKS_PER_SEED * seed + index


class Labelled:
    """Decisions of driven episodes with the teacher's labels: ``stacks`` ``uint8 [N, stack,
    64, 64]`` (what the student saw), ``labels`` ``int64 [N]``, ``rewards`` ``float [N]`` (env
    reward summed over each decision's frames) and ``episode_ends`` (exclusive end index of
    each episode)."""

    def __init__(self, stacks: np.ndarray, labels: np.ndarray, rewards: np.ndarray, episode_ends: list[int]):
        self.stacks, self.labels, self.rewards, self.episode_ends = stacks, labels, rewards, episode_ends

    def __len__(self) -> int:
        return len(self.labels)


class LabellingDriver:
    """Actor for :func:`~nac_drive.simulators.carracing.run_episodes`: at each decision (every
    ``student.action_repeat`` frames) the student observes the frame and the teacher labels the
    state; the teacher's action is executed with probability ``beta``, the student's otherwise,
    and held until the next decision. ``on_step`` adds each frame's reward to its decision."""

    def __init__(self, student, teacher, beta: float, rng: np.random.Generator):
        self.student, self.teacher, self.beta, self.rng = student, teacher, beta, rng
        self.stacks: list[np.ndarray] = []
        self.labels: list[int] = []
        self.rewards: list[float] = []
        self.episode_ends: list[int] = []
        self._env = None
        self._frame = 0
        self._action: Any = None

    def reset(self) -> None:
        if self.labels and (not self.episode_ends or self.episode_ends[-1] != len(self.labels)):
            self.episode_ends.append(len(self.labels))
        self.student.reset()
        self.teacher.reset()
        self._frame = 0

    def reset_env(self, env) -> None:
        self._env = env
        self.teacher.reset_env(env)

    def act(self, obs: np.ndarray):
        if self._frame % self.student.action_repeat == 0:
            stack = self.student.observe(obs)
            label = int(self.teacher.action_for(self._env))
            self.stacks.append(stack.copy())
            self.labels.append(label)
            self.rewards.append(0.0)
            use_teacher = self.beta >= 1 or (self.beta > 0 and self.rng.random() < self.beta)
            self._action = label if use_teacher else self.student.decide(stack)
        self._frame += 1
        return self._action

    def on_step(self, episode: int, frame: int, obs, action, reward: float, info: dict) -> None:
        self.rewards[-1] += reward

    def take(self) -> Labelled:
        self.reset()  # closes the last episode
        data = Labelled(np.stack(self.stacks), np.asarray(self.labels, np.int64),
                        np.asarray(self.rewards, np.float64), list(self.episode_ends))
        self.stacks, self.labels, self.rewards, self.episode_ends = [], [], [], []
        return data


def drive_and_label(zip_path: Path, seeds: list[int], beta: float, rng: np.random.Generator,
                    disturb_rate: float = 0.0, disturb_frames: int = 8, max_frames: int | None = None,
                    progress: bool = False):
    """Drive the expert zip on ``seeds`` (one episode each, in its env: its gas) with the
    discrete teacher labelling (its choice does not depend on the gas). Returns
    ``(Labelled, EpisodeResults)``."""
    from nac_drive.agents.ppo_expert import PPOExpert
    from nac_drive.agents.teacher import PurePursuitTeacher
    from nac_drive.simulators.carracing import ActionBursts, make_carracing, run_episodes

    student = PPOExpert(zip_path)
    if student.continuous:
        raise ValueError(f"{zip_path}: kickstarting needs a 5-action discrete expert")
    driver = LabellingDriver(student, PurePursuitTeacher(continuous=False), beta, rng)
    env = make_carracing(continuous=False, gas=student.gas)
    if disturb_rate:
        env = ActionBursts(env, disturb_rate, disturb_frames, seed=seeds[0])
    try:
        results = run_episodes(driver, seeds, env=env, max_steps=max_frames, on_step=driver.on_step,
                               progress=progress)
    finally:
        env.close()
    return driver.take(), results


def agreement(policy, stacks: np.ndarray, labels: np.ndarray, batch: int = 512) -> tuple[float, float]:
    """How well ``policy`` (SB3 actor-critic) agrees with ``labels``: (share of decisions
    whose most likely action is the label, mean probability it gives the label)."""
    import torch

    hits, prob = 0.0, 0.0
    with torch.no_grad():
        for i in range(0, len(labels), batch):
            x = torch.as_tensor(stacks[i:i + batch], device=policy.device)
            y = torch.as_tensor(labels[i:i + batch], device=policy.device)
            probs = policy.get_distribution(x).distribution.probs  # [B, 5]
            hits += float((probs.argmax(1) == y).sum())
            prob += float(probs.gather(1, y[:, None]).sum())
    return hits / len(labels), prob / len(labels)


def fit_policy(policy, optimizer, stacks: np.ndarray, labels: np.ndarray, updates: int, batch_size: int,
               rng: np.random.Generator, progress: bool = False) -> float:
    """Fit the policy's action logits to ``labels`` by cross-entropy with ``updates`` minibatch
    steps (all weights but the value head's move); returns the mean loss of the last 50."""
    from tqdm import tqdm

    from nac_drive.agents.ppo_lab.kickstarted_ppo import imitation_step

    policy.set_training_mode(True)
    losses: list[float] = []
    for _ in tqdm(range(updates), desc="fit", unit="batch", disable=not progress, leave=False):
        idx = np.sort(rng.choice(len(labels), size=min(batch_size, len(labels)), replace=False))
        losses.append(imitation_step(policy, optimizer, stacks[idx], labels[idx])[0])
    policy.set_training_mode(False)
    return float(np.mean(losses[-50:]))


def value_targets(rewards: np.ndarray, episode_ends: list[int], gamma: float) -> np.ndarray:
    """Discounted returns-to-go ``float32 [N]`` of each decision's episode, divided by the
    standard deviation of the running discounted return, which is how ``expert train``'s
    reward normalisation (SB3's VecNormalize) scales the rewards its value head predicts."""
    returns_to_go, running = np.zeros(len(rewards)), np.zeros(len(rewards))
    start = 0
    for end in episode_ends:
        future = 0.0
        for t in range(end - 1, start - 1, -1):
            future = rewards[t] + gamma * future
            returns_to_go[t] = future
        past = 0.0
        for t in range(start, end):
            past = past * gamma + rewards[t]
            running[t] = past
        start = end
    return (returns_to_go / np.sqrt(running.var() + 1e-8)).astype(np.float32)


def fit_value_head(policy, stacks: np.ndarray, targets: np.ndarray, epochs: int, batch_size: int,
                   learning_rate: float, rng: np.random.Generator) -> float:
    """Fit only the value head (``mlp_extractor.value_net`` and ``value_net``; the CNN, which
    the policy shares, stays) to ``targets``; returns the last epoch's mean squared error."""
    import torch

    head = list(policy.mlp_extractor.value_net.parameters()) + list(policy.value_net.parameters())
    optimizer = torch.optim.Adam(head, lr=learning_rate)
    with torch.no_grad():
        features = torch.cat([policy.extract_features(torch.as_tensor(stacks[i:i + 512], device=policy.device))
                              for i in range(0, len(targets), 512)])
    y = torch.as_tensor(targets, device=policy.device)
    mse = 0.0
    for _ in range(epochs):
        order, mse = rng.permutation(len(y)), 0.0
        for i in range(0, len(y), batch_size):
            idx = torch.as_tensor(order[i:i + batch_size], device=policy.device)
            value = policy.value_net(policy.mlp_extractor.forward_critic(features[idx]))[:, 0]
            loss = torch.nn.functional.mse_loss(value, y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            mse += loss.item() * len(idx)
    return mse / len(y)


def new_model(args: KickstartArgs):
    """A fresh SB3 PPO model with the expert's network (NatureCNN, [head_units] heads) and
    spaces; its zip records its preprocessing as ``expert train``'s do."""
    from stable_baselines3 import PPO

    from nac_drive.agents.ppo_lab.env import Preprocessing, make_vec_env

    preprocessing = Preprocessing(frame_stack=args.frame_stack, action_repeat=args.action_repeat, gas=args.gas)
    venv = make_vec_env(continuous=False, preprocessing=preprocessing)
    model = PPO("CnnPolicy", venv, seed=args.seed, device=resolve_device(args.device), verbose=0,
                gamma=args.gamma, policy_kwargs=dict(net_arch=dict(pi=[args.head_units], vf=[args.head_units])))
    model.preprocessing = preprocessing.to_json()   # what PPOExpert and an SB3 user read from the zip
    venv.close()
    return model


def kickstart(args: KickstartArgs) -> Path:
    """Run the kickstart; returns the zip to continue with PPO (``kickstart.zip`` in the run
    folder: the best round's policy with its value head warmed up, no optimizer state)."""
    import torch
    from tqdm import tqdm

    from nac_drive.agents.ppo_lab.expert_zip import export_for_shipping
    from nac_drive.agents.ppo_lab.training import score_checkpoint
    from nac_drive.io.atomic import atomic_write, fresh_dir

    resolve_device(args.device)   # a device this machine lacks is refused before the run folder exists
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    run_dir = fresh_dir(Path(args.out) / (args.run_name or f"kickstart_r{args.action_repeat}_s{args.seed}"))
    args = replace(args, run_name=run_dir.name)
    print(f"run folder: {run_dir}", flush=True)
    write_json = _json_writer(run_dir)
    write_json("args.json", asdict(args))
    model = new_model(args)
    policy = model.policy
    optimizer = torch.optim.Adam(policy.parameters(), lr=args.learning_rate)
    rng = np.random.default_rng(args.seed)
    stacks = np.zeros((0, args.frame_stack, 64, 64), np.uint8)
    labels = np.zeros(0, np.int64)
    history: list[dict[str, Any]] = []
    best_score, best_round = -np.inf, -1
    current = run_dir / "round_start.zip"
    atomic_write(current, model.save)
    for r in tqdm(range(args.rounds), desc="kickstart rounds", unit="round", disable=not args.progress_bar):
        beta = args.beta0 * args.beta_decay ** r
        seeds = [track_seed(args.seed, r * args.episodes + e) for e in range(args.episodes)]
        data, driven = drive_and_label(current, seeds, beta, rng, args.disturb_rate, args.disturb_frames,
                                       args.max_frames, progress=args.progress_bar)
        on_policy_accuracy, on_policy_prob = agreement(policy, data.stacks, data.labels)
        stacks = np.concatenate([stacks, data.stacks])[-args.max_samples:]
        labels = np.concatenate([labels, data.labels])[-args.max_samples:]
        loss = fit_policy(policy, optimizer, stacks, labels, args.updates, args.batch_size, rng, args.progress_bar)
        current = run_dir / f"round_{r}.zip"
        atomic_write(current, model.save)
        entry = {"round": r, "beta": beta, "tracks": seeds, "driven": driven.summary(), "decisions": len(labels),
                 "agreement_before_fit": on_policy_accuracy, "label_probability_before_fit": on_policy_prob,
                 "fit_loss": loss}
        if args.eval_episodes:
            scored = score_checkpoint(current, args.eval_episodes, args.eval_seed)
            entry["validation"] = scored.summary()
            if scored.summary()["mean_return"] > best_score:
                best_score, best_round = scored.summary()["mean_return"], r
        else:
            best_round = r
        history.append(entry)
        write_json("history.json", history)
        tqdm.write(f"round {r}: beta {beta:.3f}, drove {driven.format()}; agreement before the fit "
                   f"{on_policy_accuracy:.3f}, fit loss {loss:.3f}"
                   + (f"; validation {scored.format()}" if args.eval_episodes else ""))
    best = run_dir / "best_round.zip"
    shutil.copyfile(run_dir / f"round_{best_round}.zip", best)
    print(f"kept round {best_round}" + (f" (validation {best_score:.1f})" if args.eval_episodes else ""))
    if args.value_episodes:
        _warm_up_value(best, args, rng, write_json)
    result = run_dir / "kickstart.zip"
    export_for_shipping(best, result)
    print(f"kickstart zip: {result}  (continue with: nac-drive expert train --init-from {result} ..., "
          "which trains at its action repeat and discount)")
    return result


def _warm_up_value(zip_path: Path, args: KickstartArgs, rng: np.random.Generator, write_json) -> None:
    """Drive ``zip_path`` (no teacher, no bursts), fit its value head, write it back in place."""
    from nac_drive.agents.ppo_lab.expert_zip import load_expert_zip
    from nac_drive.io.atomic import atomic_write

    first = args.rounds * args.episodes
    seeds = [track_seed(args.seed, first + e) for e in range(args.value_episodes)]
    data, driven = drive_and_label(zip_path, seeds, 0.0, rng, max_frames=args.max_frames,
                                   progress=args.progress_bar)
    targets = value_targets(data.rewards, data.episode_ends, args.gamma)
    model = new_model(args)
    model.policy.load_state_dict(load_expert_zip(zip_path).policy.state_dict())
    mse = fit_value_head(model.policy, data.stacks, targets, args.value_epochs, args.batch_size,
                         args.learning_rate, rng)
    atomic_write(zip_path, model.save)
    write_json("value_warmup.json", {"tracks": seeds, "driven": driven.summary(), "decisions": len(targets),
                                     "target_std": float(targets.std()), "mse": mse})
    print(f"value head warmed up on {len(targets)} decisions ({driven.format()}): mse {mse:.3f}, "
          f"target std {targets.std():.3f}")


def _json_writer(run_dir: Path):
    from nac_drive.io.atomic import atomic_write

    def write(name: str, value) -> None:
        atomic_write(run_dir / name, lambda tmp: Path(tmp).write_text(json.dumps(value, indent=1)))

    return write
