#!/usr/bin/env bash
# Parallel training modes at GPT-2-small shapes, each against one process with the same
# total threads, in one run (tests/bench/README.md, "Parallel training"):
#   - step time and tokens/s of dp2, ZeRO-1/2/3 x dp2, pp2 (GPipe, 1F1B and interleaved 1F1B
#     with two chunks per stage) and tp2, each as
#     2 ranks x THREADS/2 threads, against 1 rank x THREADS threads;
#   - the fraction of data-parallel communication hidden behind backward;
#   - bytes per rank for parameters, gradients, AdamW state and ZeRO's transient buffers,
#     against ZeRO's formulas for P parameters on N ranks;
#   - the pipeline bubble measured on stage 0 against (p - 1) / (v m + p - 1), v chunks;
#   - each collective's bus bandwidth on loopback against memcpy (bench_comm_bench).
#
#   tests/bench/parallel_bench.sh BUILD_DIR
#
# Environment: STEPS (4; the first is a warm-up and not counted), THREADS (2), LAYERS (12),
# HEADS (12), CHANNELS (768), VOCAB (50257), SEQ (64), GLOBAL_BATCH (8), MICRO_BATCH (4),
# PP_LAYERS (9,3: the balanced pipeline's parallel.pp_layers),
# MODES (a space-separated subset of the runs below; default all), COMM=0 to skip the
# collectives. Exit 0 when every run succeeded, 1 when one failed, 2 on usage.
#
# The pipeline runs twice: at GPT-2's vocabulary, where the last stage also computes the
# 50257-way LM head (about as much work as six layers) and the first stage waits on it, and
# at a 256-token vocabulary ("_v256"), where the two stages are balanced and the measured
# bubble is the schedule's own.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
drover="$build/bin/drover"
[[ -x "$drover" ]] || { echo "parallel_bench: $drover not built" >&2; exit 2; }
steps=${STEPS:-4}
threads=${THREADS:-2}
half=$((threads / 2 > 0 ? threads / 2 : 1))
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

python3 "$(dirname "$0")/random_shard.py" "$out/train.bin"

cat > "$out/spec.yaml" <<EOF
name: parallel-bench
model: {n_layer: ${LAYERS:-12}, n_head: ${HEADS:-12}, n_embd: ${CHANNELS:-768}, block_size: 1024, vocab_size: ${VOCAB:-50257}}
data: {train: $out/train.bin}
train: {steps: $steps, global_batch: ${GLOBAL_BATCH:-8}, micro_batch: ${MICRO_BATCH:-4}, seq_len: ${SEQ:-64}, lr: 1.0e-4, warmup_steps: 1, eval_every: 0, log_every: 1}
parallel: {timeout_s: 600}
checkpoint: {every_steps: 0}
EOF

failed=0
modes=" ${MODES:-single dp2 zero1 zero2 zero3 pp2_gpipe pp2_1f1b pp2_1f1b_balanced pp2_interleaved pp2_gpipe_v256 pp2_1f1b_v256 pp2_interleaved_v256 single_v256 tp2} "
run() {  # name nproc threads [--set k=v]...
  local name=$1 nproc=$2 t=$3
  shift 3
  [[ "$modes" == *" $name "* ]] || return 0
  echo "== $name: $nproc rank(s) x $t thread(s) $*"
  if ! "$drover" train "$out/spec.yaml" --fresh --nproc "$nproc" --threads "$t" \
      --set "output_dir=$out/$name" "$@" > "$out/$name.log" 2>&1; then
    tail -n 15 "$out/$name.log"
    echo "parallel_bench: $name failed" >&2
    failed=1
  fi
}

run single 1 "$threads"
run dp2 2 "$half"
run zero1 2 "$half" --set parallel.zero_stage=1
run zero2 2 "$half" --set parallel.zero_stage=2
run zero3 2 "$half" --set parallel.zero_stage=3
# Pipelines run global_batch / micro_batch micro-batches: 8 of 1 sequence by default.
run pp2_gpipe 2 "$half" --set parallel.pp=2 --set parallel.pp_schedule=gpipe --set train.micro_batch=1
run pp2_1f1b 2 "$half" --set parallel.pp=2 --set parallel.pp_schedule=1f1b --set train.micro_batch=1
# The same 1F1B pipeline with the stages' layers balanced for the LM head (parallel.pp_layers:
# PP_LAYERS, default 9,3, what the trainer suggests for the default 12-layer model).
run pp2_1f1b_balanced 2 "$half" --set parallel.pp=2 --set parallel.pp_schedule=1f1b \
  --set train.micro_batch=1 --set parallel.pp_layers="${PP_LAYERS:-9,3}"
# Interleaved 1F1B, two chunks of n_layer / 4 layers per stage.
run pp2_interleaved 2 "$half" --set parallel.pp=2 --set parallel.pp_schedule=interleaved \
  --set train.micro_batch=1
small=(--set model.vocab_size=256)
run pp2_gpipe_v256 2 "$half" "${small[@]}" --set parallel.pp=2 --set parallel.pp_schedule=gpipe \
  --set train.micro_batch=1
run pp2_1f1b_v256 2 "$half" "${small[@]}" --set parallel.pp=2 --set parallel.pp_schedule=1f1b \
  --set train.micro_batch=1
run pp2_interleaved_v256 2 "$half" "${small[@]}" --set parallel.pp=2 \
  --set parallel.pp_schedule=interleaved --set train.micro_batch=1
run single_v256 1 "$threads" "${small[@]}"
run tp2 2 "$half" --set parallel.tp=2

python3 - "$out" "${GLOBAL_BATCH:-8}" "${SEQ:-64}" <<'EOF'
import json, os, statistics, sys
out, global_batch, seq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def runs():
    for name in ["single", "dp2", "zero1", "zero2", "zero3", "pp2_gpipe", "pp2_1f1b",
                 "pp2_1f1b_balanced", "pp2_interleaved", "tp2", "single_v256", "pp2_gpipe_v256",
                 "pp2_1f1b_v256", "pp2_interleaved_v256"]:
        path = os.path.join(out, name, "metrics.jsonl")
        if os.path.exists(path):
            lines = [json.loads(l) for l in open(path)]
            if len(lines) > 1:
                yield name, lines[1:]  # the first step warms up (allocation, page faults)
rows = dict(runs())
if "single" not in rows:
    sys.exit("no single-process run to compare with")
def step_ms(name):
    return statistics.median(m["step_ms"] for m in rows[name])
print(f"\n== step time (median of the timed steps; {global_batch * seq} tokens per step)")
print(f"{'mode':<18} {'mesh':<22} {'step ms':>9} {'tokens/s':>9} {'vs 1 proc':>9}")
print("(the _v256 runs compare with single_v256: the same model with a 256-token vocabulary)")
for name, ms in rows.items():
    m0 = ms[0]
    step = step_ms(name)
    base = step_ms("single_v256" if name.endswith("_v256") and "single_v256" in rows else "single")
    mesh = f"dp{m0['dp']} pp{m0['pp']} tp{m0['tp']} zero{m0['zero_stage']}"
    print(f"{name:<18} {mesh:<22} {step:9.0f} {statistics.median(m['tokens_per_s'] for m in ms):9.1f}"
          f" {base / step:8.2f}x")

print("\n== data-parallel communication hidden behind forward and backward (1 - waited / busy)")
print("   (gradient reduction, and ZeRO-3's parameter gathers; ZeRO-1/2's all-gather of the")
print("   updated parameters after the optimizer cannot hide there and is shown apart)")
for name in ["dp2", "zero1", "zero2", "zero3"]:
    if name in rows:
        n = len(rows[name])
        comm = sum(m["comm_ms"] for m in rows[name])
        wait = sum(m["comm_wait_ms"] for m in rows[name])
        publish = sum(m.get("publish_ms", 0) for m in rows[name])
        hidden = 1 - wait / comm if comm > 0 else float("nan")
        print(f"{name:<10} busy {comm / n:7.0f} ms/step  waited {wait / n:6.0f} ms/step  hidden "
              f"{100 * hidden:5.1f}% (goal >= 80%)   parameter all-gather {publish / n:5.0f} ms/step")

print("\n== bytes per rank (MiB) against ZeRO's formulas, fp32, N = 2")
if "single" in rows:
    P = rows["single"][-1]["param_mib"]  # 4P bytes, in MiB
    N = 2
    formulas = {"dp2": (P, P, 2 * P), "zero1": (P, P, 2 * P / N),
                "zero2": (P, P / N, 2 * P / N), "zero3": (P / N, P / N, 2 * P / N)}
    print(f"{'mode':<8} {'params':>9} {'grads':>9} {'adam':>9} {'working':>9} {'total':>9}"
          f" {'formula':>9}   formula terms")
    for name, (fp, fg, fo) in formulas.items():
        if name in rows:
            m = rows[name][-1]
            total = m["param_mib"] + m["grad_mib"] + m["optimizer_mib"] + m["working_mib"]
            print(f"{name:<8} {m['param_mib']:9.1f} {m['grad_mib']:9.1f} {m['optimizer_mib']:9.1f}"
                  f" {m['working_mib']:9.1f} {total:9.1f} {fp + fg + fo:9.1f}   "
                  f"{fp:.1f} + {fg:.1f} + {fo:.1f}" + (" + gathered working set" if name in ("zero2", "zero3") else ""))

print("\n== pipeline bubble on stage 0 (time blocked on the next stage / step) vs (p-1)/(v m+p-1)")
for name in ["pp2_gpipe", "pp2_1f1b", "pp2_1f1b_balanced", "pp2_interleaved", "pp2_gpipe_v256",
             "pp2_1f1b_v256", "pp2_interleaved_v256"]:
    if name in rows:
        ms = rows[name]
        p, v = ms[0]["pp"], ms[0].get("pp_chunks", 1)
        m = global_batch  # micro-batches of one sequence, as the runs set it
        bubble = statistics.median(x["pp_wait_ms"] / x["step_ms"] for x in ms)
        ideal = (p - 1) / (v * m + p - 1)
        print(f"{name:<20} measured {100 * bubble:5.1f}%   ideal {100 * ideal:5.1f}%"
              f"   (p = {p}, v = {v}, m = {m})")
EOF

if [[ "${COMM:-1}" == 1 && -x "$build/bin/bench_comm_bench" ]]; then
  echo
  echo "== collectives on loopback (bench_comm_bench --ranks 2)"
  "$build/bin/bench_comm_bench" --ranks 2 --sizes-mib 1,16,64
fi
exit $failed
