"""benchmarks/explain_tables.py: the tables of BENCHMARKS.md §7 from explain.json reports, on
small crafted reports with the keys ``nac-drive explain`` writes."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_script():
    spec = importlib.util.spec_from_file_location("explain_tables", ROOT / "benchmarks" / "explain_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


explain_tables = _load_script()


def summary(mean, lo, hi):
    return {"mean": mean, "ci95": [lo, hi], "blocks": 4, "items": 12}


def nac_report() -> dict:
    """A NAC policy with every section the tables read."""
    paired = {method: {baseline: {"deletion_auc": summary(d, d - 0.05, d + 0.05),
                                  "insertion_auc": summary(-d, -d - 0.05, -d + 0.05)}
                       for baseline, d in (("random", 0.111 + k), ("random_cam_grid", 0.222 + k),
                                           ("random_patches", 0.333 + k))}
              for method, k in (("gradcam", 0.0), ("occlusion", 0.4), ("integrated_gradients", 0.8))}
    closed_row = {"name": "k[1]", "chosen": "top", "paired": {"mean": -10.0, "ci95": [-12.0, -8.0]}}
    return {
        "task": "carracing", "core": "nac", "skipped": {},
        "drive": {"seeds": [900000, 900001], "returns": [800.0, 820.0], "lengths": [100, 50]},
        "fig4": {"mode": "exact"},
        "scenes": {"literal": {"claims": {"tau": {"verdict": "untestable", "heads": []},
                                          "logits": {"verdict": "reproduced", "heads": [1]}}},
                   "qualitative": {"tau": {"verdict": "separated (the paper's direction, heads 0; the other way, "
                                                      "heads 2)", "heads_separating": [0, 2],
                                           "heads_paper_direction": [0]},
                                   "logits": {"verdict": "not separated"}}},
        "window": {"method": "integrated_gradients", "mean_share_by_frames_ago": [0.75, 0.25],
                   "completeness": {"decisions": 12, "incomplete": 3, "ratio": {"median": 0.031, "max": 0.3}}},
        "mirror": {"mirror_agreement": 0.875},
        "dictionary": {"variance_explained": 0.942, "target": 0.9, "reached": True},
        "saliency": {"frames": 12, "blocks": {"by": "time", "count": 4}, "paired": paired,
                     "road_share": {"gradcam": summary(0.4, 0.3, 0.5), "occlusion": summary(0.2, 0.1, 0.3),
                                    "integrated_gradients": summary(0.25, None, None)},
                     "road_pixel_share": summary(0.12, 0.07, 0.15)},
        "closed_loop": {"tracks": 2, "metric": "return", "intact": {"mean_return": 850.25},
                        "neurons": [closed_row, {**closed_row, "name": "q[2]", "paired": {"mean": -20.0}},
                                    {**closed_row, "name": "v[3]", "chosen": "random", "paired": {"mean": 1.0}},
                                    {**closed_row, "name": "v[4]", "chosen": "random", "paired": {"mean": 3.0}}],
                        "attention": [{"name": "keys: random K", "paired": {"mean": -1.5, "ci95": [-3.0, 0.0]}}]},
        "push": {"steering": "P(right) - P(left)", "metric": "return", "probe": {"in_sample_r2": 0.93},
                 "pushes": [{"push": "left", "change": {"mean": 0.0123, "ci95": [0.01, 0.015]},
                             "paired": {"mean": 5.0, "ci95": [1.0, 9.0]}},
                            {"push": "right", "change": {"mean": -0.02, "ci95": [-0.03, -0.01]},
                             "paired": {"mean": -4.0, "ci95": [-8.0, 0.0]}},
                            {"push": "random 1", "change": {"mean": -0.005}, "paired": {"mean": 0.0}},
                            {"push": "random 2", "change": {"mean": 0.004}, "paired": {"mean": 0.0}}]},
    }


MHA_SKIPPED = {"fig4": "needs the tau and logits of the NAC's heads; this policy's core is mha",
               "scenes": "needs the NAC's heads on the road's scenes; this policy's core is mha",
               "closed_loop": "needs the NAC's neurons; this policy's core is mha",
               "saliency": "--saliency-frames 0", "push": "--closed-loop-tracks 0"}


def mha_report() -> dict:
    """Another core: the NAC-only sections and two turned off are null, each with why in ``skipped``."""
    report = {**nac_report(), "core": "mha", "skipped": dict(MHA_SKIPPED)}
    report.update({name: None for name in MHA_SKIPPED})
    return report


def write(folder: Path, report) -> Path:
    folder.mkdir(parents=True)
    (folder / "explain.json").write_text(json.dumps(report))
    return folder


def tables(capsys, argv) -> str:
    assert explain_tables.main([str(a) for a in argv]) == 0
    return capsys.readouterr().out


def table_rows(out: str, caption: str) -> dict[str, dict[str, str]]:
    """The table after the line starting with ``caption``: policy -> header -> cell."""
    def cells(line: str) -> list[str]:
        return [c.strip() for c in line.strip().strip("|").split(" | ")]

    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(caption)) + 2   # caption, blank, header
    header, rows = cells(lines[start]), {}
    assert set(lines[start + 1]) == {"|", "-"}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        row = cells(line)
        assert len(row) == len(header), line
        rows[row[0]] = dict(zip(header, row))
    return rows


def notes_after(out: str, caption: str) -> list[str]:
    """The note lines under the table after ``caption``."""
    block = out.split(caption, 1)[1].split("\n\n")
    return [line for line in (block[2] if len(block) > 2 else "").splitlines() if line.startswith("- ")]


def test_each_saliency_method_is_paired_with_the_random_map_of_its_own_granularity(tmp_path, capsys):
    out = tables(capsys, [write(tmp_path / "core-nac-exact", nac_report())])
    row = table_rows(out, "Saliency faithfulness")["core-nac-exact (nac, exact)"]
    # gradcam: random 0.111, random_cam_grid 0.222, random_patches 0.333; occlusion +0.4, IG +0.8
    assert row["deletion: Grad-CAM - random_cam_grid"] == "0.222 [0.172, 0.272]"
    assert row["deletion: Occlusion - random_patches"] == "0.733 [0.683, 0.783]"
    assert row["deletion: IG - random"] == "0.911 [0.861, 0.961]"
    assert row["insertion: Grad-CAM - random_cam_grid"] == "-0.222 [-0.272, -0.172]"
    assert row["blocks, frames"] == "4 by time, 12 frames"


def test_a_skipped_section_prints_a_dash_and_its_reason_once_for_the_policies_sharing_it(tmp_path, capsys):
    other = mha_report()
    other["skipped"]["closed_loop"] = "needs the NAC's neurons; this policy's core is gru"
    out = tables(capsys, [write(tmp_path / "core-nac-exact", nac_report()), write(tmp_path / "core-mha", mha_report()),
                          write(tmp_path / "core-gru", {**other, "core": "gru"})])
    saliency = table_rows(out, "Saliency faithfulness")
    assert set(saliency["core-mha (mha)"].values()) - {"core-mha (mha)"} == {"-"}
    assert saliency["core-nac-exact (nac, exact)"]["deletion: IG - random"] != "-"
    assert notes_after(out, "Saliency faithfulness") == [
        "- `saliency` skipped, policies core-mha (mha), core-gru (gru): --saliency-frames 0"]
    assert notes_after(out, "Closed loop") == [   # different reasons: a line each
        "- `closed_loop` skipped, policy core-mha (mha): needs the NAC's neurons; this policy's core is mha",
        "- `closed_loop` skipped, policy core-gru (gru): needs the NAC's neurons; this policy's core is gru"]
    overview = table_rows(out, "Overview")["core-mha (mha)"]
    assert overview["Fig. 4, literal thresholds on the road's scenes"] == "-"
    assert overview["mirror agreement"] == "0.875"   # present sections still print


def test_the_overview_reads_each_section(tmp_path, capsys):
    ablated = nac_report()
    ablated["window"] = {"method": "ablation", "mean_share_by_frames_ago": [0.5], "completeness": None}
    ablated["dictionary"] = {"variance_explained": 0.5, "target": 0.9, "reached": False}
    out = tables(capsys, [write(tmp_path / "a", nac_report()), write(tmp_path / "b", ablated)])
    rows = table_rows(out, "Overview")
    a, b = rows["a (nac, exact)"], rows["b (nac, exact)"]
    assert a["traced steps (tracks)"] == "150 (2 tracks)"
    assert a["intact closed loop: return (tracks)"] == "850.2 (2 tracks)"
    assert a["Fig. 4, literal thresholds on the road's scenes"] == "tau untestable; logits reproduced (heads 1)"
    # which way the heads separate is kept: two heads do, one of them the paper's way
    assert a["Fig. 4 qualitative (left vs right AUROC)"] == ("tau separated (heads 0, 2; the paper's direction: 0); "
                                                             "logits not separated")
    assert (a["window: current frame's share"], b["window: current frame's share"]) == ("0.750", "0.500")
    assert (a["window: completeness"], b["window: completeness"]) == ("median ratio 0.031, 3/12 incomplete",
                                                                      "ablation")
    assert a["dictionary: variance explained"] == "0.942 (reached: target 0.9)"
    assert b["dictionary: variance explained"] == "0.500 (not reached: target 0.9)"


def test_the_closed_loop_averages_the_top_and_the_random_neurons_apart(tmp_path, capsys):
    out = tables(capsys, [write(tmp_path / "a", nac_report())])
    row = table_rows(out, "Closed loop")["a (nac, exact)"]
    assert (row["top neurons: mean change"], row["top neurons: range"]) == ("-15.0 (2 units)", "-20.0 to -10.0")
    assert (row["random neurons: mean change"], row["random neurons: range"]) == ("2.0 (2 units)", "1.0 to 3.0")
    assert row["keys: random K"] == "-1.5 [-3.0, 0.0]"


def test_the_push_and_road_share_tables(tmp_path, capsys):
    out = tables(capsys, [write(tmp_path / "a", nac_report())])
    push = table_rows(out, "Push along")["a (nac, exact)"]
    assert "steering = P(right) - P(left)" in out
    assert push["left: steering change"] == "0.0123 [0.0100, 0.0150]"
    assert push["right: return change"] == "-4.0 [-8.0, 0.0]"
    assert push["random directions: steering change range"] == "-0.0050 to 0.0040 (2 directions)"
    assert push["probe in-sample R^2"] == "0.930"
    road = table_rows(out, "Road share")["a (nac, exact)"]
    assert road["Grad-CAM"] == "0.400 [0.300, 0.500]"
    assert road["IG"] == "0.250 [-, -]"   # null bounds
    assert road["road's share of the pixels (chance)"] == "0.120 [0.070, 0.150]"


def test_recipe_takes_the_reports_order_then_the_rest_sorted(tmp_path, capsys):
    for name in ("zzz-extra", "core-mha", "aaa-extra", "core-gru", "steady-s1", "carracing-shipped"):
        core = name.split("-")[-1] if name.startswith("core") else "nac"
        write(tmp_path / name, {**nac_report(), "core": core})
    (tmp_path / "steady-policy-s0").mkdir()   # a folder of the recipe that holds no report
    out = tables(capsys, ["--recipe", tmp_path])
    assert [name.split(" ")[0] for name in table_rows(out, "Overview")] == [
        "carracing-shipped", "steady-s1", "core-gru", "core-mha", "aaa-extra", "zzz-extra"]


def test_a_folder_without_a_report_or_a_file_that_is_not_json_exits_2(tmp_path, capsys):
    good = write(tmp_path / "good", nac_report())
    (tmp_path / "empty").mkdir()
    assert explain_tables.main([str(good), str(tmp_path / "empty")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("explain_tables: error: ") and str(tmp_path / "empty") in captured.err
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "explain.json").write_text("{not json")
    assert explain_tables.main([str(tmp_path / "broken")]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "broken" / "explain.json") in err and "not valid JSON" in err
    assert len(err.strip().splitlines()) == 1


def test_recipe_without_reports_exits_2(tmp_path, capsys):
    assert explain_tables.main(["--recipe", str(tmp_path)]) == 2
    assert str(tmp_path) in capsys.readouterr().err


@pytest.mark.parametrize("argv", [[], ["--recipe", "x", "y"]])
def test_folders_or_recipe_exactly_one(argv):
    with pytest.raises(SystemExit) as stop:
        explain_tables.main(argv)
    assert stop.value.code == 2


def test_a_closed_loop_of_no_tracks_counts_as_skipped(tmp_path, capsys):
    report = {**nac_report(), "closed_loop": {"tracks": 0, "metric": "return", "intact": None, "neurons": [],
                                              "attention": []}}
    out = tables(capsys, [write(tmp_path / "a", report)])
    assert table_rows(out, "Closed loop")["a (nac, exact)"]["intact (tracks)"] == "-"
    assert notes_after(out, "Closed loop") == [
        "- `closed_loop` skipped, policy a (nac, exact): no tracks driven (--closed-loop-tracks 0)"]


def test_another_cores_intact_drive_comes_from_its_push_and_udacity_has_no_road_share(tmp_path, capsys):
    gru = {**mha_report(), "core": "gru", "push": nac_report()["push"]}
    gru["push"] = {**gru["push"], "tracks": 3, "intact": {"mean_return": 777.0}}
    del gru["skipped"]["push"]
    udacity = nac_report()
    udacity["saliency"] = {**udacity["saliency"], "road_share": None, "road_pixel_share": None}
    out = tables(capsys, [write(tmp_path / "core-gru", gru), write(tmp_path / "udacity-shipped", udacity)])
    overview = table_rows(out, "Overview")
    # the closed-loop section needs NAC neurons; the push drove the same policy intact on its tracks
    assert overview["core-gru (gru)"]["intact closed loop: return (tracks)"] == "777.0 (3 tracks)"
    assert overview["udacity-shipped (nac, exact)"]["intact closed loop: return (tracks)"] == "850.2 (2 tracks)"
    assert table_rows(out, "Closed loop")["core-gru (gru)"]["intact (tracks)"] == "-"   # its own section only
    road = table_rows(out, "Road share")["udacity-shipped (nac, exact)"]
    assert road["Grad-CAM"] == road["road's share of the pixels (chance)"] == "CarRacing only"


def test_a_column_of_two_metrics_names_the_task_of_each(tmp_path, capsys):
    udacity = {**nac_report(), "task": "udacity"}
    for section in ("closed_loop", "push"):
        udacity[section] = {**udacity[section], "metric": "mean_abs_cte", "intact": {"mean_abs_cte": 0.0412}}
    out = tables(capsys, [write(tmp_path / "carracing-shipped", nac_report()),
                          write(tmp_path / "udacity-shipped", udacity), write(tmp_path / "steady-s0", nac_report())])
    column = "intact closed loop: return (CarRacing); mean \\|CTE\\| (m) (Udacity) (tracks)"   # | escaped in a cell
    overview = table_rows(out, "Overview")
    assert overview["udacity-shipped (nac, exact)"][column].startswith("0.041 (")
    assert overview["steady-s0 (nac, exact)"][column] == overview["carracing-shipped (nac, exact)"][column]


def scene_effects(effects: dict) -> list[dict]:
    """``scenes.effects`` rows from ``{(quantity, comparison): [(effect, effect_ci95, auroc_ci95), ...]}``,
    one tuple per head (None: an untestable comparison)."""
    return [{"quantity": quantity, "comparison": comparison, "head": head,
             "effect": None if row is None else row[0], "effect_ci95": None if row is None else row[1],
             "auroc_ci95": None if row is None else row[2]}
            for (quantity, comparison), heads in effects.items() for head, row in enumerate(heads)]


def test_fig4_across_seeds_takes_each_seeds_strongest_head_and_an_interval_over_the_seeds(tmp_path, capsys):
    from scipy import stats

    def steady(strongest_right_left: float, separates: bool, paper_way: bool) -> dict:
        lo = 0.05 if separates else 0.0
        auroc_lo = 0.5 + lo if paper_way else 0.5 - strongest_right_left - 0.05
        effects = {("tau", "right_vs_left"): [(0.01, [0.0, 0.05], [0.45, 0.55]),
                                              (strongest_right_left, [lo, 0.3], [auroc_lo, 0.9])],
                   ("tau", "left_vs_straight"): [None, None]}
        return {**nac_report(), "fig4": {"mode": "steady"}, "scenes": {"effects": scene_effects(effects)}}

    seeds = [(0.2, True, True), (0.1, True, False), (0.15, False, False)]
    folders = [write(tmp_path / f"steady-s{i}", steady(*seed)) for i, seed in enumerate(seeds)]
    lone = write(tmp_path / "other-s0", steady(0.3, True, True))       # one seed of its recipe: no table
    exact = write(tmp_path / "steady-s3", {**steady(0.3, True, True), "fig4": {"mode": "exact"}})   # another mode
    out = tables(capsys, [*folders, lone, exact])
    assert out.count("The paper's Fig. 4 on the road's scenes across the seeds of") == 1
    rows = table_rows(out, "The paper's Fig. 4 on the road's scenes across the seeds of steady-s* (nac, steady)")
    row = rows["tau: right vs left"]
    assert row["seed 0: strongest head"] == "0.200 [0.050, 0.300] (head 1)"
    assert row["seed 2: strongest head"] == "0.150 [0.000, 0.300] (head 1)"
    lo, hi = stats.t.interval(0.95, 2, loc=0.15, scale=stats.sem([0.2, 0.1, 0.15]))
    assert row["mean over the seeds [95% t-interval]"] == f"0.150 [{lo:.3f}, {hi:.3f}]"
    assert row["seeds with a head separating them"] == "2/3 (1 the paper's way)"
    untested = rows["tau: left vs straight"]
    assert untested["seed 1: strongest head"] == "untestable" and untested["seeds with a head separating them"] == "-"
    assert rows["logits: right vs left"]["mean over the seeds [95% t-interval]"] == "-"   # not in these reports


def test_no_seeds_no_fig4_table(tmp_path, capsys):
    out = tables(capsys, [write(tmp_path / "core-nac-exact", nac_report())])
    assert "across the seeds" not in out and not out.endswith("\n\n\n")


def test_the_summary_reads_each_table_in_a_few_words_and_alone_with_summary(tmp_path, capsys):
    report = nac_report()
    report["push"]["verdict"] = "no clear effect"
    report["closed_loop"]["attention"].append({"name": "t_ij: its mean per head",
                                               "paired": {"mean": 2.5, "ci95": [1.0, 4.0]}})
    udacity = {**nac_report(), "saliency": {**nac_report()["saliency"], "road_share": None}}
    folders = [write(tmp_path / "a", report), write(tmp_path / "core-mha", mha_report()),
               write(tmp_path / "udacity-shipped", udacity)]
    out = tables(capsys, folders)
    rows = table_rows(out, "Summary")
    a = rows["a (nac, exact)"]
    assert a["Fig. 4, literal"] == "1/2 reproduced"   # logits' verdict; tau untestable
    assert a["Fig. 4, qualitative"] == "1/2 separated (1/2 the paper's way)"
    assert a["deletion: Grad-CAM - random_cam_grid"] == "0.222 [0.172, 0.272]"   # its own granularity's random
    assert a["road share: Grad-CAM (chance)"] == "0.400 (0.120)"
    assert (a["clamped: top neurons"], a["clamped: random neurons"]) == ("-15.0 (2 units)", "2.0 (2 units)")
    # the part that moves the return most, by |change|: t_ij's +2.5 over the random keys' -1.5
    assert a["costliest attention part"] == "t_ij: its mean per head: 2.5 [1.0, 4.0]"
    assert a["push along the curvature probe"] == "no clear effect"
    assert a["current frame's share"] == "0.750"
    assert rows["udacity-shipped (nac, exact)"]["road share: Grad-CAM (chance)"] == "CarRacing only"
    mha = rows["core-mha (mha)"]
    assert mha["Fig. 4, literal"] == mha["costliest attention part"] == mha["push along the curvature probe"] == "-"
    assert out.index("Summary") < out.index("Overview")
    alone = tables(capsys, ["--summary", *folders])
    assert table_rows(alone, "Summary") == rows and "Overview" not in alone
