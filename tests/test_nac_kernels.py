"""The numba kernels of the NAC layer give what the eager torch code gives.

The eager code is the reference (autograd differentiates it, GPUs run it); on CPU the
layer takes the kernels for key selection always, and for the pair stage whenever
no dropout is needed: without a gradient a trace's stages included, with one the fused
backward (its gradients equal the eager code's, and pass gradcheck in float64).
"""

import copy
import itertools
import math

import numpy as np
import pytest
import torch

from nac_drive import NAC
from nac_drive.nac import kernels as nac_kernels
from nac_drive.nac.selection import NO_KEY, BlockPartition, Visibility, select_block, select_exact

torch.set_num_threads(1)
pytestmark = pytest.mark.skipif(not nac_kernels.available(), reason="numba kernels unavailable")

SETTINGS = list(itertools.product(["exact", "euler", "steady"], ["exact", "block", "all"], [True, False],
                                  [None, 5], ["query", "elapsed"]))


def _eager(fn):
    with nac_kernels.disabled():
        return fn()


@pytest.mark.parametrize("mode,select,causal,window,time_input", SETTINGS)
def test_kernel_forward_equals_the_eager_forward(mode, select, causal, window, time_input):
    layer = NAC(6, d_model=16, num_heads=2, topk=4, mode=mode, select=select, causal=causal, window=window,
                time_input=time_input, seed=0).eval()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 23, 6, generator=g)
    t = torch.rand(3, 23, generator=g).cumsum(1)
    mask = torch.rand(3, 23, generator=g) > 0.2
    mask[2] = False                                   # a sequence with no valid step at all
    for stamps, valid in ((None, None), (t, mask)):
        with torch.no_grad():
            fast = layer(x, t=stamps, mask=valid)
            reference = _eager(lambda: layer(x, t=stamps, mask=valid))
        torch.testing.assert_close(fast, reference, atol=2e-6, rtol=1e-5)
    # the kernel did run: outside no_grad the layer needs autograd and takes the eager code
    assert not fast.requires_grad and layer(x).requires_grad


@pytest.mark.parametrize("mode,select,window,time_input",
                         list(itertools.product(["exact", "euler", "steady"], ["exact", "all"], [None, 5],
                                                ["query", "elapsed"])))
def test_kernel_step_equals_the_eager_step_and_the_forward(mode, select, window, time_input, stream_calls):
    """A streamed step takes one numba call (``kernels.stream_step``): what the eager step gives (the
    output and the cache), and the forward at that position, with timestamps and without."""
    layer = NAC(6, d_model=16, num_heads=2, topk=4, mode=mode, select=select, window=window, time_input=time_input,
                seed=0).eval()
    g = torch.Generator().manual_seed(2)
    x, t = torch.randn(2, 12, 6, generator=g), torch.rand(2, 12, generator=g).cumsum(1)
    with torch.inference_mode():
        for stamps in (t, None):
            y = _eager(lambda: layer(x, t=stamps))
            fast, eager = layer.init_cache(2), layer.init_cache(2)
            for i in range(12):
                t_i = None if stamps is None else stamps[:, i]
                y_fast, fast = layer.step(x[:, i], fast, t=t_i)
                y_eager, eager = _eager(lambda: layer.step(x[:, i], eager, t=t_i))
                torch.testing.assert_close(y_fast, y_eager, atol=2e-6, rtol=1e-5)
                torch.testing.assert_close(fast.feats, eager.feats, atol=2e-6, rtol=1e-5)
                torch.testing.assert_close(y_fast, y[:, i], atol=2e-6, rtol=1e-5)
    assert len(stream_calls) == 24


def test_saturated_gates_match():
    """Large weights push tanh, sigmoid and softplus deep into saturation (tau from ~0 to
    ~30). Mode exact keeps the logits in [0, phi t], so the comparison stays well posed:
    in steady mode phi / tau with tau ~ 1e-6 turns float rounding into a different argmax."""
    layer = NAC(6, d_model=16, num_heads=2, topk=4, mode="exact", select="all", seed=0).eval()
    x = torch.randn(2, 15, 6, generator=torch.Generator().manual_seed(4)) * 4
    with torch.no_grad():
        for p in layer.parameters():
            p.mul_(25.0)
        layer.phi_tau_bias.zero_()
        _, trace = _eager(lambda: layer(x, return_trace=True))
        tau, inter = trace.tau[trace.topk_idx >= 0], trace.inter[trace.topk_idx >= 0]   # (empty slots: NaN)
        assert tau.min() < 1e-3 and tau.max() > 20 and (inter.abs() > 0.999).float().mean() > 0.5
        torch.testing.assert_close(layer(x), _eager(lambda: layer(x)), atol=1e-5, rtol=1e-5)


def _counted(monkeypatch, name: str) -> list:
    """Counts the calls of ``nac_kernels.<name>``."""
    calls, real = [], getattr(nac_kernels, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(nac_kernels, name, counted)
    return calls


@pytest.fixture
def kernel_calls(monkeypatch):
    """Counts the calls of the fused pair-stage kernel."""
    return _counted(monkeypatch, "attend")


@pytest.fixture
def stream_calls(monkeypatch):
    """Counts the calls of the one-call streamed step."""
    return _counted(monkeypatch, "stream_step")


def test_the_pair_stage_takes_the_eager_path_when_it_must(kernel_calls):
    layer = NAC(6, d_model=16, num_heads=2, topk=4, dropout=0.5, seed=0).eval()
    x = torch.randn(1, 9, 6)
    with torch.no_grad():
        layer(x)
        layer(x, return_trace=True)                        # the kernel writes the stages out too
        assert len(kernel_calls) == 2                      # inference: the kernel
        layer.double()(x.double())                         # float64
        with nac_kernels.disabled():
            layer.float()(x)
        layer.float().train()
        assert not torch.equal(layer(x), layer(x))         # active dropout: two calls differ
        assert len(kernel_calls) == 2
    layer.eval()(x)                                        # autograd: the kernel and its fused backward
    assert len(kernel_calls) == 3
    layer(x, return_trace=True)                            # a trace whose stages carry gradients: eager
    assert len(kernel_calls) == 3


def _through_fused_backward(y: torch.Tensor) -> bool:
    """Whether ``y``'s autograd graph holds the fused pair stage's backward."""
    seen, todo = set(), [y.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__ == "PairStageBackward":
            return True
        todo += [next_node for next_node, _ in node.next_functions]
    return False


def _output_and_grads(layer, x, t):
    """y and the gradients of a fixed random projection of it w.r.t. x, t and every parameter."""
    y = layer(x, t)
    probe = torch.randn(y.shape, generator=torch.Generator().manual_seed(7), dtype=y.dtype)
    return y, torch.autograd.grad((y * probe).sum(), [x, t, *layer.parameters()], allow_unused=True)


TRAINING = list(itertools.product(["exact", "euler", "steady"], ["exact", "all"], [None, 5], ["query", "elapsed"],
                                  ["paper", "scaled", "qk"]))


@pytest.mark.parametrize("mode,select,window,time_input,variant", TRAINING)
def test_training_through_the_kernels_gives_the_eager_outputs_and_gradients(mode, select, window, time_input,
                                                                              variant):
    layer = NAC(6, d_model=16, num_heads=2, topk=4, mode=mode, select=select, window=window, euler_steps=8,
                time_input=time_input, time_weighted_values=time_input == "query", logit_variant=variant,
                seed=0).train()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 11, 6, generator=g, requires_grad=True)
    t = torch.rand(3, 11, generator=g).cumsum(1).requires_grad_()
    fast_y, fast = _output_and_grads(layer, x, t)
    assert _through_fused_backward(fast_y) == (variant == "paper")   # the kernels compute the paper's logits
    eager_y, eager = _eager(lambda: _output_and_grads(layer, x, t))
    assert not _through_fused_backward(eager_y)
    torch.testing.assert_close(fast_y, eager_y, atol=2e-6, rtol=1e-5)
    for a, b in zip(fast, eager, strict=True):
        if b is None:
            assert a is None
        else:
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("mode,select,window,time_input", [s[:4] for s in TRAINING if s[4] == "paper"])
def test_the_fused_backward_passes_gradcheck_in_float64(mode, select, window, time_input):
    layer = NAC(4, d_model=8, num_heads=2, topk=3, mode=mode, select=select, window=window, euler_steps=8,
                time_input=time_input, seed=0).double()
    params = dict(layer.named_parameters())
    names = ["inter.weight", "command.weight", "command.bias", "motor.weight", "phi_tau_weight", "phi_tau_bias",
             "time_weight", "v_gate.weight"]
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.rand(2, 6, generator=g, dtype=torch.float64).cumsum(1).requires_grad_()

    def call(x, t, *weights):
        return torch.func.functional_call(layer, {**params, **dict(zip(names, weights))}, (x, t))

    assert _through_fused_backward(call(x, t, *(params[n] for n in names)))
    inputs = (x, t, *(params[n].detach().clone().requires_grad_() for n in names))
    assert torch.autograd.gradcheck(call, inputs, eps=1e-6, atol=1e-6, rtol=1e-4)


def _assert_same_trace(fast, eager):
    """Every field of two NACTraces equal (to the kernels' 1e-5), NaN where the other has NaN."""
    for name in ("q", "k", "v", "topk_idx", *nac_kernels.TRACED_STAGES):
        a, b = getattr(fast, name), getattr(eager, name)
        assert a.shape == b.shape, name
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5, equal_nan=True, msg=name)
    assert torch.equal(torch.isnan(fast.phi), fast.topk_idx < 0)   # NaN exactly in the empty slots
    assert torch.equal(fast.weights[fast.topk_idx < 0], torch.zeros_like(fast.weights[fast.topk_idx < 0]))


@pytest.mark.parametrize("mode,select,causal,window,time_input", SETTINGS[::5])
def test_a_traced_kernel_forward_gives_the_eager_trace(mode, select, causal, window, time_input, kernel_calls):
    layer = NAC(6, d_model=16, num_heads=2, topk=4, mode=mode, select=select, causal=causal, window=window,
                time_input=time_input, seed=0).eval()
    g = torch.Generator().manual_seed(5)
    x, t = torch.randn(3, 17, 6, generator=g), torch.rand(3, 17, generator=g).cumsum(1)
    mask = torch.rand(3, 17, generator=g) > 0.3
    mask[2] = False                                   # a sequence with no valid step: empty slots only
    with torch.no_grad():
        y, fast = layer(x, t=t, mask=mask, return_trace=True)
        y_eager, eager = _eager(lambda: layer(x, t=t, mask=mask, return_trace=True))
    assert len(kernel_calls) == 1
    torch.testing.assert_close(y, y_eager, atol=2e-6, rtol=1e-5)
    assert (fast.topk_idx < 0).any() and (fast.topk_idx >= 0).any()   # both kinds of slot are checked
    _assert_same_trace(fast, eager)


@pytest.mark.parametrize("mode", ["exact", "euler", "steady"])
def test_a_traced_kernel_step_gives_the_eager_trace_and_the_untraced_output(mode, stream_calls):
    """A streamed step with its trace (as ``drive --trace`` runs) takes the kernels' one call, as
    one without does: the same output as without the trace, and the eager code's trace."""
    layer = NAC(6, d_model=16, num_heads=2, topk=4, mode=mode, window=5, seed=0).eval()
    x = torch.randn(1, 9, 6, generator=torch.Generator().manual_seed(6))
    with torch.inference_mode():
        traced, plain, eager = layer.init_cache(1), layer.init_cache(1), layer.init_cache(1)
        for i in range(9):
            y, traced, fast = layer.step(x[:, i], traced, return_trace=True)
            y_plain, plain = layer.step(x[:, i], plain)
            _, eager, eager_trace = _eager(lambda: layer.step(x[:, i], eager, return_trace=True))
            assert torch.equal(y, y_plain)
            _assert_same_trace(fast, eager_trace)
    assert len(stream_calls) == 18


@pytest.mark.parametrize("name", ["command", "motor_bias", "phi_tau_bias"])
def test_a_nan_weight_takes_the_eager_path_even_after_finite_calls(name, kernel_calls):
    """The weights' finiteness is checked once per packing; a parameter changed in place
    repacks them, so a NaN put there later is still seen."""
    layer = NAC(6, d_model=16, num_heads=2, topk=4, mode="exact", seed=0).eval()
    x = torch.randn(1, 9, 6)
    with torch.no_grad():
        assert torch.isfinite(layer(x)).all() and len(kernel_calls) == 1
        param = {"command": layer.command.weight, "motor_bias": layer.motor.bias,
                 "phi_tau_bias": layer.phi_tau_bias}[name]
        param.view(-1)[0] = math.nan
        y = layer(x)
        assert len(kernel_calls) == 1
        torch.testing.assert_close(y, _eager(lambda: layer(x)), equal_nan=True)


# ------------------------------------------------------------------------- key selection
def _random_qk(B, H, T, D, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, T, D, generator=g), torch.randn(B, H, T, D, generator=g)


def kernel_exact(q, k, topk, vis, q_offset=0):
    return nac_kernels.kernel_select_exact(q, k, topk, vis, q_offset)


def kernel_block(q, k, topk, vis):
    return nac_kernels.kernel_select_block(q, BlockPartition.of(k, topk, vis.key_valid), topk, vis)


@pytest.mark.parametrize("causal,window,masked", list(itertools.product([True, False], [None, 1, 6], [False, True])))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_selection_kernels_choose_the_reference_keys(causal, window, masked, dtype):
    q, k = (t.to(dtype) for t in _random_qk(2, 3, 41, 8, seed=5))
    valid = torch.rand(2, 41, generator=torch.Generator().manual_seed(6)) > 0.3 if masked else None
    vis = Visibility(causal, window, valid)
    for topk in (1, 4, 12):
        for reference, kernel in ((select_exact, kernel_exact), (select_block, kernel_block)):
            got, want = kernel(q, k, topk, vis), reference(q, k, topk, vis)
            assert got.dtype == torch.long and got.shape == want.shape
            assert torch.equal(got, want), (reference.__name__, topk)   # the same keys in the same order
            # best first, like torch.topk: the scores of the chosen keys never increase
            scores = (q.unsqueeze(-2) @ k.transpose(-1, -2).unsqueeze(2)).squeeze(-2)   # [B,H,T,T]
            chosen = torch.gather(scores, -1, got.clamp(min=0)).masked_fill(got == NO_KEY, -math.inf)
            assert torch.all(chosen[..., 1:] <= chosen[..., :-1])


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_block_selection_kernel_ranks_ties_newest_first(causal, dtype):
    """Small integers score exactly and often alike (ties inside and across blocks, zeros): the
    kernel's keys and the torch reference's, in order, are those of (score, key) ranked by hand
    in the blocks that rank best by the same centroid scores (ties there to the later block)."""
    g = torch.Generator().manual_seed(3)
    H, T, D, K = 2, 50, 4, 9                  # blocks of 8, 3 of them a query
    q, k = (torch.randint(-2, 3, (1, H, T, D), generator=g).to(dtype) for _ in range(2))
    part = BlockPartition.of(k, K, None)
    block_scores = q @ part.centroids.transpose(-1, -2)
    got = kernel_block(q, k, K, Visibility(causal))
    assert torch.equal(select_block(q, k, K, Visibility(causal)), got)
    for h, i in itertools.product(range(H), range(T)):
        own = i // part.size
        rankable = [blk for blk in range(part.n_blocks) if blk != own and (blk < own or not causal)]
        ranked = sorted(rankable, key=lambda blk: (float(block_scores[0, h, i, blk]), blk), reverse=True)
        cand = [j for blk in [own, *ranked[:part.n_pick - 1]] for j in range(blk * part.size, (blk + 1) * part.size)
                if j < T and (j <= i or not causal)]
        best = sorted(cand, key=lambda j: (float(q[0, h, i] @ k[0, h, j]), j), reverse=True)[:K]
        assert got[0, h, i].tolist() == best + [NO_KEY] * (K - len(best)), (h, i)


@pytest.mark.parametrize("causal,window", [(True, None), (False, None), (True, 20), (False, 90)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_exact_selection_kernel_ranks_ties_newest_first(causal, window, dtype):
    """Small integers score exactly and often alike (zeros, -0.0 among them): over 150 keys, more
    than one row of the kernel's columns, the keys in order are those of (score, key) ranked by
    hand among each query's visible, valid keys."""
    g = torch.Generator().manual_seed(4)
    H, T, D, K = 2, 150, 3, 9
    q, k = (torch.randint(-2, 3, (1, H, T, D), generator=g).to(dtype) for _ in range(2))
    k[0, :, 40:60] = -0.0 * k[0, :, 40:60].abs()   # negative zeros: they tie with 0.0
    valid = torch.rand(1, T, generator=g) > 0.2
    got = kernel_exact(q, k, K, Visibility(causal, window, valid))
    for h, i in itertools.product(range(H), range(T)):
        cand = [j for j in range(T) if valid[0, j] and (j <= i or not causal)
                and (window is None or (i - window < j and (causal or j < i + window)))]
        best = sorted(cand, key=lambda j: (float(q[0, h, i] @ k[0, h, j]), j), reverse=True)[:K]
        assert got[0, h, i].tolist() == best + [NO_KEY] * (K - len(best)), (h, i)


def test_packed_scores_rank_as_the_selection_compares_them():
    """float32 block selection ranks a score and its key packed into one int64: higher score first,
    equal scores (-0.0 and 0.0 among them) the newer key first."""
    from nac_drive.nac import _numba as nb

    scores = np.array([1.5, -0.0, 0.0, -2.0, 1.5, -1e-45, 1e-45, -3.4e38, 3.4e38, -2.0, 0.0, -0.0], np.float32)
    packed = [nb._pack(bits, key) for key, bits in enumerate(scores.view(np.int32))]
    by_packing = sorted(range(len(scores)), key=packed.__getitem__, reverse=True)
    assert by_packing == sorted(range(len(scores)), key=lambda c: (scores[c], c), reverse=True)


def test_exact_selection_kernel_with_a_query_offset():
    q, k = _random_qk(1, 2, 30, 4, seed=9)
    vis = Visibility(causal=True, window=7)
    got = kernel_exact(q[:, :, 20:], k, 5, vis, q_offset=20)
    assert torch.equal(got, select_exact(q[:, :, 20:], k, 5, vis, q_offset=20))
    assert torch.all((got <= torch.arange(20, 30)[:, None]) & (got > torch.arange(20, 30)[:, None] - 7))


def test_exact_selection_kernel_on_long_sequences():
    q, k = _random_qk(1, 2, 700, 16, seed=11)
    for causal in (True, False):
        vis = Visibility(causal)
        assert torch.equal(kernel_exact(q, k, 8, vis), select_exact(q, k, 8, vis))


# ------------------------------------------------------------------------ the math inside
@pytest.fixture(scope="module")
def math_kernels():
    from numba import njit

    from nac_drive.nac import _numba as nb

    def wrap(helper, scratch):   # scratch: "tmp and bits", "bits" or none
        if scratch == "tmp and bits":
            @njit
            def run(x):
                out, tmp = np.empty_like(x), np.empty_like(x)
                bits = np.empty(x.size, np.int32)
                helper(x, out, x.size, tmp, bits, bits.view(np.float32))
                return out
        elif scratch == "bits":
            @njit
            def run(x):
                out = np.empty_like(x)
                bits = np.empty(x.size, np.int32)
                helper(x, out, x.size, bits, bits.view(np.float32))
                return out
        else:
            @njit
            def run(x):
                out = np.empty_like(x)
                helper(x, out, x.size)
                return out
        return run

    return {"exp": wrap(nb._exp_into, "bits"), "tanh": wrap(nb._tanh_into, None),
            "sigmoid": wrap(nb._sigmoid_into, None), "softplus": wrap(nb._softplus_into, "tmp and bits"),
            "one_minus_exp_neg": wrap(nb._one_minus_exp_neg_into, "tmp and bits")}


def test_vectorised_transcendentals_are_accurate(math_kernels):
    x = np.concatenate([np.linspace(-90, 90, 20001), np.linspace(-1e-3, 1e-3, 2001),
                        np.geomspace(1e-12, 1e-2, 200), -np.geomspace(1e-12, 1e-2, 200)]).astype(np.float32)
    x64 = x.astype(np.float64)
    exact = {
        "exp": np.exp(np.clip(x64, -87, 88)),
        "tanh": np.tanh(x64),
        "sigmoid": 1 / (1 + np.exp(-x64)),
        "softplus": np.logaddexp(0, x64),
    }
    for name, want in exact.items():
        got = math_kernels[name](x).astype(np.float64)
        err = np.abs(got - want) / np.maximum(np.abs(want), 1e-30 if name == "exp" else 1.0)
        assert err.max() < 1e-6, (name, err.max(), x64[err.argmax()])
    assert np.abs(math_kernels["tanh"](x)).max() <= 1.0   # tanh' = 1 - tanh^2 in the backward stays >= 0
    # tanh keeps its relative accuracy near 0 (the backbone sees small pre-activations)
    small = x64[np.abs(x64) < 1e-3]
    got = math_kernels["tanh"](small.astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got - np.tanh(small)) / np.maximum(np.abs(small), 1e-30)) < 1e-6
    # 1 - exp(-y) for y >= 0, relative to itself even for tiny y (exact mode, small tau * t)
    y = np.concatenate([np.geomspace(1e-12, 80, 5000), [0.0]]).astype(np.float32)
    got = math_kernels["one_minus_exp_neg"](y).astype(np.float64)
    want = -np.expm1(-y.astype(np.float64))
    assert np.max(np.abs(got - want) / np.maximum(want, 1e-30)) < 1e-6 and got[-1] == 0.0


# ------------------------------------------------------------------ edge cases of review
def test_tied_scores_pick_the_newest_keys_in_forward_and_step():
    """A car standing still sends identical frames: their keys tie exactly. Forward and
    step() must pick the same ones (the newest), or driving differs from training."""
    layer = NAC(5, d_model=8, num_heads=2, topk=3, time_input="elapsed", seed=0).eval()
    x = torch.randn(1, 20, 5, generator=torch.Generator().manual_seed(0))
    x[:, 3:12] = x[:, 3:4]
    with torch.inference_mode():
        y, trace = layer(x, return_trace=True)
        cache = layer.init_cache(1)
        for i in range(20):
            y_i, cache = layer.step(x[:, i], cache)
            torch.testing.assert_close(y_i, y[:, i], atol=2e-6, rtol=1e-5)
        _, eager_trace = _eager(lambda: layer(x, return_trace=True))
    # at query 8 keys 3..8 are the same frame: those chosen among them are the newest,
    # on the kernels and in the torch reference alike
    assert torch.equal(eager_trace.topk_idx, trace.topk_idx)
    for h in range(2):
        tied = {j for j in trace.topk_idx[0, h, 8].tolist() if 3 <= j <= 8}
        assert tied and tied == set(range(9 - len(tied), 9)), (h, trace.topk_idx[0, h, 8])


def test_a_broadcast_mask_is_read_as_torch_reads_it_and_a_wrong_one_is_refused():
    q, k = _random_qk(4, 2, 6, 3, seed=1)
    row = torch.tensor([[True, False, True, False, True, True]])
    vis = Visibility(False, None, row)
    got = kernel_exact(q, k, 6, vis)
    assert torch.equal(got, select_exact(q, k, 6, vis))
    assert torch.all((got == NO_KEY).sum(-1) == 2)
    with pytest.raises(ValueError, match="key_valid"):
        kernel_exact(q, k, 6, Visibility(False, None, torch.ones(4, 5, dtype=torch.bool)))


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::torch.jit.TracerWarning")
def test_tracing_a_layer_takes_the_eager_path():
    layer = NAC(5, d_model=8, num_heads=2, topk=3, seed=0).eval()
    x = torch.randn(1, 12, 5)
    traced = torch.jit.trace(layer, (x,))
    with torch.no_grad():
        torch.testing.assert_close(traced(x), layer(x), atol=2e-6, rtol=1e-5)


def test_nan_inputs_give_nan_like_the_eager_code():
    layer = NAC(5, d_model=8, num_heads=2, topk=3, seed=0).eval()
    x = torch.randn(1, 8, 5)
    x[0, 2] = float("nan")
    with torch.no_grad():
        fast, reference = layer(x), _eager(lambda: layer(x))
    assert torch.equal(fast.isnan().any(-1), reference.isnan().any(-1)) and fast[0, 2].isnan().any()


def test_infinite_inputs_never_reach_the_fast_math_kernels(kernel_calls):
    layer = NAC(5, d_model=8, num_heads=2, topk=3, seed=0).eval()
    x = torch.randn(1, 8, 5)
    x[0, 2, 0] = float("inf")
    q, k = _random_qk(1, 2, 6, 3, seed=3)
    k[0, 0, 1, 0] = float("inf")
    assert not nac_kernels.handles_selection(q, k)
    with torch.no_grad():
        fast, reference = layer(x), _eager(lambda: layer(x))
    assert kernel_calls == []
    torch.testing.assert_close(fast, reference, equal_nan=True)


@pytest.mark.parametrize("where", ["input", "weight"])
def test_a_streamed_step_on_an_infinite_value_takes_the_eager_code(where, stream_calls):
    """The one-call step computes the gates itself, then checks q, the query half and every key
    row before its fast-math selection: an inf in a frame (or a gate's weight) sends that step,
    and those whose window still holds the row, to the eager code, which lets it through as torch does."""
    layer = NAC(5, d_model=8, num_heads=2, topk=3, window=4, seed=0).eval()
    x = torch.randn(1, 9, 5, generator=torch.Generator().manual_seed(8))
    if where == "input":
        x[0, 2, 0] = float("inf")
    else:
        with torch.no_grad():
            layer.k_gate.weight[0, 0] = float("inf")
    with torch.inference_mode():
        fast, eager = layer.init_cache(1), layer.init_cache(1)
        for i in range(9):
            y_fast, fast = layer.step(x[:, i], fast)
            y_eager, eager = _eager(lambda: layer.step(x[:, i], eager))
            torch.testing.assert_close(y_fast, y_eager, atol=2e-6, rtol=1e-5, equal_nan=True)
            torch.testing.assert_close(fast.feats, eager.feats, atol=2e-6, rtol=1e-5, equal_nan=True)
    assert len(stream_calls) == 9   # each tried, its result refused while the window held the row


def test_a_streamed_step_that_needs_a_gradient_takes_the_stage_by_stage_code(stream_calls):
    """Only the output projection trains (the rest frozen): autograd must see it, so the step
    leaves the one-call kernel, which computes without autograd."""
    layer = NAC(5, d_model=8, num_heads=2, topk=3, window=4, seed=0).eval()
    layer.requires_grad_(False)
    layer.out_proj.weight.requires_grad_(True)
    y, _ = layer.step(torch.randn(1, 5), layer.init_cache(1))
    y.sum().backward()
    assert layer.out_proj.weight.grad is not None and stream_calls == []


def test_a_hook_on_the_output_projection_sees_the_heads_of_a_streamed_step(stream_calls):
    """The one-call step projects the heads itself, unless a hook watches ``out_proj``
    (``interpret.representations`` reads the heads there): then the projection is a module call."""
    layer = NAC(5, d_model=8, num_heads=2, topk=3, window=4, seed=0).eval()
    x = torch.randn(1, 6, 5, generator=torch.Generator().manual_seed(10))
    seen = []
    with torch.inference_mode():
        plain, hooked = layer.init_cache(1), layer.init_cache(1)
        for i in range(6):
            y_plain, plain = layer.step(x[:, i], plain)
            hook = layer.out_proj.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
            y_hooked, hooked = layer.step(x[:, i], hooked)
            hook.remove()
            torch.testing.assert_close(y_hooked, y_plain, atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(y_hooked, layer.out_proj(seen[-1])[:, 0], rtol=0, atol=0)
    assert len(seen) == 6 and seen[0].shape == (1, 1, 8) and len(stream_calls) == 12


def test_a_streamed_step_after_a_weight_update_reads_the_new_weights(stream_calls):
    """Mid-stream, an optimizer's step changes the weights in place: the next streamed step packs
    them afresh (``packing.Derived``), as a layer that never streamed would."""
    layer = NAC(5, d_model=8, num_heads=2, topk=3, window=4, seed=0).eval()
    x = torch.randn(1, 8, 5, generator=torch.Generator().manual_seed(9))
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.5)
    cache = layer.init_cache(1)
    with torch.inference_mode():
        for i in range(4):
            _, cache = layer.step(x[:, i], cache)
        before, _ = layer.step(x[:, 4], cache)
    layer(x).square().sum().backward()
    optimizer.step()
    never_streamed = copy.deepcopy(layer)   # (a copy starts without the packed weights)
    with torch.inference_mode():
        y, _ = layer.step(x[:, 4], cache)
        expected, _ = never_streamed.step(x[:, 4], cache)
    torch.testing.assert_close(y, expected, rtol=0, atol=0)
    assert not torch.allclose(y, before)
    assert len(stream_calls) == 7


def test_queries_past_every_visible_key_get_empty_slots_in_both_paths():
    q, k = _random_qk(1, 2, 8, 4, seed=2)
    vis = Visibility(causal=True, window=1)
    for select in (kernel_exact, select_exact):
        assert torch.all(select(q, k[:, :, :5], 3, vis, q_offset=7) == NO_KEY)
