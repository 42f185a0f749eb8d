"""nac-drive tune: a resumable Optuna search per variant that drives validation tracks only (or drives nothing),
and its best.json taken by train --tuned and compare --tuned."""

import json
from pathlib import Path

import optuna
import pytest
import torch

import nac_drive.pipeline.drive as drive_module
from nac_drive.cli.main import main
from nac_drive.data_collection.carracing_dataset import write_dataset
from nac_drive.pipeline.compare import CompareArgs, variant_settings
from nac_drive.pipeline.train import best_epoch, train
from nac_drive.pipeline.train_args import TrainArgs
from nac_drive.pipeline.tune import SEARCH_SPACE, VALIDATION_SEED_BASE, TuneArgs, searched, tune
from nac_drive.pipeline.train_args import read_tuned
from nac_drive.simulators.carracing import EVAL_SEED_BASE
from support.demos import synthetic_episodes

torch.set_num_threads(1)
TINY = dict(window=4, epochs=1, windows_per_epoch=32, episodes=2, max_steps=15, progress=False)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("demos")
    write_dataset(root, "synthetic", synthetic_episodes(), "CarRacing-v3", expert="bands", description="test")
    return root


@pytest.fixture
def driven(monkeypatch):
    """Every track seed a trial drives, as drive_carracing is asked for it."""
    seeds, real = [], drive_module.drive_carracing

    def recording(args, progress=True):
        seeds.extend(range(args.seed_base, args.seed_base + args.episodes))
        return real(args, progress=progress)
    monkeypatch.setattr(drive_module, "drive_carracing", recording)
    return seeds


def completed(folder):
    study = optuna.load_study(study_name=folder.name, storage=f"sqlite:///{folder / 'study.db'}")
    return study, [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]


def test_the_search_space_leaves_what_a_variant_fixes_and_adds_its_cores_rows():
    assert set(searched("gru")) == set(SEARCH_SPACE["all"])
    assert set(searched("nac-exact")) == set(SEARCH_SPACE["all"]) | {"topk", "sparsity"}
    assert "topk" not in searched("nac-2k") and "sparsity" not in searched("nac-09s")
    assert "topk" not in searched("nac-pw")   # every key of the window: no K to search
    assert set(searched("mha")) == set(SEARCH_SPACE["all"]) | {"num_heads"}


@pytest.mark.slow
def test_tune_drives_validation_tracks_only_resumes_and_reruns_a_trial_cut_off(dataset, tmp_path, driven):
    args = TuneArgs(data=str(dataset), variant="gru", out=str(tmp_path), trials=2, **TINY)
    best = tune(args)
    folder = tmp_path / "gru"
    study, done = completed(folder)
    assert len(done) == 2 and best["trials"] == 2
    assert driven and all(VALIDATION_SEED_BASE <= s < EVAL_SEED_BASE for s in driven)   # never a held-out track
    assert sorted(set(driven)) == [VALIDATION_SEED_BASE, VALIDATION_SEED_BASE + 1]
    values = [t.user_attrs["value"] for t in done]
    assert best["value"] == max(values) and best["metric"] == "mean_return"
    assert best["train_args"] == {"core": "gru", **done[values.index(max(values))].params}
    assert json.loads((folder / "best.json").read_text()) == best

    # a process killed mid-trial leaves it RUNNING: the next run fails it and runs its parameters again
    cut = study.ask()
    lr = cut.suggest_float("lr", 1e-4, 3e-3, log=True)
    best = tune(TuneArgs(data=str(dataset), variant="gru", out=str(tmp_path), trials=3, **TINY))
    study, done = completed(folder)
    assert len(done) == 3 and best["trials"] == 3
    assert study.trials[cut.number].state == optuna.trial.TrialState.FAIL
    assert done[-1].params["lr"] == lr   # the trial cut off, run again with its lr
    assert len(list((folder / "runs").iterdir())) == 3   # two finished trials were not run again

    tune(TuneArgs(data=str(dataset), variant="gru", out=str(tmp_path), trials=4, **TINY))
    _, done = completed(folder)
    assert len({t.params["lr"] for t in done}) == 4   # a resumed search draws new values, not its first ones again

    with pytest.raises(ValueError, match="give another --out"):   # another budget would mix its trials in
        tune(TuneArgs(data=str(dataset), variant="gru", out=str(tmp_path), trials=4, **{**TINY, "epochs": 2}))


def test_the_val_loss_objective_drives_nothing_and_keeps_the_lowest_loss(dataset, tmp_path, driven, capsys):
    args = TuneArgs(data=str(dataset), variant="gru", out=str(tmp_path), trials=2, objective="val-loss", **TINY)
    best = tune(args)
    assert driven == []   # no track at all, held out or not
    _, done = completed(tmp_path / "gru")
    losses = [best_epoch(Path(t.user_attrs["run_dir"]) / "metrics.csv")["val_loss"] for t in done]
    assert [t.user_attrs["value"] for t in done] == losses and len(set(losses)) == 2
    assert best["metric"] == "val_loss" and best["value"] == min(losses)   # lowest, not highest
    assert best["train_args"] == {"core": "gru", **done[losses.index(min(losses))].params}
    # the CLI's summary (the study is complete: no trial more) names what scored, not tracks it never drove
    assert main(["tune", "--data", str(dataset), "--variant", "gru", "--out", str(tmp_path), "--trials", "2",
                 "--objective", "val-loss", "--window", "4", "--epochs", "1", "--windows-per-epoch", "32",
                 "--no-progress"]) == 0
    summary = capsys.readouterr().out
    assert f"val_loss {min(losses):.3f} on the validation episodes of the data" in summary
    assert "tracks" not in summary
    with pytest.raises(ValueError, match="give another --out"):   # a study scored one way takes no trials scored another
        tune(TuneArgs(data=str(dataset), variant="gru", out=str(tmp_path), trials=3, **TINY))


def test_a_second_search_of_one_study_is_refused_while_the_first_runs(dataset, tmp_path):
    from nac_drive.io.atomic import one_writer

    folder = tmp_path / "gru"
    folder.mkdir()
    with one_writer(folder, "nac-drive tune"):   # the first search, still running
        with pytest.raises(ValueError, match=r"gru: another nac-drive tune \(pid \d+\) is writing it"):
            tune(TuneArgs(data=str(dataset), variant="gru", out=str(tmp_path), trials=1, **TINY))
    assert list(folder.iterdir()) == []   # no study opened, no trial run; the first's lock gone


def test_train_and_compare_take_a_best_json_and_refuse_a_wrong_one(dataset, tmp_path):
    folder = tmp_path / "tuned" / "gru"
    folder.mkdir(parents=True)
    best = {"variant": "gru", "train_args": {"core": "gru", "lr": 5e-4, "weight_decay": 1e-3, "d_model": 8}}
    (folder / "best.json").write_text(json.dumps(best))
    run_dir = train(TrainArgs(data=str(dataset), out=str(tmp_path / "runs"), tuned=str(folder / "best.json"), window=4,
                              epochs=1, windows_per_epoch=32, progress=False))
    recorded = json.loads((run_dir / "train_args.json").read_text())
    assert recorded["core"] == "gru" and recorded["lr"] == 5e-4 and recorded["d_model"] == 8
    assert variant_settings(CompareArgs(data=str(dataset), tuned=str(tmp_path / "tuned"), variants=["gru"]),
                            "gru")["d_model"] == 8
    with pytest.raises(ValueError, match="no best.json for mha"):
        CompareArgs(data=str(dataset), tuned=str(tmp_path / "tuned"), variants=["gru", "mha"])
    with pytest.raises(ValueError, match="tuned for gru, not lstm"):
        read_tuned(folder / "best.json", "lstm")
    (folder / "best.json").write_text(json.dumps({"variant": "gru", "train_args": {"core": "gru", "lr_max": 1}}))
    with pytest.raises(ValueError, match="lr_max"):
        read_tuned(folder / "best.json")
    assert main(["train", "--data", str(dataset), "--tuned", str(folder / "best.json"), "--init-from", "x"]) == 2
    with pytest.raises(ValueError, match="which a run's own command decides"):   # a budget is not a search's
        (folder / "best.json").write_text(json.dumps({"variant": "gru", "train_args": {"core": "gru", "window": 8}}))
        read_tuned(folder / "best.json")


def test_flags_a_best_json_sets_or_its_core_ignores_are_refused(tmp_path, capsys):
    best = tmp_path / "best.json"
    best.write_text(json.dumps({"variant": "gru", "train_args": {"core": "gru", "lr": 5e-4, "d_model": 8}}))
    assert main(["train", "--data", "x", "--tuned", str(best), "--lr", "0.01"]) == 2
    assert f"--lr: --tuned {best} sets it" in capsys.readouterr().err
    assert main(["train", "--data", "x", "--tuned", str(best), "--mode", "euler"]) == 2   # the tuned core is a gru
    assert "--mode: the gru core does not use it" in capsys.readouterr().err
    (tmp_path / "t" / "gru").mkdir(parents=True)
    (tmp_path / "t" / "gru" / "best.json").write_text(best.read_text())
    assert main(["compare", "--data", "x", "--tuned", str(tmp_path / "t"), "--variants", "gru", "--d-model", "32"]) == 2
    assert "--d-model: --tuned sets each variant's own" in capsys.readouterr().err


def test_a_trial_that_errs_fails_and_is_not_run_again_while_a_killed_one_is(dataset, tmp_path, monkeypatch):
    import nac_drive.pipeline.tune as tune_module

    def broken(*_args, **_kwargs):
        raise RuntimeError("the trial's training broke")

    monkeypatch.setattr(tune_module, "_trial", broken)
    args = TuneArgs(data=str(dataset), variant="gru", out=str(tmp_path), trials=1, objective="val-loss", **TINY)
    with pytest.raises(RuntimeError, match="broke"):
        tune(args)
    study, _ = completed(tmp_path / "gru")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.FAIL]   # not left RUNNING for a rerun
    monkeypatch.undo()
    tune(args)
    study, done = completed(tmp_path / "gru")
    assert len(study.trials) == 2 and len(done) == 1   # one new trial; the failed one was not enqueued again
