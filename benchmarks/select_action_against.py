"""``select_action`` of the shipped CarRacing policy: this build against another one.

    git worktree add /tmp/old <commit> && pip install --no-deps --target /tmp/old-site /tmp/old
    python benchmarks/select_action_against.py --against /tmp/old-site --rounds 5

Each round measures both builds in fresh processes (which goes first swaps every round), so a
machine whose speed drifts slows both alike. A measurement: one thread, random 96x96 frames,
100 frames of warm-up (the window is full), then the median over 500 frames. Only the API both
builds share is used (``nac_drive.DrivingPolicy``, ``shipped_policy_path``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def measure_here(frames: int = 500) -> float:
    """ms a ``select_action`` (median), with the nac_drive this process imports."""
    import numpy as np
    import torch

    from nac_drive import DrivingPolicy
    from nac_drive.policy.loading import shipped_policy_path

    torch.set_num_threads(1)
    policy = DrivingPolicy.from_pretrained(shipped_policy_path("carracing")).eval()
    images = np.random.default_rng(0).integers(0, 256, (100 + frames, 96, 96, 3), dtype=np.uint8)
    policy.reset()
    for image in images[:100]:
        policy.select_action(image)
    times = []
    for image in images[100:]:
        t0 = time.perf_counter()
        policy.select_action(image)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def measure(site: str | None) -> float:
    env = dict(os.environ)
    if site:
        env["PYTHONPATH"] = os.pathsep.join([site, env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, __file__, "--child"], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["ms"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", required="--child" not in sys.argv,
                        help="a folder holding another nac-drive build (pip install --no-deps --target)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps({"ms": measure_here()}))
        return
    ms = {"this": [], "other": []}
    for r in range(args.rounds):
        for build in (("other", "this") if r % 2 == 0 else ("this", "other")):
            ms[build].append(measure(args.against if build == "other" else None))
    print(f"| shipped CarRacing policy, select_action (1 thread) | ms, min / median of {args.rounds} rounds |")
    print("|---|---|")
    for build, label in (("other", f"other build ({args.against})"), ("this", "this build")):
        print(f"| {label} | {min(ms[build]):.3f} / {statistics.median(ms[build]):.3f} |")
    print(f"| this / other (min) | {min(ms['this']) / min(ms['other']):.2f} |")


if __name__ == "__main__":
    main()
