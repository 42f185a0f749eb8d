"""Each core's hyper-parameters chosen by an equal-budget search (Optuna's TPE), scored on
validation tracks only.

    nac-drive tune --data runs/demos --variant nac-exact --trials 20 --out runs/tune
    nac-drive train --data runs/demos --tuned runs/tune/nac-exact/best.json
    nac-drive compare --data runs/demos --tuned runs/tune     # each variant's runs/tune/<variant>/best.json

A trial trains one run with sampled hyper-parameters (:data:`SEARCH_SPACE`; the epochs and
windows of ``--epochs`` / ``--windows-per-epoch`` are the same for every variant) and is scored
by ``--objective``:

- ``drive`` (default): its best checkpoint drives ``--episodes`` **validation** tracks
  (CarRacing 800000, 800001, ...; the Udacity emulator's random-800000, ...). CarRacing
  maximises the mean return, Udacity minimises the mean |cross-track error|.
- ``val-loss``: the lowest behaviour-cloning loss on the demonstrations' validation episodes
  (``--val-fraction`` of train); nothing is driven. At a trial's budget a policy may not drive
  yet (a return of 14-126 for every value tried), where the loss still ranks the values.

The held-out tracks from 900000, which score the comparison, are never driven here.

``--workers N`` draws N trials together (Optuna's ask, before any of them is told) and trains
them at once, one process each with one torch thread; ``--ray [ADDRESS]`` runs those N as Ray
tasks instead, on this machine or a cluster whose nodes see ``--data`` and ``--out`` at the same
paths. The study stays in this process, which alone writes it: the same seed and ``--workers``
give the same trials and values with or without Ray.

The study lives in ``OUT/<variant>/study.db`` (SQLite, Optuna's own storage): run the same
command again and it resumes; ``--trials`` is the total of finished trials, and a trial cut
off by a kill runs again with its parameters (one that raised an error fails, and is not run
again). ``OUT/<variant>/best.json`` holds the best
trial's training arguments (the variant's own settings and the searched values, not the
budget), which ``train --tuned`` and ``compare --tuned`` take
(:func:`~nac_drive.pipeline.train_args.read_tuned`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nac_drive.devices import device_arg, resolve_device
from nac_drive.fields import MAX_EPISODES, MAX_SEED, REQUIRED, arg, check_fields
from nac_drive.pipeline.ray_tasks import ray_arg
from nac_drive.pipeline.variants import VARIANTS
from nac_drive.simulators.carracing import VALIDATION_SEED_BASE
from nac_drive.torch_threads import check_workers

BEST, STUDY = "best.json", "study.db"
OBJECTIVES = ("drive", "val-loss")

# What a trial samples, per training argument: ("log", low, high), ("float", low, high) or
# ("choice", values). Every variant searches the shared rows and those of its core; a setting
# its variant fixes (VARIANTS) is not searched.
SEARCH_SPACE: dict[str, dict[str, tuple]] = {
    "all": {"lr": ("log", 1e-4, 3e-3), "weight_decay": ("log", 1e-6, 1e-2), "d_model": ("choice", (32, 64, 128))},
    "nac": {"topk": ("choice", (2, 4, 8, 12)), "sparsity": ("float", 0.2, 0.8)},
    "mha": {"num_heads": ("choice", (2, 4, 8))},
}


@dataclass
class TuneArgs:
    """Arguments of ``nac-drive tune``."""

    data: str = arg(REQUIRED, "demonstrations: CarRacing (Minari) or Udacity recordings")
    variant: str = arg("nac-exact", "what to tune: " + ", ".join(VARIANTS), choices=tuple(VARIANTS))
    out: str = arg("runs/tune", "studies go to OUT/<variant>: study.db, best.json and the trials' run folders")
    trials: int = arg(20, "finished trials in all (a resumed search runs only those missing)", min=1)
    episodes: int = arg(10, "validation tracks each trial's policy drives (CarRacing 800000-; Udacity "
                            "random-800000-)", min=1, max=MAX_EPISODES)
    max_steps: int | None = arg(None, "cap each validation episode (frames; default a whole CarRacing episode, "
                                      "1000 Udacity frames)", min=1)
    seed: int = arg(0, "seeds the sampler and every trial's training", min=0, max=MAX_SEED)
    objective: str = arg("drive", "what scores a trial: drive (validation tracks' mean return, or minus Udacity's "
                                  "mean |cte|) or val-loss (the lowest validation loss; nothing driven)",
                         choices=OBJECTIVES)
    progress: bool = arg(True, "show progress bars")
    device: str = device_arg()
    workers: int = arg(1, "trials drawn together and trained at once, one process each with one torch thread (at "
                          "most the cores; 1: one trial after another, training on every core); with --ray, that many "
                          "Ray tasks at a time", min=1)
    ray: str | None = ray_arg()
    window: int = arg(16, "frames per training window (the same for every trial)", min=1, group="budget")
    epochs: int = arg(4, "training epochs of every trial", min=1, group="budget")
    windows_per_epoch: int = arg(2048, "windows sampled per epoch", min=0, group="budget")

    def __post_init__(self):
        check_fields(self)
        if self.ray is None:
            check_workers(self.workers)


def searched(variant: str) -> dict[str, tuple]:
    """The rows of :data:`SEARCH_SPACE` that ``variant`` searches."""
    settings = VARIANTS[variant]
    space = {**SEARCH_SPACE["all"], **SEARCH_SPACE.get(settings["core"], {})}
    fixed = {*settings, *(("topk",) if settings.get("select") == "all" else ())}   # every key: no Top-K to size
    return {name: row for name, row in space.items() if name not in fixed}


def sample(trial, space: dict[str, tuple]) -> dict[str, Any]:
    """One value per row of ``space``, drawn through the Optuna ``trial``."""
    values = {}
    for name, (kind, *bounds) in space.items():
        if kind == "log":
            values[name] = trial.suggest_float(name, *bounds, log=True)
        elif kind == "float":
            values[name] = trial.suggest_float(name, *bounds)
        else:
            values[name] = trial.suggest_categorical(name, list(bounds[0]))
    return values


def tune(args: TuneArgs) -> dict:
    """Run the trials ``args.trials`` still lacks, ``args.workers`` at a time (in this process,
    in worker processes or as Ray tasks: :func:`_scored`); the best trial, also written to
    ``OUT/<variant>/best.json``. Only this process writes the study, and one search a study at
    a time: a second is refused, naming the first's pid (it would take the first's running
    trial for one cut off by a kill, and train it again beside it)."""
    from nac_drive.io.atomic import one_writer

    resolve_device(args.device)   # a device this machine lacks is refused before the study exists
    folder = Path(args.out) / args.variant
    folder.mkdir(parents=True, exist_ok=True)
    with one_writer(folder, "nac-drive tune"):
        return _search(args, folder)


def _search(args: TuneArgs, folder: Path) -> dict:
    """:func:`tune`'s search of the study in ``folder``, its writer lock held."""
    import optuna
    from tqdm import tqdm

    from nac_drive.io.checkpoint import write_json
    from nac_drive.pipeline.ray_tasks import ray_jobs

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{folder / STUDY}"
    # Udacity's objective negates its |cte|, so every study maximises. The sampler's seed moves
    # on with the trials already in the study: a resumed search must not draw its first ones again.
    earlier = optuna.create_study(study_name=args.variant, storage=storage, load_if_exists=True, direction="maximize")
    study = optuna.load_study(study_name=args.variant, storage=storage,
                              sampler=optuna.samplers.TPESampler(seed=args.seed + len(earlier.trials)))
    budget = _budget(args)
    for trial in study.trials:
        if trial.user_attrs.get("budget", budget) != budget:
            raise ValueError(f"{folder / STUDY}: its trials ran with {trial.user_attrs['budget']}, this search asks "
                             f"for {budget}; give another --out")
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)   # cut off by a kill: run it again
        study.enqueue_trial(trial.params)
    def finished() -> int:
        return len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))

    space = searched(args.variant)
    left = finished() < args.trials   # Ray is started only for trials left to run
    with ray_jobs(args.ray if left else None) as ray, \
            tqdm(total=args.trials, initial=min(finished(), args.trials), desc="trials", unit="trial",
                 disable=not args.progress) as bar:
        while finished() < args.trials:
            # a batch is asked before any of it is told: where it runs cannot change what is drawn
            trials = [study.ask() for _ in range(min(args.workers, args.trials - finished()))]
            for trial in trials:
                trial.set_user_attr("budget", budget)
            jobs = [(trial.number, sample(trial, space)) for trial in trials]
            told = set()
            try:
                for i, (value, attrs) in _scored(args, folder, jobs, ray):
                    for key, attr in attrs.items():
                        trials[i].set_user_attr(key, attr)
                    study.tell(trials[i], value)
                    told.add(i)
                    bar.update()
            except Exception:   # an error, not a kill: its trials fail, as Optuna's optimize fails them, never rerun
                for i, trial in enumerate(trials):
                    if i not in told:
                        study.tell(trial, state=optuna.trial.TrialState.FAIL)
                raise
    best = study.best_trial
    result = {"variant": args.variant, "trial": best.number, "metric": best.user_attrs["metric"],
              "value": best.user_attrs["value"], "trials": finished(),
              "validation_seed_base": VALIDATION_SEED_BASE, "budget": budget,
              "train_args": {**VARIANTS[args.variant], **best.params}}
    write_json(folder / BEST, result)
    return result


def _budget(args: TuneArgs) -> dict:
    """What every trial of a study shares: the data, the training budget and the validation drive."""
    drive = {"episodes": args.episodes, "max_steps": args.max_steps} if args.objective == "drive" else {}
    return {"data": str(Path(args.data).resolve()), "window": args.window, "epochs": args.epochs,
            "windows_per_epoch": args.windows_per_epoch, "objective": args.objective, **drive, "seed": args.seed}


def _scored(args: TuneArgs, folder: Path, jobs: list[tuple[int, dict]], ray):
    """:func:`_trial` for every (trial number, values): in this process one after another
    (``workers`` 1), in ``workers`` processes of one torch thread, or as Ray tasks (``ray``, an
    open :class:`~nac_drive.pipeline.ray_tasks.RayJobs`); yields (the job's index, its result)."""
    from functools import partial

    from nac_drive.pipeline.processes import map_in_processes

    if ray is not None:
        where = folder.resolve()   # a worker's working folder is not this process's: every path absolute
        remote = replace(args, data=str(Path(args.data).resolve()))
        yield from ray.run(partial(_trial, remote, where, threads=1), jobs)
    elif args.workers > 1:
        yield from enumerate(map_in_processes(partial(_trial, args, folder, threads=1), jobs, args.workers))
    else:
        yield from ((i, _trial(args, folder, job)) for i, job in enumerate(jobs))


def _trial(args: TuneArgs, folder: Path, job: tuple[int, dict], threads: int | None = None) -> tuple[float, dict]:
    """Train trial ``job`` = (its number, its values) (``threads``: :func:`~nac_drive.pipeline.train.train`'s)
    and score the run (:data:`OBJECTIVES`): (the value Optuna maximises: the mean return; minus the
    mean |cte| or the validation loss, the trial's attributes: ``run_dir``, ``metric``, ``value``
    and for a drive ``seeds``)."""
    from nac_drive.io.checkpoint import read_json
    from nac_drive.pipeline.drive import drive_checkpoint
    from nac_drive.pipeline.train import best_epoch, train
    from nac_drive.pipeline.train_args import TrainArgs

    number, values = job
    run_dir = train(TrainArgs(data=args.data, out=str(folder / "runs"), run_name=f"trial-{number}",
                              seed=args.seed, window=args.window, epochs=args.epochs,
                              windows_per_epoch=args.windows_per_epoch, progress=False, device=args.device,
                              **VARIANTS[args.variant], **values), threads=threads)
    if args.objective == "val-loss":
        loss = best_epoch(run_dir / "metrics.csv")["val_loss"]
        if loss is None:
            raise ValueError(f"{args.data}: too few episodes to hold one out for validation; --objective val-loss "
                             "needs a validation set")
        return -loss, {"run_dir": str(run_dir), "metric": "val_loss", "value": loss}
    task = read_json(run_dir / "train_args.json")["data_info"]["task"]
    drive = drive_checkpoint(run_dir / "best", task, args.episodes, args.max_steps, progress=False,
                             seed_base=VALIDATION_SEED_BASE)
    metric = "mean_abs_cte" if task == "udacity" else "mean_return"
    value = -drive[metric] if task == "udacity" else drive[metric]
    return value, {"run_dir": str(run_dir), "metric": metric, "value": drive[metric], "seeds": drive["seeds"]}
