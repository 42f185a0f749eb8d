"""Runs never overwrite runs, and a kill at any moment leaves the previous checkpoint or
dataset whole (real SIGKILLs of subprocesses at chosen points)."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from nac_drive.io.atomic import atomic_write_dir, fresh_dir
from nac_drive.cli import main
from nac_drive.data_collection.carracing_dataset import DatasetError, find_datasets, load_episodes, write_dataset
from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig
from support.demos import synthetic_episodes

torch.set_num_threads(1)

TINY = ["--window", "4", "--d-model", "16", "--num-heads", "2", "--topk", "3", "--windows-per-epoch", "32",
        "--batch-size", "8", "--no-progress"]


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    root = tmp_path_factory.mktemp("demos")
    write_dataset(root, "bands", synthetic_episodes(2, 24), "CarRacing-v3", expert="bands", description="test")
    return root


def killed(patch: str, script: str, *args) -> None:
    """Run ``patch`` (which makes the chosen call ``die()``), then ``script``, in a fresh
    Python with ``sys.argv[1:] = args``; it must die of SIGKILL at that point."""
    prelude = textwrap.dedent("""
        import os, shutil, signal, sys
        from pathlib import Path

        def die(*_, **__):
            os.kill(os.getpid(), signal.SIGKILL)

        target = Path(sys.argv[1])
        """)
    code = "\n".join([prelude, textwrap.dedent(patch), textwrap.dedent(script)])
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=300)
    assert out.returncode == -signal.SIGKILL, out.stderr[-2000:]


def hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_fresh_dir_takes_the_next_free_name(tmp_path):
    assert fresh_dir(tmp_path / "run") == tmp_path / "run"
    (tmp_path / "run-3").write_text("a file takes a name too")
    assert [fresh_dir(tmp_path / "run").name for _ in range(2)] == ["run-2", "run-4"]
    assert all((tmp_path / name).is_dir() and not any((tmp_path / name).iterdir()) for name in ("run", "run-2", "run-4"))


def _policy(seed: int) -> DrivingPolicy:
    return DrivingPolicy(PolicyConfig(core={"core": "gru", "d_model": 8, "seed": seed}))


# where the writer is killed, and whether the new checkpoint was already in place
KILL_POINTS = {
    "writing": ("import nac_drive.io.checkpoint\n"   # the weights are written, the config is not
                "nac_drive.io.checkpoint.write_json = die", False),
    "moving the previous aside": ("real = os.rename\n"
                                  "os.rename = lambda a, b: die() if Path(a) == target else real(a, b)", False),
    "putting the new in place": ("real = os.rename\n"
                                 "os.rename = lambda a, b: die() if Path(b) == target else real(a, b)", False),
    "removing the previous": ("real = shutil.rmtree\n"
                              "shutil.rmtree = lambda p, **k: die() if Path(p).name.endswith('.old') else real(p, **k)",
                              True),
}


@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_checkpoint_folder_killed_at_any_step_loads_whole(tmp_path, point):
    target = tmp_path / "best"
    old, new = _policy(1), _policy(2)
    atomic_write_dir(target, old.save_pretrained)
    patch, replaced = KILL_POINTS[point]
    killed(patch, """
        from nac_drive.io.atomic import atomic_write_dir
        from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig
        policy = DrivingPolicy(PolicyConfig(core={"core": "gru", "d_model": 8, "seed": 2}))
        atomic_write_dir(target, policy.save_pretrained)
        """, target)
    expected = new if replaced else old
    loaded = DrivingPolicy.from_pretrained(target)   # the whole previous (or new) folder, never a mixture
    for name, tensor in expected.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    if point == "putting the new in place":
        assert not target.exists() and hidden(tmp_path) == [".best.new", ".best.old"]
    # the next write repairs what the kill left and leaves nothing hidden behind
    atomic_write_dir(target, _policy(3).save_pretrained)
    assert torch.equal(DrivingPolicy.from_pretrained(target).head[1].weight, _policy(3).head[1].weight)
    assert hidden(tmp_path) == [] and sorted(p.name for p in target.iterdir()) == ["README.md", "config.json",
                                                                                  "model.safetensors"]


def test_training_into_a_taken_run_name_starts_a_new_folder(tmp_path, demos, capsys):
    args = ["train", "--data", demos, "--out", tmp_path, "--epochs", "1", *TINY]
    assert main([str(a) for a in args]) == 0
    (first,) = [p for p in tmp_path.iterdir()]
    assert f"run folder: {first}" in capsys.readouterr().out
    before = {p: p.read_bytes() for p in (first / "metrics.csv", first / "best" / "model.safetensors")}
    assert main([str(a) for a in args + ["--seed", "0"]]) == 0    # the same default name again
    second = first.with_name(first.name + "-2")
    assert f"run folder: {second}" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in before} == before
    assert len((second / "metrics.csv").read_text().splitlines()) == 2 and (second / "best").is_dir()


def test_resume_keeps_each_epochs_metrics_once(tmp_path, demos):
    args = [str(a) for a in ["train", "--data", demos, "--out", tmp_path, "--run-name", "r", *TINY]]
    assert main(args + ["--epochs", "2"]) == 0
    metrics = tmp_path / "r" / "metrics.csv"
    with open(metrics, "a") as f:   # epoch 3 logged, then killed before its checkpoint was saved
        f.write("3,9,9,9,9,9,9,9\n")
    assert main(args + ["--epochs", "3", "--resume"]) == 0
    rows = list(csv.DictReader(metrics.open()))
    assert [r["epoch"] for r in rows] == ["1", "2", "3"] and rows[2]["train_loss"] != "9"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]    # --resume stays in its folder


def test_resume_refuses_another_window_or_mode_and_keeps_the_run(tmp_path, demos, capsys):
    # once: --resume took another --window/--mode, trained another policy under the name and rewrote its config
    args = [str(a) for a in ["train", "--data", demos, "--out", tmp_path, "--run-name", "r", *TINY]]
    assert main(args + ["--epochs", "1"]) == 0
    config = (tmp_path / "r" / "last" / "config.json").read_bytes()
    capsys.readouterr()
    for change, said in ((["--window", "5"], "window = 4, this run asks 5"),
                         (["--mode", "steady"], "mode = 'exact', this run asks 'steady'")):
        assert main(args + ["--epochs", "2", "--resume", *change]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("nac-drive train: error: resume: ") and said in err[-1], err
    assert (tmp_path / "r" / "last" / "config.json").read_bytes() == config


def test_a_second_resume_of_a_run_being_resumed_is_refused(tmp_path, demos, capsys):
    # once: two concurrent --resume of one run both went on and wrote metrics.csv rows twice
    args = [str(a) for a in ["train", "--data", demos, "--out", tmp_path, "--run-name", "r", *TINY]]
    assert main(args + ["--epochs", "1"]) == 0
    first = subprocess.Popen([sys.executable, "-m", "nac_drive.cli", *args, "--epochs", "200", "--resume"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert next(line for line in first.stdout if line.startswith("run folder:"))   # it holds the run
        capsys.readouterr()
        assert main(args + ["--epochs", "3", "--resume"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert f"another nac-drive train (pid {first.pid}) is writing it" in err[-1], err
    finally:
        first.kill()
        first.wait()
    assert main(args + ["--epochs", "2", "--resume"]) == 0   # a killed holder's lock went with it
    assert hidden(tmp_path / "r") == []                       # and a clean exit takes the lock file away


@pytest.mark.slow
def test_training_killed_while_it_swaps_in_a_checkpoint_resumes_from_the_previous(tmp_path, demos):
    """Killed in epoch 2 after last/ was moved aside and before the new one took its name."""
    run = tmp_path / "r"
    killed("""
        last, real, renames = target / "last", os.rename, []
        def rename(a, b):   # the second time a folder takes the name last/: epoch 2's swap
            renames.append(Path(b))
            if renames.count(last) == 2:
                die()
            real(a, b)
        os.rename = rename
        """, """
        from nac_drive.cli import main
        main(["train", *sys.argv[2:]])
        """, run, "--data", demos, "--out", tmp_path, "--run-name", "r", "--epochs", "2", *TINY)
    assert not (run / "last").exists() and (run / ".last.old").is_dir()
    state = json.loads((run / ".last.old" / "train_state.json").read_text())
    assert state["epoch"] == 0
    DrivingPolicy.from_pretrained(run / "last")          # loads the previous one, whole
    assert main([str(a) for a in ["train", "--data", demos, "--out", tmp_path, "--run-name", "r", "--resume",
                                  "--epochs", "2", *TINY]]) == 0
    assert [r["epoch"] for r in csv.DictReader((run / "metrics.csv").open())] == ["1", "2"]
    assert json.loads((run / "last" / "train_state.json").read_text())["epoch"] == 1
    assert hidden(run) == []


@pytest.mark.parametrize("point", ["writing", "publishing"])
def test_a_killed_dataset_write_leaves_no_dataset(tmp_path, point):
    patch = {"writing": "from minari.dataset._storages.hdf5_storage import HDF5Storage\n"
                        "HDF5Storage.update_episode_metadata = die",     # episodes written, their metadata not
             "publishing": "os.rename = die"}[point]                     # complete, not yet renamed
    killed(patch, f"""
        from nac_drive.data_collection.carracing_dataset import write_dataset
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from support.demos import synthetic_episodes
        write_dataset(target, "demo", synthetic_episodes(1, 8), "CarRacing-v3", expert="x", description="")
        """, tmp_path)
    assert not list(tmp_path.glob("nac_drive/demo/seeds-*")) and hidden(tmp_path) != []
    with pytest.raises(DatasetError, match="no Minari dataset"):
        find_datasets(tmp_path)
    write_dataset(tmp_path, "demo", synthetic_episodes(1, 8), "CarRacing-v3", expert="x", description="")
    assert len(load_episodes(tmp_path)) == 1 and hidden(tmp_path) == []


def test_collect_and_dagger_refuse_a_taken_dataset_name_before_driving(tmp_path, capsys):
    from nac_drive.pipeline.dagger import round_seeds

    mine = write_dataset(tmp_path, "mine", synthetic_episodes(1, 8), "CarRacing-v3", expert="x", description="")
    round_1 = synthetic_episodes(5, 8)
    for episode, seed in zip(round_1, round_seeds(1, 0, 5)):
        episode["seed"] = seed
    write_dataset(tmp_path, "dagger-r1-s0", round_1, "CarRacing-v3", expert="x", description="")
    before = (mine / "data" / "main_data.hdf5").read_bytes()
    assert main(["collect", "carracing", "--expert", "teacher", "--episodes", "1", "--out", str(tmp_path),
                 "--name", "mine"]) == 2                                          # the same track
    assert "mine/seeds-100000-100000-v1: a dataset of that name exists" in capsys.readouterr().err
    assert main(["collect", "carracing", "--expert", "teacher", "--episodes", "50", "--out", str(tmp_path),
                 "--name", "mine", "--workers", "2"]) == 2                         # a shard holding it
    assert "dataset mine already holds some of the tracks 100000..100024" in capsys.readouterr().err
    dagger = ["dagger", "--policy", str(tmp_path / "none"), "--data", str(tmp_path), "--rounds", "2"]
    assert main(dagger + ["--workers", "1"]) == 2
    assert "dagger-r1-s0/seeds-150005-150009-v1: a dataset of that name exists" in capsys.readouterr().err
    assert main(dagger + ["--workers", "2"]) == 2                                   # round 1's first shard: 150005..7
    assert "dataset dagger-r1-s0 already holds some of the tracks 150005..150007" in capsys.readouterr().err
    assert (mine / "data" / "main_data.hdf5").read_bytes() == before
    assert sorted(str(p.relative_to(tmp_path)) for p in find_datasets(tmp_path)) == [
        "nac_drive/dagger-r1-s0/seeds-150005-150009-v1", "nac_drive/mine/seeds-100000-100000-v1"]


def test_expert_runs_and_traces_take_new_folders(tmp_path, capsys):
    from nac_drive.agents.ppo_lab.training import train_expert
    from nac_drive.agents.ppo_lab.training_args import ExpertTrainArgs
    from nac_drive.interpret.trace import load_trace

    tiny = ExpertTrainArgs(out=str(tmp_path), run_name="r", n_envs=1, n_steps=8, batch_size=8, n_epochs=1,
                           total_frames=32, eval_every_frames=10**9, progress_bar=False)
    assert train_expert(tiny).parent == tmp_path / "r" and train_expert(tiny).parent == tmp_path / "r-2"
    assert json.loads((tmp_path / "r-2" / "args.json").read_text())["run_name"] == "r-2"   # resumable as is
    for name in ("run", "run-2"):
        assert main(["drive", "carracing", "--episodes", "1", "--max-steps", str(3 if name == "run" else 5),
                     "--trace", str(tmp_path / "run"), "--json"]) == 0
        assert json.loads(capsys.readouterr().out.splitlines()[-1])["trace"] == str(tmp_path / name)
    assert load_trace(tmp_path / "run").num_steps == 3 and load_trace(tmp_path / "run-2").num_steps == 5


def test_a_collect_overlapping_a_running_one_is_refused_at_start_and_a_killed_ones_claim_is_not(tmp_path, capsys):
    """Issue 44 item 6: two collects started at once with overlapping seeds into one
    --out both recorded, and the dataset held the shared tracks twice. Now the second is
    refused before driving, in one line, leaving nothing; once the first is killed
    (SIGKILL: its claim stays behind) its claim is stale and the same collect runs."""
    import time

    from nac_drive.data_collection.carracing_dataset import dataset_folder

    first = subprocess.Popen([sys.executable, "-m", "nac_drive.cli", "collect", "carracing", "--expert",
                              "teacher-discrete", "--episodes", "40", "--out", str(tmp_path), "--name", "x"],
                             cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    folder = dataset_folder(tmp_path, "x")
    try:
        deadline = time.monotonic() + 120
        while not (folder / "namespace_metadata.json").is_file():   # the first is driving
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
        second = ["collect", "carracing", "--expert", "teacher-discrete", "--episodes", "2", "--seed-base", "100039",
                  "--max-steps", "5", "--out", str(tmp_path), "--name", "x"]
        assert main(second) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"another collect (pid {first.pid}) is recording tracks 100000..100039" in err[0]
        assert first.poll() is None and sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    finally:
        first.kill()
        first.wait()
    assert [p.name for p in folder.glob(".claim.*")] == [f".claim.seeds-100000-100039.{first.pid}"]
    assert main(second) == 0
    assert sorted(p.name for p in folder.iterdir()) == [".claims.lock", "namespace_metadata.json",   # the lock stays
                                                         "seeds-100039-100040-v1"]
    assert [ep.seed for ep in load_episodes(folder)] == [100039, 100040]


def process_state(pid: int) -> tuple[str, int] | None:
    """(state letter, parent pid) of process ``pid`` from /proc, None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1])


def alive(pid: int) -> bool:
    state = process_state(pid)
    return state is not None and state[0] != "Z"   # a zombie has ended, only its exit status is left


def children_of(pid: int) -> list[int]:
    """The live processes whose parent is ``pid``."""
    return [int(p.name) for p in Path("/proc").glob("[0-9]*")
            if (state := process_state(int(p.name))) and state[0] != "Z" and state[1] == pid]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_collect_takes_its_workers_down_and_commits_nothing(tmp_path, sig):
    """Issue 44 item 2: killing `collect --workers 2` left orphan workers that finished, committed
    their shards after the kill, then slept forever at ~370 MB each."""
    import time

    run = subprocess.Popen([sys.executable, "-m", "nac_drive.cli", "collect", "carracing", "--expert",
                            "teacher-discrete", "--episodes", "4", "--workers", "2", "--out", str(tmp_path)],
                           cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while len(workers := children_of(run.pid)) < 2:   # both workers are driving
        assert run.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    time.sleep(1.0)
    run.send_signal(sig)
    run.wait()
    deadline = time.monotonic() + 5
    try:
        while any(alive(w) for w in workers):
            assert time.monotonic() < deadline, f"workers {workers} outlived their run"
            time.sleep(0.1)
    finally:   # a failing run leaves no orphans behind either
        for w in filter(alive, workers):
            os.kill(w, signal.SIGKILL)
    time.sleep(2.0)   # what an orphan would have committed by now
    assert not list(tmp_path.glob("nac_drive/*/seeds-*")), "a shard was committed after the run was killed"


def test_a_full_disk_ends_in_one_line_and_commits_no_shard_of_the_run(tmp_path, capsys, monkeypatch):
    """Issue 44 item 3: a disk filling during `collect` crashed h5py (exit 139) and left a
    `.partial`; with --workers 2 one shard was committed and a re-run was refused. Now a shard
    that would not fit is refused before it is written, and a run commits all its shards or none
    (here the second worker's disk is full, the first's is not)."""
    import collections
    import os as os_module

    from nac_drive.data_collection import carracing_dataset

    real = carracing_dataset.shutil.disk_usage
    first = tmp_path / "first-shard-asked"

    def one_worker_finds_the_disk_full(path):
        try:
            os_module.close(os_module.open(first, os_module.O_CREAT | os_module.O_EXCL))
            return real(path)
        except FileExistsError:
            return collections.namedtuple("usage", "total used free")(10**9, 10**9 - 2**20, 2**20)

    monkeypatch.setattr(carracing_dataset.shutil, "disk_usage", one_worker_finds_the_disk_full)
    out = tmp_path / "out"
    argv = ["collect", "carracing", "--expert", "teacher-discrete", "--episodes", "2", "--max-steps", "20",
            "--workers", "2", "--out", str(out)]
    assert main(argv) == 2
    *bars, err = capsys.readouterr().err.strip().splitlines()   # the progress bar's lines, then the one error line
    assert all(bar.startswith("episodes:") for bar in bars)
    assert "MiB free, a shard of these episodes needs" in err and "free some space" in err
    assert not list(out.glob("nac_drive/*/seeds-*")) and hidden(out) == []
    monkeypatch.setattr(carracing_dataset.shutil, "disk_usage", real)
    assert main(argv) == 0   # a plain re-run: nothing of the failed run is in its way
    assert [ep.seed for ep in load_episodes(out)] == [100000, 100001]


def test_a_checkpoint_that_fills_the_disk_ends_in_one_line_and_keeps_the_previous(tmp_path, demos, capsys,
                                                                                   monkeypatch):
    # once: exit 1, "a bug" (safetensors raises its own error when the disk fills)
    import collections

    from nac_drive.io import atomic, checkpoint

    args = [str(a) for a in ["train", "--data", demos, "--out", tmp_path, "--run-name", "r", *TINY]]
    assert main(args + ["--epochs", "1"]) == 0
    before = (tmp_path / "r" / "last" / "model.safetensors").read_bytes()

    def full(*_, **__):
        raise RuntimeError("I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(checkpoint, "save_file", full)
    monkeypatch.setattr(atomic.shutil, "disk_usage",
                        lambda path: collections.namedtuple("usage", "total used free")(10**9, 10**9 - 4096, 4096))
    capsys.readouterr()
    assert main(args + ["--epochs", "2", "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("nac-drive train: error: ") and "the disk is full (4096 bytes free)" in err
    assert (tmp_path / "r" / "last" / "model.safetensors").read_bytes() == before
    monkeypatch.undo()
    assert DrivingPolicy.from_pretrained(tmp_path / "r" / "last") is not None
