"""Grad-CAM saliency (nac_drive.interpret.saliency): the map follows the salient object."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch import nn

from nac_drive.interpret.saliency import (compute_run_saliency, last_conv2d, load_saliency, overlay, saliency_maps,
                                          steering_saliency)
from nac_drive.interpret.trace import RunRecorder, load_trace

SIZE = 32


def _frames(sides: list[int], seed: int) -> torch.Tensor:
    """Dark noisy frames [B, 3, 32, 32] with a bright 8x8 'road patch' on the left (0), on the
    right (1) or nowhere (2)."""
    g = torch.Generator().manual_seed(seed)
    x = 0.15 * torch.rand(len(sides), 3, SIZE, SIZE, generator=g)
    for b, side in enumerate(sides):
        if side == 2:
            continue
        top = int(torch.randint(2, SIZE - 10, (1,), generator=g))
        left = int(torch.randint(1, 7, (1,), generator=g)) + (SIZE // 2 + 2 if side else 0)
        x[b, :, top:top + 8, left:left + 8] = 0.9
    return x


class TinyCNN(nn.Module):
    """conv -> conv -> global average pool -> linear. An extra input channel, brightness
    times the x coordinate, lets channels encode "bright on the left / right" while the
    read-out stays position-free: the setting Grad-CAM's pooled gradients assume."""

    def __init__(self, outputs: int):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(4, 8, 3, stride=2, padding=1), nn.ReLU(),
                                      nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.ReLU())
        self.head = nn.Linear(8, outputs)

    def forward(self, x):
        coord = torch.linspace(-1, 1, x.shape[-1]).expand(x.shape[0], 1, x.shape[-2], -1)
        return self.head(self.features(torch.cat([x, x.mean(1, keepdim=True) * coord], 1)).mean((2, 3)))


def _train(regression: bool) -> TinyCNN:
    """A few seeded Adam steps. Frames without a patch (class "none", steering 0) make
    the model look for positive evidence of each side rather than the absence of the
    other one, as a driving model must see the road to steer towards it."""
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model = TinyCNN(1 if regression else 3)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(60):
        sides = torch.randint(0, 3, (32,), generator=torch.Generator().manual_seed(step)).tolist()
        x, y = _frames(sides, seed=1000 + step), torch.tensor(sides)
        out = model(x)
        steer = torch.tensor([-1.0, 1.0, 0.0])[y]
        loss = (nn.functional.mse_loss(out[:, 0], steer) if regression
                else nn.functional.cross_entropy(out, y))
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.set_num_threads(threads)
    return model


@pytest.fixture(scope="module")
def classifier():
    return _train(regression=False)


@pytest.fixture(scope="module")
def regressor():
    return _train(regression=True)


def _centre_x(maps: np.ndarray) -> np.ndarray:
    """Horizontal centre of mass of each map [B, H, W], in pixels."""
    xs = np.arange(maps.shape[2])
    return (maps.sum(1) * xs).sum(1) / maps.sum((1, 2))


LEFT, RIGHT = [0] * 10, [1] * 10


@pytest.mark.parametrize("method", ["gradcam", "gradcam++"])
def test_classification_map_follows_the_patch(classifier, method):
    left, right = _frames(LEFT, seed=7), _frames(RIGHT, seed=8)
    assert (classifier(left).argmax(1) == 0).all() and (classifier(right).argmax(1) == 1).all()
    maps_l = saliency_maps(classifier, left, target="predicted", method=method)
    maps_r = saliency_maps(classifier, right, target="predicted", method=method)
    assert maps_l.shape == (10, SIZE, SIZE) and maps_l.min() >= 0 and maps_l.max() <= 1
    assert (maps_l.reshape(10, -1).std(1) > 0.05).all() and (maps_r.reshape(10, -1).std(1) > 0.05).all()
    assert (_centre_x(maps_l) < SIZE / 2).all() and (_centre_x(maps_r) > SIZE / 2).all()
    # an explicit class index is the same target as the predicted one here
    np.testing.assert_allclose(saliency_maps(classifier, left, target=0, method=method), maps_l, atol=1e-6)


@pytest.mark.parametrize("method", ["gradcam", "gradcam++"])
def test_steering_map_follows_the_patch(regressor, method):
    left, right = _frames(LEFT, seed=7), _frames(RIGHT, seed=8)
    assert (regressor(left)[:, 0] < 0).all() and (regressor(right)[:, 0] > 0).all()
    right_pos, _ = steering_saliency(regressor, right, method=method)   # evidence for steering right
    _, left_neg = steering_saliency(regressor, left, method=method)     # evidence for steering left
    assert (right_pos.reshape(10, -1).std(1) > 0.05).all() and (left_neg.reshape(10, -1).std(1) > 0.05).all()
    assert (_centre_x(left_neg) < SIZE / 2).all() and (_centre_x(right_pos) > SIZE / 2).all()
    # "steer" picks the direction the model steers: the same maps
    taken = saliency_maps(regressor, torch.cat([left, right]), target="steer", method=method)
    np.testing.assert_allclose(taken, np.concatenate([left_neg, right_pos]), atol=1e-5)


def test_eigencam_map_moves_with_the_patch(classifier):
    left, right = _frames(LEFT, seed=7), _frames(RIGHT, seed=8)
    maps_l = saliency_maps(classifier, left, method="eigencam")
    maps_r = saliency_maps(classifier, right, method="eigencam")
    assert (maps_l.reshape(10, -1).std(1) > 0.05).all()
    assert np.abs(_centre_x(maps_l) - _centre_x(maps_r)).mean() > SIZE / 8


def test_never_uses_flip_augmentation(classifier, monkeypatch):
    from pytorch_grad_cam.base_cam import BaseCAM

    def forbidden(*a, **k):
        raise AssertionError("aug_smooth mirrors the frame: steering meaning reversed")

    monkeypatch.setattr(BaseCAM, "forward_augmentation_smoothing", forbidden)
    for method in ("gradcam", "gradcam++", "eigencam"):
        saliency_maps(classifier, _frames([0, 1], seed=3), method=method)


class _Wrapper(nn.Module):
    """Like a policy's frame model: a fresh wrapper (train mode) around an eval-mode policy."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)


def test_named_target_layer_and_modes_restored(classifier):
    assert last_conv2d(classifier) is classifier.features[2]
    classifier.eval()
    wrapper = _Wrapper(classifier)
    assert wrapper.training
    first = saliency_maps(wrapper, _frames([0], seed=3), target_layer="inner.features.0")
    assert wrapper.training and not classifier.training and not classifier.features.training
    last = saliency_maps(wrapper, _frames([0], seed=3), target_layer=classifier.features[2])
    assert first.shape == last.shape and not np.allclose(first, last)
    assert all(p.grad is None for p in classifier.parameters())


def test_bad_arguments_are_named(classifier):
    x = _frames([0], seed=3)
    with pytest.raises(ValueError, match="method"):
        saliency_maps(classifier, x, method="gradcam-flip")
    with pytest.raises(ValueError, match="target"):
        saliency_maps(classifier, x, target="left")
    with pytest.raises(ValueError, match="target"):
        saliency_maps(classifier, x, target=5)
    with pytest.raises(ValueError, match="target_layer"):
        saliency_maps(classifier, x, target_layer="features.9")
    with pytest.raises(ValueError, match="target_layer"):
        saliency_maps(nn.Sequential(nn.Flatten(), nn.Linear(3 * SIZE * SIZE, 2)), x)
    with pytest.raises(ValueError, match="frames"):
        saliency_maps(classifier, x[0])


def test_overlay_blends_a_colormap_where_the_map_is_hot():
    frame = np.full((40, 60, 3), 128, np.uint8)
    m = np.zeros((10, 10), np.float32)
    m[:, 5:] = 1.0                                                     # hot on the right half
    out = overlay(frame, m, alpha=0.5)
    assert out.shape == frame.shape and out.dtype == np.uint8
    left, right = out[:, :25].astype(int), out[:, 35:].astype(int)
    assert right[..., 0].mean() > left[..., 0].mean() + 40               # jet: red where hot, blue where cold
    assert left[..., 2].mean() > right[..., 2].mean() + 40
    with pytest.raises(ValueError, match="frame"):
        overlay(frame.astype(np.float32), m)


def test_run_saliency_file(classifier, tmp_path):
    sides = [0, 1, 1, 0]
    x = _frames(sides, seed=11)
    rec = RunRecorder(tmp_path)
    for i in range(len(sides)):
        frame = np.uint8(np.round(x[i].permute(1, 2, 0).numpy() * 255))
        rec.add(frame=frame, policy_action=sides[i], timestamp=float(i))
    rec.save()
    calls = []

    def model_for_step(i):
        calls.append(i)
        return classifier

    path = compute_run_saliency(tmp_path, model_for_step, target="predicted", progress=False)
    sal = load_saliency(tmp_path, load_trace(tmp_path))
    assert path.name == "saliency.npz" and calls == [0, 1, 2, 3]
    assert sal.maps.shape == (4, SIZE, SIZE) and sal.metadata["target_layer"] == "features.2"
    centres = _centre_x(sal.maps.astype(np.float32))
    assert [int(c > SIZE / 2) for c in centres] == sides
    assert sal.overlay(2).shape == (SIZE, SIZE, 3)
    # the run records one step more: its trace has a new chunk: not the one the saliency was computed from
    rec.add(frame=frame, policy_action=0, timestamp=4.0)
    rec.save()
    from nac_drive.interpret.archive import ArchiveError
    with pytest.raises(ArchiveError, match="computed from another trace "):
        load_saliency(tmp_path, load_trace(tmp_path))


def test_the_readme_recipe_is_the_packages_saliency():
    """README: Grad-CAM from Python on policy.frame_model() and policy.encoder.last_conv with
    pytorch-grad-cam's own classes gives the maps `nac-drive saliency` computes, bit for bit."""
    from pytorch_grad_cam import GradCAM
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    from nac_drive.policy.cores import CoreConfig
    from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig

    policy = DrivingPolicy(PolicyConfig(core=CoreConfig(window=4, d_model=16, num_heads=2, topk=2))).eval()
    frames = torch.randint(0, 256, (5, 96, 96, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(4))
    for frame in frames[:4]:
        policy.select_action(frame.numpy())                  # the window so far
    x = frames[4:].permute(0, 3, 1, 2).float() / 255          # the next frame [1, 3, 96, 96]
    model = policy.frame_model()
    assert last_conv2d(model) is policy.encoder.last_conv
    action = int(model(x).argmax())
    cam = GradCAM(model=model, target_layers=[policy.encoder.last_conv])
    maps = cam(input_tensor=x, targets=[ClassifierOutputTarget(action)])
    cam.activations_and_grads.release()
    ours = saliency_maps(model, x, target="predicted")
    assert maps.shape == ours.shape == (1, 96, 96) and maps.std() > 0.05
    np.testing.assert_array_equal(ours, maps)
    assert not np.array_equal(saliency_maps(model, x, target=(action + 1) % 5), ours)   # the target matters


def test_overlay_keeps_the_frames_brightness_where_show_cam_on_image_does_not():
    """Why overlay() is not pytorch-grad-cam's show_cam_on_image: that one divides the blend
    by its brightest pixel, so a map with no evidence brightens the whole frame."""
    import cv2
    from pytorch_grad_cam.utils.image import show_cam_on_image

    frame = np.random.default_rng(0).integers(0, 200, (96, 96, 3), dtype=np.uint8)
    cold = np.zeros((12, 12), np.float32)
    blue = cv2.applyColorMap(np.zeros((1, 1), np.uint8), cv2.COLORMAP_JET)[0, 0, ::-1].astype(float)   # RGB
    expected = np.round(0.55 * frame + 0.45 * blue)                     # the plain blend, per pixel
    np.testing.assert_allclose(overlay(frame, cold, alpha=0.45), expected, atol=1)   # 1: float32 rounding
    theirs = show_cam_on_image(frame.astype(np.float32) / 255, np.zeros((96, 96), np.float32), use_rgb=True,
                               image_weight=0.55)
    assert np.abs(theirs.astype(float) - expected).max() > 20


def _recorded_run(run_dir):
    rng = np.random.default_rng(0)
    with RunRecorder(run_dir) as rec:
        for _ in range(3):
            rec.add(rng.integers(0, 255, (96, 96, 3), dtype=np.uint8), policy_action=0)
    return run_dir


def _saliency_refused_before_computing(run_dir, monkeypatch, capsys) -> str:
    from nac_drive.cli.main import main
    from nac_drive.interpret import saliency

    monkeypatch.setattr(saliency, "saliency_maps",
                        lambda *a, **k: pytest.fail("saliency was computed for an output it cannot write"))
    assert main(["saliency", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    return err[0]


def test_saliency_refuses_an_output_that_is_a_folder_before_computing(tmp_path, monkeypatch, capsys):
    run = _recorded_run(tmp_path / "run")
    (run / "saliency.npz").mkdir()
    assert "saliency.npz: is a folder" in _saliency_refused_before_computing(run, monkeypatch, capsys)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a read-only tmpfs needs root")
def test_saliency_refuses_a_read_only_run_folder_before_computing(tmp_path, monkeypatch, capsys):
    """Issue 44: saliency computed for 11 s before finding its output folder read-only."""
    import shutil
    import subprocess

    run = _recorded_run(tmp_path / "run")
    mount = tmp_path / "ro"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], check=True)
    try:
        shutil.copytree(run, mount, dirs_exist_ok=True)
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        line = _saliency_refused_before_computing(mount, monkeypatch, capsys)
        assert f"{mount}: cannot write there (Read-only file system)" in line
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_the_replay_feeds_a_frame_drop_runs_frames_at_their_recorded_times(tmp_path):
    """Under --perturb frame-drop the trace holds only the frames that arrived, irregularly
    apart: Grad-CAM's frame model of step i must be the policy that saw those frames at
    those times, not at one frame period each."""
    from nac_drive.policy.loading import load_driving_policy
    from nac_drive.interpret.policy_saliency import Replay, model_input
    from nac_drive.pipeline.drive import DriveArgs, drive_carracing

    drive = drive_carracing(DriveArgs(episodes=1, max_steps=40, perturb="frame-drop=0.5", trace=str(tmp_path / "run")),
                            progress=False)
    run = load_trace(drive["trace"])
    gaps = np.diff(run.timestamp)
    assert run.num_steps < 40 and gaps.max() > gaps.min()   # frames dropped: irregular time
    policy, reference = load_driving_policy(None), load_driving_policy(None)
    replay = Replay(policy, run)
    for i in range(run.num_steps):
        with torch.no_grad():
            out = replay.frame_model_for_step(i)(model_input(policy, run.frame(i))[None])[0]
        expected = reference.step_output({"image": run.frame(i), "timestamp": float(run.timestamp[i])})
        torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
