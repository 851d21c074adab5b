// Streaming split of chat replies into reasoning, content and tool calls (text/chat_stream.h).
#include <gtest/gtest.h>

#include "text/chat_stream.h"

namespace dsv4 {
namespace {

struct Joined {
  std::string reasoning, content;
  std::vector<ToolCall> tool_calls;
};

// Feeds `text` in pieces of `step` bytes and joins the deltas.
Joined feed(ChatStream& s, const std::string& text, std::size_t step) {
  Joined out;
  for (std::size_t i = 0; i < text.size(); i += step) {
    ChatStream::Delta d = s.push(text.substr(i, step));
    EXPECT_TRUE(d.tool_calls.empty());
    out.reasoning += d.reasoning;
    out.content += d.content;
  }
  ChatStream::Delta d = s.finish();
  out.reasoning += d.reasoning;
  out.content += d.content;
  out.tool_calls = d.tool_calls;
  return out;
}

const std::string kToolText = std::string("Checking.\n\n") + std::string(kToolCallsStart) +
                              "\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"x\" string=\"false\">1"
                              "</｜DSML｜parameter>\n</｜DSML｜invoke>\n" +
                              std::string(kToolCallsEnd);

TEST(ChatStream, AgreesWithParseCompletionForEverySplit) {
  const std::vector<std::pair<std::string, bool>> replies = {
      {"plain answer", false},
      {"thinking about it</think>the answer", true},
      {"<think>deep thought</think>answer\n\nmore", true},
      {"cut off while thinking </thi", true},
      {"a < b and </ also <think> inside", false},
      {kToolText, false},
      {"thought</think>" + kToolText, true},
      {"broken " + std::string(kToolCallsStart) + " no end", false},
  };
  for (const auto& [text, thinking] : replies) {
    const bool tools = text.find(kDsmlToken) != std::string::npos;
    const ParsedCompletion want = parse_completion(text, thinking);
    for (std::size_t step : {1u, 2u, 3u, 7u, 1000u}) {
      ChatStream s(thinking, tools);
      const Joined got = feed(s, text, step);
      SCOPED_TRACE(text + " step " + std::to_string(step));
      EXPECT_EQ(got.reasoning, want.reasoning_content);
      EXPECT_EQ(got.content, want.content);
      ASSERT_EQ(got.tool_calls.size(), want.tool_calls.size());
      for (std::size_t i = 0; i < got.tool_calls.size(); ++i) {
        EXPECT_EQ(got.tool_calls[i].name, want.tool_calls[i].name);
        EXPECT_EQ(got.tool_calls[i].arguments, want.tool_calls[i].arguments);
      }
    }
  }
}

TEST(ChatStream, ReleasesTextAsSoonAsItIsDecided) {
  ChatStream s(/*thinking=*/true, /*tools=*/false);
  EXPECT_EQ(s.push("abc").reasoning, "abc");
  ChatStream::Delta d = s.push("de</th");
  EXPECT_EQ(d.reasoning, "de");  // "</th" may be the end marker
  d = s.push("ink>xy");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "xy");
}

}  // namespace
}  // namespace dsv4
