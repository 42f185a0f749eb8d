"""``nac-drive explain``: its report is JSON without NaN, written atomically, refuses what it
cannot explain before driving, and end to end through the CLI prints what explain.json holds."""

import json
import subprocess
import sys

import numpy as np
import pytest

from nac_drive.agents.driver import shipped_policy_path
from nac_drive.interpret.trace import load_trace
from nac_drive.pipeline.explain import EXPLAIN_FILE, fig4_section, jsonable, write_report
from support.synthetic_runs import make_synthetic_run


def cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "nac_drive.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_reports_hold_null_where_a_figure_is_missing(tmp_path):
    report = {"a": float("nan"), "b": [np.float32(1.5), np.inf], "c": {"d": np.int64(3), "e": np.array([1.0, np.nan])},
              "f": True, "g": None}
    assert jsonable(report) == {"a": None, "b": [1.5, None], "c": {"d": 3, "e": [1.0, None]}, "f": True, "g": None}
    path = write_report(tmp_path / EXPLAIN_FILE, report)
    assert json.loads(path.read_text()) == jsonable(report)
    assert [p.name for p in tmp_path.iterdir()] == [EXPLAIN_FILE]   # no temporary file left


def test_the_fig4_section_is_strict_json_with_null_for_scenes_never_seen(tmp_path):
    run = load_trace(make_synthetic_run(tmp_path / "run", steps=60, with_saliency=False))
    section = fig4_section(run)
    text = json.dumps(section, allow_nan=False)            # would raise on a NaN
    assert json.loads(text)["claims"].keys() == {"tau", "logits", "steady_logits"}
    assert set(section["scenes"]) == {"left", "left-straight", "straight", "right-straight", "right"}


def test_explain_refuses_a_policy_it_cannot_explain_before_driving(tmp_path):
    out = cli("explain", "--policy", str(shipped_policy_path("udacity")), "--out", str(tmp_path / "x"))
    assert out.returncode == 2 and "explain needs a CarRacing NAC policy" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not (tmp_path / "x").exists()
    out = cli("explain", "--closed-loop-tracks", "-1")
    assert out.returncode == 2 and "--closed-loop-tracks" in out.stderr


@pytest.mark.slow
def test_explain_end_to_end_prints_what_explain_json_holds(tmp_path):
    out = cli("explain", "--episodes", "1", "--max-steps", "150", "--closed-loop-tracks", "1", "--closed-loop-top", "2",
              "--closed-loop-random", "1", "--frames", "120", "--out", str(tmp_path / "explain"), "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["run"] == str(tmp_path / "explain")
    written = json.loads((tmp_path / "explain" / EXPLAIN_FILE).read_text())
    assert written == report
    assert "Fig. 4 claim" in out.stdout and "Neuron atlas" in out.stdout and "Closed loop" in out.stdout

    assert report["drive"]["seeds"] == [900000] and report["drive"]["lengths"] == [150]
    fig4 = report["fig4"]
    assert sum(fig4["scenes"].values()) == 150 and len(fig4["heads"]) == 4
    assert {s["verdict"] for s in fig4["statements"]} <= {"reproduced", "not reproduced", "untestable"}
    atlas = report["atlas"]
    assert atlas["frames"] == 120 and len(atlas["heads"]) == 4
    assert len(atlas["neurons"]) == 3 * 64 + 4 * (8 + 4 + 4)       # q/k/v of d_model 64, 4 heads of 16 neurons
    costs = [row["silencing_cost"] for row in atlas["neurons"]]
    assert costs == sorted(costs, reverse=True) and all(0 <= c <= 1 for c in costs)
    assert 0 <= atlas["uniform_weights"]["agreement"] <= 1 and atlas["replay_agrees_with_run"] > 0.8
    closed = report["closed_loop"]
    assert closed["seeds"] == [900000] and [n["chosen"] for n in closed["neurons"]] == ["top", "top", "random"]
    assert [n["name"] for n in closed["neurons"][:2]] == [row["name"] for row in atlas["neurons"][:2]]
    assert len(closed["intact"]["returns"]) == 1 and all(len(n["returns"]) == 1 for n in closed["neurons"])
    assert load_trace(tmp_path / "explain").num_steps == 150
