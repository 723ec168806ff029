#!/usr/bin/env bash
# compute-sanitizer over the CUDA kernel table's op tests, on the GPU machine, after
# check.sh (a call of its own, when device time is left):
#
#   tests/device/sanitize.sh build/device-pack.tar.xz        (carry build/device-pack.tar.xz)
#
# The kernel emulator (tests/cuda_emu) runs every kernel on the CPU with real barriers, but
# its threads run one after another in a fixed order, so a missing barrier in one direction,
# a lane reading another's write without __syncwarp, or a read of memory nobody wrote can
# pass there. These are what the sanitizer's tools look for on the device:
#   racecheck  shared-memory hazards (attention, LayerNorm, the column sums, the softmax kernels);
#   synccheck  barriers and warp syncs reached by only some threads;
#   initcheck  reads of device memory never written;
#   memcheck   out-of-bounds and misaligned accesses, over every op test.
# Each prints PASS, FAIL, or SKIP where the machine's runtime refuses the sanitizer (on
# gVisor it does: /work/.library/device/KINDS.md). The log is $OUT/sanitize.log when $OUT
# is set. Exit 0 when nothing failed.
set -uo pipefail

pack=${1:-build/device-pack.tar.xz}
log=${OUT:-.}/sanitize.log
exec > >(tee "$log") 2>&1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/pack_env.sh"
unpack_device_pack "$pack" "$work" || exit 1
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
[[ -n $sanitizer ]] || { echo "SKIP compute-sanitizer is not installed"; exit 0; }

failed=0
check() {  # check TOOL SECONDS GTEST_FILTER
  local tool=$1 seconds=$2 filter=$3
  echo "==== $tool: $filter"
  timeout "$seconds" "$sanitizer" --tool "$tool" --error-exitcode 3 --print-limit 10 \
    "$bin/cuda_tests" --gtest_filter="$filter" > "$work/$tool.txt" 2>&1
  local rc=$?
  # The test that was running and the first report in full (a tail alone shows the host
  # frames of the last one); the whole output to $OUT/sanitize-TOOL.txt.
  awk '/^\[ RUN/ {run = $0}
       /^========= [A-Z]/ && !/SUMMARY|COMPUTE-SANITIZER/ && !shown {print "first report, in " run; shown = 1; n = 30}
       n > 0 {print; n--}' "$work/$tool.txt"
  tail -6 "$work/$tool.txt"
  [[ -z ${OUT:-} ]] || cp "$work/$tool.txt" "$OUT/sanitize-$tool.txt"
  if grep -q "Device not supported\|Unable to find injection library" "$work/$tool.txt"; then
    echo "SKIP $tool (the runtime refuses the sanitizer)"
  elif [[ $rc -eq 0 ]]; then
    echo "PASS $tool"
  else
    echo "FAIL $tool (exit $rc$([[ $rc -eq 124 ]] && echo ': timed out'))"
    failed=1
  fi
}
kernels='CudaOpsTest.AttentionForwardAndBackward:CudaOpsTest.AttentionDecodeMatchesTheCpu:CudaOpsTest.LayerNormForwardAndBackward:CudaOpsTest.LayerNormBackwardAtEdgeShapesRepeatsBitForBit:CudaOpsTest.BiasColumnSumsAtEdgeShapesRepeatBitForBit:CudaOpsTest.GeluCrossEntropyAndAdamW:CudaOpsTest.EncoderForwardAndBackward:CudaOpsTest.CrossEntropyOverVocabularySlices:CudaOpsTest.CrossEntropyForwardAndBackwardInOnePass:CudaOpsTest.LayerNormForwardAtEdgeShapes:CudaOpsTest.MatmulGeluFusedMatchesTheCpusSeparateOps'
# DROVER_SANITIZE_TESTS (a gtest filter) runs every tool over those tests alone: a changed
# kernel's, in a short call.
only=${DROVER_SANITIZE_TESTS:-}
check racecheck 150 "${only:-$kernels}"
check synccheck 90 "${only:-$kernels}"
check initcheck 90 "${only:-$kernels:CudaOpsTest.ElementwiseAndReductions}"
check memcheck 150 "${only:-CudaOpsTest.*:-*Gpt2Shapes*:*TrainingSteps*}"
[[ $failed -eq 0 ]] && echo "sanitize: nothing failed" || echo "sanitize: FAILED"
exit $failed
