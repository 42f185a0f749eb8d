"""NAC layer speed and memory, side by side with torch-nac 0.0.2 and causal MHA.

    pip install --no-deps torch-nac==0.0.2     # the public reference (benchmark only)
    python benchmarks/nac_layer.py             # prints the markdown tables of BENCHMARKS.md
    python benchmarks/nac_layer.py --sections paper long --processes 3   # as BENCHMARKS §1 measured them

    # this build side by side with another one, e.g. before a refactor:
    git worktree add /tmp/old <commit> && pip install --no-deps --target /tmp/old-site /tmp/old
    python benchmarks/nac_layer.py --sections against --against /tmp/old-site --rounds 5

One thread, forward only, no grad: the median of the calls made in TIMED_S seconds (at least
``repeats``), after WARM_UP_S seconds of warm-up calls (the first calls after the first ran 1.1-1.7x
the steady state here, which a run of many calls meets); with
``--processes N`` each row runs in N processes and the fastest is reported (on a VM a whole process
can fall in a slow spell: one row moved 1.3x between runs). Memory
is the forward's peak-RSS increase over the process's RSS once model and input exist;
every measurement runs in its own process so peaks do not mix. Rows marked "eager"
run the layer with its numba kernels off (``NAC_DRIVE_KERNELS=0``): the torch code alone.
Section ``train`` times forward + backward instead, in one process, alternating (see
:func:`_training_step`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

WARM_UP_S = 0.5   # of calls before timing, after the first
TIMED_S = 1.0     # of timed calls (at least --repeats)
PROCESSES = 1     # per row (--processes)


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _build(impl: str, T: int, B: int, d: int, H: int, K: int, mode: str, select: str, causal: bool,
           window: int | None):
    import torch

    if impl == "nac":
        from nac_drive import NAC
        layer = NAC(d, d_model=d, num_heads=H, topk=K, mode=mode, select=select, causal=causal,
                    window=window, seed=0)
        return layer.eval(), (lambda x: layer(x))
    if impl == "torch-nac":
        from torch_nac.layers import NAC as TorchNAC
        layer = TorchNAC(d, H, topk=K, mode=mode, return_sequences=True, input_dim=d)
        return layer.eval(), (lambda x: layer(x))
    if impl == "mha":
        layer = torch.nn.MultiheadAttention(d, H, batch_first=True)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(T)
        return layer.eval(), (lambda x: layer(x, x, x, attn_mask=mask, need_weights=False, is_causal=True)[0])
    if impl == "selection-only":  # the layer's exact causal key selection alone, on ready q and k (kernel or eager)
        from nac_drive.nac import kernels as nac_kernels
        from nac_drive.nac.selection import Visibility, select_exact

        select = nac_kernels.kernel_select_exact if nac_kernels.available() else select_exact

        def run(x):
            qk = x.view(B, x.shape[1], H, d // H).transpose(1, 2)
            return select(qk, qk, K, Visibility(causal=True))
        return None, run
    if impl == "scores-pass":  # the floor of any exact selection: every score computed and read once
        def run(x):
            qk = x.view(B, x.shape[1], H, d // H).transpose(1, 2)
            return (qk @ qk.transpose(-1, -2)).amax(dim=-1)
        return None, run
    raise ValueError(impl)


def worker(spec: dict) -> dict:
    """Measure one configuration in this process."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(spec["B"], spec["T"], spec["d"])
    _, run = _build(spec["impl"], spec["T"], spec["B"], spec["d"], spec["H"], spec["K"], spec["mode"],
                    spec["select"], spec["causal"], spec["window"])
    if spec["impl"] == "nac" and spec.get("step"):
        return _measure_step(spec, x)
    with torch.no_grad():
        if spec["impl"] != "mha":  # load every kernel once on a tiny input: not the forward's memory
            run(x[:, :16])
        rss_before = _rss_mb()
        t0 = time.perf_counter()
        run(x)  # warm-up, also the forward whose peak memory is reported
        first = time.perf_counter() - t0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        _repeat_for(run, x, WARM_UP_S, 2)   # the steady state: the first calls after the first are slower
        times = _repeat_for(run, x, TIMED_S, spec["repeats"] if first < 5 else 3)
    times.sort()
    return {"ms": 1e3 * times[len(times) // 2], "mem_mb": max(0.0, peak - rss_before)}


def _repeat_for(run, x, seconds: float, at_least: int) -> list[float]:
    """Seconds of each ``run(x)``, called at least ``at_least`` times and until ``seconds`` have passed."""
    times, start = [], time.perf_counter()
    while len(times) < at_least or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        run(x)
        times.append(time.perf_counter() - t0)
    return times


def _measure_step(spec: dict, x) -> dict:
    """ms per ``step()`` under ``spec["grad_mode"]``: median over ``repeats`` runs of 200 calls (the layer
    is built outside the grad mode, as a policy is)."""
    import torch
    from nac_drive import NAC

    layer = NAC(spec["d"], d_model=spec["d"], num_heads=spec["H"], topk=spec["K"], mode=spec["mode"],
                select=spec["select"], window=spec["window"], seed=0).eval()
    frame = x[:1, 0]
    calls_per_run = 200
    runs = []
    with getattr(torch, spec["grad_mode"])():
        cache = layer.init_cache(1)
        for _ in range(2 * spec["window"]):
            _, cache = layer.step(frame, cache)
        for _ in range(spec["repeats"]):
            t0 = time.perf_counter()
            for _ in range(calls_per_run):
                _, cache = layer.step(frame, cache)
            runs.append((time.perf_counter() - t0) / calls_per_run)
    return {"ms": 1e3 * sorted(runs)[len(runs) // 2], "mem_mb": float("nan")}


def measure(eager: bool = False, site: str | None = None, **spec) -> dict:
    """Run one configuration in ``PROCESSES`` fresh processes, one after another: the fastest
    one's ms (a VM's slow spells pass; the code's speed stays) and the largest memory; ``eager``
    turns the layer's numba kernels off; ``site``: a folder holding another nac-drive build,
    imported instead of the installed one."""
    spec = {"B": 1, "d": 64, "H": 4, "K": 8, "mode": "exact", "select": "exact", "causal": True,
            "window": None, "repeats": 10, **spec}
    env = {**os.environ, "NAC_DRIVE_KERNELS": "0" if eager else "1"}
    if site:
        env["PYTHONPATH"] = os.pathsep.join([site, env.get("PYTHONPATH", "")])
    runs = []
    for _ in range(PROCESSES):
        out = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True,
                             text=True, env=env)
        if out.returncode != 0:
            return {"ms": float("nan"), "mem_mb": float("nan"), "error": out.stderr.strip().splitlines()[-1]}
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {"ms": min(r["ms"] for r in runs), "mem_mb": max(r["mem_mb"] for r in runs)}


def _row(name: str, r: dict, ref: dict | None = None) -> str:
    speed = f"{ref['ms'] / r['ms']:.0f}x" if ref and r["ms"] == r["ms"] else ""
    mem = f"{r['mem_mb'] / ref['mem_mb']:.2f}" if ref and ref["mem_mb"] > 0 and r["mem_mb"] == r["mem_mb"] else ""
    err = f" ({r['error']})" if "error" in r else ""
    return f"| {name} | {r['ms']:.2f} | {r['mem_mb']:.1f} | {speed} | {mem} |{err}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--long", type=int, nargs="*", default=[1024, 4096, 16384], help="T for the long runs")
    parser.add_argument("--sections", nargs="*", choices=SECTIONS, default=list(SECTIONS[:-1]),
                        help="which tables to measure (default: all but 'against')")
    parser.add_argument("--against", help="section 'against': a folder holding another nac-drive build "
                                          "(pip install --no-deps --target FOLDER CHECKOUT)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="sections 'against' and 'train': rounds, the implementations alternating")
    parser.add_argument("--processes", type=int, default=1,
                        help="processes per row (in 'against', per round), the fastest reported")
    args = parser.parse_args()
    global PROCESSES
    PROCESSES = args.processes
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    if "paper" in args.sections:
        _paper_configuration()
    if "driving" in args.sections:
        _driving_configuration()
    if "long" in args.sections:
        _long_sequences(args.long)
    if "step" in args.sections:
        _streaming_step()
    if "train" in args.sections:
        _training_step(args.rounds)
    if "against" in args.sections:
        if not args.against:
            parser.error("--sections against needs --against FOLDER")
        _against(args.against, args.rounds)


SECTIONS = ("paper", "driving", "long", "step", "train", "against")
HEADER = ("| implementation | ms / forward | forward peak RSS (MB) | speed-up vs torch-nac | memory vs torch-nac |"
          "\n|---|---|---|---|---|")


def _paper_configuration() -> None:
    print("\n### Paper configuration: T=1024, B=1, d=64, H=4, K=8 (1 thread)\n")
    print(HEADER)
    for mode in ("exact", "euler", "steady"):
        ref = measure(impl="torch-nac", T=1024, mode=mode, causal=False)
        print(_row(f"torch-nac 0.0.2, {mode}", ref))
        for select, causal in (("block", False), ("block", True), ("exact", False), ("exact", True)):
            name = f"nac-drive, {mode}, select={select}, {'causal' if causal else 'non-causal'}"
            print(_row(name, measure(impl="nac", T=1024, mode=mode, select=select, causal=causal), ref))
            if mode == "exact":
                print(_row(name + ", eager", measure(True, impl="nac", T=1024, mode=mode, select=select,
                                                     causal=causal), ref))
    print(_row("causal nn.MultiheadAttention", measure(impl="mha", T=1024)))
    print(_row("exact causal key selection alone (numba kernel, no NAC work)",
               measure(impl="selection-only", T=1024)))
    print(_row("exact causal key selection alone, eager (scores + torch.topk)",
               measure(True, impl="selection-only", T=1024)))
    print(_row("all T^2 scores in one product + one pass over them (amax): any exact selection's floor",
               measure(impl="scores-pass", T=1024)))


def _driving_configuration() -> None:
    print("\n### Driving configuration: T=16, B=32, d=64, H=4, K=8 (1 thread)\n")
    print(HEADER)
    ref = measure(impl="torch-nac", T=16, B=32, causal=False)
    print(_row("torch-nac 0.0.2, exact", ref))
    print(_row("nac-drive, exact, causal, window=16", measure(impl="nac", T=16, B=32, window=16), ref))
    print(_row("nac-drive, exact, causal, window=16, eager", measure(True, impl="nac", T=16, B=32, window=16), ref))
    print(_row("causal nn.MultiheadAttention", measure(impl="mha", T=16, B=32), ref))


def _long_sequences(lengths: list[int]) -> None:
    print("\n### Long sequences, B=1, select=block, causal (1 thread)\n")
    print("| T | nac-drive ms | nac-drive MB | eager ms | MHA ms | MHA MB | NAC speed-up vs MHA |"
          "\n|---|---|---|---|---|---|---|")
    for T in lengths:
        n, m = measure(impl="nac", T=T, select="block", repeats=5), measure(impl="mha", T=T, repeats=5)
        e = measure(True, impl="nac", T=T, select="block", repeats=5)
        print(f"| {T} | {n['ms']:.1f} | {n['mem_mb']:.1f} | {e['ms']:.1f} | {m['ms']:.1f} | {m['mem_mb']:.1f} | "
              f"{m['ms'] / n['ms']:.2f}x |")


def _streaming_step() -> None:
    print("\n### Streaming `step()`: window 16, d=64, H=4, K=8, B=1 (1 thread)\n")
    print("| mode | ms / step, torch.no_grad | ms / step, torch.inference_mode (as DrivingPolicy streams) "
          "| inference_mode, eager |")
    print("|---|---|---|---|")
    for mode in ("exact", "euler", "steady"):
        r = {grad: measure(impl="nac", T=1, mode=mode, window=16, step=True, grad_mode=grad)
             for grad in ("no_grad", "inference_mode")}
        e = measure(True, impl="nac", T=1, mode=mode, window=16, step=True, grad_mode="inference_mode")
        print(f"| {mode} | {r['no_grad']['ms']:.3f} | {r['inference_mode']['ms']:.3f} | {e['ms']:.3f} |")


def _training_step(rounds: int, calls: int = 20) -> None:
    """ms per forward + backward (of y.sum()) at the driving size, training mode: the NAC's eager
    code, the NAC with its kernels (the fused pair stage and its backward), causal MHA. One process,
    one thread, the three alternating within each round, so a machine whose load drifts slows all
    alike; each round's figure is the fastest of ``calls`` calls, the table the min and median."""
    import statistics

    import torch
    from nac_drive import NAC
    from nac_drive.nac import kernels

    torch.set_num_threads(1)
    torch.manual_seed(0)
    B, T, d, H, K = 32, 16, 64, 4, 8
    nac = NAC(d, d_model=d, num_heads=H, topk=K, window=16, seed=0).train()
    mha = torch.nn.MultiheadAttention(d, H, batch_first=True).train()
    mask = torch.nn.Transformer.generate_square_subsequent_mask(T)
    x = torch.randn(B, T, d, requires_grad=True)

    def eager():
        with kernels.disabled():
            nac(x).sum().backward()

    runs = {"NAC, eager torch code": eager,
            "NAC, kernels (fused pair stage, forward and backward)": lambda: nac(x).sum().backward(),
            "causal nn.MultiheadAttention": lambda: mha(x, x, x, attn_mask=mask, need_weights=False,
                                                        is_causal=True)[0].sum().backward()}
    ms = {name: [] for name in runs}
    for run in runs.values():
        run()                                                   # compile and warm up
    for _ in range(rounds):
        for name, run in runs.items():
            times = []
            for _ in range(calls):
                t0 = time.perf_counter()
                run()
                times.append(time.perf_counter() - t0)
            ms[name].append(1e3 * min(times))
    mha_ms = min(ms["causal nn.MultiheadAttention"])
    print(f"\n### Training step (forward + backward): T=16, B=32, d=64, H=4, K=8, window 16 "
          f"({rounds} rounds, 1 thread)\n")
    print("| implementation | ms / forward+backward (min / median of rounds) | / MHA (min) |\n|---|---|---|")
    for name, v in ms.items():
        print(f"| {name} | {min(v):.2f} / {statistics.median(v):.2f} | {min(v) / mha_ms:.2f}x |")


# the layer's configurations of the tables above, each run by both builds
AGAINST = [
    ("paper, exact, select=block, causal", False, dict(T=1024, select="block")),
    ("paper, exact, select=block, causal, eager", True, dict(T=1024, select="block")),
    ("paper, exact, select=exact, causal", False, dict(T=1024)),
    ("paper, exact, select=exact, non-causal", False, dict(T=1024, causal=False)),
    ("paper, steady, select=exact, causal", False, dict(T=1024, mode="steady")),
    ("paper, euler, select=block, non-causal", False, dict(T=1024, mode="euler", select="block", causal=False)),
    ("driving, exact, window=16, B=32", False, dict(T=16, B=32, window=16)),
    ("driving, exact, window=16, B=32, eager", True, dict(T=16, B=32, window=16)),
    ("step, exact, inference_mode", False, dict(T=1, window=16, step=True, grad_mode="inference_mode")),
    ("step, exact, no_grad", False, dict(T=1, window=16, step=True, grad_mode="no_grad")),
    ("step, exact, inference_mode, eager", True, dict(T=1, window=16, step=True, grad_mode="inference_mode")),
]


def _against(site: str, rounds: int) -> None:
    """This build and the one in ``site``, alternating in fresh processes (which goes first swaps
    every round), so a machine whose speed drifts slows both alike: min and median of the rounds."""
    import statistics

    print(f"\n### This build against {site} ({rounds} rounds, 1 thread)\n")
    print("| configuration | other build ms (min / median) | this build ms (min / median) | this / other (min) |")
    print("|---|---|---|---|")
    for name, eager, spec in AGAINST:
        ms = {"this": [], "other": []}
        for r in range(rounds):
            for build in (("other", "this") if r % 2 == 0 else ("this", "other")):
                ms[build].append(measure(eager, site if build == "other" else None, impl="nac", **spec)["ms"])
        digits = 3 if spec.get("step") else 2
        shown = {b: f"{min(v):.{digits}f} / {statistics.median(v):.{digits}f}" for b, v in ms.items()}
        print(f"| {name} | {shown['other']} | {shown['this']} | {min(ms['this']) / min(ms['other']):.2f} |")


if __name__ == "__main__":
    main()
