// libFuzzer target: an HTTP request body -> the OpenAI request parser of both endpoints.
//
// A body from outside may only ever produce an ApiException (a 4xx error object) or a parsed
// request; any other exception, a crash or a sanitizer report is a bug.
//
//   ./fuzz_openai_request -max_total_time=60 SCRATCH_DIR ../fuzz/corpus/openai_request
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string_view>

#include "server/openai_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  dsv4::server::ProtocolLimits limits;
  limits.vocab_size = 4096;
  for (auto endpoint : {dsv4::server::Endpoint::kCompletions, dsv4::server::Endpoint::kChat}) {
    try {
      (void)dsv4::server::parse_api_request(body, endpoint, limits);
    } catch (const dsv4::server::ApiException& e) {
      if (e.error().status < 400 || e.error().status >= 500) {
        std::fprintf(stderr, "fuzz_openai_request: status %d for a client error\n", e.error().status);
        std::abort();
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fuzz_openai_request: unexpected exception: %s\n", e.what());
      std::abort();
    }
  }
  return 0;
}
