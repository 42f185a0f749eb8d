"""Hostile files: nothing read from disk is ever unpickled, and no size a file claims is
allocated before it is checked.

A crafted pickle whose unpickling creates a marker folder is put wherever a file is read
(expert zip members, policy checkpoints, optimizer state, run archives, kept-checkpoint
JSON); the real loaders and verbs must refuse it with a clear one-line error, or ignore
it when it is a part they never read, and the marker must never appear.
"""

from __future__ import annotations

import base64
import io
import json
import os
import pickle
import shutil
import struct
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from huggingface_hub import constants as hf_constants
from support.expert_zips import rewrite_zip
from support.fake_hub import FakeHub, serve

from nac_drive.agents.ppo_lab.expert_zip import export_for_shipping, load_expert_zip, read_data
from nac_drive.agents.ppo_expert import PPOExpert, shipped_expert_path
from nac_drive.io.checkpoint import CheckpointError
from nac_drive.cli import main
from nac_drive.interpret.archive import ArchiveError
from nac_drive.policy.driving_policy import DrivingPolicy

torch.set_num_threads(1)


class Payload:
    """Unpickling it runs ``os.mkdir(marker)``: proof that a loader executed file content."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


@pytest.fixture
def canary(tmp_path):
    """The marker path and crafted files: a plain pickle, a torch file and an object .npy."""
    marker = tmp_path / "CODE-RAN"
    torch_file, npy = io.BytesIO(), io.BytesIO()
    torch.save({"weight": Payload(marker)}, torch_file)
    np.save(npy, np.array([Payload(marker)], dtype=object), allow_pickle=True)
    yield SimpleNamespace(marker=marker, pickle=pickle.dumps(Payload(marker)), torch=torch_file.getvalue(),
                          npy=npy.getvalue(), b64=base64.b64encode(pickle.dumps(Payload(marker))).decode())
    assert not marker.exists(), "a crafted pickle was unpickled"


def one_line_error(capsys, *argv, code=2) -> str:
    """Run ``nac-drive argv`` in-process: it must exit with ``code`` and say why in one line."""
    assert main([str(a) for a in argv]) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def shipped_data() -> dict:
    return read_data(shipped_expert_path())


def shipped_repeat() -> int:
    return shipped_data()["preprocessing"]["action_repeat"]


def with_crafted_serialized(data: dict, b64: str) -> dict:
    """``data`` with every pickled (``:serialized:``) value, which SB3's PPO.load runs, crafted."""
    return {key: {**value, ":serialized:": b64} if isinstance(value, dict) and ":serialized:" in value else value
            for key, value in data.items()}


def zip_bytes(path: Path) -> bytes:
    with zipfile.ZipFile(path) as zf:
        return b"".join(zf.read(name) for name in zf.namelist())


def test_the_crafted_files_run_code_in_loaders_that_unpickle(tmp_path):
    """The canaries are live: plain unpickling, torch.load without weights_only and SB3's
    PPO.load of an expert zip whose JSON holds the crafted pickle all create the marker."""
    from stable_baselines3 import PPO

    for name, load in (("pickle", lambda m: pickle.loads(pickle.dumps(Payload(m)))),
                       ("torch", lambda m: torch.load(_torch_bytes(Payload(m)), weights_only=False)),
                       ("ppo", lambda m: _ppo_load(PPO, _crafted_zip(tmp_path, m)))):
        marker = tmp_path / f"ran-{name}"
        load(marker)
        assert marker.is_dir(), name


def _torch_bytes(obj) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


def _crafted_zip(tmp_path: Path, marker: Path) -> Path:
    b64 = base64.b64encode(pickle.dumps(Payload(marker))).decode()
    return rewrite_zip(shipped_expert_path(), tmp_path / "crafted-data.zip",
                       data=json.dumps(with_crafted_serialized(shipped_data(), b64)).encode())


def _ppo_load(ppo, path: Path) -> None:
    try:
        ppo.load(path, device="cpu")
    except Exception:  # noqa: BLE001 - the payload returns None where SB3 wants a space; it ran already
        pass


# ------------------------------------------------------------------ expert zips
@pytest.mark.parametrize("kind", ["pickle", "torch"])
@pytest.mark.parametrize("member", ["policy.pth", "policy.optimizer.pth", "pytorch_variables.pth"])
def test_expert_zip_with_a_crafted_torch_member(canary, tmp_path, capsys, member, kind):
    crafted = rewrite_zip(shipped_expert_path(), tmp_path / "expert.zip", **{member.replace(".", "__"):
                                                                             getattr(canary, kind)})
    if member != "policy.pth":   # never read to drive or ship: loading and shipping work, the pickle stays inert
        assert not load_expert_zip(crafted).continuous and PPOExpert(crafted).action_repeat == shipped_repeat()
        shipped = export_for_shipping(crafted, tmp_path / "ship.zip")
        assert canary.marker.name.encode() not in zip_bytes(shipped)
        assert torch.equal(load_expert_zip(shipped).policy.action_net.weight,
                           load_expert_zip(shipped_expert_path()).policy.action_net.weight)
        return
    for load in (load_expert_zip, PPOExpert, lambda p: export_for_shipping(p, tmp_path / "ship.zip")):
        with pytest.raises(ValueError, match=r"expert\.zip: member 'policy\.pth' is not a plain tensor file"):
            load(crafted)
    assert not (tmp_path / "ship.zip").exists()
    for argv in (["expert", "compare", crafted], ["expert", "eval", "--expert", crafted, "--episodes", "1"],
                 ["expert", "ship", crafted, tmp_path / "ship.zip"],
                 ["collect", "carracing", "--expert", crafted, "--episodes", "1", "--out", tmp_path / "demos"],
                 ["expert", "train", "--init-from", crafted, "--out", tmp_path / "runs", "--n-envs", "1"]):
        assert "policy.pth" in one_line_error(capsys, *argv)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "demos").exists()   # refused before starting
    assert not (tmp_path / "ship.zip").exists()


def test_expert_zip_whose_json_holds_crafted_pickles(canary, tmp_path, capsys):
    """SB3 stores spaces, schedules and classes as pickles inside ``data``: they are never
    run here, and a shipped copy (``expert ship``) carries none of their bytes."""
    crafted = rewrite_zip(shipped_expert_path(), tmp_path / "expert.zip",
                          data=json.dumps(with_crafted_serialized(shipped_data(), canary.b64)).encode())
    assert torch.equal(load_expert_zip(crafted).policy.action_net.weight,
                       load_expert_zip(shipped_expert_path()).policy.action_net.weight)
    expert = PPOExpert(crafted)
    assert expert.act(np.zeros((96, 96, 3), np.uint8)) in range(5)
    shipped = tmp_path / "ship.zip"
    assert main(["expert", "ship", str(crafted), str(shipped)]) == 0
    assert capsys.readouterr().out.strip() == f"shipped copy: {shipped}"
    assert canary.b64[:40].encode() not in zip_bytes(shipped) and load_expert_zip(shipped).action_repeat == shipped_repeat()
    assert torch.equal(load_expert_zip(shipped).policy.action_net.weight,
                       load_expert_zip(shipped_expert_path()).policy.action_net.weight)
    # a pickled policy_kwargs (it could name any class) is refused
    data = {**shipped_data(), "policy_kwargs": {":type:": "<class 'dict'>", ":serialized:": canary.b64}}
    rewrite_zip(shipped_expert_path(), tmp_path / "kwargs.zip", data=json.dumps(data).encode())
    with pytest.raises(ValueError, match="kwargs.zip: field 'policy_kwargs' is not plain JSON"):
        load_expert_zip(tmp_path / "kwargs.zip")


def _tiny_expert_run(tmp_path: Path) -> Path:
    """A real `expert train` run of 32 frames (action repeat 2), kept and best at 32 frames."""
    from nac_drive.agents.ppo_lab.training import train_expert
    from nac_drive.agents.ppo_lab.training_args import ExpertTrainArgs

    train_expert(ExpertTrainArgs(out=str(tmp_path / "runs"), run_name="r", n_envs=1, n_steps=8, batch_size=8, n_epochs=1,
                                 total_frames=32, action_repeat=2, eval_every_frames=32, eval_episodes=1, progress_bar=False))
    return tmp_path / "runs" / "r"


def test_ship_after_a_resume_that_saved_no_new_best_never_unpickles(canary, tmp_path, capsys):
    """`expert resume --ship` hands on the best_model.zip already in the run folder when the
    resumed part saves no new best. A crafted zip planted there used to run its code in
    PPO.load (see the first test); now the shipped copy is made from its checked parts."""
    run = _tiny_expert_run(tmp_path)
    kept = run / "evaluated" / "frames_32.zip"
    planted = rewrite_zip(kept, tmp_path / "planted.zip",
                          data=json.dumps(with_crafted_serialized(json.loads(zipfile.ZipFile(kept).read("data")),
                                                                  canary.b64)).encode())
    shutil.copy(planted, run / "best_model.zip")
    best_before = (run / "best_model.zip").read_bytes()
    # 16 more frames: no evaluation (every 32), so no new best
    assert main(["expert", "resume", str(run), "--total-frames", "48", "--ship", str(tmp_path / "ship.zip")]) == 0
    out = capsys.readouterr().out
    assert f"best checkpoint: {run / 'best_model.zip'}" in out and "shipped copy:" in out
    assert (run / "best_model.zip").read_bytes() == best_before
    assert torch.equal(load_expert_zip(tmp_path / "ship.zip").policy.action_net.weight,
                       load_expert_zip(kept).policy.action_net.weight)
    assert canary.b64[:40].encode() not in zip_bytes(tmp_path / "ship.zip")


def test_resume_refuses_crafted_kept_state(canary, tmp_path, capsys):
    run = _tiny_expert_run(tmp_path)
    kept = run / "evaluated" / "frames_32.zip"
    original = {p: p.read_bytes() for p in (kept, kept.with_suffix(".json"), run / "args.json")}
    cases = [
        (kept, rewrite_zip(kept, tmp_path / "k.zip", policy__optimizer__pth=canary.torch).read_bytes(),
         "member 'policy.optimizer.pth' is not a plain tensor file"),
        (kept.with_suffix(".json"), canary.pickle, "frames_32.json: not valid JSON"),
        (kept.with_suffix(".json"), json.dumps({**json.loads(original[kept.with_suffix(".json")]),
                                                "reward_norm": "x"}).encode(), "field 'reward_norm'"),
        (run / "args.json", canary.pickle, "args.json: not valid JSON"),
        (run / "args.json", json.dumps({**json.loads(original[run / "args.json"]), "n_envs": "2"}).encode(),
         "args.json.n_envs: expected a int"),
        (run / "args.json", json.dumps({**json.loads(original[run / "args.json"]), "evil": 1}).encode(),
         "unknown keys ['evil']"),
    ]
    for path, content, message in cases:
        path.write_bytes(content)
        assert message in one_line_error(capsys, "expert", "resume", run, "--total-frames", "64")
        path.write_bytes(original[path])


# ------------------------------------------------------------------ policy checkpoints
@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    from nac_drive.data_collection.carracing_dataset import write_dataset
    from support.demos import synthetic_episodes

    root = tmp_path_factory.mktemp("demos")
    write_dataset(root, "bands", synthetic_episodes(2, 24), "CarRacing-v3", expert="bands", description="test")
    return root


TINY = ["--window", "4", "--d-model", "16", "--num-heads", "2", "--topk", "3", "--windows-per-epoch", "32",
        "--batch-size", "8", "--no-progress"]


@pytest.fixture(scope="module")
def trained_run(demos, tmp_path_factory):
    """A real `nac-drive train` run folder (best/, last/ with optimizer state)."""
    out = tmp_path_factory.mktemp("train")
    assert main(["train", "--data", str(demos), "--out", str(out), "--run-name", "tiny", "--epochs", "1", *TINY]) == 0
    return out / "tiny"


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "optimizer.safetensors", "train_state.json"])
def test_policy_checkpoint_with_a_crafted_file(canary, tmp_path, capsys, demos, trained_run, name):
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    (run / "last" / name).write_bytes(canary.pickle)
    if name != "config.json":   # --resume reads the weights and the optimizer state (its config comes from the flags)
        resumed = one_line_error(capsys, "train", "--data", demos, "--out", tmp_path, "--run-name", "run", "--resume",
                                 "--epochs", "2", *TINY)
        assert f"last/{name}: not " in resumed and ("JSON" in resumed or "safetensors" in resumed)
    if name in ("config.json", "model.safetensors"):
        with pytest.raises(CheckpointError, match=f"last/{name}"):
            DrivingPolicy.from_pretrained(run / "last")
        for argv in (["drive", "carracing", "--policy", run / "last", "--episodes", "1"],
                     ["saliency", tmp_path / "nowhere", "--policy", run / "last"],
                     ["dagger", "--policy", run / "last", "--data", tmp_path / "dg", "--rounds", "1"],
                     ["train", "--data", demos, "--out", tmp_path / "ft", "--init-from", run / "last", "--window", "4",
                      "--no-progress"]):   # no architecture flag: --init-from takes the checkpoint's
            assert f"last/{name}" in one_line_error(capsys, *argv)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_hub_checkpoint_with_a_crafted_file_is_refused_like_a_folder(canary, tmp_path, capsys, monkeypatch,
                                                                       trained_run, name):
    """Served by a (faked) Hub, downloaded into the cache by huggingface_hub: same refusal."""
    files = {f: (trained_run / "last" / f).read_bytes() for f in ("config.json", "model.safetensors")}
    hub = FakeHub()
    hub.add_commit("attacker/policy", {**files, name: canary.pickle})
    config = json.loads(files["config.json"])
    hub.add_commit("attacker/huge", {**files, "config.json": json.dumps(
        {**config, "core": {**config["core"], "d_model": 10**9}}).encode()})
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    with serve(hub):
        with pytest.raises(CheckpointError, match=f"models--attacker--policy/snapshots/[0-9a-f]{{40}}/{name}: not "):
            DrivingPolicy.from_pretrained("attacker/policy")
        assert f"/{name}: not " in one_line_error(capsys, "drive", "carracing", "--policy", "attacker/policy",
                                                  "--episodes", "1")
        with pytest.raises(CheckpointError, match=r"config.core.d_model: 1000000000 is outside 1\.\.1024"):
            DrivingPolicy.from_pretrained("attacker/huge")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)   # the cached snapshot alone: still refused
    with pytest.raises(CheckpointError, match=f"snapshots/[0-9a-f]{{40}}/{name}: not "):
        DrivingPolicy.from_pretrained("attacker/policy")


# ------------------------------------------------------------------ run archives
@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory):
    from support.synthetic_runs import make_synthetic_run

    run = tmp_path_factory.mktemp("run")
    make_synthetic_run(run, steps=6, seed=3)
    return run


FIRST_CHUNK = "trace/chunk-000000.npz"   # a recorded run's trace (its only chunk)


@pytest.mark.parametrize("archive,member", [(FIRST_CHUNK, "timestamp.npy"), (FIRST_CHUNK, "frames_jpeg.npy"),
                                            (FIRST_CHUNK, "metadata.json"), ("saliency.npz", "maps.npy")])
def test_run_archive_with_a_crafted_member(canary, tmp_path, capsys, recorded_run, archive, member):
    from nac_drive.interpret.saliency import load_saliency
    from nac_drive.interpret.trace import load_trace

    run = tmp_path / "run"
    shutil.copytree(recorded_run, run)
    crafted = canary.pickle if member.endswith(".json") else canary.npy
    rewrite_zip(recorded_run / archive, run / archive, **{member.replace(".", "__"): crafted})
    field = member.removesuffix(".npy")
    why = "invalid JSON" if member.endswith(".json") else "object arrays"
    loader = load_trace if archive == FIRST_CHUNK else lambda r: load_saliency(r, load_trace(r))
    with pytest.raises(ArchiveError, match=f"{archive}: field '{field}'.*{why}"):
        loader(run)
    assert why in one_line_error(capsys, "dashboard", run)
    if archive == FIRST_CHUNK:
        assert why in one_line_error(capsys, "saliency", run)


def test_a_saliency_file_of_another_trace_is_refused(tmp_path, capsys):
    """A new run recorded into a folder that holds an earlier run's saliency.npz (same
    length, other frames): the dashboard refuses to overlay the wrong maps."""
    from nac_drive.interpret.dashboard import build_dashboard
    from support.synthetic_runs import make_synthetic_run

    make_synthetic_run(tmp_path, steps=6, seed=1)
    assert build_dashboard(tmp_path).is_file()
    make_synthetic_run(tmp_path, steps=6, seed=2, with_saliency=False)   # the trace replaced, saliency.npz stale
    with pytest.raises(ArchiveError, match="saliency.npz: field 'metadata.json': computed from another trace "):
        build_dashboard(tmp_path)
    assert "recompute it with nac-drive saliency" in one_line_error(capsys, "dashboard", tmp_path)
    meta = json.loads(zipfile.ZipFile(tmp_path / "saliency.npz").read("metadata.json"))
    rewrite_zip(tmp_path / "saliency.npz", tmp_path / "old.npz",   # a file from before saliency named its trace
                metadata__json=json.dumps({k: v for k, v in meta.items() if k != "trace_sha256"}).encode())
    os.replace(tmp_path / "old.npz", tmp_path / "saliency.npz")
    with pytest.raises(ArchiveError, match="names no trace it was computed from"):
        build_dashboard(tmp_path)


# ------------------------------------------------------------------ sizes claimed by files
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_a_device_is_refused_by_type_not_read(tmp_path, capsys, trained_run, recorded_run, kind):
    """A size check passes /dev/zero (size 0, no end: 4.7 GB read in 5 s) and a FIFO (the read
    waits for a writer for good); both are refused as what they are, at once."""
    def special(path: Path) -> Path:
        if kind == "fifo":
            os.mkfifo(path)
        else:
            path.symlink_to("/dev/zero")
        return path

    policy = tmp_path / "policy"
    shutil.copytree(trained_run / "best", policy)
    (policy / "config.json").unlink()
    special(policy / "config.json")
    what = "a FIFO" if kind == "fifo" else "a device"
    with pytest.raises(CheckpointError, match=rf"config.json: not a regular file \({what}\)"):
        DrivingPolicy.from_pretrained(policy)
    video = special(tmp_path / "video.webm")
    assert f"video.webm: not a regular file ({what})" in one_line_error(
        capsys, "dashboard", recorded_run, "--video", video, "-o", tmp_path / "page.html")
    explain = recorded_run / "explain.json"
    special(explain)
    try:   # the page is still built; the report is named as not shown
        from nac_drive.interpret.explain_report import load_explain

        assert load_explain(recorded_run, "0" * 64) == (None, f"explain.json is not shown: {explain}: "
                                                              f"not a regular file ({what})")
    finally:
        explain.unlink()


def test_policy_config_sizes_are_checked_before_building(tmp_path, trained_run):
    def with_core(name: str, **core) -> Path:
        folder = tmp_path / name
        shutil.copytree(trained_run / "best", folder)
        config = json.loads((folder / "config.json").read_text())
        config["core"].update(core)
        (folder / "config.json").write_text(json.dumps(config))
        return folder

    with pytest.raises(CheckpointError, match=r"config.json: config.core.d_model: 1000000000 is outside 1\.\.1024"):
        DrivingPolicy.from_pretrained(with_core("huge", d_model=10**9))
    with pytest.raises(CheckpointError, match=r"config.core.window: 100000 is outside"):
        DrivingPolicy.from_pretrained(with_core("window", window=100_000))
    # within the limits but not what the weights hold: refused from the weights' header,
    # naming the first tensor whose shape differs
    with pytest.raises(CheckpointError, match=r"model.safetensors: \S+ has shape \[.*\], the model expects"):
        DrivingPolicy.from_pretrained(with_core("wide", d_model=512, num_heads=64))


def test_expert_zip_sizes_are_checked_before_building(tmp_path):
    data = shipped_data()
    cases = {
        "arch": ({**data, "policy_kwargs": {"net_arch": {"pi": [10**9], "vf": [256]}}},
                 r"policy.pth does not fit the network its 'data' describes \(first difference: \S+: \[5, 256\] in "
                 r"the file, \[5, 1000000000\] in the network\)"),
        "stack": ({**data, "observation_space": {**data["observation_space"], "_shape": [10**6, 64, 64]}},
                  r"field 'observation_space' has shape \[1000000, 64, 64\]"),
        "kwargs": ({**data, "policy_kwargs": {"features_extractor_kwargs": {"features_dim": 10**9}}},
                   r"policy_kwargs' has 'features_extractor_kwargs'"),
    }
    for name, (crafted, message) in cases.items():
        rewrite_zip(shipped_expert_path(), tmp_path / f"{name}.zip", data=json.dumps(crafted).encode())
        with pytest.raises(ValueError, match=message):
            load_expert_zip(tmp_path / f"{name}.zip")


@pytest.mark.parametrize("value,message", [(float("nan"), "contains NaN or inf"), (3e38, "holds 3e\\+38, past the 10000")])
def test_an_expert_zip_with_non_finite_or_absurd_weights_is_refused(tmp_path, capsys, value, message):
    # such a zip was once shipped, averaged and collected with, and failed mid-run
    from nac_drive.agents.ppo_lab.expert_zip import read_tensors

    state = read_tensors(shipped_expert_path(), "policy.pth")
    name = next(k for k, v in state.items() if v.is_floating_point())
    state[name] = state[name].clone().fill_(value)
    raw = io.BytesIO()
    torch.save(state, raw)
    rewrite_zip(shipped_expert_path(), tmp_path / "bad.zip", policy__pth=raw.getvalue())
    with pytest.raises(ValueError, match=rf"bad.zip: policy.pth: {name} {message}"):
        load_expert_zip(tmp_path / "bad.zip")
    error = one_line_error(capsys, "expert", "ship", tmp_path / "bad.zip", tmp_path / "shipped.zip")
    assert name in error and not (tmp_path / "shipped.zip").exists()


def test_zip_members_are_capped_before_they_are_inflated(tmp_path):
    # a member that inflates to 65 MiB (of spaces: it compresses to ~64 kB)
    bomb = rewrite_zip(shipped_expert_path(), tmp_path / "bomb.zip", data=b" " * (65 * 2**20))
    assert bomb.stat().st_size < 4_000_000
    with pytest.raises(ValueError, match=r"bomb.zip: member 'data' would inflate to 68157440 bytes, more than"):
        load_expert_zip(bomb)
    # a directory that understates a member's size: reading stops at the declared size
    raw = bytearray(shipped_expert_path().read_bytes())
    entry = raw.find(b"PK\x01\x02")   # central directory entries: name length at +28, name at +46
    while raw[entry + 46:entry + 46 + struct.unpack("<H", raw[entry + 28:entry + 30])[0]] != b"policy.pth":
        entry = raw.find(b"PK\x01\x02", entry + 4)
    raw[entry + 24:entry + 28] = struct.pack("<I", 1000)   # its uncompressed size: 1000 bytes
    (tmp_path / "lying.zip").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"lying.zip: member 'policy.pth' is unreadable \(BadZipFile: Bad CRC"):
        load_expert_zip(tmp_path / "lying.zip")


def test_run_archive_sizes_are_checked_before_reading(tmp_path, recorded_run, monkeypatch):
    from nac_drive.interpret import archive
    from nac_drive.interpret.trace import load_trace

    header = io.BytesIO()   # an .npy header asking for 8 TB, followed by 16 bytes
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (10**12,)})
    (tmp_path / "trace").mkdir()
    rewrite_zip(recorded_run / FIRST_CHUNK, tmp_path / FIRST_CHUNK, timestamp__npy=header.getvalue() + bytes(16))
    with pytest.raises(ArchiveError, match=r"field 'timestamp': its header asks for \[1000000000000\] x float64"):
        load_trace(tmp_path)
    monkeypatch.setattr(archive, "ARCHIVE_LIMIT", 1000)
    with pytest.raises(ArchiveError, match=r"chunk-000000.npz: its members would inflate to \d+ bytes, more than the 1000"):
        load_trace(recorded_run)


def test_a_trace_frame_claiming_gigapixels_is_never_decoded(tmp_path, capsys, recorded_run):
    """~630 bytes claiming 30000 x 30000 pixels as a trace's first frame: the dashboard
    (re-encoding frames to fit its budget) and saliency refuse it from its header."""
    from support import hostile_jpegs

    from nac_drive.interpret.archive import METADATA_MEMBER, write_archive

    with np.load(recorded_run / FIRST_CHUNK, allow_pickle=False) as trace:
        arrays = {name: trace[name] for name in trace.files if name != METADATA_MEMBER}
        meta = json.loads(trace[METADATA_MEMBER])
    offsets, frames = arrays["frame_offsets"], arrays["frames_jpeg"]
    giant = np.frombuffer(hostile_jpegs.giant(), np.uint8)
    arrays["frames_jpeg"] = np.concatenate([giant, frames[offsets[1]:]])
    arrays["frame_offsets"] = np.concatenate([[0], offsets[1:] - offsets[1] + len(giant)])
    run = tmp_path / "run"
    run.mkdir()
    write_archive(run / FIRST_CHUNK, arrays, meta)
    claim = "a JPEG claiming 30000x30000 pixels"
    assert claim in one_line_error(capsys, "dashboard", run, "--image-budget-mb", "0.001")
    assert main(["saliency", str(run)]) == 2     # (after its progress bar)
    assert f"field 'frames_jpeg': frame 0: {claim}" in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("nac", ["a string", {"groups": "x"}, {"d_model": [1], "groups": {}}])
def test_a_trace_whose_nac_description_has_wrong_types_is_refused(tmp_path, capsys, recorded_run, nac):
    from nac_drive.interpret.archive import METADATA_MEMBER, write_archive

    with np.load(recorded_run / FIRST_CHUNK, allow_pickle=False) as trace:
        arrays = {name: trace[name] for name in trace.files if name != METADATA_MEMBER}
        meta = json.loads(trace[METADATA_MEMBER])
    assert isinstance(meta["nac"]["groups"]["inter"], int)   # the recorded run has a NAC description
    write_archive(tmp_path / FIRST_CHUNK, arrays, {**meta, "nac": nac})
    assert "'nac' must be null or a NAC description" in one_line_error(capsys, "dashboard", tmp_path)


@pytest.mark.parametrize("field,value,said", [
    ("action_names", 5, "'action_names' must be null or a list of at most 1000 names"),
    ("expert_action_names", [1, 2], "'expert_action_names' must be null or a list"),
    ("wiring_inter_to_command", "one row short", "field 'wiring_inter_to_command': shape [7, 4], the NAC the "
                                                 "metadata describes has [8, 4]")])
def test_a_trace_whose_labels_or_wiring_do_not_fit_is_refused(tmp_path, capsys, recorded_run, field, value, said):
    # both once crashed the dashboard with exit 1
    from nac_drive.interpret.archive import METADATA_MEMBER, write_archive

    with np.load(recorded_run / FIRST_CHUNK, allow_pickle=False) as trace:
        arrays = {name: trace[name] for name in trace.files if name != METADATA_MEMBER}
        meta = json.loads(trace[METADATA_MEMBER])
    if field in arrays:
        assert arrays[field].shape == (8, 4)
        arrays[field] = arrays[field][:-1]
    else:
        meta[field] = value
    write_archive(tmp_path / FIRST_CHUNK, arrays, meta)
    assert said in one_line_error(capsys, "dashboard", tmp_path)


def test_a_dataset_declaring_more_than_memory_is_refused(tmp_path):
    import h5py

    from nac_drive.data_collection.carracing_dataset import DatasetError, load_episodes, write_dataset
    from support.demos import synthetic_episodes

    path = write_dataset(tmp_path, "bomb", synthetic_episodes(1, 8), "CarRacing-v3", expert="x", description="")
    with h5py.File(path / "data" / "main_data.hdf5", "r+") as f:   # 2.7 TB declared, nothing written
        f["episode_0"].create_dataset("huge", shape=(10**8, 96, 96, 3), dtype=np.uint8, chunks=(1, 96, 96, 3),
                                      compression="gzip")
    assert (path / "data" / "main_data.hdf5").stat().st_size < 10_000_000
    with pytest.raises(DatasetError, match=r"main_data.hdf5: its arrays would take \d+ bytes, more than this"):
        load_episodes(tmp_path)


# ------------------------------------------------------------------ nesting
DEEP = "[" * 100_000 + "]" * 100_000   # 200 kB, far under every size cap; json recurses per level


def test_json_nested_100k_deep_is_refused_in_one_line_wherever_it_is_read(tmp_path, capsys, trained_run, recorded_run):
    """explain.json, a checkpoint's config and a run archive's metadata, each 100,000 levels deep:
    a one-line refusal naming the depth (explain.json: the page is built, the report named as not shown),
    never RecursionError "a bug"."""
    run = tmp_path / "run"
    shutil.copytree(recorded_run, run)
    (run / "explain.json").write_text('{"trace_sha256": ' + DEEP + "}")
    page = tmp_path / "page.html"
    assert main(["dashboard", str(run), "-o", str(page)]) == 0
    assert "explain.json is not shown: JSON nested deeper than 64 levels" in page.read_text()

    policy = tmp_path / "policy"
    shutil.copytree(trained_run / "best", policy)
    (policy / "config.json").write_text(DEEP)
    with pytest.raises(CheckpointError, match=r"config.json: not valid JSON \(ValueError: JSON nested deeper than 64"):
        DrivingPolicy.from_pretrained(policy)
