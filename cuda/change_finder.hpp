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
#include <type_traits>
#include <utility>
#include <vector>

#include "codec/codec.hpp"

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

// Host memory from elsewhere: ChangeFinder's is page-locked (cudaMallocHost),
// so that copies from the device run at the link's rate and take time in
// proportion to what they copy.
struct HostMemory {
  void* (*allocate)(std::size_t bytes);
  void (*deallocate)(void* p);
};

// The allocator of Found's arrays: operator new, or `mem` where one is
// given (ChangeFinder gives its page-locked memory to the Founds it fills,
// and reuses it when the same Found is filled again). resize() leaves new
// elements uninitialized: the device's copies write them. A copy of a Found
// is in ordinary memory.
template <class T>
struct HostAllocator {
  using value_type = T;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_copy_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;
  const HostMemory* mem = nullptr;
  HostAllocator() = default;
  explicit HostAllocator(const HostMemory* m) : mem(m) {}
  template <class U>
  HostAllocator(const HostAllocator<U>& o) : mem(o.mem) {}
  T* allocate(std::size_t n) {
    return static_cast<T*>(mem ? mem->allocate(n * sizeof(T)) : ::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, std::size_t) {
    if (mem)
      mem->deallocate(p);
    else
      ::operator delete(p);
  }
  template <class U>
  void construct(U* p) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... A>
  void construct(U* p, A&&... a) {
    ::new (static_cast<void*>(p)) U(std::forward<A>(a)...);
  }
  HostAllocator select_on_container_copy_construction() const { return {}; }
  template <class U>
  bool operator==(const HostAllocator<U>& o) const {
    return mem == o.mem;
  }
};
template <class T>
using HostVector = std::vector<T, HostAllocator<T>>;

// A tensor's changes on the host, chunk by chunk.
struct Found {
  std::size_t es = 1;
  std::uint64_t elements = 0, chunks = 0;
  HostVector<std::uint64_t> start;   // chunks + 1: each chunk's first change
  HostVector<std::uint64_t> bytes;   // per chunk: changed bytes
  HostVector<std::uint32_t> pos;     // per change: its element in its chunk
  HostVector<std::uint8_t> diff;     // per change: new - old, es bytes
  HostVector<std::uint8_t> ctx;      // context: per change, its base context
  HostVector<std::uint32_t> sample;  // context: per chunk, 256 sampled-context counts
  HostVector<std::uint32_t> rank;    // context, after rank(): per change
  std::uint64_t host_bytes = 0;      // bytes copied from the device to get here
  std::uint64_t changes() const { return start.empty() ? 0 : start.back(); }
  // Chunk c as the encoders take it (views into this).
  FoundChunk chunk(std::uint64_t c) const;
};

// How changes are found (both give the same changes; the choice is speed):
//   tiles   one kernel: 16-byte loads of both inputs, each tile's changes
//           numbered by cub::BlockScan with a decoupled look-back
//           (cub::TilePrefixCallbackOp) and written straight to their places;
//           a tile is 32 KiB of each input (tiles16: 16 KiB, with more
//           blocks on each multiprocessor)
//   select  cub::DeviceSelect::If over the elements (an element and its
//           difference made as CUB loads it), the selected written to their
//           places as CUB writes them; chunk and tile bounds by binary search,
//           chunks' changed bytes by cub::DeviceSegmentedReduce
//   tiles64 (pipelined_tiles) tiles of 16 KiB (64 bytes of each input a
//           thread), as many blocks as fit at once, each taking tiles in
//           turn from a counter and loading its next tile before it works
//           on the one it has
//   tilesw  (warp_tiles, the default) tiles' 32 KiB tiles with at most 80
//           registers a thread (3 blocks a multiprocessor): each vector kept
//           as its differences; each lane's first change in a row from its
//           warp's (cub::BlockScan) and the lanes' below (ballots of the
//           counts' bits), then each lane writes its own changes
//   tilesw64 (warp_tiles64) tilesw with 64 KiB tiles (half the tiles,
//           look-backs and scans a byte), loaded 32 KiB at a time; sparse's
//           kernel 2 blocks a multiprocessor, context's 1
//   tilesw4 (warp_tiles4) tilesw with 16 KiB tiles, sparse's kernel in at
//           most 64 registers (4 blocks a multiprocessor)
enum class Design { tiles, small_tiles, select, pipelined_tiles, warp_tiles, warp_tiles64, warp_tiles4 };
const char* name(Design d);

// Time of the last find() or rank(), in milliseconds, by step (device events).
struct Timing {
  float find_ms = 0;         // on the device: from the inputs to the changes in device memory (find), or ranks (rank)
  float copy_ms = 0;         // the copies of the changes (and counts) to the host's page-locked memory
  float total_ms = 0;        // all of it, with find's wait for the count of changes
  bool found_again = false;  // find: more changes than room for them, found again with room
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
  // (synchronized with the stream that wrote them). `out`'s arrays are put in
  // page-locked memory, kept when the same Found is filled again.
  void find(const DeviceTensor& t, bool context, Found& out);
  // After find(t, true, out): each change's rank among the base elements of
  // its group, its chunk's groups being `groups` (context_groups of each chunk).
  void rank(const DeviceTensor& t, std::span<const ContextGroups> groups, Found& out);
  // After find(t, ..., out): adds the changes found, still in the finder's
  // device memory (until the next find), to `base` on the device, t's base
  // bytes, which become the new bytes as the changes give them: the base
  // brought forward without reading the new bytes again, or copying them.
  void apply(void* base, const Found& out);
  const Timing& timing() const { return timing_; }
  // A reference for timing, not a finder: both inputs read as tiles read
  // them (tiles16, tiles64, tilesw4: 16 KiB tiles; else 32 KiB), and only the bytes
  // that differ counted and returned (the sum of find()'s chunk bytes);
  // timing().find_ms is its time on the device.
  std::uint64_t read_floor(const DeviceTensor& t);
  // tilesw unless set (what DevicePublisher uses); select: a tensor of 2^32
  // elements or more is found by tiles.
  void set_design(Design d) { design_ = d; }
  Design design() const { return design_; }

  // The number of CUDA devices; 0 with the reason in `why` where there is none.
  static int devices(std::string& why);

  struct Impl;  // the device buffers (change_finder.cu)

 private:
  std::unique_ptr<Impl> impl_;
  Timing timing_;
  Design design_ = Design::warp_tiles;
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
