// The CUDA path's kernels. A tensor's changes are found in three steps, all
// on the device, and only the changes cross to the host:
//   mark     base and new bytes compared 16 bytes a thread: a bit per changed
//            element (32-element mask words), each chunk's changed elements
//            and bytes (and for context, each chunk's sampled contexts)
//   select   the nonzero mask words (cub::DeviceSelect), then where each
//            one's changes go (cub::DeviceScan over their popcounts)
//   expand   each selected word's changes: element in chunk, difference,
//            base context
// For context, rank() then counts each change's base elements of its group
// before it: per tile, each group's elements (cub::BlockReduce), those
// summed over the tiles before it in its chunk (cub::DeviceScan by key), and
// within the tile (cub::BlockScan).
// What a change, a difference, a context and a group are: change_rules.hpp,
// the CPU encoders' own.
#include "change_finder.hpp"

#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

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
constexpr int kVecBytes = 16;                           // bytes of each input a thread compares at a time
constexpr std::uint64_t kTileBytes = kThreads * kVecBytes;  // a block's step; divides every chunk's bytes
constexpr unsigned kMaxGroups = 8;                       // what the encoder writes (context_codec.cpp)

// A thread's 16 bytes of `p` from byte `at`: one vector load where they are
// all inside and aligned, else byte by byte, zeros past `nbytes`.
template <bool kVec>
__device__ inline uint4 load16(const std::uint8_t* p, std::uint64_t at, std::uint64_t nbytes) {
  if (kVec && at + kVecBytes <= nbytes) return __ldg(reinterpret_cast<const uint4*>(p + at));
  std::uint32_t w[4] = {0, 0, 0, 0};
  for (int k = 0; k < kVecBytes && at + k < nbytes; ++k) w[k / 4] |= std::uint32_t{p[at + k]} << (8 * (k % 4));
  return make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ inline std::uint64_t element_at(const uint4& v, int i, std::size_t es) {
  const std::uint32_t w[4] = {v.x, v.y, v.z, v.w};
  const int at = i * static_cast<int>(es);
  if (es == 8) return std::uint64_t{w[at / 4]} | std::uint64_t{w[at / 4 + 1]} << 32;
  const std::uint32_t x = w[at / 4] >> (8 * (at % 4));
  return x & static_cast<std::uint32_t>(rules::element_ones(es));
}

// Mark: a bit per changed element, and each chunk's changes and changed bytes.
// Block b compares tiles [b * per, (b + 1) * per); a warp's 512 bytes lie in
// one chunk, so its counts are summed before they are added to the chunk's.
template <int ES, bool kVec>
__global__ void mark(const std::uint8_t* a, const std::uint8_t* b, std::uint64_t nbytes, std::uint64_t per,
                     std::uint32_t* mask, unsigned long long* chunk_changes, unsigned long long* chunk_bytes) {
  constexpr int kPerThread = kVecBytes / ES;   // elements
  constexpr int kLanesPerWord = 32 / kPerThread;
  const unsigned lane = threadIdx.x % 32;
  const std::uint64_t ntiles = (nbytes + kTileBytes - 1) / kTileBytes;
  const std::uint64_t t0 = blockIdx.x * per, t1 = min(ntiles, t0 + per);
  std::uint32_t changes = 0, bytes = 0;
  std::uint64_t chunk = ~0ull;
  auto flush = [&]() {
    changes = __reduce_add_sync(0xffffffffu, changes);
    bytes = __reduce_add_sync(0xffffffffu, bytes);
    if (lane == 0 && chunk != ~0ull && (changes || bytes)) {
      atomicAdd(chunk_changes + chunk, changes);
      atomicAdd(chunk_bytes + chunk, bytes);
    }
    changes = bytes = 0;
  };
  for (std::uint64_t t = t0; t < t1; ++t) {
    const std::uint64_t at = t * kTileBytes + threadIdx.x * kVecBytes;
    const std::uint64_t ch = rules::chunk_of(t * kTileBytes / ES);
    if (ch != chunk) flush(), chunk = ch;
    const uint4 va = load16<kVec>(a, at, nbytes), vb = load16<kVec>(b, at, nbytes);
    std::uint32_t bits = 0;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i)
      bits |= std::uint32_t{rules::changed(element_at(va, i, ES), element_at(vb, i, ES))} << i;
    bytes += __popc(__vcmpne4(va.x, vb.x)) / 8 + __popc(__vcmpne4(va.y, vb.y)) / 8 + __popc(__vcmpne4(va.z, vb.z)) / 8 +
             __popc(__vcmpne4(va.w, vb.w)) / 8;
    changes += __popc(bits);
    // The threads of one 32-element word put their bits together.
    std::uint32_t word = bits << (kPerThread * (lane % kLanesPerWord));
#pragma unroll
    for (int s = 1; s < kLanesPerWord; s *= 2) word |= __shfl_xor_sync(0xffffffffu, word, s);
    const std::uint64_t e0 = at / ES;  // this thread's first element
    if (lane % kLanesPerWord == 0 && at < nbytes) mask[e0 / 32] = word;
  }
  flush();
}

// The contexts of each chunk's sampled base elements (rules::sampled): thread
// t takes sampled element t; a block's 256 lie in one chunk.
template <int ES>
__global__ void sample_contexts(const std::uint8_t* a, std::uint64_t n, ContextField f, std::uint32_t* sample) {
  __shared__ std::uint32_t hist[256];
  hist[threadIdx.x] = 0;
  __syncthreads();
  const std::uint64_t t = std::uint64_t{blockIdx.x} * kThreads + threadIdx.x;
  const std::uint64_t e = t / rules::kSampleRun * rules::kSampleEvery + t % rules::kSampleRun;
  if (e < n) atomicAdd(&hist[rules::context_of(rules::load_element(a + e * ES, ES), f)], 1u);
  __syncthreads();
  const std::uint64_t e0 = std::uint64_t{blockIdx.x} * kThreads / rules::kSampleRun * rules::kSampleEvery;
  if (hist[threadIdx.x]) atomicAdd(sample + rules::chunk_of(e0) * 256 + threadIdx.x, hist[threadIdx.x]);
}

struct NonzeroWord {
  const std::uint32_t* mask;
  __device__ bool operator()(std::uint32_t w) const { return mask[w] != 0; }
};
struct WordChanges {
  const std::uint32_t* mask;
  __device__ std::uint64_t operator()(std::uint32_t w) const { return static_cast<std::uint64_t>(__popc(mask[w])); }
};

// Expand: the changes of selected word i, from change offs[i] on.
template <int ES>
__global__ void expand(const std::uint8_t* a, const std::uint8_t* b, const std::uint32_t* mask, const std::uint32_t* words,
                       const std::uint64_t* offs, std::uint32_t nsel, ContextField f, bool context, std::uint32_t* pos,
                       std::uint8_t* diff, std::uint8_t* ctx) {
  const std::uint32_t i = blockIdx.x * kThreads + threadIdx.x;
  if (i >= nsel) return;
  const std::uint32_t w = words[i];
  std::uint64_t o = offs[i];
  for (std::uint32_t m = mask[w]; m; m &= m - 1, ++o) {
    const std::uint64_t e = std::uint64_t{w} * 32 + static_cast<unsigned>(__ffs(m) - 1);
    const std::uint64_t va = rules::load_element(a + e * ES, ES), vb = rules::load_element(b + e * ES, ES);
    pos[o] = rules::index_in_chunk(e);
    const std::uint64_t d = rules::difference(va, vb, ES);
    for (int k = 0; k < ES; ++k) diff[o * ES + k] = static_cast<std::uint8_t>(d >> (8 * k));
    if (context) ctx[o] = rules::context_of(va, f);
  }
}

// ---- rank ------------------------------------------------------------------------
// A tile is a block's 256 x 16 bytes; chunks hold whole tiles. Counts of
// the (at most 8) groups' elements in 16-bit lanes (a tile has at most 4096
// elements), with the changes among them.
struct Counts {
  unsigned long long g03 = 0, g47 = 0, chg = 0;
  __host__ __device__ void add_group(unsigned g) { (g < 4 ? g03 : g47) += 1ull << (16 * (g % 4)); }
  __host__ __device__ unsigned group(unsigned g) const { return static_cast<unsigned>(((g < 4 ? g03 : g47) >> (16 * (g % 4))) & 0xffff); }
};
struct AddCounts {
  __host__ __device__ Counts operator()(const Counts& x, const Counts& y) const { return {x.g03 + y.g03, x.g47 + y.g47, x.chg + y.chg}; }
};
// A tile's counts, and summed by key: the tiles' before it in its chunk.
struct TileCounts {
  std::uint32_t g[kMaxGroups] = {};
  std::uint32_t chg = 0;
};
struct AddTileCounts {
  __host__ __device__ TileCounts operator()(const TileCounts& x, const TileCounts& y) const {
    TileCounts r;
    for (unsigned g = 0; g < kMaxGroups; ++g) r.g[g] = x.g[g] + y.g[g];
    r.chg = x.chg + y.chg;
    return r;
  }
};
struct TileChunk {
  std::uint64_t tiles_per_chunk;
  __host__ __device__ std::uint64_t operator()(std::uint64_t t) const { return t / tiles_per_chunk; }
};

// A thread's elements: their groups (a byte each), their counts and which changed.
template <int ES, bool kVec>
__device__ inline Counts thread_counts_f(const std::uint8_t* a, std::uint64_t n, const std::uint32_t* mask, const ContextGroups* groups,
                                         ContextField f, std::uint64_t e0, std::uint8_t* grp, std::uint32_t& bits) {
  constexpr int kPerThread = kVecBytes / ES;
  const uint4 va = load16<kVec>(a, e0 * ES, n * ES);
  const ContextGroups& gs = groups[rules::chunk_of(e0)];
  bits = e0 < n ? (mask[e0 / 32] >> (e0 % 32)) & ((1u << kPerThread) - 1) : 0;
  Counts c;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    grp[i] = static_cast<std::uint8_t>(rules::group_of(rules::context_of(element_at(va, i, ES), f), gs.lo, gs.G));
    if (e0 + i < n) c.add_group(grp[i]);
  }
  c.chg = __popc(bits);
  return c;
}

template <int ES, bool kVec>
__global__ void tile_counts(const std::uint8_t* a, std::uint64_t n, const std::uint32_t* mask, const ContextGroups* groups,
                            ContextField f, TileCounts* tiles) {
  using Reduce = cub::BlockReduce<Counts, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  constexpr int kPerThread = kVecBytes / ES;
  const std::uint64_t e0 = (std::uint64_t{blockIdx.x} * kThreads + threadIdx.x) * kPerThread;
  std::uint8_t grp[kPerThread];
  std::uint32_t bits;
  const Counts c = Reduce(tmp).Reduce(thread_counts_f<ES, kVec>(a, n, mask, groups, f, e0, grp, bits), AddCounts{});
  if (threadIdx.x == 0) {
    TileCounts t;
    for (unsigned g = 0; g < kMaxGroups; ++g) t.g[g] = c.group(g);
    t.chg = static_cast<std::uint32_t>(c.chg);
    tiles[blockIdx.x] = t;
  }
}

// Each change's rank: the tiles' before it in its chunk (`before`), the
// threads' before it in its tile, and its thread's elements before it.
template <int ES, bool kVec>
__global__ void rank_changes(const std::uint8_t* a, std::uint64_t n, const std::uint32_t* mask, const ContextGroups* groups,
                             ContextField f, const TileCounts* tiles, const TileCounts* before, const std::uint64_t* chunk_start,
                             std::uint32_t* rank) {
  using Scan = cub::BlockScan<Counts, kThreads>;
  __shared__ typename Scan::TempStorage tmp;
  if (tiles[blockIdx.x].chg == 0) return;  // the whole block: nothing to rank
  constexpr int kPerThread = kVecBytes / ES;
  const std::uint64_t e0 = (std::uint64_t{blockIdx.x} * kThreads + threadIdx.x) * kPerThread;
  std::uint8_t grp[kPerThread];
  std::uint32_t bits;
  Counts mine = thread_counts_f<ES, kVec>(a, n, mask, groups, f, e0, grp, bits);
  Counts prior;
  Scan(tmp).ExclusiveScan(mine, prior, Counts{}, AddCounts{});
  const TileCounts& tb = before[blockIdx.x];
  const std::uint64_t tile_e0 = std::uint64_t{blockIdx.x} * kThreads * kPerThread;
  std::uint64_t j = chunk_start[rules::chunk_of(tile_e0)] + tb.chg + prior.chg;
  std::uint32_t seen[kMaxGroups] = {};
  for (int i = 0; i < kPerThread; ++i) {
    const unsigned g = grp[i];
    if ((bits >> i) & 1) rank[j++] = tb.g[g] + prior.group(g) + seen[g];
    ++seen[g];
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

int launch_blocks(std::uint64_t ntiles) {
  static const int sms = [] {
    int dev = 0, n = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  }();
  return static_cast<int>(std::min<std::uint64_t>(ntiles, std::uint64_t(sms) * 8));
}

}  // namespace

struct ChangeFinder::Impl {
  cudaStream_t stream = nullptr;
  cudaEvent_t ev[3] = {};
  std::uint32_t* mask = nullptr;
  std::uint32_t* words = nullptr;
  std::uint64_t* offs = nullptr;
  unsigned long long* counts = nullptr;  // per chunk: changes, then changed bytes
  std::uint32_t* sample = nullptr;
  std::uint32_t* nsel = nullptr;
  std::uint32_t* pos = nullptr;
  std::uint8_t* diff = nullptr;
  std::uint8_t* ctx = nullptr;
  std::uint32_t* rank = nullptr;
  TileCounts* tiles = nullptr;
  TileCounts* before = nullptr;
  ContextGroups* groups = nullptr;
  std::uint64_t* chunk_start = nullptr;
  void* tmp = nullptr;
  std::size_t cap_mask = 0, cap_words = 0, cap_offs = 0, cap_counts = 0, cap_sample = 0, cap_nsel = 0, cap_pos = 0, cap_diff = 0,
              cap_ctx = 0, cap_rank = 0, cap_tiles = 0, cap_before = 0, cap_groups = 0, cap_start = 0, cap_tmp = 0;

  void temp(std::size_t bytes) {
    if (bytes <= cap_tmp) return;
    if (tmp) CK(cudaFree(tmp));
    tmp = nullptr;
    CK(cudaMalloc(&tmp, bytes));
    cap_tmp = bytes;
  }
  ~Impl() {
    for (void* p : {static_cast<void*>(mask), static_cast<void*>(words), static_cast<void*>(offs), static_cast<void*>(counts),
                    static_cast<void*>(sample), static_cast<void*>(nsel), static_cast<void*>(pos), static_cast<void*>(diff),
                    static_cast<void*>(ctx), static_cast<void*>(rank), static_cast<void*>(tiles), static_cast<void*>(before),
                    static_cast<void*>(groups), static_cast<void*>(chunk_start), tmp})
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

template <int ES>
void launch_mark(const DeviceTensor& t, ChangeFinder::Impl& im, std::uint64_t n) {
  const std::uint64_t ntiles = (t.nbytes + kTileBytes - 1) / kTileBytes;
  const int blocks = launch_blocks(ntiles);
  const std::uint64_t per = (ntiles + blocks - 1) / blocks;
  const auto* a = static_cast<const std::uint8_t*>(t.base);
  const auto* b = static_cast<const std::uint8_t*>(t.next);
  const std::uint64_t chunks = rules::chunk_count(n);
  unsigned long long* cc = im.counts;
  if ((reinterpret_cast<std::uintptr_t>(a) | reinterpret_cast<std::uintptr_t>(b)) % kVecBytes == 0)
    mark<ES, true><<<blocks, kThreads, 0, im.stream>>>(a, b, t.nbytes, per, im.mask, cc, cc + chunks);
  else
    mark<ES, false><<<blocks, kThreads, 0, im.stream>>>(a, b, t.nbytes, per, im.mask, cc, cc + chunks);
  CK(cudaGetLastError());
}

template <int ES>
void launch_rest(const DeviceTensor& t, ChangeFinder::Impl& im, std::uint64_t n, std::uint32_t nsel, bool context) {
  if (context && n) {
    const std::uint64_t samples = (n + rules::kSampleEvery - 1) / rules::kSampleEvery * rules::kSampleRun;
    sample_contexts<ES><<<static_cast<unsigned>((samples + kThreads - 1) / kThreads), kThreads, 0, im.stream>>>(
        static_cast<const std::uint8_t*>(t.base), n, t.field, im.sample);
    CK(cudaGetLastError());
  }
  if (nsel)
    expand<ES><<<(nsel + kThreads - 1) / kThreads, kThreads, 0, im.stream>>>(
        static_cast<const std::uint8_t*>(t.base), static_cast<const std::uint8_t*>(t.next), im.mask, im.words, im.offs, nsel,
        t.field, context, im.pos, im.diff, im.ctx);
  CK(cudaGetLastError());
}

template <int ES>
void launch_rank(const DeviceTensor& t, ChangeFinder::Impl& im, std::uint64_t n, std::uint64_t ntiles) {
  const auto* a = static_cast<const std::uint8_t*>(t.base);
  const bool vec = reinterpret_cast<std::uintptr_t>(a) % kVecBytes == 0;
  const unsigned blocks = static_cast<unsigned>(ntiles);
  if (vec)
    tile_counts<ES, true><<<blocks, kThreads, 0, im.stream>>>(a, n, im.mask, im.groups, t.field, im.tiles);
  else
    tile_counts<ES, false><<<blocks, kThreads, 0, im.stream>>>(a, n, im.mask, im.groups, t.field, im.tiles);
  CK(cudaGetLastError());
  const auto keys = thrust::make_transform_iterator(thrust::counting_iterator<std::uint64_t>(0),
                                                    TileChunk{kSparseChunkElements / (kTileBytes / ES)});
  std::size_t tb = 0;
  CK(cub::DeviceScan::ExclusiveScanByKey(nullptr, tb, keys, im.tiles, im.before, AddTileCounts{}, TileCounts{},
                                         static_cast<std::int64_t>(ntiles), cuda::std::equal_to<>{}, im.stream));
  im.temp(tb);
  CK(cub::DeviceScan::ExclusiveScanByKey(im.tmp, tb, keys, im.tiles, im.before, AddTileCounts{}, TileCounts{},
                                         static_cast<std::int64_t>(ntiles), cuda::std::equal_to<>{}, im.stream));
  if (vec)
    rank_changes<ES, true><<<blocks, kThreads, 0, im.stream>>>(a, n, im.mask, im.groups, t.field, im.tiles, im.before, im.chunk_start, im.rank);
  else
    rank_changes<ES, false><<<blocks, kThreads, 0, im.stream>>>(a, n, im.mask, im.groups, t.field, im.tiles, im.before, im.chunk_start, im.rank);
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

template <class T>
void to_host(std::vector<T>& v, const T* src, std::uint64_t count, cudaStream_t s, std::uint64_t& copied) {
  v.resize(count);
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
    fail(Exit::failure, "CUDA change finder: element size " + std::to_string(t.es) + " for a " + std::to_string(t.nbytes) + "-byte tensor");
  const std::uint64_t n = t.nbytes / t.es, chunks = rules::chunk_count(n);
  const std::uint64_t nwords = (n + 31) / 32;
  out = Found{};
  out.es = t.es, out.elements = n, out.chunks = chunks;
  grow(im.mask, im.cap_mask, nwords + 1);
  grow(im.words, im.cap_words, nwords + 1);
  grow(im.offs, im.cap_offs, nwords + 1);
  grow(im.counts, im.cap_counts, 2 * chunks + 1);
  grow(im.nsel, im.cap_nsel, 1);
  CK(cudaEventRecord(im.ev[0], im.stream));
  CK(cudaMemsetAsync(im.counts, 0, 2 * chunks * sizeof(unsigned long long), im.stream));
  if (context) {
    grow(im.sample, im.cap_sample, 256 * chunks + 1);
    CK(cudaMemsetAsync(im.sample, 0, 256 * chunks * sizeof(std::uint32_t), im.stream));
  }
  if (n) by_es(t.es, [&]<int ES>() { launch_mark<ES>(t, im, n); });
  // The nonzero mask words, and where each one's changes go.
  const thrust::counting_iterator<std::uint32_t> all(0);
  std::size_t tb = 0;
  CK(cub::DeviceSelect::If(nullptr, tb, all, im.words, im.nsel, static_cast<std::int64_t>(nwords), NonzeroWord{im.mask}, im.stream));
  im.temp(tb);
  CK(cub::DeviceSelect::If(im.tmp, tb, all, im.words, im.nsel, static_cast<std::int64_t>(nwords), NonzeroWord{im.mask}, im.stream));
  std::uint32_t nsel = 0;
  std::vector<unsigned long long> counts(2 * chunks);
  CK(cudaMemcpyAsync(&nsel, im.nsel, sizeof nsel, cudaMemcpyDeviceToHost, im.stream));
  if (chunks) CK(cudaMemcpyAsync(counts.data(), im.counts, counts.size() * sizeof counts[0], cudaMemcpyDeviceToHost, im.stream));
  CK(cudaStreamSynchronize(im.stream));
  out.host_bytes += sizeof nsel + counts.size() * sizeof counts[0];
  out.start.assign(chunks + 1, 0);
  out.bytes.assign(chunks, 0);
  for (std::uint64_t c = 0; c < chunks; ++c) out.start[c + 1] = out.start[c] + counts[c], out.bytes[c] = counts[chunks + c];
  const std::uint64_t K = out.start.back();
  const auto popc = thrust::make_transform_iterator(im.words, WordChanges{im.mask});
  tb = 0;
  CK(cub::DeviceScan::ExclusiveSum(nullptr, tb, popc, im.offs, static_cast<std::int64_t>(nsel), im.stream));
  im.temp(tb);
  CK(cub::DeviceScan::ExclusiveSum(im.tmp, tb, popc, im.offs, static_cast<std::int64_t>(nsel), im.stream));
  grow(im.pos, im.cap_pos, K + 1);
  grow(im.diff, im.cap_diff, K * t.es + 1);
  if (context) grow(im.ctx, im.cap_ctx, K + 1);
  by_es(t.es, [&]<int ES>() { launch_rest<ES>(t, im, n, nsel, context); });
  CK(cudaEventRecord(im.ev[1], im.stream));
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
  const std::uint64_t ntiles = (t.nbytes + kTileBytes - 1) / kTileBytes;
  grow(im.tiles, im.cap_tiles, ntiles + 1);
  grow(im.before, im.cap_before, ntiles + 1);
  grow(im.groups, im.cap_groups, groups.size() + 1);
  grow(im.chunk_start, im.cap_start, out.start.size());
  grow(im.rank, im.cap_rank, K + 1);
  CK(cudaEventRecord(im.ev[0], im.stream));
  if (!groups.empty()) {
    CK(cudaMemcpyAsync(im.groups, groups.data(), groups.size_bytes(), cudaMemcpyHostToDevice, im.stream));
    CK(cudaMemcpyAsync(im.chunk_start, out.start.data(), out.start.size() * sizeof(std::uint64_t), cudaMemcpyHostToDevice, im.stream));
  }
  if (K) by_es(t.es, [&]<int ES>() { launch_rank<ES>(t, im, out.elements, ntiles); });
  CK(cudaEventRecord(im.ev[1], im.stream));
  to_host(out.rank, im.rank, K, im.stream, out.host_bytes);
  CK(cudaEventRecord(im.ev[2], im.stream));
  CK(cudaStreamSynchronize(im.stream));
  CK(cudaEventElapsedTime(&timing_.find_ms, im.ev[0], im.ev[1]));
  CK(cudaEventElapsedTime(&timing_.total_ms, im.ev[0], im.ev[2]));
}

}  // namespace hfdelta::gpu
