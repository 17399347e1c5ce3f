// Bytes this rank put on and took off the wire, kept per communicator; and, beside them, the bytes
// a collective copied between a device and host memory (hvdc/device.h; 0 on the CPU).
#pragma once
#include <cstddef>
#include <cstdint>

namespace hvdc {

struct CommStats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t calls = 0;
  uint64_t host_bytes = 0;

  void add(uint64_t sent, uint64_t received) {
    bytes_sent += sent;
    bytes_received += received;
  }
};

// Bytes a bandwidth-optimal (ring) allreduce of `bytes` moves per rank each way among `n` ranks.
// MPI chooses its own algorithm, so this is the model the statistics report, not a measurement;
// every Communicator implementation counts allreduce_sum with it, so the numbers do not depend on
// which one ran.
inline uint64_t ring_allreduce_bytes(size_t bytes, int n) {
  return n <= 1 ? 0 : static_cast<uint64_t>(2.0 * (n - 1) / n * static_cast<double>(bytes));
}

}  // namespace hvdc
