#!/usr/bin/env bash
# Rebuilds the shipped PilotNet+NAC Udacity policy, nac_drive/assets/policy_udacity_nac (shipped at
# 9a7dd8b, 2026-11-22: the best checkpoint of the second stage, udacity-nac-v2, after epoch 4 of 6),
# and scores it as BENCHMARKS.md §4 does: 3 laps of the held-out emulator track serpentine.
#
#   bash benchmarks/recipes/udacity_policy.sh [OUT]      # OUT: a new folder (default runs/recipe-udacity)
#
# Stages: the emulator's scripted driver records 3000 frames on each of 7 tracks; stage 1 trains on
# the named tracks gentle, lakeside and canyon; stage 2 goes on from it on all 7 (the 4 random tracks
# recorded with more steering noise, --noise 0.5).
#
# Time on the 2-core CPU machine: not timed when it was made. PilotNet trains at ~240 frames/s
# here (docs/findings.md, "Channels-last convolutions"), so the two stages' 6 x 1024 and 6 x 1536
# windows of 16 frames take about 17 min (an estimate); the evaluation runs in real time (15
# telemetry messages a second: 3 laps of serpentine, ~7700 messages, ~9 min). About 30 min in all.
#
# What it should score: the shipped checkpoint drove 3 laps of serpentine, 0 off-road events, mean
# |cross-track error| 0.045 m (max 0.151 m). One seed; the same recipe with --core lstm / mha gave
# 0.048 / 0.039 m.
set -euo pipefail

OUT=${1:-runs/recipe-udacity}
if [ -e "$OUT" ]; then echo "$OUT exists: give a new folder" >&2; exit 1; fi
D="$OUT/data"
T="$OUT/train"
PORT=4572

for track in gentle lakeside canyon; do
  nac-drive collect udacity --driver scripted --out "$D/$track" --track "$track" --frames 3000 --seed 1
done
nac-drive train --data "$D" --out "$T" --core nac --window 16 --epochs 6 --windows-per-epoch 1024 \
  --batch-size 16 --seed 0
for track in random-11 random-12 random-13 random-14; do
  nac-drive collect udacity --driver scripted --out "$D/$track" --track "$track" --frames 3000 --seed 2 \
    --noise 0.5
done
nac-drive train --data "$D" --out "$T" --run-name udacity-nac-v2 --init-from "$T/udacity__nac-exact__w16__s0/best" \
  --window 16 --epochs 6 --windows-per-epoch 1536 --batch-size 16 --seed 1

# Closed loop: the bridge drives the policy, the emulator plays the simulator on the held-out track.
nac-drive drive udacity --policy "$T/udacity-nac-v2/best" --port "$PORT" --json &
bridge=$!
until (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; do
  kill -0 "$bridge"   # the bridge failed to start: stop here
  sleep 1
done
nac-drive sim udacity-emulator --port "$PORT" --track serpentine --laps 3 --stop-off-road --realtime --json
kill "$bridge" 2>/dev/null || true
wait "$bridge" || true
