#!/usr/bin/env python3
"""The PyTorch side of the learning check (tests/bench/learning_check.sh).

nanoGPT's small CPU recipe for Shakespeare (4 layers, 4 heads, 128 channels, block 64,
batch 12, 2000 iterations, lr 1e-3 cosine to 1e-4 after 100 warm-up steps, beta2 0.99,
weight decay 0.1, clip 1.0), on byte tokens (vocabulary 256) with a 90/10 train/val split
of the text, using the reference model of torch_gpt.py.

    train:     train_shakespeare.py --text tinyshakespeare.txt --out-dir DIR
               writes DIR/train.bin, DIR/val.bin (token shards), DIR/model.bin (llm.c file)
    evaluate:  train_shakespeare.py --eval-model MODEL.bin --val DIR/val.bin

Validation loss, in both modes, is the mean loss over consecutive (B, T) windows of the
validation tokens read as llm.c's loader reads them (inputs tokens[p : p+B*T], targets
shifted by one, p advancing by B*T), so a drover model file and the PyTorch model are
scored by the same code on the same tokens. The last line printed is one JSON object.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt  # noqa: E402


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--text", help="training text (bytes are tokens)")
    ap.add_argument("--out-dir", help="where shards, model and metrics go")
    ap.add_argument("--eval-model", help="only evaluate this llm.c model file on --val")
    ap.add_argument("--val", help="validation token shard for --eval-model")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--channels", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.99)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--val-fraction", type=float, default=0.1)
    ap.add_argument("--eval-batches", type=int, default=0,
                    help="validation windows of (batch, seq); 0 = all that fit")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--log-every", type=int, default=100)
    args = ap.parse_args()
    if not args.eval_model and not (args.text and args.out_dir):
        ap.error("give --text and --out-dir (train), or --eval-model and --val (evaluate)")
    if args.eval_model and not args.val:
        ap.error("--eval-model needs --val")
    return args


@torch.no_grad()
def val_loss(model, tokens, B, T, max_batches):
    """Mean loss over consecutive (B, T) windows of `tokens` (llm.c loader order)."""
    span = B * T
    n = (len(tokens) - 1) // span
    if max_batches > 0:
        n = min(n, max_batches)
    if n == 0:
        raise ValueError(f"validation set of {len(tokens)} tokens is shorter than one batch")
    model.eval()
    total = 0.0
    for i in range(n):
        chunk = torch.from_numpy(tokens[i * span:(i + 1) * span + 1].astype(np.int64))
        _, loss = model(chunk[:-1].view(B, T), chunk[1:].view(B, T))
        total += float(loss)
    return total / n, n


@torch.no_grad()
def sample(model, prompt, n, seed):
    g = torch.Generator().manual_seed(seed)
    ids = list(prompt)
    V, maxT = model.cfg.vocab_size, model.cfg.max_seq_len
    for _ in range(n):
        ctx = torch.tensor([ids[-maxT:]], dtype=torch.int64)
        logits, _ = model(ctx)
        probs = torch.softmax(logits[0, -1, :V].to(torch.float64), dim=-1)
        ids.append(int(torch.multinomial(probs, 1, generator=g)))
    return bytes(ids).decode("utf-8", errors="replace")


def train(args):
    os.makedirs(args.out_dir, exist_ok=True)
    with open(args.text, "rb") as f:
        data = np.frombuffer(f.read(), dtype=np.uint8).astype(np.uint16)
    split = int(len(data) * (1.0 - args.val_fraction))
    train_tokens, val_tokens = data[:split], data[split:]
    torch_gpt.write_token_shard(os.path.join(args.out_dir, "train.bin"), train_tokens)
    torch_gpt.write_token_shard(os.path.join(args.out_dir, "val.bin"), val_tokens)

    torch.manual_seed(args.seed)
    cfg = torch_gpt.GptConfig(max_seq_len=args.seq, vocab_size=256, num_layers=args.layers,
                              num_heads=args.heads, channels=args.channels)
    model = torch_gpt.Gpt(cfg)
    model.init_gpt2(args.seed)
    opt = torch_gpt.make_adamw(model, args.lr, args.weight_decay, args.beta1, args.beta2)
    gen = torch.Generator().manual_seed(args.seed)
    train_t = torch.from_numpy(train_tokens.astype(np.int64))
    B, T = args.batch, args.seq
    metrics = open(os.path.join(args.out_dir, "metrics.jsonl"), "w")
    t0 = time.time()
    for step in range(args.steps):
        # nanoGPT's get_batch: B random windows of T + 1 tokens.
        starts = torch.randint(0, len(train_t) - T - 1, (B,), generator=gen)
        win = torch.stack([train_t[s:s + T + 1] for s in starts.tolist()])
        lr = torch_gpt.learning_rate(step, args.lr, args.min_lr, args.warmup, args.steps)
        for group in opt.param_groups:
            group["lr"] = lr
        model.train()
        opt.zero_grad(set_to_none=True)
        _, loss = model(win[:, :-1], win[:, 1:])
        loss.backward()
        norm = torch_gpt.clip_grad_global_norm(model, args.clip)
        opt.step()
        metrics.write(json.dumps({"step": step, "loss": float(loss), "lr": lr,
                                  "grad_norm": norm}) + "\n")
        if step % args.log_every == 0 or step == args.steps - 1:
            print(f"step {step:5d} | loss {float(loss):.4f} | lr {lr:.2e} | "
                  f"norm {norm:.3f} | {time.time() - t0:.1f} s", flush=True)
    train_s = time.time() - t0
    metrics.close()
    torch_gpt.save_model_file(model, os.path.join(args.out_dir, "model.bin"))
    vl, n = val_loss(model, val_tokens, B, T, args.eval_batches)
    print("---- sample ----")
    print(sample(model, b"ROMEO:", 200, args.seed))
    print("----------------")
    print(json.dumps({"val_loss": vl, "val_batches": n, "train_s": round(train_s, 1),
                      "ms_per_step": round(1000 * train_s / args.steps, 2),
                      "tokens_per_s": round(args.steps * B * T / train_s),
                      "last_train_loss": float(loss), "threads": torch.get_num_threads()}))


def evaluate(args):
    model = torch_gpt.load_model_file(args.eval_model)
    vl, n = val_loss(model, torch_gpt.read_token_shard(args.val), args.batch, args.seq,
                     args.eval_batches)
    print(json.dumps({"model": args.eval_model, "val_loss": vl, "val_batches": n}))


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    if args.eval_model:
        evaluate(args)
    else:
        train(args)


if __name__ == "__main__":
    main()
