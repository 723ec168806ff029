#!/usr/bin/env bash
# A GPU cluster on this machine: a coordinator, an agent with --device cuda on two GPUs a
# stand-in driver lists (tests/unit/worker/fake_cuda_driver.cc), and its trainers on the
# kernel emulator's CUDA plugin (tests/cuda_emu/), each on its slot's GPU
# (CUDA_VISIBLE_DEVICES), their groups through the emulated NCCL. A two-rank bf16 job is
# submitted; once it has a checkpoint one trainer is killed, and the job must recover from
# that checkpoint on the same GPUs and succeed: the path from `drover submit` to CUDA
# training and back after a failure, which the device check (tests/device/check.sh step 4)
# runs only when a GPU is lent and only without the failure.
#
#   emulated_gpu_cluster_test.sh BIN_DIR EMULATED_PLUGIN FAKE_DRIVER
set -euo pipefail
bin=$1
plugin=$2
driver=$(realpath "$3")
work=$(mktemp -d)
cleanup() {
  jobs -p | xargs -r kill 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
mkdir "$work/bin" "$work/driver"
cp "$bin/drover" "$bin/drover-coordinator" "$bin/drover-worker" "$bin/drover-trainer" "$plugin" \
  "$work/bin/"
ln -s "$driver" "$work/driver/libcuda.so.1"
export LD_LIBRARY_PATH=$work/driver${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export DROVER_FAKE_GPUS="NVIDIA H200,141,90;NVIDIA H200,141,90"
export DROVER_EMU_NCCL_TIMEOUT_MS=60000
tests=$(cd "$(dirname "$0")/.." && pwd)
python3 "$tests/bench/random_shard.py" "$work/train.bin" 50000

port=$((20000 + RANDOM % 20000))
addr=127.0.0.1:$port
drover() { "$work/bin/drover" --coordinator "$addr" "$@"; }
"$work/bin/drover-coordinator" --listen "$addr" --state-dir "$work/state" \
  > "$work/coordinator.log" 2>&1 &
"$work/bin/drover-worker" --coordinator "$addr" --name gpu0 --device cuda \
  --work-dir "$work/gpu0" > "$work/gpu0.log" 2>&1 &

cat > "$work/job.yaml" <<YAML
name: emulated-gpu-cluster
output_dir: $work/out
model: {n_layer: 2, n_head: 2, n_embd: 64, block_size: 32, vocab_size: 256}
data: {train: "$work/train.bin"}
train: {steps: 30, global_batch: 4, micro_batch: 2, seq_len: 32, eval_every: 0}
precision: {dtype: bf16}
parallel: {timeout_s: 30}
resources: {device: cuda, world_size: {min: 2, max: 2}}
checkpoint: {dir: $work/ckpt, every_steps: 5, keep_last: 2}
fault_tolerance: {max_restarts: 3}
YAML
show() {
  drover status "$id" || true
  tail -20 "$work/gpu0.log" "$work/coordinator.log"
}
id=""
for _ in $(seq 1 100); do
  id=$(drover submit "$work/job.yaml" 2>/dev/null) && break
  sleep 0.1
done
[[ -n $id ]] || { echo "FAIL: submit"; show; exit 1; }

# Once a checkpoint is complete, kill one of the two trainers.
killed=""
for _ in $(seq 1 600); do
  if compgen -G "$work/ckpt/step_[0-9]*" | grep -vq "\.tmp$"; then
    pid=$(pgrep -f "$work/bin/drover-trainer" | head -1 || true)
    if [[ -n $pid ]]; then
      kill -9 "$pid"
      killed=$pid
      break
    fi
  fi
  sleep 0.1
done
[[ -n $killed ]] || { echo "FAIL: no checkpoint and trainer to kill"; show; exit 1; }
echo "killed trainer $killed after a checkpoint"

rc=0
timeout 240 "$work/bin/drover" --coordinator "$addr" wait "$id" || rc=$?
drover status "$id" | tee "$work/status.txt"
[[ $rc -eq 0 ]] || { echo "FAIL: the job did not succeed (wait exited $rc)"; show; exit 1; }
grep -q "restarts: [1-9]" "$work/status.txt" ||
  { echo "FAIL: no restart recorded"; exit 1; }
grep -Eq "^ *2 +2 +[0-9]+ " "$work/status.txt" ||
  { echo "FAIL: attempt 2 did not resume on both GPUs from a checkpoint"; exit 1; }
grep -q '"step":30' "$work/out/metrics.jsonl" || { echo "FAIL: step 30 not reached"; exit 1; }
# On the CUDA table (its steps report device allocations), each rank on a GPU of its own, so
# that the groups went through NCCL.
grep -q '"device_allocations"' "$work/out/metrics.jsonl" ||
  { echo "FAIL: the steps did not run on the CUDA table"; exit 1; }
drover logs "$id" --rank 0 > "$work/rank0.log"
grep -q "ranks connected through NCCL (every rank has a GPU of its own" "$work/rank0.log" ||
  { echo "FAIL: the ranks did not connect through NCCL"; cat "$work/rank0.log"; exit 1; }
echo "the job recovered on its two GPUs and succeeded"
