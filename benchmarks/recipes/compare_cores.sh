#!/usr/bin/env bash
# Rebuilds the first comparison of docs/findings.md ("Temporal cores by behaviour cloning alone"):
# every temporal core of `nac-drive compare` (the NAC's modes, the paper's ablations that apply to
# this layer, lstm, gru, cfc, ltc, mha), seeds 0 1 2, on the same data and budget, CarRacing then
# Udacity; each comparison writes compare.json and compare.md.
#
#   bash benchmarks/recipes/compare_cores.sh [OUT]      # OUT: a new folder (default runs/recipe-compare)
#
# CarRacing: 20 teacher demonstrations (tracks 100000-100019), 5 epochs x 4096 windows of 16
# frames; each trained policy drives the 20 held-out tracks 900000-900019.
# Udacity: the emulator's scripted driver, 1000 frames on each of gentle, lakeside, canyon and
# the 4 random tracks (more steering noise), as benchmarks/recipes/udacity_policy.sh records them
# at 3000; 4 epochs x 2048 windows of 16 frames (the default window, above Top-K 8, so NAC-PW differs
# from the exact mode); each trained policy drives the 5 held-out emulator tracks for 2700 frames, a lap of each.
#
# Time on the 2-core CPU machine: CarRacing about 2 hours (a pair of runs every ~6 min with
# --workers 2), Udacity about 4 hours (a pair every 10-16 min), collection a few minutes each.
# A killed comparison resumes where it stopped: run its `nac-drive compare` line again.
#
# What it should score: the figures of that table, within their intervals; they are means
# over 3 seeds, and one seed of a run on other hardware or another torch build trains differently.
set -euo pipefail
source "$(dirname "$0")/lib.bash"

OUT=${1:-runs/recipe-compare}
if [ -e "$OUT" ]; then echo "$OUT exists: give a new folder" >&2; exit 1; fi
CAR="$OUT/carracing-demos"
UDA="$OUT/udacity-data"

nac-drive collect carracing --expert teacher-discrete --episodes 20 --out "$CAR"
V="nac-exact nac-euler nac-steady nac-pw nac-2k nac-02s nac-09s lstm gru cfc ltc mha"   # the variants that table reports
nac-drive compare --data "$CAR" --out "$OUT/compare-carracing" --epochs 5 --windows-per-epoch 4096 \
  --episodes 20 --workers 2 --variants $V --json

record_udacity_tracks "$UDA"
nac-drive compare --data "$UDA" --out "$OUT/compare-udacity" --epochs 4 --windows-per-epoch 2048 \
  --episodes 5 --max-steps 2700 --workers 2 --variants $V --json
