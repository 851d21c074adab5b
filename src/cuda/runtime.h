// Host side of the GPU: devices, memory, streams, events, copies, graphs. Plain C++ (no CUDA
// headers), so any host code can use it. Two implementations with the same interface:
// runtime_cuda.cc (the CUDA runtime; library dsv4_gpu_runtime) and runtime_sim.cc (host memory
// for the SIMT simulator; dsv4_gpu_runtime_sim), where every "asynchronous" call completes at once.
// Every failing CUDA call throws dsv4::Error naming the call and CUDA's error string.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cuda/stream_handle.h"

namespace dsv4::gpu {

// True in the simulator build.
bool simulated();

struct DeviceInfo {
  std::string name;
  int sm_count = 0;
  int cc_major = 0;
  int cc_minor = 0;
  std::int64_t total_bytes = 0;
  std::int64_t free_bytes = 0;
  std::int64_t l2_bytes = 0;
  std::int64_t max_smem_optin = 0;  // dynamic shared memory per block after set_max_dynamic_smem
};

// The current device. Throws dsv4::Error("no CUDA device: ...") when there is none. The simulator
// describes a "simulated H200" with 141e9 bytes.
DeviceInfo device_info();

// Device memory (cudaMalloc; 256-byte aligned). Move-only; freed on destruction. The simulator
// fills new buffers up to 1 GiB with 0xFF bytes (NaN as float or bf16), like uninitialized memory.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() { return data_; }
  const void* data() const { return data_; }
  template <class T>
  T* as() {
    return static_cast<T*>(data_);
  }
  template <class T>
  const T* as() const {
    return static_cast<const T*>(data_);
  }
  std::size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

// Page-locked host memory (cudaMallocHost), for asynchronous copies. Move-only.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() { return data_; }
  const void* data() const { return data_; }
  template <class T>
  T* as() {
    return static_cast<T*>(data_);
  }
  template <class T>
  const T* as() const {
    return static_cast<const T*>(data_);
  }
  std::size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

// A non-blocking stream. Move-only.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  gpu_stream_t handle() const { return handle_; }
  void synchronize();

 private:
  gpu_stream_t handle_ = nullptr;
};

// An event with timing. Move-only.
class Event {
 public:
  Event();
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(const Stream& stream);
  // The same inside a stream capture: a record node of the graph (cudaEventRecordExternal), so
  // each replay records the event -- timing inside a graph.
  void record_in_graph(const Stream& stream);
  // Makes `other` wait until this event has happened (cudaStreamWaitEvent).
  void wait(const Stream& other) const;
  void synchronize();
  // Milliseconds between two recorded events.
  static float elapsed_ms(const Event& start, const Event& end);

 private:
  void* handle_ = nullptr;  // cudaEvent_t, or the simulator's time point
};

// Asynchronous copies and memset on `stream` (the simulator completes them at once).
void copy_to_device(void* dst, const void* src, std::size_t bytes, const Stream& stream);
void copy_to_host(void* dst, const void* src, std::size_t bytes, const Stream& stream);
void copy_on_device(void* dst, const void* src, std::size_t bytes, const Stream& stream);
void fill_bytes(void* dst, int value, std::size_t bytes, const Stream& stream);
void synchronize_device();

// A CUDA graph captured from a stream and replayed on a stream. Move-only. The simulator
// throws "CUDA graphs are not simulated" from begin_capture and replay.
class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(Graph&& other) noexcept;
  Graph& operator=(Graph&& other) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  void begin_capture(const Stream& stream);
  void end_capture(const Stream& stream);
  void replay(const Stream& stream);
  bool empty() const { return exec_ == nullptr; }

 private:
  void reset();
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
};

// Whether gpu::launch_dependent overlaps a kernel with the one before it (kernels/
// dependent_launch.cuh): yes unless DSV4_DEPENDENT_LAUNCH=0 is in the environment (read once).
bool dependent_launch_enabled();

namespace detail {
// Error paths of gpu::launch and gpu::set_max_dynamic_smem (cuda/device.h) in the real build,
// implemented in runtime_cuda.cc so .cu files need no fmt: throw dsv4::Error naming the kernel.
[[noreturn]] void launch_failed(const void* kernel, int cuda_error, const unsigned (&grid)[3],
                                const unsigned (&block)[3], std::size_t smem_bytes);
[[noreturn]] void set_max_dynamic_smem_failed(const void* kernel, int cuda_error, std::size_t bytes);
}  // namespace detail

}  // namespace dsv4::gpu
