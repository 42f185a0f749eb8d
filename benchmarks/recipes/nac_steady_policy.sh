#!/usr/bin/env bash
# Makes a NAC-steady CarRacing policy of BENCHMARKS.md §7 (not shipped: the paper's Fig. 4 model,
# made to test the Fig. 4 claim on the kind of model the paper used). The recipe is
# `nac-drive quickstart --full`'s standard budget, stage by stage, with --mode steady; SEED seeds the
# training and the DAgger rounds (the demonstrations are the same 30 tracks for every seed).
# benchmarks/recipes/explain_policies.sh makes seeds 0, 1 and 2 this way and explains them.
#
#   bash benchmarks/recipes/nac_steady_policy.sh [OUT] [SEED]   # OUT: a new folder (default runs/recipe-nac-steady); SEED 0
#
# Its policy: OUT/train/dagger-r9/best. Time on the 2-core CPU machine: about 85 min alongside other
# jobs (2026-11-27; the standard quickstart takes 36-44 min alone).
#
# What it should score (seed 0): 882.6 +- 103.8, 14/20 laps on the 20 held-out tracks (one run; the
# shipped mode-exact policy of the time: 883.2 +- 48.2).
set -euo pipefail

OUT=${1:-runs/recipe-nac-steady}
SEED=${2:-0}
if [ -e "$OUT" ]; then echo "$OUT exists: give a new folder" >&2; exit 1; fi

nac-drive collect carracing --expert ppo --episodes 30 --out "$OUT/demos" --name "steady-s$SEED" --workers 2
nac-drive train --data "$OUT/demos" --core nac --mode steady --epochs 10 --windows-per-epoch 4096 --seed "$SEED" \
  --out "$OUT/train" --run-name bc-steady
nac-drive dagger --policy "$OUT/train/bc-steady/best" --data "$OUT/demos" --rounds 10 --episodes 4 \
  --disturb-rate 0.02 --disturb-frames 8 --oracle ppo --epochs 3 --windows-per-epoch 3072 --lr 2e-4 --seed "$SEED" \
  --out "$OUT/train" --run-name dagger
nac-drive drive carracing --policy "$OUT/train/dagger-r9/best" --episodes 20 --json
