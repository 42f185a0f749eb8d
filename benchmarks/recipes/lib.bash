# Functions the recipes share (sourced by them, never run alone).

# allowed_cores: the CPUs this shell may run on, space-separated (nac_drive.torch_threads.allowed_cores)
allowed_cores() {
  python3 -c 'from nac_drive.torch_threads import allowed_cores; print(*allowed_cores())'
}

# pinned LANE COMMAND...: COMMAND on the LANE-th core it may use (taskset), where there are two or more and taskset;
# else as it is. Two lanes of jobs side by side each get a core and so one torch thread; unpinned, each job starts a
# thread per core, and jobs that shared the cores that way ran up to 10x slower (a Udacity trial at 19-21 frames/s
# beside three jobs, 223 alone).
pinned() {
  local lane=$1 cores; shift
  read -r -a cores <<< "$(allowed_cores)"
  if [ "${#cores[@]}" -ge 2 ] && [ "$lane" -lt "${#cores[@]}" ] && command -v taskset >/dev/null; then
    taskset -c "${cores[$lane]}" "$@"
  else
    "$@"
  fi
}

# start_lane COMMAND...: COMMAND in the background, in a process group of its own (set -m), so that a Ctrl-C or a
# TERM to the recipe stops every job of every lane (a script's background jobs ignore SIGINT and would run on, and a
# recipe run again would start them twice). wait_lanes waits for them all: its status is the first failure's.
LANES=()
start_lane() {
  set -m
  "$@" &
  LANES+=($!)
  # only the lane needs a group of its own: left on, job control takes a command of the recipe that is stopped and
  # continued (SIGSTOP/SIGCONT, as a scheduler suspends a job) for a finished one, ends the recipe and TERMs the command
  set +m
  trap 'stop_lanes; exit 130' INT TERM
}
stop_lanes() {
  local p
  for p in "${LANES[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
}
wait_lanes() {
  local p s rc=0
  for p in "${LANES[@]}"; do
    wait "$p" && s=0 || s=$?
    [ "$rc" -ne 0 ] || rc=$s
  done
  LANES=()
  trap - INT TERM
  return "$rc"
}

# job_lanes FUNCTION ARG...: FUNCTION ARG once for each ARG, by two lanes side by side (start_lane): a lane that is
# free takes the next ARG of the list that no lane has taken (an atomic mkdir claims it). In FUNCTION, LANE is the
# lane it runs on (0 or 1, for pinned). List the longest jobs first, so that no lane is left alone with a long one at
# the end. Status: the first failing lane's.
job_lanes() {
  local claims rc=0; claims=$(mktemp -d)
  start_lane _lane_jobs 0 "$claims" "$@"
  start_lane _lane_jobs 1 "$claims" "$@"
  wait_lanes || rc=$?
  rm -r "$claims"
  return "$rc"
}
_lane_jobs() {   # _lane_jobs LANE CLAIMS FUNCTION ARG...: one lane of job_lanes
  LANE=$1
  local claims=$2 function=$3 i=0 arg; shift 3
  for arg in "$@"; do
    i=$((i + 1))
    mkdir "$claims/$i" 2>/dev/null || continue
    "$function" "$arg"
  done
}

# collected_ppo_demos DIR: 30 CarRacing demonstrations of the shipped PPO expert (the standard budget of
# `nac-drive quickstart --full`), collected on every core into DIR.partial, then renamed; an existing DIR is kept.
collected_ppo_demos() {
  local dir=$1
  [ -d "$dir" ] && return 0
  rm -rf "$dir.partial"
  nac-drive collect carracing --expert ppo --episodes 30 --out "$dir.partial" --name steady --workers "$(allowed_cores | wc -w)"
  mv "$dir.partial" "$dir"
}

# record_udacity_tracks DIR [FRAMES]: the emulator's scripted driver, FRAMES (default 1000) frames on each of
# gentle, lakeside and canyon, and on the 4 random tracks with more steering noise (benchmarks/recipes/udacity_policy.sh
# records 3000), one recording folder each under DIR. Recorded whole into DIR.partial, then renamed: a killed recipe
# records them again; an existing DIR is kept.
UDACITY_NAMED_TRACKS="gentle lakeside canyon"
record_udacity_tracks() {
  local dir=$1 frames=${2:-1000} track
  [ -d "$dir" ] && return 0
  rm -rf "$dir.partial"
  for track in $UDACITY_NAMED_TRACKS; do
    nac-drive collect udacity --driver scripted --out "$dir.partial/$track" --track "$track" --frames "$frames" --seed 1
  done
  for track in random-11 random-12 random-13 random-14; do
    nac-drive collect udacity --driver scripted --out "$dir.partial/$track" --track "$track" --frames "$frames" \
      --seed 2 --noise 0.5
  done
  mv "$dir.partial" "$dir"
}

# resumed_train OUT RUN FLAGS...: nac-drive train FLAGS into OUT/RUN, going on from its last epoch where a killed run
# left one (a finished run: nothing left to train), else anew (a run killed before its first epoch ended is removed,
# so that it is never trained again beside itself in RUN-2).
resumed_train() {
  local out=$1 run=$2 resume=(--resume); shift 2
  [ -f "$out/$run/last/train_state.json" ] || { resume=(); rm -rf "${out:?}/$run"; }
  nac-drive train --out "$out" --run-name "$run" "${resume[@]}" "$@"
}
