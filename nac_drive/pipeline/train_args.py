"""Behaviour cloning of a CNN + temporal-core policy on recorded demonstrations.

    nac-drive train --data runs/demos --core nac --window 16
    torchrun --nproc-per-node 2 --no-python nac-drive train --data runs/demos   # DistributedDataParallel

Each run folder holds ``best/`` and ``last/`` checkpoints (``config.json`` +
``model.safetensors``), ``metrics.csv`` and TensorBoard events.
"""
# The CLI builds ``nac-drive train``'s parser from this module: keep its imports light.

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nac_drive.devices import device_arg
from nac_drive.fields import MAX_EPISODES, MAX_SEED, arg, check_fields
from nac_drive.pipeline.variants import VARIANTS
from nac_drive.simulators.frame_drops import MAX_SHARE

CLASS_WEIGHTINGS = ("none", "balanced")
# nac_drive.nac.validation.LOGIT_VARIANTS, spelt out to keep torch out of the parser (tests/test_cli_ignored_flags.py)
LOGIT_VARIANTS = ("paper", "scaled", "qk")
# The architecture flags each temporal core of nac_drive.policy.cores reads besides --window and
# --d-model (tests/test_cli_ignored_flags.py checks the cores are CORES); another core would ignore them.
CORE_FIELDS = {"nac": ("mode", "num_heads", "topk", "select", "sparsity", "euler_steps", "logit_variant"),
               "lstm": (), "gru": (), "cfc": (),
               "ltc": (), "mha": ("num_heads",)}
# What --init-from takes from its checkpoint instead (its config.json)
ARCHITECTURE = ("core", "d_model") + CORE_FIELDS["nac"]
ARCHITECTURE_GROUP = "architecture (the checkpoint's with --init-from)"


@dataclass
class TrainArgs:
    data: str = arg("runs/demos", 'demonstrations: a Minari dataset folder (CarRacing) or a folder above several.')
    out: str = arg("runs/train", 'where run folders go.')
    run_name: str | None = arg(None, 'run folder name; default says what ran: '
                                     '<task>__<core>[-<mode>]__w<window>__s<seed>[__drop<P>].')
    core: str = arg("nac", 'temporal core: nac, lstm, gru, cfc, ltc or mha.', choices=tuple(CORE_FIELDS))
    window: int = arg(16, "frames per training window (and the policy's causal window when driving).", min=1)
    epochs: int = arg(10, 'passes over --windows-per-epoch sampled windows.', min=1)
    seed: int = arg(0, 'seeds the split, sampling, dropout and initialisation.', min=0, max=MAX_SEED)
    frame_drop: float = arg(0.0, "train on irregular time: each epoch a share P of every training episode's "
                                 "frames is dropped (seeded, redrawn per epoch) and the windows are cut from the "
                                 "frames left, with their real timestamps, as a drive under --perturb "
                                 "frame-drop=P feeds the policy; validation stays regular.", min=0, max=MAX_SHARE,
                            metavar="P")
    init_from: str = arg("", 'start from this checkpoint folder\'s weights and architecture (fine-tuning).')
    tuned: str = arg("", "a best.json of nac-drive tune: its core, architecture and optimisation values replace "
                         "those flags (the budget stays this command's).", metavar="BEST_JSON")
    resume: bool = arg(False, 'continue the run in <out>/<run_name>/last.')
    progress: bool = arg(True, 'show a progress bar.')
    device: str = device_arg()
    mode: str = arg("exact", 'NAC logit mode: exact, euler or steady.', choices=("exact", "euler", "steady"),
                    group=ARCHITECTURE_GROUP)
    d_model: int = arg(64, 'core width (NAC d_model; hidden units of the baselines).', min=1, group=ARCHITECTURE_GROUP)
    num_heads: int = arg(4, 'attention heads (nac, mha).', min=1, group=ARCHITECTURE_GROUP)
    topk: int = arg(8, 'keys per query (nac).', min=1, group=ARCHITECTURE_GROUP)
    select: str = arg("exact", 'NAC key selection: exact Top-K or every key of the window (block selection '
                               'cannot stream, and a policy drives frame by frame).', choices=("exact", "all"),
                      group=ARCHITECTURE_GROUP)
    sparsity: float = arg(0.5, "share of NCP synapses left out of the NAC's wired gates (the paper's "
                               "NAC-02s / NAC-09s ablations: 0.2 / 0.9).", min=0.1, max=0.9,
                          group=ARCHITECTURE_GROUP)
    euler_steps: int = arg(6, 'NAC Euler steps (--mode euler).', min=1, group=ARCHITECTURE_GROUP)
    logit_variant: str = arg("paper", "NAC logits: the paper's, or beyond the paper 'scaled' (each head's logits "
                                      "times a learned scale) or 'qk' (plus the q.k score Top-K selects by), which "
                                      "let the attention weights differ by more than the paper's factor e.",
                             choices=LOGIT_VARIANTS, group=ARCHITECTURE_GROUP)
    windows_per_epoch: int = arg(4096, 'windows sampled per epoch (0: all windows).', min=0, group="optimisation")
    batch_size: int = arg(32, 'windows per optimiser step (per process under torchrun).', min=1, group="optimisation")
    lr: float = arg(1e-3, 'peak learning rate (AdamW), reached after a 5% warm-up, then cosine decay.', above=0,
                    group="optimisation")
    weight_decay: float = arg(1e-4, 'AdamW weight decay.', min=0, group="optimisation")
    class_weighting: str = arg("none", 'discrete actions: "none", or "balanced" (inverse frequency, clipped '
                                        'to 10x). Balanced weights make a CarRacing policy brake and coast '
                                        'too often (BENCHMARKS.md section 3).', choices=CLASS_WEIGHTINGS,
                               group="optimisation")
    val_fraction: float = arg(0.15, 'share of episodes held out for validation (at least one when there '
                                    'are two).', min=0, below=1, group="validation")
    val_windows: int = arg(1024, 'validation windows evaluated per epoch (0: all).', min=0, group="validation")
    eval_episodes: int = arg(0, "after training, the best checkpoint drives this many held-out tracks (CarRacing "
                                "900000, ...; the Udacity emulator's random-900000, ...); the figures go to "
                                "closed_loop.json and TensorBoard's closed_loop/ tags and HParams table.",
                             min=0, max=MAX_EPISODES, group="validation")

    def __post_init__(self):
        check_fields(self)
        if 0 < self.windows_per_epoch < self.batch_size:   # the loader drops a partial batch
            raise ValueError(f"--windows-per-epoch {self.windows_per_epoch}: fewer windows than one batch "
                             f"(--batch-size {self.batch_size}): no optimiser step would run")

    def ignored(self) -> dict[str, str]:
        """The fields this run would not use, each with why: with ``init_from`` the
        architecture (the checkpoint's is used); with ``tuned`` what its best.json sets; then
        what the core (the tuned one, if any) does not read; ``frame_drop`` with one-frame
        windows, which have no time between frames to stretch; ``topk`` under ``select="all"``."""
        unused = {"frame_drop": "a window of one frame (--window 1) has no time between frames for dropped "
                                "frames to stretch"} if self.window == 1 else {}
        if self.init_from:
            return {**unused, **{name: "--init-from fine-tunes the checkpoint's own architecture (its "
                                       "config.json); leave this flag out" for name in (*ARCHITECTURE, "tuned")}}
        core, mode, select = self.core, self.mode, self.select
        if self.tuned:
            tuned = read_tuned(self.tuned)
            unused.update({name: f"--tuned {self.tuned} sets it" for name in tuned})
            core, mode, select = tuned.get("core", core), tuned.get("mode", mode), tuned.get("select", select)
        used = ("core", "d_model", *core_fields(core, mode))
        if core == "nac" and select == "all":
            unused.setdefault("topk", "--select all reads every key of the window: no K is chosen")
        users = {name: " and ".join(core for core, fields in CORE_FIELDS.items() if name in fields)
                 for name in ARCHITECTURE}
        return {**{name: (f"only --mode euler takes Euler steps (this run's mode: {mode})" if core == "nac" else
                          f"the {core} core does not use it (only {users[name]})")
                   for name in ARCHITECTURE if name not in used}, **unused}


def core_fields(core: str, mode: str) -> tuple[str, ...]:
    """The architecture fields a core (in ``mode``, for the NAC) reads besides window and d_model."""
    return tuple(name for name in CORE_FIELDS[core] if name != "euler_steps" or mode == "euler")


# TrainArgs fields a best.json may not set: what each run's own command decides
NOT_TUNED = frozenset({"data", "out", "run_name", "window", "epochs", "seed", "init_from", "resume", "progress",
                       "tuned", "windows_per_epoch", "val_fraction", "val_windows", "eval_episodes", "frame_drop", "device"})


def read_tuned(path: str | Path, variant: str | None = None) -> dict[str, Any]:
    """The training arguments of a ``best.json`` of :func:`~nac_drive.pipeline.tune.tune`
    (checked: a JSON object naming its variant, and only fields of :class:`TrainArgs` that a
    search may choose); ``variant``, if given, must be the one it was tuned for."""
    from nac_drive.io.checkpoint import read_json

    best = read_json(Path(path))
    if not isinstance(best, dict) or not isinstance(best.get("train_args"), dict) or best.get("variant") not in VARIANTS:
        raise ValueError(f"{path}: not a best.json of nac-drive tune (no variant and train_args)")
    if variant is not None and best["variant"] != variant:
        raise ValueError(f"{path}: tuned for {best['variant']}, not {variant}")
    known = {f.name for f in dataclasses.fields(TrainArgs)}
    unknown = set(best["train_args"]) - known
    if unknown:
        raise ValueError(f"{path}: train_args names fields train does not have: {sorted(unknown)}")
    budget = set(best["train_args"]) & NOT_TUNED
    if budget:
        raise ValueError(f"{path}: train_args sets {sorted(budget)}, which a run's own command decides (the data, "
                         f"the budget, the seed, where it goes), not a search")
    return best["train_args"]
