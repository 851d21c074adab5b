// The SIMT simulator's own checks, which only exist in the simulator: deadlocks, barrier and warp
// collective divergence, launch limits, device assertions, poisoned memory, late cp.async data,
// wgmma operands written while a product is in flight, and its speed. (The behaviour it shares
// with the GPU is in test_device_language.cu.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/error.h"
#include "cuda/device.h"
#include "cuda/runtime.h"

namespace gpu = dsv4::gpu;
namespace sim = dsv4::gpu::sim;
using testing::AllOf;
using testing::HasSubstr;

namespace {

gpu::Stream& test_stream() {
  static gpu::Stream stream;
  return stream;
}

// Runs `launch` in throwing mode and returns the SimError's message ("" when nothing was thrown).
template <class F>
std::string sim_error(F&& launch) {
  sim::ScopedErrorMode mode(sim::ErrorMode::kThrow);
  try {
    launch();
  } catch (const sim::SimError& e) {
    if (std::getenv("DSV4_SHOW_SIM_ERRORS")) std::printf("%s\n", e.what());
    return e.what();
  }
  return "";
}

// ---- a healthy kernel, to check the simulator still works after a failed launch ----
__global__ void iota_kernel(int* out) {
  __shared__ int slots[128];
  slots[threadIdx.x] = static_cast<int>(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = slots[127 - threadIdx.x] + __shfl_xor_sync(0xffffffffu, 0, 1);
}

void expect_simulator_healthy() {
  gpu::DeviceBuffer out(128 * sizeof(int));
  gpu::launch(iota_kernel, dim3(1), dim3(128), 0, test_stream().handle(), out.as<int>());
  for (int i = 0; i < 128; ++i) ASSERT_EQ(out.as<int>()[i], 127 - i);
}

// ---- kernels with bugs ----
__global__ void skip_barrier_kernel(int* out) {
  if (threadIdx.x < 64) __syncthreads();  // half the block skips this barrier
  __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void warp_vs_block_deadlock_kernel(int* out) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (lane < 16) {
    out[threadIdx.x] = __shfl_sync(0xffffffffu, lane, 0);  // waits for lanes 16-31...
  } else {
    __syncthreads();  // ...which wait for lanes 0-15 here
  }
}

__global__ void divergent_collectives_kernel(unsigned* out) {
  const unsigned lane = threadIdx.x;
  if (lane % 2 == 0) {
    out[lane] = static_cast<unsigned>(__shfl_sync(0xffffffffu, static_cast<int>(lane), 0));
  } else {
    out[lane] = __ballot_sync(0xffffffffu, 1);
  }
}

__global__ void assert_kernel(int* out) {
  DSV4_DEVICE_ASSERT(blockIdx.x != 1 || threadIdx.x != 7);
  out[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}

__global__ void bad_width_kernel(int* out) { out[threadIdx.x] = __shfl_down_sync(0xffffffffu, 1, 1, 12); }

__global__ void foreign_mask_kernel(int* out) { out[threadIdx.x] = __shfl_sync(0x0000ffffu, 1, 0); }

__global__ void partial_warp_mma_kernel(float* out) {
  if (threadIdx.x >= 16) return;
  const std::uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
  const float c[4] = {0, 0, 0, 0};
  float d[4];
  gpu::mma_m16n8k16_bf16(d, a, b, c);
  out[threadIdx.x] = d[0];
}

__global__ void misaligned_cp_async_kernel(const unsigned char* src) {
  DSV4_DYNAMIC_SMEM(unsigned char, stage);
  gpu::cp_async_16(stage + 16 * threadIdx.x, src + 16 * threadIdx.x + 4);
  gpu::cp_async_wait_all();
}

__global__ void throwing_kernel(int* out) {
  if (threadIdx.x == 3) throw std::runtime_error("thrown by a simulated thread");
  out[threadIdx.x] = 1;
}

// A wgmma product of warpgroup 0 reads A (64 x 16) and B (64 x 16) from the first 4 KB of shared
// memory; warpgroup 1 then writes at byte `offset` while the product is in flight (before warpgroup
// 0's wgmma_wait) -- a race when the write lands in the operands. With `early` one thread of
// warpgroup 0 writes right after its own issue, before the other threads have issued.
// Only 96 of warpgroup 0's threads issue the product; all of them commit and wait.
__global__ void wgmma_partial_warpgroup_kernel(float* out) {
  DSV4_DYNAMIC_SMEM(std::uint8_t, smem);
  const int t = static_cast<int>(threadIdx.x);
  for (int i = t; i < 4096 / 4; i += 128) reinterpret_cast<std::uint32_t*>(smem)[i] = 0x3F003F00u;
  __syncthreads();
  float acc[32];
  for (float& v : acc) v = 0.0f;
  gpu::wgmma_fence();
  if (t < 96)
    gpu::wgmma_m64n64k16_bf16(acc, gpu::wgmma_descriptor(smem, 128, 256), gpu::wgmma_descriptor(smem + 2048, 128, 256),
                              false);
  gpu::wgmma_commit();
  gpu::wgmma_wait<0>();
  out[t] = acc[0];
}

__global__ void wgmma_overwrite_kernel(int offset, bool early, float* out) {
  DSV4_DYNAMIC_SMEM(std::uint8_t, smem);
  const int t = static_cast<int>(threadIdx.x);
  for (int i = t; i < 8192 / 4; i += 256) reinterpret_cast<std::uint32_t*>(smem)[i] = 0x3F003F00u;  // bf16 0.5, 0.5
  __syncthreads();
  float acc[32];
  for (float& v : acc) v = 0.0f;
  if (t < 128) {
    gpu::wgmma_fence();
    gpu::wgmma_m64n64k16_bf16(acc, gpu::wgmma_descriptor(smem, 128, 256), gpu::wgmma_descriptor(smem + 2048, 128, 256),
                              false);
    gpu::wgmma_commit();
    if (early && t == 0) smem[offset] ^= 1u;
  }
  __syncthreads();
  if (!early && t == 128) smem[offset] ^= 1u;  // a thread of warpgroup 1
  __syncthreads();
  if (t < 128) {
    gpu::wgmma_wait<0>();
    out[t] = acc[0];
  }
}

// ---- kernels with correct but unusual behaviour ----
__global__ void early_exit_kernel(int* out) {
  if (threadIdx.x % 2 == 1) return;  // exited threads do not hold up the barrier
  __syncthreads();
  out[threadIdx.x] = 7;
}

__global__ void partial_last_warp_kernel(int* out) {
  // 48 threads: warp 1 has lanes 0-15 only. Reading a lane that does not exist gives 0.
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x) + 1, 16);
}

__global__ void independent_syncwarp_kernel(int* out) {
  // Lane 1 synchronizes alone first; then lanes 0 and 1 shuffle together.
  const int lane = static_cast<int>(threadIdx.x);
  if (lane == 1) __syncwarp(0x2u);
  if (lane < 2) out[lane] = __shfl_sync(0x3u, lane + 10, 1 - lane);
}

__global__ void early_read_kernel(const uint4* src, unsigned* out) {
  DSV4_DYNAMIC_SMEM(uint4, stage);
  const unsigned t = threadIdx.x;
  gpu::cp_async_16(&stage[t], &src[t]);
  gpu::cp_async_commit();
  out[2 * t] = stage[t].x;  // too early: the copy has not landed
  gpu::cp_async_wait<0>();
  out[2 * t + 1] = stage[t].x;
}

// Bulk copies land when the mbarrier phase completes: thread 0 copies and only then announces
// the bytes; a thread that reads before waiting sees the poison.
__global__ void early_bulk_read_kernel(const uint4* src, unsigned* out) {
  DSV4_DYNAMIC_SMEM(uint4, stage);
  __shared__ __align__(8) std::uint64_t bar;
  const unsigned t = threadIdx.x, n = blockDim.x;
  if (t == 0) gpu::mbarrier_init(&bar, 1);
  __syncthreads();
  if (t == 0) gpu::bulk_copy_to_shared(stage, src, n * 16, &bar);
  out[2 * t] = stage[t].x;  // too early: the phase still waits for thread 0's arrival
  __syncthreads();
  if (t == 0) gpu::mbarrier_arrive_expect_tx(&bar, n * 16);
  gpu::mbarrier_wait(&bar, 0);
  out[2 * t + 1] = stage[t].x;
}

// A phase nobody completes: every thread waits for an arrival that never comes.
__global__ void mbarrier_deadlock_kernel() {
  __shared__ __align__(8) std::uint64_t bar;
  if (threadIdx.x == 0) gpu::mbarrier_init(&bar, 2);
  __syncthreads();
  if (threadIdx.x == 0) gpu::mbarrier_arrive(&bar);
  gpu::mbarrier_wait(&bar, 0);
}

__global__ void misaligned_bulk_copy_kernel(const unsigned char* src) {
  DSV4_DYNAMIC_SMEM(unsigned char, stage);
  __shared__ __align__(8) std::uint64_t bar;
  if (threadIdx.x == 0) {
    gpu::mbarrier_init(&bar, 1);
    gpu::bulk_copy_to_shared(stage, src, 24, &bar);
  }
}

__global__ void smem_limit_kernel(float* out) {
  DSV4_DYNAMIC_SMEM(float, s);
  s[threadIdx.x] = static_cast<float>(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}

__global__ void barriers_kernel(int* out) {
  __shared__ int slots[256];
  int acc = 0;
  for (int i = 0; i < 5; ++i) {  // 10 barriers
    slots[threadIdx.x] = i + static_cast<int>(threadIdx.x);
    __syncthreads();
    acc += slots[(threadIdx.x + 1) % 256];
    __syncthreads();
  }
  out[blockIdx.x * 256 + threadIdx.x] = acc;
}

// Warp 1 waits at named barrier 1 for 64 threads, warp 0 at barrier 2: neither completes.
__global__ void named_barrier_deadlock_kernel() {
  if (threadIdx.x < 32) gpu::named_barrier_sync(2, 64);
  else gpu::named_barrier_sync(1, 64);
}
// Three warps at a barrier that counts two.
__global__ void named_barrier_overfull_kernel() { gpu::named_barrier_sync(3, 64); }
// 384 threads start with 168 registers; two warpgroups ask for 24 more each (6144), one frees 40
// (5120; the 1024 the launch left unallocated do not count): the increase waits forever, as it
// did on the H200.
__global__ void register_pool_deadlock_kernel() {
  if (threadIdx.x >= 256) gpu::setmaxnreg_dec<128>();
  else gpu::setmaxnreg_inc<192>();
}
// Only the first warp of the warpgroup lowers its budget.
__global__ void partial_setmaxnreg_kernel() {
  if (threadIdx.x < 32) gpu::setmaxnreg_dec<120>();
}
// A 16-byte load 8 bytes into a buffer.
__global__ void misaligned_vector_load_kernel(const unsigned char* src, unsigned* out) {
  out[threadIdx.x] = gpu::load_global_v4_or_zero(src + 8, true).x;
}
// Barrier 0 is __syncthreads'.
__global__ void named_barrier_zero_kernel() { gpu::named_barrier_sync(0, 32); }

// The block of rank 1 leaves its cluster without the cluster barrier the other waits at.
__global__ void cluster_skip_kernel(unsigned* out) {
  DSV4_DYNAMIC_SMEM(unsigned, buf);
  buf[threadIdx.x] = threadIdx.x;
  if (gpu::cluster_rank() == 1) return;
  gpu::cluster_sync();
  out[threadIdx.x] = buf[threadIdx.x];
}
// cluster_map of an address outside the block's dynamic shared memory.
__global__ void cluster_map_global_kernel(unsigned* out) { *gpu::cluster_map(out, 1) = 1u; }

// =================================================================================================

TEST(Simulator, BarrierSkippedByHalfTheBlockIsReported) {
  gpu::DeviceBuffer out(128 * sizeof(int));
  const std::string error = sim_error(
      [&] { gpu::launch(skip_barrier_kernel, dim3(1), dim3(128), 0, test_stream().handle(), out.as<int>()); });
  EXPECT_THAT(error, AllOf(HasSubstr("barrier divergence"), HasSubstr("skip_barrier_kernel"),
                           HasSubstr("test_simulator.cc:"), HasSubstr("block (0, 0, 0)")));
  expect_simulator_healthy();
}

TEST(Simulator, DeadlockIsReportedWithWhereEveryThreadWaits) {
  gpu::DeviceBuffer out(64 * sizeof(int));
  const std::string error = sim_error([&] {
    gpu::launch(warp_vs_block_deadlock_kernel, dim3(2), dim3(64), 0, test_stream().handle(), out.as<int>());
  });
  EXPECT_THAT(error, AllOf(HasSubstr("deadlock"), HasSubstr("warp_vs_block_deadlock_kernel"),
                           HasSubstr("threads 0-15 (warp 0): __shfl_sync (mask 0xffffffff)"),
                           HasSubstr("threads 16-31 (warp 0): __syncthreads at")));
  expect_simulator_healthy();
}

TEST(Simulator, ClusterBarrierAndMappingAreChecked) {
  gpu::DeviceBuffer out(32 * sizeof(unsigned));
  // Rank 1 exits; rank 0 then passes the barrier alone (as on the GPU, exited threads do not hold
  // it up), so the launch completes.
  gpu::launch_cluster(cluster_skip_kernel, dim3(2), dim3(32), 32 * sizeof(unsigned), 2, test_stream().handle(),
                      out.as<unsigned>());
  try {
    gpu::launch_cluster(cluster_skip_kernel, dim3(3), dim3(32), 32 * sizeof(unsigned), 2, test_stream().handle(),
                        out.as<unsigned>());
    ADD_FAILURE() << "a grid of 3 blocks in clusters of 2 was launched";
  } catch (const dsv4::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("invalid cluster of 2 blocks"));
  }
  const std::string map_error = sim_error([&] {
    gpu::launch_cluster(cluster_map_global_kernel, dim3(2), dim3(1), 16, 2, test_stream().handle(), out.as<unsigned>());
  });
  EXPECT_THAT(map_error, AllOf(HasSubstr("cluster_map at"), HasSubstr("dynamic shared memory"),
                               HasSubstr("cluster_map_global_kernel")));
  expect_simulator_healthy();
}

TEST(Simulator, DivergentWarpCollectivesAreReported) {
  gpu::DeviceBuffer out(32 * sizeof(unsigned));
  const std::string error = sim_error([&] {
    gpu::launch(divergent_collectives_kernel, dim3(1), dim3(32), 0, test_stream().handle(), out.as<unsigned>());
  });
  EXPECT_THAT(error, AllOf(HasSubstr("divergent warp collectives in warp 0"), HasSubstr("__shfl_sync"),
                           HasSubstr("__ballot_sync")));
  expect_simulator_healthy();
}

TEST(Simulator, DeviceAssertionNamesBlockAndThread) {
  gpu::DeviceBuffer out(2 * 32 * sizeof(int));
  const std::string error = sim_error(
      [&] { gpu::launch(assert_kernel, dim3(2), dim3(32), 0, test_stream().handle(), out.as<int>()); });
  EXPECT_THAT(error, AllOf(HasSubstr("device assertion `blockIdx.x != 1 || threadIdx.x != 7` failed"),
                           HasSubstr("block (1, 0, 0)"), HasSubstr("thread (7, 0, 0) (warp 0, lane 7)"),
                           HasSubstr("assert_kernel")));
  expect_simulator_healthy();
}

TEST(Simulator, MisusedPrimitivesAreReported) {
  gpu::DeviceBuffer out(64 * sizeof(int));
  EXPECT_THAT(sim_error([&] {
                gpu::launch(bad_width_kernel, dim3(1), dim3(32), 0, test_stream().handle(), out.as<int>());
              }),
              HasSubstr("width 12 is not a power of two"));
  EXPECT_THAT(sim_error([&] {
                gpu::launch(foreign_mask_kernel, dim3(1), dim3(32), 0, test_stream().handle(), out.as<int>());
              }),
              HasSubstr("does not include the calling lane 16"));
  EXPECT_THAT(sim_error([&] {
                gpu::launch(partial_warp_mma_kernel, dim3(1), dim3(32), 0, test_stream().handle(),
                            out.as<float>());
              }),
              HasSubstr("needs all 32 lanes"));
  gpu::DeviceBuffer src(1024);
  EXPECT_THAT(sim_error([&] {
                gpu::launch(misaligned_cp_async_kernel, dim3(1), dim3(4), 64, test_stream().handle(),
                            static_cast<const unsigned char*>(src.data()));
              }),
              HasSubstr("must be 16-byte aligned"));
  EXPECT_THAT(sim_error([&] {
                gpu::launch(misaligned_vector_load_kernel, dim3(1), dim3(1), 0, test_stream().handle(),
                            static_cast<const unsigned char*>(src.data()), out.as<unsigned>());
              }),
              HasSubstr("16-byte load at"));
  EXPECT_THAT(sim_error([] { (void)threadIdx.x; }), HasSubstr("threadIdx used outside a simulated kernel"));
  expect_simulator_healthy();
}

TEST(Simulator, WgmmaRacesAndPartialWarpgroupsAreReported) {
  gpu::DeviceBuffer out(128 * sizeof(float));
  auto run = [&](int offset, bool early) {
    return sim_error([&] {
      gpu::launch(wgmma_overwrite_kernel, dim3(1), dim3(256), 8192, test_stream().handle(), offset, early,
                  out.as<float>());
    });
  };
  EXPECT_THAT(run(2048 + 700, false), HasSubstr("changed before the warpgroup's last wgmma_wait"));  // B
  EXPECT_THAT(run(5, false), HasSubstr("changed before the warpgroup's last wgmma_wait"));           // A
  EXPECT_THAT(run(1000, true), HasSubstr("changed between the warpgroup's threads' issues"));
  EXPECT_EQ(run(4096 + 3, false), "");  // outside the operands: no race
  for (int i = 0; i < 128; ++i) EXPECT_EQ(out.as<float>()[i], 4.0f) << i;  // 16 x 0.5 x 0.5
  EXPECT_THAT(sim_error([&] {
                gpu::launch(wgmma_partial_warpgroup_kernel, dim3(1), dim3(128), 4096, test_stream().handle(),
                            out.as<float>());
              }),
              HasSubstr("was issued by 96 of the warpgroup's 128 threads"));
  expect_simulator_healthy();
}

TEST(Simulator, ExceptionsFromKernelCodePropagate) {
  gpu::DeviceBuffer out(32 * sizeof(int));
  EXPECT_THROW(gpu::launch(throwing_kernel, dim3(1), dim3(32), 0, test_stream().handle(), out.as<int>()),
               std::runtime_error);
  expect_simulator_healthy();
}

TEST(SimulatorDeathTest, AbortsWithTheReportByDefault) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ASSERT_EQ(sim::error_mode(), sim::ErrorMode::kAbort);
  EXPECT_DEATH(
      {
        gpu::DeviceBuffer out(32 * sizeof(int));
        gpu::launch(warp_vs_block_deadlock_kernel, dim3(1), dim3(32), 0, test_stream().handle(), out.as<int>());
      },
      "dsv4 sim: kernel .*warp_vs_block_deadlock_kernel.*deadlock");
}

TEST(Simulator, ExitedThreadsDoNotHoldUpBarriers) {
  gpu::DeviceBuffer out(64 * sizeof(int));
  gpu::fill_bytes(out.data(), 0, out.size(), test_stream());
  gpu::launch(early_exit_kernel, dim3(1), dim3(64), 0, test_stream().handle(), out.as<int>());
  for (int i = 0; i < 64; ++i) EXPECT_EQ(out.as<int>()[i], i % 2 == 0 ? 7 : 0);
}

TEST(Simulator, MissingLanesOfAPartialWarpReadAsZero) {
  gpu::DeviceBuffer out(48 * sizeof(int));
  gpu::launch(partial_last_warp_kernel, dim3(1), dim3(48), 0, test_stream().handle(), out.as<int>());
  for (int i = 0; i < 48; ++i) EXPECT_EQ(out.as<int>()[i], i < 32 ? (i ^ 16) + 1 : 0) << i;
}

TEST(Simulator, CollectivesWithDifferentMasksReleaseIndependently) {
  gpu::DeviceBuffer out(2 * sizeof(int));
  gpu::launch(independent_syncwarp_kernel, dim3(1), dim3(32), 0, test_stream().handle(), out.as<int>());
  EXPECT_EQ(out.as<int>()[0], 11);
  EXPECT_EQ(out.as<int>()[1], 10);
}

TEST(Simulator, BulkCopyDataLandsWhenThePhaseCompletes) {
  const int n = 32;
  std::vector<uint4> src(n);
  for (int i = 0; i < n; ++i) src[i] = make_uint4(static_cast<unsigned>(i), 0, 0, 0);
  gpu::DeviceBuffer d_src(n * sizeof(uint4)), out(2 * n * sizeof(unsigned));
  gpu::copy_to_device(d_src.data(), src.data(), d_src.size(), test_stream());
  gpu::launch(early_bulk_read_kernel, dim3(1), dim3(n), n * sizeof(uint4), test_stream().handle(), d_src.as<uint4>(),
              out.as<unsigned>());
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(out.as<unsigned>()[2 * i], 0xffffffffu) << i;
    EXPECT_EQ(out.as<unsigned>()[2 * i + 1], static_cast<unsigned>(i)) << i;
  }
}

TEST(Simulator, MbarrierMisuseIsReported) {
  EXPECT_THAT(
      sim_error([] { gpu::launch(mbarrier_deadlock_kernel, dim3(1), dim3(64), 0, test_stream().handle()); }),
      AllOf(HasSubstr("deadlock"), HasSubstr("threads 0-63 (warps 0-1): mbarrier_wait"), HasSubstr("parity 0")));
  gpu::DeviceBuffer src(256);
  EXPECT_THAT(sim_error([&] {
                gpu::launch(misaligned_bulk_copy_kernel, dim3(1), dim3(32), 64, test_stream().handle(),
                            src.as<unsigned char>());
              }),
              HasSubstr("size a positive multiple of 16"));
}

TEST(Simulator, NamedBarrierAndRegisterPoolMisuseIsReported) {
  EXPECT_THAT(sim_error([] { gpu::launch(named_barrier_deadlock_kernel, dim3(1), dim3(64), 0, test_stream().handle()); }),
              AllOf(HasSubstr("deadlock"), HasSubstr("threads 0-31 (warp 0): named_barrier_sync (barrier 2, 64 threads)"),
                    HasSubstr("threads 32-63 (warp 1): named_barrier_sync (barrier 1, 64 threads)")));
  EXPECT_THAT(sim_error([] { gpu::launch(named_barrier_overfull_kernel, dim3(1), dim3(96), 0, test_stream().handle()); }),
              HasSubstr("96 threads wait at named barrier 3, which counts 64"));
  EXPECT_THAT(sim_error([] { gpu::launch(named_barrier_zero_kernel, dim3(1), dim3(32), 0, test_stream().handle()); }),
              HasSubstr("0 is __syncthreads'"));
  EXPECT_THAT(sim_error([] { gpu::launch(register_pool_deadlock_kernel, dim3(1), dim3(384), 0, test_stream().handle()); }),
              AllOf(HasSubstr("deadlock"), HasSubstr("setmaxnreg_inc (to 192 registers a thread, 24 more")));
  EXPECT_THAT(sim_error([] { gpu::launch(partial_setmaxnreg_kernel, dim3(1), dim3(128), 0, test_stream().handle()); }),
              AllOf(HasSubstr("setmaxnreg is warpgroup-wide"), HasSubstr("ended with 120 registers"),
                    HasSubstr("with 248")));
  expect_simulator_healthy();
}

TEST(Simulator, CpAsyncDataLandsAtTheWait) {
  const int n = 32;
  std::vector<uint4> src(n);
  for (int i = 0; i < n; ++i) src[i] = make_uint4(static_cast<unsigned>(i), 0, 0, 0);
  gpu::DeviceBuffer d_src(n * sizeof(uint4)), out(2 * n * sizeof(unsigned));
  gpu::copy_to_device(d_src.data(), src.data(), d_src.size(), test_stream());
  gpu::launch(early_read_kernel, dim3(1), dim3(n), n * sizeof(uint4), test_stream().handle(), d_src.as<uint4>(),
              out.as<unsigned>());
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(out.as<unsigned>()[2 * i], 0xffffffffu) << i;  // the poison of fresh shared memory
    EXPECT_EQ(out.as<unsigned>()[2 * i + 1], static_cast<unsigned>(i)) << i;
  }
}

TEST(Simulator, DynamicSharedMemoryLimits) {
  gpu::DeviceBuffer out(64 * sizeof(float));
  auto run = [&](std::size_t bytes) {
    gpu::launch(smem_limit_kernel, dim3(1), dim3(64), bytes, test_stream().handle(), out.as<float>());
  };
  run(48 * 1024);  // the default limit
  try {
    run(64 * 1024);
    ADD_FAILURE() << "a launch with 64 KB of dynamic shared memory but no attribute was accepted";
  } catch (const dsv4::Error& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("smem_limit_kernel"), HasSubstr("set_max_dynamic_smem")));
  }
  gpu::set_max_dynamic_smem(smem_limit_kernel, 100 * 1024);
  run(64 * 1024);
  run(100 * 1024);
  EXPECT_THROW(run(100 * 1024 + 4), dsv4::Error);
  EXPECT_THROW(gpu::set_max_dynamic_smem(smem_limit_kernel, 227 * 1024 + 1), dsv4::Error);
  gpu::set_max_dynamic_smem(smem_limit_kernel, 227 * 1024);
  run(227 * 1024);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(out.as<float>()[i], static_cast<float>((i + 1) % 64));
  EXPECT_THROW(gpu::launch(smem_limit_kernel, dim3(1), dim3(1025), 0, test_stream().handle(), out.as<float>()),
               dsv4::Error);
  EXPECT_THROW(gpu::launch(smem_limit_kernel, dim3(1, 70000), dim3(32), 0, test_stream().handle(), out.as<float>()),
               dsv4::Error);
}

TEST(Simulator, FreshDeviceBuffersArePoisoned) {
  gpu::DeviceBuffer buffer(1000);
  for (std::size_t i = 0; i < buffer.size(); ++i) ASSERT_EQ(static_cast<unsigned char*>(buffer.data())[i], 0xff);
  EXPECT_TRUE(gpu::simulated());
  EXPECT_EQ(gpu::device_info().name, "simulated H200");
}

TEST(Simulator, BarriersAreCheap) {
  const int blocks = 200;
  gpu::DeviceBuffer out(blocks * 256 * sizeof(int));
  const auto start = std::chrono::steady_clock::now();
  gpu::launch(barriers_kernel, dim3(blocks), dim3(256), 0, test_stream().handle(), out.as<int>());
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / blocks;
  std::printf("a block of 256 threads with 10 barriers: %.3f ms\n", ms);
#if defined(__OPTIMIZE__) && !defined(__SANITIZE_ADDRESS__) && !defined(DSV4_SIM_UCONTEXT)
  EXPECT_LT(ms, 1.0);
#else
  EXPECT_LT(ms, 50.0);  // sanitizers, -O0 or the ucontext fallback
#endif
  for (int t = 0; t < 256; ++t) {
    int want = 0;
    for (int i = 0; i < 5; ++i) want += i + (t + 1) % 256;
    ASSERT_EQ(out.as<int>()[t], want);
  }
}

}  // namespace
