#!/bin/bash
# hearsay's GPU checks, in one run on a machine with an NVIDIA GPU, from the pack that
# tools/gpu_pack.sh made on a build machine: the CUDA parity, codec, optimizer and gossip
# tests; the step bench on the GPU against PyTorch on the same GPU; one peer training the
# MLP and the GPT on the GPU. Writes OUTDIR/{gpu.txt,tests.txt,bench.jsonl,train-*.jsonl}.
# Usage (from the checkout's root): tools/gpu_check.sh [PACK_DIR] [OUTDIR]
# Exit status: 0 when every test passed and nothing was skipped, else 1.
set -uo pipefail
pack=${1:-.gpu}
out=${2:-${OUT:-gpu-out}}
root=/tmp/hearsay-gpu
mkdir -p "$out" "$root"
tar -C "$root" -xJf "$pack/hearsay-gpu.tar.xz" || exit 1

# The binaries read their sources' folder (bench scripts, data/kjv.txt) at the path they
# were built in, and Fashion-MNIST where Debian's package puts it.
built_in=$(cat "$root/source_dir")
if [ -n "$built_in" ] && [ ! -e "$built_in" ]; then mkdir -p "$(dirname "$built_in")" && ln -s "$PWD" "$built_in"; fi
mkdir -p data /usr/share/datasets/fashion-mnist
[ -f data/kjv.txt ] || cp "$root/data/kjv.txt" data/
cp -n "$root"/data/fashion-mnist/*.gz /usr/share/datasets/fashion-mnist/

# cuBLAS from this machine's CUDA (a toolkit, or the pip wheels PyTorch brought).
cublas=$(find /usr/local/cuda*/ /usr/lib /opt -name 'libcublas.so.13' 2>/dev/null | head -1)
export LD_LIBRARY_PATH="$root/lib${cublas:+:$(dirname "$cublas")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OPENBLAS_CORETYPE=Haswell OPENBLAS_NUM_THREADS=1
export HEARSAY_TORCH_PYTHON=${HEARSAY_TORCH_PYTHON:-$(command -v python3)}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv >"$out/gpu.txt" 2>&1
echo "cublas: ${cublas:-not found}" >>"$out/gpu.txt"
missing=$(ldd "$root/bin/hearsay-peer" | grep 'not found')
[ -z "$missing" ] || { echo "missing libraries: $missing" | tee -a "$out/gpu.txt"; exit 1; }
cat "$out/gpu.txt"

status=0
for t in backend_test codec_test optim_test device_gossip_test; do
  echo "== $t" >>"$out/tests.txt"
  timeout 300 "$root/tests/$t" --no-intro >>"$out/tests.txt" 2>&1
  rc=$?
  skipped=$(grep -c '^skipped:' "$out/tests.txt")
  echo "$t: exit $rc (skips so far: $skipped)"
  [ $rc -eq 0 ] || status=1
done
grep -q '^skipped:' "$out/tests.txt" && { echo "a GPU test was skipped on a GPU machine"; status=1; }

"$root/bin/hearsay-bench" step --device cuda:0 --models mlp,gpt-0.8m,gpt-10m --batches 64,256,4096 \
  --repeats 5 --round-s 0.3 >"$out/bench.jsonl" 2>&1 || status=1
grep -E '"(samples_per_s|tokens_per_s|torch_samples_per_s|torch_tokens_per_s|speedup_vs_torch)"' "$out/bench.jsonl" | cut -c1-160

"$root/bin/hearsay-peer" --config configs/single-mlp.textproto --set 'device: "cuda:0"' \
  --log "$out/train-mlp.jsonl" >/dev/null 2>"$out/train-mlp.err" || { status=1; tail -3 "$out/train-mlp.err"; }
"$root/bin/hearsay-peer" --config configs/gpt-single.textproto --set 'device: "cuda:0"' \
  --set 'checkpoint { dir: "/tmp/hearsay-gpu/ckpt" }' \
  --log "$out/train-gpt.jsonl" >/dev/null 2>"$out/train-gpt.err" || { status=1; tail -3 "$out/train-gpt.err"; }
for f in "$out"/train-*.jsonl; do grep '"event":"done"\|"event":"eval"' "$f" | tail -1 | cut -c1-300; done
exit $status
