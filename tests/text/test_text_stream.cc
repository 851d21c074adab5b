// Incremental detokenization and stop strings (text/text_stream.h), on the byte codec.
#include <gtest/gtest.h>

#include "text/text_stream.h"

namespace dsv4 {
namespace {

std::int32_t byte_token(char c) { return static_cast<unsigned char>(c) + 3; }

// Pushes `text` byte by byte and returns what the stream released, piece by piece, joined by '|'.
std::string run(TextStream& s, const std::string& text, bool finish = true) {
  std::string out;
  for (char c : text) {
    if (s.stopped()) break;
    out += s.push(byte_token(c)) + "|";
  }
  if (finish) out += s.finish();
  return out;
}

class TextStreamTest : public ::testing::Test {
 protected:
  std::unique_ptr<TextCodec> codec = make_byte_codec({.size = 4096, .bos_id = 0, .eos_id = 1});
};

TEST_F(TextStreamTest, WithoutStopStringsTextFlowsAtOnce) {
  TextStream s(*codec, {}, false, true);
  EXPECT_EQ(run(s, "abc"), "a|b|c|");
  EXPECT_FALSE(s.stopped());
}

TEST_F(TextStreamTest, HoldsBackWhatCouldStartAStopString) {
  TextStream s(*codec, {"STOP"}, false, true);
  EXPECT_EQ(run(s, "abcdeSTOPxyz"), "|||a|b|c|d|e||");
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.stop_string(), "STOP");
  EXPECT_EQ(s.push(byte_token('q')), "");  // ignored after the stop
}

TEST_F(TextStreamTest, IncludeStopString) {
  TextStream s(*codec, {"\n\n"}, true, true);
  EXPECT_EQ(run(s, "ab\n\ncd"), "|a|b|\n\n|");
  EXPECT_TRUE(s.stopped());
}

TEST_F(TextStreamTest, FalseStartIsReleased) {
  TextStream s(*codec, {"END"}, false, true);
  EXPECT_EQ(run(s, "ENxENDy"), "||E|N|x||");
  EXPECT_TRUE(s.stopped());
}

TEST_F(TextStreamTest, EarliestOfSeveralStops) {
  TextStream s(*codec, {"cd", "b"}, false, true);
  EXPECT_EQ(run(s, "abcd"), "|a|");
  EXPECT_EQ(s.stop_string(), "b");
}

TEST_F(TextStreamTest, FinishReleasesHeldText) {
  TextStream s(*codec, {"xyz"}, false, true);
  EXPECT_EQ(run(s, "abxy"), "||a|b|xy");
  EXPECT_FALSE(s.stopped());
}

TEST_F(TextStreamTest, MultiByteCharactersAreNotSplit) {
  const std::string snow = "\xe2\x98\x83";  // U+2603
  TextStream s(*codec, {}, false, true);
  EXPECT_EQ(run(s, "a" + snow + "b"), "a|||" + snow + "|b|");
  TextStream held(*codec, {"zz"}, false, true);
  // With a one-byte hold-back the cut must move back to the character's first byte.
  EXPECT_EQ(run(held, snow + snow), "|||||" + snow + "|" + snow);
}

TEST_F(TextStreamTest, SpecialTokensSkippedOrShown) {
  TextStream skip(*codec, {}, false, true);
  EXPECT_EQ(skip.push(1), "");
  TextStream show(*codec, {}, false, false);
  EXPECT_EQ(show.push(1), "<eos>");
}

// Bytes that can never become a character (text/utf8.h's strict rule) flow at once; the
// byte codec used to wait for more after an overlong, surrogate or out-of-range lead.
TEST_F(TextStreamTest, InvalidBytesAreNotWaitedFor) {
  TextStream s(*codec, {}, false, true);
  EXPECT_EQ(run(s, "\xC0" "a"), "\xC0|a|");
  TextStream overlong(*codec, {}, false, true);
  EXPECT_EQ(run(overlong, "\xE0\x80" "a"), "|\xE0\x80|a|");
  TextStream surrogate(*codec, {}, false, true);
  EXPECT_EQ(run(surrogate, "\xED\xA0" "a"), "|\xED\xA0|a|");
  TextStream too_high(*codec, {}, false, true);
  EXPECT_EQ(run(too_high, "\xF4\x90"), "|\xF4\x90|");
  TextStream f5(*codec, {}, false, true);
  EXPECT_EQ(run(f5, "\xF5" "a"), "\xF5|a|");
  // Stray continuation bytes are characters of their own: a stop-string hold-back does not
  // pull the cut back over them.
  TextStream held(*codec, {"zz"}, false, true);
  EXPECT_EQ(run(held, "\x80\x80\x80"), "|\x80|\x80|\x80");
}

}  // namespace
}  // namespace dsv4
