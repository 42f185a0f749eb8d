#!/usr/bin/env bash
# BENCHMARKS.md §7 (issue 54): `nac-drive explain` on the shipped CarRacing and Udacity policies, on
# three NAC-steady CarRacing policies (seeds 0-2, benchmarks/recipes/nac_steady_policy.sh), and on the
# seed-0 policy of every core of the regime comparison (benchmarks/recipes/compare_regime.sh: its last
# DAgger round's, so every core is explained alike, trained alike; its mha one ships as `shipped:mha`).
#
#   bash benchmarks/recipes/explain_policies.sh [OUT] [REGIME]
#   # OUT: a folder (default runs/recipe-explain); REGIME: compare_regime.sh's folder (without it, the
#   # comparison's cores are left out)
#
# Each explain traces 3 held-out tracks x 1000 frames and drives 30 held-out tracks in closed loop:
# intact, with the 5 neurons whose silencing costs most and 5 others clamped and each part of the
# attention replaced (NAC cores), and pushed along the curvature probe (every core). Udacity's window
# attribution removes one frame at a time (ablation), as §7 has done since it first ran.
# Two lanes, each pinned to one core (lib.bash): the shipped policies and the NAC-steady ones; the comparison's cores
# (without REGIME, one lane on every core).
# Everything resumes: run the same line again (an explain killed midway goes on with --resume, a
# NAC-steady policy where it stopped; seeds 1 and 2 train on seed 0's demonstrations).
#
# Time on the 2-core CPU machine: a NAC-steady policy about 85 min; an explain not measured yet at
# 30 tracks (about 22 drives of 30 tracks each). Its window attribution (Integrated Gradients, steps
# doubled until complete) took 1.7 s a traced step for the shipped CarRacing policy and 4.3 s for the
# comparison's mha one, beside three other jobs (2026-11-30): 1.4-3.6 hours of the 3000 steps, so each
# explain attributes every 10th step (--window-every 10: 300 decisions).
# What it should score: not known yet, it has not run to the end; §7's tables are rewritten from its last step's
# OUT/tables.md (benchmarks/explain_tables.py).
set -euo pipefail
source "$(dirname "$0")/lib.bash"

OUT=${1:-runs/recipe-explain}
REGIME=${2:-}
CORES="nac-exact nac-scaled nac-qk cfc gru lstm mha"
compared_policy() { echo "$REGIME/compare/runs/${1}__s0-dagger-r4/best"; }
for core in $CORES; do   # before hours of work: every compared core's policy is there
  if [ -n "$REGIME" ] && [ ! -f "$(compared_policy "$core")/model.safetensors" ]; then
    echo "$REGIME has no seed-0 policy of $core ($(compared_policy "$core")): run compare_regime.sh first" >&2
    exit 1
  fi
done
mkdir -p "$OUT"

explained() {   # explained LANE DIR COMMAND...: an explain COMMAND into DIR on that lane's core (lib.bash's pinned);
                # a finished one is kept, a killed one resumed
  local lane=$1 dir=$2; shift 2
  [ -f "$dir/explain.json" ] && return 0
  if [ -d "$dir" ]; then on_lane "$lane" "$@" --resume "$dir"; else on_lane "$lane" "$@" --out "$dir"; fi
}

on_lane() {   # on_lane LANE COMMAND...: pinned to the lane's core when both lanes run, else on every core
  local lane=$1; shift
  if [ -n "$REGIME" ]; then pinned "$lane" "$@"; else "$@"; fi
}

shipped_and_steady() {   # on core 0
  explained 0 "$OUT/carracing-shipped" nac-drive explain --episodes 3 --closed-loop-tracks 30 --closed-loop-top 5 \
    --closed-loop-random 5 --window-every 10 --json
  explained 0 "$OUT/udacity-shipped" nac-drive explain --task udacity --episodes 3 --closed-loop-tracks 30 \
    --closed-loop-top 5 --closed-loop-random 5 --window-every 10 --window-method ablation --json
  local seed made demos=""
  for seed in 0 1 2; do
    made="$OUT/steady-policy-s$seed"
    [ -f "$made/drive.json" ] || on_lane 0 bash "$(dirname "$0")/nac_steady_policy.sh" "$made" "$seed" $demos
    demos="$OUT/steady-policy-s0/collected"
    explained 0 "$OUT/steady-s$seed" nac-drive explain --policy "$made/train/dagger-r9/best" --episodes 3 \
      --closed-loop-tracks 30 --closed-loop-top 5 --closed-loop-random 5 --window-every 10 --json
  done
}

compared_cores() {   # on core 1
  [ -n "$REGIME" ] || return 0
  local core
  for core in $CORES; do
    explained 1 "$OUT/core-$core" nac-drive explain --policy "$(compared_policy "$core")" \
      --episodes 3 --closed-loop-tracks 30 --closed-loop-top 5 --closed-loop-random 5 --window-every 10 --json
  done
}

start_lane shipped_and_steady
start_lane compared_cores
wait_lanes
python "$(dirname "$0")/../explain_tables.py" --recipe "$OUT" > "$OUT/tables.md.partial"   # §7's tables
mv "$OUT/tables.md.partial" "$OUT/tables.md"
cat "$OUT/tables.md"
