// The context encoding (hfdelta's own, format revision 5).
//
// An element's chance of changing in one optimizer step depends on its
// magnitude: a step of about the learning rate crosses a rounding boundary of
// a small element far more often than of a large one (it halves with every
// step of the exponent). Both ends hold the base, so both can sort the
// elements by their base exponent without sending it. Each chunk of elements
// splits the exponent range into a few contiguous groups chosen for it; the
// changes of each group are coded as gaps among that group's base elements
// (Rice codes: quotients through zstd, remainder bits raw), and their values
// as a magnitude (through zstd) and a sign bit, group by group.
//
// Entry: head (kContextHeadSize bytes: "HFC1", u32 element size, u64 tensor
// bytes, u64 chunk elements, u64 chunks, u8 shift, u8 bits, 6 zero bytes),
// then each chunk:
//   varint K (changed elements); if K > 0:
//   u8 G (groups, 1..16; the encoder writes at most 8), G-1 u8 thresholds (ascending; group g holds the
//   contexts from threshold g on), per group u8 Rice parameter and varint
//   count (summing to K), varint lengths of the Q, M and X frames, then
//   Q: zstd frame of K bytes, each gap's quotient (255: 255 + an X varint)
//   R: each gap's low bits (the group's Rice parameter), LSB first, padded
//   M: zstd frame of K bytes, magnitude - 1 (255: the magnitude is 256 + an X varint)
//   S: K sign bits (1: the difference is negative), LSB first, padded
//   X: zstd frame of the escapes' LEB128 varints, Q's then M's (absent: 0)
// Q, R, M and S run group by group; within a group, in element order. A gap
// is how many base elements of the group lie between two changes of it. The
// value is the difference new - old of the elements as little-endian
// integers, modulo 2^(8*element size), as a signed number.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <type_traits>
#include <vector>

#include <zstd.h>

#if defined(__x86_64__) || defined(__SSE2__)
#include <immintrin.h>
#endif

#include "codec/codec.hpp"
#include "codec/codec_internal.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/safetensors.hpp"

namespace hfdelta {

namespace {

constexpr std::string_view kMagicContext = encoding_info(Encoding::context).magic;
constexpr unsigned kMaxRice = 24;      // gaps are below 2^20
constexpr double kGroupCostBits = 40;  // a group's own bytes in the chunk head, about
constexpr std::size_t kEncoderGroups = 8;
constexpr std::uint64_t kNone = ~0ull;  // a group's countdown when it has no change left

// One append a value, not one a byte: where every change escapes (a tensor
// rewritten throughout), this runs once a change.
void put_varint(std::vector<std::uint8_t>& out, std::uint64_t v) {
  std::uint8_t b[10];
  std::size_t n = 0;
  for (; v >= 0x80; v >>= 7) b[n++] = static_cast<std::uint8_t>(v | 0x80);
  b[n++] = static_cast<std::uint8_t>(v);
  out.insert(out.end(), b, b + n);
}

template <std::size_t ES>
inline std::uint64_t load_elem(const std::uint8_t* p) {
  std::uint64_t v = 0;
  std::memcpy(&v, p, ES);
  return v;
}

using rules::element_ones;
using rules::signed_value;
using rules::SignedValue;

// n·H(k/n) in bits: the cost of k changes among n elements of one context.
double position_bits(std::uint64_t n, std::uint64_t k) {
  if (k == 0 || k == n) return 0;
  const double p = static_cast<double>(k) / static_cast<double>(n);
  return static_cast<double>(n) * (-p * std::log2(p) - (1 - p) * std::log2(1 - p));
}

// Packs values of up to 24 bits, LSB first, into `p`, which has room for
// every value's bits and 8 bytes more: each value stored with the bits before
// it that make no whole byte yet, eight bytes at a time (no branch a value).
struct BitWriter {
  std::uint8_t* p;
  std::uint64_t acc = 0;  // bits not yet in whole bytes: fewer than 8
  unsigned fill = 0;
  void put(std::uint32_t v, unsigned bits) {
    acc |= static_cast<std::uint64_t>(v) << fill;
    fill += bits;
    put_le64(p, acc);
    p += fill / 8;
    acc >>= fill & ~7u;
    fill %= 8;
  }
};

// Reads what BitWriter packs: values of up to 32 bits, LSB first, from `n`
// bytes (zeros past them), eight bytes at a time where there are eight.
struct BitReader {
  const std::uint8_t* p;
  std::size_t n;
  std::uint64_t at = 0;  // bits read
  std::uint32_t get(unsigned bits) {
    const std::size_t byte = static_cast<std::size_t>(at / 8);
    std::uint64_t w = 0;
    if (byte + 8 <= n)
      w = get_le64(p + byte);
    else
      for (std::size_t k = 0; byte + k < n && k < 8; ++k) w |= static_cast<std::uint64_t>(p[byte + k]) << (8 * k);
    const auto v = static_cast<std::uint32_t>((w >> (at % 8)) & ((std::uint64_t{1} << bits) - 1));
    at += bits;
    return v;
  }
};

// The context of each of `n` elements: (element >> sh) & mask, one byte each.
// A plain loop over fixed-width integers (for 2-byte elements the compiler
// widens them to 32-bit lanes: extract_contexts_avx2 keeps 16).
template <std::size_t ES>
void extract_contexts(const std::uint8_t* p, std::size_t n, unsigned sh, std::uint64_t mask, std::uint8_t* out) {
  using U = std::conditional_t<
      ES == 1, std::uint8_t,
      std::conditional_t<ES == 2, std::uint16_t, std::conditional_t<ES == 4, std::uint32_t, std::uint64_t>>>;
  const U m = static_cast<U>(mask);
  for (std::size_t i = 0; i < n; ++i) {
    U v;
    std::memcpy(&v, p + i * ES, ES);
    out[i] = static_cast<std::uint8_t>((v >> sh) & m);
  }
}

// Masks of 64 contexts at or above each of a chunk's group thresholds: bit i
// of out[j] is set where c[i] >= t[j]. A context's group is the number of
// thresholds it reaches.
struct Thresholds {
  std::size_t n = 0;  // G - 1
  std::uint8_t t[kContextMaxGroups] = {};
};

// The walks over every element (the encoder's rank pass, the decoder's walk)
// come in two shapes: for chunks of delta-diff's most groups (NT =
// kEncoderGroups - 1 thresholds, nearly every chunk of a trained tensor),
// where the loops over groups unroll and the counts stay in registers; and
// for any other count (NT = kAnyNT: th.n at run time).
constexpr std::size_t kAnyNT = ~std::size_t{0};
template <std::size_t NT>
[[gnu::always_inline]] inline std::size_t thresholds_n(const Thresholds& th) {
  return NT == kAnyNT ? th.n : NT;
}

template <std::size_t NT>
[[gnu::always_inline]] inline void threshold_masks_generic(const std::uint8_t* c, const Thresholds& th,
                                                           std::uint64_t* out) {
  const std::size_t nt = thresholds_n<NT>(th);
#if defined(__SSE2__)
  __m128i v[4];
  for (int k = 0; k < 4; ++k) v[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(c + 16 * k));
  for (std::size_t j = 0; j < nt; ++j) {
    const __m128i t = _mm_set1_epi8(static_cast<char>(th.t[j]));
    std::uint64_t m = 0;
    for (int k = 0; k < 4; ++k)  // unsigned c >= t: max(c, t) == c
      m |= static_cast<std::uint64_t>(
               static_cast<std::uint16_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_max_epu8(v[k], t), v[k]))))
           << (16 * k);
    out[j] = m;
  }
#else
  for (std::size_t j = 0; j < nt; ++j) {
    std::uint64_t m = 0;
    for (int i = 0; i < 64; ++i) m |= static_cast<std::uint64_t>(c[i] >= th.t[j]) << i;
    out[j] = m;
  }
#endif
}

// The walks over every element come in three builds, picked at run time:
// for x86-64-v4's AVX-512BW (a byte comparison of 64 contexts gives their
// mask in one instruction), for x86-64-v3 (AVX2, BMI2 and POPCNT) and for
// the baseline, where a popcount is a library call. Level: 0, 1 (v3), 2 (v4).
#if defined(__x86_64__) && defined(__GNUC__)
#define HFDELTA_HAVE_V3 1
#define HFDELTA_V3 __attribute__((target("avx2,bmi,bmi2,popcnt")))
#define HFDELTA_V4 __attribute__((target("avx2,avx512f,avx512bw,bmi,bmi2,popcnt")))
int cpu_level() {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("bmi2") || !__builtin_cpu_supports("popcnt")) return 0;
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") ? 2 : 1;
}

template <std::size_t NT>
__attribute__((target("avx512f,avx512bw"))) inline void threshold_masks_avx512(const std::uint8_t* c,
                                                                               const Thresholds& th,
                                                                               std::uint64_t* out) {
  const __m512i v = _mm512_loadu_si512(c);
  for (std::size_t j = 0; j < thresholds_n<NT>(th); ++j)
    out[j] = _mm512_cmpge_epu8_mask(v, _mm512_set1_epi8(static_cast<char>(th.t[j])));
}

// extract_contexts for 2-byte elements, 32 at a time in 16-bit lanes.
__attribute__((target("avx2"))) inline void extract_contexts_avx2(const std::uint8_t* p, std::size_t n, unsigned sh,
                                                                  std::uint64_t mask, std::uint8_t* out) {
  const __m128i count = _mm_cvtsi32_si128(static_cast<int>(sh));
  const __m256i m = _mm256_set1_epi16(static_cast<short>(mask));
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i x0 =
        _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * i)), count), m);
    const __m256i x1 = _mm256_and_si256(
        _mm256_srl_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * i + 32)), count), m);
    // packus interleaves the 128-bit lanes: the permute puts them back in order.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm256_permute4x64_epi64(_mm256_packus_epi16(x0, x1), 0xd8));
  }
  extract_contexts<2>(p + 2 * i, n - i, sh, mask, out + i);
}

#else
#define HFDELTA_HAVE_V3 0
int cpu_level() { return 0; }
#endif
const int kCpuLevel = cpu_level();
int g_level = kCpuLevel;  // the build in use: the CPU's widest, unless a test caps it

// The context of each of `n` elements (extract_contexts), at the widest
// level the caller is built for.
template <std::size_t ES, int L>
[[gnu::always_inline]] inline void contexts_of(const std::uint8_t* p, std::size_t n, unsigned sh, std::uint64_t mask,
                                               std::uint8_t* out) {
#if HFDELTA_HAVE_V3
  if constexpr (ES == 2 && L >= 1) return extract_contexts_avx2(p, n, sh, mask, out);
#endif
  extract_contexts<ES>(p, n, sh, mask, out);
}

#if HFDELTA_HAVE_V3
HFDELTA_V3 inline unsigned select_bit_pdep(std::uint64_t x, std::uint64_t k) {
  return static_cast<unsigned>(std::countr_zero(_pdep_u64(std::uint64_t{1} << k, x)));
}
#endif

// The position of the k-th (from 0) set bit of x, which has more than k.
template <int L>
[[gnu::always_inline]] inline unsigned select_bit(std::uint64_t x, std::uint64_t k) {
#if HFDELTA_HAVE_V3
  if constexpr (L >= 1) return select_bit_pdep(x, k);
#endif
  unsigned at = 0;
  for (;;) {  // whole bytes at a time while they hold no more than k set bits
    const auto c = static_cast<std::uint64_t>(std::popcount(x & 0xff));
    if (c > k) break;
    k -= c, x >>= 8, at += 8;
  }
  for (; k; --k) x &= x - 1;
  return at + static_cast<unsigned>(std::countr_zero(x));
}

// The walks over every element (the decoder's, and the encoder's rank pass)
// go in blocks of kBlockWords words of 64 elements: the block is classified
// first (classify), then its changes taken.
constexpr std::size_t kBlockWords = 64;
constexpr std::size_t kBlock = 64 * kBlockWords;
constexpr std::size_t kRows = kContextMaxGroups + 1;

// One block's classes and the changes found in it (per thread, reused). The
// classes are kept by row: row 0 holds every element of the block, row j + 1
// those at or above threshold j, row nt + 1 none; group g is row g less row
// g + 1 (fewer masks and counts to keep than one row per group).
struct Block {
  std::uint64_t m[kRows][kBlockWords];  // per row and word: its elements
  // Per row: its elements in the block's earlier words (the block's total for
  // the words past its end), and in the whole block.
  alignas(32) std::uint16_t a[kRows][kBlockWords];
  std::uint64_t total[kRows];
  std::size_t fixed_nt = kContextMaxGroups;  // rows 0 and fixed_nt + 1 hold a whole block's
  std::uint64_t hit[kBlockWords];            // the changes found
  std::uint16_t at[kBlock];                  // per change found, group by group: its element in the block
  std::uint64_t zz[kBlock];                  // and its value (zigzag of the difference)

  std::uint64_t group_mask(std::size_t g, std::size_t wd) const { return m[g][wd] & ~m[g + 1][wd]; }
  std::uint64_t group_before(std::size_t g, std::size_t wd) const {
    return static_cast<std::uint64_t>(a[g][wd] - a[g + 1][wd]);
  }
  std::uint64_t group_total(std::size_t g) const { return total[g] - total[g + 1]; }
};

// Rows 0 and nt + 1 for a block of `len` elements.
inline void fixed_rows(Block& b, std::size_t nt, std::size_t len) {
  if (b.fixed_nt == nt && len == kBlock) return;
  const std::size_t words = (len + 63) / 64;
  for (std::size_t wd = 0; wd < kBlockWords; ++wd) {
    b.m[0][wd] = wd < len / 64 ? ~0ull : wd < words ? (std::uint64_t{1} << (len % 64)) - 1 : 0;
    b.a[0][wd] = static_cast<std::uint16_t>(std::min(64 * wd, len));
    b.m[nt + 1][wd] = 0;
    b.a[nt + 1][wd] = 0;
  }
  b.total[0] = len;
  b.total[nt + 1] = 0;
  b.fixed_nt = len == kBlock ? nt : kContextMaxGroups;  // a shorter block's row 0 is redone next time
}

#if HFDELTA_HAVE_V3
// word_of's count, 16 words at a time.
__attribute__((target("avx2,popcnt"))) inline std::size_t word_of_avx2(const std::uint16_t* lo, const std::uint16_t* hi,
                                                                       std::uint64_t r) {
  const __m256i rv = _mm256_set1_epi16(static_cast<short>(r));
  unsigned above = 0;  // two mask bits per word with more than r before it
  for (std::size_t k = 0; k < kBlockWords; k += 16) {
    const __m256i before = _mm256_sub_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(lo + k)),
                                            _mm256_load_si256(reinterpret_cast<const __m256i*>(hi + k)));
    above += static_cast<unsigned>(
        std::popcount(static_cast<unsigned>(_mm256_movemask_epi8(_mm256_cmpgt_epi16(before, rv)))));
  }
  return kBlockWords - 1 - above / 2;
}
#endif

// Where classify takes a block's contexts: extracted (one byte an element,
// whole words readable, zeros past the block's end), or, for 2-byte elements
// in the x86-64-v3 build, straight from the base elements (`es` 2 here). A
// context of 0 is below every threshold, so the zeros past the end count in
// no row.
struct Contexts {
  const std::uint8_t* ctx = nullptr;
  const std::uint8_t* base = nullptr;
  ContextField field;
};

// The thresholds' masks of the 64 contexts at `c`: bit i of m[j] set where
// c[i] >= t[j].
template <int L, std::size_t NT>
[[gnu::always_inline]] inline void word_masks(const std::uint8_t* c, const Thresholds& th, std::uint64_t* m) {
#if HFDELTA_HAVE_V3
  if constexpr (L >= 2) return threshold_masks_avx512<NT>(c, th, m);
#endif
  threshold_masks_generic<NT>(c, th, m);
}

// Pass 1 over a block of `len` elements: each row's masks and counts.
template <int L, std::size_t NT>
[[gnu::always_inline]] inline void classify_rows(const Contexts& src, std::size_t len, const Thresholds& th, Block& b) {
  const std::size_t nt = thresholds_n<NT>(th);
  std::uint64_t count[kContextMaxGroups] = {};
  for (std::size_t wd = 0; wd < (len + 63) / 64; ++wd) {
    std::uint64_t m[kContextMaxGroups];
    word_masks<L, NT>(src.ctx + 64 * wd, th, m);
    for (std::size_t j = 0; j < nt; ++j) {
      b.m[j + 1][wd] = m[j];
      b.a[j + 1][wd] = static_cast<std::uint16_t>(count[j]);
      count[j] += static_cast<std::uint64_t>(std::popcount(m[j]));
    }
  }
  for (std::size_t j = 0; j < nt; ++j) b.total[j + 1] = count[j];
}

#if HFDELTA_HAVE_V3
// classify_rows in the x86-64-v3 build, 32 contexts to a vector: unsigned
// c >= t as signed (c ^ 0x80) > ((t - 1) ^ 0x80), one comparison (thresholds
// are at least 1).
#define HFDELTA_V3_INLINE [[gnu::always_inline]] __attribute__((target("avx2,popcnt"))) inline

// The 64 contexts of word wd, flipped: from the extracted contexts, or from
// the 2-byte base elements (their last word, if not whole, from a copy).
HFDELTA_V3_INLINE void word_contexts_avx2(const Contexts& src, std::size_t wd, std::size_t len, __m128i shift,
                                          __m256i field, __m256i* v) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  if (!src.base) {
    for (int h = 0; h < 2; ++h)
      v[h] = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src.ctx + 64 * wd + 32 * h)), flip);
    return;
  }
  const std::uint8_t* p = src.base + 128 * wd;
  alignas(32) std::uint8_t tail[128];
  if (64 * wd + 64 > len) {
    std::memset(tail, 0, sizeof tail);
    p = static_cast<const std::uint8_t*>(std::memcpy(tail, p, 2 * (len - 64 * wd)));
  }
  for (int h = 0; h < 2; ++h) {
    const __m256i x0 = _mm256_and_si256(
        _mm256_srl_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * h)), shift), field);
    const __m256i x1 = _mm256_and_si256(
        _mm256_srl_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * h + 32)), shift), field);
    // packus interleaves the 128-bit lanes: the permute puts them back in order.
    v[h] = _mm256_xor_si256(_mm256_permute4x64_epi64(_mm256_packus_epi16(x0, x1), 0xd8), flip);
  }
}

// Each word's masks stored and counted, each threshold's before the next (so
// that the counts stay in registers).
template <std::size_t NT>
__attribute__((target("avx2,popcnt"))) void classify_rows_avx2(const Contexts& src, std::size_t len,
                                                               const Thresholds& th, Block& b) {
  const std::size_t nt = thresholds_n<NT>(th);
  __m256i t[kContextMaxGroups];
  for (std::size_t j = 0; j < nt; ++j) t[j] = _mm256_set1_epi8(static_cast<char>((th.t[j] - 1) ^ 0x80));
  const __m128i shift = _mm_cvtsi32_si128(src.field.shift);
  const __m256i field = _mm256_set1_epi16(static_cast<short>((1 << src.field.bits) - 1));
  std::uint64_t count[kContextMaxGroups] = {};
  for (std::size_t wd = 0; wd < (len + 63) / 64; ++wd) {
    __m256i v[2];
    word_contexts_avx2(src, wd, len, shift, field, v);
    for (std::size_t j = 0; j < nt; ++j) {
      const std::uint64_t lo = static_cast<std::uint32_t>(_mm256_movemask_epi8(_mm256_cmpgt_epi8(v[0], t[j])));
      const std::uint64_t hi = static_cast<std::uint32_t>(_mm256_movemask_epi8(_mm256_cmpgt_epi8(v[1], t[j])));
      const std::uint64_t mj = lo | hi << 32;
      b.m[j + 1][wd] = mj;
      b.a[j + 1][wd] = static_cast<std::uint16_t>(count[j]);
      count[j] += static_cast<std::uint64_t>(std::popcount(mj));
    }
  }
  for (std::size_t j = 0; j < nt; ++j) b.total[j + 1] = count[j];
}
#endif

// Pass 1 over a block of `len` elements.
template <int L, std::size_t NT>
[[gnu::always_inline]] inline void classify(const Contexts& src, std::size_t len, const Thresholds& th, Block& b) {
  const std::size_t nt = thresholds_n<NT>(th);
  fixed_rows(b, nt, len);
#if HFDELTA_HAVE_V3
  if constexpr (L == 1)
    classify_rows_avx2<NT>(src, len, th, b);
  else
#endif
    classify_rows<L, NT>(src, len, th, b);
  for (std::size_t j = 0; j < nt; ++j)  // the words past the block's end
    for (std::size_t wd = (len + 63) / 64; wd < kBlockWords; ++wd)
      b.a[j + 1][wd] = static_cast<std::uint16_t>(b.total[j + 1]);
}

// The word of group g's element of rank `r` in the block (r below the
// group's total): the last word with at most r of its elements before it.
template <int L>
[[gnu::always_inline]] inline std::size_t word_of(const Block& b, std::size_t g, std::uint64_t r) {
#if HFDELTA_HAVE_V3
  if constexpr (L >= 1) return word_of_avx2(b.a[g], b.a[g + 1], r);
#endif
  std::size_t w = 0;
  for (std::size_t half = kBlockWords / 2; half; half /= 2) w += b.group_before(g, w + half) <= r ? half : 0;
  return w;
}

// Encoder: each change's rank among its group's base elements, a block at a
// time: the block classified, a change's rank the group's count before the
// block and before its word, and the elements of its group below its bit in
// its word. Writes each change's slot (group by group) and gap.
struct RankJob {
  const std::uint8_t* ctx;
  std::uint64_t n;
  const std::uint32_t* pos;
  std::uint64_t K;
  const std::uint8_t* gtab;
  Thresholds th;
  std::size_t G;
  std::uint64_t* slot;       // per group: its next slot
  std::uint32_t* gaps;       // per slot
  std::uint32_t* change_of;  // per slot: the change it holds
  // The value streams by slot, from each change's difference as its slot is
  // known (stores in any order cost less than loads in any order later).
  const std::uint64_t* diff;  // per change: new - old, modulo 2^(8 es)
  std::size_t es;
  std::uint8_t* msym;   // per slot: magnitude - 1, 255 for an escape
  std::uint8_t* signs;  // a bit per slot, zeroed by the caller
  Block* block;         // scratch
};

// Change j, of group g and `rank` among the group's base elements, into the
// group's next slot: its gap and its value's magnitude symbol and sign.
[[gnu::always_inline]] inline void place_change(const RankJob& r, std::uint64_t j, std::size_t g, std::uint64_t rank,
                                                std::uint64_t* next_rank, std::uint64_t ones) {
  const std::uint64_t s = r.slot[g]++;
  r.gaps[s] = static_cast<std::uint32_t>(rank - next_rank[g]);
  r.change_of[s] = static_cast<std::uint32_t>(j);
  next_rank[g] = rank + 1;
  const SignedValue v = signed_value(r.diff[j], ones);
  r.msym[s] = static_cast<std::uint8_t>(std::min<std::uint64_t>(v.mag_minus1, 255));
  r.signs[s / 8] = static_cast<std::uint8_t>(r.signs[s / 8] | v.neg << (s % 8));
}

template <int L, std::size_t NT>
[[gnu::always_inline]] inline void rank_changes_body(const RankJob& r) {
  const std::size_t G = thresholds_n<NT>(r.th) + 1;
  Block& b = *r.block;
  std::uint64_t seen[kContextMaxGroups] = {}, next_rank[kContextMaxGroups] = {};
  std::uint64_t j = 0;
  const std::uint64_t ones = element_ones(r.es);
  for (std::uint64_t b0 = 0; b0 < r.n && j < r.K; b0 += kBlock) {
    const std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(kBlock, r.n - b0));
    classify<L, NT>(Contexts{r.ctx + b0, nullptr, {}}, len, r.th, b);  // r.ctx: whole words readable
    for (; j < r.K && r.pos[j] < b0 + len; ++j) {
      const std::size_t at = static_cast<std::size_t>(r.pos[j] - b0), wd = at / 64;
      const std::size_t g = r.gtab[r.ctx[r.pos[j]]];
      const std::uint64_t rank =
          seen[g] + b.group_before(g, wd) +
          static_cast<std::uint64_t>(std::popcount(b.group_mask(g, wd) & ((std::uint64_t{1} << (at % 64)) - 1)));
      place_change(r, j, g, rank, next_rank, ones);
    }
    for (std::size_t g = 0; g < G; ++g) seen[g] += b.group_total(g);
  }
}

// The shape for the chunk's group count, in the build of level L.
template <int L>
[[gnu::always_inline]] inline void rank_changes_shaped(const RankJob& r) {
  if (r.th.n == kEncoderGroups - 1) return rank_changes_body<L, kEncoderGroups - 1>(r);
  rank_changes_body<L, kAnyNT>(r);
}

#if HFDELTA_HAVE_V3
HFDELTA_V3 void rank_changes_v3(const RankJob& r) { rank_changes_shaped<1>(r); }
HFDELTA_V4 void rank_changes_v4(const RankJob& r) { rank_changes_shaped<2>(r); }
#endif
void rank_changes_base(const RankJob& r) { rank_changes_shaped<0>(r); }

// The slots of changes whose ranks were found elsewhere (FoundChunk::rank).
void place_ranked(const RankJob& r, const std::uint8_t* ctx, const std::uint32_t* rank) {
  std::uint64_t next_rank[kContextMaxGroups] = {};
  const std::uint64_t ones = element_ones(r.es);
  for (std::uint64_t j = 0; j < r.K; ++j) place_change(r, j, r.gtab[ctx[j]], rank[j], next_rank, ones);
}

void rank_changes(const RankJob& r) {
#if HFDELTA_HAVE_V3
  if (g_level >= 2) return rank_changes_v4(r);
  if (g_level == 1) return rank_changes_v3(r);
#endif
  rank_changes_base(r);
}

}  // namespace

int context_isa_level(int cap) {
  if (cap >= 0) g_level = std::min(cap, kCpuLevel);
  return g_level;
}

// ---- context field ------------------------------------------------------------

ContextField context_field(std::string_view dtype, std::size_t es) {
  // Exponent fields: the context is the exponent, which sets the unit in the
  // last place and with it how often a step of about the learning rate moves
  // the element. Wider exponents keep their top 8 bits.
  struct Row {
    std::string_view dtype;
    std::size_t es;
    ContextField f;
  };
  static constexpr Row kRows[] = {
      {"BF16", 2, {7, 8}}, {"F16", 2, {10, 5}},    {"F32", 4, {23, 8}},
      {"F64", 8, {55, 8}}, {"F8_E4M3", 1, {3, 4}}, {"F8_E5M2", 1, {2, 5}},
  };
  for (const Row& r : kRows)
    if (r.dtype == dtype && r.es == es) return r.f;
  return {};
}

ChunkLayout chunk_layout(std::string_view dtype, std::uint64_t nbytes) {
  const std::size_t ds = dtype_size(dtype);
  ChunkLayout l;
  l.es = sparse_elem_size(ds ? ds : 1, nbytes);
  if (l.es == ds) l.field = context_field(dtype, ds);
  return l;
}

void context_entry_head(std::size_t es, std::uint64_t nbytes, ContextField f, std::uint8_t out[kContextHeadSize]) {
  std::memset(out, 0, kContextHeadSize);
  std::memcpy(out, kMagicContext.data(), 4);
  put_le32(out + 4, static_cast<std::uint32_t>(es));
  put_le64(out + 8, nbytes);
  put_le64(out + 16, kContextChunkElements);
  put_le64(out + 24, sparse_chunk_count(nbytes, es));
  out[32] = f.shift;
  out[33] = f.bits;
}

// ---- encoder ------------------------------------------------------------------

struct ContextChunkEncoder::Impl {
  std::size_t es = 1;
  ContextField field;
  std::uint64_t mask = 0;
  std::uint64_t n = 0;                         // elements scanned
  std::unique_ptr<std::uint8_t[]> ctx;         // per element: its context (and a word's slack)
  std::unique_ptr<std::uint32_t[]> pos;        // per change: its element
  std::unique_ptr<std::uint64_t[]> diff;       // per change: new - old, modulo 2^(8 es)
  std::unique_ptr<std::uint32_t[]> gaps;       // per slot (changes group-major)
  std::unique_ptr<std::uint32_t[]> change_of;  // per slot: the change it holds
  std::unique_ptr<Block> block;                // the rank pass's
  std::vector<std::uint8_t> q, r, m, s, x, xm, frames, head;
  // take(): the changes' contexts and ranks as found, and their groups.
  const std::uint8_t* found_ctx = nullptr;
  const std::uint32_t* found_rank = nullptr;
  ContextGroups found_groups;

  void alloc() {
    if (ctx) return;
    // Uninitialised: pages a chunk never reaches cost nothing.
    ctx.reset(new std::uint8_t[kContextChunkElements + 64]);
    pos.reset(new std::uint32_t[kContextChunkElements]);
    diff.reset(new std::uint64_t[kContextChunkElements]);
    gaps.reset(new std::uint32_t[kContextChunkElements]);
    change_of.reset(new std::uint32_t[kContextChunkElements]);
    block.reset(new Block);
  }

  template <std::size_t ES>
  void scan_t(const std::uint8_t* a, const std::uint8_t* b, std::size_t cnt, std::uint64_t first, std::uint64_t& count,
              std::uint64_t& bytes) {
    if (g_level >= 1)
      contexts_of<ES, 1>(a, cnt, field.shift, mask, ctx.get() + first);
    else
      contexts_of<ES, 0>(a, cnt, field.shift, mask, ctx.get() + first);
    for_each_change<ES>(a, b, cnt, [&](std::size_t off) {
      const std::uint64_t va = load_elem<ES>(a + off), vb = load_elem<ES>(b + off);
      bytes += rules::changed_bytes(va, vb, ES);
      pos[count] = static_cast<std::uint32_t>(first + off / ES);
      diff[count] = rules::difference(va, vb, ES);
      ++count;
    });
    n = std::max(n, first + cnt);
  }
};

ContextChunkEncoder::ContextChunkEncoder() : impl_(std::make_unique<Impl>()) {}
ContextChunkEncoder::~ContextChunkEncoder() = default;

void ContextChunkEncoder::begin(std::size_t es, ContextField f) {
  impl_->alloc();
  impl_->es = es;
  // A field of no bits reads none: context 0 whatever its shift, which may be
  // 8 * es (64 for 8-byte elements: too far to shift by).
  impl_->field = f.bits ? f : ContextField{};
  impl_->mask = (std::uint64_t{1} << f.bits) - 1;
  impl_->n = 0;
  impl_->found_ctx = nullptr;
  count_ = bytes_ = 0;
}

void ContextChunkEncoder::take(const FoundChunk& fc, const ContextGroups& groups) {
  Impl& im = *impl_;
  if (fc.count > fc.elements || fc.elements > kContextChunkElements || groups.G < 1 || groups.G > kContextMaxGroups)
    fail(Exit::failure, "context encoder: a found chunk of " + std::to_string(fc.count) + " changes among " +
                            std::to_string(fc.elements) + " elements in " + std::to_string(groups.G) + " groups");
  if (fc.count && (!fc.ctx || !fc.rank))
    fail(Exit::failure, "context encoder: found changes without their contexts or ranks");
  for (std::uint64_t j = 0; j < fc.count; ++j) {
    im.pos[j] = fc.pos[j];
    im.diff[j] = rules::load_element(fc.diff + j * im.es, im.es);
  }
  im.n = fc.elements;
  im.found_ctx = fc.ctx;
  im.found_rank = fc.rank;
  im.found_groups = groups;
  count_ = fc.count;
  bytes_ = fc.bytes_changed;
}

void ContextChunkEncoder::scan(const std::uint8_t* a, const std::uint8_t* b, std::size_t n, std::uint64_t first) {
  switch (impl_->es) {
    case 1:
      return impl_->scan_t<1>(a, b, n, first, count_, bytes_);
    case 2:
      return impl_->scan_t<2>(a, b, n, first, count_, bytes_);
    case 4:
      return impl_->scan_t<4>(a, b, n, first, count_, bytes_);
    case 8:
      return impl_->scan_t<8>(a, b, n, first, count_, bytes_);
  }
  fail(Exit::failure, "context encoder: element size " + std::to_string(impl_->es));
}

namespace {

struct Group {
  std::uint32_t lo = 0;  // first context
  std::uint64_t n = 0, k = 0;
};

// Contiguous groups of contexts: start from one group per context present,
// then merge the neighbours that lose the fewest bits, while there are more
// than the format allows or a merge costs less than a group's own bytes.
std::vector<Group> choose_groups(const std::uint64_t* hn, const std::uint64_t* hk, std::size_t contexts) {
  std::vector<Group> gs;
  for (std::size_t c = 0; c < contexts; ++c)
    if (hn[c]) gs.push_back({static_cast<std::uint32_t>(c), hn[c], hk[c]});
  if (gs.empty()) return {Group{}};
  gs.front().lo = 0;
  auto loss = [&](std::size_t i) {
    const Group& a = gs[i];
    const Group& b = gs[i + 1];
    return position_bits(a.n + b.n, a.k + b.k) - position_bits(a.n, a.k) - position_bits(b.n, b.k);
  };
  std::vector<double> inc(gs.size() - 1);
  for (std::size_t i = 0; i + 1 < gs.size(); ++i) inc[i] = loss(i);
  while (gs.size() > 1) {
    const std::size_t i = static_cast<std::size_t>(std::min_element(inc.begin(), inc.end()) - inc.begin());
    if (gs.size() <= kEncoderGroups && inc[i] >= kGroupCostBits) break;
    gs[i].n += gs[i + 1].n;
    gs[i].k += gs[i + 1].k;
    gs.erase(gs.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    inc.erase(inc.begin() + static_cast<std::ptrdiff_t>(i));
    if (i < inc.size()) inc[i] = loss(i);
    if (i > 0) inc[i - 1] = loss(i - 1);
  }
  return gs;
}

// The Rice parameter that codes `gaps` in the fewest bits, counting the
// quotients at their order-0 entropy (zstd's Huffman stage comes close) and
// the low bits raw. For gaps spread geometrically that is about k0, with
// 2^k0 just below mean·ln 2 (the quotient then about as likely 0 as not);
// k0 and k0 - 1 are tried (on the generator's qwen3-0.6b pair, trying k0 - 1
// made the entries 2.2% smaller; trying k0 + 1 never changed one).
unsigned choose_rice(const std::uint32_t* gaps, std::size_t cnt) {
  if (cnt == 0) return 0;
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < cnt; ++i) sum += gaps[i];
  const auto scaled = static_cast<std::uint64_t>(static_cast<double>(sum) / static_cast<double>(cnt) * 0.6931);
  const unsigned k0 =
      scaled == 0 ? 0 : std::min<unsigned>(static_cast<unsigned>(std::bit_width(scaled)) - 1, kMaxRice - 1);
  unsigned best_k = k0;
  double best = 0;
  std::uint32_t hist[4][256];  // four tables taken in turn (see ContextChunkEncoder::end)
  for (unsigned k = k0 ? k0 - 1 : 0; k <= k0; ++k) {
    std::memset(hist, 0, sizeof hist);
    double bits = static_cast<double>(k) * static_cast<double>(cnt);
    auto one = [&](std::size_t t, std::uint32_t gap) {
      const std::uint32_t q = gap >> k;
      ++hist[t][std::min<std::uint32_t>(q, 255)];
      if (q >= 255) [[unlikely]]
        bits += 8.0 * (1 + std::bit_width(q - 255) / 7);
    };
    std::size_t i = 0;
    for (; i + 4 <= cnt; i += 4)
      for (std::size_t t = 0; t < 4; ++t) one(t, gaps[i + t]);
    for (; i < cnt; ++i) one(i % 4, gaps[i]);
    for (std::size_t v = 0; v < 256; ++v)
      if (const std::uint32_t h = hist[0][v] + hist[1][v] + hist[2][v] + hist[3][v])
        bits += h * std::log2(static_cast<double>(cnt) / h);
    if (k == (k0 ? k0 - 1 : 0) || bits < best) best = bits, best_k = k;
  }
  return best_k;
}

// The groups of a chunk from its contexts' estimated elements `hn` and
// changes `hk` (each context's elements: at least its changes).
ContextGroups groups_of(std::uint64_t* hn, const std::uint64_t* hk, ContextField f) {
  for (std::size_t c = 0; c < 256; ++c) hn[c] = std::max(hn[c], hk[c]);
  const std::vector<Group> gs = choose_groups(hn, hk, std::size_t{1} << f.bits);
  ContextGroups r;
  r.G = static_cast<std::uint32_t>(gs.size());
  for (std::size_t g = 0; g < gs.size(); ++g) r.lo[g] = static_cast<std::uint8_t>(gs[g].lo);
  return r;
}

}  // namespace

ContextGroups context_groups(const FoundChunk& fc, ContextField f) {
  if (!f.bits) f = {};
  std::uint64_t hn[256], hk[256] = {};
  for (std::size_t c = 0; c < 256; ++c) hn[c] = rules::kSampleWeight * fc.sample[c];
  for (std::uint64_t j = 0; j < fc.count; ++j) ++hk[fc.ctx[j]];
  return groups_of(hn, hk, f);
}

std::uint64_t ContextChunkEncoder::end(Compressor& c, const ByteSink& sink) {
  Impl& im = *impl_;
  const std::uint64_t K = count_;
  im.head.clear();
  put_varint(im.head, K);
  if (K == 0) {
    sink(im.head);
    return im.head.size();
  }
  // Each context's changes: their contexts scanned, or as found.
  std::uint64_t hk[256] = {};
  if (im.found_ctx)
    for (std::uint64_t j = 0; j < K; ++j) ++hk[im.found_ctx[j]];
  else
    for (std::uint64_t j = 0; j < K; ++j) ++hk[im.ctx[im.pos[j]]];
  ContextGroups gs = im.found_groups;
  if (!im.found_ctx) {
    // The groups are chosen from a sample of the contexts (rules::sampled;
    // they only steer the coding, the counts travel nowhere), and every
    // change's. Four tables taken in turn: runs of one context would
    // otherwise wait on each other's increments.
    std::uint64_t hn4[4][256] = {}, hn[256];
    static_assert(rules::kSampleRun % 4 == 0 && rules::kSampleEvery % 4 == 0);
    for (std::uint64_t b = 0; b < im.n; b += rules::kSampleEvery) {
      const std::uint64_t e = std::min(im.n, b + rules::kSampleRun);
      std::uint64_t i = b;
      for (; i + 4 <= e; i += 4)
        for (std::size_t t = 0; t < 4; ++t) hn4[t][im.ctx[i + t]] += rules::kSampleWeight;
      for (; i < e; ++i) hn4[i % 4][im.ctx[i]] += rules::kSampleWeight;
    }
    for (std::size_t c2 = 0; c2 < 256; ++c2) hn[c2] = hn4[0][c2] + hn4[1][c2] + hn4[2][c2] + hn4[3][c2];
    gs = groups_of(hn, hk, im.field);
  }
  const std::size_t G = gs.G;

  std::uint8_t gtab[256];
  for (std::size_t c2 = 0; c2 < 256; ++c2)
    gtab[c2] = static_cast<std::uint8_t>(rules::group_of(static_cast<std::uint8_t>(c2), gs.lo, gs.G));
  std::uint64_t gk[kContextMaxGroups] = {};
  for (std::size_t c2 = 0; c2 < 256; ++c2) gk[gtab[c2]] += hk[c2];
  // Slots group by group; gaps counted among each group's base elements.
  std::uint64_t slot[kContextMaxGroups], start[kContextMaxGroups + 1];
  start[0] = 0;
  for (std::size_t g = 0; g < G; ++g) start[g + 1] = start[g] + gk[g], slot[g] = start[g];
  im.m.resize(K);
  im.s.assign((K + 7) / 8, 0);
  RankJob job{
      im.ctx.get(),  im.n,  im.pos.get(), K,           gtab,          {}, G, slot, im.gaps.get(), im.change_of.get(),
      im.diff.get(), im.es, im.m.data(),  im.s.data(), im.block.get()};
  job.th.n = G - 1;
  for (std::size_t g = 1; g < G; ++g) job.th.t[g - 1] = gs.lo[g];
  if (im.found_ctx)
    place_ranked(job, im.found_ctx, im.found_rank);
  else {
    std::memset(im.ctx.get() + im.n, 0, 64);  // (see Contexts)
    rank_changes(job);
  }

  im.q.resize(K);
  im.r.clear(), im.x.clear(), im.xm.clear();
  im.head.push_back(static_cast<std::uint8_t>(G));
  for (std::size_t g = 1; g < G; ++g) im.head.push_back(gs.lo[g]);
  unsigned rice[kContextMaxGroups];
  std::uint64_t rbits = 0;
  for (std::size_t g = 0; g < G; ++g) {
    rice[g] = choose_rice(im.gaps.get() + start[g], static_cast<std::size_t>(gk[g]));
    rbits += rice[g] * gk[g];
  }
  im.r.resize(static_cast<std::size_t>((rbits + 7) / 8 + 8));
  BitWriter rw{im.r.data()};
  for (std::size_t g = 0; g < G; ++g) {
    const std::uint32_t* gp = im.gaps.get() + start[g];
    const std::size_t cnt = static_cast<std::size_t>(gk[g]);
    const unsigned k = rice[g];
    im.head.push_back(static_cast<std::uint8_t>(k));
    put_varint(im.head, cnt);
    std::uint8_t* qp = im.q.data() + start[g];
    const std::uint32_t low = (std::uint32_t{1} << k) - 1;
    for (std::size_t i = 0; i < cnt; ++i) {
      const std::uint32_t qv = gp[i] >> k;
      qp[i] = static_cast<std::uint8_t>(std::min<std::uint32_t>(qv, 255));
      if (qv >= 255) [[unlikely]]
        put_varint(im.x, qv - 255);
      rw.put(gp[i] & low, k);
    }
  }
  im.r.resize(static_cast<std::size_t>((rbits + 7) / 8));
  // The magnitudes' escapes, in slot order (M and S were written by slot).
  const std::uint64_t ones = element_ones(im.es);
  const std::uint8_t* m = im.m.data();
  for (std::uint64_t s = 0; s < K; ++s)
    if (m[s] == 255) [[unlikely]]
      put_varint(im.xm, signed_value(im.diff[im.change_of[s]], ones).mag_minus1 - 255);
  im.x.insert(im.x.end(), im.xm.begin(), im.xm.end());

  im.frames.clear();
  c.compress_frame(im.q, im.frames, true);
  const std::size_t lq = im.frames.size();
  im.frames.insert(im.frames.end(), im.r.begin(), im.r.end());
  const std::size_t before_m = im.frames.size();
  c.compress_frame(im.m, im.frames);
  const std::size_t lm = im.frames.size() - before_m;
  im.frames.insert(im.frames.end(), im.s.begin(), im.s.end());
  const std::size_t before_x = im.frames.size();
  if (!im.x.empty()) c.compress_frame(im.x, im.frames);
  const std::size_t lx = im.frames.size() - before_x;
  put_varint(im.head, lq);
  put_varint(im.head, lm);
  put_varint(im.head, lx);
  sink(im.head);
  sink(im.frames);
  return im.head.size() + im.frames.size();
}

std::uint64_t encode_context(Compressor& c, std::span<const std::uint8_t> a, std::span<const std::uint8_t> b,
                             std::size_t es, ContextField field, const ByteSink& sink, std::uint64_t* changed) {
  es = sparse_elem_size(es, b.size());
  if (field.bits > 8 || field.shift + field.bits > 8 * es) field = {};
  const std::uint64_t n = b.size() / es;
  const std::uint64_t chunks = sparse_chunk_count(b.size(), es);
  std::uint8_t head[kContextHeadSize];
  context_entry_head(es, b.size(), field, head);
  sink({head, sizeof head});
  std::uint64_t total = sizeof head;
  ContextChunkEncoder enc;
  for (std::uint64_t ch = 0; ch < chunks; ++ch) {
    const std::uint64_t e0 = ch * kContextChunkElements, e1 = std::min(n, e0 + kContextChunkElements);
    enc.begin(es, field);
    enc.scan(a.data() + e0 * es, b.data() + e0 * es, static_cast<std::size_t>(e1 - e0), 0);
    if (changed) *changed += enc.changed_elements();
    total += enc.end(c, sink);
  }
  return total;
}

std::uint64_t encode_context_found(Compressor& c, std::size_t es, std::uint64_t nbytes, ContextField field,
                                   std::span<const FoundChunk> chunks, std::span<const ContextGroups> groups,
                                   const ByteSink& sink) {
  if (es != sparse_elem_size(es, nbytes) || chunks.size() != sparse_chunk_count(nbytes, es) ||
      groups.size() != chunks.size())
    fail(Exit::failure, "context encoder: " + std::to_string(chunks.size()) + " found chunks of " + std::to_string(es) +
                            "-byte elements for a " + std::to_string(nbytes) + "-byte tensor");
  if (field.bits > 8 || field.shift + field.bits > 8 * es) field = {};
  std::uint8_t head[kContextHeadSize];
  context_entry_head(es, nbytes, field, head);
  sink({head, sizeof head});
  std::uint64_t total = sizeof head;
  ContextChunkEncoder enc;
  for (std::size_t ch = 0; ch < chunks.size(); ++ch) {
    enc.begin(es, field);
    enc.take(chunks[ch], groups[ch]);
    total += enc.end(c, sink);
  }
  return total;
}

// ---- decoder ------------------------------------------------------------------

namespace {

struct Head {
  std::uint32_t es = 0;
  std::uint64_t n = 0, chunks = 0;
  ContextField field;
};

Head take_head(EntryCursor& in, std::uint64_t nbytes) {
  const std::uint8_t* h = in.take(kContextHeadSize);
  if (std::memcmp(h, kMagicContext.data(), 4) != 0) in.bad("does not start with HFC1");
  Head r;
  r.es = get_le32(h + 4);
  const std::uint64_t tb = get_le64(h + 8), ce = get_le64(h + 16);
  r.chunks = get_le64(h + 24);
  r.field = {h[32], h[33]};
  if ((r.es != 1 && r.es != 2 && r.es != 4 && r.es != 8) || sparse_elem_size(r.es, nbytes) != r.es)
    in.bad("has element size " + std::to_string(r.es) + ", which does not fit a " + std::to_string(nbytes) +
           "-byte tensor");
  if (tb != nbytes) in.bad("is for a " + std::to_string(tb) + "-byte tensor, the target has " + std::to_string(nbytes));
  if (ce != kContextChunkElements)
    in.bad("has chunks of " + std::to_string(ce) + " elements, not " + std::to_string(kContextChunkElements));
  r.n = nbytes / r.es;
  if (r.chunks != sparse_chunk_count(nbytes, r.es)) in.bad("has an inconsistent chunk table");
  if (r.field.bits > 8 || r.field.shift + r.field.bits > 8 * r.es)
    in.bad("takes its context from bits " + std::to_string(r.field.shift) + "+" + std::to_string(r.field.bits) +
           ", outside a " + std::to_string(r.es) + "-byte element");
  if (r.field.bits == 0) r.field = {};  // as the encoder: no bits, context 0, no shift (it may be 64)
  for (int i = 34; i < 40; ++i)
    if (h[i]) in.bad("has nonzero reserved bytes");
  return r;
}

// Changes handed to the patch callback per call, at most.
constexpr std::size_t kHandOut = 16 * 1024;

static_assert(kBlock <= kHandOut, "a block's changes fit one hand-out");

// Decompression contexts and buffers, per thread (reused from chunk to chunk).
struct ContextScratch {
  Decompressor dq, dm, dx;
  std::vector<std::uint8_t> q, m, x;
  std::vector<std::uint32_t> gaps;
  std::vector<std::uint64_t> escm;  // M's escapes, in slot order
  std::vector<std::uint64_t> offs;
  std::vector<std::uint8_t> vals, ctx;
  std::unique_ptr<Block> block;
  static ContextScratch& get() {
    thread_local ContextScratch s;
    return s;
  }
};

// One chunk, parsed and its streams decoded: everything but the walk over
// the base.
struct Chunk {
  std::uint64_t index = 0, e0 = 0, e1 = 0, K = 0;
  std::size_t G = 1;
  std::uint8_t lo[kContextMaxGroups] = {};  // each group's first context
  std::uint64_t count[kContextMaxGroups] = {}, start[kContextMaxGroups + 1] = {}, esc_start[kContextMaxGroups + 1] = {};
  const std::uint8_t* signs = nullptr;
};

[[noreturn]] void bad_chunk(const EntryCursor& in, std::uint64_t ch, const std::string& msg) {
  in.bad("chunk " + std::to_string(ch) + " " + msg);
}

// Decodes a zstd frame that must hold exactly `len` bytes into `out`.
void read_frame(Decompressor& d, std::span<const std::uint8_t> f, std::uint64_t len, std::vector<std::uint8_t>& out,
                const std::string& what) {
  check_declared_size(f, len, what);
  out.resize(static_cast<std::size_t>(len));
  FrameReader fr(d, f, what);
  fr.read(out.data(), out.size());
  fr.expect_end();
}

// The padding bits after the last `bits` of a packed stream are zero.
void check_padding(const EntryCursor& in, std::uint64_t ch, const std::uint8_t* p, std::uint64_t bits,
                   const char* name) {
  if (bits % 8 && (p[bits / 8] >> (bits % 8))) bad_chunk(in, ch, std::string("has nonzero padding after its ") + name);
}

Chunk take_chunk(EntryCursor& in, const Head& h, std::uint64_t ch, ContextScratch& s, bool decode) {
  Chunk c;
  c.index = ch;
  c.e0 = ch * kContextChunkElements, c.e1 = std::min(h.n, c.e0 + kContextChunkElements);
  const std::uint64_t span = c.e1 - c.e0;
  c.K = in.varint();
  if (c.K > span) bad_chunk(in, ch, "declares more changes than it has elements");
  if (c.K == 0) return c;
  c.G = in.byte();
  if (c.G < 1 || c.G > kContextMaxGroups) bad_chunk(in, ch, "has " + std::to_string(c.G) + " context groups (1 to 16)");
  const std::uint32_t contexts = 1u << h.field.bits;
  for (std::size_t g = 1; g < c.G; ++g) {
    c.lo[g] = in.byte();
    if (c.lo[g] <= c.lo[g - 1] || c.lo[g] >= contexts)
      bad_chunk(in, ch, "has context thresholds out of order or range");
  }
  unsigned rice[kContextMaxGroups];
  std::uint64_t rbits = 0;
  for (std::size_t g = 0; g < c.G; ++g) {
    rice[g] = in.byte();
    if (rice[g] > kMaxRice) bad_chunk(in, ch, "has Rice parameter " + std::to_string(rice[g]));
    c.count[g] = in.varint();
    if (c.count[g] > c.K - c.start[g]) bad_chunk(in, ch, "has group counts that exceed its changes");
    c.start[g + 1] = c.start[g] + c.count[g];
    rbits += rice[g] * c.count[g];
  }
  if (c.start[c.G] != c.K) bad_chunk(in, ch, "has group counts that do not sum to its changes");
  const std::uint64_t lq = in.varint(), lm = in.varint(), lx = in.varint();
  const std::span<const std::uint8_t> fq(in.take(lq), lq);
  const std::uint8_t* r = in.take((rbits + 7) / 8);
  const std::span<const std::uint8_t> fm(in.take(lm), lm);
  c.signs = in.take((c.K + 7) / 8);
  const std::span<const std::uint8_t> fx(in.take(lx), lx);
  check_padding(in, ch, r, rbits, "gap bits");
  check_padding(in, ch, c.signs, c.K, "sign bits");
  if (!decode) {
    // Stepping over another caller's chunk: its frames are checked by that caller.
    return c;
  }
  const std::string cw = in.what + ": context chunk " + std::to_string(ch);
  read_frame(s.dq, fq, c.K, s.q, cw + " quotients");
  read_frame(s.dm, fm, c.K, s.m, cw + " magnitudes");
  const std::uint64_t escapes = static_cast<std::uint64_t>(std::count(s.q.begin(), s.q.end(), 255)) +
                                static_cast<std::uint64_t>(std::count(s.m.begin(), s.m.end(), 255));
  s.x.clear();
  if (escapes == 0) {
    if (lx) bad_chunk(in, ch, "has an escape frame but no escapes");
  } else {
    if (!lx) bad_chunk(in, ch, "has escapes but no escape frame");
    // An escape is a varint of at most 10 bytes: bounded by the chunk's own changes.
    const std::uint64_t most = 10 * escapes;
    const unsigned long long cs = ZSTD_getFrameContentSize(fx.data(), fx.size());
    if (cs == ZSTD_CONTENTSIZE_ERROR) bad_chunk(in, ch, "has an escape frame that is not a zstd frame");
    if (cs != ZSTD_CONTENTSIZE_UNKNOWN && cs > most) bad_chunk(in, ch, "has more escape bytes than its escapes need");
    FrameReader fr(s.dx, fx, cw + " escapes");
    for (std::span<const std::uint8_t> p; !(p = fr.next()).empty();) {
      if (s.x.size() + p.size() > most) bad_chunk(in, ch, "has more escape bytes than its escapes need");
      s.x.insert(s.x.end(), p.begin(), p.end());
    }
    fr.expect_end();
  }
  const std::string xw = cw + " escapes";
  EntryCursor xs{s.x, xw, "context entry"};
  // Gaps, group by group; each group's changes must fit the chunk.
  s.gaps.resize(static_cast<std::size_t>(c.K));
  std::uint32_t* const gaps = s.gaps.data();
  const std::uint8_t* const q = s.q.data();
  BitReader rb{r, static_cast<std::size_t>((rbits + 7) / 8)};
  for (std::size_t g = 0; g < c.G; ++g) {
    std::uint64_t used = 0;
    const unsigned k = rice[g];
    const std::uint64_t most_q = span >> k;
    for (std::uint64_t i = c.start[g]; i < c.start[g + 1]; ++i) {
      std::uint64_t qv = q[i];
      if (qv == 255) [[unlikely]] {
        const std::uint64_t e = xs.varint();
        if (e > span) bad_chunk(in, ch, "has a gap longer than the chunk");
        qv += e;
      }
      const std::uint64_t low = rb.get(k);
      if (qv > most_q) bad_chunk(in, ch, "has a gap longer than the chunk");
      const std::uint64_t gap = qv << k | low;
      used += gap + 1;
      if (used > span) bad_chunk(in, ch, "names more elements in a context group than the chunk has");
      gaps[i] = static_cast<std::uint32_t>(gap);
    }
  }
  // Magnitudes' escapes, and where each group's begin. Wider than one byte,
  // an element takes any magnitude below 257 either way: only escapes are
  // checked.
  s.escm.clear();
  const std::uint64_t top = element_ones(h.es);
  const std::uint64_t most_neg = top / 2 + 1;  // |most negative difference|
  const std::uint8_t* const m = s.m.data();
  auto value = [&](std::uint64_t i) {
    std::uint64_t mag = m[i] + std::uint64_t{1};
    if (m[i] == 255) {
      const std::uint64_t e = xs.varint();
      // (1-byte elements have no magnitudes of 256 or more: top - 256 would wrap.)
      if (top < 256 || e > top - 256) bad_chunk(in, ch, "has a value wider than its elements");
      mag = 256 + e;
      s.escm.push_back(mag);
    }
    const bool neg = (c.signs[i / 8] >> (i % 8)) & 1;
    if (mag > (neg ? most_neg : most_neg - 1)) bad_chunk(in, ch, "has a value wider than its elements");
  };
  for (std::size_t g = 0; g < c.G; ++g) {
    c.esc_start[g] = s.escm.size();
    if (h.es == 1) {
      for (std::uint64_t i = c.start[g]; i < c.start[g + 1]; ++i) value(i);
      continue;
    }
    const std::uint8_t* const end = m + c.start[g + 1];
    for (const std::uint8_t* at = m + c.start[g];
         (at = static_cast<const std::uint8_t*>(std::memchr(at, 255, static_cast<std::size_t>(end - at)))); ++at)
      value(static_cast<std::uint64_t>(at - m));
  }
  c.esc_start[c.G] = s.escm.size();
  if (xs.at != s.x.size()) bad_chunk(in, ch, "has escape bytes left over");
  return c;
}

// Walks chunk `c` over its base elements, handing `patch` the changes of each
// piece of base before asking for the next, in element order. A piece goes
// in blocks of kBlockWords words of 64 elements, in passes with no branch on
// the data per element or per word (a group's next change lies anywhere, so
// such branches are mispredicted about once a change):
//   1. classify: each group's elements in each word as a mask, and how many
//      the group has in the block's earlier words;
//   2. find: each group's changes in the block, its next change's rank among
//      the group's elements giving its word (the counts compared with the
//      rank at once) and its bit in that word's mask (the rank's set bit);
//      each change found is marked in a bitmap of the block;
//   3. hand out: each change's place in element order, counted from the marks.
struct Walk {
  const Chunk& c;
  const Head& h;
  const std::string& what;
  ContextScratch& s;
  const BaseView& base;
  const SparsePatch& patch;
};

// Every group's changes were found among the chunk's base elements.
void check_walked(const Walk& w, const std::uint64_t* next) {
  const Chunk& c = w.c;
  for (std::size_t g = 0; g < c.G; ++g)
    if (next[g] != c.start[g + 1])
      fail(Exit::verify_failed, w.what + ": context entry chunk " + std::to_string(c.index) + " names " +
                                    std::to_string(c.count[g]) + " changes in context group " + std::to_string(g) +
                                    ", but the base has room for " + std::to_string(next[g] - c.start[g]) +
                                    " there: these bytes are not the entry's base, or the entry is damaged");
}

template <std::size_t ES, int L, std::size_t NT>
[[gnu::always_inline]] inline void walk_body(const Walk& w) {
  const Chunk& c = w.c;
  ContextScratch& s = w.s;
  Block& b = *s.block;
  std::uint64_t rem[kContextMaxGroups], next[kContextMaxGroups], esc[kContextMaxGroups];
  for (std::size_t g = 0; g < c.G; ++g) {
    next[g] = c.start[g];
    esc[g] = c.esc_start[g];
    rem[g] = c.count[g] ? s.gaps[static_cast<std::size_t>(c.start[g])] : kNone;
  }
  Thresholds th;
  th.n = c.G - 1;
  for (std::size_t g = 1; g < c.G; ++g) th.t[g - 1] = c.lo[g];
  constexpr std::size_t kPiece = kContextWindow / ES;
  std::memset(b.hit, 0, sizeof b.hit);
  for (std::uint64_t e = c.e0; e < c.e1;) {
    const std::size_t cnt = static_cast<std::size_t>(std::min<std::uint64_t>(kPiece, c.e1 - e));
    const std::span<const std::uint8_t> piece = w.base(e * ES, cnt * ES);
    if (piece.size() != cnt * ES) fail(Exit::failure, w.what + ": context decoder was given a short piece of base");
    // 2-byte elements in the x86-64-v3 build: their contexts straight from
    // the base, not stored and read again.
    constexpr bool kDirect = ES == 2 && L == 1;
    if constexpr (!kDirect) {
      contexts_of<ES, L>(piece.data(), cnt, w.h.field.shift, (std::uint64_t{1} << w.h.field.bits) - 1, s.ctx.data());
      std::memset(s.ctx.data() + cnt, 0, 64);  // (see Contexts)
    }
    std::size_t out = 0;
    for (std::size_t b0 = 0; b0 < cnt; b0 += kBlock) {
      const std::size_t len = std::min(kBlock, cnt - b0);
      if constexpr (kDirect)
        classify<L, NT>(Contexts{nullptr, piece.data() + b0 * ES, w.h.field}, len, th, b);
      else
        classify<L, NT>(Contexts{s.ctx.data() + b0, nullptr, {}}, len, th, b);  // s.ctx has 64 bytes of slack
      std::size_t found = 0;
      for (std::size_t g = 0; g < c.G; ++g) {
        std::uint64_t r = rem[g];
        const std::uint64_t total = b.group_total(g);
        if (r < total) {
          std::uint64_t nx = next[g], ex = esc[g];
          const std::uint64_t end = c.start[g + 1];
          do {  // r: the rank of the group's change nx among its elements in the block
            const std::size_t wd = word_of<L>(b, g, r);
            const unsigned bit = select_bit<L>(b.group_mask(g, wd), r - b.group_before(g, wd));
            b.hit[wd] |= std::uint64_t{1} << bit;
            const std::uint8_t sym = s.m[static_cast<std::size_t>(nx)];
            const std::uint64_t mag = sym == 255 ? s.escm[static_cast<std::size_t>(ex++)] : sym + std::uint64_t{1};
            const std::uint64_t neg = (c.signs[nx / 8] >> (nx % 8)) & 1;
            b.at[found] = static_cast<std::uint16_t>(64 * wd + bit);
            b.zz[found] = 2 * mag - neg;  // zigzag of the signed difference
            ++found;
            ++nx;
            r = nx < end ? r + s.gaps[static_cast<std::size_t>(nx)] + 1 : kNone;
          } while (r < total);
          next[g] = nx;
          esc[g] = ex;
        }
        rem[g] = r - total;  // (kNone stays above any block's total)
      }
      if (out + found > kHandOut) {  // a batch at a time: the piece is still the caller's to patch
        w.patch({s.offs.data(), out}, {s.vals.data(), out * ES}, ES, SparseOp::add_zigzag);
        out = 0;
      }
      // Each word's first place, then each change's: its word's place and
      // the changes marked before it in the word.
      std::size_t place[kBlockWords];
      std::uint64_t hit[kBlockWords];
      const std::size_t words = (len + 63) / 64;
      for (std::size_t wd = 0, p = out; wd < words; ++wd) {
        place[wd] = p;
        hit[wd] = b.hit[wd];
        b.hit[wd] = 0;  // for the next block
        p += static_cast<std::size_t>(std::popcount(hit[wd]));
      }
      std::uint64_t* const offs = s.offs.data();
      std::uint8_t* const vals = s.vals.data();
      for (std::size_t i = 0; i < found; ++i) {
        const std::size_t at = b.at[i], wd = at / 64;
        const std::size_t k =
            place[wd] + static_cast<std::size_t>(std::popcount(hit[wd] & ((std::uint64_t{1} << (at % 64)) - 1)));
        offs[k] = (e + b0 + at) * ES;
        std::memcpy(vals + k * ES, &b.zz[i], ES);
      }
      out += found;
    }
    if (out) w.patch({s.offs.data(), out}, {s.vals.data(), out * ES}, ES, SparseOp::add_zigzag);
    e += cnt;
  }
  check_walked(w, next);
}

// The shape for the chunk's group count (as rank_changes_shaped), in the
// build of level L.
template <std::size_t ES, int L>
[[gnu::always_inline]] inline void walk_shaped(const Walk& w) {
  if (w.c.G == kEncoderGroups) return walk_body<ES, L, kEncoderGroups - 1>(w);
  walk_body<ES, L, kAnyNT>(w);
}

#if HFDELTA_HAVE_V3
template <std::size_t ES>
HFDELTA_V3 void walk_v3(const Walk& w) {
  walk_shaped<ES, 1>(w);
}
template <std::size_t ES>
HFDELTA_V4 void walk_v4(const Walk& w) {
  walk_shaped<ES, 2>(w);
}
#endif
template <std::size_t ES>
void walk_base(const Walk& w) {
  walk_shaped<ES, 0>(w);
}

// The walk as the format describes it, an element at a time: each element's
// group, and each group's count down to its next change. What the walks
// above must hand out exactly (the tests compare them).
template <std::size_t ES>
void walk_reference(const Walk& w) {
  const Chunk& c = w.c;
  ContextScratch& s = w.s;
  std::uint64_t rem[kContextMaxGroups], next[kContextMaxGroups], esc[kContextMaxGroups];
  for (std::size_t g = 0; g < c.G; ++g) {
    next[g] = c.start[g];
    esc[g] = c.esc_start[g];
    rem[g] = c.count[g] ? s.gaps[static_cast<std::size_t>(c.start[g])] : kNone;
  }
  constexpr std::size_t kPiece = kContextWindow / ES;
  for (std::uint64_t e = c.e0; e < c.e1;) {
    const std::size_t cnt = static_cast<std::size_t>(std::min<std::uint64_t>(kPiece, c.e1 - e));
    const std::span<const std::uint8_t> piece = w.base(e * ES, cnt * ES);
    if (piece.size() != cnt * ES) fail(Exit::failure, w.what + ": context decoder was given a short piece of base");
    std::size_t out = 0;
    for (std::size_t i = 0; i < cnt; ++i) {
      const std::uint8_t ctx = rules::context_of(load_elem<ES>(piece.data() + i * ES), w.h.field);
      const unsigned g = rules::group_of(ctx, c.lo, static_cast<unsigned>(c.G));
      if (rem[g]) {
        --rem[g];
        continue;
      }
      const std::uint64_t slot = next[g]++;
      const std::uint8_t sym = s.m[static_cast<std::size_t>(slot)];
      const std::uint64_t mag = sym == 255 ? s.escm[static_cast<std::size_t>(esc[g]++)] : sym + std::uint64_t{1};
      const std::uint64_t zz = 2 * mag - ((c.signs[slot / 8] >> (slot % 8)) & 1);
      s.offs[out] = (e + i) * ES;
      std::memcpy(s.vals.data() + out * ES, &zz, ES);
      if (++out == kHandOut) {
        w.patch({s.offs.data(), out}, {s.vals.data(), out * ES}, ES, SparseOp::add_zigzag);
        out = 0;
      }
      rem[g] = next[g] < c.start[g + 1] ? s.gaps[static_cast<std::size_t>(next[g])] : kNone;
    }
    if (out) w.patch({s.offs.data(), out}, {s.vals.data(), out * ES}, ES, SparseOp::add_zigzag);
    e += cnt;
  }
  check_walked(w, next);
}
bool g_reference_walk = false;  // a test's choice (context_reference_walk)

template <std::size_t ES>
void walk_chunk(const Chunk& c, const Head& h, const std::string& what, ContextScratch& s, const BaseView& base,
                const SparsePatch& patch) {
  constexpr std::size_t kPiece = kContextWindow / ES;
  s.offs.resize(kHandOut);
  s.vals.resize(kHandOut * ES);
  s.ctx.resize(kPiece + 64);
  if (!s.block) s.block = std::make_unique<Block>();
  const Walk w{c, h, what, s, base, patch};
  if (g_reference_walk) return walk_reference<ES>(w);
#if HFDELTA_HAVE_V3
  if (g_level >= 2) return walk_v4<ES>(w);
  if (g_level == 1) return walk_v3<ES>(w);
#endif
  walk_base<ES>(w);
}

}  // namespace

bool context_reference_walk(int on) {
  if (on >= 0) g_reference_walk = on != 0;
  return g_reference_walk;
}

void decode_context_chunks(std::span<const std::uint8_t> entry, std::uint64_t nbytes, std::uint64_t first,
                           std::uint64_t last, const std::string& what, const BaseView& base,
                           const SparsePatch& patch) {
  EntryCursor in{entry, what, "context entry"};
  const Head h = take_head(in, nbytes);
  ContextScratch& s = ContextScratch::get();
  for (std::uint64_t ch = 0; ch < h.chunks; ++ch) {
    const bool mine = ch >= first && ch < last;
    const Chunk c = take_chunk(in, h, ch, s, mine);
    if (!mine || c.K == 0) continue;
    switch (h.es) {
      case 1:
        walk_chunk<1>(c, h, what, s, base, patch);
        break;
      case 2:
        walk_chunk<2>(c, h, what, s, base, patch);
        break;
      case 4:
        walk_chunk<4>(c, h, what, s, base, patch);
        break;
      default:
        walk_chunk<8>(c, h, what, s, base, patch);
        break;
    }
  }
  if (in.at != entry.size()) in.bad("is followed by " + std::to_string(entry.size() - in.at) + " extra bytes");
}

void decode_context(std::span<const std::uint8_t> entry, std::uint64_t nbytes, const std::string& what,
                    const BaseView& base, const SparsePatch& patch) {
  decode_context_chunks(entry, nbytes, 0, ~0ull, what, base, patch);
}

ContextSummary check_context(std::span<const std::uint8_t> entry, std::uint64_t nbytes, const std::string& what) {
  EntryCursor in{entry, what, "context entry"};
  const Head h = take_head(in, nbytes);
  ContextScratch& s = ContextScratch::get();
  ContextSummary r;
  r.chunks = h.chunks;
  r.elem_size = h.es;
  r.field = h.field;
  for (std::uint64_t ch = 0; ch < h.chunks; ++ch) r.changes += take_chunk(in, h, ch, s, true).K;
  if (in.at != entry.size()) in.bad("is followed by " + std::to_string(entry.size() - in.at) + " extra bytes");
  return r;
}

}  // namespace hfdelta
