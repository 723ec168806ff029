#!/usr/bin/env bash
# The device check (issue 9), run on the GPU machine from a copy of the working tree with the
# pack of tests/device/pack.sh carried:
#
#   here:   tests/device/pack.sh build build/device-pack.tar.xz
#   there:  tests/device/check.sh build/device-pack.tar.xz      (carry build/device-pack.tar.xz)
#
# What it checks:
#   1. the GPU and its driver (nvidia-smi);
#   2. cuda_tests: every op of the CUDA kernel table against the CPU fp32 reference
#      (forward and backward; mixed-precision attention through the fused kernels on
#      mma.sync register tiles, attention_mma.cu), 20 training steps on the GPU against the
#      CPU in fp32 and bf16, a model's losses as `drover eval --device cuda` computes them
#      (GptInference), and sampling logits through the key/value cache as `drover sample
#      --device cuda` computes them (GptDecoder, attention_decode.cu); nccl_tests: the NCCL
#      communicator (every collective, uneven
#      chunks, a peer that never joins aborted at the deadline; two ranks on one GPU refused);
#   2b. attention through the wmma kernels (DROVER_CUDA_ATTENTION=wmma, flash_attention.cu),
#      the GEMM version (DROVER_CUDA_ATTENTION=gemms), cuDNN's fused attention
#      (DROVER_CUDA_ATTENTION=cudnn, cudnn_attention.cu) and the mma kernels' other tile
#      choices (DROVER_CUDA_ATTENTION_TILES; a malformed one refused), and every op with
#      float operand buffers and GEMMs on fp32 inputs (DROVER_CUDA_GEMM_INPUTS=fp32), where
#      mixed precision takes 16-bit ones otherwise;
#   3. an agent with --device cuda registers the GPU as a slot, named by the driver probe;
#   4. a one-rank job on cuda trains to success through the coordinator on that GPU, and
#      allocates no device memory inside its steps after the second;
#   4b. two ranks sharing the GPU (dp2 with ZeRO-1 and ZeRO-3, and tp2 with its split
#      vocabulary; process groups staged through host memory) give the one-process losses
#      of every step (with DROVER_CHECK_NO_GPU=1, tp2 on the CPU as a dry run);
#   4c. train.recompute=all on the GPU (bf16, the fused attention recomputed too) trains as
#      keeping every activation: the same losses, bit for bit (the kernels are deterministic);
#   4d. an fp16 job on the GPU, the dynamic loss scaler skipping, backing off and growing,
#      trains as the same job on the CPU: losses within 1e-2, the same scale at every step;
#   5. the same build runs a CPU job to success on that machine;
#   6. `drover export --format safetensors` read by PyTorch (and by transformers'
#      GPT2LMHeadModel) gives drover's logits (tests/tools/hf_gpt2_check.py).
# Then, as information (tests/device/speed.sh): GPT-2 124M at T=1024 in bf16, drover against
# PyTorch eager and torch.compile on the same GPU. drover's bf16 GEMMs run on tensor cores
# with native bf16 inputs and outputs (what passes from op to op is stored in bf16; the
# weights and the residual stream's gradient are copied to bf16 per GEMM; the old fp32 GEMMs
# are timed too), its attention is fused (mma.sync register tiles; the wmma kernels and the
# GEMM version, which materialises T x T, are timed too), and the residual stream and its
# gradients stay fp32: this measures
# how far it is from the goal.
# Worst-case timeouts add up to more than the device tool's 600 s per call: should the check
# be cut short, run tests/device/speed.sh as a call of its own. tests/device/sanitize.sh
# (compute-sanitizer over the op tests) is a call of its own too, when time is left. Each step prints PASS or FAIL; the log is $OUT/check.log when $OUT is set. With
# DROVER_CHECK_NO_GPU=1 it runs steps 3-6 as a machine without a GPU must see them (a dry
# run here: step 3 expects the agent's refusal instead, 4b runs on the CPU); with
# DROVER_CHECK_SPEED=0 it leaves the speed step out. Exit 0 when every step passed.
set -uo pipefail

pack=${1:-build/device-pack.tar.xz}
no_gpu=${DROVER_CHECK_NO_GPU:-0}
log=${OUT:-.}/check.log
exec > >(tee "$log") 2>&1

work=$(mktemp -d)
cleanup() {
  jobs -p | xargs -r kill -9 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
here=$(cd "$(dirname "$0")" && pwd)
source "$here/pack_env.sh"
unpack_device_pack "$pack" "$work" || exit 1

failed=0
step() {  # step NAME COMMAND...: runs it, says PASS or FAIL
  local name=$1
  shift
  echo "==== $name"
  if "$@"; then echo "PASS $name"; else echo "FAIL $name"; failed=1; fi
}

if [[ $no_gpu != 1 ]]; then
  step "1 gpu and driver" nvidia-smi -L
  step "2 cuda ops against the cpu, 20 steps" timeout 150 "$bin/cuda_tests"
  # A binary of their own: their ranks are forked children, and a parent that has used CUDA
  # (the op tests) leaves them an unusable runtime. With one GPU the two-GPU tests skip.
  step "2 the nccl communicator" timeout 60 "$bin/nccl_tests"
  # Mixed-precision attention takes the mma kernels above; the wmma kernels and the GEMM
  # version too.
  step "2b cuda attention through the wmma kernels" env DROVER_CUDA_ATTENTION=wmma \
    timeout 60 "$bin/cuda_tests" --gtest_filter='CudaOpsTest.Attention*:CudaOpsTest.Fused*:CudaOpsTest.OpsRead*:CudaOpsTest.TwentyTrainingSteps*'
  step "2b cuda attention through the gemms" env DROVER_CUDA_ATTENTION=gemms \
    timeout 60 "$bin/cuda_tests" --gtest_filter='CudaOpsTest.Attention*:CudaOpsTest.Fused*:CudaOpsTest.OpsRead*'
  # cuDNN's fused attention (cudnn_attention.cu), from the PyTorch environment's libcudnn: its
  # first run on a GPU decides whether cuDNN's engines take the graphs at all ("no engine of
  # cuDNN ... takes the graph" names its reasons).
  step "2b cuda attention through cudnn" env DROVER_CUDA_ATTENTION=cudnn \
    timeout 90 "$bin/cuda_tests" --gtest_filter='CudaOpsTest.Attention*:CudaOpsTest.Fused*:CudaOpsTest.*TrainingSteps*'
  step "2b cuda ops on fp32 inputs" env DROVER_CUDA_GEMM_INPUTS=fp32 \
    timeout 90 "$bin/cuda_tests" --gtest_filter='CudaOpsTest.*'
  # The fused attention's other tile choices (DROVER_CUDA_ATTENTION_TILES, which speed.sh
  # may train with), and a malformed choice refused by name.
  for tiles in forward=32x64,dq=2,dkv=2 forward=32x64s; do
    step "2b cuda attention with tiles $tiles" env DROVER_CUDA_ATTENTION_TILES=$tiles \
      timeout 60 "$bin/cuda_tests" --gtest_filter='CudaOpsTest.Attention*:CudaOpsTest.TwentyTrainingSteps*'
  done
  step "2b a malformed tile choice is refused by name" env \
    DROVER_CUDA_ATTENTION_TILES=forward=16x64,dq=4 timeout 60 "$bin/cuda_tests" \
    --gtest_filter='CudaBackendTest.MalformedAttentionTiles*'
fi

# A coordinator, a GPU agent and a CPU agent on loopback.
port=$((20000 + RANDOM % 20000))
addr=127.0.0.1:$port
"$bin/drover-coordinator" --listen "$addr" --state-dir "$work/state" > "$work/coordinator.log" 2>&1 &
"$bin/drover-worker" --coordinator "$addr" --name gpu0 --device cuda --work-dir "$work/gpu0" \
  > "$work/gpu0.log" 2>&1 &
gpu_agent=$!
"$bin/drover-worker" --coordinator "$addr" --name cpu0 --slots 1 --device cpu \
  --work-dir "$work/cpu0" > "$work/cpu0.log" 2>&1 &
drover() { "$bin/drover" --coordinator "$addr" "$@"; }
sleep 3

gpu_registered() {  # the table names the GPU; its slot is described as the probe found it
  drover workers | tee "$work/workers.txt"
  grep -q "^gpu0 .*CUDA.*GiB" "$work/workers.txt" &&
    drover workers --json | grep -q '"cuda:0 .*GiB'
}
gpu_refused() {
  ! kill -0 "$gpu_agent" 2>/dev/null && cat "$work/gpu0.log" &&
    grep -q "drover-worker: --device cuda: " "$work/gpu0.log"
}
# The agent's GPU health check on the real NVML (worker/gpu_health.h): the library loads,
# finds the GPU by the bus id the CUDA driver gave, and finds nothing wrong with it (its
# NVLinks, if any, named in the log when some are down from the start). Whether it watches
# the GPU's Xid events, and what it reads of the GPU (drover workers --gpus), are printed,
# not required: a container may not be allowed events.
gpu_health_checked() {
  grep -E "checking the health|health checks are off|not health-checked|unfit|NVLink|NVML|Xid" "$work/gpu0.log"
  for _ in $(seq 1 30); do  # a heartbeat brings them, within a second of registering
    drover workers --json | grep -q '"gpus"' && break
    sleep 0.1
  done
  drover workers --gpus || true  # NVML's readings of the GPU
  grep -q "checking the health of 1 of 1 GPU(s) through NVML" "$work/gpu0.log" &&
    ! grep -q "unfit for training" "$work/gpu0.log" &&
    ! drover workers | grep -q "passes the health check"
}
if [[ $no_gpu == 1 ]]; then
  step "3 agent without a gpu refuses --device cuda" gpu_refused
else
  step "3 agent registers the gpu" gpu_registered
  step "3 agent checks the gpu's health through NVML" gpu_health_checked
fi

# A tiny model on data made here.
head -c 200000 /dev/urandom | base64 > "$work/text.txt"
"$bin/drover" data prepare "$work/text.txt" --out "$work/data" > /dev/null
job_yaml() {  # job_yaml NAME DEVICE
  cat <<YAML
name: device-check-$1
output_dir: $work/out-$1
model: {n_layer: 2, n_head: 2, n_embd: 64, block_size: 32, vocab_size: 256}
data: {train: "$work/data/train_*.bin", val: "$work/data/val.bin"}
train: {steps: 30, global_batch: 4, micro_batch: 4, seq_len: 32, eval_every: 0}
resources: {device: $2, world_size: {min: 1, max: 1}}
checkpoint: {every_steps: 10}
YAML
}

cuda_job_succeeds() {
  job_yaml cuda cuda > "$work/cuda.yaml"
  local id
  id=$(drover submit "$work/cuda.yaml") || return 1
  timeout 180 "$bin/drover" --coordinator "$addr" wait "$id"
  local rc=$?
  drover status "$id" | tee "$work/cuda-status.txt"
  drover logs "$id" | tail -5
  [[ $rc -eq 0 ]] &&
    python3 "$here/../tools/no_step_allocations.py" "$work/out-cuda/metrics.jsonl" 3
}
cpu_job_succeeds() {
  job_yaml cpu cpu > "$work/cpu.yaml"
  local id
  id=$(drover submit "$work/cpu.yaml") || return 1
  timeout 120 "$bin/drover" --coordinator "$addr" wait "$id"
  local rc=$?
  drover status "$id"
  [[ $rc -eq 0 ]]
}
# Two ranks of DEVICE (one GPU shared, process groups staged through host memory) against
# one rank, with SETTING (a --set): every step's loss within 1e-4 relative.
two_ranks_match_one() {  # two_ranks_match_one DEVICE SETTING
  ranks_match_one "$1" 2 "$2"
}
# NPROC ranks of DEVICE against one rank, with each SETTING as a --set.
ranks_match_one() {  # ranks_match_one DEVICE NPROC SETTING...
  local device=$1 nproc=$2 setting
  shift 2
  local sets=()
  for setting in "$@"; do sets+=(--set "$setting"); done
  cat > "$work/dp.yaml" <<YAML
name: device-check-dp
model: {n_layer: 2, n_head: 2, n_embd: 64, block_size: 32, vocab_size: 256}
data: {train: "$work/data/train_*.bin"}
train: {steps: 10, global_batch: 8, micro_batch: 2, seq_len: 32, eval_every: 0}
resources: {device: $device, world_size: {min: 1, max: $nproc}}
checkpoint: {every_steps: 0}
YAML
  rm -rf "$work/out-dp1" "$work/out-dp2"
  # The reference is one plain rank: a layout like tp2 needs two.
  timeout 120 "$bin/drover" train "$work/dp.yaml" --set output_dir="$work/out-dp1" 2>&1 |
    tail -2 || return 1
  timeout 120 "$bin/drover" train "$work/dp.yaml" --nproc "$nproc" \
    --set output_dir="$work/out-dp2" "${sets[@]}" 2>&1 | tail -2 || return 1
  python3 "$here/../tools/same_losses.py" "$work/out-dp1/metrics.jsonl" \
    "$work/out-dp2/metrics.jsonl" 10 1e-4 || return 1
  [[ $device != cuda ]] || {
    python3 "$here/../tools/no_step_allocations.py" "$work/out-dp2/metrics.jsonl" 3 &&
      # What rank 0 stalled for its peers (peer_wait_ms, comm_wait_ms: from the compute
      # stream having drained, CommStream::Wait), for the note; not a pass or fail.
      python3 "$here/../tools/step_medians.py" "$work/out-dp2/metrics.jsonl" 3 \
        step_ms peer_wait_ms comm_ms comm_wait_ms busy_ms
  }
}
# train_into DIR YAML [SETTING...]: `drover train YAML` with each SETTING as a --set, its
# output in DIR (emptied first); the log's last line shows.
train_into() {
  local dir=$1 yaml=$2 setting
  shift 2
  local sets=()
  for setting in "$@"; do sets+=(--set "$setting"); done
  rm -rf "$dir"
  timeout 120 "$bin/drover" train "$yaml" "${sets[@]}" --set output_dir="$dir" 2>&1 | tail -1
}
# One rank of DEVICE in bf16, every layer's activations recomputed in backward, against the
# same run keeping them: the same kernels on the same inputs, so the same losses exactly.
recompute_matches_keeping() {  # recompute_matches_keeping DEVICE
  cat > "$work/recompute.yaml" <<YAML
name: device-check-recompute
model: {n_layer: 4, n_head: 2, n_embd: 64, block_size: 32, vocab_size: 256}
data: {train: "$work/data/train_*.bin"}
train: {steps: 10, global_batch: 8, micro_batch: 4, seq_len: 32, eval_every: 0}
precision: {dtype: bf16}
resources: {device: $1}
checkpoint: {every_steps: 0}
YAML
  local r
  for r in none all; do
    train_into "$work/out-recompute-$r" "$work/recompute.yaml" train.recompute=$r || return 1
  done
  python3 "$here/../tools/same_losses.py" "$work/out-recompute-none/metrics.jsonl" \
    "$work/out-recompute-all/metrics.jsonl" 10 0
}
# One rank in fp16 on DEVICE against the same job on the CPU (fp16 storage and fp32
# accumulation there too: the reference), the dynamic loss scaler starting at 2^26 (the first
# steps overflow: skipped, scale halved) and growing every 4 good steps, so that it skips,
# backs off and grows within the 12 steps (on the CPU: 2^26 down to 2^22, up to 2^23 and
# back): every step's loss within 1e-2 relative (the GEMMs and reductions add in other
# orders), and the same loss scale at every step (a step skipped on one and not the other
# shows there).
fp16_matches_cpu() {  # fp16_matches_cpu DEVICE
  cat > "$work/fp16.yaml" <<YAML
name: device-check-fp16
model: {n_layer: 2, n_head: 2, n_embd: 64, block_size: 32, vocab_size: 256}
data: {train: "$work/data/train_*.bin"}
train: {steps: 12, global_batch: 8, micro_batch: 4, seq_len: 32, eval_every: 0}
precision: {dtype: fp16, initial_loss_scale: 67108864, loss_scale_window: 4}
resources: {device: cpu}
checkpoint: {every_steps: 0}
YAML
  local d
  for d in cpu $1; do
    train_into "$work/out-fp16-$d" "$work/fp16.yaml" resources.device=$d || return 1
  done
  # same_losses compares the loss scales too (powers of 2: within 1e-2 is equal).
  python3 "$here/../tools/same_losses.py" "$work/out-fp16-cpu/metrics.jsonl" \
    "$work/out-fp16-$1/metrics.jsonl" 12 1e-2
}
if [[ $no_gpu != 1 ]]; then
  step "4 a cuda job trains on the gpu" cuda_job_succeeds
  step "4b two ranks on one gpu, dp2 zero-1, equal one rank" \
    two_ranks_match_one cuda parallel.zero_stage=1
  step "4b two ranks on one gpu, dp2 zero-3, equal one rank" \
    two_ranks_match_one cuda parallel.zero_stage=3
  # Tensor parallelism: the split vocabulary's kernels (-1 ids, the loss's halves) on the
  # device, and the blocks' all-reduces.
  step "4b two ranks on one gpu, tp2, equal one rank" two_ranks_match_one cuda parallel.tp=2
  # Hybrid sharding: ZeRO-3 in shard groups of 2, the 2 replicas averaging their shards.
  step "4b four ranks on one gpu, zero-3 in 2 replicas of dp2 (dp_shard), equal one rank" \
    ranks_match_one cuda 4 parallel.zero_stage=3 parallel.dp_shard=2
  step "4c recompute all on the gpu trains as keeping the activations" \
    recompute_matches_keeping cuda
  step "4d an fp16 job on the gpu trains as on the cpu, loss scaler included" \
    fp16_matches_cpu cuda
else
  # The same comparison on the CPU: a dry run of the step itself.
  step "4b (dry run on the cpu) two ranks, tp2, equal one rank" \
    two_ranks_match_one cpu parallel.tp=2
  step "4b (dry run on the cpu) four ranks, zero-3 in 2 replicas of dp2, equal one rank" \
    ranks_match_one cpu 4 parallel.zero_stage=3 parallel.dp_shard=2
  step "4c (dry run on the cpu) recompute all trains as keeping the activations" \
    recompute_matches_keeping cpu
  step "4d (dry run on the cpu) an fp16 job trains as on the cpu, loss scaler included" \
    fp16_matches_cpu cpu
fi
step "5 the same build trains a cpu job" cpu_job_succeeds
# The GPU machine has PyTorch; a dry run here may not, and says so rather than failing.
if [[ $no_gpu == 1 ]] && ! without_pack_libs python3 -c 'import torch' 2>/dev/null; then
  echo "==== 6 pytorch reads drover's safetensors export"
  echo "SKIP 6 (dry run): this machine's python3 has no torch"
else
  step "6 pytorch reads drover's safetensors export" \
    without_pack_libs timeout 120 python3 "$here/../tools/hf_gpt2_check.py" "$bin"
fi

if [[ $no_gpu != 1 && ${DROVER_CHECK_SPEED:-1} == 1 ]]; then
  # GPT-2 124M at T=1024 in bf16, batch 32 (both fit an H200 with room to spare; the issue
  # asks for the largest batch that fits, and a larger one raises both MFUs): drover, PyTorch
  # eager and torch.compile (tests/device/speed.sh; run it by hand for 350m when device time
  # is left, or at batch 64).
  timeout 480 "$here/speed.sh" "$bin" 124m 32 12 || true
fi

echo "==== coordinator log (tail)"
tail -20 "$work/coordinator.log"
[[ $failed -eq 0 ]] && echo "device check: every step passed" || echo "device check: FAILED"
exit $failed
