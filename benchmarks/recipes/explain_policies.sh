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
# The NAC-steady policies' 30 demonstrations are collected first, on every core (the three seeds train on
# them); then two lanes, each pinned to one core, take the jobs one at a time, the longest first (lib.bash's
# job_lanes): each NAC-steady policy made and explained, the Udacity and the CarRacing shipped policies, the
# comparison's cores.
# Everything resumes: run the same line again (an explain killed midway goes on with --resume, a
# NAC-steady policy where it stopped).
#
# Time on the 2-core CPU machine, each job pinned to one core beside one other (2026-11-30 to 12-01): a NAC-steady
# policy 26 min (seed 2; seeds 0 and 1 took ~70 min on 11-30); an explain of a NAC CarRacing policy 46-55 min (window
# attribution of 250-271 decisions 13 min, the closed loop's 15 drives of 30 tracks 27 min, the push's 6 drives
# 10 min), of the Udacity one 59 min, of another core 31-34 min (its 7 push drives ~130 s each). Window attribution
# is Integrated Gradients with steps doubled until complete, so each explain attributes every 10th step
# (--window-every 10). About 12 lane-hours in all (6 hours of two lanes).
# What it should score: OUT/tables.md (benchmarks/explain_tables.py, written at the end) whose first table is
# BENCHMARKS.md §7's, the others docs/findings.md's "What the neurons do"; the runs are seeded, not bit-exact.
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
STEADY_DEMOS=$OUT/steady-demos   # the NAC-steady policies' demonstrations, the same for the three seeds

explained() {   # explained DIR COMMAND...: an explain COMMAND into DIR on this lane's core (lib.bash's pinned);
                # a finished one is kept, a killed one resumed
  local dir=$1; shift
  [ -f "$dir/explain.json" ] && return 0
  if [ -d "$dir" ]; then pinned "$LANE" "$@" --resume "$dir"; else pinned "$LANE" "$@" --out "$dir"; fi
}

job() {   # job NAME: the policy NAME made (a NAC-steady one) and explained into OUT/NAME; a finished one is kept
  [ -f "$OUT/$1/explain.json" ] && return 0   # (its NAC-steady policy is not made again either)
  case $1 in
    steady-s*)
      local seed=${1#steady-s}; local made="$OUT/steady-policy-s$seed"
      [ -f "$made/drive.json" ] || pinned "$LANE" bash "$(dirname "$0")/nac_steady_policy.sh" "$made" "$seed" "$STEADY_DEMOS"
      explained "$OUT/$1" nac-drive explain --policy "$made/train/dagger-r9/best" --episodes 3 --closed-loop-tracks 30 \
        --closed-loop-top 5 --closed-loop-random 5 --window-every 10 --json ;;
    carracing-shipped)
      explained "$OUT/$1" nac-drive explain --episodes 3 --closed-loop-tracks 30 --closed-loop-top 5 \
        --closed-loop-random 5 --window-every 10 --json ;;
    udacity-shipped)
      explained "$OUT/$1" nac-drive explain --task udacity --episodes 3 --closed-loop-tracks 30 --closed-loop-top 5 \
        --closed-loop-random 5 --window-every 10 --window-method ablation --json ;;
    core-*)
      explained "$OUT/$1" nac-drive explain --policy "$(compared_policy "${1#core-}")" --episodes 3 \
        --closed-loop-tracks 30 --closed-loop-top 5 --closed-loop-random 5 --window-every 10 --json ;;
    *) echo "explain_policies.sh: no job $1" >&2; return 1 ;;
  esac
}

collected_ppo_demos "$STEADY_DEMOS"   # first, on every core
jobs=(steady-s0 steady-s1 steady-s2 udacity-shipped carracing-shipped)   # the longest first
if [ -n "$REGIME" ]; then
  for core in $CORES; do jobs+=("core-$core"); done
fi
job_lanes job "${jobs[@]}"
python "$(dirname "$0")/../explain_tables.py" --recipe "$OUT" > "$OUT/tables.md.partial"   # §7's tables
mv "$OUT/tables.md.partial" "$OUT/tables.md"
cat "$OUT/tables.md"
