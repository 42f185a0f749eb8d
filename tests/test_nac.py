"""The NAC layer: equations, sparsity, causality, masking, streaming, gradients, validation."""

import contextlib
import itertools
import math

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nac_drive import NAC
from nac_drive.nac import kernels as nac_kernels
from nac_drive.nac.selection import NO_KEY, Visibility, select_block, select_exact, topk_positions

torch.set_num_threads(1)
MODES = ("exact", "euler", "steady")


def make(input_dim=6, **kw):
    kw = {"d_model": 16, "num_heads": 2, "topk": 4, "seed": 0, **kw}
    return NAC(input_dim, **kw)


def inputs(B=2, T=9, D=6, seed=1):
    return torch.randn(B, T, D, generator=torch.Generator().manual_seed(seed))


def backbone_parameters(layer):
    return {name: p for name, p in layer.named_parameters()
            if name.split(".")[0] in ("inter", "command", "motor")
            or name.startswith(("phi_tau_", "time_"))}


# ---------------------------------------------------------------- the backbone sees the input
def test_phi_and_tau_vary_with_the_input():
    layer = make()
    _, tr1 = layer(inputs(seed=1), return_trace=True)
    _, tr2 = layer(inputs(seed=2), return_trace=True)
    valid = tr1.topk_idx != NO_KEY
    # Within one input, different pairs get different phi and tau ...
    assert tr1.phi[valid].std() > 1e-3 and tr1.tau[valid].std() > 1e-3
    # ... and another input changes them.
    assert not torch.allclose(tr1.phi, tr2.phi) and not torch.allclose(tr1.tau, tr2.tau)


@pytest.mark.parametrize("mode", MODES)
def test_every_backbone_head_and_time_parameter_gets_gradient(mode):
    layer = make(mode=mode)
    x = inputs()
    layer(x, t=torch.rand(2, 9).cumsum(1)).pow(2).sum().backward()
    params = backbone_parameters(layer)
    assert {"inter.weight", "command.weight", "motor.weight", "phi_tau_weight", "phi_tau_bias",
            "time_weight", "time_bias"} <= set(params)
    for name, p in params.items():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    # both read-outs: phi_tau_weight[..., 0] reads phi, [..., 1] reads tau
    for head in (0, 1):
        assert layer.phi_tau_weight.grad[..., head].abs().sum() > 0
        assert layer.phi_tau_bias.grad[..., head].abs().sum() > 0


# ------------------------------------------------------------------------------- sparsity
def masked_modules(layer):
    return {"q_gate": layer.q_gate, "k_gate": layer.k_gate, "v_gate": layer.v_gate,
            "inter": layer.inter, "command": layer.command, "motor": layer.motor}


def test_masked_weights_are_zero_and_get_zero_gradient():
    layer = make()
    layer(inputs()).sum().backward()
    for name, module in masked_modules(layer).items():
        off = module.mask == 0
        assert off.any(), f"{name}: wiring has no missing synapse at sparsity 0.5"
        w = module.effective_weight
        off = off.expand_as(w)
        assert torch.all(w[off] == 0), name
        assert torch.all(module.weight.grad[off] == 0), name
        assert module.weight.grad[~off].abs().sum() > 0, name


@pytest.mark.parametrize("sparsity", [0.2, 0.5, 0.8])
def test_mask_density_matches_the_wiring(sparsity):
    layer = make(input_dim=32, d_model=64, num_heads=4, sparsity=sparsity)
    bw = layer.backbone_wiring
    expected = {"inter": bw.sensory_to_inter, "command": bw.inter_to_command, "motor": bw.command_to_motor}
    for name, module in masked_modules(layer).items():
        mask = module.mask.numpy()
        if name in expected:
            assert np.array_equal(mask, expected[name]), name
        else:
            # AutoNCP: each sensory neuron reaches int(n_inter * (1 - sparsity)) inter
            # neurons, plus one synapse for any inter neuron left unreached.
            fanout = mask.sum(axis=0)
            assert np.all(fanout >= max(int(64 * (1 - sparsity)), 1)), name
            assert np.all(mask.sum(axis=1) >= 1), f"{name}: an output neuron without input"
            assert abs(mask.mean() - (1 - sparsity)) < 0.1, name
    # the three gates are wired independently
    assert not torch.equal(layer.q_gate.mask, layer.k_gate.mask)


# -------------------------------------------------------------------------------- logits
def test_exact_and_steady_logits_follow_the_closed_form():
    layer = make(mode="exact")
    x, t = inputs(), torch.rand(2, 9).cumsum(1)
    _, tr = layer(x, t=t, return_trace=True)
    ok = tr.topk_idx != NO_KEY
    closed = (tr.phi / tr.tau) * (1 - torch.exp(-tr.tau * tr.t_interp))
    torch.testing.assert_close(tr.logits[ok], closed[ok])
    layer.mode = "steady"
    _, tr = layer(x, t=t, return_trace=True)
    torch.testing.assert_close(tr.logits[ok], (tr.phi / tr.tau)[ok])


def test_euler_converges_monotonically_to_exact():
    layer = make(mode="exact").double()
    x = inputs().double()
    _, exact = layer(x, return_trace=True)
    ok = exact.topk_idx != NO_KEY
    errors = []
    for steps in (1, 10, 1000):
        layer.mode, layer.euler_steps = "euler", steps
        _, tr = layer(x, return_trace=True)
        # Euler over the horizon t_interp has the closed form (phi/tau)(1 - (1 - tau t/N)^N)
        closed = tr.phi / tr.tau * (1 - (1 - tr.tau * tr.t_interp / steps) ** steps)
        torch.testing.assert_close(tr.logits[ok], closed[ok])
        errors.append((tr.logits - exact.logits)[ok].abs().max().item())
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 1e-3


# ----------------------------------------------------------------------------- causality
@pytest.mark.parametrize("select", ["exact", "block", "all"])
def test_outputs_never_depend_on_future_steps(select):
    layer = make(select=select)
    x = inputs(T=12)
    y = layer(x)
    for i in (0, 5, 10):
        x2 = x.clone()
        x2[:, i + 1:] = torch.randn_like(x2[:, i + 1:]) * 5
        y2 = layer(x2)
        assert torch.equal(y[:, :i + 1], y2[:, :i + 1]), f"step {i} saw the future"
        assert not torch.equal(y[:, i + 1:], y2[:, i + 1:])


@pytest.mark.parametrize("select", ["exact", "block", "all"])
def test_window_hides_steps_older_than_the_window(select):
    W = 3
    layer = make(select=select, window=W)
    x = inputs(T=12)
    y = layer(x)
    x2 = x.clone()
    x2[:, :5] = torch.randn_like(x2[:, :5]) * 5  # steps 0..4 changed
    y2 = layer(x2)
    # step i sees steps i-W+1..i: from step 4 + W on nothing changed is visible
    assert torch.equal(y[:, 4 + W:], y2[:, 4 + W:])
    assert not torch.equal(y[:, 4 + W - 1], y2[:, 4 + W - 1])


# ------------------------------------------------------------------------------- masking
@pytest.mark.parametrize("select", ["exact", "block", "all"])
def test_masked_keys_get_exactly_zero_weight(select):
    layer = make(select=select, causal=False)
    x = inputs(T=10)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[0, [1, 4, 7]] = False
    mask[1, 5:] = False
    _, tr = layer(x, mask=mask, return_trace=True)
    hit = tr.topk_idx != NO_KEY
    keys_valid = torch.zeros_like(hit)
    keys_valid[hit] = mask[torch.arange(2)[:, None, None, None].expand_as(hit)[hit], tr.topk_idx[hit]]
    assert torch.all(tr.weights[~keys_valid] == 0)
    assert torch.all(tr.weights[keys_valid] > 0)
    # The masked keys' content cannot reach any output.
    x2 = x.clone()
    x2[0, [1, 4, 7]] = 100.0
    x2[1, 5:] = -100.0
    y, y2 = layer(x, mask=mask), layer(x2, mask=mask)
    valid_rows = mask  # outputs at masked positions may change (their query changed)
    torch.testing.assert_close(y[valid_rows], y2[valid_rows])


def test_rows_without_any_valid_key_give_finite_output():
    layer = make()
    x = inputs(T=6)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[0, :] = False          # nothing valid at all
    mask[1, :3] = False         # causal rows 0..2 have no valid key
    y, tr = layer(x, mask=mask, return_trace=True)
    assert torch.isfinite(y).all()
    assert torch.all(tr.weights[0] == 0) and torch.all(tr.weights[1, :, :3] == 0)
    y.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters() if p.grad is not None)


def test_fewer_keys_than_topk_leave_marked_empty_slots():
    layer = make(topk=4)
    _, tr = layer(inputs(T=6), return_trace=True)
    # causal step i has i + 1 keys
    for i in range(6):
        filled = (tr.topk_idx[:, :, i] != NO_KEY).sum(-1)
        assert torch.all(filled == min(i + 1, 4))
    assert torch.all(tr.weights[tr.topk_idx == NO_KEY] == 0)
    assert torch.all(tr.topk_idx[:, :, torch.arange(6)] <= torch.arange(6)[:, None])


# ----------------------------------------------------------------------------- streaming
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("select", ["exact", "all"])
@pytest.mark.parametrize("window", [None, 4, 7])
@pytest.mark.parametrize("time_input", ["query", "elapsed"])
def test_step_reproduces_the_causal_forward(mode, select, window, time_input):
    layer = make(mode=mode, select=select, window=window, time_input=time_input)
    x, t = inputs(T=11), torch.rand(2, 11).cumsum(1)
    for stamps in (None, t):
        y, tr = layer(x, t=stamps, return_trace=True)
        cache = layer.init_cache(2)
        for i in range(11):
            y_i, cache, tr_i = layer.step(x[:, i], cache, t=None if stamps is None else stamps[:, i],
                                          return_trace=True)
            torch.testing.assert_close(y_i, y[:, i], atol=1e-5, rtol=0)
            # same keys selected (compare as sets per head)
            assert torch.equal(tr_i.topk_idx[:, :, 0].sort(-1).values[..., -min(i + 1, 4):],
                               tr.topk_idx[:, :, i].sort(-1).values[..., -min(i + 1, 4):])
        if window is not None:
            assert cache.feats.shape[2] == window  # O(window) state


def test_time_input_modes_differ_and_timestamps_count_from_the_first_step():
    x, t = inputs(), torch.rand(2, 9).cumsum(1)
    query = make(time_input="query")
    elapsed = make(time_input="elapsed")
    elapsed.load_state_dict(query.state_dict())
    assert not torch.allclose(query(x, t=t), elapsed(x, t=t))
    # both modes read timestamps from the sequence's first step: a clock's absolute time
    # (float64 seconds since 1970) gives what the same frames timed from 0 give, although
    # float32 cannot even tell its frames apart
    clock = 1.7e9 + t.double()
    assert len(torch.unique(clock.float())) < len(torch.unique(t))
    for layer in (query, elapsed):
        torch.testing.assert_close(layer(x, t=clock), layer(x, t=t - t[:, :1]), atol=1e-6, rtol=1e-5)
        cache = layer.init_cache(2)
        for i in range(9):
            y, cache = layer.step(x[:, i], cache, t=clock[:, i])
        torch.testing.assert_close(y, layer(x, t=t)[:, -1], atol=1e-6, rtol=1e-5)


def test_time_weighted_values_switch_changes_the_output():
    layer = make()
    x = inputs()
    y = layer(x)
    layer.time_weighted_values = False
    assert not torch.allclose(y, layer(x))


# ------------------------------------------------------------------------- key selection
def test_block_selection_is_exact_when_the_best_keys_share_a_block():
    B, H, T, D, K = 1, 2, 64, 8, 4           # blocks of 8 keys
    g = torch.Generator().manual_seed(0)
    k = torch.randn(B, H, T, D, generator=g) * 0.1
    q = torch.randn(B, H, T, D, generator=g) * 0.1
    direction = torch.randn(D, generator=g)
    direction /= direction.norm()
    q += direction * 3.0
    k[:, :, 16:24] += direction * 3.0          # the best keys all live in block 2
    vis = Visibility(causal=False)
    exact, block = select_exact(q, k, K, vis), select_block(q, k, K, vis)
    assert torch.equal(exact.sort(-1).values, block.sort(-1).values)
    assert torch.all((exact >= 16) & (exact < 24))


def test_block_selection_respects_causality_and_window():
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 2, 50, 8, generator=g), torch.randn(2, 2, 50, 8, generator=g)
    idx = select_block(q, k, 5, Visibility(causal=True, window=10))
    pos = torch.arange(50)[:, None]
    ok = idx != NO_KEY
    assert torch.all((idx <= pos) | ~ok) and torch.all((idx > pos - 10) | ~ok)
    assert torch.all(ok[..., 0])  # every query at least sees itself


def _block_selection_by_hand(q, k, topk, causal, window, key_valid):
    """Alg. 2 one query at a time: own block + the best-centroid visible blocks, exact Top-K inside."""
    B, H, T, _ = q.shape
    size = math.ceil(math.sqrt(T))
    blocks = [range(s, min(s + size, T)) for s in range(0, T, size)]
    n_pick = min(len(blocks), math.ceil(topk / size) + 1)
    out = torch.full((B, H, T, topk), NO_KEY)
    for b, h, i in itertools.product(range(B), range(H), range(T)):
        def visible(j):
            return ((not causal or j <= i) and (window is None or i - window < j)
                    and (window is None or causal or j < i + window))
        own = i // size
        ranked = []
        for n, blk in enumerate(blocks):
            keys = [j for j in blk if key_valid[b, j]]
            past = not causal or blk[-1] < own * size
            if n != own and keys and past and any(visible(j) for j in blk):
                centroid = k[b, h, keys].mean(0)
                ranked.append((float(q[b, h, i] @ centroid), n))
        chosen = [own] + [n for _, n in sorted(ranked, reverse=True)[:n_pick - 1]]
        cand = [j for n in chosen for j in blocks[n] if visible(j) and key_valid[b, j]]
        cand.sort(key=lambda j: -float(q[b, h, i] @ k[b, h, j]))
        out[b, h, i, :len(cand[:topk])] = torch.tensor(cand[:topk], dtype=torch.long)
    return out


@pytest.mark.parametrize("causal,window,masked", [(True, None, False), (True, 7, True), (False, None, True),
                                                   (False, 5, False)])
@pytest.mark.parametrize("kernels", [True, False], ids=["numba", "torch"])
def test_block_selection_matches_the_algorithm_done_by_hand(causal, window, masked, kernels):
    g = torch.Generator().manual_seed(7)
    q, k = torch.randn(2, 2, 30, 4, generator=g), torch.randn(2, 2, 30, 4, generator=g)
    key_valid = torch.rand(2, 30, generator=g) > 0.25 if masked else torch.ones(2, 30, dtype=torch.bool)
    for topk in (3, 9):
        with contextlib.nullcontext() if kernels else nac_kernels.disabled():
            got = select_block(q, k, topk, Visibility(causal, window, key_valid if masked else None))
        want = _block_selection_by_hand(q, k, topk, causal, window, key_valid)
        assert torch.equal(got.sort(-1).values, want.sort(-1).values)


def _ranked_by_hand(scores, positions, topk):
    """One row's Top-K positions the plain way: by (score, position), largest first, NaN above
    every number, -inf never chosen; NO_KEY in the slots left over."""
    def rank(c):
        s = float(scores[c])
        return (math.isnan(s), 0.0 if math.isnan(s) else s, int(positions[c]))
    chosen = [int(positions[c]) for c in sorted(range(len(scores)), key=rank, reverse=True)
              if float(scores[c]) != -math.inf][:topk]
    return chosen + [NO_KEY] * (topk - len(chosen))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_topk_ranks_equal_scores_newest_first(dtype):
    """Among equal scores (-0.0 and 0.0 are equal; NaN of either sign ranks first) the larger
    position first, whatever its column; -inf candidates, some of them at position NO_KEY like
    block selection's empty slots, are never chosen."""
    g = torch.Generator().manual_seed(0)
    values = torch.tensor([1.0, 0.5, 0.0, -0.0, -1.0, -math.inf, -math.inf, math.nan, -math.nan])
    scores = values[torch.randint(len(values), (300, 12), generator=g)].to(dtype)
    positions = torch.stack([torch.randperm(12, generator=g) for _ in range(300)]) + 3
    positions = positions.masked_fill((scores == -math.inf) & (torch.rand(300, 12, generator=g) < 0.5), NO_KEY)
    for topk in (1, 5, 12, 15):
        got = topk_positions(scores, positions, topk)
        assert got.tolist() == [_ranked_by_hand(s, p, topk) for s, p in zip(scores, positions)], topk


@pytest.mark.parametrize("causal,window,masked", [(True, None, False), (True, 5, True), (False, None, True),
                                                   (False, 4, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_selection_ranks_tied_scores_newest_first(causal, window, masked, dtype):
    """Small integers score exactly and often alike: the keys chosen, in order, are the visible
    keys ranked by hand. Block selection too where it picks every block (16 keys in blocks of 4,
    K >= 9), so that its Top-K is the exact one."""
    g = torch.Generator().manual_seed(4)
    B, H, T = 2, 2, 16
    q, k = (torch.randint(-1, 2, (B, H, T, 3), generator=g).to(dtype) for _ in range(2))
    key_valid = torch.rand(B, T, generator=g) > 0.3 if masked else torch.ones(B, T, dtype=torch.bool)
    vis = Visibility(causal, window, key_valid if masked else None)
    scores = q @ k.transpose(-1, -2)

    def visible(b, i, j):
        return (key_valid[b, j] and (not causal or j <= i) and (window is None or i - window < j)
                and (window is None or causal or j < i + window))

    for topk, selects in ((1, [select_exact]), (4, [select_exact]), (9, [select_exact, select_block]),
                          (20, [select_exact, select_block])):
        want = [[[_ranked_by_hand([scores[b, h, i, j] if visible(b, i, j) else -math.inf for j in range(T)],
                                  range(T), topk) for i in range(T)] for h in range(H)] for b in range(B)]
        for select in selects:
            assert select(q, k, topk, vis).tolist() == want, (select.__name__, topk)


class _LargestTensor(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for o in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(o, torch.Tensor):  # storage, not numel: expanded views are free
                self.largest = max(self.largest, o.untyped_storage().nbytes() // o.element_size())
        return out


def _largest_tensor(layer, T):
    x = torch.randn(1, T, 8)
    with torch.no_grad(), _LargestTensor() as probe:
        layer(x)
    return probe.largest


def test_block_selection_memory_grows_linearly():
    # the torch code (the numba kernels' scratch is O(T) by construction: one query's candidates)
    layer = NAC(8, d_model=16, num_heads=2, topk=4, select="block", seed=0)
    with nac_kernels.disabled():
        sizes = {T: _largest_tensor(layer, T) for T in (1024, 4096)}
    # linear growth: 4x the steps -> at most ~4x the largest tensor (never 16x)
    assert sizes[4096] <= 5 * sizes[1024], sizes
    # while an unchunked T x T score matrix would be far larger
    assert sizes[4096] < 2 * 4096 * 4096 / 16


def test_pairwise_selection_materialises_all_pairs():
    layer = NAC(8, d_model=16, num_heads=2, topk=4, select="all", seed=0)
    # NAC-PW is quadratic by design: the pair tensors hold B*H*T*T entries
    assert _largest_tensor(layer, 256) >= 2 * 256 * 256


# ---------------------------------------------------------------------------- gradcheck
@pytest.mark.parametrize("mode", MODES)
def test_gradcheck(mode):
    layer = make(input_dim=3, d_model=4, num_heads=2, topk=3, mode=mode, euler_steps=3,
                 backbone_units=8).double()
    x = torch.randn(1, 4, 3, dtype=torch.float64, requires_grad=True)
    t = torch.rand(1, 4, dtype=torch.float64).cumsum(1).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, t: layer(x, t=t), (x, t), eps=1e-6, atol=1e-5)


# ----------------------------------------------------------------- parameters vs settings
def test_settings_do_not_change_the_parameters():
    a = make(mode="exact", select="exact", causal=True, window=None)
    b = make(mode="euler", select="block", causal=False, window=5, euler_steps=3, time_input="elapsed",
             seed=1)
    b.load_state_dict(a.state_dict())   # strict: same names and shapes, wiring masks included
    assert np.array_equal(b.backbone_wiring.inter_to_command, a.backbone_wiring.inter_to_command)
    for mode in MODES:
        b.mode, b.select, b.causal, b.window, b.time_input = mode, "exact", True, None, "query"
        b.euler_steps = a.euler_steps
        a.mode = mode
        torch.testing.assert_close(a(inputs()), b(inputs()))


@pytest.mark.parametrize("change", ["in_place", "load_state_dict", "replace_parameter", "dtype"])
def test_inference_reuses_masked_weights_only_while_parameters_are_unchanged(change):
    layer, other, x = make().eval(), make(seed=3).eval(), inputs()
    with torch.no_grad():
        layer(x)                                   # builds the cached inference weights
        if change == "in_place":
            layer.k_gate.weight.mul_(-2.0)
        elif change == "load_state_dict":
            layer.load_state_dict(other.state_dict())
        elif change == "replace_parameter":
            layer.command.weight = torch.nn.Parameter(other.command.weight.clone())
        else:
            layer.double()
            x = x.double()
        cached = layer(x)
    layer._weights_cache.clear()                   # what a fresh computation gives
    with torch.no_grad():
        fresh = layer(x)
    torch.testing.assert_close(cached, fresh, rtol=0, atol=0)
    assert not torch.allclose(cached.float(), make().eval()(inputs()).detach())


def _stream(layer, x):
    """Step ``layer`` through ``x [B, T, F]``; outputs ``[B, T, d_model]``."""
    cache, ys = layer.init_cache(x.shape[0]), []
    for i in range(x.shape[1]):
        y, cache = layer.step(x[:, i], cache)
        ys.append(y)
    return torch.stack(ys, dim=1)


def test_inference_mode_streams_like_no_grad():
    layer, x = make(window=4).eval(), inputs()
    with torch.no_grad():
        expected = _stream(layer, x)
    with torch.inference_mode():
        torch.testing.assert_close(_stream(layer, x), expected, rtol=0, atol=0)


def test_a_layer_built_under_inference_mode_never_serves_stale_weights():
    with torch.inference_mode():     # its parameters are inference tensors: no version counter
        layer, x = make(window=4).eval(), inputs()
        before = _stream(layer, x)
        layer.k_gate.weight.mul_(-2.0)
        after = _stream(layer, x)
    assert not torch.allclose(before, after)
    with torch.inference_mode():
        layer._weights_cache.clear()
        torch.testing.assert_close(after, _stream(layer, x), rtol=0, atol=0)


def test_seed_makes_the_layer_reproducible():
    assert all(torch.equal(p, q) for p, q in zip(make(seed=5).state_dict().values(),
                                                  make(seed=5).state_dict().values()))
    assert not torch.equal(make(seed=5).q_gate.weight, make(seed=6).q_gate.weight)


# ---------------------------------------------------------------------------- validation
@pytest.mark.parametrize("kwargs, name", [
    ({"d_model": 10, "num_heads": 4}, "d_model"),
    ({"topk": 0}, "topk"),
    ({"sparsity": 0.95}, "sparsity"),
    ({"sparsity": 0.05}, "sparsity"),
    ({"mode": "rk4"}, "mode"),
    ({"select": "random"}, "select"),
    ({"window": 0}, "window"),
    ({"euler_steps": 0}, "euler_steps"),
    ({"time_input": "absolute"}, "time_input"),
    ({"dropout": 1.0}, "dropout"),
])
def test_bad_hyperparameters_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        make(**kwargs)


def test_bad_inputs_name_the_argument():
    layer = make()
    with pytest.raises(ValueError, match="x"):
        layer(torch.randn(9, 6))
    with pytest.raises(ValueError, match="x"):
        layer(torch.randn(2, 9, 5))
    with pytest.raises(ValueError, match="t"):
        layer(inputs(), t=torch.rand(2, 8))
    with pytest.raises(ValueError, match="mask"):
        layer(inputs(), mask=torch.ones(2, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask"):
        layer(inputs(), mask=torch.ones(2, 9))
    cache = layer.init_cache(2)
    with pytest.raises(ValueError, match="x_t"):
        layer.step(torch.randn(2, 5), cache)
    with pytest.raises(ValueError, match="cache"):
        layer.step(torch.randn(3, 6), cache)
    with pytest.raises(ValueError, match="causal"):
        make(causal=False).step(torch.randn(2, 6), cache)
    for empty in (torch.randn(2, 0, 6), torch.randn(0, 9, 6)):   # once a reshape error deep inside
        with pytest.raises(ValueError, match=r"^x: expected at least one sequence of at least one step"):
            layer(empty)
    with pytest.raises(ValueError, match=r"^x_t: expected at least one sequence"):
        layer.step(torch.randn(0, 6), layer.init_cache(0))


# ------------------------------------------------------------------------- edges
def test_euler_refuses_a_step_past_its_stability_limit():
    """Explicit Euler multiplies the logit by (1 - dt tau) per step: past dt tau = 2 it
    grows instead of settling. With tau ~ 30 and 6 steps, tau t / N crosses 2 for the
    larger t_ij; both paths refuse, and more steps (or mode exact) serve."""
    layer = make(mode="euler", euler_steps=6).eval()
    x = inputs()
    with torch.no_grad():
        layer.phi_tau_bias[:, 1] = 30.0
        for run in (lambda: layer(x), lambda: _eager_call(lambda: layer(x)), lambda: layer(x, return_trace=True)):
            with pytest.raises(ValueError, match=r"mode 'euler': tau \* t / euler_steps reached .* >= 2"):
                run()
        layer.euler_steps = 40
        y = layer(x)
        layer.mode = "exact"
        torch.testing.assert_close(y, layer(x), atol=0.05, rtol=0.05)   # 40 steps: near the closed form


def _eager_call(fn):
    with nac_kernels.disabled():
        return fn()


def test_step_refuses_block_selection_and_a_driving_core_refuses_it_at_build():
    from nac_drive.policy.cores import CoreConfig, NACCore

    layer = make(select="block")
    with pytest.raises(ValueError, match="cannot stream select='block'"):
        layer.step(torch.randn(1, 6), layer.init_cache(1))
    with pytest.raises(ValueError, match="streams frame by frame"):
        NACCore(6, CoreConfig(select="block"))


def test_empty_top_k_slots_trace_nan_and_weight_zero():
    layer = make(topk=4).eval()
    _, trace = layer(inputs(), return_trace=True)
    empty = trace.topk_idx < 0                        # query 0 sees 1 key, query 1 sees 2, ...
    assert empty[..., 0, 1:].all() and not empty[..., 5, :].any()
    for name in ("phi", "tau", "t_interp", "logits", "inter", "command", "motor"):
        value = getattr(trace, name)
        slots = empty if value.ndim == 4 else empty[..., None].expand_as(value)
        assert value[slots].isnan().all() and not value[~slots].isnan().any(), name
    assert (trace.weights[empty] == 0).all()


def test_checkpoints_with_the_old_phi_tau_names_still_load():
    layer = make()
    old = {(("gate_" + name.removeprefix("phi_tau_")) if name.startswith("phi_tau_") else name): value
           for name, value in layer.state_dict().items()}
    assert "gate_weight" in old and "phi_tau_weight" not in old
    fresh = make(seed=9)
    fresh.load_state_dict(old)
    torch.testing.assert_close(fresh(inputs()), layer(inputs()))


# ------------------------------------------------------------------------- the paper's map
def test_each_equation_maps_to_a_function_named_in_the_architecture_table():
    """docs/ARCHITECTURE.md §3 names, for each of eqs. 13-19, the function of the layer that
    computes it; every name there exists (``NAC.method`` or ``module.function`` of the room)."""
    import importlib
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = doc[doc.index("## 3. The NAC layer"):doc.index("## 4.")]
    rows = [line.strip("| ").split(" | ") for line in section.splitlines() if line.startswith("| ")]
    assert rows[0] == ["step", "equation (paper §2)", "code (`nac_drive/nac/`)"]
    rows = rows[1:]
    by_equation = {}
    for _, equation, code in rows:
        for owner, name in re.findall(r"`(\w+)\.(\w+)`", code):
            target = NAC if owner == "NAC" else importlib.import_module(f"nac_drive.nac.{owner}")
            assert callable(getattr(target, name, None)), f"{owner}.{name} named in ARCHITECTURE.md does not exist"
        methods = re.findall(r"`NAC\.(\w+)`", code)
        for eq in re.findall(r"eqs?\. ([\d, ]+)", equation):
            for n in re.findall(r"\d+", eq):
                by_equation.setdefault(int(n), set()).update(methods)
    assert all(by_equation.get(n) for n in range(13, 20)), by_equation


# ------------------------------------------------------- logit variants beyond the paper
def test_the_variants_beyond_the_paper_change_only_the_logits_as_documented():
    x, t = inputs(), torch.arange(9.0).expand(2, 9)
    paper = make(window=6).eval()
    _, base = paper(x, t, return_trace=True)
    scaled = make(window=6, logit_variant="scaled").eval()
    state = paper.state_dict()
    with pytest.raises(RuntimeError, match="logit_log_scale"):   # its own parameter: a paper checkpoint lacks it
        scaled.load_state_dict(state)
    scaled.load_state_dict({**state, "logit_log_scale": torch.tensor([0.0, math.log(3.0)])})
    _, traced = scaled(x, t, return_trace=True)
    valid = base.topk_idx >= 0
    torch.testing.assert_close(traced.logits[:, 0][valid[:, 0]], base.logits[:, 0][valid[:, 0]])   # exp(0) = 1
    torch.testing.assert_close(traced.logits[:, 1][valid[:, 1]], 3 * base.logits[:, 1][valid[:, 1]])
    qk = make(window=6, logit_variant="qk").eval()
    qk.load_state_dict(state)
    _, traced = qk(x, t, return_trace=True)
    qh = traced.q.view(2, 9, 2, 8).transpose(1, 2)
    kh = traced.k.view(2, 9, 2, 8).transpose(1, 2)
    b, h, i, slot = 1, 1, 7, 2
    j = int(base.topk_idx[b, h, i, slot])
    expected = base.logits[b, h, i, slot] + qh[b, h, i] @ kh[b, h, j] / math.sqrt(8)
    torch.testing.assert_close(traced.logits[b, h, i, slot], expected)
    assert torch.equal(traced.topk_idx, base.topk_idx)   # the same keys, weighted otherwise
    assert not torch.allclose(traced.weights, base.weights)


@pytest.mark.parametrize("variant", ["scaled", "qk"])
def test_a_variant_streams_like_its_forward_and_has_the_right_gradients(variant):
    small = make(input_dim=3, d_model=4, num_heads=2, topk=3, backbone_units=8, logit_variant=variant).double()
    x = torch.randn(1, 4, 3, dtype=torch.float64, requires_grad=True)
    t = torch.rand(1, 4, dtype=torch.float64).cumsum(1).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, t: small(x, t=t), (x, t), eps=1e-6, atol=1e-5)
    layer = make(window=5, logit_variant=variant)
    x, t = inputs(), torch.arange(9.0).expand(2, 9)
    if variant == "scaled":   # the scale's own gradient, against a central difference
        with torch.no_grad():
            layer.logit_log_scale.copy_(torch.tensor([1.5, -0.7]))
        double = make(window=5, logit_variant=variant).double()
        double.load_state_dict(layer.state_dict())
        loss = lambda: double(x.double(), t.double()).square().sum()   # noqa: E731
        loss().backward()
        with torch.no_grad():
            double.logit_log_scale[0] += 1e-6
            up = loss()
            double.logit_log_scale[0] -= 2e-6
            down = loss()
        torch.testing.assert_close(double.logit_log_scale.grad[0], (up - down) / 2e-6, rtol=1e-4, atol=1e-7)
    layer.eval()
    with torch.inference_mode():
        y = layer(x, t)
        cache, out = layer.init_cache(2), []
        for i in range(9):
            y_i, cache = layer.step(x[:, i], cache, t[:, i])
            out.append(y_i)
    torch.testing.assert_close(torch.stack(out, 1), y, atol=2e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="logit_variant"):
        make(logit_variant="sharper")
