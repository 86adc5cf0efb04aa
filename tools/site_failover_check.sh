#!/bin/bash
# A site's leader killed mid-run, with real peer processes over TCP on this host
# (docs/ALGORITHMS.md, "A leader's death"; the figures in docs/BENCHMARKS.md).
# configs/sites-async.textproto's five peers (eu: eu-0 leads eu-1, eu-2; us: us-0, us-1)
# train adpsgd with site replicas; eu-0 gets SIGKILL after KILL_AFTER_S seconds. Prints
# each survivor's exit status and its site_view, site_leader and end events.
# Usage: tools/site_failover_check.sh [BUILD_DIR] [OUT_DIR]
set -u
build=${1:-build}
out=${2:-/tmp/hearsay-site-failover}
kill_after_s=${KILL_AFTER_S:-2.5}
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell} OPENBLAS_NUM_THREADS=1
export HEARSAY_SECRET=${HEARSAY_SECRET:-site-failover-check-secret-0123456789}
cd "$(dirname "$0")/.."
mkdir -p "$out" && rm -f "$out"/*.jsonl "$out"/*.err
set_fragment='cluster { site_replicas: true gossip { algorithm: "adpsgd" sync_timeout_s: 1 } } train { epochs: 4 target_test_acc: 0 }'
declare -A pid
peers=(eu-0 eu-1 eu-2 us-0 us-1)
trap 'kill -9 "${pid[@]}" 2>/dev/null' EXIT
for p in "${peers[@]}"; do
  "$build/bin/hearsay-peer" --config configs/sites-async.textproto --peer "$p" --set "$set_fragment" \
    --log "$out/$p.jsonl" --quiet 2>"$out/$p.err" &
  pid[$p]=$!
done
sleep "$kill_after_s"
kill -9 "${pid[eu-0]}"
echo "killed eu-0 (its site's leader) after ${kill_after_s} s"
status=0
for p in eu-1 eu-2 us-0 us-1; do
  # Bounded: a survivor that hangs is killed and counts as a failure.
  for _ in $(seq 1 1200); do kill -0 "${pid[$p]}" 2>/dev/null || break; sleep 0.1; done
  kill -9 "${pid[$p]}" 2>/dev/null
  wait "${pid[$p]}"; rc=$?
  echo "$p exit $rc"
  [ "$rc" = 0 ] || status=1
  grep -h '"event":"\(site_view\|site_leader\|end\)"' "$out/$p.jsonl" | cut -c1-220
done
exit $status
