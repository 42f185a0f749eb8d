"""``--config FILE`` (issue 56 item 3) on train, dagger, compare and tune: TOML or a
training run's own train_args.json; a flag on the command line overrides the file; a key
that is not a flag of the verb, or a value of another type, is refused in one line, exit 2."""

import json

import pytest
from support.demos import synthetic_episodes

from nac_drive.cli import build_parser
from nac_drive.cli.arguments import RUN_RECORD_KEYS, from_namespace, read_config
from nac_drive.cli.main import main
from nac_drive.data_collection.carracing_dataset import write_dataset
from nac_drive.pipeline.compare import CompareArgs
from nac_drive.pipeline.train_args import TrainArgs


def parsed(argv):
    namespace = build_parser().parse_args(argv)
    read_config(namespace)
    return namespace


def test_train_config_round_trips_a_runs_train_args_json(tmp_path, capsys):
    data = tmp_path / "demos"
    write_dataset(data, "synthetic", synthetic_episodes(), "CarRacing-v3", expert="bands", description="test")
    flags = ["--data", str(data), "--core", "gru", "--window", "4", "--d-model", "16", "--epochs", "1", "--seed", "3",
             "--windows-per-epoch", "32", "--batch-size", "8", "--lr", "0.002", "--class-weighting", "balanced",
             "--no-progress"]
    assert main(["train", *flags, "--out", str(tmp_path / "a"), "--run-name", "first"]) == 0
    first = json.loads((tmp_path / "a" / "first" / "train_args.json").read_text())
    assert main(["train", "--config", str(tmp_path / "a" / "first" / "train_args.json"), "--out", str(tmp_path / "b"),
                 "--run-name", "second"]) == 0
    second = json.loads((tmp_path / "b" / "second" / "train_args.json").read_text())
    assert set(first) - {f for f in TrainArgs.__dataclass_fields__} == set(RUN_RECORD_KEYS)
    assert first["core"] == "gru" and first["lr"] == 0.002 and first["seed"] == 3   # the flags were recorded
    for record in (first, second):
        for key in ("out", "run_name", "data_info", "policy_config", "torch_threads"):
            record.pop(key)
    assert second == first
    capsys.readouterr()


def test_toml_sets_flags_and_the_command_line_overrides_it(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('data = "runs/x"\nepochs = 5\nlr = 1\nwindows-per-epoch = 64\ncore = "gru"\n')
    train = from_namespace(TrainArgs, parsed(["train", "--config", str(config), "--epochs", "2"]))
    assert (train.data, train.epochs, train.lr, train.windows_per_epoch, train.core) == ("runs/x", 2, 1.0, 64, "gru")
    assert isinstance(train.lr, float)
    config.write_text('data = "runs/x"\nvariants = ["gru", "lstm"]\nseeds = [4]\n')
    compare = from_namespace(CompareArgs, parsed(["compare", "--config", str(config)]))   # --data from the file
    assert (compare.data, compare.variants, compare.seeds) == ("runs/x", ["gru", "lstm"], [4])


@pytest.mark.parametrize("verb", [["train"], ["dagger"], ["compare"], ["tune"]])
@pytest.mark.parametrize("content, message", [
    ('data = "d"\npolicy = "p"\nbogus = 1\nsneaky = 2\n', "not flags of nac-drive {verb}: bogus, sneaky"),
    ('data = "d"\npolicy = "p"\nepochs = "3"\n', "epochs: expected int, got '3'"),
    ('data = "d"\npolicy = "p"\nprogress = 1\n', "progress: expected bool, got 1"),
    ('data = "d"\npolicy = "p"\nepochs = 0\n', "--epochs: must be >= 1, got 0"),
    ("data = \n", "not TOML"),
])
def test_a_bad_key_or_value_is_refused_in_one_line(verb, content, message, tmp_path, capsys):
    if verb != ["dagger"]:   # only dagger takes --policy
        content = content.replace('policy = "p"\n', "")
    config = tmp_path / "c.toml"
    config.write_text(content)
    assert main([*verb, "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message.format(verb=verb[0]) in err, err


def test_a_required_flag_missing_from_both_is_refused(tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text("epochs = 2\n")
    assert main(["compare", "--config", str(config)]) == 2
    assert "--data: required (on the command line or in --config)" in capsys.readouterr().err
    assert main(["compare"]) == 2
    assert "--data: required" in capsys.readouterr().err


def test_a_toml_key_the_run_would_not_use_is_refused_as_a_flag_would_be(tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text('core = "lstm"\ntopk = 4\n')
    assert main(["train", "--config", str(config), "--data", "/nonexistent"]) == 2
    assert f"--topk (in {config}): the lstm core does not use it" in capsys.readouterr().err
