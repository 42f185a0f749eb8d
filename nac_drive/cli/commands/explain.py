"""``nac-drive explain``: drive a policy with a trace and measure its neurons.

    nac-drive explain [--policy RUN/best | --task udacity] [--episodes 3] [--out runs/explain]
                      [--frames N] [--saliency-frames 500] [--window-method integrated_gradients]
                      [--closed-loop-tracks 10] [--device cuda] [--ray [ADDRESS]] [--json]

The policy (default: the shipped CNN+NAC CarRacing policy; ``--task udacity``: the shipped
PilotNet+NAC Udacity policy; a ``--policy`` checkpoint's task is read from its config.json)
drives held-out tracks with a trace into a fresh run folder: CarRacing tracks from seed
900000, or for Udacity the headless emulator's tracks random-900000, random-900000-cw,
random-900001, ... (never trained on; each loop driven counter-clockwise, then mirrored and
driven clockwise, so that the road has right curves as well as left ones), in-process, at
--speed mph (9) as ``drive udacity`` does; then

* fig4: the paper's Fig. 4 claim (tau 0.8-1.6, below 1.1 turning left, above 1.3 turning
  right; logits below 0.6 left, above 0.65 right), per head, stated as reproduced or not;
  scenes from the chosen actions, or for Udacity the steering's sign outside a deadband of
  0.05 (1.25 degrees);
* scenes: the same claim on classes read from the road (the track's curvature ahead, from
  CarRacing's track or the emulator's): the literal thresholds, and a direction-free AUROC of
  left vs right curves per head with a block-bootstrap interval, each with a verdict line;
* atlas: for every traced neuron (q/k/v units, each head's inter/command/motor neurons)
  and each head, the AUROC with which it separates right from left steps, its mutual
  information with the chosen action (Udacity: the steering's side, left/straight/right),
  and the agreement with the intact policy when it is clamped to its mean (the run's frames
  replayed; Udacity: the share of frames whose steering keeps its side, and the mean
  |change of the steering|); also the attention weights made uniform;
* saliency: how faithful saliency maps are to what the policy uses, on --saliency-frames
  frames: RISE deletion and insertion AUC (the chosen action's probability, Udacity: the
  steering output signed towards the side steered, as the most salient pixels are removed
  from the frame, or added to a blurred copy; lower deletion and higher insertion = more
  faithful) for Grad-CAM, Integrated Gradients, Occlusion and random maps (pixel noise, noise
  on Grad-CAM's grid, noise per Occlusion patch), with 95% block-bootstrap intervals (whole
  episodes, or stretches of neighbouring frames, resampled), each method paired with each
  random baseline on the same frames, and the model-randomisation sanity check (Spearman
  correlation of each method's maps with those of the policy with its head, head + core,
  whole model randomised: a faithful method's maps change);
* window: which of the window's frames each decision used (Integrated Gradients over the
  window, or one frame removed at a time), written to RUN_DIR/window_attribution.npz for
  the dashboard;
* mirror: each frame flipped left-right, how often the policy then turns the other way
  where it turned (CarRacing's left and right actions swap; Udacity's steering changes sign),
  and which units of the core's output (and of the NAC heads' outputs) swap with another, keep
  their value or change sign;
* probes: ridge probes of the scene variables (curvature ahead, cross-track error, heading
  error, speed) from q, k, v, the NAC heads' outputs and the core's output, scored by R^2 on
  held-out episodes beside the same probe on block-permuted targets, with block-bootstrap
  intervals; then the core's output pushed along the curvature probe (open loop, on the
  recorded frames) and the steering's change;
* dictionary: a sparse dictionary of the core's output (scikit-learn), its variance explained
  on held-out episodes at 1-16 atoms a step against the 90% target, each atom named by the
  scene variable it follows best;
* closed_loop: the neurons whose silencing costs most and some random ones, clamped while
  the policy drives, then each part of the attention replaced: Top-K by q . k by K random
  keys and by the K most recent, t_ij by its mean per head, the weights by uniform ones;
  each change from intact with a paired 95% interval over the same tracks (1 + top +
  random + 4 runs of --closed-loop-tracks tracks each: at the defaults 250 episodes, ~10
  minutes at ~2.5 s a CarRacing track on one core, or with --ray [ADDRESS] one Ray task per
  run, on this machine's cores or a cluster's, the same figures; saliency ~3 minutes, window ~3
  minutes a 1000-step episode with Integrated Gradients (20 s with ablation), the rest a
  minute or two). CarRacing scores the return; Udacity the mean |cross-track error| and
  laps / off-road. Udacity with --episodes 2 --closed-loop-tracks 3 --window-method
  ablation: about 11 minutes on 2 busy cores; Integrated Gradients over the window of its
  PilotNet frames would add about 7 minutes a 1000-frame track;
* push: the core's output pushed towards a left curve, towards a right one (2 SD along the
  curvature probe, as the probes' open-loop push) and as far (the same norm) along 4 random
  directions (the control), each while the policy drives the --closed-loop-tracks tracks; per
  push the change of each track's mean steering and of the return (Udacity: mean |cte|),
  paired with the same tracks driven intact, with 95% intervals, and a verdict ("follows":
  left steers left, right steers right, both intervals clear of 0, each push further than
  every random direction); 6 runs of --closed-loop-tracks tracks (it reuses the closed
  loop's intact drive), 7 where the closed loop did not run, any core.

A policy of another core (lstm, gru, cfc, ltc, mha) gets the sections that need no NAC states
(saliency, window, mirror, probes, dictionary and push on its core's output, the drive); fig4,
scenes, atlas and closed_loop are skipped, and the report's
"skipped" says so. A CarRacing report's saliency also gives each method's share of saliency on
the road ahead of the car (road_share), a proxy for the paper's Fig. 6 claim.

``nac-drive dashboard RUN_DIR`` then shows the drive with these results as panels.

Everything goes to RUN_DIR/explain.json (NaN as null).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from nac_drive.fields import arg, check_fields


@dataclass
class ExplainPrint:
    """What ``nac-drive explain`` prints of its report."""

    rows: int = arg(15, "atlas rows printed (explain.json has all)", min=1)

    def __post_init__(self):
        check_fields(self)


def add_parser(subparsers) -> None:
    from nac_drive.cli.arguments import JsonOutput, add_dataclass_arguments
    from nac_drive.pipeline.explain import ExplainArgs

    p = subparsers.add_parser("explain", help="test the paper's Fig. 4 claim and map every neuron of a policy",
                              description=__doc__)
    add_dataclass_arguments(p, ExplainArgs)
    add_dataclass_arguments(p, ExplainPrint)
    add_dataclass_arguments(p, JsonOutput)   # its JSON line: explain.json's content
    p.set_defaults(func=run)


def run(namespace: argparse.Namespace) -> int:
    from nac_drive.cli.arguments import JsonOutput, from_namespace
    from nac_drive.pipeline.explain import EXPLAIN_FILE, ExplainArgs, explain

    shown, output = from_namespace(ExplainPrint, namespace), from_namespace(JsonOutput, namespace)
    report = explain(from_namespace(ExplainArgs, namespace))
    print(format_drive(report))
    if report["fig4"]:
        print()
        print("\n".join(format_fig4(report["fig4"])))
    if report.get("scenes"):
        print()
        print("\n".join(format_scenes(report["scenes"])))
    if report["atlas"]:
        print()
        print("\n".join(format_atlas(report["atlas"], shown.rows)))
    if report["saliency"]:
        print()
        print("\n".join(format_saliency(report["saliency"])))
    if report["window"]:
        print()
        print("\n".join(format_window(report["window"])))
    if report.get("mirror"):
        print()
        print("\n".join(format_mirror(report["mirror"])))
    if report.get("probes"):
        print()
        print("\n".join(format_probes(report["probes"])))
    if report.get("dictionary"):
        print()
        print("\n".join(format_dictionary(report["dictionary"])))
    if report["closed_loop"] and report["closed_loop"]["neurons"]:
        print()
        print("\n".join(format_closed_loop(report["closed_loop"])))
    if report.get("push"):
        print()
        print("\n".join(format_push(report["push"])))
    if report.get("skipped"):
        print()
        print("\n".join(format_skipped(report["skipped"])))
    print(f"\nwrote {report['run']}/{EXPLAIN_FILE}")
    output.emit(report)
    return 0


def _num(x, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def format_drive(report: dict) -> str:
    """The traced drive in one line."""
    drive = report["drive"]
    if report.get("task") != "udacity":
        return f"drove {len(drive['seeds'])} tracks: mean return {drive['mean_return']:.1f}"
    return (f"drove {len(drive['tracks'])} emulator tracks ({', '.join(drive['tracks'])}), {sum(drive['lengths'])} "
            f"frames at {drive['speed_mph']:g} mph: mean |cte| {drive['mean_abs_cte']:.3f} m, off the road on "
            f"{drive['off_road_tracks']}, laps {drive['laps_finished']}")


def format_scenes(scenes: dict) -> list[str]:
    """The scenes section as text lines: the road's classes, AUROC right vs left curves per head
    with its interval, then the literal and the qualitative verdict lines."""
    limits = scenes["thresholds"]
    unit = limits["length_unit"]
    classes = ", ".join(f"{s} {n}" for s, n in scenes["classes"].items())
    lines = [f"Fig. 4 on the road's scenes (curvature over {limits['curvature_ahead']:g} {unit} ahead, 1/{unit}: "
             f"a curve at |curvature| >= {limits['curve']:.3g} (radius <= {1 / limits['curve']:.0f} {unit}), "
             f"straight <= {limits['straight']:.3g} (radius >= {1 / limits['straight']:.0f} {unit}); left positive). "
             f"Traced steps: {classes}",
             f"{'head':>4} {'quantity':<14}{'AUROC R>L':>11}{'95% CI':>16}   (block bootstrap, "
             f"{scenes['blocks']} blocks of {scenes['block_steps']} steps)"]
    for e in scenes["effects"]:
        if e["comparison"] == "right_vs_left":
            ci = e["auroc_ci95"]
            lines.append(f"{e['head']:>4} {e['quantity']:<14}{_num(e['auroc']):>11}"
                         f"{('-' if ci is None else f'{ci[0]:.3f}-{ci[1]:.3f}'):>16}")
    lines += [scenes["verdict"]["literal"], scenes["verdict"]["qualitative"]]
    return lines


def format_fig4(fig4: dict) -> list[str]:
    """The Fig. 4 section as text lines: medians per scene, ranges and AUROC per head, then verdicts."""
    from nac_drive.interpret.fig4 import SCENES

    scenes = ", ".join(f"{s} {n}" for s, n in fig4["scenes"].items())
    band = f"; steering within +-{fig4['deadband']:g} is straight" if fig4.get("deadband") is not None else ""
    lines = [f"Fig. 4 claim (paper §3.4, NAC-Steady; this policy's mode: {fig4['mode']}{band}). Traced steps: {scenes}",
             f"{'head':>4} {'quantity':<14}" + "".join(f"{s:>15}" for s in SCENES)
             + f"{'all p5':>9}{'all p95':>9}{'AUROC R>L':>11}"]
    for head in fig4["heads"]:
        for q in ("tau", "logits", "steady_logits"):
            stats = head[q]
            lines.append(f"{head['head']:>4} {q:<14}" + "".join(f"{_num(stats['by_scene'][s]['median']):>15}"
                                                                  for s in SCENES)
                         + f"{_num(stats['all']['p5']):>9}{_num(stats['all']['p95']):>9}"
                         + f"{_num(stats['auroc_right_vs_left']):>11}")
    lines.append("(medians per scene; AUROC R>L: how well the value separates right from left steps, "
                 "1 = right always higher, as claimed)")
    for s in fig4["statements"]:
        heads = f" in heads {s['heads_holding']}" if s["heads_holding"] else ""
        lines.append(f"  {s['statement']}: {s['verdict'].upper()}{heads} ({s['figure']})")
    lines.append("claims (all parts in one head): "
                 + "; ".join(f"{name} {c['verdict']}" for name, c in fig4["claims"].items()))
    return lines


def format_atlas(atlas: dict, rows: int) -> list[str]:
    """The atlas as text lines: the first ``rows`` neurons, the heads, uniform weights. A
    steering policy's agreement is by side (left/straight/right), beside the mean |change of
    the steering|."""
    steering = atlas.get("decision") == "steering side"
    decision = "steering's side" if steering else "action"

    def figures(row) -> str:
        if steering:
            return f"{_num(row['agreement']):>20}{_num(row.get('steering_change'), '.4f'):>14}"
        return f"{_num(row['agreement']):>20}{_num(row.get('log_prob_change'), '+.4f'):>12}{_num(row.get('kl'), '.4f'):>9}"

    lines = [f"Neuron atlas: {atlas['frames']} frames replayed (the intact replay chooses the recorded {decision} on "
             f"{100 * atlas['replay_agrees_with_run']:.1f}% of them); MI bias ~{atlas['mi_bias_bits']:.3f} bits",
             f"{'rank':>4}  {'neuron':<16}{'AUROC R>L':>10}{'MI bits':>9}{'agreement silenced':>20}"
             + (f"{'|d steering|':>14}" if steering else f"{'d log p':>12}{'KL':>9}")]
    for i, row in enumerate(atlas["neurons"][:rows], 1):
        lines.append(f"{i:>4}  {row['name']:<16}{_num(row['auroc']):>10}{_num(row['mi_bits']):>9}{figures(row)}")
    push = "on the steering" if steering else "left vs right"
    for row in atlas["heads"]:
        lines.append(f"{'':>4}  {row['name']:<16}{_num(row['auroc']):>10}{_num(row['mi_bits']):>9}{figures(row)}"
                     f"   (its push {push}; silenced: output at its mean)")
    lines.append(f"{'':>4}  {'uniform weights':<16}{'':>10}{'':>9}{figures(atlas['uniform_weights'])}")
    if steering:
        lines.append(f"(agreement: the share of frames whose steering keeps its side, within +-{atlas['deadband']:g} "
                     f"straight; |d steering|: its mean change)")
    else:
        lines.append("(agreement: the share of frames with the same chosen action; d log p: the mean change of that "
                     "action's log-probability; KL: the mean KL(intact || silenced), nats)")
    return lines


def format_saliency(saliency: dict) -> list[str]:
    """The saliency-faithfulness section as text lines."""
    def interval(summary) -> str:
        ci = summary["ci95"]
        return f"{_num(summary['mean'])} [{_num(ci[0] if ci else None)}, {_num(ci[1] if ci else None)}]"

    stages = saliency["cascade"]
    lines = [f"Saliency faithfulness on {saliency['frames']} frames ({saliency['steps']} steps; target: "
             f"{saliency['target']}; sanity check on {saliency['sanity_frames']} frames)",
             f"{'method':<22}{'deletion AUC (lower)':>24}{'insertion AUC (higher)':>26}"
             + "".join(f"{'rho ' + st:>12}" for st in stages)]
    for name, m in saliency["methods"].items():
        lines.append(f"{name:<22}{interval(m['deletion_auc']):>24}{interval(m['insertion_auc']):>26}"
                     + "".join(f"{_num(m['sanity_spearman'][st]['mean'], '.2f'):>12}" for st in stages))
    lines.append("(rho: Spearman correlation with the maps of the policy whose head / head + core / whole model "
                 "was randomised; near 1 = the maps do not depend on what was learnt)")
    return lines + format_paired(saliency) + format_road_share(saliency)


def format_road_share(saliency: dict) -> list[str]:
    """Each method's share of saliency on the road ahead, with its block-bootstrap 95% interval."""
    shares = saliency.get("road_share")
    if not shares:
        return []
    from nac_drive.interpret.road_share import UNIFORM_ROW

    rows = {**shares, UNIFORM_ROW: saliency["road_pixel_share"]}
    lines = ["Share of saliency on the road ahead (95% block bootstrap):"]
    for name, share in rows.items():
        ci = share["ci95"] or [None, None]
        lines.append(f"  {name:<26}{_num(share['mean'])} [{_num(ci[0])}, {_num(ci[1])}]")
    lines.append(f"  (road: {saliency.get('road_mask')})")
    return lines


def format_skipped(skipped: dict) -> list[str]:
    """The sections left out of explain.json, each with why."""
    return ["Skipped:"] + [f"  {section}: {why}" for section, why in skipped.items()]


def format_paired(saliency: dict) -> list[str]:
    """Each method against each random baseline on the same frames, as text lines: the mean
    per-frame AUC difference and its block-bootstrap 95% interval."""
    paired, blocks = saliency.get("paired") or {}, saliency.get("blocks") or {}
    if not any(paired.values()):
        return []

    def change(c) -> str:
        ci = c["ci95"]
        return f"{_num(c['mean'], '+.3f')} [{_num(ci[0] if ci else None, '+.3f')}, {_num(ci[1] if ci else None, '+.3f')}]"

    unit = "episodes" if blocks.get("by") == "episode" else f"stretches of {blocks.get('frames_per_block')} frames"
    lines = [f"Paired on the same frames, method - random baseline (95% block bootstrap over {blocks.get('count')} "
             f"blocks: {unit}):",
             f"{'method':<22}{'baseline':<18}{'deletion AUC diff':>28}{'insertion AUC diff':>28}"]
    for name, against in paired.items():
        for baseline, c in against.items():
            lines.append(f"{name:<22}{baseline:<18}{change(c['deletion_auc']):>28}{change(c['insertion_auc']):>28}")
    lines.append("(faithful: deletion below 0 and insertion above 0, the interval excluding 0; random_cam_grid is "
                 "noise on Grad-CAM's grid, random_patches noise per Occlusion patch)")
    return lines


def format_window(window: dict) -> list[str]:
    """The window-attribution section as text lines."""
    shares = window["mean_share_by_frames_ago"]
    lines = [f"Which frame each decision used ({window['method']}, {window['full_window_steps']} steps with a full "
             f"window of {window['window']}): mean share by frames ago",
             "  " + " ".join(f"{a}:{_num(x, '.3f')}" for a, x in enumerate(shares)),
             f"  the current frame has the largest share on {_num(window['current_frame_largest'], '.1%')} of them"]
    complete = window.get("completeness")
    if complete:
        lines.append(f"  Integrated Gradients' steps: median {_num(complete['steps']['median'], '.0f')}, max "
                     f"{_num(complete['steps']['max'], '.0f')}; |sum(attr) - output change|: median "
                     f"{_num(complete['error']['median'])}, max {_num(complete['error']['max'])} on changes of median "
                     f"{_num(complete['difference']['median'])} (ratio max {_num(complete['ratio']['max'])}; "
                     f"{complete['incomplete']} of {complete['decisions']} decisions above "
                     f"{complete['tolerance']:g} at the cap)")
    return lines


def format_mirror(mirror: dict) -> list[str]:
    """The mirrored-frames check as text lines."""
    turns = "steers outside the deadband" if mirror["decision"] == "steering side" else "turns"
    lines = [f"Mirrored frames ({mirror['frames']} frames flipped left-right): where the intact policy {turns} "
             f"({mirror['turn_frames']} frames), the mirrored frame turns the other way on "
             f"{_num(mirror['flips'], '.1%')} and the same way on {_num(mirror['stays'], '.1%')}; its decision is the "
             f"mirror of the intact one on {_num(mirror['mirror_agreement'], '.1%')} of all frames"]
    if mirror.get("steering_symmetry_error") is not None:
        lines.append(f"  mean |mirrored steering + intact steering|: {mirror['steering_symmetry_error']:.4f}")
    for name, units in (mirror.get("units") or {}).items():
        pairs = ", ".join(f"{a}<->{b}" for a, b, *_ in units["pairs"][:8])
        lines.append(f"  {name} units under the mirror (|correlation| >= {units['match']:g}): "
                     + ", ".join(f"{kind} {count}" for kind, count in units["counts"].items())
                     + (f"; swap pairs: {pairs}" if pairs else ""))
    return lines


def _interval(ci, spec: str = ".3f") -> str:
    from nac_drive.simulators.episode_stats import format_interval

    return format_interval(ci, spec)


def format_probes(probes: dict) -> list[str]:
    """The probes section as text lines: R^2 on held-out steps beside the shuffled control per
    representation and variable, then the push along the curvature probe."""
    lines = [f"Linear probes (ridge), scored on held-out {probes['held_out']} ({probes['groups']} folds' worth); "
             f"control: the same probe on targets block-permuted by {probes['block_steps']} steps; 95% block "
             f"bootstrap over {probes['blocks']} blocks",
             f"{'representation':<16}{'variable':<19}{'R^2':>7}{'95% CI':>18}{'control':>9}"
             f"{'R^2 - control 95% CI':>24}"]
    for row in probes["scores"]:
        lines.append(f"{row['representation']:<16}{row['variable']:<19}{_num(row['r2']):>7}"
                     f"{_interval(row['r2_ci95']):>18}{_num(row['control_r2']):>9}"
                     f"{_interval(row['above_control_ci95']):>24}")
    lines.append(probes["verdict"])
    skipped = {**probes.get("skipped", {}), **probes.get("variables_skipped", {})}
    if skipped:
        lines.append("not probed: " + "; ".join(f"{name} ({why})" for name, why in skipped.items()))
    push = probes.get("intervention")
    if push:
        lines.append(f"Pushed along the curvature probe ({push['mode']}; {push['sds']:g} SD of the core's output along "
                     f"each direction; steering = {push['steering']}, intact mean {push['intact_steering']:+.4f}): "
                     f"{push['verdict']}")
        lines += [_push_line(row) for row in push["pushes"]] + _random_directions_lines(push)
    elif probes.get("intervention_skipped"):
        lines.append(f"no push along the curvature probe: {probes['intervention_skipped']}")
    return lines


def format_push(push: dict) -> list[str]:
    """The closed-loop push as text lines: per push the change of the tracks' mean steering, of
    their mean signed offset from the centre line and of the metric (the return, or the mean
    |cte| in metres), each with its paired 95% interval."""
    change, spec = ("cte_change", "+.3f") if push["metric"] == "mean_abs_cte" else ("return_change", "+.1f")
    lines = [f"Pushed along the curvature probe while driving {push['tracks']} held-out tracks ({push['sds']:g} SD "
             f"of the core's output along the probe; control: {push['control']}; steering = {push['steering']}, "
             f"intact mean {push['intact_steering']:+.4f}): {push['verdict']}"]
    lines += [f"{_push_line(row)}   offset change {row['offset_change']['mean']:+.3f} "
              f"{_interval(row['offset_change']['ci95'], '+.3f')}   {push['metric']} change {row[change]:{spec}} "
              f"{_interval(row['paired']['ci95'], spec)}" for row in push["pushes"]]
    offset = push.get("offset") or {}
    return lines + _random_directions_lines(push) + [f"  the offset from the centre line: {offset.get('verdict', '-')}"]


def _push_line(row: dict) -> str:
    """One push of the curvature probe's (open or closed loop): how far the probe's reading and the steering move."""
    change = row["change"]
    return (f"  {row['push']:<10} probe reads {row['probe_change']:+.4f}   steering change {change['mean']:+.4f} "
            f"{_interval(change['ci95'], '+.4f')}")


def _random_directions_lines(push: dict) -> list[str]:
    """The random directions a push is compared with, as a line (none without them)."""
    random = push.get("random_directions")
    if not random:
        return []
    return [f"  along {random['count']} random directions: |steering change| median {random['median_abs_change']:.4f}, "
            f"max {random['max_abs_change']:.4f}; the left and right pushes both outdo {random['outdone']:.0%} of them"]


def format_dictionary(dictionary: dict) -> list[str]:
    """The dictionary section as text lines: variance explained per sparsity against PCA, then
    the most used atoms and the scene variable each follows."""
    reached = "reached" if dictionary["reached"] else "NOT reached"
    lines = [f"Sparse dictionary of the core's output ({dictionary['atoms']} atoms of {dictionary['units']} units, "
             f"learnt on {dictionary['train_steps']} steps, scored on {dictionary['held_out']}: "
             f"{dictionary['held_out_steps']} steps): target {dictionary['target']:.0%} {reached} at "
             f"{dictionary['sparsity']} atoms a step ({_num(dictionary['variance_explained'], '.1%')})",
             "  atoms a step: " + "   ".join(f"{row['k']}: {_num(row['variance_explained'], '.1%')} (PCA "
                                             f"{_num(row['pca_variance_explained'], '.1%')})"
                                             for row in dictionary["by_sparsity"])]
    for feature in dictionary["features"][:8]:
        lines.append(f"  atom {feature['atom']:>3}: used on {feature['usage']:.1%} of steps, follows "
                     f"{feature['label'] or '-'} (AUROC {_num(feature['auroc'], '.2f')}, its coefficient's "
                     f"r {_num(feature['correlation'], '+.2f')})")
    return lines


def format_closed_loop(closed: dict) -> list[str]:
    """The closed-loop check as text lines, a row per clamped neuron and per attention part
    replaced, each with its change's paired 95% interval: the return (CarRacing), or the
    mean |cte| in metres, the tracks left off the road and the laps (Udacity)."""
    intact = closed["intact"]
    udacity = closed.get("metric") == "mean_abs_cte"
    rows = closed["neurons"] + [dict(row, chosen="part", silencing_cost=None) for row in closed.get("attention", [])]
    width = max([16] + [len(row["name"]) + 1 for row in rows])

    def paired(row) -> str:
        ci = (row.get("paired") or {}).get("ci95")
        return "" if ci is None else "  " + _interval(ci, "+.3f" if udacity else "+.1f")

    if not udacity:
        lines = [f"Closed loop on {closed['tracks']} held-out tracks: intact mean return {intact['mean_return']:.1f}",
                 f"{'clamped':<{width}}{'chosen':>8}{'cost':>8}{'return':>9}{'change':>9}  paired 95%"]
        for row in rows:
            lines.append(f"{row['name']:<{width}}{row['chosen']:>8}{_num(row['silencing_cost']):>8}"
                         f"{row['mean_return']:>9.1f}{row['return_change']:>+9.1f}{paired(row)}")
        return lines
    lines = [f"Closed loop on {closed['tracks']} held-out emulator tracks ({', '.join(closed['track_names'])}): intact "
             f"mean |cte| {intact['mean_abs_cte']:.3f} m, off the road on {intact['off_road_tracks']}, laps "
             f"{intact['laps_finished']}",
             f"{'clamped':<{width}}{'chosen':>8}{'cost':>8}{'|cte| m':>9}{'change':>9}{'off-road':>9}{'laps':>6}"
             f"  paired 95%"]
    for row in rows:
        lines.append(f"{row['name']:<{width}}{row['chosen']:>8}{_num(row['silencing_cost']):>8}"
                     f"{row['mean_abs_cte']:>9.3f}{row['cte_change']:>+9.3f}{row['off_road_tracks']:>9}"
                     f"{row['laps_finished']:>6}{paired(row)}")
    return lines