// make_executor (executor_factory.h).
#include "cli/executor_factory.h"

#include <algorithm>
#include <thread>

#include "common/error.h"
#include "cpu/cpu_executor.h"
#include "model/model_config.h"
#ifdef DSV4_WITH_CUDA
#include "cuda/cuda_executor.h"
#endif

namespace dsv4::cli {

bool cuda_available_in_build() {
#ifdef DSV4_WITH_CUDA
  return true;
#else
  return false;
#endif
}

MadeExecutor make_executor(const ExecutorRequest& r, [[maybe_unused]] const EngineConfig& engine) {  // engine: CUDA only
  MadeExecutor made;
  if (r.device == "cpu") {
    if (r.load_format != "auto") fail("--load-format {} needs --device cuda (the CPU executor reads checkpoints)", r.load_format);
    const int threads = r.threads > 0 ? r.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    made.executor = CpuExecutor::load(r.model_dir, r.cache, threads);
    made.default_cache_bytes = std::int64_t{1'000'000'000};
    return made;
  }
  if (r.device != "cuda") fail("--device: expected cpu or cuda, found '{}'", r.device);
#ifdef DSV4_WITH_CUDA
  gpu::CudaOptions options;
  options.gpu_memory_utilization = r.gpu_memory_utilization;
  options.cuda_graphs = r.cuda_graphs;
  std::unique_ptr<gpu::CudaExecutor> gpu;
  if (r.load_format == "dummy") {
    gpu = gpu::CudaExecutor::dummy(ModelConfig::from_file(r.model_dir / "config.json"), r.cache, options);
  } else {
    gpu = gpu::CudaExecutor::load(r.model_dir, r.cache, options);
  }
  const std::int64_t max_context = engine.max_model_len > 0 ? engine.max_model_len : gpu->config().max_position_embeddings;
  made.default_cache_bytes =
      gpu->cache_budget_bytes(StepLimits{engine.max_num_batched_tokens, engine.max_num_seqs, max_context});
  made.executor = std::move(gpu);
  return made;
#else
  fail("--device cuda: this dsv4 was built without CUDA (no nvcc when it was configured); rebuild on a machine with "
       "the CUDA toolkit (tools/gpu-check.sh shows how)");
#endif
}

}  // namespace dsv4::cli
