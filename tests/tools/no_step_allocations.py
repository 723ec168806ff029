#!/usr/bin/env python3
"""Whether a device run allocated device memory inside its steps: every metrics.jsonl line
from step FROM on must say device_allocations 0 (the first steps grow the kernel table's
scratch buffers; after them, a cudaMalloc in a step synchronises the GPU every step).
Exits 1 naming the steps that allocated, or when no line carries the field.

    no_step_allocations.py METRICS.jsonl FROM
"""
import json
import sys

path, first = sys.argv[1], int(sys.argv[2])
rows = [json.loads(l) for l in open(path) if '"step"' in l]
counted = [r for r in rows if "device_allocations" in r]
if not counted:
    print(f"{path}: no line has device_allocations (not a device run?)")
    sys.exit(1)
late = [(r["step"], r["device_allocations"]) for r in counted
        if r["step"] >= first and r["device_allocations"] != 0]
print("device allocations per step:", [r["device_allocations"] for r in counted])
if late:
    print(f"steps from {first} on that allocated device memory (step, count): {late}")
    sys.exit(1)
