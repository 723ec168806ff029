#!/usr/bin/env python3
"""The PyTorch baseline of the device check's speed step (issue 9), run on the GPU machine.

A nanoGPT-style GPT-2 (the same shapes drover trains: tied embedding, pre-LayerNorm blocks,
GELU MLP, biases) trained on random tokens in bf16 autocast with fused AdamW, eager and
torch.compile, at T=1024 and the largest batch of --batches that fits (torch.compile tries
only those up to eager's). Prints one JSON line
per run (tokens/s, step time, peak memory, MFU) and a table at the end.

MFU counts 6 N + 12 L C T FLOPs per token (weights forward and backward, plus attention's
two T x T products) against the chip's bf16 matrix rate measured here first, on random
data, so the ratio is against this GPU as it runs today and not a datasheet.

    python3 tests/device/torch_gpt2_bench.py --model 124m --batches 32,16,8 --steps 20

`--device cpu --model tiny --T 64 --peak-tflops 1` is a dry run of the script itself on a
machine without a GPU (its numbers mean nothing there).
"""
import argparse
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SIZES = {  # n_layer, n_head, n_embd
    "124m": (12, 12, 768),
    "350m": (24, 16, 1024),
    "774m": (36, 20, 1280),
    "tiny": (2, 2, 64),  # a dry run of this script on the CPU
}


class Block(nn.Module):
    def __init__(self, n_head, C):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        shape = (B, T, self.n_head, C // self.n_head)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, C, vocab, block_size):
        super().__init__()
        self.wte = nn.Embedding(vocab, C)
        self.wpe = nn.Embedding(block_size, C)
        self.h = nn.ModuleList(Block(n_head, C) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2 and drover
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def median_ms(fn, repeats, device):
    times = []
    for _ in range(repeats):
        if device == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    return times[len(times) // 2]


def bf16_gemm_tflops():
    """The chip's bf16 matrix rate on random data (several operand sets, median)."""
    n = 8192
    sets = [(torch.randn(n, n, device="cuda", dtype=torch.bfloat16),
             torch.randn(n, n, device="cuda", dtype=torch.bfloat16)) for _ in range(3)]
    out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    i = [0]

    def one():
        a, b = sets[i[0] % 3]
        i[0] += 1
        torch.matmul(a, b, out=out)

    for _ in range(5):
        one()
    ms = median_ms(one, 30, "cuda")
    return 2 * n ** 3 / (ms * 1e-3) / 1e12


def run(model_name, mode, batch, T, steps, vocab, peak_tflops, device):
    n_layer, n_head, C = SIZES[model_name]
    torch.manual_seed(0)
    model = GPT(n_layer, n_head, C, vocab, T).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    # The fused AdamW is CUDA's (a CPU dry run may have a PyTorch without it on the CPU).
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1,
                            **({"fused": True} if device == "cuda" else {}))
    step_model = torch.compile(model) if mode == "compile" else model
    # Inputs and targets as contiguous tensors of their own, as a data loader hands them over
    # (a slice of one (B, T + 1) tensor is strided, and .view(-1) refuses it).
    data = []
    for _ in range(4):
        d = torch.randint(0, vocab, (batch, T + 1), device=device)
        data.append((d[:, :-1].contiguous(), d[:, 1:].contiguous()))

    def step(i):
        x, y = data[i % len(data)]
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    on_gpu = device == "cuda"
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    warm = time.time()
    for i in range(3):  # compilation and autotuning stay out of the timing
        step(i)
    if on_gpu:
        torch.cuda.synchronize()
    warm_s = time.time() - warm
    ms = median_ms(lambda: step(0), steps, device)
    tokens = batch * T
    flops_per_token = 6 * n_params + 12 * n_layer * C * T
    tflops = flops_per_token * tokens / (ms * 1e-3) / 1e12
    return {
        "framework": "pytorch-" + mode, "model": model_name, "params": n_params, "batch": batch,
        "T": T, "step_ms": round(ms, 2), "tokens_per_s": round(tokens / (ms * 1e-3)),
        "tflops": round(tflops, 1), "mfu": round(tflops / peak_tflops, 3),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2 ** 30, 2) if on_gpu else 0.0,
        "warmup_s": round(warm_s, 1),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="124m", choices=sorted(SIZES))
    ap.add_argument("--batches", default="32,16,8",
                    help="tried in order; the first that fits (later modes: from the first's on)")
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--peak-tflops", type=float, default=0, help="skip the GEMM measurement")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    peak = args.peak_tflops or bf16_gemm_tflops()
    print(json.dumps({"bf16_gemm_tflops_measured": round(peak, 1)}), flush=True)
    rows = []
    batches = [int(b) for b in args.batches.split(",")]
    for mode in args.modes.split(","):
        # Every mode at one batch where it can: a later mode starts from the batch the first
        # fitted (a torch.compile that runs out of memory costs a whole compilation).
        if rows:
            batches = [b for b in batches if b <= rows[0]["batch"]]
        for batch in batches:
            try:
                row = run(args.model, mode, batch, args.T, args.steps, args.vocab, peak,
                          args.device)
            except torch.cuda.OutOfMemoryError:
                print(json.dumps({"framework": "pytorch-" + mode, "batch": batch, "oom": True}))
                torch.cuda.empty_cache()
                continue
            except Exception as e:  # noqa: BLE001 - one mode failing (torch.compile's
                # toolchain, say) must not take the other's numbers with it: a GPU lease is short.
                print(json.dumps({"framework": "pytorch-" + mode, "batch": batch,
                                  "error": "%s: %s" % (type(e).__name__, e)}), flush=True)
                break
            print(json.dumps(row), flush=True)
            rows.append(row)
            break
        torch.cuda.empty_cache()
    print("%-18s %6s %6s %9s %12s %7s %9s" %
          ("framework", "model", "batch", "step ms", "tokens/s", "MFU", "peak GiB"))
    for r in rows:
        print("%-18s %6s %6d %9.1f %12d %7.3f %9.2f" % (r["framework"], r["model"], r["batch"],
              r["step_ms"], r["tokens_per_s"], r["mfu"], r["peak_mem_gib"]))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
