// Programmatic dependent launch (sm_90), for chains of short kernels whose launch gaps matter
// (the indexer's scores and top-k passes).
//
// launch_dependent launches `kernel` as gpu::launch does, but lets it start while the kernel
// before it in the stream is still running: once that kernel has called grid_dependents_launch in
// every CTA, or finished. Until its grid_dependency_wait -- which returns when the kernel before
// has finished and its writes are visible -- a kernel launched so may only read what was complete
// before that kernel began (the step's tables, the weights, the outputs of kernels two or more
// back, provided every kernel calls grid_dependency_wait before grid_dependents_launch), and must
// write nothing that another kernel reads. CUDA graphs captured from the stream keep these edges.
// DSV4_DEPENDENT_LAUNCH=0 in the environment makes every dependent launch a plain one (the two
// calls then return at once), to measure what the overlap gives. In the simulator launches run
// one after another: a dependent launch is a plain one and the two calls do nothing.
#pragma once

#include <cstddef>
#include <utility>

#include "cuda/device.h"

namespace dsv4::gpu {

#if defined(__CUDACC__)

__device__ __forceinline__ void grid_dependency_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void grid_dependents_launch() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

template <class... P, class... A>
void launch_dependent(void (*kernel)(P...), dim3 grid, dim3 block, std::size_t smem_bytes, gpu_stream_t stream,
                      A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "gpu::launch_dependent: wrong number of kernel arguments");
  if (!dependent_launch_enabled()) {
    launch(kernel, grid, block, smem_bytes, stream, std::forward<A>(args)...);
    return;
  }
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  detail::launch_with(attribute, kernel, grid, block, smem_bytes, stream, std::forward<A>(args)...);
}

#else

inline void grid_dependency_wait() {}
inline void grid_dependents_launch() {}

template <class... P, class... A>
void launch_dependent(void (*kernel)(P...), dim3 grid, dim3 block, std::size_t smem_bytes, gpu_stream_t stream,
                      A&&... args) {
  launch(kernel, grid, block, smem_bytes, stream, std::forward<A>(args)...);
}

#endif

}  // namespace dsv4::gpu
