// TextStream: one request's output tokens in, text out, with OpenAI `stop` strings.
//
// Stop strings are matched on the decoded text, across token boundaries. While a stop string
// could still be completing, the stream holds back the last (longest stop - 1) bytes (never
// splitting a UTF-8 character); when one matches, the text ends right before it (or after it,
// with include_stop_str_in_output) and the stream reports which string stopped it. Without
// stop strings, text is released as soon as it forms complete characters.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "text/text_codec.h"

namespace dsv4 {

class TextStream {
 public:
  TextStream(const TextCodec& codec, std::vector<std::string> stop, bool include_stop_str_in_output,
             bool skip_special_tokens);

  // Adds one generated token; returns the text that may now be sent. After a stop string
  // matched, further tokens are ignored (return "").
  std::string push(std::int32_t token);
  // The generation ended (eos, length, ...): returns everything still held.
  std::string finish();

  bool stopped() const { return stopped_; }
  const std::string& stop_string() const { return stop_string_; }  // the one that matched

 private:
  std::string release(bool final);

  std::unique_ptr<TextCodec::Decoder> decoder_;
  std::vector<std::string> stop_;
  bool include_stop_;
  std::size_t max_stop_ = 0;
  std::string held_;
  bool stopped_ = false;
  std::string stop_string_;
};

}  // namespace dsv4
