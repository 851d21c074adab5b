// OpenAI request parsing and response JSON (openai_protocol.h).
#include "server/openai_protocol.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "common/error.h"
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

[[noreturn]] void bad(const std::string& param, const std::string& code, std::string message) {
  throw_api_error(400, std::move(message), param, code);
}

[[noreturn]] void wrong_type(const std::string& param, std::string_view expected, const Json& found) {
  const std::string type = json_type_name(found);
  const char* article = type == "null" ? "" : (type == "integer" || type == "object" || type == "array") ? "an " : "a ";
  bad(param, "invalid_type",
      fmt::format("Invalid type for '{}': expected {}, but got {}{} instead.", param, expected, article, type));
}

[[noreturn]] void unsupported(const std::string& param, std::string_view what) {
  bad(param, "unsupported_parameter", fmt::format("Unsupported parameter '{}': {}", param, what));
}

// Reads the optional fields of one JSON object; null counts as absent.
class Fields {
 public:
  explicit Fields(const Json& object) : object_(object) {}

  const Json* get(const char* name) const {
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  std::optional<bool> boolean(const char* name) const {
    const Json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) wrong_type(name, "a boolean", *v);
    return v->get<bool>();
  }

  std::optional<std::string> string(const char* name) const {
    const Json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_string()) wrong_type(name, "a string", *v);
    return v->get<std::string>();
  }

  std::optional<std::int64_t> integer(const char* name, std::int64_t lo, std::int64_t hi) const {
    const Json* v = get(name);
    if (!v) return std::nullopt;
    return integer_value(name, *v, lo, hi);
  }

  std::optional<double> number(const char* name, double lo, double hi, bool lo_open = false) const {
    const Json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_number()) wrong_type(name, "a number", *v);
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || (lo_open && x == lo) || x > hi) {
      bad(name, "invalid_value",
          fmt::format("Invalid value for '{}': expected a number in {}{}, {}], but got {}.", name, lo_open ? "(" : "[",
                      lo, hi, x));
    }
    return x;
  }

  static std::int64_t integer_value(const std::string& name, const Json& v, std::int64_t lo, std::int64_t hi) {
    if (v.is_number_unsigned()) {
      const auto u = v.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(hi) || (lo > 0 && u < static_cast<std::uint64_t>(lo))) {
        out_of_range(name, lo, hi, fmt::format("{}", u));
      }
      return static_cast<std::int64_t>(u);
    }
    if (!v.is_number_integer()) wrong_type(name, "an integer", v);
    const auto i = v.get<std::int64_t>();
    if (i < lo || i > hi) out_of_range(name, lo, hi, fmt::format("{}", i));
    return i;
  }

 private:
  [[noreturn]] static void out_of_range(const std::string& name, std::int64_t lo, std::int64_t hi,
                                        const std::string& found) {
    const std::string range = hi == std::numeric_limits<std::int64_t>::max() ? fmt::format(">= {}", lo)
                                                                              : fmt::format("in [{}, {}]", lo, hi);
    bad(name, "invalid_value", fmt::format("Invalid value for '{}': expected an integer {}, but got {}.", name, range, found));
  }

  const Json& object_;
};

constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();

std::int32_t token_id(const std::string& param, const Json& v, std::int64_t vocab) {
  return static_cast<std::int32_t>(Fields::integer_value(param, v, 0, vocab - 1));
}

void parse_prompt(const Json& body, ApiRequest& r, const ProtocolLimits& limits) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) bad("prompt", "missing_required_parameter", "Missing required parameter: 'prompt'.");
  const Json& p = *it;
  if (p.is_string()) {
    r.prompt_text = p.get<std::string>();
    return;
  }
  if (!p.is_array()) wrong_type("prompt", "a string, an array of strings or an array of token ids", p);
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
  for (std::size_t i = 0; i < tokens->size(); ++i) {
    const Json& t = (*tokens)[i];
    if (!t.is_number_integer() && !t.is_number_unsigned()) {
      wrong_type("prompt", "a string, an array of strings or an array of token ids", t);
    }
    r.prompt_tokens.push_back(token_id("prompt", t, limits.vocab_size));
  }
}

std::string message_content(const Json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) wrong_type(where, "a string or an array of content parts", content);
  std::string text;
  for (std::size_t i = 0; i < content.size(); ++i) {
    const Json& part = content[i];
    const std::string at = fmt::format("{}[{}]", where, i);
    if (!part.is_object()) wrong_type(at, "an object", part);
    auto type = part.find("type");
    if (type == part.end() || !type->is_string()) bad(at + ".type", "invalid_value", fmt::format("Invalid '{}.type': expected a string.", at));
    if (*type != "text") {
      unsupported(at + ".type", fmt::format("content parts of type '{}' are not supported; only 'text' is.",
                                            type->get<std::string>()));
    }
    auto t = part.find("text");
    if (t == part.end() || !t->is_string()) bad(at + ".text", "invalid_value", fmt::format("Invalid '{}.text': expected a string.", at));
    text += t->get<std::string>();
  }
  return text;
}

void parse_messages(const Json& body, ApiRequest& r, const ProtocolLimits& limits) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) bad("messages", "missing_required_parameter", "Missing required parameter: 'messages'.");
  if (!it->is_array()) wrong_type("messages", "an array", *it);
  if (it->empty()) bad("messages", "invalid_value", "Invalid 'messages': expected a non-empty array.");
  if (it->size() > limits.max_messages) {
    bad("messages", "invalid_value", fmt::format("Invalid 'messages': {} messages, more than {}.", it->size(), limits.max_messages));
  }
  for (std::size_t i = 0; i < it->size(); ++i) {
    const Json& m = (*it)[i];
    const std::string at = fmt::format("messages[{}]", i);
    if (!m.is_object()) wrong_type(at, "an object", m);
    ChatMessage message;
    auto role = m.find("role");
    if (role == m.end() || role->is_null()) bad(at + ".role", "missing_required_parameter", fmt::format("Missing required parameter: '{}.role'.", at));
    if (!role->is_string()) wrong_type(at + ".role", "a string", *role);
    message.role = role->get<std::string>();
    if (message.role != "system" && message.role != "developer" && message.role != "user" &&
        message.role != "assistant" && message.role != "tool") {
      bad(at + ".role", "invalid_value",
          fmt::format("Invalid value for '{}.role': '{}'; expected one of system, developer, user, assistant, tool.", at,
                      message.role));
    }
    auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      if (message.role != "assistant") {
        bad(at + ".content", "missing_required_parameter", fmt::format("Missing required parameter: '{}.content'.", at));
      }
    } else {
      message.content = message_content(*content, at + ".content");
    }
    if (auto rc = m.find("reasoning_content"); rc != m.end() && !rc->is_null()) {
      if (!rc->is_string()) wrong_type(at + ".reasoning_content", "a string", *rc);
      message.reasoning_content = rc->get<std::string>();
    }
    if (auto tc = m.find("tool_calls"); tc != m.end() && !tc->is_null()) {
      if (!tc->is_array()) wrong_type(at + ".tool_calls", "an array", *tc);
      for (std::size_t k = 0; k < tc->size(); ++k) {
        const Json& call = (*tc)[k];
        const std::string cat = fmt::format("{}.tool_calls[{}]", at, k);
        if (!call.is_object()) wrong_type(cat, "an object", call);
        const Fields cf(call);
        ToolCall tool;
        tool.id = cf.string("id").value_or("");
        const Json* fn = cf.get("function");
        if (!fn) bad(cat + ".function", "missing_required_parameter", fmt::format("Missing required parameter: '{}.function'.", cat));
        if (!fn->is_object()) wrong_type(cat + ".function", "an object", *fn);
        const Fields ff(*fn);
        auto name = ff.string("name");
        if (!name) bad(cat + ".function.name", "missing_required_parameter", fmt::format("Missing required parameter: '{}.function.name'.", cat));
        tool.name = *name;
        tool.arguments = ff.string("arguments").value_or("{}");
        message.tool_calls.push_back(std::move(tool));
      }
    }
    if (auto id = m.find("tool_call_id"); id != m.end() && !id->is_null()) {
      if (!id->is_string()) wrong_type(at + ".tool_call_id", "a string", *id);
      message.tool_call_id = id->get<std::string>();
    }
    if (auto name = m.find("name"); name != m.end() && !name->is_null()) {
      if (!name->is_string()) wrong_type(at + ".name", "a string", *name);
      message.name = name->get<std::string>();
    }
    r.messages.push_back(std::move(message));
  }
}

void parse_stop(const Fields& f, ApiRequest& r, const ProtocolLimits& limits) {
  const Json* stop = f.get("stop");
  if (!stop) return;
  if (stop->is_string()) {
    r.stop.push_back(stop->get<std::string>());
  } else if (stop->is_array()) {
    if (stop->size() > limits.max_stop) {
      bad("stop", "invalid_value", fmt::format("Invalid 'stop': {} stop strings, at most {} are allowed.", stop->size(), limits.max_stop));
    }
    for (const Json& s : *stop) {
      if (!s.is_string()) wrong_type("stop", "a string or an array of strings", s);
      r.stop.push_back(s.get<std::string>());
    }
  } else {
    wrong_type("stop", "a string or an array of strings", *stop);
  }
  for (const std::string& s : r.stop) {
    if (s.empty()) bad("stop", "invalid_value", "Invalid 'stop': stop strings must not be empty.");
  }
}

void parse_tools(const Fields& f, ApiRequest& r) {
  const Json* tools = f.get("tools");
  if (!tools) return;
  if (!tools->is_array()) wrong_type("tools", "an array", *tools);
  for (std::size_t i = 0; i < tools->size(); ++i) {
    const Json& tool = (*tools)[i];
    const std::string at = fmt::format("tools[{}]", i);
    if (!tool.is_object()) wrong_type(at, "an object", tool);
    const Fields t(tool);
    if (auto type = t.string("type"); type && *type != "function") {
      unsupported(at + ".type", fmt::format("tools of type '{}' are not supported; only 'function' is.", *type));
    }
    const Json* fn = t.get("function");
    if (!fn) bad(at + ".function", "missing_required_parameter", fmt::format("Missing required parameter: '{}.function'.", at));
    if (!fn->is_object()) wrong_type(at + ".function", "an object", *fn);
    if (!Fields(*fn).string("name")) {
      bad(at + ".function.name", "missing_required_parameter", fmt::format("Missing required parameter: '{}.function.name'.", at));
    }
  }
  if (const Json* choice = f.get("tool_choice")) {
    if (!choice->is_string()) unsupported("tool_choice", "only \"auto\" and \"none\" are supported.");
    const std::string c = choice->get<std::string>();
    if (c == "none") return;  // the model is not told about the tools
    if (c != "auto") unsupported("tool_choice", "only \"auto\" and \"none\" are supported.");
  }
  if (!tools->empty()) r.tools = nlohmann::ordered_json(*tools);  // keys sorted; see parse_api_request
}

void refuse_unsupported(const Fields& f, Endpoint endpoint) {
  if (auto n = f.integer("n", 1, kInt64Max); n && *n != 1) unsupported("n", "only n = 1 is supported.");
  if (auto b = f.integer("best_of", 1, kInt64Max); b && *b != 1) unsupported("best_of", "only best_of = 1 is supported.");
  if (auto p = f.number("presence_penalty", -2, 2); p && *p != 0) unsupported("presence_penalty", "penalties are not supported.");
  if (auto p = f.number("frequency_penalty", -2, 2); p && *p != 0) unsupported("frequency_penalty", "penalties are not supported.");
  if (auto p = f.number("repetition_penalty", 0, 1e9, true); p && *p != 1) unsupported("repetition_penalty", "penalties are not supported.");
  if (auto m = f.integer("min_tokens", 0, kInt64Max); m && *m != 0) unsupported("min_tokens", "min_tokens is not supported.");
  if (const Json* bias = f.get("logit_bias")) {
    if (!bias->is_object()) wrong_type("logit_bias", "an object", *bias);
    if (!bias->empty()) unsupported("logit_bias", "logit_bias is not supported.");
  }
  if (endpoint == Endpoint::kCompletions) {
    if (auto echo = f.boolean("echo"); echo && *echo) unsupported("echo", "echo is not supported.");
    if (auto suffix = f.string("suffix"); suffix && !suffix->empty()) unsupported("suffix", "suffix is not supported.");
  } else {
    if (const Json* format = f.get("response_format")) {
      if (!format->is_object()) wrong_type("response_format", "an object", *format);
      auto type = format->find("type");
      if (type == format->end() || *type != "text") unsupported("response_format", "only {\"type\": \"text\"} is supported.");
    }
  }
}

}  // namespace

ApiRequest parse_api_request(std::string_view body, Endpoint endpoint, const ProtocolLimits& limits) {
  Json json;
  try {
    json = parse_json(body, "the request body");
  } catch (const Error& e) {
    throw_api_error(400, fmt::format("We could not parse the JSON body of your request: {}", e.what()), {}, "invalid_json");
  }
  ApiRequest request = parse_api_json(json, endpoint, limits);
  if (!request.tools.is_null()) {
    // Tool schemas are rendered in the client's key order: take them from an order-keeping parse.
    const OrderedJson ordered = parse_ordered_json(body, "the request body");  // parsed once already: no throw
    if (ordered.is_object() && ordered.contains("tools")) request.tools = ordered["tools"];
  }
  return request;
}

ApiRequest parse_api_json(const Json& body, Endpoint endpoint, const ProtocolLimits& limits) {
  if (!body.is_object()) {
    throw_api_error(400, fmt::format("The request body must be a JSON object, not {}.", json_type_name(body)), {},
                    "invalid_type");
  }
  const bool chat = endpoint == Endpoint::kChat;
  ApiRequest r;
  r.endpoint = endpoint;
  const Fields f(body);
  if (auto model = f.string("model")) r.model = *model;
  if (chat) {
    parse_messages(body, r, limits);
  } else {
    parse_prompt(body, r, limits);
  }
  refuse_unsupported(f, endpoint);

  r.stream = f.boolean("stream").value_or(false);
  if (const Json* options = f.get("stream_options")) {
    if (!options->is_object()) wrong_type("stream_options", "an object", *options);
    if (!r.stream) bad("stream_options", "invalid_value", "Invalid 'stream_options': only allowed when 'stream' is true.");
    const Fields o(*options);
    r.include_usage = o.boolean("include_usage").value_or(false);
    r.continuous_usage = o.boolean("continuous_usage_stats").value_or(false);
  }

  SamplingParams& s = r.sampling;
  // Legacy completions default to 16 tokens (as OpenAI and vLLM); chat runs to the context end.
  if (chat) {
    auto max_completion = f.integer("max_completion_tokens", 1, kInt64Max);
    s.max_tokens = max_completion ? max_completion : f.integer("max_tokens", 1, kInt64Max);
  } else {
    s.max_tokens = f.integer("max_tokens", 1, kInt64Max).value_or(16);
  }
  s.temperature = f.number("temperature", 0, 2).value_or(1.0);
  s.top_p = f.number("top_p", 0, 1, /*lo_open=*/true).value_or(1.0);
  s.top_k = f.integer("top_k", -1, kInt64Max).value_or(0);
  if (auto seed = f.integer("seed", std::numeric_limits<std::int64_t>::min(), kInt64Max)) {
    s.seed = static_cast<std::uint64_t>(*seed);
  }
  s.ignore_eos = f.boolean("ignore_eos").value_or(false);
  if (const Json* ids = f.get("stop_token_ids")) {
    if (!ids->is_array()) wrong_type("stop_token_ids", "an array of token ids", *ids);
    for (const Json& id : *ids) s.stop_token_ids.push_back(token_id("stop_token_ids", id, limits.vocab_size));
  }
  parse_stop(f, r, limits);
  r.include_stop_str_in_output = f.boolean("include_stop_str_in_output").value_or(false);
  r.skip_special_tokens = f.boolean("skip_special_tokens").value_or(true);
  r.return_token_ids = f.boolean("return_token_ids").value_or(false);
  (void)f.string("user");

  if (chat) {
    parse_tools(f, r);
    if (const Json* kwargs = f.get("chat_template_kwargs")) {
      if (!kwargs->is_object()) wrong_type("chat_template_kwargs", "an object", *kwargs);
      const Fields k(*kwargs);
      r.thinking = k.boolean("thinking").value_or(k.boolean("enable_thinking").value_or(false));
    }
    r.add_generation_prompt = f.boolean("add_generation_prompt").value_or(true);
    r.continue_final_message = f.boolean("continue_final_message").value_or(false);
    if (r.continue_final_message && r.add_generation_prompt && f.get("add_generation_prompt")) {
      bad("continue_final_message", "invalid_value",
          "Invalid 'continue_final_message': cannot be combined with 'add_generation_prompt' = true.");
    }
    if (r.continue_final_message) {
      r.add_generation_prompt = false;
      if (r.messages.back().role != "assistant") {
        bad("continue_final_message", "invalid_value", "Invalid 'continue_final_message': the last message must be the assistant's.");
      }
    }
    r.logprobs = f.boolean("logprobs").value_or(false);
    auto top = f.integer("top_logprobs", 0, limits.max_logprobs);
    if (top && !r.logprobs) bad("top_logprobs", "invalid_value", "Invalid 'top_logprobs': requires 'logprobs' to be true.");
    if (r.logprobs) s.logprobs = top.value_or(0);
  } else {
    if (auto n = f.integer("logprobs", 0, limits.max_logprobs)) {
      r.logprobs = true;
      s.logprobs = *n;
    }
  }
  return r;
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
