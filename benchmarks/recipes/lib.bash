# Functions the recipes share (sourced by them, never run alone).

# pinned CORE COMMAND...: COMMAND on that one core (taskset where there is one). Two lanes of jobs side by side
# each get a core and so one torch thread; unpinned, each job starts a thread per core, and jobs that share the
# cores that way were measured up to 10x slower (a Udacity trial at 19-21 frames/s beside three jobs, 223 alone).
pinned() {
  local core=$1; shift
  if command -v taskset >/dev/null; then taskset -c "$core" "$@"; else "$@"; fi
}

# record_udacity_tracks DIR: the emulator's scripted driver, 1000 frames on each of gentle, lakeside
# and canyon, and on the 4 random tracks with more steering noise (as benchmarks/recipes/udacity_policy.sh
# records them at 3000), one recording folder each under DIR. Recorded whole into DIR.partial, then
# renamed: a killed recipe records them again; an existing DIR is kept.
record_udacity_tracks() {
  local dir=$1 track
  [ -d "$dir" ] && return 0
  rm -rf "$dir.partial"
  for track in gentle lakeside canyon; do
    nac-drive collect udacity --driver scripted --out "$dir.partial/$track" --track "$track" --frames 1000 --seed 1
  done
  for track in random-11 random-12 random-13 random-14; do
    nac-drive collect udacity --driver scripted --out "$dir.partial/$track" --track "$track" --frames 1000 --seed 2 \
      --noise 0.5
  done
  mv "$dir.partial" "$dir"
}
