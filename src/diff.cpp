#include "hfdelta/progress.hpp"
#include "hfdelta/diff.hpp"

#include <fcntl.h>
#include <stdio.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>

#include <boost/filesystem/operations.hpp>

#include "codec_internal.hpp"
#include "delta_writer.hpp"
#include "hfdelta/checkpoint.hpp"
#include "hfdelta/delta_format.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/hash.hpp"
#include "hfdelta/io.hpp"
#include "hfdelta/safetensors.hpp"
#include "hfdelta/version.hpp"
#include "parallel.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

namespace {

// Bytes of each input read at a time by the sparse engine: small enough to
// stay in the core's cache while they are hashed, compared and scanned.
constexpr std::uint64_t kBlock = 256 * 1024;

// A piece of a frame or entry body in a thread's spool file.
struct Seg {
  int spool = -1;
  std::uint64_t offset = 0, size = 0;
  bool in_xspool = false;
};

// What one unit of work found in its range of a tensor.
struct RangeOut {
  Seg body;
  std::uint64_t elements_changed = 0, bytes_changed = 0;
};

// One tensor of NEW, where its base bytes are, and everything the units
// working on it produce.
struct Work {
  std::size_t nfile = 0, bfile = 0;      // shard of NEW, of BASE
  const TensorInfo* t = nullptr;
  std::uint64_t noff = 0, boff = 0;      // absolute in those files
  std::uint64_t nbytes = 0;
  bool fresh = false;                    // no base bytes: its entry is its bytes (xor with zeros)
  bool need_hash = false;                // its checksum is needed even if it is unchanged
  const std::string* from = nullptr;     // the base tensor its bytes come from (not fresh)
  std::size_t es = 1;                    // the sparse encoding's element size
  std::uint64_t chunks = 0;
  std::vector<RangeOut> ranges;          // one per unit scanning it, in tensor order
  Hash128 base_hash, new_hash;
  Encoding encoding = Encoding::sparse;
  Seg frame;                             // the entry, when it is not sparse
  Seg xor_frame;                         // "auto": the xor encoding, for the choice
  std::uint64_t elements_changed = 0, bytes_changed = 0;
  bool changed() const { return elements_changed != 0; }
};

// A unit of parallel work: a whole tensor, or for a tensor large enough to
// keep the other cores waiting, its hashes or one range of its chunks.
struct Unit {
  enum class Kind { whole, hash, range, fresh } kind;
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

// Per-thread state, made on first use.
struct Worker {
  Spool spool, xspool;  // xspool: "auto"'s xor frames
  std::unique_ptr<Compressor> comp, xcomp;
  SparseChunkEncoder enc;
  std::vector<std::uint8_t> a, b, x;
};

// Compresses the XOR of blocks streamed in order into one xor frame (the
// "auto" encoding's alternative), from blocks already in cache.
struct XorStream {
  Worker& wk;
  Seg seg;
  ByteSink sink;
  XorStream(Worker& w, int tid, std::uint64_t nbytes) : wk(w), seg{tid, w.xspool.size, 0, true} {
    sink = [this](std::span<const std::uint8_t> s) { wk.xspool.put(s); };
    wk.xcomp->begin(nbytes);
  }
  void block(std::size_t n) {
    // Word at a time through local pointers: the compiler cannot prove the
    // vectors' buffers apart, and would go byte by byte.
    const std::uint8_t* a = wk.a.data();
    const std::uint8_t* b = wk.b.data();
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
};

std::uint64_t size_of(const fs::path& p) {
  boost::system::error_code ec;
  const auto n = fs::file_size(p, ec);
  if (ec) fail(Exit::failure, p.string() + ": " + ec.message());
  return n;
}

void advise_sequential(const File& f) { ::posix_fadvise(f.fd(), 0, 0, POSIX_FADV_SEQUENTIAL); }

// Scans chunks [c0, c1) of one tensor in blocks: each block of both inputs is
// read once, hashed (if `hashers`), compared and turned into sparse changes
// while it is in cache; each finished chunk goes to the thread's spool.
RangeOut scan_range(const Work& w, std::uint64_t c0, std::uint64_t c1, const File& base, const File& target,
                    Worker& wk, XorStream* xs, Hasher* hb, Hasher* hn) {
  RangeOut out;
  const std::uint64_t chunk_bytes = kSparseChunkElements * w.es;
  const ByteSink to_spool = [&](std::span<const std::uint8_t> s) { wk.spool.put(s); };
  out.body = {-1, wk.spool.size, 0};
  for (std::uint64_t ch = c0; ch < c1; ++ch) {
    const std::uint64_t cs = ch * chunk_bytes, ce = std::min(w.nbytes, cs + chunk_bytes);
    wk.enc.begin(w.es);
    for (std::uint64_t at = cs; at < ce; at += kBlock) {
      const std::size_t n = static_cast<std::size_t>(std::min(kBlock, ce - at));
      base.pread_exact(wk.a.data(), n, w.boff + at);
      target.pread_exact(wk.b.data(), n, w.noff + at);
      if (hb) hb->update({wk.a.data(), n}), hn->update({wk.b.data(), n});
      if (xs) xs->block(n);
      if (std::memcmp(wk.a.data(), wk.b.data(), n) == 0) continue;
      wk.enc.scan(wk.a.data(), wk.b.data(), n / w.es, (at - cs) / w.es);
    }
    out.elements_changed += wk.enc.changed_elements();
    out.bytes_changed += wk.enc.changed_bytes();
    wk.enc.end(*wk.comp, to_spool);
  }
  out.body.size = wk.spool.size - out.body.offset;
  return out;
}

// Makes a thread's scratch state on first use.
void ensure_worker(Worker& wk, std::size_t tid, const fs::path& tmp, int level, bool autochoice) {
  if (wk.comp) return;
  wk.comp = std::make_unique<Compressor>(level);
  wk.spool.file = File(tmp / (".spool-" + std::to_string(tid)), File::Mode::create_exclusive);
  wk.a.resize(kBlock), wk.b.resize(kBlock), wk.x.resize(kBlock);
  if (autochoice) {
    wk.xcomp = std::make_unique<Compressor>(level);
    wk.xspool.file = File(tmp / (".xspool-" + std::to_string(tid)), File::Mode::create_exclusive);
  }
}

// A tensor without base bytes (new, or of another length than before): its
// entry is an xor frame against zeros, i.e. its bytes compressed. An all-zero
// tensor needs none.
void encode_fresh(Work& w, const File& target, Worker& wk, std::size_t tid) {
  const ByteSink sink = [&](std::span<const std::uint8_t> s) { wk.spool.put(s); };
  Hasher hn;
  bool nonzero = false;
  w.encoding = Encoding::xor_bytes;
  w.frame = {static_cast<int>(tid), wk.spool.size, 0};
  wk.comp->begin(w.nbytes);
  for (std::uint64_t at = 0; at < w.nbytes; at += kBlock) {
    const std::size_t n = static_cast<std::size_t>(std::min(kBlock, w.nbytes - at));
    target.pread_exact(wk.b.data(), n, w.noff + at);
    hn.update({wk.b.data(), n});
    if (!nonzero) nonzero = std::any_of(wk.b.data(), wk.b.data() + n, [](std::uint8_t c) { return c != 0; });
    wk.comp->put({wk.b.data(), n}, sink);
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

// The units of the sparse engine, largest first. A tensor larger than its
// share of the work is cut into ranges of chunks so that it does not keep
// the other cores waiting; its hashes (which run front to back) become a
// unit of their own.
std::vector<Unit> sparse_units(std::vector<Work>& works, int threads) {
  std::uint64_t total = 0;
  for (const auto& w : works) total += w.nbytes;
  std::vector<Unit> units;
  for (std::size_t i = 0; i < works.size(); ++i) {
    Work& w = works[i];
    if (w.fresh) {
      units.push_back({Unit::Kind::fresh, i, 0, 0, 0, w.nbytes});
      continue;
    }
    const std::vector<ChunkRange> ranges = split_chunk_ranges(w.nbytes, w.chunks, kSparseChunkElements * w.es, total, threads);
    if (ranges.empty()) {
      w.ranges.resize(1);
      units.push_back({Unit::Kind::whole, i, 0, 0, w.chunks, w.nbytes});
      continue;
    }
    units.push_back({Unit::Kind::hash, i, 0, 0, 0, w.nbytes});
    for (const ChunkRange& r : ranges) {
      units.push_back({Unit::Kind::range, i, w.ranges.size(), r.c0, r.c1, r.bytes});
      w.ranges.emplace_back();
    }
  }
  std::stable_sort(units.begin(), units.end(), [](const Unit& x, const Unit& y) { return x.bytes > y.bytes; });
  return units;
}

// A split tensor's checksums (and with `xs`, its xor frame), front to back.
void hash_unit(Work& w, const File& base, const File& target, Worker& wk, XorStream* xs) {
  Hasher hb, hn;
  for (std::uint64_t at = 0; at < w.nbytes; at += kBlock) {
    const std::size_t n = static_cast<std::size_t>(std::min(kBlock, w.nbytes - at));
    base.pread_exact(wk.a.data(), n, w.boff + at);
    target.pread_exact(wk.b.data(), n, w.noff + at);
    hb.update({wk.a.data(), n});
    hn.update({wk.b.data(), n});
    if (xs) xs->block(n);
  }
  w.base_hash = hb.digest(), w.new_hash = hn.digest();
  if (xs) w.xor_frame = xs->end();
}

// "auto" of a tensor scanned whole: only the smaller of its sparse entry
// and its xor frame stays in the spools.
void keep_smaller(Work& w, RangeOut& r, Worker& wk, XorStream& xs) {
  w.xor_frame = xs.end();
  if (r.elements_changed == 0 || kSparseHeadSize + r.body.size <= w.xor_frame.size) {
    wk.xspool.size = w.xor_frame.offset;
    w.xor_frame = {};
  } else {
    wk.spool.size = r.body.offset;
    r.body.size = 0;
    w.encoding = Encoding::xor_bytes;
    w.frame = w.xor_frame;
    w.xor_frame = {};  // decided
  }
}

// A tensor in one unit: hashed, scanned and (with `xs`) decided in one pass.
void scan_whole(Work& w, const Unit& unit, const File& base, const File& target, Worker& wk, std::size_t tid, XorStream* xs) {
  Hasher hb, hn;
  RangeOut r = scan_range(w, unit.c0, unit.c1, base, target, wk, xs, &hb, &hn);
  w.base_hash = hb.digest(), w.new_hash = hn.digest();
  r.body.spool = static_cast<int>(tid);
  if (xs) keep_smaller(w, r, wk, *xs);
  if (r.elements_changed == 0) wk.spool.size = r.body.offset, r.body.size = 0;  // unchanged: nothing to keep
  w.ranges[0] = r;
}

void run_sparse_unit(const Unit& unit, Work& w, const File& base, const File& target, Worker& wk, std::size_t tid,
                     bool autochoice) {
  if (unit.kind == Unit::Kind::fresh) return encode_fresh(w, target, wk, tid);
  // "auto" encodes xor too, in the same pass, and keeps the smaller entry
  // of every tensor: never larger than xor, at the cost of compressing the
  // XOR stream (mostly zeros, which zstd goes through fast).
  std::optional<XorStream> xs;
  if (autochoice && unit.kind != Unit::Kind::range) xs.emplace(wk, static_cast<int>(tid), w.nbytes);
  XorStream* x = xs ? &*xs : nullptr;
  if (unit.kind == Unit::Kind::hash) return hash_unit(w, base, target, wk, x);
  if (unit.kind == Unit::Kind::whole) return scan_whole(w, unit, base, target, wk, tid, x);
  RangeOut r = scan_range(w, unit.c0, unit.c1, base, target, wk, nullptr, nullptr, nullptr);
  r.body.spool = static_cast<int>(tid);
  w.ranges[unit.range] = r;
}

// Each tensor's totals over its ranges; "auto" keeps a split tensor's xor
// frame where it is smaller than its sparse entry.
void sum_ranges(std::vector<Work>& works, bool autochoice) {
  for (Work& w : works) {
    for (const auto& r : w.ranges) w.elements_changed += r.elements_changed, w.bytes_changed += r.bytes_changed;
    if (!autochoice || w.fresh || !w.changed() || w.xor_frame.spool < 0) continue;
    std::uint64_t sparse_len = kSparseHeadSize;
    for (const auto& r : w.ranges) sparse_len += r.body.size;
    if (w.xor_frame.size < sparse_len) w.encoding = Encoding::xor_bytes, w.frame = w.xor_frame;
  }
}

}  // namespace

// The sparse engine ("sparse" and "auto"): one pass over both inputs per
// tensor, in parallel over tensors and over chunk ranges of large tensors.
static void sparse_pass(std::vector<Work>& works, const std::vector<File>& base_files, const std::vector<File>& new_files,
                        std::vector<Worker>& workers, const fs::path& tmp, const DiffOptions& opts, int threads) {
  const bool autochoice = !opts.encoding;
  const std::vector<Unit> units = sparse_units(works, threads);
  std::uint64_t total = 0;
  for (const Unit& u : units) total += u.bytes;
  progress::begin("diff", total);
  parallel_for(units.size(), threads, [&](std::size_t u, std::size_t tid) {
    const Unit& unit = units[u];
    Work& w = works[unit.work];
    ensure_worker(workers[tid], tid, tmp, opts.level, autochoice);
    run_sparse_unit(unit, w, base_files[w.bfile], new_files[w.nfile], workers[tid], tid, autochoice);
    progress::add(unit.bytes);
  });
  sum_ranges(works, autochoice);
}

// The slime encodings, one frame per tensor over mapped views.
static void frame_pass(std::vector<Work>& works, const std::vector<File>& base_files, const std::vector<File>& new_files,
                       std::vector<Worker>& workers, const fs::path& tmp, const DiffOptions& opts, int threads) {
  std::vector<MappedFile> base_maps, new_maps;
  for (const auto& f : base_files) base_maps.emplace_back(f.path());
  for (const auto& f : new_files) new_maps.emplace_back(f.path());
  std::vector<std::size_t> order(works.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return works[x].nbytes > works[y].nbytes; });
  std::uint64_t total = 0;
  for (const Work& w : works) total += w.nbytes;
  progress::begin("diff", total);
  parallel_for(order.size(), threads, [&](std::size_t k, std::size_t tid) {
    Work& w = works[order[k]];
    progress::add(w.nbytes);  // counted as it starts: the frame is one step
    Worker& wk = workers[tid];
    ensure_worker(wk, tid, tmp, opts.level, false);
    if (w.fresh) return encode_fresh(w, new_files[w.nfile], wk, tid);
    const auto a = base_maps[w.bfile].bytes(w.boff, w.nbytes);
    const auto b = new_maps[w.nfile].bytes(w.noff, w.nbytes);
    if (std::memcmp(a.data(), b.data(), a.size()) == 0) {
      if (w.need_hash) w.base_hash = w.new_hash = xxh3_128(b);
      return;
    }
    const std::size_t es = dtype_size(w.t->dtype) ? dtype_size(w.t->dtype) : 1;
    const ChangeCount cc = count_changes(a, b, es);
    w.elements_changed = cc.elements, w.bytes_changed = cc.bytes;
    w.base_hash = xxh3_128(a), w.new_hash = xxh3_128(b);
    const ByteSink sink = [&](std::span<const std::uint8_t> s) { wk.spool.put(s); };
    w.encoding = *opts.encoding;
    w.frame = {static_cast<int>(tid), wk.spool.size, 0};
    w.frame.size = w.encoding == Encoding::xor_bytes ? encode_xor(*wk.comp, a, b, sink)
                                                     : encode_overwrite(*wk.comp, a, b, cc.bytes, sink);
  });
}

// A file's first 8 + N bytes: the header length and the header, as written.
static std::string header_prefix(const SafetensorsHeader& h) {
  std::string p(8, '\0');
  for (int i = 0; i < 8; ++i) p[static_cast<std::size_t>(i)] = static_cast<char>((h.header_len >> (8 * i)) & 0xff);
  return p + h.header;
}

namespace {

// What plan_shards decides, as it goes.
struct ShardPlan {
  const Checkpoint& base;
  const Checkpoint& target;
  std::vector<Work>& works;
  std::vector<ShardOp> ops;
};

using GoneTensor = std::pair<std::string, TensorRef>;  // a base tensor NEW does not have

// Pairs tensor `t` of NEW's file `nfile` with its base bytes at `src` (none:
// zeros). `build`: the file is built, so its tensors' checksums go in its list.
void add_work(ShardPlan& sp, std::size_t nfile, const TensorInfo& t, const TensorRef* src, bool build) {
  const auto& hdr = sp.target.shards[nfile].header;
  Work w;
  w.nfile = nfile;
  w.t = &t;
  w.noff = hdr.file_offset(t);
  w.nbytes = t.nbytes();
  w.es = sparse_elem_size(dtype_size(t.dtype) ? dtype_size(t.dtype) : 1, w.nbytes);
  w.chunks = sparse_chunk_count(w.nbytes, w.es);
  w.need_hash = build;
  if (src) {
    w.bfile = src->shard;
    w.boff = sp.base.shards[src->shard].header.file_offset(sp.base.info(*src));
    w.from = &sp.base.info(*src).name;
  } else {
    w.fresh = true;
  }
  sp.works.push_back(std::move(w));
}

// NEW's file `s` patched in place, if BASE's file of that name has the same
// header or the same tensor byte ranges (then its header is rewritten).
bool plan_in_place(ShardPlan& sp, std::size_t s) {
  const Shard& ns = sp.target.shards[s];
  const Shard* bs = sp.base.find_shard(ns.file);
  if (!bs || (bs->header.header != ns.header.header && !same_tensor_ranges(bs->header, ns.header))) return false;
  const std::size_t b = static_cast<std::size_t>(bs - sp.base.shards.data());
  if (bs->header.header != ns.header.header) {
    ShardOp op;
    op.file = ns.file;
    op.op = ShardOp::Op::header;
    for (std::size_t i = 0; i < ns.header.tensors.size(); ++i)
      if (ns.header.tensors[i].name != bs->header.tensors[i].name)
        op.renamed[ns.header.tensors[i].name] = bs->header.tensors[i].name;
    sp.ops.push_back(std::move(op));
  }
  for (std::size_t i = 0; i < ns.header.tensors.size(); ++i) {
    const TensorRef ref{b, i};
    add_work(sp, s, ns.header.tensors[i], &ref, false);
  }
  return true;
}

// NEW's file `s` built: each tensor's source is decided here and below; the
// list is filled in from the works once their checksums are known.
void plan_build(ShardPlan& sp, std::size_t s) {
  const Shard& ns = sp.target.shards[s];
  ShardOp op;
  op.file = ns.file;
  op.op = ShardOp::Op::build;
  op.size = ns.header.file_size;
  op.replaces = sp.base.find_shard(ns.file) != nullptr;
  for (const auto& t : ns.header.tensors) {
    const auto b = sp.base.tensors.find(t.name);
    add_work(sp, s, t, b != sp.base.tensors.end() && sp.base.info(b->second).nbytes() == t.nbytes() ? &b->second : nullptr, true);
  }
  sp.ops.push_back(std::move(op));
}

void plan_removes(ShardPlan& sp) {
  for (const auto& bs : sp.base.shards)
    if (!sp.target.find_shard(bs.file)) {
      ShardOp op;
      op.file = bs.file;
      op.op = ShardOp::Op::remove;
      sp.ops.push_back(std::move(op));
    }
}

// Base tensors gone from NEW of the length of some new tensor without a source.
std::vector<GoneTensor> gone_tensors(const ShardPlan& sp) {
  std::set<std::uint64_t> new_lengths;
  for (const auto& w : sp.works)
    if (w.fresh && w.nbytes > 0) new_lengths.insert(w.nbytes);
  std::vector<GoneTensor> gone;
  for (const auto& [name, ref] : sp.base.tensors)
    if (!sp.target.tensors.count(name) && new_lengths.count(sp.base.info(ref).nbytes())) gone.emplace_back(name, ref);
  return gone;
}

// A vanished base tensor becomes the source of a new one.
void take_source(const Checkpoint& base, Work& w, const GoneTensor& g) {
  w.fresh = false;
  w.bfile = g.second.shard;
  w.boff = base.shards[g.second.shard].header.file_offset(base.info(g.second));
  w.from = &base.info(g.second).name;
}

// Renames and moves: new tensors without a source that have the bytes of a
// base tensor gone from NEW, of the same length. Only those candidates are
// read an extra time.
void pair_by_checksum(ShardPlan& sp, const std::vector<GoneTensor>& gone, const std::vector<File>& base_files,
                      const std::vector<File>& new_files, int threads) {
  const Checkpoint& base = sp.base;
  std::set<std::uint64_t> gone_lengths;
  for (const auto& g : gone) gone_lengths.insert(base.info(g.second).nbytes());
  std::vector<std::size_t> orphans;
  for (std::size_t i = 0; i < sp.works.size(); ++i)
    if (sp.works[i].fresh && gone_lengths.count(sp.works[i].nbytes)) orphans.push_back(i);
  if (orphans.empty()) return;
  std::vector<Hash128> orphan_hash(orphans.size()), gone_hash(gone.size());
  parallel_for(orphans.size() + gone.size(), threads, [&](std::size_t k, std::size_t) {
    std::vector<std::uint8_t> buf;
    if (k < orphans.size()) {
      const Work& w = sp.works[orphans[k]];
      orphan_hash[k] = hash_file_range(new_files[w.nfile], w.noff, w.nbytes, buf);
    } else {
      const TensorRef& r = gone[k - orphans.size()].second;
      gone_hash[k - orphans.size()] =
          hash_file_range(base_files[r.shard], base.shards[r.shard].header.file_offset(base.info(r)), base.info(r).nbytes(), buf);
    }
  });
  using Key = std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>;  // length, checksum
  std::map<Key, std::size_t> by_content;  // first by name wins
  for (std::size_t g = 0; g < gone.size(); ++g)
    by_content.emplace(Key{base.info(gone[g].second).nbytes(), gone_hash[g].high, gone_hash[g].low}, g);
  for (std::size_t k = 0; k < orphans.size(); ++k) {
    Work& w = sp.works[orphans[k]];
    auto m = by_content.find(Key{w.nbytes, orphan_hash[k].high, orphan_hash[k].low});
    if (m != by_content.end()) take_source(base, w, gone[m->second]);
  }
}

// Renames whose bytes changed too: a new tensor and a vanished one that are
// the only ones of their dtype and shape are paired, so the entry carries
// their difference rather than every byte.
void pair_lone_renames(ShardPlan& sp, const std::vector<GoneTensor>& gone) {
  using Kind = std::pair<std::string, std::vector<std::uint64_t>>;
  std::map<Kind, std::vector<std::size_t>> new_of, gone_of;
  std::set<std::string> used;  // vanished tensors already taken by checksum
  for (std::size_t i = 0; i < sp.works.size(); ++i) {
    const Work& w = sp.works[i];
    if (w.fresh && w.nbytes > 0) new_of[{w.t->dtype, w.t->shape}].push_back(i);
    if (w.from) used.insert(*w.from);
  }
  for (std::size_t g = 0; g < gone.size(); ++g)
    if (!used.count(gone[g].first)) gone_of[{sp.base.info(gone[g].second).dtype, sp.base.info(gone[g].second).shape}].push_back(g);
  for (const auto& [kind, ws] : new_of) {
    auto it = gone_of.find(kind);
    if (ws.size() == 1 && it != gone_of.end() && it->second.size() == 1) take_source(sp.base, sp.works[ws[0]], gone[it->second[0]]);
  }
}

}  // namespace

// Decides, per weight file of NEW, how it is reached from BASE, and pairs
// every tensor of NEW with its base bytes (the `works`):
// - a file of BASE with the same name and header bytes: patched in place,
//   tensor by tensor (no operation);
// - the same name, header length and tensor byte ranges: the header is
//   rewritten in place and each tensor paired with the one at its range;
// - otherwise the file is built: each tensor from the base tensor of the same
//   name and length, else from a base tensor that is gone from NEW and has
//   the same bytes (a rename or a move, found by checksum), else from zeros;
// and base files NEW does not have are removed.
static std::vector<ShardOp> plan_shards(const Checkpoint& base, const Checkpoint& target, const std::vector<File>& base_files,
                                        const std::vector<File>& new_files, int threads, std::vector<Work>& works) {
  ShardPlan sp{base, target, works, {}};
  for (std::size_t s = 0; s < target.shards.size(); ++s)
    if (!plan_in_place(sp, s)) plan_build(sp, s);
  plan_removes(sp);
  const std::vector<GoneTensor> gone = gone_tensors(sp);
  pair_by_checksum(sp, gone, base_files, new_files, threads);
  pair_lone_renames(sp, gone);
  std::sort(sp.ops.begin(), sp.ops.end(), [](const ShardOp& a, const ShardOp& b) { return a.file < b.file; });
  return std::move(sp.ops);
}

namespace {

// BASE and NEW must be saves: a delta version diffed as a checkpoint, or a
// directory without weight files (a save still being written, an unmounted
// share), would publish "remove every weight file" to every host.
Checkpoint open_input(const fs::path& dir, const char* role) {
  if (is_delta_dir(dir))
    fail(Exit::bad_input, std::string(role) + " " + dir.string() + ": is a delta version, not a checkpoint");
  Checkpoint c = open_checkpoint(dir);
  if (c.shards.empty())
    fail(Exit::bad_input, std::string(role) + " " + dir.string() +
                              ": has no weight files (*.safetensors); not a checkpoint (a save still being written?)");
  return c;
}

// One delta-diff: its inputs and what the passes make of them.
struct DiffRun {
  const DiffOptions& opts;
  Checkpoint base, target;
  DiffSummary sum;
  std::vector<FileChange> files;  // non-weight files
  std::vector<File> base_files, new_files;
  std::vector<Work> works;
  std::vector<ShardOp> shard_ops;
  std::vector<Worker> workers;
};

// Non-weight files: whatever differs travels whole, whatever vanished is removed.
std::vector<FileChange> file_changes(const Checkpoint& base, const Checkpoint& target) {
  std::vector<FileChange> files;
  for (const auto& f : target.other_files) {
    const bool same = std::binary_search(base.other_files.begin(), base.other_files.end(), f) &&
                      same_contents(base.dir / f, target.dir / f);
    if (same) continue;
    const MappedFile m(target.dir / f);
    files.push_back({f, FileChange::Op::put, m.size(), xxh3_128(m.bytes())});
  }
  for (const auto& f : base.other_files)
    if (!std::binary_search(target.other_files.begin(), target.other_files.end(), f))
      files.push_back({f, FileChange::Op::remove, 0, {}});
  return files;
}

void open_weight_files(DiffRun& r) {
  for (const auto& sh : r.base.shards) {
    r.base_files.emplace_back(r.base.dir / sh.file, File::Mode::read);
    advise_sequential(r.base_files.back());
  }
  for (const auto& sh : r.target.shards) {
    r.new_files.emplace_back(r.target.dir / sh.file, File::Mode::read);
    advise_sequential(r.new_files.back());
    r.sum.full_bytes += r.new_files.back().size();
  }
  for (const auto& f : r.target.other_files) r.sum.full_bytes += size_of(r.target.dir / f);
}

void plan_tensors(DiffRun& r) {
  r.shard_ops = plan_shards(r.base, r.target, r.base_files, r.new_files, default_threads(r.opts.threads), r.works);
  for (const auto& op : r.shard_ops)
    (op.op == ShardOp::Op::remove ? r.sum.shards_removed : op.op == ShardOp::Op::header ? r.sum.shards_rewritten
                                                                                         : r.sum.shards_built) += 1;
}

void encode_tensors(DiffRun& r, const fs::path& tmp) {
  const int threads = default_threads(r.opts.threads);
  r.workers = std::vector<Worker>(static_cast<std::size_t>(threads));
  if (!r.opts.encoding || *r.opts.encoding == Encoding::sparse)
    sparse_pass(r.works, r.base_files, r.new_files, r.workers, tmp, r.opts, threads);
  else
    frame_pass(r.works, r.base_files, r.new_files, r.workers, tmp, r.opts, threads);
}

// The changed tensors, as the delta's entries (`of`: their works), counted
// into the summary with the rest.
std::vector<NewDeltaEntry> entries_of(DiffRun& r, std::vector<const Work*>& of) {
  DiffSummary& sum = r.sum;
  std::vector<NewDeltaEntry> entries;
  for (const Work& w : r.works) {
    const std::uint64_t elems = dtype_size(w.t->dtype) ? w.t->elements() : w.nbytes;
    sum.tensors += 1, sum.elements += elems, sum.tensor_bytes += w.nbytes;
    sum.tensors_new += w.fresh;
    if (!w.changed()) continue;
    std::uint64_t size = w.frame.size;
    if (w.encoding == Encoding::sparse) {
      size = kSparseHeadSize;
      for (const auto& rg : w.ranges) size += rg.body.size;
    }
    entries.push_back({w.t->name, r.target.shards[w.nfile].file, size, w.new_hash,
                       w.fresh ? std::nullopt : std::optional<Hash128>(w.base_hash), w.encoding});
    of.push_back(&w);
    (w.encoding == Encoding::sparse ? sum.tensors_sparse : w.encoding == Encoding::xor_bytes ? sum.tensors_xor
                                                                                             : sum.tensors_overwrite) += 1;
    sum.tensors_changed += 1, sum.elements_changed += w.elements_changed, sum.bytes_changed += w.bytes_changed;
  }
  return entries;
}

DeltaIndex index_of(const DiffRun& r) {
  DeltaIndex idx;
  idx.version = r.opts.version;
  idx.base_version = r.opts.base_version;
  // A structural delta records every entry's encoding (new tensors are
  // always xor against zeros), which also makes readers of the plain
  // layout refuse it instead of patching tensors by name.
  idx.per_tensor = !r.opts.encoding || !r.shard_ops.empty();
  idx.encoding = r.opts.encoding.value_or(Encoding::xor_bytes);
  idx.files = r.files;
  idx.shards = r.shard_ops;
  return idx;
}

// The new headers of rewritten and built weight files, into the delta and
// (their checksums, a built file's tensors) into its index.
void place_headers(const DiffRun& r, DeltaIndex& idx, DeltaWriter& out) {
  std::map<std::string, const Work*> work_of;
  for (const Work& w : r.works) work_of[w.t->name] = &w;
  for (ShardOp& op : idx.shards) {
    if (op.op == ShardOp::Op::remove) continue;
    const std::string prefix = header_prefix(r.target.find_shard(op.file)->header);
    op.header_size = prefix.size();
    op.header_hash = xxh3_128({reinterpret_cast<const std::uint8_t*>(prefix.data()), prefix.size()});
    if (op.op == ShardOp::Op::header) {
      const std::string old = header_prefix(r.base.find_shard(op.file)->header);
      op.base_header_hash = xxh3_128({reinterpret_cast<const std::uint8_t*>(old.data()), old.size()});
    }
    for (const TensorInfo& t : r.target.find_shard(op.file)->header.tensors) {
      const Work& w = *work_of.at(t.name);
      op.tensors.push_back({t.name, w.fresh ? std::nullopt : std::optional<std::string>(*w.from), w.new_hash});
    }
    out.put_header(op.file, prefix);
  }
}

// An entry's bytes, gathered from the spools: the sparse entry head and its
// ranges' chunks, or its one frame.
void write_entry(const Work& w, const std::vector<Worker>& workers, File& f, std::uint64_t at) {
  auto copy = [&](const Seg& sg) {
    const Worker& from = workers[static_cast<std::size_t>(sg.spool)];
    copy_range(sg.in_xspool ? from.xspool.file : from.spool.file, sg.offset, sg.size, f, at);
    at += sg.size;
  };
  if (w.encoding != Encoding::sparse) return copy(w.frame);
  std::uint8_t head[kSparseHeadSize];
  sparse_entry_head(w.es, w.nbytes, head);
  f.pwrite_all(head, sizeof head, at);
  at += sizeof head;
  for (const auto& rg : w.ranges) copy(rg.body);
}

void remove_spools(std::vector<Worker>& workers, const fs::path& tmp) {
  for (std::size_t t = 0; t < workers.size(); ++t) {
    if (workers[t].spool.file.fd() >= 0) {
      workers[t].spool.file.close();
      fs::remove(tmp / (".spool-" + std::to_string(t)));
    }
    if (workers[t].xspool.file.fd() >= 0) {
      workers[t].xspool.file.close();
      fs::remove(tmp / (".xspool-" + std::to_string(t)));
    }
  }
}

// Encodes the tensors and writes the delta into `out`'s temporary directory.
void write_delta(DiffRun& r, DeltaWriter& out) {
  encode_tensors(r, out.tmp);
  std::vector<const Work*> of;
  const std::vector<NewDeltaEntry> entries = entries_of(r, of);
  DeltaIndex idx = index_of(r);
  place_headers(r, idx, out);
  // One delta file per changed weight file, entries by name, so the output
  // does not depend on thread scheduling.
  out.write_entries(idx, entries, [&](std::size_t i, File& f, std::uint64_t at) { write_entry(*of[i], r.workers, f, at); });
  remove_spools(r.workers, out.tmp);
  for (const auto& fc : r.files) {
    if (fc.op != FileChange::Op::put) continue;
    out.copy_file(fc.path, r.target.dir / fc.path);
    r.sum.files_changed += 1;
  }
  for (const auto& fc : r.files) r.sum.files_removed += fc.op == FileChange::Op::remove;
  r.sum.delta_bytes = out.publish(idx);
}

}  // namespace

DiffSummary diff_checkpoints(const fs::path& base_dir, const fs::path& new_dir, const fs::path& out_arg,
                             const DiffOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path out = fs::absolute(out_arg);
  check_delta_out(out);
  DiffRun r{opts, open_input(base_dir, "BASE"), open_input(new_dir, "NEW"), {}, {}, {}, {}, {}, {}, {}};
  r.sum.version = opts.version;
  r.sum.base_version = opts.base_version;
  r.files = file_changes(r.base, r.target);
  open_weight_files(r);
  plan_tensors(r);
  DeltaWriter writer(out, opts.sync);
  try {
    write_delta(r, writer);
  } catch (...) {
    r.workers.clear();  // the spools closed before their directory goes
    writer.abandon();
    throw;
  }
  r.sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r.sum;
}

std::vector<std::string> diff_warnings(const DiffSummary& s) {
  std::vector<std::string> w;
  if (2 * s.elements_changed > s.elements)
    w.push_back(std::to_string(s.elements_changed) + " of " + std::to_string(s.elements) +
                " elements changed (more than half); are BASE and NEW successive saves of the same model?");
  if (s.delta_bytes > s.tensor_bytes)
    w.push_back("the delta (" + std::to_string(s.delta_bytes) + " bytes) is larger than NEW's weights (" +
                std::to_string(s.tensor_bytes) + " bytes); are BASE and NEW successive saves of the same model?");
  return w;
}

}  // namespace hfdelta
