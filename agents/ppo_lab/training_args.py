"""Arguments of ``nac-drive expert train`` (light imports: the CLI builds its parser from them)."""

from __future__ import annotations

from dataclasses import dataclass

from nac_drive.devices import device_arg
from nac_drive.fields import MAX_EPISODES, MAX_SEED, arg, check_fields
from nac_drive.simulators.carracing import DISCRETE_GAS, EXPERT_TRAIN_SEED_BASE

ACTION_REPEAT = 4
FRAME_STACK = 2
GAMMA = 0.99
FRAME_SIZE = 64  # the expert sees gray FRAME_SIZE x FRAME_SIZE frames


@dataclass
class ExpertTrainArgs:
    """Arguments of ``nac-drive expert train`` (defaults: the recipe that works here)."""

    out: str = arg("runs/expert", "folder for runs (checkpoints, TensorBoard logs, zips)")
    run_name: str | None = arg(
        None, "subfolder name; default ppo_{discrete|continuous}_s{seed}_{kframes}kf_{time}")
    continuous: bool = arg(
        False, "train on continuous actions (steer, gas, brake) instead of the 5 discrete ones")
    total_frames: int = arg(1_000_000, "env frames to train for (agent steps x action_repeat)", min=1)
    seed: int = arg(EXPERT_TRAIN_SEED_BASE,
                     "seed of the training tracks, the network init and PPO's sampling", min=0, max=MAX_SEED)
    n_envs: int = arg(2, "parallel SubprocVecEnv workers (one per core)", min=1)
    update_threads: int = arg(0, "torch threads of the PPO update between rollouts, while the workers wait "
                                 "(0: every core; rollouts always use one)", min=0)
    action_repeat: int | None = arg(None, f"env frames per agent decision (default: the --init-from zip's, "
                                          f"else {ACTION_REPEAT})", min=1)
    frame_stack: int | None = arg(None, f"observations stacked as channels (default: the --init-from zip's, "
                                        f"else {FRAME_STACK})", min=1)
    gas: float | None = arg(None, f"discrete runs: what the GAS action presses (default: the --init-from "
                                  f"zip's, else {DISCRETE_GAS}, gymnasium's discrete env; more drives the "
                                  f"continuous env through DiscreteActions)", above=0, max=1)
    n_steps: int = arg(256, "rollout length per worker", min=2)
    batch_size: int = arg(128, "PPO minibatch size", min=2)
    n_epochs: int = arg(4, "PPO epochs per rollout", min=1)
    learning_rate: float = arg(3e-4, "initial learning rate, decayed linearly to 0", min=0)
    ent_coef: float = arg(0.01, "entropy bonus", min=0)
    gamma: float | None = arg(None, f"discount per agent step (default: the --init-from zip's, else {GAMMA})",
                              above=0, max=1)
    gae_lambda: float = arg(0.95, "GAE lambda", min=0, max=1)
    clip_range: float = arg(0.2, "PPO clip range", above=0)
    head_units: int = arg(256, "units of the hidden layer of the policy and value heads", min=1)
    negative_patience: int = arg(
        25, "training-only truncation after this many agent steps of negative reward", min=1)
    teacher_fit_lr: float = arg(
        0.0, "kickstarted PPO: after each PPO update, fit the policy's logits to the discrete teacher's labels "
             "of the rollout's states with an Adam at this learning rate (0: plain PPO)", min=0)
    teacher_fit_epochs: int = arg(2, "passes of that fit over each rollout", min=1)
    init_from: str = arg("", "start from this expert zip's policy weights (fine-tuning: e.g. a lower "
                             "--learning-rate on new --seed tracks; the same kind of actions as the "
                             "run); read without unpickling")
    log_std_init: float = arg(
        0.0, "continuous runs: initial log standard deviation of the Gaussian policy (0 as in SB3)")
    eval_every_frames: int = arg(50_000, "evaluate the policy every this many training frames", min=1)
    keep_evaluated: bool = arg(
        True, "keep every evaluated checkpoint as evaluated/frames_<N>.zip (to compare on more tracks later)")
    eval_episodes: int = arg(8, "validation tracks per evaluation (fixed seeds)", min=1, max=MAX_EPISODES)
    eval_seed: int = arg(EXPERT_TRAIN_SEED_BASE + 50_000,
                          "seed of the validation tracks (inside the training seed range)", min=0, max=MAX_SEED)
    skip_render: bool = arg(
        True, "do not draw the frames the agent never sees (same observations, ~3x faster)")
    progress_bar: bool = arg(True, "show a progress bar")
    device: str = device_arg()

    def __post_init__(self):
        check_fields(self)
        if self.teacher_fit_lr and self.continuous:
            raise ValueError("--teacher-fit-lr: the teacher labels discrete actions; drop --continuous")
        if not self.init_from:   # else train_expert reads the defaults from the zip
            self.action_repeat = self.action_repeat or ACTION_REPEAT
            self.frame_stack = self.frame_stack or FRAME_STACK
            self.gamma = self.gamma or GAMMA
            self.gas = self.gas or DISCRETE_GAS
