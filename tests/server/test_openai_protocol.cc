// Request parsing and validation, and the response JSON (server/openai_protocol.h).
#include <gtest/gtest.h>

#include "server/openai_protocol.h"

namespace dsv4::server {
namespace {

constexpr ModelVocab kTinyVocab{.size = 4096, .bos_id = 0, .eos_id = 1};  // the tiny preset's

ProtocolLimits limits() {
  ProtocolLimits l;
  l.vocab_size = 4096;
  l.max_logprobs = 20;
  return l;
}

ApiRequest completion(const std::string& body) { return parse_api_request(body, Endpoint::kCompletions, limits()); }
ApiRequest chat(const std::string& body) { return parse_api_request(body, Endpoint::kChat, limits()); }

// Parses `body` and returns the error it must raise.
ApiError error_of(const std::string& body, Endpoint endpoint = Endpoint::kCompletions) {
  try {
    parse_api_request(body, endpoint, limits());
  } catch (const ApiException& e) {
    return e.error();
  }
  ADD_FAILURE() << "no error for " << body;
  return {};
}

TEST(OpenAiProtocol, CompletionDefaults) {
  const ApiRequest r = completion(R"({"model": "m", "prompt": "hello"})");
  EXPECT_EQ(r.model, "m");
  ASSERT_TRUE(r.prompt_text);
  EXPECT_EQ(*r.prompt_text, "hello");
  EXPECT_FALSE(r.stream);
  ASSERT_TRUE(r.sampling.max_tokens);
  EXPECT_EQ(*r.sampling.max_tokens, 16);  // the legacy completions default
  EXPECT_DOUBLE_EQ(r.sampling.temperature, 1.0);
  EXPECT_DOUBLE_EQ(r.sampling.top_p, 1.0);
  EXPECT_FALSE(r.sampling.seed);
  EXPECT_FALSE(r.logprobs);
  EXPECT_FALSE(r.sampling.logprobs);
}

TEST(OpenAiProtocol, CompletionFields) {
  const ApiRequest r = completion(R"({"prompt": [5, 6, 7], "max_tokens": 8, "temperature": 0, "top_p": 0.5,
      "top_k": 4, "seed": -1, "stop": ["a", "bc"], "stop_token_ids": [9], "logprobs": 3, "stream": true,
      "stream_options": {"include_usage": true}, "ignore_eos": true, "n": 1, "user": "u",
      "presence_penalty": 0, "return_token_ids": true, "unknown_field": {"x": 1}})");
  EXPECT_EQ(r.prompt_tokens, (std::vector<std::int32_t>{5, 6, 7}));
  EXPECT_FALSE(r.prompt_text);
  EXPECT_EQ(*r.sampling.max_tokens, 8);
  EXPECT_TRUE(r.sampling.greedy());
  EXPECT_DOUBLE_EQ(r.sampling.top_p, 0.5);
  EXPECT_EQ(r.sampling.top_k, 4);
  EXPECT_EQ(*r.sampling.seed, ~std::uint64_t{0});
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(r.sampling.stop_token_ids, (std::vector<std::int32_t>{9}));
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(*r.sampling.logprobs, 3);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.sampling.ignore_eos);
  EXPECT_TRUE(r.return_token_ids);
}

TEST(OpenAiProtocol, PromptForms) {
  EXPECT_EQ(*completion(R"({"prompt": ["one"]})").prompt_text, "one");
  EXPECT_EQ(completion(R"({"prompt": [[1, 2]]})").prompt_tokens, (std::vector<std::int32_t>{1, 2}));
  EXPECT_EQ(completion(R"({"prompt": "x", "stop": "\n"})").stop, (std::vector<std::string>{"\n"}));
  ApiError e = error_of(R"({"prompt": ["one", "two"]})");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "prompt");
  e = error_of(R"({"prompt": [1, 4096]})");
  EXPECT_EQ(e.param, "prompt");
  EXPECT_NE(e.message.find("4095"), std::string::npos) << e.message;
  EXPECT_EQ(error_of(R"({"prompt": []})").param, "prompt");
  EXPECT_EQ(error_of(R"({"prompt": 5})").code, "invalid_type");
  EXPECT_EQ(error_of(R"({"prompt": [1, "a"]})").code, "invalid_type");
  e = error_of(R"({"model": "m"})");
  EXPECT_EQ(e.param, "prompt");
  EXPECT_EQ(e.code, "missing_required_parameter");
}

TEST(OpenAiProtocol, MalformedBodies) {
  ApiError e = error_of(R"({"prompt": "x",)");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.code, "invalid_json");
  EXPECT_EQ(error_of("[1, 2]").code, "invalid_type");
  EXPECT_EQ(error_of("").code, "invalid_json");
  EXPECT_EQ(error_of(std::string(200, '[')).code, "invalid_json");  // too deep
  EXPECT_EQ(error_of("{\"prompt\": \"\xff\"}").code, "invalid_json");  // not UTF-8
}

// A repeated key is refused as malformed JSON, naming the key, rather than one value winning.
TEST(OpenAiProtocol, DuplicateKeysAreRefused) {
  ApiError e = error_of(R"({"prompt": "x", "max_tokens": 1, "max_tokens": 500})");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.code, "invalid_json");
  EXPECT_NE(e.message.find("the request body: key 'max_tokens' is listed more than once"), std::string::npos)
      << e.message;
  e = error_of(R"({"messages": [{"role": "user", "content": "hi", "role": "system"}]})", Endpoint::kChat);
  EXPECT_EQ(e.code, "invalid_json");
  EXPECT_NE(e.message.find("key 'role' is listed more than once in \"messages[0]\""), std::string::npos)
      << e.message;
  // In the tool schemas, which are rendered in the client's key order.
  e = error_of(R"({"messages": [{"role": "user", "content": "hi"}],
      "tools": [{"type": "function", "function": {"name": "f", "name": "g"}}]})", Endpoint::kChat);
  EXPECT_EQ(e.code, "invalid_json");
  EXPECT_NE(e.message.find("key 'name' is listed more than once in \"tools[0].function\""), std::string::npos)
      << e.message;
}

struct BadField {
  const char* body;
  const char* param;
  const char* code;
};

TEST(OpenAiProtocol, WrongTypesAndRangesNameTheField) {
  const BadField cases[] = {
      {R"({"prompt": "x", "max_tokens": "10"})", "max_tokens", "invalid_type"},
      {R"({"prompt": "x", "max_tokens": 1.5})", "max_tokens", "invalid_type"},
      {R"({"prompt": "x", "max_tokens": 0})", "max_tokens", "invalid_value"},
      {R"({"prompt": "x", "max_tokens": 18446744073709551615})", "max_tokens", "invalid_value"},
      {R"({"prompt": "x", "temperature": "hot"})", "temperature", "invalid_type"},
      {R"({"prompt": "x", "temperature": 2.5})", "temperature", "invalid_value"},
      {R"({"prompt": "x", "temperature": -1})", "temperature", "invalid_value"},
      {R"({"prompt": "x", "top_p": 0})", "top_p", "invalid_value"},
      {R"({"prompt": "x", "top_p": 1.01})", "top_p", "invalid_value"},
      {R"({"prompt": "x", "top_k": -2})", "top_k", "invalid_value"},
      {R"({"prompt": "x", "seed": "1"})", "seed", "invalid_type"},
      {R"({"prompt": "x", "stream": "yes"})", "stream", "invalid_type"},
      {R"({"prompt": "x", "stream_options": {"include_usage": true}})", "stream_options", "invalid_value"},
      {R"({"prompt": "x", "stream": true, "stream_options": 1})", "stream_options", "invalid_type"},
      {R"({"prompt": "x", "stop": 3})", "stop", "invalid_type"},
      {R"({"prompt": "x", "stop": ["a", 3]})", "stop", "invalid_type"},
      {R"({"prompt": "x", "stop": [""]})", "stop", "invalid_value"},
      {R"({"prompt": "x", "stop": ["1","2","3","4","5","6","7","8","9","10","11","12","13","14","15","16","17"]})", "stop",
       "invalid_value"},
      {R"({"prompt": "x", "stop_token_ids": [4096]})", "stop_token_ids", "invalid_value"},
      {R"({"prompt": "x", "stop_token_ids": 5})", "stop_token_ids", "invalid_type"},
      {R"({"prompt": "x", "logprobs": 21})", "logprobs", "invalid_value"},
      {R"({"prompt": "x", "logprobs": true})", "logprobs", "invalid_type"},
      {R"({"prompt": "x", "model": 7})", "model", "invalid_type"},
      {R"({"prompt": "x", "n": 2})", "n", "unsupported_parameter"},
      {R"({"prompt": "x", "n": 0})", "n", "invalid_value"},
      {R"({"prompt": "x", "best_of": 3})", "best_of", "unsupported_parameter"},
      {R"({"prompt": "x", "presence_penalty": 0.5})", "presence_penalty", "unsupported_parameter"},
      {R"({"prompt": "x", "frequency_penalty": 3})", "frequency_penalty", "invalid_value"},
      {R"({"prompt": "x", "logit_bias": {"5": 1}})", "logit_bias", "unsupported_parameter"},
      {R"({"prompt": "x", "echo": true})", "echo", "unsupported_parameter"},
      {R"({"prompt": "x", "suffix": "y"})", "suffix", "unsupported_parameter"},
      {R"({"prompt": "x", "ignore_eos": 1})", "ignore_eos", "invalid_type"},
  };
  for (const BadField& c : cases) {
    const ApiError e = error_of(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << ": " << e.message;
    EXPECT_EQ(e.code, c.code) << c.body << ": " << e.message;
    EXPECT_FALSE(e.message.empty());
  }
}

TEST(OpenAiProtocol, ChatMessages) {
  const ApiRequest r = chat(R"({"model": "m", "messages": [
      {"role": "system", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": null, "reasoning_content": "hmm"},
      {"role": "user", "content": "again"}],
      "max_tokens": 5, "max_completion_tokens": 7, "logprobs": true, "top_logprobs": 2})");
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[1].content, "hi \nthere");  // text parts joined with "\n", as vLLM does
  EXPECT_EQ(r.messages[2].role, "assistant");
  EXPECT_EQ(r.messages[2].reasoning_content, "hmm");
  EXPECT_EQ(*r.sampling.max_tokens, 7);  // max_completion_tokens wins
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(*r.sampling.logprobs, 2);
  EXPECT_FALSE(chat(R"({"messages": [{"role": "user", "content": "x"}]})").sampling.max_tokens);  // to the context end
  const ApiRequest cont = chat(R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "Sure,"}],
      "continue_final_message": true})");
  EXPECT_TRUE(cont.continue_final_message);
  EXPECT_FALSE(cont.add_generation_prompt);
  EXPECT_TRUE(r.add_generation_prompt);
}

TEST(OpenAiProtocol, ChatAssistantReasoningFields) {
  // vLLM's newer "reasoning" and the older "reasoning_content" both carry an assistant turn's
  // thinking; when both are given, "reasoning" is used (vLLM reads only "reasoning").
  const ApiRequest r = chat(R"({"messages": [{"role": "user", "content": "a"},
      {"role": "assistant", "content": "b", "reasoning": "new"},
      {"role": "assistant", "content": "c", "reasoning_content": "old"},
      {"role": "assistant", "content": "d", "reasoning": "new", "reasoning_content": "old"},
      {"role": "assistant", "content": "e", "reasoning": null, "reasoning_content": "old"}]})");
  ASSERT_EQ(r.messages.size(), 5u);
  EXPECT_EQ(r.messages[1].reasoning_content, "new");
  EXPECT_EQ(r.messages[2].reasoning_content, "old");
  EXPECT_EQ(r.messages[3].reasoning_content, "new");
  EXPECT_EQ(r.messages[4].reasoning_content, "old");
  const ApiError e = error_of(R"({"messages": [{"role": "assistant", "content": "b", "reasoning": 3}]})", Endpoint::kChat);
  EXPECT_EQ(e.param, "messages[0].reasoning");
  EXPECT_EQ(e.code, "invalid_type");
}

TEST(OpenAiProtocol, ChatReasoningEffort) {
  const std::string messages = R"("messages": [{"role": "user", "content": "Hi"}])";
  const ApiRequest plain = chat("{" + messages + "}");
  EXPECT_EQ(plain.reasoning_effort, ReasoningEffort::kLow);
  EXPECT_EQ(chat_options(plain).reasoning_effort, ReasoningEffort::kLow);
  EXPECT_EQ(chat("{" + messages + R"(, "reasoning_effort": null})").reasoning_effort, ReasoningEffort::kLow);
  EXPECT_EQ(chat("{" + messages + R"(, "reasoning_effort": "low"})").reasoning_effort, ReasoningEffort::kLow);
  EXPECT_EQ(chat("{" + messages + R"(, "reasoning_effort": "high"})").reasoning_effort, ReasoningEffort::kHigh);
  const ApiRequest max = chat("{" + messages + R"(, "reasoning_effort": "max", "chat_template_kwargs": {"thinking": true},
      "add_generation_prompt": true})");
  const ChatOptions options = chat_options(max);
  EXPECT_EQ(options.reasoning_effort, ReasoningEffort::kMax);
  EXPECT_TRUE(options.thinking);
  EXPECT_TRUE(options.add_generation_prompt);
  EXPECT_FALSE(options.continue_final_message);
  EXPECT_TRUE(render_chat_prompt(max.messages, max.tools, options)
                  .starts_with(std::string(kBosToken) + "Reasoning Effort: Beyond maximum"));
  for (const char* bad : {R"("medium")", R"("none")", R"("MAX")", R"("")"}) {
    const ApiError e = error_of("{" + messages + R"(, "reasoning_effort": )" + bad + "}", Endpoint::kChat);
    EXPECT_EQ(e.status, 400) << bad;
    EXPECT_EQ(e.param, "reasoning_effort") << bad;
    EXPECT_EQ(e.code, "invalid_value") << bad;
    EXPECT_NE(e.message.find("low, high, max"), std::string::npos) << e.message;
  }
  EXPECT_EQ(error_of("{" + messages + R"(, "reasoning_effort": 2})", Endpoint::kChat).code, "invalid_type");
}

TEST(OpenAiProtocol, ChatToolSchemaNumbersAsPythonWritesThem) {
  // Tool schemas are rendered with json.dumps: a big integer keeps its digits, floats follow repr.
  const ApiRequest r = chat(R"({"messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
          "properties": {"n": {"type": "integer", "maximum": 123456789012345678901234567890, "minimum": 1e15,
          "multipleOf": 0.00001}}}}}]})");
  const std::string prompt = render_chat_prompt(r.messages, r.tools, chat_options(r));
  EXPECT_NE(prompt.find(R"({"type": "integer", "maximum": 123456789012345678901234567890, "minimum": 1000000000000000.0, "multipleOf": 1e-05})"),
            std::string::npos)
      << prompt;
}

TEST(OpenAiProtocol, ChatToolsAndThinking) {
  const ApiRequest r = chat(R"({"messages": [
      {"role": "user", "content": "weather?"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
          "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
      "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
          "properties": {"city": {"type": "string"}}}, "description": "weather"}}],
      "tool_choice": "auto", "chat_template_kwargs": {"thinking": true}})");
  EXPECT_TRUE(r.thinking);
  ASSERT_EQ(r.messages.size(), 3u);
  ASSERT_EQ(r.messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[1].tool_calls[0].id, "call_1");
  EXPECT_EQ(r.messages[1].tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.messages[1].tool_calls[0].arguments, "{\"city\": \"Paris\"}");
  EXPECT_EQ(r.messages[2].tool_call_id, "call_1");
  ASSERT_TRUE(r.tools.is_array());
  // The client's key order is kept for rendering: parameters before description.
  const auto& fn = r.tools[0]["function"];
  std::vector<std::string> keys;
  for (const auto& [key, value] : fn.items()) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{"name", "parameters", "description"}));
  // tool_choice "none": the tools are not shown to the model.
  EXPECT_TRUE(chat(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "none",
      "tools": [{"type": "function", "function": {"name": "f"}}]})").tools.is_null());
}

TEST(OpenAiProtocol, ChatToolCallResponse) {
  const auto codec = make_byte_codec(kTinyVocab);
  const ApiRequest r = chat(R"({"messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "f"}}]})");
  ResponseBuilder b(r, "chatcmpl-7", "tiny", 1, *codec);
  ResponseBuilder::Piece whole;
  whole.text = std::string("Let me check.\n\n") + std::string(kToolCallsStart) + "\n<｜DSML｜invoke name=\"f\">\n" +
               "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n" +
               std::string(kToolCallsEnd);
  whole.finish_reason = "stop";
  const Json j = b.response(whole, {1, 2, 0}, {});
  const Json& message = j["choices"][0]["message"];
  EXPECT_EQ(message["content"], "Let me check.");
  ASSERT_EQ(message["tool_calls"].size(), 1u) << j;
  EXPECT_EQ(message["tool_calls"][0]["type"], "function");
  EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(Json::parse(message["tool_calls"][0]["function"]["arguments"].get<std::string>()), Json({{"city", "Paris"}}));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
}

TEST(OpenAiProtocol, BadChatMessages) {
  const BadField cases[] = {
      {R"({"model": "m"})", "messages", "missing_required_parameter"},
      {R"({"messages": []})", "messages", "invalid_value"},
      {R"({"messages": "hi"})", "messages", "invalid_type"},
      {R"({"messages": [3]})", "messages[0]", "invalid_type"},
      {R"({"messages": [{"content": "x"}]})", "messages[0].role", "missing_required_parameter"},
      {R"({"messages": [{"role": "wizard", "content": "x"}]})", "messages[0].role", "invalid_value"},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content", "missing_required_parameter"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content", "invalid_type"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
       "messages[0].content[0].type", "unsupported_parameter"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs", "invalid_value"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 2})", "logprobs", "invalid_type"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})", "tools[0].function",
       "missing_required_parameter"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": {}})", "tools", "invalid_type"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "retrieval", "function": {}}]})",
       "tools[0].type", "unsupported_parameter"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required",
           "tools": [{"type": "function", "function": {"name": "f"}}]})", "tool_choice", "unsupported_parameter"},
      {R"({"messages": [{"role": "assistant", "content": "x", "tool_calls": [{"function": {"arguments": "{}"}}]}]})",
       "messages[0].tool_calls[0].function.name", "missing_required_parameter"},
      {R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"thinking": "yes"}})",
       "chat_template_kwargs.thinking", "invalid_type"},
      {R"({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "medium"})", "reasoning_effort",
       "invalid_value"},
      {R"({"messages": [{"role": "user", "content": "x"}], "continue_final_message": true})", "continue_final_message",
       "invalid_value"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -3})", "max_completion_tokens",
       "invalid_value"},
  };
  for (const BadField& c : cases) {
    const ApiError e = error_of(c.body, Endpoint::kChat);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << ": " << e.message;
    EXPECT_EQ(e.code, c.code) << c.body << ": " << e.message;
  }
}

TEST(OpenAiProtocol, ContextLength) {
  ApiRequest r = completion(R"({"prompt": "x", "max_tokens": 10})");
  EXPECT_NO_THROW(check_context_length(r, 90, 100));
  try {
    check_context_length(r, 91, 100);
    FAIL();
  } catch (const ApiException& e) {
    EXPECT_EQ(e.error().param, "max_tokens");
    EXPECT_EQ(e.error().code, "context_length_exceeded");
  }
  r = chat(R"({"messages": [{"role": "user", "content": "x"}]})");
  EXPECT_NO_THROW(check_context_length(r, 99, 100));
  try {
    check_context_length(r, 100, 100);
    FAIL();
  } catch (const ApiException& e) {
    EXPECT_EQ(e.error().param, "messages");
    EXPECT_EQ(e.error().code, "context_length_exceeded");
  }
}

TEST(OpenAiProtocol, ErrorJsonShape) {
  const Json j = error_json({404, "no such model", {}, "model", "model_not_found"});
  EXPECT_EQ(j["error"]["message"], "no such model");
  EXPECT_EQ(j["error"]["type"], "not_found_error");
  EXPECT_EQ(j["error"]["param"], "model");
  EXPECT_EQ(j["error"]["code"], "model_not_found");
  const Json k = error_json({400, "bad", {}, {}, {}});
  EXPECT_TRUE(k["error"]["param"].is_null());
  EXPECT_TRUE(k["error"]["code"].is_null());
  EXPECT_EQ(k["error"]["type"], "invalid_request_error");
  EXPECT_EQ(error_type_for_status(401), "authentication_error");
  EXPECT_EQ(error_type_for_status(503), "server_error");
}

TEST(OpenAiProtocol, CompletionResponseAndChunks) {
  const auto codec = make_byte_codec(kTinyVocab);
  const ApiRequest r = completion(R"({"prompt": "x", "logprobs": 1, "return_token_ids": true})");
  ResponseBuilder b(r, "cmpl-1", "tiny", 123, *codec);
  ResponseBuilder::Piece whole;
  whole.text = "hi";
  whole.tokens = {'h' + 3, 'i' + 3};
  whole.logprobs = {SampledToken{'h' + 3, -0.5f, {{'h' + 3, -0.5f}}}, SampledToken{'i' + 3, -1.0f, {{'j' + 3, -0.25f}}}};
  whole.finish_reason = "length";
  const Json j = b.response(whole, {3, 2, 1}, {1, 2, 3});
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["id"], "cmpl-1");
  EXPECT_EQ(j["model"], "tiny");
  EXPECT_EQ(j["created"], 123);
  const Json& c = j["choices"][0];
  EXPECT_EQ(c["text"], "hi");
  EXPECT_EQ(c["finish_reason"], "length");
  EXPECT_EQ(c["token_ids"], Json::array({'h' + 3, 'i' + 3}));
  EXPECT_EQ(c["prompt_token_ids"], Json::array({1, 2, 3}));
  EXPECT_EQ(c["logprobs"]["tokens"], Json::array({"h", "i"}));
  EXPECT_EQ(c["logprobs"]["text_offset"], Json::array({0, 1}));
  EXPECT_FLOAT_EQ(c["logprobs"]["token_logprobs"][1].get<float>(), -1.0f);
  EXPECT_FLOAT_EQ(c["logprobs"]["top_logprobs"][1]["j"].get<float>(), -0.25f);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(j["usage"]["completion_tokens"], 2);
  EXPECT_EQ(j["usage"]["total_tokens"], 5);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 1);

  ResponseBuilder s(r, "cmpl-2", "tiny", 5, *codec);
  ResponseBuilder::Piece piece;
  piece.text = "a";
  piece.tokens = {'a' + 3};
  const Json chunk = s.chunk(piece, std::nullopt);
  EXPECT_EQ(chunk["choices"][0]["text"], "a");
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(chunk["usage"].is_null());
  const Json usage = s.usage_chunk({4, 1, 0});
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 5);
  EXPECT_EQ(sse_event(Json{{"a", 1}}), "data: {\"a\":1}\n\n");
}

TEST(OpenAiProtocol, ChatResponseAndChunks) {
  const auto codec = make_byte_codec(kTinyVocab);
  const ApiRequest r = chat(R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 1})");
  ResponseBuilder b(r, "chatcmpl-1", "tiny", 1, *codec);
  const Json role = b.role_chunk();
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["choices"][0]["delta"]["role"], "assistant");
  ResponseBuilder::Piece piece;
  piece.text = "ok";
  piece.tokens = {'o' + 3, 'k' + 3};
  piece.logprobs = {SampledToken{'o' + 3, -0.1f, {{'o' + 3, -0.1f}}}, SampledToken{'k' + 3, -0.2f, {{'k' + 3, -0.2f}}}};
  const Json chunk = b.chunk(piece, Usage{1, 2, 0});
  EXPECT_EQ(chunk["choices"][0]["delta"]["content"], "ok");
  EXPECT_EQ(chunk["choices"][0]["logprobs"]["content"][0]["token"], "o");
  EXPECT_EQ(chunk["choices"][0]["logprobs"]["content"][0]["bytes"], Json::array({'o'}));
  EXPECT_EQ(chunk["choices"][0]["logprobs"]["content"][1]["top_logprobs"][0]["token"], "k");
  EXPECT_EQ(chunk["usage"]["completion_tokens"], 2);
  ResponseBuilder::Piece last;
  last.finish_reason = "stop";
  last.stop_reason = "\n";
  const Json end = b.chunk(last, std::nullopt);
  EXPECT_TRUE(end["choices"][0]["delta"].empty());
  EXPECT_EQ(end["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(end["choices"][0]["stop_reason"], "\n");

  const Json whole = b.response(piece, {1, 2, 0}, {});
  EXPECT_EQ(whole["object"], "chat.completion");
  EXPECT_EQ(whole["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(whole["choices"][0]["message"]["content"], "ok");
  EXPECT_EQ(whole["choices"][0]["logprobs"]["content"].size(), 2u);
}

TEST(OpenAiProtocol, InvalidUtf8IsReplacedNotThrown) {
  const std::string text = json_text(Json{{"text", std::string("a\xe4\xb8")}});
  EXPECT_NE(text.find("\xef\xbf\xbd"), std::string::npos) << text;  // U+FFFD
}

}  // namespace
}  // namespace dsv4::server
