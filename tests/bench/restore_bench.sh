#!/usr/bin/env bash
# What a resume costs each rank: `drover train --nproc NPROC` saves a checkpoint after one
# step, then resumes from it for one more, at each ZeRO stage; printed per stage are what a
# rank read of the checkpoint (the trainer's "read X of its Y MB") and the peak resident set
# of the largest rank, fresh and resuming, whose difference is what the restore held beyond
# training itself (tests/bench/README.md, "Resuming").
#
#   tests/bench/restore_bench.sh BUILD_DIR
#
# Environment: NPROC (4), STAGES ("0 1 3"), LAYERS (6), HEADS (8), CHANNELS (512),
# VOCAB (4096). Peak RSS comes from GNU time's %M, which for `drover train` is the largest
# trainer process it waited for. Exit 0 when every run succeeded, 1 otherwise.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
drover="$build/bin/drover"
[[ -x "$drover" ]] || { echo "restore_bench: $drover not built" >&2; exit 2; }
[[ -x /usr/bin/time ]] || { echo "restore_bench: needs GNU time (apt-get install time)" >&2; exit 2; }
nproc=${NPROC:-4}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

python3 "$(dirname "$0")/random_shard.py" "$out/train.bin" 100000
cat > "$out/job.yaml" <<YAML
name: restore-bench
output_dir: $out/run
model: {n_layer: ${LAYERS:-6}, n_head: ${HEADS:-8}, n_embd: ${CHANNELS:-512}, block_size: 64, vocab_size: ${VOCAB:-4096}}
data: {train: "$out/train.bin"}
train: {steps: 1, global_batch: $nproc, micro_batch: 1, seq_len: 64, warmup_steps: 0, eval_every: 0}
checkpoint: {every_steps: 1, keep_last: 2}
resources: {threads_per_rank: 1}
YAML

peak() {  # peak STAGE STEPS [--fresh] -> "<peak KB> <log>"
  local stage=$1 steps=$2
  shift 2
  /usr/bin/time -f "%M" -o "$out/rss" "$drover" train "$out/job.yaml" --nproc "$nproc" \
    --set parallel.zero_stage="$stage" --set train.steps="$steps" "$@" > "$out/log" 2>&1 ||
    { cat "$out/log"; echo "restore_bench: run failed (ZeRO-$stage, $steps steps)" >&2; exit 1; }
  cat "$out/rss"
}

printf '%-7s %-22s %14s %14s %14s\n' stage "read per rank" "fresh peak" "resume peak" "restore held"
for stage in ${STAGES:-0 1 3}; do
  rm -rf "$out/run"
  fresh=$(peak "$stage" 1 --fresh)
  resumed=$(peak "$stage" 2)
  read=$(grep -o 'read [0-9.]* of its [0-9.]* MB' "$out/log" | head -1 | sed 's/^read //')
  awk -v s="$stage" -v r="${read:-?}" -v f="$fresh" -v p="$resumed" 'BEGIN {
    printf "ZeRO-%-2s %-22s %10.1f MiB %10.1f MiB %10.1f MiB\n", s, r, f / 1024, p / 1024, (p - f) / 1024 }'
done
