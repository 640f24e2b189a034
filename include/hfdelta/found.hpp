// Changes found outside the library, the input of the publishers' advanced
// entry point (MemoryPublisher::put_found, TensorFound): the CUDA path of
// cuda/ finds a tensor's changes on the device and hands over only them, one
// FoundChunk per chunk of the chunked encodings (docs/format.md, "sparse",
// "context"). The codecs encode them into the same entry bytes a scan of the
// two views would.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hfdelta {

// One chunk's changes as found elsewhere (the CUDA path of cuda/, which has
// the base and new bytes on the device): what the chunked encoders take
// instead of scanning the views, for the same entry bytes. Views the caller
// keeps alive while the chunk is encoded.
struct FoundChunk {
  std::uint64_t elements = 0;          // the chunk's elements
  std::uint64_t count = 0;             // its changed elements
  std::uint64_t bytes_changed = 0;     // their bytes that differ
  const std::uint32_t* pos = nullptr;  // per change: its element in the chunk, ascending
  const std::uint8_t* diff = nullptr;  // per change: new - old, elem_size bytes little-endian
  // The context encoding's only:
  const std::uint8_t* ctx = nullptr;      // per change: its base element's context
  const std::uint32_t* sample = nullptr;  // 256 counts: the contexts of the chunk's sampled base elements
  const std::uint32_t* rank = nullptr;    // per change: how many base elements of its context group precede it
};

// Most context groups per chunk (docs/format.md, "context").
inline constexpr std::size_t kContextMaxGroups = 16;

// A chunk's context groups: group g holds the contexts from lo[g] (lo[0] = 0)
// up to the next group's.
struct ContextGroups {
  std::uint32_t G = 1;
  std::uint8_t lo[kContextMaxGroups] = {};
};

}  // namespace hfdelta
