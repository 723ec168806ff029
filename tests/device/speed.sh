#!/usr/bin/env bash
# The device check's speed step (issue 9): drover and PyTorch (eager and torch.compile) train
# the same GPT-2 shapes at T=1024 in bf16 with the same batch on the same GPU, one after the
# other. Prints, for each: tokens/s, step time, MFU against the bf16 GEMM rate the PyTorch
# script measures first on this GPU, and peak GPU memory. Information, not a pass/fail.
#
#   tests/device/speed.sh PACK|BIN_DIR [MODEL [BATCH [STEPS]]]     MODEL: 124m | 350m | 774m
#
# check.sh runs it for 124m at batch 32 with the programs it unpacked (BIN_DIR, environment
# set); as a device call of its own, for a larger model when device time is left, give it
# the pack (carry build/device-pack.tar.xz):
#   tests/device/speed.sh build/device-pack.tar.xz 350m 16
# (350m at batch 16 fits drover's storage, fp32 residual stream and bf16 operand buffers,
# easily on an H200). DROVER_SPEED_RECOMPUTE=all (or a count of layers) trains drover with
# train.recompute so: a larger batch or model in the same memory, for a forward more.
# DROVER_SPEED_TILES=forward=..,dq=..,dkv=.. trains a second time with those fused attention
# tiles (DROVER_CUDA_ATTENTION_TILES) instead of the fastest that bench_attention_tiles names.
set -uo pipefail
bin=${1:?PACK or BIN_DIR}
model=${2:-124m}
batch=${3:-32}
steps=${4:-12}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
source "$here/pack_env.sh"
if [[ -f $bin ]]; then
  unpack_device_pack "$bin" "$work" || exit 1
fi

# DROVER_SPEED_DEVICE=cpu is a dry run of this script on a machine without a GPU (at T=64;
# e.g. `DROVER_SPEED_DEVICE=cpu tests/device/speed.sh build/bin tiny 4 3`): its numbers
# mean nothing, but every command and parser in it runs.
device=${DROVER_SPEED_DEVICE:-cuda}
T=1024
torch_args=()
if [[ $device == cpu ]]; then
  T=64
  torch_args=(--device cpu --T 64 --peak-tflops 1)
fi
gpt2_shape "$model" || exit 2
echo "==== speed (information): GPT-2 $model, T=$T, bf16, batch $batch, on $device"

# Random tokens (the data does not change the speed).
python3 "$here/../bench/random_shard.py" "$work/train.bin" 2000000
gpt2_job "speed-$model" "$work/out" "$work/train.bin" "$steps" "$batch" "$device" \
  "${DROVER_SPEED_RECOMPUTE:-none}" > "$work/speed.yaml"
# The fused attention at this shape in each tile shape and occupancy, kernel by kernel
# (tests/bench/attention_tiles_bench.cu; head size 64 only). Its last line names the fastest
# choice the table offers (DROVER_CUDA_ATTENTION_TILES), which drover trains with too below
# when it is not the table's default.
fastest=""
if [[ $device == cuda && -x $bin/bench_attention_tiles && $((C / NH)) -eq 64 ]]; then
  timeout 60 "$bin/bench_attention_tiles" "$batch" "$T" "$C" "$NH" "$L" > "$work/tiles.txt" 2>&1 ||
    echo "bench_attention_tiles exited $?"
  cat "$work/tiles.txt"
  fastest=$(sed -n 's/^fastest tiles: DROVER_CUDA_ATTENTION_TILES=\([^ ]*\) .*/\1/p' "$work/tiles.txt")
fi
[[ -n ${DROVER_SPEED_TILES:-} ]] && fastest=$DROVER_SPEED_TILES  # a choice to time, given

# drover_run OUT [VAR=VALUE...]: trains the job into OUT (metrics.jsonl) with the GPU's memory
# sampled into OUT.mem; prints its last lines and the CUDA backend's warnings.
drover_run() {
  local out=$1
  shift
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$out.mem" 2>/dev/null &
  local smi=$!
  env "$@" timeout 150 "$bin/drover" train "$work/speed.yaml" --set output_dir="$out" > "$out.txt" 2>&1
  local rc=$?
  kill "$smi" 2>/dev/null
  tail -4 "$out.txt"
  # The CUDA backend's messages (a GEMM that cuBLASLt had no algorithm for, say).
  grep 'drover cuda:' "$out.txt" | sort | uniq -c | head -10
  [[ $rc -eq 0 ]] || echo "drover train exited $rc"
}
drover_run "$work/out"
if [[ -n $fastest && $fastest != "forward=16x64,dq=3,dkv=3" ]]; then
  echo "---- drover with the fastest tiles: DROVER_CUDA_ATTENTION_TILES=$fastest"
  drover_run "$work/out-tiles" DROVER_CUDA_ATTENTION_TILES="$fastest"
fi
# DROVER_SPEED_PROFILE=0 leaves out the op profiles below, DROVER_SPEED_TORCH=0 PyTorch (the
# MFU is then against DROVER_SPEED_PEAK_TFLOPS, a GEMM rate measured earlier, if given).
if [[ ${DROVER_SPEED_PROFILE:-1} == 1 ]]; then
  # Where drover's step time goes, op by op (each op synchronised, so no overlap), with the
  # fused attention on mma.sync register tiles, then on wmma tiles, then with the GEMM version
  # (which keeps the T x T probabilities).
  timeout 90 "$bin/drover" train "$work/speed.yaml" --set train.steps=4 \
    --set output_dir="$work/out-profile" --profile-ops 2>&1 | sed -n '/^ops profile/,$p'
  echo "---- the same with DROVER_CUDA_ATTENTION=wmma"
  DROVER_CUDA_ATTENTION=wmma timeout 90 "$bin/drover" train "$work/speed.yaml" --set train.steps=4 \
    --set output_dir="$work/out-profile-wmma" --profile-ops 2>&1 | sed -n '/^ops profile/,$p'
  echo "---- the same with DROVER_CUDA_ATTENTION=gemms"
  DROVER_CUDA_ATTENTION=gemms timeout 90 "$bin/drover" train "$work/speed.yaml" --set train.steps=4 \
    --set output_dir="$work/out-profile-gemms" --profile-ops 2>&1 | sed -n '/^ops profile/,$p'
  echo "---- the same with DROVER_CUDA_GEMM_INPUTS=fp32 (fp32 operand buffers, GEMMs on fp32 inputs)"
  DROVER_CUDA_GEMM_INPUTS=fp32 timeout 90 "$bin/drover" train "$work/speed.yaml" --set train.steps=4 \
    --set output_dir="$work/out-profile-fp32-inputs" --profile-ops 2>&1 | sed -n '/^ops profile/,$p'
fi
# PyTorch after drover (drover's numbers matter more if time runs out); it measures the
# GEMM rate that both MFUs are against.
peak=${DROVER_SPEED_PEAK_TFLOPS:-}
if [[ ${DROVER_SPEED_TORCH:-1} == 1 ]]; then
  without_pack_libs timeout 300 python3 "$here/torch_gpt2_bench.py" --model "$model" \
    --batches "$batch" --steps "$steps" "${torch_args[@]}" > "$work/torch.txt" 2>&1
  tail -8 "$work/torch.txt"
  peak=$(python3 -c 'import json,sys
for l in open(sys.argv[1]):
    if "bf16_gemm_tflops_measured" in l: print(json.loads(l)["bf16_gemm_tflops_measured"])' \
    "$work/torch.txt" 2>/dev/null)
fi

# One JSON line a drover run: its median steady tokens/s, step time, MFU and peak memory.
drover_summary() {
  python3 - "$1/metrics.jsonl" "$1.mem" "$L" "$C" "${peak:-0}" "$model" "$batch" "$T" "$2" <<'PY'
import json, statistics, sys
metrics, mem, L, C, peak, model, batch, T, mode = sys.argv[1:]
L, C, peak, T, V = int(L), int(C), float(peak), int(T), 50257
try:
    rows = [json.loads(l) for l in open(metrics) if '"tokens_per_s"' in l]
except OSError:
    rows = []
steady = [r["tokens_per_s"] for r in rows[2:]] or [r["tokens_per_s"] for r in rows]
if not steady:
    print(mode + ": no steps recorded"); sys.exit(0)
tps = statistics.median(steady)
params = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
tflops = (6 * params + 12 * L * C * T) * tps / 1e12
try:
    peak_mib = max(int(x) for x in open(mem) if x.strip().isdigit())
except (OSError, ValueError):
    peak_mib = 0
print(json.dumps({"model": model, "mode": mode, "batch": int(batch),
                  "activation_gib": round(rows[-1].get("activation_mib", 0) / 1024, 2),
                  "tokens_per_s": round(tps), "step_ms": round(int(batch) * T / tps * 1e3, 1),
                  "tflops": round(tflops, 1), "mfu": round(tflops / peak, 3) if peak else None,
                  "peak_mem_gib (nvidia-smi, whole gpu)": round(peak_mib / 1024, 2)}))
PY
}
drover_summary "$work/out" drover
if [[ -d $work/out-tiles ]]; then drover_summary "$work/out-tiles" "drover (tiles $fastest)"; fi
