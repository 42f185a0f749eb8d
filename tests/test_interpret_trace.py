"""Run recorder and loader (nac_drive.interpret.trace) on traces of a real NAC layer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import zipfile

import numpy as np
import pytest
import torch

from nac_drive import NAC
from nac_drive.interpret.archive import ArchiveError, write_archive
from nac_drive.interpret.trace import RunRecorder, load_trace

WINDOW, TOPK = 5, 3


def _layer(**kw) -> NAC:
    torch.manual_seed(0)
    kw = {"d_model": 8, "num_heads": 2, "topk": TOPK, "causal": True, "window": WINDOW, "seed": 3, **kw}
    return NAC(6, **kw).eval()


def _record(tmp_path, steps: int = 9, layer: NAC | None = None, episodes: int = 1):
    """Step a real NAC over random inputs; returns (recorder, raw traces, frames)."""
    layer = layer or _layer()
    rng = np.random.default_rng(1)
    rec = RunRecorder(tmp_path / "run", metadata={"policy": {"core": "nac"}, "seed": 7}, nac=layer,
                      action_names=["steer", "gas"], jpeg_quality=95)
    traces, frames = [], []
    with torch.no_grad():
        for e in range(episodes):
            rec.new_episode()
            cache = layer.init_cache(1)
            for i in range(steps):
                _, cache, trace = layer.step(torch.randn(1, 6), cache, return_trace=True)
                # Smooth frames: JPEG keeps them within a few grey levels.
                frame = np.full((24, 32, 3), rng.integers(30, 220, size=3), dtype=np.uint8)
                expert = None if i % 3 == 0 else np.array([0.1 * i, 0.5])
                rec.add(frame=frame, policy_action=np.array([0.2 * i, 0.3]), expert_action=expert,
                        reward=None if i == 2 else float(i), cross_track_error=0.01 * i, nac_trace=trace,
                        timestamp=0.05 * (e * steps + i))
                traces.append((i, trace))
                frames.append(frame)
    return rec, traces, frames


def test_round_trip_preserves_values_and_derives_key_age_and_pair_reductions(tmp_path):
    layer = _layer()
    rec, traces, frames = _record(tmp_path, layer=layer)
    run = load_trace(rec.save().parent)

    assert run.num_steps == len(traces)
    assert run.metadata["run"] == {"policy": {"core": "nac"}, "seed": 7}
    assert run.metadata["nac"]["groups"] == dict(zip(("inter", "command", "motor"), layer.backbone_wiring.sizes),
                                                 sensory=2 * layer.depth)
    np.testing.assert_array_equal(run.wiring["wiring_q"], layer.q_gate.mask.numpy().astype(np.uint8))
    np.testing.assert_array_equal(run.wiring["wiring_inter_to_command"], layer.backbone_wiring.inter_to_command)
    for n, (step, tr) in enumerate(traces):
        assert np.abs(run.frame(n).astype(int) - frames[n]).max() <= 3
        np.testing.assert_allclose(run.q[n], tr.q[0, 0].numpy(), rtol=1e-6)
        np.testing.assert_allclose(run.v[n], tr.v[0, 0].numpy(), rtol=1e-6)
        idx = tr.topk_idx[0, :, 0].numpy()
        for h in range(layer.num_heads):
            valid = [j for j in range(idx.shape[1]) if idx[h, j] >= 0]
            # key age: frames ago, -1 for an empty slot; within the causal window
            expected_age = [step - idx[h, j] if idx[h, j] >= 0 else -1 for j in range(idx.shape[1])]
            assert run.key_age[n, h].tolist() == expected_age
            assert all(0 <= a < WINDOW for a in run.key_age[n, h] if a >= 0)
            assert len(valid) == min(step + 1, TOPK)
            # mean over the valid selected pairs, and the top-weighted pair, computed directly
            w = tr.weights[0, h, 0]
            top = max(valid, key=lambda j: float(w[j]))
            for group in ("inter", "command", "motor"):
                x = getattr(tr, group)[0, h, 0]                                   # [K, n]
                direct_mean = torch.stack([x[j] for j in valid]).mean(0).numpy()
                np.testing.assert_allclose(getattr(run, f"{group}_mean")[n, h], direct_mean, rtol=1e-5, atol=1e-6)
                np.testing.assert_allclose(getattr(run, f"{group}_top")[n, h], x[top].numpy(), rtol=1e-6)
            for j in range(idx.shape[1]):
                if idx[h, j] >= 0:
                    assert run.phi[n, h, j] == pytest.approx(float(tr.phi[0, h, 0, j]), rel=1e-6)
                    assert run.tau[n, h, j] == pytest.approx(float(tr.tau[0, h, 0, j]), rel=1e-6)
                else:
                    assert np.isnan(run.phi[n, h, j]) and run.weights[n, h, j] == 0
    # actions / reward / expert: NaN exactly where unknown
    np.testing.assert_allclose(run.policy_action[:, 0], 0.2 * np.arange(9), rtol=1e-6)
    assert np.isnan(run.expert_action[::3]).all() and not np.isnan(run.expert_action[1::3]).any()
    assert np.isnan(run.reward[2]) and run.reward[3] == 3.0
    assert run.metadata["action_names"] == ["steer", "gas"]


def test_file_is_plain_npz_without_pickles(tmp_path):
    rec, _, _ = _record(tmp_path, steps=3)
    path = rec.save()
    with np.load(path, allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    assert b'"format": "nac-drive-trace"' in arrays.pop("metadata.json")
    assert not any(a.dtype.hasobject for a in arrays.values())
    assert {"q", "inter_mean", "motor_top", "key_age", "frames_jpeg", "frame_offsets"} <= set(arrays)


def test_new_episode_restarts_key_ages(tmp_path):
    rec, traces, _ = _record(tmp_path, steps=4, episodes=2)
    run = load_trace(rec.save())
    assert run.episode.tolist() == [0] * 4 + [1] * 4
    assert run.nac_step.tolist() == [0, 1, 2, 3] * 2
    assert run.key_age[4].max() == 0          # first step of episode 2 only sees itself
    assert (run.key_age[7][run.key_age[7] >= 0] <= 3).all()


def test_layer_without_window_pads_growing_k(tmp_path):
    layer = _layer(select="all", window=None)
    rec, traces, _ = _record(tmp_path, steps=5, layer=layer)
    run = load_trace(rec.save())
    assert run.weights.shape[-1] == 5                       # K grew to 5 keys
    assert (run.key_age[0] >= 0).sum(-1).tolist() == [1, 1]
    assert sorted(run.key_age[4, 0].tolist()) == [0, 1, 2, 3, 4]
    np.testing.assert_allclose(np.nansum(run.weights, -1), 1.0, rtol=1e-5)


def test_run_without_nac_traces(tmp_path):
    rec = RunRecorder(tmp_path)
    for i in range(3):
        rec.add(frame=np.zeros((8, 8, 3), np.uint8), policy_action=i, timestamp=float(i))
    run = load_trace(rec.save())
    assert run.q.shape == (3, 0) and run.key_age.shape == (3, 0, 0) and not run.has_nac.any()
    assert run.policy_action[:, 0].tolist() == [0, 1, 2] and run.expert_action.shape == (3, 0)


def test_bad_inputs_name_the_argument(tmp_path):
    rec = RunRecorder(tmp_path)
    with pytest.raises(ValueError, match="frame"):
        rec.add(frame=np.zeros((8, 8), np.uint8), policy_action=0)
    with pytest.raises(ValueError, match="frame"):
        rec.add(frame=np.zeros((8, 8, 3), np.float32), policy_action=0)
    with pytest.raises(ValueError, match="metadata"):
        RunRecorder(tmp_path, metadata={"x": object()})
    layer = _layer()
    _, _, trace = layer.step(torch.randn(1, 6), layer.init_cache(1), return_trace=True)
    with pytest.raises(ValueError, match="topk_idx"):   # a key later than the query: counters out of sync
        RunRecorder(tmp_path).add(frame=np.zeros((8, 8, 3), np.uint8), policy_action=0, nac_trace=trace,
                                  nac_step=-1)
    _, _, batch2 = layer.step(torch.randn(2, 6), layer.init_cache(2), return_trace=True)
    with pytest.raises(ValueError, match="batch 1"):
        RunRecorder(tmp_path).add(frame=np.zeros((8, 8, 3), np.uint8), policy_action=0, nac_trace=batch2)


# ------------------------------------------------------------------ corrupt files
@pytest.fixture()
def saved(tmp_path):
    rec, _, _ = _record(tmp_path, steps=4)
    return rec, rec.save()


def test_truncated_file_names_the_file(saved):
    _, path = saved
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ArchiveError, match=str(path)):
        load_trace(path)


def test_missing_file_names_the_file(tmp_path):
    with pytest.raises(ArchiveError, match="no such file"):
        load_trace(tmp_path / "nothing")


def test_corrupt_member_names_the_field(saved):
    _, path = saved
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("tau.npy")
    raw = bytearray(path.read_bytes())
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)   # local header -> data
    for j in range(start + 8, start + info.compress_size - 4):
        raw[j] ^= 0x5A
    path.write_bytes(bytes(raw))
    with pytest.raises(ArchiveError, match=r"field 'tau'"):
        load_trace(path)


@pytest.mark.parametrize("change, field", [
    (lambda a: a.update(phi=a["phi"][:, :1]), "phi"),                        # K disagrees with weights
    (lambda a: a.update(q=a["q"][:-1]), "q"),                                # N disagrees
    (lambda a: a.pop("key_age"), "key_age"),                                 # missing member
    (lambda a: a.update(timestamp=a["timestamp"].astype(np.int64)), "timestamp"),
    (lambda a: a.update(frame_offsets=a["frame_offsets"][::-1].copy()), "frame_offsets"),
])
def test_mismatched_member_names_the_field(saved, change, field):
    rec, path = saved
    arrays = rec.arrays()
    change(arrays)
    with np.load(path, allow_pickle=False) as npz:
        import json
        meta = json.loads(npz["metadata.json"])
    write_archive(path, arrays, meta)
    with pytest.raises(ArchiveError, match=rf"{path}: field '{field}'"):
        load_trace(path)


def test_wrong_version_and_pickled_member(saved):
    rec, path = saved
    with np.load(path, allow_pickle=False) as npz:
        import json
        meta = json.loads(npz["metadata.json"])
    write_archive(path, rec.arrays(), {**meta, "version": 99})
    with pytest.raises(ArchiveError, match=r"field 'metadata.json'.*version 99"):
        load_trace(path)
    # An object array (pickle) in place of a member is refused, naming it.
    with zipfile.ZipFile(path, "w") as zf:
        for name, a in rec.arrays().items():
            with zf.open(f"{name}.npy", "w") as m:
                np.lib.format.write_array(m, np.array([{"evil": 1}], dtype=object) if name == "timestamp" else a,
                                          allow_pickle=True)
        zf.writestr("metadata.json", json.dumps(meta))
    with pytest.raises(ArchiveError, match=r"field 'timestamp'"):
        load_trace(path)


# ------------------------------------------------------------------ kill safety
_WRITER = textwrap.dedent("""
    import sys, time
    import numpy as np
    import nac_drive.interpret.archive as archive
    from nac_drive.interpret.trace import RunRecorder

    rec = RunRecorder(sys.argv[1])
    rng = np.random.default_rng(0)
    def add(n):
        for _ in range(n):
            rec.add(frame=rng.integers(0, 255, (32, 32, 3), dtype=np.uint8), policy_action=[0.0],
                    timestamp=float(len(rec)))
    add(50)
    rec.save()
    # From now on every member takes a while to write, so the kill lands mid-file.
    write_array = np.lib.format.write_array
    def slow(*a, **k):
        time.sleep(0.2)
        return write_array(*a, **k)
    np.lib.format.write_array = slow
    print("saved", flush=True)
    while True:
        add(10)
        rec.save()
""")


def test_killed_writer_leaves_the_previous_file_intact(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "saved"
        deadline = time.time() + 30
        while not list(tmp_path.glob(".trace.npz.*.tmp")):          # a second save is under way
            assert time.time() < deadline, "the writer never started a second save"
            time.sleep(0.01)
        time.sleep(0.3)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert list(tmp_path.glob(".trace.npz.*.tmp")), "the kill did not land mid-write"
    run = load_trace(tmp_path)                                       # the previous complete file
    assert run.num_steps == 50
    assert len(run.frame_offsets) == 51 and run.frame(49).shape == (32, 32, 3)


def test_attention_entropy_is_relative_to_the_selected_keys():
    from nac_drive.interpret.trace import attention_entropy

    valid = np.array([[True] * 4, [True] * 4, [True, True, False, False], [True, False, False, False]])
    weights = np.array([[0.25] * 4, [1.0, 0, 0, 0], [0.5, 0.5, 0, 0], [1.0, 0, 0, 0]])
    got = attention_entropy(weights, valid)
    np.testing.assert_allclose(got[:3], [1.0, 0.0, 1.0], atol=1e-12)
    assert np.isnan(got[3])                              # one key: no choice to measure
    # weights e times apart (the most exact mode allows) are still close to uniform
    skewed = np.exp([1.0, 0, 0, 0]) / np.exp([1.0, 0, 0, 0]).sum()
    assert 0.9 < attention_entropy(skewed, np.ones(4, bool)) < 1.0
