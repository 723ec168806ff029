#!/usr/bin/env python3
"""drover eval --hellaswag against Hugging Face transformers on the same model and file.

  hellaswag_check.py BUILD/bin [--examples 200]

Needs PyTorch and transformers, so it is not part of ctest; run it by hand. Makes a random
byte-vocabulary llm.c model with drover-gpt-logits (block size 64), exports it with
`drover export --format hf`, writes a HellaSwag-shaped JSON lines file of random words
(contexts up to 90 bytes, so that many rows are left-truncated; 2 to 5 endings; random
labels), and scores it both ways: drover's `eval --hellaswag --json`, and
GPT2LMHeadModel.from_pretrained in float64 scoring each ending as hellaswag.h documents
(the row is the context's tail that fits before the whole ending, right-padded; the sum and
the mean of the ending tokens' cross-entropy; argmin, first of equals). The counts of right
picks must be equal; it prints both, and how close the two nearest endings came.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
from transformers import GPT2LMHeadModel

BLOCK = 64


def words(rng, n):
    return " ".join(
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 7)))
        for _ in range(n)
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("--examples", type=int, default=200)
    args = ap.parse_args()
    rng = random.Random(11)
    with tempfile.TemporaryDirectory() as d:
        model_bin = os.path.join(d, "m.bin")
        subprocess.run([os.path.join(args.bin, "drover-gpt-logits"), "write", model_bin,
                        "--layers", "2", "--heads", "2", "--embd", "32", "--vocab", "256",
                        "--block", str(BLOCK), "--seed", "5"], check=True)
        hf = os.path.join(d, "hf")
        subprocess.run([os.path.join(args.bin, "drover"), "export", model_bin, "--format", "hf",
                        "-o", hf], check=True, stdout=subprocess.DEVNULL)
        examples = []
        for i in range(args.examples):
            n = rng.randint(2, 5)
            ctx = words(rng, rng.randint(1, 16))[:90].strip() or "a"
            examples.append({"ind": i, "ctx": ctx,
                             "endings": [words(rng, rng.randint(1, 4)) for _ in range(n)],
                             "label": rng.randrange(n)})
        path = os.path.join(d, "val.jsonl")
        with open(path, "w") as f:
            for e in examples:
                f.write(json.dumps(e) + "\n")
        out = subprocess.run([os.path.join(args.bin, "drover"), "eval", model_bin, "--hellaswag",
                              path, "--tokenizer", "byte", "--json"],
                             check=True, capture_output=True, text=True).stdout
        drover = json.loads(out)

        model = GPT2LMHeadModel.from_pretrained(hf).double().eval()
        right_sum = right_mean = 0
        closest = float("inf")
        for e in examples:
            ctx = list(e["ctx"].encode())
            rows, starts = [], []
            for ending in e["endings"]:
                end = list((" " + ending).encode())
                keep = min(len(ctx), BLOCK - len(end))
                row = ctx[len(ctx) - keep:] + end
                rows.append(row)
                starts.append(keep)
            T = max(len(r) for r in rows)
            x = torch.tensor([r + [0] * (T - len(r)) for r in rows])
            with torch.no_grad():
                logp = F.log_softmax(model(x).logits[..., :256], dim=-1)
            sums, means = [], []
            for i, row in enumerate(rows):
                s = -sum(logp[i, t, row[t + 1]].item() for t in range(starts[i] - 1, len(row) - 1))
                sums.append(s)
                means.append(s / (len(row) - starts[i]))
            pick_sum = min(range(len(sums)), key=lambda k: (sums[k], k))
            pick_mean = min(range(len(means)), key=lambda k: (means[k], k))
            right_sum += pick_sum == e["label"]
            right_mean += pick_mean == e["label"]
            ordered = sorted(means)
            closest = min(closest, ordered[1] - ordered[0])
        n = len(examples)
        print(f"drover:       acc_norm {drover['hellaswag_acc_norm']:.4f} "
              f"acc {drover['hellaswag_acc']:.4f} over {drover['hellaswag_examples']}")
        print(f"transformers: acc_norm {right_mean / n:.4f} acc {right_sum / n:.4f} over {n}")
        print(f"closest two endings' mean losses differed by {closest:.3g}")
        ok = (drover["hellaswag_examples"] == n and
              round(drover["hellaswag_acc_norm"] * n) == right_mean and
              round(drover["hellaswag_acc"] * n) == right_sum)
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
