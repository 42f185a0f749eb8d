"""Behaviour cloning of a CNN + temporal-core policy on recorded demonstrations.

    nac-drive train --data runs/demos --core nac --window 16
    torchrun --nproc-per-node 2 --no-python nac-drive train --data runs/demos   # DistributedDataParallel

Each run folder holds ``best/`` and ``last/`` checkpoints (``config.json`` +
``model.safetensors``), ``metrics.csv`` and TensorBoard events.
"""
# The CLI builds ``nac-drive train``'s parser from this module: keep its imports light.

from __future__ import annotations

import argparse
from dataclasses import dataclass

from nac_drive.arguments import COUNT, add_dataclass_arguments, arg, check_fields, from_namespace

CLASS_WEIGHTINGS = ("none", "balanced")


@dataclass
class TrainArgs:
    data: str = arg("runs/demos", 'demonstrations: a Minari dataset folder (CarRacing) or a folder above several.')
    out: str = arg("runs/train", 'where run folders go.')
    run_name: str | None = arg(None, 'run folder name; default says what ran: '
                                     '<task>__<core>[-<mode>]__w<window>__s<seed>.')
    core: str = arg("nac", 'temporal core: nac, lstm, gru, cfc, ltc or mha.')
    mode: str = arg("exact", 'NAC logit mode: exact, euler or steady.')
    window: int = arg(16, "frames per training window (and the policy's causal window when driving).", min=1)
    d_model: int = arg(64, 'core width (NAC d_model; hidden units of the baselines).', min=1)
    num_heads: int = arg(4, 'attention heads (nac, mha).', min=1)
    topk: int = arg(8, 'keys per query (nac).', min=1)
    epochs: int = arg(10, 'passes over --windows-per-epoch sampled windows.', min=1)
    windows_per_epoch: int = arg(4096, 'windows sampled per epoch (0: all windows).', min=0)
    batch_size: int = arg(32, 'windows per optimiser step (per process under torchrun).', min=1)
    lr: float = arg(1e-3, 'peak learning rate (AdamW), reached after a 5% warm-up, then cosine decay.', above=0)
    weight_decay: float = arg(1e-4, 'AdamW weight decay.', min=0)
    class_weighting: str = arg("none", 'discrete actions: "none", or "balanced" (inverse frequency, clipped '
                                        'to 10x). Balanced weights make a CarRacing policy brake and coast '
                                        'too often (BENCHMARKS.md section 3).', choices=CLASS_WEIGHTINGS)
    val_fraction: float = arg(0.15, 'share of episodes held out for validation (at least one when there '
                                    'are two).', min=0, below=1)
    val_windows: int = arg(1024, 'validation windows evaluated per epoch (0: all).', min=0)
    seed: int = arg(0, 'seeds the split, sampling, dropout and initialisation.', min=0)
    resume: bool = arg(False, 'continue the run in <out>/<run_name>/last.')
    init_from: str = arg("", 'start from this checkpoint folder\'s weights and architecture (fine-tuning).')
    progress: bool = arg(True, 'show a progress bar.')
    extra: dict = arg({}, 'further CoreConfig fields (e.g. {"select": "all"}).')

    def __post_init__(self):
        check_fields(self)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dataclass_arguments(parser, TrainArgs, skip=("extra",))
    parser.add_argument("--select", choices=["exact", "all"], default=None,
                        help="NAC key selection: exact Top-K or every key of the window (block selection "
                             "cannot stream, and a policy drives frame by frame; default: exact).")
    parser.add_argument("--euler-steps", type=COUNT, default=None, help="NAC Euler steps (mode euler; default: 6).")


def args_from_namespace(ns: argparse.Namespace) -> TrainArgs:
    extra = {k: v for k, v in (("select", ns.select), ("euler_steps", ns.euler_steps)) if v is not None}
    return from_namespace(TrainArgs, ns, extra=extra)
