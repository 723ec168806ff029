// The kernel emulator's own contract (README.md): device work runs behind the host, in its
// stream's order, and copies give exactly the guarantees the CUDA runtime documents. The CUDA
// op tests rely on it to show a missing synchronisation as wrong numbers; these tests pin that
// it does. Run with DROVER_EMU_DEFER_MS set far beyond a test's length, so that work runs
// only when something needs it and every outcome below is certain.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <cudnn_graph.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cfenv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace {

__global__ void FillKernel(float* x, float value, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) x[i] = value;
}

// Records, per block, the thread that got to it first: a race on purpose.
__global__ void FirstThreadKernel(int* first) {
  if (first[blockIdx.x] < 0) first[blockIdx.x] = static_cast<int>(threadIdx.x);
}

// Records the order in which the blocks ran: a race on purpose.
__global__ void BlockOrderKernel(int* order, int* counter) {
  if (threadIdx.x == 0) order[blockIdx.x] = (*counter)++;
}

__global__ void ReadKernel(const float* x, int i, float* out) { *out = x[i]; }

// Records the order in which the block's threads pass each of two barriers: pass p's from
// order[p * blockDim.x], counted in counter[p].
__global__ void BarrierOrderKernel(int* order, int* counter) {
  for (int pass = 0; pass < 2; ++pass) {
    __syncthreads();
    order[pass * blockDim.x + counter[pass]++] = static_cast<int>(threadIdx.x);
  }
}

// A deadlock: the first half of the warp waits for the block, the second for the warp.
__global__ void SplitBarrierKernel() {
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    __syncwarp();
  }
}

// Leaves the rounding mode upward: what a kernel must not do to its host thread.
__global__ void RoundingModeKernel() {
  if (threadIdx.x == 0) std::fesetround(FE_UPWARD);
  __syncthreads();
}

// One warp: d (16 x 8, row-major) = a (16 x 16) b (16 x 8), both row-major floats holding
// values exact in 16 bits, through drover_emu::MmaM16N8K16 with every lane's fragments taken
// as the PTX ISA's formulas for mma.m16n8k16 place them ("row = groupID for ai where
// 0 <= i < 2 || 4 <= i < 6, groupID + 8 otherwise; col = threadID_in_group * 2 + (i & 1),
// + 8 for i >= 4"; B: "row = threadID_in_group * 2 + (i & 1), + 8 for i >= 2; col =
// groupID"; C: "row = groupID for c0, c1, groupID + 8 otherwise; col = threadID_in_group * 2
// + (i & 1)").
__global__ void MmaKernel(float* d, const float* a, const float* b, bool fp16) {
  const int lane = static_cast<int>(threadIdx.x), g = lane >> 2, t = lane % 4;
  auto bits = [&](float x) -> uint32_t {
    if (fp16) return __float2half_rn(x).bits;
    return __float2bfloat16_rn(x).bits;
  };
  uint32_t ra[4] = {}, rb[2] = {};
  for (int i = 0; i < 8; ++i) {
    const int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
    const int col = t * 2 + (i & 1) + (i >= 4 ? 8 : 0);
    ra[i / 2] |= bits(a[row * 16 + col]) << (16 * (i % 2));
  }
  for (int i = 0; i < 4; ++i) {
    const int row = t * 2 + (i & 1) + (i >= 2 ? 8 : 0), col = g;
    rb[i / 2] |= bits(b[row * 8 + col]) << (16 * (i % 2));
  }
  float acc[4] = {1.0f, 1.0f, 1.0f, 1.0f};  // c: ones
  ::drover_emu::MmaM16N8K16(acc, ra, rb, fp16);
  for (int i = 0; i < 4; ++i) d[(i < 2 ? g : g + 8) * 8 + t * 2 + (i & 1)] = acc[i];
}

// One warp's ldmatrix.x4 from four 8 x 8 matrices of 16-bit values in shared memory,
// M_m(i, j) = 64 m + 8 i + j, each row 16 elements (32 bytes) after the last; lane l gives the
// address of row l % 8 of matrix l / 8, as the PTX ISA's ldmatrix has it. out[4 lane + m]:
// the lane's register m.
__global__ void LdMatrixKernel(uint32_t* out, bool trans) {
  DROVER_DYNAMIC_SHARED(smem);
  uint16_t* rows = reinterpret_cast<uint16_t*>(smem);
  const int lane = static_cast<int>(threadIdx.x);
  for (int e = lane; e < 4 * 8 * 16; e += 32) {
    const int row = e / 16, col = e % 16;  // row 8 m + i of the 32
    rows[e] = static_cast<uint16_t>(col < 8 ? 64 * (row / 8) + 8 * (row % 8) + col : 0xFFFF);
  }
  __syncthreads();
  uint32_t r[4];
  ::drover_emu::LdMatrixX4(r, rows + ((lane / 8) * 8 + lane % 8) * 16, trans);
  for (int m = 0; m < 4; ++m) out[4 * lane + m] = r[m];
}

// cp.async's groups: out[0] the destination before any wait, out[1] after waiting for all,
// out[2] a copy whose source is invalid (zeros), out[3] and out[4] the older and the newer of
// two groups after waiting for all but the newest.
__global__ void CopyAsyncKernel(const float* src, float* out) {
  DROVER_DYNAMIC_SHARED(smem);
  float* f = reinterpret_cast<float*>(smem);
  if (threadIdx.x == 0) {
    ::drover_emu::CpAsync(f, src, 16, 16);
    ::drover_emu::CpAsyncCommit();
    out[0] = f[0];
    ::drover_emu::CpAsyncWait(0);
    out[1] = f[0];
    ::drover_emu::CpAsync(f + 4, src, 16, 0);
    ::drover_emu::CpAsyncCommit();
    ::drover_emu::CpAsyncWait(0);
    out[2] = f[4];
    ::drover_emu::CpAsync(f + 8, src, 16, 16);
    ::drover_emu::CpAsyncCommit();
    ::drover_emu::CpAsync(f + 12, src, 16, 16);
    ::drover_emu::CpAsyncCommit();
    ::drover_emu::CpAsyncWait(1);
    out[3] = f[8];
    out[4] = f[12];
  }
  __syncthreads();
}

constexpr int kN = 64;

class CudaEmulatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaStreamCreateWithFlags(&a_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&b_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&device_), kN * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned_), kN * sizeof(float)), cudaSuccess);
    std::memset(pinned_, 0, kN * sizeof(float));
    ASSERT_EQ(cudaMemsetAsync(device_, 0, kN * sizeof(float), a_), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  }
  void TearDown() override {
    EXPECT_EQ(cudaStreamDestroy(a_), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(b_), cudaSuccess);
    EXPECT_EQ(cudaFree(device_), cudaSuccess);
    EXPECT_EQ(cudaFreeHost(pinned_), cudaSuccess);
  }
  void Fill(float value, cudaStream_t stream) {
    DROVER_LAUNCH(FillKernel, dim3(2), dim3(32), 0, stream)(device_, value, kN);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  }
  // The device buffer into pinned memory on `stream`: fully asynchronous.
  void CopyToPinned(cudaStream_t stream) {
    ASSERT_EQ(cudaMemcpyAsync(pinned_, device_, kN * sizeof(float), cudaMemcpyDeviceToHost, stream),
              cudaSuccess);
  }
  // Whether every element of the pinned buffer is `value`.
  bool PinnedHolds(float value) const {
    for (int i = 0; i < kN; ++i) {
      if (pinned_[i] != value) return false;
    }
    return true;
  }

  cudaStream_t a_ = nullptr, b_ = nullptr;
  float* device_ = nullptr;
  float* pinned_ = nullptr;
};

TEST_F(CudaEmulatorTest, WorkRunsBehindTheHostUntilItsStreamIsSynchronised) {
  Fill(1.0f, a_);
  CopyToPinned(a_);
  EXPECT_TRUE(PinnedHolds(0.0f)) << "a host read without a synchronisation saw finished work";
  ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  EXPECT_TRUE(PinnedHolds(1.0f));
}

TEST_F(CudaEmulatorTest, FreshDeviceMemoryIsNotZeroed) {
  float* fresh = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&fresh), kN * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(pinned_, fresh, kN * sizeof(float), cudaMemcpyDeviceToHost, a_),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  for (int i = 0; i < kN; ++i) EXPECT_TRUE(std::isnan(pinned_[i])) << i;
  ASSERT_EQ(cudaFree(fresh), cudaSuccess);
}

TEST_F(CudaEmulatorTest, AWaitOnAnEventOrdersAnotherStreamAfterTheWorkBeforeIt) {
  cudaEvent_t filled = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&filled, cudaEventDisableTiming), cudaSuccess);
  Fill(2.0f, a_);
  ASSERT_EQ(cudaEventRecord(filled, a_), cudaSuccess);
  Fill(3.0f, a_);  // after the event: not waited for
  ASSERT_EQ(cudaStreamWaitEvent(b_, filled, 0), cudaSuccess);
  ASSERT_EQ(cudaEventDestroy(filled), cudaSuccess);  // a wait keeps what it needs
  CopyToPinned(b_);
  ASSERT_EQ(cudaStreamSynchronize(b_), cudaSuccess);
  EXPECT_TRUE(PinnedHolds(2.0f));
  ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
}

TEST_F(CudaEmulatorTest, WithoutAWaitAnotherStreamReadsWhatWasThereBefore) {
  Fill(4.0f, a_);
  CopyToPinned(b_);  // the ordering bug the CUDA op tests must catch
  ASSERT_EQ(cudaStreamSynchronize(b_), cudaSuccess);
  EXPECT_TRUE(PinnedHolds(0.0f));
  ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
}

TEST_F(CudaEmulatorTest, ACopyFromPageableMemoryHasReadItsSourceWhenItReturns) {
  std::vector<float> source(kN, 5.0f);
  ASSERT_EQ(cudaMemcpyAsync(device_, source.data(), kN * sizeof(float), cudaMemcpyHostToDevice, a_),
            cudaSuccess);
  std::fill(source.begin(), source.end(), 6.0f);  // the caller may reuse it at once
  CopyToPinned(a_);
  ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  EXPECT_TRUE(PinnedHolds(5.0f));
}

TEST_F(CudaEmulatorTest, ACopyIntoPageableMemoryIsDoneWhenItReturns) {
  Fill(7.0f, a_);
  std::vector<float> pageable(kN, 0.0f);
  ASSERT_EQ(
      cudaMemcpyAsync(pageable.data(), device_, kN * sizeof(float), cudaMemcpyDeviceToHost, a_),
      cudaSuccess);
  EXPECT_EQ(pageable, std::vector<float>(kN, 7.0f));
}

TEST_F(CudaEmulatorTest, CudaFreeWaitsForTheWorkOfEveryStream) {
  float* other = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&other), sizeof(float)), cudaSuccess);
  Fill(8.0f, a_);
  CopyToPinned(a_);
  ASSERT_EQ(cudaFree(other), cudaSuccess);
  EXPECT_TRUE(PinnedHolds(8.0f));
}

TEST_F(CudaEmulatorTest, PollingAnEventHasTheWorkBeforeItRun) {
  cudaEvent_t copied = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming), cudaSuccess);
  Fill(9.0f, a_);
  CopyToPinned(a_);
  ASSERT_EQ(cudaEventRecord(copied, a_), cudaSuccess);
  cudaError_t state = cudaErrorNotReady;
  while ((state = cudaEventQuery(copied)) == cudaErrorNotReady) {
  }
  EXPECT_EQ(state, cudaSuccess);
  EXPECT_TRUE(PinnedHolds(9.0f));
  ASSERT_EQ(cudaEventDestroy(copied), cudaSuccess);
}

// What the NCCL groups time a rank's stall with: two timing events on different streams
// measure from the first's stream reaching it to the second's, once both have.
TEST_F(CudaEmulatorTest, ElapsedTimeIsBetweenTheStreamsReachingTwoTimingEvents) {
  cudaEvent_t start = nullptr, end = nullptr, untimed = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&start, cudaEventDefault), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&end, cudaEventDefault), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(start, a_), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(b_, start, 0), cudaSuccess);
  drover_emu::EnqueueOnStream(b_,
                              [] { std::this_thread::sleep_for(std::chrono::milliseconds(200)); });
  ASSERT_EQ(cudaEventRecord(end, b_), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(untimed, b_), cudaSuccess);
  float ms = -1;
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, end), cudaErrorNotReady);  // nothing ran yet
  ASSERT_EQ(cudaStreamSynchronize(b_), cudaSuccess);
  ASSERT_EQ(cudaEventElapsedTime(&ms, start, end), cudaSuccess);
  EXPECT_GE(ms, 200.0f);
  EXPECT_LT(ms, 5000.0f);
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, untimed), cudaErrorInvalidResourceHandle);
  for (cudaEvent_t e : {start, end, untimed}) EXPECT_EQ(cudaEventDestroy(e), cudaSuccess);
}

TEST_F(CudaEmulatorTest, KernelArgumentsAreTakenAtTheLaunch) {
  float value = 10.0f;
  DROVER_LAUNCH(FillKernel, dim3(2), dim3(32), 0, a_)(device_, value, kN);
  value = 11.0f;
  CopyToPinned(a_);
  ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  EXPECT_TRUE(PinnedHolds(10.0f));
}

TEST_F(CudaEmulatorTest, ALaunchTheDeviceRefusesFailsAtTheCallAndRunsNothing) {
  DROVER_LAUNCH(FillKernel, dim3(1), dim3(2048), 0, a_)(device_, 12.0f, kN);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // read once
  CopyToPinned(a_);
  ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  EXPECT_TRUE(PinnedHolds(0.0f));
}

TEST_F(CudaEmulatorTest, AGemmRunsOnItsHandlesStreamWithTheScalarsOfTheCall) {
  cublasHandle_t blas = nullptr;
  ASSERT_EQ(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetStream(blas, a_), CUBLAS_STATUS_SUCCESS);
  Fill(1.0f, a_);
  // C (8 x 4, the buffer's second half) = alpha * A (8 x 4) B (4 x 4), A and B all ones.
  float alpha = 2.0f, beta = 0.0f;
  ASSERT_EQ(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, 8, 4, 4, &alpha, device_, CUDA_R_32F, 8,
                         device_, CUDA_R_32F, 4, &beta, device_ + 32, CUDA_R_32F, 8,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  alpha = 100.0f;
  CopyToPinned(a_);
  EXPECT_TRUE(PinnedHolds(0.0f));
  ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(pinned_[i], 1.0f) << i;
  for (int i = 32; i < kN; ++i) EXPECT_EQ(pinned_[i], 8.0f) << i;  // 2 * (4 ones)
}

// cuBLASLt's GELU epilogues on bf16 matrices: D (8 x 2) = epilogue(A (8 x 2) B (2 x 2) [+
// bias]), every pointer in device memory, aux (8 x 2) with leading dimension 8.
class CublasLtGeluTest : public CudaEmulatorTest {
 protected:
  static constexpr int kM = 8, kNCols = 2, kK = 2;

  // GELU's tanh approximation and its slope, in double, written out apart from the
  // emulator's.
  static double Gelu(double x) {
    return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
  }
  static double GeluSlope(double x) {
    const double h = 1e-6;  // a central difference: exact enough for a bf16 comparison
    return (Gelu(x + h) - Gelu(x - h)) / (2 * h);
  }
  static float Bf16(double x) {
    return __bfloat162float(__float2bfloat16_rn(static_cast<float>(x)));
  }

  void SetUp() override {
    CudaEmulatorTest::SetUp();
    ASSERT_EQ(cublasLtCreate(&lt_), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&bf16_), kWords * sizeof(__nv_bfloat16)),
              cudaSuccess);
    // Column i of A: x_i, then 2^-5; B's columns (1, 2^-5) and (-1, 2^-5). So the sums are
    // +-x_i + 2^-10, which bf16 (8 significant bits) cannot hold next to |x_i| >= 1.
    for (int i = 0; i < kM; ++i) {
      host_[kA + i] = kX[i];
      host_[kA + kM + i] = 1.0f / 32;
    }
    const float b[kK * kNCols] = {1.0f, 1.0f / 32, -1.0f, 1.0f / 32};
    for (int i = 0; i < kK * kNCols; ++i) host_[kB + i] = b[i];
    for (int i = 0; i < kM; ++i) host_[kBias + i] = i == 4 ? 0.5f : 0.0f;
    for (int i = 0; i < kM * kNCols; ++i) host_[kAux + i] = kX[i % kM];  // DGELU's input
    Upload();
    ASSERT_EQ(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F),
              CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasLtMatrixLayoutCreate(&a_layout_, CUDA_R_16BF, kM, kK, kM),
              CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasLtMatrixLayoutCreate(&b_layout_, CUDA_R_16BF, kK, kNCols, kK),
              CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasLtMatrixLayoutCreate(&d_layout_, CUDA_R_16BF, kM, kNCols, kM),
              CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasLtMatmulPreferenceCreate(&pref_), CUBLAS_STATUS_SUCCESS);
    // The matrices are 32 bytes apart, not at the 256 bytes cuBLASLt assumes by default.
    const uint32_t aligned = 16;
    for (cublasLtMatmulPreferenceAttributes_t which :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
      ASSERT_EQ(cublasLtMatmulPreferenceSetAttribute(pref_, which, &aligned, sizeof(aligned)),
                CUBLAS_STATUS_SUCCESS);
    }
  }
  void TearDown() override {
    cublasLtMatmulPreferenceDestroy(pref_);
    for (cublasLtMatrixLayout_t l : {a_layout_, b_layout_, d_layout_}) {
      cublasLtMatrixLayoutDestroy(l);
    }
    cublasLtMatmulDescDestroy(desc_);
    EXPECT_EQ(cudaFree(bf16_), cudaSuccess);
    CudaEmulatorTest::TearDown();
  }
  void Upload() {
    std::vector<__nv_bfloat16> words(kWords);
    for (int i = 0; i < kWords; ++i) words[i] = __float2bfloat16_rn(host_[i]);
    ASSERT_EQ(cudaMemcpyAsync(bf16_, words.data(), kWords * sizeof(__nv_bfloat16),
                              cudaMemcpyHostToDevice, a_),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  }
  // The device's bf16 words as floats.
  std::vector<float> Download() {
    std::vector<__nv_bfloat16> words(kWords);
    EXPECT_EQ(cudaMemcpyAsync(words.data(), bf16_, kWords * sizeof(__nv_bfloat16),
                              cudaMemcpyDeviceToHost, a_),
              cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
    std::vector<float> values(kWords);
    for (int i = 0; i < kWords; ++i) values[i] = __bfloat162float(words[i]);
    return values;
  }
  // The epilogue with the aux matrix at `aux` (leading dimension aux_ld), the bias where it
  // takes one; the heuristic's status, and its algorithm in *algo.
  cublasStatus_t Plan(uint32_t epilogue, const void* aux, int64_t aux_ld,
                      cublasLtMatmulAlgo_t* algo, int32_t aux_type = CUDA_R_16BF) {
    const void* bias = bf16_ + kBias;
    const int32_t bias_type = CUDA_R_16BF;
    auto set = [&](cublasLtMatmulDescAttributes_t attr, const auto& value) {
      EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc_, attr, &value, sizeof(value)),
                CUBLAS_STATUS_SUCCESS)
          << "attribute " << attr;
    };
    set(CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
    set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type);
    set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
    set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld);
    set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, aux_type);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
        lt_, desc_, a_layout_, b_layout_, d_layout_, d_layout_, pref_, 1, &result, &found);
    *algo = result.algo;
    return st;
  }
  // D = the epilogue's, with the aux pointer as the descriptor holds it; on stream a_.
  cublasStatus_t Run(const cublasLtMatmulAlgo_t& algo) {
    const float alpha = 1.0f, beta = 0.0f;
    return cublasLtMatmul(lt_, desc_, &alpha, bf16_ + kA, a_layout_, bf16_ + kB, b_layout_, &beta,
                          bf16_ + kD, d_layout_, bf16_ + kD, d_layout_, &algo, nullptr, 0, a_);
  }
  // The exact sum of column j of D's row i (the products and sums are exact in fp32).
  double Sum(int i, int j) const {
    return host_[kA + i] * host_[kB + 2 * j] + host_[kA + kM + i] * host_[kB + 2 * j + 1];
  }

  // Offsets into one bf16 allocation, each 16 words (32 bytes) apart.
  static constexpr int kA = 0, kB = 16, kBias = 32, kD = 48, kAux = 64, kWords = 96;
  static constexpr float kX[kM] = {1.0f, -4.0f, -3.0f, -0.5f, 0.0f, 2.0f, 0.75f, -1.5f};
  cublasLtHandle_t lt_ = nullptr;
  __nv_bfloat16* bf16_ = nullptr;
  float host_[kWords] = {};
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_layout_ = nullptr, b_layout_ = nullptr, d_layout_ = nullptr;
  cublasLtMatmulPreference_t pref_ = nullptr;
};

TEST_F(CublasLtGeluTest, TheGeluEpilogueKeepsItsInputAndTakesGeluOfTheFp32Sum) {
  cublasLtMatmulAlgo_t algo;
  ASSERT_EQ(Plan(CUBLASLT_EPILOGUE_GELU_AUX_BIAS, bf16_ + kAux, kM, &algo), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(Run(algo), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  const std::vector<float> got = Download();
  int unrounded = 0;  // elements where GELU of aux, the rounded sum, gives another bf16
  for (int j = 0; j < kNCols; ++j) {
    for (int i = 0; i < kM; ++i) {
      const int at = i + kM * j;
      const double pre = Sum(i, j) + host_[kBias + i];
      EXPECT_EQ(got[kAux + at], Bf16(pre)) << "aux " << i << ", " << j;
      EXPECT_EQ(got[kD + at], Bf16(Gelu(pre))) << "D " << i << ", " << j;
      unrounded += Bf16(Gelu(got[kAux + at])) != got[kD + at];
    }
  }
  EXPECT_GT(unrounded, 0);
}

TEST_F(CublasLtGeluTest, TheDgeluEpilogueScalesTheFp32ProductByGelusSlopeAtAux) {
  cublasLtMatmulAlgo_t algo;
  ASSERT_EQ(Plan(CUBLASLT_EPILOGUE_DGELU, bf16_ + kAux, kM, &algo), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(Run(algo), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  const std::vector<float> got = Download();
  int unrounded = 0;  // elements where the product rounded first would give another bf16
  for (int j = 0; j < kNCols; ++j) {
    for (int i = 0; i < kM; ++i) {
      const int at = i + kM * j;
      const double slope = GeluSlope(host_[kAux + at]);
      EXPECT_EQ(got[kD + at], Bf16(Sum(i, j) * slope)) << "D " << i << ", " << j;  // no bias
      unrounded += Bf16(Bf16(Sum(i, j)) * slope) != got[kD + at];
    }
  }
  EXPECT_GT(unrounded, 0);
}

// What cublasLt.h says of the aux matrix (EPILOGUE_AUX_LD: "Must be divisible by 8 and be no
// less than the number of rows in the output matrix"; its type that of D), and a pointer
// set.
TEST_F(CublasLtGeluTest, AnAuxMatrixCublasLtRefusesGetsNoAlgorithm) {
  cublasLtMatmulAlgo_t algo;
  for (uint32_t epilogue : {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUBLASLT_EPILOGUE_DGELU}) {
    EXPECT_NE(Plan(epilogue, bf16_ + kAux, 12, &algo), CUBLAS_STATUS_SUCCESS) << epilogue;
    EXPECT_NE(Plan(epilogue, bf16_ + kAux, 0, &algo), CUBLAS_STATUS_SUCCESS) << epilogue;
    EXPECT_NE(Plan(epilogue, nullptr, kM, &algo), CUBLAS_STATUS_SUCCESS) << epilogue;
    EXPECT_NE(Plan(epilogue, bf16_ + kAux, kM, &algo, CUDA_R_32F), CUBLAS_STATUS_SUCCESS)
        << epilogue;
    EXPECT_EQ(Plan(epilogue, bf16_ + kAux, 16, &algo), CUBLAS_STATUS_SUCCESS) << epilogue;
  }
}

using CublasLtGeluDeathTest = CublasLtGeluTest;

TEST_F(CublasLtGeluDeathTest, AnAuxPointerLessAlignedThanAtTheHeuristicDies) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  cublasLtMatmulAlgo_t algo;
  ASSERT_EQ(Plan(CUBLASLT_EPILOGUE_GELU_AUX_BIAS, bf16_ + kAux, kM, &algo), CUBLAS_STATUS_SUCCESS);
  const void* shifted = bf16_ + kAux + 1;  // 2 bytes past a 32-byte boundary
  ASSERT_EQ(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                           &shifted, sizeof(shifted)),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_DEATH((void)Run(algo), "an aux pointer less aligned than at the heuristic");
}

// A kernel that needs a barrier it lacks must fail in one order or the other: the emulator
// runs every other block's threads last to first.
TEST_F(CudaEmulatorTest, ThreadsOfABlockRunFirstToLastInOneBlockAndLastToFirstInTheNext) {
  int* first = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&first), 2 * sizeof(int)), cudaSuccess);
  first[0] = first[1] = -1;
  DROVER_LAUNCH(FirstThreadKernel, dim3(2), dim3(32), 0, a_)(first);
  ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  EXPECT_EQ(std::min(first[0], first[1]), 0);
  EXPECT_EQ(std::max(first[0], first[1]), 31);
  ASSERT_EQ(cudaFreeHost(first), cudaSuccess);
}

TEST_F(CudaEmulatorTest, AReadJustOutsideABufferReadsNaN) {
  for (const int i : {-64, -1, kN, kN + 63}) {  // the guards: 256 bytes each side
    pinned_[0] = 0.0f;
    DROVER_LAUNCH(ReadKernel, dim3(1), dim3(1), 0, a_)(device_, i, pinned_);
    ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
    EXPECT_TRUE(std::isnan(pinned_[0])) << i;
  }
}

// A block that reads what another block of its launch writes must fail in one order or the
// other: every other launch runs its blocks last to first.
TEST_F(CudaEmulatorTest, OneLaunchRunsItsBlocksFirstToLastAndTheNextLastToFirst) {
  int* order = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&order), 2 * 3 * sizeof(int) + sizeof(int)),
            cudaSuccess);
  int* counter = order + 6;
  for (int launch = 0; launch < 2; ++launch) {
    *counter = 0;
    DROVER_LAUNCH(BlockOrderKernel, dim3(3), dim3(32), 0, a_)(order + 3 * launch, counter);
    ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  }
  const std::vector<int> first(order, order + 3), second(order + 3, order + 6);
  const std::vector<int> up = {0, 1, 2}, down = {2, 1, 0};
  EXPECT_TRUE((first == up && second == down) || (first == down && second == up))
      << first[0] << first[1] << first[2] << " then " << second[0] << second[1] << second[2];
  ASSERT_EQ(cudaFreeHost(order), cudaSuccess);
}

// The threads of a block run in rounds, each until it waits or ends, in the block's order;
// the thread whose arrival releases a barrier goes on at once. Four threads first to last:
// 3 releases the first barrier and goes on (to wait at the second), then 0, 1 and 2 pass it
// in the next round, 2 releasing the second and going on, then 3 in the same round, 0 and 1
// in the one after; last to first, the mirror image. (The switches between the threads are
// the emulator's hottest code: this pins that a faster one keeps the order.)
TEST_F(CudaEmulatorTest, ThreadsPassABarrierInRoundsWithTheOneThatReleasedItFirst) {
  int* order = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&order), 10 * sizeof(int)), cudaSuccess);
  std::map<std::vector<int>, int> seen;  // each block order's first launch
  for (int launch = 0; launch < 2; ++launch) {
    std::fill(order, order + 10, 0);
    DROVER_LAUNCH(BarrierOrderKernel, dim3(1), dim3(4), 0, a_)(order, order + 8);
    ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
    seen.emplace(std::vector<int>(order, order + 8), launch);
  }
  const std::vector<int> up = {3, 0, 1, 2, 2, 3, 0, 1}, down = {0, 3, 2, 1, 1, 0, 3, 2};
  EXPECT_EQ(seen.size(), 2u);
  for (const auto& [o, launch] : seen) {
    std::string text;
    for (int t : o) text += std::to_string(t);
    EXPECT_TRUE(o == up || o == down) << "launch " << launch << ": " << text;
  }
  ASSERT_EQ(cudaFreeHost(order), cudaSuccess);
}

using CudaEmulatorDeathTest = CudaEmulatorTest;

TEST_F(CudaEmulatorDeathTest, ThreadsWaitingAtBarriersNotAllOfThemReachDie) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        DROVER_LAUNCH(SplitBarrierKernel, dim3(1), dim3(32), 0, a_)();
        (void)cudaStreamSynchronize(a_);
      },
      "deadlock: the threads of a block wait at barriers that not all of them reach");
}

// The fibers' switches keep no floating-point control words (cuda_emu.cc): a kernel that
// changes them is stopped at its block's end.
TEST_F(CudaEmulatorDeathTest, AKernelThatChangesTheRoundingModeDies) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        DROVER_LAUNCH(RoundingModeKernel, dim3(1), dim3(32), 0, a_)();
        (void)cudaStreamSynchronize(a_);
      },
      "a kernel changed the floating-point control words");
}

TEST_F(CudaEmulatorDeathTest, AKernelWritingPastItsBufferDiesAtTheNextSynchronisation) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        DROVER_LAUNCH(FillKernel, dim3(3), dim3(32), 0, a_)(device_, 13.0f, kN + 1);
        (void)cudaStreamSynchronize(a_);
      },
      "a write outside the device allocation of 256 bytes at 0x[0-9a-f]+: byte 256 \\(past "
      "its end\\)");
}

TEST_F(CudaEmulatorDeathTest, ACopyWritingBeforeItsBufferDiesWhenTheBufferIsFreed) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        (void)cudaMemcpyAsync(reinterpret_cast<char*>(pinned_) - 4, device_, 8,
                              cudaMemcpyDeviceToHost, a_);
        (void)cudaFreeHost(pinned_);
      },
      "a write outside the pinned allocation of 256 bytes at 0x[0-9a-f]+: byte -4 \\(before "
      "its start\\)");
}

TEST_F(CudaEmulatorDeathTest, AKernelGivenPageableHostMemoryDiesAtTheLaunch) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<float> host(kN);
  EXPECT_DEATH(DROVER_LAUNCH(FillKernel, dim3(2), dim3(32), 0, a_)(host.data(), 1.0f, kN),
               "kernel argument 0 \\(0x[0-9a-f]+\\) is not device or page-locked memory");
}

TEST_F(CudaEmulatorTest, MmaSyncTakesItsFragmentsInThePtxLayout) {
  std::vector<float> a(16 * 16), b(16 * 8), want(16 * 8, 1.0f);
  for (int i = 0; i < 256; ++i) a[i] = static_cast<float>(i % 7 - 3);  // exact in 16 bits
  for (int i = 0; i < 128; ++i) b[i] = static_cast<float>(i % 5 - 2) * 0.5f;
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 8; ++c) {
      for (int k = 0; k < 16; ++k) want[r * 8 + c] += a[r * 16 + k] * b[k * 8 + c];
    }
  }
  float *da = nullptr, *db = nullptr, *dd = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&da), a.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&db), b.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dd), want.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(da, a.data(), a.size() * 4, cudaMemcpyHostToDevice, a_), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(db, b.data(), b.size() * 4, cudaMemcpyHostToDevice, a_), cudaSuccess);
  for (const bool fp16 : {false, true}) {
    DROVER_LAUNCH(MmaKernel, 1, 32, 0, a_)(dd, da, db, fp16);
    std::vector<float> got(want.size(), NAN);
    ASSERT_EQ(cudaMemcpyAsync(got.data(), dd, got.size() * 4, cudaMemcpyDeviceToHost, a_),
              cudaSuccess);
    EXPECT_EQ(got, want) << (fp16 ? "fp16" : "bf16");
  }
  for (float* p : {da, db, dd}) ASSERT_EQ(cudaFree(p), cudaSuccess);
}

// The PTX ISA's ldmatrix: "each thread in a warp loads fragments of a row" (without .trans:
// lane L holds row L / 4, elements 2 (L % 4) and + 1 of each matrix) and ".trans ... loads
// fragments of a column" (column L / 4, rows 2 (L % 4) and + 1): transcribed here apart from
// the emulator's decoding.
TEST_F(CudaEmulatorTest, LdMatrixGivesEachLaneItsRowOrColumnPair) {
  uint32_t* out = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&out), 128 * sizeof(uint32_t)), cudaSuccess);
  for (const bool trans : {false, true}) {
    DROVER_LAUNCH(LdMatrixKernel, 1, 32, 4 * 8 * 16 * 2, a_)(out, trans);
    std::vector<uint32_t> got(128);
    ASSERT_EQ(cudaMemcpyAsync(got.data(), out, 128 * 4, cudaMemcpyDeviceToHost, a_), cudaSuccess);
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, t = lane % 4;
      for (int m = 0; m < 4; ++m) {
        auto element = [&](int i, int j) { return static_cast<uint32_t>(64 * m + 8 * i + j); };
        const uint32_t want = trans ? element(2 * t, g) | element(2 * t + 1, g) << 16
                                    : element(g, 2 * t) | element(g, 2 * t + 1) << 16;
        EXPECT_EQ(got[4 * lane + m], want)
            << "lane " << lane << " matrix " << m << (trans ? " .trans" : "");
      }
    }
  }
  ASSERT_EQ(cudaFree(out), cudaSuccess);
}

// A cp.async lands at the wait that covers its group, not before: a tile read without its
// wait reads what was there (NaN in a fresh block's shared memory).
TEST_F(CudaEmulatorTest, AnAsyncCopyLandsAtItsWait) {
  std::vector<float> src = {1.5f, 2.5f, 3.5f, 4.5f};
  ASSERT_EQ(cudaMemcpyAsync(device_, src.data(), 16, cudaMemcpyHostToDevice, a_), cudaSuccess);
  DROVER_LAUNCH(CopyAsyncKernel, 1, 32, 64, a_)(device_, device_ + 8);
  ASSERT_EQ(cudaMemcpyAsync(pinned_, device_ + 8, 5 * sizeof(float), cudaMemcpyDeviceToHost, a_),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  EXPECT_TRUE(std::isnan(pinned_[0]));
  EXPECT_EQ(pinned_[1], 1.5f);
  EXPECT_EQ(pinned_[2], 0.0f);
  EXPECT_EQ(pinned_[3], 1.5f);
  EXPECT_TRUE(std::isnan(pinned_[4]));
}

TEST_F(CudaEmulatorTest, AKernelTakesNullAndTheEndOfAnAllocation) {
  DROVER_LAUNCH(FillKernel, dim3(1), dim3(32), 0, a_)(device_ + kN, 1.0f, 0);
  DROVER_LAUNCH(ReadKernel, dim3(1), dim3(1), 0, a_)(device_, 0, pinned_);
  DROVER_LAUNCH(FillKernel, dim3(1), dim3(32), 0, a_)(nullptr, 1.0f, 0);
  ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  EXPECT_EQ(pinned_[0], 0.0f);
}

// ---- The emulated cuDNN (cudnn_emu.cc) ------------------------------------------------------

// Not cuDNN's: the executions the emulated cuDNN has taken (cudnn_emu.cc).
extern "C" uint64_t drover_emu_cudnn_executions(void);

// Operation graphs built through cuDNN's backend API as the plugin builds them, run on a
// stream and checked against plain loops. What a test makes is destroyed with it.
class CudnnEmulatorTest : public ::testing::Test {
 protected:
  enum Kind { kInMemory, kVirtual, kByValue };

  void SetUp() override {
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudnnCreate(&handle_), CUDNN_STATUS_SUCCESS);
    ASSERT_EQ(cudnnSetStream(handle_, stream_), CUDNN_STATUS_SUCCESS);
    workspace_ = Allocate(kWorkspaceBytes);
  }
  void TearDown() override {
    for (cudnnBackendDescriptor_t d : made_) {
      EXPECT_EQ(cudnnBackendDestroyDescriptor(d), CUDNN_STATUS_SUCCESS);
    }
    EXPECT_EQ(cudnnDestroy(handle_), CUDNN_STATUS_SUCCESS);
    for (void* p : allocated_) EXPECT_EQ(cudaFree(p), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(stream_), cudaSuccess);
  }

  static std::string LastError() {
    char message[512];
    cudnnGetLastErrorString(message, sizeof(message));
    return message;
  }
  static float Bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

  void* Allocate(size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    allocated_.push_back(p);
    return p;
  }
  // Device memory holding `values` as floats, or as bf16 words.
  void* Upload(const std::vector<float>& values, bool bf16 = false) {
    std::vector<__nv_bfloat16> words;
    for (const float v : values) words.push_back(__float2bfloat16_rn(v));
    const size_t bytes = values.size() * (bf16 ? 2 : 4);
    void* p = Allocate(bytes);
    const void* from = bf16 ? static_cast<const void*>(words.data()) : values.data();
    EXPECT_EQ(cudaMemcpyAsync(p, from, bytes, cudaMemcpyHostToDevice, stream_), cudaSuccess);
    return p;
  }
  // `n` elements of device memory (floats, or bf16 words) once the stream has run.
  std::vector<float> Download(const void* p, size_t n, bool bf16 = false) {
    std::vector<float> values(n);
    std::vector<__nv_bfloat16> words(n);
    void* to = bf16 ? static_cast<void*>(words.data()) : values.data();
    EXPECT_EQ(cudaMemcpyAsync(to, p, n * (bf16 ? 2 : 4), cudaMemcpyDeviceToHost, stream_),
              cudaSuccess);
    if (bf16) std::transform(words.begin(), words.end(), values.begin(), __bfloat162float);
    return values;
  }

  cudnnBackendDescriptor_t Make(cudnnBackendDescriptorType_t type) {
    cudnnBackendDescriptor_t d = nullptr;
    EXPECT_EQ(cudnnBackendCreateDescriptor(type, &d), CUDNN_STATUS_SUCCESS);
    made_.push_back(d);
    return d;
  }
  template <typename T>
  static void Set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                  cudnnBackendAttributeType_t type, const T& value) {
    EXPECT_EQ(cudnnBackendSetAttribute(d, name, type, 1, &value), CUDNN_STATUS_SUCCESS)
        << "attribute " << name << ": " << LastError();
  }
  template <typename T>
  static void SetArray(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                       cudnnBackendAttributeType_t type, const std::vector<T>& values) {
    EXPECT_EQ(
        cudnnBackendSetAttribute(d, name, type, static_cast<int64_t>(values.size()), values.data()),
        CUDNN_STATUS_SUCCESS)
        << "attribute " << name << ": " << LastError();
  }
  static void Finalize(cudnnBackendDescriptor_t d) {
    EXPECT_EQ(cudnnBackendFinalize(d), CUDNN_STATUS_SUCCESS) << LastError();
  }

  // A finalized tensor descriptor, its strides packed row-major unless given.
  cudnnBackendDescriptor_t Tensor(int64_t uid, cudnnDataType_t type, std::vector<int64_t> dims,
                                  Kind kind = kInMemory, std::vector<int64_t> strides = {}) {
    if (strides.empty()) {
      strides.resize(dims.size());
      int64_t stride = 1;
      for (size_t k = dims.size(); k-- > 0;) {
        strides[k] = stride;
        stride *= dims[k];
      }
    }
    cudnnBackendDescriptor_t t = Make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    Set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, uid);
    Set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, type);
    SetArray(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims);
    SetArray(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides);
    Set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, int64_t{16});
    Set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, kind == kVirtual);
    Set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, kind == kByValue);
    Finalize(t);
    return t;
  }
  // y = mode(x[, b[, t]]), computed in float; `axis` for GEN_INDEX.
  cudnnBackendDescriptor_t Pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                                     cudnnBackendDescriptor_t y,
                                     cudnnBackendDescriptor_t b = nullptr,
                                     cudnnBackendDescriptor_t t = nullptr, int64_t axis = -1) {
    cudnnBackendDescriptor_t pw = Make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    Set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, mode);
    Set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, CUDNN_DATA_FLOAT);
    if (axis >= 0) Set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, axis);
    Finalize(pw);
    cudnnBackendDescriptor_t op = Make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    Set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, pw);
    Set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, x);
    if (b != nullptr)
      Set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, b);
    if (t != nullptr)
      Set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, t);
    Set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, y);
    Finalize(op);
    return op;
  }
  cudnnBackendDescriptor_t Matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                                  cudnnBackendDescriptor_t c) {
    cudnnBackendDescriptor_t mm = Make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    Set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, CUDNN_DATA_FLOAT);
    Finalize(mm);
    cudnnBackendDescriptor_t op = Make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    Set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, a);
    Set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, b);
    Set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, c);
    Set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, mm);
    Finalize(op);
    return op;
  }
  cudnnBackendDescriptor_t Reduction(cudnnReduceTensorOp_t reduce, cudnnBackendDescriptor_t x,
                                     cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t r = Make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    Set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, reduce);
    Set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, CUDNN_DATA_FLOAT);
    Finalize(r);
    cudnnBackendDescriptor_t op = Make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    Set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, x);
    Set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, y);
    Set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, r);
    Finalize(op);
    return op;
  }
  cudnnBackendDescriptor_t Reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = Make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    Set(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, x);
    Set(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, y);
    Finalize(op);
    return op;
  }
  // The graph of `ops` in *graph; the status of its finalization.
  cudnnStatus_t Graph(const std::vector<cudnnBackendDescriptor_t>& ops,
                      cudnnBackendDescriptor_t* graph) {
    *graph = Make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    Set(*graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, handle_);
    SetArray(*graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops);
    return cudnnBackendFinalize(*graph);
  }
  // The heuristics for `graph`: how many engine configurations they give, the first in *config.
  int64_t EngineConfigs(cudnnBackendDescriptor_t graph, cudnnBackendDescriptor_t* config) {
    cudnnBackendDescriptor_t heur = Make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    Set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, graph);
    Set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, CUDNN_HEUR_MODE_A);
    Finalize(heur);
    *config = Make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    int64_t count = -1;
    EXPECT_EQ(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count, config),
              CUDNN_STATUS_SUCCESS)
        << LastError();
    return count;
  }
  // An execution plan for the graph of `ops`, which must finalize; its workspace fits ours.
  cudnnBackendDescriptor_t Plan(const std::vector<cudnnBackendDescriptor_t>& ops) {
    cudnnBackendDescriptor_t graph = nullptr, config = nullptr;
    EXPECT_EQ(Graph(ops, &graph), CUDNN_STATUS_SUCCESS) << LastError();
    EXPECT_EQ(EngineConfigs(graph, &config), 1);
    cudnnBackendDescriptor_t plan = Make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    Set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, handle_);
    Set(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, config);
    Finalize(plan);
    int64_t workspace = -1, count = 0;
    EXPECT_EQ(cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                       CUDNN_TYPE_INT64, 1, &count, &workspace),
              CUDNN_STATUS_SUCCESS);
    EXPECT_GT(workspace, 0);
    EXPECT_LE(workspace, kWorkspaceBytes);
    return plan;
  }
  // Runs `plan` on stream_ with the tensors in `data` (unique id, pointer) and the workspace.
  cudnnStatus_t Execute(cudnnBackendDescriptor_t plan, const std::map<int64_t, void*>& data) {
    std::vector<int64_t> uids;
    std::vector<void*> pointers;
    for (const auto& [uid, p] : data) {
      uids.push_back(uid);
      pointers.push_back(p);
    }
    cudnnBackendDescriptor_t pack = Make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    SetArray(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids);
    SetArray(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, pointers);
    Set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, workspace_);
    Finalize(pack);
    return cudnnBackendExecute(handle_, plan, pack);
  }

  static constexpr size_t kWorkspaceBytes = 1 << 16;
  cudaStream_t stream_ = nullptr;
  cudnnHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::vector<cudnnBackendDescriptor_t> made_;
  std::vector<void*> allocated_;
};

// Y (2, 3, 2) = scale * A (2, 3, 4) B (1, 4, 2): bf16 inputs, B broadcast over the batch, the
// product a virtual float, the scale a by-value float read at the call. The ops are given
// consumer first: the graph orders them.
TEST_F(CudnnEmulatorTest, ABatchedBf16MatmulScaledByAByValueFloatMatchesPlainLoops) {
  constexpr int kBatch = 2, kM = 3, kK = 4, kN = 2;
  std::vector<float> a(kBatch * kM * kK), b(kK * kN);
  for (size_t i = 0; i < a.size(); ++i) a[i] = Bf16(0.37f * static_cast<float>(i) - 1.1f);
  for (size_t i = 0; i < b.size(); ++i) b[i] = Bf16(0.5f - 0.23f * static_cast<float>(i));
  cudnnBackendDescriptor_t ta = Tensor(1, CUDNN_DATA_BFLOAT16, {kBatch, kM, kK});
  cudnnBackendDescriptor_t tb = Tensor(2, CUDNN_DATA_BFLOAT16, {1, kK, kN});
  cudnnBackendDescriptor_t ts = Tensor(3, CUDNN_DATA_FLOAT, {kBatch, kM, kN}, kVirtual);
  cudnnBackendDescriptor_t tscale = Tensor(4, CUDNN_DATA_FLOAT, {1, 1, 1}, kByValue);
  cudnnBackendDescriptor_t ty = Tensor(5, CUDNN_DATA_FLOAT, {kBatch, kM, kN});
  cudnnBackendDescriptor_t plan =
      Plan({Pointwise(CUDNN_POINTWISE_MUL, ts, ty, tscale), Matmul(ta, tb, ts)});
  void* y = Allocate(kBatch * kM * kN * sizeof(float));
  float scale = 0.25f;
  const uint64_t executions = drover_emu_cudnn_executions();
  ASSERT_EQ(Execute(plan, {{1, Upload(a, true)}, {2, Upload(b, true)}, {4, &scale}, {5, y}}),
            CUDNN_STATUS_SUCCESS)
      << LastError();
  EXPECT_EQ(drover_emu_cudnn_executions(), executions + 1);
  scale = 100.0f;  // after the call: not what the graph reads
  const std::vector<float> got = Download(y, kBatch * kM * kN);
  for (int n = 0; n < kBatch; ++n) {
    for (int i = 0; i < kM; ++i) {
      for (int j = 0; j < kN; ++j) {
        double sum = 0.0;
        for (int k = 0; k < kK; ++k) sum += double{a[(n * kM + i) * kK + k]} * b[k * kN + j];
        EXPECT_EQ(got[(n * kM + i) * kN + j], static_cast<float>(sum) * 0.25f)
            << n << ", " << i << ", " << j;
      }
    }
  }
}

// The causal softmax of attention's forward, one head of T = 4: rows and columns from
// GEN_INDEX, the mask from CMP_GE, -inf by value where a column is past its row, then
// exp(s - max) / sum over each row. The ops are given last first.
TEST_F(CudnnEmulatorTest, ACausallyMaskedSoftmaxMatchesAHandComputation) {
  constexpr int kT = 4;
  const std::vector<float> s = {0.5f, 3.0f, -1.0f, 2.0f, 1.5f,  -0.5f, 9.0f, 0.0f,
                                2.0f, 1.0f, 0.25f, 7.0f, -3.0f, 4.0f,  1.0f, 2.5f};
  const std::vector<int64_t> square = {1, 1, kT, kT}, column = {1, 1, kT, 1};
  cudnnBackendDescriptor_t ts = Tensor(10, CUDNN_DATA_FLOAT, square);
  cudnnBackendDescriptor_t row = Tensor(11, CUDNN_DATA_INT32, square, kVirtual);
  cudnnBackendDescriptor_t col = Tensor(12, CUDNN_DATA_INT32, square, kVirtual);
  cudnnBackendDescriptor_t keep = Tensor(13, CUDNN_DATA_BOOLEAN, square, kVirtual);
  cudnnBackendDescriptor_t minus_inf = Tensor(14, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, kByValue);
  cudnnBackendDescriptor_t masked = Tensor(15, CUDNN_DATA_FLOAT, square, kVirtual);
  cudnnBackendDescriptor_t max = Tensor(16, CUDNN_DATA_FLOAT, column, kVirtual);
  cudnnBackendDescriptor_t centered = Tensor(17, CUDNN_DATA_FLOAT, square, kVirtual);
  cudnnBackendDescriptor_t e = Tensor(18, CUDNN_DATA_FLOAT, square, kVirtual);
  cudnnBackendDescriptor_t sum = Tensor(19, CUDNN_DATA_FLOAT, column, kVirtual);
  cudnnBackendDescriptor_t tp = Tensor(20, CUDNN_DATA_FLOAT, square);
  cudnnBackendDescriptor_t plan = Plan({
      Pointwise(CUDNN_POINTWISE_DIV, e, tp, sum),
      Reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum),
      Pointwise(CUDNN_POINTWISE_EXP, centered, e),
      Pointwise(CUDNN_POINTWISE_SUB, masked, centered, max),
      Reduction(CUDNN_REDUCE_TENSOR_MAX, masked, max),
      Pointwise(CUDNN_POINTWISE_BINARY_SELECT, ts, masked, minus_inf, keep),
      Pointwise(CUDNN_POINTWISE_CMP_GE, row, keep, col),
      Pointwise(CUDNN_POINTWISE_GEN_INDEX, ts, col, nullptr, nullptr, 3),
      Pointwise(CUDNN_POINTWISE_GEN_INDEX, ts, row, nullptr, nullptr, 2),
  });
  void* p = Allocate(kT * kT * sizeof(float));
  float minus_infinity = -INFINITY;
  ASSERT_EQ(Execute(plan, {{10, Upload(s)}, {14, &minus_infinity}, {20, p}}), CUDNN_STATUS_SUCCESS)
      << LastError();
  const std::vector<float> got = Download(p, kT * kT);
  for (int i = 0; i < kT; ++i) {
    const double row_max = *std::max_element(s.begin() + i * kT, s.begin() + i * kT + i + 1);
    double row_sum = 0.0;
    for (int j = 0; j <= i; ++j) row_sum += std::exp(s[i * kT + j] - row_max);
    for (int j = 0; j < kT; ++j) {
      const double want = j <= i ? std::exp(s[i * kT + j] - row_max) / row_sum : 0.0;
      EXPECT_NEAR(got[i * kT + j], want, 1e-6) << i << ", " << j;
    }
  }
}

// The attention backward's transpose: a reshape to swapped dimensions and swapped strides
// views x (1, 2, 3, 4) as (1, 2, 4, 3); stored as bf16, each element rounds.
TEST_F(CudnnEmulatorTest, AReshapeWithSwappedDimsAndStridesIsATranspose) {
  constexpr int kH = 2, kT = 3, kD = 4;
  std::vector<float> x(kH * kT * kD);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 1.0f + static_cast<float>(i) / 1000.0f;
  cudnnBackendDescriptor_t tx = Tensor(30, CUDNN_DATA_FLOAT, {1, kH, kT, kD});
  cudnnBackendDescriptor_t view =
      Tensor(31, CUDNN_DATA_FLOAT, {1, kH, kD, kT}, kVirtual, {kH * kT * kD, kT * kD, 1, kD});
  cudnnBackendDescriptor_t tz = Tensor(32, CUDNN_DATA_BFLOAT16, {1, kH, kD, kT});
  cudnnBackendDescriptor_t plan =
      Plan({Reshape(tx, view), Pointwise(CUDNN_POINTWISE_IDENTITY, view, tz)});
  void* z = Allocate(x.size() * 2);
  ASSERT_EQ(Execute(plan, {{30, Upload(x)}, {32, z}}), CUDNN_STATUS_SUCCESS) << LastError();
  const std::vector<float> got = Download(z, x.size(), true);
  for (int h = 0; h < kH; ++h) {
    for (int d = 0; d < kD; ++d) {
      for (int t = 0; t < kT; ++t) {
        EXPECT_EQ(got[(h * kD + d) * kT + t], Bf16(x[(h * kT + t) * kD + d]))
            << h << ", " << d << ", " << t;
      }
    }
  }
}

TEST_F(CudnnEmulatorTest, AVirtualTensorThatNoOpWritesFailsTheGraph) {
  cudnnBackendDescriptor_t graph = nullptr;
  ASSERT_EQ(
      Graph({Pointwise(CUDNN_POINTWISE_IDENTITY, Tensor(40, CUDNN_DATA_FLOAT, {1, 4}, kVirtual),
                       Tensor(41, CUDNN_DATA_FLOAT, {1, 4}))},
            &graph),
      CUDNN_STATUS_BAD_PARAM);
  EXPECT_NE(LastError().find("virtual tensor uid 40 is read by op 0 but no op"), std::string::npos)
      << LastError();
}

TEST_F(CudnnEmulatorTest, AnExecutionMissingATensorIsRefusedNamingItsUid) {
  cudnnBackendDescriptor_t plan =
      Plan({Pointwise(CUDNN_POINTWISE_IDENTITY, Tensor(50, CUDNN_DATA_FLOAT, {4}),
                      Tensor(51, CUDNN_DATA_FLOAT, {4}))});
  EXPECT_EQ(Execute(plan, {{51, Allocate(16)}}), CUDNN_STATUS_BAD_PARAM);
  EXPECT_NE(LastError().find("tensor uid 50 is not in the variant pack"), std::string::npos)
      << LastError();
}

TEST_F(CudnnEmulatorTest, WithDroverEmuCudnnNoEngineTheHeuristicsGiveNoEngine) {
  cudnnBackendDescriptor_t graph = nullptr, config = nullptr;
  ASSERT_EQ(Graph({Pointwise(CUDNN_POINTWISE_EXP, Tensor(60, CUDNN_DATA_FLOAT, {4}),
                             Tensor(61, CUDNN_DATA_FLOAT, {4}))},
                  &graph),
            CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(setenv("DROVER_EMU_CUDNN_NO_ENGINE", "1", 1), 0);
  EXPECT_EQ(EngineConfigs(graph, &config), 0);
  ASSERT_EQ(unsetenv("DROVER_EMU_CUDNN_NO_ENGINE"), 0);
  EXPECT_EQ(EngineConfigs(graph, &config), 1);
}

// What cuDNN refuses as an attribute is set: a finalized descriptor's, one of another type's
// or of the wrong attribute type, and a descriptor value not yet finalized.
TEST_F(CudnnEmulatorTest, AttributesCudnnRefusesAreRefusedWithAMessage) {
  cudnnBackendDescriptor_t t = Tensor(70, CUDNN_DATA_FLOAT, {4});
  const int64_t uid = 71;
  EXPECT_EQ(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid),
            CUDNN_STATUS_BAD_PARAM);
  EXPECT_NE(LastError().find("finalized"), std::string::npos) << LastError();
  cudnnBackendDescriptor_t fresh = Make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  EXPECT_EQ(cudnnBackendSetAttribute(fresh, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT32, 1, &uid),
            CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(cudnnBackendSetAttribute(fresh, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &uid),
            CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(cudnnBackendFinalize(fresh), CUDNN_STATUS_BAD_PARAM);
  EXPECT_NE(LastError().find("CUDNN_ATTR_TENSOR_DATA_TYPE is not set"), std::string::npos)
      << LastError();
  cudnnBackendDescriptor_t op = Make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  EXPECT_EQ(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &fresh),
            CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED);
}

TEST_F(CudnnEmulatorTest, ThePlanOverwritesItsWorkspace) {
  cudnnBackendDescriptor_t plan =
      Plan({Pointwise(CUDNN_POINTWISE_IDENTITY, Tensor(80, CUDNN_DATA_FLOAT, {4}),
                      Tensor(81, CUDNN_DATA_FLOAT, {4}))});
  ASSERT_EQ(cudaMemsetAsync(workspace_, 0, kWorkspaceBytes, stream_), cudaSuccess);
  ASSERT_EQ(Execute(plan, {{80, Upload({1, 2, 3, 4})}, {81, Allocate(16)}}), CUDNN_STATUS_SUCCESS);
  EXPECT_TRUE(std::isnan(Download(workspace_, 1)[0]));
}

TEST_F(CudnnEmulatorTest, TheVersionIsDroverEmuCudnnVersionsWhereSet) {
  EXPECT_EQ(cudnnGetVersion(), 91000u);
  ASSERT_EQ(setenv("DROVER_EMU_CUDNN_VERSION", "8907", 1), 0);
  EXPECT_EQ(cudnnGetVersion(), 8907u);
  ASSERT_EQ(unsetenv("DROVER_EMU_CUDNN_VERSION"), 0);
}

using CudnnEmulatorDeathTest = CudnnEmulatorTest;

// A view reaching elements of a strided virtual tensor that no op wrote: (4) at stride 2
// holds offsets 0, 2, 4, 6; a (4) view at stride 1 reads 1 and 3.
TEST_F(CudnnEmulatorDeathTest, AVirtualElementNoOpWroteDiesWhenRead) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  cudnnBackendDescriptor_t strided = Tensor(91, CUDNN_DATA_FLOAT, {4}, kVirtual, {2});
  cudnnBackendDescriptor_t view = Tensor(92, CUDNN_DATA_FLOAT, {4}, kVirtual);
  cudnnBackendDescriptor_t plan =
      Plan({Pointwise(CUDNN_POINTWISE_IDENTITY, Tensor(90, CUDNN_DATA_FLOAT, {4}), strided),
            Reshape(strided, view),
            Pointwise(CUDNN_POINTWISE_IDENTITY, view, Tensor(93, CUDNN_DATA_FLOAT, {4}))});
  void* x = Upload({1, 2, 3, 4});
  void* y = Allocate(16);
  EXPECT_DEATH(
      {
        (void)Execute(plan, {{90, x}, {93, y}});
        (void)cudaStreamSynchronize(stream_);
      },
      "virtual tensor uid 91 is read at offset 1, which no op of the graph wrote");
}

}  // namespace
