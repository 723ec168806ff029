// The whole model against an independent double-precision GPT-2 forward written here with
// plain loops: the loss and logits match, and the gradient of every tensor matches central
// finite differences of the double loss (a sample of entries per tensor).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "worker/engine/model/gpt.h"

namespace drover::engine {
namespace {

using Vec = std::vector<double>;

// The reference reads parameters by name through the model's tensor table.
class RefGpt {
 public:
  RefGpt(const GptConfig& c, const Gpt& model) : c_(c), model_(model) {}

  // Mean cross-entropy over B*T positions; logits (B, T, V) when not null.
  double Loss(const Vec& p, const std::vector<int32_t>& in, const std::vector<int32_t>& tg, int B,
              int T, Vec* logits_out = nullptr) const {
    const int C = c_.channels, V = c_.vocab_size, NH = c_.num_heads, HS = C / NH;
    const int BT = B * T;
    Vec x(BT * C);
    const double* wte = P(p, "wte");
    const double* wpe = P(p, "wpe");
    for (int i = 0; i < BT; i++)
      for (int k = 0; k < C; k++) x[i * C + k] = wte[in[i] * C + k] + wpe[(i % T) * C + k];
    for (int l = 0; l < c_.num_layers; l++) {
      const std::string h = "h." + std::to_string(l) + ".";
      Vec a = LayerNorm(x, P(p, h + "ln1w"), P(p, h + "ln1b"), BT);
      Vec qkv = Linear(a, P(p, h + "qkvw"), P(p, h + "qkvb"), BT, C, 3 * C);
      Vec y(BT * C, 0.0);
      for (int b = 0; b < B; b++)
        for (int hd = 0; hd < NH; hd++)
          for (int t = 0; t < T; t++) {
            Vec s(t + 1);
            double m = -1e300, z = 0;
            for (int u = 0; u <= t; u++) {
              double d = 0;
              for (int i = 0; i < HS; i++)
                d += qkv[(b * T + t) * 3 * C + hd * HS + i] *
                     qkv[(b * T + u) * 3 * C + C + hd * HS + i];
              s[u] = d / std::sqrt(double(HS));
              m = std::max(m, s[u]);
            }
            for (int u = 0; u <= t; u++) z += (s[u] = std::exp(s[u] - m));
            for (int u = 0; u <= t; u++)
              for (int i = 0; i < HS; i++)
                y[(b * T + t) * C + hd * HS + i] +=
                    s[u] / z * qkv[(b * T + u) * 3 * C + 2 * C + hd * HS + i];
          }
      Vec proj = Linear(y, P(p, h + "attprojw"), P(p, h + "attprojb"), BT, C, C);
      for (int i = 0; i < BT * C; i++) x[i] += proj[i];
      Vec a2 = LayerNorm(x, P(p, h + "ln2w"), P(p, h + "ln2b"), BT);
      Vec f = Linear(a2, P(p, h + "fcw"), P(p, h + "fcb"), BT, C, 4 * C);
      for (double& v : f)
        v = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
      Vec proj2 = Linear(f, P(p, h + "fcprojw"), P(p, h + "fcprojb"), BT, 4 * C, C);
      for (int i = 0; i < BT * C; i++) x[i] += proj2[i];
    }
    Vec xf = LayerNorm(x, P(p, "lnfw"), P(p, "lnfb"), BT);
    Vec logits = Linear(xf, wte, nullptr, BT, C, V);  // tied head, live rows only
    double loss = 0;
    for (int i = 0; i < BT; i++) {
      double m = -1e300, z = 0;
      for (int v = 0; v < V; v++) m = std::max(m, logits[i * V + v]);
      for (int v = 0; v < V; v++) z += std::exp(logits[i * V + v] - m);
      loss += m + std::log(z) - logits[i * V + tg[i]];
    }
    if (logits_out) *logits_out = logits;
    return loss / BT;
  }

 private:
  const double* P(const Vec& p, const std::string& name) const {
    const TensorInfo* t = model_.FindTensor(name);
    EXPECT_NE(t, nullptr) << name;
    return p.data() + t->offset;
  }
  Vec LayerNorm(const Vec& x, const double* w, const double* b, int N) const {
    const int C = c_.channels;
    Vec out(N * C);
    for (int n = 0; n < N; n++) {
      double m = 0, v = 0;
      for (int k = 0; k < C; k++) m += x[n * C + k];
      m /= C;
      for (int k = 0; k < C; k++) v += (x[n * C + k] - m) * (x[n * C + k] - m);
      const double r = 1 / std::sqrt(v / C + 1e-5);
      for (int k = 0; k < C; k++) out[n * C + k] = (x[n * C + k] - m) * r * w[k] + b[k];
    }
    return out;
  }
  static Vec Linear(const Vec& x, const double* w, const double* b, int N, int in, int out) {
    Vec y(N * out);
    for (int n = 0; n < N; n++)
      for (int o = 0; o < out; o++) {
        double s = b ? b[o] : 0.0;
        for (int i = 0; i < in; i++) s += x[n * in + i] * w[o * in + i];
        y[n * out + o] = s;
      }
    return y;
  }
  GptConfig c_;
  const Gpt& model_;
};

class GradCheckTest : public ::testing::Test {
 protected:
  // L=2, C=16, NH=2, V=37 (padded to 128), maxT=8; B=2, T=8.
  GradCheckTest() : model_(Config()) {
    // Well-scaled random parameters (GPT-2 init's 0.02 would make the gradients tiny);
    // padded wte rows stay zero as after InitRandom.
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-0.5f, 0.5f);
    for (const TensorInfo& t : model_.tensors()) {
      float* x = model_.params() + t.offset;
      for (size_t i = 0; i < t.numel; i++) {
        x[i] = u(rng);
        if (t.name.ends_with("ln1w") || t.name.ends_with("ln2w") || t.name == "lnfw") x[i] += 1;
      }
    }
    float* wte = model_.params() + model_.FindTensor("wte")->offset;
    std::fill(wte + 37 * 16, wte + 128 * 16, 0.0f);
    std::uniform_int_distribution<int> tok(0, 36);
    for (int i = 0; i < kB * kT; i++) {
      in_.push_back(tok(rng));
      tg_.push_back(tok(rng));
    }
  }
  static GptConfig Config() { return GptConfig{8, 37, 128, 2, 2, 16}; }
  static constexpr int kB = 2, kT = 8;
  Gpt model_;
  std::vector<int32_t> in_, tg_;
};

TEST_F(GradCheckTest, LossAndLogitsMatchDoubleReference) {
  RefGpt ref(Config(), model_);
  Vec p(model_.params(), model_.params() + model_.num_params());
  Vec want_logits;
  const double want = ref.Loss(p, in_, tg_, kB, kT, &want_logits);
  const float loss = model_.Forward(in_.data(), tg_.data(), kB, kT);
  EXPECT_NEAR(loss, want, 1e-5 * want);
  for (int i = 0; i < kB * kT; i++)
    for (int v = 0; v < 37; v++)
      ASSERT_NEAR(model_.logits()[i * 128 + v], want_logits[i * 37 + v], 2e-5) << i << "," << v;
}

TEST_F(GradCheckTest, EveryTensorsGradientMatchesFiniteDifferences) {
  // Garbage first: after ZeroGrad the backward must overwrite every gradient.
  std::fill(model_.grads(), model_.grads() + model_.num_params(), 123.0f);
  model_.ZeroGrad();
  model_.Forward(in_.data(), tg_.data(), kB, kT);
  model_.Backward();
  RefGpt ref(Config(), model_);
  Vec p(model_.params(), model_.params() + model_.num_params());
  std::mt19937 rng(11);
  for (const TensorInfo& t : model_.tensors()) {
    // 12 random entries per tensor, plus the first and the last.
    std::vector<size_t> idx = {0, t.numel - 1};
    std::uniform_int_distribution<size_t> pick(0, t.numel - 1);
    for (int k = 0; k < 12; k++) idx.push_back(pick(rng));
    if (t.name == "wte") idx.push_back(37 * 16 + 5);  // a padded row: gradient exactly 0
    for (size_t i : idx) {
      double& x = p[t.offset + i];
      const double orig = x, eps = 1e-5;
      x = orig + eps;
      const double plus = ref.Loss(p, in_, tg_, kB, kT);
      x = orig - eps;
      const double minus = ref.Loss(p, in_, tg_, kB, kT);
      x = orig;
      const double fd = (plus - minus) / (2 * eps);
      const float g = model_.grads()[t.offset + i];
      EXPECT_NEAR(g, fd, 2e-5 + 1e-3 * std::abs(fd)) << t.name << "[" << i << "]";
    }
  }
  // Padded rows of wte never receive gradient.
  const float* gwte = model_.grads() + model_.FindTensor("wte")->offset;
  for (int i = 37 * 16; i < 128 * 16; i++) ASSERT_EQ(gwte[i], 0.0f);
}

TEST_F(GradCheckTest, BackwardAccumulatesScaledGradients) {
  // Two half-weighted backward passes equal one full one: gradient accumulation.
  model_.ZeroGrad();
  model_.Forward(in_.data(), tg_.data(), kB, kT);
  model_.Backward(1.0f);
  std::vector<float> once(model_.grads(), model_.grads() + model_.num_params());
  model_.ZeroGrad();
  for (int k = 0; k < 2; k++) {
    model_.Forward(in_.data(), tg_.data(), kB, kT);
    model_.Backward(0.5f);
  }
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < once.size(); i++) {
    max_diff = std::max(max_diff, double(std::abs(once[i] - model_.grads()[i])));
    max_abs = std::max(max_abs, double(std::abs(once[i])));
  }
  EXPECT_GT(max_abs, 1e-3);
  EXPECT_LT(max_diff, 1e-6 * max_abs);
}

}  // namespace
}  // namespace drover::engine
