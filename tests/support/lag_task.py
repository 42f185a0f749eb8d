"""A known-answer sequence task for temporal cores: only the input exactly ``LAG`` steps back
decides the label.

Each step carries a random bit (+-1), a one-hot of its position modulo ``PERIOD`` (what lets
a content-based attention find "5 steps back") and a few channels of noise; steps are 1 s
apart and the timestamps go to the core. The label at step i >= LAG is whether the bit of
step i - LAG was +1; earlier steps have none. Nothing else in the window predicts it, so a
core scores its accuracy only by reading that one step: chance is 0.5.
"""

from __future__ import annotations

import torch
from torch import nn

from nac_drive.policy.cores import CoreConfig, build_core

LAG = 5
PERIOD = 8
NOISE = 3
FEATURES = 1 + PERIOD + NOISE


def lag_batch(batch: int, steps: int, generator: torch.Generator, lag: int = LAG):
    """-> x ``[B, T, FEATURES]``, t ``[B, T]`` seconds, labels ``[B, T]`` (0/1), has_label ``[B, T]`` bool."""
    bits = torch.randint(0, 2, (batch, steps), generator=generator).float() * 2 - 1
    position = nn.functional.one_hot(torch.arange(steps) % PERIOD, PERIOD).float().expand(batch, steps, PERIOD)
    noise = torch.randn(batch, steps, NOISE, generator=generator)
    x = torch.cat([bits[..., None], position, noise], dim=-1)
    labels = torch.zeros(batch, steps)
    labels[:, lag:] = (bits[:, :-lag] > 0).float()
    has_label = torch.arange(steps).expand(batch, steps) >= lag
    return x, torch.arange(steps, dtype=torch.float32).expand(batch, steps), labels, has_label


class LagModel(nn.Module):
    """A temporal core of :mod:`nac_drive.policy.cores` and a linear read-out: ``[B, T, FEATURES]`` -> logits ``[B, T]``."""

    def __init__(self, cfg: CoreConfig):
        super().__init__()
        self.core = build_core(FEATURES, cfg)
        self.head = nn.Linear(self.core.out_dim, 1)

    def forward(self, x, t):
        return self.head(self.core(x, t))[..., 0]


def train_lag_task(cfg: CoreConfig, steps: int = 1500, batch: int = 32, lr: float = 3e-3, seed: int = 0,
                   eval_batch: int = 512, length: int = 16) -> float:
    """Train a :class:`LagModel` of ``cfg`` for ``steps`` Adam steps on fresh batches of
    sequences of ``length`` steps (the core sees its ``cfg.window`` last); -> its accuracy
    on a held-out batch (labelled steps only)."""
    torch.manual_seed(seed)
    model = LagModel(cfg)
    optimiser = torch.optim.Adam(model.parameters(), lr=lr)
    data = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, t, labels, has_label = lag_batch(batch, length, data)
        loss = nn.functional.binary_cross_entropy_with_logits(model(x, t)[has_label], labels[has_label])
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    model.eval()
    with torch.no_grad():
        x, t, labels, has_label = lag_batch(eval_batch, length, torch.Generator().manual_seed(10_000 + seed))
        chosen = model(x, t) > 0
    return float((chosen == labels.bool())[has_label].float().mean())
