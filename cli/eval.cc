// `drover eval MODEL --data SHARDS`: mean loss of a model file on the first N consecutive
// (B, T) batches of token shards, formed as llm.c's loader forms them (engine::EvalLoader).
// `drover eval MODEL --hellaswag FILE.jsonl`: its accuracy on HellaSwag (or any benchmark
// of that shape: worker/engine/eval/hellaswag.h), acc_norm and acc.
// Both on --device cpu or cuda, in --precision fp32, bf16 or fp16 (engine::GptInference).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/device_flags.h"
#include "cli/exit_code.h"
#include "cli/tokenizer_flags.h"
#include "worker/engine/data/loader.h"
#include "worker/engine/data/token_dataset.h"
#include "worker/engine/eval/hellaswag.h"
#include "worker/engine/model/gpt_inference.h"
#include "worker/engine/model/model_file.h"
#include "worker/engine/threads.h"

namespace drover::cli {
namespace {

struct EvalFlags {
  std::string model_path;
  std::string data;
  std::string hellaswag;
  int examples = 0;  // of --hellaswag; 0: all
  TokenizerFlags tokenizer;
  int batches = 10;
  int batch = 4;
  int seq = 0;  // 0: min(64, the model's block size)
  int threads = 0;
  DeviceFlags device;
};

int Usage(const std::string& msg) {
  std::fprintf(stderr, "drover eval: %s\n", msg.c_str());
  return kExitUsage;
}

// A file that cannot be used: 2 when it is the file's fault, 1 when the machine's.
int InputFailure(const std::string& what, const Status& st) {
  std::fprintf(stderr, "drover eval: %s%s\n", what.c_str(), st.message().c_str());
  return ExitCodeForInput(st);
}

// Mean loss over --batches batches of --data; `loss` is set, or an exit code returned.
int EvalLoss(const EvalFlags& f, engine::GptInference& model, double* loss, int* T_out) {
  const engine::GptConfig& cfg = model.config();
  const int T = f.seq > 0 ? f.seq : std::min(64, cfg.max_seq_len);
  if (T > cfg.max_seq_len) {
    return Usage("--seq " + std::to_string(T) + " exceeds the model's block size " +
                 std::to_string(cfg.max_seq_len));
  }
  auto data = engine::TokenDataset::Open(f.data, T);
  if (!data.ok()) return InputFailure("--data: ", data.status());
  std::shared_ptr<const engine::TokenDataset> dataset(std::move(data).value());
  auto loader = engine::EvalLoader::Create(dataset, f.batch, T, cfg.vocab_size);
  if (!loader.ok()) return InputFailure("--data: ", loader.status());
  if ((*loader)->num_batches() < f.batches) {
    return Usage("--batches " + std::to_string(f.batches) + ": the data holds only " +
                 std::to_string((*loader)->num_batches()) + " batches of " +
                 std::to_string(f.batch) + " x " + std::to_string(T) + " tokens");
  }
  std::vector<int32_t> inputs(static_cast<size_t>(f.batch) * T);
  std::vector<int32_t> targets(inputs.size());
  double sum = 0;
  for (int i = 0; i < f.batches; ++i) {
    if (Status st = (*loader)->Batch(i, inputs.data(), targets.data()); !st.ok()) {
      return InputFailure("--data: ", st);
    }
    sum += model.Loss(inputs.data(), targets.data(), f.batch, T);
  }
  *loss = sum / f.batches;
  *T_out = T;
  return kExitOk;
}

int RunEval(const EvalFlags& f, bool json) {
  if (f.data.empty() && f.hellaswag.empty()) return Usage("give --data, --hellaswag or both");
  auto ops = OpsFor(f.device);  // before the model: a machine that cannot run it fails fast
  if (!ops.ok()) return InputFailure("", ops.status());
  auto model = engine::LoadModelFile(f.model_path);
  if (!model.ok()) return InputFailure("", model.status());
  if (f.threads > 0) engine::SetNumThreads(f.threads);
  const engine::Precision precision = PrecisionOf(f.device);
  engine::GptInference run(**model, *ops, precision);
  // Says where the numbers were computed: a bf16 loss is not an fp32 one.
  char where[64];
  std::snprintf(where, sizeof(where), "%s, %s", run.device(), engine::PrecisionName(precision));
  std::vector<engine::ChoiceExample> examples;
  if (!f.hellaswag.empty()) {  // read before the long loss evaluation: a bad file fails fast
    auto tok = TokenizerFor("eval", f.model_path, f.tokenizer);
    if (!tok.ok()) return InputFailure("", tok.status());
    auto read = engine::ReadChoiceExamples(f.hellaswag, **tok, f.examples);
    if (!read.ok()) return InputFailure("--hellaswag: ", read.status());
    examples = std::move(read).value();
  }
  std::string json_out;
  if (!f.data.empty()) {
    double loss = 0;
    int T = 0;
    if (int rc = EvalLoss(f, run, &loss, &T); rc != kExitOk) return rc;
    char buf[256];
    if (json) {
      std::snprintf(buf, sizeof(buf),
                    "\"loss\":%.9g,\"batches\":%d,\"batch\":%d,\"seq\":%d,\"tokens\":%lld", loss,
                    f.batches, f.batch, T, static_cast<long long>(f.batches) * f.batch * T);
      json_out += buf;
    } else {
      std::printf("loss %.6f over %d batches of %d x %d tokens (%s)\n", loss, f.batches, f.batch, T,
                  where);
    }
  }
  if (!examples.empty()) {
    auto acc = engine::EvaluateChoices(run, examples);
    if (!acc.ok()) return InputFailure("--hellaswag: " + f.hellaswag + ": ", acc.status());
    char buf[256];
    if (json) {
      std::snprintf(
          buf, sizeof(buf),
          "%s\"hellaswag_acc_norm\":%.6f,\"hellaswag_acc\":%.6f,\"hellaswag_examples\":%d",
          json_out.empty() ? "" : ",", acc->acc_norm(), acc->acc(), acc->examples);
      json_out += buf;
    } else {
      std::printf("hellaswag: acc_norm %.4f (%d of %d), acc %.4f (%d of %d) (%s)\n",
                  acc->acc_norm(), acc->correct_mean, acc->examples, acc->acc(), acc->correct_sum,
                  acc->examples, where);
    }
  }
  if (json) {
    std::printf("{%s,\"device\":\"%s\",\"precision\":\"%s\"}\n", json_out.c_str(), run.device(),
                engine::PrecisionName(precision));
  }
  return kExitOk;
}

CommandRun SetupEval(CLI::App* app, GlobalOptions* globals) {
  auto f = std::make_shared<EvalFlags>();
  auto json = std::make_shared<bool>(false);
  app->add_option("model", f->model_path,
                  "llm.c model file, HF GPT-2 model.safetensors (or its directory), or a "
                  "checkpoint (step_N/, or a checkpoint.dir for its newest)")
      ->required();
  app->add_option("--data", f->data, "token shards (path or glob): the mean loss on them");
  app->add_option("--hellaswag", f->hellaswag,
                  "HellaSwag JSON lines (hellaswag_val.jsonl, or any file of its shape): the "
                  "accuracy, acc_norm (mean loss per ending token) and acc (sum)");
  app->add_option("--examples", f->examples, "with --hellaswag: only the first N (default: all)")
      ->check(CLI::PositiveNumber);
  AddTokenizerOptions(app, &f->tokenizer);
  app->add_option("--batches", f->batches, "batches to average (default 10)")
      ->check(CLI::PositiveNumber);
  app->add_option("--batch", f->batch, "sequences per batch B (default 4)")
      ->check(CLI::PositiveNumber);
  app->add_option("--seq", f->seq, "sequence length T (default min(64, block size))")
      ->check(CLI::PositiveNumber);
  app->add_option("--threads", f->threads, "CPU threads (default: all)");
  AddDeviceOptions(app, &f->device, /*with_precision=*/true);
  app->add_flag("--json", *json, "print one JSON object");
  return [f, json, globals] { return RunEval(*f, *json || globals->json); };
}

DROVER_REGISTER_COMMAND("eval",
                        "Mean loss of a model file on token shards, or its HellaSwag accuracy",
                        SetupEval);

}  // namespace
}  // namespace drover::cli
