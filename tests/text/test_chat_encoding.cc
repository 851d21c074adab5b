// Chat encoding tests: prompt goldens written out by hand from DeepSeek-V4's reference
// encoding_dsv4.py (encode_messages), and parse_completion on well-formed and malformed
// completions.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "text/chat_encoding.h"

namespace dsv4 {
namespace {

using OrderedJson = nlohmann::ordered_json;

const std::string BOS = "<｜begin▁of▁sentence｜>";
const std::string EOS = "<｜end▁of▁sentence｜>";
const std::string USER = "<｜User｜>";
const std::string ASSISTANT = "<｜Assistant｜>";

ChatMessage msg(std::string role, std::string content) {
  ChatMessage m;
  m.role = std::move(role);
  m.content = std::move(content);
  return m;
}

ChatMessage assistant(std::string content, std::string reasoning = "", std::vector<ToolCall> calls = {}) {
  ChatMessage m = msg("assistant", std::move(content));
  m.reasoning_content = std::move(reasoning);
  m.tool_calls = std::move(calls);
  return m;
}

ChatMessage tool_result(std::string id, std::string content) {
  ChatMessage m = msg("tool", std::move(content));
  m.tool_call_id = std::move(id);
  return m;
}

std::string render(const std::vector<ChatMessage>& messages, ChatOptions options = {},
                   const OrderedJson& tools = nullptr) {
  return render_chat_prompt(messages, tools, options);
}

ChatOptions thinking() {
  ChatOptions o;
  o.thinking = true;
  return o;
}

const OrderedJson kWeatherTools = OrderedJson::parse(R"([{"type": "function", "function": {
  "name": "get_weather", "description": "Get the weather",
  "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                 "required": ["city"]}}}])");

// The reference's TOOLS_TEMPLATE, filled in for kWeatherTools.
const std::string kWeatherToolsBlock =
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "
    "\"<｜DSML｜tool_calls>\" block like the following:\n\n"
    "<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME\">\n"
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
    "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n"
    "{\"name\": \"get_weather\", \"description\": \"Get the weather\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\"}}, \"required\": "
    "[\"city\"]}}\n\n"
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

// ---- rendering ---------------------------------------------------------------------------------

TEST(ChatRender, SingleUserTurnChatMode) {
  EXPECT_EQ(render({msg("user", "Hello")}), BOS + USER + "Hello" + ASSISTANT + "</think>");
}

TEST(ChatRender, SingleUserTurnThinkingMode) {
  EXPECT_EQ(render({msg("user", "Hello")}, thinking()), BOS + USER + "Hello" + ASSISTANT + "<think>");
}

TEST(ChatRender, SystemPrompt) {
  EXPECT_EQ(render({msg("system", "You are helpful."), msg("user", "Hi")}),
            BOS + "You are helpful." + USER + "Hi" + ASSISTANT + "</think>");
}

TEST(ChatRender, MultiTurnDropsEarlierReasoning) {
  const std::vector<ChatMessage> m = {msg("user", "1+1?"), assistant("2", "easy"), msg("user", "and 2+2?")};
  EXPECT_EQ(render(m, thinking()),
            BOS + USER + "1+1?" + ASSISTANT + "</think>" + "2" + EOS + USER + "and 2+2?" + ASSISTANT + "<think>");
  EXPECT_EQ(render(m), BOS + USER + "1+1?" + ASSISTANT + "</think>" + "2" + EOS + USER + "and 2+2?" + ASSISTANT +
                           "</think>");
  ChatOptions keep = thinking();
  keep.drop_thinking = false;
  EXPECT_EQ(render(m, keep), BOS + USER + "1+1?" + ASSISTANT + "<think>" + "easy</think>2" + EOS + USER +
                                 "and 2+2?" + ASSISTANT + "<think>");
}

TEST(ChatRender, GenerationPromptAndContinuation) {
  ChatOptions no_prompt;
  no_prompt.add_generation_prompt = false;
  EXPECT_EQ(render({msg("user", "Hi")}, no_prompt), BOS + USER + "Hi");
  ChatOptions cont = thinking();
  cont.continue_final_message = true;
  EXPECT_EQ(render({msg("user", "Hi"), assistant("Hel", "hmm")}, cont),
            BOS + USER + "Hi" + ASSISTANT + "<think>" + "hmm</think>Hel");
  EXPECT_EQ(render({msg("user", "Hi"), assistant("Hello", "hmm")}, thinking()),
            BOS + USER + "Hi" + ASSISTANT + "<think>" + "hmm</think>Hello" + EOS);
}

// encoding_dsv4.py's REASONING_EFFORT_PROMPTS: "low" (the default) adds nothing, "high" and
// "max" their own texts, at the very start of the prompt and only in thinking mode.
const std::string kEffortHigh =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";
const std::string kEffortMax =
    "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively "
    "decompose the problem into its most fundamental components, trace every causal chain to its root, and "
    "resolve the underlying cause rather than any surface symptom.\n"
    "Do not stop reasoning until you have independently verified the solution from multiple angles and are "
    "certain that no assumption remains unchecked and no error remains undiscovered.\n\n";

TEST(ChatRender, ReasoningEffortLadder) {
  ChatOptions o = thinking();
  EXPECT_EQ(o.reasoning_effort, ReasoningEffort::kLow);
  EXPECT_EQ(render({msg("user", "Hi")}, o), BOS + USER + "Hi" + ASSISTANT + "<think>");
  o.reasoning_effort = ReasoningEffort::kHigh;
  EXPECT_EQ(render({msg("user", "Hi")}, o), BOS + kEffortHigh + USER + "Hi" + ASSISTANT + "<think>");
  o.reasoning_effort = ReasoningEffort::kMax;
  EXPECT_EQ(render({msg("user", "Hi")}, o), BOS + kEffortMax + USER + "Hi" + ASSISTANT + "<think>");
  // Before the first message whatever it is: the system prompt, or the tools' system message.
  EXPECT_EQ(render({msg("system", "S"), msg("user", "Hi")}, o), BOS + kEffortMax + "S" + USER + "Hi" + ASSISTANT + "<think>");
  EXPECT_EQ(render({msg("user", "Hi")}, o, kWeatherTools),
            BOS + kEffortMax + "\n\n" + kWeatherToolsBlock + USER + "Hi" + ASSISTANT + "<think>");
  // Chat mode: every level renders nothing.
  for (ReasoningEffort e : {ReasoningEffort::kLow, ReasoningEffort::kHigh, ReasoningEffort::kMax}) {
    ChatOptions chat;
    chat.reasoning_effort = e;
    EXPECT_EQ(render({msg("user", "Hi")}, chat), BOS + USER + "Hi" + ASSISTANT + "</think>");
  }
}

TEST(ChatRender, ReasoningEffortNames) {
  EXPECT_EQ(parse_reasoning_effort("low"), ReasoningEffort::kLow);
  EXPECT_EQ(parse_reasoning_effort("high"), ReasoningEffort::kHigh);
  EXPECT_EQ(parse_reasoning_effort("max"), ReasoningEffort::kMax);
  for (const char* other : {"", "medium", "minimal", "none", "xhigh", "MAX", "max "})
    EXPECT_FALSE(parse_reasoning_effort(other).has_value()) << other;
}

TEST(ChatRender, ToolsBlockAfterSystemPrompt) {
  EXPECT_EQ(render({msg("system", "Be brief."), msg("user", "Weather?")}, {}, kWeatherTools),
            BOS + "Be brief.\n\n" + kWeatherToolsBlock + USER + "Weather?" + ASSISTANT + "</think>");
  // Without a system message, one with empty content carries the tools.
  EXPECT_EQ(render({msg("user", "Weather?")}, {}, kWeatherTools),
            BOS + "\n\n" + kWeatherToolsBlock + USER + "Weather?" + ASSISTANT + "</think>");
  // A developer message carries them after its user tag.
  EXPECT_EQ(render({msg("developer", "Rules."), msg("user", "Weather?")}, {}, kWeatherTools),
            BOS + USER + "Rules.\n\n" + kWeatherToolsBlock + USER + "Weather?" + ASSISTANT + "</think>");
}

TEST(ChatRender, AssistantToolCallAndToolResults) {
  const std::vector<ChatMessage> m = {
      msg("user", "Weather in Paris and Rome?"),
      assistant("", "I need both.",
                {{"call_1", "get_weather", R"({"city": "Paris"})"}, {"call_2", "get_weather", R"({"city": "Rome", "days": 3})"}}),
      tool_result("call_2", "sunny"),  // out of order: sorted by call order
      tool_result("call_1", "rainy"),
  };
  const std::string calls =
      "\n\n<｜DSML｜tool_calls>\n"
      "<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"city\" string=\"true\">Rome</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n"
      "</｜DSML｜tool_calls>";
  // Thinking mode with tools: reasoning is kept (drop_thinking is off when tools are given).
  EXPECT_EQ(render(m, thinking(), kWeatherTools),
            BOS + "\n\n" + kWeatherToolsBlock + USER + "Weather in Paris and Rome?" + ASSISTANT + "<think>" +
                "I need both.</think>" + calls + EOS + USER +
                "<tool_result>rainy</tool_result>\n\n<tool_result>sunny</tool_result>" + ASSISTANT + "<think>");
  // Chat mode, no tools given.
  EXPECT_EQ(render(m), BOS + USER + "Weather in Paris and Rome?" + ASSISTANT + "</think>" + calls + EOS + USER +
                           "<tool_result>rainy</tool_result>\n\n<tool_result>sunny</tool_result>" + ASSISTANT +
                           "</think>");
}

TEST(ChatRender, UserMessageAfterToolResultsJoinsTheTurn) {
  const std::vector<ChatMessage> m = {msg("user", "Go"), assistant("", "", {{"c", "f", "{}"}}),
                                      tool_result("c", "done"), msg("user", "Thanks, now summarize.")};
  EXPECT_EQ(render(m), BOS + USER + "Go" + ASSISTANT + "</think>" +
                           "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>" +
                           EOS + USER + "<tool_result>done</tool_result>\n\nThanks, now summarize." + ASSISTANT +
                           "</think>");
}

TEST(ChatRender, NonStringArgumentsUsePythonJson) {
  const std::vector<ChatMessage> m = {
      msg("user", "x"),
      assistant("Calling.", "", {{"", "f", R"({"list": [1, 2], "obj": {"k": null, "s": "北京"}, "flag": true, "n": 1.5, "s": "a \"q\""})"}})};
  const std::string prompt = render(m);
  EXPECT_NE(prompt.find("Calling.\n\n<｜DSML｜tool_calls>"), std::string::npos);
  EXPECT_NE(prompt.find("<｜DSML｜parameter name=\"list\" string=\"false\">[1, 2]</｜DSML｜parameter>\n"
                        "<｜DSML｜parameter name=\"obj\" string=\"false\">{\"k\": null, \"s\": \"北京\"}</｜DSML｜parameter>\n"
                        "<｜DSML｜parameter name=\"flag\" string=\"false\">true</｜DSML｜parameter>\n"
                        "<｜DSML｜parameter name=\"n\" string=\"false\">1.5</｜DSML｜parameter>\n"
                        "<｜DSML｜parameter name=\"s\" string=\"true\">a \"q\"</｜DSML｜parameter>\n"),
            std::string::npos)
      << prompt;
  // Arguments that are not a JSON object become one string parameter.
  const std::string raw = render({msg("user", "x"), assistant("", "", {{"", "f", "not json"}})});
  EXPECT_NE(raw.find("<｜DSML｜parameter name=\"arguments\" string=\"true\">not json</｜DSML｜parameter>"),
            std::string::npos);
}

TEST(ChatRender, LatestReminder) {
  // As in the reference: a user turn followed by a reminder still gets the assistant tag.
  EXPECT_EQ(render({msg("user", "Hi"), msg("latest_reminder", "Be nice.")}),
            BOS + USER + "Hi" + ASSISTANT + "</think>" + "<｜latest_reminder｜>Be nice.");
}

TEST(ChatRender, RejectsWhatItCannotRender) {
  EXPECT_THROW(render({msg("wizard", "x")}), Error);
  EXPECT_THROW(render({msg("user", "x")}, {}, OrderedJson{{"name", "f"}}), Error);
  EXPECT_THROW(render({msg("user", "x")}, {}, OrderedJson::array({OrderedJson{{"name", "f"}}})), Error);
}

TEST(ChatRender, ToolArgumentNumbersAsPythonWritesThem) {
  // json.loads then json.dumps: floats by repr (exponent below 1e-4 and from 1e16 on), integers
  // of any size exactly as written.
  const std::string args =
      R"({"a": 1e15, "b": 123456789012345678901234567890, "c": -18446744073709551617, "d": 1E5,)"
      R"( "e": 1e16, "f": 0.00001, "g": [1.0, 2e-7, -0.0, 9999999999999998.0], "h": {"k": 1.5e300}})";
  const std::string prompt = render({msg("user", "x"), assistant("", "", {{"", "f", args}})});
  EXPECT_NE(prompt.find("<｜DSML｜parameter name=\"a\" string=\"false\">1000000000000000.0</｜DSML｜parameter>\n"
                        "<｜DSML｜parameter name=\"b\" string=\"false\">123456789012345678901234567890</｜DSML｜parameter>\n"
                        "<｜DSML｜parameter name=\"c\" string=\"false\">-18446744073709551617</｜DSML｜parameter>\n"
                        "<｜DSML｜parameter name=\"d\" string=\"false\">100000.0</｜DSML｜parameter>\n"
                        "<｜DSML｜parameter name=\"e\" string=\"false\">1e+16</｜DSML｜parameter>\n"
                        "<｜DSML｜parameter name=\"f\" string=\"false\">1e-05</｜DSML｜parameter>\n"
                        "<｜DSML｜parameter name=\"g\" string=\"false\">[1.0, 2e-07, -0.0, 9999999999999998.0]</｜DSML｜parameter>\n"
                        "<｜DSML｜parameter name=\"h\" string=\"false\">{\"k\": 1.5e+300}</｜DSML｜parameter>\n"),
            std::string::npos)
      << prompt;
  // Python refuses to read an integer of more than 4300 digits: the reference then renders the
  // arguments text as one string parameter.
  const std::string huge = "{\"n\": " + std::string(4301, '7') + "}";
  EXPECT_NE(render({msg("user", "x"), assistant("", "", {{"", "f", huge}})})
                .find("<｜DSML｜parameter name=\"arguments\" string=\"true\">" + huge + "</｜DSML｜parameter>"),
            std::string::npos);
  const std::string most = "{\"n\": " + std::string(4300, '7') + "}";
  EXPECT_NE(render({msg("user", "x"), assistant("", "", {{"", "f", most}})})
                .find("<｜DSML｜parameter name=\"n\" string=\"false\">" + std::string(4300, '7') + "</｜DSML｜parameter>"),
            std::string::npos);
}

TEST(PythonJson, FloatsAsPythonRepr) {
  const std::pair<double, const char*> cases[] = {
      {0.0, "0.0"},          {-0.0, "-0.0"},        {1.0, "1.0"},
      {1.5, "1.5"},          {0.1, "0.1"},          {1e15, "1000000000000000.0"},
      {-1.5e15, "-1500000000000000.0"},            {9999999999999998.0, "9999999999999998.0"},
      {1e16, "1e+16"},       {1.25e16, "1.25e+16"}, {123456789012345678.0, "1.2345678901234568e+17"},
      {1e22, "1e+22"},       {0.0001, "0.0001"},    {0.00012, "0.00012"},
      {0.00001, "1e-05"},    {1.5e-7, "1.5e-07"},   {5e-324, "5e-324"},
      {1.7976931348623157e308, "1.7976931348623157e+308"},
      {123.456, "123.456"},  {2.0 / 3.0, "0.6666666666666666"},
  };
  for (const auto& [value, want] : cases) EXPECT_EQ(python_json_dumps(OrderedJson(value)), want) << want;
  // Integers stay integers, and big ones keep their digits.
  EXPECT_EQ(python_json_dumps(parse_python_json("[10, -0, 18446744073709551615, -9223372036854775808, "
                                                "18446744073709551616, -9223372036854775809, 1.0, 1E2]",
                                                "test")),
            "[10, 0, 18446744073709551615, -9223372036854775808, 18446744073709551616, -9223372036854775809, 1.0, "
            "100.0]");
  // Past the double range Python reads inf (written Infinity), below it 0; numbers inside
  // strings are left alone.
  EXPECT_EQ(python_json_dumps(parse_python_json(
                R"([1e400, -1e400, -1e-400, 3e-324, 2e-324, 1.8e308, 0.0e999, "99999999999999999999999 \" 1e400", {"k\\": 1e400}])",
                "test")),
            R"([Infinity, -Infinity, -0.0, 5e-324, 0.0, Infinity, 0.0, "99999999999999999999999 \" 1e400", {"k\\": Infinity}])");
  EXPECT_THROW(parse_python_json("[1, 2", "test"), Error);
  EXPECT_THROW(parse_python_json("[01]", "test"), Error);
  EXPECT_THROW(parse_python_json("[1.]", "test"), Error);
  EXPECT_THROW(parse_python_json("[-]", "test"), Error);
  EXPECT_THROW(parse_python_json(R"({"a": 1, "a": 2})", "test"), Error);
}

// json.loads reads the constants json.dumps writes for non-finite floats (NaN, Infinity,
// -Infinity), so what python_json_dumps writes always reads back; other spellings stay errors.
TEST(PythonJson, NonFiniteConstantsReadAsPythonReadsThem) {
  const OrderedJson v = parse_python_json(R"({"a": [Infinity, -Infinity, NaN, "NaN Infinity"], "b": -1e400})", "test");
  EXPECT_EQ(python_json_dumps(v), R"({"a": [Infinity, -Infinity, NaN, "NaN Infinity"], "b": -Infinity})");
  EXPECT_TRUE(std::isinf(v["a"][0].get<double>()));
  EXPECT_LT(v["a"][1].get<double>(), 0.0);
  EXPECT_TRUE(std::isnan(v["a"][2].get<double>()));
  const std::string once = python_json_dumps(parse_python_json("[1e999, 0.5, 123456789012345678901234567890]", "test"));
  EXPECT_EQ(python_json_dumps(parse_python_json(once, "test")), once);
  for (const char* bad : {"[+Infinity]", "[-NaN]", "[infinity]", "[Inf]", "[nan]", "[Infinityx]", "[NaN1]"}) {
    EXPECT_THROW(parse_python_json(bad, "test"), Error) << bad;
  }
}

TEST(PythonJson, MatchesJsonDumps) {
  const OrderedJson v = OrderedJson::parse(R"({"b": 1, "a": [1, 2.5, "x", true, null], "c": {}, "d": [], "e": "\u0001\n\"北京\""})");
  EXPECT_EQ(python_json_dumps(v), R"({"b": 1, "a": [1, 2.5, "x", true, null], "c": {}, "d": [], "e": "\u0001\n\"北京\""})");
}

// ---- parsing -------------------------------------------------------------------------------------

TEST(ChatParse, ThinkingSplit) {
  const auto p = parse_completion("Let me think.</think>The answer is 4." + EOS, true);
  EXPECT_EQ(p.reasoning_content, "Let me think.");
  EXPECT_EQ(p.content, "The answer is 4.");
  EXPECT_TRUE(p.tool_calls.empty());
  EXPECT_FALSE(p.tool_markup_error);

  const auto chat = parse_completion("Hello there." + EOS + "ignored", false);
  EXPECT_EQ(chat.reasoning_content, "");
  EXPECT_EQ(chat.content, "Hello there.");

  // Cut off while thinking: everything is reasoning.
  const auto cut = parse_completion("Still thinking about", true);
  EXPECT_EQ(cut.reasoning_content, "Still thinking about");
  EXPECT_EQ(cut.content, "");
}

TEST(ChatParse, ToolCallBeforeThinkEndIsFlagged) {
  // The reference refuses a tool-call block inside the reasoning ("missing </think>"): the text
  // stays where it was and the markup is flagged.
  const std::string block = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  const auto p = parse_completion("Let me call." + block + "</think>Done." + EOS, true);
  EXPECT_TRUE(p.tool_markup_error);
  EXPECT_TRUE(p.tool_calls.empty());
  EXPECT_EQ(p.reasoning_content, "Let me call." + block);
  EXPECT_EQ(p.content, "Done.");
  // Cut off after the block, before "</think>".
  const auto cut = parse_completion("Let me call." + block, true);
  EXPECT_TRUE(cut.tool_markup_error);
  EXPECT_TRUE(cut.tool_calls.empty());
  EXPECT_EQ(cut.reasoning_content, "Let me call." + block);
  // A well-placed call after "</think>" is not flagged; neither is the text in chat mode.
  EXPECT_FALSE(parse_completion("ok</think>" + block + EOS, true).tool_markup_error);
  EXPECT_EQ(parse_completion("ok</think>" + block + EOS, true).tool_calls.size(), 1u);
}

TEST(ChatParse, ToolCallsToOpenAiArguments) {
  const std::string text =
      "The user wants weather.</think>Let me check.\n\n<｜DSML｜tool_calls>\n"
      "<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"city\" string=\"true\">Paris \"center\"\nnorth</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"opts\" string=\"false\">{\"units\": [\"C\", \"F\"], \"x\": null}</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"get_time\">\n"
      "</｜DSML｜invoke>\n"
      "</｜DSML｜tool_calls>" +
      EOS;
  const auto p = parse_completion(text, true);
  EXPECT_FALSE(p.tool_markup_error);
  EXPECT_EQ(p.reasoning_content, "The user wants weather.");
  EXPECT_EQ(p.content, "Let me check.");
  ASSERT_EQ(p.tool_calls.size(), 2u);
  EXPECT_EQ(p.tool_calls[0].name, "get_weather");
  EXPECT_EQ(p.tool_calls[0].arguments,
            R"({"city": "Paris \"center\"\nnorth", "days": 3, "opts": {"units": ["C", "F"], "x": null}})");
  const auto args = nlohmann::json::parse(p.tool_calls[0].arguments);
  EXPECT_EQ(args["city"], "Paris \"center\"\nnorth");
  EXPECT_EQ(args["days"], 3);
  EXPECT_EQ(p.tool_calls[1].name, "get_time");
  EXPECT_EQ(p.tool_calls[1].arguments, "{}");
  EXPECT_TRUE(p.tool_calls[0].id.empty());
}

TEST(ChatParse, RenderedToolCallsParseBack) {
  const std::vector<ToolCall> calls = {{"", "search", R"({"query": "a <b> & c", "limit": 10, "tags": ["x"]})"}};
  const std::string prompt = render_chat_prompt(std::vector<ChatMessage>{msg("user", "q"), assistant("Sure.", "", calls)},
                                                nullptr, ChatOptions{});
  const auto start = prompt.find(ASSISTANT + "</think>") + (ASSISTANT + "</think>").size();
  const auto p = parse_completion(prompt.substr(start), false);
  EXPECT_FALSE(p.tool_markup_error);
  EXPECT_EQ(p.content, "Sure.");
  ASSERT_EQ(p.tool_calls.size(), 1u);
  EXPECT_EQ(p.tool_calls[0].name, "search");
  EXPECT_EQ(nlohmann::json::parse(p.tool_calls[0].arguments), nlohmann::json::parse(calls[0].arguments));
}

TEST(ChatParse, LenientForms) {
  // No string attribute: JSON if it parses, else a string; string="false" that is not JSON
  // becomes a string; tags without newlines between them.
  const auto p = parse_completion(
      "<｜DSML｜tool_calls><｜DSML｜invoke name=\"f\"><｜DSML｜parameter name=\"a\">42</｜DSML｜parameter>"
      "<｜DSML｜parameter name=\"b\">hello</｜DSML｜parameter>"
      "<｜DSML｜parameter name=\"c\" string=\"false\">not json</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜tool_calls>",
      false);
  EXPECT_FALSE(p.tool_markup_error);
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.tool_calls.size(), 1u);
  EXPECT_EQ(p.tool_calls[0].arguments, R"({"a": 42, "b": "hello", "c": "not json"})");
}

TEST(ChatParse, MalformedMarkupStaysContent) {
  const std::vector<std::string> bad = {
      // never closed (generation cut off)
      "Checking.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">x",
      // parameter outside an invoke
      "<｜DSML｜tool_calls>\n<｜DSML｜parameter name=\"a\" string=\"true\">x</｜DSML｜parameter>\n</｜DSML｜tool_calls>",
      // duplicate parameter
      "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">1</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"a\" string=\"true\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
      // bad string attribute
      "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"maybe\">1</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
      // text after the block
      "<｜DSML｜tool_calls>\n</｜DSML｜tool_calls> and more",
      // invoke without a name
      "<｜DSML｜tool_calls>\n<｜DSML｜invoke>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
  };
  for (const auto& text : bad) {
    const auto p = parse_completion(text + EOS, false);
    EXPECT_TRUE(p.tool_markup_error) << text;
    EXPECT_TRUE(p.tool_calls.empty()) << text;
    EXPECT_EQ(p.content, text);
  }
  // Random truncations of a good completion never throw.
  const std::string good = "r</think>c\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
                           "<｜DSML｜parameter name=\"a\" string=\"false\">[1]</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
                           "</｜DSML｜tool_calls>" + EOS;
  for (std::size_t n = 0; n <= good.size(); ++n) {
    EXPECT_NO_THROW(parse_completion(good.substr(0, n), true));
    EXPECT_NO_THROW(parse_completion(good.substr(0, n), false));
  }
  EXPECT_EQ(parse_completion(good, true).tool_calls.size(), 1u);
}

}  // namespace
}  // namespace dsv4
