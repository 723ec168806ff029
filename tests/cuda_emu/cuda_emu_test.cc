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
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
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

using CudaEmulatorDeathTest = CudaEmulatorTest;

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

}  // namespace
