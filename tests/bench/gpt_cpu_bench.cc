// Training speed of drover's CPU engine at GPT-2 124M shapes (issue 3, "Speed").
//
// One process, fp32, a fixed thread count: warm-up steps, then timed training steps of
// ZeroGrad + Forward + Backward + global-norm clip + AdamW on random tokens. Prints
// tokens/s, ms/step split into forward / backward / optimizer, peak RSS, and model FLOPs
// utilisation (MFU) against an sgemm rate measured in the same run on the same threads.
// It also times, in isolation, every GEMM shape one training step performs, to say how
// much of the step is GEMM (BLAS) and how much everything else.
//
// The last line is one JSON object (tests/bench/run_all.sh reads it). Usage:
//   bench_gpt_cpu_bench [--threads 2] [--batch 4] [--seq 64] [--steps 5] [--warmup 2]
//                       [--layers 12 --heads 12 --channels 768 --vocab 50257 --max-seq 1024]
#include <cblas.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "worker/engine/model/gpt.h"
#include "worker/engine/optim/adamw.h"
#include "worker/engine/optim/grad_clip.h"
#include "worker/engine/threads.h"

namespace drover::engine {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Peak resident set size of this process (VmHWM), in MiB.
double PeakRssMiB() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return -1;
}

// One row-major sgemm C (M, N) = op(A) @ op(B) [+ C], the way a linear layer issues it.
struct GemmShape {
  const char* what;
  int M, N, K;
  bool trans_a, trans_b;
  double count;  // how many times one training step performs it
};

// Seconds for one call of `s`: best of `reps` after one untimed call.
double TimeGemm(const GemmShape& s, int reps) {
  std::vector<float> a(size_t(s.M) * s.K, 0.01f), b(size_t(s.K) * s.N, 0.02f);
  std::vector<float> c(size_t(s.M) * s.N, 0.0f);
  const int lda = s.trans_a ? s.M : s.K, ldb = s.trans_b ? s.K : s.N;
  double best = 1e30;
  for (int r = 0; r <= reps; ++r) {
    const auto t0 = Clock::now();
    cblas_sgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans,
                s.trans_b ? CblasTrans : CblasNoTrans, s.M, s.N, s.K, 1.0f, a.data(), lda, b.data(),
                ldb, 1.0f, c.data(), s.N);
    if (r > 0) best = std::min(best, SecondsSince(t0));
  }
  return best;
}

// The machine's sgemm rate on these threads: a 1536^3 product, best of a few, in GFLOP/s.
double MeasureSgemmGflops() {
  const GemmShape s{"square", 1536, 1536, 1536, false, false, 1};
  return 2.0 * s.M * s.N * s.K / TimeGemm(s, 4) / 1e9;
}

// The large GEMMs of one training step (llm.c's layout: out = inp @ W^T; backward
// dinp = dout @ W and dW += dout^T @ inp). Attention's per-head products are left out:
// at T = 64 they are under 2% of the FLOPs.
std::vector<GemmShape> StepGemms(const GptConfig& c, int B, int T) {
  const int N = B * T, C = c.channels, L = c.num_layers;
  std::vector<GemmShape> out;
  auto linear = [&](const char* what, int in, int oc, double count) {
    out.push_back({what, N, oc, in, false, true, count});   // forward
    out.push_back({what, N, in, oc, false, false, count});  // dinp
    out.push_back({what, oc, in, N, true, false, count});   // dweight
  };
  linear("qkv", C, 3 * C, L);
  linear("attproj", C, C, L);
  linear("fc", C, 4 * C, L);
  linear("fcproj", 4 * C, C, L);
  linear("lm_head", C, c.vocab_size, 1);
  return out;
}

// Model FLOPs of one training step: 3x the forward's matmul FLOPs (backward = 2x),
// attention's QK^T and AV counted in full (no causal halving), LM head over V.
double ModelFlopsPerStep(const GptConfig& c, int B, int T) {
  const double N = double(B) * T, C = c.channels;
  const double per_layer = 2.0 * N * 12.0 * C * C + 4.0 * N * T * C;
  const double forward = c.num_layers * per_layer + 2.0 * N * C * c.vocab_size;
  return 3.0 * forward;
}

struct Options {
  int threads = 2, batch = 4, seq = 64, steps = 5, warmup = 2;
  int layers = 12, heads = 12, channels = 768, vocab = 50257, max_seq = 1024;
  uint64_t seed = 1337;
};

struct StepTimes {
  double forward = 0, backward = 0, optimizer = 0;
  double total() const { return forward + backward + optimizer; }
};

int Run(const Options& o) {
  SetNumThreads(o.threads);
  const double sgemm_gflops = MeasureSgemmGflops();
  std::printf("sgemm rate (1536^3, %d threads): %.1f GFLOP/s\n", o.threads, sgemm_gflops);

  GptConfig config{o.max_seq, o.vocab, PaddedVocabSize(o.vocab), o.layers, o.heads, o.channels};
  if (Status st = config.Validate(); !st.ok()) {
    std::fprintf(stderr, "invalid model shape: %s\n", st.ToString().c_str());
    return 2;
  }
  Gpt model(config);
  model.InitRandom(o.seed);
  AdamWConfig adamw_config{0.9f, 0.99f, 1e-8f, 0.1f};
  AdamW adamw(model.tensors(), model.num_params(), adamw_config);
  std::printf("model: %zu parameters (L=%d NH=%d C=%d V=%d Vp=%d), B=%d T=%d\n", model.num_params(),
              o.layers, o.heads, o.channels, o.vocab, config.padded_vocab_size, o.batch, o.seq);

  std::mt19937 rng(o.seed);
  std::uniform_int_distribution<int32_t> token(0, o.vocab - 1);
  std::vector<int32_t> inputs(size_t(o.batch) * o.seq), targets(inputs.size());
  StepTimes timed;
  float loss = 0;
  for (int step = 0; step < o.warmup + o.steps; ++step) {
    for (auto& t : inputs) t = token(rng);
    for (auto& t : targets) t = token(rng);
    StepTimes st;
    auto t0 = Clock::now();
    model.ZeroGrad();
    loss = model.Forward(inputs.data(), targets.data(), o.batch, o.seq);
    st.forward = SecondsSince(t0);
    t0 = Clock::now();
    model.Backward();
    st.backward = SecondsSince(t0);
    t0 = Clock::now();
    ClipGradNorm(model.grads(), model.num_params(), 1.0);
    adamw.Step(model.params(), model.grads(), 1e-4f);
    st.optimizer = SecondsSince(t0);
    std::printf("%s step %d: loss %.4f  %.1f ms (fwd %.1f, bwd %.1f, opt %.1f)\n",
                step < o.warmup ? "warm-up" : "timed", step, loss, 1e3 * st.total(),
                1e3 * st.forward, 1e3 * st.backward, 1e3 * st.optimizer);
    if (step >= o.warmup) {
      timed.forward += st.forward / o.steps;
      timed.backward += st.backward / o.steps;
      timed.optimizer += st.optimizer / o.steps;
    }
  }
  const double peak_rss = PeakRssMiB();  // before the GEMM probe allocates anything

  double gemm_s = 0;
  for (const GemmShape& s : StepGemms(config, o.batch, o.seq)) gemm_s += s.count * TimeGemm(s, 2);
  const double step_s = timed.total();
  const double tokens_per_s = double(o.batch) * o.seq / step_s;
  const double flops = ModelFlopsPerStep(config, o.batch, o.seq);
  const double mfu = flops / step_s / (sgemm_gflops * 1e9);
  std::printf(
      "drover: %.0f tokens/s, %.1f ms/step (forward %.1f, backward %.1f, optimizer %.1f), "
      "peak RSS %.0f MiB\n",
      tokens_per_s, 1e3 * step_s, 1e3 * timed.forward, 1e3 * timed.backward, 1e3 * timed.optimizer,
      peak_rss);
  std::printf("model FLOPs %.1f GFLOP/step -> %.1f GFLOP/s, MFU %.1f%% of measured sgemm\n",
              flops / 1e9, flops / step_s / 1e9, 100 * mfu);
  std::printf("the step's GEMMs alone (timed in isolation): %.1f ms = %.0f%% of forward+backward\n",
              1e3 * gemm_s, 100 * gemm_s / (timed.forward + timed.backward));
  std::printf(
      "{\"impl\": \"drover\", \"tokens_per_s\": %.1f, \"ms_per_step\": %.2f, \"forward_ms\": "
      "%.2f, \"backward_ms\": %.2f, \"optimizer_ms\": %.2f, \"peak_rss_mib\": %.1f, "
      "\"sgemm_gflops\": %.1f, \"model_gflop_per_step\": %.2f, \"mfu\": %.4f, "
      "\"gemm_ms_isolated\": %.2f, \"threads\": %d, \"last_loss\": %.5f}\n",
      tokens_per_s, 1e3 * step_s, 1e3 * timed.forward, 1e3 * timed.backward, 1e3 * timed.optimizer,
      peak_rss, sgemm_gflops, flops / 1e9, mfu, 1e3 * gemm_s, o.threads, loss);
  return 0;
}

}  // namespace
}  // namespace drover::engine

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress shows through run_all.sh's tee
  drover::engine::Options o;
  CLI::App app{"drover CPU training throughput at GPT-2 shapes"};
  app.add_option("--threads", o.threads, "CPU threads (OpenMP and BLAS)")
      ->check(CLI::PositiveNumber);
  app.add_option("--batch", o.batch, "B")->check(CLI::PositiveNumber);
  app.add_option("--seq", o.seq, "T")->check(CLI::PositiveNumber);
  app.add_option("--steps", o.steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--layers", o.layers, "L")->check(CLI::PositiveNumber);
  app.add_option("--heads", o.heads, "NH")->check(CLI::PositiveNumber);
  app.add_option("--channels", o.channels, "C")->check(CLI::PositiveNumber);
  app.add_option("--vocab", o.vocab, "V")->check(CLI::PositiveNumber);
  app.add_option("--max-seq", o.max_seq, "rows of wpe")->check(CLI::PositiveNumber);
  app.add_option("--seed", o.seed, "init and token seed");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (o.seq > o.max_seq) {
    std::fprintf(stderr, "--seq %d exceeds --max-seq %d\n", o.seq, o.max_seq);
    return 2;
  }
  return drover::engine::Run(o);
}
