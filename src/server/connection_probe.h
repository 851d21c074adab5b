// ConnectionProbe: has the client of a connection hung up?
//
// A write to a closed peer only fails one or two writes later -- too late for a request that is
// still queued, prefilling, or not streaming at all -- and the server keeps no read pending on a
// connection while its request runs (pipelined bytes wait in the kernel). So the server asks the
// kernel about the connection's socket (poll with POLLRDHUP, which consumes no data) while the
// request is in flight. The probe does not own the descriptor. Linux only.
#pragma once

namespace dsv4::server {

class ConnectionProbe {
 public:
  ConnectionProbe() = default;
  explicit ConnectionProbe(int fd) : fd_(fd) {}

  bool valid() const { return fd_ >= 0; }
  // True once the peer has closed (or half-closed) or reset the connection.
  bool closed() const;

 private:
  int fd_ = -1;
};

}  // namespace dsv4::server
