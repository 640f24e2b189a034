// The CUDA path's kernels. A tensor's changes are found in one pass over
// both inputs, and only the changes cross to the host:
//   find     a tile (256 threads x 32 bytes of each input, 16-byte loads) is
//            compared element by element; its changes are numbered by a
//            block scan whose tile prefix comes from the tiles before it by
//            CUB's decoupled look-back (cub::TilePrefixCallbackOp), and
//            written, staged in shared memory, straight to their places:
//            element in chunk, difference, base context. Each chunk's
//            changed bytes (cub::BlockReduce), its first change, each tile's
//            first change and, for context, each chunk's sampled contexts
//            come out of the same pass.
// For context, rank() then counts each change's base elements of its group
// before it, in one more pass over the base: per tile each group's elements
// (cub::BlockScan, which also gives each thread's elements before it), the
// tiles' before it in its chunk by a segmented decoupled look-back, and
// within the thread from the tile's groups kept in shared memory.
// What a change, a difference, a context and a group are: change_rules.hpp,
// the CPU encoders' own.
#include "change_finder.hpp"

#include <cuda_runtime.h>

#include <cub/agent/single_pass_scan_operators.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cuda/std/functional>

#include <algorithm>
#include <string>

#include "change_rules.hpp"
#include "hfdelta/error.hpp"

namespace hfdelta::gpu {

namespace {

[[noreturn]] void cuda_fail(cudaError_t e, const char* call, int line) {
  fail(Exit::failure, std::string("CUDA: ") + call + " (change_finder.cu:" + std::to_string(line) + "): " + cudaGetErrorString(e));
}
#define CK(call)                                         \
  do {                                                   \
    const cudaError_t e_ = (call);                       \
    if (e_ != cudaSuccess) cuda_fail(e_, #call, __LINE__); \
  } while (0)

constexpr int kThreads = 256;
constexpr int kThreadBytes = 32;                              // of each input: two 16-byte loads
constexpr int kWords = kThreadBytes / 4;
constexpr std::uint64_t kTileBytes = kThreads * kThreadBytes;  // 8 KiB; divides every chunk's bytes
constexpr int kStage = 1024;                                  // a tile's changes staged in shared memory
constexpr unsigned kMaxGroups = 8;                            // what the encoder writes (context_codec.cpp)
static_assert(kSparseChunkElements % kTileBytes == 0, "a tile lies in one chunk");
static_assert(kThreads == 256, "one thread per context of the sample's histogram");

// A thread's 32 bytes of `p` from byte `at` as 8 words: two 16-byte loads
// where they are inside (the caller has checked alignment), else byte by
// byte, zeros past `nbytes`.
template <bool kVec>
__device__ inline void load_thread(const std::uint8_t* p, std::uint64_t at, std::uint64_t nbytes, std::uint32_t (&w)[kWords]) {
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

// Element i of a thread's words (i a constant once unrolled).
template <int ES>
__device__ inline std::uint64_t element_at(const std::uint32_t (&w)[kWords], int i) {
  if constexpr (ES == 8) {
    return std::uint64_t{w[2 * i]} | std::uint64_t{w[2 * i + 1]} << 32;
  } else {
    const int at = i * ES;
    return (w[at / 4] >> (8 * (at % 4))) & static_cast<std::uint32_t>(rules::element_ones(ES));
  }
}

template <int ES> struct DiffWord;
template <> struct DiffWord<1> { using type = std::uint8_t; };
template <> struct DiffWord<2> { using type = std::uint16_t; };
template <> struct DiffWord<4> { using type = std::uint32_t; };
template <> struct DiffWord<8> { using type = std::uint64_t; };

using CountState = cub::ScanTileState<unsigned long long>;
using CountPrefix = cub::TilePrefixCallbackOp<unsigned long long, ::cuda::std::plus<>, CountState>;

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
  unsigned long long* tile_start;   // ntiles + 1: each tile's first change, then all changes
  unsigned long long* chunk_start;  // chunks + 1: each chunk's first change, then all changes
  unsigned long long* chunk_bytes;  // per chunk, zeroed: its changed bytes
  std::uint32_t* sample;            // context: 256 per chunk, zeroed
};

// Find: one tile per block, numbered by blockIdx (the look-back waits only
// on tiles launched before).
template <int ES, bool kVec, bool kContext>
__global__ void __launch_bounds__(kThreads, 4) find_changes(const std::uint8_t* a, const std::uint8_t* b, std::uint64_t nbytes,
                                                         ContextField f, CountState state, FindOut o) {
  using Scan = cub::BlockScan<unsigned long long, kThreads>;
  using Reduce = cub::BlockReduce<unsigned, kThreads>;
  using D = typename DiffWord<ES>::type;
  constexpr int kPer = kThreadBytes / ES;  // elements per thread
  static_assert(rules::kSampleRun % kPer == 0, "a thread's elements are all sampled or none");
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ typename Reduce::TempStorage reduce_tmp;
  __shared__ typename CountPrefix::TempStorage prefix_tmp;
  __shared__ std::uint32_t s_pos[kStage];
  __shared__ D s_diff[kStage];
  __shared__ std::uint8_t s_ctx[kContext ? kStage : 1];
  __shared__ std::uint32_t hist[kContext ? kThreads : 1];
  __shared__ unsigned long long s_first, s_count;

  const int tile = static_cast<int>(blockIdx.x);
  const std::uint64_t at = std::uint64_t(tile) * kTileBytes + threadIdx.x * kThreadBytes;
  std::uint32_t wa[kWords], wb[kWords];
  load_thread<kVec>(a, at, nbytes, wa);
  load_thread<kVec>(b, at, nbytes, wb);
  if constexpr (kContext) hist[threadIdx.x] = 0;

  std::uint32_t bits = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) bits |= std::uint32_t{rules::changed(element_at<ES>(wa, i), element_at<ES>(wb, i))} << i;
  unsigned bytes = 0;
#pragma unroll
  for (int k = 0; k < kWords; ++k) bytes += __popc(__vcmpne4(wa[k], wb[k])) / 8;

  // This thread's first change, over the whole tensor.
  const unsigned long long count = __popc(bits);
  unsigned long long off;
  if (tile == 0) {
    unsigned long long total;
    Scan(scan_tmp).ExclusiveSum(count, off, total);
    if (threadIdx.x == 0) {
      state.SetInclusive(0, total);
      s_count = total;
    }
  } else {
    CountPrefix prefix(state, prefix_tmp, ::cuda::std::plus<>{}, tile);
    Scan(scan_tmp).ExclusiveSum(count, off, prefix);
    if (threadIdx.x == 0) s_count = prefix.GetBlockAggregate();
  }
  if (threadIdx.x == 0) s_first = off;
  const unsigned tile_bytes = Reduce(reduce_tmp).Sum(bytes);
  const std::uint64_t e_tile = std::uint64_t(tile) * (kTileBytes / ES);
  const std::uint64_t chunk = rules::chunk_of(e_tile);
  if (threadIdx.x == 0) {
    o.tile_start[tile] = off;
    if (rules::index_in_chunk(e_tile) == 0) o.chunk_start[chunk] = off;
    if (tile_bytes) atomicAdd(o.chunk_bytes + chunk, static_cast<unsigned long long>(tile_bytes));
  }
  __syncthreads();  // s_first, s_count; the histogram zeroed
  const unsigned long long first = s_first, tile_count = s_count;
  if (threadIdx.x == 0 && tile + 1 == static_cast<int>(gridDim.x)) o.tile_start[tile + 1] = o.chunk_start[chunk + 1] = first + tile_count;

  const std::uint64_t e0 = at / ES;
  if constexpr (kContext) {
    if (at < nbytes && rules::sampled(rules::index_in_chunk(e0))) {
#pragma unroll
      for (int i = 0; i < kPer; ++i)
        if (at + i * ES < nbytes) atomicAdd(&hist[rules::context_of(element_at<ES>(wa, i), f)], 1u);
    }
  }

  D* diff = static_cast<D*>(o.diff);
  if (tile_count <= kStage) {  // the whole block takes one branch
    unsigned k = static_cast<unsigned>(off - first);
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if ((bits >> i) & 1) {
        const std::uint64_t va = element_at<ES>(wa, i), vb = element_at<ES>(wb, i);
        s_pos[k] = rules::index_in_chunk(e0 + i);
        s_diff[k] = static_cast<D>(rules::difference(va, vb, ES));
        if constexpr (kContext) s_ctx[k] = rules::context_of(va, f);
        ++k;
      }
    __syncthreads();
    for (unsigned j = threadIdx.x; j < tile_count; j += kThreads) {
      const std::uint64_t to = first + j;
      if (to >= o.cap) break;
      o.pos[to] = s_pos[j];
      diff[to] = s_diff[j];
      if constexpr (kContext) o.ctx[to] = s_ctx[j];
    }
  } else {
    std::uint64_t to = off;
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if ((bits >> i) & 1) {
        if (to < o.cap) {
          const std::uint64_t va = element_at<ES>(wa, i), vb = element_at<ES>(wb, i);
          o.pos[to] = rules::index_in_chunk(e0 + i);
          diff[to] = static_cast<D>(rules::difference(va, vb, ES));
          if constexpr (kContext) o.ctx[to] = rules::context_of(va, f);
        }
        ++to;
      }
  }
  if constexpr (kContext) {
    __syncthreads();  // the histogram complete
    const std::uint32_t h = hist[threadIdx.x];
    if (h) atomicAdd(o.sample + chunk * 256 + threadIdx.x, h);
  }
}

// ---- rank ------------------------------------------------------------------------
// Counts of the (at most 8) groups' elements in 16-bit lanes (a tile has at
// most 8192 elements).
struct Counts {
  unsigned long long g03 = 0, g47 = 0;
  __host__ __device__ void add_group(unsigned g) { (g < 4 ? g03 : g47) += 1ull << (16 * (g % 4)); }
  __host__ __device__ unsigned group(unsigned g) const { return static_cast<unsigned>(((g < 4 ? g03 : g47) >> (16 * (g % 4))) & 0xffff); }
};
struct AddCounts {
  __host__ __device__ Counts operator()(const Counts& x, const Counts& y) const { return {x.g03 + y.g03, x.g47 + y.g47}; }
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
// changes [tile_start[tile], tile_start[tile + 1]) (find()'s tiles).
template <int ES, bool kVec>
__global__ void __launch_bounds__(kThreads) rank_changes(const std::uint8_t* a, std::uint64_t nbytes, ContextField f,
                                                         const ContextGroups* groups, const unsigned long long* tile_start,
                                                         const std::uint32_t* pos, RankState state, std::uint32_t* rank) {
  using Scan = cub::BlockScan<Counts, kThreads>;
  constexpr int kPer = kThreadBytes / ES;
  constexpr int kTileElements = kTileBytes / ES;
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
  const std::uint64_t at = std::uint64_t(tile) * kTileBytes + threadIdx.x * kThreadBytes;
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

template <class T>
void grow(T*& p, std::size_t& cap, std::size_t need) {
  if (need <= cap) return;
  if (p) CK(cudaFree(p));
  p = nullptr;
  cap = std::max(need, cap + cap / 2);
  CK(cudaMalloc(&p, cap * sizeof(T)));
}

}  // namespace

struct ChangeFinder::Impl {
  cudaStream_t stream = nullptr;
  cudaEvent_t ev[3] = {};
  std::uint32_t* pos = nullptr;
  std::uint8_t* diff = nullptr;
  std::uint8_t* ctx = nullptr;
  unsigned long long* tile_start = nullptr;
  unsigned long long* chunk_start = nullptr;  // chunks + 1, then chunks of changed bytes
  std::uint32_t* sample = nullptr;
  std::uint32_t* rank = nullptr;
  ContextGroups* groups = nullptr;
  std::uint8_t* tile_state = nullptr;
  std::size_t cap_pos = 0, cap_diff = 0, cap_ctx = 0, cap_tile_start = 0, cap_chunk_start = 0, cap_sample = 0, cap_rank = 0,
              cap_groups = 0, cap_tile_state = 0;
  std::uint64_t changes_cap = 0;  // what pos, diff and ctx hold now

  ~Impl() {
    for (void* p : {static_cast<void*>(pos), static_cast<void*>(diff), static_cast<void*>(ctx), static_cast<void*>(tile_start),
                    static_cast<void*>(chunk_start), static_cast<void*>(sample), static_cast<void*>(rank),
                    static_cast<void*>(groups), static_cast<void*>(tile_state)})
      if (p) cudaFree(p);
    for (cudaEvent_t e : ev)
      if (e) cudaEventDestroy(e);
    if (stream) cudaStreamDestroy(stream);
  }
};

ChangeFinder::ChangeFinder() : impl_(std::make_unique<Impl>()) {
  CK(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking));
  for (cudaEvent_t& e : impl_->ev) CK(cudaEventCreate(&e));
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

bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

template <int ES>
void launch_find(const DeviceTensor& t, ChangeFinder::Impl& im, int ntiles, bool context, const FindOut& o) {
  const CountState s = tile_state<CountState>(im, ntiles);
  const auto* a = static_cast<const std::uint8_t*>(t.base);
  const auto* b = static_cast<const std::uint8_t*>(t.next);
  const bool vec = aligned(a) && aligned(b);
  auto go = [&]<bool kVec, bool kContext>() {
    find_changes<ES, kVec, kContext><<<ntiles, kThreads, 0, im.stream>>>(a, b, t.nbytes, t.field, s, o);
  };
  if (vec)
    context ? go.template operator()<true, true>() : go.template operator()<true, false>();
  else
    context ? go.template operator()<false, true>() : go.template operator()<false, false>();
  CK(cudaGetLastError());
}

template <int ES>
void launch_rank(const DeviceTensor& t, ChangeFinder::Impl& im, int ntiles) {
  const RankState s = tile_state<RankState>(im, ntiles);
  const auto* a = static_cast<const std::uint8_t*>(t.base);
  if (aligned(a))
    rank_changes<ES, true><<<ntiles, kThreads, 0, im.stream>>>(a, t.nbytes, t.field, im.groups, im.tile_start, im.pos, s, im.rank);
  else
    rank_changes<ES, false><<<ntiles, kThreads, 0, im.stream>>>(a, t.nbytes, t.field, im.groups, im.tile_start, im.pos, s, im.rank);
  CK(cudaGetLastError());
}

template <class F>
void by_es(std::size_t es, F&& f) {
  switch (es) {
    case 1: return f.template operator()<1>();
    case 2: return f.template operator()<2>();
    case 4: return f.template operator()<4>();
    case 8: return f.template operator()<8>();
  }
  fail(Exit::failure, "CUDA change finder: element size " + std::to_string(es));
}

template <class T, class U>
void to_host(std::vector<T>& v, const U* src, std::uint64_t count, cudaStream_t s, std::uint64_t& copied) {
  static_assert(sizeof(T) == sizeof(U));
  v.resize(count);
  if (count) CK(cudaMemcpyAsync(v.data(), src, count * sizeof(T), cudaMemcpyDeviceToHost, s));
  copied += count * sizeof(T);
}

DeviceTensor usable(DeviceTensor t) {
  t.field = usable_field(t.field, t.es);
  return t;
}

int tile_count(std::uint64_t nbytes) {
  const std::uint64_t n = (nbytes + kTileBytes - 1) / kTileBytes;
  if (n > 0x7fffffffu) fail(Exit::failure, "CUDA change finder: a tensor of " + std::to_string(nbytes) + " bytes");
  return static_cast<int>(n);
}

}  // namespace

void ChangeFinder::find(const DeviceTensor& tensor, bool context, Found& out) {
  Impl& im = *impl_;
  const DeviceTensor t = usable(tensor);
  if (t.es != rules::chunked_elem_size(t.es, t.nbytes))
    fail(Exit::failure, "CUDA change finder: element size " + std::to_string(t.es) + " for a " + std::to_string(t.nbytes) + "-byte tensor");
  const std::uint64_t n = t.nbytes / t.es, chunks = rules::chunk_count(n);
  const int ntiles = tile_count(t.nbytes);
  out = Found{};
  out.es = t.es, out.elements = n, out.chunks = chunks;
  timing_ = Timing{};
  grow(im.tile_start, im.cap_tile_start, static_cast<std::size_t>(ntiles) + 1);
  grow(im.chunk_start, im.cap_chunk_start, 2 * chunks + 1);
  if (context) grow(im.sample, im.cap_sample, 256 * chunks + 1);
  // Room for one element in 64 changed, or the most a tensor had before;
  // more: found again with room for them.
  std::uint64_t cap = std::max<std::uint64_t>(im.changes_cap, std::min<std::uint64_t>(n, n / 64 + 4096));
  std::vector<unsigned long long> counts(2 * chunks + 1);
  CK(cudaEventRecord(im.ev[0], im.stream));
  for (;;) {
    grow(im.pos, im.cap_pos, cap + 1);
    grow(im.diff, im.cap_diff, cap * t.es + 8);
    if (context) grow(im.ctx, im.cap_ctx, cap + 1);
    im.changes_cap = cap = std::min({im.cap_pos, im.cap_diff / t.es, context ? im.cap_ctx : im.cap_pos});
    counts.assign(2 * chunks + 1, 0);
    if (n) {
      CK(cudaMemsetAsync(im.chunk_start, 0, (2 * chunks + 1) * sizeof(unsigned long long), im.stream));
      if (context) CK(cudaMemsetAsync(im.sample, 0, 256 * chunks * sizeof(std::uint32_t), im.stream));
      const FindOut o{im.pos, im.diff, im.ctx, cap, im.tile_start, im.chunk_start, im.chunk_start + chunks + 1,
                      context ? im.sample : nullptr};
      by_es(t.es, [&]<int ES>() { launch_find<ES>(t, im, ntiles, context, o); });
      CK(cudaEventRecord(im.ev[1], im.stream));
      CK(cudaMemcpyAsync(counts.data(), im.chunk_start, counts.size() * sizeof counts[0], cudaMemcpyDeviceToHost, im.stream));
    } else {
      CK(cudaEventRecord(im.ev[1], im.stream));
    }
    CK(cudaStreamSynchronize(im.stream));
    if (counts[chunks] <= cap) break;
    cap = counts[chunks];  // too many for the room: again, with room for all
    timing_.found_again = true;
  }
  out.host_bytes += counts.size() * sizeof counts[0];
  out.start.assign(counts.begin(), counts.begin() + static_cast<std::ptrdiff_t>(chunks) + 1);
  out.bytes.assign(counts.begin() + static_cast<std::ptrdiff_t>(chunks) + 1, counts.end());
  const std::uint64_t K = out.start.back();
  to_host(out.pos, im.pos, K, im.stream, out.host_bytes);
  to_host(out.diff, im.diff, K * t.es, im.stream, out.host_bytes);
  if (context) {
    to_host(out.ctx, im.ctx, K, im.stream, out.host_bytes);
    to_host(out.sample, im.sample, 256 * chunks, im.stream, out.host_bytes);
  }
  CK(cudaEventRecord(im.ev[2], im.stream));
  CK(cudaStreamSynchronize(im.stream));
  CK(cudaEventElapsedTime(&timing_.find_ms, im.ev[0], im.ev[1]));
  CK(cudaEventElapsedTime(&timing_.total_ms, im.ev[0], im.ev[2]));
}

void ChangeFinder::rank(const DeviceTensor& tensor, std::span<const ContextGroups> groups, Found& out) {
  Impl& im = *impl_;
  const DeviceTensor t = usable(tensor);
  if (groups.size() != out.chunks || out.elements != t.nbytes / t.es)
    fail(Exit::failure, "CUDA change finder: rank() of " + std::to_string(groups.size()) + " chunks' groups after find() of " +
                            std::to_string(out.chunks));
  for (const ContextGroups& g : groups)
    if (g.G < 1 || g.G > kMaxGroups)
      fail(Exit::failure, "CUDA change finder: " + std::to_string(g.G) + " context groups (this path ranks up to " +
                              std::to_string(kMaxGroups) + ")");
  const std::uint64_t K = out.changes();
  const int ntiles = tile_count(t.nbytes);
  timing_ = Timing{};
  grow(im.groups, im.cap_groups, groups.size() + 1);
  grow(im.rank, im.cap_rank, K + 1);
  CK(cudaEventRecord(im.ev[0], im.stream));
  if (K) {
    CK(cudaMemcpyAsync(im.groups, groups.data(), groups.size_bytes(), cudaMemcpyHostToDevice, im.stream));
    by_es(t.es, [&]<int ES>() { launch_rank<ES>(t, im, ntiles); });
  }
  CK(cudaEventRecord(im.ev[1], im.stream));
  to_host(out.rank, im.rank, K, im.stream, out.host_bytes);
  CK(cudaEventRecord(im.ev[2], im.stream));
  CK(cudaStreamSynchronize(im.stream));
  CK(cudaEventElapsedTime(&timing_.find_ms, im.ev[0], im.ev[1]));
  CK(cudaEventElapsedTime(&timing_.total_ms, im.ev[0], im.ev[2]));
}

}  // namespace hfdelta::gpu
