"""Demonstration datasets (Minari), windows, and behaviour-cloning training."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from nac_drive.cli.arguments import add_dataclass_arguments
from nac_drive.data_collection.carracing_dataset import (DatasetError, WindowDataset, find_datasets, load_episodes,
                                                         split_by_episode, write_dataset)
from nac_drive.data_collection.episode_recorder import RecordEpisodes
from nac_drive.pipeline.train import EpochSampler, class_weights, train
from nac_drive.pipeline.train_args import TrainArgs
from nac_drive.policy.driving_policy import DrivingPolicy
from support.demos import synthetic_episodes
from support.window_by_window import window_by_window

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("demos")
    write_dataset(root, "synthetic", synthetic_episodes(), "CarRacing-v3", expert="bands", description="test")
    return root


def test_dataset_round_trip(dataset):
    eps = load_episodes(dataset)
    source = synthetic_episodes()
    assert len(eps) == 4
    for ep, src in zip(eps, source):
        assert ep.frames.dtype == np.uint8 and ep.frames.shape == (40, 96, 96, 3)
        np.testing.assert_array_equal(ep.frames, src["observations"][:40])   # lossless, aligned with actions
        np.testing.assert_array_equal(ep.actions, src["actions"])
        np.testing.assert_allclose(ep.timestamps, src["timestamps"][:40])
        assert ep.seed == src["seed"] and ep.expert == "bands"
    with pytest.raises(FileExistsError):
        write_dataset(dataset, "synthetic", synthetic_episodes(1), "CarRacing-v3", expert="x", description="")


def test_dataset_under_a_relative_folder_and_no_half_written_dataset(tmp_path, monkeypatch):
    import minari

    monkeypatch.chdir(tmp_path)
    path = write_dataset("demos", "rel", synthetic_episodes(1, 20), "CarRacing-v3", expert="x", description="")
    assert path.is_absolute() and len(load_episodes("demos")) == 1

    real = minari.create_dataset_from_buffers

    def dies_after_writing(dataset_id, *args, **kwargs):
        real(dataset_id, *args, **kwargs)
        raise KeyboardInterrupt   # e.g. Ctrl-C while the metadata is being written
    monkeypatch.setattr(minari, "create_dataset_from_buffers", dies_after_writing)
    with pytest.raises(KeyboardInterrupt):
        write_dataset("demos", "killed", synthetic_episodes(1, 20), "CarRacing-v3", expert="x", description="")
    assert not (tmp_path / "demos" / "nac_drive" / "killed").exists()
    assert [str(p) for p in find_datasets("demos")] == ["demos/nac_drive/rel/seeds-100000-100000-v1"]


def test_corrupt_and_inconsistent_files_are_named(tmp_path):
    root = tmp_path / "demos"
    path = write_dataset(root, "bad", synthetic_episodes(1, 20), "CarRacing-v3", expert="x", description="")
    h5 = path / "data" / "main_data.hdf5"
    with h5py.File(h5, "r+") as f:
        group = f["episode_0"]
        actions = group["actions"][()]
        del group["actions"]
        group["actions"] = actions + 7                     # no such discrete action
    with pytest.raises(DatasetError, match=r"main_data.hdf5 episode 0: actions"):
        load_episodes(root)
    h5.write_bytes(b"garbage" * 10)
    with pytest.raises(DatasetError, match="main_data"):
        load_episodes(root)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DatasetError, match="no Minari dataset"):
        load_episodes(empty)


def test_split_is_by_episode_and_windows_stay_inside_episodes(dataset):
    eps = load_episodes(dataset)
    train_eps, val_eps = split_by_episode(eps, 0.25, seed=0)
    assert len(val_eps) == 1 and len(train_eps) == 3
    assert {e.seed for e in train_eps}.isdisjoint({e.seed for e in val_eps})
    windows = WindowDataset(train_eps, window=8)
    assert len(windows) == 3 * (40 - 8 + 1)
    f, t, a = windows[len(windows) - 1]
    assert f.shape == (8, 3, 96, 96) and t[0] == 0 and torch.allclose(t.diff(), torch.full((7,), 0.02))
    np.testing.assert_array_equal(a.numpy(), train_eps[-1].actions[-8:])


def test_recorder_wrapper_keeps_what_the_env_emitted():
    gym = pytest.importorskip("gymnasium")
    class FrameCounter:   # an oracle: labels each frame with how many frames it has seen this episode
        def reset(self):
            self.seen = []

        def act(self, obs):
            self.seen.append(obs.copy())
            return len(self.seen)

    oracle = FrameCounter()
    env = RecordEpisodes(gym.make("CarRacing-v3", continuous=False), fps=50, oracle=oracle)
    with pytest.raises(RuntimeError, match="reset the env"):
        env.step(3)
    obs, _ = env.reset(seed=100_123)
    first = obs.copy()
    for _ in range(5):
        env.step(3)
    (episode,) = env.take_episodes()
    assert episode["observations"].shape == (6, 96, 96, 3) and np.array_equal(episode["observations"][0], first)
    assert episode["actions"].tolist() == [1, 2, 3, 4, 5]   # the oracle's answers, not the executed gas
    np.testing.assert_array_equal(np.stack(oracle.seen), episode["observations"][:5])   # it saw each frame
    env.reset(seed=100_124)
    assert oracle.seen == []                                  # reset with the env
    assert episode["truncations"][-1] and not episode["terminations"].any()   # cut short by the driver
    assert episode["seed"] == 100_123


def test_sampler_and_class_weights():
    ranks = [list(EpochSampler(100, 40, seed=1, rank=r, world=2)) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == 20 and set(ranks[0]).isdisjoint(ranks[1])
    assert ranks[0] == list(EpochSampler(100, 40, seed=1, rank=0, world=2))
    later = EpochSampler(100, 40, seed=1)
    later.epoch = 1
    assert list(later) != list(EpochSampler(100, 40, seed=1))
    w = class_weights(np.array([0, 0, 0, 1]), 3, "balanced")
    assert w[1] == pytest.approx(3 * w[0]) and w[2] <= 10 * w.min()
    assert class_weights(np.array([0, 1]), 2, "none") is None
    with pytest.raises(ValueError, match="class_weighting"):
        class_weights(np.array([0, 1]), 2, "balance")
    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser, TrainArgs)   # the flag offers exactly the accepted values
    assert parser.parse_args(["--class-weighting", "balanced"]).class_weighting == "balanced"
    with pytest.raises(SystemExit):
        parser.parse_args(["--class-weighting", "balance"])


def test_training_learns_and_resumes(dataset, tmp_path):
    args = TrainArgs(data=str(dataset), out=str(tmp_path), window=4, d_model=16, num_heads=2, topk=3, epochs=3,
                     windows_per_epoch=192, batch_size=16, lr=3e-3, progress=False, val_fraction=0.25)
    run = train(args)
    rows = (run / "metrics.csv").read_text().splitlines()
    assert len(rows) == 4
    last = dict(zip(rows[0].split(","), rows[-1].split(",")))
    assert float(last["val_accuracy"]) > 0.5        # chance is 0.2: the bands were learned
    assert (run / "best" / "config.json").is_file() and (run / "last" / "optimizer.safetensors").is_file()
    card = (run / "best" / "README.md").read_text()
    assert f"| data | {dataset} |" in card   # the model card names the data it learnt from
    saved = json.loads((run / "train_args.json").read_text())
    assert saved["data_info"]["val_episodes"] == 1 and saved["core"] == "nac"
    # resume: the optimizer state comes back and training continues from epoch 4
    args.epochs, args.resume = 4, True
    train(args)
    rows = (run / "metrics.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == ["1", "2", "3", "4"]


def test_a_fine_tune_is_named_after_the_core_it_trains_not_the_flags_defaults(dataset, tmp_path):
    tiny = dict(data=str(dataset), out=str(tmp_path), window=4, d_model=16, epochs=1, windows_per_epoch=32,
                batch_size=16, progress=False, val_fraction=0.25)
    gru = train(TrainArgs(core="gru", **tiny))
    assert gru.name == "carracing__gru__w4__s0"
    tiny.pop("window"), tiny.pop("d_model")   # --init-from takes the checkpoint's architecture
    tuned = train(TrainArgs(init_from=str(gru / "best"), seed=1, **tiny))
    assert tuned.name == "carracing__gru__w4__s1"   # the defaults (core nac, window 16) would say nac-exact, w16


def _last_weights(run: Path) -> dict:
    """A training run's last/ weights, name -> tensor."""
    from safetensors.torch import load_file

    return load_file(run / "last" / "model.safetensors")


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


def test_the_seed_decides_the_trained_weights(dataset, tmp_path):
    """Same data and seed: the same weights, bit for bit (what makes a quickstart run repeat
    its score); another seed: other weights."""
    def weights(seed: int, out: str) -> dict:
        args = TrainArgs(data=str(dataset), out=str(tmp_path / out), window=4, d_model=16, num_heads=2, topk=3,
                         epochs=2, windows_per_epoch=64, batch_size=16, progress=False, seed=seed)
        return _last_weights(train(args))

    first, again, other = weights(0, "a"), weights(0, "b"), weights(1, "c")
    assert first.keys() == again.keys() == other.keys()
    assert _same(first, again) and not _same(first, other)


def test_a_killed_and_resumed_run_trains_the_weights_of_an_uninterrupted_one(dataset, tmp_path, monkeypatch):
    """Killed in epoch 2 of 2 and resumed: epoch 2 draws what it drew uninterrupted (its
    windows and its dropout masks), so the final weights are the same bit for bit (once, a
    resumed DAgger round drove 874 where the uninterrupted one drove 902)."""
    from nac_drive.pipeline import train as train_module

    def run(name: str, **changes) -> Path:
        return train(TrainArgs(data=str(dataset), out=str(tmp_path), run_name=name, window=4, d_model=16,
                               num_heads=2, topk=3, epochs=2, windows_per_epoch=64, batch_size=16, progress=False,
                               **changes))

    whole = run("whole")
    real, calls = train_module.evaluate, []

    def killed_in_epoch_2(*args, **kwargs):   # epoch 2 trained, its last/ never written
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(train_module, "evaluate", killed_in_epoch_2)
    with pytest.raises(KeyboardInterrupt):
        run("killed")
    monkeypatch.setattr(train_module, "evaluate", real)
    assert json.loads((tmp_path / "killed" / "last" / "train_state.json").read_text())["epoch"] == 0
    resumed = run("killed", resume=True)
    assert DrivingPolicy.from_pretrained(whole / "last").config.head_dropout > 0   # a draw to get wrong
    assert _same(_last_weights(whole), _last_weights(resumed))


def test_training_alone_uses_every_core_and_gives_the_caller_its_threads_back(monkeypatch):
    """A lone process trains on every core (one batch is big enough to share); under
    torchrun each rank keeps one thread; either way the caller's count comes back."""
    from nac_drive.pipeline import train as train_module

    seen = []
    monkeypatch.setattr(train_module, "_train",
                        lambda args, held, device: seen.append(torch.get_num_threads()) or Path("run"))
    monkeypatch.setattr(train_module, "available_cores", lambda: 3)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert train(TrainArgs()) == Path("run")
    assert torch.get_num_threads() == 1   # this module's setting, restored
    monkeypatch.setenv("WORLD_SIZE", "2")
    train(TrainArgs())
    assert seen == [3, 1]


def test_tensorboard_has_step_scalars_grouped_tags_and_hparams(dataset, tmp_path):
    """Read back with TensorBoard's own readers: per-step train scalars, val/ per epoch,
    no duplicate steps after a resume, and HParams sessions that set runs of two cores side by side."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer
    from tensorboard.plugins.hparams import metadata

    tiny = dict(data=str(dataset), out=str(tmp_path), window=4, d_model=16, num_heads=2, topk=3,
                windows_per_epoch=64, batch_size=16, progress=False, val_fraction=0.25)
    nac = train(TrainArgs(**tiny, epochs=2, run_name="nac"))
    train(TrainArgs(**tiny, epochs=3, run_name="nac", resume=True))        # steps 9..12 appended once
    train(TrainArgs(**tiny, epochs=1, core="gru", run_name="gru"))

    events = EventAccumulator(str(nac / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {t.split("/")[0] for t in tags} == {"train", "val"} and "train/loss" in tags
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, 13))   # 4 steps an epoch
    assert [e.step for e in events.Scalars("val/loss")] == [4, 8, 12]
    val_loss = [float(r.split(",")[3]) for r in (nac / "metrics.csv").read_text().splitlines()[1:]]
    assert [e.value for e in events.Scalars("val/loss")] == pytest.approx(val_loss, rel=1e-6)

    runs = EventMultiplexer()
    runs.AddRunsFromDirectory(str(tmp_path))
    runs.Reload()
    sessions = {run: metadata.parse_session_start_info_plugin_data(tags[metadata.SESSION_START_INFO_TAG])
                for run, tags in runs.PluginRunToTagToContent(metadata.PLUGIN_NAME).items()}
    cores = {run.split("/")[0]: session.hparams["core"].string_value for run, session in sessions.items()}
    assert cores == {"nac": "nac", "gru": "gru"}
    window = {session.hparams["window"].number_value for session in sessions.values()}
    assert window == {4.0}


@pytest.mark.slow
def test_torchrun_two_processes_end_with_identical_weights(dataset, tmp_path):
    # the README's command: torchrun starts the installed `nac-drive train` twice
    nac_drive_cli = str(Path(sys.executable).parent / "nac-drive")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29517",
           "--no-python", nac_drive_cli, "train", "--data", str(dataset), "--out", str(tmp_path), "--window", "4",
           "--d-model", "16", "--num-heads", "2", "--topk", "3", "--epochs", "1", "--windows-per-epoch", "64",
           "--batch-size", "8", "--no-progress"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("best checkpoint:") == 1
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    ranks = json.loads((run / "ddp_ranks.json").read_text())
    assert ranks["world_size"] == 2
    a, b = ranks["param_checksums"]
    assert a == b
    saved = json.loads((run / "train_args.json").read_text())
    assert saved["world_size"] == 2


def _sensitive(policy):
    """An untrained policy's outputs barely depend on its frames (a few 1e-4 apart): scale its
    head so that a window scored with another window's frames changes the loss."""
    with torch.no_grad():
        policy.head[-1].weight.mul_(1000.0)
    return policy.eval()


def _counting_encoder(policy):
    """Counts the frames the policy's encoder sees."""
    seen = []
    policy.encoder.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0].shape[0]))
    return seen


@pytest.mark.parametrize("limit", [0, 50])
def test_validation_encodes_each_frame_once_and_scores_every_window_as_a_whole_run_does(dataset, limit):
    """Windows of 8 overlap: 3 episodes of 40 frames hold 99 windows but 120 frames."""
    from nac_drive.pipeline.train import evaluate, validation_windows
    from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig

    windows = WindowDataset(load_episodes(dataset)[:3], window=8)
    policy = _sensitive(DrivingPolicy(PolicyConfig()))
    weights = torch.tensor([1.0, 2.0, 0.5, 1.0, 3.0])
    idx = validation_windows(len(windows), limit, seed=7)
    assert len(idx) == (limit or len(windows))
    loss, accuracy = window_by_window(policy, windows, idx, 16, weights)
    seen = _counting_encoder(policy)
    got = evaluate(policy, windows, weights, limit, batch_size=16, seed=7)
    assert got["loss"] == pytest.approx(loss, rel=1e-5) and got["accuracy"] == pytest.approx(accuracy)
    frames = {(windows.index[i][0], windows.index[i][1] + p) for i in idx for p in range(8)}
    assert sum(seen) == len(frames) < 8 * len(idx)


@pytest.mark.parametrize("stride, windows", [(1, 13 + 7), (3, 5 + 3)])
def test_udacity_validation_encodes_each_frame_once_and_scores_every_window_as_a_whole_run_does(tmp_path, stride,
                                                                                                windows):
    import datetime as dt

    from nac_drive.data_collection.udacity_dataset import UdacityWindowDataset, segments_from_log
    from nac_drive.data_collection.udacity_log import DrivingLogWriter
    from nac_drive.pipeline.train import evaluate
    from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig

    rng, when = np.random.default_rng(0), dt.datetime(2026, 1, 1, 12)
    with DrivingLogWriter(tmp_path) as log:
        for k in range(30):   # a 5 s gap before frame 18: two segments
            when += dt.timedelta(seconds=5 if k == 18 else 0.067)
            log.write(rng.integers(0, 256, (160, 320, 3), dtype=np.uint8), rng.uniform(-1, 1), 0.3, 0.0, 9.0,
                      when=when)
    segments = segments_from_log(tmp_path / "driving_log.csv")
    policy = _sensitive(DrivingPolicy(PolicyConfig(task="udacity", encoder="pilotnet", action="continuous",
                                                   num_outputs=1, frame_dt=1 / 15)))
    with pytest.raises(ValueError, match="must not be augmented"):   # it would score other frames than training's
        evaluate(policy, UdacityWindowDataset(segments, window=6, augment=True), None, 0, batch_size=4, seed=0)
    held_out = UdacityWindowDataset(segments, window=6, stride=stride)
    loss, mae = window_by_window(policy, held_out, np.arange(len(held_out)), 4, None)
    seen = _counting_encoder(policy)
    got = evaluate(policy, held_out, None, 0, batch_size=4, seed=0)
    assert got["loss"] == pytest.approx(loss, rel=1e-5) and got["mae"] == pytest.approx(mae, rel=1e-5)
    assert sum(seen) == 30 and len(held_out) == windows


def test_a_budget_that_would_run_no_optimiser_step_is_refused_before_training(dataset, tmp_path):
    """The loader drops a partial batch: fewer windows an epoch than one batch trained nothing
    and still wrote best/ (issue 58)."""
    from nac_drive.pipeline.compare import CompareArgs

    with pytest.raises(ValueError, match="--windows-per-epoch 16: fewer windows than one batch .--batch-size 32"):
        TrainArgs(windows_per_epoch=16)
    TrainArgs(windows_per_epoch=16, batch_size=16)   # one batch: fine
    with pytest.raises(ValueError, match="--windows-per-epoch 8: fewer windows than one batch"):
        CompareArgs(data="x", windows_per_epoch=8)
    with pytest.raises(ValueError, match="--dagger-windows-per-epoch 8"):
        CompareArgs(data="x", dagger_rounds=1, dagger_windows_per_epoch=8)
    with pytest.raises(ValueError, match="windows an epoch, fewer than one batch .--batch-size 512"):   # all: too few
        train(TrainArgs(data=str(dataset), out=str(tmp_path), window=4, windows_per_epoch=0, batch_size=512,
                        progress=False))
    assert list(tmp_path.iterdir()) == []   # refused before the run folder was made


def test_dagger_from_a_run_folder_starts_from_its_best_checkpoint(dataset, tmp_path, monkeypatch):
    """A run folder as --policy means its best/ from the start: round 0 once drove the folder,
    then its fine-tuning failed on a missing config.json, its dataset already committed (issue 58)."""
    import nac_drive.pipeline.dagger as dagger_module
    from nac_drive.pipeline.dagger import DaggerArgs, dagger
    from nac_drive.policy import DrivingPolicy, PolicyConfig

    DrivingPolicy(PolicyConfig()).save_pretrained(tmp_path / "run" / "best")   # the dataset's GAS
    driven = []

    def stop(runs, *, policy_path, **kwargs):
        driven.append(Path(policy_path))
        raise KeyboardInterrupt   # enough: what round 0 would drive is known
    monkeypatch.setattr(dagger_module, "drive_round", stop)
    with pytest.raises(KeyboardInterrupt):
        dagger(DaggerArgs(policy=str(tmp_path / "run"), rounds=1, episodes=1, workers=1),
               TrainArgs(data=str(dataset), out=str(tmp_path / "out"), progress=False))
    assert driven == [tmp_path / "run" / "best"]


def test_best_epoch_is_the_epoch_best_holds(tmp_path):
    """best/ is chosen by validation loss, or without a validation set by training loss: the row
    `nac-drive train` reports as best is that epoch's, not the first row's."""
    from nac_drive.pipeline.train import _append_csv, best_epoch

    def rows(val_losses):
        path = tmp_path / f"metrics-{len(list(tmp_path.iterdir()))}.csv"
        for epoch, (train_loss, val_loss) in enumerate(zip([0.9, 0.5, 0.7, 0.5], val_losses), start=1):
            _append_csv(path, {"epoch": epoch, "train_loss": train_loss, "val_loss": val_loss})
        return path

    nan = float("nan")
    assert best_epoch(rows([nan] * 4)) == {"epoch": 2.0, "train_loss": 0.5, "val_loss": None}   # first of the lowest
    assert best_epoch(rows([0.8, 0.6, 0.4, 0.45]))["epoch"] == 3.0
