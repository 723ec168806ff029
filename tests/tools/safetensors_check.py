#!/usr/bin/env python3
"""`drover export --format safetensors` checked from outside drover, with Python's standard
library only (json, struct): no numpy, torch or safetensors package.

  safetensors_check.py BUILD/bin

1. drover-gpt-logits writes an llm.c model file (2 layers, n_embd 16, 2 heads, vocab 64,
   block 8) with every parameter random, so that a swapped or mis-transposed tensor shows.
2. `drover export` turns it into a safetensors file.
3. An independent reader parses that file (length prefix, JSON header, dtype, shapes,
   data_offsets back to back and covering the data, __metadata__) and compares every tensor
   with the model file, read here by its own layout (llm.c's tensor-major order), applying
   the HF GPT-2 names and Conv1D transposes.
4. A GPT-2 forward written here in plain Python (double precision) from the safetensors
   tensors gives drover's logits (drover-gpt-logits logits) within 1e-4.
5. `--format hf` writes a directory of the same model.safetensors (byte for byte) and a
   config.json with GPT2Config's keys for this model; drover reads the directory's file back
   to the same logits (the other direction of the format).
6. Bad input: a missing file, a directory without a model.safetensors, a file with the
   wrong magic, an unknown --format, an output directory that does not exist and --format
   hf onto a file exit 2 with a message naming the problem.
Exit status 0 when every check passes; the first failure is printed and exits 1.
"""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

L, NH, C, V, MAXT = 2, 2, 16, 64, 8
TOKENS = [3, 17, 0, 63, 42, 42, 7, 29]  # T = 8 = block size: every position is used
TOLERANCE = 1e-4


def fail(msg):
    print("safetensors_check: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def run(args, expect_rc=0):
    # On the GPU machine this Python runs without the device pack's libraries on its path
    # (tests/device/pack_env.sh); drover's programs get them back here.
    env = dict(os.environ)
    if env.get("DROVER_PACK_LIB"):
        env["LD_LIBRARY_PATH"] = env["DROVER_PACK_LIB"] + ":" + env.get("LD_LIBRARY_PATH", "")
    p = subprocess.run(args, capture_output=True, text=True, env=env)
    if p.returncode != expect_rc:
        fail("%s exited %d (expected %d)\nstdout: %s\nstderr: %s" %
             (" ".join(args), p.returncode, expect_rc, p.stdout, p.stderr))
    return p


# ---- the llm.c model file, read by its documented layout ----

def read_model_file(path):
    with open(path, "rb") as f:
        data = f.read()
    header = struct.unpack_from("<256i", data, 0)
    if header[0] != 20240326 or header[1] != 3:
        fail("model file header magic/version %d/%d" % (header[0], header[1]))
    maxt, v, nl, nh, c, vp = header[2:8]
    floats = struct.unpack_from("<%df" % ((len(data) - 1024) // 4), data, 1024)
    pos = 0

    def take(n):
        nonlocal pos
        out = floats[pos:pos + n]
        pos += n
        return list(out)

    cfg = dict(maxT=maxt, V=v, L=nl, NH=nh, C=c, Vp=vp)
    t = {"wte": take(vp * c), "wpe": take(maxt * c)}
    # Tensor-major: each per-layer tensor stacked over the layers.
    for name, n in [("ln1w", c), ("ln1b", c), ("qkvw", 3 * c * c), ("qkvb", 3 * c),
                    ("attprojw", c * c), ("attprojb", c), ("ln2w", c), ("ln2b", c),
                    ("fcw", 4 * c * c), ("fcb", 4 * c), ("fcprojw", 4 * c * c),
                    ("fcprojb", c)]:
        for layer in range(nl):
            t["h.%d.%s" % (layer, name)] = take(n)
    t["lnfw"] = take(c)
    t["lnfb"] = take(c)
    if pos != len(floats):
        fail("model file has %d floats, layout needs %d" % (len(floats), pos))
    return cfg, t


def transpose(flat, rows, cols):
    """(rows, cols) row-major -> (cols, rows) row-major."""
    return [flat[r * cols + k] for k in range(cols) for r in range(rows)]


def expected_hf(cfg, t):
    """HF GPT-2 name -> (shape, values) from the model file's tensors."""
    c, v = cfg["C"], cfg["V"]
    e = {"wte.weight": ([v, c], t["wte"][:v * c]),
         "wpe.weight": ([cfg["maxT"], c], t["wpe"])}
    for layer in range(cfg["L"]):
        d = "h.%d." % layer
        e[d + "ln_1.weight"] = ([c], t[d + "ln1w"])
        e[d + "ln_1.bias"] = ([c], t[d + "ln1b"])
        e[d + "attn.c_attn.weight"] = ([c, 3 * c], transpose(t[d + "qkvw"], 3 * c, c))
        e[d + "attn.c_attn.bias"] = ([3 * c], t[d + "qkvb"])
        e[d + "attn.c_proj.weight"] = ([c, c], transpose(t[d + "attprojw"], c, c))
        e[d + "attn.c_proj.bias"] = ([c], t[d + "attprojb"])
        e[d + "ln_2.weight"] = ([c], t[d + "ln2w"])
        e[d + "ln_2.bias"] = ([c], t[d + "ln2b"])
        e[d + "mlp.c_fc.weight"] = ([c, 4 * c], transpose(t[d + "fcw"], 4 * c, c))
        e[d + "mlp.c_fc.bias"] = ([4 * c], t[d + "fcb"])
        e[d + "mlp.c_proj.weight"] = ([4 * c, c], transpose(t[d + "fcprojw"], c, 4 * c))
        e[d + "mlp.c_proj.bias"] = ([c], t[d + "fcprojb"])
    e["ln_f.weight"] = ([c], t["lnfw"])
    e["ln_f.bias"] = ([c], t["lnfb"])
    return e


# ---- the safetensors file, read by the format's specification ----

def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        fail("safetensors file shorter than its 8-byte length prefix")
    (n,) = struct.unpack_from("<Q", data, 0)
    if 8 + n > len(data):
        fail("header length %d runs past the file (%d bytes)" % (n, len(data)))
    if (8 + n) % 8 != 0:
        fail("tensor data starts at byte %d, not 8-byte aligned" % (8 + n))
    raw = data[8:8 + n]
    if not raw.startswith(b"{"):
        fail("header does not start with '{'")
    header = json.loads(raw.decode("utf-8"))
    body = data[8 + n:]
    meta = header.pop("__metadata__", None)
    if not isinstance(meta, dict) or not all(isinstance(x, str) for x in meta.values()):
        fail("__metadata__ missing or not a string map: %r" % (meta,))
    tensors = {}
    spans = []
    for name, info in header.items():
        if set(info) != {"dtype", "shape", "data_offsets"}:
            fail("%s: header keys %s" % (name, sorted(info)))
        if info["dtype"] != "F32":
            fail("%s: dtype %s, expected F32" % (name, info["dtype"]))
        begin, end = info["data_offsets"]
        numel = 1
        for d in info["shape"]:
            numel *= d
        if end - begin != 4 * numel:
            fail("%s: data_offsets %d..%d hold %d bytes, shape %s needs %d" %
                 (name, begin, end, end - begin, info["shape"], 4 * numel))
        spans.append((begin, end, name))
        tensors[name] = (info["shape"], list(struct.unpack_from("<%df" % numel, body, begin)))
    spans.sort()
    at = 0
    for begin, end, name in spans:
        if begin != at:
            fail("%s starts at %d, the previous tensor ends at %d (gap or overlap)" %
                 (name, begin, at))
        at = end
    if at != len(body):
        fail("tensors cover %d bytes of %d after the header" % (at, len(body)))
    return meta, tensors


# ---- GPT-2 forward, plain Python ----

def layer_norm(x, w, b):
    mean = sum(x) / len(x)
    var = sum((v - mean) ** 2 for v in x) / len(x)
    r = 1.0 / math.sqrt(var + 1e-5)
    return [(v - mean) * r * wi + bi for v, wi, bi in zip(x, w, b)]


def conv1d(x, w, b, n_in, n_out):
    """x (n_in) @ w (n_in, n_out) + b: HF's Conv1D."""
    out = list(b)
    for i in range(n_in):
        xi = x[i]
        row = w[i * n_out:(i + 1) * n_out]
        for o in range(n_out):
            out[o] += xi * row[o]
    return out


def gelu(v):  # GPT-2's tanh approximation ("gelu_new")
    return 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))


def gpt2_logits(w, tokens, n_layer, n_head, c, v):
    T = len(tokens)
    hs = c // n_head
    x = [[w["wte.weight"][tok * c + i] + w["wpe.weight"][t * c + i] for i in range(c)]
         for t, tok in enumerate(tokens)]
    for layer in range(n_layer):
        p = "h.%d." % layer
        qkv = [conv1d(layer_norm(xt, w[p + "ln_1.weight"], w[p + "ln_1.bias"]),
                      w[p + "attn.c_attn.weight"], w[p + "attn.c_attn.bias"], c, 3 * c)
               for xt in x]
        y = [[0.0] * c for _ in range(T)]
        for h in range(n_head):
            for t in range(T):
                q = qkv[t][h * hs:(h + 1) * hs]
                scores = []
                for s in range(t + 1):  # causal
                    k = qkv[s][c + h * hs:c + (h + 1) * hs]
                    scores.append(sum(a * b for a, b in zip(q, k)) / math.sqrt(hs))
                m = max(scores)
                e = [math.exp(sc - m) for sc in scores]
                z = sum(e)
                for s in range(t + 1):
                    vv = qkv[s][2 * c + h * hs:2 * c + (h + 1) * hs]
                    for i in range(hs):
                        y[t][h * hs + i] += e[s] / z * vv[i]
        for t in range(T):
            a = conv1d(y[t], w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"], c, c)
            x[t] = [xi + ai for xi, ai in zip(x[t], a)]
            hdn = conv1d(layer_norm(x[t], w[p + "ln_2.weight"], w[p + "ln_2.bias"]),
                         w[p + "mlp.c_fc.weight"], w[p + "mlp.c_fc.bias"], c, 4 * c)
            m = conv1d([gelu(u) for u in hdn], w[p + "mlp.c_proj.weight"],
                       w[p + "mlp.c_proj.bias"], 4 * c, c)
            x[t] = [xi + mi for xi, mi in zip(x[t], m)]
    out = []
    for t in range(T):
        f = layer_norm(x[t], w["ln_f.weight"], w["ln_f.bias"])
        # The LM head is tied to wte.
        out.append([sum(f[i] * w["wte.weight"][tok * c + i] for i in range(c))
                    for tok in range(v)])
    return out


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    bindir = sys.argv[1]
    drover = os.path.join(bindir, "drover")
    tool = os.path.join(bindir, "drover-gpt-logits")
    with tempfile.TemporaryDirectory(prefix="drover_safetensors_") as tmp:
        model = os.path.join(tmp, "model.bin")
        out = os.path.join(tmp, "model.safetensors")
        run([tool, "write", model, "--layers", str(L), "--heads", str(NH), "--embd", str(C),
             "--vocab", str(V), "--block", str(MAXT), "--seed", "11"])
        run([drover, "export", model, "--format", "safetensors", "-o", out])
        if sorted(os.listdir(tmp)) != ["model.bin", "model.safetensors"]:
            fail("export left other files behind: %s" % sorted(os.listdir(tmp)))

        cfg, file_tensors = read_model_file(model)
        meta, tensors = read_safetensors(out)
        if meta.get("format") != "pt":
            fail("__metadata__.format is %r; transformers needs 'pt'" % meta.get("format"))
        want_meta = {"n_layer": L, "n_head": NH, "n_embd": C, "n_positions": MAXT,
                     "vocab_size": V}
        for k, val in want_meta.items():
            if meta.get(k) != str(val):
                fail("__metadata__.%s is %r, expected '%d'" % (k, meta.get(k), val))

        expected = expected_hf(cfg, file_tensors)
        if sorted(tensors) != sorted(expected):
            fail("tensor names differ: extra %s, missing %s" %
                 (sorted(set(tensors) - set(expected)), sorted(set(expected) - set(tensors))))
        for name, (shape, values) in expected.items():
            got_shape, got = tensors[name]
            if got_shape != shape:
                fail("%s: shape %s, expected %s" % (name, got_shape, shape))
            # A copy of fp32 values: equal bit for bit, not approximately.
            if got != values:
                i = next(i for i, (a, b) in enumerate(zip(got, values)) if a != b)
                fail("%s: value %d is %r, the model file has %r" % (name, i, got[i], values[i]))
        print("safetensors_check: %d tensors, names, shapes, offsets and every value agree" %
              len(tensors))

        weights = {name: vals for name, (_, vals) in tensors.items()}
        ours = gpt2_logits(weights, TOKENS, L, NH, C, V)
        p = run([tool, "logits", model, "--tokens", ",".join(map(str, TOKENS))])
        theirs = json.loads(p.stdout)["logits"]
        worst = max(abs(a - b) for ra, rb in zip(ours, theirs) for a, b in zip(ra, rb))
        scale = max(abs(a) for r in ours for a in r)
        if len(theirs) != len(TOKENS) or any(len(r) != V for r in theirs):
            fail("drover-gpt-logits printed %d rows" % len(theirs))
        if not worst <= TOLERANCE:
            fail("logits differ by %.3g (tolerance %g)" % (worst, TOLERANCE))
        print("safetensors_check: Python GPT-2 forward matches drover's logits: max |diff| "
              "%.3g over %dx%d logits of magnitude up to %.3g" %
              (worst, len(TOKENS), V, scale))

        hf_dir = os.path.join(tmp, "hf")
        run([drover, "export", model, "--format", "hf", "-o", hf_dir])
        if sorted(os.listdir(hf_dir)) != ["config.json", "model.safetensors"]:
            fail("--format hf wrote %s" % sorted(os.listdir(hf_dir)))
        with open(os.path.join(hf_dir, "model.safetensors"), "rb") as a, open(out, "rb") as b:
            if a.read() != b.read():
                fail("--format hf's model.safetensors differs from --format safetensors' file")
        with open(os.path.join(hf_dir, "config.json")) as f:
            config = json.load(f)
        want_config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
                       "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
                       "n_layer": L, "n_head": NH, "n_embd": C, "n_positions": MAXT,
                       "vocab_size": V, "tie_word_embeddings": True}
        for k, val in want_config.items():
            if config.get(k) != val:
                fail("config.json %s is %r, expected %r" % (k, config.get(k), val))
        p = run([tool, "logits", os.path.join(hf_dir, "model.safetensors"), "--tokens",
                 ",".join(map(str, TOKENS))])
        if json.loads(p.stdout)["logits"] != theirs:
            fail("the exported safetensors file, read back by drover, gives other logits")
        print("safetensors_check: --format hf wrote model.safetensors and config.json; drover "
              "reads the file back to the same logits")

        # Bad input: exit 2 and a message that names the problem.
        missing = os.path.join(tmp, "nope.bin")
        p = run([drover, "export", missing, "--format", "safetensors"], expect_rc=2)
        if missing not in p.stderr:
            fail("missing file: message does not name it: %r" % p.stderr)
        foreign = os.path.join(tmp, "foreign.bin")
        with open(foreign, "wb") as f:
            f.write(b"\0" * 4096)
        p = run([drover, "export", foreign, "-o", os.path.join(tmp, "x.safetensors")],
                expect_rc=2)
        if "magic" not in p.stderr:
            fail("wrong magic: message does not say so: %r" % p.stderr)
        p = run([drover, "export", model, "--format", "onnx"], expect_rc=2)
        if "onnx" not in p.stderr or "safetensors" not in p.stderr:
            fail("unknown format: message %r" % p.stderr)
        empty = os.path.join(tmp, "empty")
        os.mkdir(empty)
        p = run([drover, "export", empty], expect_rc=2)
        if "is a directory" not in p.stderr or "model.safetensors" not in p.stderr:
            fail("directory without a model as model: message %r" % p.stderr)
        p = run([drover, "export", model, "-o", os.path.join(tmp, "no", "x.safetensors")],
                expect_rc=2)
        if "does not exist" not in p.stderr:
            fail("missing output directory: message %r" % p.stderr)
        p = run([drover, "export", model, "--format", "hf", "-o", out], expect_rc=2)
        if "is a file" not in p.stderr:
            fail("--format hf onto a file: message %r" % p.stderr)
        if os.path.exists(os.path.join(tmp, "x.safetensors")):
            fail("a refused export left an output file")
        print("safetensors_check: bad input exits 2 with a clear message")
    print("safetensors_check: PASS")


if __name__ == "__main__":
    main()
