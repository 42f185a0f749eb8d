"""One door per verb (issue 56 item 3): every verb that prints a result takes ``--json``
from the one ``JsonOutput``, and ``--json`` only adds one last line of strict JSON to
stdout (the text before it, the progress bar still on stderr).

The cheap verbs run here on tiny budgets; the expensive ones (``expert train``,
``kickstart``, ``resume``, ``explain``, ``tune``, ``compare``, ``quickstart``, ``sim
udacity-emulator``, which needs a bridge) are checked through their parsers here and their
summary builders below; their own test files run some of them with ``--json``."""

import json

import pytest
from support.cli_parsers import verb_parsers
from support.demos import synthetic_episodes

from nac_drive.cli.arguments import JsonOutput
from nac_drive.cli.main import main
from nac_drive.data_collection.carracing_dataset import write_dataset

TINY = ["--window", "4", "--d-model", "16", "--epochs", "1", "--windows-per-epoch", "32", "--batch-size", "8",
        "--no-progress"]
# the verbs that print no result of their own
NO_RESULT = {"nac-drive completion"}


def refuse(token):
    """parse_constant for json.loads: NaN and Infinity are not JSON."""
    raise ValueError(f"non-standard JSON token {token}")


def last_json_line(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1], parse_constant=refuse)


def test_every_verb_that_prints_a_result_takes_json_from_json_output_alone():
    for verb, parser in verb_parsers():
        classes = [cls for cls, _ in getattr(parser, "argument_classes", [])]
        flags = {option for action in parser._actions for option in action.option_strings}
        if verb in NO_RESULT:
            assert "--json" not in flags, verb
            continue
        assert JsonOutput in classes and "--json" in flags, verb
        assert all("json" not in getattr(cls, "__dataclass_fields__", {}) for cls in classes if cls is not JsonOutput), \
            f"{verb}: a --json of its own"


def test_no_verb_turns_the_progress_bar_off_for_json():
    from pathlib import Path

    import nac_drive.cli.commands as commands

    for module in Path(commands.__file__).parent.glob("*.py"):
        assert "not output.json" not in module.read_text() and "not shown.json" not in module.read_text(), module


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("demos")
    write_dataset(root, "synthetic", synthetic_episodes(), "CarRacing-v3", expert="bands", description="test")
    return root


@pytest.fixture(scope="module")
def traced_run(tmp_path_factory):
    """A short drive of the shipped policy with its trace, for saliency and the dashboard."""
    run = tmp_path_factory.mktemp("drive") / "run"
    assert main(["drive", "carracing", "--episodes", "1", "--max-steps", "12", "--trace", str(run)]) == 0
    return run


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    """An untrained checkpoint for dagger's round (the dataset's GAS, a window of 4)."""
    from nac_drive.policy import DrivingPolicy, PolicyConfig
    from nac_drive.policy.cores import CoreConfig

    path = tmp_path_factory.mktemp("student") / "best"
    DrivingPolicy(PolicyConfig(core=CoreConfig(window=4, d_model=16))).save_pretrained(path)
    return path


# verb: (its cheapest command line, given a fresh folder and a fixture getter; {key of its JSON line: the text
# that shows it})
RUNS = {
    "collect carracing": (lambda out, fixture: ["collect", "carracing", "--expert", "random", "--episodes", "1",
                                                "--max-steps", "10", "--out", str(out)],
                          {"mean_return": "return", "dataset": "dataset: ", "shards": "shards: "}),
    "train": (lambda out, fixture: ["train", "--data", str(fixture("dataset")), "--out", str(out), *TINY],
              {"run": "run folder: ", "best_checkpoint": "best checkpoint: ", "best_epoch": "(epoch 1: "}),
    "dagger": (lambda out, fixture: ["dagger", "--policy", str(fixture("student")), "--data", str(out / "demos"),
                                     "--rounds", "1", "--episodes", "1", "--max-steps", "10", "--workers", "1",
                                     "--out", str(out / "runs"), "--window", "4", "--epochs", "1", "--windows-per-epoch", "8",
                                     "--batch-size", "4", "--no-progress"],
               {"final_checkpoint": "final checkpoint: ", "rounds": "DAgger round 0: "}),
    "drive carracing": (lambda out, fixture: ["drive", "carracing", "--episodes", "1", "--max-steps", "10"],
                        {"mean_return": "return", "seeds": "seed 900000: "}),
    "expert eval": (lambda out, fixture: ["expert", "eval", "--expert", "random", "--episodes", "1",
                                          "--max-steps", "10"],
                    {"mean_return": "return", "expert": "random: "}),
    "saliency": (lambda out, fixture: ["saliency", str(fixture("traced_run"))], {"saliency": "wrote "}),
    "dashboard": (lambda out, fixture: ["dashboard", str(fixture("traced_run")), "-o", str(out / "d.html")],
                  {"written": "wrote "}),
    "export": (lambda out, fixture: ["export", str(out / "policy.onnx")],
               {"path": "wrote ", "max_abs_diff": "max |difference|"}),
}
# verbs whose progress bar shows on stderr on these budgets
BARS = ("collect carracing", "drive carracing", "expert eval")


@pytest.mark.parametrize("verb", list(RUNS))
def test_json_adds_one_strict_json_line_after_the_text(verb, tmp_path, capsys, request):
    if verb == "export":
        pytest.importorskip("onnxruntime")
    command, shown = RUNS[verb]
    (tmp_path / "text").mkdir()
    (tmp_path / "json").mkdir()
    assert main(command(tmp_path / "text", request.getfixturevalue)) == 0
    text = capsys.readouterr().out
    assert main([*command(tmp_path / "json", request.getfixturevalue), "--json"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    summary = last_json_line(captured.out)
    assert not lines[0].startswith("{"), verb   # the text comes first
    for key, label in shown.items():
        assert key in summary, (verb, key)
        assert label in text and label in "\n".join(lines[:-1]), (verb, label)   # the same text, --json or not
    if verb in BARS:
        assert "100%|" in captured.err, (verb, captured.err[-300:])   # tqdm's bar, done


@pytest.mark.parametrize("argv", [["expert", "train"], ["expert", "kickstart"], ["expert", "resume", "RUN"],
                                  ["explain"], ["tune", "--data", "d"], ["compare", "--data", "d"], ["quickstart"],
                                  ["sim", "udacity-emulator"], ["expert", "compare", "a.zip"]])
def test_the_expensive_verbs_parse_json(argv):
    from nac_drive.cli import build_parser

    assert build_parser().parse_args([*argv, "--json"]).json is True
    assert build_parser().parse_args(argv).json is False


def test_the_summaries_of_the_expensive_verbs_are_their_text_then_one_strict_json_line(capsys):
    from nac_drive.cli.commands.expert import training_summary
    from nac_drive.cli.commands.sim import print_summary

    summary = {"telemetry_sent": 12, "mean_abs_cte_m": float("nan"), "track": "canyon"}
    print_summary(summary, JsonOutput(json=True))
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[:-1] == ["telemetry_sent: 12", "mean_abs_cte_m: nan", "track: canyon"]
    assert last_json_line(lines[-1]) == {**summary, "mean_abs_cte_m": None}
    print_summary(summary, JsonOutput(json=False))
    assert not capsys.readouterr().out.strip().splitlines()[-1].startswith("{")
    assert json.loads(json.dumps(training_summary("run/best.zip", None))) == {"best_checkpoint": "run/best.zip",
                                                                             "shipped": None}
