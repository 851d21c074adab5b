// DeepSeek-V4's chat prompt format and the parsing of its completions. V4 ships no Jinja
// template; its reference is the Python `encoding/encoding_dsv4.py` in the model repository
// (also vendored in vLLM as vllm/tokenizers/deepseek_v4_encoding.py). This is our own C++
// rendition of its encode_messages / parse_message_from_completion_text; chat_encoding.cc
// lists where it deliberately differs.
//
// The prompt, in short (chat mode; thinking mode writes "<think>" where "</think>" follows
// the last user turn):
//   <｜begin▁of▁sentence｜>{system}\n\n## Tools ...            (tools block only with tools)
//   <｜User｜>{user}<｜Assistant｜></think>{answer}<｜end▁of▁sentence｜>
//   <｜User｜>{user}\n\n<tool_result>{result}</tool_result><｜Assistant｜></think>
// An assistant tool call is "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n
// <｜DSML｜parameter name=\"k\" string=\"true\">v</｜DSML｜parameter>\n</｜DSML｜invoke>\n
// </｜DSML｜tool_calls>" after its content; tool results become <tool_result> blocks of the
// next user turn, ordered like the calls.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dsv4 {

inline constexpr std::string_view kBosToken = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEosToken = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kUserToken = "<｜User｜>";
inline constexpr std::string_view kAssistantToken = "<｜Assistant｜>";
inline constexpr std::string_view kLatestReminderToken = "<｜latest_reminder｜>";
inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";
inline constexpr std::string_view kDsmlToken = "｜DSML｜";
inline constexpr std::string_view kToolCallsStart = "<｜DSML｜tool_calls>";
inline constexpr std::string_view kToolCallsEnd = "</｜DSML｜tool_calls>";

struct ToolCall {
  std::string id;         // OpenAI's tool_call id: not rendered, orders the tool results
  std::string name;
  std::string arguments;  // JSON text of an object (OpenAI's function.arguments)
};

struct ChatMessage {
  std::string role;  // "system", "developer", "user", "assistant", "tool", "latest_reminder"
  std::string content;
  std::string reasoning_content;     // assistant: its thinking
  std::vector<ToolCall> tool_calls;  // assistant
  std::string tool_call_id;          // tool: which call this answers
  std::string name;                  // tool: the function's name (V4 does not render it)
};

// The reference's reasoning-effort levels ("low", "high", "max"; none given is "low"). In
// thinking mode "high" and "max" put their "Reasoning Effort: ..." text at the very start of
// the prompt, before the first message; "low" adds nothing, and chat mode none of them.
enum class ReasoningEffort { kLow, kHigh, kMax };
// The level of a name the reference accepts ("low", "high", "max"), else nullopt.
std::optional<ReasoningEffort> parse_reasoning_effort(std::string_view name);

struct ChatOptions {
  // Thinking mode: the reply opens with "<think>" and earlier turns' reasoning is dropped
  // (unless tools are given). Chat mode: "</think>" right after the assistant tag.
  bool thinking = false;
  // End a prompt whose last turn is user/tool with "<｜Assistant｜>" + "<think>" or "</think>".
  bool add_generation_prompt = true;
  // The reference's drop_thinking; forced off when tools are given, as in the reference.
  bool drop_thinking = true;
  // Thinking mode: the level's text (if any) opens the prompt.
  ReasoningEffort reasoning_effort = ReasoningEffort::kLow;
  // A last assistant message is left open (no end-of-sentence) for the model to continue.
  bool continue_final_message = false;
};

// The prompt text (to be encoded with special tokens allowed). `tools` is OpenAI's request
// "tools" array ([{"type": "function", "function": {...}}]) or null/empty; its schemas are
// rendered as Python's json.dumps writes them, in the key order given (read requests with
// parse_python_json to keep the client's order and big integers; a plain Json converts, keys
// sorted).
// Throws Error on requests it cannot render: an unknown role, tools that are not an array
// of {"function": {...}} objects.
std::string render_chat_prompt(std::span<const ChatMessage> messages, const nlohmann::ordered_json& tools,
                               const ChatOptions& options);

struct ParsedCompletion {
  std::string reasoning_content;
  std::string content;
  std::vector<ToolCall> tool_calls;  // ids left empty: the server assigns them
  // Tool-call markup was found but malformed (kept in content), or a tool-call block came
  // before "</think>" (kept in reasoning; no calls are parsed from the reply then).
  bool tool_markup_error = false;
};

// Splits a completion (the text generated after the prompt, decoded with special tokens kept;
// an end-of-sentence and anything after it are ignored) into reasoning, content and tool
// calls, with arguments as JSON object text. Never throws on model output: malformed tool
// markup stays in `content`; in thinking mode a completion without "</think>" is all
// reasoning (it was cut off while thinking), and a tool-call block inside the reasoning is
// flagged (tool_markup_error) where the reference raises.
ParsedCompletion parse_completion(std::string_view text, bool thinking);

// JSON text read as Python's json.loads reads it, for python_json_dumps to write back as
// json.dumps does: parsed as everywhere (json_io.h: depth limit, no repeated keys; `where`
// names the source in errors), in document key order, except numbers: an integer beyond 64 bits
// keeps its digits (held as a binary value), a float past the double range reads as +-inf and
// one below it as +-0, and NaN / Infinity / -Infinity (which json.dumps writes) read as Python
// reads them. Throws Error on what Python would not read either (and on a repeated key, which
// Python would take).
nlohmann::ordered_json parse_python_json(std::string_view text, std::string_view where);

// Python's json.dumps(value, ensure_ascii=False): ", " and ": " separators, keys in the
// order given, floats as repr() writes them (1e+16, 1000000000000000.0, 1e-05, Infinity),
// binary values as the integer digits they hold (parse_python_json), invalid UTF-8 replaced
// by U+FFFD.
std::string python_json_dumps(const nlohmann::ordered_json& value);

}  // namespace dsv4
