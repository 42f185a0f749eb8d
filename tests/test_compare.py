"""nac-drive compare: variants trained and driven alike, several seeds, one table; train --eval-episodes."""

import csv
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
import torch

from nac_drive.cli.main import main
from nac_drive.data_collection.carracing_dataset import write_dataset
from nac_drive.io.atomic import one_writer
from nac_drive.pipeline.compare import VARIANTS, CompareArgs, RunResult, compare, summarise, t_interval
from nac_drive.torch_threads import available_cores
from support.demos import synthetic_episodes

torch.set_num_threads(1)
TINY = ["--window", "4", "--d-model", "16", "--epochs", "1", "--windows-per-epoch", "32", "--no-progress"]


def refuse(token):
    """parse_constant for json.loads: NaN and Infinity are not JSON."""
    raise ValueError(f"non-standard JSON token {token}")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("demos")
    write_dataset(root, "synthetic", synthetic_episodes(), "CarRacing-v3", expert="bands", description="test")
    return root


def killed_at_validation(n: int, args: CompareArgs, monkeypatch) -> None:
    """``compare(args)`` killed (Ctrl-C) in training's ``n``-th validation pass."""
    import nac_drive.pipeline.train as training

    real, calls = training.evaluate, []

    def killed(*a, **k):
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(training, "evaluate", killed)
    with pytest.raises(KeyboardInterrupt):
        compare(args)
    monkeypatch.setattr(training, "evaluate", real)


def run_cli(argv, capsys) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().out


def test_t_interval_is_the_students_t_interval_of_the_seeds():
    lo, hi = t_interval([0.80, 0.82, 0.84])
    # mean 0.82, sd 0.02, t(0.975, 2) = 4.3027: half-width 0.0496843
    assert (lo, hi) == pytest.approx((0.82 - 0.0496843, 0.82 + 0.0496843), abs=1e-5)
    assert t_interval([0.8]) is None


def test_a_variant_pools_every_episode_of_its_seeds_and_keeps_each_seeds_mean():
    loops = [{"returns": [900.0, 800.0], "laps_finished": 1, "mean_return": 850.0},
             {"returns": [700.0, 950.0], "laps_finished": 1, "mean_return": 825.0}]
    runs = [RunResult("gru", s, f"r{s}", "carracing", 0.5, acc, None, loop)
            for s, acc, loop in zip((0, 1), (0.7, 0.9), loops)]
    row = summarise("gru", runs)
    assert row["val_accuracy"] == pytest.approx(0.8) and row["val_accuracy_per_seed"] == [0.7, 0.9]
    loop = row["closed_loop"]
    assert loop["episodes"] == 4 and loop["mean_return"] == pytest.approx(837.5)
    assert loop["worst_return"] == 700.0 and loop["successes"] == 2 and loop["laps_finished"] == 2
    assert loop["mean_return_per_seed"] == [850.0, 825.0]
    assert loop["mean_ci95"][0] < 837.5 < loop["mean_ci95"][1]


def test_a_variants_interval_over_seeds_of_the_same_tracks_counts_seeds_and_tracks():
    def drive(returns, cte):
        return {"returns": returns, "seeds": [900000, 900001, 900002], "laps_finished": 0,
                "mean_return": float(np.mean(returns)), "mean_abs_cte_m": cte, "off_road_tracks": 0}

    runs = [RunResult("gru", s, f"r{s}", "udacity", 0.5, None, 0.1, drive([310.0, 910.0, 610.0], cte))
            for s, cte in ((0, [0.10, 0.20, 0.30]), (1, [0.30, 0.40, 0.50]))]
    loop = summarise("gru", runs)["closed_loop"]
    assert loop["ci_over"] == "seeds and tracks"
    # the seeds drive alike: the tracks' means 310, 910, 610 (variance 90000, over 3) alone, t(0.975, 2) = 4.3027
    assert loop["mean_ci95"] == [pytest.approx(610 - 745.25, abs=0.01), pytest.approx(610 + 745.25, abs=0.01)]
    # |cte|: seed means 0.2 and 0.4 (variance 0.02, over 2: 0.01), tracks' means 0.2, 0.3, 0.4 (0.01, over 3)
    se, df = math.sqrt(0.01 + 0.01 / 3), (0.01 + 0.01 / 3) ** 2 / (0.01 ** 2 / 1 + (0.01 / 3) ** 2 / 2)
    half = stats.t.ppf(0.975, df) * se
    assert loop["mean_abs_cte_ci95"] == [pytest.approx(0.3 - half, abs=1e-4), pytest.approx(0.3 + half, abs=1e-4)]
    alone = summarise("gru", runs[:1])["closed_loop"]   # one seed: the episodes' bootstrap, as a drive reports it
    assert alone["ci_over"] == "episodes" and alone["mean_ci95"][0] >= 310   # a bootstrap stays within the data


def test_each_variant_is_paired_with_the_first_on_the_same_tracks_with_every_seed_of_each():
    from nac_drive.pipeline.compare import markdown_table, paired_with

    def run(variant, seed, returns, dropped=None, tracks=(900000, 900001, 900002)):
        loop = {"returns": returns, "seeds": list(tracks), "laps_finished": 0, "mean_return": float(np.mean(returns))}
        drops = {"0.5": {**loop, "returns": dropped}} if dropped else None
        return RunResult(variant, seed, f"{variant}{seed}", "carracing", 0.5, 0.8, None, loop, frame_drops=drops)

    # hard and easy tracks: the spread between them is wide, the per-track gain a steady +10 on every seed
    nac = [run("nac-exact", 0, [300.0, 900.0, 600.0], [200.0, 800.0, 500.0]), run("nac-exact", 1, [300.0, 900.0, 600.0])]
    mha = [run("mha", 1, [310.0, 910.0, 610.0]), run("mha", 0, [310.0, 910.0, 610.0], [190.0, 805.0, 500.0])]
    paired = paired_with("nac-exact", nac, mha)
    assert paired["reference"] == "nac-exact" and paired["value"] == "return"
    assert paired["0"]["mean"] == pytest.approx(10.0) and (paired["0"]["tracks"], paired["0"]["runs"]) == (3, [2, 2])
    assert paired["0"]["ci95"] == [pytest.approx(10.0), pytest.approx(10.0)]   # no spread left once paired
    assert summarise("mha", mha)["closed_loop"]["mean_ci95"][1] - 10 > 100    # the pooled interval is wide
    assert paired["0.5"]["runs"] == [1, 1] and paired["0.5"]["mean"] == pytest.approx(-5 / 3)   # seed 0 alone
    report = {"task": "carracing", "seeds": [0, 1], "episodes": 3, "max_steps": None, "tuned": None, "dagger": None,
              "budget": {"window": 16, "epochs": 1, "windows_per_epoch": 8, "d_model": 16},
              "variants": [summarise("nac-exact", nac), {**summarise("mha", mha), "paired": paired}]}
    table = markdown_table(report)
    assert "| paired against nac-exact: return change [95% CI] (tracks x seeds vs its seeds) | frame-drop 0 | " \
           "frame-drop 0.5 |" in table
    assert "| mha | +10.0 [+10.0, +10.0] (3 x 2 vs 2) | -1.7" in table
    # one mha seed drives 50 better on every track, the other 50 worse: the seeds, not the six (seed, track)
    # pairs, are what varies: their means' variance 5000 over 2 seeds, SE 50, t(0.975, 1 df) = 12.7062
    swinging = [run("mha", 0, [350.0, 950.0, 650.0]), run("mha", 1, [250.0, 850.0, 550.0])]
    swing = paired_with("nac-exact", nac, swinging)["0"]
    assert swing["mean"] == pytest.approx(0.0) and swing["df"] == pytest.approx(1.0)
    assert swing["ci95"] == [pytest.approx(-635.31, abs=0.01), pytest.approx(635.31, abs=0.01)]
    with pytest.raises(ValueError, match="mha and nac-exact drove other tracks at frame-drop 0"):
        paired_with("nac-exact", nac, [run("mha", 0, [1.0, 2.0, 3.0], tracks=(900003, 900004, 900005))])


@pytest.mark.parametrize("change, message", [
    ({"variants": ["nac-fc"]}, "--variants: must be one of"),
    ({"variants": ["gru", "gru"]}, "--variants: at least one, each once"),
    ({"seeds": [0, 0]}, "--seeds: at least one, each once"),
    ({"seeds": [-1]}, "--seeds: must be >= 0"),
    ({"variants": ["nac-exact", "nac-pw"], "window": 8}, "--window 8: nac-pw .every key. equals nac-exact"),
    ({"workers": available_cores() + 1}, f"--workers: {available_cores() + 1} is more than the"),
])
def test_bad_variants_or_seeds_are_refused_before_any_training(change, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        CompareArgs(**{"data": str(tmp_path), **change})


def crafted_results(tmp_path, episodes: int = 20, max_steps: int | None = None, **changes) -> list[str]:
    """A comparison of gru, seeds 0 and 1, whose results are on disk (nothing to train): each drove
    ``episodes`` tracks (returns 900, 800, 900, ...); ``changes`` replace fields of seed 0's result.
    Returns compare's argv."""
    from nac_drive.pipeline.compare import shared_budget

    argv = ["compare", "--data", str(tmp_path / "data"), "--out", str(tmp_path / "cmp"), "--variants", "gru",
            "--seeds", "0", "1", "--episodes", str(episodes), "--no-progress"]
    argv += ["--max-steps", str(max_steps)] if max_steps else []
    (tmp_path / "data").mkdir()
    (tmp_path / "cmp" / "results").mkdir(parents=True)
    budget = shared_budget(CompareArgs(data=str(tmp_path / "data"), variants=["gru"], seeds=[0, 1],
                                       episodes=episodes, max_steps=max_steps))
    returns = [900.0 - 100 * (i % 2) for i in range(episodes)]
    loop = {"returns": returns, "seeds": list(range(900000, 900000 + episodes)), "laps_finished": 1,
            "mean_return": sum(returns) / episodes}
    for seed in (0, 1):
        result = vars(RunResult("gru", seed, f"r{seed}", "carracing", 0.5, 0.8, None, loop, budget))
        result.update(changes if seed == 0 else {})
        (tmp_path / "cmp" / "results" / f"gru__s{seed}.json").write_text(json.dumps(result))
    return argv


@pytest.mark.parametrize("changes, message", [
    ({"val_accuracy": "0.9"}, "val_accuracy: expected a number, got '0.9'"),
    ({"val_accuracy": None}, "val_accuracy: expected a number, got None"),
    ({"closed_loop": {"returns": [900.0], "mean_return": 900.0}}, "closed_loop: laps_finished: expected a count"),
    ({"variant": "lstm"}, "it holds 'lstm' seed 0, not 'gru' seed 0"),
    ({"closed_loop": {"returns": [900.0], "laps_finished": 1, "mean_return": 900.0}},   # pairing reads the tracks
     "closed_loop: seeds: expected a list"),
    ({"closed_loop": {"returns": [float("inf")], "laps_finished": 0, "mean_return": 0.0}},
     "closed_loop: returns: expected a list of finite numbers"),
])
def test_a_crafted_result_is_refused_in_one_line_naming_its_file(changes, message, tmp_path, capsys):
    code = main(crafted_results(tmp_path, **changes))
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0, err
    assert f"gru__s0.json: not a comparison result ({message}" in err


def test_a_policy_driven_beside_is_paired_with_every_seed_of_the_reference_on_the_same_tracks():
    from nac_drive.pipeline.compare import also_row, markdown_table

    def loop(returns):
        return {"returns": returns, "seeds": [900000, 900001, 900002], "laps_finished": 0,
                "mean_return": float(np.mean(returns))}

    gru = [RunResult("gru", s, f"r{s}", "carracing", 0.5, 0.8, None, loop(r), frame_drops={"0.5": loop(r)})
           for s, r in ((0, [300.0, 900.0, 600.0]), (1, [310.0, 890.0, 620.0]))]
    drives = {"0": loop([315.0, 905.0, 620.0]), "0.5": loop([300.0, 900.0, 600.0])}
    row = also_row("shipped:nac", drives, "carracing", "gru", gru)
    assert row["closed_loop"]["mean_return"] == pytest.approx(613.333, abs=1e-3)
    assert row["frame_drops"]["0.5"]["episodes"] == 3
    paired = row["paired"]
    # per track against the seeds' mean: 315 - 305, 905 - 895, 620 - 610: +10 on each of the 3 tracks, no spread
    # there; gru's two seeds differ (means 600 and 606.67: variance 22.22, over 2 seeds 11.11, SE 3.333), the one
    # policy adds none: 10 +- t(0.975, 1 df) 12.7062 x 3.333
    assert paired["0"]["mean"] == pytest.approx(10.0) and (paired["0"]["tracks"], paired["0"]["runs"]) == (3, [2, 1])
    assert paired["0"]["ci95"] == [pytest.approx(10 - 42.354, abs=1e-3), pytest.approx(10 + 42.354, abs=1e-3)]
    # 300 - 305, 900 - 895, 600 - 610: mean -10/3
    assert paired["0.5"]["mean"] == pytest.approx(-10 / 3)
    report = {"task": "carracing", "seeds": [0, 1], "episodes": 3, "max_steps": None, "tuned": None, "dagger": None,
              "budget": {"window": 16, "epochs": 1, "windows_per_epoch": 8, "d_model": 16},
              "variants": [summarise("gru", gru)], "also": [row]}
    table = markdown_table(report)
    assert "| shipped:nac (driven, not trained here) | - | 613.3" in table
    assert "| shipped:nac (driven, not trained here) | +10.0 [" in table   # the paired table
    with pytest.raises(ValueError, match="--also shipped:nac and gru drove other tracks at frame-drop 0"):
        also_row("shipped:nac", {"0": {**drives["0"], "seeds": [1, 2, 3]}}, "carracing", "gru", gru)


def test_also_drives_a_shipped_policy_once_beside_the_comparison(tmp_path, capsys, monkeypatch):
    from nac_drive.pipeline import drive
    from nac_drive.policy.loading import shipped_policy_path

    argv = crafted_results(tmp_path, episodes=2, max_steps=30) + ["--also", "shipped:nac", "--json"]
    code, printed = run_cli(argv, capsys)
    assert code == 0
    report = json.loads(printed.strip().splitlines()[-1], parse_constant=refuse)
    (row,) = report["also"]
    alone = drive.drive_checkpoint(shipped_policy_path("carracing"), "carracing", 2, 30, progress=False)
    assert row["policy"] == "shipped:nac" and row["closed_loop"]["episodes"] == 2
    assert row["closed_loop"]["mean_return"] == pytest.approx(alone["mean_return"], abs=0.005)   # rounded
    assert row["paired"]["0"]["mean"] == pytest.approx(alone["mean_return"] - 850.0, abs=0.005)
    assert "shipped:nac (driven, not trained here)" in (tmp_path / "cmp" / "compare.md").read_text()

    def never(*a, **k):
        raise AssertionError("driven again")

    monkeypatch.setattr(drive, "drive_checkpoint", never)   # kept in OUT/results: the same row, not driven again
    code, printed = run_cli(argv, capsys)
    assert code == 0 and json.loads(printed.strip().splitlines()[-1])["also"] == report["also"]
    # a kept drive that is not whole, or was driven with other weights, is refused before any run trains: here
    # gru seed 1 would train next (on no dataset, which would fail otherwise)
    (tmp_path / "cmp" / "results" / "gru__s1.json").unlink()
    (kept,) = (tmp_path / "cmp" / "results").glob("also__*.json")
    whole = json.loads(kept.read_text())
    for broken, refusal in (({**whole, "drives": {"0": {"returns": []}}}, "not a comparison's drive"),
                            ({**whole, "drives": {"0": {k: v for k, v in whole["drives"]["0"].items() if k != "seeds"}}},
                             "0: seeds: expected a list"),
                            ({**whole, "budget": {**whole["budget"], "sha256": "0" * 64}}, "not the drive of --also")):
        kept.write_text(json.dumps(broken))
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and f"{kept}: " in err and refusal in err, err
        assert not (tmp_path / "cmp" / "runs").exists()


def test_also_refuses_a_policy_of_another_task_before_any_training(tmp_path, capsys):
    from nac_drive.policy.loading import shipped_policy_path

    udacity = str(shipped_policy_path("udacity"))
    code = main(["compare", "--data", str(tmp_path), "--out", str(tmp_path / "cmp"), "--also", udacity,
                 "--variants", "gru", "--seeds", "0", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0
    assert f"--also {udacity}: policy: " in err and "is a 'udacity' policy, not a 'carracing' one" in err
    assert not (tmp_path / "cmp" / "runs").exists()


def test_compare_json_is_strict_json_with_non_finite_numbers_as_null(tmp_path, capsys):
    argv = crafted_results(tmp_path, val_accuracy=float("nan"),
                           closed_loop={"returns": [900.0, 800.0], "seeds": [900000, 900001], "laps_finished": 1,
                                        "mean_return": float("inf")})
    assert main(argv) == 0

    report = json.loads((tmp_path / "cmp" / "compare.json").read_text(), parse_constant=refuse)
    assert report["variants"][0]["val_accuracy"] is None
    assert report["variants"][0]["val_accuracy_per_seed"] == [None, 0.8]
    assert report["variants"][0]["closed_loop"]["mean_return_per_seed"] == [None, 850.0]


@pytest.mark.skipif(available_cores() < 2, reason="--workers 2 needs two cores")
def test_a_run_that_fails_in_a_worker_ends_the_comparison_with_its_error(tmp_path, capsys):
    code = main(["compare", "--data", str(tmp_path), "--out", str(tmp_path / "cmp"), "--workers", "2",
                 "--variants", "gru", "lstm", "--seeds", "0", "--no-progress"])
    assert code == 2 and "no Minari dataset" in capsys.readouterr().err
    assert not (tmp_path / "cmp" / "results").exists()


def test_every_variant_sets_train_arguments_that_exist_and_differ():
    from nac_drive.pipeline.train_args import TrainArgs

    settings = [tuple(sorted(v.items())) for v in VARIANTS.values()]
    assert len(set(settings)) == len(settings)
    for variant, values in VARIANTS.items():
        TrainArgs(**values)   # a misspelt field or an out-of-range value fails here


@pytest.mark.slow
def test_compare_trains_and_drives_every_variant_and_seed_into_one_table(dataset, tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = ["compare", "--data", str(dataset), "--out", str(out), "--variants", "nac-pw", "lstm",
            "--seeds", "0", "1", "2", "--episodes", "2", "--max-steps", "30", "--json", *TINY]
    code, printed = run_cli(argv, capsys)
    assert code == 0
    report = json.loads(printed.strip().splitlines()[-1], parse_constant=refuse)   # strict JSON
    assert [row["variant"] for row in report["variants"]] == ["nac-pw", "lstm"]
    for row in report["variants"]:
        assert row["seeds"] == [0, 1, 2] and len(row["runs"]) == 3
        accuracies, returns = [], []
        for run in row["runs"]:
            with open(f"{run}/metrics.csv") as f:   # the best checkpoint's epoch: the lowest val loss
                best = min(csv.DictReader(f), key=lambda r: float(r["val_loss"]))
            accuracies.append(float(best["val_accuracy"]))
            with open(f"{run}/closed_loop.json") as f:
                drive = json.load(f)
            assert drive["seeds"] == [900000, 900001] and max(drive["lengths"]) <= 30
            returns += drive["returns"]
            config = json.load(open(f"{run}/best/config.json"))["core"]
            assert config["core"] == VARIANTS[row["variant"]]["core"]
            # one run after another: each trains on every core
            assert json.load(open(f"{run}/train_args.json"))["torch_threads"] == available_cores()
            if row["variant"] == "nac-pw":
                assert config["select"] == "all"
        assert row["val_accuracy_per_seed"] == pytest.approx(accuracies)
        assert row["val_accuracy"] == pytest.approx(np.mean(accuracies))
        loop = row["closed_loop"]
        assert loop["episodes"] == 6 and loop["mean_return"] == pytest.approx(np.mean(returns), abs=0.01)
        assert loop["worst_return"] == pytest.approx(min(returns), abs=0.01)
    table = (out / "compare.md").read_text()
    assert table.count("\n| nac-pw |") == 1 and table.count("\n| lstm |") == 2 and "3 seeds (0, 1, 2)" in table
    # lstm on nac-pw's tracks, every seed of each: the mean change, their means' gap
    paired = report["variants"][1]["paired"]
    assert "paired" not in report["variants"][0] and paired["reference"] == "nac-pw"
    assert (paired["0"]["tracks"], paired["0"]["runs"]) == (2, [3, 3])
    gap = report["variants"][1]["closed_loop"]["mean_return"] - report["variants"][0]["closed_loop"]["mean_return"]
    assert paired["0"]["mean"] == pytest.approx(gap, abs=0.02) and "| paired against nac-pw: return change" in table

    # TensorBoard's HParams table sees each run's closed-loop return
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    first = report["variants"][0]["runs"][0]
    events = EventAccumulator(f"{first}/tensorboard")
    events.Reload()
    with open(f"{first}/closed_loop.json") as f:
        assert events.Scalars("closed_loop/mean_return")[0].value == pytest.approx(json.load(f)["mean_return"])

    # run again: nothing is trained or driven twice, the table is the same
    stamps = {p: p.stat().st_mtime_ns for p in (out / "results").iterdir()}
    code, again = run_cli(argv, capsys)
    assert code == 0 and json.loads(again.strip().splitlines()[-1]) == report
    assert {p: p.stat().st_mtime_ns for p in (out / "results").iterdir()} == stamps
    assert len(list((out / "runs").iterdir())) == 6

    # another budget into the same folder is refused, before anything is trained
    changed = list(argv)
    changed[changed.index("--epochs") + 1] = "2"
    assert main(changed) == 2
    assert "that run was trained and driven with" in capsys.readouterr().err
    assert len(list((out / "runs").iterdir())) == 6


@pytest.mark.slow
def test_train_eval_episodes_drives_the_best_checkpoint_and_logs_it(dataset, tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer
    from tensorboard.plugins.hparams import metadata

    code, _ = run_cli(["train", "--data", str(dataset), "--out", str(tmp_path), "--run-name", "r", "--core", "gru",
                       "--eval-episodes", "1", *TINY], capsys)
    assert code == 0
    drive = json.loads((tmp_path / "r" / "closed_loop.json").read_text())
    assert drive["episodes"] == 1 and drive["seeds"] == [900000] and drive["policy"].endswith("best")
    runs = EventMultiplexer()
    runs.AddRunsFromDirectory(str(tmp_path))
    runs.Reload()
    experiment = [metadata.parse_experiment_plugin_data(tags[metadata.EXPERIMENT_TAG])
                  for tags in runs.PluginRunToTagToContent(metadata.PLUGIN_NAME).values()
                  if metadata.EXPERIMENT_TAG in tags][0]
    assert "closed_loop/mean_return" in [m.name.tag for m in experiment.metric_infos]
    events = EventAccumulator(str(tmp_path / "r" / "tensorboard"))
    events.Reload()
    assert [s.value for s in events.Scalars("closed_loop/mean_return")] == pytest.approx([drive["mean_return"]])


@pytest.mark.slow
def test_compare_on_udacity_recordings_gives_steering_mse_and_cross_track_error(tmp_path, capsys):
    rec = tmp_path / "rec"
    for track in ("lakeside", "canyon"):
        code, _ = run_cli(["collect", "udacity", "--driver", "scripted", "--out", str(rec), "--frames", "60",
                           "--track", track, "--no-progress"], capsys)
        assert code == 0
    workers = min(2, available_cores())
    code, printed = run_cli(["compare", "--data", str(rec), "--out", str(tmp_path / "cmp"), "--variants", "cfc",
                             "nac-exact", "--seeds", "0", "1", "--episodes", "1", "--max-steps", "20", "--json",
                             "--workers", str(workers), *TINY], capsys)
    assert code == 0
    report = json.loads(printed.strip().splitlines()[-1], parse_constant=refuse)   # strict JSON
    assert report["task"] == "udacity"
    for row in report["variants"]:
        assert row["metric"] == "val_mse"
        losses = []
        for run in row["runs"]:
            with open(f"{run}/metrics.csv") as f:   # Udacity's validation loss is the steering MSE
                losses.append(min(float(r["val_loss"]) for r in csv.DictReader(f)))
            drive = json.load(open(f"{run}/closed_loop.json"))
            assert drive["tracks"] == ["random-900000"] and drive["lengths"] == [20]
            threads = json.load(open(f"{run}/train_args.json"))["torch_threads"]
            assert threads == (1 if workers > 1 else available_cores())   # workers share the cores
        assert row["val_mse_per_seed"] == pytest.approx(losses)
        loop = row["closed_loop"]
        assert loop["episodes"] == 2 and loop["mean_abs_cte"] >= 0 and "off_road_tracks" in loop
    assert "steering MSE" in (tmp_path / "cmp" / "compare.md").read_text()


@pytest.mark.slow
def test_compare_in_the_shipped_regime_runs_dagger_rounds_on_its_own_data_and_draws_the_curve(dataset, tmp_path,
                                                                                              capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import hashlib

    def contents(root):
        return {p.relative_to(root): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}

    before = contents(dataset)
    out = tmp_path / "cmp"
    (out / "runs" / "gru__s0-dagger-r0").mkdir(parents=True)   # a killed attempt's round: started again in its place
    code, printed = run_cli(["compare", "--data", str(dataset), "--out", str(out), "--variants", "gru", "--seeds", "0",
                             "--episodes", "1", "--max-steps", "25", "--dagger-rounds", "2", "--dagger-episodes", "1",
                             "--dagger-epochs", "1", "--dagger-windows-per-epoch", "32", "--curve-episodes", "1",
                             "--frame-drops", "0", "0.5", "--json", *TINY], capsys)
    assert code == 0
    report = json.loads(printed.strip().splitlines()[-1], parse_constant=refuse)   # strict JSON
    assert contents(dataset) == before   # the shared demos untouched, file by file
    data = out / "runs" / "gru__s0-data"
    linked = next(p for p in dataset.rglob("*.hdf5"))
    assert (data / linked.relative_to(dataset)).stat().st_ino == linked.stat().st_ino   # hard-linked, not copied
    assert {p.parents[2].name for p in data.rglob("main_data.hdf5")} >= {"dagger-r0-s0", "dagger-r1-s0"}
    result = json.loads((out / "results" / "gru__s0.json").read_text())
    assert result["run_dir"].endswith("gru__s0-dagger-r1")   # the last round's checkpoint drove
    assert not any(p.name.endswith("-2") for p in (out / "runs").iterdir())   # no round trained again beside it
    assert json.loads((out / "runs" / "gru__s0-dagger-r1" / "closed_loop.json").read_text())["seeds"] == [900000]
    curve = result["curve"]
    assert [p["stage"] for p in curve] == ["behaviour cloning", "dagger round 0", "dagger round 1"]
    from nac_drive.data_collection.carracing_dataset import load_episodes

    demo_frames = sum(len(ep) for ep in load_episodes(dataset))
    assert [p["frames"] for p in curve] == [demo_frames, demo_frames + 25, demo_frames + 50]   # one 25-frame episode a round
    events = EventAccumulator(str(out / "runs" / "gru__s0-curve" / "tensorboard"))
    events.Reload()
    assert [(s.step, s.value) for s in events.Scalars("closed_loop/mean_return")] == [
        (p["frames"], pytest.approx(p["mean_return"])) for p in curve]
    assert report["variants"][0]["curve"][2]["frames"] == demo_frames + 50
    dropped = result["frame_drops"]["0.5"]   # the same track again, half its frames never reaching the policy
    assert dropped["seeds"] == [900000] and dropped["lengths"] == [25] and 5 < sum(dropped["frames_dropped"]) < 20
    assert report["variants"][0]["frame_drops"]["0.5"]["episodes"] == 1 and "frame-drop 0.5" in printed
    assert "learning curve" in printed and "2 DAgger rounds" in printed


@pytest.mark.slow
def test_a_comparison_killed_in_a_dagger_round_goes_on_without_driving_again(dataset, tmp_path, monkeypatch):
    """A comparison killed in a round's fine-tuning once removed every round and drove them
    all again: ~20 minutes a pair lost at the regime comparison's size."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import nac_drive.pipeline.dagger as dagger_module
    import nac_drive.pipeline.drive as drive_module
    import nac_drive.pipeline.train as training

    out = tmp_path / "cmp"
    args = CompareArgs(data=str(dataset), out=str(out), variants=["gru"], seeds=[0], window=4, d_model=16, epochs=1,
                       windows_per_epoch=32, progress=False, episodes=1, max_steps=25, dagger_rounds=2,
                       dagger_episodes=1, dagger_epochs=2, dagger_windows_per_epoch=32, curve_episodes=1)
    killed_at_validation(5, args, monkeypatch)   # validations: BC 1, round 0 2, round 1 the 4th and 5th
    runs = out / "runs"
    first_curve = json.loads((runs / "gru__s0-curve" / "curve.json").read_text())["points"]
    assert [p["stage"] for p in first_curve] == ["behaviour cloning", "dagger round 0"]

    rounds_driven, checkpoints_driven, validated = [], [], []
    real_round, real_drive, real_evaluate = dagger_module.drive_round, drive_module.drive_checkpoint, training.evaluate
    monkeypatch.setattr(training, "evaluate", lambda *a, **k: validated.append(1) or real_evaluate(*a, **k))
    monkeypatch.setattr(dagger_module, "drive_round", lambda *a, **k: rounds_driven.append(k["name"]) or
                        real_round(*a, **k))
    monkeypatch.setattr(drive_module, "drive_checkpoint", lambda checkpoint, *a, **k: checkpoints_driven.append(
        Path(checkpoint).parent.name) or real_drive(checkpoint, *a, **k))
    compare(args)
    assert rounds_driven == []   # both rounds' datasets were written before the kill
    assert len(validated) == 1   # round 1's second epoch: behaviour cloning and round 0 were whole
    assert checkpoints_driven == ["gru__s0-dagger-r1", "gru__s0-dagger-r1"]   # round 1's point, then the 20 tracks
    assert sorted(p.name for p in runs.iterdir()) == ["gru__s0", "gru__s0-curve", "gru__s0-dagger-r0",
                                                      "gru__s0-dagger-r1", "gru__s0-dagger.json",
                                                      "gru__s0-data"]   # no <run>-2; what the rounds were driven with
    with open(runs / "gru__s0-dagger-r1" / "metrics.csv") as f:
        assert [row["epoch"] for row in csv.DictReader(f)] == ["1", "2"]   # epoch 2 after the kill, epoch 1 once
    curve = json.loads((out / "results" / "gru__s0.json").read_text())["curve"]
    assert curve[:2] == first_curve and [p["stage"] for p in curve][2] == "dagger round 1"
    assert curve[2]["frames"] == curve[1]["frames"] + 25   # the kept round's frames, read back from its dataset
    events = EventAccumulator(str(runs / "gru__s0-curve" / "tensorboard"))
    events.Reload()
    assert [s.step for s in events.Scalars("closed_loop/mean_return")] == [p["frames"] for p in curve]   # each once
    whole = EventAccumulator(str(runs / "gru__s0-dagger-r0" / "tensorboard"))
    whole.Reload()
    assert len(whole.Scalars("closed_loop/mean_return")) == 1   # round 0's student drive, not logged again
    student = EventAccumulator(str(runs / "gru__s0-dagger-r1" / "tensorboard"))
    student.Reload()
    held_out = json.loads((runs / "gru__s0-dagger-r1" / "closed_loop.json").read_text())["mean_return"]
    logged = sorted(s.value for s in student.Scalars("closed_loop/mean_return"))
    assert len(logged) == 2 and held_out in [pytest.approx(v) for v in logged]   # round 1's student drive once, the held-out drive


def test_the_dagger_regime_is_refused_on_udacity_and_its_flags_without_rounds(tmp_path, capsys):
    (tmp_path / "rec").mkdir()
    (tmp_path / "rec" / "driving_log.csv").write_text("")
    with pytest.raises(ValueError, match="--dagger-rounds: DAgger needs an oracle"):
        from nac_drive.pipeline.compare import compare
        compare(CompareArgs(data=str(tmp_path / "rec"), dagger_rounds=1))
    assert "oracle" in CompareArgs(data="x").ignored() and "oracle" not in CompareArgs(data="x", dagger_rounds=1).ignored()
    assert main(["compare", "--data", "x", "--curve-episodes", "3"]) == 2
    assert "--curve-episodes: only with --dagger-rounds > 0" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--oracle tacher: not one of teacher, planner, ppo"):   # before any training
        CompareArgs(data="x", dagger_rounds=1, oracle="tacher")
    assert "max_steps" not in CompareArgs(data="x", episodes=0, dagger_rounds=1).ignored()   # it caps the rounds
    assert "frame_drops" in CompareArgs(data="x", episodes=0, frame_drops=[0.5]).ignored()


def test_a_second_comparison_into_one_folder_is_refused_before_it_trains(dataset, tmp_path):
    out = tmp_path / "cmp"
    out.mkdir()
    with one_writer(out, "nac-drive compare"):   # the first comparison, still running
        with pytest.raises(ValueError, match=r"another nac-drive compare \(pid \d+\) is writing it"):
            compare(CompareArgs(data=str(dataset), out=str(out), variants=["gru"], seeds=[0], window=4, d_model=16,
                                epochs=1, windows_per_epoch=32, progress=False))
    assert sorted(p.name for p in out.iterdir()) == []   # nothing trained, nothing written; the first's lock gone


def test_a_killed_pairs_behaviour_cloning_goes_on_from_its_last_epoch(dataset, tmp_path, monkeypatch):
    """A comparison killed mid-training once left that run behind and trained the pair again
    into gru__s0-2."""
    out = tmp_path / "cmp"
    args = CompareArgs(data=str(dataset), out=str(out), variants=["gru"], seeds=[0], window=4, d_model=16, epochs=2,
                       windows_per_epoch=32, progress=False, episodes=0)   # (no drive: training is what resumes)
    killed_at_validation(2, args, monkeypatch)   # in epoch 2
    run = out / "runs" / "gru__s0"
    assert json.loads((run / "last" / "train_state.json").read_text())["epoch"] == 0   # epoch 1 kept
    report = compare(args)
    assert report["variants"][0]["runs"] == [str(run)]   # the same folder, no gru__s0-2
    assert sorted(p.name for p in (out / "runs").iterdir() if p.name.startswith("gru__s0")) == ["gru__s0"]
    with open(run / "metrics.csv") as f:
        assert [row["epoch"] for row in csv.DictReader(f)] == ["1", "2"]   # epoch 2 trained once, after the kill
    with pytest.raises(ValueError, match="a killed comparison trained it with other epochs"):
        (out / "results" / "gru__s0.json").unlink()
        compare(replace(args, epochs=3))
