// The SIMT simulator: CUDA's kernel language for the host compiler, so a .cu file compiled with
// DSV4_SIM=1 by g++ runs its kernels on the CPU. Included by cuda/device.h; kernels use only what
// device.h documents. How it works (simt.cc has the details):
//
//  * A launch runs the grid block by block (blockIdx.x fastest, then y, z) on the calling OS thread.
//    The threads of a block are fibers (user-space contexts with their own stacks). A fiber runs
//    until it reaches a barrier or a warp collective, or returns; then the next one runs.
//  * __syncthreads releases when every thread of the block that has not exited waits at it; all of
//    them must wait at the same __syncthreads (same source line), otherwise the simulator reports
//    barrier divergence. A named barrier (named_barrier_sync) releases when as many threads wait at
//    its id as it counts. Warp collectives (__syncwarp, shuffles, votes, reduces, match, mma)
//    release when every lane of the mask that has not exited waits at the same kind of collective
//    with the same mask. When nothing can run, the simulator reports a deadlock (or divergent
//    collectives) with where every thread waits.
//  * Errors (deadlock, divergence, DSV4_DEVICE_ASSERT, misuse of a primitive) print a message
//    naming the kernel, block and thread and abort, or throw SimError in ErrorMode::kThrow.
//  * __shared__ variables are function-local statics: one copy that all threads of the running
//    block share (blocks never run at the same time, except the blocks of a cluster, which would
//    share it too: a kernel launched in clusters keeps its shared data in dynamic shared memory).
//    Dynamic shared memory is refilled with 0xFF bytes before every block, so reading what no
//    thread wrote gives NaN. The blocks of a cluster (launch_cluster) run together.
#pragma once

#if !defined(DSV4_SIM)
#error "cuda/sim/simt.h is the simulator's half of cuda/device.h; include cuda/device.h with DSV4_SIM=1"
#endif

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <source_location>
#include <type_traits>

#include "common/error.h"
#include "cuda/sim/sim_math.h"
#include "cuda/sim/sim_types.h"
#include "cuda/stream_handle.h"

// ---- keywords ----
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __shared__ static
#define __constant__
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __grid_constant__
// __restrict__ is a GNU keyword already.

constexpr int warpSize = 32;

namespace dsv4::gpu::sim {

// Thrown instead of aborting in ErrorMode::kThrow.
class SimError : public dsv4::Error {
 public:
  using dsv4::Error::Error;
};

// kAbort (the default): print the report to stderr and abort, inside the failing fiber where
// possible so a debugger shows the kernel's stack. kThrow: the launch throws SimError; the
// failed launch's fibers are abandoned (their stack objects are never destroyed).
enum class ErrorMode { kAbort, kThrow };
void set_error_mode(ErrorMode mode);
ErrorMode error_mode();

// Sets the error mode for a scope (tests).
class ScopedErrorMode {
 public:
  explicit ScopedErrorMode(ErrorMode mode) : saved_(error_mode()) { set_error_mode(mode); }
  ~ScopedErrorMode() { set_error_mode(saved_); }
  ScopedErrorMode(const ScopedErrorMode&) = delete;
  ScopedErrorMode& operator=(const ScopedErrorMode&) = delete;

 private:
  ErrorMode saved_;
};

// The built-in variables of the running simulated thread.
struct Builtins {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};
inline thread_local const Builtins* t_builtins = nullptr;
[[noreturn]] void outside_kernel(const char* what);
inline const Builtins& builtins(const char* what) {
  if (t_builtins == nullptr) [[unlikely]]
    outside_kernel(what);
  return *t_builtins;
}

using Location = std::source_location;

// ---- the primitives behind the CUDA names below (simt.cc) ----
enum class BarrierOp { kSync, kCount, kAnd, kOr };
int block_barrier(BarrierOp op, int pred, const Location& loc);
void syncwarp(unsigned mask, const Location& loc);
// bar.sync id, threads: releases when `threads` threads (whole warps) wait at barrier id (1..15).
inline constexpr unsigned kNamedBarriers = 16;
void named_barrier_sync(unsigned id, unsigned threads, const Location& loc);
// setmaxnreg: a block starts with R registers a thread, R = 64K / its threads rounded up to whole
// warps, down to a multiple of 8, at most 255 (what a kernel whose __launch_bounds__ names its block
// size gets), and an empty pool. A decrease to `regs` adds (current - regs) to the pool; an
// increase waits until the pool holds (regs - current) and takes them (a deadlock when no
// decrease will free them: the registers the launch left unallocated are not in the pool). Every
// thread of a warpgroup must make the same calls (checked when the block ends).
void setmaxnreg(unsigned regs, bool increase, const Location& loc);
enum class ShflMode { kIdx, kUp, kDown, kXor };
std::uint64_t shfl(ShflMode mode, unsigned mask, std::uint64_t bits, int lane_arg, int width, const Location& loc);
enum class VoteMode { kBallot, kAny, kAll };
unsigned vote(VoteMode mode, unsigned mask, int pred, const Location& loc);
enum class ReduceOp { kAdd, kMinU, kMaxU, kMinS, kMaxS, kAnd, kOr, kXor };
unsigned reduce(ReduceOp op, unsigned mask, unsigned value, const Location& loc);
unsigned match_any(unsigned mask, std::uint64_t value, const Location& loc);
unsigned match_all(unsigned mask, std::uint64_t value, int* pred, const Location& loc);
void mma_m16n8k32_e4m3(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2],
                       const float (&c)[4], const Location& loc);
void mma_m16n8k16_bf16(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2],
                       const float (&c)[4], const Location& loc);
// cp.async: the 16 source bytes are read at issue time and land in shared memory when the
// issuing thread waits for their group (cp_async_wait), as late as the hardware may deliver them.
void cp_async_16(void* smem, const void* gmem, bool valid, const Location& loc);
// A vector load of `bytes` (8 or 16) from global memory: the address must be aligned to its size.
void vector_load(void* dst, const void* gmem, unsigned bytes, const Location& loc);
void cp_async_commit();
void cp_async_wait(int pending_groups);  // < 0: wait for all, committed or not
// mbarriers and bulk copies (Hopper's cp.async.bulk into shared memory, completing a transaction
// count on an mbarrier): the source bytes are read at issue time; the phase completes with all
// expected arrivals and transaction bytes, and its copies land in shared memory when a thread's
// wait first sees it complete, so a read with no wait before it sees the old contents. A wait
// blocks the thread until the phase of the given parity has completed.
void mbarrier_init(std::uint64_t* bar, unsigned count, const Location& loc);
void mbarrier_arrive(std::uint64_t* bar, unsigned tx_bytes, const Location& loc);
void bulk_copy_to_shared(void* smem, const void* gmem, unsigned bytes, std::uint64_t* bar, const Location& loc);
void mbarrier_wait(std::uint64_t* bar, unsigned parity, const Location& loc);
unsigned char* dynamic_smem();
// Thread block clusters: the blocks of a cluster run together (their threads interleave), each
// with its own dynamic shared memory. cluster_map gives the address at the same offset in block
// `rank`'s dynamic shared memory (the pointer must be into the caller's); mbarrier_arrive_remote
// arrives on the barrier at that offset in block `rank`. cluster_sync waits until every thread of
// the cluster that has not exited waits at it.
unsigned cluster_rank(const Location& loc);
unsigned cluster_blocks(const Location& loc);
void cluster_sync(const Location& loc);
void* cluster_map(const void* smem, unsigned rank, const Location& loc);
void mbarrier_arrive_remote(std::uint64_t* bar, unsigned rank, const Location& loc);
// wgmma bookkeeping (device.h's models compute the products at issue): the operands a warpgroup's
// product names -- the 128-byte core matrices of its descriptors, `rows` 8-row groups of B (N / 8)
// and two K groups each -- must stay unchanged from the first thread's issue to the last thread's
// wait; a change is reported (the GPU reads them asynchronously in between), and so is a product
// that not every thread of the warpgroup issued. Products are matched across the warpgroup's
// threads by their place in the thread's sequence of commit groups. desc_a = kRegisterA: A comes
// from registers (only B is checked).
inline constexpr std::uint64_t kRegisterA = ~std::uint64_t{0};
void wgmma_issue(std::uint64_t desc_a, std::uint64_t desc_b, int b_row_groups, const Location& loc);
void wgmma_commit();
void wgmma_wait(int pending_groups, const Location& loc);
[[noreturn]] void device_assert_failed(const char* condition, const char* file, int line);
[[noreturn]] void trap(const Location& loc);

template <class T>
inline T shfl_as(ShflMode mode, unsigned mask, T value, int lane_arg, int width, const Location& loc) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  std::uint64_t bits = 0;
  std::memcpy(&bits, static_cast<const void*>(&value), sizeof(T));
  bits = shfl(mode, mask, bits, lane_arg, width, loc);
  T out;
  std::memcpy(static_cast<void*>(&out), &bits, sizeof(T));
  return out;
}
template <class T>
inline std::uint64_t bits_of(T value) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  std::uint64_t bits = 0;
  std::memcpy(&bits, static_cast<const void*>(&value), sizeof(T));
  return bits;
}

// ---- launches ----
using KernelId = void (*)();
struct LaunchRequest {
  KernelId kernel;
  dim3 grid;
  dim3 block;
  std::size_t smem_bytes;
  void (*body)(void*);  // runs the kernel for the current simulated thread
  void* context;
  unsigned cluster = 1;  // blocks per cluster, along x (1 to 8, dividing grid.x)
};
// Runs the whole grid before returning. Throws dsv4::Error for an invalid launch (as the real
// launch would), and reports kernel bugs per the error mode.
void run_grid(const LaunchRequest& request);
void set_max_dynamic_smem(KernelId kernel, std::size_t bytes);

}  // namespace dsv4::gpu::sim

// ---- built-in variables ----
#define threadIdx (::dsv4::gpu::sim::builtins("threadIdx").thread_idx)
#define blockIdx (::dsv4::gpu::sim::builtins("blockIdx").block_idx)
#define blockDim (::dsv4::gpu::sim::builtins("blockDim").block_dim)
#define gridDim (::dsv4::gpu::sim::builtins("gridDim").grid_dim)

// ---- barriers and fences ----
// The source location parameters are the simulator's: they name the call site in reports.
inline void __syncthreads(std::source_location loc = std::source_location::current()) {
  dsv4::gpu::sim::block_barrier(dsv4::gpu::sim::BarrierOp::kSync, 0, loc);
}
inline int __syncthreads_count(int pred, std::source_location loc = std::source_location::current()) {
  return dsv4::gpu::sim::block_barrier(dsv4::gpu::sim::BarrierOp::kCount, pred, loc);
}
inline int __syncthreads_and(int pred, std::source_location loc = std::source_location::current()) {
  return dsv4::gpu::sim::block_barrier(dsv4::gpu::sim::BarrierOp::kAnd, pred, loc);
}
inline int __syncthreads_or(int pred, std::source_location loc = std::source_location::current()) {
  return dsv4::gpu::sim::block_barrier(dsv4::gpu::sim::BarrierOp::kOr, pred, loc);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, std::source_location loc = std::source_location::current()) {
  dsv4::gpu::sim::syncwarp(mask, loc);
}
// One OS thread runs every simulated thread in program order between switches: fences are no-ops.
inline void __threadfence() {}
inline void __threadfence_block() {}
inline void __threadfence_system() {}
[[noreturn]] inline void __trap(std::source_location loc = std::source_location::current()) {
  dsv4::gpu::sim::trap(loc);
}

// ---- shuffles (PTX shfl.sync semantics, including width segments and out-of-range lanes) ----
#define DSV4_SIM_SHFL(T)                                                                                \
  inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = warpSize,                         \
                       std::source_location loc = std::source_location::current()) {                    \
    return dsv4::gpu::sim::shfl_as(dsv4::gpu::sim::ShflMode::kIdx, mask, var, srcLane, width, loc);      \
  }                                                                                                     \
  inline T __shfl_up_sync(unsigned mask, T var, unsigned int delta, int width = warpSize,               \
                          std::source_location loc = std::source_location::current()) {                 \
    return dsv4::gpu::sim::shfl_as(dsv4::gpu::sim::ShflMode::kUp, mask, var, static_cast<int>(delta),    \
                                   width, loc);                                                         \
  }                                                                                                     \
  inline T __shfl_down_sync(unsigned mask, T var, unsigned int delta, int width = warpSize,             \
                            std::source_location loc = std::source_location::current()) {               \
    return dsv4::gpu::sim::shfl_as(dsv4::gpu::sim::ShflMode::kDown, mask, var, static_cast<int>(delta),  \
                                   width, loc);                                                         \
  }                                                                                                     \
  inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = warpSize,                    \
                           std::source_location loc = std::source_location::current()) {                \
    return dsv4::gpu::sim::shfl_as(dsv4::gpu::sim::ShflMode::kXor, mask, var, laneMask, width, loc);     \
  }
DSV4_SIM_SHFL(int)
DSV4_SIM_SHFL(unsigned int)
DSV4_SIM_SHFL(long)
DSV4_SIM_SHFL(unsigned long)
DSV4_SIM_SHFL(long long)
DSV4_SIM_SHFL(unsigned long long)
DSV4_SIM_SHFL(float)
DSV4_SIM_SHFL(double)
DSV4_SIM_SHFL(__nv_bfloat16)
DSV4_SIM_SHFL(__nv_bfloat162)
#undef DSV4_SIM_SHFL

// ---- votes ----
inline unsigned __ballot_sync(unsigned mask, int pred, std::source_location loc = std::source_location::current()) {
  return dsv4::gpu::sim::vote(dsv4::gpu::sim::VoteMode::kBallot, mask, pred, loc);
}
inline int __any_sync(unsigned mask, int pred, std::source_location loc = std::source_location::current()) {
  return static_cast<int>(dsv4::gpu::sim::vote(dsv4::gpu::sim::VoteMode::kAny, mask, pred, loc));
}
inline int __all_sync(unsigned mask, int pred, std::source_location loc = std::source_location::current()) {
  return static_cast<int>(dsv4::gpu::sim::vote(dsv4::gpu::sim::VoteMode::kAll, mask, pred, loc));
}

// ---- warp reduces (sm_80) ----
inline unsigned __reduce_add_sync(unsigned mask, unsigned value,
                                  std::source_location loc = std::source_location::current()) {
  return dsv4::gpu::sim::reduce(dsv4::gpu::sim::ReduceOp::kAdd, mask, value, loc);
}
inline int __reduce_add_sync(unsigned mask, int value, std::source_location loc = std::source_location::current()) {
  return static_cast<int>(
      dsv4::gpu::sim::reduce(dsv4::gpu::sim::ReduceOp::kAdd, mask, static_cast<unsigned>(value), loc));
}
inline unsigned __reduce_min_sync(unsigned mask, unsigned value,
                                  std::source_location loc = std::source_location::current()) {
  return dsv4::gpu::sim::reduce(dsv4::gpu::sim::ReduceOp::kMinU, mask, value, loc);
}
inline int __reduce_min_sync(unsigned mask, int value, std::source_location loc = std::source_location::current()) {
  return static_cast<int>(
      dsv4::gpu::sim::reduce(dsv4::gpu::sim::ReduceOp::kMinS, mask, static_cast<unsigned>(value), loc));
}
inline unsigned __reduce_max_sync(unsigned mask, unsigned value,
                                  std::source_location loc = std::source_location::current()) {
  return dsv4::gpu::sim::reduce(dsv4::gpu::sim::ReduceOp::kMaxU, mask, value, loc);
}
inline int __reduce_max_sync(unsigned mask, int value, std::source_location loc = std::source_location::current()) {
  return static_cast<int>(
      dsv4::gpu::sim::reduce(dsv4::gpu::sim::ReduceOp::kMaxS, mask, static_cast<unsigned>(value), loc));
}
inline unsigned __reduce_and_sync(unsigned mask, unsigned value,
                                  std::source_location loc = std::source_location::current()) {
  return dsv4::gpu::sim::reduce(dsv4::gpu::sim::ReduceOp::kAnd, mask, value, loc);
}
inline unsigned __reduce_or_sync(unsigned mask, unsigned value,
                                 std::source_location loc = std::source_location::current()) {
  return dsv4::gpu::sim::reduce(dsv4::gpu::sim::ReduceOp::kOr, mask, value, loc);
}
inline unsigned __reduce_xor_sync(unsigned mask, unsigned value,
                                  std::source_location loc = std::source_location::current()) {
  return dsv4::gpu::sim::reduce(dsv4::gpu::sim::ReduceOp::kXor, mask, value, loc);
}

// ---- match (sm_70) ----
#define DSV4_SIM_MATCH(T)                                                                                   \
  inline unsigned __match_any_sync(unsigned mask, T value,                                                  \
                                   std::source_location loc = std::source_location::current()) {            \
    return dsv4::gpu::sim::match_any(mask, dsv4::gpu::sim::bits_of(value), loc);                             \
  }                                                                                                         \
  inline unsigned __match_all_sync(unsigned mask, T value, int* pred,                                       \
                                   std::source_location loc = std::source_location::current()) {            \
    return dsv4::gpu::sim::match_all(mask, dsv4::gpu::sim::bits_of(value), pred, loc);                       \
  }
DSV4_SIM_MATCH(int)
DSV4_SIM_MATCH(unsigned int)
DSV4_SIM_MATCH(long)
DSV4_SIM_MATCH(unsigned long)
DSV4_SIM_MATCH(long long)
DSV4_SIM_MATCH(unsigned long long)
DSV4_SIM_MATCH(float)
DSV4_SIM_MATCH(double)
#undef DSV4_SIM_MATCH
