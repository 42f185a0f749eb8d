#!/usr/bin/env bash
# Rebuilds the shipped PilotNet+NAC Udacity policy, nac_drive/assets/policy_udacity_nac (shipped at
# 9a7dd8b, 2026-11-22: the best checkpoint of the second stage, udacity-nac-v2, after epoch 4 of 6),
# and scores it on 3 laps of the held-out emulator track serpentine (docs/findings.md); or the same with
# another temporal core.
#
#   bash benchmarks/recipes/udacity_policy.sh [OUT] [CORE] [DATA]
#   # OUT: a folder (default runs/recipe-udacity); CORE: the temporal core (default nac: the shipped policy; the
#   # regime comparison makes cfc, gru and mha this way too, BENCHMARKS.md §11); DATA: where the 7 recordings are
#   # (default OUT/data; several cores' runs can share one); PORT (environment): the bridge's port (default 4572)
#
# Stages: the emulator's scripted driver records 3000 frames on each of 7 tracks; stage 1 (OUT/train/udacity-CORE-v1)
# trains on the named tracks gentle, lakeside and canyon; stage 2 (udacity-CORE-v2) goes on from it on all 7 (the 4
# random tracks recorded with more steering noise, --noise 0.5). Everything resumes: run the same line again (a
# stage killed midway goes on from its last epoch; serpentine's score is kept in OUT/serpentine.json).
#
# Time on the 2-core CPU machine: the recordings ~2 min; PilotNet trains at ~220-240 frames/s on one core, so the two
# stages' 6 x 1024 and 6 x 1536 windows of 16 frames take ~25 min (cfc, 2026-11-30, beside other jobs); the evaluation
# runs in real time (15 telemetry messages a second: 3 laps of serpentine, ~7700 messages, ~9 min).
#
# What it should score: the shipped checkpoint drove 3 laps of serpentine, 0 off-road events, mean
# |cross-track error| 0.045 m (max 0.151 m). One seed; with CORE gru (shipped beside: policy_udacity_gru) /
# cfc / mha 0.033 / 0.053 / 0.893 m (2026-11-30; the defaults did not train mha: validation loss 0.12).
set -euo pipefail

source "$(dirname "$0")/lib.bash"

OUT=${1:-runs/recipe-udacity}
CORE=${2:-nac}
DATA=${3:-$OUT/data}
PORT=${PORT:-4572}
T="$OUT/train"
NAMED="$OUT/data-named"   # stage 1's data: the named tracks' recordings, hard-linked
mkdir -p "$OUT"

record_udacity_tracks "$DATA" 3000
if [ ! -d "$NAMED" ]; then
  rm -rf "$NAMED.partial" && mkdir "$NAMED.partial"
  for track in $UDACITY_NAMED_TRACKS; do cp -al "$DATA/$track" "$NAMED.partial/$track"; done
  mv "$NAMED.partial" "$NAMED"
fi
resumed_train "$T" "udacity-$CORE-v1" --data "$NAMED" --core "$CORE" --window 16 --epochs 6 --windows-per-epoch 1024 \
  --batch-size 16 --seed 0
resumed_train "$T" "udacity-$CORE-v2" --data "$DATA" --init-from "$T/udacity-$CORE-v1/best" --window 16 --epochs 6 \
  --windows-per-epoch 1536 --batch-size 16 --seed 1

# Closed loop: the bridge drives the policy, the emulator plays the simulator on the held-out track.
[ -f "$OUT/serpentine.json" ] && { cat "$OUT/serpentine.json"; exit 0; }
nac-drive drive udacity --policy "$T/udacity-$CORE-v2/best" --port "$PORT" --json &
bridge=$!
until (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; do
  kill -0 "$bridge"   # the bridge failed to start: stop here
  sleep 1
done
nac-drive sim udacity-emulator --port "$PORT" --track serpentine --laps 3 --stop-off-road --realtime --json \
  | tail -n 1 > "$OUT/serpentine.json.partial"
kill "$bridge" 2>/dev/null || true
wait "$bridge" || true
mv "$OUT/serpentine.json.partial" "$OUT/serpentine.json"
cat "$OUT/serpentine.json"
