// Seeing the peer of an accepted connection hang up (server/connection_probe.h).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/connection_probe.h"

namespace dsv4::server {
namespace {

int port_of(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return ntohs(addr.sin_port);
}

TEST(ConnectionProbe, SeesTheHangUpNotData) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  const int server_port = port_of(listener);

  const int client = socket(AF_INET, SOCK_STREAM, 0);
  addr.sin_port = htons(static_cast<std::uint16_t>(server_port));
  ASSERT_EQ(connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const int accepted = accept(listener, nullptr, nullptr);
  ASSERT_GE(accepted, 0);

  const ConnectionProbe probe(accepted);
  EXPECT_TRUE(probe.valid());
  EXPECT_FALSE(probe.closed());
  EXPECT_FALSE(ConnectionProbe().valid());
  EXPECT_FALSE(ConnectionProbe().closed());
  // Data from the client (a pipelined request) is not a hang-up.
  ASSERT_EQ(write(client, "GET / HTTP/1.1\r\n", 16), 16);
  usleep(1000);
  EXPECT_FALSE(probe.closed());

  close(client);
  bool closed = false;
  for (int i = 0; i < 200 && !closed; ++i) {
    closed = probe.closed();
    if (!closed) usleep(1000);
  }
  EXPECT_TRUE(closed);
  close(accepted);
  close(listener);
}

}  // namespace
}  // namespace dsv4::server
