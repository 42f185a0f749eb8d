"""Temporal cores compared by how they learn and how they drive: ``nac-drive compare``.

    nac-drive compare --data runs/demos                          # CarRacing: every variant, seeds 0 1 2
    nac-drive compare --data runs/udacity --variants nac-exact lstm cfc

Every variant trains on the same demonstrations with the same budget, encoder, head and
seeds (``train``), then its best checkpoint drives the same held-out tracks
(``train --eval-episodes``). The variants are the NAC's modes and the paper's ablations
that apply to this layer (§4 of its appendix: Top-K 2 and all pairs, NAC-PW; wiring
sparsity 0.2 and 0.9; the NAC-FC ablations replace the NCP gates and do not), two variants
beyond the paper that let its weights attend (``nac-scaled``, ``nac-qk``: ``train
--logit-variant``) and the baselines. ``--tuned`` trains each variant with the
hyper-parameters ``nac-drive tune`` chose for it. NAC-PW differs from the exact mode only where a window holds more keys than Top-K
(8): both together need ``--window`` above it. Per variant, over its seeds:

* offline, the paper's metric: held-out action accuracy (CarRacing) or steering MSE
  (Udacity) of the best checkpoint, the mean and its 95% t-interval over seeds;
* closed loop, every episode of every seed pooled: the mean return with its 95% interval
  (over the seeds and the tracks: :func:`_pooled`), the worst episode and the success rate
  (CarRacing), or the mean |cross-track error| and the laps finished (Udacity emulator), and
  each seed's mean;
  ``--frame-drops 0 0.25 0.5`` drives the same tracks again with those shares of the frames
  never reaching the policy (irregular time, ``--perturb frame-drop=P``).

``--also POLICY...`` drives policies trained elsewhere (a checkpoint folder, or ``shipped:nac``:
the policy nac-drive ships for the data's task) on the same tracks and shares, without
training them: each is a row of the table, paired track by track with the reference.

``--dagger-rounds R`` trains in the regime the shipped policy was made in: behaviour
cloning, then R DAgger rounds (the same oracle and random-action bursts for every variant),
with ``--curve-episodes`` a learning curve (held-out return against demonstration frames).

Results go to ``OUT/compare.json`` and ``OUT/compare.md``; each (variant, seed) keeps its
run folder under ``OUT/runs`` and its result in ``OUT/results``, so a killed comparison
starts again where it stopped (with the same data and budget: a result of another is
refused): a finished pair is kept, a pair's behaviour cloning goes on from its last epoch,
its DAgger rounds start again (in their own folders). ``--workers N`` trains and drives N runs at once, one process each with one
torch thread (on 2 cores, two workers finish about twice as fast as one process); ``--ray
[ADDRESS]`` runs every (variant, seed) as a Ray task instead, on this machine or a cluster whose
nodes see ``--data`` and ``--out`` at the same paths (a shared filesystem). TensorBoard's HParams table (``tensorboard --logdir OUT/runs``) shows the same
runs with their validation and ``closed_loop/`` metrics.
"""
# The CLI builds ``nac-drive compare``'s parser from this module: keep its imports light.

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from nac_drive.devices import device_arg, resolve_device
from nac_drive.fields import MAX_EPISODES, MAX_SEED, REQUIRED, arg, check_fields
from nac_drive.pipeline.ray_tasks import ray_arg
from nac_drive.pipeline.train_args import TrainArgs, read_tuned
from nac_drive.pipeline.variants import VARIANTS
from nac_drive.torch_threads import check_workers

RESULTS, RUNS = "results", "runs"           # folders inside OUT
DAGGER = "the shipped regime: DAgger rounds after behaviour cloning"   # --help group
DAGGER_FIELDS = ("dagger_episodes", "oracle", "disturb_rate", "disturb_frames", "dagger_epochs",
                 "dagger_windows_per_epoch", "dagger_lr", "curve_episodes")
REPORT_JSON, REPORT_MD = "compare.json", "compare.md"


@dataclass
class CompareArgs:
    data: str = arg(REQUIRED, "demonstrations: CarRacing (Minari) or Udacity recordings; every variant trains on them")
    out: str = arg("runs/compare", "the comparison's folder: run folders, per-run results, compare.json and .md")
    variants: list[str] = arg(list(VARIANTS), "what to compare (the first is the reference every other's drives "
                                              "are paired with, track by track): " + ", ".join(VARIANTS),
                              choices=tuple(VARIANTS), metavar="VARIANT")
    seeds: list[int] = arg([0, 1, 2], "training seeds of every variant (split, sampling, initialisation)",
                           min=0, max=MAX_SEED)
    episodes: int = arg(20, "held-out tracks each trained policy drives (0: offline metrics only)",
                        min=0, max=MAX_EPISODES)
    max_steps: int | None = arg(None, "cap each closed-loop episode (frames; default: a whole episode)", min=1)
    frame_drops: list[float] = arg([0.0], "irregular time: the closed loop is driven once per share P of frames "
                                          "dropped (--perturb frame-drop=P; e.g. 0 0.25 0.5), on the same tracks",
                                   min=0, max=0.9, metavar="P")
    progress: bool = arg(True, "show progress bars")
    device: str = device_arg()
    workers: int = arg(1, "runs trained and driven at once, one process each with one torch thread (at most the "
                          "cores; 1: one run after another, training on every core)", min=1)
    ray: str | None = ray_arg()
    window: int = arg(16, "frames per training window (and the policy's causal window)", min=1, group="budget")
    epochs: int = arg(10, "training epochs of every run", min=1, group="budget")
    windows_per_epoch: int = arg(4096, "windows sampled per epoch", min=0, group="budget")
    d_model: int = arg(64, "core width of every variant", min=1, group="budget")
    dagger_rounds: int = arg(0, "DAgger rounds after behaviour cloning, as the shipped policy was made (0: behaviour "
                                "cloning alone); CarRacing only", min=0, group=DAGGER)
    dagger_episodes: int = arg(4, "student episodes per DAgger round", min=1, max=MAX_EPISODES, group=DAGGER)
    oracle: str = arg("teacher", "who labels the DAgger rounds: 'teacher', 'planner' (as the shipped policy's were), "
                                 "'ppo' or a PPO expert zip (dagger --oracle)", group=DAGGER)
    disturb_rate: float = arg(0.02, "random-action bursts in the DAgger rounds (dagger --disturb-rate)", min=0, max=1,
                              group=DAGGER)
    disturb_frames: int = arg(8, "frames per burst (dagger --disturb-frames)", min=1, group=DAGGER)
    dagger_epochs: int = arg(3, "fine-tuning epochs after each round", min=1, group=DAGGER)
    dagger_windows_per_epoch: int = arg(3072, "fine-tuning windows per epoch", min=0, group=DAGGER)
    dagger_lr: float = arg(2e-4, "fine-tuning peak learning rate", above=0, group=DAGGER)
    curve_episodes: int = arg(0, "held-out tracks the policy after behaviour cloning and after each round drives, for "
                                 "the learning curve (return against demonstration frames; 0: none)", min=0,
                              max=MAX_EPISODES, group=DAGGER)
    also: list[str] = arg([], "policies trained elsewhere, driven beside the variants on the same tracks and "
                              "frame-drop shares and never trained here: checkpoint folders, or shipped:CORE (the "
                              "policy nac-drive ships for the data's task, e.g. shipped:nac); each a row of the "
                              "table, paired with the reference", metavar="POLICY")
    tuned: str | None = arg(None, "nac-drive tune's folder: each variant trains with TUNED/<variant>/best.json's "
                                  "values (a tuned d_model replaces --d-model); every variant must have one",
                            metavar="TUNED")

    def __post_init__(self):
        check_fields(self)
        for name in ("variants", "seeds", "frame_drops"):
            values = getattr(self, name)
            if not values or len(set(values)) != len(values):
                raise ValueError(f"--{name}: at least one, each once; got {values}")
        if len(set(self.also)) != len(self.also):
            raise ValueError(f"--also: each once; got {self.also}")
        check_workers(self.workers)
        if self.tuned is not None:
            missing = [v for v in self.variants if not (Path(self.tuned) / v / "best.json").is_file()]
            if missing:
                raise ValueError(f"--tuned {self.tuned}: no best.json for {', '.join(missing)} (run nac-drive tune "
                                 f"--variant V --out {self.tuned} for each)")
            for variant in self.variants:   # each read and checked now, not after hours of training
                read_tuned(Path(self.tuned) / variant / "best.json", variant)
        if self.dagger_rounds:
            from nac_drive.pipeline.dagger import check_oracle

            check_oracle(self.oracle)
        for name in ("windows_per_epoch", "dagger_windows_per_epoch"):   # a budget that would train nothing
            windows = getattr(self, name)
            if 0 < windows < TrainArgs.batch_size and (name == "windows_per_epoch" or self.dagger_rounds):
                raise ValueError(f"--{name.replace('_', '-')} {windows}: fewer windows than one batch "
                                 f"({TrainArgs.batch_size}): no optimiser step would run")
        topk = TrainArgs.topk   # the dataclass default: what nac-exact keeps per query
        if {"nac-exact", "nac-pw"} <= set(self.variants) and self.window <= topk:
            raise ValueError(f"--window {self.window}: nac-pw (every key) equals nac-exact when a window holds at "
                             f"most Top-K = {topk} keys; give --window > {topk}, or compare only one of them")

    def ignored(self) -> dict[str, str]:
        """The fields this comparison would not use, each with why."""
        unused = {}
        if self.episodes == 0:
            unused["frame_drops"] = "only with --episodes > 0 (closed-loop episodes to drive under them)"
            unused["also"] = "only with --episodes > 0 (those policies are only driven)"
            if self.dagger_rounds == 0:
                unused["max_steps"] = "only with --episodes > 0 or --dagger-rounds > 0 (episodes to cap)"
        if self.tuned is not None:
            unused["d_model"] = "--tuned sets each variant's own (its best.json)"
        if self.ray is not None:
            unused["workers"] = "--ray runs as many runs at once as the Ray cluster has CPUs"
        if self.dagger_rounds == 0:
            unused.update({name: "only with --dagger-rounds > 0" for name in DAGGER_FIELDS})
        elif self.disturb_rate == 0:
            unused["disturb_frames"] = "only with --disturb-rate > 0 (no bursts without it)"
        return unused


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
    curve: list | None = field(default=None)    # [{"frames", "stage", and the drive's figures}] (--curve-episodes)
    frame_drops: dict | None = field(default=None)   # {"0.25": the drive under frame-drop=0.25, ...} (P > 0)


def shared_budget(args: CompareArgs) -> dict:
    """What each (variant, seed) of a comparison must share to be compared: the data and the
    budget of training and driving."""
    return {"data": str(Path(args.data).resolve()), "window": args.window, "epochs": args.epochs,
            "windows_per_epoch": args.windows_per_epoch, "d_model": args.d_model, "episodes": args.episodes,
            "max_steps": args.max_steps, **({"tuned": str(Path(args.tuned).resolve())} if args.tuned else {}),
            **({"frame_drops": args.frame_drops} if args.frame_drops != [0.0] else {}),
            **({"dagger_rounds": args.dagger_rounds, **{name: getattr(args, name) for name in DAGGER_FIELDS}}
               if args.dagger_rounds else {})}


def variant_settings(args: CompareArgs, variant: str) -> dict[str, Any]:
    """The training arguments that make ``variant``: its own (:data:`VARIANTS`), or with
    ``args.tuned`` its tuned ones (:func:`~nac_drive.pipeline.train_args.read_tuned`)."""
    if args.tuned is None:
        return {"d_model": args.d_model, **VARIANTS[variant]}
    return {"d_model": args.d_model, **read_tuned(Path(args.tuned) / variant / "best.json", variant)}


def compare(args: CompareArgs) -> dict:
    """Train and drive every (variant, seed) not done yet; the comparison (also written to
    ``OUT/compare.json``, strict JSON with NaN and infinities as null, and ``OUT/compare.md``).
    One comparison writes ``OUT`` at a time: a second is refused, naming the first's pid. Every
    run trains on ``args.device``; the checkpoints drive on the CPU, a frame at a time."""
    from nac_drive.io.atomic import one_writer
    from nac_drive.pipeline.train import data_task

    resolve_device(args.device)   # a device this machine lacks is refused before any folder exists
    task = data_task(args.data)
    if args.dagger_rounds and task == "udacity":
        raise ValueError("--dagger-rounds: DAgger needs an oracle that labels the states a student reaches, which "
                         "CarRacing has (the teacher, the PPO expert) and Udacity recordings do not")
    also = {name: _also_checkpoint(name, task) for name in args.also} if args.episodes else {}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with one_writer(out, "nac-drive compare"):
        return _compare(args, out, task, also)


def _compare(args: CompareArgs, out: Path, task: str, also: dict[str, Path]) -> dict:
    jobs = [(variant, seed) for variant in args.variants for seed in args.seeds]
    finished = {job: _finished_result(args, *job, out) for job in jobs}   # another budget's: refused before any run
    kept = {name: _kept_drives(args, out, name, checkpoint, task) for name, checkpoint in also.items()}   # likewise
    todo = [job for job in jobs if finished[job] is None]
    if args.ray is not None:
        finished.update(_results_on_ray(args, todo, out))
    elif args.workers > 1:
        finished.update(_results_in_processes(args, todo, out))
    else:
        finished.update({job: _result(args, out, job) for job in todo})
    results = [finished[job] for job in jobs]
    report = {"data": args.data, "seeds": args.seeds, "episodes": args.episodes, "max_steps": args.max_steps,
              "tuned": args.tuned, "dagger": ({"dagger_rounds": args.dagger_rounds,
                                                **{name: getattr(args, name) for name in DAGGER_FIELDS}}
                                               if args.dagger_rounds else None),
              "budget": {"window": args.window, "epochs": args.epochs, "windows_per_epoch": args.windows_per_epoch,
                         "d_model": args.d_model},
              "task": results[0].task,
              "variants": [summarise(variant, [r for r in results if r.variant == variant]) for variant in args.variants]}
    reference = args.variants[0]
    reference_runs = [r for r in results if r.variant == reference]
    for row in report["variants"][1:]:
        row["paired"] = paired_with(reference, reference_runs, [r for r in results if r.variant == row["variant"]])
    if also:
        report["also"] = [also_row(name, kept[name] or _also_drives(args, out, name, checkpoint, task), task,
                                   reference, reference_runs) for name, checkpoint in also.items()]
    from nac_drive.io.atomic import atomic_write
    from nac_drive.io.strict_json import write_report

    write_report(out / REPORT_JSON, report)
    atomic_write(out / REPORT_MD, lambda tmp: Path(tmp).write_text(markdown_table(report) + "\n"))
    return report


def _finished_result(args: CompareArgs, variant: str, seed: int, out: Path) -> RunResult | None:
    """A (variant, seed)'s result if a previous invocation finished it (with this budget), else None."""
    path = out / RESULTS / f"{variant}__s{seed}.json"
    if not path.is_file():
        return None
    result = _read_result(path, variant, seed)
    if result.budget != shared_budget(args):
        raise ValueError(f"{path}: that run was trained and driven with {result.budget}, this comparison asks "
                         f"for {shared_budget(args)}; give another --out")
    return result


def _results_in_processes(args: CompareArgs, jobs: list[tuple[str, int]], out: Path) -> dict:
    """:func:`_result` for every job, ``args.workers`` at a time, each in a process with one
    torch thread; one bar counts the finished runs. A failed run stops the comparison once the
    runs under way end (what they finish is kept; none is started after it)."""
    from functools import partial

    from nac_drive.pipeline.processes import map_in_processes

    quiet = replace(args, progress=False)
    results = map_in_processes(partial(_result, quiet, out, threads=1), jobs, args.workers,
                               desc="runs" if args.progress else None, unit="run",
                               name=lambda job: "{}, seed {}".format(*job))
    return dict(zip(jobs, results))


def _results_on_ray(args: CompareArgs, jobs: list[tuple[str, int]], out: Path) -> dict:
    """:func:`_trained` for every job as a Ray task (:func:`~nac_drive.pipeline.ray_tasks.tasks_on_ray`);
    this process writes each result as it comes back, so a failed or stopped comparison keeps them."""
    from functools import partial

    from nac_drive.pipeline.ray_tasks import tasks_on_ray

    where = out.resolve()   # a worker's working folder is not this process's: every path absolute
    remote = replace(args, progress=False, data=str(Path(args.data).resolve()), out=str(where),
                     tuned=args.tuned and str(Path(args.tuned).resolve()))
    results = {}
    for i, result in tasks_on_ray(partial(_trained, remote, where, threads=1), jobs, args.ray,
                                  desc="runs" if args.progress else None, unit="run",
                                  name=lambda job: "{}, seed {}".format(*job)):
        result.run_dir = str(out / Path(result.run_dir).relative_to(where))   # as the other paths name it
        results[jobs[i]] = _written(out, result)
    return results


def _result(args: CompareArgs, out: Path, job: tuple[str, int], threads: int | None = None) -> RunResult:
    """:func:`_trained`, its result written to ``OUT/results``."""
    return _written(out, _trained(args, out, job, threads))


def _written(out: Path, result: RunResult) -> RunResult:
    """``result`` written to ``OUT/results``."""
    from nac_drive.io.checkpoint import write_json

    path = out / RESULTS / f"{result.variant}__s{result.seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, vars(result))
    return result


def _trained(args: CompareArgs, out: Path, job: tuple[str, int], threads: int | None = None) -> RunResult:
    """A (variant, seed) trained (``threads``: :func:`~nac_drive.pipeline.train.train`'s) and
    its best checkpoint driven."""
    variant, seed = job
    from nac_drive.io.checkpoint import read_json
    from nac_drive.pipeline.train import best_epoch, train

    bc = TrainArgs(data=args.data, out=str(out / RUNS), run_name=f"{variant}__s{seed}", seed=seed, window=args.window,
                   epochs=args.epochs, windows_per_epoch=args.windows_per_epoch, eval_episodes=0,
                   progress=args.progress, device=args.device, **variant_settings(args, variant))
    run_dir = train(replace(bc, resume=_killed_before(bc)), threads=threads)
    best = best_epoch(run_dir / "metrics.csv")
    task = read_json(run_dir / "train_args.json")["data_info"]["task"]
    final, curve = run_dir / "best", None
    if args.dagger_rounds:
        final, curve = _dagger_rounds(args, out, variant, seed, run_dir, threads)
    closed_loop, dropped = None, {}
    if args.episodes:
        from nac_drive.pipeline.train import record_closed_loop

        dropped = _drives_at_shares(args, final, task)
        if "0" in dropped:
            closed_loop = record_closed_loop(final.parent, dropped.pop("0"))
    return RunResult(variant, seed, str(final.parent), task, best["val_loss"],
                     best["val_accuracy"] if task == "carracing" else None,
                     best["val_loss"] if task == "udacity" else None, closed_loop, shared_budget(args), curve,
                     dropped or None)


def _also_checkpoint(name: str, task: str) -> Path:
    """The checkpoint folder ``--also name`` names, refused in one line before any training
    if it is not a policy for ``task``."""
    from nac_drive.pipeline.drive import task_policy
    from nac_drive.policy.loading import checkpoint_folder

    try:
        checkpoint = Path(checkpoint_folder(name, task))
        task_policy(checkpoint, task)
    except (OSError, ValueError) as e:
        raise ValueError(f"--also {name}: {e}") from None
    return checkpoint


def _also_file(out: Path, name: str) -> Path:
    """Where ``--also name``'s drives are kept: its name made a file name, and a hash of the
    name, so that two names never share a file."""
    import hashlib

    readable = "".join(c if c.isalnum() or c in "-_" else "-" for c in name)
    return out / RESULTS / f"also__{readable}__{hashlib.sha256(name.encode()).hexdigest()[:8]}.json"


def _also_budget(args: CompareArgs, name: str, checkpoint: Path) -> dict:
    """What ``--also name``'s kept drives must have been driven with: the checkpoint's folder
    and the SHA-256 of its weights and config (retrained in place, or a new release's shipped
    policy: driven again), the tracks, the frames and the shares."""
    import hashlib

    digest = hashlib.sha256()
    for file in sorted(checkpoint.glob("*")):
        if file.suffix in (".json", ".safetensors"):
            digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return {"policy": name, "checkpoint": str(checkpoint.resolve()), "sha256": digest.hexdigest(),
            "episodes": args.episodes, "max_steps": args.max_steps, "frame_drops": args.frame_drops}


def _kept_drives(args: CompareArgs, out: Path, name: str, checkpoint: Path, task: str) -> dict[str, dict] | None:
    """``--also name``'s drives that an earlier invocation kept (:func:`_also_drives`), or None;
    one kept with another budget, or not whole, is refused in one line naming its file."""
    from nac_drive.io.checkpoint import read_json

    path = _also_file(out, name)
    if not path.is_file():
        return None
    kept, budget = read_json(path), _also_budget(args, name, checkpoint)
    if not isinstance(kept, dict) or kept.get("budget") != budget:
        raise ValueError(f"{path}: not the drive of --also {name} with {budget}; delete it to drive again")
    drives = kept.get("drives")
    if not isinstance(drives, dict) or set(drives) != {f"{share:g}" for share in args.frame_drops}:
        problems = ["expected a drive at each frame-drop share"]
    else:
        problems = [f"{share}: {p}" for share, drive in drives.items() for p in _drive_problems(drive, task)]
    if problems:
        raise ValueError(f"{path}: not a comparison's drive ({'; '.join(problems)}); delete it to drive again")
    return drives


def _drives_at_shares(args: CompareArgs, checkpoint: Path, task: str) -> dict[str, dict]:
    """``checkpoint`` driven on the comparison's held-out tracks at each of ``args.frame_drops``:
    {"0": the plain drive, "0.25": the drive under frame-drop=0.25, ...}, without their text."""
    from nac_drive.pipeline.drive import drive_checkpoint

    drives = {}
    for share in args.frame_drops:
        drive = drive_checkpoint(checkpoint, task, args.episodes, args.max_steps, args.progress,
                                 perturb=f"frame-drop={share:g}" if share else None)
        drives[f"{share:g}"] = {k: v for k, v in drive.items() if k != "text"}
    return drives


def _also_drives(args: CompareArgs, out: Path, name: str, checkpoint: Path, task: str) -> dict[str, dict]:
    """``checkpoint`` driven at each frame-drop share (:func:`_drives_at_shares`), kept in
    ``OUT/results`` (:func:`_kept_drives` finds them again)."""
    from nac_drive.io.checkpoint import write_json

    drives = _drives_at_shares(args, checkpoint, task)
    path = _also_file(out, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {"budget": _also_budget(args, name, checkpoint), "drives": drives})
    return drives


def _killed_before(bc: TrainArgs) -> bool:
    """Whether a comparison killed before it wrote this pair's result left its behaviour-cloning
    run with a checkpoint (``last/``): it is continued (a whole one trains no epoch more), never
    trained again into ``<run>-2``. One trained with other arguments is refused in one line."""
    from nac_drive.pipeline.train import trained_otherwise

    run_dir = Path(bc.out) / bc.run_name
    if not (run_dir / "last" / "train_state.json").is_file():
        return False
    differ = trained_otherwise(run_dir, bc)
    if differ:
        raise ValueError(f"{run_dir}: a killed comparison trained it with other {', '.join(differ)}; give another "
                         "--out")
    return True


def _dagger_rounds(args: CompareArgs, out: Path, variant: str, seed: int, bc_run: Path,
                   threads: int | None) -> tuple[Path, list | None]:
    """``args.dagger_rounds`` of DAgger from the behaviour-cloned ``bc_run``, on a data folder of
    the run's own (the demonstrations hard-linked, the rounds' datasets added); the final
    checkpoint, and with ``curve_episodes`` the learning curve: after behaviour cloning and
    after each round, the demonstration frames so far and that checkpoint's held-out drive
    (also TensorBoard ``closed_loop/`` scalars stepped by frames, ``OUT/runs/<run>-curve``,
    and ``curve.json`` there). A killed attempt's rounds and points go on where they stopped
    (DAgger's ``resume``): a round's dataset is not driven again, nor a point of the curve."""
    from nac_drive.data_collection.carracing_dataset import load_episodes
    from nac_drive.io.checkpoint import read_json, write_json
    from nac_drive.pipeline.run_log import log_closed_loop
    from nac_drive.pipeline.dagger import DaggerArgs, dagger
    from nac_drive.pipeline.drive import drive_checkpoint

    name = f"{variant}__s{seed}"
    data, curve_dir = out / RUNS / f"{name}-data", out / RUNS / f"{name}-curve"
    link_tree(Path(args.data), data)
    frames = sum(len(episode) for episode in load_episodes(args.data))
    curve_file = curve_dir / "curve.json"
    done = {p["stage"]: p for p in read_json(curve_file)["points"]} if curve_file.is_file() else {}
    curve = []

    def point(stage: str, checkpoint: Path) -> None:
        if not args.curve_episodes:
            return
        if stage in done:   # driven before a kill
            curve.append(done[stage])
        else:
            drive = drive_checkpoint(checkpoint, "carracing", args.curve_episodes, args.max_steps, progress=False)
            curve.append({"stage": stage, "frames": frames, "checkpoint": str(checkpoint),
                          **{k: drive[k] for k in ("mean_return", "returns", "laps_finished")}})
            write_json(curve_file, {"points": curve})   # before TensorBoard's: a kill between them loses a scalar,
            log_closed_loop(curve_dir, drive, step=frames)   # never logs one twice

    def on_round(r: int, checkpoint: Path, results) -> None:
        nonlocal frames
        frames += sum(results.lengths)
        point(f"dagger round {r}", checkpoint)

    point("behaviour cloning", bc_run / "best")
    final = dagger(DaggerArgs(policy=str(bc_run / "best"), rounds=args.dagger_rounds, episodes=args.dagger_episodes,
                              max_steps=args.max_steps, disturb_rate=args.disturb_rate,
                              disturb_frames=args.disturb_frames, workers=1, oracle=args.oracle, resume=True),
                   TrainArgs(data=str(data), out=str(out / RUNS), run_name=f"{name}-dagger", seed=seed,
                             window=args.window, epochs=args.dagger_epochs,
                             windows_per_epoch=args.dagger_windows_per_epoch, lr=args.dagger_lr,
                             progress=args.progress, device=args.device), threads=threads, on_round=on_round)
    return final, curve if args.curve_episodes else None


def link_tree(source: Path, target: Path) -> None:
    """Every file under ``source`` at the same place under ``target``, hard-linked (no copy;
    datasets are never rewritten in place), or copied where a link cannot be made; one already
    there (a killed attempt's) is kept."""
    import os
    import shutil

    for path in source.rglob("*"):
        to = target / path.relative_to(source)
        if path.is_file() and not to.exists():
            to.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, to)
            except OSError:   # another file system, or one without hard links
                shutil.copy2(path, to)


def _read_result(path: Path, variant: str, seed: int) -> RunResult:
    """The stored result of (``variant``, ``seed``); a file that is not one, with what
    :func:`summarise` reads checked, is refused in one line naming it."""
    from nac_drive.io.checkpoint import read_json

    try:
        result = RunResult(**read_json(path))
        problems = _result_problems(result, variant, seed)
    except (TypeError, ValueError) as e:
        problems = [str(e)]
    if problems:
        raise ValueError(f"{path}: not a comparison result ({'; '.join(problems)}); delete it to train that run "
                         "again")
    return result


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _result_problems(result: RunResult, variant: str, seed: int) -> list[str]:
    """What a stored result lacks of what :func:`summarise` and :func:`_pooled` read."""
    if result.variant != variant or result.seed != seed:
        return [f"it holds {result.variant!r} seed {result.seed!r}, not {variant!r} seed {seed}"]
    if result.task not in ("carracing", "udacity"):
        return [f"task: expected 'carracing' or 'udacity', got {result.task!r}"]
    metric = "val_accuracy" if result.task == "carracing" else "val_mse"
    problems = [] if _number(getattr(result, metric)) else [f"{metric}: expected a number, "
                                                             f"got {getattr(result, metric)!r}"]
    drives = {"closed_loop": result.closed_loop} if result.closed_loop is not None else {}
    if result.frame_drops is not None:
        if not isinstance(result.frame_drops, dict):
            return problems + ["frame_drops: expected an object"]
        for share, drive in result.frame_drops.items():
            try:
                float(share)
            except ValueError:
                problems.append(f"frame_drops: {share!r} is not a share")
            drives[f"frame_drops.{share}"] = drive
    for name, drive in drives.items():
        problems += [f"{name}: {p}" for p in _drive_problems(drive, result.task)]
    curve = result.curve if result.curve is not None else []
    if not (isinstance(curve, list) and all(isinstance(p, dict) and isinstance(p.get("stage"), str)
                                            and _number(p.get("frames")) and _number(p.get("mean_return"))
                                            for p in curve)):
        problems.append("curve: expected a list of {stage, frames, mean_return}")
    return problems


def _drive_problems(drive, task: str) -> list[str]:
    """What a stored drive lacks of what :func:`_pooled` reads, and of the tracks pairing reads."""
    if not isinstance(drive, dict):
        return ["expected an object"]
    lists = ["returns"] + (["mean_abs_cte_m"] if task == "udacity" else [])
    counts = ["laps_finished"] + (["off_road_tracks"] if task == "udacity" else [])
    problems = [f"{k}: expected a list of finite numbers" for k in lists
                if not (isinstance(drive.get(k), list) and drive[k]
                        and all(_number(x) and math.isfinite(x) for x in drive[k]))]
    problems += [f"{k}: expected a count" for k in counts if not _count(drive.get(k))]
    problems += [] if isinstance(drive.get("seeds"), list) else ["seeds: expected a list"]
    return problems + ([] if _number(drive.get("mean_return")) else ["mean_return: expected a number"])


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
    """One variant's row: the offline metric over seeds, the closed loop over every episode
    (and under each frame-drop share, ``frame_drops``), the learning curve's mean over seeds."""
    task = runs[0].task
    metric = "val_accuracy" if task == "carracing" else "val_mse"
    offline = [getattr(r, metric) for r in runs]
    row: dict[str, Any] = {"variant": variant, "settings": VARIANTS[variant], "seeds": [r.seed for r in runs],
                           "runs": [r.run_dir for r in runs], "metric": metric,
                           metric: float(sum(offline) / len(offline)), f"{metric}_ci95": t_interval(offline),
                           f"{metric}_per_seed": offline}
    curves = [r.curve for r in runs if r.curve]
    if curves and all(len(c) == len(curves[0]) for c in curves):   # a stage's mean over seeds
        row["curve"] = [{"stage": points[0]["stage"], "frames": sum(p["frames"] for p in points) / len(points),
                         "mean_return": sum(p["mean_return"] for p in points) / len(points)}
                        for points in zip(*curves)]
    for share in sorted({share for r in runs for share in (r.frame_drops or {})}, key=float):
        drops = [r.frame_drops[share] for r in runs if share in (r.frame_drops or {})]
        row.setdefault("frame_drops", {})[share] = _pooled(drops, task)
    drives = [r.closed_loop for r in runs if r.closed_loop]
    if drives:
        row["closed_loop"] = _pooled(drives, task)
    return row


def paired_with(reference: str, reference_runs: list[RunResult], runs: list[RunResult]) -> dict:
    """A variant's drives against the ``reference`` variant's (the first of ``--variants``; None
    when neither drove) on the same tracks, at frame-drop 0 (``"0"``) and at each share both
    were driven under: each track's return (Udacity: mean |cte| m), every seed of each side,
    compared by :func:`~nac_drive.simulators.episode_stats.crossed_paired_change` (``mean``,
    ``ci95``, ``tracks``, ``runs``): the spread between tracks cancels, the spread between
    seeds counts once per seed."""
    value, paired = _paired_measure(reference, runs[0].task if runs else "carracing")
    shares = sorted({"0", *{share for r in runs for share in (r.frame_drops or {})}}, key=float)
    for share in shares:
        ours = [d for d in (_drive_at(r, share) for r in runs) if d is not None]
        theirs = [d for d in (_drive_at(r, share) for r in reference_runs) if d is not None]
        if ours and theirs:
            paired[share] = _crossed(theirs, ours, value, f"{runs[0].variant} and {reference}", share)
    return paired if len(paired) > 2 else None   # None: no drive to pair (--episodes 0)


def also_row(name: str, drives: dict[str, dict], task: str, reference: str, reference_runs: list[RunResult]) -> dict:
    """The row of a policy driven beside the variants (``--also``): its drive at frame-drop 0
    (``closed_loop``) and at each share, and each paired with the ``reference`` variant's seeds
    on the same tracks as :func:`paired_with` pairs a variant (the policy is one run)."""
    row = {"policy": name, "closed_loop": _pooled([drives["0"]], task) if "0" in drives else None,
           "frame_drops": {share: _pooled([d], task) for share, d in drives.items() if share != "0"}}
    value, paired = _paired_measure(reference, task)
    for share, drive in drives.items():
        theirs = [d for d in (_drive_at(r, share) for r in reference_runs) if d is not None]
        if theirs:
            paired[share] = _crossed(theirs, [drive], value, f"--also {name} and {reference}", share)
    row["paired"] = paired if len(paired) > 2 else None
    return row


def _crossed(theirs: list[dict], ours: list[dict], value: str, who: str, share: str) -> dict:
    """:func:`~nac_drive.simulators.episode_stats.crossed_paired_change` of the drives ``ours``
    against ``theirs`` (each one run's, ``value`` per track); every drive must have driven the
    same tracks."""
    from nac_drive.simulators.episode_stats import crossed_paired_change

    tracks = theirs[0]["seeds"]
    for d in ours + theirs:
        if d["seeds"] != tracks:
            raise ValueError(f"compare: {who} drove other tracks at frame-drop {share} ({d['seeds'][:3]}... "
                             f"against {tracks[:3]}...)")
    return crossed_paired_change([d[value] for d in theirs], [d[value] for d in ours])


def _paired_measure(reference: str, task: str) -> tuple[str, dict]:
    """What pairing compares on ``task``: the drive's per-track list (each track's return, or on
    Udacity its mean |cte| in m) and the start of a paired row, ``{"reference", "value"}``."""
    if task == "udacity":
        return "mean_abs_cte_m", {"reference": reference, "value": "mean abs CTE m"}
    return "returns", {"reference": reference, "value": "return"}


def _drive_at(run: RunResult, share: str) -> dict | None:
    """A run's drive at frame-drop ``share`` ("0": its plain closed loop), None if it has none."""
    return run.closed_loop if share == "0" else (run.frame_drops or {}).get(share)


def _pooled(drives: list[dict], task: str) -> dict:
    """Every episode of several seeds' drives pooled: the return statistics, the laps, each
    seed's mean return, and on Udacity the mean |cte| with its interval and the tracks left.
    The mean's interval: over the episodes of one drive (BCa, :func:`return_stats`); over several
    seeds' drives of the same tracks, :func:`~nac_drive.simulators.episode_stats.crossed_mean_interval`
    (``ci_over`` "seeds and tracks"), which counts a seed that drives worse everywhere once."""
    from nac_drive.simulators.episode_stats import crossed_mean_interval, mean_interval, return_stats

    returns = [x for d in drives for x in d["returns"]]
    pooled = {**return_stats(returns), "laps_finished": sum(d["laps_finished"] for d in drives),
              "mean_return_per_seed": [round(d["mean_return"], 2) for d in drives], "ci_over": "episodes"}
    tracks = drives[0].get("seeds")
    crossed = len(drives) > 1 and tracks is not None and all(d.get("seeds") == tracks for d in drives)
    if crossed:
        pooled.update(mean_ci95=crossed_mean_interval([d["returns"] for d in drives])["ci95"],
                      ci_over="seeds and tracks")
    if task == "udacity":
        cte = [x for d in drives for x in d["mean_abs_cte_m"]]
        interval = (crossed_mean_interval([d["mean_abs_cte_m"] for d in drives])["ci95"] if crossed
                    else list(mean_interval(cte)) if len(cte) > 1 else None)
        pooled.update(mean_abs_cte=float(sum(cte) / len(cte)), mean_abs_cte_ci95=interval,
                      off_road_tracks=sum(d["off_road_tracks"] for d in drives))
    return pooled


def _loop_cell(loop: dict | None, udacity: bool) -> str:
    """A pooled closed loop (:func:`_pooled`) in one table cell."""
    if loop is None:
        return "-"
    from nac_drive.simulators.episode_stats import format_estimate

    episodes = loop["episodes"]
    if udacity:
        return (format_estimate(loop["mean_abs_cte"], loop["mean_abs_cte_ci95"], ".3f")
                + f" / {loop['off_road_tracks']}/{episodes} / {loop['laps_finished']}/{episodes}")
    return (format_estimate(loop["mean_return"], loop["mean_ci95"])
            + f" / {loop['worst_return']:.1f} / {loop['successes']}/{episodes}")


def _paired_cell(change: dict | None, udacity: bool) -> str:
    """A :func:`paired_with` change in one table cell."""
    if change is None:
        return "-"
    from nac_drive.simulators.episode_stats import format_estimate

    runs = change["runs"]
    return (format_estimate(change["mean"], change["ci95"], "+.3f" if udacity else "+.1f")
            + f" ({change['tracks']} x {runs[1]} vs {runs[0]})")


def _row_name(row: dict) -> str:
    """A table row's name: its variant, or for an ``--also`` policy its name, marked."""
    return row["variant"] if "variant" in row else f"{row['policy']} (driven, not trained here)"


def markdown_table(report: dict) -> str:
    """The comparison as one Markdown table (what ``compare`` prints)."""
    from nac_drive.simulators.episode_stats import format_estimate

    udacity = report["task"] == "udacity"
    offline = "steering MSE (held out)" if udacity else "action accuracy (held out)"
    drive = "mean abs CTE m [95% CI] / off-road / laps" if udacity else "return [95% CI] / worst / success"
    shares = sorted({share for row in report["variants"] for share in row.get("frame_drops", {})}, key=float)
    lines = [f"| variant | {offline} [95% CI over seeds] | closed loop: {drive} | "
             + "".join(f"frame-drop {share}: the same | " for share in shares) + "per-seed mean return |",
             "|---" * (4 + len(shares)) + "|"]
    for row in report["variants"]:
        metric = row["metric"]
        cells = [row["variant"], format_estimate(row[metric], row[f"{metric}_ci95"], ".4f")]
        loop = row.get("closed_loop")
        cells.append(_loop_cell(loop, udacity))
        cells += [_loop_cell(row.get("frame_drops", {}).get(share), udacity) for share in shares]
        cells.append("-" if loop is None else ", ".join(f"{x:.1f}" for x in loop["mean_return_per_seed"]))
        lines.append("| " + " | ".join(cells) + " |")
    for row in report.get("also", []):   # driven, never trained here: no offline metric, no seeds
        cells = [_row_name(row), "-", _loop_cell(row["closed_loop"], udacity)]
        cells += [_loop_cell(row["frame_drops"].get(share), udacity) for share in shares]
        lines.append("| " + " | ".join(cells + ["-"]) + " |")
    budget = report["budget"]
    if report.get("dagger"):
        dagger = report["dagger"]
        lines.append(f"\nEach seed: behaviour cloning, then {dagger['dagger_rounds']} DAgger rounds of "
                     f"{dagger['dagger_episodes']} episodes ({dagger['oracle']} labels; bursts {dagger['disturb_rate']}"
                     f" x {dagger['disturb_frames']} frames), each fine-tuned {dagger['dagger_epochs']} x "
                     f"{dagger['dagger_windows_per_epoch']} windows at lr {dagger['dagger_lr']:g}; the closed loop "
                     f"drives the last round's best checkpoint, the offline metric is behaviour cloning's.")
    compared = [row for row in report["variants"] + report.get("also", []) if row.get("paired")]
    if compared:
        first = compared[0]["paired"]
        cols = [share for share in ["0", *shares] if any(share in row["paired"] for row in compared)]
        lines += ["", f"| paired against {first['reference']}: {first['value']} change [95% CI] (tracks x seeds vs "
                  f"its seeds) | "
                  + " | ".join(f"frame-drop {share}" for share in cols) + " |", "|---" * (len(cols) + 1) + "|"]
        lines += ["| " + _row_name(row) + " | " + " | ".join(_paired_cell(row["paired"].get(share), udacity)
                                                            for share in cols) + " |" for row in compared]
    curved = [row for row in report["variants"] if row.get("curve")]
    if curved:
        stages = curved[0]["curve"]
        lines += ["", "| learning curve: mean return (demonstration frames) | "
                  + " | ".join(point["stage"] for point in stages) + " |", "|---" * (len(stages) + 1) + "|"]
        lines += ["| " + row["variant"] + " | " + " | ".join(f"{p['mean_return']:.1f} ({p['frames']:.0f})"
                                                            for p in row["curve"]) + " |" for row in curved]
    lines.append(f"\n{len(report['seeds'])} seeds ({', '.join(map(str, report['seeds']))}) per variant; "
                 f"{budget['epochs']} epochs x {budget['windows_per_epoch']} windows of {budget['window']} frames, "
                 f"d_model {budget['d_model']}; closed loop: {report['episodes']} held-out tracks per seed"
                 + (f", {report['max_steps']} frames each" if report["max_steps"] else "") + "."
                 + (f" Hyper-parameters of each variant from nac-drive tune ({report['tuned']}; a tuned d_model "
                    f"replaces the budget's)." if report.get("tuned") else ""))
    return "\n".join(lines)
