// The OpenAI HTTP protocol, without the HTTP: request bodies of /v1/completions and
// /v1/chat/completions parsed and validated into engine terms, and the JSON of responses,
// stream chunks and errors.
//
// Validation is strict about what it accepts: every field it knows is type- and range-checked
// and a failure names the field ("param") the way OpenAI's API does; fields that would change
// the output but that the engine cannot honour (n or best_of > 1, penalties, min_tokens,
// logit_bias, echo, suffix, a response_format other than text, tools of a type other than
// function, a tool_choice other than auto / none) are refused with code "unsupported_parameter"
// rather than silently ignored; unknown fields are ignored (as vLLM does). Chat messages and
// function tools follow text/chat_encoding.h; V4's thinking mode is chat_template_kwargs
// {"thinking": true} (as in vLLM), and "reasoning_effort" takes the levels V4's encoder
// accepts (low, high, max; anything else is a 400).
#pragma once

#include <cstdint>
#include <ctime>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/json_io.h"
#include "engine/request.h"
#include "engine/sampling.h"
#include "text/chat_encoding.h"
#include "text/text_codec.h"

namespace dsv4::server {

// An OpenAI error: the HTTP status and {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type;   // empty: derived from the status (invalid_request_error, ...)
  std::string param;  // empty: null
  std::string code;   // empty: null
};

class ApiException : public std::exception {
 public:
  explicit ApiException(ApiError error) : error_(std::move(error)) {}
  const ApiError& error() const { return error_; }
  const char* what() const noexcept override { return error_.message.c_str(); }

 private:
  ApiError error_;
};

[[noreturn]] void throw_api_error(int status, std::string message, std::string param = {}, std::string code = {});
// The OpenAI error type for an HTTP status: invalid_request_error (4xx), authentication_error
// (401), permission_error (403), not_found_error (404), rate_limit_error (429), server_error (5xx).
std::string error_type_for_status(int status);
Json error_json(const ApiError& error);

enum class Endpoint { kCompletions, kChat };

struct ProtocolLimits {
  std::int64_t vocab_size = 0;
  std::int64_t max_logprobs = 20;  // most top_logprobs alternatives
  std::size_t max_stop = 16;       // most stop strings
  std::size_t max_messages = 4096;
};

struct ApiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  // empty: the served model
  // The prompt: text (completions), token ids (completions), or messages (chat).
  std::optional<std::string> prompt_text;
  std::vector<std::int32_t> prompt_tokens;
  std::vector<ChatMessage> messages;
  nlohmann::ordered_json tools;  // chat: OpenAI "tools" in the client's key order (null: none)
  bool thinking = false;         // chat: chat_template_kwargs.thinking (V4 thinking mode)
  ReasoningEffort reasoning_effort = ReasoningEffort::kLow;  // chat: "reasoning_effort" (low, high, max)
  bool add_generation_prompt = true;    // chat (vLLM extension)
  bool continue_final_message = false;  // chat (vLLM extension)

  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage: a last chunk with the usage
  bool continuous_usage = false;  // stream_options.continuous_usage_stats: usage in every chunk
  std::vector<std::string> stop;
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;
  bool return_token_ids = false;  // vLLM's extension: token_ids (and prompt_token_ids) in choices
  bool logprobs = false;          // report logprobs (sampling.logprobs holds the alternatives)
  SamplingParams sampling;        // temperature, top_p, top_k, seed, max_tokens, stop_token_ids, ignore_eos
};

// Parses a request body. Throws ApiException (400) naming the field for anything invalid.
ApiRequest parse_api_request(std::string_view body, Endpoint endpoint, const ProtocolLimits& limits);
ApiRequest parse_api_json(const Json& body, Endpoint endpoint, const ProtocolLimits& limits);

// The chat encoder's options for a chat request: thinking mode, reasoning effort, generation
// prompt and continuation, as the request asked.
ChatOptions chat_options(const ApiRequest& request);

// Refuses (400, code context_length_exceeded) a prompt that leaves no room in max_model_len,
// or one whose max_tokens would overflow it.
void check_context_length(const ApiRequest& request, std::int64_t prompt_tokens, std::int64_t max_model_len);

struct Usage {
  std::int64_t prompt_tokens = 0;
  std::int64_t completion_tokens = 0;
  std::int64_t cached_tokens = 0;
};
Json usage_json(const Usage& usage);

// "stop", "length", "abort" or "error" for OpenAI's finish_reason.
std::string finish_reason_text(FinishReason reason);

// Builds the JSON of one request's responses and stream chunks.
class ResponseBuilder {
 public:
  ResponseBuilder(const ApiRequest& request, std::string id, std::string model, std::int64_t created,
                  const TextCodec& codec);

  // One piece of output: new text (chat: content), the tokens that produced it, their
  // logprobs (when asked), and, on the last piece, why the request finished.
  struct Piece {
    std::string text;
    std::string reasoning;             // chat streaming: reasoning_content delta
    std::vector<ToolCall> tool_calls;  // chat streaming: parsed at the end
    std::vector<std::int32_t> tokens;
    std::vector<SampledToken> logprobs;
    std::optional<std::string> finish_reason;
    std::optional<std::string> stop_reason;  // the stop string that matched
  };

  // Streaming: the first chat chunk (role only); a chunk for a piece; the final usage chunk.
  Json role_chunk() const;
  Json chunk(const Piece& piece, const std::optional<Usage>& usage);
  Json usage_chunk(const Usage& usage) const;
  // Non-streaming: the whole response. For chat, `whole.text` is the raw reply, split by
  // parse_completion into content, reasoning_content and tool_calls.
  Json response(const Piece& whole, const Usage& usage, const std::vector<std::int32_t>& prompt_tokens);

 private:
  Json base(std::string_view object) const;
  Json completion_logprobs(const std::vector<SampledToken>& tokens);
  Json chat_logprobs(const std::vector<SampledToken>& tokens) const;
  Json tool_calls_json(const std::vector<ToolCall>& calls, bool with_index);

  const ApiRequest& request_;
  std::string id_;
  std::string model_;
  std::int64_t created_;
  const TextCodec& codec_;
  std::int64_t text_offset_ = 0;  // completions logprobs: characters of text so far
  int tool_calls_made_ = 0;       // for unique call ids
};

// "data: <json>\n\n" (invalid UTF-8 replaced), and the stream's end "data: [DONE]\n\n".
std::string sse_event(const Json& value);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";
// Compact JSON text; invalid UTF-8 in strings (partial characters of a token) is replaced.
std::string json_text(const Json& value);

}  // namespace dsv4::server
