"""``nac-drive explain``: its report is JSON without NaN, written atomically, refuses what it
cannot explain before driving, and end to end through the CLI prints what explain.json holds."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from nac_drive.policy.loading import shipped_policy_path
from nac_drive.interpret.trace import load_trace
from nac_drive.pipeline.explain import (EXPLAIN_FILE, NAC_STATES_NEEDED, ExplainArgs, fig4_section, jsonable,
                                        skipped_sections, write_report)
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
    from nac_drive.policy.cores import CoreConfig
    from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig

    lstm = DrivingPolicy(PolicyConfig(core=CoreConfig(core="lstm", d_model=8), action="continuous",
                                      num_outputs=3)).save_pretrained(tmp_path / "lstm")
    udacity = str(shipped_policy_path("udacity"))
    for args, expected in ((["--policy", str(lstm)], "explain needs a CarRacing policy with discrete actions or a "
                                                     "Udacity policy (steering regression), got a carracing lstm "
                                                     "policy with continuous actions"),
                           (["--policy", udacity, "--task", "carracing"], "is a 'udacity' policy, not a 'carracing' one"),
                           (["--speed", "5"], "speed: only a Udacity policy drives at a set speed")):
        out = cli("explain", *args, "--out", str(tmp_path / "x"), timeout=120)   # a refusal comes at once
        assert out.returncode == 2 and expected in out.stderr, (args, out.stderr[-2000:])
        assert len(out.stderr.strip().splitlines()) == 1 and not (tmp_path / "x").exists()
    out = cli("explain", "--closed-loop-tracks", "-1")
    assert out.returncode == 2 and "--closed-loop-tracks" in out.stderr
    out = cli("explain", "--closed-loop-tracks", "1000000000000")   # bounded before any drive (issue 58)
    assert out.returncode == 2 and "--closed-loop-tracks: must be <= 100000" in out.stderr


def test_one_table_decides_which_sections_a_core_skips():
    from nac_drive.policy.cores import CORES

    nac_only = {section for section, needs in NAC_STATES_NEEDED.items() if needs is not None}
    assert nac_only == {"fig4", "scenes", "atlas", "closed_loop"} and skipped_sections("nac") == {}
    for core in set(CORES) - {"nac"}:
        skipped = skipped_sections(core)
        assert set(skipped) == nac_only and all(f"core is {core}" in why for why in skipped.values())
    off = skipped_sections("nac", ExplainArgs(saliency_frames=0, window_method="none", closed_loop_tracks=0))
    assert off == {"saliency": "--saliency-frames 0", "window": "--window-method none",
                   "push": "--closed-loop-tracks 0"}
    assert set(skipped_sections("gru", ExplainArgs(saliency_frames=0))) == nac_only | {"saliency"}


def test_explain_of_a_gru_policy_runs_every_section_that_needs_no_nac_states(tmp_path):
    """A small untrained GRU policy (the sections read its frames and outputs, whatever it
    learnt): saliency with its paired statistics and road share, the window, the mirror and the
    drive run; fig4, the atlas and the closed loop are skipped, each named with why, in
    explain.json, the text and the dashboard, and so is the push, its track straight on these steps."""
    import torch

    from nac_drive.interpret.dashboard import build_dashboard
    from nac_drive.policy.cores import CoreConfig
    from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig
    from support.dashboard_pages import run_data

    torch.manual_seed(0)
    gru = DrivingPolicy(PolicyConfig(core=CoreConfig(core="gru", d_model=8, window=4))).save_pretrained(
        tmp_path / "gru")
    out = cli("explain", "--policy", str(gru), "--episodes", "1", "--max-steps", "30", "--saliency-frames", "4",
              "--window-method", "ablation", "--window-every", "2", "--closed-loop-tracks", "1", "--out",
              str(tmp_path / "explain"), "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report == json.loads((tmp_path / "explain" / EXPLAIN_FILE).read_text())
    assert report["core"] == "gru" and report["drive"]["lengths"] == [30]
    assert set(report["skipped"]) == {"fig4", "scenes", "atlas", "closed_loop", "push"}
    assert {name for name in NAC_STATES_NEEDED if report[name] is None} == set(report["skipped"])
    assert report["skipped"]["push"] == "needs the curve ahead: constant on these steps"
    assert "Skipped:" in out.stdout and report["skipped"]["atlas"] in out.stdout
    assert "Fig. 4 claim" not in out.stdout and "Neuron atlas" not in out.stdout

    saliency = report["saliency"]
    assert saliency["frames"] == 4 and set(saliency["paired"]) == {"gradcam", "integrated_gradients", "occlusion"}
    assert set(saliency["road_share"]) == set(saliency["methods"]) and "rows above the car" in saliency["road_mask"]
    for share in [*saliency["road_share"].values(), saliency["road_pixel_share"]]:
        assert share["mean"] is None or 0 <= share["mean"] <= 1
        assert share["ci95"] == [None, None] or share["ci95"][0] <= share["mean"] <= share["ci95"][1]
    assert saliency["road_pixel_share"]["frames"] == 4 and saliency["road_pixel_share"]["mean"] > 0   # on the road
    assert "on the road ahead" in out.stdout
    assert report["window"]["window"] == 4 and report["window"]["every"] == 2
    assert report["window"]["full_window_steps"] == len(range(4, 30, 2))   # full from step 3, every second one
    assert report["mirror"]["frames"] == 30 and 0 <= report["mirror"]["mirror_agreement"] <= 1
    assert len(report["mirror"]["units"]["core"]["units"]) == 8 and "heads" in report["mirror"]["units_skipped"]
    probes = report["probes"]   # a GRU's core output only, each other representation named with why
    assert set(probes["skipped"]) == {"q", "k", "v", "heads"} and probes["units"] == {"core": 8}
    assert {row["variable"] for row in probes["scores"]} == set(probes["variables"]) and probes["scores"]
    assert probes["held_out"] == "stretches of 6 steps"
    # the first 30 steps of track 900000 are straight: no curve to probe, so no push, and why
    assert probes["variables_skipped"] == {"curvature": "constant on these steps"} and probes["intervention"] is None
    assert probes["intervention_skipped"] == "needs the curve ahead: constant on these steps"
    assert "Linear probes (ridge)" in out.stdout and "no push along the curvature probe" in out.stdout
    dictionary = report["dictionary"]
    assert dictionary["units"] == 8 and dictionary["held_out_steps"] + dictionary["train_steps"] == 30
    assert "Sparse dictionary of the core's output" in out.stdout

    page = build_dashboard(tmp_path / "explain").read_text()
    figures = run_data(page)["figures"]
    assert {"explain_skipped", "explain_faithfulness", "explain_paired", "explain_road_share",
            "explain_mirror"} <= set(figures)
    assert not {"explain_fig4", "explain_atlas", "explain_closed_loop"} & set(figures)
    assert figures["explain_skipped"]["data"][0]["cells"]["values"][0] == list(report["skipped"])


@pytest.mark.slow
def test_explain_end_to_end_prints_what_explain_json_holds(tmp_path):
    out = cli("explain", "--episodes", "1", "--max-steps", "150", "--closed-loop-tracks", "1", "--closed-loop-top", "2",
              "--closed-loop-random", "1", "--frames", "120", "--saliency-frames", "6", "--window-method", "ablation",
              "--out", str(tmp_path / "explain"), "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["run"] == str(tmp_path / "explain")
    written = json.loads((tmp_path / "explain" / EXPLAIN_FILE).read_text())
    assert written == report
    assert "Fig. 4 claim" in out.stdout and "Neuron atlas" in out.stdout and "Closed loop" in out.stdout

    assert report["drive"]["seeds"] == [900000] and report["drive"]["lengths"] == [150]
    assert report["core"] == "nac" and report["skipped"] == {}
    fig4 = report["fig4"]
    assert sum(fig4["scenes"].values()) == 150 and len(fig4["heads"]) == 4
    assert {s["verdict"] for s in fig4["statements"]} <= {"reproduced", "not reproduced", "untestable"}
    scenes = report["scenes"]   # the road's classes, from the recorded curvature
    assert sum(scenes["classes"].values()) <= 150 and scenes["variables"]["curvature"]["count"] == 150
    assert scenes["verdict"]["literal"] in out.stdout and scenes["verdict"]["qualitative"] in out.stdout
    atlas = report["atlas"]
    assert atlas["frames"] == 120 and len(atlas["heads"]) == 4
    assert len(atlas["neurons"]) == 3 * 64 + 4 * (8 + 4 + 4)       # q/k/v of d_model 64, 4 heads of 16 neurons
    costs = [row["silencing_cost"] for row in atlas["neurons"]]
    assert costs == sorted(costs, reverse=True) and all(0 <= c <= 1 for c in costs)
    assert 0 <= atlas["uniform_weights"]["agreement"] <= 1 and atlas["replay_agrees_with_run"] > 0.8
    assert all(row["kl"] >= 0 and row["log_prob_change"] is not None for row in atlas["neurons"] + atlas["heads"])
    assert "d log p" in out.stdout
    mirror = report["mirror"]
    assert mirror["frames"] == 120 and mirror["decision"] == "action" and 0 <= mirror["mirror_agreement"] <= 1
    assert mirror["turn_frames"] == 0 or abs(mirror["flips"] + mirror["stays"]) <= 1
    assert "Mirrored frames" in out.stdout
    assert len(mirror["units"]["core"]["units"]) == 64 and len(mirror["units"]["heads"]["units"]) == 64
    assert sum(mirror["units"]["heads"]["counts"].values()) == 64
    probes = report["probes"]
    assert probes["skipped"] == {} and probes["units"] == {"q": 64, "k": 64, "v": 64, "heads": 64, "core": 64}
    assert {row["representation"] for row in probes["scores"]} == {"q", "k", "v", "heads", "core"}
    assert all(row["steps"] == 120 for row in probes["scores"])
    assert report["dictionary"]["units"] == 64 and report["dictionary"]["atoms"] == 128
    closed = report["closed_loop"]
    assert closed["seeds"] == [900000] and [n["chosen"] for n in closed["neurons"]] == ["top", "top", "random"]
    assert [n["name"] for n in closed["neurons"][:2]] == [row["name"] for row in atlas["neurons"][:2]]
    assert len(closed["intact"]["returns"]) == 1 and all(len(n["returns"]) == 1 for n in closed["neurons"])
    parts = {row["name"]: row for row in closed["attention"]}
    assert set(parts) == {"keys: random K", "keys: most recent K", "t_ij: its mean per head", "weights: uniform"}
    for row in closed["neurons"] + closed["attention"]:   # one track: the paired change is the change, no interval
        assert row["paired"]["mean"] == pytest.approx(row["returns"][0] - closed["intact"]["returns"][0])
        assert row["paired"]["ci95"] is None and row["return_change"] == pytest.approx(row["paired"]["mean"])
    assert "keys: most recent K" in out.stdout
    push = report["push"]   # the same track driven pushed along the curvature probe
    assert push["seeds"] == [900000] and push["probe"]["steps"] == 120
    assert [row["push"] for row in push["pushes"]] == ["left", "right", "random 1", "random 2", "random 3", "random 4"]
    assert all(row["change"]["ci95"] is None and row["paired"]["ci95"] is None for row in push["pushes"])
    assert push["verdict"] == "no clear effect" and "Pushed along the curvature probe while driving" in out.stdout
    assert push["intact"] == closed["intact"] and len(closed["intact"]["track_steering"]) == 1   # driven intact once
    run = load_trace(tmp_path / "explain")
    assert run.num_steps == 150 and report["trace_sha256"] == run.sha256

    saliency = report["saliency"]
    assert saliency["frames"] == 6 and set(saliency["methods"]) == {"gradcam", "integrated_gradients", "occlusion",
                                                                   "random", "random_cam_grid", "random_patches"}
    assert set(saliency["paired"]) == {"gradcam", "integrated_gradients", "occlusion"}
    for against in saliency["paired"].values():
        assert set(against) == {"random", "random_cam_grid", "random_patches"}
        assert all(against[b][key]["items"] == 6 for b in against for key in ("deletion_auc", "insertion_auc"))
    assert "Paired on the same frames" in out.stdout
    for method in saliency["methods"].values():
        assert 0 <= method["deletion_auc"]["mean"] <= 1 and 0 <= method["insertion_auc"]["mean"] <= 1
    assert saliency["methods"]["random"]["sanity_spearman"]["encoder"]["mean"] == 1.0   # it ignores the model
    window = report["window"]
    shares = np.load(tmp_path / "explain" / window["file"])["shares"]
    full = shares[np.isfinite(shares).all(axis=1) & (shares.sum(axis=1) > 0)]
    assert window["full_window_steps"] == len(full) == 150 - 15
    np.testing.assert_allclose(window["mean_share_by_frames_ago"], full.mean(axis=0), rtol=1e-5)

    # the dashboard of the run shows every section, with the report's figures
    from nac_drive.interpret.dashboard import build_dashboard
    from support.dashboard_pages import run_data

    data = run_data(build_dashboard(tmp_path / "explain").read_text())
    figures = data["figures"]
    assert {"explain_fig4", "explain_atlas", "explain_faithfulness", "explain_closed_loop", "explain_push",
            "attribution"} <= set(figures)
    q_points = next(t for t in figures["explain_atlas"]["data"] if t["name"] == "q")
    q_rows = [row for row in atlas["neurons"] if row["group"] == "q"]
    assert q_points["text"] == [row["name"] for row in q_rows]
    assert q_points["y"] == pytest.approx([row["silencing_cost"] for row in q_rows])
    changes = figures["explain_closed_loop"]["data"][0]["y"]
    assert changes == pytest.approx([n["return_change"] for n in closed["neurons"]])


def test_the_dashboard_shows_an_explain_report_of_its_own_trace_only_and_escapes_it(tmp_path):
    from nac_drive.interpret.dashboard import build_dashboard
    from support.dashboard_pages import run_data

    run = load_trace(make_synthetic_run(tmp_path / "run", steps=40, with_saliency=False))
    closed = {"tracks": 2, "seeds": [900000, 900001], "intact": {"returns": [900.0, 910.0], "mean_return": 905.0},
              "neurons": [{"name": "<b>q[1]</b>", "chosen": "top", "silencing_cost": 0.1, "returns": [880.0, 890.0],
                           "mean_return": 885.0, "return_change": -20.0}]}
    report = {"trace_sha256": run.sha256, "closed_loop": closed, "atlas": {"neurons": "not a list of rows"}}
    write_report(tmp_path / "run" / EXPLAIN_FILE, report)
    page = build_dashboard(tmp_path / "run").read_text()
    figures = run_data(page)["figures"]
    assert figures["explain_closed_loop"]["data"][0]["x"] == ["&lt;b&gt;q[1]&lt;/b&gt;"]   # plotly shows it as text
    assert figures["explain_closed_loop"]["data"][0]["y"] == [-20.0]
    assert "explain_atlas" not in figures and "its &#x27;atlas&#x27; section is malformed" in page

    write_report(tmp_path / "run" / EXPLAIN_FILE, dict(report, trace_sha256="0" * 64))
    page = build_dashboard(tmp_path / "run").read_text()
    assert "explain_closed_loop" not in run_data(page)["figures"]
    assert "explain.json is not shown: computed from another trace " in page


def test_the_dashboard_draws_no_more_fig4_heads_than_the_trace_holds(tmp_path):
    """A report (with the right sha) claiming many heads made the dashboard draw a subplot
    pair per head, in time growing faster than the heads: 50 took 71 s, 150 over 600 s."""
    from nac_drive.interpret.dashboard import build_dashboard
    from support.dashboard_pages import run_data

    run = load_trace(make_synthetic_run(tmp_path / "run", steps=40, with_saliency=False))
    trace_heads = run.tau.shape[1]
    stats = {"median": 1.2, "p5": 1.0, "p95": 1.4, "count": 7}

    def fig4(heads):
        return {"mode": "exact", "claims": {}, "heads": [
            {"head": h, "tau": {"by_scene": {"straight": stats}}, "logits": {"by_scene": {"left": stats}}}
            for h in range(heads)]}

    write_report(tmp_path / "run" / EXPLAIN_FILE, {"trace_sha256": run.sha256, "fig4": fig4(trace_heads)})
    drawn = run_data(build_dashboard(tmp_path / "run").read_text())["figures"]["explain_fig4"]
    assert len(drawn["data"]) == 2 * trace_heads   # a tau and a logit bar per head: the trace's heads are drawn

    write_report(tmp_path / "run" / EXPLAIN_FILE, {"trace_sha256": run.sha256, "fig4": fig4(trace_heads + 20)})
    page = build_dashboard(tmp_path / "run").read_text()
    assert "explain_fig4" not in run_data(page)["figures"]
    assert (f"its &#x27;fig4&#x27; section claims {trace_heads + 20} heads, the trace holds {trace_heads}; "
            "not shown") in page


def test_a_killed_explain_goes_on_from_its_last_finished_section(tmp_path, monkeypatch):
    """A killed explain once redid everything, its drive included, into RUN_DIR-2."""
    from dataclasses import replace

    import torch

    import nac_drive.pipeline.drive as drive_module
    import nac_drive.pipeline.explain as module
    from nac_drive.policy.cores import CoreConfig
    from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig

    torch.manual_seed(0)
    gru = DrivingPolicy(PolicyConfig(core=CoreConfig(core="gru", d_model=8, window=4))).save_pretrained(
        tmp_path / "gru")
    run = tmp_path / "explain"
    args = ExplainArgs(policy=str(gru), episodes=1, max_steps=30, saliency_frames=4, window_method="ablation",
                       closed_loop_tracks=1, out=str(run))
    real_mirror = module.mirror_section

    def killed(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "mirror_section", killed)
    with pytest.raises(KeyboardInterrupt):
        module.explain(args, progress=False)
    partial = json.loads((run / module.PARTIAL_FILE).read_text())["report"]
    assert partial["saliency"] and partial["window"] and "mirror" not in partial
    assert not (run / EXPLAIN_FILE).exists()

    with pytest.raises(ValueError, match="was explained with other --seed; give the flags it was run with"):
        module.explain(replace(args, resume=str(run), seed=1), progress=False)
    monkeypatch.setattr(module, "mirror_section", real_mirror)
    monkeypatch.setattr(module, "saliency_section", lambda *a, **k: pytest.fail("saliency computed again"))
    monkeypatch.setattr(drive_module, "drive_carracing", lambda *a, **k: pytest.fail("driven again"))

    def push_killed_after_one_drive(*a, log, **k):   # the push's drives: each kept as it finishes
        log.add("intact", {"returns": [1.5], "mean_return": 1.5, "track_offset": [float("nan"), 0.25]})
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "push_section", push_killed_after_one_drive)
    with pytest.raises(KeyboardInterrupt):
        module.explain(replace(args, resume=str(run)), progress=False)
    saved = json.loads((run / module.PARTIAL_FILE).read_text())
    assert saved["drives"]["push"] == {"intact": {"returns": [1.5], "mean_return": 1.5, "track_offset": [None, 0.25]}}
    assert "push" not in saved["report"]

    def push_resumed(*a, log, **k):   # given the drives it finished before the kill, a NaN (strict JSON's null) a NaN
        kept = log.done["intact"]
        assert kept.keys() == {"returns", "mean_return", "track_offset"} and kept["returns"] == [1.5]
        assert math.isnan(kept["track_offset"][0]) and kept["track_offset"][1] == 0.25
        return {"pushes": []}

    monkeypatch.setattr(module, "push_section", push_resumed)
    report = module.explain(replace(args, resume=str(run)), progress=False)
    assert report["saliency"] == partial["saliency"] and report["mirror"]["frames"] > 0
    assert report["push"] == {"pushes": []}
    assert json.loads((run / EXPLAIN_FILE).read_text()) == report and not (run / module.PARTIAL_FILE).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["explain", "gru"]   # no explain-2
    with pytest.raises(ValueError, match="no explain was killed there \\(it finished"):
        module.explain(replace(args, resume=str(run)), progress=False)


def test_kept_drives_read_back_as_driven_or_refused_whole():
    from nac_drive.pipeline.explain import kept_drives

    saved = {"push": {"intact": {"returns": [1.0, 2.0], "mean_return": 1.5, "track_offset": [None, 0.5]},
                      "left": {"returns": [3.0], "finished": True}}}
    read = kept_drives(saved)
    assert read["push"]["left"] == {"returns": [3.0], "finished": True}
    assert read["push"]["intact"]["returns"] == [1.0, 2.0] and math.isnan(read["push"]["intact"]["track_offset"][0])
    assert kept_drives({}) == {}
    for malformed in ([], {"push": []}, {"push": {"intact": [1.0]}}, {"push": {"intact": {"returns": ["1.0"]}}},
                      {"push": {"intact": {"returns": [[1.0]]}}}, {"push": {"intact": {"mean_return": {}}}}):
        assert kept_drives(malformed) is None, malformed


def test_a_partial_file_with_malformed_drives_is_refused(tmp_path):
    import nac_drive.pipeline.explain as module

    run = tmp_path / "explain"
    run.mkdir()
    (run / module.PARTIAL_FILE).write_text(json.dumps({"args": {}, "report": {}, "drives": {"push": {"intact": 1}}}))
    with pytest.raises(ValueError, match="is not an explain's record"):
        module.explain(ExplainArgs(policy="shipped:nac", resume=str(run)), progress=False)
