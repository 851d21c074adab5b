// The split-K workspace of the weight-streaming product (gemm_stream.h).
#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>

#include "cuda/kernels/fill.h"
#include "cuda/kernels/gemm_stream.h"
#include "cuda/runtime.h"

namespace dsv4::gpu {
namespace {

struct Workspace {
  DeviceBuffer partial, counters;
  std::int64_t partial_floats = 0, counter_count = 0;
};

struct State {
  std::mutex mutex;
  std::map<gpu_stream_t, Workspace> by_stream;
};

State& state() {
  static State* s = new State;  // lives to the end of the process (the CUDA context may be gone at exit)
  return *s;
}

std::int64_t round_up_pow2(std::int64_t v, std::int64_t floor) {
  std::int64_t p = floor;
  while (p < v) p *= 2;
  return p;
}

}  // namespace

StreamWorkspace stream_workspace(gpu_stream_t stream, std::int64_t partial_floats, std::int64_t counters) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.by_stream.count(stream) == 0 && s.by_stream.size() >= 8) {
    // Streams come and go with executors (tests make many): free the others' workspaces once the
    // work that may use them is done.
    synchronize_device();
    s.by_stream.clear();
  }
  Workspace& w = s.by_stream[stream];
  if (w.partial_floats < partial_floats || w.counter_count < counters) {
    synchronize_device();  // products in flight may still use the old buffers
    w.partial_floats = round_up_pow2(std::max(partial_floats, w.partial_floats), std::int64_t{1} << 18);
    w.counter_count = round_up_pow2(std::max(counters, w.counter_count), std::int64_t{1} << 12);
    w.partial = DeviceBuffer(static_cast<std::size_t>(w.partial_floats) * sizeof(float));
    w.counters = DeviceBuffer(static_cast<std::size_t>(w.counter_count) * sizeof(std::int32_t));
    fill_const_u8(w.counters.as<std::uint8_t>(), w.counter_count * static_cast<std::int64_t>(sizeof(std::int32_t)), 0, stream);
  }
  return StreamWorkspace{w.partial.as<float>(), w.counters.as<std::int32_t>()};
}

int stream_sm_count() {
  static const int count = std::max(1, device_info().sm_count);
  return count;
}

}  // namespace dsv4::gpu
