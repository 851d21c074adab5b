// The one place an executor is chosen (--device): the CPU executor, or the GPU executor where
// this build has CUDA. Every command that runs a model goes through make_executor.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "executor/executor.h"
#include "kvcache/cache_spec.h"

namespace dsv4::cli {

struct ExecutorRequest {
  std::string device = "cpu";         // cpu | cuda
  std::string load_format = "auto";   // auto | dummy (cuda only)
  std::filesystem::path model_dir;
  CacheOptions cache;
  int threads = 0;                    // cpu: 0 = all cores
  double gpu_memory_utilization = 0.9;
  bool cuda_graphs = true;
};

struct MadeExecutor {
  std::unique_ptr<Executor> executor;
  std::int64_t default_cache_bytes = 0;  // the KV cache size when the user gives none
};

// `engine` gives the step limits the executor is prepared for (GPU scratch and its cache budget).
MadeExecutor make_executor(const ExecutorRequest& request, const EngineConfig& engine);

// Whether this build can run --device cuda.
bool cuda_available_in_build();

}  // namespace dsv4::cli
