#!/usr/bin/env bash
# Step 4b of the device check (two ranks sharing the GPU give the one-rank losses) run on the
# kernel emulator (tests/cuda_emu/README.md): drover and drover-trainer are copied next to the
# emulated libdrover_cuda.so, so that `resources.device: cuda` jobs run the CUDA kernel
# table's code on the CPU. Two ranks then go through the real multi-rank CUDA path: process
# groups staged through the table's page-locked host memory, ToHost/FromHost, IsDeviceMemory.
# dp2 with ZeRO-1 and ZeRO-3, 10 steps each, must give the one-rank losses within 1e-5, and
# its validation losses at steps 5 and 10. (A plugin that failed to load would fail the job:
# resources.device cuda has no fallback.)
# Both ranks are on the one emulated GPU, so parallel.backend auto must pick Gloo (NCCL
# refuses two ranks on one GPU); emulated_cuda_nccl_test.sh gives each rank its own.
# Then a stop and resume from a checkpoint saved from the device, against a run without one,
# and one rank in bf16 recomputing every layer's activations in backward (train.recompute;
# the fused attention on mma.sync tiles recomputed too) against keeping them: the same
# losses exactly (check.sh's step 4c).
# With the stand-in driver (FAKE_DRIVER, as libcuda.so.1, naming the GPU an H200), each rank's
# MFU counts its share of the GPU: the two ranks' job reports the one rank's MFU for the same
# tokens/s, not half of it.
#
#   emulated_cuda_ranks_test.sh BIN_DIR EMULATED_PLUGIN [FAKE_DRIVER]
set -euo pipefail
bin=$1
plugin=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/bin"
if [[ -n ${3:-} ]]; then
  mkdir "$work/driver"
  ln -s "$(realpath "$3")" "$work/driver/libcuda.so.1"
  export LD_LIBRARY_PATH=$work/driver${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export DROVER_FAKE_GPUS="NVIDIA H200,141,90"
fi
cp "$bin/drover" "$bin/drover-trainer" "$plugin" "$work/bin/"
tests=$(cd "$(dirname "$0")/.." && pwd)
python3 "$tests/bench/random_shard.py" "$work/train.bin" 50000
python3 "$tests/bench/random_shard.py" "$work/val.bin" 5000
cat > "$work/dp.yaml" <<YAML
name: emulated-cuda-ranks
model: {n_layer: 2, n_head: 2, n_embd: 64, block_size: 32, vocab_size: 256}
data: {train: "$work/train.bin", val: "$work/val.bin"}
train: {steps: 10, global_batch: 8, micro_batch: 2, seq_len: 32, eval_every: 5, eval_batches: 2}
resources: {device: cuda, world_size: {min: 1, max: 2}}
checkpoint: {every_steps: 0}
YAML
for zero in 1 3; do
  "$work/bin/drover" train "$work/dp.yaml" --set output_dir="$work/one-$zero" \
    --set parallel.zero_stage=$zero > "$work/one-$zero.log" 2>&1 ||
    { cat "$work/one-$zero.log"; exit 1; }
  CUDA_VISIBLE_DEVICES=0 "$work/bin/drover" train "$work/dp.yaml" --nproc 2 \
    --set output_dir="$work/two-$zero" --set parallel.zero_stage=$zero > "$work/two-$zero.log" 2>&1 ||
    { cat "$work/two-$zero.log"; exit 1; }
  grep -q "ranks connected through Gloo (ranks 0 and 1 share the GPU" "$work/two-$zero.log" ||
    { cat "$work/two-$zero.log"; echo "FAIL: two ranks on one GPU did not fall back to Gloo"; exit 1; }
  echo "zero-$zero: one rank (reference), two ranks"
  python3 "$tests/tools/same_losses.py" "$work/one-$zero/metrics.jsonl" \
    "$work/two-$zero/metrics.jsonl" 10 1e-5
  # No device allocation inside a step after the first two (the scratch buffers' growth).
  python3 "$tests/tools/no_step_allocations.py" "$work/one-$zero/metrics.jsonl" 3
  python3 "$tests/tools/no_step_allocations.py" "$work/two-$zero/metrics.jsonl" 3
done
echo "two emulated-cuda ranks gave the one-rank losses, zero-1 and zero-3"
if [[ -n ${3:-} ]]; then
  python3 - "$work/one-1/metrics.jsonl" "$work/two-1/metrics.jsonl" <<'PY'
import json, sys
# MFU per token/s: the model's FLOPs a token over the job's peak, the same for one rank on the
# GPU and for two ranks sharing it.
def per_token(path):
    rows = [json.loads(line) for line in open(path) if '"step"' in line]
    rows = [r for r in rows if r.get("tokens_per_s", 0) > 0]
    if not rows or any("mfu" not in r for r in rows):
        sys.exit(f"FAIL: {path} has steps without an mfu")
    return [r["mfu"] / r["tokens_per_s"] for r in rows]
one, two = per_token(sys.argv[1]), per_token(sys.argv[2])
ratio = two[-1] / one[-1]
if abs(ratio - 1) > 1e-3:
    sys.exit(f"FAIL: two ranks sharing the GPU report {ratio:.3f} x the one rank's MFU per token/s")
print(f"MFU per token/s: one rank {one[-1]:.3e}, two ranks sharing the GPU {two[-1]:.3e}")
PY
fi

# A resume on the emulated device, where device work runs behind the host: two ranks with
# ZeRO-3 train 5 steps and save a checkpoint (each rank's shard copied from the device into
# page-locked memory), then resume from it for 5 more. The 10 losses must be those of 10
# steps without the stop (a constant learning rate, so that train.steps does not change the
# schedule).
resume() {  # resume OUT STEPS
  CUDA_VISIBLE_DEVICES=0 "$work/bin/drover" train "$work/dp.yaml" --nproc 2 \
    --set output_dir="$work/$1" --set parallel.zero_stage=3 --set train.steps=$2 \
    --set train.schedule=constant --set train.warmup_steps=0 \
    --set checkpoint.every_steps=5 > "$work/$1-$2.log" 2>&1 ||
    { cat "$work/$1-$2.log"; exit 1; }
}
resume straight 10
resume stopped 5
resume stopped 10
grep -q "resumed from checkpoint" "$work/stopped-10.log" ||
  { cat "$work/stopped-10.log"; echo "FAIL: the second run did not resume"; exit 1; }
echo "zero-3 over two ranks: 10 steps (reference), 5 steps then 5 resumed"
python3 "$tests/tools/same_losses.py" "$work/straight/metrics.jsonl" \
  "$work/stopped/metrics.jsonl" 10 1e-6
echo "a resume on the emulated device gave the losses of the run without a stop"

# HellaSwag scored as the job trains (data.hellaswag), on the device: its rows are half of
# seq_len (ChoiceBatches: the longest fits 16), so each evaluation lays the activations out
# for them and back. Two ZeRO-3 ranks with it train exactly as without it, and score what one
# rank on the CPU scores.
python3 - "$work/hs.jsonl" <<'PY'
import json, random, sys
rng = random.Random(7)
words = ["ab", "cd", "ef", "gh", "ij"]
with open(sys.argv[1], "w") as f:
    for e in range(6):
        ctx = " ".join(rng.choice(words) for _ in range(2))
        endings = [" " + rng.choice(words) + "x" * i for i in range(4)]
        f.write(json.dumps({"ctx": ctx, "endings": endings, "label": e % 4}) + "\n")
PY
"$work/bin/drover" data hellaswag "$work/hs.jsonl" --out "$work/hs.bin" > /dev/null
CUDA_VISIBLE_DEVICES=0 "$work/bin/drover" train "$work/dp.yaml" --nproc 2 \
  --set output_dir="$work/hs-3" --set parallel.zero_stage=3 --set data.hellaswag="$work/hs.bin" \
  > "$work/hs-3.log" 2>&1 || { cat "$work/hs-3.log"; exit 1; }
grep -q "data.hellaswag: 6 examples, 24 endings in rows of 16 positions, 4 a batch" \
  "$work/hs-3.log" || { cat "$work/hs-3.log"; echo "FAIL: not rows of 16"; exit 1; }
echo "zero-3 over two ranks: without data.hellaswag (reference), with it"
python3 "$tests/tools/same_losses.py" "$work/two-3/metrics.jsonl" "$work/hs-3/metrics.jsonl" 10 0
python3 "$tests/tools/no_step_allocations.py" "$work/hs-3/metrics.jsonl" 3
"$work/bin/drover" train "$work/dp.yaml" --set output_dir="$work/hs-cpu" \
  --set resources.device=cpu --set data.hellaswag="$work/hs.bin" > "$work/hs-cpu.log" 2>&1 ||
  { cat "$work/hs-cpu.log"; exit 1; }
echo "data.hellaswag: one rank on the CPU (reference), two ZeRO-3 ranks on the device"
python3 "$tests/tools/same_losses.py" "$work/hs-cpu/metrics.jsonl" "$work/hs-3/metrics.jsonl" 10 1e-4
echo "HellaSwag in short rows on the emulated device left the training as it was"

for r in none all; do
  "$work/bin/drover" train "$work/dp.yaml" --set output_dir="$work/recompute-$r" \
    --set precision.dtype=bf16 --set train.recompute=$r > "$work/recompute-$r.log" 2>&1 ||
    { cat "$work/recompute-$r.log"; exit 1; }
done
echo "bf16, one rank: activations kept (reference), every layer recomputed"
python3 "$tests/tools/same_losses.py" "$work/recompute-none/metrics.jsonl" \
  "$work/recompute-all/metrics.jsonl" 10 0
echo "recomputing the activations on the emulated device gave the losses of keeping them"
