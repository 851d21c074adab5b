// Finding a connection's socket and polling it for hang-up (connection_probe.h).
//
// The lookup touches no file descriptor but the one it finds: the connection's socket inode
// comes from /proc/net/tcp{,6} (matched on local port, peer address and peer port), the
// descriptor from the /proc/self/fd links ("socket:[inode]"). Calling fstat/getsockname on
// every descriptor instead would race with other threads closing theirs.
#include "server/connection_probe.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace dsv4::server {
namespace {

// Parses /proc/net/tcp's "ADDR:PORT" (ADDR: the address's 32-bit words in hex, each as the
// kernel stores it) into raw address bytes and a port.
bool parse_endpoint(const std::string& text, bool v6, unsigned char* addr, int& port) {
  const std::size_t colon = text.find(':');
  const std::size_t words = v6 ? 4 : 1;
  if (colon != words * 8) return false;
  for (std::size_t w = 0; w < words; ++w) {
    const std::uint32_t word = static_cast<std::uint32_t>(std::strtoul(text.substr(w * 8, 8).c_str(), nullptr, 16));
    std::memcpy(addr + 4 * w, &word, 4);
  }
  port = static_cast<int>(std::strtol(text.c_str() + colon + 1, nullptr, 16));
  return true;
}

// The inode of the TCP socket (local_port, remote_addr:remote_port), or 0.
unsigned long find_inode(const std::string& remote_addr, int remote_port, int local_port) {
  unsigned char want4[4] = {}, want6[16] = {};
  const bool is4 = inet_pton(AF_INET, remote_addr.c_str(), want4) == 1;
  const bool is6 = !is4 && inet_pton(AF_INET6, remote_addr.c_str(), want6) == 1;
  if (!is4 && !is6) return 0;
  if (is4) {  // an IPv4 peer of an IPv6 socket shows as ::ffff:a.b.c.d
    std::memset(want6, 0, 10);
    want6[10] = want6[11] = 0xff;
    std::memcpy(want6 + 12, want4, 4);
  }
  for (const bool v6 : {false, true}) {
    if (!v6 && !is4) continue;
    std::ifstream in(v6 ? "/proc/net/tcp6" : "/proc/net/tcp");
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout;
      unsigned long inode = 0;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode;
      if (!fields) continue;
      unsigned char local_addr[16], peer_addr[16];
      int lport = 0, rport = 0;
      if (!parse_endpoint(local, v6, local_addr, lport) || !parse_endpoint(remote, v6, peer_addr, rport)) continue;
      if (lport != local_port || rport != remote_port) continue;
      if (std::memcmp(peer_addr, v6 ? want6 : want4, v6 ? 16 : 4) == 0) return inode;
    }
  }
  return 0;
}

}  // namespace

ConnectionProbe::ConnectionProbe(const std::string& remote_addr, int remote_port, int local_port) {
  if (remote_port <= 0 || local_port <= 0) return;
  const unsigned long inode = find_inode(remote_addr, remote_port, local_port);
  if (inode == 0) return;
  const std::string target = "socket:[" + std::to_string(inode) + "]";
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return;
  while (const dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0') continue;
    char link[64] = {};
    const std::string path = std::string("/proc/self/fd/") + entry->d_name;
    const ssize_t n = readlink(path.c_str(), link, sizeof(link) - 1);
    if (n > 0 && std::string_view(link, static_cast<std::size_t>(n)) == target) {
      fd_ = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
}

bool ConnectionProbe::closed() const {
  if (fd_ < 0) return false;
  pollfd p{};
  p.fd = fd_;
  p.events = POLLRDHUP;
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace dsv4::server
