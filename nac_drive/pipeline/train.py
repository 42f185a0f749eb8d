"""Behaviour cloning of a :class:`DrivingPolicy` on recorded demonstrations.

    nac-drive train --data runs/demos --core nac --window 16
    torchrun --nproc-per-node 2 --no-python nac-drive train --data runs/demos   # DistributedDataParallel

The loss covers every position of every window (position p sees p+1 frames, like the
first frames of an episode in closed loop). With ``--frame-drop P`` the training windows are
cut from the frames left after a share P of each episode's is dropped, redrawn each epoch
(the datasets' ``frame_drop``). Validation uses held-out *episodes*, with every frame. The
run folder (``<out>/<run name>``, or ``<run name>-2``, ``-3``, ... when that is taken; only
``--resume`` writes into an existing one) holds ``best/`` (lowest validation loss, or training
loss without a validation set;
``config.json`` + ``model.safetensors``), ``last/`` (+ optimizer state, for ``--resume``),
``metrics.csv``, TensorBoard events (``tensorboard/``: per-step ``train/`` and per-epoch
``val/`` scalars, and the run's hyperparameters; :mod:`nac_drive.pipeline.run_log`) and
``train_args.json``. ``best/`` and ``last/`` are
replaced whole (:func:`~nac_drive.io.atomic.atomic_write_dir`): a kill leaves the previous one.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import math
import os
import time
import warnings
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from nac_drive.allocator import keep_large_buffers
from nac_drive.devices import module_device, resolve_device
from nac_drive.fields import changed_fields
from nac_drive.io.atomic import atomic_write, atomic_write_dir, fresh_dir, one_writer, readable_dir
from nac_drive.io.checkpoint import load_optimizer, load_state_into, save_optimizer, write_json
from nac_drive.policy.cores import CORES, CoreConfig
from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig, read_policy_weights
from nac_drive.pipeline.train_args import CLASS_WEIGHTINGS, TrainArgs, core_fields, read_tuned
from nac_drive.torch_threads import available_cores, torch_threads


def run_name(args: TrainArgs, config: PolicyConfig) -> str:
    """``--run-name``, else one that says what trains: the task and ``config``'s core (with
    ``--init-from`` the checkpoint's, not the flags' defaults), window, seed and frame-drop."""
    core_cfg = config.core
    core = f"nac-{core_cfg.mode}" if core_cfg.core == "nac" else core_cfg.core
    if core_cfg.core == "nac" and core_cfg.logit_variant != "paper":
        core += f"-{core_cfg.logit_variant}"   # beyond the paper: the name says so
    drop = f"__drop{args.frame_drop:g}" if args.frame_drop else ""
    return args.run_name or f"{config.task}__{core}__w{core_cfg.window}__s{args.seed}{drop}"


def epoch_seed(seed: int, epoch: int) -> int:
    """torch's seed for one epoch's draws, a function of (seed, epoch) alone as the windows
    of :class:`EpochSampler` are: an epoch trained after a resume draws as it did uninterrupted."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


class EpochSampler(torch.utils.data.Sampler):
    """A fresh seeded sample of windows each epoch, split evenly across processes."""

    def __init__(self, n: int, per_epoch: int, seed: int, rank: int = 0, world: int = 1):
        self.n, self.per_epoch, self.seed, self.rank, self.world = n, per_epoch or n, seed, rank, world
        self.epoch = 0

    def __iter__(self):
        rng = np.random.default_rng((self.seed, self.epoch))
        picks = rng.choice(self.n, size=self.per_epoch, replace=self.per_epoch > self.n)
        usable = len(picks) - len(picks) % self.world
        return iter(picks[self.rank:usable:self.world].tolist())

    def __len__(self) -> int:
        return self.per_epoch // self.world


def class_weights(actions: np.ndarray, num_classes: int, how: str) -> torch.Tensor | None:
    if how not in CLASS_WEIGHTINGS:
        raise ValueError(f"class_weighting: must be one of {CLASS_WEIGHTINGS}, got {how!r}")
    if how == "none":
        return None
    counts = np.bincount(actions, minlength=num_classes).astype(np.float64)
    weights = counts.sum() / (num_classes * np.maximum(counts, 1))
    weights = np.clip(weights, None, 10.0 * weights[counts > 0].min())
    return torch.tensor(weights, dtype=torch.float32)


def bc_loss(outputs: torch.Tensor, actions: torch.Tensor, weights: torch.Tensor | None):
    """outputs [B, T, A], actions [B, T] (classes, or one continuous output) or [B, T, A]
    -> (loss, number correct for classes / sum of absolute errors for regression)."""
    if actions.dtype == torch.int64:
        loss = F.cross_entropy(outputs.flatten(0, 1), actions.flatten(), weight=weights)
        return loss, (outputs.argmax(-1) == actions).sum().item()
    if actions.ndim == outputs.ndim - 1:   # Udacity steering: [B, T] -> [B, T, 1]
        actions = actions.unsqueeze(-1)
    return F.mse_loss(outputs, actions), (outputs - actions).abs().mean(-1).sum().item()


def data_task(data: str | Path) -> str:
    """The task demonstrations in ``data`` are for: "udacity" for ``driving_log.csv``
    recordings, else "carracing" (Minari datasets)."""
    return "udacity" if Path(data).is_dir() and any(Path(data).rglob("driving_log.csv")) else "carracing"


def _load_data(args: TrainArgs, seed: int):
    """-> (policy config, train windows, validation windows, training actions or None, info),
    for the task of :func:`data_task`."""
    if data_task(args.data) == "udacity":
        return _load_udacity(args, seed)
    return _load_carracing(args, seed)


def _load_carracing(args: TrainArgs, seed: int):
    from nac_drive.data_collection.carracing_dataset import WindowDataset, load_episodes, split_by_episode

    episodes = load_episodes(args.data)
    train_eps, val_eps = split_by_episode(episodes, args.val_fraction, seed)
    discrete = episodes[0].actions.ndim == 1
    first_of_gas = {}
    for e in episodes:
        first_of_gas.setdefault(e.gas, e.source)
    gases = sorted(first_of_gas)
    if len(gases) > 1:
        raise ValueError(f"{args.data}: the datasets were recorded in envs whose GAS presses {gases} (e.g. "
                         + ", ".join(f"{first_of_gas[g]}: {g}" for g in gases)
                         + "); a policy learns one env, so train on the datasets of one")
    frame_dt = round(float(np.median(np.diff(episodes[0].timestamps))), 6) if len(episodes[0]) > 1 else 0.02
    config = PolicyConfig(task="carracing", encoder="carracing_cnn", action="discrete" if discrete else "continuous",
                          num_outputs=5 if discrete else 3, frame_dt=frame_dt, gas=gases[0])
    train_set = WindowDataset(train_eps, args.window, frame_drop=args.frame_drop, seed=seed)
    val_set = WindowDataset(val_eps, args.window)
    actions = np.concatenate([e.actions for e in train_eps]) if discrete else None
    return config, train_set, val_set, actions, {
        "task": "carracing", "episodes": len(episodes), "train_episodes": len(train_eps),
        "val_episodes": len(val_eps), "val_seeds": [e.seed for e in val_eps]}


def _load_udacity(args: TrainArgs, seed: int):
    from nac_drive.data_collection.udacity_dataset import (DEFAULT_FPS, UdacityWindowDataset, segments_from_log,
                                                           split_segments)

    segments = [seg for log in sorted(Path(args.data).rglob("driving_log.csv")) for seg in segments_from_log(log)]
    train_segs, val_segs = split_segments(segments, args.val_fraction, seed)
    config = PolicyConfig(task="udacity", encoder="pilotnet", action="continuous", num_outputs=1,
                          head_dropout=0.5, frame_dt=1.0 / DEFAULT_FPS)
    train_set = UdacityWindowDataset(train_segs, args.window, augment=True, seed=seed, frame_drop=args.frame_drop)
    val_set = UdacityWindowDataset(val_segs, args.window, augment=False, seed=seed)
    return config, train_set, val_set, None, {
        "task": "udacity", "segments": len(segments), "train_segments": len(train_segs),
        "val_segments": len(val_segs), "frames": sum(len(s.rows) for s in segments)}


def _world_size() -> int:
    """Processes training together (torchrun sets ``WORLD_SIZE``; 1 alone)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def _distributed(device: torch.device) -> tuple[int, int, bool, torch.device]:
    """(rank, world size, whether this call started the process group, this process's
    device). Under torchrun on CUDA each process takes the GPU of its ``LOCAL_RANK`` (unless
    the device names one) and the ranks talk over NCCL, on the CPU over gloo."""
    world = _world_size()
    if world > 1 and device.type == "cuda" and device.index is None:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    started = world > 1 and not dist.is_initialized()
    if started:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return (dist.get_rank(), world, started, device) if world > 1 else (0, 1, False, device)


def train(args: TrainArgs, threads: int | None = None) -> Path:
    """Train; returns the run folder. Works alone or under torchrun (gloo on CPU, NCCL on CUDA).

    The policy, its optimizer state and every batch live on ``args.device`` (resolved first:
    a device this machine lacks is refused before any work); checkpoints are written from CPU
    copies, so a GPU run's load anywhere.

    ``args.tuned``: a ``best.json`` of :func:`~nac_drive.pipeline.tune.tune` whose values replace
    those fields. ``threads``: torch threads; by default every core alone (a batch of 512 frames is big
    enough to share), one under torchrun, where the processes share the cores (as do the
    workers of ``compare --workers``, which pass one). The caller's count is back afterwards.
    The process's allocator keeps large freed buffers from then on
    (:func:`~nac_drive.allocator.keep_large_buffers`: 1.55x the frames a second on the CPU).
    """
    device = resolve_device(args.device)
    keep_large_buffers()
    if args.tuned:   # nac-drive tune's choice replaces those fields
        args = dataclasses.replace(args, **read_tuned(args.tuned))
    if threads is None:
        threads = available_cores() if _world_size() == 1 else 1
    with torch_threads(threads), contextlib.ExitStack() as held:
        return _train(args, held, device)


def _train(args: TrainArgs, held: contextlib.ExitStack, device: torch.device) -> Path:
    """:func:`train`; ``held`` keeps the run folder's writer lock (a resumed run) until it returns."""
    if args.core not in CORES:
        raise ValueError(f"core: must be one of {CORES}, got {args.core!r}")
    rank, world, started_group, device = _distributed(device)
    torch.manual_seed(args.seed)
    config, train_set, val_set, actions, data_info = _load_data(args, args.seed)
    if len(train_set) == 0:
        raise ValueError(f"data: no episode or segment of {args.data} has {args.window} frames (--window)")
    if actions is None and args.class_weighting != "none":
        raise ValueError(f"--class-weighting {args.class_weighting}: {args.data} holds continuous actions, and class "
                         f"weights apply to discrete ones only")
    core_cfg = CoreConfig(core=args.core, window=args.window, d_model=args.d_model, num_heads=args.num_heads,
                          topk=args.topk, mode=args.mode, select=args.select, euler_steps=args.euler_steps,
                          sparsity=args.sparsity, logit_variant=args.logit_variant, seed=args.seed)
    config.core = core_cfg
    if args.init_from:   # fine-tune (e.g. a DAgger round): the checkpoint's own architecture
        policy = DrivingPolicy.from_pretrained(args.init_from).train()
        if policy.config.action != config.action:
            raise ValueError(f"init_from: {args.init_from} is a {policy.config.action} policy, the data has "
                             f"{config.action} actions")
        if policy.config.gas != config.gas:
            raise ValueError(f"init_from: {args.init_from} learned an env whose GAS presses {policy.config.gas}, "
                             f"the data was recorded with {config.gas}")
        config = policy.config
    else:
        policy = DrivingPolicy(config)   # built on the CPU from the seed, so every device starts from the same weights
    run_dir = Path(args.out) / run_name(args, config)
    policy.to(device)   # before the optimizer exists: its state is made (or restored) beside the parameters
    model = policy if world == 1 else torch.nn.parallel.DistributedDataParallel(
        policy, device_ids=[device.index] if device.type == "cuda" else None)

    sampler = EpochSampler(len(train_set), args.windows_per_epoch, args.seed, rank, world)
    if len(sampler) < args.batch_size:   # the loader drops a partial batch: not one step would run
        per = f"{len(sampler)} a process ({world} processes)" if world > 1 else str(len(sampler))
        raise ValueError(f"--windows-per-epoch: {per} windows an epoch, fewer than one batch (--batch-size "
                         f"{args.batch_size}): no optimiser step would run; sample more windows or smaller batches")
    loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                                         pin_memory=device.type == "cuda")
    steps_per_epoch = max(1, len(loader))
    total_steps = steps_per_epoch * args.epochs
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    warmup = max(1, total_steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min((s + 1) / warmup, 0.5 * (
        1 + math.cos(math.pi * min(1.0, (s - warmup) / max(1, total_steps - warmup))))))
    weights = class_weights(actions, config.num_outputs, args.class_weighting) if actions is not None else None
    weights = weights.to(device) if weights is not None else None

    start_epoch, best = 0, float("inf")
    if args.resume:
        last = readable_dir(run_dir / "last")
        if rank == 0:   # two resumes of one run would both write its checkpoints and metrics
            held.enter_context(one_writer(run_dir, "nac-drive train"))
        refuse_another_architecture(config, last)
        load_state_into(policy, read_policy_weights(last / "model.safetensors"), last / "model.safetensors")
        state = load_optimizer(last, optimizer)
        if not (isinstance(state.get("epoch"), int) and isinstance(state.get("best_val_loss"), (int, float))):
            raise ValueError(f"resume: {last / 'train_state.json'} has no epoch and best_val_loss")
        start_epoch, best = state["epoch"] + 1, state["best_val_loss"]
        schedule.last_epoch = start_epoch * steps_per_epoch - 1
        with warnings.catch_warnings():   # the restored optimizer has stepped; torch cannot tell
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
            schedule.step()
    else:   # a new run never writes into an existing run's folder
        run_dir = _fresh_run_dir(run_dir, rank, world, device)
    csv_path = run_dir / "metrics.csv"

    log = None
    if rank == 0:
        from nac_drive.pipeline.run_log import RunLog
        print(f"run folder: {run_dir}", flush=True)
        if args.resume:   # rows of epochs after the checkpoint are about to be trained again
            _keep_csv_rows(csv_path, start_epoch)
        write_json(run_dir / "train_args.json", {**asdict(args), "world_size": world, "device_used": str(device),
                                                  "torch_threads": torch.get_num_threads(), "data_info": data_info,
                                                  "policy_config": asdict(config)})
        log = RunLog(run_dir, hyperparameters(args, config, world), first_step=start_epoch * steps_per_epoch)

    card = {"data": str(args.data)}   # the model card says what the policy learnt from
    for epoch in range(start_epoch, args.epochs):
        sampler.epoch = epoch
        torch.manual_seed(epoch_seed(args.seed, epoch))   # its dropout masks: a resumed run draws what it would have
        if hasattr(train_set, "set_epoch"):   # fresh augmentation draws
            train_set.set_epoch(epoch)
        model.train()
        seen, loss_sum, correct, t0 = 0, 0.0, 0, time.perf_counter()
        bar = tqdm(loader, desc=f"epoch {epoch + 1}/{args.epochs}", disable=rank != 0 or not args.progress,
                   unit="batch", leave=False)
        for batch, tensors in enumerate(bar):
            frames, stamps, target = (x.to(device, non_blocking=True) for x in tensors)
            outputs = model(frames, stamps)
            loss, right = bc_loss(outputs, target, weights)
            right = right if config.action == "discrete" else 0
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            n = target.shape[0] * target.shape[1]
            seen, loss_sum, correct = seen + n, loss_sum + loss.item() * n, correct + (right or 0)
            bar.set_postfix(loss=f"{loss_sum / seen:.3f}")
            if log:
                log.step(epoch * steps_per_epoch + batch + 1, loss.item(), schedule.get_last_lr()[0],
                         right / n if config.action == "discrete" else None)
        elapsed = time.perf_counter() - t0
        if rank != 0:
            continue
        val = evaluate(policy, val_set, weights, args.val_windows, args.batch_size, args.seed)
        row = {"epoch": epoch + 1, "train_loss": loss_sum / max(seen, 1),
               "train_accuracy": correct / max(seen, 1) if config.action == "discrete" else float("nan"),
               "val_loss": val["loss"], "val_accuracy": val["accuracy"], "val_mae": val["mae"],
               "lr": schedule.get_last_lr()[0], "frames_per_s": seen * world / elapsed}
        _append_csv(csv_path, row)
        log.epoch((epoch + 1) * steps_per_epoch, row)
        score = checkpoint_score(row)
        if score < best:
            best = score
            atomic_write_dir(run_dir / "best", lambda folder: policy.save_pretrained(folder, model_card_kwargs=card))
        # one step: a kill leaves the previous last/ whole (weights and optimizer of one epoch)
        atomic_write_dir(run_dir / "last", lambda folder: (
            policy.save_pretrained(folder, model_card_kwargs=card),
            save_optimizer(folder, optimizer, {"epoch": epoch, "best_val_loss": best})))
        shown = [f"train loss {row['train_loss']:.4f}"] + [
            f"{label} {value:.{digits}f}" for label, value, digits in
            (("val loss", val["loss"], 4), ("val acc", val["accuracy"], 3), ("val MAE", val["mae"], 4))
            if value == value]   # NaN: no validation set, or not this kind of action
        print(f"epoch {epoch + 1}: {', '.join(shown)}, {row['frames_per_s']:.0f} frames/s", flush=True)
    if log:
        log.close()
        if args.eval_episodes:
            from nac_drive.pipeline.drive import drive_checkpoint
            record_closed_loop(run_dir, drive_checkpoint(run_dir / "best", config.task, args.eval_episodes,
                                                         progress=args.progress))
    if world > 1:
        _record_rank_agreement(policy, run_dir, rank, world)
    if started_group:  # gloo's threads left running at interpreter exit can abort the process
        dist.destroy_process_group()
    return run_dir


def hyperparameters(args: TrainArgs, config: PolicyConfig, world: int) -> dict:
    """What TensorBoard's HParams table shows of a run (what tells runs apart): of the
    architecture, only what its core uses (an lstm has no heads)."""
    core = config.core
    architecture = {name: getattr(core, name) for name in ("core", "window", "d_model",
                                                           *core_fields(core.core, core.mode))}
    return {"task": config.task, "action": config.action, **architecture, "epochs": args.epochs,
            "windows_per_epoch": args.windows_per_epoch, "batch_size": args.batch_size * world, "lr": args.lr,
            "weight_decay": args.weight_decay, "class_weighting": args.class_weighting, "seed": args.seed,
            "frame_drop": args.frame_drop, "init_from": args.init_from or "-"}


CLOSED_LOOP_FILE = "closed_loop.json"   # in a run folder: how its best checkpoint drove


def record_closed_loop(run_dir: Path, summary: dict) -> dict:
    """A checkpoint's drive (:func:`~nac_drive.pipeline.drive.drive_checkpoint`) into its run
    folder: ``closed_loop.json`` and the ``closed_loop/`` TensorBoard scalars, which the
    HParams table shows beside the validation metrics. Returns what it wrote."""
    from nac_drive.pipeline.run_log import log_closed_loop

    summary = {k: v for k, v in summary.items() if k != "text"}
    write_json(run_dir / CLOSED_LOOP_FILE, summary)
    log_closed_loop(run_dir, summary)
    return summary


def _fresh_run_dir(path: Path, rank: int, world: int, device: torch.device) -> Path:
    """Rank 0 creates a new run folder at ``path`` or, if taken, at ``path-2``, ``path-3``, ...
    (:func:`fresh_dir`); under torchrun every rank learns its name."""
    name = fresh_dir(path).name.encode() if rank == 0 else b""
    if world > 1:
        buffer = torch.zeros(256, dtype=torch.uint8, device=device)   # a file name has at most 255 bytes; NCCL: on the GPU
        buffer[:len(name)] = torch.tensor(list(name), dtype=torch.uint8)
        dist.broadcast(buffer, src=0)
        name = bytes(buffer[buffer > 0].tolist())
    return path.with_name(name.decode())


def _keep_csv_rows(path: Path, epochs: int) -> None:
    """Keep the rows of epochs ``1..epochs`` in ``metrics.csv`` (rewritten atomically)."""
    if not path.is_file():
        return
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return
    kept = [row for row in rows if row.get("epoch", "").isdigit() and int(row["epoch"]) <= epochs]

    def write(tmp: str) -> None:
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(kept)
    atomic_write(path, write)


def _record_rank_agreement(policy: DrivingPolicy, run_dir: Path, rank: int, world: int) -> None:
    """Gather a float64 checksum of every rank's parameters into ``ddp_ranks.json``:
    DistributedDataParallel must leave all ranks with identical weights."""
    flat = torch.cat([p.detach().double().flatten() for p in policy.parameters()])
    positions = torch.arange(len(flat), dtype=torch.float64, device=flat.device)
    mine = torch.stack([flat.sum(), flat.square().sum(), (flat * positions).sum()])
    gathered = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    if rank == 0:
        write_json(run_dir / "ddp_ranks.json", {"world_size": world,
                                                 "param_checksums": [g.tolist() for g in gathered]})
    dist.barrier()


@torch.no_grad()
def evaluate(policy: DrivingPolicy, dataset, weights, limit: int, batch_size: int, seed: int) -> dict:
    """Loss, accuracy (discrete) and mean absolute error (continuous) on held-out windows
    (``limit`` of them at most, a seeded sample), in batches of ``batch_size`` windows.

    Overlapping windows share frames, and the encoder sees one frame at a time: each frame is
    encoded once (:func:`encode_held_out`), then every window runs the core and head on its
    frames' features."""
    nan = float("nan")
    if len(dataset) == 0:
        return {"loss": nan, "accuracy": nan, "mae": nan}
    policy.eval()
    device = module_device(policy)
    idx = validation_windows(len(dataset), limit, seed)
    features = encode_held_out(policy, dataset, idx, batch_size * dataset.window)
    total, loss_sum, correct, abs_err = 0, 0.0, 0, 0.0
    for first in range(0, len(idx), batch_size):
        batch = idx[first:first + batch_size]
        stamps, target = (torch.stack(parts).to(device) for parts in zip(*map(dataset.labels, batch)))
        outputs = policy.outputs_from_features(torch.stack([features[i] for i in batch]), stamps)
        loss, hits = bc_loss(outputs, target, weights)
        n = target.shape[0] * target.shape[1]
        total, loss_sum = total + n, loss_sum + loss.item() * n
        if policy.config.action == "discrete":
            correct += hits
        else:
            abs_err += hits
    discrete = policy.config.action == "discrete"
    return {"loss": loss_sum / total, "accuracy": correct / total if discrete else nan,
            "mae": nan if discrete else abs_err / total}


def validation_windows(count: int, limit: int, seed: int) -> np.ndarray:
    """Which of ``count`` held-out windows :func:`evaluate` scores: all, or a seeded sample of ``limit``."""
    idx = np.arange(count)
    return np.random.default_rng(seed).choice(idx, limit, replace=False) if limit and count > limit else idx


@torch.no_grad()
def encode_held_out(policy: DrivingPolicy, dataset, idx: np.ndarray, chunk: int) -> dict[int, torch.Tensor]:
    """The encoder's features of the windows ``idx`` of ``dataset`` -> {window: ``[W, feature_dim]``},
    each frame encoded once (``chunk`` frames at a time). The dataset gives ``index[i]``
    (sequence, first frame), ``window`` and ``frames_of(sequence, positions)``: the frames as
    recorded, so an augmenting or frame-dropping dataset is refused."""
    if getattr(dataset, "augment", False) or getattr(dataset, "frame_drop", 0):
        raise ValueError("validation: the held-out windows must not be augmented nor frame-dropped (a dataset "
                         "with augment=False and frame_drop=0)")
    span, device = np.arange(dataset.window), module_device(policy)
    located = [dataset.index[i] for i in idx]   # each window's (sequence, first frame)
    starts: dict[int, list[int]] = {}
    for sequence, start in located:
        starts.setdefault(sequence, []).append(start)
    encoded = {}
    for sequence, firsts in starts.items():
        positions = np.unique((np.asarray(firsts)[:, None] + span).ravel())
        encoded[sequence] = positions, torch.cat([
            policy.encoder(dataset.frames_of(sequence, positions[a:a + chunk]).to(device))
            for a in range(0, len(positions), chunk)])
    features = {}
    for i, (sequence, start) in zip(idx, located):
        positions, rows = encoded[sequence]
        first = int(np.searchsorted(positions, start))   # the window's frames are consecutive there
        features[int(i)] = rows[first:first + dataset.window]
    return features


def run_summary(run_dir: Path) -> dict:
    """What ``nac-drive train`` reports of a finished run: its folder, its best checkpoint
    and that epoch's ``metrics.csv`` row (:func:`best_epoch`)."""
    return {"run": str(run_dir), "best_checkpoint": str(run_dir / "best"),
            "best_epoch": best_epoch(run_dir / "metrics.csv")}


def best_epoch(metrics_csv: Path) -> dict[str, float | None]:
    """The ``metrics.csv`` row of the epoch ``best/`` holds (the first of the lowest
    :func:`checkpoint_score`), as numbers (NaN -> None)."""
    with metrics_csv.open() as f:
        rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]
    best = min(rows, key=checkpoint_score)
    return {k: (None if math.isnan(v) else v) for k, v in best.items()}


def checkpoint_score(row: dict[str, float]) -> float:
    """What ``best/`` is chosen by, from an epoch's metrics row: its validation loss, or without
    a validation set (NaN: ``--val-fraction 0``, one episode) its training loss."""
    return row["val_loss"] if not math.isnan(row["val_loss"]) else row["train_loss"]


def _append_csv(path: Path, row: dict) -> None:
    new = not path.exists()
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(row))
        if new:
            writer.writeheader()
        writer.writerow(row)
        f.flush()
        os.fsync(f.fileno())


def trained_otherwise(run_dir: Path, args: TrainArgs) -> list[str]:
    """The fields of ``args`` that the run in ``run_dir`` was trained with otherwise (its
    ``train_args.json``; paths compared resolved, and ``progress``, ``resume``, ``device`` and
    ``out`` may change): what a run that goes on in that folder may not change."""
    from nac_drive.io.checkpoint import read_json

    recorded, asked = read_json(Path(run_dir) / "train_args.json"), asdict(args)
    for given in (recorded, asked):   # one file, however it was named (a Ray worker's are absolute)
        for name in ("data", "init_from"):
            if given.get(name) is not None:
                given[name] = str(Path(str(given[name])).resolve())
    return changed_fields(recorded, asked, may_change=("progress", "resume", "device", "out"))


def refuse_another_architecture(config, last: Path) -> None:
    """A resumed run goes on with the policy its checkpoint ``last`` holds: a ``--window``,
    ``--mode`` (or any other setting) that differs would train another policy under the saved
    name (and rewrite its config), so it is refused, naming the first difference."""
    from nac_drive.io.checkpoint import CONFIG, read_json
    from nac_drive.policy.driving_policy import PolicyConfig

    saved = asdict(PolicyConfig.from_dict(read_json(last / CONFIG)))
    asked = asdict(config)
    for key in saved:
        pairs = saved[key].items() if isinstance(saved[key], dict) else [(None, saved[key])]
        for sub, was in pairs:
            now = asked[key][sub] if sub else asked[key]
            if now != was:
                name = sub or key
                raise ValueError(f"resume: {last} was trained with {name} = {was!r}, this run asks {now!r}; resume "
                                 f"with the run's own settings (--{name.replace('_', '-')} {was}), or start a new run")
