"""The fast paths of inference give what the eager code gives, and never outlive a weight change.

On the CPU without autograd a policy's encoder and head run as one plan each, the encoder's
convolutions through oneDNN's fused operator with their weights reordered once
(``fused.FusedLayers``), and its NAC streams a step in one numba call (``kernels.stream_step``).
Inside ``kernels.disabled()`` they step aside: the reference.
"""

import copy
import io
import pickle

import numpy as np
import pytest
import torch
from support.held_out_drive import drive_recording, replay

from nac_drive.nac import kernels
from nac_drive.policy.cores import CoreConfig
from nac_drive.policy import fused
from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig
from nac_drive.policy.encoders import ENCODERS
from nac_drive.policy.loading import load_driving_policy

torch.set_num_threads(1)
HELD_OUT, FRAMES = 900000, 250


def _frames(encoder, batch: int, seed: int = 0) -> torch.Tensor:
    """Random uint8 frames ``[batch, C, H, W]`` as a simulator gives them (HWC memory)."""
    c, h, w = encoder.frame_shape
    pixels = torch.randint(0, 256, (batch, h, w, c), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    return pixels.permute(0, 3, 1, 2)


def _eager(module, *args):
    with torch.inference_mode(), kernels.disabled():
        return module(*args)


def _fused(encoder) -> bool:
    """Whether the encoder has convolved through the fused path (it keeps the reordered weights)."""
    return encoder.fused.ran


@pytest.mark.parametrize("name", sorted(ENCODERS))
@pytest.mark.parametrize("batch", [1, 3])
def test_the_fused_convolutions_give_the_eager_features(name, batch):
    encoder = ENCODERS[name]().eval()
    frames = _frames(encoder, batch)
    with torch.inference_mode():
        fast = encoder(frames)
    assert _fused(encoder)
    torch.testing.assert_close(fast, _eager(encoder, frames), atol=1e-5, rtol=1e-5)


def _change(encoder, how: str, other) -> None:
    """Change ``encoder``'s weights as training or loading does."""
    if how == "optimizer step":
        optimizer = torch.optim.SGD(encoder.parameters(), lr=0.1)
        encoder.train()
        encoder(_frames(encoder, 2, seed=1)).square().sum().backward()
        optimizer.step()
        encoder.eval()
    elif how == "load_state_dict":
        encoder.load_state_dict(other.state_dict())
    elif how == "replaced parameter":
        encoder.convs[2].weight = torch.nn.Parameter(other.convs[2].weight.detach().clone())
    else:   # a tensor's data swapped (what Module.to does to change a dtype and back)
        encoder.convs[0].bias.data = other.convs[0].bias.detach().clone()


@pytest.mark.parametrize("how", ["optimizer step", "load_state_dict", "replaced parameter", "data swapped"])
def test_a_weight_change_reaches_the_fused_convolutions(how):
    """The reordered weights are a copy: any change of a weight rebuilds them before the next call."""
    torch.manual_seed(0)
    encoder, other = ENCODERS["carracing_cnn"]().eval(), ENCODERS["carracing_cnn"]()
    frames = _frames(encoder, 1)
    with torch.inference_mode():
        before = encoder(frames)
    _change(encoder, how, other)
    with torch.inference_mode():
        after = encoder(frames)
    assert _fused(encoder) and not torch.allclose(before, after)
    torch.testing.assert_close(after, _eager(encoder, frames), atol=1e-5, rtol=1e-5)


def test_training_gradients_hooks_and_a_replaced_activation_take_the_module_path():
    torch.manual_seed(0)
    encoder = ENCODERS["carracing_cnn"]()
    frames = _frames(encoder, 2)
    reference = _eager(encoder.eval(), frames)
    encoder.train()
    with torch.inference_mode():
        torch.testing.assert_close(encoder(frames), reference)   # train mode: the Sequential's forward
    assert not _fused(encoder)
    encoder.eval()
    assert encoder(frames).requires_grad and not _fused(encoder)   # autograd
    seen = []
    hook = encoder.convs[1].register_forward_hook(lambda module, args, out: seen.append(out.shape))
    with torch.inference_mode():
        encoder(frames)
    hook.remove()
    assert seen == [(2, 10, 46, 46)] and not _fused(encoder)       # a hook sees every layer
    encoder.convs[3] = torch.nn.Tanh()                              # not fused: applied after its convolution
    with torch.inference_mode():
        torch.testing.assert_close(encoder(frames), _eager(encoder, frames), atol=1e-5, rtol=1e-5)
    assert _fused(encoder)


def test_an_encoder_copies_and_pickles_after_inference():
    """oneDNN's reordered weights cannot be copied: a copy starts without them."""
    encoder = ENCODERS["carracing_cnn"]().eval()
    frames = _frames(encoder, 1)
    with torch.inference_mode():
        expected = encoder(frames)
    for twin in (copy.deepcopy(encoder), pickle.loads(pickle.dumps(encoder))):
        assert not _fused(twin)
        with torch.inference_mode():
            torch.testing.assert_close(twin(frames), expected, rtol=0, atol=0)
    buffer = io.BytesIO()
    torch.save(encoder, buffer)


@pytest.fixture(scope="module")
def drive():
    """The shipped policy drives the first frames of held-out track 900000 on its fast paths:
    (the policy, its frames and outputs)."""
    policy = load_driving_policy()
    return policy, drive_recording(policy, [HELD_OUT], max_steps=FRAMES)


def _same_actions(fast: np.ndarray, eager: np.ndarray) -> None:
    assert fast.shape == eager.shape == (FRAMES, 5)
    assert np.abs(fast - eager).max() <= 1e-5
    assert (fast.argmax(1) == eager.argmax(1)).all()
    assert len(set(eager.argmax(1))) > 1   # the frames ask for more than one action


def test_the_shipped_policy_drives_on_its_fast_paths_as_on_the_eager_code(drive, monkeypatch):
    policy, recording = drive
    assert _fused(policy.encoder)
    streamed, planned = [], []   # the kernel's calls; the plans that served a call
    real, run_plan = kernels.stream_step, fused.FusedLayers.__call__

    def plan(self, *args):
        out = run_plan(self, *args)
        if out is not None:
            planned.append(self)
        return out

    monkeypatch.setattr(kernels, "stream_step", lambda *a, **k: streamed.append(1) or real(*a, **k))
    monkeypatch.setattr(fused.FusedLayers, "__call__", plan)
    _same_actions(replay(policy, recording), recording.outputs)   # the fast paths again: the same outputs
    assert len(streamed) == FRAMES    # every frame on the fast paths: one kernel call, the encoder's and the head's plans
    assert planned.count(policy.encoder.fused) == planned.count(policy.fused_head) == FRAMES
    with kernels.disabled():
        _same_actions(recording.outputs, replay(policy, recording))
    assert len(streamed) == FRAMES and len(planned) == 2 * FRAMES


def test_a_gru_policy_steps_on_the_fused_encoder_as_on_the_eager_code(drive):
    """A baseline core (its window re-run by torch) on the shipped policy's encoder weights."""
    shipped, recording = drive
    policy = DrivingPolicy(PolicyConfig(core=CoreConfig(core="gru"))).eval()
    policy.encoder.load_state_dict(shipped.encoder.state_dict())
    fast = replay(policy, recording)
    assert _fused(policy.encoder)
    with kernels.disabled():
        _same_actions(fast, replay(policy, recording))


def test_a_fused_convolution_that_fails_falls_back_to_torchs_own_with_a_warning(monkeypatch):
    """The fast path calls a private oneDNN operator of torch; a torch whose operator changed
    must still drive, on the plain convolutions."""
    if not fused._FUSED_CONV:
        pytest.skip("this torch has no fused CPU convolution")
    encoder = ENCODERS["carracing_cnn"]().eval()
    frames = torch.rand(2, 3, 96, 96).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        expected = encoder.fc(encoder.convs(frames))

        def changed(*args, **kwargs):
            raise RuntimeError("mkldnn::_convolution_pointwise() expected 11 arguments")

        monkeypatch.setattr(fused, "_FUSED_CONV", True)
        monkeypatch.setattr(torch.ops.mkldnn, "_convolution_pointwise", changed, raising=False)
        with pytest.warns(RuntimeWarning, match="the fused CPU convolutions failed"):
            got = encoder(frames)
    assert torch.allclose(got, expected, atol=1e-5) and fused._FUSED_CONV is False


def test_a_head_of_one_layer_runs_as_a_plan_and_never_turns_the_fused_convolutions_off(recwarn):
    """A user's head may be one Linear instead of the Sequential a policy builds: its plan is a stack
    of one. A layer stack that fails without a convolution in it raises instead of being taken for
    a failed fused convolution (which would turn them off for the whole process)."""
    fusing = fused._FUSED_CONV
    policy = DrivingPolicy(PolicyConfig(core=CoreConfig(core="gru")))
    policy.head = torch.nn.Linear(policy.core.out_dim, 5)
    policy.eval()
    frames = _frames(policy.encoder, 3)
    with torch.inference_mode():
        fast = [policy.select_action(frame.permute(1, 2, 0).numpy()) for frame in frames]
    assert policy.fused_head.ran and fused._FUSED_CONV == fusing
    assert not [w for w in recwarn if "fused" in str(w.message)]
    policy.reset()
    with kernels.disabled():
        assert [policy.select_action(frame.permute(1, 2, 0).numpy()) for frame in frames] == fast
    stack = fused.FusedLayers()
    with torch.inference_mode(), pytest.raises(RuntimeError):
        stack(policy.head, lambda: policy.head, torch.zeros(1, 3))   # a wrong input width
    assert fused._FUSED_CONV == fusing
