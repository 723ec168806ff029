#!/usr/bin/env python3
"""drover's exported GPT-2 run by PyTorch: the same logits as drover's forward.

  hf_gpt2_check.py BUILD/bin [--device cuda|cpu]

Needs PyTorch (`import torch`), so it is not part of ctest on machines without it (the
stdlib-only tests/tools/safetensors_check.py is); run it by hand or on the GPU machine.
Like safetensors_check.py it makes a random llm.c model file with drover-gpt-logits,
exports it with `drover export --format safetensors`, then runs GPT-2 in torch in float64
from the safetensors tensors (F.layer_norm, the Conv1D layout x @ W, tanh GELU, causal
softmax attention, LM head tied to wte) and compares with drover's logits within 1e-4.
When the `transformers` package is importable it also loads the file into
GPT2LMHeadModel (strict about every tensor but the attention-mask buffers) and compares
that model's logits too, then `from_pretrained` on `drover export --format hf`'s
directory, and checks the other direction: a GPT2LMHeadModel with random
weights saved by `save_pretrained` (float32, then bfloat16), loaded by drover from that
directory (model.safetensors and config.json), gives transformers' logits.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_check as sc  # noqa: E402  (the stdlib reader and the test's shapes)


def torch_gpt2_logits(w, tokens, n_layer, n_head):
    idx = torch.tensor(tokens, device=w["wte.weight"].device)
    T = len(tokens)
    c = w["wte.weight"].shape[1]
    hs = c // n_head
    x = w["wte.weight"][idx] + w["wpe.weight"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device))
    for layer in range(n_layer):
        p = "h.%d." % layer
        h = F.layer_norm(x, (c,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps=1e-5)
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]  # Conv1D: (C, 3C)
        q, k, v = qkv.split(c, dim=1)
        q, k, v = (t.view(T, n_head, hs).transpose(0, 1) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(0, 1).reshape(T, c)
        x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = F.layer_norm(x, (c,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps=1e-5)
        h = F.gelu(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (c,), w["ln_f.weight"], w["ln_f.bias"], eps=1e-5)
    return x @ w["wte.weight"].T


def transformers_logits(meta, weights, tokens, device):
    try:
        import transformers
    except ImportError:
        return None
    config = transformers.GPT2Config(
        vocab_size=int(meta["vocab_size"]), n_positions=int(meta["n_positions"]),
        n_embd=int(meta["n_embd"]), n_layer=int(meta["n_layer"]), n_head=int(meta["n_head"]),
        activation_function="gelu_new", layer_norm_epsilon=1e-5, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config).to(torch.float64).to(device).eval()
    state = {"transformer." + k: v for k, v in weights.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.endswith(".attn.bias") and
               not m.endswith(".attn.masked_bias") and m != "lm_head.weight"]
    if missing or unexpected:
        sc.fail("GPT2LMHeadModel: missing %s, unexpected %s" % (missing, unexpected))
    model.tie_weights()
    with torch.no_grad():
        out = model(torch.tensor([tokens], device=device)).logits[0]
    return out


def check_load(tool, tmp, device):
    """save_pretrained's files, read by drover: the same logits as transformers'."""
    import transformers
    config = transformers.GPT2Config(
        vocab_size=sc.V, n_positions=sc.MAXT, n_embd=sc.C, n_layer=sc.L, n_head=sc.NH,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(29)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # every weight random, gains and biases too (as drover-gpt-logits)
        for p in model.parameters():
            p.uniform_(-0.5, 0.5)
    for dtype in (torch.float32, torch.bfloat16):
        out = os.path.join(tmp, "hf_" + str(dtype).split(".")[-1])
        model.to(dtype).save_pretrained(out, safe_serialization=True)
        reference = model.to(torch.float64).to(device)
        with torch.no_grad():
            want = reference(torch.tensor([sc.TOKENS], device=device)).logits[0]
        p = sc.run([tool, "logits", os.path.join(out, "model.safetensors"), "--tokens",
                    ",".join(map(str, sc.TOKENS))])
        got = torch.tensor(json.loads(p.stdout)["logits"], dtype=torch.float64, device=device)
        worst = (want - got).abs().max().item()
        print("hf_gpt2_check: save_pretrained (%s) loaded by drover vs transformers: "
              "max |diff| %.3g" % (dtype, worst))
        if not worst <= sc.TOLERANCE:
            sc.fail("drover's logits of a save_pretrained model differ by %.3g" % worst)
        model = model.to(torch.float32).cpu()


def check_from_pretrained(drover, tool, model, tmp, device):
    """drover export --format hf's directory, read by GPT2LMHeadModel.from_pretrained, in each
    --dtype: the logits of drover's model (16-bit: of the rounded weights drover reads back)."""
    import transformers
    for dtype in ("fp32", "bf16", "fp16"):
        out = os.path.join(tmp, "hf_dir_" + dtype)
        sc.run([drover, "export", model, "--format", "hf", "--dtype", dtype, "-o", out])
        hf = transformers.GPT2LMHeadModel.from_pretrained(out).to(torch.float64).to(device).eval()
        with torch.no_grad():
            want = hf(torch.tensor([sc.TOKENS], device=device)).logits[0]
        source = model if dtype == "fp32" else os.path.join(out, "model.safetensors")
        p = sc.run([tool, "logits", source, "--tokens", ",".join(map(str, sc.TOKENS))])
        got = torch.tensor(json.loads(p.stdout)["logits"], dtype=torch.float64, device=device)
        worst = (want - got).abs().max().item()
        print("hf_gpt2_check: from_pretrained(drover export --format hf --dtype %s) vs drover: "
              "max |diff| %.3g" % (dtype, worst))
        if not worst <= sc.TOLERANCE:
            sc.fail("from_pretrained's logits (%s) differ from drover's by %.3g" % (dtype, worst))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bindir")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    drover = os.path.join(args.bindir, "drover")
    tool = os.path.join(args.bindir, "drover-gpt-logits")
    with tempfile.TemporaryDirectory(prefix="drover_hf_gpt2_") as tmp:
        model = os.path.join(tmp, "model.bin")
        out = os.path.join(tmp, "model.safetensors")
        sc.run([tool, "write", model, "--layers", str(sc.L), "--heads", str(sc.NH), "--embd",
                str(sc.C), "--vocab", str(sc.V), "--block", str(sc.MAXT), "--seed", "23"])
        sc.run([drover, "export", model, "--format", "safetensors", "-o", out])
        meta, tensors = sc.read_safetensors(out)
        weights = {name: torch.tensor(vals, dtype=torch.float32).view(*shape)
                   .to(torch.float64).to(args.device)
                   for name, (shape, vals) in tensors.items()}
        p = sc.run([tool, "logits", model, "--tokens", ",".join(map(str, sc.TOKENS))])
        theirs = torch.tensor(json.loads(p.stdout)["logits"], dtype=torch.float64,
                              device=args.device)
        with torch.no_grad():
            ours = torch_gpt2_logits(weights, sc.TOKENS, int(meta["n_layer"]),
                                     int(meta["n_head"]))
        worst = (ours - theirs).abs().max().item()
        print("hf_gpt2_check: torch GPT-2 (%s, float64) vs drover: max |diff| %.3g" %
              (args.device, worst))
        if not worst <= sc.TOLERANCE:
            sc.fail("torch logits differ from drover's by %.3g" % worst)
        hf = transformers_logits(meta, weights, sc.TOKENS, args.device)
        if hf is None:
            print("hf_gpt2_check: transformers not installed; GPT2LMHeadModel not checked")
        else:
            worst = (hf - theirs).abs().max().item()
            print("hf_gpt2_check: transformers GPT2LMHeadModel vs drover: max |diff| %.3g" %
                  worst)
            if not worst <= sc.TOLERANCE:
                sc.fail("GPT2LMHeadModel logits differ from drover's by %.3g" % worst)
            check_load(tool, tmp, args.device)
            check_from_pretrained(drover, tool, model, tmp, args.device)
    print("hf_gpt2_check: PASS")


if __name__ == "__main__":
    main()
