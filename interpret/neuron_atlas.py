"""The neuron atlas: for every traced neuron of a NAC driving policy, how much of the chosen
action it carries and what silencing it does.

Neurons (:func:`traced_neurons`): the sensory gates' units q, k, v ``[d_model]`` and each
head's backbone inter, command and motor neurons (their ``*_mean`` traces: the mean over a
step's selected pairs). Each head as a whole is a row of its own.

* **Information** (:func:`information`, the recorded run alone): the AUROC with which a
  neuron's activation separates the steps where the policy steered right from those where
  it steered left (:func:`~nac_drive.interpret.fig4.left_right_auroc`), and the mutual
  information between the binned activation and the chosen action
  (:func:`mutual_information`).
* **Silencing** (:func:`silencing`, the policy replayed on the run's frames,
  :class:`PolicyReplay`): the neuron clamped to its mean over the run
  (:class:`~nac_drive.nac.Clamp`), and the share of frames where the policy still chooses
  the action the intact policy chooses (its agreement). A head is silenced by replacing its
  output with its mean output; the attention weights are also tried uniform over each
  query's selected keys.

:func:`neuron_atlas` puts it together, neurons sorted by what silencing them costs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from nac_drive.interpret.fig4 import left_right_auroc, steering_sides
from nac_drive.interpret.trace import BACKBONE_GROUPS
from nac_drive.nac import Clamp

SENSORY_GROUPS = ("q", "k", "v")
MI_BINS = 8
ENCODE_CHUNK = 256   # frames per encoder call when the replay encodes a run


@dataclass(frozen=True)
class Neuron:
    """One traced neuron: ``group`` q, k, v (``unit`` in ``[0, d_model)``, ``head`` the head
    that unit belongs to) or inter, command, motor (``unit`` within that group of ``head``)."""

    group: str
    head: int
    unit: int

    @property
    def name(self) -> str:
        """``q[12]`` or ``h2.inter[3]``."""
        return f"{self.group}[{self.unit}]" if self.group in SENSORY_GROUPS else f"h{self.head}.{self.group}[{self.unit}]"

    def activations(self, run) -> np.ndarray:
        """``[N]`` its activation at each step of ``run`` (NaN where a step has no trace)."""
        if self.group in SENSORY_GROUPS:
            return getattr(run, self.group)[:, self.unit]
        return getattr(run, f"{self.group}_mean")[:, self.head, self.unit]

    def clamp(self, value: float) -> Clamp:
        """The :class:`Clamp` that holds this neuron at ``value``."""
        if self.group in SENSORY_GROUPS:
            return Clamp(**{self.group: {self.unit: float(value)}})
        return Clamp(**{self.group: {(self.head, self.unit): float(value)}})


def traced_neurons(run) -> list[Neuron]:
    """Every neuron the trace of ``run`` records, in the trace's order."""
    d_model, heads = run.q.shape[1], run.inter_mean.shape[1]
    if not d_model or not heads:
        raise ValueError(f"{run.path}: the run has no NAC trace (drive a NAC policy with --trace)")
    depth = d_model // heads
    neurons = [Neuron(g, u // depth, u) for g in SENSORY_GROUPS for u in range(d_model)]
    for group in BACKBONE_GROUPS:
        size = getattr(run, f"{group}_mean").shape[2]
        neurons += [Neuron(group, h, u) for h in range(heads) for u in range(size)]
    return neurons


def mutual_information(x: np.ndarray, labels: np.ndarray, bins: int = MI_BINS) -> float:
    """Plug-in mutual information in bits between ``x`` ``[n]`` cut into ``bins`` quantile
    bins (equal counts; tied values share a bin, so a constant gives 0) and the discrete
    ``labels`` ``[n]``; non-finite ``x`` left out.

    The plug-in estimate is biased upwards: by about (bins - 1)(classes - 1) / (2 n ln 2)
    bits for independent variables (Miller-Madow; :func:`mi_bias_bits`), 0.007 bits for 8
    bins, 5 actions and 3000 steps. Compare rows of one atlas, not tiny values with zero.
    """
    x, labels = np.asarray(x, dtype=np.float64), np.asarray(labels)
    keep = np.isfinite(x)
    x, labels = x[keep], labels[keep]
    if x.size == 0:
        return float("nan")
    edges = np.unique(np.quantile(x, np.linspace(0, 1, bins + 1)[1:-1]))
    binned = np.searchsorted(edges, x, side="right")
    _, y = np.unique(labels, return_inverse=True)
    joint = np.zeros((len(edges) + 1, y.max() + 1))
    np.add.at(joint, (binned, y), 1.0)
    joint /= joint.sum()
    outer = joint.sum(axis=1, keepdims=True) * joint.sum(axis=0, keepdims=True)
    nz = joint > 0
    return float(max(0.0, np.sum(joint[nz] * np.log2(joint[nz] / outer[nz]))))


def mi_bias_bits(bins: int, classes: int, n: int) -> float:
    """First-order (Miller-Madow) upward bias of :func:`mutual_information` for independent
    variables: (bins - 1)(classes - 1) / (2 n ln 2) bits."""
    return (bins - 1) * (classes - 1) / (2.0 * max(n, 1) * math.log(2))


def information(run, bins: int = MI_BINS) -> list[dict]:
    """Per traced neuron (:func:`traced_neurons`), on the run's traced steps: ``auroc``
    (right steps vs left steps, 0.5 = none, 0 or 1 = perfect), ``mi_bits`` (with the chosen
    action, :func:`mutual_information`) and ``mean`` (its mean over the run: the value
    silencing clamps it to)."""
    traced = run.has_nac
    sides, actions = steering_sides(run), run.policy_action[:, 0]
    rows = []
    for neuron in traced_neurons(run):
        x = np.where(traced, neuron.activations(run), np.nan)
        rows.append({"name": neuron.name, "group": neuron.group, "head": neuron.head, "unit": neuron.unit,
                     "auroc": left_right_auroc(x, sides), "mi_bits": mutual_information(x[traced], actions[traced], bins),
                     "mean": float(np.nanmean(x[traced]))})
    return rows


class PolicyReplay:
    """A discrete NAC policy replayed on the frames of a recorded run, as a batch.

    Step i sees the frames of its episode up to i, exactly as the streaming policy
    (``NAC.step``, :class:`~nac_drive.interpret.policy_saliency.Replay`) does: the
    causal, windowed ``NAC.forward`` over a whole episode gives at every position what
    ``step`` gives there (tests hold them equal). The encoder runs once per frame; each
    call of :meth:`outputs` runs only the temporal core and the head, all episodes in one
    batch (padded at the end, which no earlier step sees).

    Args:
        policy: a :class:`~nac_drive.policy.DrivingPolicy` with a NAC core and discrete actions.
        run: the loaded :class:`~nac_drive.interpret.trace.RunTrace`.
        max_frames: replay only the run's first this many steps (default all).
    """

    def __init__(self, policy, run, max_frames: int | None = None):
        if policy.config.core.core != "nac" or policy.config.action != "discrete":
            raise ValueError(f"policy: the atlas needs a NAC policy with discrete actions, got core "
                             f"{policy.config.core.core!r} with {policy.config.action} actions")
        if max_frames is not None and max_frames < 1:
            raise ValueError(f"max_frames: must be >= 1, got {max_frames}")
        self.policy, self.run = policy, run
        self.nac = policy.core.nac
        n = run.num_steps if max_frames is None else min(max_frames, run.num_steps)
        self.steps = np.arange(n)                                                       # [n] replayed steps
        starts = [0] + [i for i in range(1, n) if run.episode[i] != run.episode[i - 1]] + [n]
        self.segments = [(a, b) for a, b in zip(starts[:-1], starts[1:])]               # episodes (or their start)
        longest = max(b - a for a, b in self.segments)
        features = []
        with torch.inference_mode():
            for a, b in self.segments:
                x = torch.zeros(longest, policy.config.feature_dim)
                for c in range(a, b, ENCODE_CHUNK):
                    frames = [policy.observation_to_frame(run.frame(i))[0] for i in range(c, min(c + ENCODE_CHUNK, b))]
                    x[c - a:c - a + len(frames)] = policy.encoder(torch.stack(frames))
                features.append(x)
        self.features = torch.stack(features)                                            # [S, T, F]
        # as the streaming policy stamps frames without timestamps: frames seen x frame_dt
        self.times = (torch.arange(longest) * policy.config.frame_dt).expand(len(self.segments), longest)
        self.valid = torch.zeros(len(self.segments), longest, dtype=torch.bool)         # [S, T] real steps
        for s, (a, b) in enumerate(self.segments):
            self.valid[s, :b - a] = True

    @torch.inference_mode()
    def outputs(self, clamp: Clamp | None = None) -> np.ndarray:
        """``[n, num_outputs]`` the head's output at every replayed step, under ``clamp``."""
        with self.nac.clamped(clamp):
            y = self.policy.head(self.policy.core(self.features, self.times))           # [S, T, A]
        return y[self.valid].numpy()

    def actions(self, clamp: Clamp | None = None) -> np.ndarray:
        """``[n]`` the action chosen at every replayed step (the output's argmax), under ``clamp``."""
        return self.outputs(clamp).argmax(axis=-1)

    @torch.inference_mode()
    def head_outputs(self) -> np.ndarray:
        """``[n, H, depth]`` each head's output (eq. 19, what enters the output projection),
        intact."""
        seen = []
        hook = self.nac.out_proj.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
        try:
            self.outputs()
        finally:
            hook.remove()
        return seen[0][self.valid].view(-1, self.nac.num_heads, self.nac.depth).numpy()

    def head_push(self, towards: int, against: int) -> np.ndarray:
        """``[n, H]`` each head's direct share of the head's output ``towards - against``
        (two action indices): the output is linear in the heads' outputs, so it is exactly
        the sum of these shares plus a constant."""
        w_head, w_out = self.policy.head[-1].weight, self.nac.out_proj.weight           # [A, D], [D, D]
        with torch.no_grad():
            direction = ((w_head[towards] - w_head[against]) @ w_out).view(self.nac.num_heads, -1).numpy()
        return np.einsum("nhd,hd->nh", self.head_outputs(), direction)


def agreement(actions: np.ndarray, reference: np.ndarray) -> float:
    """The share of steps where ``actions`` ``[n]`` equal ``reference`` ``[n]``."""
    return float(np.mean(np.asarray(actions) == np.asarray(reference))) if len(actions) else float("nan")


def silencing(replay: PolicyReplay, clamps: dict[str, Clamp], progress: bool = False) -> dict[str, float]:
    """Name -> agreement of the policy under that clamp with the intact policy, over the
    replayed steps."""
    intact = replay.actions()
    items = clamps.items()
    if progress:
        from tqdm import tqdm
        items = tqdm(items, desc="silencing", unit="neuron")
    return {name: agreement(replay.actions(clamp), intact) for name, clamp in items}


def neuron_atlas(run, policy, max_frames: int | None = None, bins: int = MI_BINS, progress: bool = False) -> dict:
    """The atlas of a NAC policy on a run it drove (its ``trace.npz``).

    Returns ``neurons`` (one row per traced neuron: :func:`information` plus ``agreement``
    and ``silencing_cost`` = 1 - agreement; sorted by cost, then by mutual information),
    ``heads`` (per head: AUROC and mutual information of its direct push towards LEFT
    rather than RIGHT in the policy's output (:meth:`PolicyReplay.head_push`), and the
    agreement with its output held at its mean), ``uniform_weights`` (agreement with the
    attention weights uniform over each query's selected keys), ``frames`` (steps replayed),
    ``replay_agrees_with_run`` (the intact replay's actions against the recorded ones: the
    frames are replayed from their JPEG copies) and ``mi_bias_bits`` (:func:`mi_bias_bits`).
    """
    names = list(run.metadata.get("action_names") or [])
    if "left" not in names or "right" not in names:
        raise ValueError(f"run: the atlas needs discrete actions named 'left' and 'right', got {names or None}")
    left, right = names.index("left"), names.index("right")
    replay = PolicyReplay(policy, run, max_frames)
    steps, intact = replay.steps, replay.actions()
    rows = information(run, bins)
    neurons = {n.name: n for n in traced_neurons(run)}
    clamps = {row["name"]: neurons[row["name"]].clamp(row["mean"]) for row in rows}
    mean_heads = replay.head_outputs().mean(axis=0)                                     # [H, depth]
    clamps.update({f"head {h}": Clamp(heads={h: mean_heads[h].tolist()}) for h in range(len(mean_heads))})
    clamps["uniform weights"] = Clamp(uniform_weights=True)
    agree = silencing(replay, clamps, progress)

    for row in rows:
        row["agreement"] = agree[row["name"]]
        row["silencing_cost"] = 1.0 - row["agreement"]
    rows.sort(key=lambda r: (-r["silencing_cost"], -np.nan_to_num(r["mi_bits"], nan=-1.0)))
    push = replay.head_push(left, right)                                                 # [n, H]
    sides, actions = steering_sides(run)[steps], run.policy_action[steps, 0]
    heads = [{"name": f"head {h}", "head": h, "auroc": left_right_auroc(push[:, h], sides),
              "mi_bits": mutual_information(push[:, h], actions, bins), "agreement": agree[f"head {h}"],
              "silencing_cost": 1.0 - agree[f"head {h}"]} for h in range(push.shape[1])]
    traced = int(run.has_nac.sum())
    return {"neurons": rows, "heads": heads, "uniform_weights": {"agreement": agree["uniform weights"]},
            "frames": len(steps), "replay_agrees_with_run": agreement(intact, run.policy_action[steps, 0]),
            "bins": bins, "mi_bias_bits": mi_bias_bits(bins, len(names), traced)}
