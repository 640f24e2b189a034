#include "diff/base_check.hpp"

#include <algorithm>
#include <mutex>
#include <vector>

#include <boost/filesystem/operations.hpp>

#include "delta/delta_reader.hpp"
#include "hfdelta/delta_format.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/version.hpp"
#include "util/io.hpp"
#include "util/parallel.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

namespace {

void record_delta(VersionBytes& vb, const OpenDelta& d) {
  const DeltaIndex& idx = d.index;
  vb.recorded = idx.format_revision.has_value();  // a plain slime-layout delta records no checksums of ours
  if (!vb.recorded) return;
  for (const DeltaEntry& e : d.entries) {
    NewBytes nb = new_bytes_of(e);
    if (nb.whole)
      vb.tensors[e.tensor()] = *nb.whole;
    else  // a parts entry: its regions' checksums only
      vb.regions[e.tensor()] = {nb.m, std::move(nb.regions)};
  }
  for (const ShardOp& op : idx.shards) {
    if (op.op == ShardOp::Op::remove) {
      vb.files[op.file] = std::nullopt;
      continue;
    }
    vb.headers[op.file] = op.header_hash;
    for (const ShardOp::Tensor& t : op.tensors) vb.tensors[t.name] = t.hash;
  }
  for (const FileChange& f : idx.files)
    vb.files[f.path] = f.op == FileChange::Op::put ? std::optional<Hash128>(f.hash) : std::nullopt;
}

[[noreturn]] void differs(const std::string& role, const Checkpoint& c, const VersionBytes& want,
                          const std::string& what) {
  throw Error(
      Exit::verify_failed,
      role + " " + c.dir.string() + ": does not hold the bytes of version " + format_version(want.version) + " (" +
          want.dir.string() + "), the base the next version is published on: " + what +
          ". Give the save that version " + format_version(want.version) +
          " was published from (a retried job or a stale BASE publishes a version no host can apply); nothing was "
          "published",
      c.dir.string());
}

void check_full(const Checkpoint& c, const std::string& role, const VersionBytes& want, int threads) {
  std::vector<std::pair<std::string, MarkedFile>> files(want.full.begin(), want.full.end());
  std::mutex m;
  std::optional<std::string> bad;
  parallel_for(files.size(), threads, [&](std::size_t i, std::size_t) {
    const fs::path p = c.dir / files[i].first;
    boost::system::error_code ec;
    const bool ok = fs::is_regular_file(p, ec) && matches_marker(p, files[i].second);
    if (ok) return;
    const std::lock_guard<std::mutex> g(m);
    if (!bad || files[i].first < *bad) bad = files[i].first;
  });
  if (bad) differs(role, c, want, "file '" + *bad + "' is missing or holds other bytes than the full version's");
}

// The checksum of region `g` of the matrix `m` at `offset` in `f`: its bytes
// row-major, as the part was made, read a bounded piece at a time.
Hash128 region_hash(const File& f, std::uint64_t offset, const MatrixShape& m, const Region& g,
                    std::vector<std::uint8_t>& buf) {
  constexpr std::uint64_t kPiece = 4u << 20;
  const std::uint64_t row_bytes = g.cols * m.es;
  Hasher h;
  for (std::uint64_t r = 0; r < g.rows; ++r)
    for (std::uint64_t k = 0; k < row_bytes; k += kPiece) {
      buf.resize(static_cast<std::size_t>(std::min(kPiece, row_bytes - k)));
      f.pread_exact(buf.data(), buf.size(), offset + ((g.row0 + r) * m.cols + g.col0) * m.es + k);
      h.update(buf);
    }
  return h.digest();
}

// What is wrong with tensor `name` of `c` against its regions' checksums, if anything.
std::optional<std::string> check_regions(const Checkpoint& c, const std::string& name,
                                         const VersionBytes::Regions& want) {
  const auto ref = c.tensors.find(name);
  if (ref == c.tensors.end()) return "tensor '" + name + "' is missing";
  const TensorInfo& t = c.info(ref->second);
  if (t.nbytes() != want.m.bytes())
    return "tensor '" + name + "' has " + std::to_string(t.nbytes()) + " bytes, the version's parts entry is of " +
           std::to_string(want.m.bytes());
  const Shard& sh = c.shards[ref->second.shard];
  const File f(c.dir / sh.file, File::Mode::read);
  std::vector<std::uint8_t> buf;
  for (const auto& [g, hash] : want.sums) {
    const Hash128 h = region_hash(f, sh.header.file_offset(t), want.m, g, buf);
    if (h != hash)
      return "tensor '" + name + "', rows " + std::to_string(g.row0) + ".." + std::to_string(g.row0 + g.rows) +
             " x columns " + std::to_string(g.col0) + ".." + std::to_string(g.col0 + g.cols) + ", has checksum " +
             h.hex() + ", the version's part is " + hash.hex();
  }
  return std::nullopt;
}

}  // namespace

VersionBytes recorded_bytes(const fs::path& root, std::uint64_t v) {
  VersionBytes vb;
  vb.version = v;
  vb.dir = root / version_dirname(v);
  try {
    std::optional<DeltaIndex> idx = read_index_if_delta(vb.dir);
    if (idx) {
      record_delta(vb, open_delta(vb.dir, std::move(*idx)));
      return vb;
    }
    const Completeness c = check_complete(vb.dir, false);
    if (!c.complete) fail(Exit::bad_input, c.missing + " is missing");
    if (c.marker) {
      vb.full = c.marker->files;
      vb.recorded = true;
    }
  } catch (const Error& e) {
    fail_again(e, "version " + format_version(v) + " of " + root.string() +
                      ", the base of the next version, cannot "
                      "be read (" +
                      e.what() + "); withdraw it (delta-diff --withdraw " + vb.dir.string() +
                      ") before publishing on it");
  }
  return vb;
}

void check_holds(const Checkpoint& c, const std::string& role, const VersionBytes& want, const KnownHash& known,
                 int threads) {
  if (!want.recorded) return;
  if (!want.full.empty()) return check_full(c, role, want, threads);
  for (const auto& [file, hash] : want.headers) {
    const Shard* sh = c.find_shard(file);
    if (!sh) differs(role, c, want, "weight file '" + file + "' is missing");
    const std::string h = sh->header.prefix();
    if (xxh3_128({reinterpret_cast<const std::uint8_t*>(h.data()), h.size()}) != hash)
      differs(role, c, want, "weight file '" + file + "' has another header");
  }
  for (const auto& [file, hash] : want.files) {
    const fs::path p = c.dir / file;
    boost::system::error_code ec;
    const bool there = fs::exists(fs::symlink_status(p, ec));
    if (!hash) {
      if (there) differs(role, c, want, "'" + file + "' is there, but the version removed it");
      continue;
    }
    if (!there || xxh3_128(MappedFile(p).bytes()) != *hash) differs(role, c, want, "file '" + file + "' differs");
  }
  std::vector<const std::pair<const std::string, Hash128>*> todo;
  for (const auto& t : want.tensors) todo.push_back(&t);
  std::mutex m;
  std::optional<std::string> bad;
  parallel_for(todo.size(), threads, [&](std::size_t i, std::size_t) {
    const auto& [name, hash] = *todo[i];
    std::optional<Hash128> h = known(name);
    if (!h) {
      const auto ref = c.tensors.find(name);
      if (ref != c.tensors.end()) {
        const Shard& sh = c.shards[ref->second.shard];
        const File f(c.dir / sh.file, File::Mode::read);
        std::vector<std::uint8_t> buf;
        h = hash_file_range(f, sh.header.file_offset(c.info(ref->second)), c.info(ref->second).nbytes(), buf);
      }
    }
    if (h == hash) return;
    const std::lock_guard<std::mutex> g(m);
    const std::string why = h ? "tensor '" + name + "' has checksum " + h->hex() + ", the version's is " + hash.hex()
                              : "tensor '" + name + "' is missing";
    if (!bad || why < *bad) bad = why;
  });
  // Tensors of a parts entry: each region as the version records it (the
  // rest of such a tensor is known to the hosts' records only).
  std::vector<const std::pair<const std::string, VersionBytes::Regions>*> parted;
  for (const auto& t : want.regions) parted.push_back(&t);
  parallel_for(parted.size(), threads, [&](std::size_t i, std::size_t) {
    const std::optional<std::string> why = check_regions(c, parted[i]->first, parted[i]->second);
    if (!why) return;
    const std::lock_guard<std::mutex> g(m);
    if (!bad || *why < *bad) bad = why;
  });
  if (bad) differs(role, c, want, *bad);
}

}  // namespace hfdelta
