// DeepSeek-V4 chat encoding (see chat_encoding.h), following encoding_dsv4.py:
//   encode_messages: request tools go on a leading system/developer message (a system message
//     with empty content is inserted if there is none: what vLLM's V4 tokenizer does);
//     merge_tool_messages (tool results become <tool_result> blocks of a user turn, and a
//     user message right after them joins that turn; blocks are joined with "\n\n");
//     sort_tool_results_by_call_order; drop_thinking (thinking mode, no tools: assistant
//     reasoning before the last user turn removed, developer messages there dropped);
//     BOS + render_message for each.
//   parse_message_from_completion_text: reasoning up to "</think>", content up to EOS or the
//     tool-call block, DSML invoke/parameter markup to {"name", "arguments"}.
// Differences, all on inputs the reference rejects or crashes on:
//   - parse_completion never throws: malformed tool markup is left in content (flagged), a
//     tool-call block before "</think>" is left in the reasoning (flagged), a missing
//     "</think>" in thinking mode makes everything reasoning, text after EOS is ignored,
//     whitespace between DSML tags is accepted, a parameter without string="..." is JSON if
//     it parses, and a string="false" value that is not JSON becomes a JSON string;
//   - tool-call arguments that are not a JSON object render as one string parameter
//     "arguments" (the older copy of the reference does that; vLLM's raises), empty ones as {};
//   - arguments that repeat a key are not read as JSON (json_io.h refuses them; Python keeps
//     the last value), so they render as the one string parameter too;
//   - the reference's quick-instruction "task" tokens, response_format and content blocks of
//     images are not supported (an OpenAI request cannot ask for the first two).
// The reasoning-effort texts are those of the current encoder (low / high / max); the first V4
// checkpoints' copy knew only "high" (no text) and "max" (today's "high" text).
#include "text/chat_encoding.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <system_error>

#include "common/error.h"
#include "common/json_io.h"

namespace dsv4 {
namespace {

// The reference's TOOLS_TEMPLATE with its placeholders filled in.
constexpr std::string_view kToolsHead =
    "## Tools\n"
    "\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by "
    "writing a \"<｜DSML｜tool_calls>\" block like the following:\n"
    "\n"
    "<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME\">\n"
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>\n"
    "\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types "
    "(numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n"
    "\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n"
    "\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n"
    "\n"
    "### Available Tool Schemas\n"
    "\n";
constexpr std::string_view kToolsTail =
    "\n"
    "\n"
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

// The reference's REASONING_EFFORT_PROMPTS for "high" and "max" ("low" is empty).
constexpr std::string_view kReasoningEffortHigh =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the "
    "root cause, rigorously stress-testing your logic against all potential paths, edge cases, and "
    "adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n"
    "\n";
constexpr std::string_view kReasoningEffortMax =
    "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively "
    "decompose the problem into its most fundamental components, trace every causal chain to its root, and "
    "resolve the underlying cause rather than any surface symptom.\n"
    "Do not stop reasoning until you have independently verified the solution from multiple angles and are "
    "certain that no assumption remains unchecked and no error remains undiscovered.\n"
    "\n";

std::string_view reasoning_effort_text(ReasoningEffort effort) {
  switch (effort) {
    case ReasoningEffort::kLow: break;
    case ReasoningEffort::kHigh: return kReasoningEffortHigh;
    case ReasoningEffort::kMax: return kReasoningEffortMax;
  }
  return {};
}

constexpr std::string_view kInvokeOpen = "<｜DSML｜invoke";
constexpr std::string_view kInvokeClose = "</｜DSML｜invoke>";
constexpr std::string_view kParameterOpen = "<｜DSML｜parameter";
constexpr std::string_view kParameterClose = "</｜DSML｜parameter>";

// JSON from a client or a model, read as Python reads it (parse_python_json), in its key
// order; nullopt if it is not such JSON.
std::optional<OrderedJson> parse_ordered(std::string_view text) {
  try {
    return parse_python_json(text, "tool-call arguments");
  } catch (const Error&) {
    return std::nullopt;
  }
}

// ---- Rendering --------------------------------------------------------------------------------

struct Block {
  bool tool_result = false;
  std::string text;
  std::string tool_call_id;
};

// A message after the reference's preprocessing.
struct Turn {
  std::string role;
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> tool_calls;
  std::vector<Block> blocks;  // user turns: text and tool results
  bool has_blocks = false;
  const OrderedJson* tools = nullptr;  // on the leading system/developer turn
};

std::string render_tools(const OrderedJson& tools) {
  std::string out(kToolsHead);
  for (std::size_t i = 0; i < tools.size(); ++i) {
    if (i > 0) out += '\n';
    out += python_json_dumps(tools[i]["function"]);
  }
  out += kToolsTail;
  return out;
}

// The reference's encode_arguments_to_dsml: one parameter per key of the arguments object.
std::string render_arguments(const std::string& arguments) {
  auto parameter = [](std::string_view key, bool is_string, std::string_view value) {
    std::string p = "<｜DSML｜parameter name=\"";
    p += key;
    p += "\" string=\"";
    p += is_string ? "true" : "false";
    p += "\">";
    p += value;
    p += kParameterClose;
    return p;
  };
  if (arguments.find_first_not_of(" \t\r\n") == std::string::npos) return "";
  std::optional<OrderedJson> parsed = parse_ordered(arguments);
  if (!parsed || !parsed->is_object()) return parameter("arguments", true, arguments);
  std::string out;
  for (const auto& [key, value] : parsed->items()) {
    if (!out.empty()) out += '\n';
    out += value.is_string() ? parameter(key, true, value.get_ref<const std::string&>())
                             : parameter(key, false, python_json_dumps(value));
  }
  return out;
}

std::string render_tool_calls(const std::vector<ToolCall>& calls) {
  std::string out = "\n\n";
  out += kToolCallsStart;
  out += '\n';
  for (std::size_t i = 0; i < calls.size(); ++i) {
    if (i > 0) out += '\n';
    out += "<｜DSML｜invoke name=\"" + calls[i].name + "\">\n";
    out += render_arguments(calls[i].arguments);
    out += '\n';
    out += kInvokeClose;
  }
  out += '\n';
  out += kToolCallsEnd;
  return out;
}

bool is_user_like(const std::string& role) { return role == "user" || role == "developer"; }

std::ptrdiff_t last_user_index(const std::vector<Turn>& turns) {
  for (auto i = static_cast<std::ptrdiff_t>(turns.size()) - 1; i >= 0; --i)
    if (is_user_like(turns[static_cast<std::size_t>(i)].role)) return i;
  return -1;
}

// merge_tool_messages + sort_tool_results_by_call_order.
std::vector<Turn> preprocess(std::span<const ChatMessage> messages, const OrderedJson& tools) {
  std::vector<Turn> input;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    static constexpr std::string_view kRoles[] = {"system", "developer", "user", "assistant", "tool",
                                                  "latest_reminder"};
    if (std::find(std::begin(kRoles), std::end(kRoles), m.role) == std::end(kRoles))
      fail("messages[{}]: role {:?} is not supported", i, m.role);
    Turn t;
    t.role = m.role;
    t.content = m.content;
    t.reasoning = m.reasoning_content;
    t.tool_calls = m.tool_calls;
    if (m.role == "tool") t.blocks.push_back({true, m.content, m.tool_call_id});
    input.push_back(std::move(t));
  }
  const bool has_tools = tools.is_array() && !tools.empty();
  if (has_tools) {
    if (input.empty() || (input[0].role != "system" && input[0].role != "developer")) {
      Turn system;
      system.role = "system";
      input.insert(input.begin(), std::move(system));
    }
    input[0].tools = &tools;
  }

  std::vector<Turn> merged;
  for (auto& t : input) {
    const bool into_previous = !merged.empty() && merged.back().role == "user" && merged.back().has_blocks;
    if (t.role == "tool") {
      if (into_previous) {
        merged.back().blocks.push_back(std::move(t.blocks[0]));
      } else {
        t.role = "user";
        t.content.clear();
        t.has_blocks = true;
        merged.push_back(std::move(t));
      }
    } else if (t.role == "user") {
      Block text{false, t.content, ""};
      if (into_previous) {
        merged.back().blocks.push_back(std::move(text));
      } else {
        t.blocks.push_back(std::move(text));
        t.has_blocks = true;
        merged.push_back(std::move(t));
      }
    } else {
      merged.push_back(std::move(t));
    }
  }

  std::map<std::string, std::size_t> call_order;
  for (auto& t : merged) {
    if (t.role == "assistant" && !t.tool_calls.empty()) {
      call_order.clear();
      for (std::size_t i = 0; i < t.tool_calls.size(); ++i)
        if (!t.tool_calls[i].id.empty()) call_order.emplace(t.tool_calls[i].id, i);
    } else if (t.role == "user" && t.has_blocks && !call_order.empty()) {
      std::vector<Block> results;
      for (const auto& b : t.blocks)
        if (b.tool_result) results.push_back(b);
      if (results.size() < 2) continue;
      auto rank = [&](const Block& b) {
        auto it = call_order.find(b.tool_call_id);
        return it == call_order.end() ? std::size_t{0} : it->second;
      };
      std::stable_sort(results.begin(), results.end(),
                       [&](const Block& x, const Block& y) { return rank(x) < rank(y); });
      std::size_t next = 0;
      for (auto& b : t.blocks)
        if (b.tool_result) b = results[next++];
    }
  }
  return merged;
}

// The reference's _drop_thinking_messages.
std::vector<Turn> drop_thinking(std::vector<Turn> turns) {
  const std::ptrdiff_t last_user = last_user_index(turns);
  std::vector<Turn> kept;
  for (std::size_t i = 0; i < turns.size(); ++i) {
    Turn& t = turns[i];
    const bool keep = t.role == "user" || t.role == "system" || t.role == "tool" || t.role == "latest_reminder" ||
                      static_cast<std::ptrdiff_t>(i) >= last_user;
    if (keep) {
      kept.push_back(std::move(t));
    } else if (t.role == "assistant") {
      t.reasoning.clear();
      kept.push_back(std::move(t));
    }  // developer messages before the last user turn are dropped
  }
  return kept;
}

}  // namespace

std::optional<ReasoningEffort> parse_reasoning_effort(std::string_view name) {
  if (name == "low") return ReasoningEffort::kLow;
  if (name == "high") return ReasoningEffort::kHigh;
  if (name == "max") return ReasoningEffort::kMax;
  return std::nullopt;
}

std::string render_chat_prompt(std::span<const ChatMessage> messages, const OrderedJson& tools,
                               const ChatOptions& options) {
  if (!tools.is_null() && !tools.is_array()) fail("tools: expected an array, found {}", tools.type_name());
  for (std::size_t i = 0; tools.is_array() && i < tools.size(); ++i) {
    const OrderedJson& tool = tools[i];
    if (!tool.is_object() || !tool.contains("function") || !tool["function"].is_object())
      fail("tools[{}]: expected an object with a \"function\" object", i);
  }
  std::vector<Turn> turns = preprocess(messages, tools);
  const bool drop = options.drop_thinking && !(tools.is_array() && !tools.empty());
  if (options.thinking && drop) turns = drop_thinking(std::move(turns));
  const std::ptrdiff_t last_user = last_user_index(turns);

  std::string prompt(kBosToken);
  for (std::size_t i = 0; i < turns.size(); ++i) {
    const Turn& t = turns[i];
    const auto index = static_cast<std::ptrdiff_t>(i);
    const bool last = i + 1 == turns.size();
    if (i == 0 && options.thinking) prompt += reasoning_effort_text(options.reasoning_effort);

    if (t.role == "system") {
      prompt += t.content;
      if (t.tools != nullptr) prompt += "\n\n" + render_tools(*t.tools);
    } else if (t.role == "developer") {
      prompt += kUserToken;
      prompt += t.content;
      if (t.tools != nullptr) prompt += "\n\n" + render_tools(*t.tools);
    } else if (t.role == "user") {
      prompt += kUserToken;
      for (std::size_t b = 0; b < t.blocks.size(); ++b) {
        if (b > 0) prompt += "\n\n";
        if (t.blocks[b].tool_result)
          prompt += "<tool_result>" + t.blocks[b].text + "</tool_result>";
        else
          prompt += t.blocks[b].text;
      }
    } else if (t.role == "latest_reminder") {
      prompt += kLatestReminderToken;
      prompt += t.content;
    } else {  // assistant
      if (options.thinking && (!drop || index > last_user)) {
        prompt += t.reasoning;
        prompt += kThinkEnd;
      }
      prompt += t.content;
      if (!t.tool_calls.empty()) prompt += render_tool_calls(t.tool_calls);
      if (!(last && options.continue_final_message)) prompt += kEosToken;
    }

    // What follows a turn: the assistant tag after a user turn that the assistant answers
    // next (or that ends the prompt), with "<think>" opening the reply in thinking mode.
    if (!last && turns[i + 1].role != "assistant" && turns[i + 1].role != "latest_reminder") continue;
    if (!is_user_like(t.role)) continue;
    if (last && !options.add_generation_prompt) continue;
    prompt += kAssistantToken;
    prompt += options.thinking && (!drop || index >= last_user) ? kThinkStart : kThinkEnd;
  }
  return prompt;
}

// ---- Parsing ---------------------------------------------------------------------------------

namespace {

class Cursor {
 public:
  explicit Cursor(std::string_view text) : text_(text) {}
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' || text_[pos_] == '\r' ||
                                   text_[pos_] == '\t'))
      ++pos_;
  }
  bool eat(std::string_view s) {
    if (text_.substr(pos_).substr(0, s.size()) != s) return false;
    pos_ += s.size();
    return true;
  }
  // The text up to `stop` (consumed, stop included), or nullopt if `stop` never comes.
  std::optional<std::string_view> until(std::string_view stop) {
    const auto at = text_.find(stop, pos_);
    if (at == std::string_view::npos) return std::nullopt;
    std::string_view out = text_.substr(pos_, at - pos_);
    pos_ = at + stop.size();
    return out;
  }
  std::string_view rest() const { return text_.substr(pos_); }

 private:
  std::string_view text_;
  std::size_t pos_ = 0;
};

// Parses what follows "<｜DSML｜tool_calls>" up to and including its end tag.
std::optional<std::vector<ToolCall>> parse_tool_block(Cursor& c) {
  std::vector<ToolCall> calls;
  while (true) {
    c.skip_space();
    if (c.eat(kToolCallsEnd)) return calls;
    if (!c.eat(kInvokeOpen)) return std::nullopt;
    c.skip_space();
    if (!c.eat("name=\"")) return std::nullopt;
    auto name = c.until("\">");
    if (!name) return std::nullopt;
    ToolCall call;
    call.name = std::string(*name);
    std::vector<std::string> keys;
    std::string arguments = "{";
    while (true) {
      c.skip_space();
      if (c.eat(kInvokeClose)) break;
      if (!c.eat(kParameterOpen)) return std::nullopt;
      c.skip_space();
      if (!c.eat("name=\"")) return std::nullopt;
      auto header = c.until(">");  // key"  string="true"   or  key"
      if (!header) return std::nullopt;
      std::string_view key;
      std::optional<bool> is_string;
      if (header->ends_with("\" string=\"true\"")) {
        key = header->substr(0, header->size() - std::string_view("\" string=\"true\"").size());
        is_string = true;
      } else if (header->ends_with("\" string=\"false\"")) {
        key = header->substr(0, header->size() - std::string_view("\" string=\"false\"").size());
        is_string = false;
      } else if (header->ends_with("\"") && header->find('"') == header->size() - 1) {
        key = header->substr(0, header->size() - 1);  // no string="..." attribute
      } else {
        return std::nullopt;
      }
      auto value = c.until(kParameterClose);
      if (!value) return std::nullopt;
      if (std::find(keys.begin(), keys.end(), key) != keys.end()) return std::nullopt;  // duplicate
      keys.emplace_back(key);
      const bool as_json = is_string != std::optional<bool>(true) && parse_ordered(*value).has_value();
      if (arguments.size() > 1) arguments += ", ";
      arguments += python_json_dumps(std::string(key)) + ": ";
      arguments += as_json ? std::string(*value) : python_json_dumps(std::string(*value));
    }
    call.arguments = arguments + "}";
    calls.push_back(std::move(call));
  }
}

}  // namespace

ParsedCompletion parse_completion(std::string_view text, bool thinking) {
  ParsedCompletion out;
  if (const auto eos = text.find(kEosToken); eos != std::string_view::npos) text = text.substr(0, eos);
  std::string_view rest = text;
  if (thinking) {
    if (rest.starts_with(kThinkStart)) rest.remove_prefix(kThinkStart.size());
    const auto end = rest.find(kThinkEnd);
    out.reasoning_content = std::string(rest.substr(0, end));
    // A tool-call block belongs after "</think>"; one inside the reasoning is malformed (the
    // reference rejects it as a missing "</think>"): it stays reasoning, flagged.
    out.tool_markup_error = out.reasoning_content.find(kToolCallsStart) != std::string::npos;
    if (end == std::string_view::npos) return out;
    rest.remove_prefix(end + kThinkEnd.size());
  }
  const auto start = rest.find(kToolCallsStart);
  if (start == std::string_view::npos || out.tool_markup_error) {
    out.content = std::string(rest);
    return out;
  }
  Cursor cursor(rest.substr(start + kToolCallsStart.size()));
  auto calls = parse_tool_block(cursor);
  if (!calls || cursor.rest().find_first_not_of(" \t\r\n") != std::string_view::npos) {
    out.content = std::string(rest);
    out.tool_markup_error = true;
    return out;
  }
  std::string_view before = rest.substr(0, start);
  if (before.ends_with("\n\n")) before.remove_suffix(2);
  out.content = std::string(before);
  out.tool_calls = std::move(*calls);
  return out;
}

namespace {

// Python's int() refuses decimal strings of more than this many digits
// (sys.int_info.default_max_str_digits), and so does json.loads.
constexpr std::size_t kPythonMaxIntDigits = 4300;

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// The length of the JSON number token at the start of `s` (-?(0|[1-9]d*)(.d+)?([eE][+-]?d+)?),
// or 0 if it does not start with one.
std::size_t number_token_length(std::string_view s) {
  std::size_t i = 0;
  auto digits = [&] {
    const std::size_t from = i;
    while (i < s.size() && is_digit(s[i])) ++i;
    return i > from;
  };
  if (i < s.size() && s[i] == '-') ++i;
  if (i < s.size() && s[i] == '0') {
    ++i;
  } else if (!digits()) {
    return 0;
  }
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (!digits()) return 0;
  }
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (!digits()) return 0;
  }
  return i;
}

bool is_integer_token(std::string_view token) { return token.find_first_of(".eE") == std::string_view::npos; }

// The constants json.loads reads for non-finite floats (and json.dumps writes): the length of
// "NaN", "Infinity" or "-Infinity" at the start of `s` when no letter, digit or '_' follows.
std::size_t non_finite_token_length(std::string_view s) {
  for (std::string_view name : {"NaN", "Infinity", "-Infinity"}) {
    if (!s.starts_with(name)) continue;
    if (s.size() > name.size()) {
      const auto next = static_cast<unsigned char>(s[name.size()]);
      if (std::isalnum(next) != 0 || next == '_') return 0;
    }
    return name.size();
  }
  return 0;
}

// Whether nlohmann would read `token` exactly: an integer in int64 / uint64 range.
bool fits_64_bits(std::string_view token) {
  if (!is_integer_token(token)) return false;
  const char* end = token.data() + token.size();
  if (token.starts_with('-')) {
    std::int64_t v = 0;
    return std::from_chars(token.data(), end, v).ec == std::errc();
  }
  std::uint64_t v = 0;
  return std::from_chars(token.data(), end, v).ec == std::errc();
}

// Python's float(token) for a JSON number token: correctly rounded, with +-inf past the largest
// double and +-0 below the smallest (where from_chars reports out of range).
double python_float(std::string_view token) {
  double value = 0;
  const auto [ptr, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
  if (ec == std::errc()) return value;
  const bool negative = token.starts_with('-');
  if (negative) token.remove_prefix(1);
  // Out of range: too large if its first significant digit stands at 10^0 or above.
  const std::size_t e = token.find_first_of("eE");
  const std::string_view mantissa = token.substr(0, e);
  const std::size_t point = std::min(mantissa.find('.'), mantissa.size());
  const std::size_t first = mantissa.find_first_of("123456789");
  std::int64_t exponent = 0;
  if (e != std::string_view::npos) {
    std::string_view x = token.substr(e + 1);
    const bool x_negative = x.starts_with('-');
    if (x.starts_with('-') || x.starts_with('+')) x.remove_prefix(1);
    for (char c : x) exponent = std::min<std::int64_t>(exponent * 10 + (c - '0'), std::int64_t{1} << 40);
    if (x_negative) exponent = -exponent;
  }
  const std::int64_t order = static_cast<std::int64_t>(point) - static_cast<std::int64_t>(first) -
                             (first < point ? 1 : 0) + exponent;
  const double magnitude = first != std::string_view::npos && order >= 0 ? std::numeric_limits<double>::infinity() : 0.0;
  return negative ? -magnitude : magnitude;
}

// Puts back, in document order, the number tokens that parse_python_json set aside.
void restore_numbers(OrderedJson& value, const std::vector<std::string_view>& tokens, std::size_t& next,
                     std::string_view where) {
  if (value.is_structured()) {
    for (auto& item : value) restore_numbers(item, tokens, next, where);
    return;
  }
  if (!value.is_number_float()) return;
  const std::string_view token = tokens.at(next++);
  if (token == "NaN") {
    value = std::numeric_limits<double>::quiet_NaN();
    return;
  }
  if (token == "Infinity" || token == "-Infinity") {
    value = token.starts_with('-') ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
    return;
  }
  if (!is_integer_token(token)) {
    value = python_float(token);
    return;
  }
  const std::size_t digits = token.size() - (token.starts_with('-') ? 1 : 0);
  if (digits > kPythonMaxIntDigits) {
    fail("{}: an integer of {} digits, more than Python reads ({})", where, digits, kPythonMaxIntDigits);
  }
  value = OrderedJson::binary(std::vector<std::uint8_t>(token.begin(), token.end()));
}

// Python's repr() of a float, which json.dumps writes: the shortest digits that read back the
// same, in positional notation for decimal exponents from -4 to 15 (with ".0" if integral),
// else as d.ddde+XX.
std::string python_float_repr(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
  std::array<char, 64> buffer{};
  const auto result = std::to_chars(buffer.data(), buffer.data() + buffer.size(), x, std::chars_format::scientific);
  std::string_view s(buffer.data(), static_cast<std::size_t>(result.ptr - buffer.data()));  // -d.ddde+XX
  std::string out;
  if (s.starts_with('-')) {
    out += '-';
    s.remove_prefix(1);
  }
  const std::size_t e = s.find('e');
  std::string digits;
  for (char c : s.substr(0, e))
    if (c != '.') digits += c;
  int exponent = 0;
  for (char c : s.substr(e + 2)) exponent = exponent * 10 + (c - '0');
  if (s[e + 1] == '-') exponent = -exponent;

  if (exponent < -4 || exponent >= 16) {
    out += digits[0];
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += exponent < 0 ? "e-" : "e+";
    if (std::abs(exponent) < 10) out += '0';
    out += std::to_string(std::abs(exponent));
  } else if (exponent < 0) {
    out += "0.";
    out.append(static_cast<std::size_t>(-exponent - 1), '0');
    out += digits;
  } else {
    const auto point = static_cast<std::size_t>(exponent) + 1;
    if (digits.size() <= point) {
      out += digits;
      out.append(point - digits.size(), '0');
      out += ".0";
    } else {
      out += digits.substr(0, point) + "." + digits.substr(point);
    }
  }
  return out;
}

}  // namespace

OrderedJson parse_python_json(std::string_view text, std::string_view where) {
  // Number tokens that nlohmann would not read exactly (floats, and integers beyond 64 bits,
  // which it makes doubles or refuses past the double range) are set aside and replaced by
  // "0.0" for the structural parse, then put back as Python reads them; so are NaN, Infinity and
  // -Infinity, which nlohmann does not read at all.
  std::string replaced;
  std::vector<std::string_view> tokens;
  std::size_t copied = 0;
  for (std::size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (c == '"') {  // skip the string
      for (++i; i < text.size() && text[i] != '"'; ++i)
        if (text[i] == '\\') ++i;
      ++i;
      continue;
    }
    // NaN / Infinity / -Infinity, as json.loads reads them (not after a '-': "-NaN" stays an error).
    if (const std::size_t n = non_finite_token_length(text.substr(i)); n > 0 && (i == 0 || text[i - 1] != '-')) {
      replaced.append(text.substr(copied, i - copied));
      replaced += "0.0";
      copied = i + n;
      tokens.push_back(text.substr(i, n));
      i += n;
      continue;
    }
    if (c != '-' && !is_digit(c)) {
      ++i;
      continue;
    }
    const std::size_t length = number_token_length(text.substr(i));
    if (length == 0) {
      ++i;
      continue;
    }
    const std::string_view token = text.substr(i, length);
    if (!fits_64_bits(token)) {
      replaced.append(text.substr(copied, i - copied));
      replaced += "0.0";
      copied = i + length;
      tokens.push_back(token);
    }
    i += length;
  }
  if (tokens.empty()) return parse_ordered_json(text, where);
  replaced.append(text.substr(copied));
  OrderedJson value = parse_ordered_json(replaced, where);
  std::size_t next = 0;
  restore_numbers(value, tokens, next, where);
  return value;
}

std::string python_json_dumps(const OrderedJson& value) {
  switch (value.type()) {
    case OrderedJson::value_t::object: {
      std::string out = "{";
      bool first = true;
      for (const auto& [key, item] : value.items()) {
        if (!first) out += ", ";
        first = false;
        out += OrderedJson(key).dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
        out += ": ";
        out += python_json_dumps(item);
      }
      return out + "}";
    }
    case OrderedJson::value_t::array: {
      std::string out = "[";
      for (std::size_t i = 0; i < value.size(); ++i) {
        if (i > 0) out += ", ";
        out += python_json_dumps(value[i]);
      }
      return out + "]";
    }
    case OrderedJson::value_t::number_float:
      return python_float_repr(value.get<double>());
    case OrderedJson::value_t::binary: {  // an integer's digits (parse_python_json)
      const auto& digits = value.get_binary();
      return std::string(digits.begin(), digits.end());
    }
    default:
      return value.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
  }
}

}  // namespace dsv4
