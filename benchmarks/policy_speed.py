"""Driving-policy speed: closed-loop latency per frame and training throughput, per core.

    python benchmarks/policy_speed.py                # prints the markdown tables of BENCHMARKS.md

* latency: ``select_action`` on one raw 96x96 frame, one thread, after a 64-frame warm-up
  (the window is full), median over 500 frames;
* training: forward + backward + AdamW step on batches of 32 windows x 16 frames,
  frames per second; one process with one thread, one process on every core (what
  ``nac-drive train`` uses alone), and two processes under DistributedDataParallel
  (gloo), as ``torchrun --nproc-per-node 2`` trains; each process's allocator keeps large
  buffers, as ``train`` has it do (``nac_drive.allocator``; what that is worth:
  ``benchmarks/train_allocator.py``).

    python benchmarks/policy_speed.py --breakdown    # where the shipped policy's select_action spends it
    python benchmarks/policy_speed.py --paired 7     # training frames/s, NAC against MHA, 7 alternating rounds

* breakdown: the shipped CarRacing policy's ``select_action`` and each part of it run alone on
  the same inputs (the frame's checks and conversion, the encoder, the NAC's ``step``, the head),
  CPU time of this thread (so other jobs on the machine do not count), median over 500 calls;
  on the old path (before issue 57 item 3: the encoder and the head module by module, the NAC
  step stage by stage) and the new one side by side, in turn by blocks of 25 calls, with their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from nac_drive.allocator import keep_large_buffers
from nac_drive.policy.cores import CORES, CoreConfig
from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig
from nac_drive.torch_threads import available_cores

BATCH, WINDOW = 32, 16


def make_policy(core: str) -> DrivingPolicy:
    return DrivingPolicy(PolicyConfig(core=CoreConfig(core=core, window=WINDOW)))


def median_ms(call, calls: int, clock=time.perf_counter) -> float:
    """Median ms of ``call(i)`` over ``calls`` calls, timed by ``clock``."""
    times = []
    for i in range(calls):
        t0 = clock()
        call(i)
        times.append(clock() - t0)
    return 1e3 * statistics.median(times)


def latency_ms(core: str, frames: int = 500) -> float:
    torch.set_num_threads(1)
    policy = make_policy(core).eval()
    obs = np.random.default_rng(0).integers(0, 256, (96, 96, 3), dtype=np.uint8)
    for _ in range(64):
        policy.select_action(obs)
    return median_ms(lambda i: policy.select_action(obs), frames)


def _train_steps(policy, model, steps: int) -> float:
    keep_large_buffers()   # as nac-drive train does
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-4)
    frames = torch.randint(0, 256, (BATCH, WINDOW, 3, 96, 96), dtype=torch.uint8)
    stamps = torch.arange(WINDOW, dtype=torch.float32).expand(BATCH, WINDOW) * 0.02
    actions = torch.randint(0, 5, (BATCH, WINDOW))
    for i in range(steps + 2):
        if i == 2:   # two warm-up steps
            t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(frames, stamps).flatten(0, 1), actions.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return BATCH * WINDOW * steps / (time.perf_counter() - t0)


def train_fps(core: str, steps: int = 8, threads: int = 1) -> float:
    torch.set_num_threads(threads)
    policy = make_policy(core).train()
    return _train_steps(policy, policy, steps)


def _ddp_worker(rank: int, world: int, core: str, steps: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    policy = make_policy(core).train()
    fps = _train_steps(policy, torch.nn.parallel.DistributedDataParallel(policy), steps)
    gathered = [None] * world
    dist.all_gather_object(gathered, fps)
    if rank == 0:
        out.put(sum(gathered))
    dist.destroy_process_group()


def ddp_train_fps(core: str, steps: int = 8, world: int = 2) -> float:
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    try:
        mp.start_processes(_ddp_worker, args=(world, core, steps, queue), nprocs=world, start_method="spawn")
    except mp.ProcessExitedException as exc:
        if queue.empty():  # died before rank 0 reported: no measurement
            raise
        # gloo can abort a worker while it shuts down, after the figure was measured and sent
        print(f"(a DDP worker died after reporting: {exc})", file=sys.stderr)
    return queue.get()


def on_the_old_path(policy: DrivingPolicy) -> DrivingPolicy:
    """``policy``, made to run ``select_action`` as before issue 57 item 3: the encoder and the head
    module by module (not as ``fused.FusedLayers``' plans) and the NAC step stage by stage (not
    ``kernels.stream_step``'s one call); the Python between the parts is this build's. The same
    weights: both paths' outputs agree to float rounding."""
    policy.encoder.fused = policy.fused_head = lambda owner, layers, x: None   # "the plan does not serve"
    if hasattr(policy.core, "nac"):
        policy.core.nac.streams_on_kernels = lambda x_t, rows, weights: False
    return policy


def paired_medians_ms(calls: dict[str, object], n: int, block: int = 25, clock=time.thread_time) -> dict[str, float]:
    """Median ms of each ``call(i)`` of ``calls`` (name -> call) over ``n`` calls, taken in turn in
    blocks of ``block`` calls: a machine whose load drifts slows them alike, and within a block
    each call finds the caches as its own previous call left them (as in a closed loop)."""
    times = {name: [] for name in calls}
    for start in range(0, n, block):
        for name, call in calls.items():
            for i in range(start, min(n, start + block)):
                t0 = clock()
                call(i)
                times[name].append(clock() - t0)
    return {name: 1e3 * statistics.median(values) for name, values in times.items()}


GOAL_MS = 0.5   # issue 57 item 3: select_action of the shipped policy, one thread


def breakdown(frames: int = 500) -> None:
    """Median CPU ms of the shipped policy's ``select_action`` and of each of its parts, on the old
    path (:func:`on_the_old_path`) and the new one, side by side."""
    import copy

    from nac_drive.policy.loading import load_driving_policy

    torch.set_num_threads(1)
    new = load_driving_policy()
    paths = {"old": on_the_old_path(copy.deepcopy(new)), "new": new}
    obs = [np.random.default_rng(i).integers(0, 256, (96, 96, 3), dtype=np.uint8) for i in range(8)]
    for policy in paths.values():
        for i in range(64):
            policy.select_action(obs[i % 8])

    def parts(policy):
        frame, _ = policy.observation_to_frame(obs[0])
        features = policy.encoder(frame[None])
        t = policy.episode_time(None)
        y, _ = policy.core.step(features, policy._state, t=t)
        return {"select_action, whole": lambda i: policy.select_action(obs[i % 8]),
                "the frame's checks and conversion": lambda i: policy.observation_to_frame(obs[i % 8]),
                "encoder (CNN)": lambda i: policy.encoder(frame[None]),
                "NAC step (window full)": lambda i: policy.core.step(features, policy._state, t=t),
                "head": lambda i: policy.head_output(y)}

    with torch.inference_mode():
        calls = {path: parts(policy) for path, policy in paths.items()}
        whole, *named = calls["new"]
        ms = {name: paired_medians_ms({path: calls[path][name] for path in paths}, frames) for name in calls["new"]}
    ms["the rest (Python between the parts)"] = {path: ms[whole][path] - sum(ms[name][path] for name in named)
                                                 for path in paths}
    print("| part of the shipped policy's select_action | CPU ms, old path (median) | new path | old / new |\n"
          "|---|---|---|---|")
    for name, value in ms.items():
        print(f"| {name} | {value['old']:.3f} | {value['new']:.3f} | {value['old'] / value['new']:.2f} |")
    print(f"\nselect_action: {ms[whole]['new']:.3f} ms a frame (goal <= {GOAL_MS} ms: "
          f"{'reached' if ms[whole]['new'] <= GOAL_MS else 'missed'})")


def paired_training(rounds: int, steps: int = 4) -> None:
    """The whole policy's training frames/s (encoder, core, head, AdamW), NAC against MHA: one process,
    one thread, the two alternating round by round, so a machine whose load drifts slows both alike;
    the table gives each core's median and range over rounds and the per-round ratio NAC / MHA."""
    torch.set_num_threads(1)
    policies = {core: make_policy(core).train() for core in ("nac", "mha")}
    fps = {core: [] for core in policies}
    for _ in range(rounds):
        for core, policy in policies.items():
            fps[core].append(_train_steps(policy, policy, steps))
    ratios = sorted(n / m for n, m in zip(fps["nac"], fps["mha"]))
    print(f"| core | train frames/s, 1 thread: median [min, max] of {rounds} rounds |\n|---|---|")
    for core, values in fps.items():
        print(f"| {core} | {statistics.median(values):.0f} [{min(values):.0f}, {max(values):.0f}] |")
    print(f"| NAC / MHA, per round | {statistics.median(ratios):.3f} [{ratios[0]:.3f}, {ratios[-1]:.3f}] |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cores", nargs="*", default=list(CORES))
    parser.add_argument("--breakdown", action="store_true",
                        help="only the shipped policy's select_action, part by part, old path and new")
    parser.add_argument("--paired", type=int, metavar="ROUNDS",
                        help="only the training frames/s of NAC against MHA, alternating for ROUNDS rounds")
    args = parser.parse_args()
    if args.breakdown:
        breakdown()
        return
    if args.paired:
        paired_training(args.paired)
        return
    cores = available_cores()
    print(f"| core | select_action ms / frame (p50, 1 thread) | train frames/s, 1 process, 1 thread | "
          f"1 process, {cores} threads | 2 processes (DDP) |\n|---|---|---|---|---|")
    for core in args.cores:
        lat, one = latency_ms(core), train_fps(core)
        every, two = (train_fps(core, threads=cores), ddp_train_fps(core)) if core == "nac" else (None, None)
        shown = ["" if v is None else f"{v:.0f} ({v / one:.2f}x)" for v in (every, two)]
        print(f"| {core} | {lat:.2f} | {one:.0f} | {shown[0]} | {shown[1]} |", flush=True)


if __name__ == "__main__":
    main()
