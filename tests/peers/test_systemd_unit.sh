#!/bin/bash
# The shipped unit (peers/systemd/hearsay-peer@.service) as systemd reads it: with its
# ExecStart pointed at the hearsay-peer just built, `systemd-analyze verify` must accept it
# without a word (a warning, such as a misspelt setting systemd ignores, fails the test).
# Exit 77 (skipped) where systemd-analyze is not installed. Running the unit needs systemd
# as PID 1, which this machine's containers do not have (docs/OPERATIONS.md).
set -uo pipefail
unit="$1/peers/systemd/hearsay-peer@.service"
bin="$2/hearsay-peer"
command -v systemd-analyze > /dev/null || { echo "SKIPPED: no systemd-analyze"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
sed "s|/usr/local/bin/hearsay-peer|$bin|" "$unit" > "$dir/hearsay-peer@.service"
grep -q "ExecStart=$bin " "$dir/hearsay-peer@.service" || { echo "the unit's ExecStart is not /usr/local/bin/hearsay-peer"; exit 1; }
out=$(systemd-analyze verify "$dir/hearsay-peer@.service" 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] && [ -z "$out" ]
