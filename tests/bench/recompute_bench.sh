#!/usr/bin/env bash
# What train.recompute trades: the same training run with every activation kept, with the
# first half of the layers recomputed in backward, and with all of them, in one go. For
# each: the median step time (steps 3 on), the activation memory the trainer reports
# (activation_mib: every activation buffer it holds) and the process's peak resident memory,
# each also as a ratio to the run that keeps everything (tests/bench/README.md,
# "Recomputation").
#
#   tests/bench/recompute_bench.sh BUILD_DIR
#
# Environment: STEPS (5), THREADS (2), LAYERS (12), HEADS (6), CHANNELS (384), VOCAB (50257),
# SEQ (256), BATCH (4), DTYPE (fp32); about 2 minutes on 2 cores (GPT-2 124M's shapes,
# CHANNELS=768 HEADS=12 BATCH=8, take 13 minutes there). Every run must give the same
# losses: they may differ in memory and time only. Exit 0 when every run succeeded and agreed.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
drover="$build/bin/drover"
[[ -x "$drover" ]] || { echo "recompute_bench: $drover not built" >&2; exit 2; }
steps=${STEPS:-5}
layers=${LAYERS:-12}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
here=$(cd "$(dirname "$0")" && pwd)
python3 "$here/random_shard.py" "$out/train.bin"

cat > "$out/job.yaml" <<YAML
name: recompute-bench
model: {n_layer: $layers, n_head: ${HEADS:-6}, n_embd: ${CHANNELS:-384}, block_size: ${SEQ:-256}, vocab_size: ${VOCAB:-50257}}
data: {train: "$out/train.bin"}
train: {steps: $steps, global_batch: ${BATCH:-4}, micro_batch: ${BATCH:-4}, seq_len: ${SEQ:-256}, eval_every: 0}
precision: {dtype: ${DTYPE:-fp32}}
checkpoint: {every_steps: 0}
YAML

for r in none $((layers / 2)) all; do
  /usr/bin/time -f "%M" -o "$out/rss-$r" "$drover" train "$out/job.yaml" --fresh \
    --threads "${THREADS:-2}" --set train.recompute=$r --set output_dir="$out/out-$r" \
    > "$out/log-$r" 2>&1 || { cat "$out/log-$r"; exit 1; }
done

python3 - "$out" none $((layers / 2)) all <<'PY'
import json, statistics, sys
out, runs = sys.argv[1], sys.argv[2:]
rows = {}
for r in runs:
    lines = [json.loads(l) for l in open(f"{out}/out-{r}/metrics.jsonl") if '"loss"' in l]
    rows[r] = dict(
        losses=[l["loss"] for l in lines],
        step_ms=statistics.median(l["step_ms"] for l in lines[2:]),
        act=lines[-1]["activation_mib"],
        rss=int(open(f"{out}/rss-{r}").read().split()[-1]) / 1024)
base = rows["none"]
print(f"{'recompute':>10} {'step_ms':>9} {'x none':>7} {'activation_mib':>15} {'x none':>7}"
      f" {'peak_rss_mib':>13} {'x none':>7}")
for r in runs:
    x = rows[r]
    print(f"{r:>10} {x['step_ms']:9.1f} {x['step_ms'] / base['step_ms']:7.2f} {x['act']:15.1f}"
          f" {x['act'] / base['act']:7.2f} {x['rss']:13.1f} {x['rss'] / base['rss']:7.2f}")
same = all(rows[r]["losses"] == base["losses"] for r in runs)
print("losses identical in every run:", same)
sys.exit(0 if same else 1)
PY
