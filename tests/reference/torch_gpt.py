"""Independent PyTorch reference for drover's training engine.

A nanoGPT-style GPT-2 (pre-LayerNorm blocks, causal self-attention, tanh-GELU MLP, final
LayerNorm, LM head tied to the token embedding) written from the architecture, plus the
pieces of drover's training step that the golden test and the learning check compare:

  * llm.c's model file (256 x int32 header, magic 20240326, version 3 = fp32 with padded
    vocabulary, then the parameters tensor-major: wte wpe ln1w ln1b qkvw qkvb attprojw
    attprojb ln2w ln2b fcw fcb fcprojw fcprojb lnfw lnfb, each stacked over layers);
  * the padded vocabulary handled as drover (and llm.c) handle it: logits are computed over
    all Vp rows of wte, the softmax and the loss only over the first V columns, so padded
    rows never receive a gradient and stay zero;
  * AdamW with nanoGPT's two decay groups (matrices and embeddings decay; biases and
    LayerNorm parameters do not), global-norm clipping, and the warm-up + decay schedule.

Nothing here imports drover; the only shared facts are the formats above. Runs in any
dtype (the golden file is computed in float64).
"""

import math
import struct

import numpy as np
import torch
import torch.nn.functional as F

MODEL_MAGIC = 20240326
MODEL_VERSION_FP32 = 3
HEADER_INTS = 256

# llm.c's per-layer tensors, in file order; shapes as functions of C.
LAYER_TENSORS = [
    ("ln1w", lambda C: (C,)),
    ("ln1b", lambda C: (C,)),
    ("qkvw", lambda C: (3 * C, C)),
    ("qkvb", lambda C: (3 * C,)),
    ("attprojw", lambda C: (C, C)),
    ("attprojb", lambda C: (C,)),
    ("ln2w", lambda C: (C,)),
    ("ln2b", lambda C: (C,)),
    ("fcw", lambda C: (4 * C, C)),
    ("fcb", lambda C: (4 * C,)),
    ("fcprojw", lambda C: (C, 4 * C)),
    ("fcprojb", lambda C: (C,)),
]
DECAY_LAYER_TENSORS = {"qkvw", "attprojw", "fcw", "fcprojw"}


def padded_vocab_size(vocab_size):
    return (vocab_size + 127) // 128 * 128


class GptConfig:
    def __init__(self, max_seq_len, vocab_size, num_layers, num_heads, channels,
                 padded_vocab=None):
        self.max_seq_len = max_seq_len
        self.vocab_size = vocab_size
        self.padded_vocab_size = padded_vocab or padded_vocab_size(vocab_size)
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.channels = channels
        assert channels % num_heads == 0, "channels must be divisible by heads"
        assert self.padded_vocab_size >= vocab_size

    def __repr__(self):
        return (f"GptConfig(maxT={self.max_seq_len}, V={self.vocab_size}, "
                f"Vp={self.padded_vocab_size}, L={self.num_layers}, "
                f"NH={self.num_heads}, C={self.channels})")


def is_decayed(name):
    return name in ("wte", "wpe") or name in DECAY_LAYER_TENSORS


class Block(torch.nn.Module):
    """One transformer layer's parameters, named as in llm.c (shapes as PyTorch's Linear:
    (out, in))."""

    def __init__(self, C, dtype):
        super().__init__()
        for name, shape in LAYER_TENSORS:
            self.register_parameter(name, torch.nn.Parameter(torch.zeros(shape(C), dtype=dtype)))


class Gpt(torch.nn.Module):
    """GPT-2 in nanoGPT's shape: one set of parameters per layer (so each layer's gradient
    is its own tensor, as with nn.Linear modules), written and read in llm.c's order."""

    def __init__(self, cfg, dtype=torch.float32):
        super().__init__()
        self.cfg = cfg
        C = cfg.channels
        self.wte = torch.nn.Parameter(torch.zeros(cfg.padded_vocab_size, C, dtype=dtype))
        self.wpe = torch.nn.Parameter(torch.zeros(cfg.max_seq_len, C, dtype=dtype))
        self.h = torch.nn.ModuleList(Block(C, dtype) for _ in range(cfg.num_layers))
        self.lnfw = torch.nn.Parameter(torch.ones(C, dtype=dtype))
        self.lnfb = torch.nn.Parameter(torch.zeros(C, dtype=dtype))

    def file_order(self):
        """[(llm.c tensor name, [parameters stacked over layers])] in model-file order."""
        out = [("wte", [self.wte]), ("wpe", [self.wpe])]
        out += [(n, [getattr(b, n) for b in self.h]) for n, _ in LAYER_TENSORS]
        out += [("lnfw", [self.lnfw]), ("lnfb", [self.lnfb])]
        return out

    def init_gpt2(self, seed):
        """GPT-2 init (N(0, 0.02), residual projections scaled by 1/sqrt(2L), biases 0,
        LayerNorm weights 1); padded wte rows zero, as llm.c exports them."""
        g = torch.Generator().manual_seed(seed)
        L = self.cfg.num_layers
        with torch.no_grad():
            for name, params in self.file_order():
                for p in params:
                    if name in ("ln1w", "ln2w", "lnfw"):
                        p.fill_(1.0)
                    elif name.endswith("b"):
                        p.zero_()
                    else:
                        std = 0.02 / math.sqrt(2 * L) if name in ("attprojw", "fcprojw") else 0.02
                        p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32) * std)
            self.wte[self.cfg.vocab_size:].zero_()

    def forward(self, idx, targets=None):
        """idx, targets: (B, T) int64. Returns (logits (B, T, Vp), mean loss or None)."""
        cfg = self.cfg
        B, T = idx.shape
        C, NH = cfg.channels, cfg.num_heads
        HS = C // NH
        assert T <= cfg.max_seq_len
        x = self.wte[idx] + self.wpe[:T]  # (B, T, C)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        for blk in self.h:
            h = F.layer_norm(x, (C,), blk.ln1w, blk.ln1b, eps=1e-5)
            qkv = F.linear(h, blk.qkvw, blk.qkvb)  # (B, T, 3C)
            q, k, v = qkv.split(C, dim=2)
            q = q.view(B, T, NH, HS).transpose(1, 2)  # (B, NH, T, HS)
            k = k.view(B, T, NH, HS).transpose(1, 2)
            v = v.view(B, T, NH, HS).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HS))  # (B, NH, T, T)
            att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(B, T, C)
            x = x + F.linear(y, blk.attprojw, blk.attprojb)
            h = F.layer_norm(x, (C,), blk.ln2w, blk.ln2b, eps=1e-5)
            h = F.gelu(F.linear(h, blk.fcw, blk.fcb), approximate="tanh")  # (B, T, 4C)
            x = x + F.linear(h, blk.fcprojw, blk.fcprojb)
        x = F.layer_norm(x, (C,), self.lnfw, self.lnfb, eps=1e-5)
        logits = x @ self.wte.t()  # (B, T, Vp): tied head over the padded vocabulary
        loss = None
        if targets is not None:
            # The loss sees only the real vocabulary, so padded logits get no gradient.
            real = logits[:, :, :cfg.vocab_size]
            loss = F.cross_entropy(real.reshape(B * T, -1), targets.reshape(-1))
        return logits, loss

    def flat(self, grads=False):
        """All parameters (or gradients) in llm.c file order as one float64 numpy array."""
        parts = []
        for _, params in self.file_order():
            for p in params:
                t = p.grad if grads else p
                parts.append(t.detach().to(torch.float64).reshape(-1).numpy())
        return np.concatenate(parts)

    def load_flat(self, flat):
        """Sets the parameters from a flat array in llm.c file order."""
        offset = 0
        with torch.no_grad():
            for _, params in self.file_order():
                for p in params:
                    n = p.numel()
                    p.copy_(torch.from_numpy(np.asarray(flat[offset:offset + n])).view(p.shape))
                    offset += n

    def num_params(self):
        return sum(p.numel() for p in self.parameters())


def save_model_file(model, path):
    cfg = model.cfg
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:8] = [MODEL_MAGIC, MODEL_VERSION_FP32, cfg.max_seq_len, cfg.vocab_size,
                  cfg.num_layers, cfg.num_heads, cfg.channels, cfg.padded_vocab_size]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(model.flat().astype("<f4").tobytes())


def load_model_file(path, dtype=torch.float32):
    with open(path, "rb") as f:
        data = f.read()
    header = np.frombuffer(data[:HEADER_INTS * 4], dtype="<i4")
    if header[0] != MODEL_MAGIC:
        raise ValueError(f"{path}: bad magic {header[0]} (want {MODEL_MAGIC})")
    if header[1] != MODEL_VERSION_FP32:
        raise ValueError(f"{path}: unsupported version {header[1]} (want 3, fp32)")
    cfg = GptConfig(max_seq_len=int(header[2]), vocab_size=int(header[3]),
                    num_layers=int(header[4]), num_heads=int(header[5]),
                    channels=int(header[6]), padded_vocab=int(header[7]))
    model = Gpt(cfg, dtype=dtype)
    flat = np.frombuffer(data[HEADER_INTS * 4:], dtype="<f4")
    if flat.size != model.num_params():
        raise ValueError(f"{path}: {flat.size} parameters, header implies {model.num_params()}")
    model.load_flat(flat.copy())
    return model


def make_adamw(model, lr, weight_decay, beta1, beta2, eps=1e-8):
    """torch.optim.AdamW with nanoGPT's groups: decay for matrices and embeddings only."""
    decay, no_decay = [], []
    for name, params in model.file_order():
        (decay if is_decayed(name) else no_decay).extend(params)
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(beta1, beta2), eps=eps)


def clip_grad_global_norm(model, max_norm):
    """Returns the global L2 norm; when it is above max_norm, scales the gradients by
    max_norm / (norm + 1e-6), as torch.nn.utils.clip_grad_norm_ does. Written out so the
    norm is summed in float64 whatever the model dtype."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    norm = math.sqrt(sum(float((g.to(torch.float64) ** 2).sum()) for g in grads))
    if max_norm > 0 and norm > max_norm:
        for g in grads:
            g.mul_(max_norm / (norm + 1e-6))
    return norm


def learning_rate(step, lr, min_lr, warmup_steps, total_steps, schedule="cosine"):
    """Linear warm-up over `warmup_steps` (step s gets lr * (s + 1) / warmup), then decay
    from lr to min_lr over the remaining steps (cosine | linear | constant)."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant" or total_steps <= warmup_steps:
        return lr
    ratio = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if schedule == "linear":
        coeff = 1.0 - ratio
    else:
        coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return min_lr + coeff * (lr - min_lr)


def peak_rss_mb():
    """Peak resident set size of this process in MiB (VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def read_token_shard(path):
    """llm.c / nanoGPT token shard: 256 x int32 header (magic 20240520, version 1,
    [2] = token count), then uint16 tokens."""
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(HEADER_INTS * 4), dtype="<i4")
        if header[0] != 20240520 or header[1] != 1:
            raise ValueError(f"{path}: not a token shard (magic {header[0]}, version {header[1]})")
        tokens = np.frombuffer(f.read(), dtype="<u2")
    if tokens.size != header[2]:
        raise ValueError(f"{path}: {tokens.size} tokens, header says {header[2]}")
    return tokens


def write_token_shard(path, tokens):
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = [20240520, 1, len(tokens)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype="<u2").tobytes())


def _self_check():
    """Round-trips a model file and checks that padded rows get no gradient."""
    import os
    import tempfile
    cfg = GptConfig(max_seq_len=8, vocab_size=10, num_layers=1, num_heads=2, channels=8)
    m = Gpt(cfg, torch.float64)
    m.init_gpt2(1)
    idx = torch.randint(0, 10, (2, 8))
    _, loss = m(idx, idx)
    loss.backward()
    assert float(m.wte.grad[10:].abs().max()) == 0.0
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.bin")
        save_model_file(m, path)
        m2 = load_model_file(path, torch.float64)
        assert np.allclose(m.flat(), m2.flat(), atol=1e-7)
    print("torch_gpt self-check ok:", cfg, "loss", float(loss))


if __name__ == "__main__":
    _self_check()
