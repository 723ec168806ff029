#!/usr/bin/env python3
"""Whether two runs' metrics.jsonl files hold the same losses: STEPS lines each, every loss
within RTOL (relative) of the other's, and the same evaluations (val_loss, where the runs
evaluated; hellaswag, where both scored it) and fp16 loss scales (loss_scale, where the runs
have one) within RTOL too; with
NORM_RTOL, every step's gradient norm (grad_norm) within it as well: early in a warm-up the
losses barely move, and a wrong gradient shows in the norm first. Prints the series; exits 0
when they agree.

    same_losses.py REFERENCE.jsonl OTHER.jsonl STEPS RTOL [NORM_RTOL]
"""
import json
import sys

ref_path, other_path, steps, rtol = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
tolerance = {"loss": rtol, "val_loss": rtol, "hellaswag": rtol, "loss_scale": rtol}
if len(sys.argv) > 5:
    tolerance["grad_norm"] = float(sys.argv[5])


def series(path, key):
    lines = [json.loads(l) for l in open(path) if '"loss"' in l]
    return [(l["step"], l[key]) for l in lines if key in l]


def close(a, b, tol):
    return abs(a - b) <= tol * abs(a)


ok = len(series(ref_path, "loss")) == steps
for key, tol in tolerance.items():
    ref, other = series(ref_path, key), series(other_path, key)
    if key == "hellaswag" and not (ref and other):
        continue  # a run with data.hellaswag against one without: the rest must agree
    if ref or other:
        print("%-10s reference:" % key, ["%.6f" % v for _, v in ref])
        print("%-10s other    :" % key, ["%.6f" % v for _, v in other])
    ok = ok and len(ref) == len(other) and all(
        s == t and close(a, b, tol) for (s, a), (t, b) in zip(ref, other))
sys.exit(0 if ok else 1)
