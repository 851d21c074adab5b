// Incremental detokenization with stop strings (text_stream.h).
#include "text/text_stream.h"

#include <algorithm>

#include "text/utf8.h"

namespace dsv4 {

TextStream::TextStream(const TextCodec& codec, std::vector<std::string> stop, bool include_stop_str_in_output,
                       bool skip_special_tokens)
    : decoder_(codec.decoder(skip_special_tokens)), stop_(std::move(stop)), include_stop_(include_stop_str_in_output) {
  std::erase_if(stop_, [](const std::string& s) { return s.empty(); });
  for (const std::string& s : stop_) max_stop_ = std::max(max_stop_, s.size());
}

std::string TextStream::push(std::int32_t token) {
  if (stopped_) return {};
  held_ += decoder_->push(token);
  return release(false);
}

std::string TextStream::finish() {
  if (stopped_) return {};
  held_ += decoder_->flush();
  return release(true);
}

std::string TextStream::release(bool final) {
  // Earliest match of any stop string; held_ never contains a whole stop string from before,
  // so every match found here is new.
  std::size_t best = std::string::npos;
  const std::string* matched = nullptr;
  for (const std::string& s : stop_) {
    const std::size_t at = held_.find(s);
    if (at != std::string::npos && (at < best || (at == best && s.size() > matched->size()))) {
      best = at;
      matched = &s;
    }
  }
  if (matched) {
    stopped_ = true;
    stop_string_ = *matched;
    std::string out = held_.substr(0, include_stop_ ? best + matched->size() : best);
    held_.clear();
    return out;
  }
  std::size_t keep = final || max_stop_ == 0 ? 0 : std::min(held_.size(), max_stop_ - 1);
  // Do not split a UTF-8 character: move the cut back to the start of one.
  const std::size_t cut = utf8::char_start(held_, held_.size() - keep);
  std::string out = held_.substr(0, cut);
  held_.erase(0, cut);
  return out;
}

}  // namespace dsv4
