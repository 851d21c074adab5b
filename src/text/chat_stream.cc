// Incremental reasoning / content / tool-call split of a streamed reply (chat_stream.h).
#include "text/chat_stream.h"

#include <algorithm>

namespace dsv4 {
namespace {

// The length of the longest suffix of `text` that is a proper prefix of `marker`.
std::size_t partial_marker(std::string_view text, std::string_view marker) {
  for (std::size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

ChatStream::ChatStream(bool thinking, bool tools)
    : thinking_(thinking), tools_(tools), state_(thinking ? State::kThinkOpening : State::kContent) {}

ChatStream::Delta ChatStream::push(std::string_view text) {
  Delta delta;
  all_ += text;
  held_ += text;
  advance(delta, false);
  return delta;
}

void ChatStream::advance(Delta& delta, bool final) {
  while (true) {
    switch (state_) {
      case State::kThinkOpening: {
        if (held_.starts_with(kThinkStart)) {
          held_.erase(0, kThinkStart.size());
        } else if (!final && std::string_view(kThinkStart).starts_with(held_)) {
          return;  // could still become "<think>"
        }
        state_ = State::kReasoning;
        break;
      }
      case State::kReasoning: {
        const std::size_t end = held_.find(kThinkEnd);
        if (end != std::string::npos) {
          delta.reasoning += held_.substr(0, end);
          held_.erase(0, end + kThinkEnd.size());
          state_ = State::kContent;
          break;
        }
        const std::size_t keep = final ? 0 : partial_marker(held_, kThinkEnd);
        delta.reasoning += held_.substr(0, held_.size() - keep);
        held_.erase(0, held_.size() - keep);
        return;
      }
      case State::kContent: {
        if (!tools_) {
          delta.content += held_;
          held_.clear();
          return;
        }
        const std::size_t start = held_.find(kToolCallsStart);
        if (start != std::string::npos) {
          std::string before = held_.substr(0, start);
          if (before.ends_with("\n\n")) before.resize(before.size() - 2);  // as parse_completion trims
          delta.content += before;
          held_.erase(0, start);
          state_ = State::kToolCalls;
          break;
        }
        std::size_t keep = 0;
        if (!final) {
          // A partial marker, and up to two newlines before it (parse_completion drops the
          // "\n\n" that precedes the tool block), wait for more text.
          const std::size_t partial = partial_marker(held_, kToolCallsStart);
          keep = partial;
          while (keep < partial + 2 && keep < held_.size() && held_[held_.size() - keep - 1] == '\n') ++keep;
        }
        delta.content += held_.substr(0, held_.size() - keep);
        held_.erase(0, held_.size() - keep);
        return;
      }
      case State::kToolCalls:
        return;  // decided at the end
    }
  }
}

ChatStream::Delta ChatStream::finish() {
  Delta delta;
  advance(delta, true);
  if (state_ == State::kToolCalls) {
    ParsedCompletion parsed = parse_completion(all_, thinking_);
    if (!parsed.tool_calls.empty() && !parsed.tool_markup_error) {
      delta.tool_calls = std::move(parsed.tool_calls);
    } else {
      delta.content += held_;
    }
    held_.clear();
  }
  return delta;
}

}  // namespace dsv4
