// OpenAI request parsing and response JSON (openai_protocol.h).
#include "server/openai_protocol.h"

#include <fmt/format.h>

#include <limits>

#include "common/error.h"
#include "common/json_reader.h"
#include "text/utf8.h"

namespace dsv4::server {

void throw_api_error(int status, std::string message, std::string param, std::string code) {
  throw ApiException(ApiError{status, std::move(message), {}, std::move(param), std::move(code)});
}

std::string error_type_for_status(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    default: break;
  }
  return status >= 500 ? "server_error" : "invalid_request_error";
}

Json error_json(const ApiError& e) {
  Json body = {{"message", e.message},
               {"type", e.type.empty() ? error_type_for_status(e.status) : e.type},
               {"param", e.param.empty() ? Json(nullptr) : Json(e.param)},
               {"code", e.code.empty() ? Json(nullptr) : Json(e.code)}};
  return Json{{"error", std::move(body)}};
}

namespace {

// Request bodies: null means absent, as in OpenAI's API.
constexpr const char* kBody = "the request body";
constexpr JsonRules kBodyRules{.null_is_absent = true};
constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();

[[noreturn]] void bad(const std::string& param, const std::string& code, std::string message) {
  throw_api_error(400, std::move(message), param, code);
}

[[noreturn]] void unsupported(const std::string& param, std::string_view what) {
  bad(param, "unsupported_parameter", fmt::format("Unsupported parameter '{}': {}", param, what));
}

// A field the JSON reader refused, in OpenAI's words: its message, the field as "param" and
// the code (missing_required_parameter, invalid_type, invalid_value).
ApiError api_error(const JsonFieldError& e) {
  switch (e.kind()) {
    case JsonFieldError::Kind::kMissing:
      return {400, fmt::format("Missing required parameter: '{}'.", e.field()), {}, e.field(),
              "missing_required_parameter"};
    case JsonFieldError::Kind::kWrongType: {
      const std::string_view found = e.found();
      const char* article = found.starts_with("null")                                             ? ""
                            : found.starts_with("integer") || found.starts_with("object") ||
                                      found.starts_with("array")                                  ? "an "
                                                                                                  : "a ";
      return {400, fmt::format("Invalid type for '{}': expected {}, but got {}{} instead.", e.field(), e.expected(),
                               article, found),
              {}, e.field(), "invalid_type"};
    }
    case JsonFieldError::Kind::kOutOfRange:
      break;
  }
  return {400, fmt::format("Invalid value for '{}': expected {}, but got {}.", e.field(), e.expected(), e.found()), {},
          e.field(), "invalid_value"};
}

// A value read under a name of our choosing (array elements that OpenAI reports as the array).
JsonField body_field(const Json& value, std::string param) {
  return JsonField(value, kBody, std::move(param), kBodyRules);
}

std::int32_t token_id(const JsonField& v, std::int64_t vocab) {
  return static_cast<std::int32_t>(v.integer(0, vocab - 1));
}

void parse_prompt(const JsonObject& body, ApiRequest& r, const ProtocolLimits& limits) {
  constexpr std::string_view kPromptTypes = "a string, an array of strings or an array of token ids";
  const JsonField prompt = body.get("prompt");
  const Json& p = prompt.json();
  if (p.is_string()) {
    r.prompt_text = p.get<std::string>();
    return;
  }
  if (!p.is_array()) prompt.wrong_type(kPromptTypes);
  if (p.empty()) bad("prompt", "invalid_value", "Invalid 'prompt': the array is empty.");
  const Json* tokens = &p;
  if (p[0].is_string() || p[0].is_array()) {
    if (p.size() != 1) {
      bad("prompt", "unsupported_parameter",
          fmt::format("Invalid 'prompt': {} prompts in one request; this server takes one prompt per request.", p.size()));
    }
    if (p[0].is_string()) {
      r.prompt_text = p[0].get<std::string>();
      return;
    }
    tokens = &p[0];
    if (tokens->empty()) bad("prompt", "invalid_value", "Invalid 'prompt': the token id array is empty.");
  }
  r.prompt_tokens.reserve(tokens->size());
  for (const Json& t : *tokens) {
    const JsonField token = body_field(t, "prompt");
    if (!t.is_number_integer()) token.wrong_type(kPromptTypes);
    r.prompt_tokens.push_back(token_id(token, limits.vocab_size));
  }
}

// A message's content: a string, or text parts joined with "\n" (as vLLM joins them).
std::string message_content(const JsonField& content) {
  if (content.json().is_string()) return content.json().get<std::string>();
  if (!content.json().is_array()) content.wrong_type("a string or an array of content parts");
  std::string text;
  bool first = true;
  for (const JsonField& item : content.array()) {
    const JsonObject part = item.object();
    const std::string type = part.string("type");
    if (type != "text") {
      unsupported(part.path("type"), fmt::format("content parts of type '{}' are not supported; only 'text' is.", type));
    }
    if (!first) text += '\n';
    first = false;
    text += part.string("text");
  }
  return text;
}

void parse_messages(const JsonObject& body, ApiRequest& r, const ProtocolLimits& limits) {
  const std::vector<JsonField> messages = body.array("messages");
  if (messages.empty()) bad("messages", "invalid_value", "Invalid 'messages': expected a non-empty array.");
  if (messages.size() > limits.max_messages) {
    bad("messages", "invalid_value",
        fmt::format("Invalid 'messages': {} messages, more than {}.", messages.size(), limits.max_messages));
  }
  for (const JsonField& item : messages) {
    const JsonObject m = item.object();
    const std::string& at = item.path();
    ChatMessage message;
    message.role = m.string("role");
    if (message.role != "system" && message.role != "developer" && message.role != "user" &&
        message.role != "assistant" && message.role != "tool") {
      bad(at + ".role", "invalid_value",
          fmt::format("Invalid value for '{}.role': '{}'; expected one of system, developer, user, assistant, tool.", at,
                      message.role));
    }
    if (const auto content = m.find("content")) {
      message.content = message_content(*content);
    } else if (message.role != "assistant") {
      (void)m.get("content");  // missing: only the assistant may leave it out
    }
    // vLLM's "reasoning", or the older "reasoning_content"; "reasoning" wins when both are given
    // (vLLM reads only "reasoning"). Both are type-checked.
    const std::optional<std::string> reasoning = m.optional_string("reasoning");
    const std::optional<std::string> reasoning_content = m.optional_string("reasoning_content");
    message.reasoning_content = reasoning.value_or(reasoning_content.value_or(""));
    if (const auto calls = m.optional_array("tool_calls")) {
      for (const JsonField& call_field : *calls) {
        const JsonObject call = call_field.object();
        const JsonObject fn = call.object("function");
        ToolCall tool;
        tool.id = call.optional_string("id").value_or("");
        tool.name = fn.string("name");
        tool.arguments = fn.optional_string("arguments").value_or("{}");
        message.tool_calls.push_back(std::move(tool));
      }
    }
    message.tool_call_id = m.optional_string("tool_call_id").value_or("");
    message.name = m.optional_string("name").value_or("");
    r.messages.push_back(std::move(message));
  }
}

void parse_stop(const JsonObject& f, ApiRequest& r, const ProtocolLimits& limits) {
  constexpr std::string_view kStopTypes = "a string or an array of strings";
  const auto stop = f.find("stop");
  if (!stop) return;
  const Json& value = stop->json();
  if (value.is_string()) {
    r.stop.push_back(value.get<std::string>());
  } else if (value.is_array()) {
    if (value.size() > limits.max_stop) {
      bad("stop", "invalid_value",
          fmt::format("Invalid 'stop': {} stop strings, at most {} are allowed.", value.size(), limits.max_stop));
    }
    for (const Json& s : value) {
      if (!s.is_string()) body_field(s, "stop").wrong_type(kStopTypes);
      r.stop.push_back(s.get<std::string>());
    }
  } else {
    stop->wrong_type(kStopTypes);
  }
  for (const std::string& s : r.stop) {
    if (s.empty()) bad("stop", "invalid_value", "Invalid 'stop': stop strings must not be empty.");
  }
}

void parse_tools(const JsonObject& f, ApiRequest& r) {
  const auto tools = f.optional_array("tools");
  if (!tools) return;
  for (const JsonField& item : *tools) {
    const JsonObject tool = item.object();
    if (auto type = tool.optional_string("type"); type && *type != "function") {
      unsupported(tool.path("type"), fmt::format("tools of type '{}' are not supported; only 'function' is.", *type));
    }
    (void)tool.object("function").string("name");
  }
  if (const auto choice = f.find("tool_choice")) {
    if (!choice->json().is_string()) unsupported("tool_choice", "only \"auto\" and \"none\" are supported.");
    const std::string c = choice->json().get<std::string>();
    if (c == "none") return;  // the model is not told about the tools
    if (c != "auto") unsupported("tool_choice", "only \"auto\" and \"none\" are supported.");
  }
  if (!tools->empty()) r.tools = OrderedJson(f.get("tools").json());  // keys sorted; see parse_api_request
}

void refuse_unsupported(const JsonObject& f, Endpoint endpoint) {
  if (auto n = f.optional_integer("n", 1, kInt64Max); n && *n != 1) unsupported("n", "only n = 1 is supported.");
  if (auto b = f.optional_integer("best_of", 1, kInt64Max); b && *b != 1) {
    unsupported("best_of", "only best_of = 1 is supported.");
  }
  if (auto p = f.optional_number("presence_penalty", -2, 2); p && *p != 0) {
    unsupported("presence_penalty", "penalties are not supported.");
  }
  if (auto p = f.optional_number("frequency_penalty", -2, 2); p && *p != 0) {
    unsupported("frequency_penalty", "penalties are not supported.");
  }
  if (auto p = f.optional_number("repetition_penalty", 0, 1e9, /*min_open=*/true); p && *p != 1) {
    unsupported("repetition_penalty", "penalties are not supported.");
  }
  if (auto m = f.optional_integer("min_tokens", 0, kInt64Max); m && *m != 0) {
    unsupported("min_tokens", "min_tokens is not supported.");
  }
  if (auto bias = f.optional_object("logit_bias"); bias && !bias->json().empty()) {
    unsupported("logit_bias", "logit_bias is not supported.");
  }
  if (endpoint == Endpoint::kCompletions) {
    if (auto echo = f.optional_boolean("echo"); echo && *echo) unsupported("echo", "echo is not supported.");
    if (auto suffix = f.optional_string("suffix"); suffix && !suffix->empty()) {
      unsupported("suffix", "suffix is not supported.");
    }
  } else {
    if (const auto format = f.optional_object("response_format")) {
      const auto type = format->find("type");
      if (!type || type->json() != "text") unsupported("response_format", "only {\"type\": \"text\"} is supported.");
    }
  }
}

ApiRequest parse_fields(const JsonObject& f, Endpoint endpoint, const ProtocolLimits& limits) {
  const bool chat = endpoint == Endpoint::kChat;
  ApiRequest r;
  r.endpoint = endpoint;
  r.model = f.optional_string("model").value_or("");
  if (chat) {
    parse_messages(f, r, limits);
  } else {
    parse_prompt(f, r, limits);
  }
  refuse_unsupported(f, endpoint);

  r.stream = f.optional_boolean("stream").value_or(false);
  if (const auto options = f.optional_object("stream_options")) {
    if (!r.stream) bad("stream_options", "invalid_value", "Invalid 'stream_options': only allowed when 'stream' is true.");
    r.include_usage = options->optional_boolean("include_usage").value_or(false);
    r.continuous_usage = options->optional_boolean("continuous_usage_stats").value_or(false);
  }

  SamplingParams& s = r.sampling;
  // Legacy completions default to 16 tokens (as OpenAI and vLLM); chat runs to the context end.
  if (chat) {
    auto max_completion = f.optional_integer("max_completion_tokens", 1, kInt64Max);
    s.max_tokens = max_completion ? max_completion : f.optional_integer("max_tokens", 1, kInt64Max);
  } else {
    s.max_tokens = f.optional_integer("max_tokens", 1, kInt64Max).value_or(16);
  }
  s.temperature = f.optional_number("temperature", 0, 2).value_or(1.0);
  s.top_p = f.optional_number("top_p", 0, 1, /*min_open=*/true).value_or(1.0);
  s.top_k = f.optional_integer("top_k", -1, kInt64Max).value_or(0);
  if (auto seed = f.optional_integer("seed")) s.seed = static_cast<std::uint64_t>(*seed);
  s.ignore_eos = f.optional_boolean("ignore_eos").value_or(false);
  if (const auto ids = f.find("stop_token_ids")) {
    if (!ids->json().is_array()) ids->wrong_type("an array of token ids");
    for (const Json& id : ids->json()) {
      s.stop_token_ids.push_back(token_id(body_field(id, "stop_token_ids"), limits.vocab_size));
    }
  }
  parse_stop(f, r, limits);
  r.include_stop_str_in_output = f.optional_boolean("include_stop_str_in_output").value_or(false);
  r.skip_special_tokens = f.optional_boolean("skip_special_tokens").value_or(true);
  r.return_token_ids = f.optional_boolean("return_token_ids").value_or(false);
  (void)f.optional_string("user");

  if (chat) {
    parse_tools(f, r);
    if (const auto kwargs = f.optional_object("chat_template_kwargs")) {
      r.thinking = kwargs->optional_boolean("thinking").value_or(
          kwargs->optional_boolean("enable_thinking").value_or(false));
    }
    if (const auto effort = f.optional_string("reasoning_effort")) {
      const auto level = parse_reasoning_effort(*effort);
      if (!level) {
        bad("reasoning_effort", "invalid_value",
            fmt::format("Invalid value for 'reasoning_effort': '{}'; expected one of low, high, max.", *effort));
      }
      r.reasoning_effort = *level;
    }
    r.add_generation_prompt = f.optional_boolean("add_generation_prompt").value_or(true);
    r.continue_final_message = f.optional_boolean("continue_final_message").value_or(false);
    if (r.continue_final_message && r.add_generation_prompt && f.has("add_generation_prompt")) {
      bad("continue_final_message", "invalid_value",
          "Invalid 'continue_final_message': cannot be combined with 'add_generation_prompt' = true.");
    }
    if (r.continue_final_message) {
      r.add_generation_prompt = false;
      if (r.messages.back().role != "assistant") {
        bad("continue_final_message", "invalid_value", "Invalid 'continue_final_message': the last message must be the assistant's.");
      }
    }
    r.logprobs = f.optional_boolean("logprobs").value_or(false);
    auto top = f.optional_integer("top_logprobs", 0, limits.max_logprobs);
    if (top && !r.logprobs) bad("top_logprobs", "invalid_value", "Invalid 'top_logprobs': requires 'logprobs' to be true.");
    if (r.logprobs) s.logprobs = top.value_or(0);
  } else {
    if (auto n = f.optional_integer("logprobs", 0, limits.max_logprobs)) {
      r.logprobs = true;
      s.logprobs = *n;
    }
  }
  return r;
}

}  // namespace

ApiRequest parse_api_request(std::string_view body, Endpoint endpoint, const ProtocolLimits& limits) {
  Json json;
  try {
    json = parse_json(body, kBody);
  } catch (const Error& e) {
    throw_api_error(400, fmt::format("We could not parse the JSON body of your request: {}", e.what()), {}, "invalid_json");
  }
  ApiRequest request = parse_api_json(json, endpoint, limits);
  if (!request.tools.is_null()) {
    // Tool schemas are rendered as json.dumps writes them, in the client's key order and with
    // integers beyond 64 bits exact: take them from a parse that keeps both.
    const OrderedJson ordered = parse_python_json(body, kBody);  // parsed once already: no throw
    if (ordered.is_object() && ordered.contains("tools")) request.tools = ordered["tools"];
  }
  return request;
}

ApiRequest parse_api_json(const Json& body, Endpoint endpoint, const ProtocolLimits& limits) {
  if (!body.is_object()) {
    throw_api_error(400, fmt::format("The request body must be a JSON object, not {}.", json_type_name(body)), {},
                    "invalid_type");
  }
  try {
    return parse_fields(JsonObject(body, kBody, kBodyRules), endpoint, limits);
  } catch (const JsonFieldError& e) {
    throw ApiException(api_error(e));
  }
}

ChatOptions chat_options(const ApiRequest& request) {
  ChatOptions options;
  options.thinking = request.thinking;
  options.reasoning_effort = request.reasoning_effort;
  options.add_generation_prompt = request.add_generation_prompt;
  options.continue_final_message = request.continue_final_message;
  return options;
}

void check_context_length(const ApiRequest& r, std::int64_t prompt_tokens, std::int64_t max_model_len) {
  const char* prompt_param = r.endpoint == Endpoint::kChat ? "messages" : "prompt";
  if (prompt_tokens >= max_model_len) {
    throw_api_error(400,
                    fmt::format("This model's maximum context length is {} tokens. However, your request has {} input "
                                "tokens, which leaves no room for output. Please reduce the length of the input.",
                                max_model_len, prompt_tokens),
                    prompt_param, "context_length_exceeded");
  }
  if (r.sampling.max_tokens && *r.sampling.max_tokens > max_model_len - prompt_tokens) {
    const char* param = r.endpoint == Endpoint::kChat ? "max_completion_tokens" : "max_tokens";
    throw_api_error(400,
                    fmt::format("'{}' is too large: {}. This model's maximum context length is {} tokens and your "
                                "request has {} input tokens ({} > {} - {}).",
                                param, *r.sampling.max_tokens, max_model_len, prompt_tokens, *r.sampling.max_tokens,
                                max_model_len, prompt_tokens),
                    param, "context_length_exceeded");
  }
}

Json usage_json(const Usage& u) {
  return Json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

std::string finish_reason_text(FinishReason reason) { return std::string(finish_reason_name(reason)); }

ResponseBuilder::ResponseBuilder(const ApiRequest& request, std::string id, std::string model, std::int64_t created,
                                 const TextCodec& codec)
    : request_(request), id_(std::move(id)), model_(std::move(model)), created_(created), codec_(codec) {}

Json ResponseBuilder::base(std::string_view object) const {
  return Json{{"id", id_}, {"object", object}, {"created", created_}, {"model", model_}};
}

namespace {

Json byte_list(const std::string& text) {
  Json bytes = Json::array();
  for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
  return bytes;
}

Json optional_string(const std::optional<std::string>& s) { return s ? Json(*s) : Json(nullptr); }

}  // namespace

Json ResponseBuilder::completion_logprobs(const std::vector<SampledToken>& tokens) {
  Json out = {{"text_offset", Json::array()}, {"token_logprobs", Json::array()}, {"tokens", Json::array()},
              {"top_logprobs", Json::array()}};
  for (const SampledToken& t : tokens) {
    const std::string text = codec_.token_text(t.token);
    out["text_offset"].push_back(text_offset_);
    text_offset_ += static_cast<std::int64_t>(utf8::count_char_starts(text));
    out["token_logprobs"].push_back(t.logprob);
    out["tokens"].push_back(text);
    Json top = Json::object();
    for (const TokenLogprob& alt : t.top_logprobs) top[codec_.token_text(alt.token)] = alt.logprob;
    out["top_logprobs"].push_back(std::move(top));
  }
  return out;
}

Json ResponseBuilder::chat_logprobs(const std::vector<SampledToken>& tokens) const {
  Json content = Json::array();
  for (const SampledToken& t : tokens) {
    const std::string text = codec_.token_text(t.token);
    Json top = Json::array();
    for (const TokenLogprob& alt : t.top_logprobs) {
      const std::string alt_text = codec_.token_text(alt.token);
      top.push_back({{"token", alt_text}, {"logprob", alt.logprob}, {"bytes", byte_list(alt_text)}});
    }
    content.push_back({{"token", text}, {"logprob", t.logprob}, {"bytes", byte_list(text)}, {"top_logprobs", std::move(top)}});
  }
  return Json{{"content", std::move(content)}};
}

Json ResponseBuilder::role_chunk() const {
  Json chunk = base("chat.completion.chunk");
  chunk["choices"] = Json::array({Json{{"index", 0},
                                       {"delta", {{"role", "assistant"}, {"content", ""}}},
                                       {"logprobs", nullptr},
                                       {"finish_reason", nullptr}}});
  chunk["usage"] = nullptr;
  return chunk;
}

Json ResponseBuilder::tool_calls_json(const std::vector<ToolCall>& calls, bool with_index) {
  Json out = Json::array();
  for (std::size_t i = 0; i < calls.size(); ++i) {
    Json call = {{"id", fmt::format("call_{}_{}", id_, tool_calls_made_++)},
                 {"type", "function"},
                 {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (with_index) call["index"] = i;
    out.push_back(std::move(call));
  }
  return out;
}

Json ResponseBuilder::chunk(const Piece& piece, const std::optional<Usage>& usage) {
  const bool chat = request_.endpoint == Endpoint::kChat;
  Json choice = {{"index", 0}};
  std::optional<std::string> finish = piece.finish_reason;
  if (chat) {
    Json delta = Json::object();
    if (!piece.reasoning.empty()) delta["reasoning_content"] = piece.reasoning;
    if (!piece.text.empty()) delta["content"] = piece.text;
    if (!piece.tool_calls.empty()) {
      delta["tool_calls"] = tool_calls_json(piece.tool_calls, /*with_index=*/true);
      if (finish == "stop") finish = "tool_calls";
    }
    if (delta.empty() && !piece.finish_reason) delta["content"] = "";
    choice["delta"] = std::move(delta);
    choice["logprobs"] = request_.logprobs && !piece.logprobs.empty() ? chat_logprobs(piece.logprobs) : Json(nullptr);
  } else {
    choice["text"] = piece.text;
    choice["logprobs"] = request_.logprobs && !piece.logprobs.empty() ? completion_logprobs(piece.logprobs) : Json(nullptr);
  }
  choice["finish_reason"] = optional_string(finish);
  choice["stop_reason"] = optional_string(piece.stop_reason);
  if (request_.return_token_ids) choice["token_ids"] = piece.tokens;
  Json chunk = base(chat ? "chat.completion.chunk" : "text_completion");
  chunk["choices"] = Json::array({std::move(choice)});
  chunk["usage"] = usage ? usage_json(*usage) : Json(nullptr);
  return chunk;
}

Json ResponseBuilder::usage_chunk(const Usage& usage) const {
  Json chunk = base(request_.endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion");
  chunk["choices"] = Json::array();
  chunk["usage"] = usage_json(usage);
  return chunk;
}

Json ResponseBuilder::response(const Piece& whole, const Usage& usage, const std::vector<std::int32_t>& prompt_tokens) {
  const bool chat = request_.endpoint == Endpoint::kChat;
  Json choice = {{"index", 0}};
  std::optional<std::string> finish = whole.finish_reason;
  if (chat) {
    const ParsedCompletion parsed = parse_completion(whole.text, request_.thinking);
    Json message = {{"role", "assistant"}, {"content", parsed.content}};
    if (request_.thinking) message["reasoning_content"] = parsed.reasoning_content;
    if (!parsed.tool_calls.empty()) {
      if (parsed.content.empty()) message["content"] = nullptr;
      message["tool_calls"] = tool_calls_json(parsed.tool_calls, /*with_index=*/false);
      if (finish == "stop") finish = "tool_calls";
    }
    choice["message"] = std::move(message);
    choice["logprobs"] = request_.logprobs ? chat_logprobs(whole.logprobs) : Json(nullptr);
  } else {
    choice["text"] = whole.text;
    choice["logprobs"] = request_.logprobs ? completion_logprobs(whole.logprobs) : Json(nullptr);
  }
  choice["finish_reason"] = optional_string(finish);
  choice["stop_reason"] = optional_string(whole.stop_reason);
  if (request_.return_token_ids) {
    choice["token_ids"] = whole.tokens;
    choice["prompt_token_ids"] = prompt_tokens;
  }
  Json out = base(chat ? "chat.completion" : "text_completion");
  out["choices"] = Json::array({std::move(choice)});
  out["usage"] = usage_json(usage);
  return out;
}

std::string json_text(const Json& value) { return value.dump(-1, ' ', false, Json::error_handler_t::replace); }

std::string sse_event(const Json& value) { return "data: " + json_text(value) + "\n\n"; }

}  // namespace dsv4::server
