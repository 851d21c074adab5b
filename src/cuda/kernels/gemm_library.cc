// cuBLASLt's block-scaled FP8 product (gemm_library.h).
#include "cuda/kernels/gemm_library.h"

#if DSV4_HAVE_CUBLASLT

#include <cublasLt.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "cuda/runtime.h"

namespace dsv4::gpu::cublaslt {

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::size_t workspace = 0;
};

namespace {

constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;
constexpr std::size_t kMaxPlans = 512;  // distinct shapes kept (prefill chunks vary in rows)

void check(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    fail("{} failed: {} ({})", call, cublasLtGetStatusName(status), cublasLtGetStatusString(status));
}

void destroy(Plan& p) {
  if (p.c != nullptr) cublasLtMatrixLayoutDestroy(p.c);
  if (p.b != nullptr) cublasLtMatrixLayoutDestroy(p.b);
  if (p.a != nullptr) cublasLtMatrixLayoutDestroy(p.a);
  if (p.desc != nullptr) cublasLtMatmulDescDestroy(p.desc);
  p = Plan{};
}

template <class T>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t what, const T& value) {
  check(cublasLtMatmulDescSetAttribute(desc, what, &value, sizeof(value)), "cublasLtMatmulDescSetAttribute");
}

struct Scratch {
  DeviceBuffer workspace;
  DeviceBuffer scales;
};

// Process-wide state. Never destroyed: kernels may still run when static destructors do, and the
// CUDA context may already be gone then.
struct State {
  std::mutex mutex;
  cublasLtHandle_t handle = nullptr;
  // key: rows, n, k, output stride
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>, std::unique_ptr<Plan>> plans;
  std::string last_refusal;  // why the last shape without a plan has none
  bool calibrated = false, usable = false;
  std::int64_t row_multiple = 1;  // row counts cuBLASLt computes right (calibrate)
  Layouts layouts;
  std::string calibration;  // why the calibration found no layout
  std::map<gpu_stream_t, Scratch> scratch;
};

State& state() {
  static State* s = [] {
    auto* st = new State;
    check(cublasLtCreate(&st->handle), "cublasLtCreate");
    return st;
  }();
  return *s;
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

Scratch& scratch_for(State& s, gpu_stream_t stream) {
  if (s.scratch.count(stream) == 0 && s.scratch.size() >= 8) {
    // Streams come and go with executors (tests make many): free the others' scratch once all
    // work that may use it is done, rather than keep 32 MiB per stream ever seen. (A pointer from
    // scale_scratch is used before the next product is asked for: products are launched from one
    // thread at a time, the executor's.)
    synchronize_device();
    s.scratch.clear();
  }
  Scratch& sc = s.scratch[stream];
  if (sc.workspace.size() == 0) sc.workspace = DeviceBuffer(kWorkspaceBytes);
  return sc;
}

}  // namespace

bool available() { return true; }

namespace {

// A plan for rows x n x k into an output of stride ld, or null with `why` set. `scale` is any
// valid device pointer: cuBLASLt's heuristic wants the scale pointers set.
std::unique_ptr<Plan> make_plan(State& s, std::int64_t rows, std::int64_t n, std::int64_t k, std::int64_t ld,
                                const void* scale, std::string& why) {
  auto plan = std::make_unique<Plan>();
  Plan& p = *plan;
  check(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  set(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, cublasOperation_t{CUBLAS_OP_T});
  set(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, cublasOperation_t{CUBLAS_OP_N});
  set(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, std::int32_t{CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F});
  set(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, std::int32_t{CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F});
  // Column-major views: A = the weight as k x n (ld k, transposed by the op), B = the activations
  // as k x rows (ld k), C = D = the output as n x rows (ld out.ld).
  check(
      cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, static_cast<std::uint64_t>(k), static_cast<std::uint64_t>(n), k),
      "cublasLtMatrixLayoutCreate");
  check(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, static_cast<std::uint64_t>(k),
                                   static_cast<std::uint64_t>(rows), k),
        "cublasLtMatrixLayoutCreate");
  check(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_16BF, static_cast<std::uint64_t>(n), static_cast<std::uint64_t>(rows),
                                   ld),
        "cublasLtMatrixLayoutCreate");
  set(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, scale);
  set(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, scale);
  cublasLtMatmulPreference_t pref = nullptr;
  check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const std::uint64_t ws = kWorkspaceBytes;
  check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
        "cublasLtMatmulPreferenceSetAttribute");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(s.handle, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0 || result.state != CUBLAS_STATUS_SUCCESS) {
    why = fmt::format("cublasLtMatmulAlgoGetHeuristic: {}, {} algorithms, state {} (cuBLASLt version {})",
                      cublasLtGetStatusName(st), found, cublasLtGetStatusName(result.state), cublasLtGetVersion());
    destroy(p);
    return nullptr;
  }
  p.algo = result.algo;
  p.workspace = result.workspaceSize;
  return plan;
}

void launch_plan(State& s, const Plan& plan, const std::uint8_t* codes, const float* act_scales,
                 const void* weight_codes, const float* weight_scales, void* out, void* workspace,
                 gpu_stream_t stream) {
  // The scale pointers belong to this call; the descriptor is only used under the mutex.
  set(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(weight_scales));
  set(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(act_scales));
  const float alpha = 1.0f, beta = 0.0f;
  check(cublasLtMatmul(s.handle, plan.desc, &alpha, weight_codes, plan.a, codes, plan.b, &beta, out, plan.c, out,
                       plan.c, &plan.algo, workspace, plan.workspace, static_cast<cudaStream_t>(stream)),
        "cublasLtMatmul");
}

// Which scale layouts this cuBLASLt reads, found once per process by running a small product
// whose every activation row and weight block has its own power-of-two scale under each
// candidate layout and comparing with the exact result computed here. The products of a
// candidate layout that is wrong are far off (scales are permuted), the right one is exact up to
// the bf16 output rounding. No candidate right: the library path stays off (last_refusal says so).
bool calibrate_at(State& s, const std::int64_t M, Layouts& found, std::string& report) {
  constexpr std::int64_t N = 256, K = 512, kb = K / 128, nb = N / 128;
  // Codes from a small set of exact e4m3 values: +-0.5, +-1, +-2, 0.
  const std::uint8_t kCodes[7] = {0x30, 0x38, 0x40, 0xb0, 0xb8, 0xc0, 0x00};
  const float kValues[7] = {0.5f, 1.0f, 2.0f, -0.5f, -1.0f, -2.0f, 0.0f};
  std::vector<std::uint8_t> a(M * K), w(N * K);
  std::vector<float> av(M * K), wv(N * K);
  std::uint32_t seed = 12345;
  auto next = [&] { return (seed = seed * 1664525u + 1013904223u) >> 8; };
  for (std::int64_t i = 0; i < M * K; ++i) {
    const auto c = next() % 7;
    a[i] = kCodes[c];
    av[i] = kValues[c];
  }
  for (std::int64_t i = 0; i < N * K; ++i) {
    const auto c = next() % 7;
    w[i] = kCodes[c];
    wv[i] = kValues[c];
  }
  auto act_scale = [](std::int64_t m, std::int64_t b) {
    return std::ldexp(1.0f, static_cast<int>((m * 7 + b * 3) % 9) - 4);
  };
  auto weight_scale = [](std::int64_t i, std::int64_t b) {
    return std::ldexp(1.0f, static_cast<int>((i * 5 + b * 2) % 7) - 3);
  };
  std::vector<float> sa_rows(M * kb), sa_kmajor(M * kb), sw_stored(nb * kb), sw_transposed(nb * kb);
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t b = 0; b < kb; ++b) sa_rows[m * kb + b] = sa_kmajor[b * M + m] = act_scale(m, b);
  for (std::int64_t i = 0; i < nb; ++i)
    for (std::int64_t b = 0; b < kb; ++b) sw_stored[i * kb + b] = sw_transposed[b * nb + i] = weight_scale(i, b);
  std::vector<double> ref(M * N);
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      double total = 0;
      for (std::int64_t b = 0; b < kb; ++b) {
        double part = 0;
        for (std::int64_t k = b * 128; k < (b + 1) * 128; ++k)
          part += static_cast<double>(av[m * K + k]) * wv[n * K + k];
        total += part * act_scale(m, b) * weight_scale(n / 128, b);
      }
      ref[m * N + n] = total;
    }

  Stream stream;
  DeviceBuffer da(a.size()), dw(w.size()), dsa_rows(sa_rows.size() * 4), dsa_kmajor(sa_kmajor.size() * 4),
      dsw_stored(sw_stored.size() * 4), dsw_transposed(sw_transposed.size() * 4),
      dout(static_cast<std::size_t>(M * N * 2)), workspace(kWorkspaceBytes);
  copy_to_device(da.data(), a.data(), a.size(), stream);
  copy_to_device(dw.data(), w.data(), w.size(), stream);
  copy_to_device(dsa_rows.data(), sa_rows.data(), sa_rows.size() * 4, stream);
  copy_to_device(dsa_kmajor.data(), sa_kmajor.data(), sa_kmajor.size() * 4, stream);
  copy_to_device(dsw_stored.data(), sw_stored.data(), sw_stored.size() * 4, stream);
  copy_to_device(dsw_transposed.data(), sw_transposed.data(), sw_transposed.size() * 4, stream);
  std::string why;
  const std::unique_ptr<Plan> plan = make_plan(s, M, N, K, N, dsw_stored.data(), why);
  if (plan == nullptr) {
    report += fmt::format(" {} rows: {};", M, why);
    stream.synchronize();
    return false;
  }
  for (const bool act_k_major : {true, false}) {
    for (const bool weight_transposed : {false, true}) {
      fill_bytes(dout.data(), 0xff, dout.size(), stream);
      launch_plan(s, *plan, da.as<std::uint8_t>(), (act_k_major ? dsa_kmajor : dsa_rows).as<float>(), dw.data(),
                  (weight_transposed ? dsw_transposed : dsw_stored).as<float>(), dout.data(), workspace.data(),
                  stream.handle());
      std::vector<std::uint16_t> got(static_cast<std::size_t>(M * N));
      copy_to_host(got.data(), dout.data(), got.size() * 2, stream);
      stream.synchronize();
      std::int64_t wrong = 0;
      for (std::int64_t i = 0; i < M * N; ++i) {
        const std::uint32_t bits = static_cast<std::uint32_t>(got[i]) << 16;
        float v;
        std::memcpy(&v, &bits, 4);
        if (!(std::fabs(static_cast<double>(v) - ref[i]) <= std::fabs(ref[i]) * 0x1p-7 + 1e-6)) ++wrong;
      }
      report += fmt::format(" {} rows, activation scales {}, weight scales {}: {} of {} wrong;", M,
                            act_k_major ? "[k/128][rows]" : "[rows][k/128]",
                            weight_transposed ? "[k/128][n/128]" : "[n/128][k/128]", wrong, M * N);
      if (wrong == 0) {
        found = Layouts{act_k_major, weight_transposed};
        destroy(*plan);
        return true;
      }
    }
  }
  destroy(*plan);
  return false;
}

// Calibrates with 20 rows (not a multiple of 8) and 24: where only 24 works, products take row
// counts that are multiples of 8 only.
void calibrate(State& s) {
  s.calibrated = true;
  Layouts at20, at24;
  std::string report;
  const bool ok20 = calibrate_at(s, 20, at20, report), ok24 = calibrate_at(s, 24, at24, report);
  if (ok20 && ok24 && at20.act_k_major == at24.act_k_major && at20.weight_transposed == at24.weight_transposed) {
    s.layouts = at24;
    s.row_multiple = 1;
  } else if (ok24) {
    s.layouts = at24;
    s.row_multiple = 8;
  } else {
    s.calibration = "calibration: no scale layout gives the exact product:" + report;
    return;
  }
  s.usable = true;
  s.calibration = fmt::format("scale layouts: activations {}, weights {}; row counts: {}",
                              s.layouts.act_k_major ? "[k/128][rows]" : "[rows][k/128]",
                              s.layouts.weight_transposed ? "[k/128][n/128]" : "[n/128][k/128]",
                              s.row_multiple == 1 ? "any cuBLASLt takes" : "multiples of 8 (" + report + " )");
}

}  // namespace

Layouts layouts() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.layouts;
}

const Plan* find_plan(std::int64_t rows, const DeviceWeight& w, const GemmOutput& out) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (w.format != WeightFormat::kFp8 || out.f32 || rows < 1 || w.n % 128 != 0 || w.k % 512 != 0) {
    // k a multiple of 512: rows of k/128 weight scales a multiple of 16 bytes. cuBLASLt 13.1 reads
    // the weight scales of k = 384 (3 per row) at a row pitch of 4 (measured: the calibration
    // product of 2026-12-02 had its second block row wrong), so other k stay with our kernels.
    s.last_refusal = "not a dense fp8 weight with n a multiple of 128, k a multiple of 512 and bf16 output";
    return nullptr;
  }
  if (!aligned16(w.data) || !aligned16(w.scale) || !aligned16(out.data) || out.ld % 8 != 0 || out.ld < w.n) {
    s.last_refusal = "unaligned weight, scales or output";
    return nullptr;
  }
  if (!s.calibrated) calibrate(s);
  if (!s.usable) {
    s.last_refusal = s.calibration;
    return nullptr;
  }
  if (rows % s.row_multiple != 0) {
    s.last_refusal =
        fmt::format("this cuBLASLt computes row counts that are multiples of {} only (calibration)", s.row_multiple);
    return nullptr;
  }
  const auto key = std::make_tuple(rows, w.n, w.k, out.ld);
  if (auto it = s.plans.find(key); it != s.plans.end()) {
    if (it->second == nullptr) s.last_refusal = "no cuBLASLt algorithm for this shape (see the first refusal)";
    return it->second.get();
  }
  if (s.plans.size() >= kMaxPlans) {
    // Plans of every shape seen are kept until there are too many; then start over (a plan is
    // only read while its product is launched, under this mutex).
    for (auto& [k, p] : s.plans)
      if (p != nullptr) destroy(*p);
    s.plans.clear();
  }
  std::unique_ptr<Plan> plan = make_plan(s, rows, w.n, w.k, out.ld, w.scale, s.last_refusal);
  return (s.plans[key] = std::move(plan)).get();
}

std::string calibration() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.calibrated ? s.calibration : "not calibrated yet";
}

std::string last_refusal() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.last_refusal;
}

float* scale_scratch(gpu_stream_t stream, std::int64_t floats) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  Scratch& sc = scratch_for(s, stream);
  const auto bytes = static_cast<std::size_t>(floats) * sizeof(float);
  if (sc.scales.size() < bytes) {
    synchronize_device();  // the old buffer may still be read by a product in flight
    sc.scales = DeviceBuffer(std::max<std::size_t>(bytes * 2, std::size_t{1} << 20));
  }
  return sc.scales.as<float>();
}

void run(const Plan& plan, const std::uint8_t* codes, const float* act_scales, const float* weight_scales,
         const DeviceWeight& w, const GemmOutput& out, gpu_stream_t stream) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  Scratch& sc = scratch_for(s, stream);
  launch_plan(s, plan, codes, act_scales, w.data, weight_scales, out.data, sc.workspace.data(), stream);
}

}  // namespace dsv4::gpu::cublaslt

#else  // no cuBLASLt (the simulator build, or a toolkit without it)

#include "common/error.h"

namespace dsv4::gpu::cublaslt {

struct Plan {};

bool available() { return false; }
std::string last_refusal() { return "this build has no cuBLASLt"; }
std::string calibration() { return "this build has no cuBLASLt"; }
const Plan* find_plan(std::int64_t, const DeviceWeight&, const GemmOutput&) { return nullptr; }
float* scale_scratch(gpu_stream_t, std::int64_t) { return nullptr; }
Layouts layouts() { return {}; }
void run(const Plan&, const std::uint8_t*, const float*, const float*, const DeviceWeight&, const GemmOutput&,
         gpu_stream_t) {
  fail("gemm: this build has no cuBLASLt");  // unreachable: find_plan gives no plan to run
}

}  // namespace dsv4::gpu::cublaslt

#endif
