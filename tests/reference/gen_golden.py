#!/usr/bin/env python3
"""Regenerates tests/reference/golden/: a small llm.c model file and the golden values that
tests/unit/worker/engine/model/golden_test.cc compares drover against.

    /usr/bin/python3 tests/reference/gen_golden.py   # needs Debian's python3-torch

The model's parameters are drawn here, rounded to fp32 (the model file's precision), and
from then on everything is computed in float64, so the golden values are the exact answer
for the stored fp32 parameters up to float64 rounding.

golden.bin layout (little-endian):
  int32   header[256]   [0] magic 20241130, [1] version 1, [2] B, [3] T, [4] steps,
                        [5] num_params, [6] V, [7] Vp, the rest zero
  float64 hyper[8]      lr, weight_decay, beta1, beta2, eps, grad_clip, 0, 0
  int32   tokens[steps][B][T+1]   step s trains on inputs [:, :T] and targets [:, 1:]
  float64 lrs[steps]              learning rate of each step
  float32 logits[B][T][Vp]        of the first forward (columns >= V are padding)
  float64 loss0                   loss of the first forward
  float32 grads[num_params]       gradient of loss0, unclipped, in llm.c's file order
  float64 losses[steps]           loss of step s's forward, before its update
  float64 grad_norms[steps]       global gradient norm of step s, before clipping
"""

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt  # noqa: E402

GOLDEN_MAGIC = 20241130
GOLDEN_VERSION = 1

# Small enough to keep both files around 80 KB, big enough to exercise every kernel:
# two layers (stacking), two heads, T < maxT (unused wpe rows), V < Vp (padding).
CFG = dict(max_seq_len=32, vocab_size=65, num_layers=2, num_heads=2, channels=24)
B, T, STEPS = 2, 16, 10
HYPER = dict(lr=1e-3, weight_decay=0.1, beta1=0.9, beta2=0.99, eps=1e-8, grad_clip=1.0)
SEED = 20241130


def init_params(model, gen):
    """Larger-than-GPT-2 random values everywhere (LayerNorm and biases included), so the
    nonlinearities and every bias path matter; padded wte rows stay zero as in llm.c."""
    with torch.no_grad():
        for name, params in model.file_order():
            # One draw per llm.c tensor, stacked over layers, in file order.
            noise = torch.randn((len(params),) + params[0].shape, generator=gen,
                                dtype=torch.float64)
            if name in ("ln1w", "ln2w", "lnfw"):
                value = 1.0 + 0.1 * noise
            elif name.endswith("b"):
                value = 0.05 * noise
            else:
                value = 0.08 * noise
            for p, v in zip(params, value):
                p.copy_(v.to(torch.float32))  # what the fp32 model file can hold
        model.wte[model.cfg.vocab_size:].zero_()


def make_tokens(gen, vocab):
    """A noisy walk over the vocabulary: structured enough that 10 steps visibly learn."""
    n = STEPS * B * (T + 1)
    steps = torch.randint(-2, 3, (n,), generator=gen)
    walk = torch.cumsum(steps, 0) + torch.randint(0, vocab, (1,), generator=gen)
    return (walk % vocab).to(torch.int32).view(STEPS, B, T + 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "golden"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)

    gen = torch.Generator().manual_seed(SEED)
    cfg = torch_gpt.GptConfig(**CFG)
    model = torch_gpt.Gpt(cfg, dtype=torch.float64)
    init_params(model, gen)
    tokens = make_tokens(gen, cfg.vocab_size)
    torch_gpt.save_model_file(model, os.path.join(args.out, "model.bin"))

    opt = torch_gpt.make_adamw(model, HYPER["lr"], HYPER["weight_decay"], HYPER["beta1"],
                               HYPER["beta2"], HYPER["eps"])
    lrs, losses, norms = [], [], []
    for step in range(STEPS):
        idx = tokens[step, :, :T].long()
        tgt = tokens[step, :, 1:].long()
        opt.zero_grad(set_to_none=False)
        logits, loss = model(idx, tgt)
        loss.backward()
        if step == 0:
            logits0 = logits.detach().numpy().astype("<f4")
            loss0 = float(loss)
            grads0 = model.flat(grads=True).astype("<f4")
        norms.append(torch_gpt.clip_grad_global_norm(model, HYPER["grad_clip"]))
        lrs.append(HYPER["lr"])
        for group in opt.param_groups:
            group["lr"] = lrs[-1]
        opt.step()
        losses.append(float(loss))
        print(f"step {step}: loss {losses[-1]:.9f}  grad norm {norms[-1]:.6f}")

    header = np.zeros(256, dtype="<i4")
    header[:8] = [GOLDEN_MAGIC, GOLDEN_VERSION, B, T, STEPS, model.num_params(),
                  cfg.vocab_size, cfg.padded_vocab_size]
    hyper = np.zeros(8, dtype="<f8")
    hyper[:6] = [HYPER[k] for k in ("lr", "weight_decay", "beta1", "beta2", "eps",
                                     "grad_clip")]
    with open(os.path.join(args.out, "golden.bin"), "wb") as f:
        for part in (header, hyper, tokens.numpy().astype("<i4"),
                     np.asarray(lrs, dtype="<f8"), logits0,
                     np.asarray([loss0], dtype="<f8"), grads0,
                     np.asarray(losses, dtype="<f8"), np.asarray(norms, dtype="<f8")):
            f.write(part.tobytes())
    print(f"wrote {args.out}/model.bin and golden.bin ({cfg}, {model.num_params()} params)")


if __name__ == "__main__":
    main()
