#!/usr/bin/env bash
# drover eval and drover sample with --device cuda, on the kernel emulator (tests/cuda_emu/
# README.md): drover is copied next to the emulated libdrover_cuda.so, so that --device cuda
# runs the CUDA kernel table's code on the CPU. Against --device cpu on the same model:
#   - eval --data: the loss within 1e-4 (fp32) and 1e-2 (bf16, each table narrowing in its own
#     way), and the JSON names the device and precision it was computed on;
#   - eval --hellaswag: the same picks (acc and acc_norm) in fp32;
#   - sample --temperature 0: the same greedy text, a prompt longer than the block size
#     included (the window's last tokens).
# Then the build's own drover (whose plugin, where built, finds no GPU here) refuses
# --device cuda with the usage exit code, naming the flag: it never falls back to the CPU.
#
#   emulated_cuda_eval_test.sh BIN_DIR EMULATED_PLUGIN
set -euo pipefail
bin=$1
plugin=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/bin"
cp "$bin/drover" "$plugin" "$work/bin/"
tests=$(cd "$(dirname "$0")/.." && pwd)
python3 "$tests/bench/random_shard.py" "$work/val.bin" 5000
"$bin/drover-gpt-logits" write "$work/model.bin" --layers 2 --heads 2 --embd 64 --vocab 256 \
  --block 32 --seed 3 > /dev/null
drover=$work/bin/drover

field() {  # JSON KEY -> value
  python3 -c 'import json, sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"
}
close() {  # GOT WANT RTOL WHAT
  python3 -c '
import sys
got, want, rtol = map(float, sys.argv[1:4])
ok = abs(got - want) <= rtol * abs(want)
print("%s: cuda %.7f, cpu %.7f, %s" % (sys.argv[4], got, want, "ok" if ok else "FAIL"))
sys.exit(0 if ok else 1)' "$@"
}

for precision in fp32 bf16; do
  args=(eval "$work/model.bin" --data "$work/val.bin" --batches 2 --batch 2 --seq 32
        --precision "$precision" --json)
  cpu=$("$drover" "${args[@]}")
  cuda=$("$drover" "${args[@]}" --device cuda)
  [[ $(field "$cuda" device) == cuda && $(field "$cuda" precision) == "$precision" &&
     $(field "$cpu" device) == cpu ]] || { echo "FAIL: $cpu / $cuda"; exit 1; }
  rtol=1e-4
  [[ $precision == bf16 ]] && rtol=1e-2
  close "$(field "$cuda" loss)" "$(field "$cpu" loss)" $rtol "eval loss, $precision"
done

# Endings of different lengths after contexts of different lengths, one longer than the block.
python3 - "$work/choices.jsonl" <<'PY'
import json, sys
rows = [("the cat sat on", ["the mat.", "a dog", "it", "every morning of the week"], 0),
        ("x" * 40, ["yes", "no", "maybe so"], 1),
        ("one two three", ["four", "five six", "seven"], 2),
        ("a b c d e f g", ["h", "i j", "k l m", "n"], 3)]
with open(sys.argv[1], "w") as f:
    for ctx, endings, label in rows:
        f.write(json.dumps({"ctx": ctx, "endings": endings, "label": label}) + "\n")
PY
args=(eval "$work/model.bin" --hellaswag "$work/choices.jsonl" --tokenizer byte --json)
cpu=$("$drover" "${args[@]}")
cuda=$("$drover" "${args[@]}" --device cuda)
for key in hellaswag_acc hellaswag_acc_norm hellaswag_examples; do
  [[ $(field "$cuda" $key) == $(field "$cpu" $key) ]] ||
    { echo "FAIL: $key: cuda $cuda, cpu $cpu"; exit 1; }
done
echo "hellaswag: the same picks ($(field "$cpu" hellaswag_acc_norm) acc_norm)"

prompt="a prompt that is longer than the thirty-two tokens of the block"
args=(sample "$work/model.bin" --prompt "$prompt" --tokens 12 --temperature 0 --tokenizer byte)
"$drover" "${args[@]}" > "$work/cpu.txt"
"$drover" "${args[@]}" --device cuda > "$work/cuda.txt"
cmp "$work/cpu.txt" "$work/cuda.txt" ||
  { echo "FAIL: sample differs"; cat "$work/cpu.txt" "$work/cuda.txt"; exit 1; }
[[ $(wc -c < "$work/cpu.txt") -gt ${#prompt} ]] || { echo "FAIL: no tokens"; exit 1; }
echo "sample: the same greedy text"

set +e
"$bin/drover" eval "$work/model.bin" --data "$work/val.bin" --device cuda > "$work/no-gpu.txt" 2>&1
rc=$?
set -e
if [[ $rc -ne 2 ]] || ! grep -q "^drover eval: --device cuda: " "$work/no-gpu.txt"; then
  echo "FAIL: --device cuda without a usable GPU gave exit $rc:"
  cat "$work/no-gpu.txt"
  exit 1
fi
echo "no usable GPU: $(head -c 160 "$work/no-gpu.txt")"
echo "PASS"
