// Every CPU op's forward against a double-precision reference, and its backward against
// central finite differences of that reference (loss = sum(out * w) for a random w, so
// dout = w).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "worker/engine/kernels/cpu/attention.h"
#include "worker/engine/kernels/cpu/crossentropy.h"
#include "worker/engine/kernels/cpu/encoder.h"
#include "worker/engine/kernels/cpu/gelu.h"
#include "worker/engine/kernels/cpu/layernorm.h"
#include "worker/engine/kernels/cpu/matmul.h"
#include "worker/engine/kernels/cpu/simd.h"

namespace drover::engine::cpu {
namespace {

using Vec = std::vector<double>;

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

Vec ToDouble(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }

double Dot(const Vec& a, const std::vector<float>& w) {
  double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += a[i] * w[i];
  return s;
}

// d f / d x[i] by central differences; f reads x.
double CentralDiff(Vec& x, size_t i, const std::function<double()>& f) {
  const double eps = 1e-6;
  const double orig = x[i];
  x[i] = orig + eps;
  const double plus = f();
  x[i] = orig - eps;
  const double minus = f();
  x[i] = orig;
  return (plus - minus) / (2 * eps);
}

// Checks got (float kernel gradient, minus `base` it accumulated onto) against finite
// differences of f over every element of x. Tolerance relative to the gradient's scale.
void ExpectGradMatches(const std::vector<float>& got, const std::vector<float>& base, Vec& x,
                       const std::function<double()>& f, const char* what, double rtol = 1e-4) {
  ASSERT_EQ(got.size(), x.size());
  Vec want(x.size());
  double scale = 1e-12;
  for (size_t i = 0; i < x.size(); i++) {
    want[i] = CentralDiff(x, i, f);
    scale = std::max(scale, std::abs(want[i]));
  }
  for (size_t i = 0; i < x.size(); i++) {
    const double g = got[i] - (base.empty() ? 0.0 : base[i]);
    ASSERT_NEAR(g, want[i], rtol * (scale + std::abs(want[i]))) << what << "[" << i << "]";
  }
}

void ExpectClose(const std::vector<float>& got, const Vec& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); i++) {
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << what << "[" << i << "]";
  }
}

TEST(FastMathTest, ExpAndTanhAreAccurate) {
  for (double x = -80; x <= 80; x += 0.37) {
    EXPECT_NEAR(ExpApprox(static_cast<float>(x)) / std::exp(static_cast<float>(x)), 1.0, 1e-6) << x;
  }
  EXPECT_LT(ExpApprox(-1000.0f), 1e-37f);  // clamped at exp(-87)
  EXPECT_TRUE(std::isfinite(ExpApprox(1000.0f)));
  for (double x = -20; x <= 20; x += 0.013) {
    EXPECT_NEAR(TanhApprox(static_cast<float>(x)), std::tanh(x), 3e-7) << x;
  }
}

// ---- encoder ---------------------------------------------------------------------------

TEST(EncoderTest, ForwardAndBackwardMatchReference) {
  const int B = 2, T = 3, C = 5, Vp = 7;
  const std::vector<int32_t> inp = {1, 4, 1, 6, 0, 4};  // repeated tokens scatter-add
  auto wte = Random(Vp * C, 1), wpe = Random(T * C, 2), w = Random(B * T * C, 3);
  std::vector<float> out(B * T * C);
  EncoderForward(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
  Vec dwte_x = ToDouble(wte), dwpe_x = ToDouble(wpe);
  auto ref = [&]() {
    Vec o(B * T * C);
    for (int b = 0; b < B; b++)
      for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++)
          o[(b * T + t) * C + c] = dwte_x[inp[b * T + t] * C + c] + dwpe_x[t * C + c];
    return o;
  };
  ExpectClose(out, ref(), 1e-6, "out");
  auto dwte = Random(Vp * C, 4), dwpe = Random(T * C, 5);
  const auto dwte0 = dwte, dwpe0 = dwpe;
  EncoderBackward(dwte.data(), dwpe.data(), w.data(), inp.data(), B, T, C);
  auto loss = [&] { return Dot(ref(), w); };
  ExpectGradMatches(dwte, dwte0, dwte_x, loss, "dwte");
  ExpectGradMatches(dwpe, dwpe0, dwpe_x, loss, "dwpe");
}

// ---- layernorm -------------------------------------------------------------------------

Vec LayerNormRef(const Vec& x, const Vec& w, const Vec& b, int N, int C) {
  Vec out(N * C);
  for (int n = 0; n < N; n++) {
    double m = 0, v = 0;
    for (int c = 0; c < C; c++) m += x[n * C + c];
    m /= C;
    for (int c = 0; c < C; c++) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    const double s = 1.0 / std::sqrt(v / C + 1e-5);
    for (int c = 0; c < C; c++) out[n * C + c] = (x[n * C + c] - m) * s * w[c] + b[c];
  }
  return out;
}

TEST(EncoderTest, BackwardWindowsAddUpToTheWholeBackward) {
  // The embedding gradient [dwte (V, C) | dwpe (T, C)] filled window by window (as the shards
  // of ZeRO receive the embedding's rows) equals one EncoderBackward, bit for bit, and
  // nothing outside a window is touched.
  const int B = 2, T = 5, C = 70, V = 9;  // C spans two channel blocks
  std::vector<int32_t> inp = {3, 1, 3, 8, 0, 1, 1, 7, 3, 2};
  const std::vector<float> dout = Random(static_cast<size_t>(B) * T * C, 21);
  const size_t wpe = static_cast<size_t>(V) * C, n = wpe + static_cast<size_t>(T) * C;
  std::vector<float> whole = Random(n, 22);
  std::vector<float> windows = whole;
  EncoderBackward(whole.data(), whole.data() + wpe, dout.data(), inp.data(), B, T, C);
  const std::vector<size_t> cuts = {0, 13, 140, 141, 500, wpe + 3, n};
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    std::vector<float> guard = windows;
    EncoderBackwardWindow(windows.data() + cuts[i], cuts[i], cuts[i + 1], wpe, dout.data(),
                          inp.data(), B, T, C);
    for (size_t j = 0; j < n; ++j) {
      if (j < cuts[i] || j >= cuts[i + 1]) {
        ASSERT_EQ(windows[j], guard[j]) << j;
      }
    }
  }
  for (size_t j = 0; j < n; ++j) ASSERT_EQ(windows[j], whole[j]) << j;
}

TEST(LayerNormTest, ForwardAndBackwardMatchReference) {
  const int N = 6, C = 37;  // C not a multiple of the vector width
  auto x = Random(N * C, 1, 2.0f), w = Random(C, 2), b = Random(C, 3), dy = Random(N * C, 4);
  for (float& v : x) v += 0.5f;  // a non-zero mean
  std::vector<float> out(N * C), mean(N), rstd(N);
  LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  Vec xd = ToDouble(x), wd = ToDouble(w), bd = ToDouble(b);
  ExpectClose(out, LayerNormRef(xd, wd, bd, N, C), 1e-5, "out");

  // Backward accumulates into all three outputs: start them non-zero.
  auto dx = Random(N * C, 5), dw = Random(C, 6), db = Random(C, 7);
  const auto dx0 = dx, dw0 = dw, db0 = db;
  LayerNormBackward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(),
                    rstd.data(), N, C);
  auto loss = [&] { return Dot(LayerNormRef(xd, wd, bd, N, C), dy); };
  ExpectGradMatches(dx, dx0, xd, loss, "dinp");
  ExpectGradMatches(dw, dw0, wd, loss, "dweight");
  ExpectGradMatches(db, db0, bd, loss, "dbias");
}

// ---- matmul ----------------------------------------------------------------------------

TEST(MatmulTest, ForwardAndBackwardMatchReferenceWithRowStride) {
  const int N = 5, C = 7, OC = 6, ldo = 9;  // ldo > OC, as for the LM head's padded rows
  auto x = Random(N * C, 1), w = Random(OC * C, 2), bias = Random(OC, 3);
  auto residual = Random(N * ldo, 4), dy = Random(N * ldo, 5);
  for (int n = 0; n < N; n++)
    for (int o = OC; o < ldo; o++) dy[n * ldo + o] = 0.0f;  // unused columns
  Vec xd = ToDouble(x), wd = ToDouble(w), bd = ToDouble(bias);
  auto ref = [&](bool with_residual) {
    Vec out(N * ldo, 0.0);
    for (int n = 0; n < N; n++)
      for (int o = 0; o < OC; o++) {
        double s = bd[o] + (with_residual ? residual[n * ldo + o] : 0.0);
        for (int c = 0; c < C; c++) s += xd[n * C + c] * wd[o * C + c];
        out[n * ldo + o] = s;
      }
    return out;
  };
  for (bool with_residual : {false, true}) {
    std::vector<float> out(N * ldo, 0.0f);
    MatmulForward(out.data(), x.data(), w.data(), bias.data(),
                  with_residual ? residual.data() : nullptr, N, C, OC, ldo);
    ExpectClose(out, ref(with_residual), 1e-5, "out");
  }
  // dinp is overwritten (start it with garbage); dweight and dbias accumulate.
  auto dx = Random(N * C, 6), dw = Random(OC * C, 7), db = Random(OC, 8);
  const auto dw0 = dw, db0 = db;
  MatmulBackward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, C, OC, ldo);
  auto loss = [&] { return Dot(ref(true), dy); };
  ExpectGradMatches(dx, {}, xd, loss, "dinp");
  ExpectGradMatches(dw, dw0, wd, loss, "dweight");
  ExpectGradMatches(db, db0, bd, loss, "dbias");
}

// ---- attention -------------------------------------------------------------------------

Vec AttentionRef(const Vec& qkv, int B, int T, int C, int NH) {
  const int HS = C / NH;
  Vec out(B * T * C, 0.0);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        const double* q = &qkv[(b * T + t) * 3 * C + h * HS];
        Vec a(t + 1);
        double maxv = -1e300, sum = 0;
        for (int t2 = 0; t2 <= t; t2++) {
          const double* k = &qkv[(b * T + t2) * 3 * C + C + h * HS];
          double d = 0;
          for (int i = 0; i < HS; i++) d += q[i] * k[i];
          a[t2] = d / std::sqrt(static_cast<double>(HS));
          maxv = std::max(maxv, a[t2]);
        }
        for (int t2 = 0; t2 <= t; t2++) sum += (a[t2] = std::exp(a[t2] - maxv));
        for (int t2 = 0; t2 <= t; t2++) {
          const double* v = &qkv[(b * T + t2) * 3 * C + 2 * C + h * HS];
          for (int i = 0; i < HS; i++) out[(b * T + t) * C + h * HS + i] += a[t2] / sum * v[i];
        }
      }
  return out;
}

TEST(AttentionTest, ForwardAndBackwardMatchReference) {
  const int B = 2, T = 5, C = 12, NH = 3;
  auto qkv = Random(B * T * 3 * C, 1, 1.5f), dy = Random(B * T * C, 2);
  std::vector<float> out(B * T * C), att(B * NH * T * T, -1.0f);
  AttentionForward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  Vec qkvd = ToDouble(qkv);
  ExpectClose(out, AttentionRef(qkvd, B, T, C, NH), 1e-5, "out");
  for (int bh = 0; bh < B * NH; bh++)
    for (int t = 0; t < T; t++) {
      double row = 0;
      for (int t2 = 0; t2 < T; t2++) {
        const float p = att[(bh * T + t) * T + t2];
        if (t2 > t) {
          EXPECT_EQ(p, 0.0f) << "masked entry";
        }
        row += p;
      }
      EXPECT_NEAR(row, 1.0, 1e-5);
    }
  auto dqkv = Random(B * T * 3 * C, 3);  // overwritten
  AttentionBackward(dqkv.data(), dy.data(), att.data(), qkv.data(), B, T, C, NH);
  auto loss = [&] { return Dot(AttentionRef(qkvd, B, T, C, NH), dy); };
  ExpectGradMatches(dqkv, {}, qkvd, loss, "dqkv");
}

// ---- gelu ------------------------------------------------------------------------------

double GeluRef(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

TEST(GeluTest, ForwardAndBackwardMatchReference) {
  const size_t N = 10000;  // several chunks, and a ragged tail
  auto x = Random(N, 1, 6.0f), dy = Random(N, 2);
  std::vector<float> out(N);
  GeluForward(out.data(), x.data(), N);
  Vec xd = ToDouble(x), want(N);
  for (size_t i = 0; i < N; i++) want[i] = GeluRef(xd[i]);
  ExpectClose(out, want, 1e-6, "out");
  // In place, as the model uses it: dinp aliases dout.
  std::vector<float> d = dy;
  GeluBackward(d.data(), x.data(), d.data(), N);
  for (size_t i = 0; i < N; i++) {
    const double h = 1e-6;
    const double fd = (GeluRef(xd[i] + h) - GeluRef(xd[i] - h)) / (2 * h) * dy[i];
    ASSERT_NEAR(d[i], fd, 1e-5 * (1 + std::abs(fd))) << "x=" << x[i];
  }
}

// ---- cross-entropy ---------------------------------------------------------------------

TEST(CrossEntropyTest, ForwardAndBackwardMatchReferenceIgnoringPadding) {
  const int N = 4, V = 11, Vp = 16;
  auto logits = Random(N * Vp, 1, 4.0f);
  for (int n = 0; n < N; n++)
    for (int v = V; v < Vp; v++) logits[n * Vp + v] = 100.0f;  // padding must not matter
  const std::vector<int32_t> targets = {3, 0, 10, 3};
  const auto logits0 = logits;
  std::vector<float> losses(N), lse(N);
  const float mean =
      CrossEntropyForward(losses.data(), lse.data(), logits.data(), targets.data(), N, V, Vp);
  EXPECT_EQ(logits, logits0) << "forward must leave the logits readable";
  Vec xd = ToDouble(logits);
  const double scale = 0.75;  // a grad_scale, as with gradient accumulation
  auto ref = [&] {
    double total = 0;
    for (int n = 0; n < N; n++) {
      double m = -1e300, s = 0;
      for (int v = 0; v < V; v++) m = std::max(m, xd[n * Vp + v]);
      for (int v = 0; v < V; v++) s += std::exp(xd[n * Vp + v] - m);
      total += m + std::log(s) - xd[n * Vp + targets[n]];
    }
    return scale * total / N;
  };
  EXPECT_NEAR(mean * scale, ref(), 1e-5);
  CrossEntropyBackward(logits.data(), lse.data(), targets.data(), scale / N, N, V, Vp);
  ExpectGradMatches(logits, {}, xd, ref, "dlogits");
  for (int n = 0; n < N; n++)
    for (int v = V; v < Vp; v++) EXPECT_EQ(logits[n * Vp + v], 0.0f);
}

// The vocabulary split's halves (tensor parallelism): the (N, 32) logits of a 27-token
// vocabulary cut into three ranks' slices of 11, 11 and 10 columns (the last with 5 live,
// the others all live), each part's lse and target logit combined, give the whole row's
// loss and lse; each slice's backward with the combined lse gives the whole backward's
// columns. A slice holding only padding (V = 0) gives -inf and is ignored by the combine.
TEST(CrossEntropyTest, VocabularySlicesCombineToTheWholeRow) {
  const int N = 5, V = 27, Vp = 32;
  const int begins[] = {0, 11, 22, 32}, parts = 4;  // the fourth slice is empty of live ones
  auto logits = Random(N * Vp, 2, 4.0f);
  const std::vector<int32_t> targets = {3, 26, 11, 0, 21};
  std::vector<float> losses(N), lse(N);
  const float mean =
      CrossEntropyForward(losses.data(), lse.data(), logits.data(), targets.data(), N, V, Vp);
  std::vector<float> lse_parts(parts * N), target_logits(N, 0.0f);
  std::vector<std::vector<float>> slices(parts);
  std::vector<std::vector<int32_t>> local_targets(parts);
  for (int p = 0; p < parts; ++p) {
    const int b = begins[p], w = p + 1 < parts ? begins[p + 1] - b : 4;  // 4 padding columns
    const int live = std::clamp(V - b, 0, w);
    slices[p].resize(static_cast<size_t>(N) * w);
    for (int n = 0; n < N; ++n) {
      for (int c = 0; c < w; ++c) {
        slices[p][n * w + c] = b + c < Vp ? logits[n * Vp + b + c] : 0.0f;
      }
      local_targets[p].push_back(targets[n] >= b && targets[n] < b + w ? targets[n] - b : -1);
    }
    std::vector<float> mine(N);
    CrossEntropyPartForward(lse_parts.data() + p * N, mine.data(), slices[p].data(),
                            local_targets[p].data(), N, live, w);
    for (int n = 0; n < N; ++n) target_logits[n] += mine[n];
    if (live == 0) {
      for (int n = 0; n < N; ++n) EXPECT_EQ(lse_parts[p * N + n], -INFINITY);
    }
  }
  std::vector<float> combined_losses(N), combined_lse(N);
  const float combined = CrossEntropyCombine(combined_losses.data(), combined_lse.data(),
                                             lse_parts.data(), target_logits.data(), parts, N);
  EXPECT_NEAR(combined, mean, 1e-5 * mean);
  for (int n = 0; n < N; ++n) {
    EXPECT_NEAR(combined_lse[n], lse[n], 1e-5 * std::fabs(lse[n])) << n;
    EXPECT_NEAR(combined_losses[n], losses[n], 1e-5 * losses[n]) << n;
  }
  CrossEntropyBackward(logits.data(), lse.data(), targets.data(), 0.5f, N, V, Vp);
  for (int p = 0; p < 3; ++p) {
    const int b = begins[p], w = begins[p + 1] - b, live = std::clamp(V - b, 0, w);
    CrossEntropyBackward(slices[p].data(), combined_lse.data(), local_targets[p].data(), 0.5f, N,
                         live, w);
    for (int n = 0; n < N; ++n) {
      for (int c = 0; c < w; ++c) {
        EXPECT_NEAR(slices[p][n * w + c], logits[n * Vp + b + c], 1e-6)
            << p << " " << n << " " << c;
      }
    }
  }
}

// Ids of -1 (tokens another rank's slice holds): zero rows forward, no dwte row backward,
// and their positions' gradients as any other's; in the window variant too.
TEST(EncoderTest, IdsOfAnotherRanksSliceAddNoRowButTheirPosition) {
  const int B = 2, T = 3, C = 4, Vl = 5;
  const std::vector<int32_t> ids = {1, -1, 4, -1, -1, 1};
  const auto wte = Random(Vl * C, 3), wpe = Random(T * C, 4);
  std::vector<float> out(B * T * C, 7.0f);
  EncoderForward(out.data(), ids.data(), wte.data(), wpe.data(), B, T, C);
  for (int i = 0; i < B * T; ++i) {
    for (int c = 0; c < C; ++c) {
      const float want = ids[i] < 0 ? 0.0f : wte[ids[i] * C + c] + wpe[(i % T) * C + c];
      EXPECT_EQ(out[i * C + c], want) << i;
    }
  }
  const auto dout = Random(B * T * C, 5);
  std::vector<float> grads(Vl * C + T * C, 0.0f);
  EncoderBackward(grads.data(), grads.data() + Vl * C, dout.data(), ids.data(), B, T, C);
  for (int c = 0; c < C; ++c) {
    EXPECT_EQ(grads[1 * C + c], dout[0 * C + c] + dout[5 * C + c]);
    EXPECT_EQ(grads[4 * C + c], dout[2 * C + c]);
    EXPECT_EQ(grads[0 * C + c], 0.0f);
    for (int t = 0; t < T; ++t) {
      EXPECT_EQ(grads[Vl * C + t * C + c], dout[t * C + c] + dout[(T + t) * C + c]);
    }
  }
  std::vector<float> window(grads.size(), 0.0f);
  EncoderBackwardWindow(window.data(), 0, window.size(), Vl * C, dout.data(), ids.data(), B, T, C);
  EXPECT_EQ(window, grads);
}

}  // namespace
}  // namespace drover::engine::cpu
