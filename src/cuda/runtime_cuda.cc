// The host runtime on the CUDA runtime API. Every call is checked; a failure throws dsv4::Error
// naming the call and CUDA's error name and string.
#include <cuda_runtime.h>
#include <cxxabi.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "common/error.h"
#include "cuda/runtime.h"

namespace dsv4::gpu {
namespace {

void check(cudaError_t err, const char* call) {
  if (err != cudaSuccess) {
    fail("{} failed: {} ({})", call, cudaGetErrorName(err), cudaGetErrorString(err));
  }
}
#define DSV4_CUDA_CHECK(expr) check((expr), #expr)

cudaStream_t raw(const Stream& s) { return s.handle(); }

// The kernel's demangled name, or its address when CUDA cannot name it.
std::string kernel_name(const void* kernel) {
  const char* mangled = nullptr;
  if (cudaFuncGetName(&mangled, kernel) != cudaSuccess || mangled == nullptr) {
    (void)cudaGetLastError();
    return fmt::format("kernel at {}", kernel);
  }
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(abi::__cxa_demangle(mangled, nullptr, nullptr, &status),
                                                   std::free);
  return status == 0 && demangled ? std::string(demangled.get()) : std::string(mangled);
}

// Throws the allocation error with the requested and free byte counts.
[[noreturn]] void allocation_failed(cudaError_t err, const char* call, std::size_t bytes) {
  (void)cudaGetLastError();  // clear the (non-sticky) error
  std::size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
    (void)cudaGetLastError();
    fail("{} failed: {} ({}): requested {} bytes", call, cudaGetErrorName(err), cudaGetErrorString(err), bytes);
  }
  if (err == cudaErrorMemoryAllocation) {
    fail("{}: out of memory: requested {} bytes, {} bytes free of {}", call, bytes, free, total);
  }
  fail("{} failed: {} ({}): requested {} bytes, {} bytes free of {}", call, cudaGetErrorName(err),
       cudaGetErrorString(err), bytes, free, total);
}

}  // namespace

bool simulated() { return false; }

DeviceInfo device_info() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    fail("no CUDA device: cudaGetDeviceCount: {} ({})", cudaGetErrorName(err), cudaGetErrorString(err));
  }
  if (count == 0) fail("no CUDA device: cudaGetDeviceCount found none");
  int device = 0;
  DSV4_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  DSV4_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  auto attribute = [device](cudaDeviceAttr attr, const char* what) {
    int value = 0;
    check(cudaDeviceGetAttribute(&value, attr, device), what);
    return value;
  };
  DeviceInfo info;
  info.name = prop.name;
  info.sm_count = attribute(cudaDevAttrMultiProcessorCount, "cudaDeviceGetAttribute(MultiProcessorCount)");
  info.cc_major = attribute(cudaDevAttrComputeCapabilityMajor, "cudaDeviceGetAttribute(ComputeCapabilityMajor)");
  info.cc_minor = attribute(cudaDevAttrComputeCapabilityMinor, "cudaDeviceGetAttribute(ComputeCapabilityMinor)");
  info.l2_bytes = attribute(cudaDevAttrL2CacheSize, "cudaDeviceGetAttribute(L2CacheSize)");
  info.max_smem_optin =
      attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
  std::size_t free = 0, total = 0;
  DSV4_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  info.free_bytes = static_cast<std::int64_t>(free);
  info.total_bytes = static_cast<std::int64_t>(total);
  return info;
}

// ---- DeviceBuffer
DeviceBuffer::DeviceBuffer(std::size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  cudaError_t err = cudaMalloc(&data_, bytes);
  if (err != cudaSuccess) {
    data_ = nullptr;
    allocation_failed(err, "cudaMalloc", bytes);
  }
}
DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) (void)cudaFree(data_);  // destructors must not throw
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) (void)cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

// ---- PinnedBuffer
PinnedBuffer::PinnedBuffer(std::size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  cudaError_t err = cudaMallocHost(&data_, bytes);
  if (err != cudaSuccess) {
    data_ = nullptr;
    (void)cudaGetLastError();
    fail("cudaMallocHost failed: {} ({}): requested {} bytes of page-locked host memory", cudaGetErrorName(err),
         cudaGetErrorString(err), bytes);
  }
}
PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) (void)cudaFreeHost(data_);
}
PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) (void)cudaFreeHost(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

// ---- Stream
Stream::Stream() {
  cudaStream_t s = nullptr;
  DSV4_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  handle_ = s;
}
Stream::~Stream() {
  if (handle_ != nullptr) (void)cudaStreamDestroy(handle_);
}
Stream::Stream(Stream&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) (void)cudaStreamDestroy(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}
void Stream::synchronize() { DSV4_CUDA_CHECK(cudaStreamSynchronize(handle_)); }

// ---- Event
Event::Event() {
  cudaEvent_t e = nullptr;
  DSV4_CUDA_CHECK(cudaEventCreate(&e));
  handle_ = e;
}
Event::~Event() {
  if (handle_ != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(handle_));
}
Event::Event(Event&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(handle_));
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}
void Event::record(const Stream& stream) {
  DSV4_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(handle_), raw(stream)));
}
void Event::record_in_graph(const Stream& stream) {
  DSV4_CUDA_CHECK(cudaEventRecordWithFlags(static_cast<cudaEvent_t>(handle_), raw(stream), cudaEventRecordExternal));
}
void Event::wait(const Stream& other) const {
  DSV4_CUDA_CHECK(cudaStreamWaitEvent(raw(other), static_cast<cudaEvent_t>(handle_), 0));
}
void Event::synchronize() { DSV4_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_))); }
float Event::elapsed_ms(const Event& start, const Event& end) {
  float ms = 0;
  DSV4_CUDA_CHECK(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.handle_), static_cast<cudaEvent_t>(end.handle_)));
  return ms;
}

// ---- copies
void copy_to_device(void* dst, const void* src, std::size_t bytes, const Stream& stream) {
  if (bytes == 0) return;
  DSV4_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, raw(stream)));
}
void copy_to_host(void* dst, const void* src, std::size_t bytes, const Stream& stream) {
  if (bytes == 0) return;
  DSV4_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, raw(stream)));
}
void copy_on_device(void* dst, const void* src, std::size_t bytes, const Stream& stream) {
  if (bytes == 0) return;
  DSV4_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, raw(stream)));
}
void fill_bytes(void* dst, int value, std::size_t bytes, const Stream& stream) {
  if (bytes == 0) return;
  DSV4_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, raw(stream)));
}
void synchronize_device() { DSV4_CUDA_CHECK(cudaDeviceSynchronize()); }

// ---- Graph
void Graph::reset() {
  if (exec_ != nullptr) (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_ != nullptr) (void)cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  exec_ = nullptr;
  graph_ = nullptr;
}
Graph::~Graph() { reset(); }
Graph::Graph(Graph&& other) noexcept
    : graph_(std::exchange(other.graph_, nullptr)), exec_(std::exchange(other.exec_, nullptr)) {}
Graph& Graph::operator=(Graph&& other) noexcept {
  if (this != &other) {
    reset();
    graph_ = std::exchange(other.graph_, nullptr);
    exec_ = std::exchange(other.exec_, nullptr);
  }
  return *this;
}
void Graph::begin_capture(const Stream& stream) {
  reset();
  DSV4_CUDA_CHECK(cudaStreamBeginCapture(raw(stream), cudaStreamCaptureModeThreadLocal));
}
void Graph::end_capture(const Stream& stream) {
  cudaGraph_t graph = nullptr;
  DSV4_CUDA_CHECK(cudaStreamEndCapture(raw(stream), &graph));
  graph_ = graph;
  cudaGraphExec_t exec = nullptr;
  DSV4_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  exec_ = exec;
}
void Graph::replay(const Stream& stream) {
  if (exec_ == nullptr) fail("Graph::replay: no graph captured");
  DSV4_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), raw(stream)));
}

// ---- dependent launches (kernels/dependent_launch.cuh)
bool dependent_launch_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("DSV4_DEPENDENT_LAUNCH");
    return env == nullptr || std::string_view(env) != "0";
  }();
  return enabled;
}

// ---- launch errors (cuda/device.h)
namespace detail {
void launch_failed(const void* kernel, int cuda_error, const unsigned (&grid)[3], const unsigned (&block)[3],
                   std::size_t smem_bytes) {
  const auto err = static_cast<cudaError_t>(cuda_error);
  fail("kernel launch failed: {} with grid ({}, {}, {}), block ({}, {}, {}), {} bytes of dynamic shared memory: {} ({})",
       kernel_name(kernel), grid[0], grid[1], grid[2], block[0], block[1], block[2], smem_bytes,
       cudaGetErrorName(err), cudaGetErrorString(err));
}
void set_max_dynamic_smem_failed(const void* kernel, int cuda_error, std::size_t bytes) {
  const auto err = static_cast<cudaError_t>(cuda_error);
  fail("cudaFuncSetAttribute(MaxDynamicSharedMemorySize = {}) failed for {}: {} ({})", bytes, kernel_name(kernel),
       cudaGetErrorName(err), cudaGetErrorString(err));
}
}  // namespace detail

}  // namespace dsv4::gpu
