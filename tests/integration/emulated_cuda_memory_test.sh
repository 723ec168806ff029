#!/usr/bin/env bash
# A job too large for its GPU, on the kernel emulator (tests/cuda_emu/README.md) with a
# device of limited memory (DROVER_EMU_DEVICE_MEMORY): the trainer must not abort but say
# "out of GPU memory", with what was asked for, what the GPU had left and the settings that
# make a rank need less, and exit 1; and the same job with train.recompute: all, which keeps
# less activation memory, must then fit the same GPU and train.
#
# The limit is not a constant of this script: both runs are measured first on an unlimited
# emulated GPU (DROVER_EMU_REPORT_PEAK: the most device memory held at once), and the limit
# is halfway between their peaks.
#
#   emulated_cuda_memory_test.sh BIN_DIR EMULATED_PLUGIN
set -euo pipefail
bin=$1
plugin=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/bin"
cp "$bin/drover" "$bin/drover-trainer" "$plugin" "$work/bin/"
tests=$(cd "$(dirname "$0")/.." && pwd)
python3 "$tests/bench/random_shard.py" "$work/train.bin" 50000
cat > "$work/job.yaml" <<YAML
name: emulated-cuda-memory
model: {n_layer: 4, n_head: 2, n_embd: 64, block_size: 64, vocab_size: 256}
data: {train: "$work/train.bin"}
train: {steps: 2, global_batch: 8, micro_batch: 8, seq_len: 64, eval_every: 0}
precision: {dtype: bf16}
resources: {device: cuda}
checkpoint: {every_steps: 0}
YAML

train() {  # train RECOMPUTE OUT: the job, its output in $work/OUT.log; returns its exit code
  local rc=0
  "$work/bin/drover" train "$work/job.yaml" --set train.recompute="$1" \
    --set output_dir="$work/$2" > "$work/$2.log" 2>&1 || rc=$?
  return $rc
}
peak() {  # peak OUT: the emulated device's peak bytes in OUT.log
  sed -n 's/^emulated device memory peak: \([0-9]*\) bytes$/\1/p' "$work/$1.log"
}

export DROVER_EMU_REPORT_PEAK=1
train none kept || { cat "$work/kept.log"; exit 1; }
train all recomputed || { cat "$work/recomputed.log"; exit 1; }
kept=$(peak kept)
recomputed=$(peak recomputed)
echo "peak device memory: $kept bytes keeping the activations, $recomputed recomputing them"
[[ -n $kept && -n $recomputed && $recomputed -lt $kept ]] ||
  { echo "FAIL: recomputing did not lower the peak"; exit 1; }
unset DROVER_EMU_REPORT_PEAK

export DROVER_EMU_DEVICE_MEMORY=$(((kept + recomputed) / 2))
echo "an emulated GPU of $DROVER_EMU_DEVICE_MEMORY bytes"
rc=0
train none too-large || rc=$?
tail -1 "$work/too-large.log"
[[ $rc -eq 1 ]] || { cat "$work/too-large.log"; echo "FAIL: exit $rc, want 1"; exit 1; }
last=$(tail -1 "$work/too-large.log")
for want in "out of GPU memory:" "more was needed and the GPU has" "train.micro_batch" \
  "train.recompute: all" "parallel.zero_stage"; do
  [[ $last == *"$want"* ]] || { echo "FAIL: the last line lacks '$want'"; exit 1; }
done
train all fits || { cat "$work/fits.log"; echo "FAIL: recomputing did not fit"; exit 1; }
grep -q "training done at step 2" "$work/fits.log" || { cat "$work/fits.log"; exit 1; }
echo "too large for the GPU: said so and exited 1; with train.recompute all it trained"
