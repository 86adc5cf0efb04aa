#!/bin/bash
# Launches every peer of a cluster config as its own process on this machine, waits for
# them, and prints a summary. (The experiment runner, hearsay-run, will replace this.)
#   experiments/launch_local.sh CONFIG [OUT_DIR] [--set FRAGMENT]...
# The cluster secret is taken from HEARSAY_SECRET, or made up for this run.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
peer_bin=${HEARSAY_PEER:-$here/build/bin/hearsay-peer}
config=${1:?usage: launch_local.sh CONFIG [OUT_DIR] [--set FRAGMENT]...}
shift
out="runs/$(basename "$config" .textproto)-$(date +%Y%m%d-%H%M%S)"
if [ $# -gt 0 ] && [ "${1:0:2}" != "--" ]; then out=$1; shift; fi
extra=("$@")
export HEARSAY_SECRET=${HEARSAY_SECRET:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}
peers=$("$peer_bin" --config "$config" "${extra[@]}" --list-peers) || exit 2
mkdir -p "$out"
pids=()
for p in $peers; do
  "$peer_bin" --config "$config" "${extra[@]}" --peer "$p" --quiet --log "$out/$p.jsonl" >"$out/$p.out" 2>"$out/$p.err" &
  pids+=($!)
done
trap 'kill -TERM "${pids[@]}" 2>/dev/null' INT TERM
status=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    status=1
    echo "launch_local: a peer failed; the tail of its stderr:" >&2
    tail -n 5 "$out/$(echo $peers | cut -d' ' -f$((i + 1))).err" >&2
  fi
done
/usr/bin/python3 "$here/experiments/summarize.py" "$out"
exit $status
