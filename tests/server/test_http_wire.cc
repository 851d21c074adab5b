// The response bytes and the request-head rules of the HTTP front end (server/http_wire.h).
#include "server/http_wire.h"

#include <gtest/gtest.h>

#include <string>

namespace dsv4::server {
namespace {

TEST(HttpWire, ResponseBytes) {
  EXPECT_EQ(render_response(200, "application/json", "{}", true),
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\n{}");
  // HEAD: the length of the body that a GET would get, no body.
  EXPECT_EQ(render_response(405, "", "abc", false, {{"Allow", "POST"}}, /*head_only=*/true),
            "HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 3\r\nConnection: close\r\nAllow: POST\r\n\r\n");
  EXPECT_EQ(render_stream_head(true, true),
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            "Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n");
  // HTTP/1.0: no chunking, the body ends when the connection does.
  EXPECT_EQ(render_stream_head(false, true),
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(render_chunk("data: x\n\n"), "9\r\ndata: x\n\n\r\n");
  EXPECT_EQ(render_chunk(std::string(300, 'a')).substr(0, 5), "12c\r\n");
  EXPECT_EQ(render_chunk(""), "");  // a zero-length chunk would end the body
}

TEST(HttpWire, RoutesAndMethods) {
  EXPECT_EQ(route_of("/v1/completions"), Route::kCompletions);
  EXPECT_EQ(route_of("/v1/chat/completions?x=1"), Route::kChat);
  EXPECT_EQ(route_of("/v1/models"), Route::kModels);
  EXPECT_EQ(route_of("/health"), Route::kHealth);
  EXPECT_EQ(route_of("/metrics?name=a"), Route::kMetrics);
  EXPECT_EQ(route_of("/v1/completions/"), Route::kNone);
  EXPECT_EQ(route_of("/HEALTH"), Route::kNone);
  EXPECT_EQ(route_of(""), Route::kNone);
  EXPECT_TRUE(method_allowed(Route::kChat, "POST"));
  EXPECT_FALSE(method_allowed(Route::kChat, "GET"));
  EXPECT_FALSE(method_allowed(Route::kCompletions, "post"));  // methods are case-sensitive (RFC 9110)
  EXPECT_TRUE(method_allowed(Route::kHealth, "HEAD"));
  EXPECT_FALSE(method_allowed(Route::kMetrics, "POST"));
  EXPECT_EQ(allowed_methods(Route::kChat), "POST");
  EXPECT_EQ(allowed_methods(Route::kModels), "GET, HEAD");
}

TEST(HttpWire, BodyFramingRules) {
  constexpr std::size_t kLimit = 1000;
  auto refusal = [&](BodyFraming f) {
    const auto r = refuse_body(f, kLimit);
    return r ? r->status : 0;
  };
  BodyFraming post;
  post.method = "POST";
  EXPECT_EQ(refusal(post), 411);  // no length at all
  post.content_length = 0;
  EXPECT_EQ(refusal(post), 0);
  post.content_length = kLimit;
  EXPECT_EQ(refusal(post), 0);
  post.content_length = kLimit + 1;
  EXPECT_EQ(refusal(post), 413);

  BodyFraming chunked;
  chunked.method = "POST";
  chunked.chunked = chunked.has_transfer_encoding = true;
  EXPECT_EQ(refusal(chunked), 0);  // capped while it is read
  BodyFraming other_coding = chunked;
  other_coding.chunked = false;  // Transfer-Encoding: gzip (not ending in chunked)
  EXPECT_EQ(refusal(other_coding), 400);

  BodyFraming gzip;
  gzip.method = "POST";
  gzip.content_length = 10;
  gzip.content_encoding = "gzip";
  EXPECT_EQ(refusal(gzip), 415);
  gzip.content_length = kLimit * 100;  // refused as compressed before its size matters
  EXPECT_EQ(refusal(gzip), 415);
  gzip.content_encoding = "Identity";
  gzip.content_length = 10;
  EXPECT_EQ(refusal(gzip), 0);
  gzip.content_encoding = "br";
  gzip.content_length = 0;  // no body: nothing to decode
  EXPECT_EQ(refusal(gzip), 0);

  BodyFraming get;
  get.method = "GET";
  EXPECT_EQ(refusal(get), 0);  // a GET needs no length
  const auto r = refuse_body(post, kLimit);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->code, "request_too_large");
  EXPECT_NE(r->message.find("1000"), std::string::npos);
}

TEST(HttpWire, ConstantTimeEqual) {
  EXPECT_TRUE(constant_time_equal("Bearer k", "Bearer k"));
  EXPECT_TRUE(constant_time_equal("", ""));
  EXPECT_FALSE(constant_time_equal("Bearer k", "Bearer j"));
  EXPECT_FALSE(constant_time_equal("Bearer k", "Bearer kk"));
  EXPECT_FALSE(constant_time_equal("Bearer kk", "Bearer k"));
  EXPECT_FALSE(constant_time_equal("", "x"));
  EXPECT_FALSE(constant_time_equal(std::string("a\0", 2), "a"));
}

}  // namespace
}  // namespace dsv4::server
