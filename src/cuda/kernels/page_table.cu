// Device page-table updates (page_table.h).
#include "cuda/kernels/page_table.h"

#include "cuda/device.h"

namespace dsv4::gpu {
namespace {

__global__ void page_update_kernel(const DeviceStep* step) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= step->page_updates) return;
  const std::int32_t* u = step->page_update + 3 * i;
  const_cast<std::int32_t*>(step->groups[u[0]].page_table)[u[1]] = u[2];
}

}  // namespace

void apply_page_updates(const DeviceStep* step, std::int32_t count, gpu_stream_t stream) {
  if (count <= 0) return;
  launch(page_update_kernel, dim3(static_cast<unsigned>((count + 255) / 256)), dim3(256), 0, stream, step);
}

}  // namespace dsv4::gpu
