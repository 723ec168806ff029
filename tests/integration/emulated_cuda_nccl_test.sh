#!/usr/bin/env bash
# Multi-GPU training through NCCL, on the kernel emulator and its NCCL emulator
# (tests/cuda_emu/README.md): `drover train --nproc N` with CUDA_VISIBLE_DEVICES=0,1,2,3 gives
# each rank a GPU of its own, so parallel.backend auto connects every group through the NCCL
# communicator in the CUDA plugin (device buffers straight to NCCL, host scalars staged).
# Every layout must give the one-rank losses within 1e-5 over 6 steps, and its validation
# losses at steps 3 and 6 (an evaluation on every rank, the loss on the last stage): dp2
# with ZeRO-2 (reduce-scatter) and ZeRO-3 (gathers), pp2 with 1F1B (point to point both ways
# at once: a deadlock on one communicator) and GPipe, pp2 x tp2, pp2 interleaved (two chunks
# per stage); and in bf16 dp2 with
# ZeRO-1 and tp2 (1e-4); pp2 x tp2 also with the training thread's calls complete at their
# return, and in the emulator's strict mode. Then a stop and resume of dp2 with ZeRO-1, against a run without
# one. Then a tp2 job whose rank 1 is frozen (SIGSTOP) must fail within its 2 s deadline
# (stream-ordered groups: the watchdog aborts the transfer). Then parallel.backend nccl with
# two ranks on one GPU must be refused at start-up,
# naming the ranks.
#
#   emulated_cuda_nccl_test.sh BIN_DIR EMULATED_PLUGIN
set -euo pipefail
bin=$1
plugin=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/bin"
cp "$bin/drover" "$bin/drover-trainer" "$plugin" "$work/bin/"
tests=$(cd "$(dirname "$0")/.." && pwd)
python3 "$tests/bench/random_shard.py" "$work/train.bin" 50000
python3 "$tests/bench/random_shard.py" "$work/val.bin" 5000
cat > "$work/job.yaml" <<YAML
name: emulated-cuda-nccl
model: {n_layer: 2, n_head: 2, n_embd: 64, block_size: 32, vocab_size: 256}
data: {train: "$work/train.bin", val: "$work/val.bin"}
train: {steps: 6, global_batch: 8, micro_batch: 2, seq_len: 32, eval_every: 3, eval_batches: 2}
parallel: {timeout_s: 30}
resources: {device: cuda, world_size: {min: 1, max: 4}}
checkpoint: {every_steps: 0}
YAML
# A hung transfer fails within the job's deadline, not the emulator's own.
export DROVER_EMU_NCCL_TIMEOUT_MS=60000
"$work/bin/drover" train "$work/job.yaml" --set output_dir="$work/one" > "$work/one.log" 2>&1 ||
  { cat "$work/one.log"; exit 1; }
run() {  # name nproc reference rtol overrides...
  local name=$1 nproc=$2 reference=$3 rtol=$4
  shift 4
  local sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  CUDA_VISIBLE_DEVICES=0,1,2,3 "$work/bin/drover" train "$work/job.yaml" --nproc "$nproc" \
    --set output_dir="$work/$name" "${sets[@]}" > "$work/$name.log" 2>&1 ||
    { cat "$work/$name.log"; echo "FAIL: $name"; exit 1; }
  grep -q "ranks connected through NCCL (every rank has a GPU of its own" "$work/$name.log" ||
    { cat "$work/$name.log"; echo "FAIL: $name did not connect through NCCL"; exit 1; }
  echo "$name: one rank (reference), $nproc ranks through NCCL"
  # The gradient norms too, within 10 rtol: a wrong gradient moves them before the losses.
  python3 "$tests/tools/same_losses.py" "$work/$reference/metrics.jsonl" \
    "$work/$name/metrics.jsonl" 6 "$rtol" "$(python3 -c "print(10 * $rtol)")"
  # Rank 0's steps from the third on allocate no device memory (each cudaMalloc would
  # synchronise the GPU).
  python3 "$tests/tools/no_step_allocations.py" "$work/$name/metrics.jsonl" 3
}
run dp2-zero2 2 one 1e-5 parallel.zero_stage=2
run dp2-zero3 2 one 1e-5 parallel.zero_stage=3
# Hybrid sharding: ZeRO-3 in shard groups of 2, their 2 replicas averaging once a step.
run dp4-zero3-hybrid 4 one 1e-5 parallel.zero_stage=3 parallel.dp_shard=2
run pp2-1f1b 2 one 1e-5 parallel.pp=2
run pp2-gpipe 2 one 1e-5 parallel.pp=2 parallel.pp_schedule=gpipe
run pp2-tp2 4 one 1e-5 parallel.pp=2 parallel.tp=2
# The same with the training thread's NCCL calls complete at their return, not stream-ordered.
run pp2-tp2-at-return 4 one 1e-5 parallel.pp=2 parallel.tp=2 parallel.stream_order=false
# Stream-ordered, with device work run only when something needs it (the emulator's strict
# mode, DROVER_EMU_DEFER_MS a day): a missing stream ordering reads stale data or hangs.
# (Complete at their return, the pipeline hangs there: a send's transfer is forced only by
# its Wait, which a GPU would not need.)
DROVER_EMU_DEFER_MS=86400000 run pp2-tp2-strict 4 one 1e-5 parallel.pp=2 parallel.tp=2
# The interleaved schedule: two chunks per stage of a 4-layer model, each micro-batch handed
# from the last stage back to the first between chunks (on groups of their own: on pp, the
# ring's back edge deadlocks NCCL's sends that wait for their receives).
"$work/bin/drover" train "$work/job.yaml" --set output_dir="$work/one-l4" --set model.n_layer=4 \
  > "$work/one-l4.log" 2>&1 || { cat "$work/one-l4.log"; exit 1; }
run pp2-interleaved 2 one-l4 1e-5 parallel.pp=2 parallel.pp_schedule=interleaved model.n_layer=4
# bf16: the fused attention, cuBLASLt's forward GEMMs and the one-launch AdamW on every rank.
# Sums in another order can move a value across a bf16 rounding boundary: a looser bound
# (seen: 1.4e-5 relative at most).
"$work/bin/drover" train "$work/job.yaml" --set output_dir="$work/one-bf16" \
  --set precision.dtype=bf16 > "$work/one-bf16.log" 2>&1 || { cat "$work/one-bf16.log"; exit 1; }
run dp2-zero1-bf16 2 one-bf16 1e-4 parallel.zero_stage=1 precision.dtype=bf16
run tp2-bf16 2 one-bf16 1e-4 parallel.tp=2 precision.dtype=bf16
# A stage without the head starts its backward from the received gradient (floats), not the
# 16-bit copy of the residual gradient a LayerNorm backward leaves (GptStage::LayerBackward).
run pp2-bf16 2 one-bf16 1e-4 parallel.pp=2 precision.dtype=bf16

# A resume through NCCL: dp2 at ZeRO-1 saves after 3 steps and resumes from it. Each rank
# reads only its half of the checkpoint and gathers the other half of the parameters from
# its peer (ParallelGpt::LoadParams: an all-gather of host buffers, staged through the
# device). The 6 losses and the evaluations at steps 3 and 6 must be those of 6 steps
# without the stop (a constant learning rate, so that train.steps does not change the
# schedule; a run evaluates at its last step, so every 3 steps).
resume() {  # resume OUT STEPS
  CUDA_VISIBLE_DEVICES=0,1 "$work/bin/drover" train "$work/job.yaml" --nproc 2 \
    --set output_dir="$work/$1" --set parallel.zero_stage=1 --set train.steps=$2 \
    --set train.schedule=constant --set train.warmup_steps=0 \
    --set checkpoint.every_steps=3 --set train.eval_every=3 > "$work/$1-$2.log" 2>&1 ||
    { cat "$work/$1-$2.log"; echo "FAIL: resume $1 $2"; exit 1; }
}
resume straight 6
resume stopped 3
resume stopped 6
python3 - "$work/stopped-6.log" <<'PY' || { cat "$work/stopped-6.log"; exit 1; }
import re, sys
reads = re.findall(r"read ([0-9.]+) of its ([0-9.]+) MB", open(sys.argv[1]).read())
assert len(reads) == 2, f"FAIL: {len(reads)} ranks said what they read, not 2"
for got, whole in reads:
    assert abs(2 * float(got) - float(whole)) <= 0.1, f"FAIL: a rank read {got} of {whole} MB"
print(f"each rank read {reads[0][0]} of the checkpoint's {reads[0][1]} MB")
PY
python3 "$tests/tools/same_losses.py" "$work/straight/metrics.jsonl" \
  "$work/stopped/metrics.jsonl" 6 1e-6
echo "dp2 zero-1 through NCCL: 3 steps then 3 resumed gave the losses of 6 without a stop"

# A rank that hangs (SIGSTOP: alive, silent) under tensor parallelism, whose all-reduces are
# stream-ordered: the other rank's calls return before their transfers, so its group's
# watchdog must abort the transfer at the 2 s deadline and the step fail with it, rather
# than the rank wait on the GPU for good; then the launcher stops both.
CUDA_VISIBLE_DEVICES=0,1 "$work/bin/drover" train "$work/job.yaml" --nproc 2 \
  --set output_dir="$work/hang" --set parallel.tp=2 --set train.steps=100000 \
  --set parallel.timeout_s=2 > "$work/hang.log" 2>&1 &
launcher=$!
rank1=""
for _ in $(seq 600); do
  rank1=$(grep -oP '\[rank 1\] .*drover-trainer .*pid \K[0-9]+' "$work/hang.log" | head -1 || true)
  steps=0
  [ -f "$work/hang/metrics.jsonl" ] && steps=$(wc -l < "$work/hang/metrics.jsonl")
  [ -n "$rank1" ] && [ "$steps" -gt 2 ] && break
  sleep 0.1
done
[ -n "$rank1" ] || { kill -9 $launcher; cat "$work/hang.log"; echo "FAIL: rank 1 never trained"; exit 1; }
kill -STOP "$rank1"
t0=$(date +%s.%N)
set +e
wait $launcher
rc=$?
set -e
kill -9 "$rank1" 2>/dev/null || true
took=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
[ "$rc" = 1 ] || { cat "$work/hang.log"; echo "FAIL: the hung tp2 job exited $rc, not 1"; exit 1; }
grep -q "not complete within 2000 ms (a peer hangs or is slow); communicator aborted" \
  "$work/hang.log" || { cat "$work/hang.log"; echo "FAIL: no deadline in the log"; exit 1; }
# 2 s deadline, then the launcher's stop of the frozen rank (SIGKILL after its grace).
python3 -c "import sys; sys.exit(0 if $took < 2 + 3 + 5 else 1)" ||
  { cat "$work/hang.log"; echo "FAIL: the hung job took $took s to fail"; exit 1; }
grep -m1 "communicator aborted" "$work/hang.log"
echo "a hung rank under tp2 failed its peer's stream-ordered transfer at the deadline ($took s)"

set +e
CUDA_VISIBLE_DEVICES=0 "$work/bin/drover" train "$work/job.yaml" --nproc 2 \
  --set output_dir="$work/shared" --set parallel.backend=nccl > "$work/shared.log" 2>&1
rc=$?
set -e
[ "$rc" = 2 ] || { cat "$work/shared.log"; echo "FAIL: nccl on one shared GPU exited $rc, not 2"; exit 1; }
grep -q "parallel.backend nccl: ranks 0 and 1 share the GPU" "$work/shared.log" ||
  { cat "$work/shared.log"; echo "FAIL: the refusal does not name the ranks"; exit 1; }
echo "NCCL groups on emulated GPUs gave the one-rank losses; a shared GPU was refused"
