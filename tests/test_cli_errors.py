"""Every verb answers nonsense with one line on stderr and exit 2, before doing any work,
and never with a traceback (nac_drive.cli.run_verb, nac_drive.cli.arguments)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli_in_process import exit_code

import nac_drive
from nac_drive.fields import check_number
from nac_drive.pipeline.train_args import TrainArgs

NAC_DRIVE = str(Path(sys.executable).parent / "nac-drive")
MISSING = "/nonexistent/nac-drive-test"

# (arguments, a fragment the error line must hold)
NONSENSE = [
    (["train", "--val-fraction", "1.5"], "--val-fraction: must be < 1, got 1.5"),
    (["train", "--epochs", "0"], "--epochs: must be >= 1"),
    (["train", "--lr", "nan"], "--lr: must be a finite number"),
    (["train", "--window", "-3"], "--window: must be >= 1"),
    (["train", "--batch-size", "many"], "--batch-size: expected an integer, got 'many'"),
    (["train", "--data", MISSING], MISSING),
    (["collect", "carracing", "--episodes", "0"], "--episodes: must be >= 1"),
    (["collect", "carracing", "--max-steps", "0"], "--max-steps: must be >= 1"),
    (["collect", "carracing", "--seed-base", "-1"], "--seed-base: must be >= 0"),
    (["collect", "carracing", "--expert", MISSING + ".zip", "--episodes", "1"], MISSING),
    (["dagger", "--policy", MISSING, "--rounds", "0"], "--rounds: must be >= 1"),
    (["dagger", "--policy", MISSING, "--disturb-rate", "1.5"], "--disturb-rate: must be <= 1"),
    (["dagger", "--policy", MISSING, "--workers", "0"], "--workers: must be >= 1"),
    # more workers than cores (each is a single-threaded process of ~400 MB); the cores: os.sched_getaffinity
    (["dagger", "--policy", MISSING, "--workers", str(len(os.sched_getaffinity(0)) + 1)],
     f"--workers: {len(os.sched_getaffinity(0)) + 1} is more than the {len(os.sched_getaffinity(0))} cores"),
    (["collect", "carracing", "--workers", "64"], f"--workers: 64 is more than the {len(os.sched_getaffinity(0))} cores"),
    (["dagger", "--policy", MISSING], MISSING),
    (["drive", "carracing", "--episodes", "0"], "--episodes: must be >= 1"),
    (["drive", "carracing", "--max-steps", "0"], "--max-steps: must be >= 1"),
    (["drive", "carracing", "--policy", MISSING], MISSING),
    (["drive", "carracing", "--policy", "shipped:lstm"], "no carracing policy with a 'lstm' core ships with nac-drive; "
                                                        "carracing has shipped:mha, shipped:nac"),
    (["drive", "udacity", "--policy", "shipped:mha"], "no udacity policy with a 'mha' core ships"),
    (["dagger", "--policy", "shipped:gru"], "no carracing policy with a 'gru' core ships"),
    (["drive", "carracing", "--policy", "shipped:nac/../policy_udacity_nac"],   # a name, never a path
     "no carracing policy with a 'nac/../policy_udacity_nac' core ships"),
    (["drive", "udacity", "--speed", "-5"], "--speed: must be > 0"),
    (["drive", "udacity", "--port", "70000"], "--port: must be <= 65535"),
    (["drive", "udacity", "--policy", MISSING], MISSING),
    (["expert", "train", "--total-frames", "-5"], "--total-frames: must be >= 1"),
    (["expert", "train", "--gamma", "2"], "--gamma: must be <= 1"),
    (["expert", "train", "--n-envs", "0"], "--n-envs: must be >= 1"),
    (["expert", "resume", MISSING], MISSING),
    (["expert", "resume", MISSING, "--total-frames", "0"], "--total-frames: must be >= 1"),
    (["expert", "eval", "--episodes", "0"], "--episodes: must be >= 1"),
    (["expert", "eval", "--expert", MISSING + ".zip"], MISSING),
    (["expert", "compare", MISSING + ".zip"], MISSING),
    (["expert", "compare", "x.zip", "--episodes", "0"], "--episodes: must be >= 1"),
    (["quickstart", "--max-steps", "0"], "--max-steps: must be >= 1"),
    (["quickstart", "--episodes", "-1"], "--episodes: must be >= 1"),
    (["quickstart", "--recorded", "0"], "--recorded: must be >= 1"),
    (["quickstart", "--full", "--epochs", "0"], "--epochs: must be >= 1"),
    (["quickstart", "--budget", "small"], "--budget: only with --full"),
    (["quickstart", "--full", "--core", "transformer"], "--core: must be one of"),
    (["quickstart", "--full", "--expert", "random-discrete"], "random actions cannot label DAgger rounds"),
    (["quickstart", "--full", "--expert", MISSING + ".zip"], MISSING),
    (["saliency", MISSING], MISSING),
    (["dashboard", MISSING], MISSING),
    (["dashboard", MISSING, "--image-budget-mb", "0"], "--image-budget-mb: must be > 0"),
    (["dashboard", MISSING, "--rrd", "run.txt"], "--rrd: expected a file name ending in .rrd"),
    (["drive", "carracing", "--rerun", "run.mp4"], "--rerun: expected a file name ending in .rrd"),
    (["drive", "carracing", "--rerun", MISSING + "/run.rrd"], "--rerun: cannot write"),
    (["drive", "carracing", "--rerun-serve", "0"], "--rerun-serve: must be >= 1"),
    (["drive", "carracing", "--rerun", "--rerun-serve"], "--rerun-serve: a viewer started for the drive already serves"),
    (["collect", "udacity", "--out", MISSING, "--port", "0"], "--port: must be >= 1"),
    (["collect", "udacity", "--out", MISSING, "--frames", "5"], "--frames: only with --driver scripted"),
    (["collect", "udacity", "--driver", "scripted", "--out", MISSING, "--port", "4567"], "--port: only with --driver human"),
    (["collect", "udacity", "--driver", "scripted", "--out", MISSING, "--track", "monaco"], "--track"),
    (["sim", "udacity-emulator", "--track", "monaco"], "--track"),
    (["sim", "udacity-emulator", "--frames", "0"], "--frames: must be >= 1"),
    (["sim", "udacity-emulator", "--timeout", "0"], "--timeout: must be > 0"),
    (["sim", "udacity-emulator", "--port", "abc"], "--port: expected an integer, got 'abc'"),
    (["sim", "udacity-emulator", "--laps", "inf"], "--laps: must be a finite number"),
    # caps checked before any work: --episodes 1e9 once allocated 23 GB (dagger) before failing, a seed of
    # 10**30 reached HDF5 (exit 1 after a folder was made), --speed 1e308 went to the car
    (["collect", "carracing", "--episodes", "1000000000"], "--episodes: must be <= 100000"),
    (["collect", "carracing", "--seed-base", str(10**30)], "--seed-base: must be <= 1000000000"),
    (["collect", "carracing", "--seed-base", "799990", "--episodes", "20"],
     "--seed-base: tracks 799990..800009 reach the validation and held-out tracks (800000-)"),
    (["dagger", "--policy", MISSING, "--episodes", "1000000000"], "--episodes: must be <= 100000"),
    (["train", "--seed", str(10**10)], "--seed: must be <= 1000000000"),
    (["expert", "kickstart", "--episodes", "1000000000"], "--episodes: must be <= 100000"),
    (["collect", "udacity", "--driver", "scripted", "--out", MISSING, "--speed", "1e308"], "--speed: must be <= 30"),
]


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([NAC_DRIVE, *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_every_verb_refuses_nonsense_in_one_line(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    problems = []
    for args, fragment in NONSENSE:
        code, stderr = exit_code(args), capfd.readouterr().err
        last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
        if code != 2 or "Traceback" in stderr or fragment not in last:
            problems.append(f"nac-drive {' '.join(args)} -> exit {code}: {stderr[-600:]!r}")
    assert not problems, "\n".join(problems)
    # nothing was started: no run, dataset or output folder appeared where the verbs ran
    assert list(tmp_path.iterdir()) == []


def test_a_port_in_use_and_an_unwritable_output_end_in_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = run_cli(["drive", "udacity", "--port", str(port)], tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1].startswith("nac-drive drive: error:")

    blocker = tmp_path / "file"
    blocker.write_text("a file where a folder must go")
    out = run_cli(["quickstart", "--episodes", "1", "--max-steps", "5", "--no-saliency", "--out",
                   str(blocker / "out")], tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert str(blocker) in out.stderr.strip().splitlines()[-1]


def test_a_missing_udacity_extra_is_one_line_and_exit_2(monkeypatch, capsys, tmp_path):
    """Without the socket libraries of the 'udacity' extra, serving the simulator says which
    extra to install, before any summary of a run that never started."""
    import sys

    from nac_drive import cli

    monkeypatch.setitem(sys.modules, "nac_drive.simulators.udacity_server", None)   # import fails
    for verb in (["collect", "udacity", "--out", str(tmp_path / "rec")],
                 ["drive", "udacity", "--trace", str(tmp_path / "trace"), "--record", str(tmp_path / "log")]):
        assert cli.main(verb) == 2
        err = capsys.readouterr()
        assert err.out == "" and len(err.err.strip().splitlines()) == 1
        assert err.err.startswith(f"nac-drive {verb[0]}: error:") and "pip install 'nac-drive[udacity]'" in err.err
    assert list(tmp_path.iterdir()) == []   # no recording or trace folder was made


def test_a_bug_is_one_line_and_exit_1_unless_a_traceback_is_asked_for(monkeypatch, capsys):
    from nac_drive import cli

    def broken(args):
        raise KeyError("the bug")

    parser = cli.build_parser()
    args = parser.parse_args(["dashboard", "somewhere"])
    args.func = broken
    assert cli.run_verb(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("nac-drive dashboard: unexpected KeyError")
    monkeypatch.setenv("NAC_DRIVE_TRACEBACK", "1")
    with pytest.raises(KeyError):
        cli.run_verb(args)


def test_a_librarys_terminal_colours_never_reach_the_one_line_error(capsys):
    """A failed Ray task's error once printed as "[36mray::_run_job()[39m ..." in the one line."""
    from nac_drive import cli

    def coloured(args):
        raise ValueError("\x1b[36mray::_run_job()\x1b[39m (pid=1) \x1b[1;31mbad\x1b[0m input")

    args = cli.build_parser().parse_args(["dashboard", "somewhere"])
    args.func = coloured
    assert cli.run_verb(args) == 2
    assert capsys.readouterr().err == "nac-drive dashboard: error: ray::_run_job() (pid=1) bad input\n"


def test_argument_dataclasses_check_their_bounds_in_python_too():
    with pytest.raises(ValueError, match="--val-fraction: must be < 1, got 1.5"):
        TrainArgs(val_fraction=1.5)
    with pytest.raises(ValueError, match="--class-weighting: must be one of none, balanced"):
        TrainArgs(class_weighting="balance")
    from nac_drive.agents.ppo_lab.training_args import ExpertTrainArgs

    with pytest.raises(ValueError, match="--total-frames: must be >= 1, got -5"):
        ExpertTrainArgs(total_frames=-5)
    assert check_number(0.5, min=0, below=1) is None
    assert check_number(float("-inf"), max=3) == "must be a finite number, got -inf"


def test_python_m_nac_drive_is_the_command(tmp_path):
    version = subprocess.run([sys.executable, "-m", "nac_drive", "--version"], capture_output=True, text=True,
                             timeout=120, cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.strip() == f"nac-drive {nac_drive.__version__}"
    refused = subprocess.run([sys.executable, "-m", "nac_drive", "drive", "carracing", "--rerun", "run.mp4"],
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "nac-drive drive: error: --rerun: expected a file name ending in .rrd, got 'run.mp4'"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize("argv", [["drive", "carracing", "--episodes", "1", "--rerun"], ["dashboard", MISSING, "--rrd"]])
def test_a_fifo_as_the_recording_is_refused_before_any_work(tmp_path, argv):
    """A FIFO given as the .rrd once hung the drive with no word (its writer blocks until a
    reader opens the other end)."""
    fifo = tmp_path / "live.rrd"
    os.mkfifo(fifo)
    out = run_cli([*argv, str(fifo)], tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1].endswith(f"{fifo} is not a regular file (a FIFO or a device); a "
                                                        "recording is written to a file of its own")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["live.rrd"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_FSIZE stands in for a full disk")
def test_a_trace_that_cannot_be_written_ends_in_one_line_after_the_drives_summary(tmp_path):
    """A full disk while a trace was written ended the drive at once, "[Errno 27] File too large",
    naming no path, the summary lost. Here the file-size limit makes the chunk writer fail as a
    full disk does."""
    import resource
    import signal

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past the limit fails (EFBIG) instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

    out = subprocess.run([sys.executable, "-m", "nac_drive.cli", "drive", "carracing", "--episodes", "1",
                          "--max-steps", "600", "--trace", "run"], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path, preexec_fn=small_files, env={**os.environ, "PYTHONSAFEPATH": "1"})
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1] == (
        "nac-drive drive: error: --trace: run/trace: chunk 0 could not be written (File too large); the 0 chunk(s) "
        "before it are whole")
    assert "seed 900000: return" in out.stdout and "frames  600" in out.stdout   # the whole drive, summary first

    out = subprocess.run([sys.executable, "-m", "nac_drive.cli", "explain", "--episodes", "1", "--max-steps", "600",
                          "--closed-loop-tracks", "0", "--saliency-frames", "0", "--window-method", "none", "--out",
                          "explained"], capture_output=True, text=True, timeout=300, cwd=tmp_path, preexec_fn=small_files,
                         env={**os.environ, "PYTHONSAFEPATH": "1"})
    assert out.returncode == 2, out.stderr[-2000:]   # explain measures no trace cut short
    assert out.stderr.strip().splitlines()[-1] == (
        "nac-drive explain: error: --out: explained/trace: chunk 0 could not be written (File too large); the 0 "
        "chunk(s) before it are whole")
    assert not (tmp_path / "explained" / "explain.json").exists()
