// ChatStream: a streamed assistant reply split, as it arrives, into reasoning and content
// deltas, with tool calls parsed at the end -- the streaming twin of parse_completion
// (chat_encoding.h), which the non-streaming response uses directly.
//
//   thinking mode   text up to "</think>" is reasoning (a leading "<think>" is dropped), the
//                   rest content; chat mode: all content.
//   with tools      content stops at "<｜DSML｜tool_calls>"; what follows is held and, at the
//                   end, parsed into tool calls (or released as content if the markup is
//                   malformed, as parse_completion does).
// Partial markers at the end of the text are held back until they can be decided.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "text/chat_encoding.h"

namespace dsv4 {

class ChatStream {
 public:
  ChatStream(bool thinking, bool tools);

  struct Delta {
    std::string reasoning;
    std::string content;
    std::vector<ToolCall> tool_calls;  // only from finish()
  };
  Delta push(std::string_view text);
  Delta finish();

 private:
  enum class State { kThinkOpening, kReasoning, kContent, kToolCalls };
  void advance(Delta& delta, bool final);

  bool thinking_;
  bool tools_;
  State state_;
  std::string held_;
  std::string all_;
};

}  // namespace dsv4
