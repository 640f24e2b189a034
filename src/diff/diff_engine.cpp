#include "diff/diff_engine.hpp"

#include <fcntl.h>

#include <algorithm>
#include <cstring>

#include <boost/filesystem/operations.hpp>

#include "codec/change_rules.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/progress.hpp"
#include "util/parallel.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

namespace {

// Bytes of each input read at a time by the chunk engine: small enough to
// stay in the core's cache while they are hashed, compared and scanned.
constexpr std::uint64_t kScanBlock = 256 * 1024;

// A unit of parallel work: a whole tensor, or for a tensor large enough to
// keep the other cores waiting, its hashes or one range of its chunks. A
// tensor's checksum runs front to back on one core, so its new and base
// bytes are hashed by two units (hash, hash_base).
struct TensorUnit {
  enum class Kind { whole, hash, hash_base, range, fresh } kind;
  std::size_t work = 0, range = 0;
  std::uint64_t c0 = 0, c1 = 0;  // chunks
  std::uint64_t bytes = 0;       // for scheduling, largest first
};

// One append-only scratch file per thread: frames are streamed there while
// tensors are compressed in parallel, then gathered into the delta files.
struct Spool {
  File file;
  std::uint64_t size = 0;
  void put(std::span<const std::uint8_t> s) {
    file.pwrite_all(s.data(), s.size(), size);
    size += s.size();
  }
};

}  // namespace

// Per-thread state, made on first use.
struct Worker {
  Spool spool, xspool;  // xspool: "auto"'s xor frames
  std::unique_ptr<Compressor> comp, xcomp;
  SparseChunkEncoder enc;
  ContextChunkEncoder cenc;
  std::vector<std::uint8_t> a, b, x;
};

namespace {

// "auto" compresses every kXorSample-th block of the XOR stream of a tensor
// of more than kXorWhole blocks, and estimates its whole xor frame from
// them; only where the estimate comes within kXorMargin of the chunked
// entry is the whole stream compressed (try_xor), and the smaller entry
// kept. Smaller tensors are compressed whole in the pass: the choice is
// then exact for the cost of a few blocks.
constexpr std::uint64_t kXorSample = 16, kXorWhole = 4;
constexpr double kXorMargin = 1.5;

bool sampled(const Work& w) { return w.nbytes > kXorWhole * kScanBlock; }

// Compresses the XOR of blocks streamed in order into one xor frame (the
// "auto" encoding's alternative), from blocks already in cache; or, for a
// sampled tensor, every kXorSample-th block, only counting the bytes.
struct XorStream {
  Worker& wk;
  Seg seg;
  ByteSink sink;
  bool sample;
  std::uint64_t blocks = 0, fed = 0, total = 0, out = 0;
  XorStream(Worker& w, int tid, std::uint64_t nbytes, bool sample_only)
      : wk(w), seg{tid, w.xspool.size, 0, true}, sample(sample_only) {
    if (sample)
      sink = [this](std::span<const std::uint8_t> s) { out += s.size(); };
    else
      sink = [this](std::span<const std::uint8_t> s) { wk.xspool.put(s); };
    // The xor entry it may keep is the xor encoding's (the slime layout's).
    wk.xcomp->begin(sample ? Compressor::kUnknownSize : nbytes, FrameKind::slime);
  }
  // Whether the next block is compressed (else block() only counts it, and
  // may be given no base bytes).
  bool takes_next() const { return !sample || blocks % kXorSample == 0; }
  void block(const std::uint8_t* a, const std::uint8_t* b, std::size_t n) {
    total += n;
    const bool take = takes_next();
    ++blocks;
    if (!take) return;
    fed += n;
    // Word at a time through local pointers: the compiler cannot prove the
    // buffers apart, and would go byte by byte.
    std::uint8_t* x = wk.x.data();
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      std::uint64_t u, v;
      std::memcpy(&u, a + i, 8);
      std::memcpy(&v, b + i, 8);
      u ^= v;
      std::memcpy(x + i, &u, 8);
    }
    for (; i < n; ++i) x[i] = a[i] ^ b[i];
    wk.xcomp->put({x, n}, sink);
  }
  Seg end() {
    wk.xcomp->end(sink);
    seg.size = wk.xspool.size - seg.offset;
    return seg;
  }
  // A sampled stream: the whole frame's size, estimated.
  std::uint64_t estimate() {
    wk.xcomp->end(sink);
    return fed ? static_cast<std::uint64_t>(double(out) * double(total) / double(fed)) : 0;
  }
};

// Scans chunks [c0, c1) of one tensor in blocks: each block of both inputs is
// read once, hashed (if `hashers`), compared and turned into sparse or
// context changes while it is in cache; each finished chunk goes to the
// thread's spool.
RangeOut scan_range(const Work& w, std::uint64_t c0, std::uint64_t c1, Worker& wk, XorStream* xs, Hasher* hb,
                    Hasher* hn) {
  RangeOut out;
  std::optional<Hasher> sum;  // a split tensor's range: its new bytes as encoded here
  if (!hn) hn = &sum.emplace();
  const std::uint64_t chunk_bytes = kSparseChunkElements * w.es;
  const ByteSink to_spool = [&](std::span<const std::uint8_t> s) { wk.spool.put(s); };
  const bool context = w.encoding == Encoding::context;
  out.body = {-1, wk.spool.size, 0};
  for (std::uint64_t ch = c0; ch < c1; ++ch) {
    const std::uint64_t cs = ch * chunk_bytes, ce = std::min(w.nbytes, cs + chunk_bytes);
    if (context)
      wk.cenc.begin(w.es, w.field);
    else
      wk.enc.begin(w.es);
    for (std::uint64_t at = cs; at < ce; at += kScanBlock) {
      const std::size_t n = static_cast<std::size_t>(std::min(kScanBlock, ce - at));
      const std::uint8_t* a = w.bsrc->read(wk.a.data(), n, w.boff + at);
      const std::uint8_t* b = w.nsrc->read(wk.b.data(), n, w.noff + at);
      if (hb) hb->update({a, n});
      if (hn) hn->update({b, n});
      if (xs) xs->block(a, b, n);
      // The context encoder sees every base element (it counts contexts).
      if (context)
        wk.cenc.scan(a, b, n / w.es, (at - cs) / w.es);
      else if (std::memcmp(a, b, n) != 0)
        wk.enc.scan(a, b, n / w.es, (at - cs) / w.es);
    }
    if (context) {
      out.elements_changed += wk.cenc.changed_elements();
      out.bytes_changed += wk.cenc.changed_bytes();
      wk.cenc.end(*wk.comp, to_spool);
    } else {
      out.elements_changed += wk.enc.changed_elements();
      out.bytes_changed += wk.enc.changed_bytes();
      wk.enc.end(*wk.comp, to_spool);
    }
  }
  out.body.size = wk.spool.size - out.body.offset;
  if (sum) out.new_sum = sum->digest();
  return out;
}

[[noreturn]] void changed_while_read(const Work& w) {
  fail(Exit::verify_failed, "tensor '" + w.t->name +
                                "': its bytes changed while they were read (written by another "
                                "thread or process meanwhile?); nothing was published: give bytes that stay unchanged "
                                "until the call returns");
}

// Makes a thread's scratch state on first use.
void ensure_worker(Worker& wk, std::size_t tid, const fs::path& tmp, int level, bool autochoice) {
  if (wk.comp) return;
  wk.comp = std::make_unique<Compressor>(level);
  wk.spool.file = File(tmp / (".spool-" + std::to_string(tid)), File::Mode::create_exclusive);
  wk.a.resize(kScanBlock), wk.b.resize(kScanBlock), wk.x.resize(kScanBlock);
  if (autochoice) {
    wk.xcomp = std::make_unique<Compressor>(level);
    wk.xspool.file = File(tmp / (".xspool-" + std::to_string(tid)), File::Mode::create_exclusive);
  }
}

// A tensor without base bytes (new, or of another length than before): its
// entry is an xor frame against zeros, i.e. its bytes compressed. An all-zero
// tensor needs none.
void encode_fresh(Work& w, Worker& wk, std::size_t tid) {
  const ByteSink sink = [&](std::span<const std::uint8_t> s) { wk.spool.put(s); };
  Hasher hn;
  bool nonzero = false;
  w.encoding = Encoding::xor_bytes;
  w.frame = {static_cast<int>(tid), wk.spool.size, 0};
  wk.comp->begin(w.nbytes);
  for (std::uint64_t at = 0; at < w.nbytes; at += kScanBlock) {
    const std::size_t n = static_cast<std::size_t>(std::min(kScanBlock, w.nbytes - at));
    const std::uint8_t* b = w.nsrc->read(wk.b.data(), n, w.noff + at);
    hn.update({b, n});
    if (!nonzero) nonzero = std::any_of(b, b + n, [](std::uint8_t c) { return c != 0; });
    wk.comp->put({b, n}, sink);
  }
  wk.comp->end(sink);
  w.new_hash = hn.digest();
  if (!nonzero) {
    wk.spool.size = w.frame.offset;
    w.frame = {};
    return;
  }
  w.frame.size = wk.spool.size - w.frame.offset;
  w.elements_changed = dtype_size(w.t->dtype) ? w.t->elements() : w.nbytes;
  w.bytes_changed = w.nbytes;
}

// The base bytes' checksum as read: checked against the one recorded for
// them, where known (a mirror altered since it was recorded).
void set_base_hash(Work& w, const Hash128& h) {
  if (w.base_hash_known && h != w.base_hash)
    fail(Exit::verify_failed, (w.base_what ? *w.base_what : std::string("base")) + ": tensor '" + w.t->name +
                                  "' holds other bytes (checksum " + h.hex() + ") than recorded for it (" +
                                  w.base_hash.hex() + "): it was altered since; nothing was published");
  w.base_hash = h;
  w.base_hashed = true;
}

// The head of a chunked entry.
std::uint64_t head_size(const Work& w) { return w.encoding == Encoding::context ? kContextHeadSize : kSparseHeadSize; }

// The units of the chunk engine, largest first. A tensor larger than its
// share of the work is cut into ranges of chunks so that it does not keep
// the other cores waiting; its hashes (which run front to back) become a
// unit of their own.
std::vector<TensorUnit> chunk_units(std::span<Work* const> works, int threads) {
  std::uint64_t total = 0;
  for (const Work* w : works) total += w->nbytes;
  std::vector<TensorUnit> units;
  for (std::size_t i = 0; i < works.size(); ++i) {
    Work& w = *works[i];
    if (w.fresh) {
      units.push_back({TensorUnit::Kind::fresh, i, 0, 0, 0, w.nbytes});
      continue;
    }
    const std::vector<ChunkRange> ranges =
        split_chunk_ranges(w.nbytes, w.chunks, kSparseChunkElements * w.es, total, threads);
    if (ranges.empty()) {
      w.ranges.resize(1);
      units.push_back({TensorUnit::Kind::whole, i, 0, 0, w.chunks, w.nbytes});
      continue;
    }
    units.push_back({TensorUnit::Kind::hash, i, 0, 0, 0, w.nbytes});
    units.push_back({TensorUnit::Kind::hash_base, i, 0, 0, 0, w.nbytes});
    w.range_c0.clear();
    for (const ChunkRange& r : ranges) {
      w.range_c0.push_back(r.c0);
      units.push_back({TensorUnit::Kind::range, i, w.ranges.size(), r.c0, r.c1, r.bytes});
      w.ranges.emplace_back();
    }
  }
  std::stable_sort(units.begin(), units.end(), [](const TensorUnit& x, const TensorUnit& y) { return x.bytes > y.bytes; });
  return units;
}

// A split tensor's checksum of its new bytes, front to back (its base's is
// hash_base_unit's), and with `xs`, its xor frame's size estimated from a
// sample, reading only the base blocks the sample takes. Each range's sum of the new bytes
// too, for the ranges to be checked against (Work::range_sum). Blocks never
// straddle a range: ranges start at chunk boundaries, and a chunk is a whole
// number of blocks.
void hash_unit(Work& w, Worker& wk, XorStream* xs) {
  Hasher hn, hr;
  const std::uint64_t chunk_bytes = kSparseChunkElements * w.es;
  std::size_t r = 0;
  w.range_sum.assign(w.range_c0.size(), {});
  for (std::uint64_t at = 0; at < w.nbytes; at += kScanBlock) {
    const std::size_t n = static_cast<std::size_t>(std::min(kScanBlock, w.nbytes - at));
    if (r + 1 < w.range_c0.size() && at == w.range_c0[r + 1] * chunk_bytes) w.range_sum[r++] = hr.digest(), hr.reset();
    const std::uint8_t* b = w.nsrc->read(wk.b.data(), n, w.noff + at);
    hn.update({b, n});
    hr.update({b, n});
    if (xs) xs->block(xs->takes_next() ? w.bsrc->read(wk.a.data(), n, w.boff + at) : nullptr, b, n);
  }
  if (!w.range_sum.empty()) w.range_sum[r] = hr.digest();
  w.new_hash = hn.digest();
  if (xs) w.xor_estimate = xs->estimate();
}

// A split tensor's base checksum, beside hash_unit's of its new bytes.
void hash_base_unit(Work& w, Worker& wk) {
  Hasher hb;
  for (std::uint64_t at = 0; at < w.nbytes; at += kScanBlock) {
    const std::size_t n = static_cast<std::size_t>(std::min(kScanBlock, w.nbytes - at));
    hb.update({w.bsrc->read(wk.a.data(), n, w.boff + at), n});
  }
  set_base_hash(w, hb.digest());
}

// "auto" of a tensor scanned whole: only the smaller of its chunked entry
// and its xor frame stays in the spools.
void keep_smaller(Work& w, RangeOut& r, Worker& wk, XorStream& xs) {
  if (xs.sample) {
    w.xor_estimate = xs.estimate();  // decided after the pass
    return;
  }
  const Seg x = xs.end();
  if (r.elements_changed == 0 || head_size(w) + r.body.size <= x.size) {
    wk.xspool.size = x.offset;
  } else {
    wk.spool.size = r.body.offset;
    r.body.size = 0;
    w.encoding = Encoding::xor_bytes;
    w.frame = x;
  }
}

// A tensor in one unit: hashed, scanned and (with `xs`) decided in one pass.
void scan_whole(Work& w, const TensorUnit& unit, Worker& wk, std::size_t tid, XorStream* xs) {
  Hasher hb, hn;
  RangeOut r = scan_range(w, unit.c0, unit.c1, wk, xs, &hb, &hn);
  set_base_hash(w, hb.digest());
  w.new_hash = hn.digest();
  r.body.spool = static_cast<int>(tid);
  if (xs) keep_smaller(w, r, wk, *xs);
  if (r.elements_changed == 0) wk.spool.size = r.body.offset, r.body.size = 0;  // unchanged: nothing to keep
  w.ranges[0] = r;
}

void run_chunk_unit(const TensorUnit& unit, Work& w, Worker& wk, std::size_t tid, bool autochoice) {
  if (unit.kind == TensorUnit::Kind::fresh) return encode_fresh(w, wk, tid);
  // "auto" encodes xor too, in the same pass, and keeps the smaller entry
  // of every tensor: never larger than xor, at the cost of compressing the
  // XOR stream (mostly zeros, which zstd goes through fast).
  std::optional<XorStream> xs;
  // A split tensor (over kXorWhole blocks) is always sampled.
  if (autochoice && (unit.kind == TensorUnit::Kind::hash || unit.kind == TensorUnit::Kind::whole))
    xs.emplace(wk, static_cast<int>(tid), w.nbytes, unit.kind == TensorUnit::Kind::hash || sampled(w));
  XorStream* x = xs ? &*xs : nullptr;
  if (unit.kind == TensorUnit::Kind::hash) return hash_unit(w, wk, x);
  if (unit.kind == TensorUnit::Kind::hash_base) return hash_base_unit(w, wk);
  if (unit.kind == TensorUnit::Kind::whole) return scan_whole(w, unit, wk, tid, x);
  RangeOut r = scan_range(w, unit.c0, unit.c1, wk, nullptr, nullptr, nullptr);
  r.body.spool = static_cast<int>(tid);
  w.ranges[unit.range] = r;
}

// A split tensor's ranges encoded the bytes its checksum was taken of.
void check_range_sums(const Work& w) {
  if (w.range_sum.size() != w.ranges.size() || w.ranges.size() < 2) return;
  for (std::size_t i = 0; i < w.ranges.size(); ++i)
    if (w.ranges[i].new_sum != w.range_sum[i]) changed_while_read(w);
}

// The size of a tensor's chunked entry: its head and its ranges' chunks.
std::uint64_t chunked_len(const Work& w) {
  std::uint64_t n = head_size(w);
  for (const auto& r : w.ranges) n += r.body.size;
  return n;
}

// Each tensor's totals over its ranges; "auto" keeps for try_xor only the
// sampled tensors whose estimate comes close to their chunked entry (the
// others were decided in their pass).
void sum_ranges(std::span<Work* const> works, bool autochoice) {
  for (Work* wp : works) {
    Work& w = *wp;
    check_range_sums(w);
    for (const auto& r : w.ranges) w.elements_changed += r.elements_changed, w.bytes_changed += r.bytes_changed;
    if (!autochoice || w.fresh || !w.changed()) {
      w.xor_estimate.reset();  // no choice to make
      continue;
    }
    // The whole frame only where the sample says it may be smaller.
    if (w.xor_estimate && double(*w.xor_estimate) >= kXorMargin * double(chunked_len(w))) w.xor_estimate.reset();
  }
}

// "auto", a sampled tensor whose estimate came close: its whole xor frame,
// kept where smaller than its chunked entry. The bytes are read again, and
// must still be those hashed in the pass.
void try_xor(Work& w, Worker& wk, std::size_t tid) {
  w.xor_estimate.reset();
  XorStream xs(wk, static_cast<int>(tid), w.nbytes, false);
  Hasher hb, hn;
  for (std::uint64_t at = 0; at < w.nbytes; at += kScanBlock) {
    const std::size_t n = static_cast<std::size_t>(std::min(kScanBlock, w.nbytes - at));
    const std::uint8_t* a = w.bsrc->read(wk.a.data(), n, w.boff + at);
    const std::uint8_t* b = w.nsrc->read(wk.b.data(), n, w.noff + at);
    hb.update({a, n});
    hn.update({b, n});
    xs.block(a, b, n);
  }
  const Seg x = xs.end();
  if (hn.digest() != w.new_hash || (w.base_hashed && hb.digest() != w.base_hash)) changed_while_read(w);
  if (x.size < chunked_len(w)) {
    w.encoding = Encoding::xor_bytes, w.frame = x;
  } else if (wk.xspool.size == x.offset + x.size) {
    wk.xspool.size = x.offset;  // the spool's end: taken back
  }
}

}  // namespace

Work make_work(std::size_t nfile, const TensorInfo& t) {
  Work w;
  w.nfile = nfile;
  w.t = &t;
  w.nbytes = t.nbytes();
  const ChunkLayout l = chunk_layout(t.dtype, w.nbytes);
  w.es = l.es;
  w.field = l.field;
  w.chunks = sparse_chunk_count(w.nbytes, w.es);
  return w;
}

Encoder::Encoder(fs::path tmp, std::optional<Encoding> encoding, int level, int threads)
    : tmp_(std::move(tmp)),
      encoding_(encoding),
      chunked_(encoding == Encoding::sparse ? Encoding::sparse : Encoding::context),
      level_(level),
      threads_(default_threads(threads)) {
  for (int t = 0; t < threads_; ++t) workers_.push_back(std::make_unique<Worker>());
}

Encoder::~Encoder() {
  try {
    close();
  } catch (...) {  // the delta's temporary directory goes with them on failure
  }
}

void Encoder::encode(std::span<Work* const> works) {
  if (!encoding_ || chunked(*encoding_))
    chunk_pass(works);
  else
    frame_pass(works);
}

// The chunk engine ("sparse", "context" and "auto"): one pass over both
// inputs per tensor, in parallel over tensors and over chunk ranges of large
// tensors.
void Encoder::chunk_pass(std::span<Work* const> works) {
  const bool autochoice = !encoding_;
  for (Work* w : works) w->encoding = chunked_;
  const std::vector<TensorUnit> units = chunk_units(works, threads_);
  parallel_for(units.size(), threads_, [&](std::size_t u, std::size_t tid) {
    const TensorUnit& unit = units[u];
    Work& w = *works[unit.work];
    Worker& wk = *workers_[tid];
    ensure_worker(wk, tid, tmp_, level_, autochoice);
    run_chunk_unit(unit, w, wk, tid, autochoice);
    // Each tensor's bytes count once: a split tensor's through its ranges.
    if (unit.kind != TensorUnit::Kind::hash && unit.kind != TensorUnit::Kind::hash_base) progress::add(unit.bytes);
  });
  sum_ranges(works, autochoice);
  std::vector<Work*> close;
  for (Work* w : works)
    if (w->xor_estimate) close.push_back(w);
  parallel_for(close.size(), threads_, [&](std::size_t i, std::size_t tid) {
    ensure_worker(*workers_[tid], tid, tmp_, level_, true);
    try_xor(*close[i], *workers_[tid], tid);
  });
}

// The slime encodings, one frame per tensor over whole views.
void Encoder::frame_pass(std::span<Work* const> works) {
  std::vector<std::size_t> order(works.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t x, std::size_t y) { return works[x]->nbytes > works[y]->nbytes; });
  parallel_for(order.size(), threads_, [&](std::size_t k, std::size_t tid) {
    Work& w = *works[order[k]];
    progress::add(w.nbytes);  // counted as it starts: the frame is one step
    Worker& wk = *workers_[tid];
    ensure_worker(wk, tid, tmp_, level_, false);
    if (w.fresh) return encode_fresh(w, wk, tid);
    const auto a = w.bsrc->view(w.boff, w.nbytes);
    const auto b = w.nsrc->view(w.noff, w.nbytes);
    set_base_hash(w, xxh3_128(a));
    if (std::memcmp(a.data(), b.data(), a.size()) == 0) {
      w.new_hash = w.base_hash;
      return;
    }
    const std::size_t es = dtype_size(w.t->dtype) ? dtype_size(w.t->dtype) : 1;
    const ChangeCount cc = count_changes(a, b, es);
    w.elements_changed = cc.elements, w.bytes_changed = cc.bytes;
    w.new_hash = xxh3_128(b);
    const ByteSink sink = [&](std::span<const std::uint8_t> s) { wk.spool.put(s); };
    w.encoding = *encoding_;
    w.frame = {static_cast<int>(tid), wk.spool.size, 0};
    w.frame.size = w.encoding == Encoding::xor_bytes ? encode_xor(*wk.comp, a, b, sink)
                                                     : encode_overwrite(*wk.comp, a, b, cc.bytes, sink);
    // The whole-tensor frames read their views in several passes: the bytes
    // hashed before must still be there after, or the frame may hold others.
    if (xxh3_128(b) != w.new_hash) changed_while_read(w);
  });
}

void Encoder::encode_found(Work& w, std::span<const FoundChunk> chunks, std::span<const ContextGroups> groups) {
  if (!encoding_ || !chunked(*encoding_))
    fail(Exit::usage, "tensor '" + w.t->name + "': changes found elsewhere are encoded as sparse or context, not " +
                          (encoding_ ? std::string(encoding_name(*encoding_)) : std::string("auto")) +
                          ": give the tensor's bytes");
  const bool context = *encoding_ == Encoding::context;
  if (w.fresh || chunks.size() != w.chunks || (context && groups.size() != chunks.size()))
    fail(Exit::failure, "tensor '" + w.t->name + "': " + std::to_string(chunks.size()) +
                            " chunks of found changes for " + std::to_string(w.chunks) + " chunks" +
                            (w.fresh ? " of a tensor without base bytes" : ""));
  Worker& wk = *workers_[0];
  ensure_worker(wk, 0, tmp_, level_, false);
  w.encoding = *encoding_;
  // The base's and the new bytes' checksums, block by block: each chunk's
  // changes (ascending within it) applied to its base bytes.
  Hasher hb, hn;
  const std::uint64_t chunk_bytes = kSparseChunkElements * w.es, ones = rules::element_ones(w.es);
  for (std::uint64_t c = 0; c < w.chunks; ++c) {
    const FoundChunk& fc = chunks[c];
    const std::uint64_t cs = c * chunk_bytes, ce = std::min(w.nbytes, cs + chunk_bytes);
    if (fc.elements != (ce - cs) / w.es)
      fail(Exit::failure, "tensor '" + w.t->name + "': found chunk " + std::to_string(c) + " of " +
                              std::to_string(fc.elements) + " elements, not " + std::to_string((ce - cs) / w.es));
    std::uint64_t j = 0;
    for (std::uint64_t at = cs; at < ce; at += kScanBlock) {
      const std::size_t n = static_cast<std::size_t>(std::min(kScanBlock, ce - at));
      const std::uint8_t* a = w.bsrc->read(wk.a.data(), n, w.boff + at);
      hb.update({a, n});
      std::uint8_t* b = wk.b.data();
      std::memcpy(b, a, n);
      const std::uint64_t e0 = (at - cs) / w.es, e1 = e0 + n / w.es;
      for (; j < fc.count && fc.pos[j] < e1; ++j) {
        if (fc.pos[j] < e0 || (j && fc.pos[j] <= fc.pos[j - 1]))
          fail(Exit::failure,
               "tensor '" + w.t->name + "': found changes of chunk " + std::to_string(c) + " out of order");
        std::uint8_t* p = b + (fc.pos[j] - e0) * w.es;
        const std::uint64_t v = (rules::load_element(p, w.es) + rules::load_element(fc.diff + j * w.es, w.es)) & ones;
        for (std::size_t k = 0; k < w.es; ++k) p[k] = static_cast<std::uint8_t>(v >> (8 * k));
      }
      hn.update({b, n});
    }
    if (j != fc.count)
      fail(Exit::failure, "tensor '" + w.t->name + "': found changes of chunk " + std::to_string(c) + " past its end");
  }
  set_base_hash(w, hb.digest());
  w.new_hash = hn.digest();
  // The entry's chunks, as scan_range writes them.
  const ByteSink to_spool = [&](std::span<const std::uint8_t> s) { wk.spool.put(s); };
  RangeOut r;
  r.body = {0, wk.spool.size, 0};
  for (std::uint64_t c = 0; c < w.chunks; ++c) {
    if (context) {
      wk.cenc.begin(w.es, w.field);
      wk.cenc.take(chunks[c], groups[c]);
      r.elements_changed += wk.cenc.changed_elements(), r.bytes_changed += wk.cenc.changed_bytes();
      wk.cenc.end(*wk.comp, to_spool);
    } else {
      wk.enc.begin(w.es);
      wk.enc.take(chunks[c]);
      r.elements_changed += wk.enc.changed_elements(), r.bytes_changed += wk.enc.changed_bytes();
      wk.enc.end(*wk.comp, to_spool);
    }
  }
  r.body.size = wk.spool.size - r.body.offset;
  if (r.elements_changed == 0) wk.spool.size = r.body.offset, r.body.size = 0;
  r.new_sum = w.new_hash;
  w.ranges.assign(1, r);
  w.elements_changed = r.elements_changed, w.bytes_changed = r.bytes_changed;
  progress::add(w.nbytes);
}

std::uint64_t Encoder::entry_size(const Work& w) const { return chunked(w.encoding) ? chunked_len(w) : w.frame.size; }

// An entry's bytes, gathered from the spools: the chunked entry's head and
// its ranges' chunks, or its one frame.
void Encoder::write_entry(const Work& w, File& f, std::uint64_t at) const {
  auto copy = [&](const Seg& sg) {
    const Worker& from = *workers_[static_cast<std::size_t>(sg.spool)];
    copy_range(sg.in_xspool ? from.xspool.file : from.spool.file, sg.offset, sg.size, f, at);
    at += sg.size;
  };
  if (!chunked(w.encoding)) return copy(w.frame);
  static_assert(kContextHeadSize >= kSparseHeadSize);
  std::uint8_t head[kContextHeadSize];
  if (w.encoding == Encoding::context)
    context_entry_head(w.es, w.nbytes, w.field, head);
  else
    sparse_entry_head(w.es, w.nbytes, head);
  f.pwrite_all(head, head_size(w), at);
  at += head_size(w);
  for (const auto& rg : w.ranges) copy(rg.body);
}

void Encoder::close() {
  for (std::size_t t = 0; t < workers_.size(); ++t) {
    Worker& wk = *workers_[t];
    if (wk.spool.file.fd() >= 0) {
      wk.spool.file.close();
      fs::remove(tmp_ / (".spool-" + std::to_string(t)));
    }
    if (wk.xspool.file.fd() >= 0) {
      wk.xspool.file.close();
      fs::remove(tmp_ / (".xspool-" + std::to_string(t)));
    }
  }
}

}  // namespace hfdelta
