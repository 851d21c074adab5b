// Pieces every GPU benchmark uses: comma lists on the command line, medians, and the HBM
// bandwidth measured in the same run (the byte rooflines' denominator).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsv4::bench {

// "flash,pro" -> {"flash", "pro"}.
std::vector<std::string> split_list(const std::string& text);
// "1,32,128" -> {1, 32, 128}.
std::vector<std::int64_t> parse_list(const std::string& text);

double median(std::vector<double> v);

// Bytes per second of a 4 GiB device-to-device copy (read + write), the median of 10 copies.
double measure_hbm_bandwidth();

// A benchmark's main: run(argc, argv), or the exception's message after "name: " and exit 1.
int guarded_main(const char* name, int (*run)(int, char**), int argc, char** argv);

}  // namespace dsv4::bench
