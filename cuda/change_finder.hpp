// The CUDA path: a tensor's changes found on the GPU that holds its base and
// new bytes, and only they copied to the host, as FoundChunks for the CPU's
// chunked encoders (encode_sparse_found, encode_context_found), which then
// write the entries the CPU path writes, byte for byte.
//
// This header needs no CUDA headers: g++ code may hold a ChangeFinder.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "hfdelta/codec.hpp"

namespace hfdelta::gpu {

// A tensor's two versions on the current device. `es` is the chunked
// encodings' element size (chunk_layout), `field` the context field.
struct DeviceTensor {
  const void* base = nullptr;
  const void* next = nullptr;
  std::uint64_t nbytes = 0;
  std::size_t es = 1;
  ContextField field;
};

// A tensor's changes on the host, chunk by chunk.
struct Found {
  std::size_t es = 1;
  std::uint64_t elements = 0, chunks = 0;
  std::vector<std::uint64_t> start;       // chunks + 1: each chunk's first change
  std::vector<std::uint64_t> bytes;       // per chunk: changed bytes
  std::vector<std::uint32_t> pos;         // per change: its element in its chunk
  std::vector<std::uint8_t> diff;         // per change: new - old, es bytes
  std::vector<std::uint8_t> ctx;          // context: per change, its base context
  std::vector<std::uint32_t> sample;      // context: per chunk, 256 sampled-context counts
  std::vector<std::uint32_t> rank;        // context, after rank(): per change
  std::uint64_t host_bytes = 0;           // bytes copied from the device to get here
  std::uint64_t changes() const { return start.empty() ? 0 : start.back(); }
  // Chunk c as the encoders take it (views into this).
  FoundChunk chunk(std::uint64_t c) const;
};

// Time of the last find() or rank(), in milliseconds, by step.
struct Timing {
  float find_ms = 0;          // on the device: comparison to compacted changes (find), or ranks (rank)
  float total_ms = 0;         // with the copies to the host (and find's wait for the count of changes)
  bool found_again = false;   // find: more changes than room for them, found again with room
};

// Finds changes on the current CUDA device; holds its scratch memory (grown
// to the largest tensor seen) and a stream. Not thread-safe: one per thread.
class ChangeFinder {
 public:
  ChangeFinder();
  ~ChangeFinder();
  ChangeFinder(const ChangeFinder&) = delete;
  ChangeFinder& operator=(const ChangeFinder&) = delete;

  // The changes of `t` into `out`; `context`: with each change's base
  // context and each chunk's sample (what context_groups needs). The finder
  // works on a stream of its own: the caller has the bytes written first
  // (synchronized with the stream that wrote them).
  void find(const DeviceTensor& t, bool context, Found& out);
  // After find(t, true, out): each change's rank among the base elements of
  // its group, its chunk's groups being `groups` (context_groups of each chunk).
  void rank(const DeviceTensor& t, std::span<const ContextGroups> groups, Found& out);
  const Timing& timing() const { return timing_; }

  // The number of CUDA devices; 0 with the reason in `why` where there is none.
  static int devices(std::string& why);

  struct Impl;  // the device buffers (change_finder.cu)

 private:
  std::unique_ptr<Impl> impl_;
  Timing timing_;
};

// The field as the context encoder reads it: none where it does not fit an
// element of `es` bytes.
ContextField usable_field(ContextField f, std::size_t es);

// Entries from changes on the host (found_entries.cpp, plain C++): sparse's;
// each chunk's context groups (what rank() takes), and context's once the
// changes are ranked among them.
std::vector<std::uint8_t> sparse_entry(const Found& f, std::uint64_t nbytes, int level);
std::vector<ContextGroups> context_groups_of(const Found& f, ContextField field);
std::vector<std::uint8_t> context_entry(const Found& f, std::uint64_t nbytes, ContextField field,
                                        std::span<const ContextGroups> groups, int level);

}  // namespace hfdelta::gpu
