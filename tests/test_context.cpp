// The context encoding: round trips on each context edge case (zero,
// subnormal, inf/NaN bases, exponent changes, sign flips, every element size,
// non-float dtypes), chunks decoded apart, a base that is not the entry's, and
// hostile entries that must be refused without a crash.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "codec/codec.hpp"
#include "codec/codec_internal.hpp"
#include "hfdelta/error.hpp"

using namespace hfdelta;
using Bytes = std::vector<std::uint8_t>;

namespace {

Bytes encode(const Bytes& a, const Bytes& b, std::size_t es, ContextField f) {
  Compressor c(3);
  Bytes out;
  const std::uint64_t n = encode_context(
      c, a, b, es, f, [&](std::span<const std::uint8_t> s) { out.insert(out.end(), s.begin(), s.end()); });
  CHECK(n == out.size());
  return out;
}

Bytes encode_sparse_entry(const Bytes& a, const Bytes& b, std::size_t es) {
  Compressor c(3);
  Bytes out;
  encode_sparse(c, a, b, es, [&](std::span<const std::uint8_t> s) { out.insert(out.end(), s.begin(), s.end()); });
  return out;
}

// Decodes chunks [c0, c1) of `entry` against `a` and applies them to a copy,
// checking the base pieces asked for and the changes handed out.
Bytes patched(const Bytes& a, const Bytes& entry, std::uint64_t c0 = 0, std::uint64_t c1 = ~0ull) {
  Bytes r = a;
  std::uint64_t asked = 0, piece_end = 0, last = 0;
  bool first = true, ok = true;  // one check at the end: doctest's per-change checks would dominate
  const BaseView base = [&](std::uint64_t off, std::size_t n) {
    REQUIRE((off >= asked && n <= kContextWindow && off + n <= a.size()));
    asked = off + n;
    piece_end = off + n;
    return std::span<const std::uint8_t>(a.data() + off, n);
  };
  decode_context_chunks(
      entry, a.size(), c0, c1, "test", base,
      [&](std::span<const std::uint64_t> offs, std::span<const std::uint8_t> x, std::size_t es, SparseOp op) {
        REQUIRE((op == SparseOp::add_zigzag && x.size() == offs.size() * es));
        for (std::size_t i = 0; i < offs.size(); ++i) {
          // within the piece just read, whole elements, ascending
          ok = ok && offs[i] + es <= piece_end && offs[i] % es == 0 && (first || offs[i] > last);
          if (offs[i] + es > r.size()) FAIL("change past the tensor's end");
          first = false;
          last = offs[i];
          sparse_apply_value(r.data() + offs[i], x.data() + i * es, es, op);
        }
      });
  CHECK(ok);
  return r;
}

void round_trip(const Bytes& a, const Bytes& b, std::size_t es, ContextField f) {
  const Bytes e = encode(a, b, es, f);
  CHECK(patched(a, e) == b);
  const ContextSummary s = check_context(e, a.size(), "test");
  CHECK(s.changes == count_changes(a, b, s.elem_size).elements);
}

std::uint16_t bf16(float v) {
  std::uint32_t u;
  std::memcpy(&u, &v, 4);
  return static_cast<std::uint16_t>(u >> 16);
}

template <class T>
Bytes bytes_of(const std::vector<T>& v) {
  Bytes r(v.size() * sizeof(T));
  std::memcpy(r.data(), v.data(), r.size());
  return r;
}

// A bf16 weight tensor and one optimizer-like step: small elements move by
// one unit in the last place far more often than large ones.
std::pair<Bytes, Bytes> bf16_step(std::size_t n, std::uint32_t seed, double lr = 2e-5) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> w(0, 0.02f);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<std::uint16_t> a(n), b(n);
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = bf16(w(rng));
    const int ex = (a[i] >> 7) & 0xFF;
    const double ulp = std::ldexp(1.0, ex - 127 - 7);
    b[i] = a[i];
    if (u(rng) < std::min(1.0, lr / ulp)) b[i] = static_cast<std::uint16_t>(a[i] + (u(rng) < 0.5 ? 1 : -1));
  }
  return {bytes_of(a), bytes_of(b)};
}

// The group count of each chunk with changes of a context entry (its own
// parse of the layout in docs/format.md, not the decoder's).
std::vector<unsigned> chunk_groups(const Bytes& e) {
  std::size_t at = kContextHeadSize;
  auto varint = [&] {
    std::uint64_t v = 0;
    for (int sh = 0;; sh += 7) {
      const std::uint8_t c = e.at(at++);
      v |= std::uint64_t(c & 0x7f) << sh;
      if (!(c & 0x80)) return v;
    }
  };
  std::uint64_t chunks;
  std::memcpy(&chunks, e.data() + 24, 8);
  std::vector<unsigned> gs;
  for (std::uint64_t c = 0; c < chunks; ++c) {
    const std::uint64_t K = varint();
    if (!K) continue;
    const unsigned G = e.at(at++);
    gs.push_back(G);
    at += G - 1;
    std::uint64_t rbits = 0;
    for (unsigned g = 0; g < G; ++g) {
      const unsigned k = e.at(at++);
      rbits += k * varint();
    }
    const std::uint64_t lq = varint(), lm = varint(), lx = varint();
    at += lq + (rbits + 7) / 8 + lm + (K + 7) / 8 + lx;
  }
  REQUIRE(at == e.size());
  return gs;
}

}  // namespace

TEST_CASE("context: the field is the exponent of float dtypes, none for the rest") {
  CHECK(context_field("BF16", 2).shift == 7);
  CHECK(context_field("BF16", 2).bits == 8);
  CHECK(context_field("F16", 2).bits == 5);
  CHECK(context_field("F32", 4).shift == 23);
  CHECK(context_field("F64", 8).shift == 55);
  CHECK(context_field("F8_E4M3", 1).bits == 4);
  CHECK(context_field("F8_E5M2", 1).bits == 5);
  CHECK(context_field("I32", 4).bits == 0);
  CHECK(context_field("U8", 1).bits == 0);
  CHECK(context_field("BOOL", 1).bits == 0);
  CHECK(context_field("BF16", 1).bits == 0);  // an element size that does not fit the dtype
}

TEST_CASE("context: a bf16 optimizer step round-trips and is smaller than sparse") {
  auto [a, b] = bf16_step(300000, 1);
  const Bytes e = encode(a, b, 2, context_field("BF16", 2));
  CHECK(patched(a, e) == b);
  const Bytes sp = encode_sparse_entry(a, b, 2);
  INFO("context " << e.size() << " sparse " << sp.size());
  CHECK(e.size() < sp.size() * 9 / 10);
}

TEST_CASE("context: every build of the loops (baseline, x86-64-v3, AVX-512BW) writes and reads the same bytes") {
  const int widest = context_isa_level();
  INFO("widest build on this CPU: " << widest);
  // Two chunks and a tail that is not a whole block of 64, steps dense enough
  // for several groups, and every element size with a field. The rank pass
  // has a shape for chunks of the encoder's most groups and one for the
  // rest: the first chunk has the most, the tail fewer.
  auto [a, b] = bf16_step(kContextChunkElements + 1000 + 37, 7, 2e-4);
  {
    const std::vector<unsigned> gs = chunk_groups(encode(a, b, 2, context_field("BF16", 2)));
    REQUIRE(gs.size() == 2);
    CHECK(gs[0] == 8);
    CHECK(gs[1] < 8);
  }
  std::vector<float> fa(70001), fb(70001);
  std::mt19937 rng(3);
  std::normal_distribution<float> w(0, 0.02f);
  for (std::size_t i = 0; i < fa.size(); ++i) fa[i] = w(rng), fb[i] = i % 7 ? fa[i] : fa[i] * 1.0001f;
  const Bytes a4 = bytes_of(fa), b4 = bytes_of(fb);
  Bytes a1(5000), b1(5000);
  for (std::size_t i = 0; i < a1.size(); ++i)
    a1[i] = static_cast<std::uint8_t>(rng()), b1[i] = i % 5 ? a1[i] : static_cast<std::uint8_t>(a1[i] + 1);
  std::vector<Bytes> first;
  for (int level = 0; level <= widest; ++level) {
    CAPTURE(level);
    REQUIRE(context_isa_level(level) == level);
    const std::vector<Bytes> entries = {encode(a, b, 2, context_field("BF16", 2)),
                                        encode(a4, b4, 4, context_field("F32", 4)),
                                        encode(a1, b1, 1, context_field("F8_E4M3", 1))};
    CHECK(patched(a, entries[0]) == b);
    CHECK(patched(a4, entries[1]) == b4);
    CHECK(patched(a1, entries[2]) == b1);
    if (level == 0)
      first = entries;
    else
      CHECK(entries == first);
  }
  context_isa_level(widest);
  CHECK(context_isa_level() == widest);
}

TEST_CASE("context: unchanged, empty, one element, every element changed") {
  const ContextField f = context_field("BF16", 2);
  Bytes a(2000), b;
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<std::uint8_t>(i * 7);
  round_trip(a, a, 2, f);
  round_trip({}, {}, 2, f);
  round_trip({1, 2}, {1, 3}, 2, f);
  b = a;
  for (auto& x : b) x = static_cast<std::uint8_t>(x + 1);
  round_trip(a, b, 2, f);
  const Bytes e = encode(a, a, 2, f);
  CHECK(e.size() == kContextHeadSize + 1);  // one chunk, no changes: a single varint
}

TEST_CASE("context: zero, subnormal, inf and NaN bases, exponent changes and sign flips") {
  const ContextField f = context_field("F32", 4);
  std::vector<float> a, b;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float sub = std::numeric_limits<float>::denorm_min();
  const std::vector<std::pair<float, float>> cases = {
      {0.0f, 1e-30f},      {-0.0f, 0.0f},   {0.0f, -0.0f},                    // zero bases, and a zero's sign flip
      {sub, 2 * sub},      {sub * 3, 0.0f}, {1e-39f, 1e-38f},                 // subnormal bases, into the normal range
      {inf, 1.0f},         {-inf, inf},     {nan, 2.0f},        {1.0f, nan},  // inf and NaN bases and targets
      {1.0f, 0.99999994f}, {0.5f, 1.0f},    {1.9999999f, 2.0f},               // exponent changes both ways
      {1.5f, -1.5f},       {-3.0f, 3.0f},   {1e-20f, -1e20f},                 // sign flips, near and far
  };
  for (int rep = 0; rep < 50; ++rep)
    for (auto [x, y] : cases) {
      a.push_back(x * (rep % 2 ? 1.0f : 1.0f));
      b.push_back(rep % 3 ? y : x);  // some unchanged, so gaps are not all zero
    }
  round_trip(bytes_of(a), bytes_of(b), 4, f);
}

TEST_CASE("context: every element size, and non-float dtypes") {
  std::mt19937_64 rng(7);
  for (std::size_t es : {1u, 2u, 4u, 8u}) {
    CAPTURE(es);
    Bytes a(es * 50000), b;
    for (auto& x : a) x = static_cast<std::uint8_t>(rng());
    b = a;
    for (std::size_t i = 0; i < 2000; ++i) {
      const std::size_t e = (rng() % (a.size() / es)) * es;
      for (std::size_t k = 0; k < es; ++k)
        b[e + k] = static_cast<std::uint8_t>(rng());  // any difference, wide ones too
    }
    // An exponent-like field of each size, and none (integers, bool).
    const ContextField fields[] = {
        {}, {static_cast<std::uint8_t>(8 * es - (es == 1 ? 5 : 9)), static_cast<std::uint8_t>(es == 1 ? 4 : 8)}};
    for (const ContextField f : fields) round_trip(a, b, es, f);
  }
}

TEST_CASE("context: the most negative and most positive differences, and escapes") {
  for (std::size_t es : {1u, 2u, 4u, 8u}) {
    CAPTURE(es);
    Bytes a(es * 4000, 0), b = a;
    // new - old = -2^(8es-1) at element 0, 2^(8es-1) - 1 at element 1, and
    // a lone change after a long unchanged run (a gap that escapes).
    b[es - 1] = 0x80;
    for (std::size_t k = 0; k < es; ++k) b[es + k] = k + 1 == es ? 0x7f : 0xff;
    b[es * 3999] = 1;
    round_trip(a, b, es, {});
  }
}

TEST_CASE("context: tensors of several chunks, and chunks decoded apart") {
  auto [a, b] = bf16_step(kContextChunkElements * 2 + 12345, 3);
  const Bytes e = encode(a, b, 2, context_field("BF16", 2));
  CHECK(patched(a, e) == b);
  // Chunk by chunk, each decoded apart, gives the same bytes.
  Bytes r = a;
  for (std::uint64_t c = 0; c < 3; ++c) {
    const Bytes part = patched(a, e, c, c + 1);
    const std::uint64_t lo = c * kContextChunkElements * 2,
                        hi = std::min<std::uint64_t>(a.size(), lo + kContextChunkElements * 2);
    std::copy(part.begin() + static_cast<std::ptrdiff_t>(lo), part.begin() + static_cast<std::ptrdiff_t>(hi),
              r.begin() + static_cast<std::ptrdiff_t>(lo));
  }
  CHECK(r == b);
  // An odd byte count falls back to one-byte elements.
  Bytes a3(a.begin(), a.begin() + 30001), b3(b.begin(), b.begin() + 30001);
  round_trip(a3, b3, 2, context_field("BF16", 2));
}

TEST_CASE("context: a base that is not the entry's is refused or decodes to other bytes") {
  auto [a, b] = bf16_step(200000, 5);
  const Bytes e = encode(a, b, 2, context_field("BF16", 2));
  // Another tensor as base: its contexts hold other counts, so the decoder
  // runs out of elements in some group (refused) or patches other bytes
  // (caught by the checksums that every apply checks).
  auto [other, unused] = bf16_step(200000, 6);
  try {
    const Bytes r = patched(other, e);
    CHECK(r != b);
  } catch (const Error& err) {
    CHECK(err.code() == Exit::verify_failed);
    CHECK(std::string(err.what()).find("not the entry's base") != std::string::npos);
  }
  // A base of all zeros: one context, fewer elements than the groups name.
  const Bytes zeros(a.size(), 0);
  CHECK_THROWS_AS(patched(zeros, e), Error);
}

TEST_CASE("context: hostile entries are refused with bad_input, never crash") {
  auto [a, b] = bf16_step(20000, 9, 1e-4);
  const Bytes e = encode(a, b, 2, context_field("BF16", 2));
  REQUIRE(patched(a, e) == b);
  // Truncated anywhere.
  for (std::size_t len = 0; len < e.size(); len += 1 + len / 16) {
    const Bytes t(e.begin(), e.begin() + static_cast<std::ptrdiff_t>(len));
    CHECK_THROWS_AS(check_context(t, a.size(), "t"), Error);
  }
  // Every byte flipped in turn: refused with bad_input, or decoded to some
  // bytes (which an apply's checksums then refuse); check and decode agree
  // on what they refuse without the base.
  std::size_t refused = 0;
  for (std::size_t i = 0; i < e.size(); ++i) {
    Bytes t = e;
    t[i] ^= static_cast<std::uint8_t>(1 + i % 255);
    bool check_ok = true;
    try {
      check_context(t, a.size(), "t");
    } catch (const Error& err) {
      CHECK(err.code() == Exit::bad_input);
      check_ok = false;
    }
    try {
      patched(a, t);
      CHECK(check_ok);
    } catch (const Error& err) {
      // bad_input: what check finds too; verify_failed: what only the base shows.
      CHECK((err.code() == Exit::bad_input ? !check_ok : (err.code() == Exit::verify_failed && check_ok)));
      ++refused;
    }
  }
  CHECK(refused > e.size() / 4);  // flips in the raw gap and sign bits decode to other changes
  // A head for another tensor size, or a field outside the element.
  Bytes t = e;
  put_le64(t.data() + 8, a.size() + 2);
  CHECK_THROWS_AS(check_context(t, a.size(), "t"), Error);
  t = e;
  t[32] = 12;  // shift 12 + 8 bits > 16
  CHECK_THROWS_AS(check_context(t, a.size(), "t"), Error);
}

namespace {

// A context entry with the groups given, not the encoder's choice: every
// chunk's changes found and ranked here, element by element, and coded by
// encode_context_found (which takes any 1 to 16 groups).
Bytes encode_grouped(const Bytes& a, const Bytes& b, std::size_t es, ContextField f, const ContextGroups& groups) {
  const std::uint64_t n = a.size() / es, chunks = (n + kContextChunkElements - 1) / kContextChunkElements;
  std::vector<std::vector<std::uint32_t>> pos(chunks), rank(chunks);
  std::vector<Bytes> diff(chunks), ctx(chunks);
  std::vector<FoundChunk> found(chunks);
  for (std::uint64_t ch = 0; ch < chunks; ++ch) {
    FoundChunk& fc = found[ch];
    fc.elements = std::min<std::uint64_t>(kContextChunkElements, n - ch * kContextChunkElements);
    std::uint32_t seen[kContextMaxGroups] = {};
    for (std::uint64_t i = 0; i < fc.elements; ++i) {
      const std::uint64_t e = ch * kContextChunkElements + i;
      std::uint64_t va = 0, vb = 0;
      std::memcpy(&va, a.data() + e * es, es);
      std::memcpy(&vb, b.data() + e * es, es);
      const std::uint8_t c = f.bits ? static_cast<std::uint8_t>((va >> f.shift) & ((1u << f.bits) - 1)) : 0;
      unsigned g = 0;
      while (g + 1 < groups.G && c >= groups.lo[g + 1]) ++g;
      if (va != vb) {
        pos[ch].push_back(static_cast<std::uint32_t>(i));
        rank[ch].push_back(seen[g]);
        ctx[ch].push_back(c);
        const std::uint64_t d = vb - va;
        for (std::size_t k = 0; k < es; ++k) diff[ch].push_back(static_cast<std::uint8_t>(d >> (8 * k)));
        for (std::size_t k = 0; k < es; ++k) fc.bytes_changed += a[e * es + k] != b[e * es + k];
      }
      ++seen[g];
    }
    fc.count = pos[ch].size();
    fc.pos = pos[ch].data();
    fc.rank = rank[ch].data();
    fc.ctx = ctx[ch].data();
    fc.diff = diff[ch].data();
  }
  const std::vector<ContextGroups> gs(chunks, groups);
  Compressor c(3);
  Bytes out;
  encode_context_found(c, es, a.size(), f, found, gs,
                       [&](std::span<const std::uint8_t> s) { out.insert(out.end(), s.begin(), s.end()); });
  return out;
}

// What a decode hands out: every change's byte offset and value, in order,
// and the error that ended it (empty when none).
struct HandedOut {
  std::vector<std::uint64_t> offs;
  Bytes vals;
  std::string error;
  bool operator==(const HandedOut&) const = default;
};

HandedOut handed_out(const Bytes& base, const Bytes& entry) {
  HandedOut h;
  std::uint64_t piece_end = 0;
  bool ok = true;
  const BaseView view = [&](std::uint64_t off, std::size_t n) {
    piece_end = off + n;
    return std::span<const std::uint8_t>(base.data() + off, n);
  };
  try {
    decode_context(entry, base.size(), "t", view,
                   [&](std::span<const std::uint64_t> offs, std::span<const std::uint8_t> x, std::size_t es, SparseOp) {
                     for (const std::uint64_t o : offs) ok = ok && o + es <= piece_end;  // the piece just read
                     h.offs.insert(h.offs.end(), offs.begin(), offs.end());
                     h.vals.insert(h.vals.end(), x.begin(), x.end());
                   });
  } catch (const Error& err) {
    h.error = std::to_string(static_cast<int>(err.code())) + " " + err.what();
  }
  CHECK(ok);
  return h;
}

}  // namespace

TEST_CASE("context: every build's walk hands out what the element-at-a-time walk does, over random layouts") {
  const int widest = context_isa_level();
  std::mt19937_64 rng(11);
  auto pick = [&](std::uint64_t k) { return rng() % k; };
  std::size_t runs = 0, changes = 0, refused = 0;
  for (int iter = 0; iter < 200; ++iter) {
    CAPTURE(iter);
    const std::size_t es = std::size_t{1} << pick(4);
    // Mostly small tensors (partial words and blocks); some past a block
    // (4096 elements), a piece (1 MiB of base) or a chunk (2^20 elements).
    const std::uint64_t sizes[] = {1 + pick(200), 1 + pick(20000), 4096 * (1 + pick(4)) + pick(3) * 63,
                                   (kContextWindow / es) + pick(70000), kContextChunkElements + pick(5000)};
    const std::uint64_t n = sizes[iter % 20 == 19 ? 3 + pick(2) : pick(3)];
    ContextField f;
    if (pick(8)) {
      f.bits = static_cast<std::uint8_t>(1 + pick(std::min<std::size_t>(8, 8 * es)));
      f.shift = static_cast<std::uint8_t>(pick(8 * es - f.bits + 1));
    }
    const unsigned contexts = 1u << f.bits;
    // Groups: 1 to 16, thresholds anywhere in the context range.
    ContextGroups groups;
    std::vector<unsigned> starts;
    for (unsigned t = 1; t < contexts; ++t) starts.push_back(t);
    std::shuffle(starts.begin(), starts.end(), rng);
    starts.resize(std::min<std::size_t>(starts.size(), pick(kContextMaxGroups)));
    std::sort(starts.begin(), starts.end());
    groups.G = static_cast<std::uint32_t>(starts.size() + 1);
    for (std::size_t g = 0; g < starts.size(); ++g) groups.lo[g + 1] = static_cast<std::uint8_t>(starts[g]);
    // Base contexts: uniform, or a few around one (as exponents are), or runs of one.
    const unsigned mode = static_cast<unsigned>(pick(3)), centre = static_cast<unsigned>(pick(contexts));
    Bytes a(n * es), b;
    for (std::uint64_t i = 0; i < n; ++i) {
      std::uint64_t v = rng();
      unsigned c = static_cast<unsigned>(pick(contexts));
      if (mode == 1)
        c = std::min<unsigned>(contexts - 1, centre + static_cast<unsigned>(std::countr_zero(rng() | 1u << 20)));
      if (mode == 2) c = static_cast<unsigned>((i / 300 * 7 + centre) % contexts);
      if (f.bits) v = (v & ~(((std::uint64_t{1} << f.bits) - 1) << f.shift)) | std::uint64_t{c} << f.shift;
      std::memcpy(a.data() + i * es, &v, es);
    }
    // Changes: none to all, small steps mostly, some wide (magnitude escapes).
    const double densities[] = {0, 0.0005, 0.013, 0.08, 0.5, 1};
    const double density = densities[pick(6)];
    b = a;
    std::uniform_real_distribution<double> u(0, 1);
    for (std::uint64_t i = 0; i < n; ++i) {
      if (u(rng) >= density) continue;
      std::uint64_t v = 0;
      std::memcpy(&v, b.data() + i * es, es);
      const std::uint64_t step = pick(10) ? 1 + pick(3) : rng() | 1;
      v = pick(2) ? v + step : v - step;
      std::memcpy(b.data() + i * es, &v, es);
    }
    const Bytes e = encode_grouped(a, b, es, f, groups);
    // Decoded against its base, and against another (a refusal, or other bytes).
    Bytes other = a;
    for (std::uint64_t i = 0; i < n; i += 1 + pick(50)) other[i * es + pick(es)] ^= static_cast<std::uint8_t>(rng());
    for (const Bytes* base : {&a, &other}) {
      context_reference_walk(1);
      const HandedOut want = handed_out(*base, e);
      context_reference_walk(0);
      if (base == &a) {
        REQUIRE(want.error.empty());
        Bytes r = a;
        for (std::size_t i = 0; i < want.offs.size(); ++i)
          sparse_apply_value(r.data() + want.offs[i], want.vals.data() + i * es, es, SparseOp::add_zigzag);
        REQUIRE(r == b);
        changes += want.offs.size();
      } else {
        refused += !want.error.empty();
      }
      for (int level = 0; level <= widest; ++level) {
        CAPTURE(level);
        context_isa_level(level);
        const HandedOut got = handed_out(*base, e);
        CHECK(got.error == want.error);
        CHECK(got.offs == want.offs);
        CHECK(got.vals == want.vals);
        ++runs;
      }
      context_isa_level(widest);
    }
  }
  MESSAGE(runs << " decodes compared, " << changes << " changes, " << refused << " other bases refused");
  CHECK(changes > 1000000);
  CHECK(refused > 10);
}
