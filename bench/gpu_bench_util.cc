#include "gpu_bench_util.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "cuda/runtime.h"

namespace dsv4::bench {

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> v;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    v.push_back(text.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return v;
}

std::vector<std::int64_t> parse_list(const std::string& text) {
  std::vector<std::int64_t> v;
  for (const std::string& item : split_list(text)) v.push_back(std::atoll(item.c_str()));
  return v;
}

int guarded_main(const char* name, int (*run)(int, char**), int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double measure_hbm_bandwidth() {
  const std::size_t bytes = std::size_t{4} << 30;
  gpu::DeviceBuffer a(bytes), b(bytes);
  gpu::Stream stream;
  gpu::fill_bytes(a.data(), 0x5a, bytes, stream);
  gpu::Event start, stop;
  std::vector<double> ms;
  for (int i = 0; i < 12; ++i) {
    start.record(stream);
    gpu::copy_on_device(b.data(), a.data(), bytes, stream);
    stop.record(stream);
    stop.synchronize();
    if (i >= 2) ms.push_back(gpu::Event::elapsed_ms(start, stop));
  }
  return 2.0 * static_cast<double>(bytes) / (median(ms) * 1e-3);
}

}  // namespace dsv4::bench
