"""TensorBoard events of a training run: grouped tags and hyperparameters.

Tags (x axis: optimiser steps of the run, so train and val curves line up):
``train/loss``, ``train/lr``, ``train/accuracy`` (discrete) every step;
``train/epoch_loss``, ``train/epoch_accuracy``, ``train/frames_per_s``, ``val/loss``,
``val/accuracy``, ``val/mae`` every epoch; ``closed_loop/...`` where a policy was driven
(a DAgger round's student, logged into the run that fine-tunes it). The run's
hyperparameters (core, window, widths, lr, ...) go to TensorBoard's HParams plugin,
so ``tensorboard --logdir runs/train`` compares runs of different cores in one table.
"""

from __future__ import annotations

import math
from pathlib import Path

TB_FOLDER = "tensorboard"   # inside a run folder
HPARAM_METRICS = ("val/loss", "val/accuracy", "val/mae", "train/epoch_loss", "closed_loop/mean_return",
                  "closed_loop/laps_finished", "closed_loop/mean_abs_cte")
_EPOCH_TAGS = {"train_loss": "train/epoch_loss", "train_accuracy": "train/epoch_accuracy",
               "frames_per_s": "train/frames_per_s", "val_loss": "val/loss", "val_accuracy": "val/accuracy",
               "val_mae": "val/mae"}


class RunLog:
    """The TensorBoard writer of one run folder. ``first_step`` > 0 (a resumed run) drops
    the events a killed run had written from that step on."""

    def __init__(self, run_dir: str | Path, hparams: dict, first_step: int = 0):
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams as hparam_summaries

        from nac_drive.policy.cores import CORES

        domains = {"core": list(CORES), "mode": ["exact", "euler", "steady"]}   # of the keys a run has
        self.writer = SummaryWriter(str(Path(run_dir) / TB_FOLDER), purge_step=first_step + 1 if first_step else None)
        experiment, start, self._end = hparam_summaries(
            hparams, {tag: 0.0 for tag in HPARAM_METRICS},
            hparam_domain_discrete={k: v for k, v in domains.items() if k in hparams})
        for summary in (experiment, start):
            self.writer.file_writer.add_summary(summary)

    def step(self, step: int, loss: float, lr: float, accuracy: float | None = None) -> None:
        """One optimiser step (``accuracy``: the batch's share of right discrete actions)."""
        self.writer.add_scalar("train/loss", loss, step)
        self.writer.add_scalar("train/lr", lr, step)
        if accuracy is not None:
            self.writer.add_scalar("train/accuracy", accuracy, step)

    def epoch(self, step: int, row: dict) -> None:
        """An epoch's ``metrics.csv`` row; NaN entries (no validation set, the other kind
        of action) are left out."""
        for key, tag in _EPOCH_TAGS.items():
            if key in row and not math.isnan(row[key]):
                self.writer.add_scalar(tag, row[key], step)

    def close(self) -> None:
        """The run finished: marks its HParams session done."""
        self.writer.file_writer.add_summary(self._end)
        self.writer.close()


def log_closed_loop(run_dir: str | Path, summary: dict, step: int = 0) -> None:
    """Closed-loop figures (a CarRacing or Udacity-emulator drive's summary) as ``closed_loop/``
    scalars: mean return, laps finished, the policy's median latency and, on Udacity, the
    mean |cross-track error| (m)."""
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(Path(run_dir) / TB_FOLDER)) as writer:
        for name in ("mean_return", "laps_finished", "latency_ms_p50", "mean_abs_cte"):
            if name in summary and math.isfinite(summary[name]):   # no latency: a drive read back from its dataset
                writer.add_scalar(f"closed_loop/{name}", summary[name], step)
