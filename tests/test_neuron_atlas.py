"""The neuron atlas and the Fig. 4 claim test, on known answers: AUROC and mutual information
by hand, the NAC clamp, the batched replay against the streaming policy, a policy in which
one neuron decides the steering, and synthetic traces that satisfy or violate Fig. 4."""

import dataclasses

import numpy as np
import pytest
import torch

from nac_drive import NAC
from nac_drive.nac import kernels as nac_kernels
from nac_drive.policy.loading import load_driving_policy
from nac_drive.interpret.fig4 import SCENES, auroc, fig4_claim, head_values, scene_classes, steering_sides
from nac_drive.interpret.neuron_atlas import (PolicyReplay, agreement, mi_bias_bits, mutual_information, neuron_atlas,
                                              probability_shift, traced_neurons)
from nac_drive.interpret.trace import load_trace
from nac_drive.nac import Clamp
from nac_drive.simulators.carracing import ACTION_NAMES
from support.steering_policy import one_neuron_policy, record_policy_run, road_episodes
from support.synthetic_runs import make_synthetic_run

torch.set_num_threads(1)


# ------------------------------------------------------------------ statistics
def test_auroc_matches_hand_computed_values_with_ties():
    # 3 of the 4 (positive, negative) pairs are ordered right: 0.75
    assert auroc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1], bool)) == 0.75
    # positives {2, 3}, negatives {1, 2}: 2>1, 2=2 (one half), 3>1, 3>2 -> 3.5 / 4
    assert auroc(np.array([1.0, 2.0, 2.0, 3.0]), np.array([0, 1, 0, 1], bool)) == 0.875
    assert auroc(np.full(6, 0.3), np.array([0, 1] * 3, bool)) == 0.5              # all tied
    assert auroc(np.array([3.0, 2.0, 1.0]), np.array([0, 1, 1], bool)) == 0.0     # perfectly reversed
    assert np.isnan(auroc(np.array([1.0, 2.0]), np.array([1, 1], bool)))          # one class only
    with pytest.raises(ValueError, match="one shape"):
        auroc(np.ones(3), np.ones(4, bool))


def test_auroc_equals_the_pairwise_count_and_scikit_learns_on_random_tied_scores():
    from sklearn.metrics import roc_auc_score   # the definition auroc keeps, at a fraction of its cost

    rng = np.random.default_rng(0)
    scores, labels = rng.integers(0, 5, 60).astype(float), rng.random(60) < 0.4
    pos, neg = scores[labels], scores[~labels]
    by_pairs = ((pos[:, None] > neg[None]) + 0.5 * (pos[:, None] == neg[None])).mean()
    assert auroc(scores, labels) == pytest.approx(by_pairs)
    for scores in (scores, rng.normal(size=60), np.round(rng.normal(size=60), 1)):
        assert auroc(scores, labels) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)


def test_mutual_information_known_answers():
    rng = np.random.default_rng(1)
    x = rng.normal(size=4000)
    # a balanced bit decided by x at a bin edge (the median): all of its entropy, 1 bit
    assert mutual_information(x, x > np.median(x)) == pytest.approx(1.0, abs=1e-9)
    assert mutual_information(x, x > 0) < 1.0   # cut inside a bin: that bin mixes both
    assert mutual_information(np.full(100, 2.0), rng.integers(0, 5, 100)) == 0.0  # a constant tells nothing
    independent = mutual_information(x, rng.integers(0, 5, 4000))
    assert 0 <= independent < 3 * mi_bias_bits(8, 5, 4000)                        # only the plug-in bias
    assert mi_bias_bits(8, 5, 3000) == pytest.approx(7 * 4 / (2 * 3000 * np.log(2)))



def test_mutual_information_matches_a_hand_computed_table_and_the_former_estimator():
    # two bins cut at the median 4.5; labels 0 0 0 1 | 1 1 1 1: p(bin, label) = 3/8, 1/8, 0, 4/8
    x, labels = np.arange(1.0, 9.0), np.array([0, 0, 0, 1, 1, 1, 1, 1])
    by_hand = 3 / 8 * np.log2(2) + 1 / 8 * np.log2(2 / 5) + 4 / 8 * np.log2(8 / 5)   # p log2(p / (p_bin p_label))
    assert mutual_information(x, labels, bins=2) == pytest.approx(by_hand, abs=1e-12)
    # the values the plug-in estimator written here by hand gave before scikit-learn computed it
    rng = np.random.default_rng(7)
    x = rng.normal(size=500)
    labels = (x + rng.normal(size=500) > 0).astype(int) + (x > 1)
    x[::50] = np.nan
    assert mutual_information(x, labels) == pytest.approx(0.6579354681459028, abs=1e-12)
    assert mutual_information(np.round(x, 1), labels, bins=5) == pytest.approx(0.5010689227531672, abs=1e-12)

# ------------------------------------------------------------------ the clamp
def _layer_with_a_constant(name: str):
    """A layer in which one unit (per ``name``: q[1], k[2], v[1], h0.inter[0], h0.command[1],
    h0.motor[0], or head 1's whole output) is constant, its weights zeroed and its bias set;
    -> (layer, the clamp to that constant, a clamp to another value). Mode steady (the paper's
    Fig. 4 model): its logits phi/tau are not squeezed into (0, 1), so the backbone moves the
    weights visibly."""
    layer = NAC(6, d_model=8, num_heads=2, topk=3, window=4, mode="steady", time_input="elapsed", seed=0,
                backbone_units=8).eval()
    constant = {"q": (layer.q_gate, 1, 0.7), "k": (layer.k_gate, 2, -0.4), "v": (layer.v_gate, 1, 0.9),
                "inter": (layer.inter, 0, 0.3), "command": (layer.command, 1, -0.2), "motor": (layer.motor, 0, 0.5)}
    with torch.no_grad():
        if name == "head":
            layer.time_weighted_values = False   # a head's output = its weights (summing to 1) x its values
            for unit in range(4, 8):              # head 1's value channels
                layer.v_gate.weight[unit] = 0.0
                layer.v_gate.bias[unit] = 0.1 * unit
            return layer, Clamp(heads={1: [0.4, 0.5, 0.6, 0.7]}), Clamp(heads={1: [2.0, -1.0, 0.0, 1.0]})
        module, unit, bias = constant[name]
        if name in ("q", "k", "v"):
            module.weight[unit] = 0.0
            module.bias[unit] = bias
            return layer, Clamp(**{name: {unit: bias}}), Clamp(**{name: {unit: bias - 2.0}})
        module.weight[0, :, unit] = 0.0           # head 0's neuron
        module.bias[0, unit] = bias
        value = float(np.tanh(bias))
        return layer, Clamp(**{name: {(0, unit): value}}), Clamp(**{name: {(0, unit): -0.95 * float(np.sign(value))}})


def _outputs(layer, x, t, clamp, eager):
    """(forward [B, T, D], streamed [B, T, D]) under ``clamp``, on the eager code or the kernels."""
    def run():
        with torch.inference_mode(), layer.clamped(clamp):
            y = layer(x, t=t)
            cache, steps = layer.init_cache(x.shape[0]), []
            for i in range(x.shape[1]):
                y_i, cache = layer.step(x[:, i], cache, t=t[:, i])
                steps.append(y_i)
        return y, torch.stack(steps, dim=1)
    if eager:
        with nac_kernels.disabled():
            return run()
    return run()


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "kernels"])
@pytest.mark.parametrize("name", ["q", "k", "v", "inter", "command", "motor", "head"])
def test_a_clamp_to_the_value_a_unit_has_changes_nothing_and_another_value_changes_the_output(name, eager):
    if not eager and not nac_kernels.available():
        pytest.skip("numba kernels unavailable")
    layer, same, other = _layer_with_a_constant(name)
    g = torch.Generator().manual_seed(3)
    x, t = torch.randn(2, 9, 6, generator=g), torch.rand(2, 9, generator=g).cumsum(1)
    intact, intact_streamed = _outputs(layer, x, t, None, eager)
    for y in (*_outputs(layer, x, t, same, eager), intact_streamed):
        torch.testing.assert_close(y, intact, atol=2e-6, rtol=1e-5)
    changed, changed_streamed = _outputs(layer, x, t, other, eager)
    assert (changed - intact).abs().max() > 1e-4   # 50x the kernels' distance from the eager code
    torch.testing.assert_close(changed_streamed, changed, atol=2e-6, rtol=1e-5)   # step honours it too
    assert layer.clamp is None                                                      # restored after the block


def test_a_clamp_runs_the_same_on_the_kernels_and_the_eager_code():
    if not nac_kernels.available():
        pytest.skip("numba kernels unavailable")
    layer = NAC(6, d_model=8, num_heads=2, topk=3, window=4, mode="steady", time_input="elapsed", seed=0,
                backbone_units=8).eval()
    x, t = torch.randn(2, 9, 6, generator=torch.Generator().manual_seed(4)), torch.arange(9.0).expand(2, 9)
    both = Clamp(q={3: 1.5}, v={0: -1.0}, inter={(0, 2): 0.8}, heads={1: [0.1, 0.2, 0.3, 0.4]})
    for fast, eager in zip(_outputs(layer, x, t, both, False), _outputs(layer, x, t, both, True)):
        torch.testing.assert_close(fast, eager, atol=2e-6, rtol=1e-5)


def test_uniform_weights_make_every_selected_key_weigh_the_same():
    layer = NAC(6, d_model=8, num_heads=2, topk=3, window=5, mode="steady", seed=0).eval()
    x = torch.randn(1, 8, 6, generator=torch.Generator().manual_seed(5))
    y, trace = layer(x, return_trace=True)
    with layer.clamped(Clamp(uniform_weights=True)):
        y_uniform, uniform = layer(x, return_trace=True)
        with torch.inference_mode():   # no trace: the eager pair stage, not the kernel
            torch.testing.assert_close(layer(x), y_uniform, atol=2e-6, rtol=1e-5)
    valid = trace.topk_idx >= 0
    expected = valid / valid.sum(-1, keepdim=True)
    torch.testing.assert_close(uniform.weights, expected.float())
    assert not torch.allclose(trace.weights, expected.float(), atol=1e-3)   # the learned ones were not uniform
    assert (y_uniform - y).abs().max() > 1e-4


def test_recent_keys_replace_top_k_by_the_newest_visible_ones_in_forward_and_step():
    layer = NAC(6, d_model=8, num_heads=2, topk=3, window=5, seed=0).eval()
    x, t = torch.randn(1, 9, 6, generator=torch.Generator().manual_seed(6)), torch.arange(9.0)[None]
    _, top = layer(x, t, return_trace=True)
    with layer.clamped(Clamp(keys="recent")):
        y, trace = layer(x, t, return_trace=True)
        cache, streamed = layer.init_cache(1), []
        for i in range(9):
            y_i, cache = layer.step(x[:, i], cache, t[:, i])
            streamed.append(y_i)
    for i in range(9):   # query i sees keys max(0, i-4)..i; the 3 newest of them, newest first
        expected = [j for j in range(i, max(0, i - 4) - 1, -1)][:3]
        expected += [-1] * (3 - len(expected))
        assert trace.topk_idx[0, :, i].tolist() == [expected, expected]
    torch.testing.assert_close(torch.stack(streamed, 1), y, atol=2e-6, rtol=1e-5)
    assert not torch.equal(top.topk_idx, trace.topk_idx)   # Top-K by q . k had chosen others


def test_random_keys_are_visible_distinct_reproducible_and_not_top_k():
    layer = NAC(6, d_model=8, num_heads=2, topk=3, window=8, seed=0).eval()
    x = torch.randn(4, 20, 6, generator=torch.Generator().manual_seed(7))
    _, top = layer(x, return_trace=True)
    with layer.clamped(Clamp(keys="random", key_seed=3)):
        _, first = layer(x, return_trace=True)
    with layer.clamped(Clamp(keys="random", key_seed=3)):
        _, again = layer(x, return_trace=True)
    with layer.clamped(Clamp(keys="random", key_seed=4)):
        _, other = layer(x, return_trace=True)
    idx = first.topk_idx
    assert torch.equal(idx, again.topk_idx) and not torch.equal(idx, other.topk_idx)
    query = torch.arange(20)[None, None, :, None]
    filled = idx >= 0
    assert ((idx <= query) & (idx > query - 8))[filled].all()               # causal, in the window
    assert filled[:, :, 2:].all() and not filled[:, :, :2].all()            # K = 3 once 3 keys are visible
    assert all(len(set(row)) == len(row) for row in idx[filled.all(-1)].tolist())   # no key twice
    assert (idx[:, :, 8:] != top.topk_idx[:, :, 8:]).float().mean() > 0.3   # not the Top-K keys


def test_t_interp_held_per_head_reaches_the_logits_and_the_values():
    layer = NAC(6, d_model=8, num_heads=2, topk=3, window=5, seed=0).eval()
    x, t = torch.randn(1, 8, 6, generator=torch.Generator().manual_seed(8)), torch.arange(8.0)[None]
    y, trace = layer(x, t, return_trace=True)
    with layer.clamped(Clamp(t_interp={1: 0.25})):
        y_held, held = layer(x, t, return_trace=True)
    valid = held.topk_idx >= 0
    assert (held.t_interp[:, 1][valid[:, 1]] == 0.25).all()
    torch.testing.assert_close(held.t_interp[:, 0], trace.t_interp[:, 0], equal_nan=True)   # head 0 untouched
    phi, tau = held.phi[:, 1][valid[:, 1]], held.tau[:, 1][valid[:, 1]]
    torch.testing.assert_close(held.logits[:, 1][valid[:, 1]], phi / tau * -torch.expm1(-tau * 0.25))
    assert (y_held - y).abs().max() > 1e-4


def test_a_clamp_of_a_unit_the_layer_lacks_is_refused():
    layer = NAC(6, d_model=8, num_heads=2, topk=3, seed=0)
    for bad, field in ((Clamp(q={8: 0.0}), "clamp.q"), (Clamp(inter={(2, 0): 0.0}), "clamp.inter"),
                       (Clamp(motor={(0, 99): 0.0}), "clamp.motor"), (Clamp(heads={0: [0.0]}), "clamp.heads"),
                       (Clamp(t_interp={2: 0.5}), "clamp.t_interp")):
        with pytest.raises(ValueError, match=field), layer.clamped(bad):
            pass
    with pytest.raises(ValueError, match="select='all'"), NAC(6, d_model=8, num_heads=2, select="all").clamped(
            Clamp(keys="recent")):
        pass
    with pytest.raises(ValueError, match="clamp.keys"):
        Clamp(keys="oldest")
    assert layer.clamp is None


# ------------------------------------------------------------------ replay
def test_the_batched_replay_gives_what_the_streaming_policy_gives(tmp_path):
    """Two episodes longer than the shipped policy's window, intact and clamped: the
    replay's whole-episode forward equals NAC.step frame by frame (the driving loop's path)."""
    policy = load_driving_policy(None)
    run = record_policy_run(policy, road_episodes(episodes=2, steps=24), tmp_path / "run")
    replay = PolicyReplay(policy, run)
    assert [len(s) for s in np.split(replay.steps, [24])] == [24, 24] and len(replay.segments) == 2
    for clamp in (None, Clamp(q={5: 0.5}, inter={(1, 3): -0.5}), Clamp(heads={2: [0.0] * 16})):
        streamed = []
        with policy.core.nac.clamped(clamp):
            for i in range(run.num_steps):
                if i == 0 or run.episode[i] != run.episode[i - 1]:
                    policy.reset()
                streamed.append(policy.step_output(run.frame(i)).numpy())
        np.testing.assert_allclose(replay.outputs(clamp), np.array(streamed), atol=1e-4, rtol=1e-4)
    # the intact replay chooses what the run recorded (up to the frames' JPEG round trip)
    assert np.mean(replay.actions() == run.policy_action[:, 0]) > 0.8
    assert len(PolicyReplay(policy, run, max_frames=30).actions()) == 30


# ------------------------------------------------------------------ the atlas
def test_the_neuron_that_alone_decides_the_steering_comes_first(tmp_path):
    episodes = road_episodes(episodes=2, steps=40)
    policy = one_neuron_policy([f for e in episodes for f in e], unit=1)
    run = record_policy_run(policy, episodes, tmp_path / "run")
    actions = run.policy_action[:, 0]
    assert set(np.unique(actions)) == {ACTION_NAMES.index("left"), ACTION_NAMES.index("right")}
    assert 0.2 < np.mean(actions == ACTION_NAMES.index("left")) < 0.8

    atlas = neuron_atlas(run, policy)
    first, rest = atlas["neurons"][0], atlas["neurons"][1:]
    assert first["name"] == "v[1]" and first["head"] == 0
    assert first["auroc"] == 0.0            # right steps always have the lower v[1]: perfect separation
    assert first["mi_bits"] > 0.9           # about the one bit of a balanced left/right choice
    assert first["silencing_cost"] > 0.2    # held at its mean, it always steers one way
    assert max(r["silencing_cost"] for r in rest) == 0.0
    # agreement counts flips only; the probability shift sees how much less sure the policy became
    assert first["log_prob_change"] < -0.1 and first["kl"] > 0.1
    assert all(r["kl"] >= 0 for r in rest) and first["kl"] > 10 * max(r["kl"] for r in rest)
    assert len(atlas["neurons"]) == len(traced_neurons(run)) == 3 * 8 + 2 * sum(
        run.metadata["nac"]["groups"][g] for g in ("inter", "command", "motor"))
    head0, head1 = atlas["heads"]
    # a head's push is read from the replay (JPEG copies of the frames) against the recorded actions
    assert head0["silencing_cost"] > 0.2 and head0["auroc"] < 0.05 and head1["silencing_cost"] == 0.0
    assert atlas["uniform_weights"]["agreement"] == 1.0   # one key per query: uniform is what it had
    assert atlas["frames"] == 80 and atlas["replay_agrees_with_run"] > 0.8


def test_a_probability_shift_sees_what_agreement_does_not():
    reference = np.array([[2.0, 0.0, -1.0], [0.0, 3.0, 0.0]])
    assert probability_shift(reference, reference) == {"log_prob_change": 0.0, "kl": 0.0}
    assert probability_shift(reference + 5.0, reference)["kl"] == pytest.approx(0.0, abs=1e-12)  # softmax ignores a shift
    less_sure = np.array([[1.0, 0.0, -1.0], [0.0, 1.0, 0.0]])        # the same choices, less sure of them
    assert agreement(less_sure.argmax(1), reference.argmax(1)) == 1.0
    shift = probability_shift(less_sure, reference)
    p, q = torch.softmax(torch.tensor(reference), 1), torch.softmax(torch.tensor(less_sure), 1)
    assert shift["log_prob_change"] == pytest.approx(float((q[[0, 1], [0, 1]].log() - p[[0, 1], [0, 1]].log()).mean()))
    assert shift["kl"] == pytest.approx(float(torch.nn.functional.kl_div(q.log(), p, reduction="batchmean")))
    assert shift["log_prob_change"] < 0 and shift["kl"] > 0


# ------------------------------------------------------------------ Fig. 4
def test_scene_classes_from_discrete_actions():
    """A straight step after a turn within `recent` steps is that side's -straight; an episode
    boundary forgets the turn."""
    noop, right, left, gas = (ACTION_NAMES.index(a) for a in ("noop", "right", "left", "gas"))
    actions = [left, gas, gas, noop, right, gas, gas, left]
    run = _FakeRun(np.array(actions, np.float32)[:, None], episode=[0, 0, 0, 0, 0, 0, 1, 1])
    assert steering_sides(run).tolist() == [-1, 0, 0, 0, 1, 0, 0, -1]
    got = [SCENES[i] for i in scene_classes(run, recent=2)]
    assert got == ["left", "left-straight", "left-straight", "straight", "right", "right-straight", "straight",
                   "left"]


@dataclasses.dataclass
class _FakeRun:
    policy_action: np.ndarray
    episode: list
    metadata: dict = dataclasses.field(default_factory=lambda: {"action_names": list(ACTION_NAMES)})


def _fig4_run(tmp_path, satisfy: bool):
    """The synthetic run with its steering set to blocks of 10 left, straight, right steps and
    its tau and logits set by the steering: as Fig. 4 claims, or with left and right swapped."""
    run = load_trace(make_synthetic_run(tmp_path / "run", steps=120, with_saliency=False))
    block = np.arange(run.num_steps) // 10 % 3                       # 0 left, 1 straight, 2 right
    steer = np.array([-0.5, 0.0, 0.5], np.float32)[block]
    action = run.policy_action.copy()
    action[:, 0] = steer
    side = block if satisfy else 2 - block
    tau_by_side, logit_by_side = np.array([1.0, 1.2, 1.45]), np.array([0.5, 0.62, 0.7])
    valid = run.key_step >= 0
    jitter = 0.01 * np.random.default_rng(0).standard_normal(run.tau.shape)
    tau = np.where(valid, tau_by_side[side][:, None, None] + jitter, np.nan).astype(np.float32)
    logits = np.where(valid, logit_by_side[side][:, None, None] + jitter, np.nan).astype(np.float32)
    return dataclasses.replace(run, policy_action=action, tau=tau, logits=logits, phi=logits * tau)


@pytest.mark.parametrize("satisfy", [True, False], ids=["as-claimed", "swapped"])
def test_the_fig4_verdict_follows_the_trace(tmp_path, satisfy):
    run = _fig4_run(tmp_path, satisfy)
    result = fig4_claim(run)
    verdicts = {s["id"]: s["verdict"] for s in result["statements"]}
    expected = "reproduced" if satisfy else "not reproduced"
    assert verdicts["tau_range"] == "reproduced"                    # both stay within [0.8, 1.6]
    assert {verdicts[s] for s in verdicts if s != "tau_range"} == {expected}
    assert {c["verdict"] for c in result["claims"].values()} == {expected}
    heads = run.tau.shape[1]
    assert result["claims"]["tau"]["heads"] == (list(range(heads)) if satisfy else [])
    tau = result["heads"][0]["tau"]
    assert tau["auroc_right_vs_left"] == (1.0 if satisfy else 0.0)
    assert tau["by_scene"]["right"]["median"] == pytest.approx(1.45 if satisfy else 1.0, abs=0.03)
    # the weighted mean over keys of a constant is that constant
    np.testing.assert_allclose(head_values(run, "steady_logits"), head_values(run, "logits"), rtol=1e-5)


def test_fig4_says_untestable_when_a_side_was_never_driven(tmp_path):
    run = _fig4_run(tmp_path, satisfy=True)
    action = run.policy_action.copy()
    action[:, 0] = np.minimum(action[:, 0], 0.0)                      # never right
    result = fig4_claim(dataclasses.replace(run, policy_action=action))
    verdicts = {s["id"]: s["verdict"] for s in result["statements"]}
    assert verdicts["tau_right"] == verdicts["logits_right"] == "untestable"
    assert result["claims"]["tau"]["verdict"] == "untestable" and result["scenes"]["right"] == 0
