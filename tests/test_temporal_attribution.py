"""Which past frame mattered (nac_drive.interpret.temporal_attribution): a model that looks
only at the frame k steps ago gets all of its share there; the window file round-trips."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from nac_drive.interpret.archive import ArchiveError
from nac_drive.interpret.temporal_attribution import (FORMAT, WINDOW_FILE, WINDOW_METHODS, compute_window_attribution,
                                                      load_window_attribution, window_attribution)
from nac_drive.interpret.trace import RunRecorder, load_trace

torch.set_num_threads(1)
WINDOW, LAG = 6, 2


class LagCore(nn.Module):
    """A temporal core whose output at step i is the features of frame i - lag (0 before
    the window's start). ``stream_lag`` != lag makes its streaming disagree with its forward."""

    def __init__(self, dim: int, lag: int, stream_lag: int | None = None):
        super().__init__()
        self.lag, self.stream_lag, self.out_dim = lag, lag if stream_lag is None else stream_lag, dim

    def forward(self, x, t=None, return_trace=False):
        y = torch.zeros_like(x)
        y[:, self.lag:] = x[:, :x.shape[1] - self.lag]
        return y

    def init_state(self, batch: int):
        return []

    def step(self, x_t, state, t=None, return_trace=False):
        state = (state + [x_t])[-(self.stream_lag + 1):]
        return (state[0] if len(state) == self.stream_lag + 1 else torch.zeros_like(x_t)), state


def _lag_policy(stream_lag: int | None = None):
    from nac_drive.policy.cores import CoreConfig
    from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig

    policy = DrivingPolicy(PolicyConfig(core=CoreConfig(window=WINDOW, d_model=16, num_heads=2, topk=2)))
    torch.manual_seed(0)
    policy.core = LagCore(policy.config.feature_dim, LAG, stream_lag)
    policy.head = nn.Sequential(nn.Dropout(0.2), nn.Linear(policy.config.feature_dim, 5))
    return policy.eval()


def _record(run_dir, episodes=(5, 9), seed=0):
    """A run of synthetic road frames in episodes of the given lengths."""
    from support.synthetic_runs import road_frame

    rng = np.random.default_rng(seed)
    recorder = RunRecorder(run_dir)
    for i, length in enumerate(episodes):
        recorder.new_episode()
        for step in range(length):
            frame = road_frame(rng, offset=float(np.sin(0.7 * step + i)), curve=float(np.cos(0.3 * step)))
            recorder.add(frame, policy_action=np.array([0.0]), timestamp=0.02 * step)
    return recorder.save()


@pytest.mark.parametrize("method", WINDOW_METHODS)
def test_a_decision_owed_to_the_frame_k_steps_ago_puts_its_share_there(tmp_path, method):
    _record(tmp_path)
    run = load_trace(tmp_path)
    shares, gap, completeness = window_attribution(_lag_policy(), run, method=method, progress=False)
    assert shares.shape == (14, WINDOW) and shares.dtype == np.float32 and gap < 1e-5
    if method == "ablation":
        assert completeness is None
    else:   # every decision's attribution sums to its output's change from the black window, within 5%
        assert completeness["decisions"] == 14 and completeness["incomplete"] == 0
        assert completeness["ratio"]["max"] < 0.05 and completeness["steps"]["median"] >= 8
    for first, length in ((0, 5), (5, 9)):
        for a in range(length):
            row = shares[first + a]
            reach = min(a + 1, WINDOW)
            assert np.isnan(row[reach:]).all(), (first, a)            # before the episode's start: NaN
            if a < LAG:    # frame a - LAG does not exist: the output depends on no frame of the window
                np.testing.assert_array_equal(row[:reach], 0.0)
            else:
                np.testing.assert_allclose(row[:reach], np.eye(WINDOW)[LAG][:reach], atol=1e-4)


@pytest.mark.parametrize("method", WINDOW_METHODS)
def test_every_nth_step_attributed_is_what_attributing_all_gives_there(tmp_path, method):
    """--window-every 3: steps 0, 3, 6, ... carry the shares every step would (IG complete either
    way), the others NaN rows; the completeness counts the decisions attributed."""
    _record(tmp_path)
    run = load_trace(tmp_path)
    every, _, _ = window_attribution(_lag_policy(), run, method=method, progress=False)
    thinned, gap, completeness = window_attribution(_lag_policy(), run, method=method, progress=False, every=3)
    assert gap < 1e-5
    kept = np.arange(14) % 3 == 0
    np.testing.assert_allclose(thinned[kept], every[kept], atol=1e-4)      # NaN where NaN
    assert np.isnan(thinned[~kept]).all()
    if method != "ablation":
        assert completeness["decisions"] == kept.sum() == 5 and completeness["incomplete"] == 0
    with pytest.raises(ValueError, match="every"):
        window_attribution(_lag_policy(), run, method=method, progress=False, every=0)


def test_a_window_forward_that_is_not_what_streamed_is_refused(tmp_path):
    _record(tmp_path, episodes=(6,))
    with pytest.raises(ValueError, match="streaming output"):
        window_attribution(_lag_policy(stream_lag=1), tmp_path, method="ablation", progress=False)


def test_the_shipped_policys_window_forward_is_its_stream(tmp_path):
    """What the shares explain (the window forward at the last position) is what drove
    (step_output), for the shipped NAC policy and its window of 16 frames."""
    from nac_drive.policy.loading import load_driving_policy
    from support.synthetic_runs import road_frame

    policy = load_driving_policy().eval()
    W = policy.config.core.window
    assert W == 16 and policy.config.core.core == "nac"
    rng = np.random.default_rng(0)
    frames = [road_frame(rng, float(np.sin(0.2 * i)), float(np.cos(0.1 * i))) for i in range(W + 5)]
    policy.reset()
    streamed = [policy.step_output(f).clone() for f in frames]
    x = torch.stack([torch.from_numpy(f).permute(2, 0, 1) for f in frames]).float() / 255
    t = torch.arange(len(frames), dtype=torch.float32) * policy.config.frame_dt
    with torch.no_grad():
        for i in (3, W - 1, W + 4):
            lo = max(0, i - W + 1)
            windowed = policy(x[None, lo:i + 1], t[None, lo:i + 1])[0, -1]
            torch.testing.assert_close(windowed, streamed[i], atol=1e-5, rtol=1e-5)


def test_the_window_file_round_trips_and_refuses_another_trace(tmp_path):
    run_dir, other_dir = tmp_path / "run", tmp_path / "other"
    _record(run_dir)
    _record(other_dir, seed=1)
    path = compute_window_attribution(_lag_policy(), run_dir, method="ablation", progress=False)
    assert path == run_dir / WINDOW_FILE
    run = load_trace(run_dir)
    loaded = load_window_attribution(run_dir, trace=run)
    expected, _, _ = window_attribution(_lag_policy(), run, method="ablation", progress=False)
    np.testing.assert_array_equal(loaded.shares, expected)           # NaN where NaN
    meta = loaded.metadata
    assert (meta["format"], meta["version"], meta["num_steps"], meta["method"], meta["window"], meta["every"]) == \
        (FORMAT, 1, 14, "ablation", WINDOW, 1)
    assert meta["trace_sha256"] == run.sha256 and loaded.window == WINDOW
    with np.load(path, allow_pickle=False) as plain:                  # a plain npz: no pickles
        assert plain["shares"].shape == (14, WINDOW)
    with pytest.raises(ArchiveError, match="another trace"):
        load_window_attribution(path, trace=load_trace(other_dir))
    with pytest.raises(ValueError, match="method"):
        window_attribution(_lag_policy(), run, method="attention", progress=False)


def test_a_steering_policys_window_shares(tmp_path):
    """Udacity (regression, PilotNet frames cropped from the camera's): shares over its window."""
    from support.synthetic_runs import make_synthetic_run
    from support.udacity_test_policies import untrained_udacity_policy

    make_synthetic_run(tmp_path, steps=5, frame_size=(160, 320), with_saliency=False)
    policy = untrained_udacity_policy()
    shares, gap, _ = window_attribution(policy, tmp_path, method="ablation", progress=False)
    W = policy.config.core.window
    assert shares.shape == (5, W) and gap < 1e-4
    np.testing.assert_allclose(np.nansum(shares, axis=1), 1.0, atol=1e-5)
    assert np.isnan(shares[2, 3:]).all() and np.isfinite(shares[2, :3]).all()
