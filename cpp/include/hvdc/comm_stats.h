// Bytes this rank put on and took off the wire, kept per communicator.
#pragma once
#include <cstdint>

namespace hvdc {

struct CommStats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t calls = 0;

  void add(uint64_t sent, uint64_t received) {
    bytes_sent += sent;
    bytes_received += received;
  }
};

}  // namespace hvdc
