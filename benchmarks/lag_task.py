"""The known-answer task: what the paper's NAC and the variants beyond it reach when only the
input exactly 5 steps back decides the label (tests/support/lag_task.py), beside MHA and GRU.

    python benchmarks/lag_task.py                       # 1500 Adam steps, seeds 0-2 (~25 min on one core)
    python benchmarks/lag_task.py --steps 300 --seeds 1 --json

Every core is the driving policies' own (nac_drive.policy.cores, their defaults: d_model 64,
4 heads, Top-K 8 of a 16-step window, timestamps 1 s apart), with a linear read-out, trained
alike (Adam 3e-3, batches of 32 fresh sequences of 16 steps); accuracy on 512 held-out
sequences' labelled steps (chance 0.5).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import support_path  # noqa: F401  (tests/support on sys.path)

CORES = {"nac (paper)": {}, "nac scaled (beyond the paper)": {"logit_variant": "scaled"},
         "nac qk (beyond the paper)": {"logit_variant": "qk"}, "nac-pw (paper, every key)": {"select": "all"},
         "mha": {"core": "mha"}, "gru": {"core": "gru"}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=1500, help="Adam steps per run")
    p.add_argument("--seeds", type=int, default=3, help="seeds per core (0, 1, ...)")
    p.add_argument("--cores", nargs="+", default=list(CORES), choices=list(CORES), metavar="CORE",
                   help="which of: " + ", ".join(CORES))
    p.add_argument("--json", action="store_true", help="print one JSON line instead of a table")
    args = p.parse_args()

    import torch
    from lag_task import train_lag_task
    from nac_drive.policy.cores import CoreConfig

    torch.set_num_threads(1)
    results = {}
    for name in args.cores:
        accuracies, started = [], time.perf_counter()
        for seed in range(args.seeds):
            accuracies.append(train_lag_task(CoreConfig(**CORES[name], seed=seed), steps=args.steps, seed=seed))
            print(f"{name} seed {seed}: {accuracies[-1]:.3f}", file=sys.stderr, flush=True)
        results[name] = {"accuracy": accuracies, "mean": float(np.mean(accuracies)),
                         "seconds_per_run": (time.perf_counter() - started) / args.seeds}
    if args.json:
        print(json.dumps({"steps": args.steps, "results": results}))
        return 0
    print(f"| core ({args.steps} steps) | accuracy, mean | per seed | s a run |")
    print("|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['mean']:.3f} | {' / '.join(f'{a:.3f}' for a in r['accuracy'])} | "
              f"{r['seconds_per_run']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
