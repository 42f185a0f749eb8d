"""Temporal cores compared by how they learn and how they drive: ``nac-drive compare``.

    nac-drive compare --data runs/demos                          # CarRacing: every variant, seeds 0 1 2
    nac-drive compare --data runs/udacity --variants nac-exact lstm cfc

Every variant trains on the same demonstrations with the same budget, encoder, head and
seeds (``train``), then its best checkpoint drives the same held-out tracks
(``train --eval-episodes``). The variants are the NAC's modes and the paper's ablations
that apply to this layer (§4 of its appendix: Top-K 2 and all pairs, NAC-PW; wiring
sparsity 0.2 and 0.9; the NAC-FC ablations replace the NCP gates and do not) beside the
baselines. NAC-PW differs from the exact mode only where a window holds more keys than Top-K
(8): both together need ``--window`` above it. Per variant, over its seeds:

* offline, the paper's metric: held-out action accuracy (CarRacing) or steering MSE
  (Udacity) of the best checkpoint, the mean and its 95% t-interval over seeds;
* closed loop, every episode of every seed pooled: the mean return with its 95%
  bootstrap interval, the worst episode and the success rate (CarRacing), or the mean
  |cross-track error| and the laps finished (Udacity emulator), and each seed's mean.

Results go to ``OUT/compare.json`` and ``OUT/compare.md``; each (variant, seed) keeps its
run folder under ``OUT/runs`` and its result in ``OUT/results``, so a killed comparison
starts again where it stopped (with the same data and budget: a result of another is
refused). ``--workers N`` trains and drives N runs at once, one process each with one
torch thread (on 2 cores, two workers finish about twice as fast as one process). TensorBoard's HParams table (``tensorboard --logdir OUT/runs``) shows the same
runs with their validation and ``closed_loop/`` metrics.
"""
# The CLI builds ``nac-drive compare``'s parser from this module: keep its imports light.

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nac_drive.fields import MAX_EPISODES, MAX_SEED, REQUIRED, arg, check_fields
from nac_drive.torch_threads import check_workers

# Each variant: the train arguments it sets (the rest are the comparison's, the same for all).
VARIANTS: dict[str, dict[str, Any]] = {
    "nac-exact": {"core": "nac", "mode": "exact"},
    "nac-euler": {"core": "nac", "mode": "euler"},
    "nac-steady": {"core": "nac", "mode": "steady"},
    "nac-pw": {"core": "nac", "select": "all"},          # every key of the window, no Top-K
    "nac-2k": {"core": "nac", "topk": 2},
    "nac-02s": {"core": "nac", "sparsity": 0.2},
    "nac-09s": {"core": "nac", "sparsity": 0.9},
    "lstm": {"core": "lstm"}, "gru": {"core": "gru"}, "cfc": {"core": "cfc"}, "ltc": {"core": "ltc"},
    "mha": {"core": "mha"},
}
RESULTS, RUNS = "results", "runs"           # folders inside OUT
REPORT_JSON, REPORT_MD = "compare.json", "compare.md"


@dataclass
class CompareArgs:
    data: str = arg(REQUIRED, "demonstrations: CarRacing (Minari) or Udacity recordings; every variant trains on them")
    out: str = arg("runs/compare", "the comparison's folder: run folders, per-run results, compare.json and .md")
    variants: list[str] = arg(list(VARIANTS), "what to compare: " + ", ".join(VARIANTS),
                              choices=tuple(VARIANTS), metavar="VARIANT")
    seeds: list[int] = arg([0, 1, 2], "training seeds of every variant (split, sampling, initialisation)",
                           min=0, max=MAX_SEED)
    episodes: int = arg(20, "held-out tracks each trained policy drives (0: offline metrics only)",
                        min=0, max=MAX_EPISODES)
    max_steps: int | None = arg(None, "cap each closed-loop episode (frames; default: a whole episode)", min=1)
    progress: bool = arg(True, "show progress bars")
    workers: int = arg(1, "runs trained and driven at once, one process each with one torch thread (at most the "
                          "cores; 1: one run after another, training on every core)", min=1)
    window: int = arg(16, "frames per training window (and the policy's causal window)", min=1, group="budget")
    epochs: int = arg(10, "training epochs of every run", min=1, group="budget")
    windows_per_epoch: int = arg(4096, "windows sampled per epoch", min=0, group="budget")
    d_model: int = arg(64, "core width of every variant", min=1, group="budget")

    def __post_init__(self):
        check_fields(self)
        for name in ("variants", "seeds"):
            values = getattr(self, name)
            if not values or len(set(values)) != len(values):
                raise ValueError(f"--{name}: at least one, each once; got {values}")
        check_workers(self.workers)
        from nac_drive.pipeline.train_args import TrainArgs

        topk = TrainArgs.topk   # the dataclass default: what nac-exact keeps per query
        if {"nac-exact", "nac-pw"} <= set(self.variants) and self.window <= topk:
            raise ValueError(f"--window {self.window}: nac-pw (every key) equals nac-exact when a window holds at "
                             f"most Top-K = {topk} keys; give --window > {topk}, or compare only one of them")

    def ignored(self) -> dict[str, str]:
        """The fields this comparison would not use, each with why."""
        return {"max_steps": "only with --episodes > 0 (closed-loop episodes to cap)"} if self.episodes == 0 else {}


@dataclass
class RunResult:
    """One trained (variant, seed): its best checkpoint's offline metrics and its drive."""

    variant: str
    seed: int
    run_dir: str
    task: str
    val_loss: float
    val_accuracy: float | None            # CarRacing (discrete actions)
    val_mse: float | None                 # Udacity steering (the loss)
    closed_loop: dict | None = field(default=None)
    budget: dict | None = field(default=None)   # what every run of the comparison shares (:func:`shared_budget`)


def shared_budget(args: CompareArgs) -> dict:
    """What each (variant, seed) of a comparison must share to be compared: the data and the
    budget of training and driving."""
    return {"data": str(Path(args.data).resolve()), "window": args.window, "epochs": args.epochs,
            "windows_per_epoch": args.windows_per_epoch, "d_model": args.d_model, "episodes": args.episodes,
            "max_steps": args.max_steps}


def compare(args: CompareArgs) -> dict:
    """Train and drive every (variant, seed) not done yet; the comparison (also written to
    ``OUT/compare.json`` and ``OUT/compare.md``)."""
    out = Path(args.out)
    jobs = [(variant, seed) for variant in args.variants for seed in args.seeds]
    finished = {job: _finished_result(args, *job, out) for job in jobs}   # another budget's: refused before any run
    todo = [job for job in jobs if finished[job] is None]
    if args.workers > 1:
        finished.update(_results_in_processes(args, todo, out))
    else:
        finished.update({job: _result(args, out, job) for job in todo})
    results = [finished[job] for job in jobs]
    report = {"data": args.data, "seeds": args.seeds, "episodes": args.episodes, "max_steps": args.max_steps,
              "budget": {"window": args.window, "epochs": args.epochs, "windows_per_epoch": args.windows_per_epoch,
                         "d_model": args.d_model},
              "task": results[0].task,
              "variants": [summarise(variant, [r for r in results if r.variant == variant]) for variant in args.variants]}
    from nac_drive.io.atomic import atomic_write
    from nac_drive.io.checkpoint import write_json

    write_json(out / REPORT_JSON, report)
    atomic_write(out / REPORT_MD, lambda tmp: Path(tmp).write_text(markdown_table(report) + "\n"))
    return report


def _finished_result(args: CompareArgs, variant: str, seed: int, out: Path) -> RunResult | None:
    """A (variant, seed)'s result if a previous invocation finished it (with this budget), else None."""
    path = out / RESULTS / f"{variant}__s{seed}.json"
    if not path.is_file():
        return None
    result = _read_result(path)
    if result.budget != shared_budget(args):
        raise ValueError(f"{path}: that run was trained and driven with {result.budget}, this comparison asks "
                         f"for {shared_budget(args)}; give another --out")
    return result


def _results_in_processes(args: CompareArgs, jobs: list[tuple[str, int]], out: Path) -> dict:
    """:func:`_result` for every job, ``args.workers`` at a time, each in a process with one
    torch thread; one bar counts the finished runs. A failed run stops the comparison once the
    runs under way end (what they finish is kept; none is started after it)."""
    from dataclasses import replace
    from functools import partial

    from nac_drive.pipeline.processes import map_in_processes

    quiet = replace(args, progress=False)
    results = map_in_processes(partial(_result, quiet, out, threads=1), jobs, args.workers,
                               desc="runs" if args.progress else None, unit="run",
                               name=lambda job: "{}, seed {}".format(*job))
    return dict(zip(jobs, results))


def _result(args: CompareArgs, out: Path, job: tuple[str, int], threads: int | None = None) -> RunResult:
    """A (variant, seed) trained (``threads``: :func:`~nac_drive.pipeline.train.train`'s) and
    its best checkpoint driven; the result is written to ``OUT/results``."""
    variant, seed = job
    from nac_drive.io.checkpoint import write_json
    from nac_drive.pipeline.train import train
    from nac_drive.pipeline.train_args import TrainArgs

    path = out / RESULTS / f"{variant}__s{seed}.json"
    run_dir = train(TrainArgs(data=args.data, out=str(out / RUNS), run_name=f"{variant}__s{seed}", seed=seed,
                              window=args.window, epochs=args.epochs, windows_per_epoch=args.windows_per_epoch,
                              d_model=args.d_model, eval_episodes=0, progress=args.progress, **VARIANTS[variant]),
                    threads=threads)
    best = _best_row(run_dir / "metrics.csv")
    task = json.loads((run_dir / "train_args.json").read_text())["data_info"]["task"]
    closed_loop = None
    if args.episodes:
        from nac_drive.pipeline.drive import drive_checkpoint
        from nac_drive.pipeline.train import record_closed_loop

        closed_loop = record_closed_loop(run_dir, drive_checkpoint(run_dir / "best", task, args.episodes,
                                                                   args.max_steps, args.progress))
    path.parent.mkdir(parents=True, exist_ok=True)
    result = RunResult(variant, seed, str(run_dir), task, best["val_loss"],
                       best["val_accuracy"] if task == "carracing" else None,
                       best["val_loss"] if task == "udacity" else None, closed_loop, shared_budget(args))
    write_json(path, vars(result))
    return result


def _read_result(path: Path) -> RunResult:
    from nac_drive.io.checkpoint import read_json

    try:
        return RunResult(**read_json(path))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: not a comparison result ({e}); delete it to train that run again") from None


def _best_row(metrics_csv: Path) -> dict[str, float | None]:
    """The epoch of the lowest validation loss (the ``best/`` checkpoint), as numbers (NaN -> None)."""
    import csv

    with metrics_csv.open() as f:
        rows = list(csv.DictReader(f))
    best = min(rows, key=lambda r: float(r["val_loss"]) if r["val_loss"] != "nan" else math.inf)
    return {k: (None if math.isnan(float(v)) else float(v)) for k, v in best.items()}


def t_interval(values: list[float]) -> list[float] | None:
    """The 95% t-interval of the mean of ``values`` (one per seed); None below two values."""
    import numpy as np
    from scipy import stats

    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        return None
    half = stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return [round(float(x.mean() - half), 5), round(float(x.mean() + half), 5)]


def summarise(variant: str, runs: list[RunResult]) -> dict:
    """One variant's row: the offline metric over seeds, the closed loop over every episode."""
    from nac_drive.simulators.episode_stats import mean_interval, return_stats

    task = runs[0].task
    metric = "val_accuracy" if task == "carracing" else "val_mse"
    offline = [getattr(r, metric) for r in runs]
    row: dict[str, Any] = {"variant": variant, "settings": VARIANTS[variant], "seeds": [r.seed for r in runs],
                           "runs": [r.run_dir for r in runs], "metric": metric,
                           metric: float(sum(offline) / len(offline)), f"{metric}_ci95": t_interval(offline),
                           f"{metric}_per_seed": offline}
    drives = [r.closed_loop for r in runs if r.closed_loop]
    if drives:
        returns = [x for d in drives for x in d["returns"]]
        row["closed_loop"] = {**return_stats(returns), "laps_finished": sum(d["laps_finished"] for d in drives),
                              "mean_return_per_seed": [round(d["mean_return"], 2) for d in drives]}
        if task == "udacity":
            cte = [x for d in drives for x in d["mean_abs_cte_m"]]
            row["closed_loop"].update(mean_abs_cte=float(sum(cte) / len(cte)),
                                      mean_abs_cte_ci95=list(mean_interval(cte)) if len(cte) > 1 else None,
                                      off_road_tracks=sum(d["off_road_tracks"] for d in drives))
    return row


def markdown_table(report: dict) -> str:
    """The comparison as one Markdown table (what ``compare`` prints)."""
    udacity = report["task"] == "udacity"
    offline = "steering MSE (held out)" if udacity else "action accuracy (held out)"
    drive = "mean abs CTE m [95% CI] / off-road / laps" if udacity else "return [95% CI] / worst / success"
    lines = [f"| variant | {offline} [95% CI over seeds] | closed loop: {drive} | per-seed mean return |",
             "|---|---|---|---|"]
    for row in report["variants"]:
        metric = row["metric"]
        ci = row[f"{metric}_ci95"]
        cells = [row["variant"], f"{row[metric]:.4f}" + (f" [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "")]
        loop = row.get("closed_loop")
        if loop is None:
            cells += ["-", "-"]
        else:
            episodes = loop["episodes"]
            if udacity:
                ci = loop["mean_abs_cte_ci95"]
                cells.append(f"{loop['mean_abs_cte']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
                             + f" / {loop['off_road_tracks']}/{episodes} / {loop['laps_finished']}/{episodes}")
            else:
                ci = loop["mean_ci95"]
                cells.append(f"{loop['mean_return']:.1f}" + (f" [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else "")
                             + f" / {loop['worst_return']:.1f} / {loop['successes']}/{episodes}")
            cells.append(", ".join(f"{x:.1f}" for x in loop["mean_return_per_seed"]))
        lines.append("| " + " | ".join(cells) + " |")
    budget = report["budget"]
    lines.append(f"\n{len(report['seeds'])} seeds ({', '.join(map(str, report['seeds']))}) per variant; "
                 f"{budget['epochs']} epochs x {budget['windows_per_epoch']} windows of {budget['window']} frames, "
                 f"d_model {budget['d_model']}; closed loop: {report['episodes']} held-out tracks per seed"
                 + (f", {report['max_steps']} frames each" if report["max_steps"] else "") + ".")
    return "\n".join(lines)
