#include "hvdc/allgather.h"

#include <algorithm>
#include <cstring>
#include <memory>

namespace hvdc {

void allgather_rows(Communicator& comm, const void* send, int64_t rows, size_t row_bytes,
                    std::vector<unsigned char>& out, std::vector<int64_t>& rows_per_rank,
                    DeviceTable* device) {
  const int n = comm.size();
  rows_per_rank.assign(static_cast<size_t>(n), 0);
  comm.allgather(&rows, rows_per_rank.data(), sizeof(int64_t));
  int64_t most = 0, total = 0;
  for (int64_t r : rows_per_rank) {
    most = std::max(most, r);
    total += r;
  }
  out.assign(static_cast<size_t>(total) * row_bytes, 0);
  const size_t block = static_cast<size_t>(most) * row_bytes;
  if (block == 0) return;
  // Padded blocks: one regular allgather instead of n broadcasts; the pad never reaches `out`.
  // On a device: only this rank's rows cross to the host, into a reused staging buffer.
  const bool host = device == nullptr || device->host_memory();
  const size_t len = static_cast<size_t>(rows) * row_bytes;
  std::vector<unsigned char> mine(host ? block : 0, 0);
  std::unique_ptr<HostStaging> staging(host ? nullptr : new HostStaging(*device, block));
  unsigned char* send_block = host ? mine.data() : staging->get();
  if (host) {
    if (len) std::memcpy(send_block, send, len);
  } else {
    std::memset(send_block + len, 0, block - len);
    if (len) device->to_host(send_block, send, len);
    device->wait();
  }
  std::vector<unsigned char> all(block * static_cast<size_t>(n));
  comm.allgather(send_block, all.data(), block);
  size_t at = 0;
  for (int r = 0; r < n; ++r) {
    const size_t got = static_cast<size_t>(rows_per_rank[r]) * row_bytes;
    if (got) std::memcpy(out.data() + at, all.data() + block * static_cast<size_t>(r), got);
    at += got;
  }
}

}  // namespace hvdc
