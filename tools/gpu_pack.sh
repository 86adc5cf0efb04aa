#!/bin/bash
# Packs what tools/gpu_check.sh needs on a GPU machine that has the NVIDIA driver and CUDA
# libraries but none of hearsay's Debian packages: the CUDA-enabled peer, bench and GPU
# test binaries from BUILD (default build/), the non-system libraries they load (OpenBLAS,
# protobuf, libfabric, ...; never libc, libstdc++ or the CUDA libraries, which the GPU
# machine's own driver and toolkit must match), Fashion-MNIST and the KJV text.
# Usage: tools/gpu_pack.sh [BUILD] [DEST]  ->  DEST/hearsay-gpu.tar.xz (default .gpu/)
set -euo pipefail
build=${1:-build}
dest=${2:-.gpu}
ldd "$build/bin/hearsay-peer" 2>/dev/null | grep -q libcudart || {
  echo "gpu_pack: $build has no CUDA backend (configure with HEARSAY_CUDA=ON and build first)" >&2
  exit 2
}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/tests" "$stage/lib" "$stage/data/fashion-mnist" "$dest"
cp "$build/bin/hearsay-peer" "$build/bin/hearsay-bench" "$stage/bin/"
for t in backend_test codec_test optim_test device_gossip_test; do cp "$build/tests/$t" "$stage/tests/"; done
# Every library the binaries resolve here, less the ones the GPU machine must bring.
skip='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|libcuda|libcudart|libcublas|libcublasLt)\.so'
for f in "$stage"/bin/* "$stage"/tests/*; do
  ldd "$f" | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ $name =~ $skip ]] || cp -L "$path" "$stage/lib/$name"
done
cp /usr/share/datasets/fashion-mnist/*.gz "$stage/data/fashion-mnist/"
[ -f data/kjv.txt ] && cp data/kjv.txt "$stage/data/"
# The source folder compiled into the binaries (HEARSAY_SOURCE_DIR), for gpu_check.sh.
grep -m1 '^CMAKE_HOME_DIRECTORY:' "$build/CMakeCache.txt" | cut -d= -f2 >"$stage/source_dir"
tar -C "$stage" -cJf "$dest/hearsay-gpu.tar.xz" .
ls -la "$dest/hearsay-gpu.tar.xz"
