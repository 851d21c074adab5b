// Applies a step's page-table updates to the device page tables (executor/page_table.h on the
// GPU): entry [group, index, page] sets page_table[group][index] = page.
#pragma once

#include <cstdint>

#include "cuda/device_step.h"
#include "cuda/stream_handle.h"

namespace dsv4::gpu {

// `count` = the step's page_updates (known on the host when the step is packed).
void apply_page_updates(const DeviceStep* step, std::int32_t count, gpu_stream_t stream);

}  // namespace dsv4::gpu
