// The CUDA kernel table's element-wise ops, embedding, GELU, AdamW and operand buffers against
// the CPU fp32 reference (CpuOps), forward and backward, on the same random inputs. The
// other ops' tests sit beside this, one file each (layernorm_, matmul_, attention_,
// crossentropy_test.cc), and training_test.cc trains on both; cuda_ops_fixture.h is what
// they share.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/cuda/cuda_ops_fixture.h"

namespace drover::engine {
namespace {

// Ops::device_bytes counts what the table's allocations hold, to the byte, and their peak
// (metrics.jsonl's device_mib and device_peak_mib; speed.sh compares it with PyTorch's
// max_memory_allocated).
TEST_F(CudaOpsTest, DeviceBytesCountWhatTheAllocationsHold) {
  const Ops::DeviceBytesHeld before = gpu_->device_bytes();
  const size_t n = 3 << 20;  // floats
  {
    Buffer a = gpu_->Allocate(n);
    const Ops::DeviceBytesHeld held = gpu_->device_bytes();
    EXPECT_EQ(held.now - before.now, n * sizeof(float));
    EXPECT_GE(held.peak, before.peak);
    EXPECT_GE(held.peak, held.now);
    {
      Buffer b = gpu_->Allocate(n);
      EXPECT_EQ(gpu_->device_bytes().now - before.now, 2 * n * sizeof(float));
    }
    EXPECT_EQ(gpu_->device_bytes().now - before.now, n * sizeof(float));
    Buffer c = gpu_->Allocate(16);  // the peak is the most ever held, not the latest sum
    EXPECT_GE(gpu_->device_bytes().peak, before.now + 2 * n * sizeof(float));
  }
  EXPECT_EQ(gpu_->device_bytes().now, before.now);
}

TEST_F(CudaOpsTest, ElementwiseAndReductions) {
  const size_t n = 100003;  // not a multiple of any block size
  std::vector<float> x = Random(n), y = Random(n);
  float* dx = Dev(x);
  float* dy = Dev(y);
  gpu_->Add(dy, dx, n);
  gpu_->Scale(dy, n, 0.5f);
  cpu_->Add(y.data(), x.data(), n);
  cpu_->Scale(y.data(), n, 0.5f);
  ExpectClose(Host(dy, n), y, "add + scale", 0, 0);
  EXPECT_NEAR(gpu_->SumSquares(dx, n), cpu_->SumSquares(x.data(), n),
              1e-10 * cpu_->SumSquares(x.data(), n));
  gpu_->Fill(dy, 2.5f, n);
  ExpectClose(Host(dy, n), std::vector<float>(n, 2.5f), "fill", 0, 0);
  // From the buffer's start (8 floats a thread, then a tail) and from one float in (not
  // 16-byte aligned: a float a thread), which leaves the first float as it was.
  for (Precision p : {Precision::kBf16, Precision::kFp16}) {
    for (const size_t from : {size_t{0}, size_t{1}}) {
      std::vector<float> r = Random(n, 3000.0f);  // fp16 overflows past 65504
      float* dr = Dev(r);
      gpu_->Round(dr + from, n - from, p);
      cpu_->Round(r.data() + from, n - from, p);
      const std::vector<float> got = Host(dr, n);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_TRUE(got[i] == r[i] || (std::isnan(got[i]) && std::isnan(r[i])))
            << PrecisionName(p) << " from " << from << " element " << i << ": gpu " << got[i]
            << ", cpu " << r[i];
      }
      // Out of place, the source left as it was: into a buffer from its start (aligned with
      // the source only where `from` is 0).
      const std::vector<float> s = Random(n, 3000.0f);
      float* ds = Dev(s);
      float* dcopy = Dev(std::vector<float>(n, NAN));
      gpu_->RoundCopy(dcopy, ds + from, n - from, p);
      std::vector<float> want(s.begin() + from, s.end());
      cpu_->Round(want.data(), want.size(), p);
      const std::vector<float> copy = Host(dcopy, n);
      for (size_t i = 0; i + from < n; ++i) {
        ASSERT_TRUE(copy[i] == want[i] || (std::isnan(copy[i]) && std::isnan(want[i])))
            << "round copy " << PrecisionName(p) << " from " << from << " element " << i;
      }
      EXPECT_TRUE(std::isnan(copy[n - 1]) || from == 0) << "wrote past the copy";
      ExpectClose(Host(ds, n), s, "round copy's source", 0, 0);
    }
  }
}

TEST_F(CudaOpsTest, EncoderForwardAndBackward) {
  const int B = 3, T = 17, C = 40, Vp = 64, maxT = 32;
  std::vector<int32_t> tokens(B * T);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng_() % 50);
  tokens[1] = tokens[0];  // a repeated token scatters twice into one row
  const std::vector<float> wte = Random(Vp * C), wpe = Random(maxT * C);
  std::vector<float> out(B * T * C);
  float* dout_gpu = Dev(out);
  gpu_->EncoderForward(dout_gpu, tokens.data(), Dev(wte), Dev(wpe), B, T, C, Precision::kFp32);
  cpu_->EncoderForward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C,
                       Precision::kFp32);
  ExpectClose(Host(dout_gpu, out.size()), out, "encoder forward", 0, 0);

  const std::vector<float> dout = Random(B * T * C);
  std::vector<float> grad = Random(Vp * C + maxT * C);  // [dwte | dwpe], accumulated into
  float* dgrad = Dev(grad);
  gpu_->EncoderBackward(dgrad, dgrad + Vp * C, Dev(dout), tokens.data(), B, T, C);
  cpu_->EncoderBackward(grad.data(), grad.data() + Vp * C, dout.data(), tokens.data(), B, T, C);
  ExpectClose(Host(dgrad, grad.size()), grad, "encoder backward");

  const size_t lo = 700, hi = 2800;  // a window across both tables
  std::vector<float> window = Random(hi - lo);
  float* dwindow = Dev(window);
  gpu_->EncoderBackwardWindow(dwindow, lo, hi, Vp * C, Dev(dout), tokens.data(), B, T, C);
  cpu_->EncoderBackwardWindow(window.data(), lo, hi, Vp * C, dout.data(), tokens.data(), B, T, C);
  ExpectClose(Host(dwindow, window.size()), window, "encoder backward window");

  // Under a vocabulary split some ids are -1 (ops.h): zero rows, no dwte row, their
  // positions' gradients all the same.
  for (size_t i = 0; i < tokens.size(); i += 3) tokens[i] = -1;
  gpu_->EncoderForward(dout_gpu, tokens.data(), Dev(wte), Dev(wpe), B, T, C, Precision::kFp32);
  cpu_->EncoderForward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C,
                       Precision::kFp32);
  ExpectClose(Host(dout_gpu, out.size()), out, "encoder forward with -1 ids", 0, 0);
  dgrad = Dev(grad);
  gpu_->EncoderBackward(dgrad, dgrad + Vp * C, Dev(dout), tokens.data(), B, T, C);
  cpu_->EncoderBackward(grad.data(), grad.data() + Vp * C, dout.data(), tokens.data(), B, T, C);
  ExpectClose(Host(dgrad, grad.size()), grad, "encoder backward with -1 ids");
  dwindow = Dev(window);
  gpu_->EncoderBackwardWindow(dwindow, lo, hi, Vp * C, Dev(dout), tokens.data(), B, T, C);
  cpu_->EncoderBackwardWindow(window.data(), lo, hi, Vp * C, dout.data(), tokens.data(), B, T, C);
  ExpectClose(Host(dwindow, window.size()), window, "encoder backward window with -1 ids");
}

TEST_F(CudaOpsTest, GeluCrossEntropyAndAdamW) {
  // 16-bit buffers go 8 elements a load: 5003 leaves a tail of 3 to the element-wise kernel.
  for (const size_t n : {size_t{5000}, size_t{5003}}) {
    for (Precision store : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
      std::vector<float> y(n);
      const std::string name =
          std::string(" stored ") + PrecisionName(store) + " n " + std::to_string(n);
      // Inputs as a run stores them (GELU reads them so: ops.h, NarrowWritten).
      std::vector<float> x = Random(n, 3.0f), d = Random(n);
      cpu_->Round(x.data(), n, store);
      cpu_->Round(d.data(), n, store);
      float *gy = NewOperand(n, store), *gx = DevOperand(x, store);
      gpu_->GeluForward(gy, gx, n, store);
      cpu_->GeluForward(y.data(), x.data(), n, store);
      ExpectStoredIn(HostOperand(gy, n, store), store, "gelu" + name);
      ExpectClose(HostOperand(gy, n, store), y, "gelu" + name,
                  std::max(StoreTolerance(store), 1e-4));
      std::vector<float> dx = d;
      float* gdx = NewOperand(n, store);  // an operand buffer: in place only where it is floats
      gpu_->GeluBackward(gdx, gx, DevOperand(d, store), n, store);
      cpu_->GeluBackward(dx.data(), x.data(), dx.data(), n, store);
      ExpectStoredIn(HostOperand(gdx, n, store), store, "gelu backward" + name);
      ExpectClose(HostOperand(gdx, n, store), dx, "gelu backward" + name,
                  std::max(StoreTolerance(store), 1e-4));
    }
  }

  // A vocabulary smaller than a block, and GPT-2's (each thread's running max then moves);
  // in fp32 and with bf16 operand buffers, which go 8 logits a load where the rows are
  // 16-byte aligned (Vp a multiple of 8) and one at a time where not (Vp = 61).
  struct Shape {
    int N, V, Vp;
    float scale;
  };
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    for (const Shape& shape :
         {Shape{33, 50, 64, 2.0f}, Shape{3, 50257, 50304, 8.0f}, Shape{7, 45, 61, 2.0f}}) {
      const int N = shape.N, V = shape.V, Vp = shape.Vp;
      const std::string name =
          " V=" + std::to_string(V) + " Vp=" + std::to_string(Vp) + " " + PrecisionName(p);
      std::vector<float> logits = RandomLogits(N, Vp, shape.scale, p);
      std::vector<int32_t> targets = RandomTargets(N, V);
      std::vector<float> losses(N), lse(N);
      float *glogits = DevOperand(logits, p), *glosses = Dev(losses), *glse = Dev(lse);
      const float gmean =
          gpu_->CrossEntropyForward(glosses, glse, glogits, targets.data(), N, V, Vp, p);
      const float cmean = cpu_->CrossEntropyForward(losses.data(), lse.data(), logits.data(),
                                                    targets.data(), N, V, Vp, p);
      EXPECT_NEAR(gmean, cmean, 1e-5 * cmean) << name;
      ExpectClose(Host(glosses, N), losses, "cross-entropy losses" + name);
      ExpectClose(Host(glse, N), lse, "cross-entropy lse" + name);
      // In place, as the model runs it.
      gpu_->CrossEntropyBackward(glogits, glogits, glse, targets.data(), 0.25f / N, N, V, Vp, p);
      cpu_->CrossEntropyBackward(logits.data(), logits.data(), lse.data(), targets.data(),
                                 0.25f / N, N, V, Vp, p);
      ExpectClose(HostOperand(glogits, logits.size(), p), logits, "dlogits" + name,
                  std::max(StoreTolerance(p), 1e-4), 1e-7);
    }
  }

  const size_t n = 5000;
  std::vector<float> p = Random(n), g = Random(n), m = Random(n, 0.1f), v(n);
  for (float& e : v) e = std::fabs(e) * 0.01f;
  float *gp = Dev(p), *gm = Dev(m), *gv = Dev(v);
  const AdamWConfig config{0.9f, 0.95f, 1e-8f, 0.1f};
  gpu_->AdamWUpdate(gp, Dev(g), gm, gv, n, 1e-3f, 0.1f, config, 7);
  cpu_->AdamWUpdate(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.1f, config, 7);
  ExpectClose(Host(gp, n), p, "adamw params", 1e-5, 1e-6);
  ExpectClose(Host(gm, n), m, "adamw m", 1e-5, 1e-7);
  ExpectClose(Host(gv, n), v, "adamw v", 1e-5, 1e-9);
}

TEST_F(CudaOpsTest, OperandBuffersAreSixteenBitInMixedPrecision) {
  const char* inputs = std::getenv("DROVER_CUDA_GEMM_INPUTS");
  const bool fp32_inputs = inputs != nullptr && std::string(inputs) == "fp32";
  EXPECT_EQ(gpu_->OperandFloats(1001, Precision::kFp32), 1001u);
  for (Precision p : {Precision::kBf16, Precision::kFp16}) {
    EXPECT_EQ(gpu_->OperandFloats(1001, p), fp32_inputs ? 1001u : 501u) << PrecisionName(p);
  }
  EXPECT_EQ(cpu_->OperandFloats(1001, Precision::kBf16), 1001u);
}

// A GEMM's output that only ops read next goes through NarrowWritten, which CUDA's table
// leaves unrounded where it is floats (ops.h): its readers must round as they load. Each of
// them, given such values (16-bit ones where operand buffers are: the GEMM wrote them
// rounded), must compute what the CPU computes from the rounded ones. The
// ...EveryOpOnFp32Inputs entry runs it with float operand buffers, ...WithTheGemms with the
// GEMM attention, which rounds a copy.
TEST_F(CudaOpsTest, OpsReadNarrowWrittenValuesAsStored) {
  for (Precision p : {Precision::kBf16, Precision::kFp16}) {
    const std::string name = std::string(" ") + PrecisionName(p);
    const double rtol = std::max(StoreTolerance(p), 1e-4);
    // A GEMM's float output after NarrowWritten on the GPU, and the CPU's (rounded, as
    // CpuOps's NarrowWritten leaves it).
    auto written = [&](std::vector<float> host, float** device) {
      *device = Dev(host);
      gpu_->NarrowWritten(*device, host.size(), p);
      cpu_->NarrowWritten(host.data(), host.size(), p);
      return host;
    };
    // The same for an operand buffer: as written where the table keeps them as floats, else
    // the 16-bit values a GEMM writes (rounded).
    auto written_operand = [&](std::vector<float> host, float** device) {
      if (gpu_->OperandFloats(host.size(), p) == host.size()) return written(host, device);
      cpu_->NarrowWritten(host.data(), host.size(), p);
      *device = DevOperand(host, p);
      return host;
    };
    const size_t n = 3000;
    float *gx = nullptr, *gd = nullptr;
    const std::vector<float> x = written_operand(Random(n, 3.0f), &gx);
    const std::vector<float> d = written_operand(Random(n), &gd);
    std::vector<float> y(n), dx(n);
    float *gy = NewOperand(n, p), *gdx = NewOperand(n, p);
    gpu_->GeluForward(gy, gx, n, p);
    cpu_->GeluForward(y.data(), x.data(), n, p);
    ExpectClose(HostOperand(gy, n, p), y, "gelu" + name, rtol);
    gpu_->GeluBackward(gdx, gx, gd, n, p);
    cpu_->GeluBackward(dx.data(), x.data(), d.data(), n, p);
    ExpectClose(HostOperand(gdx, n, p), dx, "gelu backward" + name, rtol);

    const int N = 70, C = 96;
    std::vector<float> ln_in = Random(N * C), w = Random(C), b = Random(C);
    std::vector<float> ln_out(N * C), mean(N), rstd(N);
    float *gin = Dev(ln_in), *gw = Dev(w), *gmean = Dev(mean), *grstd = Dev(rstd);
    gpu_->LayerNormForward(NewOperand(ln_out.size(), p), gmean, grstd, gin, gw, Dev(b), N, C, p);
    cpu_->LayerNormForward(ln_out.data(), mean.data(), rstd.data(), ln_in.data(), w.data(),
                           b.data(), N, C, p);
    float* gdout = nullptr;
    const std::vector<float> dout = written(Random(N * C), &gdout);
    std::vector<float> dinp(N * C), dw(C), db(C);
    float *gdinp = Dev(dinp), *gdw = Dev(dw), *gdb = Dev(db);
    gpu_->LayerNormBackward(gdinp, nullptr, gdw, gdb, gdout, false, gin, gw, gmean, grstd, N, C,
                            false, p);
    cpu_->LayerNormBackward(dinp.data(), nullptr, dw.data(), db.data(), dout.data(), false,
                            ln_in.data(), w.data(), mean.data(), rstd.data(), N, C, false, p);
    ExpectClose(Host(gdinp, dinp.size()), dinp, "layernorm dinp" + name, rtol, 1e-4);
    ExpectClose(Host(gdw, C), dw, "layernorm dweight" + name, 1e-4, 1e-4);
    ExpectClose(Host(gdb, C), db, "layernorm dbias" + name, 1e-4, 1e-4);

    const int V = 50, Vp = 64;
    float* glogits = nullptr;
    std::vector<float> logits = written_operand(Random(N * Vp, 2.0f), &glogits);
    std::vector<int32_t> targets = RandomTargets(N, V);
    std::vector<float> losses(N), lse(N);
    float *glosses = Dev(losses), *glse = Dev(lse);
    const float gmean_loss =
        gpu_->CrossEntropyForward(glosses, glse, glogits, targets.data(), N, V, Vp, p);
    const float cmean_loss = cpu_->CrossEntropyForward(losses.data(), lse.data(), logits.data(),
                                                       targets.data(), N, V, Vp, p);
    EXPECT_NEAR(gmean_loss, cmean_loss, 1e-5 * cmean_loss) << name;
    ExpectClose(Host(glosses, N), losses, "cross-entropy losses" + name);
    float* gdlogits = glogits;  // in place, as the model calls it
    gpu_->CrossEntropyBackward(gdlogits, glogits, glse, targets.data(), 0.5f / N, N, V, Vp, p);
    cpu_->CrossEntropyBackward(logits.data(), logits.data(), lse.data(), targets.data(), 0.5f / N,
                               N, V, Vp, p);
    ExpectStoredIn(HostOperand(gdlogits, logits.size(), p), p, "dlogits" + name);
    ExpectClose(HostOperand(gdlogits, logits.size(), p), logits, "dlogits" + name, rtol, 1e-7);

    const int B = 2, T = 200, AC = 256, NH = 4;
    float *gqkv = nullptr, *gady = nullptr;
    const std::vector<float> qkv = written_operand(Random(B * T * 3 * AC), &gqkv);
    const std::vector<float> ady = written(Random(B * T * AC), &gady);
    const size_t state_floats = gpu_->AttentionStateFloats(B, T, AC, NH, p);
    std::vector<float> out(B * T * AC), att(static_cast<size_t>(B) * NH * T * T);
    std::vector<float> state(state_floats, NAN), dqkv(qkv.size(), NAN);
    float *gout = NewOperand(out.size(), p), *gstate = Dev(state);
    float* gdqkv = NewOperand(dqkv.size(), p);
    gpu_->AttentionForward(gout, gstate, gqkv, B, T, AC, NH, p);
    cpu_->AttentionForward(out.data(), att.data(), qkv.data(), B, T, AC, NH, p);
    const double attention_rtol = 3e-3 + StoreTolerance(p);
    const AttentionMagnitudes mag = AttentionTermMagnitudes(qkv, ady, att, B, T, AC, NH);
    ExpectClose(HostOperand(gout, out.size(), p), out, "attention out" + name, attention_rtol, 1e-3,
                &mag.out, NarrowedOperandUnit(p));
    gpu_->AttentionBackward(gdqkv, gady, false, gout, gstate, gqkv, B, T, AC, NH, p);
    cpu_->AttentionBackward(dqkv.data(), ady.data(), false, out.data(), att.data(), qkv.data(), B,
                            T, AC, NH, p);
    ExpectClose(HostOperand(gdqkv, dqkv.size(), p), dqkv, "attention dqkv" + name, attention_rtol,
                1e-3, &mag.dqkv, NarrowedOperandUnit(p));
  }
}

// The optimizer's update of every decay segment in one call (one launch on CUDA): segments
// with their own weight decay, one spanning several of the kernel's chunks, and a gap that
// no segment covers and that stays as it was; then the same arenas with another table.
TEST_F(CudaOpsTest, AdamWOverSegmentsInOnePass) {
  const size_t n = 150000;
  std::vector<float> p = Random(n), g = Random(n), m = Random(n, 0.1f), v(n);
  for (float& e : v) e = std::fabs(e) * 0.01f;
  float *gp = Dev(p), *gg = Dev(g), *gm = Dev(m), *gv = Dev(v);
  const AdamWConfig config{0.9f, 0.95f, 1e-8f, 0.1f};
  const std::vector<AdamWSegment> first = {
      {0, 1000, 0.0f}, {1000, 140000, 0.1f}, {145000, 5000, 0.0f}};  // 141000..145000 untouched
  const std::vector<AdamWSegment> second = {{0, 150000, 0.05f}};
  int64_t t = 3;
  for (const std::vector<AdamWSegment>* table : {&first, &second, &first}) {
    gpu_->AdamWUpdateSegments(gp, gg, gm, gv, table->data(), table->size(), 1e-3f, config, t);
    cpu_->AdamWUpdateSegments(p.data(), g.data(), m.data(), v.data(), table->data(), table->size(),
                              1e-3f, config, t);
    ++t;
  }
  ExpectClose(Host(gp, n), p, "adamw segments params", 1e-5, 1e-6);
  ExpectClose(Host(gm, n), m, "adamw segments m", 1e-5, 1e-7);
  ExpectClose(Host(gv, n), v, "adamw segments v", 1e-5, 1e-9);
}

}  // namespace
}  // namespace drover::engine
