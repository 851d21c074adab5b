// Pieces every GPU benchmark uses: comma lists on the command line, medians, the HBM bandwidth
// measured in the same run (the byte rooflines' denominator), and runs timed inside a CUDA graph.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/runtime.h"

namespace dsv4::bench {

// "flash,pro" -> {"flash", "pro"}.
std::vector<std::string> split_list(const std::string& text);
// "1,32,128" -> {1, 32, 128}.
std::vector<std::int64_t> parse_list(const std::string& text);

double median(std::vector<double> v);

// Bytes per second of a 4 GiB device-to-device copy (read + write), the median of 10 copies.
double measure_hbm_bandwidth();

// `reps` runs captured back to back in one CUDA graph on `stream`, replayed once to warm up and
// once timed; run(r, mark) issues run r and calls mark(i), 0 <= i < marks, where it wants an
// event (mark(0) first: the run boundaries). Run r's mark i is events[r * marks + i]; the last
// event follows the last run. Timing inside the graph leaves the host's launch latency out.
template <class Run>
std::vector<gpu::Event> events_of_graph_runs(gpu::Stream& stream, int reps, int marks, Run&& run) {
  const auto per_run = static_cast<std::size_t>(marks);
  std::vector<gpu::Event> events(per_run * static_cast<std::size_t>(reps) + 1);
  gpu::Graph graph;
  graph.begin_capture(stream);
  for (int r = 0; r < reps; ++r)
    run(r, [&](int i) { events[static_cast<std::size_t>(r) * per_run + static_cast<std::size_t>(i)].record_in_graph(stream); });
  events.back().record_in_graph(stream);
  graph.end_capture(stream);
  graph.replay(stream);  // warm-up
  graph.replay(stream);
  stream.synchronize();
  return events;
}

// Microseconds from event a to event b.
inline double us_between(const std::vector<gpu::Event>& events, std::size_t a, std::size_t b) {
  return static_cast<double>(gpu::Event::elapsed_ms(events[a], events[b])) * 1e3;
}

// A benchmark's main: run(argc, argv), or the exception's message after "name: " and exit 1.
int guarded_main(const char* name, int (*run)(int, char**), int argc, char** argv);

}  // namespace dsv4::bench
