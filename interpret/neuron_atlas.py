"""The neuron atlas: for every traced neuron of a NAC driving policy, how much of the chosen
action it carries and what silencing it does.

Both kinds of shipped policy: discrete actions (CarRacing: the chosen action) and steering
regression (Udacity: one continuous steering output, negative left). A regression policy's
decision is compared by its *side*: left, straight or right, the steering outside or within
the deadband of :func:`~nac_drive.interpret.fig4.steering_sides` (0.05 for Udacity).

Neurons (:func:`traced_neurons`): the sensory gates' units q, k, v ``[d_model]`` and each
head's backbone inter, command and motor neurons (their ``*_mean`` traces: the mean over a
step's selected pairs). Each head as a whole is a row of its own.

* **Information** (:func:`information`, the recorded run alone): the AUROC with which a
  neuron's activation separates the steps where the policy steered right from those where
  it steered left (:func:`~nac_drive.interpret.fig4.left_right_auroc`), and the mutual
  information between the binned activation and the chosen action, or for a regression
  policy its side (:func:`mutual_information`).
* **Silencing** (:func:`silencing`, the policy replayed on the run's frames,
  :class:`PolicyReplay`): the neuron clamped to its mean over the run
  (:class:`~nac_drive.nac.Clamp`), and the share of frames where the policy still chooses
  the action the intact policy chooses (its agreement; regression: the share of frames
  whose steering keeps the intact steering's side, and also the mean |change of the
  steering|, in the output's units). An agreement counts only flips of the choice, so a
  discrete policy's silencing also reports how far the action probabilities moved
  (:func:`probability_shift`): the mean change of the log-probability of the action the
  intact policy chose, and the mean KL(intact || silenced). A head is silenced by replacing
  its output with its mean output; the attention weights are also tried uniform over each
  query's selected keys.

:func:`neuron_atlas` puts it together, neurons sorted by what silencing them costs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from nac_drive.devices import module_device
from nac_drive.interpret.fig4 import left_right_auroc, sides_of, steer_deadband, steering_sides
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
    ``labels`` ``[n]``; non-finite ``x`` left out. The binning is ours; the estimate on the
    bins' contingency table is scikit-learn's ``mutual_info_score`` (in nats, here in bits).

    The plug-in estimate is biased upwards: by about (bins - 1)(classes - 1) / (2 n ln 2)
    bits for independent variables (Miller-Madow; :func:`mi_bias_bits`), 0.007 bits for 8
    bins, 5 actions and 3000 steps. Compare rows of one atlas, not tiny values with zero.
    """
    from sklearn.metrics import mutual_info_score

    x, labels = np.asarray(x, dtype=np.float64), np.asarray(labels)
    keep = np.isfinite(x)
    x, labels = x[keep], labels[keep]
    if x.size == 0:
        return float("nan")
    edges = np.unique(np.quantile(x, np.linspace(0, 1, bins + 1)[1:-1]))
    binned = np.searchsorted(edges, x, side="right")
    return float(mutual_info_score(labels, binned) / math.log(2))


def mi_bias_bits(bins: int, classes: int, n: int) -> float:
    """First-order (Miller-Madow) upward bias of :func:`mutual_information` for independent
    variables: (bins - 1)(classes - 1) / (2 n ln 2) bits."""
    return (bins - 1) * (classes - 1) / (2.0 * max(n, 1) * math.log(2))


def decision_labels(run, deadband: float | None = None) -> np.ndarray:
    """``[N]`` the decision the mutual information is taken with: the chosen action (discrete
    policies), or the side of the steering, -1 / 0 / +1 (continuous, :func:`steering_sides`)."""
    if steer_deadband(run, deadband) is None:
        return run.policy_action[:, 0]
    return steering_sides(run, deadband)


def information(run, bins: int = MI_BINS, deadband: float | None = None) -> list[dict]:
    """Per traced neuron (:func:`traced_neurons`), on the run's traced steps: ``auroc``
    (right steps vs left steps, 0.5 = none, 0 or 1 = perfect), ``mi_bits`` (with the chosen
    action or the steering's side, :func:`decision_labels`, :func:`mutual_information`) and
    ``mean`` (its mean over the run: the value silencing clamps it to)."""
    traced = run.has_nac
    sides, actions = steering_sides(run, deadband), decision_labels(run, deadband)
    rows = []
    for neuron in traced_neurons(run):
        x = np.where(traced, neuron.activations(run), np.nan)
        rows.append({"name": neuron.name, "group": neuron.group, "head": neuron.head, "unit": neuron.unit,
                     "auroc": left_right_auroc(x, sides), "mi_bits": mutual_information(x[traced], actions[traced], bins),
                     "mean": float(np.nanmean(x[traced]))})
    return rows


class PolicyReplay:
    """A NAC policy replayed on the frames of a recorded run, as a batch.

    Step i sees the frames of its episode up to i, exactly as the streaming policy
    (``NAC.step``, :class:`~nac_drive.interpret.policy_saliency.Replay`) does: the
    causal, windowed ``NAC.forward`` over a whole episode gives at every position what
    ``step`` gives there (tests hold them equal). The encoder runs once per frame; each
    call of :meth:`outputs` runs only the temporal core and the head, all episodes in one
    batch (padded at the end, which no earlier step sees), on the policy's device; the
    outputs come back to the CPU.

    Args:
        policy: a :class:`~nac_drive.policy.DrivingPolicy` with a NAC core: discrete actions,
            or continuous ones whose output 0 is the steering (a Udacity regression policy).
        run: the loaded :class:`~nac_drive.interpret.trace.RunTrace`.
        max_frames: replay only the run's first this many steps (default all).
        deadband: continuous steering within it is straight (default: the run's steering
            column's, :func:`~nac_drive.interpret.fig4.steer_deadband`).
    """

    def __init__(self, policy, run, max_frames: int | None = None, deadband: float | None = None):
        if policy.config.core.core != "nac":
            raise ValueError(f"policy: the atlas needs a NAC policy, got core {policy.config.core.core!r}")
        if max_frames is not None and max_frames < 1:
            raise ValueError(f"max_frames: must be >= 1, got {max_frames}")
        self.continuous = policy.config.action == "continuous"
        self.deadband = steer_deadband(run, deadband) if self.continuous else None
        if self.continuous and self.deadband is None:
            raise ValueError(f"run: a continuous policy's run must record its steering first ('steer' or "
                             f"'steering'), got action names {run.metadata.get('action_names')}")
        self.policy, self.run = policy, run
        self.nac = policy.core.nac
        n = run.num_steps if max_frames is None else min(max_frames, run.num_steps)
        self.steps = np.arange(n)                                                       # [n] replayed steps
        starts = [0] + [i for i in range(1, n) if run.episode[i] != run.episode[i - 1]] + [n]
        self.segments = [(a, b) for a, b in zip(starts[:-1], starts[1:])]               # episodes (or their start)
        longest = max(b - a for a, b in self.segments)
        device = module_device(policy)
        features = []
        with torch.inference_mode():
            for a, b in self.segments:
                x = torch.zeros(longest, policy.config.feature_dim, device=device)
                for c in range(a, b, ENCODE_CHUNK):
                    frames = [policy.observation_to_frame(run.frame(i))[0] for i in range(c, min(c + ENCODE_CHUNK, b))]
                    x[c - a:c - a + len(frames)] = policy.encoder(torch.stack(frames).to(device))
                features.append(x)
        self.features = torch.stack(features)                                            # [S, T, F]
        # each frame at its recorded time from its episode's first, as the policy saw it (frames
        # seen x frame_dt on CarRacing, the simulator's clock on Udacity, gaps where frames dropped)
        self.times = torch.zeros(len(self.segments), longest, dtype=torch.float64)
        self.valid = torch.zeros(len(self.segments), longest, dtype=torch.bool)         # [S, T] real steps
        for s, (a, b) in enumerate(self.segments):
            self.valid[s, :b - a] = True
            self.times[s, :b - a] = torch.from_numpy(run.timestamp[a:b] - run.timestamp[a])
        self.times, self.valid = self.times.float().to(device), self.valid.to(device)

    @torch.inference_mode()
    def outputs(self, clamp: Clamp | None = None) -> np.ndarray:
        """``[n, num_outputs]`` the head's output at every replayed step, under ``clamp``."""
        with self.nac.clamped(clamp):
            y = self.policy.head(self.policy.core(self.features, self.times))           # [S, T, A]
        return y[self.valid].cpu().numpy()

    def actions(self, clamp: Clamp | None = None) -> np.ndarray:
        """``[n]`` the action chosen at every replayed step, under ``clamp``: the output's
        argmax (discrete), or the steering (continuous: output 0 within the action space)."""
        return self.actions_of(self.outputs(clamp))

    def actions_of(self, y: np.ndarray) -> np.ndarray:
        """``[n]`` the actions of outputs ``y`` ``[n, num_outputs]`` (:meth:`actions`)."""
        if not self.continuous:
            return y.argmax(axis=-1)
        space = self.policy.action_space
        return np.clip(y, space.low, space.high)[:, 0]

    def compare(self, actions: np.ndarray, reference: np.ndarray) -> dict[str, float]:
        """How ``actions`` ``[n]`` (of :meth:`actions`) keep ``reference`` ``[n]``: ``agreement``
        (:func:`agreement`: the same action, or for steering the same side) and, for
        steering, ``steering_change`` (the mean |difference|)."""
        result = {"agreement": agreement(actions, reference, self.deadband)}
        if self.continuous:
            result["steering_change"] = steering_change(actions, reference)
        return result

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
        return seen[0][self.valid].view(-1, self.nac.num_heads, self.nac.depth).cpu().numpy()

    def head_push(self, towards: int, against: int | None = None) -> np.ndarray:
        """``[n, H]`` each head's direct share of the head's output ``towards - against``
        (two action indices), or of output ``towards`` alone (``against`` None: a regression
        policy's steering): the output is linear in the heads' outputs, so it is exactly the
        sum of these shares plus a constant."""
        w_head, w_out = self.policy.head[-1].weight, self.nac.out_proj.weight           # [A, D], [D, D]
        with torch.no_grad():
            row = w_head[towards] - (w_head[against] if against is not None else 0.0)
            direction = (row @ w_out).view(self.nac.num_heads, -1).cpu().numpy()
        return np.einsum("nhd,hd->nh", self.head_outputs(), direction)


def agreement(actions: np.ndarray, reference: np.ndarray, deadband: float | None = None) -> float:
    """The share of steps where ``actions`` ``[n]`` equal ``reference`` ``[n]``; given a
    ``deadband`` (continuous steering), where both steer to the same side: left, straight
    (within the deadband) or right (:func:`~nac_drive.interpret.fig4.sides_of`)."""
    actions, reference = np.asarray(actions), np.asarray(reference)
    if deadband is not None:
        actions, reference = sides_of(actions, deadband), sides_of(reference, deadband)
    return float(np.mean(actions == reference)) if len(actions) else float("nan")


def probability_shift(logits: np.ndarray, reference_logits: np.ndarray) -> dict[str, float]:
    """How far a discrete policy's action probabilities moved from the reference's, over the
    steps (logits ``[n, A]`` both): ``log_prob_change``, the mean change of the
    log-probability of the action the reference chose (negative: less sure of it), and
    ``kl``, the mean KL(reference || moved) in nats (0: the same distribution)."""
    from scipy.special import log_softmax, rel_entr

    moved = log_softmax(np.asarray(logits, dtype=np.float64), axis=-1)
    reference = log_softmax(np.asarray(reference_logits, dtype=np.float64), axis=-1)
    if not len(reference):
        return {"log_prob_change": float("nan"), "kl": float("nan")}
    chosen = reference.argmax(axis=-1)[:, None]
    change = np.take_along_axis(moved, chosen, axis=-1) - np.take_along_axis(reference, chosen, axis=-1)
    kl = rel_entr(np.exp(reference), np.exp(moved)).sum(axis=-1)
    return {"log_prob_change": float(change.mean()), "kl": float(kl.mean())}


def steering_change(steering: np.ndarray, reference: np.ndarray) -> float:
    """The mean |``steering`` - ``reference``| over the steps (both ``[n]``)."""
    diff = np.abs(np.asarray(steering, dtype=np.float64) - np.asarray(reference, dtype=np.float64))
    return float(diff.mean()) if diff.size else float("nan")


def silencing(replay: PolicyReplay, clamps: dict[str, Clamp], progress: bool = False) -> dict[str, dict[str, float]]:
    """Name -> how the policy under that clamp keeps the intact policy's decisions over the
    replayed steps (:meth:`PolicyReplay.compare`: ``agreement``, and for steering
    ``steering_change``; for discrete actions also :func:`probability_shift`'s
    ``log_prob_change`` and ``kl``)."""
    intact_outputs = replay.outputs()
    intact = replay.actions_of(intact_outputs)
    items = clamps.items()
    if progress:
        from tqdm import tqdm
        items = tqdm(items, desc="silencing", unit="neuron")
    kept = {}
    for name, clamp in items:
        outputs = replay.outputs(clamp)
        kept[name] = replay.compare(replay.actions_of(outputs), intact)
        if not replay.continuous:
            kept[name].update(probability_shift(outputs, intact_outputs))
    return kept


def neuron_atlas(run, policy, max_frames: int | None = None, bins: int = MI_BINS, progress: bool = False,
                 deadband: float | None = None) -> dict:
    """The atlas of a NAC policy on a run it drove (its trace).

    Returns ``neurons`` (one row per traced neuron: :func:`information` plus ``agreement``
    and ``silencing_cost`` = 1 - agreement, for discrete actions ``log_prob_change`` and
    ``kl`` (:func:`probability_shift`), and for steering ``steering_change``; sorted by
    cost, then by steering change (steering) or KL (discrete), then by mutual information), ``heads`` (per
    head: AUROC and mutual information of its direct push (:meth:`PolicyReplay.head_push`,
    ``head_push`` names it: towards LEFT rather than RIGHT in a discrete policy's output, or
    on the steering output, positive right), and the agreement with its output held at its
    mean), ``uniform_weights`` (agreement with the attention weights uniform over each
    query's selected keys), ``frames`` (steps replayed), ``replay_agrees_with_run`` (the
    intact replay's actions against the recorded ones: the frames are replayed from their
    JPEG copies; for steering also ``replay_steering_change``), ``decision`` (what agreement
    compares: "action" or "steering side"), ``deadband`` (steering) and ``mi_bias_bits``
    (:func:`mi_bias_bits`).
    """
    names = list(run.metadata.get("action_names") or [])
    continuous = policy.config.action == "continuous"
    if not continuous and ("left" not in names or "right" not in names):
        raise ValueError(f"run: the atlas needs discrete actions named 'left' and 'right', got {names or None}")
    replay = PolicyReplay(policy, run, max_frames, deadband)
    steps, intact = replay.steps, replay.actions()
    rows = information(run, bins, replay.deadband)
    neurons = {n.name: n for n in traced_neurons(run)}
    clamps = {row["name"]: neurons[row["name"]].clamp(row["mean"]) for row in rows}
    mean_heads = replay.head_outputs().mean(axis=0)                                     # [H, depth]
    clamps.update({f"head {h}": Clamp(heads={h: mean_heads[h].tolist()}) for h in range(len(mean_heads))})
    clamps["uniform weights"] = Clamp(uniform_weights=True)
    kept = silencing(replay, clamps, progress)

    def silenced(name: str) -> dict:
        return {**kept[name], "silencing_cost": 1.0 - kept[name]["agreement"]}

    for row in rows:
        row.update(silenced(row["name"]))
    rows.sort(key=lambda r: (-r["silencing_cost"], -r.get("steering_change", r.get("kl", 0.0)),
                             -np.nan_to_num(r["mi_bits"], nan=-1.0)))
    if continuous:
        push, direction = replay.head_push(0), "steering output (positive right)"                  # [n, H]
    else:
        push, direction = replay.head_push(names.index("left"), names.index("right")), "left logit - right logit"
    sides, labels = steering_sides(run, replay.deadband)[steps], decision_labels(run, replay.deadband)[steps]
    heads = [{"name": f"head {h}", "head": h, "auroc": left_right_auroc(push[:, h], sides),
              "mi_bits": mutual_information(push[:, h], labels, bins), **silenced(f"head {h}")}
             for h in range(push.shape[1])]
    traced = int(run.has_nac.sum())
    replayed = replay.compare(intact, run.policy_action[steps, 0])
    return {"neurons": rows, "heads": heads, "uniform_weights": kept["uniform weights"],
            "frames": len(steps), "replay_agrees_with_run": replayed["agreement"],
            **({"replay_steering_change": replayed["steering_change"]} if continuous else {}),
            "decision": "steering side" if continuous else "action", "deadband": replay.deadband,
            "head_push": direction, "bins": bins, "mi_bias_bits": mi_bias_bits(bins, 3 if continuous else len(names), traced)}
