#!/usr/bin/env python3
"""Writes the seed corpus, tests/fuzz/corpus/<target>/: a few small valid inputs per target
and a few broken ones, so that each fuzzer starts past the first checks. Run from the
repository root; needs protoc (for the coordinator's requests). Rerun when formats change."""
import json
import os
import struct
import subprocess

OUT = "tests/fuzz/corpus"
SPLIT = b"\n--8<--\n"


def put(target, name, data):
    os.makedirs(f"{OUT}/{target}", exist_ok=True)
    with open(f"{OUT}/{target}/{name}", "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def job_spec():
    put("job_spec", "tiny.yaml", open("deploy/examples/tiny.yaml").read())
    put("job_spec", "minimal.yaml", "name: t\ndata: {train: d/*.bin}\n")
    put("job_spec", "parallel.yaml",
        "name: p\ndata: {train: d/*.bin}\ntrain: {global_batch: 8, micro_batch: 2}\n"
        "parallel: {pp: 2, tp: 2, zero_stage: 1}\nmodel: {n_layer: 4, n_head: 4}\n"
        "resources: {world_size: {min: 4, max: 8}}\nprecision: {dtype: fp16, loss_scale: 1024}\n")
    put("job_spec", "bad_key.yaml", "name: t\ndata: {train: x}\ntrain: {stepz: 3}\n")
    put("job_spec", "bad_type.yaml", "name: t\ndata: {train: x}\ntrain: {steps: [1]}\n")


def checkpoint():
    n = 4
    shard = struct.pack("<4f", 1, 2, 3, 4)
    crc = crc32c(shard)

    def manifest(version=2, runs=True, num_params=n):
        shards = []
        for arena in ("params", "adam_m", "adam_v"):
            sh = {"file": f"{arena}.r0.bin", "arena": arena, "bytes": str(4 * n), "crc32c": crc,
                  "begin": "0", "end": str(n)}
            if runs:
                sh["runs"] = [{"begin": "0", "length": str(n), "stride": str(n), "count": "1"}]
            shards.append(sh)
        return json.dumps({"formatVersion": version, "step": "1", "numParams": str(num_params),
                           "dtype": "fp32", "shards": shards}, indent=1).encode()

    put("checkpoint", "valid_v2", manifest() + SPLIT + shard)
    put("checkpoint", "valid_v1", manifest(version=1, runs=False) + SPLIT + shard)
    put("checkpoint", "short_shard", manifest() + SPLIT + shard[:6])
    put("checkpoint", "bad_version", manifest(version=9) + SPLIT + shard)
    put("checkpoint", "not_json", b"{\"formatVersion\": 2, " + SPLIT + shard)


def model_file():
    T, V, L, NH, C, Vp = 4, 8, 1, 1, 4, 8
    n = Vp * C + T * C + L * (C + C + 3 * C * C + 3 * C + C * C + C + C + C + 4 * C * C + 4 * C
                              + C * 4 * C + C) + C + C
    header = struct.pack("<8i", 20240326, 3, T, V, L, NH, C, Vp) + bytes(4 * 248)
    body = struct.pack(f"<{n}f", *[0.01 * (i % 7) for i in range(n)])
    put("model_file", "valid.bin", header + body)
    put("model_file", "short.bin", header + body[:20])
    put("model_file", "bad_magic.bin", struct.pack("<i", 1234) + header[4:] + body)
    put("model_file", "header_only.bin", header)
    # The same model as Hugging Face GPT-2 safetensors (drover export's names and metadata).
    shapes = [("wte.weight", [V, C]), ("wpe.weight", [T, C])]
    for i in range(L):
        h = "h.%d." % i
        shapes += [(h + "ln_1.weight", [C]), (h + "ln_1.bias", [C]),
                   (h + "attn.c_attn.weight", [C, 3 * C]), (h + "attn.c_attn.bias", [3 * C]),
                   (h + "attn.c_proj.weight", [C, C]), (h + "attn.c_proj.bias", [C]),
                   (h + "ln_2.weight", [C]), (h + "ln_2.bias", [C]),
                   (h + "mlp.c_fc.weight", [C, 4 * C]), (h + "mlp.c_fc.bias", [4 * C]),
                   (h + "mlp.c_proj.weight", [4 * C, C]), (h + "mlp.c_proj.bias", [C])]
    shapes += [("ln_f.weight", [C]), ("ln_f.bias", [C])]

    def safetensors(dtype, size):
        meta = {"format": "pt", "n_layer": str(L), "n_head": str(NH), "n_embd": str(C),
                "n_positions": str(T), "vocab_size": str(V)}
        head, data = {"__metadata__": meta}, b""
        for name, shape in shapes:
            numel = 1
            for d in shape:
                numel *= d
            head[name] = {"dtype": dtype, "shape": shape,
                          "data_offsets": [len(data), len(data) + numel * size]}
            data += bytes([(len(data) + k) % 61 for k in range(numel * size)])
        text = json.dumps(head).encode()
        return struct.pack("<Q", len(text)) + text + data

    put("model_file", "hf_f32.safetensors", safetensors("F32", 4))
    put("model_file", "hf_bf16.safetensors", safetensors("BF16", 2))
    put("model_file", "hf_short.safetensors", safetensors("F16", 2)[:300])


def token_file():
    tokens = list(range(40))
    header = struct.pack("<3i", 20240520, 1, len(tokens)) + bytes(4 * 253)
    body = struct.pack(f"<{len(tokens)}H", *tokens)
    put("token_file", "valid_T8.bin", bytes([7]) + header + body)
    put("token_file", "valid_T1.bin", bytes([0]) + header + body)
    put("token_file", "truncated.bin", bytes([7]) + header + body[:11])
    put("token_file", "big_count.bin",
        bytes([3]) + struct.pack("<3i", 20240520, 1, 2**31 - 1) + bytes(4 * 253) + body)


def byte_symbols():
    direct = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
    out, k = {}, 0
    for b in range(256):
        if b in direct:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + k)
            k += 1
    return out


def tokenizer():
    sym = byte_symbols()
    enc = {sym[b]: b for b in range(256)}
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("\u0120", "w")]
    for i, (a, b) in enumerate(merges):
        enc[a + b] = 256 + i
    enc["<|endoftext|>"] = 256 + len(merges)
    vocab = "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)
    put("tokenizer", "valid", json.dumps(enc).encode() + SPLIT + vocab.encode())
    put("tokenizer", "escaped", json.dumps(enc, ensure_ascii=True).encode() + SPLIT + vocab.encode())
    put("tokenizer", "bad_json", b"{\"a\": 1, \"b\" 2}" + SPLIT + vocab.encode())
    put("tokenizer", "bad_merge", json.dumps(enc).encode() + SPLIT + b"#version: 0.2\nh e x\n")


def encode(message, text):
    return subprocess.run(["protoc", "--proto_path=proto", f"--encode=drover.v1.{message}",
                           "proto/drover.proto"], input=text.encode(), check=True,
                          capture_output=True).stdout


def record(op, payload=b""):
    return bytes([op]) + struct.pack("<H", len(payload)) + payload


def coordinator():
    spec = open("deploy/examples/tiny.yaml").read().replace("\n", "\\n").replace('"', '\\"')
    register = encode("RegisterRequest", 'name: "n1" address: "127.0.0.1" agent_id: "a1" '
                      'protocol_version: 1 slots { index: 0 device: CPU } slots { index: 1 device: CPU }')
    submit = encode("SubmitJobRequest", f'spec_yaml: "{spec}"')
    beat = encode("HeartbeatRequest", 'name: "n1" agent_id: "a1" seq: 1 '
                  'trainers { job_id: "#0" attempt: 1 rank: 0 state: TRAINER_RUNNING '
                  'progress { step: 3 } } checkpoints { job_id: "#0" attempt: 1 step: 2 }')
    exited = encode("TrainerExitRequest", 'name: "n1" agent_id: "a1" trainer { job_id: "#0" '
                    'attempt: 1 rank: 0 state: TRAINER_EXITED exit_code: 1 }')
    logs = encode("AppendLogsRequest", 'job_id: "#0" attempt: 1 rank: 0 data: "step 1\\n" offset: 0')
    read = encode("ReadLogsRequest", 'job_id: "#0" rank: 0 offset: 0 max_bytes: 100')
    get = encode("GetJobRequest", 'job_id: "#0"')
    lst = encode("ListJobsRequest", 'limit: 10 name: "tiny"')
    watch = encode("WatchRequest", 'name: "n1" agent_id: "a1"')
    put("coordinator", "register_submit_run",
        record(0, register) + record(5, submit) + record(11, b"\x01") + record(1, beat) +
        record(3, logs) + record(10, read) + record(6, get) + record(7, lst) + record(9))
    put("coordinator", "trainer_fails",
        record(0, register) + record(5, submit) + record(11) + record(1, beat) + record(2, exited) +
        record(11, b"\x50") + record(1, beat))
    put("coordinator", "cancel_and_watch",
        record(4, watch) + record(0, register) + record(4, watch) + record(5, submit) +
        record(8, get) + record(11, b"\xff"))
    put("coordinator", "bad_spec", record(5, encode("SubmitJobRequest", 'spec_yaml: "name: [x"')))
    put("coordinator", "garbage", b"\x01\xff\xff\x00\x01")


def hellaswag():
    put("hellaswag", "valid.jsonl",
        '{"ind": 24, "ctx": "A man is sitting on a roof. he", "label": 3, "endings": '
        '["is using wrap.", "is ripping tiles off.", "is holding a cube.", "starts pulling up roofing."]}\n'
        '{"ctx": "x", "endings": ["a", "b"], "label": "1"}\n')
    put("hellaswag", "long_ending.jsonl",
        '{"ctx": "abc", "endings": ["' + "y" * 20 + '", "z"], "label": 0}\n')
    put("hellaswag", "outside_vocab.jsonl", '{"ctx": "\u00ff\u00fe", "endings": ["\u00e9", "b"], "label": 0}\n')
    put("hellaswag", "bad_label.jsonl", '{"ctx": "a", "endings": ["b", "c"], "label": 7}\n')
    put("hellaswag", "bad_json.jsonl", '{"ctx": "a", "endings": ["b", "c"]\n')


def choice_file():
    # worker/engine/eval/hellaswag.h: int32 magic, version, count; per example line, label,
    # ending count, context length and tokens, each ending's length and tokens.
    def example(line, label, context, endings):
        words = [line, label, len(endings), len(context)] + context
        for e in endings:
            words += [len(e)] + e
        return words
    def file(examples, count=None):
        words = [0x43525644, 1, len(examples) if count is None else count]
        for ex in examples:
            words += ex
        return struct.pack(f"<{len(words)}i", *words)
    good = [example(1, 0, [1, 2, 3], [[4], [5, 6]]), example(2, 3, [7] * 20, [[8], [9], [10], [11, 12]])]
    put("choice_file", "valid.bin", file(good))
    put("choice_file", "long_ending.bin", file([example(1, 0, [1], [[2] * 16, [3]])]))
    put("choice_file", "outside_vocab.bin", file([example(1, 1, [1], [[250], [3]])]))
    put("choice_file", "bad_label.bin", file([example(1, 5, [1], [[2], [3]])]))
    put("choice_file", "cut_short.bin", file(good)[:-4])
    put("choice_file", "count_too_large.bin", file(good, count=9))


for f in (job_spec, checkpoint, model_file, token_file, tokenizer, coordinator, hellaswag,
          choice_file):
    f()
