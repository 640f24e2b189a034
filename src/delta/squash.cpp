#include "hfdelta/squash.hpp"

#include <sys/mman.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>

#include <boost/filesystem/operations.hpp>
#include <nlohmann/json.hpp>

#include "codec/codec.hpp"
#include "codec/codec_internal.hpp"
#include "delta/delta_format_internal.hpp"
#include "delta/delta_reader.hpp"
#include "delta/delta_writer.hpp"
#include "delta/parts.hpp"
#include "format/root_commit.hpp"
#include "hfdelta/checkpoint.hpp"
#include "hfdelta/delta_format.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/hash.hpp"
#include "hfdelta/progress.hpp"
#include "hfdelta/safetensors.hpp"
#include "hfdelta/version.hpp"
#include "util/io.hpp"
#include "util/json_text.hpp"
#include "util/parallel.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

namespace {

// One delta of the chain, its entry files mapped.
struct MappedLink {
  fs::path dir;
  DeltaIndex idx;
  std::map<std::string, MappedFile> maps;  // delta file -> mapping
  std::map<std::string, SafetensorsHeader> headers;
};

// One entry laid over a tensor.
struct Op {
  std::size_t link = 0;
  std::string name;  // the entry's name in that delta
  Encoding enc = Encoding::xor_bytes;
  std::span<const std::uint8_t> frame;
  std::optional<Hash128> base_hash;
  Hash128 new_hash;  // of the tensor after it
};

// Where a tensor's bytes come from in the first base, and what lies over them.
struct Trace {
  std::optional<std::string> origin;  // a tensor of the first base; none: zeros
  std::vector<Op> ops;
  std::optional<Hash128> hash;      // of its current bytes, where known
  std::optional<std::string> file;  // the weight file it is in, where known
};

// A weight file some delta of the chain changed structurally.
struct FileState {
  enum class Kind { header, built, removed } kind = Kind::header;
  bool existed = false;  // the first base has a weight file of this name
  Hash128 base_header;   // header: the first base's header checksum
  fs::path header;       // header, built: the newest header bytes
  std::uint64_t header_size = 0;
  Hash128 header_hash;
  std::uint64_t size = 0;  // built
};

// A header file of a delta (a weight file's header without its data).
SafetensorsHeader header_of(const fs::path& p) {
  const std::string bytes = read_small_file(p, 8 + kHeaderJson.bytes);
  const std::string w = p.string();
  // The file size the header implies: where its last tensor ends.
  std::uint64_t end = 0;
  try {
    if (bytes.size() < 8) throw std::runtime_error("too short");
    const auto j = parse_json_text(std::string_view(bytes).substr(8), w, "header", kHeaderJson);
    for (auto it = j.begin(); it != j.end(); ++it)
      if (it.key() != "__metadata__") end = std::max(end, it.value().at("data_offsets").at(1).get<std::uint64_t>());
  } catch (const std::exception& e) {
    fail(Exit::bad_input, w, std::string("not a safetensors header: ") + e.what());
  }
  return parse_safetensors(bytes, bytes.size() + end, w);
}

// Tensor names and lengths of a header file, in data order (the order the
// safetensors reader gives, which delta-apply checks build lists against).
std::vector<std::pair<std::string, std::uint64_t>> header_tensors(const fs::path& p) {
  const SafetensorsHeader h = header_of(p);
  std::vector<std::pair<std::string, std::uint64_t>> out;
  for (const auto& t : h.tensors) out.emplace_back(t.name, t.nbytes());
  return out;
}

// What composing entries element by element means for an encoding. Context
// entries compose with nothing: their positions count base elements, so
// without the base bytes each stays a part of its own (with them, see
// compose_on_base). Parts entries neither: their regions' parts code regions
// of the tensor in chunks of their own, and record the regions' checksums,
// not the tensor's; each stays a stacked layer of its own.
enum class Kind { mask, add, set, context, parts };
Kind kind_of(const Op& op, const std::string& what) {
  switch (op.enc) {
    case Encoding::xor_bytes:
      return Kind::mask;
    case Encoding::overwrite:
      return Kind::set;
    case Encoding::context:
      return Kind::context;
    case Encoding::parts:
      return Kind::parts;
    case Encoding::sparse:  // "HFS1" entries hold XOR values, "HFS2" differences
      return read_sparse_head(op.frame, what).op == SparseOp::xor_bytes ? Kind::mask : Kind::add;
    case Encoding::stack:  // split into its layers when the chain is read
      break;
  }
  fail(Exit::failure, what + ": a stacked entry reached the composer");
}

// A tensor-sized scratch buffer: a file in the output's temporary directory,
// mapped shared, so memory does not grow with the tensor (the page cache
// holds it, and writes it back under pressure).
class ScratchFile {
 public:
  ScratchFile(const fs::path& p, std::uint64_t n, std::uint8_t fill) : file_(p, File::Mode::create_exclusive), n_(n) {
    file_.reserve(n);  // a mapping of blocks never allocated dies of SIGBUS on a full disk
    if (n == 0) return;
    void* m = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, file_.fd(), 0);
    if (m == MAP_FAILED) fail(Exit::failure, p, std::string("mmap: ") + std::strerror(errno));
    p_ = static_cast<std::uint8_t*>(m);
    if (fill) std::memset(p_, fill, n);
  }
  ~ScratchFile() {
    if (p_) ::munmap(p_, n_);
    boost::system::error_code ec;
    const fs::path path = file_.path();
    file_.close();
    fs::remove(path, ec);
  }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  std::span<std::uint8_t> bytes() { return {p_, static_cast<std::size_t>(n_)}; }

 private:
  File file_;
  std::uint64_t n_;
  std::uint8_t* p_ = nullptr;
};

// Zero bytes of any length without memory: an anonymous read-only mapping.
class Zeros {
 public:
  explicit Zeros(std::uint64_t n) : n_(n) {
    if (n == 0) return;
    void* m = ::mmap(nullptr, n, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) fail(Exit::failure, std::string("mmap of zeros: ") + std::strerror(errno));
    p_ = static_cast<const std::uint8_t*>(m);
  }
  ~Zeros() {
    if (p_) ::munmap(const_cast<std::uint8_t*>(p_), n_);
  }
  Zeros(const Zeros&) = delete;
  Zeros& operator=(const Zeros&) = delete;
  std::span<const std::uint8_t> bytes() const { return {p_, static_cast<std::size_t>(n_)}; }

 private:
  std::uint64_t n_;
  const std::uint8_t* p_ = nullptr;
};

void lay(const Op& op, std::span<std::uint8_t> buf, const fs::path& scratch, const std::string& what);

// A parts entry over the tensor's real bytes `buf`: each region's part laid
// over the region's bytes (gathered, row-major, into a scratch file where the
// region is not contiguous) and checked against the part's checksum.
void lay_parts(const Op& op, std::span<std::uint8_t> buf, const fs::path& scratch, const std::string& what) {
  const PartsEntry pe = read_parts(op.frame, op.new_hash, what);
  if (pe.m.bytes() != buf.size())
    fail(Exit::bad_input, what + ": its parts are of a tensor of " + std::to_string(pe.m.bytes()) +
                              " bytes, the entries before it of " + std::to_string(buf.size()));
  for (std::size_t i = 0; i < pe.parts.size(); ++i) {
    const PartRecord& pr = pe.parts[i];
    const Region& g = pr.region;
    const std::uint64_t row_bytes = g.cols * pe.m.es, first = (g.row0 * pe.m.cols + g.col0) * pe.m.es;
    const auto row = [&](std::uint64_t r) { return buf.subspan(first + r * pe.m.cols * pe.m.es, row_bytes); };
    const std::string pw = what + " (part " + std::to_string(i + 1) + ")";
    Op q = op;
    q.enc = pr.enc;
    q.frame = pr.bytes;
    if (g.contiguous(pe.m)) {
      const auto region = buf.subspan(first, g.rows * row_bytes);
      lay(q, region, scratch, pw);
      if (const Hash128 h = xxh3_128(region); h != pr.hash)
        fail(Exit::verify_failed, pw + ": gives its region checksum " + h.hex() + ", it records " + pr.hash.hex());
      continue;
    }
    ScratchFile region(scratch, g.rows * row_bytes, 0);
    for (std::uint64_t r = 0; r < g.rows; ++r) std::ranges::copy(row(r), region.bytes().begin() + r * row_bytes);
    lay(q, region.bytes(), scratch, pw);
    if (const Hash128 h = xxh3_128(region.bytes()); h != pr.hash)
      fail(Exit::verify_failed, pw + ": gives its region checksum " + h.hex() + ", it records " + pr.hash.hex());
    for (std::uint64_t r = 0; r < g.rows; ++r)
      std::ranges::copy(region.bytes().subspan(r * row_bytes, row_bytes), row(r).begin());
  }
}

// Lays one entry over `buf` with its own meaning (XOR, add, set). A context
// or parts entry only over the tensor's real bytes; a parts entry's regions
// are gathered into `scratch` where they are not contiguous.
void lay(const Op& op, std::span<std::uint8_t> buf, const fs::path& scratch, const std::string& what) {
  thread_local Decompressor d1, d2;
  switch (op.enc) {
    case Encoding::xor_bytes:
      decode_xor(d1, op.frame, buf.size(), what, [&](std::uint64_t off, std::span<const std::uint8_t> x) {
        for (std::size_t i = 0; i < x.size(); ++i) buf[off + i] ^= x[i];
      });
      break;
    case Encoding::sparse:
      decode_sparse(
          op.frame, buf.size(), what,
          [&](std::span<const std::uint64_t> offs, std::span<const std::uint8_t> v, std::size_t es, SparseOp sop) {
            for (std::size_t i = 0; i < offs.size(); ++i)
              sparse_apply_value(buf.data() + offs[i], v.data() + i * es, es, sop);
          });
      break;
    case Encoding::overwrite:
      decode_overwrite(d1, d2, op.frame, buf.size(), what,
                       [&](std::span<const std::uint64_t> pos, std::span<const std::uint8_t> v) {
                         for (std::size_t i = 0; i < pos.size(); ++i) buf[pos[i]] = v[i];
                       });
      break;
    case Encoding::context:  // only over the tensor's own bytes (from zeros, or the base checkpoint's)
      decode_context(
          op.frame, buf.size(), what,
          [&](std::uint64_t off, std::size_t n) { return std::span<const std::uint8_t>(buf.subspan(off, n)); },
          [&](std::span<const std::uint64_t> offs, std::span<const std::uint8_t> v, std::size_t es, SparseOp sop) {
            for (std::size_t i = 0; i < offs.size(); ++i)
              sparse_apply_value(buf.data() + offs[i], v.data() + i * es, es, sop);
          });
      break;
    case Encoding::parts:
      lay_parts(op, buf, scratch, what);
      break;
    case Encoding::stack:  // split into its layers when the chain is read
      fail(Exit::failure, what + ": a stacked entry reached the composer");
  }
}

// The tensor length an entry reveals, if it does.
std::optional<std::uint64_t> length_of(const Op& op, const std::string& what) {
  switch (op.enc) {
    case Encoding::sparse:
      return read_sparse_head(op.frame, what).nbytes;
    case Encoding::parts:
      return read_parts(op.frame, op.new_hash, what).m.bytes();
    case Encoding::context:
      if (op.frame.size() >= kContextHeadSize) return get_le64(op.frame.data() + 8);
      return std::nullopt;
    case Encoding::xor_bytes: {
      const unsigned long long n = ZSTD_getFrameContentSize(op.frame.data(), op.frame.size());
      if (n != ZSTD_CONTENTSIZE_UNKNOWN && n != ZSTD_CONTENTSIZE_ERROR) return n;
      return std::nullopt;
    }
    case Encoding::overwrite:  // positions only
    case Encoding::stack:
      return std::nullopt;
  }
  return std::nullopt;
}

// One part of an entry of OUT: taken whole from a delta, or composed into a
// spool file.
struct Piece {
  Encoding enc = Encoding::xor_bytes;
  std::span<const std::uint8_t> bytes;  // taken whole
  fs::path composed;                    // or composed here
  std::uint64_t size = 0;
  Hash128 hash;  // of the tensor after it
};

// One entry of the chain, taken as it is.
Piece as_is(const Op& op) { return {op.enc, op.frame, {}, op.frame.size(), op.new_hash}; }

// One entry of OUT: one piece, or several stacked; none where the changes
// cancel out (no entry).
struct OutEntry {
  std::string name;
  std::string file;  // weight file it patches ("" where not known)
  std::vector<Piece> pieces;
  Hash128 new_hash;
  std::optional<Hash128> base_hash;
  std::optional<std::uint64_t> changed;  // elements; known where composed on the base checkpoint
  Encoding enc() const { return pieces.size() == 1 ? pieces[0].enc : Encoding::stack; }
  std::uint64_t size() const {
    if (pieces.size() == 1) return pieces[0].size;
    std::uint64_t n = kStackHeadSize + pieces.size() * kStackLayerSize;
    for (const Piece& p : pieces) n += p.size;
    return n;
  }
};

// Composes `ops` (one run: entries that compose element by element, or a
// tensor from zeros) into one piece at `path`. Returns false where the
// changes cancel out, or a tensor from zeros ends all zero (a built file
// starts as zeros): no piece is needed.
bool compose(std::span<const Op> ops, bool from_zeros, std::uint64_t n, Piece& out, const fs::path& path, int level,
             const std::string& what) {
  const Kind k0 = kind_of(ops.front(), what);
  const std::uint32_t es0 = k0 == Kind::add ? read_sparse_head(ops.front().frame, what).es : 0;
  const fs::path a_path = path.string() + "-a", b_path = path.string() + "-b";
  Compressor c(level);
  File f(path, File::Mode::create_exclusive);
  std::uint64_t at = 0;
  const ByteSink sink = [&](std::span<const std::uint8_t> s) {
    f.pwrite_all(s.data(), s.size(), at);
    at += s.size();
  };
  bool nothing = false;
  if (from_zeros || k0 != Kind::set) {
    // From zeros: the tensor's bytes themselves. Otherwise the combined mask
    // or difference, laid over zeros.
    ScratchFile a(a_path, n, 0);
    for (const Op& op : ops) lay(op, a.bytes(), path.string() + "-region", what);
    auto v = a.bytes();
    nothing = std::all_of(v.begin(), v.end(), [](std::uint8_t x) { return x == 0; });
    if (!nothing) {
      const Zeros zeros(n);
      if (!from_zeros && k0 == Kind::add) {
        out.enc = Encoding::sparse;
        encode_sparse(c, zeros.bytes(), v, es0 ? es0 : 1, sink);
      } else {
        out.enc = Encoding::xor_bytes;
        encode_xor(c, zeros.bytes(), v, sink);
      }
    }
  } else {
    // Overwrites: laid over zeros and over 0xff, a byte is set where the two
    // agree. The second buffer becomes the "old" bytes that differ exactly there.
    ScratchFile a(a_path, n, 0), b(b_path, n, 0xff);
    for (const Op& op : ops)
      lay(op, a.bytes(), path.string() + "-region", what), lay(op, b.bytes(), path.string() + "-region", what);
    auto va = a.bytes();
    auto vb = b.bytes();
    std::uint64_t count = 0;
    for (std::size_t i = 0; i < va.size(); ++i) {
      const bool set = va[i] == vb[i];
      count += set;
      vb[i] = set ? static_cast<std::uint8_t>(~va[i]) : va[i];
    }
    nothing = count == 0;
    if (!nothing) {
      out.enc = Encoding::overwrite;
      encode_overwrite(c, vb, va, count, sink);
    }
  }
  out.composed = f.path();
  out.size = at;
  out.hash = ops.back().new_hash;
  f.close();
  if (nothing) fs::remove(path);
  return !nothing;
}

// The entries of one trace as OUT's entry (see squash.hpp): from zeros, all
// composed into one; otherwise each run of entries that compose element by
// element (same kind; sparse differences of one element size) becomes one
// piece, and runs of different kinds are stacked, in order, since they do
// not compose without the base bytes. Spool files are named `spool`-<run>.
void compose_trace(const Trace& tr, std::uint64_t n, OutEntry& out, const fs::path& spool, int level,
                   const std::vector<MappedLink>& links) {
  const std::string what = "entries of '" + out.name + "' in " + links[tr.ops.front().link].dir.string() + " .. " +
                           links[tr.ops.back().link].dir.string();
  // What decides whether two entries compose, read once per entry (none
  // needed from zeros: everything composes there).
  std::vector<std::pair<Kind, std::uint32_t>> keys;
  if (tr.origin)
    for (const Op& op : tr.ops) {
      const Kind k = kind_of(op, what);
      // A context or parts entry's key is its own: a run of one.
      keys.emplace_back(k, k == Kind::add                           ? read_sparse_head(op.frame, what).es
                           : k == Kind::context || k == Kind::parts ? static_cast<std::uint32_t>(keys.size())
                                                                    : 0u);
    }
  std::vector<std::span<const Op>> runs;
  for (std::size_t i = 0; i < tr.ops.size();) {
    std::size_t j = i + 1;
    while (j < tr.ops.size() && (!tr.origin || keys[j] == keys[i])) ++j;
    runs.push_back(std::span<const Op>(tr.ops).subspan(i, j - i));
    i = j;
  }
  for (std::size_t r = 0; r < runs.size(); ++r) {
    Piece p;
    if (runs[r].size() == 1 && tr.origin) {  // one entry: as it is
      p = as_is(runs[r][0]);
    } else if (!compose(runs[r], !tr.origin, n, p, spool.string() + "-" + std::to_string(r), level, what)) {
      continue;
    }
    out.pieces.push_back(std::move(p));
  }
}

using Traces = std::map<std::string, Trace>;

// What the chain so far leaves of a tensor: its checksum, or, after a parts
// entry (which records its regions' checksums, not the tensor's), none; then
// the checksum of the bytes that parts entry changed, where known.
struct Left {
  std::optional<Hash128> hash;
  std::optional<Hash128> before;
  std::uint64_t version = 0;  // the version of that parts entry
};

// One --squash: the chain, what happened to each tensor and weight file
// along it, and OUT as it is made.
struct SquashContext {
  const SquashOptions& opts;
  SquashSummary sum{};
  std::vector<MappedLink> links{};
  Traces traces{};  // tensors something happened to, by current name
  std::map<std::string, FileState> files{};
  std::map<std::string, std::pair<std::size_t, FileChange>> file_ops{};  // path -> (link, last operation)
  DeltaIndex idx{};
  std::map<std::string, std::vector<std::pair<std::string, std::uint64_t>>> built{};  // file -> tensors
  std::vector<OutEntry> entries{};
  std::vector<const Trace*> of{};      // entries[i]'s trace
  std::optional<Checkpoint> base{};    // SquashOptions::base, opened
  std::map<std::string, Left> left{};  // check_connects: what the links so far leave
};

// A tensor's trace so far: untouched ones come from the first base's tensor of that name.
Trace trace_of(const Traces& from, const std::string& name) {
  if (auto it = from.find(name); it != from.end()) return it->second;
  Trace t;
  t.origin = name;
  return t;
}

// The checksum of the tensor's bytes just before the last parts entry `e`
// ends with (itself, or its stack's last layer) changed them, where the delta
// tells it: the entry's base, or the stacked layer before it.
std::optional<Hash128> before_parts(const DeltaEntry& e) {
  if (e.parts || e.layers.size() < 2) return e.base_hash;
  const std::size_t i = e.layers.size() - 2;
  if (e.layer_parts[i]) return std::nullopt;
  return e.layers[i].hash;
}

// Each delta's entries must start from the bytes the deltas before it left
// (their recorded checksums): a version published on the wrong base (a
// retried job, a stale BASE) breaks the chain, and a squash across it would
// publish a delta no host can apply. Names move in a delta that changes the
// layout: what it left is all that is known after it. After a parts entry the
// tensor's checksum is not in the delta (only the hosts that apply it hash
// it); what can still be told is an entry published on the bytes before the
// parts entry changed them (a parts entry only has parts for regions that
// changed): that one is refused too. --squash-base checks the rest.
void check_connects(std::map<std::string, Left>& left, const OpenDelta& v) {
  for (const DeltaEntry& e : v.entries) {
    const auto it = left.find(e.tensor());
    if (it == left.end() || !e.base_hash || v.index.structural()) continue;
    const Left& l = it->second;
    const std::string file = v.path_of(e);
    const std::string head =
        "tensor '" + e.tensor() + "' applies on top of bytes of checksum " + e.base_hash->hex() + ", but ";
    const std::string tail = ": the chain does not connect (version " + format_version(v.index.version) +
                             " was published on another base); nothing was written";
    if (l.hash && *l.hash != *e.base_hash)
      fail(Exit::bad_input, file, head + "the versions before it leave " + l.hash->hex() + tail);
    if (!l.hash && l.before == e.base_hash)
      fail(Exit::bad_input, file,
           head + "those are its bytes before the parts entry of version " + format_version(l.version) +
               " changed them" + tail);
  }
  if (v.index.structural()) left.clear();
  for (const DeltaEntry& e : v.entries) {
    const NewBytes nb = new_bytes_of(e);
    left[e.tensor()] =
        nb.whole ? Left{nb.whole, std::nullopt, 0} : Left{std::nullopt, before_parts(e), v.index.version};
  }
}

void open_links(SquashContext& ctx, const std::vector<fs::path>& chain) {
  for (const fs::path& d : chain) {
    std::optional<DeltaIndex> index = read_index_if_delta(d);
    if (!index) fail(Exit::bad_input, d, "is not a delta version (a full version cannot be squashed)");
    if (index->checksum_format == ChecksumFormat::adler32)
      fail(Exit::unsupported, d,
           "records adler32 checksums (checksum_format \"adler32\"), and --squash composes "
           "only xxh3-128 deltas; pull these versions one by one with delta-apply, or have the "
           "publisher write xxh3-128 (--update-weight-delta-checksum xxh3-128)");
    MappedLink l;
    l.dir = d;
    // Opened as delta-apply and --inspect open a delta: nothing is read
    // through a symlink, carried files and headers are what the index records.
    OpenDelta v = open_delta(d, std::move(*index));
    if (!ctx.links.empty() && v.index.base_version != ctx.links.back().idx.version)
      fail(Exit::bad_input, d,
           "applies on top of version " + format_version(v.index.base_version) + ", not " +
               format_version(ctx.links.back().idx.version) + " (" + ctx.links.back().dir.string() + ")");
    check_connects(ctx.left, v);
    l.idx = std::move(v.index);
    l.maps = std::move(v.maps);
    l.headers = std::move(v.headers);
    ctx.sum.input_bytes += tree_bytes(d);
    ctx.links.push_back(std::move(l));
  }
}

// A delta that changes the layout needs to know which weight file every
// tensor patched so far is in.
void check_files_known(const SquashContext& ctx, const MappedLink& l) {
  if (!l.idx.structural()) return;
  for (const auto& [name, t] : ctx.traces)
    if (!t.file)
      fail(Exit::unsupported,
           "cannot squash: " + l.dir.string() + " changes the weight files' layout, and tensor '" + name +
               "' was patched by an earlier delta that does not record which weight file its entries patch "
               "(hfdelta_targets; written by newer builds)");
}

// A header rewritten in place: its tensors keep their bytes, under new names.
void trace_header_op(SquashContext& ctx, const ShardOp& so, const FileState& st, const Traces& prev) {
  for (const auto& [name, len] : header_tensors(st.header)) {
    auto r = so.renamed.find(name);
    const std::string src = r != so.renamed.end() ? r->second : name;
    if (src == name && !prev.count(src)) continue;  // untouched, under its own name
    Trace t = trace_of(prev, src);
    t.file = so.file;
    ctx.traces[name] = std::move(t);
  }
}

// A file built: each tensor from a base tensor (its trace so far) or zeros.
void trace_build_op(SquashContext& ctx, const ShardOp& so, const Traces& prev) {
  for (const auto& t : so.tensors) {
    Trace tr;
    if (t.from) tr = trace_of(prev, *t.from);
    tr.file = so.file;
    tr.hash = t.hash;
    ctx.traces[t.name] = std::move(tr);
  }
}

void trace_shard_op(SquashContext& ctx, const MappedLink& l, const ShardOp& so, const Traces& prev) {
  const std::string what = (l.dir / kIndexFile).string() + ": hfdelta_shards \"" + so.file + "\"";
  std::erase_if(ctx.traces, [&](const auto& kv) { return kv.second.file == so.file; });
  auto [it, fresh] = ctx.files.try_emplace(so.file);
  FileState& st = it->second;
  if (fresh) {
    st.existed = so.op != ShardOp::Op::build || so.replaces;
    st.kind = FileState::Kind::removed;  // set below
  }
  if (so.op == ShardOp::Op::remove) {
    st.kind = FileState::Kind::removed;
    return;
  }
  st.header = l.dir / kHeadersDir / so.file;
  st.header_size = so.header_size;
  st.header_hash = so.header_hash;
  if (so.op == ShardOp::Op::header) {
    if (fresh) st.kind = FileState::Kind::header, st.base_header = so.base_header_hash;
    if (st.kind == FileState::Kind::removed && !fresh)
      fail(Exit::bad_input, what + ": rewrites the header of a removed file");
    return trace_header_op(ctx, so, st, prev);
  }
  st.kind = FileState::Kind::built;
  st.size = so.size;
  trace_build_op(ctx, so, prev);
}

// Entry `ti` of delta file `file` of link `k`, laid over its tensor's trace
// (a stacked entry as its layers, in order).
void trace_entry(SquashContext& ctx, std::size_t k, const std::string& file, const SafetensorsHeader& hdr,
                 const TensorInfo& ti, const Traces& prev) {
  const MappedLink& l = ctx.links[k];
  const std::string w = (l.dir / file).string();
  const Hash128 checksum = check_delta_entry(l.idx, file, hdr, ti, w).xxh3;
  Op op;
  op.link = k;
  op.name = ti.name;
  op.enc = encoding_of(l.idx, ti.name);
  op.frame = l.maps.at(file).bytes(hdr.file_offset(ti), ti.nbytes());
  op.new_hash = checksum;
  if (auto b = l.idx.base_checksums.find(ti.name); b != l.idx.base_checksums.end()) op.base_hash = b->second;
  Trace& tr = ctx.traces.try_emplace(ti.name, trace_of(prev, ti.name)).first->second;
  if (const auto target = l.idx.targets.find(file); target != l.idx.targets.end()) {
    if (tr.file && *tr.file != target->second)
      fail(Exit::bad_input, w,
           "entry '" + ti.name + "' patches " + target->second + ", but the tensor is in " + *tr.file);
    tr.file = target->second;
  }
  // A parts entry (also as the last layer of a stack) records the checksum
  // of its head, not of the tensor: the tensor's is unknown from then on.
  bool whole = op.enc != Encoding::parts;
  if (op.enc == Encoding::stack) {  // a squashed delta in the chain: its layers, in order
    const std::vector<StackLayer> parts =
        about_file(w, [&] { return read_stack(op.frame, checksum, w + ": entry '" + ti.name + "'"); });
    for (std::size_t i = 0; i < parts.size(); ++i) {
      Op po = op;
      po.enc = parts[i].enc;
      po.frame = parts[i].bytes;
      po.new_hash = parts[i].hash;
      if (i) po.base_hash.reset();
      tr.ops.push_back(std::move(po));
    }
    whole = parts.back().enc != Encoding::parts;
  } else {
    tr.ops.push_back(std::move(op));
  }
  tr.hash = whole ? std::optional<Hash128>(checksum) : std::nullopt;
}

// What delta `k` of the chain does to each tensor and file.
void trace_link(SquashContext& ctx, std::size_t k) {
  const MappedLink& l = ctx.links[k];
  check_files_known(ctx, l);
  const Traces prev = ctx.traces;
  for (const ShardOp& so : l.idx.shards) trace_shard_op(ctx, l, so, prev);
  for (const auto& [file, hdr] : l.headers)
    for (const auto& ti : hdr.tensors) trace_entry(ctx, k, file, hdr, ti, prev);
  for (const FileChange& fc : l.idx.files) ctx.file_ops[fc.path] = {k, fc};
}

// A tensor of a weight file OUT builds must end at a checksum of its own
// (delta-apply checks a built file tensor by tensor, and lays no parts entry
// there): one with a parts entry among its entries is squashed only
// composed against the base checkpoint's bytes, and only where its last
// entry records the tensor's checksum.
void refuse_built_parts(const SquashContext& ctx, const Trace& t, const std::string& name, const std::string& file) {
  const auto parts = std::find_if(t.ops.begin(), t.ops.end(), [](const Op& op) { return op.enc == Encoding::parts; });
  if (parts == t.ops.end() || (ctx.base && t.origin && t.hash)) return;
  fail(Exit::unsupported, "cannot squash: tensor '" + name + "' is in weight file " + file +
                              ", which the squashed delta builds, and was patched by a parts entry (" +
                              ctx.links[parts->link].dir.string() + ", a sharded publisher's)" +
                              (t.hash ? "; give the chain's first base checkpoint (--squash-base) to compose it"
                                      : ", the last of its entries, which records no checksum of the whole tensor") +
                              ", or squash the versions before and after that layout change apart");
}

// OUT's operation on a weight file the chain changed; none where it was
// created and removed within the chain.
std::optional<ShardOp> out_shard_op(SquashContext& ctx, const std::string& file, const FileState& st) {
  ShardOp so;
  so.file = file;
  if (st.kind == FileState::Kind::removed) {
    if (!st.existed) return std::nullopt;
    so.op = ShardOp::Op::remove;
    return so;
  }
  so.header_size = st.header_size;
  so.header_hash = st.header_hash;
  if (st.kind == FileState::Kind::header) {
    so.op = ShardOp::Op::header;
    so.base_header_hash = st.base_header;
    for (const auto& [name, t] : ctx.traces)
      if (t.file == file && t.origin && *t.origin != name) so.renamed[name] = *t.origin;
    return so;
  }
  so.op = ShardOp::Op::build;
  so.size = st.size;
  so.replaces = st.existed;
  auto& ts = ctx.built[file] = header_tensors(st.header);
  for (const auto& [name, len] : ts) {
    auto it = ctx.traces.find(name);
    if (it != ctx.traces.end() && it->second.file == file) refuse_built_parts(ctx, it->second, name, file);
    if (it == ctx.traces.end() || !it->second.hash || it->second.file != file)
      fail(Exit::bad_input, st.header, "tensor '" + name + "' is not accounted for by the chain's hfdelta_shards");
    so.tensors.push_back({name, it->second.origin, *it->second.hash});
  }
  return so;
}

void out_shard_ops(SquashContext& ctx) {
  for (const auto& [file, st] : ctx.files)
    if (auto so = out_shard_op(ctx, file, st)) ctx.idx.shards.push_back(std::move(*so));
}

// OUT's entries: one per traced tensor with entries, in a file that stays.
void out_entries(SquashContext& ctx) {
  for (const auto& [name, t] : ctx.traces) {
    if (t.ops.empty()) continue;
    if (t.file) {
      auto fs_it = ctx.files.find(*t.file);
      if (fs_it != ctx.files.end() && fs_it->second.kind == FileState::Kind::removed) continue;
    }
    OutEntry e;
    e.name = name;
    e.file = t.file.value_or("");
    e.new_hash = t.hash.value_or(Hash128{});  // unknown after a parts entry: set when composed
    if (t.origin) e.base_hash = t.ops.front().base_hash;
    ctx.entries.push_back(std::move(e));
    ctx.of.push_back(&t);
  }
}

// Tensor lengths the headers of built and rewritten files give.
std::map<std::string, std::uint64_t> known_lengths(const SquashContext& ctx) {
  std::map<std::string, std::uint64_t> lengths;
  for (const auto& [file, ts] : ctx.built)
    for (const auto& [name, len] : ts) lengths[name] = len;
  for (const auto& [file, st] : ctx.files)
    if (st.kind == FileState::Kind::header)
      for (const auto& [name, len] : header_tensors(st.header)) lengths[name] = len;
  return lengths;
}

// The length of the tensor `t` composes: from a header, else from an entry
// that reveals it, else (only overwrites) their largest position.
std::uint64_t tensor_length(const SquashContext& ctx, const Trace& t, const std::string& name,
                            const std::map<std::string, std::uint64_t>& lengths) {
  if (auto it = lengths.find(name); it != lengths.end()) return it->second;
  for (const Op& op : t.ops) {
    const std::string dir = ctx.links[op.link].dir.string();
    if (auto n = about_file(dir, [&] { return length_of(op, dir + ": entry '" + op.name + "'"); })) return *n;
  }
  std::uint64_t end = 0;
  for (const Op& op : t.ops) {
    Decompressor d1, d2;
    const std::string dir = ctx.links[op.link].dir.string();
    about_file(dir, [&] {
      decode_overwrite(d1, d2, op.frame, std::uint64_t{1} << 32, dir + ": entry '" + op.name + "'",
                       [&](std::span<const std::uint64_t> pos, std::span<const std::uint8_t>) {
                         if (!pos.empty()) end = std::max(end, pos.back() + 1);
                       });
    });
  }
  return end;
}

// ---- composing against the first base's checkpoint (SquashOptions::base) ----

// The checkpoint --squash-base names.
Checkpoint open_base(const fs::path& dir) {
  require_dir(dir, "--squash-base takes the checkpoint of the chain's first base");
  if (is_delta_dir(dir))
    fail(Exit::bad_input, dir, "is a delta version; --squash-base takes the checkpoint of the chain's first base");
  return open_checkpoint(dir);
}

// Whether OUT builds weight file `file`.
bool built(const SquashContext& ctx, const std::string& file) {
  const auto it = ctx.files.find(file);
  return it != ctx.files.end() && it->second.kind == FileState::Kind::built;
}

// Whether a trace is composed against the base checkpoint's bytes: a tensor
// of the first base with a context entry among its entries (the caller has
// taken a single entry as it is).
bool on_base(const SquashContext& ctx, const Trace& t) {
  return ctx.base && t.origin && std::any_of(t.ops.begin(), t.ops.end(), [](const Op& op) {
           return op.enc == Encoding::context || op.enc == Encoding::parts;
         });
}

// The dtype of tensor `name` in the last version: from the newest header the
// chain gives its weight file, else (a file the chain never rewrote) its
// origin's in the base checkpoint.
std::string last_dtype(const SquashContext& ctx, const Trace& t, const std::string& name, const TensorInfo& origin) {
  if (!t.file) return origin.dtype;
  const auto it = ctx.files.find(*t.file);
  if (it == ctx.files.end() || it->second.kind == FileState::Kind::removed) return origin.dtype;
  const SafetensorsHeader h = header_of(it->second.header);
  const TensorInfo* ti = h.find(name);
  return ti ? ti->dtype : origin.dtype;
}

// `dst.size()` bytes of `f` from `offset` into `dst`, and their checksum.
Hash128 read_hashed(const File& f, std::uint64_t offset, std::span<std::uint8_t> dst) {
  constexpr std::uint64_t kStep = 4u << 20;
  Hasher h;
  for (std::uint64_t at = 0; at < dst.size(); at += kStep) {
    const std::size_t k = static_cast<std::size_t>(std::min<std::uint64_t>(kStep, dst.size() - at));
    f.pread_exact(dst.data() + at, k, offset + at);
    h.update(dst.subspan(at, k));
  }
  return h.digest();
}

// Entry `e` of trace `t` composed against its real base bytes: the origin
// tensor read from the base checkpoint into a scratch file (its checksum
// checked against the first entry's base checksum), every entry laid in
// order over a scratch copy (each checked against the checksum its delta
// records), and the result encoded as one context entry against the base
// bytes, as `delta-diff --encoding context` encodes it; none where the
// result is the base bytes. ScratchFile and spool files are named `spool`-*.
void compose_on_base(const SquashContext& ctx, const Trace& t, std::uint64_t len, OutEntry& e, const fs::path& spool) {
  const Checkpoint& ck = *ctx.base;
  const std::string& origin = *t.origin;
  const std::string not_base = "--squash-base " + ck.dir.string() +
                               " is not the checkpoint of the chain's first base (version " +
                               format_version(ctx.idx.base_version) + ")";
  const auto ref = ck.tensors.find(origin);
  if (ref == ck.tensors.end())
    fail(Exit::verify_failed, ck.dir,
         "has no tensor '" + origin + "', which the chain's entries for '" + e.name + "' are laid over; " + not_base);
  const TensorInfo& info = ck.info(ref->second);
  const Shard& shard = ck.shards[ref->second.shard];
  const std::string w = (ck.dir / shard.file).string();
  const std::uint64_t n = info.nbytes();
  if (n != len)
    fail(Exit::verify_failed, w,
         "tensor '" + origin + "' has " + std::to_string(n) + " bytes, the chain's entries for '" + e.name +
             "' patch " + std::to_string(len) + "; " + not_base);
  ScratchFile base(spool.string() + "-base", n, 0), cur(spool.string() + "-cur", n, 0);
  const Hash128 h0 = read_hashed(File(w, File::Mode::read), shard.header.file_offset(info), base.bytes());
  const Op& first = t.ops.front();
  const std::string first_dir = ctx.links[first.link].dir.string();
  if (first.base_hash && h0 != *first.base_hash)
    fail(Exit::verify_failed, w,
         "tensor '" + origin + "' has checksum " + h0.hex() + ", " + first_dir + " records " + first.base_hash->hex() +
             " as the base of its entry '" + first.name + "'; " + not_base);
  std::copy(base.bytes().begin(), base.bytes().end(), cur.bytes().begin());
  Hash128 now = h0;  // of cur: checked against every checksum the chain records, parts entries' included
  for (std::size_t k = 0; k < t.ops.size(); ++k) {
    const Op& op = t.ops[k];
    const std::string dir = ctx.links[op.link].dir.string(), what = dir + ": entry '" + op.name + "'";
    if (k > 0 && op.base_hash && *op.base_hash != now)
      fail(Exit::verify_failed, dir,
           "entry '" + op.name + "': its base checksum " + op.base_hash->hex() + " is not " + now.hex() +
               ", what the chain's entries before it leave (the chain does not connect, or is damaged)");
    about_file(dir,
               [&] { lay(op, cur.bytes(), spool.string() + "-region", what); });  // a parts entry: each region checked
    now = xxh3_128(cur.bytes());
    if (op.enc != Encoding::parts && now != op.new_hash)
      fail(Exit::verify_failed, dir,
           "entry '" + op.name + "', laid over " + w + "'s tensor '" + origin +
               "' and the entries before it, gives checksum " + now.hex() + ", the delta records " + op.new_hash.hex() +
               (k == 0 && !first.base_hash ? " (" + not_base + ", or the delta is damaged)"
                                           : " (the chain is damaged)"));
  }
  // A file built after the last entry records the tensor's checksum too.
  if (t.hash && now != *t.hash)
    fail(Exit::verify_failed, "entries of '" + e.name + "', laid over " + w + "'s tensor '" + origin +
                                  "', give checksum " + now.hex() + ", the chain records " + t.hash->hex() +
                                  " (the chain is damaged)");
  e.base_hash = h0;
  e.new_hash = now;  // known here even where the last entry is a parts entry
  if (std::equal(base.bytes().begin(), base.bytes().end(), cur.bytes().begin())) return;  // cancelled out
  // Read as the diff engine reads the tensor (make_work).
  const ChunkLayout l = chunk_layout(last_dtype(ctx, t, e.name, info), n);
  Compressor c(ctx.opts.level);
  File f(spool, File::Mode::create_exclusive);
  std::uint64_t at = 0, changed = 0;
  encode_context(
      c, base.bytes(), cur.bytes(), l.es, l.field,
      [&](std::span<const std::uint8_t> s) {
        f.pwrite_all(s.data(), s.size(), at);
        at += s.size();
      },
      &changed);
  e.changed = changed;
  Piece p;
  p.enc = Encoding::context;
  p.composed = f.path();
  p.size = at;
  p.hash = now;
  f.close();
  e.pieces.push_back(std::move(p));
}

// Each entry's pieces, composed in parallel into spool files in `tmp`;
// entries whose changes cancel out are dropped.
void compose_entries(SquashContext& ctx, const std::map<std::string, std::uint64_t>& lengths, const fs::path& tmp) {
  progress::begin("squash", ctx.entries.size(), false);
  parallel_for(ctx.entries.size(), default_threads(ctx.opts.threads), [&](std::size_t i, std::size_t) {
    const struct Counted {
      ~Counted() { progress::add(1); }
    } counted;
    OutEntry& e = ctx.entries[i];
    const Trace& t = *ctx.of[i];
    // A tensor of a file OUT builds takes no parts entry (refuse_built_parts):
    // composed on the base even where that is its only entry.
    const bool lone_parts = t.ops[0].enc == Encoding::parts && built(ctx, e.file);
    if ((t.ops.size() > 1 || lone_parts) && on_base(ctx, t))
      return compose_on_base(ctx, t, tensor_length(ctx, t, e.name, lengths), e,
                             tmp / (".compose-" + std::to_string(i)));
    if (t.ops.size() == 1)  // one entry: as it is
      e.pieces.push_back(as_is(t.ops[0]));
    else
      compose_trace(t, tensor_length(ctx, t, e.name, lengths), e, tmp / (".compose-" + std::to_string(i)),
                    ctx.opts.level, ctx.links);
    // After a parts entry the chain records no checksum of the tensor: the
    // entry ends at its last piece's, that parts entry's (its head's).
    if (!t.hash && !e.pieces.empty()) e.new_hash = e.pieces.back().hash;
  });
  for (const auto& e : ctx.entries) {
    if (e.pieces.empty()) {
      ++ctx.sum.entries_dropped;
      continue;
    }
    ctx.sum.entries_composed +=
        std::any_of(e.pieces.begin(), e.pieces.end(), [](const Piece& p) { return !p.composed.empty(); });
    ctx.sum.entries_stacked += e.pieces.size() > 1;
  }
  std::erase_if(ctx.entries, [](const OutEntry& e) { return e.pieces.empty(); });
}

// The element counts delta-diff of the chain's first base and last version
// records, where every one is known: each entry composed on the base
// checkpoint (--squash-base), the tensors unchanged in layout.
void count_elements(SquashContext& ctx) {
  if (!ctx.base || ctx.idx.structural()) return;
  DeltaIndex::Elements n;
  for (const OutEntry& e : ctx.entries) {
    if (!e.changed) return;
    n.changed += *e.changed;
  }
  for (const Shard& sh : ctx.base->shards)
    for (const TensorInfo& t : sh.header.tensors) n.total += t.counted_elements();
  ctx.idx.elements = n;
}

// One encoding for OUT if its entries have one, else "auto".
void choose_encoding(SquashContext& ctx) {
  std::set<Encoding> encs;
  for (const auto& e : ctx.entries) encs.insert(e.enc());
  ctx.idx.per_tensor = ctx.idx.structural() || encs.size() > 1 || encs.count(Encoding::stack) ||
                       encs.count(Encoding::parts);  // "stack" and "parts" are per tensor only
  ctx.idx.encoding = encs.empty() ? ctx.links.back().idx.encoding : *encs.begin();
  for (const auto& e : ctx.entries)
    for (const Piece& p : e.pieces) {
      ctx.idx.context_layers = ctx.idx.context_layers || p.enc == Encoding::context;
      ctx.idx.parts_layers = ctx.idx.parts_layers || (e.pieces.size() > 1 && p.enc == Encoding::parts);
    }
}

// An entry's bytes: its one piece, or the stack head and every piece.
void write_pieces(const OutEntry& e, File& f, std::uint64_t at) {
  if (e.pieces.size() > 1) {
    std::vector<StackLayer> layers;
    for (const Piece& p : e.pieces) layers.push_back({p.enc, p.size, p.hash, {}});
    const std::vector<std::uint8_t> head = stack_head(layers);
    f.pwrite_all(head.data(), head.size(), at);
    at += head.size();
  }
  for (const Piece& p : e.pieces) {
    if (p.composed.empty()) {
      f.pwrite_all(p.bytes.data(), p.bytes.size(), at);
    } else {
      const File in(p.composed, File::Mode::read);
      copy_range(in, 0, p.size, f, at);
    }
    at += p.size;
  }
}

void write_out_entries(SquashContext& ctx, DeltaWriter& out) {
  std::vector<NewDeltaEntry> des;
  for (const OutEntry& e : ctx.entries) des.push_back({e.name, e.file, e.size(), e.new_hash, e.base_hash, e.enc()});
  // One delta file per weight file patched, entries by name.
  out.write_entries(ctx.idx, des,
                    [&](std::size_t i, File& f, std::uint64_t at) { write_pieces(ctx.entries[i], f, at); });
  ctx.sum.entries += des.size();
  boost::system::error_code ec;
  for (const auto& e : ctx.entries)
    for (const Piece& p : e.pieces)
      if (!p.composed.empty()) fs::remove(p.composed, ec);
}

// The newest headers of rewritten and built files, and the last version of
// every carried file.
void place_carried(SquashContext& ctx, DeltaWriter& out) {
  for (const auto& so : ctx.idx.shards) {
    if (so.op == ShardOp::Op::remove) {
      ++ctx.sum.shards_removed;
      continue;
    }
    ++(so.op == ShardOp::Op::header ? ctx.sum.shards_rewritten : ctx.sum.shards_built);
    out.copy_header(so.file, ctx.files.at(so.file).header);
  }
  for (const auto& [path, lf] : ctx.file_ops) {
    const auto& [k, fc] = lf;
    ctx.idx.files.push_back(fc);
    if (fc.op != FileChange::Op::put) {
      ++ctx.sum.files_removed;
      continue;
    }
    out.copy_file(fc.path, ctx.links[k].dir / kFilesDir / fc.path);
    ++ctx.sum.files_changed;
  }
}

}  // namespace

SquashSummary squash_deltas(const std::vector<fs::path>& chain, const fs::path& out_arg, const SquashOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path out = fs::absolute(out_arg);
  check_delta_out(out);
  if (chain.size() < 2) fail(Exit::usage, "--squash needs at least two deltas");
  SquashContext ctx{.opts = opts};
  open_links(ctx, chain);
  if (opts.base) ctx.base = open_base(*opts.base);
  for (std::size_t k = 0; k < ctx.links.size(); ++k) trace_link(ctx, k);
  ctx.idx.base_version = ctx.links.front().idx.base_version;
  ctx.idx.version = ctx.links.back().idx.version;
  out_shard_ops(ctx);
  const std::map<std::string, std::uint64_t> lengths = known_lengths(ctx);
  out_entries(ctx);
  // OUT named as its version in a directory: published into that root, so
  // on its newest version, checked now and at the rename.
  PublishExpectation expect;
  if (out.filename() == version_dirname(ctx.idx.version))
    expect = {out.parent_path(), ctx.idx.version, ctx.idx.base_version};
  check_publishable(expect, false);
  DeltaWriter writer(out, opts.sync);
  writer.expect = expect;
  // On failure the writer removes what it wrote as it goes.
  compose_entries(ctx, lengths, writer.tmp);
  count_elements(ctx);
  choose_encoding(ctx);
  write_out_entries(ctx, writer);
  place_carried(ctx, writer);
  ctx.sum.delta_bytes = writer.publish(ctx.idx);
  ctx.sum.version = ctx.idx.version;
  ctx.sum.base_version = ctx.idx.base_version;
  ctx.sum.deltas = ctx.links.size();
  ctx.sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return ctx.sum;
}

}  // namespace hfdelta
