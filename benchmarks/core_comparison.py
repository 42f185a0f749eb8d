"""Temporal cores side by side on CarRacing: same data, same encoder and head, same budget.

    python benchmarks/core_comparison.py --data runs/demos --episodes 20
    python benchmarks/core_comparison.py --data runs/demos --cores nac-exact lstm --episodes 0   # accuracy only

For each core: train with identical arguments (``--epochs`` x ``--windows-per-epoch``
windows of 16 frames, one ``--seed``, the same held-out episodes), report the held-out action
accuracy of the best checkpoint, then (with ``--episodes N``) the closed-loop mean return
on the first N held-out tracks (seeds 900000, ...). Prints one markdown row per core as
soon as it is done, so two invocations with different ``--cores`` can share two CPUs.
"""

from __future__ import annotations

import argparse
import csv

CORE_CHOICES = ("nac-exact", "nac-euler", "nac-steady", "lstm", "gru", "cfc", "ltc", "mha")


def main() -> None:
    from nac_drive.pipeline.drive import DriveArgs, drive_carracing
    from nac_drive.pipeline.train import train
    from nac_drive.pipeline.train_args import CLASS_WEIGHTINGS, TrainArgs

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="CarRacing demonstrations (Minari)")
    parser.add_argument("--out", default="runs/core_comparison")
    parser.add_argument("--cores", nargs="*", default=list(CORE_CHOICES), choices=CORE_CHOICES)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--windows-per-epoch", type=int, default=2048)
    parser.add_argument("--episodes", type=int, default=20, help="held-out tracks to drive (0: skip)")
    parser.add_argument("--class-weighting", default=TrainArgs.class_weighting, choices=CLASS_WEIGHTINGS)
    parser.add_argument("--seed", type=int, default=0, help="training seed (split, sampling, initialisation)")
    args = parser.parse_args()

    print("| core | held-out action accuracy | held-out loss | mean return +- std (tracks) |\n|---|---|---|---|",
          flush=True)
    for name in args.cores:
        core, _, mode = name.partition("-")
        run = train(TrainArgs(data=args.data, out=args.out, run_name=name, core=core, mode=mode or "exact",
                              epochs=args.epochs, windows_per_epoch=args.windows_per_epoch, seed=args.seed,
                              class_weighting=args.class_weighting, progress=False))
        rows = list(csv.DictReader(open(run / "metrics.csv")))
        best = min(rows, key=lambda r: float(r["val_loss"]))
        ret = ""
        if args.episodes > 0:
            s = drive_carracing(DriveArgs(policy=str(run / "best"), episodes=args.episodes), progress=False)
            ret = f"{s['mean_return']:.1f} +- {s['std_return']:.1f} ({s['episodes']})"
        print(f"| {name} | {float(best['val_accuracy']):.3f} | {float(best['val_loss']):.3f} | {ret} |", flush=True)


if __name__ == "__main__":
    main()
