#!/usr/bin/env bash
# Makes a NAC-steady CarRacing policy of BENCHMARKS.md §7 (not shipped: the paper's Fig. 4 model,
# made to test the Fig. 4 claim on the kind of model the paper used). The recipe is
# `nac-drive quickstart --full`'s standard budget, stage by stage, with --mode steady; SEED seeds the
# training and the DAgger rounds (the demonstrations are the same 30 tracks for every seed: DEMOS, an
# earlier run's OUT/collected, is read instead of collecting them again).
# benchmarks/recipes/explain_policies.sh makes seeds 0, 1 and 2 this way and explains them.
#
#   bash benchmarks/recipes/nac_steady_policy.sh [OUT] [SEED] [DEMOS]   # OUT default runs/recipe-nac-steady; SEED 0
#
# Its policy: OUT/train/dagger-r9/best; OUT/drive.json once it is whole. Every stage resumes: run the
# same line again after a kill (the collection is made again, behaviour cloning and the DAgger rounds
# go on where they stopped).
# Time on the 2-core CPU machine: about 85 min alongside other jobs (2026-11-27; the standard
# quickstart takes 36-44 min alone); without the collection (DEMOS) a few minutes less.
#
# What it should score (seed 0): 882.6 +- 103.8, 14/20 laps on the 20 held-out tracks (one run; the
# shipped mode-exact policy of the time: 883.2 +- 48.2).
set -euo pipefail
source "$(dirname "$0")/lib.bash"

OUT=${1:-runs/recipe-nac-steady}
SEED=${2:-0}
COLLECTED=${3:-$OUT/collected}
mkdir -p "$OUT"

# Each folder is whole or not there: made under a .partial name, then renamed.
collected_ppo_demos "$COLLECTED"
if [ ! -d "$OUT/demos" ]; then   # the training data, DAgger's rounds added: the collection hard-linked, never written
  rm -rf "$OUT/demos.partial"
  cp -al "$COLLECTED" "$OUT/demos.partial"
  mv "$OUT/demos.partial" "$OUT/demos"
fi
resumed_train "$OUT/train" bc-steady --data "$OUT/demos" --core nac --mode steady --epochs 10 --windows-per-epoch 4096 \
  --seed "$SEED"
nac-drive dagger --policy "$OUT/train/bc-steady/best" --data "$OUT/demos" --rounds 10 --episodes 4 \
  --disturb-rate 0.02 --disturb-frames 8 --oracle ppo --epochs 3 --windows-per-epoch 3072 --lr 2e-4 --seed "$SEED" \
  --out "$OUT/train" --run-name dagger --resume
nac-drive drive carracing --policy "$OUT/train/dagger-r9/best" --episodes 20 --json | tail -n 1 > "$OUT/drive.json.partial"
mv "$OUT/drive.json.partial" "$OUT/drive.json"
cat "$OUT/drive.json"
