#!/bin/bash
# Whether two builds train the same: runs each config of tests/sim/identity (every
# algorithm, site replicas under six of them, the sparse ones) on the simulator with each
# build's programs and compares every peer's log byte for byte. A refactor that means to
# change nothing must leave them identical (issue 40: the engine split, site replicas as a
# wrapper). Usage: tools/same_logs.sh OLD_BIN_DIR NEW_BIN_DIR [EVENT...], e.g. a worktree
# of the last commit built with `cmake --build B --target hearsay-sim hearsay-peer`, and
# build/bin. Events of the kinds named after the directories are left out of both sides
# first (a change that adds an event, e.g. `memory`, and means to change nothing else).
set -euo pipefail
old=$1 new=$2
shift 2
except=("$@")
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d /tmp/hearsay-same-logs-XXXXXX)
trap 'rm -rf "$out"' EXIT
export HEARSAY_TEST_SIM_SECRET=the-secret-of-the-identity-runs OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell}
status=0
for config in "$here"/tests/sim/identity/*.textproto; do
  name=$(basename "$config" .textproto)
  for side in old new; do
    bin=$([ $side = old ] && echo "$old" || echo "$new")
    "$bin/hearsay-run" "$config" --out-dir "$out/$side/$name" --plain > "$out/$side-$name.log" 2>&1 ||
      { echo "$name: the $side build's run failed:"; tail -n 5 "$out/$side-$name.log"; exit 2; }
  done
  a=$(ls -d "$out"/old/"$name"/*/) b=$(ls -d "$out"/new/"$name"/*/)
  logs=0 differ=0
  while read -r f; do
    logs=$((logs + 1))
    if [ ${#except[@]} -gt 0 ]; then
      for side in "$a" "$b"; do
        /usr/bin/python3 -c '
import json, sys
path, drop = sys.argv[1], set(sys.argv[2:])
lines = [l for l in open(path) if json.loads(l).get("event") not in drop]
open(path, "w").writelines(lines)' "$side/$f" "${except[@]}"
      done
    fi
    if ! cmp -s "$a/$f" "$b/$f"; then differ=$((differ + 1)); echo "$name: $f differs"; fi
  done < <(cd "$a" && find . -name '*.jsonl' | sort)
  echo "$name: $logs logs, $differ differ"
  [ "$differ" -eq 0 ] || status=1
done
exit $status
