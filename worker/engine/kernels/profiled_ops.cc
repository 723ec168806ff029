#include "worker/engine/kernels/profiled_ops.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <vector>

namespace drover::engine {
namespace {

constexpr const char* kNames[ProfiledOps::kOpCount] = {"Fill",
                                                       "Copy",
                                                       "Add",
                                                       "Scale",
                                                       "SumSquares",
                                                       "ToHost",
                                                       "FromHost",
                                                       "Round",
                                                       "RoundCopy",
                                                       "NarrowWritten",
                                                       "EncoderForward",
                                                       "EncoderBackward",
                                                       "EncoderBackwardWindow",
                                                       "LayerNormForward",
                                                       "LayerNormBackward",
                                                       "MatmulForward",
                                                       "MatmulBackward",
                                                       "AttentionForward",
                                                       "AttentionBackward",
                                                       "AttentionDecode",
                                                       "GeluForward",
                                                       "GeluBackward",
                                                       "MatmulGeluForward",
                                                       "GeluMatmulBackward",
                                                       "CrossEntropyForward",
                                                       "CrossEntropyBackward",
                                                       "CrossEntropyForwardBackward",
                                                       "CrossEntropyPartForward",
                                                       "CrossEntropyCombine",
                                                       "AdamWUpdate"};

}  // namespace

class ProfiledOps::Timed {
 public:
  Timed(ProfiledOps* ops, Op op, double flops = 0)
      : ops_(ops), op_(op), flops_(flops), start_(std::chrono::steady_clock::now()) {}
  ~Timed() {
    ops_->inner_->Synchronize();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    MutexLock lock(&ops_->mu_);
    Totals& t = ops_->totals_[op_];
    ++t.calls;
    t.seconds += seconds;
    t.flops += flops_;
  }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  ProfiledOps* ops_;
  Op op_;
  double flops_;
  std::chrono::steady_clock::time_point start_;
};

ProfiledOps::Totals ProfiledOps::totals(Op op) const {
  MutexLock lock(&mu_);
  return totals_[op];
}

std::string ProfiledOps::Report(int64_t steps) const {
  std::array<Totals, kOpCount> totals;
  {
    MutexLock lock(&mu_);
    totals = totals_;
  }
  const double per = static_cast<double>(std::max<int64_t>(steps, 1));
  double all = 0;
  for (const Totals& t : totals) all += t.seconds;
  std::vector<int> order(kOpCount);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return totals[a].seconds > totals[b].seconds; });
  std::string out;
  char line[160];
  std::snprintf(line, sizeof(line), "%-22s %9s %11s %10s %7s %9s\n", "op", "calls", "total ms",
                "ms/step", "share", "TFLOP/s");
  out += line;
  for (int i : order) {
    const Totals& t = totals[i];
    if (t.calls == 0) continue;
    char rate[16] = "";
    if (t.flops > 0 && t.seconds > 0) {
      std::snprintf(rate, sizeof(rate), "%.2f", t.flops / t.seconds / 1e12);
    }
    std::snprintf(line, sizeof(line), "%-22s %9lld %11.1f %10.2f %6.1f%% %9s\n", kNames[i],
                  static_cast<long long>(t.calls), t.seconds * 1e3, t.seconds * 1e3 / per,
                  all > 0 ? 100.0 * t.seconds / all : 0.0, rate);
    out += line;
  }
  std::snprintf(line, sizeof(line), "%-22s %9s %11.1f %10.2f  (each op synchronised: no overlap)\n",
                "all", "", all * 1e3, all * 1e3 / per);
  out += line;
  return out;
}

void ProfiledOps::Fill(float* x, float value, size_t n) {
  Timed t(this, kFill);
  inner_->Fill(x, value, n);
}
void ProfiledOps::Copy(float* dst, const float* src, size_t n) {
  Timed t(this, kCopy);
  inner_->Copy(dst, src, n);
}
void ProfiledOps::Add(float* y, const float* x, size_t n) {
  Timed t(this, kAdd);
  inner_->Add(y, x, n);
}
void ProfiledOps::Scale(float* x, size_t n, float s) {
  Timed t(this, kScale);
  inner_->Scale(x, n, s);
}
double ProfiledOps::SumSquares(const float* x, size_t n) {
  Timed t(this, kSumSquares);
  return inner_->SumSquares(x, n);
}
void ProfiledOps::ToHost(float* host, const float* x, size_t n) {
  Timed t(this, kToHost);
  inner_->ToHost(host, x, n);
}
void ProfiledOps::FromHost(float* x, const float* host, size_t n) {
  Timed t(this, kFromHost);
  inner_->FromHost(x, host, n);
}
void ProfiledOps::Round(float* x, size_t n, Precision p) {
  Timed t(this, kRound);
  inner_->Round(x, n, p);
}
void ProfiledOps::RoundCopy(float* dst, const float* src, size_t n, Precision p) {
  Timed t(this, kRoundCopy);
  inner_->RoundCopy(dst, src, n, p);
}
void ProfiledOps::NarrowWritten(float* x, size_t n, Precision p) {
  Timed t(this, kNarrowWritten);
  inner_->NarrowWritten(x, n, p);
}
void ProfiledOps::EncoderForward(float* out, const int32_t* inp, const float* wte, const float* wpe,
                                 int B, int T, int C, Precision store) {
  Timed t(this, kEncoderForward);
  inner_->EncoderForward(out, inp, wte, wpe, B, T, C, store);
}
void ProfiledOps::EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* inp,
                                  int B, int T, int C) {
  Timed t(this, kEncoderBackward);
  inner_->EncoderBackward(dwte, dwpe, dout, inp, B, T, C);
}
void ProfiledOps::EncoderBackwardWindow(float* dwindow, size_t lo, size_t hi, size_t wpe_offset,
                                        const float* dout, const int32_t* inp, int B, int T,
                                        int C) {
  Timed t(this, kEncoderBackwardWindow);
  inner_->EncoderBackwardWindow(dwindow, lo, hi, wpe_offset, dout, inp, B, T, C);
}
void ProfiledOps::LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                                   const float* weight, const float* bias, int N, int C,
                                   Precision store) {
  Timed t(this, kLayerNormForward);
  inner_->LayerNormForward(out, mean, rstd, inp, weight, bias, N, C, store);
}
void ProfiledOps::LayerNormBackward(float* dinp, float* dinp_copy, float* dweight, float* dbias,
                                    const float* dout, bool dout_operand, const float* inp,
                                    const float* weight, const float* mean, const float* rstd,
                                    int N, int C, bool accumulate, Precision store) {
  Timed t(this, kLayerNormBackward);
  inner_->LayerNormBackward(dinp, dinp_copy, dweight, dbias, dout, dout_operand, inp, weight, mean,
                            rstd, N, C, accumulate, store);
}
void ProfiledOps::MatmulForward(float* out, bool out_operand, const float* inp, const float* weight,
                                const float* bias, const float* residual, int N, int C, int OC,
                                int ldo, Precision operands) {
  Timed t(this, kMatmulForward, 2.0 * N * C * OC);
  inner_->MatmulForward(out, out_operand, inp, weight, bias, residual, N, C, OC, ldo, operands);
}
void ProfiledOps::MatmulBackward(float* dinp, bool dinp_operand, float* dweight, float* dbias,
                                 const float* dout, bool dout_operand, const float* inp,
                                 const float* weight, int N, int C, int OC, int ldo,
                                 bool accumulate, Precision operands) {
  // dweight always; dinp unless the caller needs no input gradient.
  Timed t(this, kMatmulBackward, (dinp != nullptr ? 4.0 : 2.0) * N * C * OC);
  inner_->MatmulBackward(dinp, dinp_operand, dweight, dbias, dout, dout_operand, inp, weight, N, C,
                         OC, ldo, accumulate, operands);
}
// Attention's FLOPs as the usual count has them: the two (T, T) products of the forward,
// four in the backward, the causal half included (what a kernel that skips it saves shows
// as a higher rate).
void ProfiledOps::AttentionForward(float* out, float* att, const float* qkv, int B, int T, int C,
                                   int NH, Precision operands) {
  Timed t(this, kAttentionForward, 4.0 * B * T * T * C);
  inner_->AttentionForward(out, att, qkv, B, T, C, NH, operands);
}
void ProfiledOps::AttentionBackward(float* dqkv, const float* dout, bool dout_operand,
                                    const float* out, const float* att, const float* qkv, int B,
                                    int T, int C, int NH, Precision operands) {
  Timed t(this, kAttentionBackward, 8.0 * B * T * T * C);
  inner_->AttentionBackward(dqkv, dout, dout_operand, out, att, qkv, B, T, C, NH, operands);
}
void ProfiledOps::AttentionDecode(float* out, const float* qkv, int from, int rows, int C, int NH) {
  // 4C FLOPs for each (query, key) pair a query sees, q . k and p v, over the heads.
  const double pairs = static_cast<double>(rows) * from + 0.5 * rows * (rows + 1);
  Timed t(this, kAttentionDecode, 4.0 * pairs * C);
  inner_->AttentionDecode(out, qkv, from, rows, C, NH);
}
void ProfiledOps::GeluForward(float* out, const float* inp, size_t N, Precision store) {
  Timed t(this, kGeluForward);
  inner_->GeluForward(out, inp, N, store);
}
void ProfiledOps::GeluBackward(float* dinp, const float* inp, const float* dout, size_t N,
                               Precision store) {
  Timed t(this, kGeluBackward);
  inner_->GeluBackward(dinp, inp, dout, N, store);
}
void ProfiledOps::MatmulGeluForward(float* out, float* pre, const float* inp, const float* weight,
                                    const float* bias, int N, int C, int OC, Precision operands) {
  Timed t(this, kMatmulGeluForward, 2.0 * N * C * OC);
  inner_->MatmulGeluForward(out, pre, inp, weight, bias, N, C, OC, operands);
}
void ProfiledOps::GeluMatmulBackward(float* dpre, float* dweight, float* dbias, const float* dout,
                                     bool dout_operand, const float* inp, const float* weight,
                                     const float* pre, int N, int C, int OC, bool accumulate,
                                     Precision operands) {
  Timed t(this, kGeluMatmulBackward, 4.0 * N * C * OC);
  inner_->GeluMatmulBackward(dpre, dweight, dbias, dout, dout_operand, inp, weight, pre, N, C, OC,
                             accumulate, operands);
}
float ProfiledOps::CrossEntropyForward(float* losses, float* lse, const float* logits,
                                       const int32_t* targets, int N, int V, int Vp,
                                       Precision operands) {
  Timed t(this, kCrossEntropyForward);
  return inner_->CrossEntropyForward(losses, lse, logits, targets, N, V, Vp, operands);
}
void ProfiledOps::CrossEntropyBackward(float* dlogits, const float* logits, const float* lse,
                                       const int32_t* targets, float dloss, int N, int V, int Vp,
                                       Precision store) {
  Timed t(this, kCrossEntropyBackward);
  inner_->CrossEntropyBackward(dlogits, logits, lse, targets, dloss, N, V, Vp, store);
}
float ProfiledOps::CrossEntropyForwardBackward(float* dlogits, float* losses, float* lse,
                                               const float* logits, const int32_t* targets,
                                               float dloss, int N, int V, int Vp,
                                               Precision operands) {
  Timed t(this, kCrossEntropyForwardBackward);
  return inner_->CrossEntropyForwardBackward(dlogits, losses, lse, logits, targets, dloss, N, V, Vp,
                                             operands);
}
void ProfiledOps::CrossEntropyPartForward(float* lse, float* target_logits, const float* logits,
                                          const int32_t* targets, int N, int V, int Vp,
                                          Precision operands) {
  Timed t(this, kCrossEntropyPartForward);
  inner_->CrossEntropyPartForward(lse, target_logits, logits, targets, N, V, Vp, operands);
}
float ProfiledOps::CrossEntropyCombine(float* losses, float* lse, const float* lse_parts,
                                       const float* target_logits, int parts, int N) {
  Timed t(this, kCrossEntropyCombine);
  return inner_->CrossEntropyCombine(losses, lse, lse_parts, target_logits, parts, N);
}
void ProfiledOps::AdamWUpdate(float* params, const float* grads, float* m, float* v, size_t n,
                              float lr, float weight_decay, const AdamWConfig& config, int64_t t) {
  Timed timed(this, kAdamWUpdate);
  inner_->AdamWUpdate(params, grads, m, v, n, lr, weight_decay, config, t);
}
void ProfiledOps::AdamWUpdateSegments(float* params, const float* grads, float* m, float* v,
                                      const AdamWSegment* segments, size_t count, float lr,
                                      const AdamWConfig& config, int64_t t) {
  Timed timed(this, kAdamWUpdate);
  inner_->AdamWUpdateSegments(params, grads, m, v, segments, count, lr, config, t);
}

}  // namespace drover::engine
