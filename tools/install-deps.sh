#!/bin/sh
# Installs the Debian packages listed in the given files (default deps/debian-packages.txt)
# that are not installed yet. Idempotent and silent when nothing is missing.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
lists=${*:-$here/deps/debian-packages.txt}
missing=""
for pkg in $(cat $lists | sed 's/#.*//'); do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing="$missing $pkg"
  fi
done
[ -z "$missing" ] && exit 0
echo "install-deps: installing:$missing"
if [ "$(id -u)" != 0 ]; then
  echo "install-deps: not root; run as root or install these packages:$missing" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null || { echo "install-deps: apt-get update failed" >&2; exit 1; }
apt-get install -y -q --no-install-recommends $missing
