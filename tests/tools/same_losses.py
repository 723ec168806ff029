#!/usr/bin/env python3
"""Whether two runs' metrics.jsonl files hold the same losses: STEPS lines each, every loss
within RTOL (relative) of the other's. Prints both series; exits 0 when they agree.

    same_losses.py REFERENCE.jsonl OTHER.jsonl STEPS RTOL
"""
import json
import sys

ref_path, other_path, steps, rtol = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
ref, other = ([json.loads(l)["loss"] for l in open(p) if '"loss"' in l]
              for p in (ref_path, other_path))
print("reference:", ["%.6f" % x for x in ref])
print("other    :", ["%.6f" % x for x in other])
ok = len(ref) == len(other) == steps and all(
    abs(a - b) <= rtol * abs(a) for a, b in zip(ref, other))
sys.exit(0 if ok else 1)
