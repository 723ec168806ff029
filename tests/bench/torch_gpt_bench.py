#!/usr/bin/env python3
"""PyTorch eager on CPU at GPT-2 124M shapes: the baseline of tests/bench/run_all.sh.

The same training step as bench_gpt_cpu_bench (fp32, zero_grad + forward + backward +
global-norm clip + AdamW with nanoGPT's decay groups, random tokens, B=4, T=64 by default)
on the nanoGPT-style model of tests/reference/torch_gpt.py, with torch.set_num_threads.
Prints per-step times, then tokens/s, ms/step split into forward / backward / optimizer,
peak RSS (VmHWM, which includes the Python interpreter and libtorch), and as the last line
one JSON object.

    /usr/bin/python3 tests/bench/torch_gpt_bench.py [--threads 2] [--steps 5] [--warmup 2]
"""

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import torch_gpt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--channels", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--max-seq", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=1337)
    args = ap.parse_args()
    if args.seq > args.max_seq:
        ap.error(f"--seq {args.seq} exceeds --max-seq {args.max_seq}")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    a = torch.randn(1536, 1536)
    b = torch.randn(1536, 1536)
    best = 1e30
    for r in range(5):
        t0 = time.perf_counter()
        torch.mm(a, b)
        if r > 0:
            best = min(best, time.perf_counter() - t0)
    sgemm_gflops = 2 * 1536 ** 3 / best / 1e9
    del a, b
    print(f"torch.mm rate (1536^3, {args.threads} threads): {sgemm_gflops:.1f} GFLOP/s")

    cfg = torch_gpt.GptConfig(max_seq_len=args.max_seq, vocab_size=args.vocab,
                              num_layers=args.layers, num_heads=args.heads,
                              channels=args.channels)
    model = torch_gpt.Gpt(cfg)
    model.init_gpt2(args.seed)
    opt = torch_gpt.make_adamw(model, 1e-4, 0.1, 0.9, 0.99)
    print(f"model: {model.num_params()} parameters ({cfg}), B={args.batch} T={args.seq}")

    B, T = args.batch, args.seq
    fwd = bwd = optim = 0.0
    for step in range(args.warmup + args.steps):
        idx = torch.randint(0, args.vocab, (B, T))
        tgt = torch.randint(0, args.vocab, (B, T))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        _, loss = model(idx, tgt)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        torch_gpt.clip_grad_global_norm(model, 1.0)
        opt.step()
        t3 = time.perf_counter()
        kind = "warm-up" if step < args.warmup else "timed"
        print(f"{kind} step {step}: loss {float(loss):.4f}  {1e3 * (t3 - t0):.1f} ms "
              f"(fwd {1e3 * (t1 - t0):.1f}, bwd {1e3 * (t2 - t1):.1f}, "
              f"opt {1e3 * (t3 - t2):.1f})", flush=True)
        if step >= args.warmup:
            fwd += (t1 - t0) / args.steps
            bwd += (t2 - t1) / args.steps
            optim += (t3 - t2) / args.steps
    step_s = fwd + bwd + optim
    rss = torch_gpt.peak_rss_mb()
    tokens_per_s = B * T / step_s
    print(f"pytorch: {tokens_per_s:.0f} tokens/s, {1e3 * step_s:.1f} ms/step (forward "
          f"{1e3 * fwd:.1f}, backward {1e3 * bwd:.1f}, optimizer {1e3 * optim:.1f}), "
          f"peak RSS {rss:.0f} MiB")
    print(json.dumps({"impl": "pytorch", "version": torch.__version__,
                      "tokens_per_s": round(tokens_per_s, 1), "ms_per_step": round(1e3 * step_s, 2),
                      "forward_ms": round(1e3 * fwd, 2), "backward_ms": round(1e3 * bwd, 2),
                      "optimizer_ms": round(1e3 * optim, 2), "peak_rss_mib": round(rss, 1),
                      "sgemm_gflops": round(sgemm_gflops, 1), "threads": args.threads,
                      "last_loss": float(loss)}))


if __name__ == "__main__":
    main()
