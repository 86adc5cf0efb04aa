#!/bin/bash
# Whether two builds train the same: runs each config of tests/sim/identity (every
# algorithm, site replicas under six of them, the sparse ones) on the simulator with each
# build's programs and compares every peer's log byte for byte. A refactor that means to
# change nothing must leave them identical (issue 40: the engine split, site replicas as a
# wrapper). Usage: tools/same_logs.sh OLD_BIN_DIR NEW_BIN_DIR, e.g. a worktree of the last
# commit built with `cmake --build B --target hearsay-sim hearsay-peer`, and build/bin.
set -euo pipefail
old=$1 new=$2
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
    if ! cmp -s "$a/$f" "$b/$f"; then differ=$((differ + 1)); echo "$name: $f differs"; fi
  done < <(cd "$a" && find . -name '*.jsonl' | sort)
  echo "$name: $logs logs, $differ differ"
  [ "$differ" -eq 0 ] || status=1
done
exit $status
