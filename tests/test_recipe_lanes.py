"""benchmarks/recipes/lib.bash's lanes: two lanes take each job of one list once, and a recipe that
ran them goes on through a pause of its next command (SIGSTOP, then SIGCONT: a scheduler's
suspend). With job control left on after the lanes, bash took the stopped command for a finished
one, ended the recipe and sent the command SIGTERM: the Udacity comparison died that way."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

LIB = Path(__file__).resolve().parents[1] / "benchmarks" / "recipes" / "lib.bash"

RECIPE = """set -euo pipefail
source {lib}
claimed() {{ echo "$LANE $1" >> {out}/claims; }}
job_lanes claimed a b c d e
{python} -c "import time; time.sleep(4); print('command finished')"
echo "recipe went on"
"""


def test_the_lanes_take_each_job_once_and_a_paused_command_after_them_finishes(tmp_path):
    recipe = tmp_path / "recipe.sh"
    recipe.write_text(RECIPE.format(lib=LIB, out=tmp_path, python=sys.executable))
    run = subprocess.Popen(["bash", str(recipe)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 30
    while not (command := [p for p in children(run.pid) if "time.sleep(4)" in cmdline(p)]):
        assert run.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    run.send_signal(signal.SIGSTOP)
    subprocess.run(["kill", "-STOP", str(command[0])], check=True)
    time.sleep(0.5)
    run.send_signal(signal.SIGCONT)   # the recipe first, as a pause that walks the processes in order does
    time.sleep(0.5)
    subprocess.run(["kill", "-CONT", str(command[0])], check=True)
    out, _ = run.communicate(timeout=30)
    assert run.returncode == 0 and out.splitlines()[-2:] == ["command finished", "recipe went on"], out
    claims = sorted(line.split() for line in (tmp_path / "claims").read_text().splitlines())
    assert sorted(job for _, job in claims) == ["a", "b", "c", "d", "e"] and {lane for lane, _ in claims} <= {"0", "1"}


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
