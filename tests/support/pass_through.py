"""A temporal core for hand-built policies: each frame's features passed on as they are, so a
test decides what the core's output holds by its encoder alone."""

from __future__ import annotations

from torch import nn


class PassThrough(nn.Module):
    """A core (``forward``, ``init_state``, ``step``) whose output is its input, ``out_dim`` wide."""

    def __init__(self, out_dim: int):
        super().__init__()
        self.out_dim = out_dim

    def forward(self, x, t=None, return_trace=False):
        return x

    def init_state(self, batch: int):
        return None

    def step(self, x_t, state, t=None, return_trace=False):
        return x_t, state
