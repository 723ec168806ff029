// The fused attention kernels (worker/engine/kernels/cuda/attention_mma.cu) at every tile
// shape and occupancy the kernel table can launch (MmaAttentionTiles, which
// DROVER_CUDA_ATTENTION_TILES chooses) and three it cannot, timed on one GPU at one shape; the
// last line names the fastest choice (tests/device/speed.sh trains with it too). The kernels
// are compiled into this program from the same source (included below), so a variant differs
// from the table's only in its template arguments.
//
//   bench_attention_tiles [B T C NH [LAYERS]]     default: GPT-2 124M at T = 1024, B = 32
//
// For each variant: the time a call (median of 20, after 3 warm-ups, cudaEvent), the time for
// LAYERS calls (a training step's share, comparable with tests/device/kernels.sh), the
// tensor-core rate it reaches on the causal half's FLOPs, and the largest difference of its
// output from the table's variant (0 for the backward's, which only change occupancy; the
// forward's tile shapes change the online softmax's order: a few bf16 ulps). bf16 only.
// Needs a GPU; without one it says so and exits 0.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "worker/engine/kernels/cuda/attention_mma.cu"  // its kernels, in its unnamed namespace

namespace drover::engine::cuda {
namespace {  // the included file's unnamed namespace: its kernels by name

using N = __nv_bfloat16;
constexpr int kHeadSize = 64;

struct Shape {
  int B = 32, T = 1024, C = 768, NH = 12, layers = 12;
  size_t Rows() const { return static_cast<size_t>(B) * T; }
  // Multiply-adds of the causal half, times 2: S = q k^T and o = P v in the forward; the
  // backward recomputes S, and takes dP, dv, dk (dkv kernel) and S, dP, dq (dq kernel).
  double ProductFlops(int products) const {
    return products * 2.0 * B * NH * (static_cast<double>(T) * T / 2) * kHeadSize;
  }
};

template <typename T>
T* DeviceArray(size_t n) {
  void* p = nullptr;
  DROVER_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
  DROVER_CUDA_CHECK(cudaMemset(p, 0, n * sizeof(T)));
  return static_cast<T*>(p);
}

N* RandomBf16(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<N> host(n);
  for (N& x : host) x = __float2bfloat16(normal(rng));
  N* d = DeviceArray<N>(n);
  DROVER_CUDA_CHECK(cudaMemcpy(d, host.data(), n * sizeof(N), cudaMemcpyHostToDevice));
  return d;
}

std::vector<float> ToHost(const N* d, size_t n) {
  std::vector<N> host(n);
  DROVER_CUDA_CHECK(cudaMemcpy(host.data(), d, n * sizeof(N), cudaMemcpyDeviceToHost));
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = __bfloat162float(host[i]);
  return out;
}

double MaxDifference(const std::vector<float>& a, const std::vector<float>& b) {
  double most = 0.0;
  for (size_t i = 0; i < a.size(); ++i) most = std::max(most, std::fabs(double{a[i]} - b[i]));
  return most;
}

// The median time of one call of `launch`, in ms.
template <typename Launch>
double TimeMs(Launch launch) {
  cudaEvent_t start, stop;
  DROVER_CUDA_CHECK(cudaEventCreate(&start));
  DROVER_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) launch();
  std::vector<float> times;
  for (int i = 0; i < 20; ++i) {
    DROVER_CUDA_CHECK(cudaEventRecord(start));
    launch();
    DROVER_CUDA_CHECK(cudaEventRecord(stop));
    DROVER_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    DROVER_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  DROVER_CUDA_CHECK(cudaEventDestroy(start));
  DROVER_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void Report(const char* kernel, const char* variant, const Shape& s, double ms, int products,
            double difference) {
  std::printf("%-8s %-34s %8.3f ms  %8.2f ms/%d layers  %6.1f TFLOP/s  max diff %.3g\n", kernel,
              variant, ms, ms * s.layers, s.layers, s.ProductFlops(products) / (ms * 1e9),
              difference);
}

struct Buffers {
  N *qkv, *dout, *out, *out2, *dqkv, *dqkv2;
  float *lse, *lse2, *D;
};

// The fastest of what DROVER_CUDA_ATTENTION_TILES can choose (MmaAttentionTiles), kernel by
// kernel.
struct Fastest {
  MmaAttentionTiles tiles;
  double forward_ms = 1e30, dq_ms = 1e30, dkv_ms = 1e30;
};

// One forward shape, timed through its kernel; `choice` is its MmaAttentionTiles value where
// the table offers it (null: this bench's only, e.g. one that spills).
template <int kM, int kNB, bool kQFromShared = false>
void ForwardVariant(const Shape& s, const Buffers& b, const std::vector<float>& reference,
                    const char* name, const MmaAttentionTiles::Forward* choice, Fastest* fastest) {
  using F = ForwardTiles<kHeadSize, kM, kNB>;
  auto* kernel = &MmaForwardKernel<N, kHeadSize, kM, kNB, kQFromShared>;
  if (F::kBytes > fused::SharedOptIn()) {
    std::printf("forward  %-34s needs %zu bytes of shared memory: skipped\n", name, F::kBytes);
    return;
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadSize));
  const OperandOut out{b.out2, true, Precision::kBf16};
  const OperandIn qkv{b.qkv, true, Precision::kBf16};
  const double ms = TimeMs([&] {
    fused::LaunchWithShared(kernel, Grid(s.B, s.T, s.NH, F::kQueryRows), F::kBytes, nullptr, out,
                            b.lse2, qkv, s.T, s.C, s.NH, scale);
  });
  DROVER_CUDA_CHECK(cudaDeviceSynchronize());
  Report("forward", name, s, ms, 2, MaxDifference(reference, ToHost(b.out2, s.Rows() * s.C)));
  if (choice != nullptr && ms < fastest->forward_ms) {
    fastest->forward_ms = ms;
    fastest->tiles.forward = *choice;
  }
}

// dq (and dk dv where kDkv) with launch bounds of kBlocks blocks an SM; where dk dv is not
// run, the table's writes those columns, so that the whole of dqkv compares. `offered`: the
// table can be told to launch them so (DROVER_CUDA_ATTENTION_TILES dq=, dkv=).
template <int kBlocks, bool kDkv>
void BackwardVariants(const Shape& s, const Buffers& b, const std::vector<float>& reference,
                      bool offered, Fastest* fastest) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadSize));
  const OperandOut dqkv{b.dqkv2, true, Precision::kBf16};
  const OperandIn qkv{b.qkv, true, Precision::kBf16};
  const dim3 grid = Grid(s.B, s.T, s.NH, kKeys);
  char name[64];
  std::snprintf(name, sizeof(name), "%d blocks an SM", kBlocks);
  DROVER_CUDA_CHECK(cudaMemset(b.dqkv2, 0, s.Rows() * 3 * s.C * sizeof(N)));
  const double dq = TimeMs([&] {
    fused::LaunchWithShared(&MmaDqKernel<N, kHeadSize, kBlocks>, grid, Tiles<kHeadSize>::kDq,
                            nullptr, dqkv, static_cast<const N*>(b.dout), b.lse, b.D, qkv, s.T, s.C,
                            s.NH, scale);
  });
  constexpr int kDkvBlocks = kDkv ? kBlocks : BackwardBlocksPerSm<kHeadSize>();
  const double dkv = TimeMs([&] {
    fused::LaunchWithShared(&MmaDkvKernel<N, kHeadSize, kDkvBlocks>, grid, Tiles<kHeadSize>::kDkv,
                            nullptr, dqkv, static_cast<const N*>(b.dout), b.lse, b.D, qkv, s.T, s.C,
                            s.NH, scale);
  });
  DROVER_CUDA_CHECK(cudaDeviceSynchronize());
  const double difference = MaxDifference(reference, ToHost(b.dqkv2, s.Rows() * 3 * s.C));
  Report("dq", name, s, dq, 3, difference);
  if (kDkv) Report("dk dv", name, s, dkv, 4, difference);
  if (!offered) return;
  if (dq < fastest->dq_ms) fastest->dq_ms = dq, fastest->tiles.dq_blocks = kBlocks;
  if (kDkv && dkv < fastest->dkv_ms) fastest->dkv_ms = dkv, fastest->tiles.dkv_blocks = kBlocks;
}

int Run(const Shape& s) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("attention tiles bench: no CUDA device; nothing timed\n");
    return 0;
  }
  if (s.C % s.NH != 0 || s.C / s.NH != kHeadSize) {
    std::printf("attention tiles bench: head size %d; this bench times %d only\n", s.C / s.NH,
                kHeadSize);
    return 2;
  }
  cudaDeviceProp prop{};
  DROVER_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("attention tiles bench on %s: B=%d T=%d C=%d NH=%d (head size %d), bf16\n", prop.name,
              s.B, s.T, s.C, s.NH, kHeadSize);
  std::mt19937 rng(1234);
  Buffers b{};
  b.qkv = RandomBf16(s.Rows() * 3 * s.C, rng);
  b.dout = RandomBf16(s.Rows() * s.C, rng);
  b.out = DeviceArray<N>(s.Rows() * s.C);
  b.out2 = DeviceArray<N>(s.Rows() * s.C);
  b.dqkv = DeviceArray<N>(s.Rows() * 3 * s.C);
  b.dqkv2 = DeviceArray<N>(s.Rows() * 3 * s.C);
  const size_t stats = static_cast<size_t>(s.B) * s.NH * s.T;
  b.lse = DeviceArray<float>(stats);
  b.lse2 = DeviceArray<float>(stats);
  b.D = DeviceArray<float>(DotFloats(s.B, s.T, s.NH));

  // The table's own forward and backward, as the training step runs them: the references.
  const OperandIn qkv{b.qkv, true, Precision::kBf16};
  const OperandIn dout{b.dout, true, Precision::kBf16};
  const OperandIn out_in{b.out, true, Precision::kBf16};
  const OperandOut out{b.out, true, Precision::kBf16};
  const OperandOut dqkv{b.dqkv, true, Precision::kBf16};
  const MmaAttentionTiles table;  // the defaults: what a run without the variable takes
  Forward<N, kHeadSize>(out, b.lse, qkv, s.B, s.T, s.C, s.NH, table, nullptr);
  Backward<N, kHeadSize>(dqkv, b.D, dout, out_in, b.lse, qkv, s.B, s.T, s.C, s.NH, table, nullptr);
  DROVER_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> out_ref = ToHost(b.out, s.Rows() * s.C);
  const std::vector<float> dqkv_ref = ToHost(b.dqkv, s.Rows() * 3 * s.C);
  const double dot = TimeMs([&] {
    fused::SoftmaxDot<N, kHeadSize>(b.D, static_cast<N*>(nullptr), static_cast<const N*>(b.dout),
                                    out_in, s.B, s.T, s.C, s.NH, nullptr);
  });
  std::printf("D        %-34s %8.3f ms  %8.2f ms/%d layers\n", "softmax dot", dot, dot * s.layers,
              s.layers);

  using Choice = MmaAttentionTiles::Forward;
  const Choice k16x64 = Choice::k16x64, k32x64 = Choice::k32x64, k32x64s = Choice::k32x64QShared;
  Fastest fastest;
  std::printf("-- forward: 16 rows a warp x kM, key tiles of 8 x kNB (the table's: %s)\n",
              MmaAttentionTilesName(table).c_str());
  // The shapes that compile without spills (32 rows x 128 keys with q in registers spills even
  // at 255 registers); the table does not offer the two that keep some in local memory.
  ForwardVariant<1, 8>(s, b, out_ref, "16x64: 16 rows a warp, 64 keys (4 an SM)", &k16x64,
                       &fastest);
  ForwardVariant<2, 8>(s, b, out_ref, "32x64: 32 rows a warp (2 an SM)", &k32x64, &fastest);
  ForwardVariant<1, 16>(s, b, out_ref, "16 x 128 (2 an SM; 64 B local)", nullptr, &fastest);
  ForwardVariant<2, 8, true>(s, b, out_ref, "32x64s: q read from shared (2)", &k32x64s, &fastest);
  ForwardVariant<2, 16, true>(s, b, out_ref, "32 x 128, q from shared (2; 8 B spill)", nullptr,
                              &fastest);
  std::printf("-- backward: launch bounds' blocks an SM\n");
  BackwardVariants<2, true>(s, b, dqkv_ref, true, &fastest);
  BackwardVariants<3, true>(s, b, dqkv_ref, true, &fastest);
  BackwardVariants<4, false>(s, b, dqkv_ref, false, &fastest);  // dk dv spills 1 KB at 4
  // What tests/device/speed.sh reads to train with the fastest tiles as well.
  std::printf(
      "fastest tiles: DROVER_CUDA_ATTENTION_TILES=%s (%.2f ms a layer against the "
      "table's defaults, %s)\n",
      MmaAttentionTilesName(fastest.tiles).c_str(),
      fastest.forward_ms + fastest.dq_ms + fastest.dkv_ms, MmaAttentionTilesName(table).c_str());
  return 0;
}

}  // namespace
}  // namespace drover::engine::cuda

int main(int argc, char** argv) {
  drover::engine::cuda::Shape s;
  if (argc >= 5) {
    s.B = std::atoi(argv[1]), s.T = std::atoi(argv[2]), s.C = std::atoi(argv[3]);
    s.NH = std::atoi(argv[4]);
  }
  if (argc >= 6) s.layers = std::atoi(argv[5]);
  if (s.B <= 0 || s.T <= 0 || s.C <= 0 || s.NH <= 0 || s.layers <= 0) {
    std::fprintf(stderr, "usage: %s [B T C NH [LAYERS]] (positive integers)\n", argv[0]);
    return 2;
  }
  return drover::engine::cuda::Run(s);
}
