// The host runtime for the SIMT simulator: device memory is host memory, streams are tokens and
// every "asynchronous" operation completes before the call returns (kernel launches in the
// simulator are synchronous too), so stream order always holds.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>

#include "common/error.h"
#include "cuda/runtime.h"

// The simulator's stream object: nothing to hold, only an identity.
struct CUstream_st {
  int unused = 0;
};

namespace dsv4::gpu {
namespace {

constexpr std::int64_t kSimTotalBytes = 141'000'000'000;
constexpr std::size_t kPoisonLimit = std::size_t{1} << 30;  // fill new buffers up to 1 GiB

std::mutex g_alloc_mutex;
std::int64_t g_allocated = 0;  // bytes of live DeviceBuffers

void* alloc_device(std::size_t bytes) {
  {
    std::lock_guard lock(g_alloc_mutex);
    const std::int64_t free = kSimTotalBytes - g_allocated;
    if (static_cast<std::int64_t>(bytes) > free) {
      fail("device allocation (simulated): out of memory: requested {} bytes, {} bytes free", bytes, free);
    }
    g_allocated += static_cast<std::int64_t>(bytes);
  }
  // cudaMalloc returns 256-byte aligned memory; aligned_alloc needs a multiple of the alignment.
  const std::size_t rounded = (bytes + 255) / 256 * 256;
  void* p = std::aligned_alloc(256, rounded);
  if (p == nullptr) {
    std::lock_guard lock(g_alloc_mutex);
    g_allocated -= static_cast<std::int64_t>(bytes);
    fail("device allocation (simulated): out of host memory: requested {} bytes", bytes);
  }
  if (rounded <= kPoisonLimit) std::memset(p, 0xFF, rounded);
  return p;
}

void free_device(void* p, std::size_t bytes) {
  if (p == nullptr) return;
  std::free(p);
  std::lock_guard lock(g_alloc_mutex);
  g_allocated -= static_cast<std::int64_t>(bytes);
}

using Clock = std::chrono::steady_clock;

}  // namespace

bool simulated() { return true; }
bool dependent_launch_enabled() { return false; }  // launches run one after another

DeviceInfo device_info() {
  DeviceInfo info;
  info.name = "simulated H200";
  info.sm_count = 132;
  info.cc_major = 9;
  info.cc_minor = 0;
  info.total_bytes = kSimTotalBytes;
  {
    std::lock_guard lock(g_alloc_mutex);
    info.free_bytes = kSimTotalBytes - g_allocated;
  }
  info.l2_bytes = 50 * 1024 * 1024;
  info.max_smem_optin = 227 * 1024;
  return info;
}

// ---- DeviceBuffer
DeviceBuffer::DeviceBuffer(std::size_t bytes) : size_(bytes) {
  if (bytes > 0) data_ = alloc_device(bytes);
}
DeviceBuffer::~DeviceBuffer() { free_device(data_, size_); }
DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    free_device(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

// ---- PinnedBuffer
PinnedBuffer::PinnedBuffer(std::size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  data_ = std::malloc(bytes);
  if (data_ == nullptr) fail("pinned allocation (simulated): out of host memory: requested {} bytes", bytes);
}
PinnedBuffer::~PinnedBuffer() { std::free(data_); }
PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

// ---- Stream
Stream::Stream() : handle_(new CUstream_st) {}
Stream::~Stream() { delete handle_; }
Stream::Stream(Stream&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    delete handle_;
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}
void Stream::synchronize() {}

// ---- Event: the time point of its last record().
Event::Event() : handle_(new Clock::time_point(Clock::now())) {}
Event::~Event() { delete static_cast<Clock::time_point*>(handle_); }
Event::Event(Event&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    delete static_cast<Clock::time_point*>(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}
void Event::record(const Stream&) { *static_cast<Clock::time_point*>(handle_) = Clock::now(); }
void Event::record_in_graph(const Stream& stream) { record(stream); }
void Event::wait(const Stream&) const {}
void Event::synchronize() {}
float Event::elapsed_ms(const Event& start, const Event& end) {
  const auto a = *static_cast<const Clock::time_point*>(start.handle_);
  const auto b = *static_cast<const Clock::time_point*>(end.handle_);
  return std::chrono::duration<float, std::milli>(b - a).count();
}

// ---- copies
void copy_to_device(void* dst, const void* src, std::size_t bytes, const Stream&) {
  if (bytes > 0) std::memmove(dst, src, bytes);
}
void copy_to_host(void* dst, const void* src, std::size_t bytes, const Stream&) {
  if (bytes > 0) std::memmove(dst, src, bytes);
}
void copy_on_device(void* dst, const void* src, std::size_t bytes, const Stream&) {
  if (bytes > 0) std::memmove(dst, src, bytes);
}
void fill_bytes(void* dst, int value, std::size_t bytes, const Stream&) {
  if (bytes > 0) std::memset(dst, value, bytes);
}
void synchronize_device() {}

// ---- Graph
Graph::~Graph() = default;
Graph::Graph(Graph&& other) noexcept
    : graph_(std::exchange(other.graph_, nullptr)), exec_(std::exchange(other.exec_, nullptr)) {}
Graph& Graph::operator=(Graph&& other) noexcept {
  graph_ = std::exchange(other.graph_, nullptr);
  exec_ = std::exchange(other.exec_, nullptr);
  return *this;
}
void Graph::reset() {}
void Graph::begin_capture(const Stream&) { fail("CUDA graphs are not simulated"); }
void Graph::end_capture(const Stream&) { fail("CUDA graphs are not simulated"); }
void Graph::replay(const Stream&) { fail("CUDA graphs are not simulated"); }

}  // namespace dsv4::gpu
