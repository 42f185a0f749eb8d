"""The Markdown tables of BENCHMARKS.md §7 from the ``explain.json`` reports that ``nac-drive
explain`` writes (one per policy; ``benchmarks/recipes/explain_policies.sh`` makes them):
a summary (a few words from each of the others: §7's own table, alone with ``--summary``),
an overview, saliency faithfulness paired against random maps of each method's own
granularity, the saliency's road share (the paper's Fig. 6 proxy), the closed loop paired
against the intact policy, the push along the curvature probe, and the paper's Fig. 4 on the
road's scenes across the seeds of one recipe (folders that differ only in a ``-sN``, as the
recipe's NAC-steady ones: the interval the seeds give, which one seed's cannot).

    python benchmarks/explain_tables.py runs/recipe-explain/carracing-shipped runs/recipe-explain/core-gru
    python benchmarks/explain_tables.py --recipe runs/recipe-explain
    python benchmarks/explain_tables.py --recipe runs/recipe-explain --summary

Each row is a policy, labelled by its folder, its core and (a NAC) its mode. A section a
report lacks prints "-", and a line under the table says why (the report's ``skipped``).
Nothing is driven here.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from nac_drive.interpret.explain_report import EXPLAIN_FILE, MAX_REPORT_BYTES
from nac_drive.interpret.fig4 import QUANTITIES
from nac_drive.interpret.road_scenes import COMPARISONS
from nac_drive.io import bounded_json
from nac_drive.io.capped_read import read_capped
from nac_drive.simulators.episode_stats import CONFIDENCE, format_estimate

# the folders explain_policies.sh writes, in the report's order
RECIPE_ORDER = ("carracing-shipped", "udacity-shipped", "steady-s0", "steady-s1", "steady-s2", "core-nac-exact",
                "core-nac-scaled", "core-nac-qk", "core-cfc", "core-gru", "core-lstm", "core-mha")
# each saliency method against the random map of its own granularity (docs/interpretability.md)
OWN_BASELINE = {"gradcam": "random_cam_grid", "occlusion": "random_patches", "integrated_gradients": "random"}
METHOD_NAMES = {"gradcam": "Grad-CAM", "occlusion": "Occlusion", "integrated_gradients": "IG"}
# closed_loop.metric / push.metric -> (the intact drive's figure, its format, its words)
METRICS = {"return": ("mean_return", ".1f", "return"),
           "mean_abs_cte": ("mean_abs_cte", ".3f", "mean |CTE| (m)")}
STEERING_SPEC = ".4f"   # a push moves the steering by ~1e-4 to 1e-2

Report = tuple[str, dict[str, Any]]
Column = tuple[str, Callable[[dict[str, Any]], str]]


class ReportError(ValueError):
    """An explain.json that is missing or not a JSON object."""


def read_report(path: Path) -> dict[str, Any]:
    """The explain.json at ``path`` (a folder holding one, or the file itself)."""
    file = path / EXPLAIN_FILE if path.is_dir() else path
    if not file.is_file():
        raise ReportError(f"{path}: no {EXPLAIN_FILE}" if path.is_dir() else f"{path}: no such file or folder")
    try:
        report = bounded_json.loads(read_capped(file, MAX_REPORT_BYTES))
    except ValueError as e:   # FileRefused, JSONDecodeError and UnicodeDecodeError among them
        raise ReportError(f"{file}: not valid JSON ({type(e).__name__}: {e})") from None
    if not isinstance(report, dict):
        raise ReportError(f"{file}: expected a JSON object")
    return report


def recipe_paths(out: Path) -> list[Path]:
    """Every ``OUT/*/explain.json``, those of :data:`RECIPE_ORDER` in its order, then the rest sorted."""
    found = {path.parent.name: path for path in out.glob(f"*/{EXPLAIN_FILE}")}
    if not found:
        raise ReportError(f"{out}: no */{EXPLAIN_FILE} in it")
    return [found[name] for name in RECIPE_ORDER if name in found] + \
           [found[name] for name in sorted(set(found) - set(RECIPE_ORDER))]


def label(path: Path, report: dict[str, Any]) -> str:
    """``folder (core)``, a NAC's ``folder (nac, mode)``."""
    folder = (path if path.is_dir() else path.parent).resolve().name
    core = report.get("core", "nac")
    mode = dig(report, "fig4", "mode") if core == "nac" else None
    return f"{folder} ({core}{', ' + mode if isinstance(mode, str) else ''})"


def dig(data: Any, *keys) -> Any:
    """``data[k0][k1]...``, None where a level is missing or null."""
    for key in keys:
        if isinstance(data, dict):
            data = data.get(key)
        elif isinstance(data, list) and isinstance(key, int) and -len(data) <= key < len(data):
            data = data[key]
        else:
            return None
    return data


def is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def number(x, spec: str = ".3f") -> str:
    return f"{x:{spec}}" if is_number(x) else "-"


def estimate(summary: dict[str, Any] | None, spec: str = ".3f") -> str:
    """A summary's ``mean [lo, hi]`` (its ``ci95``); a null bound prints "-", a null mean "-"."""
    mean, ci = dig(summary, "mean"), dig(summary, "ci95")
    if not is_number(mean):
        return "-"
    if isinstance(ci, list) and len(ci) == 2 and all(map(is_number, ci)):
        return format_estimate(mean, ci, spec)
    return f"{mean:{spec}} [{number(dig(ci, 0), spec)}, {number(dig(ci, 1), spec)}]"


def counted(n, word: str) -> str:
    """``n word`` (``word`` plural unless ``n`` is 1)."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def span(values: Sequence, spec: str) -> str:
    """The range of ``values`` as ``lo to hi`` (not an interval: the spread of several estimates)."""
    values = [v for v in values if is_number(v)]
    return f"{min(values):{spec}} to {max(values):{spec}}" if values else "-"


def metric_of(section: dict[str, Any] | None) -> tuple[str, str, str]:
    """The section's metric as :data:`METRICS` has it (a report without one: CarRacing's return)."""
    return METRICS.get(dig(section, "metric") or "return", METRICS["return"])


def absent_reason(report: dict[str, Any], section: str) -> str | None:
    """Why ``section`` has no figures in ``report``; None when it has them."""
    value = report.get(section)
    driven = section != "closed_loop" or dig(value, "tracks")   # --closed-loop-tracks 0 leaves it, emptied
    if isinstance(value, dict) and value and driven:
        return None
    reason = dig(report, "skipped", section)
    if reason:
        return str(reason)
    if value is None:
        return "not in explain.json"
    return "not a section of figures in explain.json" if driven else "no tracks driven (--closed-loop-tracks 0)"


def skipped_notes(reports: Sequence[Report], sections: Sequence[str]) -> list[str]:
    """A line per section and reason its policies lack it, those policies named together."""
    notes = []
    for section in sections:
        by_reason: dict[str, list[str]] = {}
        for name, report in reports:
            reason = absent_reason(report, section)
            if reason is not None:
                by_reason.setdefault(reason, []).append(name)
        notes += [f"- `{section}` skipped, {'policies' if len(names) > 1 else 'policy'} {', '.join(names)}: {reason}"
                  for reason, names in by_reason.items()]
    return notes


def table(caption: str, columns: Sequence[Column], reports: Sequence[Report], sections: Sequence[str]) -> str:
    """A caption, a Markdown table (a row per report, the policy first, then a cell per column: its
    function of the report) and a note per section of ``sections`` a report lacks."""
    rows = [[name, *(fn(report) for _, fn in columns)] for name, report in reports]
    notes = skipped_notes(reports, sections)
    return "\n".join([caption, "", markdown(["policy", *(head for head, _ in columns)], rows)]
                     + ([""] + notes if notes else []))


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table, each ``|`` inside a cell escaped."""
    def line(cells) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), "|---" * len(header) + "|", *map(line, rows)])


def claim_words(claims: dict[str, Any] | None) -> str:
    """``{claim: {"verdict": ..., heads}}`` as ``tau untestable; logits separated (heads 0, 2; the
    paper's direction: 0)``: each verdict's first words and the heads behind it (the literal
    thresholds' ``heads``; the qualitative reading's ``heads_separating`` and
    ``heads_paper_direction``, so that which way the heads separate is not lost)."""
    if not isinstance(claims, dict) or not claims:
        return "-"

    def heads(claim) -> str:
        def listed(key):
            return ", ".join(map(str, dig(claim, key) or [])) or "none"
        if dig(claim, "heads_separating"):
            return f" (heads {listed('heads_separating')}; the paper's direction: {listed('heads_paper_direction')})"
        return f" (heads {listed('heads')})" if dig(claim, "heads") else ""

    return "; ".join(f"{name} {str(dig(claim, 'verdict') or '-').split(' (')[0]}{heads(claim)}"
                     for name, claim in claims.items())


def _window_completeness(window: dict[str, Any] | None) -> str:
    if not window:
        return "-"
    if window.get("method") == "ablation":   # no path integral, so nothing to add up
        return "ablation"
    done = window.get("completeness")
    if not done:
        return "-"
    return (f"median ratio {number(dig(done, 'ratio', 'median'))}, "
            f"{dig(done, 'incomplete')}/{dig(done, 'decisions')} incomplete")


def _dictionary(dictionary: dict[str, Any] | None) -> str:
    if not dictionary:
        return "-"
    reached = "reached" if dictionary.get("reached") else "not reached"
    return f"{number(dictionary.get('variance_explained'))} ({reached}: target {number(dictionary.get('target'), 'g')})"


INTACT_SECTIONS = ("closed_loop", "push")   # both drive the policy intact on the same tracks; push for any core


def _intact(report: dict[str, Any], sections: Sequence[str] = INTACT_SECTIONS) -> str:
    for section in sections:
        drive = report.get(section)
        if absent_reason(report, section) is None and dig(drive, "intact") is not None:
            key, spec, _ = metric_of(drive)
            return f"{number(dig(drive, 'intact', key), spec)} ({counted(drive.get('tracks'), 'track')})"
    return "-"


TASK_NAMES = {"carracing": "CarRacing", "udacity": "Udacity"}


def metric_caption(reports: Sequence[Report], *sections: str) -> str:
    """The metrics of the first of ``sections`` each report has, across ``reports``, in words, each
    with the tasks measured on it (only when they differ)."""
    used: dict[str, list[str]] = {}
    for _, report in reports:
        section = next((s for s in sections if report.get(s)), None)
        if section:
            tasks = used.setdefault(metric_of(report[section])[2], [])
            task = TASK_NAMES.get(report.get("task"), str(report.get("task")))
            tasks += [] if task in tasks else [task]
    if len(used) <= 1:
        return next(iter(used), "return")
    return "; ".join(f"{words} ({', '.join(tasks)})" for words, tasks in used.items())


def overview_table(reports: Sequence[Report]) -> str:
    """Table 1: the drive traced, the intact closed loop, Fig. 4 on the road's scenes, the window,
    the mirror and the dictionary."""
    def traced(report):
        lengths = [n for n in dig(report, "drive", "lengths") or [] if is_number(n)]
        return f"{sum(lengths)} ({counted(len(lengths), 'track')})" if lengths else "-"

    columns = [("traced steps (tracks)", traced),
               (f"intact closed loop: {metric_caption(reports, *INTACT_SECTIONS)} (tracks)", _intact),
               ("Fig. 4, literal thresholds on the road's scenes",
                lambda r: claim_words(dig(r, "scenes", "literal", "claims"))),
               ("Fig. 4 qualitative (left vs right AUROC)", lambda r: claim_words(dig(r, "scenes", "qualitative"))),
               ("window: current frame's share", lambda r: number(dig(r, "window", "mean_share_by_frames_ago", 0))),
               ("window: completeness", lambda r: _window_completeness(r.get("window"))),
               ("mirror agreement", lambda r: number(dig(r, "mirror", "mirror_agreement"))),
               ("dictionary: variance explained", lambda r: _dictionary(r.get("dictionary")))]
    return table("Overview of each explained policy.", columns, reports,
                 ("scenes", "closed_loop", "window", "mirror", "dictionary"))


def _saliency_blocks(report) -> str:
    saliency = report.get("saliency")
    if not saliency:
        return "-"
    return (f"{dig(saliency, 'blocks', 'count')} by {dig(saliency, 'blocks', 'by')}, "
            f"{saliency.get('frames')} frames")


def saliency_paired_table(reports: Sequence[Report]) -> str:
    """Table 2: each method's deletion and insertion AUC minus the random map of its own granularity."""
    columns: list[Column] = [("blocks, frames", _saliency_blocks)]
    for curve in ("deletion_auc", "insertion_auc"):
        columns += [(f"{curve.split('_')[0]}: {METHOD_NAMES[method]} - {baseline}",
                     lambda r, m=method, b=baseline, c=curve: estimate(dig(r, "saliency", "paired", m, b, c)))
                    for method, baseline in OWN_BASELINE.items()]
    return table("Saliency faithfulness, paired on the same frames: AUC of the method minus the random map of "
                 "its own granularity, mean [95% block-bootstrap CI]. Deletion below 0 and insertion above 0 = "
                 "more faithful than random.", columns, reports, ("saliency",))


def _no_road(report) -> bool:
    """Whether the report's saliency has no road share: the road band is drawn from CarRacing's
    track, and Udacity's frames have none."""
    return bool(report.get("saliency")) and dig(report, "saliency", "road_share") is None


def road_share_table(reports: Sequence[Report]) -> str:
    """Table 3: each method's share of saliency on the road ahead, beside the road's share of the pixels."""
    def road(report, *keys) -> str:
        return "CarRacing only" if _no_road(report) else estimate(dig(report, "saliency", *keys))

    columns: list[Column] = [(METHOD_NAMES[method], lambda r, m=method: road(r, "road_share", m))
                             for method in OWN_BASELINE]
    columns.append(("road's share of the pixels (chance)", lambda r: road(r, "road_pixel_share")))
    return table("Road share (the paper's Fig. 6 proxy): the share of each saliency map's mass on the road ahead, "
                 "mean [95% block-bootstrap CI], against the road's share of the pixels (a uniform map's).",
                 columns, reports, ("saliency",))


def _neuron_group(report, chosen: str, spread: bool) -> str:
    closed = report.get("closed_loop")
    spec = metric_of(closed)[1]
    means = [dig(row, "paired", "mean") for row in dig(closed, "neurons") or [] if dig(row, "chosen") == chosen]
    means = [m for m in means if is_number(m)]
    if not means:
        return "-"
    return span(means, spec) if spread else f"{sum(means) / len(means):{spec}} ({counted(len(means), 'unit')})"


def first_row(rows, key: str, value: str) -> dict | None:
    """The first of ``rows`` (a list of objects, or null) whose ``key`` is ``value``."""
    return next((row for row in rows or [] if dig(row, key) == value), None)


def _attention_part(report, name: str) -> str:
    closed = report.get("closed_loop")
    row = first_row(dig(closed, "attention"), "name", name)
    return estimate(dig(row, "paired"), metric_of(closed)[1]) if row else "-"


def closed_loop_table(reports: Sequence[Report]) -> str:
    """Table 4: the closed loop's metric change with neurons clamped (the top ones, random ones as the
    control) and with parts of the attention replaced, each paired against the intact policy."""
    parts = list(dict.fromkeys(dig(row, "name") for _, r in reports
                               for row in dig(r, "closed_loop", "attention") or [] if dig(row, "name")))
    columns: list[Column] = [("intact (tracks)", lambda r: _intact(r, ("closed_loop",)))]
    for chosen in ("top", "random"):
        columns += [(f"{chosen} neurons: mean change", lambda r, c=chosen: _neuron_group(r, c, False)),
                    (f"{chosen} neurons: range", lambda r, c=chosen: _neuron_group(r, c, True))]
    columns += [(part, lambda r, p=part: _attention_part(r, p)) for part in parts]
    return table(f"Closed loop, paired against the intact policy on the same tracks: change of the "
                 f"{metric_caption(reports, 'closed_loop')}; neurons clamped to their mean (the top ones by "
                 f"silencing cost, random ones as the control: the mean and range of the units' paired means), "
                 f"attention parts replaced (paired mean [95% CI]).", columns, reports, ("closed_loop",))


def _push(report, push: str, figure: str) -> str:
    section = report.get("push")
    row = first_row(dig(section, "pushes"), "push", push)
    spec = STEERING_SPEC if figure == "change" else metric_of(section)[1]
    return estimate(dig(row, figure), spec) if row else "-"


def _random_pushes(report) -> str:
    rows = [row for row in dig(report, "push", "pushes") or [] if str(dig(row, "push")).startswith("random")]
    changes = [dig(row, "change", "mean") for row in rows]
    return f"{span(changes, STEERING_SPEC)} ({counted(len(rows), 'direction')})" if rows else "-"


def push_table(reports: Sequence[Report]) -> str:
    """Table 5: the closed-loop push along the curvature probe, beside random directions as long."""
    steering = " / ".join(dict.fromkeys(str(r["push"]["steering"]) for _, r in reports
                                        if dig(r, "push", "steering"))) or "-"
    columns: list[Column] = [("probe in-sample R^2", lambda r: number(dig(r, "push", "probe", "in_sample_r2")))]
    for push in ("left", "right"):
        columns += [(f"{push}: steering change", lambda r, p=push: _push(r, p, "change")),
                    (f"{push}: {metric_caption(reports, 'push')} change", lambda r, p=push: _push(r, p, "paired"))]
    columns.append(("random directions: steering change range", _random_pushes))
    return table(f"Push along the curvature probe while the policy drives (steering = {steering}): paired mean "
                 f"[95% CI] of the change from the intact drive; random directions as long as the probe's push "
                 f"are the control.", columns, reports, ("push",))


# a label (:func:`label`) whose folder ends in -sN: one seed of a recipe, as explain_policies.sh names them
SEED_LABEL = re.compile(r"^(?P<recipe>.+)-s(?P<seed>\d+) (?P<kind>\(.*\))$")


def seed_groups(reports: Sequence[Report]) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """The reports with road scenes whose folders differ only in their ``-sN`` (and share a core and
    mode), two or more: the seeds of one recipe, by ``recipe-s* (core, mode)``, each as (N, report)."""
    groups: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for name, report in reports:
        seed = SEED_LABEL.match(name)
        if seed and dig(report, "scenes", "effects"):
            groups.setdefault(f"{seed['recipe']}-s* {seed['kind']}", []).append((seed["seed"], report))
    return {group: members for group, members in groups.items() if len(members) >= 2}


def head_effects(report, quantity: str, comparison: str) -> list[dict]:
    """The rows of the report's ``scenes.effects`` for ``quantity`` between the scenes of
    ``comparison``, one per head."""
    return [e for e in dig(report, "scenes", "effects") or []
            if dig(e, "quantity") == quantity and dig(e, "comparison") == comparison]


def lower_bound_above(row: dict, key: str, floor: float) -> bool:
    """Whether the interval ``row[key]`` lies above ``floor``."""
    return is_number(dig(row, key, 0)) and row[key][0] > floor


def seeds_interval(values: Sequence[float]) -> str:
    """The mean of ``values`` (one per seed) with its 95% t-interval over them."""
    from scipy import stats

    if len(values) < 2:
        return "-"
    mean, sem = float(np.mean(values)), float(stats.sem(values))
    lo, hi = stats.t.interval(CONFIDENCE, len(values) - 1, loc=mean, scale=sem) if sem > 0 else (mean, mean)
    return format_estimate(mean, [lo, hi], ".3f")


def fig4_seeds_table(reports: Sequence[Report]) -> str:
    """Table 6: the paper's Fig. 4 on the road's scenes across the seeds of one recipe (:func:`seed_groups`):
    per quantity and pair of scenes, each seed's strongest head, their mean with an interval over the
    seeds, and the seeds with a head that separates the scenes."""
    tables = []
    for group, members in seed_groups(reports).items():
        rows = []
        for quantity in QUANTITIES:
            for comparison, positive, negative in COMPARISONS:
                heads = [head_effects(report, quantity, comparison) for _, report in members]
                strongest = [max((e for e in by_head if is_number(dig(e, "effect"))), key=lambda e: e["effect"],
                                 default=None) for by_head in heads]
                cells = [f"{estimate({'mean': e['effect'], 'ci95': e.get('effect_ci95')})} (head {e.get('head')})"
                         if e else "untestable" for e in strongest]
                tested = [e for e in strongest if e]
                separating = sum(any(lower_bound_above(e, "effect_ci95", 0.0) for e in by_head) for by_head in heads)
                paper_way = sum(any(lower_bound_above(e, "auroc_ci95", 0.5) for e in by_head) for by_head in heads)
                agreement = "-" if not tested else f"{separating}/{len(tested)}" + (
                    f" ({paper_way} the paper's way)" if comparison == "right_vs_left" else "")
                rows.append([f"{quantity}: {positive} vs {negative}", *cells,
                             seeds_interval([e["effect"] for e in tested]), agreement])
        header = ["quantity: scenes", *(f"seed {seed}: strongest head" for seed, _ in members),
                  "mean over the seeds [95% t-interval]", "seeds with a head separating them"]
        tables.append(f"The paper's Fig. 4 on the road's scenes across the seeds of {group}: each seed's strongest "
                      f"head, its direction-free effect |AUROC - 0.5| [95% block-bootstrap CI] between the scenes; "
                      f"their mean over the seeds with a t-interval (the seed the unit: the strongest of the heads "
                      f"lies above 0 by chance alone, so read the seeds' agreement and this interval); the seeds "
                      f"with a head whose interval lies above 0 (right vs left: in the paper's direction, AUROC "
                      f"above 0.5).\n\n" + markdown(header, rows))
    return "\n\n".join(tables)


def _literal_counted(claims: dict[str, Any] | None) -> str:
    """Fig. 4's literal thresholds in a few words: ``k/n reproduced``."""
    if not isinstance(claims, dict) or not claims:
        return "-"
    return f"{sum(str(dig(c, 'verdict')).startswith('reproduced') for c in claims.values())}/{len(claims)} reproduced"


def _qualitative_counted(claims: dict[str, Any] | None) -> str:
    """Fig. 4's qualitative reading in a few words: ``k/n separated (m/n the paper's way)``, a claim
    counted where any head does so."""
    if not isinstance(claims, dict) or not claims:
        return "-"
    n = len(claims)
    separated = sum(bool(dig(c, "heads_separating")) for c in claims.values())
    paper_way = sum(bool(dig(c, "heads_paper_direction")) for c in claims.values())
    return f"{separated}/{n} separated ({paper_way}/{n} the paper's way)"


def _road_against_chance(report) -> str:
    if _no_road(report):
        return "CarRacing only"
    return (f"{number(dig(report, 'saliency', 'road_share', 'gradcam', 'mean'))} "
            f"({number(dig(report, 'saliency', 'road_pixel_share', 'mean'))})")


def _costliest_part(report) -> str:
    """The attention part whose replacement moves the closed loop's metric most, with its change."""
    rows = [row for row in dig(report, "closed_loop", "attention") or [] if is_number(dig(row, "paired", "mean"))]
    if not rows:
        return "-"
    name = max(rows, key=lambda r: abs(r["paired"]["mean"])).get("name")
    return f"{name}: {_attention_part(report, name)}"


def summary_table(reports: Sequence[Report]) -> str:
    """Table 0 (BENCHMARKS.md §7's): a few words per policy from each of the other tables."""
    columns: list[Column] = [
        (f"intact closed loop: {metric_caption(reports, *INTACT_SECTIONS)} (tracks)", _intact),
        ("Fig. 4, literal", lambda r: _literal_counted(dig(r, "scenes", "literal", "claims"))),
        ("Fig. 4, qualitative", lambda r: _qualitative_counted(dig(r, "scenes", "qualitative"))),
        ("deletion: Grad-CAM - random_cam_grid",
         lambda r: estimate(dig(r, "saliency", "paired", "gradcam", OWN_BASELINE["gradcam"], "deletion_auc"))),
        ("road share: Grad-CAM (chance)", _road_against_chance),
        ("clamped: top neurons", lambda r: _neuron_group(r, "top", False)),
        ("clamped: random neurons", lambda r: _neuron_group(r, "random", False)),
        ("costliest attention part", _costliest_part),
        ("push along the curvature probe", lambda r: str(dig(r, "push", "verdict") or "-")),
        ("current frame's share", lambda r: number(dig(r, "window", "mean_share_by_frames_ago", 0)))]
    return table("Summary: each policy in a few words from the tables below (their captions say how each figure "
                 "is measured).", columns, reports, ("scenes", "saliency", "closed_loop", "push"))


TABLES = (summary_table, overview_table, saliency_paired_table, road_share_table, closed_loop_table, push_table,
          fig4_seeds_table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="*", type=Path, metavar="DIR",
                        help="folders holding an explain.json (or the files)")
    parser.add_argument("--recipe", type=Path, metavar="OUT",
                        help="every OUT/*/explain.json (explain_policies.sh's folder), in the report's order")
    parser.add_argument("--summary", action="store_true",
                        help="only the summary table (BENCHMARKS.md §7's; the others go to docs/findings.md)")
    args = parser.parse_args(argv)
    if bool(args.dirs) == bool(args.recipe):
        parser.error("give folders or --recipe OUT, not both and not neither")
    try:
        paths = recipe_paths(args.recipe) if args.recipe else args.dirs
        reports = [(label(path, report), report) for path in paths for report in [read_report(path)]]
    except ReportError as e:
        print(f"explain_tables: error: {e}", file=sys.stderr)
        return 2
    print("\n\n".join(filter(None, (make(reports) for make in ((summary_table,) if args.summary else TABLES)))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
