"""Run recorder and loader (nac_drive.interpret.trace) on traces of a real NAC layer."""

from __future__ import annotations

import hashlib
import json
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
from nac_drive.interpret.trace import RunRecorder, load_trace, reduce_nac_trace

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
    path = rec.save() / "chunk-000000.npz"
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


def test_a_bfloat16_layer_trace_is_recorded_as_float32(tmp_path):
    """A policy moved to bfloat16 streams bfloat16 traces (numpy has no such dtype): the
    recorder and the live view's reduction read them as float32."""
    layer = _layer()
    with torch.no_grad():
        _, _, trace = layer.step(torch.randn(1, 6), layer.init_cache(1), return_trace=True)
        _, _, half = layer.to(torch.bfloat16).step(torch.randn(1, 6).bfloat16(), layer.init_cache(1),
                                                   return_trace=True)
    assert half.q.dtype == torch.bfloat16
    reduced = reduce_nac_trace(half, 0)
    assert reduced["q"].dtype == np.float32 and np.allclose(reduced["q"], half.q.float().numpy()[0, 0])
    with RunRecorder(tmp_path) as rec:
        for t in (trace, half):
            rec.new_episode()
            rec.add(frame=np.zeros((8, 8, 3), np.uint8), policy_action=0, nac_trace=t)
    run = load_trace(tmp_path)
    assert run.q.dtype == np.float32 and np.array_equal(run.q[1], reduced["q"])


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
    """A recorded run of one chunk: (its arrays, its metadata, the chunk's path)."""
    rec, _, _ = _record(tmp_path, steps=4)
    path = rec.save() / "chunk-000000.npz"
    arrays, meta = _members(path)
    return arrays, meta, path


def _members(path):
    """A chunk's arrays and metadata, as np.load reads them."""
    with np.load(path, allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files if name != "metadata.json"}
        return arrays, json.loads(npz["metadata.json"])


def test_truncated_file_names_the_file(saved):
    *_, path = saved
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ArchiveError, match=str(path)):
        load_trace(path)


def test_missing_file_names_the_file(tmp_path):
    with pytest.raises(ArchiveError, match="no such file"):
        load_trace(tmp_path / "nothing")


def test_corrupt_member_names_the_field(saved):
    *_, path = saved
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
    arrays, meta, path = saved
    change(arrays)
    write_archive(path, arrays, meta)
    with pytest.raises(ArchiveError, match=rf"{path}: field '{field}'"):
        load_trace(path)


def test_wrong_version_and_pickled_member(saved):
    arrays, meta, path = saved
    write_archive(path, arrays, {**meta, "version": 99})
    with pytest.raises(ArchiveError, match=r"field 'metadata.json'.*version 99"):
        load_trace(path)
    # An object array (pickle) in place of a member is refused, naming it.
    with zipfile.ZipFile(path, "w") as zf:
        for name, a in arrays.items():
            with zf.open(f"{name}.npy", "w") as m:
                np.lib.format.write_array(m, np.array([{"evil": 1}], dtype=object) if name == "timestamp" else a,
                                          allow_pickle=True)
        zf.writestr("metadata.json", json.dumps(meta))
    with pytest.raises(ArchiveError, match=r"field 'timestamp'"):
        load_trace(path)


# ------------------------------------------------------------------ chunks: appended, never rewritten
def _feed(rec: RunRecorder, layer: NAC) -> None:
    """An episode of 3 steps without NAC trace or expert, then one of 6 with both (some
    experts unknown) on a layer that selects more keys as its cache grows (K: 1 .. 6)."""
    rng = np.random.default_rng(2)
    torch.manual_seed(2)
    frame = lambda: np.full((16, 16, 3), rng.integers(30, 220, size=3), dtype=np.uint8)  # noqa: E731
    for i in range(3):
        rec.add(frame=frame(), policy_action=[0.1 * i, 0.0], reward=1.0, timestamp=float(i))
    rec.new_episode()
    cache = layer.init_cache(1)
    with torch.no_grad():
        for i in range(6):
            _, cache, trace = layer.step(torch.randn(1, 6), cache, return_trace=True)
            rec.add(frame=frame(), policy_action=[0.2 * i, 1.0], expert_action=None if i < 2 else [0.5, 0.1 * i],
                    nac_trace=trace, timestamp=float(i))


def _fields(run) -> dict[str, np.ndarray]:
    from nac_drive.interpret.trace import NAC_FIELDS

    names = ("frames_jpeg", "frame_offsets", "timestamp", "episode", "policy_action", "expert_action", "reward",
             "cross_track_error", "has_nac", "nac_step", *NAC_FIELDS)
    return {name: getattr(run, name) for name in names}


@pytest.mark.parametrize("chunk_steps", [1, 2, 4])
def test_a_trace_of_many_chunks_loads_as_the_same_run_as_one_chunk(tmp_path, chunk_steps):
    layer = _layer(select="all", window=None)
    whole, chunked = RunRecorder(tmp_path / "one", nac=layer), RunRecorder(tmp_path / "many", nac=layer,
                                                                           chunk_steps=chunk_steps)
    _feed(whole, layer)
    _feed(chunked, layer)
    one, many = load_trace(whole.save()), load_trace(chunked.save())
    assert len(list((tmp_path / "many" / "trace").glob("chunk-*.npz"))) == -(-9 // chunk_steps)
    assert len(list((tmp_path / "one" / "trace").glob("chunk-*.npz"))) == 1
    assert one.weights.shape == (9, 2, 6) and one.expert_action.shape == (9, 2)   # K and E from later steps
    for name, a in _fields(one).items():
        np.testing.assert_array_equal(getattr(many, name), a, err_msg=name)
        assert getattr(many, name).dtype == a.dtype, name
    assert many.metadata["num_steps"] == 9 and many.metadata["frame_shape"] == [16, 16, 3]
    np.testing.assert_array_equal(many.wiring["wiring_q"], one.wiring["wiring_q"])
    assert many.sha256 != one.sha256                     # the identity is over the chunks


def test_a_new_chunk_leaves_the_earlier_ones_untouched(tmp_path):
    rec = RunRecorder(tmp_path, chunk_steps=4)
    frame = np.zeros((8, 8, 3), np.uint8)
    for i in range(4):
        rec.add(frame=frame, policy_action=i)
    first = rec.path / "chunk-000000.npz"
    assert rec.pending == 0                              # add handed the chunk to the writer
    rec.save()                                           # which save waits for (nothing new to write)
    assert first.is_file()
    before = (first.stat().st_ino, first.stat().st_mtime_ns, first.read_bytes())
    time.sleep(0.01)
    for i in range(9):
        rec.add(frame=frame, policy_action=4 + i)
    rec.save()
    assert sorted(p.name for p in rec.path.iterdir()) == [f"chunk-00000{i}.npz" for i in range(4)]
    assert (first.stat().st_ino, first.stat().st_mtime_ns, first.read_bytes()) == before
    run = load_trace(tmp_path)
    assert run.policy_action[:, 0].tolist() == list(range(13)) and run.metadata["chunks"] == 4
    digests = [hashlib.sha256(p.read_bytes()).digest() for p in sorted(rec.path.iterdir())]
    assert run.sha256 == hashlib.sha256(b"".join(digests)).hexdigest()


def test_the_recorder_holds_at_most_one_chunk_of_steps(tmp_path):
    import gc
    import tracemalloc

    layer = _layer()
    rec = RunRecorder(tmp_path, nac=layer, chunk_steps=20)
    cache, held, retained = layer.init_cache(1), [], []
    frame = np.zeros((48, 48, 3), np.uint8)
    tracemalloc.start()
    try:
        with torch.no_grad():
            for i in range(400):
                _, cache, trace = layer.step(torch.randn(1, 6), cache, return_trace=True)
                rec.add(frame=frame, policy_action=[0.0], nac_trace=trace)
                held.append(rec.pending)
                if i in (59, 399):   # a chunk was just handed over: wait until it is written (save adds none)
                    del trace
                    rec.save()
                    gc.collect()     # (which also empties CPython's free lists of tuples, dicts, ...)
                    retained.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    assert max(held) == 19 and held[19] == 0 and len(rec) == 400
    # 340 steps more recorded, no more memory held (every step in RAM would be ~340 x 4 kB more)
    assert retained[1] - retained[0] < 200_000, retained


def test_metadata_added_after_the_last_chunk_is_written_in_an_empty_one(tmp_path):
    rec = RunRecorder(tmp_path, metadata={"env": "x"}, chunk_steps=2)
    for i in range(4):
        rec.add(frame=np.zeros((8, 8, 3), np.uint8), policy_action=i)
    assert rec.save() == tmp_path / "trace" and len(list(rec.path.iterdir())) == 2   # nothing new: nothing written
    rec.metadata["laps"] = [True]
    rec.save()
    rec.save()
    assert len(list(rec.path.iterdir())) == 3
    run = load_trace(tmp_path)
    assert run.num_steps == 4 and run.metadata["run"] == {"env": "x", "laps": [True]}


def test_a_new_recording_replaces_an_earlier_one_in_the_folder(tmp_path):
    for steps in (7, 3):
        rec = RunRecorder(tmp_path, chunk_steps=2)
        for i in range(steps):
            rec.add(frame=np.zeros((8, 8, 3), np.uint8), policy_action=i)
        rec.save()
    assert load_trace(tmp_path).policy_action[:, 0].tolist() == [0, 1, 2]
    assert len(list(rec.path.iterdir())) == 2


def test_chunks_are_written_off_the_loop_one_at_a_time(tmp_path, monkeypatch):
    import threading

    import nac_drive.interpret.trace as trace_module

    release, writing, write = threading.Event(), [], trace_module.write_archive

    def held(path, arrays, metadata):   # a write that lasts until the test releases it
        writing.append(path.name)
        assert release.wait(30)
        return write(path, arrays, metadata)

    monkeypatch.setattr(trace_module, "write_archive", held)
    rec = RunRecorder(tmp_path, chunk_steps=2)
    add = [lambda i=i: rec.add(frame=np.full((8, 8, 3), i, np.uint8), policy_action=i) for i in range(5)]
    try:
        add[0]()
        add[1]()                                         # the chunk is full: handed to the writer
        assert rec.pending == 0 and len(rec) == 2
        deadline = time.time() + 30
        while not writing:
            assert time.time() < deadline, "the writer never started"
            time.sleep(0.01)
        assert writing == ["chunk-000000.npz"] and not rec.path.exists()   # add did not wait for it
        add[2]()                                         # the next chunk fills meanwhile
        fourth = threading.Thread(target=add[3])         # full, it waits for the first to be written
        fourth.start()
        fourth.join(0.5)
        assert fourth.is_alive() and writing == ["chunk-000000.npz"] and rec.pending == 2
    finally:
        release.set()
    fourth.join(30)
    assert rec.pending == 0 and writing[1:] in ([], ["chunk-000001.npz"])
    add[4]()
    assert rec.save() == tmp_path / "trace"              # waits for the writer: every step on disk
    assert writing == [f"chunk-00000{i}.npz" for i in range(3)] and rec.pending == 0
    run = load_trace(tmp_path)
    assert run.policy_action[:, 0].tolist() == [0, 1, 2, 3, 4] and run.metadata["chunks"] == 3
    assert [int(run.frame(i)[0, 0, 0]) for i in range(5)] == [0, 1, 2, 3, 4]


def test_a_writer_error_is_raised_by_the_next_add_and_save_in_one_line(tmp_path):
    small, large = _layer(), _layer(d_model=16)
    rec = RunRecorder(tmp_path, chunk_steps=2)
    with torch.no_grad():
        traces = [layer.step(torch.randn(1, 6), layer.init_cache(1), return_trace=True)[2] for layer in (small, large)]
    frame = np.zeros((8, 8, 3), np.uint8)
    for trace in traces:   # a chunk whose NAC traces differ in size: the writer cannot stack them
        rec.add(frame=frame, policy_action=0, nac_trace=trace, nac_step=0)
    message = "nac_trace.q: shape [16] at step 1 differs from [8]"
    with pytest.raises(ValueError) as e:   # the writer stopped at the chunk; the next add says why
        for _ in range(100):
            time.sleep(0.01)
            rec.add(frame=frame, policy_action=0)
    assert str(e.value) == message
    for call in (rec.save, lambda: rec.add(frame=frame, policy_action=0), rec.save):   # and every later call
        with pytest.raises(ValueError) as e:
            call()
        assert str(e.value) == message
    assert not rec.path.exists()                         # no chunk after the failed one (nor it)
    with pytest.raises(ValueError, match="^nac_trace.q"):   # the with block raises it once, saves nothing
        with RunRecorder(tmp_path / "with", chunk_steps=2) as rec:
            for trace in traces * 50:
                time.sleep(0.01)
                rec.add(frame=frame, policy_action=0, nac_trace=trace, nac_step=0)
    assert not (tmp_path / "with").exists()


@pytest.fixture()
def chunked(tmp_path):
    """A run of 4 chunks of 3 steps; returns its trace folder."""
    rec = RunRecorder(tmp_path, chunk_steps=3)
    for i in range(12):
        rec.add(frame=np.full((8, 8, 3), 10 * i, np.uint8), policy_action=i)
    return rec.save()   # (the last chunk is written in the background until then)


def test_a_missing_middle_chunk_is_refused_in_one_line(chunked):
    (chunked / "chunk-000002.npz").unlink()
    with pytest.raises(ArchiveError) as e:
        load_trace(chunked.parent)
    assert str(e.value) == (f"{chunked}: chunk-000002.npz is missing (1 of chunks 0-3 are): the trace is "
                            "incomplete, record the run again")
    (chunked / "chunk-000000.npz").unlink()
    with pytest.raises(ArchiveError, match="chunk-000000.npz is missing"):
        load_trace(chunked)


def test_a_corrupt_or_misplaced_middle_chunk_is_refused_naming_it(chunked):
    second = chunked / "chunk-000001.npz"
    data = second.read_bytes()
    second.write_bytes(data[: len(data) // 2])
    with pytest.raises(ArchiveError, match=f"^{second}: not a readable .npz archive") as e:
        load_trace(chunked)
    assert "\n" not in str(e.value)
    os.replace(chunked / "chunk-000003.npz", second)       # the last chunk in the place of the second
    with pytest.raises(ArchiveError, match=rf"{second}: field 'metadata.json': says chunk 3 from step 9, its place "
                                           r"in the trace is chunk 1 from step 3"):
        load_trace(chunked)


def test_stray_files_are_ignored_and_a_version_1_trace_still_loads(chunked):
    (chunked / ".chunk-000004.npz.x1y2.tmp").write_bytes(b"PK half a chunk")
    (chunked / "notes.txt").write_text("mine")
    assert load_trace(chunked).num_steps == 12
    arrays, meta = _members(chunked / "chunk-000000.npz")
    legacy = chunked.parent / "legacy"
    write_archive(legacy / "trace.npz", arrays, {k: v for k, v in meta.items() if k not in ("chunk", "first_step")}
                  | {"version": 1})
    run = load_trace(legacy)
    assert run.num_steps == 3 and run.path == legacy / "trace.npz"
    assert run.sha256 == hashlib.sha256((legacy / "trace.npz").read_bytes()).hexdigest()
    with pytest.raises(ArchiveError, match="version 1 is not supported"):   # a chunk is version 2
        write_archive(chunked / "chunk-000000.npz", arrays, {**meta, "version": 1})
        load_trace(chunked)


# ------------------------------------------------------------------ kill safety
_WRITER = textwrap.dedent("""
    import sys, time
    import numpy as np
    from nac_drive.interpret.trace import RunRecorder

    rec = RunRecorder(sys.argv[1], chunk_steps=10)
    rng = np.random.default_rng(0)
    def add(n):
        for _ in range(n):
            rec.add(frame=rng.integers(0, 255, (32, 32, 3), dtype=np.uint8), policy_action=[0.0],
                    timestamp=float(len(rec)))
    add(30)                      # three chunks, written by add itself
    assert rec.pending == 0
    # From now on every member takes a while to write, so the kill lands mid-chunk.
    write_array = np.lib.format.write_array
    def slow(*a, **k):
        time.sleep(0.2)
        return write_array(*a, **k)
    np.lib.format.write_array = slow
    print("flushed", len(rec), flush=True)
    while True:
        add(10)
""")


def test_a_killed_recorder_leaves_every_flushed_step(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    trace = tmp_path / "trace"
    try:
        assert proc.stdout.readline().strip() == "flushed 30"
        deadline = time.time() + 30
        while not list(trace.glob(".chunk-000003.npz.*.tmp")):          # the fourth chunk is under way
            assert time.time() < deadline, "the writer never started a fourth chunk"
            time.sleep(0.01)
        time.sleep(0.3)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL                   # it was killed, not finished
    finally:
        if proc.poll() is None:
            proc.kill()
    assert list(trace.glob(".chunk-000003.npz.*.tmp")), "the kill did not land mid-write"
    run = load_trace(tmp_path)                                             # the three flushed chunks
    assert run.num_steps == 30 and run.timestamp.tolist() == list(range(30))
    assert len(run.frame_offsets) == 31 and run.frame(29).shape == (32, 32, 3)


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
