// Entry points of drover's fuzz targets, shared by the libFuzzer binaries (fuzz_main.cc,
// built only with DROVER_FUZZ) and by the regression test that replays every kept crash
// in a normal gcc build (regression_test.cc). Each takes arbitrary bytes, drives one reader
// of untrusted input, and returns 0; a bug shows as a crash, an ASan report, an abort on a
// broken property, or (under libFuzzer) a leak, timeout or out-of-memory.
//
// Not thread-safe: the file-based targets share one scratch directory per process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace drover::fuzz {

// The job-spec YAML: ParseJobSpec (decode + Validate), and a spec that parses must
// survive JobSpecToYaml and parse again.
int FuzzJobSpec(const uint8_t* data, size_t size);
// A checkpoint directory: manifest.json, then kSplit, then the bytes written to every
// shard file the manifest names; ReadManifest, CheckCheckpointShape, ReadCheckpoint.
int FuzzCheckpoint(const uint8_t* data, size_t size);
// An llm.c model file: ReadModelFileConfig and LoadModelFile.
int FuzzModelFile(const uint8_t* data, size_t size);
// An llm.c token shard: first byte picks seq_len, the rest is the file; TokenDataset::Open
// and a read of its windows, and ReadTokenShard.
int FuzzTokenFile(const uint8_t* data, size_t size);
// GPT-2 tokenizer files: encoder.json, then kSplit, then vocab.bpe; LoadGpt2Tokenizer,
// and an Encode/Decode round trip.
int FuzzTokenizer(const uint8_t* data, size_t size);
// A HellaSwag-style JSON lines file: ReadChoiceExamples (byte tokenizer, four examples), and
// ScoreChoices of each with a tiny model (block size 16, vocabulary 200).
int FuzzHellaSwag(const uint8_t* data, size_t size);
// A file of `drover data hellaswag` (data.hellaswag): ReadChoiceFile (eight examples), and
// ChoiceBatches over them at micro_batch 2, seq_len 16, vocabulary 200: every batch filled
// and its losses added, then the accuracy.
int FuzzChoiceFile(const uint8_t* data, size_t size);
// The coordinator's request handlers, in process: a sequence of records, each an opcode
// byte, a 16-bit little-endian length and a serialized request (coordinator_target.cc).
int FuzzCoordinator(const uint8_t* data, size_t size);

// Separates the files of a multi-file input.
inline constexpr char kSplit[] = "\n--8<--\n";

struct Target {
  const char* name;  // as in tests/fuzz/corpus/<name>/ and tests/fuzz/regressions/<name>/
  int (*entry)(const uint8_t* data, size_t size);
};
inline constexpr Target kTargets[] = {
    {"job_spec", FuzzJobSpec},     {"checkpoint", FuzzCheckpoint},
    {"model_file", FuzzModelFile}, {"token_file", FuzzTokenFile},
    {"tokenizer", FuzzTokenizer},  {"coordinator", FuzzCoordinator},
    {"hellaswag", FuzzHellaSwag},  {"choice_file", FuzzChoiceFile},
};

}  // namespace drover::fuzz
