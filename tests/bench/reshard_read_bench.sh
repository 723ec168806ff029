#!/usr/bin/env bash
# What a rank reads when a job resumes on another mesh than the one that saved: the shares
# of the new mesh cut across the old mesh's shard files. For each pair, `drover train`
# saves a checkpoint on the first mesh, then each rank of the second reads its share:
# printed are the most any rank read and the sum over the ranks, twice - from the files
# as written (1 MiB blocks, each with its CRC32C: a rank reads the blocks holding its
# elements) and from the same files with the block checksums taken out of the manifest (as
# an earlier writer left them: a file holding one element asked for is read whole).
#
#   tests/bench/reshard_read_bench.sh BUILD_DIR
#
# Environment: LAYERS (6), HEADS (8), CHANNELS (512), VOCAB (4096). Exit 0 when every run
# succeeded, 1 otherwise.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
drover="$build/bin/drover"
[[ -x "$drover" ]] || { echo "reshard_read_bench: $drover not built" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

python3 "$(dirname "$0")/random_shard.py" "$out/train.bin" 100000
cat > "$out/job.yaml" <<YAML
name: reshard-read-bench
output_dir: $out/run
model: {n_layer: ${LAYERS:-6}, n_head: ${HEADS:-8}, n_embd: ${CHANNELS:-512}, block_size: 64, vocab_size: ${VOCAB:-4096}}
data: {train: "$out/train.bin"}
train: {steps: 1, global_batch: 12, micro_batch: 1, seq_len: 64, warmup_steps: 0, eval_every: 0}
checkpoint: {every_steps: 1, keep_last: 3}
resources: {threads_per_rank: 1}
YAML

run() {  # run STEPS NPROC SETTINGS... -> the log in $out/log
  local steps=$1 nproc=$2
  shift 2
  local sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  "$drover" train "$out/job.yaml" --nproc "$nproc" --set train.steps="$steps" "${sets[@]}" \
    > "$out/log" 2>&1 || { cat "$out/log"; echo "reshard_read_bench: run failed" >&2; exit 1; }
}

# "<most> <sum>" of the ranks' "read X of its Y MB", in MB.
reads() {
  grep -o 'read [0-9.]* of its [0-9.]* MB' "$out/log" |
    awk '{ if ($2 > most) most = $2; sum += $2; total = $5 }
         END { printf "%.1f %.1f %.1f", most, sum, total }'
}

strip_blocks() {
  python3 - "$1" <<'PY'
import json, sys
path = sys.argv[1]
m = json.load(open(path))
for sh in m["shards"]:
    sh.pop("block_bytes", None)
    sh.pop("block_crc32c", None)
json.dump(m, open(path, "w"), indent=1)
PY
}

printf '%-34s %10s | %-22s | %-22s\n' "saved on -> resumed on" "ckpt MB" \
  "blocks: most / sum MB" "whole files: most / sum"
pair() {  # pair LABEL "NPROC SETTINGS..." "NPROC SETTINGS..."
  local label=$1 from=($2) to=($3)
  rm -rf "$out/run"
  run 1 "${from[@]}"
  run 2 "${to[@]}"
  read -r most sum total <<< "$(reads)"
  rm -rf "$out/run/ckpt/step_2"
  strip_blocks "$out/run/ckpt/step_1/manifest.json"
  run 2 "${to[@]}"
  read -r wmost wsum _ <<< "$(reads)"
  printf '%-34s %10s | %9s / %-10s | %9s / %-10s\n' "$label" "$total" "$most" "$sum" "$wmost" "$wsum"
}

pair "dp2 ZeRO-1 -> dp4 ZeRO-1" "2 parallel.zero_stage=1" "4 parallel.zero_stage=1"
pair "dp4 ZeRO-3 -> dp3 ZeRO-3" "4 parallel.zero_stage=3" "3 parallel.zero_stage=3"
pair "dp4 ZeRO-1 -> dp2 x tp2" "4 parallel.zero_stage=1" "4 parallel.tp=2 parallel.zero_stage=1"
pair "dp4 ZeRO-3 -> tp2" "4 parallel.zero_stage=3" "2 parallel.tp=2"
pair "dp2 x pp2 -> dp4" "4 parallel.pp=2" "4"
