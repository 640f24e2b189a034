// The CUDA path's kernels. A tensor's changes are found in one pass over
// both inputs, and only the changes cross to the host. Two ways (Design):
//   tiles    one kernel: a tile (256 threads x V 16-byte vectors of each
//            input, striped: coalesced loads, all in flight before the first
//            use) is compared element by element; each vector's changes are
//            counted, the counts brought into memory order
//            (cub::BlockExchange) and numbered by cub::BlockScan, the tile's
//            first change coming from the tiles before it by CUB's decoupled
//            look-back (cub::TilePrefixCallbackOp, warp 0); each thread then
//            writes its changes straight to their places (neighbouring
//            threads' changes are neighbours there too). Each chunk's changed
//            bytes (cub::BlockReduce, one atomic add per tile), its first
//            change and each rank tile's first change come out of the same pass.
//   select   cub::DeviceSelect::If over the elements, each made (as CUB loads
//            it) into its index, difference, changed bytes and base context,
//            kept where the bytes differ; the selected are written to their
//            places as CUB writes them (a tabulate output iterator); then the
//            chunks' and rank tiles' first changes by binary search over the
//            selected indices, and the chunks' changed bytes by
//            cub::DeviceSegmentedReduce.
// For context, each chunk's sample (the contexts of its sampled base
// elements) is counted by one more kernel that reads those elements only
// (1 in 16), and rank() then counts each change's base elements of its group
// before it, in one more pass over the base: per rank tile each group's
// elements (cub::BlockScan, which also gives each thread's elements before
// it), the tiles' before it in its chunk by a segmented decoupled look-back,
// and within the thread from the tile's groups kept in shared memory.
// What a change, a difference, a context and a group are: change_rules.hpp,
// the CPU encoders' own.
#include "change_finder.hpp"

#include <cuda_runtime.h>

#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/tabulate_output_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <cub/agent/single_pass_scan_operators.cuh>
#include <cub/block/block_exchange.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_segmented_reduce.cuh>
#include <cub/device/device_select.cuh>
#include <cuda/std/functional>

#include <algorithm>
#include <string>

#include "codec/change_rules.hpp"
#include "hfdelta/error.hpp"

namespace hfdelta::gpu {

const char* name(Design d) {
  switch (d) {
    case Design::tiles:
      return "tiles";
    case Design::small_tiles:
      return "tiles16";
    case Design::select:
      return "select";
    case Design::pipelined_tiles:
      return "tiles64";
    case Design::warp_tiles:
      return "tilesw";
    case Design::warp_tiles64:
      return "tilesw64";
    case Design::warp_tiles4:
      return "tilesw4";
  }
  return "?";
}

namespace {

[[noreturn]] void cuda_fail(cudaError_t e, const char* call, int line) {
  fail(Exit::failure,
       std::string("CUDA: ") + call + " (change_finder.cu:" + std::to_string(line) + "): " + cudaGetErrorString(e));
}
#define CK(call)                                           \
  do {                                                     \
    const cudaError_t e_ = (call);                         \
    if (e_ != cudaSuccess) cuda_fail(e_, #call, __LINE__); \
  } while (0)

constexpr int kThreads = 256;
constexpr int kVecBytes = 16;
// tiles: V vectors of each input a thread, a tile of 4 V KiB of each input
template <int V>
constexpr std::uint64_t kTileBytes = std::uint64_t{kThreads} * V* kVecBytes;
constexpr int kThreadBytes = 32;  // rank: of the base a thread
constexpr int kWords = kThreadBytes / 4;
constexpr std::uint64_t kRankTileBytes = kThreads * kThreadBytes;  // 8 KiB
constexpr unsigned kMaxGroups = 8;                                 // what the encoder writes (context_codec.cpp)
static_assert(kSparseChunkElements % kTileBytes<16> == 0, "a tile lies in one chunk");
static_assert(kRankTileBytes == 2 * kThreads * kVecBytes, "a rank tile is two of a tile's vector rows");
static_assert(kSparseChunkElements % kRankTileBytes == 0, "a rank tile lies in one chunk");
static_assert(kThreads == 256, "one thread per context of the sample's histogram");

// A thread's 32 bytes of `p` from byte `at` as 8 words (rank): two 16-byte
// loads where they are inside (the caller has checked alignment), else byte
// by byte, zeros past `nbytes`.
template <bool kVec>
__device__ inline void load_thread(const std::uint8_t* p, std::uint64_t at, std::uint64_t nbytes,
                                   std::uint32_t (&w)[kWords]) {
  if (kVec && at + kThreadBytes <= nbytes) {
    const uint4* q = reinterpret_cast<const uint4*>(p + at);
    const uint4 v0 = __ldcs(q), v1 = __ldcs(q + 1);
    w[0] = v0.x, w[1] = v0.y, w[2] = v0.z, w[3] = v0.w, w[4] = v1.x, w[5] = v1.y, w[6] = v1.z, w[7] = v1.w;
    return;
  }
#pragma unroll
  for (int k = 0; k < kWords; ++k) w[k] = 0;
#pragma unroll
  for (int k = 0; k < kThreadBytes; ++k)
    if (at + k < nbytes) w[k / 4] |= std::uint32_t{p[at + k]} << (8 * (k % 4));
}

// 16 bytes of `p` from byte `at`: one load where they are inside (the caller
// has checked alignment), else byte by byte, zeros past `nbytes`.
template <bool kVec>
__device__ inline uint4 load_vec(const std::uint8_t* p, std::uint64_t at, std::uint64_t nbytes) {
  if (kVec && at + kVecBytes <= nbytes) return __ldcs(reinterpret_cast<const uint4*>(p + at));
  std::uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
  for (int k = 0; k < kVecBytes; ++k)
    if (at + k < nbytes) w[k / 4] |= std::uint32_t{p[at + k]} << (8 * (k % 4));
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Element i of a thread's words (i a constant once unrolled).
template <int ES, int N>
__device__ inline std::uint64_t element_at(const std::uint32_t (&w)[N], int i) {
  if constexpr (ES == 8) {
    return std::uint64_t{w[2 * i]} | std::uint64_t{w[2 * i + 1]} << 32;
  } else {
    const int at = i * ES;
    return (w[at / 4] >> (8 * (at % 4))) & static_cast<std::uint32_t>(rules::element_ones(ES));
  }
}

// How many of a vector's elements changed (rules::changed: any of its bytes).
template <int ES>
__device__ inline unsigned changed_in(const uint4& a, const uint4& b) {
  if constexpr (ES == 1) {
    return (__popc(__vcmpne4(a.x, b.x)) + __popc(__vcmpne4(a.y, b.y)) + __popc(__vcmpne4(a.z, b.z)) +
            __popc(__vcmpne4(a.w, b.w))) /
           8;
  } else if constexpr (ES == 2) {
    return (__popc(__vcmpne2(a.x, b.x)) + __popc(__vcmpne2(a.y, b.y)) + __popc(__vcmpne2(a.z, b.z)) +
            __popc(__vcmpne2(a.w, b.w))) /
           16;
  } else if constexpr (ES == 4) {
    return unsigned{a.x != b.x} + unsigned{a.y != b.y} + unsigned{a.z != b.z} + unsigned{a.w != b.w};
  } else {
    return unsigned{a.x != b.x || a.y != b.y} + unsigned{a.z != b.z || a.w != b.w};
  }
}

// A vector's bytes that differ (the sum of rules::changed_bytes over its elements).
__device__ inline unsigned bytes_changed_in(const uint4& a, const uint4& b) {
  return (__popc(__vcmpne4(a.x, b.x)) + __popc(__vcmpne4(a.y, b.y)) + __popc(__vcmpne4(a.z, b.z)) +
          __popc(__vcmpne4(a.w, b.w))) /
         8;
}

template <int ES>
struct DiffWord;
template <>
struct DiffWord<1> {
  using type = std::uint8_t;
};
template <>
struct DiffWord<2> {
  using type = std::uint16_t;
};
template <>
struct DiffWord<4> {
  using type = std::uint32_t;
};
template <>
struct DiffWord<8> {
  using type = std::uint64_t;
};

// The look-back of tiles: no wait before the first look at the tiles before
// (a tile takes microseconds; CUB's default waits 450 ns at every tile) and
// none between looks.
struct NoDelay {
  struct delay_t {
    __device__ void operator()() {}
  };
  __device__ NoDelay(unsigned) {}
  __device__ delay_t operator()() { return {}; }
};

using CountState = cub::ScanTileState<unsigned long long>;
using CountPrefix = cub::TilePrefixCallbackOp<unsigned long long, ::cuda::std::plus<>, CountState, NoDelay>;

template <class State>
__global__ void init_tiles(State s, int ntiles) {
  s.InitializeStatus(ntiles);
}

// Where find() puts what it finds. The per-change arrays hold `cap`
// changes; changes past them are counted, not written (the host finds
// again with room for them).
struct FindOut {
  std::uint32_t* pos;
  void* diff;
  std::uint8_t* ctx;
  std::uint64_t cap;
  unsigned long long* chunk_start;  // chunks + 1: each chunk's first change, then all changes (at most cap)
  unsigned long long* chunk_bytes;  // per chunk (tiles: zeroed): its changed bytes
  unsigned long long* total;        // all changes, also past cap
  std::uint64_t chunks;
  unsigned long long* rank_start;  // nrank + 1: each rank tile's first change, then all changes
  std::uint64_t nrank;
};

// Warp 0 takes the tile's first change from the tiles before it (CUB's
// decoupled look-back) and publishes the tile's own count; s.first holds it
// after the caller's next __syncthreads.
template <class Shared>
__device__ __forceinline__ void look_back(CountState state, Shared& s, int tile, unsigned tile_count) {
  if (threadIdx.x >= 32) return;
  unsigned long long first = 0;
  if (tile == 0) {
    if (threadIdx.x == 0) state.SetInclusive(0, tile_count);
  } else {
    CountPrefix prefix(state, s.prefix, ::cuda::std::plus<>{}, tile);
    first = prefix(tile_count);
  }
  if (threadIdx.x == 0) s.first = first;
}

// Thread 0 records where tile `tile` (first element e_tile) stands: its
// chunk's first change and changed bytes, its rank tiles' first changes
// (rank_first(k): the tile's changes before row k), and after the last tile
// the total.
template <int V, class RankFirst>
__device__ __forceinline__ void record_tile(const FindOut& o, std::uint64_t base, std::uint64_t e_tile, int tile,
                                            int ntiles, unsigned long long first, unsigned tile_count,
                                            unsigned tile_bytes, RankFirst rank_first) {
  if (threadIdx.x != 0) return;
  const std::uint64_t chunk = rules::chunk_of(e_tile);
  if (rules::index_in_chunk(e_tile) == 0) o.chunk_start[chunk] = first;
  if (tile_bytes) atomicAdd(o.chunk_bytes + chunk, static_cast<unsigned long long>(tile_bytes));
#pragma unroll
  for (int k = 0; k < V; k += 2) {
    const std::uint64_t r = base / kRankTileBytes + k / 2;
    if (r < o.nrank) o.rank_start[r] = first + rank_first(k);
  }
  if (tile + 1 == ntiles) {
    const unsigned long long all = first + tile_count;
    *o.total = all;
    o.chunk_start[o.chunks] = o.rank_start[o.nrank] = all < o.cap ? all : o.cap;
  }
}

// ---- tiles -----------------------------------------------------------------------
// Vector k of thread t is the tile's vector k * kThreads + t, so a row of
// vectors is 4 KiB of each input, and a rank tile two rows.
template <int V>
struct TileShared {
  typename cub::BlockExchange<unsigned, kThreads, V>::TempStorage exchange;
  typename cub::BlockScan<unsigned, kThreads>::TempStorage scan;
  typename cub::BlockReduce<unsigned, kThreads>::TempStorage reduce;
  typename CountPrefix::TempStorage prefix;
  unsigned long long first;
  int next;  // tiles64: the tile claimed next
};

// A thread's V vectors of each input in tile `tile`, all loads issued before any use.
template <bool kVec, int V>
__device__ inline void load_tile(const std::uint8_t* a, const std::uint8_t* b, std::uint64_t nbytes, int tile,
                                 uint4 (&va)[V], uint4 (&vb)[V]) {
  const std::uint64_t base = std::uint64_t(tile) * kTileBytes<V>;
#pragma unroll
  for (int k = 0; k < V; ++k)
    va[k] = load_vec<kVec>(a, base + (std::uint64_t(k) * kThreads + threadIdx.x) * kVecBytes, nbytes);
#pragma unroll
  for (int k = 0; k < V; ++k)
    vb[k] = load_vec<kVec>(b, base + (std::uint64_t(k) * kThreads + threadIdx.x) * kVecBytes, nbytes);
}

// One tile of `ntiles` from its loaded vectors: counted, numbered (the
// look-back waits only on tiles claimed before: lower numbers), written.
template <int ES, bool kContext, int V>
__device__ inline void find_tile(int tile, int ntiles, const uint4 (&va)[V], const uint4 (&vb)[V], ContextField f,
                                 CountState state, const FindOut& o, TileShared<V>& s) {
  static_assert(V % 2 == 0, "rank tiles of two rows");
  using Exchange = cub::BlockExchange<unsigned, kThreads, V>;
  using Scan = cub::BlockScan<unsigned, kThreads>;
  using Reduce = cub::BlockReduce<unsigned, kThreads>;
  using D = typename DiffWord<ES>::type;
  constexpr int kPer = kVecBytes / ES;  // elements per vector
  const std::uint64_t base = std::uint64_t(tile) * kTileBytes<V>;

  unsigned count[V], bytes = 0;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    count[k] = changed_in<ES>(va[k], vb[k]);
    bytes += bytes_changed_in(va[k], vb[k]);
  }
  // Each vector's first change in the tile: the counts in memory order
  // (thread t's are vectors t*V .. t*V+V-1), scanned, and back.
  unsigned off[V];
  Exchange(s.exchange).StripedToBlocked(count, off);
  unsigned mine = 0;
#pragma unroll
  for (int k = 0; k < V; ++k) mine += off[k];
  unsigned before, tile_count;
  Scan(s.scan).ExclusiveSum(mine, before, tile_count);
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const unsigned c = off[k];
    off[k] = before;
    before += c;
  }
  __syncthreads();  // the exchange's storage again
  Exchange(s.exchange).BlockedToStriped(off, off);
  look_back(state, s, tile, tile_count);
  const unsigned tile_bytes = Reduce(s.reduce).Sum(bytes);
  __syncthreads();  // s.first
  const unsigned long long first = s.first;
  const std::uint64_t e_tile = base / ES;
  // thread 0's vector of each even row is a rank tile's first
  record_tile<V>(o, base, e_tile, tile, ntiles, first, tile_count, tile_bytes, [&](int k) { return off[k]; });

  D* diff = static_cast<D*>(o.diff);
#pragma unroll
  for (int k = 0; k < V; ++k) {
    if (!count[k]) continue;
    const std::uint64_t at = base + (std::uint64_t(k) * kThreads + threadIdx.x) * kVecBytes;
    const std::uint64_t e0 = at / ES;
    const std::uint32_t wa[4] = {va[k].x, va[k].y, va[k].z, va[k].w}, wb[4] = {vb[k].x, vb[k].y, vb[k].z, vb[k].w};
    std::uint64_t to = first + off[k];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const std::uint64_t x = element_at<ES>(wa, i), y = element_at<ES>(wb, i);
      if (rules::changed(x, y)) {
        if (to < o.cap) {
          o.pos[to] = rules::index_in_chunk(e0 + i);
          diff[to] = static_cast<D>(rules::difference(x, y, ES));
          if constexpr (kContext) o.ctx[to] = rules::context_of(x, f);
        }
        ++to;
      }
    }
  }
}

// tiles, tiles16: one tile per block, numbered by blockIdx (the look-back
// waits only on tiles launched before).
template <int ES, bool kVec, bool kContext, int V, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    find_tiles(const std::uint8_t* a, const std::uint8_t* b, std::uint64_t nbytes, ContextField f, CountState state,
               FindOut o) {
  __shared__ TileShared<V> s;
  uint4 va[V], vb[V];
  load_tile<kVec>(a, b, nbytes, static_cast<int>(blockIdx.x), va, vb);
  find_tile<ES, kContext>(static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x), va, vb, f, state, o, s);
}

// tiles64: as many blocks as fit on the device at once, each taking tiles
// in turn from a counter (a tile's look-back waits only on tiles claimed
// before, by blocks that are running), and loading its next tile (V
// vectors, 16 x V bytes of each input a thread) before it works on the
// one it has: the loads stay in flight while the tile is counted, numbered
// and written.
template <int ES, bool kVec, bool kContext, int V, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    find_tiles_pipelined(const std::uint8_t* a, const std::uint8_t* b, std::uint64_t nbytes, ContextField f,
                         CountState state, FindOut o, int ntiles, unsigned* next_tile) {
  __shared__ TileShared<V> s;
  if (threadIdx.x == 0) s.next = static_cast<int>(atomicAdd(next_tile, 1u));
  __syncthreads();
  int tile = s.next;
  if (tile >= ntiles) return;
  uint4 va[V], vb[V];
  load_tile<kVec>(a, b, nbytes, tile, va, vb);
  for (;;) {
    __syncthreads();  // s.next read; the shared storage of the tile before done with
    if (threadIdx.x == 0) s.next = static_cast<int>(atomicAdd(next_tile, 1u));
    __syncthreads();
    const int next = s.next;
    uint4 na[V], nb[V];
    if (next < ntiles) load_tile<kVec>(a, b, nbytes, next, na, nb);
    find_tile<ES, kContext>(tile, ntiles, va, vb, f, state, o, s);
    if (next >= ntiles) return;
    tile = next;
#pragma unroll
    for (int k = 0; k < V; ++k) va[k] = na[k], vb[k] = nb[k];
  }
}

// ---- tilesw ----------------------------------------------------------------------
// tiles' tiles (256 threads x V 16-byte vectors of each input, striped), its
// numbering by cub::BlockScan and CUB's decoupled look-back, its chunk and
// rank tile bounds, but with fewer registers and the changes written by
// warps together:
//  - once loaded, a vector is kept as its differences (new - old, element
//    by element: zero where unchanged); the base only where contexts are
//    wanted. Sparse's kernel holds 4 V registers of data, not 8 V.
//  - the tile's changes in memory order are row by row (row k: vector k of
//    every thread), and within a row warp by warp; each warp's count of
//    each row goes through shared memory to cub::BlockScan (one count a
//    thread), which gives each warp's first change in each row.
//  - a warp's row with changes (a vote skips the others): each lane's first
//    change is the warp's first in the row plus the changes of the lanes
//    below (their counts summed bit by bit: a ballot and a popcount a bit
//    of the count, no shuffles), and each lane writes its own changes to
//    consecutive places (neighbouring lanes' changes are neighbours there
//    too): a warp's stores take as many steps as its lane with the most
//    changes in the row has (at 1%: mostly one), not one a 32 elements.
constexpr int kWarps = kThreads / 32;
constexpr int kWarpMinBlocks = 3;  // sparse's: 3 blocks a multiprocessor, at most 80 registers a thread
// tilesw64: 64 KiB tiles (V = 16: half the tiles, look-backs and scans a
// byte); sparse's kernel 2 blocks a multiprocessor (at most 128 registers),
// context's 1. tilesw4: sparse's kernel 4 blocks a multiprocessor (at most
// 64 registers) and so 16 KiB tiles (V = 4: with tilesw's 32 KiB, ptxas
// for sm_90 spills 68-204 bytes a thread in 64 registers).
constexpr int kWarp64V = 16, kWarp64MinBlocks = 2, kWarp64ContextMinBlocks = 1;
constexpr int kWarp4V = 4, kWarp4MinBlocks = 4;

template <int V>
struct WarpTileShared {
  typename cub::BlockScan<unsigned, kThreads>::TempStorage scan;
  typename cub::BlockReduce<unsigned, kThreads>::TempStorage reduce;
  typename CountPrefix::TempStorage prefix;
  unsigned long long first;
  unsigned row[V * kWarps];  // per row and warp: its count of changes, then its first in the tile
};

// new - old, element by element, modulo 2^(8 ES) (rules::difference).
template <int ES>
__device__ inline uint4 difference_of(const uint4& a, const uint4& b) {
  if constexpr (ES == 1) {
    return make_uint4(__vsub4(b.x, a.x), __vsub4(b.y, a.y), __vsub4(b.z, a.z), __vsub4(b.w, a.w));
  } else if constexpr (ES == 2) {
    return make_uint4(__vsub2(b.x, a.x), __vsub2(b.y, a.y), __vsub2(b.z, a.z), __vsub2(b.w, a.w));
  } else if constexpr (ES == 4) {
    return make_uint4(b.x - a.x, b.y - a.y, b.z - a.z, b.w - a.w);
  } else {
    const std::uint64_t d0 = (std::uint64_t{b.y} << 32 | b.x) - (std::uint64_t{a.y} << 32 | a.x);
    const std::uint64_t d1 = (std::uint64_t{b.w} << 32 | b.z) - (std::uint64_t{a.w} << 32 | a.z);
    return make_uint4(static_cast<std::uint32_t>(d0), static_cast<std::uint32_t>(d0 >> 32),
                      static_cast<std::uint32_t>(d1), static_cast<std::uint32_t>(d1 >> 32));
  }
}

// Bit i: element i of the vector changed (its difference is not zero).
template <int ES>
__device__ inline unsigned changed_mask(const uint4& d) {
  constexpr int kPer = kVecBytes / ES;
  if constexpr (ES == 2) {  // bits 0 and 16 of each word's halves' test
    const std::uint32_t w[4] = {__vcmpne2(d.x, 0), __vcmpne2(d.y, 0), __vcmpne2(d.z, 0), __vcmpne2(d.w, 0)};
    unsigned m = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) m |= ((w[j] & 1u) | (w[j] >> 15 & 2u)) << (2 * j);
    return m;
  }
  const std::uint32_t w[4] = {d.x, d.y, d.z, d.w};
  unsigned m = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) m |= unsigned{element_at<ES>(w, i) != 0} << i;
  return m;
}

// Element `i` (0 <= i < P, not a constant) of a vector's 4 words.
template <int ES>
__device__ inline std::uint64_t element_of(std::uint32_t w0, std::uint32_t w1, std::uint32_t w2, std::uint32_t w3,
                                           unsigned i) {
  if constexpr (ES == 8) {
    return i ? (std::uint64_t{w3} << 32 | w2) : (std::uint64_t{w1} << 32 | w0);
  } else {
    const unsigned at = i * ES;
    const unsigned q = at / 4;
    const std::uint32_t w = q < 2 ? (q == 0 ? w0 : w1) : (q == 2 ? w2 : w3);
    return (w >> (8 * (at % 4))) & static_cast<std::uint32_t>(rules::element_ones(ES));
  }
}

template <int ES, bool kVec, bool kContext, int V, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    find_tiles_warp(const std::uint8_t* a, const std::uint8_t* b, std::uint64_t nbytes, ContextField f,
                    CountState state, FindOut o) {
  static_assert(V % 2 == 0, "rank tiles of two rows");
  using Scan = cub::BlockScan<unsigned, kThreads>;
  using Reduce = cub::BlockReduce<unsigned, kThreads>;
  using D = typename DiffWord<ES>::type;
  constexpr int kPer = kVecBytes / ES;  // elements a vector
  __shared__ WarpTileShared<V> s;
  const int tile = static_cast<int>(blockIdx.x), ntiles = static_cast<int>(gridDim.x);
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const std::uint64_t base = std::uint64_t(tile) * kTileBytes<V>;

  uint4 vd[V];
  [[maybe_unused]] uint4 vx[kContext ? V : 1];
  unsigned bytes = 0;
  // Loaded G rows at a time (all of a group's loads issued before any use):
  // all V rows at once up to 8 (tilesw, tilesw4), tilesw64's 16 in two
  // groups, so that its loads fit its registers.
  constexpr int G = V > 8 ? 8 : V;
  static_assert(V % G == 0, "whole groups of rows");
#pragma unroll
  for (int g = 0; g < V; g += G) {
    uint4 va[G], vb[G];
#pragma unroll
    for (int j = 0; j < G; ++j)
      va[j] = load_vec<kVec>(a, base + (std::uint64_t(g + j) * kThreads + threadIdx.x) * kVecBytes, nbytes);
#pragma unroll
    for (int j = 0; j < G; ++j)
      vb[j] = load_vec<kVec>(b, base + (std::uint64_t(g + j) * kThreads + threadIdx.x) * kVecBytes, nbytes);
#pragma unroll
    for (int j = 0; j < G; ++j) {
      const int k = g + j;
      bytes += bytes_changed_in(va[j], vb[j]);
      vd[k] = difference_of<ES>(va[j], vb[j]);
      if constexpr (kContext) vx[k] = va[j];
      const unsigned c = __reduce_add_sync(0xffffffffu, changed_in<ES>(va[j], vb[j]));
      if (lane == 0) s.row[k * kWarps + warp] = c;
    }
  }
  __syncthreads();
  static_assert(V * kWarps <= kThreads, "a row's warp count a thread");
  const unsigned mine = threadIdx.x < V * kWarps ? s.row[threadIdx.x] : 0;
  unsigned before, tile_count;
  Scan(s.scan).ExclusiveSum(mine, before, tile_count);
  if (threadIdx.x < V * kWarps) s.row[threadIdx.x] = before;
  look_back(state, s, tile, tile_count);
  const unsigned tile_bytes = Reduce(s.reduce).Sum(bytes);
  __syncthreads();  // s.first, s.row
  const unsigned long long first = s.first;
  const std::uint64_t e_tile = base / ES;
  // warp 0's first in each even row is a rank tile's first
  record_tile<V>(o, base, e_tile, tile, ntiles, first, tile_count, tile_bytes,
                 [&](int k) { return s.row[k * kWarps]; });

  D* diff = static_cast<D*>(o.diff);
  const unsigned below = (1u << lane) - 1;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const unsigned m = changed_mask<ES>(vd[k]);
    if (!__any_sync(0xffffffffu, m != 0)) continue;  // no change in the warp's row
    // The lane's first change: the warp's first in the row, then the
    // changes of the lanes below, summed bit by bit of each lane's count
    // (at most P: one ballot a bit).
    const unsigned c = __popc(m);
    unsigned to = s.row[k * kWarps + warp];
#pragma unroll
    for (int bit = 0; (1 << bit) <= kPer; ++bit)
      to += static_cast<unsigned>(__popc(__ballot_sync(0xffffffffu, c >> bit & 1u) & below)) << bit;
    // The lane's vector: elements e_v .. e_v + P - 1, each change written in
    // order to consecutive places after those of the lanes below.
    const std::uint64_t e_v = (base + (std::uint64_t(k) * kThreads + threadIdx.x) * kVecBytes) / ES;
    std::uint64_t at = first + to;
    for (unsigned r = m; r; r &= r - 1, ++at) {
      const unsigned i = static_cast<unsigned>(__ffs(r) - 1);
      if (at < o.cap) {
        o.pos[at] = rules::index_in_chunk(e_v + i);
        diff[at] = static_cast<D>(element_of<ES>(vd[k].x, vd[k].y, vd[k].z, vd[k].w, i));
        if constexpr (kContext) o.ctx[at] = rules::context_of(element_of<ES>(vx[k].x, vx[k].y, vx[k].z, vx[k].w, i), f);
      }
    }
  }
}

// The floor for tiles' loads: both inputs read as a tile reads them, and
// only their changed bytes counted (one atomic add per tile).
template <bool kVec, int V, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    read_tiles(const std::uint8_t* a, const std::uint8_t* b, std::uint64_t nbytes, unsigned long long* total) {
  using Reduce = cub::BlockReduce<unsigned, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  uint4 va[V], vb[V];
  load_tile<kVec>(a, b, nbytes, static_cast<int>(blockIdx.x), va, vb);
  unsigned bytes = 0;
#pragma unroll
  for (int k = 0; k < V; ++k) bytes += bytes_changed_in(va[k], vb[k]);
  const unsigned sum = Reduce(tmp).Sum(bytes);
  if (threadIdx.x == 0 && sum) atomicAdd(total, static_cast<unsigned long long>(sum));
}

// ---- select ----------------------------------------------------------------------
// An element as DeviceSelect takes it: index, difference, changed bytes
// (0: unchanged) and base context.
template <int ES>
struct Change {
  std::uint32_t e;
  typename DiffWord<ES>::type d;
  std::uint8_t nb, c;
};
template <>
struct Change<8> {
  std::uint64_t d;
  std::uint32_t e;
  std::uint8_t nb, c;
};

template <int ES, bool kAligned>
struct MakeChange {
  const std::uint8_t *a, *b;
  ContextField f;
  __host__ __device__ Change<ES> operator()(std::uint32_t e) const {
    using D = typename DiffWord<ES>::type;
    std::uint64_t x, y;
    if constexpr (kAligned) {
      x = reinterpret_cast<const D*>(a)[e];
      y = reinterpret_cast<const D*>(b)[e];
    } else {
      x = rules::load_element(a + std::uint64_t(e) * ES, ES);
      y = rules::load_element(b + std::uint64_t(e) * ES, ES);
    }
    Change<ES> c;
    c.e = e;
    c.d = static_cast<D>(rules::difference(x, y, ES));
    c.nb = static_cast<std::uint8_t>(rules::changed_bytes(x, y, ES));
    c.c = rules::context_of(x, f);
    return c;
  }
};

struct IsChange {
  template <class C>
  __host__ __device__ bool operator()(const C& c) const {
    return c.nb != 0;
  }
};

// Where DeviceSelect writes change j: its place in the per-change arrays
// (past `cap`: nowhere), its index in the tensor and its changed bytes
// for the bounds and sums after.
template <int ES, bool kContext>
struct PutChange {
  std::uint32_t* pos;
  typename DiffWord<ES>::type* diff;
  std::uint8_t* ctx;
  std::uint32_t* index;
  std::uint8_t* nb;
  std::uint64_t cap;
  __host__ __device__ void operator()(std::ptrdiff_t j, const Change<ES>& c) const {
    if (static_cast<std::uint64_t>(j) >= cap) return;
    pos[j] = rules::index_in_chunk(c.e);
    diff[j] = c.d;
    if constexpr (kContext) ctx[j] = c.c;
    index[j] = c.e;
    nb[j] = c.nb;
  }
};

// The first of `k` ascending indices at or past `e`.
__device__ inline unsigned long long lower_bound(const std::uint32_t* index, unsigned long long k, std::uint64_t e) {
  unsigned long long lo = 0, hi = k;
  while (lo < hi) {
    const unsigned long long mid = (lo + hi) / 2;
    if (index[mid] < e)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// Each chunk's and rank tile's first change from the selected indices.
__global__ void bounds(const std::uint32_t* index, const unsigned long long* selected, FindOut o,
                       std::uint64_t rank_elements) {
  const std::uint64_t i = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const unsigned long long all = *selected, k = all < o.cap ? all : o.cap;
  if (i == 0) *o.total = all;
  if (i < o.chunks) o.chunk_start[i] = lower_bound(index, k, i * kSparseChunkElements);
  if (i == o.chunks) o.chunk_start[i] = k;
  if (i < o.nrank) o.rank_start[i] = lower_bound(index, k, i * rank_elements);
  if (i == o.nrank) o.rank_start[i] = k;
}

// ---- sample ----------------------------------------------------------------------
// Each chunk's sample (rules::sampled: the first 64 elements of every 1024)
// counted by context, a block per chunk; contexts counted once per warp
// (runs of one context are common).
template <int ES>
__global__ void __launch_bounds__(kThreads)
    sample_chunks(const std::uint8_t* a, std::uint64_t n, ContextField f, std::uint32_t* sample) {
  __shared__ std::uint32_t hist[256];
  hist[threadIdx.x] = 0;
  __syncthreads();
  const std::uint64_t e0 = std::uint64_t(blockIdx.x) * kSparseChunkElements;
  constexpr std::uint32_t kSampled = kSparseChunkElements / rules::kSampleEvery * rules::kSampleRun;
  static_assert(kSampled % kThreads == 0, "every thread takes as many turns");
  const unsigned lane = threadIdx.x % 32;
  for (std::uint32_t s = threadIdx.x; s < kSampled; s += kThreads) {
    const std::uint64_t e = e0 + s / rules::kSampleRun * rules::kSampleEvery + s % rules::kSampleRun;
    const bool in = e < n;
    const unsigned c = in ? rules::context_of(rules::load_element(a + e * ES, ES), f) : 256 + lane;
    const unsigned same = __match_any_sync(0xffffffffu, c);
    if (in && lane == static_cast<unsigned>(__ffs(same) - 1))
      atomicAdd(&hist[c], static_cast<std::uint32_t>(__popc(same)));
  }
  __syncthreads();
  sample[blockIdx.x * 256ull + threadIdx.x] = hist[threadIdx.x];
}

// ---- rank ------------------------------------------------------------------------
// Counts of the (at most 8) groups' elements in 16-bit lanes (a tile has at
// most 8192 elements).
struct Counts {
  unsigned long long g03 = 0, g47 = 0;
  __host__ __device__ void add_group(unsigned g) { (g < 4 ? g03 : g47) += 1ull << (16 * (g % 4)); }
  __host__ __device__ unsigned group(unsigned g) const {
    return static_cast<unsigned>(((g < 4 ? g03 : g47) >> (16 * (g % 4))) & 0xffff);
  }
};
struct AddCounts {
  __host__ __device__ Counts operator()(const Counts& x, const Counts& y) const {
    return {x.g03 + y.g03, x.g47 + y.g47};
  }
};
// The tiles' counts summed within their chunk: a scan that starts again at
// each chunk (chunks only grow along the tiles, so this is associative).
struct ChunkCounts {
  unsigned long long chunk = 0;
  std::uint32_t g[kMaxGroups] = {};
};
struct AddInChunk {
  __host__ __device__ ChunkCounts operator()(const ChunkCounts& x, const ChunkCounts& y) const {
    if (x.chunk != y.chunk) return y;
    ChunkCounts r = y;
    for (unsigned g = 0; g < kMaxGroups; ++g) r.g[g] += x.g[g];
    return r;
  }
};
using RankState = cub::ScanTileState<ChunkCounts>;
using RankPrefix = cub::TilePrefixCallbackOp<ChunkCounts, AddInChunk, RankState>;

// Each change's rank: the tiles' before it in its chunk, the threads' before
// it in its tile, and its thread's elements before it. A tile's changes are
// changes [tile_start[tile], tile_start[tile + 1]) (find()'s rank_start).
template <int ES, bool kVec>
__global__ void __launch_bounds__(kThreads)
    rank_changes(const std::uint8_t* a, std::uint64_t nbytes, ContextField f, const ContextGroups* groups,
                 const unsigned long long* tile_start, const std::uint32_t* pos, RankState state, std::uint32_t* rank) {
  using Scan = cub::BlockScan<Counts, kThreads>;
  constexpr int kPer = kThreadBytes / ES;
  constexpr int kTileElements = kRankTileBytes / ES;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ typename RankPrefix::TempStorage prefix_tmp;
  // (Plain arrays: shared memory takes no types with constructors.)
  __shared__ unsigned long long s_prior[2][kThreads];  // Counts::g03, g47
  __shared__ std::uint8_t s_grp[kTileElements];
  __shared__ std::uint32_t s_before[kMaxGroups];
  __shared__ std::uint8_t s_lo[kMaxGroups];
  __shared__ unsigned s_G;

  const int tile = static_cast<int>(blockIdx.x);
  const std::uint64_t e_tile = std::uint64_t(tile) * kTileElements, chunk = rules::chunk_of(e_tile);
  const std::uint64_t at = std::uint64_t(tile) * kRankTileBytes + threadIdx.x * kThreadBytes;
  std::uint32_t wa[kWords];
  load_thread<kVec>(a, at, nbytes, wa);
  if (threadIdx.x < kMaxGroups) s_lo[threadIdx.x] = groups[chunk].lo[threadIdx.x];
  if (threadIdx.x == 0) s_G = groups[chunk].G;
  __syncthreads();
  Counts mine;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const unsigned g = rules::group_of(rules::context_of(element_at<ES>(wa, i), f), s_lo, s_G);
    s_grp[threadIdx.x * kPer + i] = static_cast<std::uint8_t>(g);
    if (at + i * ES < nbytes) mine.add_group(g);
  }
  Counts prior, total;
  Scan(scan_tmp).ExclusiveScan(mine, prior, Counts{}, AddCounts{}, total);
  s_prior[0][threadIdx.x] = prior.g03;
  s_prior[1][threadIdx.x] = prior.g47;
  if (threadIdx.x < 32) {  // the look-back: warp 0
    ChunkCounts t;
    t.chunk = chunk;
    for (unsigned g = 0; g < kMaxGroups; ++g) t.g[g] = total.group(g);
    ChunkCounts before;
    before.chunk = chunk + 1;  // none
    if (tile == 0) {
      if (threadIdx.x == 0) state.SetInclusive(0, t);
    } else {
      RankPrefix prefix(state, prefix_tmp, AddInChunk{}, tile);
      before = prefix(t);
    }
    if (threadIdx.x == 0)
      for (unsigned g = 0; g < kMaxGroups; ++g) s_before[g] = before.chunk == chunk ? before.g[g] : 0;
  }
  __syncthreads();
  const std::uint64_t j1 = tile_start[tile + 1];
  const std::uint32_t first = rules::index_in_chunk(e_tile);
  for (std::uint64_t j = tile_start[tile] + threadIdx.x; j < j1; j += kThreads) {
    const std::uint32_t local = pos[j] - first;
    const std::uint32_t t = local / kPer;
    const unsigned g = s_grp[local];
    std::uint32_t r = s_before[g] + static_cast<std::uint32_t>((s_prior[g / 4][t] >> (16 * (g % 4))) & 0xffff);
    for (std::uint32_t k = t * kPer; k < local; ++k) r += s_grp[k] == g;
    rank[j] = r;
  }
}

// A device buffer of at least `need` elements: grown (by half again at
// least, the old one freed first) only where it is smaller; what a call
// needs never depends on what an earlier one allocated.
template <class T>
void grow(T*& p, std::size_t& cap, std::size_t need) {
  if (need <= cap) return;
  const std::size_t want = std::max(need, cap + cap / 2);
  if (p) CK(cudaFree(p));
  p = nullptr;
  cap = 0;
  CK(cudaMalloc(&p, want * sizeof(T)));
  cap = want;
}

void* pinned_allocate(std::size_t bytes) {
  void* p = nullptr;
  CK(cudaMallocHost(&p, bytes ? bytes : 1));
  return p;
}
void pinned_free(void* p) { cudaFreeHost(p); }
const HostMemory kPinned{pinned_allocate, pinned_free};

// `v` as `n` uninitialized elements of page-locked memory: its own kept
// where it is page-locked and large enough.
template <class T>
void fit(HostVector<T>& v, std::size_t n) {
  if (v.get_allocator().mem != &kPinned || n > v.capacity()) {
    v = HostVector<T>(HostAllocator<T>(&kPinned));
    v.reserve(n + n / 4);
  }
  v.resize(n);
}

}  // namespace

struct ChangeFinder::Impl {
  cudaStream_t stream = nullptr;
  int sms = 1;  // the device's multiprocessors (tiles64's blocks)
  cudaEvent_t ev[4] = {};
  // Per change (room for `room`): position, difference, context; select's index and changed bytes.
  std::uint32_t* pos = nullptr;
  std::uint8_t* diff = nullptr;
  std::uint8_t* ctx = nullptr;
  std::uint32_t* index = nullptr;
  std::uint8_t* nb = nullptr;
  std::uint64_t room = 0;
  unsigned long long* counts = nullptr;      // chunks + 1 starts, chunks of changed bytes, all changes, selected
  unsigned long long* rank_start = nullptr;  // rank tiles + 1
  std::uint32_t* sample = nullptr;
  std::uint32_t* rank = nullptr;
  ContextGroups* groups = nullptr;
  std::uint8_t* tile_state = nullptr;
  std::uint8_t* temp = nullptr;               // CUB's
  unsigned long long* host_counts = nullptr;  // page-locked
  unsigned long long* read_total = nullptr;   // read_floor()'s count, and its page-locked copy
  unsigned long long* host_read_total = nullptr;
  std::size_t cap_pos = 0, cap_diff = 0, cap_ctx = 0, cap_index = 0, cap_nb = 0, cap_counts = 0, cap_rank_start = 0,
              cap_sample = 0, cap_rank = 0, cap_groups = 0, cap_tile_state = 0, cap_temp = 0, cap_host_counts = 0;

  ~Impl() {
    for (void* p :
         {static_cast<void*>(pos), static_cast<void*>(diff), static_cast<void*>(ctx), static_cast<void*>(index),
          static_cast<void*>(nb), static_cast<void*>(counts), static_cast<void*>(rank_start),
          static_cast<void*>(sample), static_cast<void*>(rank), static_cast<void*>(groups),
          static_cast<void*>(tile_state), static_cast<void*>(temp), static_cast<void*>(read_total)})
      if (p) cudaFree(p);
    if (host_counts) cudaFreeHost(host_counts);
    if (host_read_total) cudaFreeHost(host_read_total);
    for (cudaEvent_t e : ev)
      if (e) cudaEventDestroy(e);
    if (stream) cudaStreamDestroy(stream);
  }
};

ChangeFinder::ChangeFinder() : impl_(std::make_unique<Impl>()) {
  CK(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking));
  for (cudaEvent_t& e : impl_->ev) CK(cudaEventCreate(&e));
  int dev = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&impl_->sms, cudaDevAttrMultiProcessorCount, dev));
}

ChangeFinder::~ChangeFinder() = default;

int ChangeFinder::devices(std::string& why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
    return 0;
  }
  if (n == 0) why = "no CUDA device";
  return n;
}

namespace {

template <class State>
State tile_state(ChangeFinder::Impl& im, int ntiles) {
  std::size_t bytes = 0;
  CK(State::AllocationSize(ntiles, bytes));
  grow(im.tile_state, im.cap_tile_state, bytes);
  State s;
  CK(s.Init(ntiles, im.tile_state, bytes));
  init_tiles<<<(ntiles + kThreads - 1) / kThreads, kThreads, 0, im.stream>>>(s, ntiles);
  CK(cudaGetLastError());
  return s;
}

bool aligned(const void* p, std::size_t to) { return reinterpret_cast<std::uintptr_t>(p) % to == 0; }

int tile_count(std::uint64_t nbytes, std::uint64_t tile_bytes) {
  const std::uint64_t n = (nbytes + tile_bytes - 1) / tile_bytes;
  if (n > 0x7fffffffu) fail(Exit::failure, "CUDA change finder: a tensor of " + std::to_string(nbytes) + " bytes");
  return static_cast<int>(n);
}

// The counts after the chunks' changed bytes: all changes, selected, and the
// tile counter of tiles64 (find() zeroes them with the changed bytes).
unsigned* next_tile_of(const FindOut& o) { return reinterpret_cast<unsigned*>(o.total + 2); }

template <int ES, int V, int kMinBlocks, bool kPipelined = false, bool kWarp = false, int kContextMinBlocks = 2>
void launch_tiles(const DeviceTensor& t, ChangeFinder::Impl& im, bool context, const FindOut& o) {
  const int ntiles = tile_count(t.nbytes, kTileBytes<V>);
  const CountState s = tile_state<CountState>(im, ntiles);
  CK(cudaMemsetAsync(o.chunk_bytes, 0, (o.chunks + 3) * sizeof(unsigned long long), im.stream));
  unsigned* next_tile = next_tile_of(o);
  const auto* a = static_cast<const std::uint8_t*>(t.base);
  const auto* b = static_cast<const std::uint8_t*>(t.next);
  auto go = [&]<bool kVec, bool kContext>() {
    if constexpr (kPipelined) {
      const auto kernel = find_tiles_pipelined<ES, kVec, kContext, V, kMinBlocks>;
      int per_sm = 0;
      CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
      const int blocks = std::max(1, std::min(ntiles, std::max(1, per_sm) * im.sms));
      kernel<<<blocks, kThreads, 0, im.stream>>>(a, b, t.nbytes, t.field, s, o, ntiles, next_tile);
    } else if constexpr (kWarp) {
      // context's kernel keeps the base too (8 V registers of data): tiles' 2 blocks (tilesw64: 1)
      find_tiles_warp<ES, kVec, kContext, V, kContext ? kContextMinBlocks : kMinBlocks>
          <<<ntiles, kThreads, 0, im.stream>>>(a, b, t.nbytes, t.field, s, o);
    } else {
      find_tiles<ES, kVec, kContext, V, kMinBlocks><<<ntiles, kThreads, 0, im.stream>>>(a, b, t.nbytes, t.field, s, o);
    }
  };
  if (aligned(a, 16) && aligned(b, 16))
    context ? go.template operator()<true, true>() : go.template operator()<true, false>();
  else
    context ? go.template operator()<false, true>() : go.template operator()<false, false>();
  CK(cudaGetLastError());
}

template <int ES>
void launch_select(const DeviceTensor& t, ChangeFinder::Impl& im, bool context, const FindOut& o) {
  const std::uint64_t n = t.nbytes / ES;
  const auto* a = static_cast<const std::uint8_t*>(t.base);
  const auto* b = static_cast<const std::uint8_t*>(t.next);
  unsigned long long* selected = o.total + 1;
  auto go = [&]<bool kAligned, bool kContext>() {
    const auto in = thrust::make_transform_iterator(thrust::counting_iterator<std::uint32_t>(0),
                                                    MakeChange<ES, kAligned>{a, b, t.field});
    const auto out = thrust::make_tabulate_output_iterator(PutChange<ES, kContext>{
        o.pos, static_cast<typename DiffWord<ES>::type*>(o.diff), o.ctx, im.index, im.nb, o.cap});
    std::size_t bytes = 0;
    CK(cub::DeviceSelect::If(nullptr, bytes, in, out, selected, static_cast<std::int64_t>(n), IsChange{}, im.stream));
    grow(im.temp, im.cap_temp, bytes);
    bytes = im.cap_temp;
    CK(cub::DeviceSelect::If(im.temp, bytes, in, out, selected, static_cast<std::int64_t>(n), IsChange{}, im.stream));
  };
  if (aligned(a, ES) && aligned(b, ES))
    context ? go.template operator()<true, true>() : go.template operator()<true, false>();
  else
    context ? go.template operator()<false, true>() : go.template operator()<false, false>();
  const std::uint64_t threads = std::max(o.chunks, o.nrank) + 1;
  bounds<<<static_cast<unsigned>((threads + kThreads - 1) / kThreads), kThreads, 0, im.stream>>>(im.index, selected, o,
                                                                                                 kRankTileBytes / ES);
  CK(cudaGetLastError());
  std::size_t bytes = 0;
  CK(cub::DeviceSegmentedReduce::Sum(nullptr, bytes, im.nb, o.chunk_bytes, static_cast<std::int64_t>(o.chunks),
                                     o.chunk_start, o.chunk_start + 1, im.stream));
  grow(im.temp, im.cap_temp, bytes);
  bytes = im.cap_temp;
  CK(cub::DeviceSegmentedReduce::Sum(im.temp, bytes, im.nb, o.chunk_bytes, static_cast<std::int64_t>(o.chunks),
                                     o.chunk_start, o.chunk_start + 1, im.stream));
}

template <int ES>
void launch_sample(const DeviceTensor& t, ChangeFinder::Impl& im, std::uint64_t chunks) {
  sample_chunks<ES><<<static_cast<unsigned>(chunks), kThreads, 0, im.stream>>>(static_cast<const std::uint8_t*>(t.base),
                                                                               t.nbytes / ES, t.field, im.sample);
  CK(cudaGetLastError());
}

template <int ES>
void launch_rank(const DeviceTensor& t, ChangeFinder::Impl& im) {
  const int ntiles = tile_count(t.nbytes, kRankTileBytes);
  const RankState s = tile_state<RankState>(im, ntiles);
  const auto* a = static_cast<const std::uint8_t*>(t.base);
  if (aligned(a, 16))
    rank_changes<ES, true>
        <<<ntiles, kThreads, 0, im.stream>>>(a, t.nbytes, t.field, im.groups, im.rank_start, im.pos, s, im.rank);
  else
    rank_changes<ES, false>
        <<<ntiles, kThreads, 0, im.stream>>>(a, t.nbytes, t.field, im.groups, im.rank_start, im.pos, s, im.rank);
  CK(cudaGetLastError());
}

template <class F>
void by_es(std::size_t es, F&& f) {
  switch (es) {
    case 1:
      return f.template operator()<1>();
    case 2:
      return f.template operator()<2>();
    case 4:
      return f.template operator()<4>();
    case 8:
      return f.template operator()<8>();
  }
  fail(Exit::failure, "CUDA change finder: element size " + std::to_string(es));
}

template <class T, class U>
void to_host(HostVector<T>& v, const U* src, std::uint64_t count, cudaStream_t s, std::uint64_t& copied) {
  static_assert(sizeof(T) == sizeof(U));
  fit(v, count);
  if (count) CK(cudaMemcpyAsync(v.data(), src, count * sizeof(T), cudaMemcpyDeviceToHost, s));
  copied += count * sizeof(T);
}

DeviceTensor usable(DeviceTensor t) {
  t.field = usable_field(t.field, t.es);
  return t;
}

}  // namespace

void ChangeFinder::find(const DeviceTensor& tensor, bool context, Found& out) {
  Impl& im = *impl_;
  const DeviceTensor t = usable(tensor);
  if (t.es != rules::chunked_elem_size(t.es, t.nbytes))
    fail(Exit::failure, "CUDA change finder: element size " + std::to_string(t.es) + " for a " +
                            std::to_string(t.nbytes) + "-byte tensor");
  const std::uint64_t n = t.nbytes / t.es, chunks = rules::chunk_count(n);
  const std::uint64_t nrank = (t.nbytes + kRankTileBytes - 1) / kRankTileBytes;
  const bool select = design_ == Design::select && n < (std::uint64_t{1} << 32);
  out.es = t.es, out.elements = n, out.chunks = chunks, out.host_bytes = 0;
  out.rank.clear();
  timing_ = Timing{};
  const std::size_t ncounts = 2 * chunks + 4;  // starts, changed bytes, all changes, selected, tiles64's tile counter
  grow(im.counts, im.cap_counts, ncounts);
  grow(im.rank_start, im.cap_rank_start, nrank + 1);
  if (context) grow(im.sample, im.cap_sample, 256 * chunks + 1);
  if (ncounts > im.cap_host_counts) {
    if (im.host_counts) CK(cudaFreeHost(im.host_counts));
    im.host_counts = nullptr, im.cap_host_counts = 0;
    CK(cudaMallocHost(&im.host_counts, 2 * ncounts * sizeof(unsigned long long)));
    im.cap_host_counts = 2 * ncounts;
  }
  unsigned long long* counts = im.host_counts;
  // Room for one element in 64 changed, or the most a tensor had before;
  // more: found again with room for them.
  std::uint64_t room = std::max<std::uint64_t>(im.room, std::min<std::uint64_t>(n, n / 64 + 4096));
  for (;;) {
    im.room = room;
    grow(im.pos, im.cap_pos, room);
    grow(im.diff, im.cap_diff, room * t.es);
    grow(im.ctx, im.cap_ctx, room);
    if (select) {
      grow(im.index, im.cap_index, room);
      grow(im.nb, im.cap_nb, room);
    }
    CK(cudaEventRecord(im.ev[0], im.stream));
    if (n) {
      const FindOut o{
          im.pos, im.diff,       im.ctx, room, im.counts, im.counts + chunks + 1, im.counts + 2 * chunks + 1,
          chunks, im.rank_start, nrank};
      if (select)
        by_es(t.es, [&]<int ES>() { launch_select<ES>(t, im, context, o); });
      else if (design_ == Design::small_tiles)
        by_es(t.es, [&]<int ES>() { launch_tiles<ES, 4, 3>(t, im, context, o); });
      else if (design_ == Design::pipelined_tiles)
        by_es(t.es, [&]<int ES>() { launch_tiles<ES, 4, 2, true>(t, im, context, o); });
      else if (design_ == Design::warp_tiles)
        by_es(t.es, [&]<int ES>() { launch_tiles<ES, 8, kWarpMinBlocks, false, true>(t, im, context, o); });
      else if (design_ == Design::warp_tiles64)
        by_es(t.es, [&]<int ES>() {
          launch_tiles<ES, kWarp64V, kWarp64MinBlocks, false, true, kWarp64ContextMinBlocks>(t, im, context, o);
        });
      else if (design_ == Design::warp_tiles4)
        by_es(t.es, [&]<int ES>() { launch_tiles<ES, kWarp4V, kWarp4MinBlocks, false, true>(t, im, context, o); });
      else
        by_es(t.es, [&]<int ES>() { launch_tiles<ES, 8, 2>(t, im, context, o); });
      if (context) by_es(t.es, [&]<int ES>() { launch_sample<ES>(t, im, chunks); });
    } else {
      CK(cudaMemsetAsync(im.counts, 0, ncounts * sizeof(unsigned long long), im.stream));
      CK(cudaMemsetAsync(im.rank_start, 0, sizeof(unsigned long long), im.stream));
    }
    CK(cudaEventRecord(im.ev[1], im.stream));
    CK(cudaMemcpyAsync(counts, im.counts, (2 * chunks + 2) * sizeof(unsigned long long), cudaMemcpyDeviceToHost,
                       im.stream));
    CK(cudaStreamSynchronize(im.stream));
    if (counts[2 * chunks + 1] <= room) break;
    room = counts[2 * chunks + 1];  // too many for the room: again, with room for all
    timing_.found_again = true;
  }
  out.host_bytes += (2 * chunks + 2) * sizeof(unsigned long long);
  out.start.assign(counts, counts + chunks + 1);
  out.bytes.assign(counts + chunks + 1, counts + 2 * chunks + 1);
  const std::uint64_t K = counts[2 * chunks + 1];
  CK(cudaEventRecord(im.ev[2], im.stream));
  to_host(out.pos, im.pos, K, im.stream, out.host_bytes);
  to_host(out.diff, im.diff, K * t.es, im.stream, out.host_bytes);
  if (context) {
    to_host(out.ctx, im.ctx, K, im.stream, out.host_bytes);
    to_host(out.sample, im.sample, 256 * chunks, im.stream, out.host_bytes);
  } else {
    out.ctx.clear(), out.sample.clear();
  }
  CK(cudaEventRecord(im.ev[3], im.stream));
  CK(cudaStreamSynchronize(im.stream));
  CK(cudaEventElapsedTime(&timing_.find_ms, im.ev[0], im.ev[1]));
  CK(cudaEventElapsedTime(&timing_.copy_ms, im.ev[2], im.ev[3]));
  CK(cudaEventElapsedTime(&timing_.total_ms, im.ev[0], im.ev[3]));
}

std::uint64_t ChangeFinder::read_floor(const DeviceTensor& tensor) {
  Impl& im = *impl_;
  const DeviceTensor t = usable(tensor);
  timing_ = Timing{};
  if (!im.read_total) CK(cudaMalloc(&im.read_total, sizeof(unsigned long long)));
  if (!im.host_read_total) CK(cudaMallocHost(&im.host_read_total, sizeof(unsigned long long)));
  const auto* a = static_cast<const std::uint8_t*>(t.base);
  const auto* b = static_cast<const std::uint8_t*>(t.next);
  const bool vec = aligned(a, 16) && aligned(b, 16);
  CK(cudaEventRecord(im.ev[0], im.stream));
  CK(cudaMemsetAsync(im.read_total, 0, sizeof(unsigned long long), im.stream));
  if (t.nbytes) {
    if (design_ == Design::small_tiles || design_ == Design::pipelined_tiles || design_ == Design::warp_tiles4) {
      const int ntiles = tile_count(t.nbytes, kTileBytes<4>);
      (vec ? read_tiles<true, 4, 3> : read_tiles<false, 4, 3>)<<<ntiles, kThreads, 0, im.stream>>>(a, b, t.nbytes,
                                                                                                   im.read_total);
    } else {
      const int ntiles = tile_count(t.nbytes, kTileBytes<8>);
      (vec ? read_tiles<true, 8, 2> : read_tiles<false, 8, 2>)<<<ntiles, kThreads, 0, im.stream>>>(a, b, t.nbytes,
                                                                                                   im.read_total);
    }
    CK(cudaGetLastError());
  }
  CK(cudaEventRecord(im.ev[1], im.stream));
  CK(cudaMemcpyAsync(im.host_read_total, im.read_total, sizeof(unsigned long long), cudaMemcpyDeviceToHost, im.stream));
  CK(cudaStreamSynchronize(im.stream));
  CK(cudaEventElapsedTime(&timing_.find_ms, im.ev[0], im.ev[1]));
  timing_.total_ms = timing_.find_ms;
  return *im.host_read_total;
}

namespace {

// Change j's element is its chunk's first plus its position: the chunk is
// the last whose first change is at or before j (binary search over the
// chunks' starts, still in device memory from find()).
__global__ void apply_kernel(std::uint8_t* base, std::size_t es, const std::uint32_t* pos, const std::uint8_t* diff,
                             const unsigned long long* start, std::uint64_t chunks, std::uint64_t K) {
  for (std::uint64_t j = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; j < K;
       j += std::uint64_t{gridDim.x} * blockDim.x) {
    std::uint64_t lo = 0, hi = chunks;  // start[lo] <= j < start[hi]
    while (hi - lo > 1) {
      const std::uint64_t mid = lo + (hi - lo) / 2;
      if (start[mid] <= j)
        lo = mid;
      else
        hi = mid;
    }
    std::uint8_t* p = base + (lo * kSparseChunkElements + pos[j]) * es;
    rules::store_element(p, rules::applied(rules::load_element(p, es), rules::load_element(diff + j * es, es), es), es);
  }
}

}  // namespace

void ChangeFinder::apply(void* base, const Found& out) {
  Impl& im = *impl_;
  const std::uint64_t K = out.changes();
  if (K > im.room || out.chunks + 1 > im.cap_counts)
    fail(Exit::failure,
         "CUDA change finder: apply() of " + std::to_string(K) + " changes, not those of the last find()");
  if (!K) return;
  const unsigned blocks = static_cast<unsigned>(std::min<std::uint64_t>((K + kThreads - 1) / kThreads, 65535));
  apply_kernel<<<blocks, kThreads, 0, im.stream>>>(static_cast<std::uint8_t*>(base), out.es, im.pos, im.diff, im.counts,
                                                   out.chunks, K);
  CK(cudaGetLastError());
  CK(cudaStreamSynchronize(im.stream));
}

void ChangeFinder::rank(const DeviceTensor& tensor, std::span<const ContextGroups> groups, Found& out) {
  Impl& im = *impl_;
  const DeviceTensor t = usable(tensor);
  if (groups.size() != out.chunks || out.elements != t.nbytes / t.es)
    fail(Exit::failure, "CUDA change finder: rank() of " + std::to_string(groups.size()) +
                            " chunks' groups after find() of " + std::to_string(out.chunks));
  for (const ContextGroups& g : groups)
    if (g.G < 1 || g.G > kMaxGroups)
      fail(Exit::failure, "CUDA change finder: " + std::to_string(g.G) + " context groups (this path ranks up to " +
                              std::to_string(kMaxGroups) + ")");
  const std::uint64_t K = out.changes();
  timing_ = Timing{};
  grow(im.groups, im.cap_groups, groups.size() + 1);
  grow(im.rank, im.cap_rank, K + 1);
  CK(cudaEventRecord(im.ev[0], im.stream));
  if (K) {
    CK(cudaMemcpyAsync(im.groups, groups.data(), groups.size_bytes(), cudaMemcpyHostToDevice, im.stream));
    by_es(t.es, [&]<int ES>() { launch_rank<ES>(t, im); });
  }
  CK(cudaEventRecord(im.ev[1], im.stream));
  CK(cudaEventRecord(im.ev[2], im.stream));
  to_host(out.rank, im.rank, K, im.stream, out.host_bytes);
  CK(cudaEventRecord(im.ev[3], im.stream));
  CK(cudaStreamSynchronize(im.stream));
  CK(cudaEventElapsedTime(&timing_.find_ms, im.ev[0], im.ev[1]));
  CK(cudaEventElapsedTime(&timing_.copy_ms, im.ev[2], im.ev[3]));
  CK(cudaEventElapsedTime(&timing_.total_ms, im.ev[0], im.ev[3]));
}

}  // namespace hfdelta::gpu
