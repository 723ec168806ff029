#!/usr/bin/env bash
# GPU nodes without a GPU: drover-worker --device cuda against a stand-in for the NVIDIA driver
# (tests/unit/worker/fake_cuda_driver.cc, found as libcuda.so.1 on the library path), so that
# the agent's GPU path runs on every commit, where the device check (tests/device/check.sh
# step 3) runs it only when a GPU is lent:
#   - two GPUs register as two slots (--slots defaults to the visible GPUs), each described
#     with its name, memory and compute capability in `drover workers`;
#   - --slots past the visible GPUs is refused, naming both numbers;
#   - a node with a GPU older than the kernels allow (a V100, 7.0) refuses to start, naming
#     the GPU, its compute capability and how to leave it out;
#   - a malformed --gpu-ignored-xids is refused, naming the entry;
#   - a driver of an older CUDA major version than the build's runtime (a CUDA 11.4 driver)
#     refuses to start, naming both versions, where the build has the CUDA plugin;
#   - a driver whose cuInit never returns: the agent says so and exits (1);
#   - an NVML whose nvmlInit_v2 never returns: the agent registers without health checks.
#
#   fake_gpu_agent_test.sh BIN_DIR FAKE_DRIVER
set -euo pipefail
bin=$1
driver=$(realpath "$2")
work=$(mktemp -d)
cleanup() {
  jobs -p | xargs -r kill 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
mkdir "$work/driver"
ln -s "$driver" "$work/driver/libcuda.so.1"
export LD_LIBRARY_PATH=$work/driver${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

port=$((20000 + RANDOM % 20000))
addr=127.0.0.1:$port
"$bin/drover-coordinator" --listen "$addr" --state-dir "$work/state" > "$work/coordinator.log" 2>&1 &
DROVER_FAKE_GPUS="NVIDIA H200,141,90;NVIDIA H200,141,90" "$bin/drover-worker" --coordinator "$addr" \
  --name gpu0 --device cuda --work-dir "$work/gpu0" > "$work/gpu0.log" 2>&1 &

registered=""
for _ in $(seq 1 100); do
  if "$bin/drover" --coordinator "$addr" workers --json > "$work/workers.json" 2>/dev/null &&
    grep -q 'cuda:1 NVIDIA H200 (141 GiB, compute 9.0)' "$work/workers.json"; then
    registered=1
    break
  fi
  sleep 0.1
done
if [[ -z $registered ]]; then
  echo "FAIL: the fake GPUs were not registered as described"
  cat "$work/workers.json" "$work/gpu0.log" 2>/dev/null
  exit 1
fi
grep -q 'cuda:0 NVIDIA H200 (141 GiB, compute 9.0)' "$work/workers.json" ||
  { echo "FAIL: slot 0 missing"; cat "$work/workers.json"; exit 1; }
echo "two fake H200s registered as two slots"

refused() {  # refused LOG WANT...: the agent exited 2 and said each WANT
  local log=$1 rc=$2
  shift 2
  [[ $rc -eq 2 ]] || { echo "FAIL: exit $rc, want 2"; cat "$log"; return 1; }
  for want in "$@"; do
    grep -qF -- "$want" "$log" || { echo "FAIL: '$want' not said"; cat "$log"; return 1; }
  done
}
rc=0
DROVER_FAKE_GPUS="NVIDIA H200,141,90" timeout 20 "$bin/drover-worker" --coordinator "$addr" \
  --name gpu1 --device cuda --slots 2 --work-dir "$work/gpu1" > "$work/gpu1.log" 2>&1 || rc=$?
refused "$work/gpu1.log" $rc "--slots 2 but only 1 GPU(s) are visible"
rc=0
DROVER_FAKE_GPUS="NVIDIA H200,141,90;Tesla V100-SXM2-16GB,16,70" timeout 20 "$bin/drover-worker" \
  --coordinator "$addr" --name gpu2 --device cuda --work-dir "$work/gpu2" > "$work/gpu2.log" 2>&1 ||
  rc=$?
refused "$work/gpu2.log" $rc \
  "drover-worker: --device cuda: GPU 1 (Tesla V100-SXM2-16GB) has compute capability 7.0" \
  "need 8.0 or newer" "CUDA_VISIBLE_DEVICES"
rc=0
DROVER_FAKE_GPUS="NVIDIA H200,141,90" timeout 20 "$bin/drover-worker" --coordinator "$addr" \
  --name gpu3 --device cuda --gpu-ignored-xids 13,thirty --work-dir "$work/gpu3" \
  > "$work/gpu3.log" 2>&1 || rc=$?
refused "$work/gpu3.log" $rc "drover-worker: --gpu-ignored-xids: 'thirty' is not an Xid"
echo "too many slots, a V100 and a malformed Xid list refused, by name"
if [[ -e $bin/libdrover_cuda.so ]]; then
  rc=0
  DROVER_FAKE_GPUS="NVIDIA H200,141,90" DROVER_FAKE_CUDA_VERSION=11040 timeout 20 \
    "$bin/drover-worker" --coordinator "$addr" --name gpu4 --device cuda --work-dir "$work/gpu4" \
    > "$work/gpu4.log" 2>&1 || rc=$?
  refused "$work/gpu4.log" $rc \
    "drover-worker: --device cuda: the NVIDIA driver supports CUDA 11.4 and this build's CUDA runtime is" \
    "Update the driver"
  echo "a CUDA 11.4 driver refused, naming both versions"
fi
# A wedged driver: cuInit never returns. The agent says so within --gpu-health-timeout-ms and
# exits, where it would hang silently.
rc=0
DROVER_FAKE_CUDA_HANG=1 DROVER_FAKE_GPUS="NVIDIA H200,141,90" timeout 20 "$bin/drover-worker" \
  --coordinator "$addr" --name gpu4 --device cuda --gpu-health-timeout-ms 300 \
  --work-dir "$work/gpu4" > "$work/gpu4.log" 2>&1 || rc=$?
[[ $rc -eq 1 ]] && grep -qF "drover-worker: --device cuda: the NVIDIA driver has not answered within 300 ms (--gpu-health-timeout-ms) while the GPUs were listed" "$work/gpu4.log" ||
  { echo "FAIL: a wedged driver, rc $rc (want 1)"; cat "$work/gpu4.log"; exit 1; }
echo "a driver that never answers: the agent said so and exited"
# NVML that never starts (nvmlInit_v2 hangs): the agent registers without health checks
# after --gpu-health-timeout-ms, and says why, where it would never register.
mkdir "$work/nvml"
ln -s "$driver" "$work/nvml/libnvidia-ml.so.1"
echo "init hang" > "$work/nvml-state"
DROVER_FAKE_NVML=$work/nvml-state DROVER_FAKE_GPUS="NVIDIA H200,141,90" \
  LD_LIBRARY_PATH=$work/nvml:$LD_LIBRARY_PATH "$bin/drover-worker" --coordinator "$addr" \
  --name gpu5 --device cuda --gpu-health-timeout-ms 300 --work-dir "$work/gpu5" \
  > "$work/gpu5.log" 2>&1 &
for _ in $(seq 1 100); do
  "$bin/drover" --coordinator "$addr" workers | grep -q "^gpu5 *ALIVE" && break
  sleep 0.1
done
"$bin/drover" --coordinator "$addr" workers | grep -q "^gpu5 *ALIVE" &&
  grep -qF "GPU health checks are off: NVML has not answered within 300 ms as it started (a wedged driver or GPU)" "$work/gpu5.log" ||
  { echo "FAIL: an NVML that never starts held up the agent"; cat "$work/gpu5.log"; exit 1; }
echo > "$work/nvml-state"  # the init returns, on a thread nobody waits for
echo "an NVML that never starts: the agent registered without health checks, saying why"
