#!/usr/bin/env python3
"""The median of each named field over a run's steps from step FROM on (the first steps grow
buffers and warm caches), printed on one line: what a device check reports of a run's
timings. Exits 1 when no step from FROM on has a step time.

    step_medians.py METRICS.jsonl FROM FIELD...
"""
import json
import statistics
import sys

path, first, fields = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rows = [json.loads(l) for l in open(path) if '"step_ms"' in l]
rows = [r for r in rows if r.get("step", 0) >= first]
if not rows:
    print(f"{path}: no step from {first} on")
    sys.exit(1)
medians = [f"{f} {statistics.median(r.get(f, 0.0) for r in rows):.2f}" for f in fields]
print(f"medians of steps {first}-{rows[-1]['step']}: " + ", ".join(medians))
