"""What a user does runs without the names only Linux has (issue 55 item 2).

A subprocess first takes away what a Windows or macOS Python lacks (``os.O_NONBLOCK``,
``os.pread`` / ``os.pwrite``, ``os.sysconf``, ``os.sched_getaffinity``, the ``fcntl`` and
``resource`` modules, POSIX-only signals), then loads the shipped policy and drives it,
collects a tiny CarRacing dataset and trains one epoch on it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

# Names Windows (most of them) or macOS (sched_getaffinity) lacks; each is on a path a user needs or
# could be, so taking them all away at once shows the package asks none of them unguarded.
WITHOUT_LINUX = textwrap.dedent("""
    import os, signal, sys
    import psutil   # its Linux backend needs resource; on Windows and macOS psutil has its own
    for name in ("O_NONBLOCK", "pread", "pwrite", "sysconf", "sched_getaffinity"):
        delattr(os, name)
    for name in ("SIGKILL", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGALRM"):
        delattr(signal, name)
    sys.modules["fcntl"] = sys.modules["resource"] = None   # import fcntl: ImportError
""")

USER = textwrap.dedent("""
    import sys
    from nac_drive.policy.loading import load_driving_policy
    from nac_drive.cli import main
    from nac_drive.simulators.carracing import make_carracing

    policy = load_driving_policy()
    env = make_carracing(seed=900000)
    obs, _ = env.reset(seed=900000)
    policy.reset()
    for _ in range(5):
        obs, *_ = env.step(policy.select_action(obs))
    print("drove")
    out = sys.argv[1]
    assert main(["collect", "carracing", "--expert", "teacher", "--episodes", "2", "--max-steps", "40",
                 "--out", f"{out}/demos", "--name", "tiny"]) == 0
    assert main(["train", "--data", f"{out}/demos", "--out", f"{out}/runs", "--run-name", "r", "--epochs", "1",
                 "--window", "4", "--d-model", "16", "--num-heads", "2", "--topk", "3",
                 "--windows-per-epoch", "32", "--batch-size", "8", "--no-progress"]) == 0
    print("trained")
""")


def test_the_prelude_takes_the_names_away():
    """The check below would prove nothing if the names were still there."""
    probe = WITHOUT_LINUX + textwrap.dedent("""
        try:
            import fcntl
        except ImportError:
            print(hasattr(os, "O_NONBLOCK"), hasattr(os, "pread"), hasattr(signal, "SIGKILL"))
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["False", "False", "False"], done.stderr


def test_load_drive_collect_and_train_without_linux_only_names(tmp_path):
    done = subprocess.run([sys.executable, "-c", WITHOUT_LINUX + USER, str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[:1] == ["drove"] and "trained" in done.stdout, done.stdout
    assert (tmp_path / "runs" / "r" / "last" / "config.json").is_file()


def test_a_worker_off_linux_ends_when_its_parent_is_gone_though_its_parent_id_stays():
    """Off Linux a worker's watchdog thread ends it once its parent is gone. On Windows the
    parent id of a process never changes, even after that parent ended: a watchdog that only
    waited for it to change never fired."""
    gone = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout)
    worker = textwrap.dedent(f"""
        import os, time
        import nac_drive.child_processes as cp
        cp._prctl = lambda: None          # no PR_SET_PDEATHSIG, as on Windows and macOS
        os.getppid = lambda: {gone}       # as on Windows: the id of the parent, ended
        cp.die_with_parent({gone})
        time.sleep(20)
    """)
    done = subprocess.run([sys.executable, "-c", worker], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr   # ended by the watchdog, not after its 20 s
