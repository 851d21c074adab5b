// libFuzzer target: model output -> the chat reply parsers (text/chat_encoding.h,
// text/chat_stream.h), and JSON text -> the Python-style JSON reader and writer.
//
// Model output is never trusted: parse_completion and ChatStream must not throw or crash on
// any text, however it is split into pieces. parse_python_json may only throw dsv4::Error, and
// what it reads must write back to text that reads and writes to the same bytes again
// (json.dumps(json.loads(s)) is a fixed point).
//
//   ./fuzz_chat_reply -max_total_time=60 SCRATCH_DIR ../fuzz/corpus/chat_reply
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include "common/error.h"
#include "text/chat_encoding.h"
#include "text/chat_stream.h"

namespace {

[[noreturn]] void bug(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_chat_reply: %s: %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const bool thinking = (data[0] & 1) != 0;
  const bool tools = (data[0] & 2) != 0;
  const std::size_t piece = 1 + data[1] % 16;
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);
  try {
    (void)dsv4::parse_completion(text, thinking);
    dsv4::ChatStream stream(thinking, tools);
    for (std::size_t at = 0; at < text.size(); at += piece) (void)stream.push(text.substr(at, piece));
    (void)stream.finish();
  } catch (const std::exception& e) {
    bug("the reply parser threw on model output", e.what());
  }

  std::string once;
  try {
    once = dsv4::python_json_dumps(dsv4::parse_python_json(text, "fuzz"));
  } catch (const dsv4::Error&) {
    return 0;  // not JSON Python would read: refused, as it should be
  } catch (const std::exception& e) {
    bug("parse_python_json threw something other than Error", e.what());
  }
  try {
    const std::string twice = dsv4::python_json_dumps(dsv4::parse_python_json(once, "fuzz"));
    if (twice != once) bug("dumps(loads(dumps(x))) != dumps(x)", once + " -> " + twice);
  } catch (const std::exception& e) {
    bug("what python_json_dumps wrote does not read back", once + ": " + e.what());
  }
  return 0;
}
