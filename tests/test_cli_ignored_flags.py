"""A flag whose value a verb would ignore is refused in one line and exit 2 (issue 45):
``dagger`` fine-tunes the checkpoint it is given, so it takes no architecture flags;
``train --init-from`` takes the checkpoint's architecture; a core's own flags go with that
core only; an option of a part the run skips is refused. Every verb's flags are the fields
of its argument dataclass(es) (nac_drive.cli.arguments), and TensorBoard's HParams of a run
record only what its core uses."""

import dataclasses

import pytest
from support.cli_in_process import exit_code
from support.cli_parsers import verb_parsers

from nac_drive.cli import build_parser
from nac_drive.cli.arguments import from_namespace
from nac_drive.pipeline.train_args import ARCHITECTURE, CORE_FIELDS, TrainArgs

MISSING = "/nonexistent/nac-drive-test"
ARCHITECTURE_FLAGS = {"--core": "lstm", "--mode": "euler", "--d-model": "32", "--num-heads": "2", "--topk": "4",
                      "--select": "all", "--sparsity": "0.2", "--euler-steps": "3"}

# (arguments, the start of the flag's refusal after "error: ")
IGNORED = [
    # dagger fine-tunes the checkpoint it is given: no architecture, no other checkpoint
    *[(["dagger", "--policy", MISSING, flag, value], f"unrecognized arguments: {flag}")
      for flag, value in {**ARCHITECTURE_FLAGS, "--init-from": MISSING}.items()],
    (["dagger", "--policy", MISSING, "--eval-episodes", "3"], "unrecognized arguments: --eval-episodes"),
    (["dagger", "--policy", MISSING, "--disturb-frames", "5"], "--disturb-frames: only with --disturb-rate > 0"),
    # train --init-from: the checkpoint's architecture
    *[(["train", "--init-from", MISSING, flag, value], f"{flag}: --init-from fine-tunes the checkpoint's own "
                                                       "architecture")
      for flag, value in ARCHITECTURE_FLAGS.items()],
    # a core's own flags with another core (even at their default value: given is refused)
    (["train", "--core", "lstm", "--topk", "8"], "--topk: the lstm core does not use it (only nac)"),
    (["train", "--core", "gru", "--num-heads", "4"], "--num-heads: the gru core does not use it (only nac and mha)"),
    (["train", "--core", "mha", "--mode", "steady"], "--mode: the mha core does not use it (only nac)"),
    (["train", "--core", "cfc", "--select", "all"], "--select: the cfc core does not use it"),
    (["train", "--core", "ltc", "--euler-steps", "3"], "--euler-steps: the ltc core does not use it"),
    (["train", "--euler-steps", "3"], "--euler-steps: only --mode euler takes Euler steps"),
    (["train", "--select", "all", "--topk", "4"], "--topk: --select all reads every key of the window"),
    # quickstart: --full's flags, and DAgger's when it runs no round
    (["quickstart", "--core", "lstm"], "--core: only with --full"),
    (["quickstart", "--full", "--dagger-rounds", "0", "--disturb-rate", "0.1"], "--disturb-rate: only with DAgger"),
    (["quickstart", "--full", "--budget", "small", "--dagger-rounds", "0", "--disturb-frames", "4"],
     "--disturb-frames: only with DAgger"),
    # collect: the other --driver's flags; a gas the expert does not press
    (["collect", "udacity", "--out", MISSING, "--no-progress"], "--no-progress: only with --driver scripted"),
    (["collect", "udacity", "--driver", "scripted", "--out", MISSING, "--exit-on-disconnect"],
     "--exit-on-disconnect: only with --driver human"),
    (["collect", "carracing", "--expert", "teacher", "--gas", "0.4"], "--gas: teacher drives the continuous env"),
    # drive: the live view's option without a live view
    (["drive", "carracing", "--no-live-saliency"], "--no-live-saliency: only with --rerun or --rerun-serve"),
    (["drive", "udacity", "--live-saliency"], "--live-saliency: only with --rerun or --rerun-serve"),
    # drive: an ONNX policy runs on onnxruntime's CPU provider
    (["drive", "carracing", "--policy", "p.onnx", "--device", "cpu"], "--device: an ONNX policy runs on onnxruntime"),
    (["drive", "udacity", "--policy", "p.onnx", "--device", "cpu"], "--device: an ONNX policy runs on onnxruntime"),
    # dashboard --rrd alone writes no HTML
    (["dashboard", MISSING, "--rrd", "run.rrd", "--title", "x"], "--title: only for the HTML file"),
    (["dashboard", MISSING, "--rrd", "run.rrd", "--video", "v.webm"], "--video: only for the HTML file"),
    (["dashboard", MISSING, "--rrd", "run.rrd", "--image-budget-mb", "5"], "--image-budget-mb: only for the HTML"),
    # compare without closed-loop episodes
    (["compare", "--data", MISSING, "--episodes", "0", "--max-steps", "50"], "--max-steps: only with --episodes > 0"),
    (["compare", "--data", MISSING, "--episodes", "0", "--frame-drops", "0.5"], "--frame-drops: only with --episodes > 0"),
    (["compare", "--data", MISSING, "--episodes", "0", "--also", "shipped:nac"], "--also: only with --episodes > 0"),
    # a NAC ablation's sparsity with another core
    (["train", "--core", "gru", "--sparsity", "0.9"], "--sparsity: the gru core does not use it (only nac)"),
    # explain without a closed-loop check
    (["explain", "--closed-loop-tracks", "0", "--closed-loop-top", "3"], "--closed-loop-top: only with a closed-loop"),
    (["explain", "--closed-loop-tracks", "0", "--closed-loop-random", "3"], "--closed-loop-random: only with"),
    # expert: what the run's kind of actions or its skipped parts do not use
    (["expert", "train", "--log-std-init", "-1"], "--log-std-init: only a continuous run"),
    (["expert", "train", "--continuous", "--gas", "0.4"], "--gas: only a discrete run's GAS"),
    (["expert", "train", "--teacher-fit-epochs", "3"], "--teacher-fit-epochs: only with --teacher-fit-lr > 0"),
    (["expert", "kickstart", "--disturb-rate", "0", "--disturb-frames", "4"], "--disturb-frames: only with"),
    (["expert", "kickstart", "--value-episodes", "0", "--value-epochs", "3"], "--value-epochs: only with"),
    (["expert", "eval", "--expert", "random", "--gas", "0.4"], "--gas: random drives the continuous env"),
]
# verbs with no flag that another flag can make idle
NOTHING_TO_IGNORE = {"nac-drive saliency", "nac-drive export", "nac-drive sim udacity-emulator", "nac-drive tune",
                     "nac-drive expert resume", "nac-drive expert compare", "nac-drive expert ship",
                     "nac-drive completion"}


def test_every_ignored_flag_is_refused_in_one_line_with_exit_2(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    problems = []
    for args, refusal in IGNORED:
        code, stderr = exit_code(args), capfd.readouterr().err
        lines = stderr.strip().splitlines()
        if code != 2 or len(lines) != 1 or not lines[0].startswith(f"nac-drive {args[0]}") \
                or f"error: {refusal}" not in lines[0]:
            problems.append(f"nac-drive {' '.join(args)} -> exit {code}: {stderr[-600:]!r}")
    assert not problems, "\n".join(problems)
    assert list(tmp_path.iterdir()) == []   # refused before any work: nothing was written


def test_every_verb_with_an_idle_flag_has_its_cases():
    verbs = {name for name, _ in verb_parsers()}
    covered = {name for name in verbs if any(f"nac-drive {' '.join(args)} ".startswith(name + " ")
                                             for args, _ in IGNORED)}
    assert covered | NOTHING_TO_IGNORE == verbs and not covered & NOTHING_TO_IGNORE


def test_every_verb_parser_is_made_of_its_dataclasses():
    """No hand-written flag: each verb's flags are exactly the documented fields of the
    dataclasses it registered, and dagger's have no architecture."""
    flags_of = {}
    for name, parser in verb_parsers():
        classes = getattr(parser, "argument_classes", [])
        assert classes, f"{name}: no argument dataclass"
        fields = [f for cls, skip in classes for f in dataclasses.fields(cls) if f.name not in skip]
        assert all(f.metadata.get("help") for f in fields), name
        flags_of[name] = {a.dest for a in parser._actions if a.dest != "help"}
        assert flags_of[name] == {f.name for f in fields}, name
    assert not flags_of["nac-drive dagger"] & {*ARCHITECTURE, "init_from"}   # its --resume is the rounds'
    assert {"epochs", "lr", "data", "window"} <= flags_of["nac-drive dagger"]
    assert set(ARCHITECTURE) | {"init_from"} <= flags_of["nac-drive train"]


def help_sections(parser) -> dict[str, list[str]]:
    """Heading -> the flags ``--help`` lists under it, in the order of the help."""
    text = parser.format_help()
    sections: dict[str, list[str]] = {}
    for line in text[text.index("\noptions:\n") + 1:].splitlines():
        if line.endswith(":") and not line.startswith(" "):
            heading = sections.setdefault(line[:-1], [])
        elif line.startswith("  -"):
            heading.append(line.split()[0].rstrip(","))
    return sections


def test_help_lists_the_ordinary_flags_first_and_groups_the_rest():
    parsers = dict(verb_parsers())
    train = help_sections(parsers["nac-drive train"])
    assert list(train) == ["options", "architecture (the checkpoint's with --init-from)", "optimisation",
                           "validation"]
    assert train["options"][:5] == ["-h", "--data", "--out", "--run-name", "--core"]
    assert train["architecture (the checkpoint's with --init-from)"][:4] == ["--mode", "--d-model", "--num-heads",
                                                                             "--topk"]
    quickstart = help_sections(parsers["nac-drive quickstart"])
    assert "--episodes" in quickstart["options"] and "--dagger-rounds" in quickstart["--full (make the policy first)"]
    drive = help_sections(parsers["nac-drive drive carracing"])
    assert drive["live view (Rerun; the 'live' extra)"] == ["--rerun", "--rerun-serve", "--live-saliency"]


def test_dagger_says_how_it_names_its_rounds_run_folders():
    from nac_drive.pipeline.dagger import round_run_name

    run_name = next(a for a in dict(verb_parsers())["nac-drive dagger"]._actions if a.dest == "run_name")
    assert f"{round_run_name('NAME', 0)}, {round_run_name('NAME', 1)}" in run_name.help   # not train's default name
    assert f"default {round_run_name(None, 0)}" in run_name.help and "<task>" not in run_name.help


def test_only_flags_given_are_refused_and_python_callers_are_not():
    parser = build_parser()
    assert from_namespace(TrainArgs, parser.parse_args(["train", "--core", "lstm"])).topk == 8   # default: fine
    with pytest.raises(ValueError, match="^--topk: the lstm core does not use it"):
        from_namespace(TrainArgs, parser.parse_args(["train", "--core", "lstm", "--topk", "8"]))
    assert "topk" in TrainArgs(core="lstm", topk=3).ignored()   # Python: said, not refused
    for core in ("lstm", "gru", "cfc", "ltc", "mha"):   # the variants beyond the paper are the NAC's alone
        with pytest.raises(ValueError, match=f"^--logit-variant: the {core} core does not use it"):
            from_namespace(TrainArgs, parser.parse_args(["train", "--core", core, "--logit-variant", "scaled"]))
    assert TrainArgs(init_from="ckpt").ignored().keys() == set(ARCHITECTURE) | {"tuned"}


def test_the_core_table_is_the_cores_and_their_config():
    from nac_drive.policy.cores import CORES, CoreConfig

    from nac_drive.nac.validation import LOGIT_VARIANTS
    from nac_drive.pipeline.train_args import LOGIT_VARIANTS as FLAG_CHOICES

    assert tuple(CORE_FIELDS) == CORES and FLAG_CHOICES == LOGIT_VARIANTS
    names = {f.name for f in dataclasses.fields(CoreConfig)}
    assert set(ARCHITECTURE) <= names and set(ARCHITECTURE) <= {f.name for f in dataclasses.fields(TrainArgs)}


def test_hparams_of_a_run_hold_only_what_its_core_uses(tmp_path):
    """An lstm run records no heads, Top-K, mode or key selection; a NAC run does (not its
    Euler steps unless in euler mode)."""
    import torch
    from support.demos import synthetic_episodes
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer
    from tensorboard.plugins.hparams import metadata

    from nac_drive.data_collection.carracing_dataset import write_dataset
    from nac_drive.pipeline.train import train

    torch.set_num_threads(1)
    demos = tmp_path / "demos"
    write_dataset(demos, "synthetic", synthetic_episodes(2, 12), "CarRacing-v3", expert="bands", description="test")
    tiny = dict(data=str(demos), out=str(tmp_path / "runs"), window=4, d_model=8, epochs=1, windows_per_epoch=16,
                batch_size=8, val_fraction=0.5, progress=False)
    train(TrainArgs(**tiny, core="lstm", run_name="lstm"))
    train(TrainArgs(**tiny, num_heads=2, topk=3, run_name="nac"))

    runs = EventMultiplexer()
    runs.AddRunsFromDirectory(str(tmp_path / "runs"))
    runs.Reload()
    hparams = {run.split("/")[0]: set(metadata.parse_session_start_info_plugin_data(
        tags[metadata.SESSION_START_INFO_TAG]).hparams)
        for run, tags in runs.PluginRunToTagToContent(metadata.PLUGIN_NAME).items()}
    assert {"core", "window", "d_model", "lr"} <= hparams["lstm"]
    assert not hparams["lstm"] & {"num_heads", "topk", "mode", "select", "euler_steps"}
    assert {"num_heads", "topk", "mode", "select"} <= hparams["nac"] and "euler_steps" not in hparams["nac"]
