#include "hfdelta/sharded_publisher.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>

#include <boost/filesystem/operations.hpp>

#include "delta/delta_writer.hpp"
#include "delta/parts.hpp"
#include "format/root_commit.hpp"
#include "hfdelta/delta_format.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/safetensors.hpp"
#include "hfdelta/version.hpp"
#include "store/checksum_record.hpp"
#include "util/io.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

namespace {

// Bytes of a piece diffed at a time: a rank's extra memory is about one
// batch, whatever the size of its pieces (the publisher's batch). A multiple
// of every chunk size of the chunked encodings (2^20 elements of 1 to 8 bytes).
constexpr std::uint64_t kShardBatch = 32u << 20;

std::string region_text(const Region& g) {
  return "rows " + std::to_string(g.row0) + ".." + std::to_string(g.row0 + g.rows) + ", columns " +
         std::to_string(g.col0) + ".." + std::to_string(g.col0 + g.cols);
}

const TensorInfo* find_info(const Checkpoint& c, std::string_view name, std::size_t* shard = nullptr) {
  const auto it = c.tensors.find(std::string(name));
  if (it == c.tensors.end()) return nullptr;
  if (shard) *shard = it->second.shard;
  return &c.info(it->second);
}

}  // namespace

void check_shard_plan(const Checkpoint& layout, const std::vector<ShardPiece>& pieces) {
  std::map<std::string, std::vector<const ShardPiece*>> by;
  for (const ShardPiece& p : pieces) {
    const TensorInfo* t = find_info(layout, p.name);
    if (!t)
      fail(Exit::unsupported, "rank " + std::to_string(p.rank) + ": tensor '" + p.name + "' is not in the mirror " +
                                  layout.dir.string() +
                                  "; a sharded publisher patches the mirror's tensors only: publish "
                                  "a new tensor set as a full version (delta-diff --full)");
    const MatrixShape m = matrix_shape(t->shape, dtype_size(t->dtype));
    const Region& g = p.region;
    if (!g.rows || !g.cols || g.row0 > m.rows || g.rows > m.rows - g.row0 || g.col0 > m.cols ||
        g.cols > m.cols - g.col0)
      fail(Exit::usage, "rank " + std::to_string(p.rank) + ": tensor '" + p.name + "': " + region_text(g) +
                            " is not inside its " + std::to_string(m.rows) + " x " + std::to_string(m.cols) +
                            " matrix");
    by[p.name].push_back(&p);
  }
  for (const auto& [name, ref] : layout.tensors) {
    const TensorInfo& t = layout.info(ref);
    const MatrixShape m = matrix_shape(t.shape, dtype_size(t.dtype));
    auto it = by.find(name);
    if (it == by.end())
      fail(Exit::usage, "tensor '" + name +
                            "': no rank gives any piece of it; every element of every tensor of the mirror "
                            "must be given by exactly one rank; nothing was published");
    std::vector<const ShardPiece*>& ps = it->second;
    std::sort(ps.begin(), ps.end(), [](const ShardPiece* a, const ShardPiece* b) {
      return std::tie(a->region.row0, a->region.col0) < std::tie(b->region.row0, b->region.col0);
    });
    std::uint64_t covered = 0;
    for (std::size_t i = 0; i < ps.size(); ++i) {
      covered += ps[i]->region.elements();
      for (std::size_t j = 0; j < i; ++j)
        if (ps[j]->region.overlaps(ps[i]->region))
          fail(Exit::usage, "tensor '" + name + "': the pieces of rank " + std::to_string(ps[j]->rank) + " (" +
                                region_text(ps[j]->region) + ") and rank " + std::to_string(ps[i]->rank) + " (" +
                                region_text(ps[i]->region) +
                                ") overlap; every element must be given by exactly one rank "
                                "(a replicated piece by one of its holders); nothing was published");
    }
    if (covered != m.rows * m.cols)
      fail(Exit::usage, "tensor '" + name + "': the ranks' pieces cover " + std::to_string(covered) + " of its " +
                            std::to_string(m.rows * m.cols) + " elements (" + std::to_string(m.rows) + " x " +
                            std::to_string(m.cols) +
                            "): a gap; every element must be given by exactly one rank; nothing "
                            "was published");
  }
}

std::string shard_parts_text(const std::vector<ShardPart>& parts) {
  std::ostringstream o;
  for (const ShardPart& p : parts)
    o << p.rank << ' ' << p.region.row0 << ' ' << p.region.rows << ' ' << p.region.col0 << ' ' << p.region.cols << ' '
      << encoding_name(p.enc) << ' ' << p.offset << ' ' << p.size << ' ' << p.hash.high << ' ' << p.hash.low << ' '
      << p.elements_changed << ' ' << p.tensor << '\n';
  return o.str();
}

std::vector<ShardPart> parse_shard_parts(std::string_view text) {
  std::vector<ShardPart> out;
  std::istringstream in{std::string(text)};
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::istringstream l(line);
    ShardPart p;
    std::string enc;
    l >> p.rank >> p.region.row0 >> p.region.rows >> p.region.col0 >> p.region.cols >> enc >> p.offset >> p.size >>
        p.hash.high >> p.hash.low >> p.elements_changed;
    l.get();
    std::getline(l, p.tensor);
    const auto e = parse_encoding(enc);
    if (!l.eof() && l.fail()) fail(Exit::bad_input, "sharded publisher: a damaged part record: " + line);
    if (!e || p.tensor.empty()) fail(Exit::bad_input, "sharded publisher: a damaged part record: " + line);
    p.enc = *e;
    out.push_back(std::move(p));
  }
  return out;
}

fs::path make_shard_stage(const fs::path& root, std::uint64_t version) {
  const fs::path stage = temp_path_beside(root / ("shard_v" + format_version(version)));
  fs::create_directory(stage);
  return stage;
}

fs::path shard_spool(const fs::path& stage, std::uint32_t rank) {
  return stage / ("rank-" + std::to_string(rank) + ".parts");
}

struct ShardWriter::State {
  fs::path mirror;
  Checkpoint layout;
  std::vector<File> files;
  File spool;
  std::uint32_t rank = 0;
  Encoding enc = Encoding::sparse;
  std::unique_ptr<Compressor> comp;
  SparseChunkEncoder sparse;
  ContextChunkEncoder context;
  std::vector<ShardPart> parts;
  std::uint64_t at = 0, read = 0;
  std::vector<std::uint8_t> old;  // one batch of the mirror's bytes
  // One chunk of the caller's bytes, copied before anything reads it: the
  // caller may write its piece meanwhile (a trainer's live parameter), and
  // what is hashed must be what is encoded.
  std::vector<std::uint8_t> now;
  Hasher hash;
};

namespace {

// Bytes [at, at + n) of region `g` (row-major) of the matrix at `base` in
// `f`, into `dst`: only the region's rows, a row's columns at a time.
void read_region(const File& f, std::uint64_t base, const MatrixShape& m, const Region& g, std::uint64_t at,
                 std::uint64_t n, std::uint8_t* dst) {
  const std::uint64_t start = base + (g.row0 * m.cols + g.col0) * m.es;
  if (g.contiguous(m)) return f.pread_exact(dst, static_cast<std::size_t>(n), start + at);
  const std::uint64_t row_bytes = g.cols * m.es;
  while (n) {
    const std::uint64_t r = at / row_bytes, k = at % row_bytes, take = std::min(n, row_bytes - k);
    f.pread_exact(dst, static_cast<std::size_t>(take), start + r * m.cols * m.es + k);
    dst += take, at += take, n -= take;
  }
}

// The index's element counts: every tensor of the mirror, as delta-diff
// counts them (bytes where the dtype has no element size), and the parts'
// changed elements.
DeltaIndex::Elements elements_of(const Checkpoint& layout, const std::vector<ShardPart>& parts) {
  DeltaIndex::Elements e;
  for (const auto& sh : layout.shards)
    for (const TensorInfo& t : sh.header.tensors) e.total += t.counted_elements();
  for (const ShardPart& p : parts) e.changed += p.elements_changed;
  return e;
}

}  // namespace

ShardWriter::ShardWriter(const fs::path& mirror, const fs::path& stage, std::uint32_t rank, Encoding enc, int level)
    : s_(std::make_unique<State>()) {
  if (!encoding_info(enc).in_parts)
    fail(Exit::usage,
         "a sharded publisher writes xor, sparse or context parts, not " + std::string(encoding_name(enc)));
  s_->mirror = mirror;
  s_->layout = open_checkpoint(mirror);
  for (const Shard& sh : s_->layout.shards) s_->files.emplace_back(s_->layout.dir / sh.file, File::Mode::read);
  s_->spool = File(shard_spool(stage, rank), File::Mode::create_exclusive);
  s_->rank = rank;
  s_->enc = enc;
  s_->comp = std::make_unique<Compressor>(level);
}

ShardWriter::~ShardWriter() = default;

std::uint64_t ShardWriter::mirror_bytes_read() const { return s_->read; }

void ShardWriter::put(std::string_view name, std::string_view dtype, std::span<const std::uint64_t> shape,
                      const Region& g, std::span<const std::uint8_t> bytes) {
  State& s = *s_;
  std::size_t shard = 0;
  const TensorInfo* t = find_info(s.layout, name, &shard);
  const std::string where = "rank " + std::to_string(s.rank) + ": tensor '" + std::string(name) + "'";
  if (!t) fail(Exit::unsupported, where + ": not in mirror " + s.mirror.string());
  if (dtype != t->dtype || !std::equal(shape.begin(), shape.end(), t->shape.begin(), t->shape.end()))
    fail(Exit::unsupported, where + ": " + std::string(dtype) + " " + shape_string({shape.begin(), shape.end()}) +
                                ", but mirror " + s.mirror.string() + " holds it as " + t->dtype + " " +
                                shape_string(t->shape) +
                                "; publish a changed layout as a full version (delta-diff --full)");
  const MatrixShape m = matrix_shape(t->shape, dtype_size(t->dtype));
  if (m.bytes() != t->nbytes()) fail(Exit::unsupported, where + ": its size is not its shape's");
  if (!g.rows || !g.cols || g.row0 > m.rows || g.rows > m.rows - g.row0 || g.col0 > m.cols || g.cols > m.cols - g.col0)
    fail(Exit::bad_input, where + ": " + region_text(g) + " is not inside its matrix");
  const std::uint64_t n = g.elements() * m.es;
  if (bytes.size() != n)
    fail(Exit::bad_input, where + ": " + std::to_string(bytes.size()) + " bytes given for " + region_text(g) +
                              ", which takes " + std::to_string(n));
  // The part is encoded as the mirror's bytes of the region are read, a
  // batch at a time (whole chunks of the chunked encodings; xor as one
  // streamed frame), and written straight to the spool: the rank's extra
  // memory is one batch and one chunk, not the piece. A region without
  // change leaves no part (its bytes in the spool are overwritten by the
  // next, or cut).
  const std::uint64_t base = s.layout.shards[shard].header.file_offset(*t);
  const ChunkLayout cl = chunk_layout(dtype, n);
  const ContextField field =
      cl.field.bits > 8 || cl.field.shift + cl.field.bits > 8 * cl.es ? ContextField{} : cl.field;
  const std::uint64_t chunk_bytes = kSparseChunkElements * cl.es;  // divides kShardBatch
  std::uint64_t size = 0;
  const ByteSink sink = [&](std::span<const std::uint8_t> b) {
    s.spool.pwrite_all(b.data(), b.size(), s.at + size);
    size += b.size();
  };
  if (s.enc == Encoding::sparse) {
    std::uint8_t head[kSparseHeadSize];
    sparse_entry_head(cl.es, n, head);
    sink({head, sizeof head});
  } else if (s.enc == Encoding::context) {
    std::uint8_t head[kContextHeadSize];
    context_entry_head(cl.es, n, field, head);
    sink({head, sizeof head});
  } else {
    s.comp->begin(n);
  }
  s.old.resize(static_cast<std::size_t>(std::min(n, kShardBatch)));
  s.now.resize(static_cast<std::size_t>(std::min(n, chunk_bytes)));
  s.hash.reset();
  std::uint64_t changed = 0;  // elements
  for (std::uint64_t at = 0; at < n; at += kShardBatch) {
    const std::size_t k = static_cast<std::size_t>(std::min(kShardBatch, n - at));
    std::uint8_t* const batch = s.old.data();
    read_region(s.files[shard], base, m, g, at, k, batch);
    s.read += k;
    // The caller's bytes are read once, a chunk at a time, into `now`; the
    // part's checksum and its encoding are both of that copy.
    for (std::uint64_t c = 0; c < k; c += chunk_bytes) {
      const std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(chunk_bytes, k - c));
      std::uint8_t* const old = batch + c;
      std::uint8_t* const now = s.now.data();
      std::memcpy(now, bytes.data() + at + c, len);
      s.hash.update({now, len});
      if (s.enc == Encoding::xor_bytes) {
        if (std::memcmp(old, now, len) != 0) changed += count_changes({old, len}, {now, len}, cl.es).elements;
        for (std::size_t i = 0; i < len; ++i) old[i] ^= now[i];
        s.comp->put({old, len}, sink);
      } else if (s.enc == Encoding::sparse) {
        s.sparse.begin(cl.es);
        s.sparse.scan(old, now, len / cl.es, 0);
        changed += s.sparse.changed_elements();
        s.sparse.end(*s.comp, sink);
      } else {
        s.context.begin(cl.es, field);
        s.context.scan(old, now, len / cl.es, 0);
        changed += s.context.changed_elements();
        s.context.end(*s.comp, sink);
      }
    }
  }
  if (s.enc == Encoding::xor_bytes) s.comp->end(sink);
  if (!changed) return;  // unchanged: no part
  ShardPart p;
  p.tensor = std::string(name);
  p.region = g;
  p.enc = s.enc;
  p.rank = s.rank;
  p.offset = s.at;
  p.size = size;
  p.hash = s.hash.digest();
  p.elements_changed = changed;
  s.at += size;
  s.parts.push_back(std::move(p));
}

std::vector<ShardPart> ShardWriter::finish(bool sync) {
  s_->spool.truncate(s_->at);  // bytes of a last region without change
  if (sync) s_->spool.sync();
  return s_->parts;
}

ShardCommit commit_sharded(const fs::path& root, const fs::path& mirror, const fs::path& stage, std::uint64_t version,
                           std::uint64_t base, std::vector<ShardPart> parts, bool sync) {
  // The version's number and base as the ranks began it: the same checks
  // again at the rename (writer.expect), after every part is copied.
  const PublishExpectation expect{root, version, base};
  check_publishable(expect, true);
  const fs::path out = root / version_dirname(version);
  const Checkpoint layout = open_checkpoint(mirror);
  const std::optional<ChecksumRecord> rec = read_record(mirror, base);
  if (!rec) fail(Exit::uninitialised, mirror, "has no checksum record of version " + format_version(base));
  std::sort(parts.begin(), parts.end(), [](const ShardPart& a, const ShardPart& b) {
    return std::tie(a.tensor, a.region.row0, a.region.col0) < std::tie(b.tensor, b.region.row0, b.region.col0);
  });
  struct Item {
    std::string name;
    std::vector<std::uint8_t> head;
    std::size_t first = 0, count = 0;
  };
  std::vector<Item> items;
  std::vector<NewDeltaEntry> entries;
  for (std::size_t i = 0; i < parts.size();) {
    std::size_t j = i;
    while (j < parts.size() && parts[j].tensor == parts[i].tensor) ++j;
    std::size_t shard = 0;
    const TensorInfo* ti = find_info(layout, parts[i].tensor, &shard);
    if (!ti) fail(Exit::unsupported, "tensor '" + parts[i].tensor + "': not in mirror " + mirror.string());
    std::vector<PartRecord> recs;
    std::uint64_t size = 0;
    for (std::size_t k = i; k < j; ++k) {
      recs.push_back({parts[k].region, parts[k].enc, parts[k].size, parts[k].hash, {}});
      size += parts[k].size;
    }
    Item it{parts[i].tensor, parts_head(matrix_shape(ti->shape, dtype_size(ti->dtype)), recs), i, j - i};
    const std::string& file = layout.shards[shard].file;
    NewDeltaEntry e;
    e.name = it.name;
    e.target = file;
    e.size = it.head.size() + size;
    e.new_hash = parts_checksum(it.head);
    e.encoding = Encoding::parts;
    if (const auto w = rec->weights.find(file); w != rec->weights.end())
      if (const auto h = w->second.tensors.find(it.name); h != w->second.tensors.end()) e.base_hash = h->second;
    if (!e.base_hash) fail(Exit::uninitialised, mirror, "its record has no checksum of tensor '" + it.name + "'");
    entries.push_back(std::move(e));
    items.push_back(std::move(it));
    i = j;
  }
  std::map<std::uint32_t, File> spools;
  for (const ShardPart& p : parts)
    if (!spools.count(p.rank)) spools.emplace(p.rank, File(shard_spool(stage, p.rank), File::Mode::read));
  DeltaIndex idx;
  idx.version = version;
  idx.base_version = base;
  idx.per_tensor = true;
  idx.elements = elements_of(layout, parts);
  DeltaWriter writer(out, sync);
  writer.expect = expect;
  ShardCommit sc;
  sc.out = out;
  // On failure the writer removes what it wrote as it goes.
  writer.write_entries(idx, entries, [&](std::size_t i, File& f, std::uint64_t at) {
    const Item& it = items[i];
    f.pwrite_all(it.head.data(), it.head.size(), at);
    at += it.head.size();
    for (std::size_t k = it.first; k < it.first + it.count; ++k) {
      copy_range(spools.at(parts[k].rank), parts[k].offset, parts[k].size, f, at);
      at += parts[k].size;
    }
  });
  sc.delta_bytes = writer.publish(idx);
  sc.tensors_changed = entries.size();
  spools.clear();
  boost::system::error_code ec;
  fs::remove_all(stage, ec);
  return sc;
}

}  // namespace hfdelta
