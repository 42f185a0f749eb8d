"""Temporal cores behind one interface, so every comparison shares encoder, data and head.

A core maps per-frame features over a causal window to per-frame outputs:

    forward(x [B, T, F], t [B, T] | None) -> y [B, T, out_dim]   (y_i sees frames <= i)
    init_state(batch) -> state;   step(x_t [B, F], state, t_t [B] | None) -> (y_t, state)

``step`` must return what ``forward`` returns at the newest frame of a window of the
last ``window`` frames, since that is what the policy was trained on. The NAC core
streams in O(window) through :meth:`NAC.step`; the baselines (LSTM, GRU, CfC, LTC, MHA)
keep the last ``window`` frames and re-run their forward over them
(:class:`WindowReplay`), which reproduces their training-time context exactly.

Time: the NAC reads the timestamps ``t`` (seconds) itself. CfC and LTC are continuous-time
too: they get each frame's elapsed time in frame periods (:func:`elapsed_periods`), so a
late frame of the Udacity bridge is a longer step of their ODE; on regular frames every
step is 1.0, the unit steps they take without timestamps. LSTM, GRU and MHA ignore ``t``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from ncps.torch import CfC, LTC
from torch import nn

from nac_drive.nac import NAC

CORES = ("nac", "lstm", "gru", "cfc", "ltc", "mha")
# Bounds of one CfC/LTC step in frame periods: LTC divides by the step, and a repeated
# or wildly late timestamp must not make one step zero or swamp the window.
MIN_PERIODS, MAX_PERIODS = 0.05, 20.0


@dataclass
class CoreConfig:
    """Temporal core hyper-parameters (baselines use d_model hidden units and heads, as
    the paper's Table 4 note prescribes)."""

    core: str = "nac"
    window: int = 16
    d_model: int = 64
    num_heads: int = 4
    topk: int = 8
    mode: str = "exact"
    euler_steps: int = 6
    select: str = "exact"
    sparsity: float = 0.5
    backbone_units: int = 16
    time_input: str = "elapsed"
    logit_variant: str = "paper"   # beyond the paper: "scaled", "qk" (nac_drive.nac.layer)
    dropout: float = 0.0
    seed: int = 0


class NACCore(nn.Module):
    def __init__(self, input_dim: int, cfg: CoreConfig):
        super().__init__()
        if cfg.select == "block":
            raise ValueError("select: a driving policy streams frame by frame (NAC.step), which select='block' "
                             "cannot do (its blocks are cut from a whole sequence); use 'exact' or 'all'")
        self.nac = NAC(input_dim, d_model=cfg.d_model, num_heads=cfg.num_heads, topk=cfg.topk, mode=cfg.mode,
                       euler_steps=cfg.euler_steps, select=cfg.select, sparsity=cfg.sparsity, causal=True,
                       window=cfg.window, dropout=cfg.dropout, seed=cfg.seed, backbone_units=cfg.backbone_units,
                       time_input=cfg.time_input, logit_variant=cfg.logit_variant)
        self.out_dim = cfg.d_model

    def forward(self, x, t=None, return_trace=False):
        return self.nac(x, t=t, return_trace=return_trace)

    def init_state(self, batch: int):
        return self.nac.init_cache(batch)

    def step(self, x_t, state, t=None, return_trace=False):
        return self.nac.step(x_t, state, t=t, return_trace=return_trace)


def elapsed_periods(t: torch.Tensor, frame_dt: float) -> torch.Tensor:
    """Timestamps ``t [B, T]`` (seconds) -> each frame's elapsed time in frame periods
    ``[B, T]``: ``(t_i - t_{i-1}) / frame_dt``, clamped to [MIN_PERIODS, MAX_PERIODS];
    the window's first frame, which has no predecessor in the window, counts one period."""
    steps = torch.ones_like(t)
    steps[:, 1:] = (t[:, 1:] - t[:, :-1]) / frame_dt
    return steps.clamp(MIN_PERIODS, MAX_PERIODS)


def run_cells(net: CfC | LTC, x: torch.Tensor, periods: torch.Tensor) -> torch.Tensor:
    """An ncps CfC / LTC over ``x [B, T, F]`` with per-sample steps ``periods [B, T]``
    -> ``[B, T, units]``. ncps 1.0.1's own loop squeezes batched timespans to ``[B]`` and
    broadcasts them against ``[B, units]``, which fails for any batch > 1; its cells take
    ``[B, 1]``."""
    h = x.new_zeros(x.shape[0], net.state_size)
    out = []
    for i in range(x.shape[1]):
        y, h = net.rnn_cell(x[:, i], h, periods[:, i, None])
        out.append(y)
    return getattr(net, "fc", nn.Identity())(torch.stack(out, dim=1))


class _Sequence(nn.Module):
    """LSTM / GRU / CfC / LTC / causal MHA over a window: x [B, T, F] -> [B, T, d_model]."""

    def __init__(self, input_dim: int, cfg: CoreConfig, frame_dt: float = 1.0):
        super().__init__()
        self.kind, self.out_dim, self.frame_dt = cfg.core, cfg.d_model, frame_dt
        if cfg.core == "lstm":
            self.net = nn.LSTM(input_dim, cfg.d_model, batch_first=True)
        elif cfg.core == "gru":
            self.net = nn.GRU(input_dim, cfg.d_model, batch_first=True)
        elif cfg.core == "cfc":
            self.net = CfC(input_dim, cfg.d_model, batch_first=True)
        elif cfg.core == "ltc":
            self.net = LTC(input_dim, cfg.d_model, batch_first=True)
        elif cfg.core == "mha":
            self.proj = nn.Linear(input_dim, cfg.d_model)
            self.position = nn.Parameter(torch.zeros(cfg.window, cfg.d_model))
            self.net = nn.MultiheadAttention(cfg.d_model, cfg.num_heads, batch_first=True)
            self.norm = nn.LayerNorm(cfg.d_model)
        else:
            raise ValueError(f"core: must be one of {CORES}, got {cfg.core!r}")

    def forward(self, x: torch.Tensor, t: torch.Tensor | None = None) -> torch.Tensor:
        if self.kind in ("lstm", "gru"):
            return self.net(x)[0]
        if self.kind in ("cfc", "ltc"):
            return self.net(x)[0] if t is None else run_cells(self.net, x, elapsed_periods(t, self.frame_dt))
        T = x.shape[1]
        if T > self.position.shape[0]:
            raise ValueError(f"x: the mha core was built for windows of {self.position.shape[0]} frames, got {T}")
        h = self.proj(x) + self.position[:T]
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        return self.norm(h + self.net(h, h, h, attn_mask=causal, need_weights=False)[0])


@dataclass
class _Replay:
    frames: torch.Tensor          # [B, n, F], the last n <= window features
    times: torch.Tensor | None    # [B, n]


class WindowReplay(nn.Module):
    """Streams a sequence model by re-running it over the last ``window`` frames."""

    def __init__(self, input_dim: int, cfg: CoreConfig, frame_dt: float = 1.0):
        super().__init__()
        self.seq = _Sequence(input_dim, cfg, frame_dt)
        self.window, self.out_dim = cfg.window, cfg.d_model

    def forward(self, x, t=None, return_trace=False):
        if return_trace:
            raise ValueError(f"return_trace: only the nac core has neuron traces, not {self.seq.kind!r}")
        if x.shape[1] <= self.window:
            return self.seq(x, t)
        # longer than the training window: each output sees only its last `window` frames
        return torch.stack([self.seq(x[:, max(0, i - self.window + 1):i + 1],
                                     None if t is None else t[:, max(0, i - self.window + 1):i + 1])[:, -1]
                            for i in range(x.shape[1])], dim=1)

    def init_state(self, batch: int) -> _Replay:
        return _Replay(frames=torch.zeros(batch, 0, 0), times=None)

    def step(self, x_t, state: _Replay, t=None, return_trace=False):
        if return_trace:
            raise ValueError(f"return_trace: only the nac core has neuron traces, not {self.seq.kind!r}")
        frames = x_t[:, None] if state.frames.shape[1] == 0 else torch.cat([state.frames, x_t[:, None]], 1)
        times = None if t is None else (t[:, None] if state.times is None else torch.cat([state.times, t[:, None]], 1))
        frames, times = frames[:, -self.window:], None if times is None else times[:, -self.window:]
        return self.seq(frames, times)[:, -1], _Replay(frames, times)


def build_core(input_dim: int, cfg: CoreConfig, frame_dt: float = 1.0) -> nn.Module:
    """The core ``cfg`` names; ``frame_dt``: the seconds of one frame period (CfC, LTC)."""
    if cfg.core not in CORES:
        raise ValueError(f"core: must be one of {CORES}, got {cfg.core!r}")
    return NACCore(input_dim, cfg) if cfg.core == "nac" else WindowReplay(input_dim, cfg, frame_dt)
