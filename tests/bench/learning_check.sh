#!/usr/bin/env bash
# Learning check (issue 3, "Learning"): nanoGPT's small CPU Shakespeare recipe (4 layers,
# 4 heads, 128 channels, block 64, batch 12, 2000 iterations, lr 1e-3 cosine to 1e-4 after
# 100 warm-up steps, beta2 0.99, weight decay 0.1, clip 1.0; byte tokens, 90/10 split),
# trained once in PyTorch (tests/reference/train_shakespeare.py) and once by drover
# (`drover data prepare` + `drover train`), then both final models scored by the same
# evaluator on the same validation tokens.
#
#   tests/bench/learning_check.sh BUILD_DIR
#
# Environment: TEXT (default ../shared/data/tinyshakespeare.txt next to the repository),
# OUT (default runs/learning_check), STEPS (2000), THREADS (2, for both), EVAL_BATCHES (100
# windows of 12 x 64 tokens), SKIP_TORCH=1 to reuse an earlier PyTorch run in OUT.
# Prints both validation losses; exit 0 when both ran, 1 when a run failed, 2 on usage.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
repo=$(cd "$(dirname "$0")/../.." && pwd)
text=${TEXT:-$repo/../shared/data/tinyshakespeare.txt}
out=${OUT:-runs/learning_check}
steps=${STEPS:-2000}
threads=${THREADS:-2}
eval_batches=${EVAL_BATCHES:-100}
drover="$build/bin/drover"
ref="$repo/tests/reference/train_shakespeare.py"

[[ -f "$text" ]] || { echo "learning_check: no corpus at $text (set TEXT)" >&2; exit 2; }
[[ -x "$drover" ]] || { echo "learning_check: $drover not built" >&2; exit 2; }
py=""
for candidate in /usr/bin/python3 python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c "import torch" 2>/dev/null; then
    py=$candidate
    break
  fi
done
[[ -n "$py" ]] || { echo "learning_check: needs python3 with torch (Debian python3-torch)" >&2; exit 2; }
mkdir -p "$out"

echo "== PyTorch reference ($steps steps, $threads threads)"
if [[ "${SKIP_TORCH:-0}" == 1 && -f "$out/torch/result.json" ]]; then
  echo "(reusing $out/torch)"
else
  mkdir -p "$out/torch"
  "$py" "$ref" --text "$text" --out-dir "$out/torch" --steps "$steps" --threads "$threads" \
    --eval-batches "$eval_batches" | tee "$out/torch/log.txt"
  tail -n 1 "$out/torch/log.txt" > "$out/torch/result.json"
fi

echo "== drover ($steps steps, $threads threads)"
"$drover" data prepare "$text" --out "$out/data" --tokenizer byte --val-fraction 0.1
start=$(date +%s)
"$drover" train "$repo/deploy/examples/shakespeare-char.yaml" --fresh --threads "$threads" \
  --set "output_dir=$out/drover" --set "checkpoint.dir=$out/drover/ckpt" \
  --set "data.train=$out/data/train_*.bin" --set "data.val=$out/data/val.bin" \
  --set "train.steps=$steps" > "$out/drover_train.log" 2>&1 ||
  { tail -n 20 "$out/drover_train.log"; echo "learning_check: drover train failed" >&2; exit 1; }
drover_s=$(($(date +%s) - start))
tail -n 3 "$out/drover_train.log"

# Both models, one evaluator: PyTorch's reader of llm.c model files on PyTorch's val split;
# `drover eval` scores the same two files as a cross-check of the evaluators.
score() {  # MODEL -> val loss (PyTorch evaluator)
  "$py" "$ref" --eval-model "$1" --val "$out/torch/val.bin" --eval-batches "$eval_batches" \
    --threads "$threads" | tail -n 1 | "$py" -c "import json,sys; print(json.load(sys.stdin)['val_loss'])"
}
dscore() {  # MODEL -> val loss (drover eval)
  "$drover" eval "$1" --data "$out/torch/val.bin" --batches "$eval_batches" --batch 12 \
    --seq 64 --threads "$threads" --json | "$py" -c "import json,sys; print(json.load(sys.stdin)['loss'])"
}
torch_val=$(score "$out/torch/model.bin")
drover_val=$(score "$out/drover/model.bin")
torch_val_d=$(dscore "$out/torch/model.bin")
drover_val_d=$(dscore "$out/drover/model.bin")
torch_s=$("$py" -c "import json; print(json.load(open('$out/torch/result.json'))['train_s'])")

echo "== learning check: validation loss after $steps steps ($eval_batches x 12 x 64 val tokens)"
printf 'PyTorch reference: %.4f  (drover eval: %.4f)  train time %ss\n' "$torch_val" "$torch_val_d" "$torch_s"
printf 'drover:            %.4f  (drover eval: %.4f)  train time %ss (incl. evals, checkpoints)\n' \
  "$drover_val" "$drover_val_d" "$drover_s"
"$py" -c "print('difference drover - PyTorch: %+.4f' % ($drover_val - $torch_val))"
echo "== drover sample"
"$drover" sample "$out/drover/model.bin" --prompt "ROMEO:" --tokens 200 --seed 1 || true
