#!/usr/bin/env bash
# Training time lost to checkpoints: the same run three times in one go (no checkpoints,
# asynchronous sharded checkpoints, synchronous ones) at GPT-2-small shapes, and what each
# checkpoint costs the run (tests/bench/README.md, "Checkpoints").
#
#   tests/bench/ckpt_bench.sh BUILD_DIR
#
# Environment: STEPS (16), EVERY (4: a checkpoint every EVERY steps), NPROC (1; 2 runs dp2
# with ZeRO-1, each rank writing its own shard), THREADS (2, in all), LAYERS (12), HEADS (12),
# CHANNELS (768), VOCAB (50257), SEQ (64), GLOBAL_BATCH (8), MICRO_BATCH (4).
#
# Every run ends with a final checkpoint that training waits for (the job is over), in both
# checkpointing runs; the cost of the periodic asynchronous ones is therefore
#   (wall_async - wall_none - final) / (checkpoints - 1), final = (wall_sync - wall_none) / checkpoints,
# and it is reported against the step time as the fraction of training lost at one checkpoint
# every 50 steps (the goal is under 2%). Exit 0 when every run succeeded, 1 otherwise.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
drover="$build/bin/drover"
[[ -x "$drover" ]] || { echo "ckpt_bench: $drover not built" >&2; exit 2; }
steps=${STEPS:-16}
every=${EVERY:-4}
nproc=${NPROC:-1}
threads=${THREADS:-2}
per_rank=$((threads / nproc > 0 ? threads / nproc : 1))
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

python3 "$(dirname "$0")/random_shard.py" "$out/train.bin"

run() {  # run NAME EVERY_STEPS ASYNC -> prints wall seconds
  local name=$1 ck_every=$2 async=$3
  cat > "$out/$name.yaml" <<YAML
name: ckpt-bench-$name
output_dir: $out/$name
model: {n_layer: ${LAYERS:-12}, n_head: ${HEADS:-12}, n_embd: ${CHANNELS:-768}, block_size: 1024, vocab_size: ${VOCAB:-50257}}
data: {train: $out/train.bin}
train: {steps: $steps, global_batch: ${GLOBAL_BATCH:-8}, micro_batch: ${MICRO_BATCH:-4}, seq_len: ${SEQ:-64}, lr: 1.0e-4, warmup_steps: 1, eval_every: 0, log_every: 1}
parallel: {timeout_s: 600, zero_stage: $([[ $nproc -gt 1 ]] && echo 1 || echo 0)}
resources: {world_size: {min: $nproc, max: $nproc}}
checkpoint: {every_steps: $ck_every, keep_last: 2, async: $async}
YAML
  local t0 t1
  t0=$(date +%s.%N)
  if ! "$drover" train "$out/$name.yaml" --nproc "$nproc" --threads "$per_rank" > "$out/$name.log" 2>&1; then
    echo "ckpt_bench: run $name failed; its log:" >&2
    tail -20 "$out/$name.log" >&2
    return 1
  fi
  t1=$(date +%s.%N)
  python3 -c "print($t1 - $t0)"
}

echo "ckpt_bench: $steps steps, a checkpoint every $every, $nproc rank(s) x $per_rank thread(s)"
none=$(run none 0 true)
async=$(run async "$every" true)
sync=$(run sync "$every" false)
python3 - "$out" "$none" "$async" "$sync" "$steps" "$every" <<'PY'
import json, os, sys
out, none, async_, sync, steps, every = sys.argv[1], *map(float, sys.argv[2:5]), int(sys.argv[5]), int(sys.argv[6])
def step_ms(name):
    with open(os.path.join(out, name, "metrics.jsonl")) as f:
        ms = [json.loads(l)["step_ms"] for l in f][1:]  # the first step warms up
    return sum(ms) / len(ms)
size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(os.path.join(out, "async", "ckpt")) for f in fs) / 2
n = steps // every
final = (sync - none) / n
periodic = (async_ - none - final) / (n - 1) if n > 1 else float("nan")
step = step_ms("none") / 1000
print(f"step time (no checkpoints)     {step * 1000:9.1f} ms")
print(f"checkpoint size                {size / 2**20:9.1f} MiB")
print(f"wall: none / async / sync      {none:9.1f} / {async_:.1f} / {sync:.1f} s   ({n} checkpoints each)")
print(f"synchronous checkpoint         {final:9.2f} s each   = {100 * final / (50 * step):5.2f}% of training at one every 50 steps")
print(f"asynchronous checkpoint        {periodic:9.2f} s each   = {100 * periodic / (50 * step):5.2f}% of training at one every 50 steps (goal < 2%)")
PY
