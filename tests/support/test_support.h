// Helpers shared by the test programs: a fresh temporary directory per test, and the message
// of an expected dsv4::Error.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <system_error>

#include "common/error.h"

namespace dsv4::testing_support {

// A fixture whose dir_ is a new, empty directory for each test, removed afterwards.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           ("dsv4_" + std::string(info->test_suite_name()) + "_" + info->name() + "_" + std::to_string(::getpid()) +
            "_" + std::to_string(counter++));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::filesystem::path dir_;
};

// Runs `f`, which must throw dsv4::Error, and returns its message (a test failure otherwise).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected dsv4::Error, nothing was thrown";
  return {};
}

}  // namespace dsv4::testing_support
