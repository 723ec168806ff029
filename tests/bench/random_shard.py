#!/usr/bin/env python3
"""Writes an llm.c token shard of random tokens below 256 (valid for every vocabulary the
benchmarks use: they time steps, they do not learn).

    random_shard.py OUT [N]     N tokens (300000), seed 1
"""
import random
import struct
import sys

out = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 300_000
random.seed(1)
header = [20240520, 1, n] + [0] * 253
with open(out, "wb") as f:
    f.write(struct.pack("<256i", *header))
    f.write(struct.pack("<%dH" % n, *(random.randrange(256) for _ in range(n))))
