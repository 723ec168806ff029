#!/usr/bin/env bash
# Packs what tests/device/check.sh runs on the GPU machine: drover's programs and the CUDA
# tests, stripped, with the shared libraries they need from this machine (Debian's gRPC,
# Protobuf, Gloo, OpenBLAS, ...) that the device image does not have. glibc, libstdc++ and
# the CUDA libraries (cudart, NCCL) are left out: the device image has newer ones of its own
# (NCCL and cudart from its PyTorch environment). Compressed: carries are limited to 64 MiB.
#
#   tests/device/pack.sh BUILD_DIR OUT.tar.xz
set -euo pipefail
if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR OUT.tar.xz" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
out=$2
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/pack/bin" "$stage/pack/lib"
programs=(drover drover-coordinator drover-worker drover-trainer cuda_tests nccl_tests drover-gpt-logits
  bench_sample_bench)
for p in "${programs[@]}"; do
  [[ -x "$build/bin/$p" ]] || { echo "pack: $build/bin/$p is not built" >&2; exit 2; }
  strip -o "$stage/pack/bin/$p" "$build/bin/$p"
done
# The attention tiles bench (speed.sh runs it), a CUDA program of its own: the CUDA runtime
# is all it links.
[[ -x "$build/bin/bench_attention_tiles" ]] || { echo "pack: $build/bin/bench_attention_tiles is not built" >&2; exit 2; }
strip -o "$stage/pack/bin/bench_attention_tiles" "$build/bin/bench_attention_tiles"
# The CUDA kernel table, which the trainer opens at run time (kernels/cuda_backend.h).
[[ -f "$build/bin/libdrover_cuda.so" ]] || { echo "pack: $build/bin/libdrover_cuda.so is not built" >&2; exit 2; }
strip -o "$stage/pack/bin/libdrover_cuda.so" "$build/bin/libdrover_cuda.so"
for p in "${programs[@]}"; do ldd "$build/bin/$p"; done |
  awk '/=>/ {print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so|libcudart|libnccl|libcuda\.so|libcublas' |
  while read -r lib; do cp -L "$lib" "$stage/pack/lib/"; done
tar -C "$stage" -cJf "$out" pack
echo "pack: $(du -h "$out" | cut -f1) in $out ($(ls "$stage/pack/lib" | wc -l) libraries)"
