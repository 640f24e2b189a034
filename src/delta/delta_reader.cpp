// The one reader of delta directories (see delta_reader.hpp).
#include "delta/delta_reader.hpp"

#include <algorithm>
#include <set>

#include <boost/filesystem/operations.hpp>

#include "format/completion_marker.hpp"
#include "hfdelta/checkpoint.hpp"
#include "hfdelta/error.hpp"
#include "util/io.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

namespace {

// A symlink anywhere inside a delta could make it read (or, through
// hfdelta_files, copy into LOCAL) a file of the publisher's host that is no
// part of the delta, so none is allowed: not only on the paths the index
// names, but any entry, directories included (those are not descended).
void check_no_symlinks(const fs::path& dir) {
  boost::system::error_code ec;
  fs::recursive_directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec))
    if (fs::is_symlink(it->symlink_status()))
      fail(Exit::bad_input, it->path(), "is a symlink; a delta is read from its own files only, never through a link");
  if (ec) fail(Exit::failure, dir, "cannot list the delta directory: " + ec.message());
}

void check_index_file(const fs::path& dir) {
  boost::system::error_code ec;
  const fs::path p = dir / kIndexFile;
  if (!fs::is_regular_file(fs::symlink_status(p, ec)))
    fail(Exit::bad_input, p, "missing or not a regular file; " + dir.string() + " is not a delta version");
}

DeltaEntry entry_of(const OpenDelta& v, const std::string& file, const SafetensorsHeader& hdr, const TensorInfo& t,
                    const std::string& w, const EntryChecksum& recorded) {
  const Hash128& checksum = recorded.xxh3;
  DeltaEntry e;
  e.file = &file;
  e.info = &t;
  e.encoding = encoding_of(v.index, t.name);
  e.frame = v.maps.at(file).bytes(hdr.file_offset(t), t.nbytes());
  e.new_hash = checksum;
  e.adler32 = recorded.adler32;
  if (auto b = v.index.base_checksums.find(t.name); b != v.index.base_checksums.end()) e.base_hash = b->second;
  const std::string what = w + ": entry '" + t.name + "'";
  if (e.encoding == Encoding::stack) {
    e.layers = read_stack(e.frame, checksum, what);
    e.layer_parts.resize(e.layers.size());
    for (std::size_t i = 0; i < e.layers.size(); ++i) {
      if (e.layers[i].enc != Encoding::parts) continue;
      const std::string pw = what + " (stacked layer " + std::to_string(i + 1) + ")";
      const unsigned needs = encoding_info(Encoding::parts).revision;
      if (v.index.format_revision.value_or(0) < needs)
        fail(Exit::bad_input,
             pw + ": is a parts entry, which needs hfdelta_format " + std::to_string(needs) + " or later");
      e.layer_parts[i] = std::make_shared<const PartsEntry>(read_parts(e.layers[i].bytes, e.layers[i].hash, pw));
    }
  }
  if (e.encoding == Encoding::parts) e.parts = std::make_shared<const PartsEntry>(read_parts(e.frame, checksum, what));
  // The whole tensor's base is checked before parts are laid: their
  // regions' checksums say nothing of the bytes around them.
  const bool parted =
      e.parts || std::any_of(e.layer_parts.begin(), e.layer_parts.end(), [](const auto& p) { return p != nullptr; });
  if (parted && !e.base_hash)
    fail(Exit::bad_input, what + ": holds a parts entry, but has no base checksum in hfdelta_base_checksums");
  return e;
}

// The delta files: headers valid, every entry an entry of this file, every
// tensor the index maps to a file present in it; lists the entries.
// A delta with a completion marker: each delta file has the size and
// checksum the marker records. Damage anywhere in a file (an entry's raw
// bytes too, which no zstd frame checksum covers) is then found here, as
// damage (exit 3), before LOCAL is touched.
void check_against_marker(const fs::path& dir, const OpenDelta& v) {
  const Completeness c = check_complete(dir, false);
  if (!c.marker) return;
  for (const auto& [file, m] : v.maps) {
    const auto want = c.marker->files.find(file);
    const std::string w = (dir / file).string();
    if (want == c.marker->files.end())
      fail(Exit::bad_input, w, std::string("not listed in the version's completion marker ") + kCompleteFile);
    if (m.size() != want->second.size || xxh3_128(m.bytes()) != want->second.hash)
      fail(Exit::bad_input, w,
           "does not have the size and checksum its completion marker records: the version "
           "is damaged (withdraw it on the publishing side)");
  }
}

void check_delta_files(const fs::path& dir, OpenDelta& v) {
  const DeltaIndex& idx = v.index;
  boost::system::error_code ec;
  for (const auto& [tensor, file] : idx.weight_map) {
    if (v.headers.count(file)) continue;
    const fs::path p = dir / file;
    if (!fs::is_regular_file(fs::symlink_status(p, ec)))
      fail(Exit::bad_input, p, "named by the delta index but missing or not a regular file");
    v.headers.emplace(file, read_safetensors(p));
    MappedFile m(p);
    if (m.size() != v.headers.at(file).file_size) fail(Exit::bad_input, p, "changed size while being read");
    v.maps.emplace(file, std::move(m));
  }
  check_against_marker(dir, v);
  for (const auto& [tensor, file] : idx.weight_map)
    if (!v.headers.at(file).find(tensor))
      fail(Exit::bad_input, dir / file, "has no entry '" + tensor + "' named by the delta index");
  // A tensor of a built file whose entry records another checksum than
  // hfdelta_shards: the delta contradicts itself.
  std::map<std::string, const ShardOp::Tensor*> built;
  for (const ShardOp& so : idx.shards)
    for (const ShardOp::Tensor& t : so.tensors) built[t.name] = &t;
  for (const auto& [file, hdr] : v.headers) {
    const std::string w = (dir / file).string();
    for (const auto& t : hdr.tensors) {
      const EntryChecksum checksum = check_delta_entry(idx, file, hdr, t, w);
      if (auto b = built.find(t.name); b != built.end() && b->second->hash != checksum.xxh3)
        fail(Exit::bad_input, w,
             "entry '" + t.name + "' records checksum " + checksum.xxh3.hex() + ", hfdelta_shards " +
                 b->second->hash.hex());
      v.entries.push_back(
          about_file(w, [&, &file = file, &hdr = hdr] { return entry_of(v, file, hdr, t, w, checksum); }));
    }
  }
}

bool touches_state(const std::string& path) {
  return path == kStateDir || path.rfind(std::string(kStateDir) + "/", 0) == 0;
}

// hfdelta_files may not replace or remove what the delta itself treats as a
// weight file (a file its entries patch, or one of its hfdelta_shards), except
// where a file stops being a weight file (removed as one, put as a plain
// file) or starts being one (a build replacing a plain file of that name).
// Whether it is a weight file of LOCAL only delta-apply can tell.
void check_file_ops(const fs::path& dir, const DeltaIndex& idx) {
  const std::string iw = (dir / kIndexFile).string();
  std::set<std::string> targets;
  for (const auto& [delta_file, target] : idx.targets) targets.insert(target);
  for (const FileChange& fc : idx.files) {
    if (touches_state(fc.path)) fail(Exit::bad_input, iw, "hfdelta_files may not touch " + fc.path);
    const bool put = fc.op == FileChange::Op::put;
    const ShardOp* so = shard_op(idx, fc.path);
    const bool swap = so && (so->op == ShardOp::Op::remove ? put : so->op == ShardOp::Op::build && !put);
    if (!swap && (so || targets.count(fc.path)))
      fail(Exit::bad_input, iw,
           std::string("hfdelta_files may not ") + (put ? "replace" : "remove") + " weight file " + fc.path +
               " (the delta's own " + (so ? "hfdelta_shards" : "hfdelta_targets") + " names it)");
    if (put) open_carried(dir / kFilesDir / fc.path, fc.size, fc.hash, "hfdelta_files");
  }
}

void check_new_headers(const fs::path& dir, OpenDelta& v) {
  for (const ShardOp& so : v.index.shards) {
    if (so.op == ShardOp::Op::remove) continue;
    const fs::path hp = dir / kHeadersDir / so.file;
    MappedFile hm = open_carried(hp, so.header_size, so.header_hash, "hfdelta_shards");
    if (so.op == ShardOp::Op::build)
      parse_built_header({reinterpret_cast<const char*>(hm.bytes().data()), hm.size()}, so, hp.string());
    v.new_headers.emplace(so.file, std::move(hm));
  }
}

}  // namespace

std::string OpenDelta::index_path() const { return (dir / kIndexFile).string(); }

std::string OpenDelta::path_of(const DeltaEntry& e) const { return (dir / *e.file).string(); }

std::string_view OpenDelta::new_header(const std::string& file) const {
  const MappedFile& m = new_headers.at(file);
  return {reinterpret_cast<const char*>(m.bytes().data()), m.size()};
}

namespace {

OpenDelta open_checked(const fs::path& dir, DeltaIndex index) {
  OpenDelta v;
  v.dir = dir;
  v.index = std::move(index);
  check_new_headers(dir, v);
  check_delta_files(dir, v);
  check_file_ops(dir, v.index);
  return v;
}

}  // namespace

OpenDelta open_delta(const fs::path& dir) {
  require_dir(dir, "give a delta version directory");
  check_no_symlinks(dir);  // before the index is read: it may be a link
  check_index_file(dir);
  return open_checked(dir, read_delta_index(dir));
}

OpenDelta open_delta(const fs::path& dir, DeltaIndex index) {
  check_no_symlinks(dir);
  check_index_file(dir);
  return open_checked(dir, std::move(index));
}

NewBytes new_bytes_of(const DeltaEntry& e) {
  NewBytes nb;
  if (e.parts) {
    nb.m = e.parts->m;
    for (const PartRecord& p : e.parts->parts) nb.regions.emplace_back(p.region, p.hash);
    return nb;
  }
  if (e.layer_parts.empty() || !e.layer_parts.back()) {
    if (!e.adler32) nb.whole = e.new_hash;
    return nb;
  }
  // The last parts layer's regions, then each earlier one's that no later
  // part touched, back to the last part of another encoding (or of another
  // matrix, whose regions are not comparable).
  nb.m = e.layer_parts.back()->m;
  for (std::size_t i = e.layer_parts.size(); i-- > 0 && e.layer_parts[i] && e.layer_parts[i]->m == nb.m;)
    for (const PartRecord& p : e.layer_parts[i]->parts)
      if (std::none_of(nb.regions.begin(), nb.regions.end(), [&](const auto& r) { return r.first.overlaps(p.region); }))
        nb.regions.emplace_back(p.region, p.hash);
  return nb;
}

}  // namespace hfdelta
