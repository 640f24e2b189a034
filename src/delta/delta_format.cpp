#include "hfdelta/delta_format.hpp"

#include <algorithm>
#include <cstdio>
#include <set>

#include <boost/filesystem/operations.hpp>
#include <nlohmann/json.hpp>

#include "delta/delta_format_internal.hpp"
#include "format/completion_marker.hpp"
#include "hfdelta/checkpoint.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/signals.hpp"
#include "hfdelta/version.hpp"
#include "util/io.hpp"
#include "util/json_text.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;
using nlohmann::json;

namespace {

json load_index(const fs::path& p) {
  json j = parse_json_text(read_small_file(p, kIndexJson.bytes), p.string(), "index", kIndexJson);
  if (!j.is_object()) fail(Exit::bad_input, p, "not a JSON object");
  return j;
}

std::uint64_t version_of(const json& v, const std::string& what) {
  if (v.is_string()) return parse_version(v.get<std::string>(), what);
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  fail(Exit::bad_input, what + ": must be a version string");
}

// An index (`j` holds it, or none if `dir` has no index file) with any delta
// key in any top-level object makes DIR a delta, so that one damaged key
// name cannot turn a delta into something copied as a full version.
std::optional<json> delta_index_json(const fs::path& dir) {
  const fs::path p = dir / kIndexFile;
  boost::system::error_code ec;
  if (!fs::exists(p, ec)) {
    // A dangling link hides what the directory is: with it taken for "no
    // index", a delta would pass for a full version and be copied as one.
    if (fs::is_symlink(fs::symlink_status(p, ec))) fail(Exit::bad_input, p, "is a symlink to nothing");
    return std::nullopt;
  }
  json j = load_index(p);
  for (const auto& [k, v] : j.items()) {
    if (!v.is_object()) continue;
    for (const char* dk : {key::delta_encoding, key::base_version, key::format, key::index_checksum})
      if (v.contains(dk)) return j;
  }
  return std::nullopt;
}

DeltaIndex delta_index_from_json(json j, const std::string& w);

}  // namespace

bool is_delta_dir(const fs::path& dir) { return delta_index_json(dir).has_value(); }

std::optional<DeltaIndex> read_index_if_delta(const fs::path& dir) {
  std::optional<json> j = delta_index_json(dir);
  if (!j) return std::nullopt;
  const std::string w = (dir / kIndexFile).string();
  return about_file(w, [&] { return delta_index_from_json(std::move(*j), w); });
}

DeltaIndex read_delta_index(const fs::path& dir) {
  const fs::path p = dir / kIndexFile;
  json j;
  {  // the text is freed before the index is converted: memory holds one form at a time
    const std::string text = read_small_file(p, kIndexJson.bytes);
    j = parse_json_text(text, p.string(), "index", kIndexJson);
  }
  return about_file(p.string(), [&] { return delta_index_from_json(std::move(j), p.string()); });
}

DeltaIndex parse_delta_index(std::string_view text, const std::string& w) {
  return about_file(w, [&] { return delta_index_from_json(parse_json_text(text, w, "index", kIndexJson), w); });
}

namespace {

// An index being converted: the parsed document (its large objects are
// erased entry by entry as they are converted, so the parsed document and
// the index are not both held in full), its metadata, and the name of the
// file for errors.
struct IndexContext {
  json& j;
  const json& m;  // j["metadata"]
  const std::string& w;
  DeltaIndex d;
  std::uint64_t revision = 0;  // metadata.hfdelta_format; 0: a plain slime-layout delta
};

// hfdelta's indexes carry a checksum of themselves, so no damaged byte of
// the index (a key name, a checksum, a file entry) can go unnoticed.
void check_index_checksum(IndexContext& ctx) {
  const json& m = ctx.m;
  if (!m.contains(key::format) && !m.contains(key::index_checksum)) return;
  if (!m.contains(key::format) || !m.contains(key::index_checksum) || !m[key::index_checksum].is_string())
    fail(Exit::bad_input, ctx.w + ": needs both metadata.hfdelta_format and metadata.hfdelta_index_checksum");
  const Hash128 want =
      parse_hash_hex(m[key::index_checksum].get<std::string>(), ctx.w + ": metadata.hfdelta_index_checksum");
  ctx.j["metadata"].erase(key::index_checksum);  // the checksum covers the index without itself
  if (xxh3_128_of_dump(ctx.j) != want)
    fail(Exit::bad_input, ctx.w + ": index does not match its hfdelta_index_checksum (damaged)");
  ctx.d.index_checksum = want;
}

void read_revision(IndexContext& ctx) {
  if (!ctx.m.contains(key::format)) return;
  const json& f = ctx.m[key::format];
  if (!f.is_number_unsigned()) fail(Exit::bad_input, ctx.w + ": metadata.hfdelta_format must be an integer");
  ctx.revision = f.get<std::uint64_t>();
  ctx.d.format_revision = ctx.revision;
  if (ctx.revision > static_cast<std::uint64_t>(kFormatRevision))
    fail(Exit::unsupported, ctx.w + ": written by a newer hfdelta (format revision " + f.dump() +
                                "; this build reads up to " + std::to_string(kFormatRevision) + ")");
}

// delta_encoding "auto": hfdelta_encodings gives each tensor's.
void read_tensor_encodings(IndexContext& ctx) {
  const std::string& w = ctx.w;
  ctx.d.per_tensor = true;
  if (!ctx.m.contains(key::encodings) || !ctx.m[key::encodings].is_object())
    fail(Exit::bad_input, w, "delta_encoding \"auto\" needs metadata.hfdelta_encodings");
  json& es = ctx.j["metadata"][key::encodings];
  for (auto it = es.begin(); it != es.end(); it = es.erase(it)) {
    const auto e = it->is_string() ? parse_encoding(it->get<std::string>()) : std::nullopt;
    if (!e)
      fail(Exit::unsupported, w,
           "hfdelta_encodings[\"" + it.key() + "\"] is " + it->dump() + ", not an encoding this build knows");
    // Revisions 1 and 2 hold none an "auto" index (revision 2 on) could not.
    const EncodingInfo& info = encoding_info(*e);
    if (info.revision > 2 && ctx.revision < info.revision)
      fail(Exit::bad_input, w,
           "hfdelta_encodings[\"" + it.key() + "\"] is \"" + std::string(info.name) +
               "\", which needs hfdelta_format " + std::to_string(info.revision) + " or later");
    ctx.d.encodings.emplace(it.key(), *e);
  }
}

void read_encoding(IndexContext& ctx) {
  const std::string& w = ctx.w;
  if (!ctx.m[key::delta_encoding].is_string()) fail(Exit::bad_input, w, "metadata.delta_encoding must be a string");
  const std::string enc_name = ctx.m[key::delta_encoding].get<std::string>();
  ctx.d.encoding_name = enc_name;
  if (enc_name == kAutoEncoding) return read_tensor_encodings(ctx);
  const auto enc = parse_encoding(enc_name);
  if (!enc) fail(Exit::unsupported, w, "unknown delta_encoding \"" + enc_name + "\"");
  const EncodingInfo& info = encoding_info(*enc);
  if (!info.whole_delta)
    fail(Exit::bad_input, w, "delta_encoding \"" + enc_name + "\" is only valid per tensor, in hfdelta_encodings");
  if (info.revision > 2 && ctx.revision < info.revision)
    fail(Exit::bad_input, w,
         "delta_encoding \"" + enc_name + "\" needs hfdelta_format " + std::to_string(info.revision) + " or later");
  ctx.d.encoding = *enc;
}

// The format names these; absent means the only value there is.
void expect_text(const IndexContext& ctx, const char* k, const char* want) {
  if (!ctx.m.contains(k)) return;
  if (!ctx.m[k].is_string() || ctx.m[k].get<std::string>() != want)
    fail(Exit::unsupported,
         ctx.w + ": metadata." + k + " is " + ctx.m[k].dump() + ", this build supports only \"" + want + "\"");
}

// xxh3-128 (or absent), as hfdelta writes; adler32 from publishers of the
// plain layout (miles' --update-weight-delta-checksum adler32), whose deltas
// carry no hfdelta keys. blake3 has no C library in Debian: the message
// names the publisher's setting that makes the versions pullable.
void read_checksum_format(IndexContext& ctx) {
  const json& m = ctx.m;
  if (!m.contains(key::checksum_format)) return;
  const json& f = m[key::checksum_format];
  const std::string name = f.is_string() ? f.get<std::string>() : f.dump();
  if (name == "xxh3-128") return;
  if (name == "adler32") {
    if (ctx.revision > 0)
      fail(Exit::bad_input, ctx.w + ": metadata.checksum_format is \"adler32\", but an hfdelta delta (hfdelta_format " +
                                std::to_string(ctx.revision) + ") records xxh3-128 checksums");
    ctx.d.checksum_format = ChecksumFormat::adler32;
    return;
  }
  fail(Exit::unsupported, ctx.w + ": metadata.checksum_format is " + f.dump() +
                              "; this build verifies \"xxh3-128\" and \"adler32\" only" +
                              (name == "blake3" ? " (no blake3 library in Debian 12)" : "") +
                              ". Have the publisher write xxh3-128 (slime and miles: --update-weight-delta-checksum "
                              "xxh3-128, their default, or adler32) and publish again; versions already written "
                              "this way cannot be pulled by delta-apply");
}

void read_versions(IndexContext& ctx) {
  if (!ctx.m.contains(key::version) || !ctx.m.contains(key::base_version))
    fail(Exit::bad_input, ctx.w + ": metadata needs \"version\" and \"base_version\"");
  ctx.d.version = version_of(ctx.m[key::version], ctx.w + ": metadata.version");
  ctx.d.base_version = version_of(ctx.m[key::base_version], ctx.w + ": metadata.base_version");
}

void read_weight_map(IndexContext& ctx) {
  const std::string& w = ctx.w;
  if (!ctx.j.contains("weight_map") || !ctx.j["weight_map"].is_object())
    fail(Exit::bad_input, w, "no \"weight_map\" object");
  json& wm = ctx.j["weight_map"];
  for (auto it = wm.begin(); it != wm.end(); it = wm.erase(it)) {
    if (!it->is_string()) fail(Exit::bad_input, w, "weight_map[\"" + it.key() + "\"] is not a file name");
    const std::string& file = it->get_ref<const std::string&>();
    check_relative_path(file, w + ": weight_map[\"" + it.key() + "\"]");
    if (file.find('/') != std::string::npos)
      fail(Exit::bad_input, w, "weight_map[\"" + it.key() + "\"] names a file outside the delta directory's top level");
    ctx.d.weight_map.emplace(it.key(), file);
  }
}

void read_base_checksums(IndexContext& ctx) {
  const std::string& w = ctx.w;
  if (!ctx.m.contains(key::base_checksums)) return;
  json& b = ctx.j["metadata"][key::base_checksums];
  if (!b.is_object()) fail(Exit::bad_input, w, "metadata.hfdelta_base_checksums must be an object");
  for (auto it = b.begin(); it != b.end(); it = b.erase(it)) {
    if (!it->is_string()) fail(Exit::bad_input, w, "hfdelta_base_checksums[\"" + it.key() + "\"] is not a string");
    ctx.d.base_checksums.emplace(
        it.key(), parse_hash_hex(it->get<std::string>(), w + ": hfdelta_base_checksums[\"" + it.key() + "\"]"));
  }
}

FileChange file_change_of(const json& e, const std::string& w) {
  if (!e.is_object() || !e.contains("path") || !e["path"].is_string() || !e.contains("op") || !e["op"].is_string())
    fail(Exit::bad_input, w, "hfdelta_files entry " + e.dump() + " needs \"path\" and \"op\"");
  FileChange fc;
  fc.path = e["path"].get<std::string>();
  check_relative_path(fc.path, w + ": hfdelta_files");
  const std::string op = e["op"].get<std::string>();
  if (op == "remove") {
    fc.op = FileChange::Op::remove;
  } else if (op == "put") {
    fc.op = FileChange::Op::put;
    if (!e.contains("size") || !e["size"].is_number_unsigned() || !e.contains("xxh3-128") || !e["xxh3-128"].is_string())
      fail(Exit::bad_input, w, "hfdelta_files entry for \"" + fc.path + "\" needs \"size\" and \"xxh3-128\"");
    fc.size = e["size"].get<std::uint64_t>();
    fc.hash = parse_hash_hex(e["xxh3-128"].get<std::string>(), w + ": hfdelta_files \"" + fc.path + "\"");
  } else {
    fail(Exit::unsupported, w, "hfdelta_files entry for \"" + fc.path + "\" has unknown op \"" + op + "\"");
  }
  return fc;
}

void read_files(IndexContext& ctx) {
  if (!ctx.m.contains(key::files)) return;
  const json& fl = ctx.m[key::files];
  if (!fl.is_array()) fail(Exit::bad_input, ctx.w + ": metadata.hfdelta_files must be a list");
  for (const json& e : fl) {
    FileChange fc = file_change_of(e, ctx.w);
    for (const auto& other : ctx.d.files)
      if (other.path == fc.path) fail(Exit::bad_input, ctx.w + ": hfdelta_files lists \"" + fc.path + "\" twice");
    ctx.d.files.push_back(std::move(fc));
  }
}

// One hfdelta_shards entry `e`, `what` naming it in errors.
struct ShardJson {
  const json& e;
  const std::string& what;

  Hash128 hash_at(const json& o, const char* k) const {
    if (!o.contains(k) || !o[k].is_string()) fail(Exit::bad_input, what + ": needs \"" + std::string(k) + "\"");
    return parse_hash_hex(o[k].get<std::string>(), what + " " + k);
  }
  std::uint64_t u64_at(const json& o, const char* k) const {
    if (!o.contains(k) || !o[k].is_number_unsigned())
      fail(Exit::bad_input, what + ": needs an integer \"" + std::string(k) + "\"");
    return o[k].get<std::uint64_t>();
  }
  void read_header(ShardOp& so) const {
    if (!e.contains("header") || !e["header"].is_object()) fail(Exit::bad_input, what + ": needs a \"header\" object");
    so.header_size = u64_at(e["header"], "size");
    so.header_hash = hash_at(e["header"], "xxh3-128");
    if (so.header_size < 8 || so.header_size > 8 + kMaxHeaderSize)
      fail(Exit::bad_input, what + ": header size " + std::to_string(so.header_size) + " is out of range");
  }
};

void read_header_op(const ShardJson& s, ShardOp& so) {
  const json& e = s.e;
  so.op = ShardOp::Op::header;
  s.read_header(so);
  so.base_header_hash = s.hash_at(e, "base_header");
  if (!e.contains("renamed")) return;
  if (!e["renamed"].is_object()) fail(Exit::bad_input, s.what + ": \"renamed\" must be an object of names");
  for (auto it = e["renamed"].begin(); it != e["renamed"].end(); ++it) {
    if (!it->is_string()) fail(Exit::bad_input, s.what + ": renamed[\"" + it.key() + "\"] is not a name");
    so.renamed.emplace(it.key(), it->get<std::string>());
  }
}

// `seen`: tensors built by the entries before, which may not be built twice.
void read_build_op(const ShardJson& s, ShardOp& so, std::set<std::string>& seen) {
  const json& e = s.e;
  const std::string& what = s.what;
  so.op = ShardOp::Op::build;
  s.read_header(so);
  so.size = s.u64_at(e, "size");
  if (e.contains("replaces")) {
    if (!e["replaces"].is_boolean()) fail(Exit::bad_input, what + ": \"replaces\" must be true or false");
    so.replaces = e["replaces"].get<bool>();
  }
  if (!e.contains("tensors") || !e["tensors"].is_array()) fail(Exit::bad_input, what + ": needs a \"tensors\" list");
  for (const json& t : e["tensors"]) {
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string())
      fail(Exit::bad_input, what + ": tensor entry " + t.dump().substr(0, 200) + " needs a \"name\"");
    ShardOp::Tensor st;
    st.name = t["name"].get<std::string>();
    if (!seen.insert(st.name).second) fail(Exit::bad_input, what + ": tensor '" + st.name + "' is built twice");
    if (t.contains("from")) {
      if (!t["from"].is_string())
        fail(Exit::bad_input, what + ": tensor '" + st.name + "' has a \"from\" that is not a name");
      st.from = t["from"].get<std::string>();
    }
    st.hash = s.hash_at(t, "xxh3-128");
    so.tensors.push_back(std::move(st));
  }
}

ShardOp shard_op_of(const json& e, const std::string& w, std::set<std::string>& seen_files,
                    std::set<std::string>& seen_tensors) {
  if (!e.is_object() || !e.contains("file") || !e["file"].is_string() || !e.contains("op") || !e["op"].is_string())
    fail(Exit::bad_input, w, "hfdelta_shards entry " + e.dump().substr(0, 200) + " needs \"file\" and \"op\"");
  ShardOp so;
  so.file = e["file"].get<std::string>();
  const std::string what = w + ": hfdelta_shards \"" + so.file + "\"";
  check_relative_path(so.file, what);
  // hfdelta's own state lives there (the lock, state.json, the journal).
  if (so.file == kStateDir || so.file.rfind(std::string(kStateDir) + "/", 0) == 0)
    fail(Exit::bad_input, what + ": hfdelta_shards may not touch " + kStateDir);
  if (!seen_files.insert(so.file).second) fail(Exit::bad_input, what + " is listed twice");
  const std::string op = e["op"].get<std::string>();
  const ShardJson s{e, what};
  if (op == "remove")
    so.op = ShardOp::Op::remove;
  else if (op == "header")
    read_header_op(s, so);
  else if (op == "build")
    read_build_op(s, so, seen_tensors);
  else
    fail(Exit::unsupported, what + " has unknown op \"" + op + "\"");
  return so;
}

void read_shards(IndexContext& ctx) {
  if (!ctx.m.contains(key::shards)) return;
  const json& sl = ctx.m[key::shards];
  if (!sl.is_array()) fail(Exit::bad_input, ctx.w + ": metadata.hfdelta_shards must be a list");
  if (ctx.revision < 3)
    fail(Exit::bad_input, ctx.w + ": hfdelta_shards needs hfdelta_format 3 or later (an older reader would ignore it)");
  std::set<std::string> seen_files, seen_tensors;
  for (const json& e : sl) ctx.d.shards.push_back(shard_op_of(e, ctx.w, seen_files, seen_tensors));
}

void read_targets(IndexContext& ctx) {
  const std::string& w = ctx.w;
  if (!ctx.m.contains(key::targets)) return;
  const json& t = ctx.m[key::targets];
  if (!t.is_object()) fail(Exit::bad_input, w, "metadata.hfdelta_targets must be an object");
  for (auto it = t.begin(); it != t.end(); ++it) {
    if (!it->is_string()) fail(Exit::bad_input, w, "hfdelta_targets[\"" + it.key() + "\"] is not a file name");
    check_relative_path(it->get<std::string>(), w + ": hfdelta_targets[\"" + it.key() + "\"]");
    ctx.d.targets.emplace(it.key(), it->get<std::string>());
  }
}

void read_elements(IndexContext& ctx) {
  if (!ctx.m.contains(key::elements)) return;
  const json& e = ctx.m[key::elements];
  const auto count = [&](const char* k) -> std::uint64_t {
    if (!e.is_object() || !e.contains(k) || !e[k].is_number_unsigned())
      fail(Exit::bad_input, ctx.w + ": metadata.hfdelta_elements must be {\"changed\": N, \"total\": M}");
    return e[k].get<std::uint64_t>();
  };
  DeltaIndex::Elements n{count("total"), count("changed")};
  if (n.changed > n.total)
    fail(Exit::bad_input, ctx.w + ": metadata.hfdelta_elements counts more changed elements than elements");
  ctx.d.elements = n;
}

DeltaIndex delta_index_from_json(json j, const std::string& w) {
  if (!j.is_object()) fail(Exit::bad_input, w, "not a JSON object");
  if (!j.contains("metadata") || !j["metadata"].is_object()) fail(Exit::bad_input, w, "no \"metadata\" object");
  IndexContext ctx{j, j["metadata"], w, {}, 0};
  check_index_checksum(ctx);
  if (!ctx.m.contains(key::delta_encoding)) fail(Exit::bad_input, w, "not a delta (no metadata.delta_encoding)");
  read_revision(ctx);
  read_encoding(ctx);
  expect_text(ctx, key::compression_format, "zstd");
  read_checksum_format(ctx);
  read_versions(ctx);
  read_weight_map(ctx);
  read_base_checksums(ctx);
  read_files(ctx);
  read_shards(ctx);
  read_targets(ctx);
  read_elements(ctx);
  if (ctx.d.per_tensor)
    for (const auto& [tensor, file] : ctx.d.weight_map)
      if (!ctx.d.encodings.count(tensor))
        fail(Exit::bad_input, w, "hfdelta_encodings has no entry for '" + tensor + "'");
  return std::move(ctx.d);
}

}  // namespace

std::string delta_file_name(std::size_t i, std::size_t n) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i, n);
  return name;
}

void write_delta_file(const fs::path& path, const std::vector<DeltaFileEntry>& entries,
                      const std::function<void(std::size_t, File&, std::uint64_t)>& body, bool sync) {
  std::vector<TensorInfo> infos;
  std::map<std::string, std::string> meta;
  std::uint64_t pos = 0;
  for (const auto& e : entries) {
    infos.push_back({e.name, "U8", {e.size}, pos, pos + e.size});
    pos += e.size;
    meta[e.name] = e.new_hash.hex();
  }
  const std::string prefix = encode_safetensors_header(infos, &meta);
  File f(path, File::Mode::create_exclusive);
  f.pwrite_all(prefix.data(), prefix.size(), 0);
  for (std::size_t i = 0; i < entries.size(); ++i) body(i, f, prefix.size() + infos[i].begin);
  if (sync) f.sync();
  f.close();
}

std::uint64_t publish_delta(const fs::path& tmp, const fs::path& out, const std::string& index, std::uint64_t version,
                            const std::set<fs::path>& dirs, bool sync, const PublishExpectation& expect) {
  write_file_atomic(tmp / kIndexFile, index, sync);
  write_marker(tmp, version, false, sync, 0);  // last: lists every file above
  if (sync)
    for (const auto& d : dirs) sync_dir(d);
  const std::uint64_t bytes = tree_bytes(tmp);
  publish_checked(tmp, out, expect);
  const StopDeferred published;  // a stop signal now no longer undoes anything
  if (sync) sync_dir(out.parent_path());
  return bytes;
}

MappedFile open_carried(const fs::path& p, std::uint64_t size, const Hash128& hash, const std::string& listed) {
  boost::system::error_code ec;
  if (!fs::is_regular_file(fs::symlink_status(p, ec)))
    fail(Exit::bad_input, p, "listed in the delta index's " + listed + " but missing or not a regular file");
  MappedFile m(p);
  if (m.size() != size || xxh3_128(m.bytes()) != hash)
    fail(Exit::bad_input, p, "does not match the size and checksum the delta index records");
  return m;
}

SafetensorsHeader parse_built_header(std::string_view bytes, const ShardOp& so, const std::string& where) {
  SafetensorsHeader h = parse_safetensors(bytes, so.size, where);
  if (h.data_start() != bytes.size() || h.tensors.size() != so.tensors.size())
    fail(Exit::bad_input, where, "does not hold the tensors hfdelta_shards lists for " + so.file);
  for (std::size_t i = 0; i < h.tensors.size(); ++i)
    if (h.tensors[i].name != so.tensors[i].name)
      fail(Exit::bad_input, where,
           "tensor '" + h.tensors[i].name + "' is listed as '" + so.tensors[i].name + "' in hfdelta_shards");
  return h;
}

const ShardOp* shard_op(const DeltaIndex& idx, const std::string& file) {
  for (const auto& s : idx.shards)
    if (s.file == file) return &s;
  return nullptr;
}

Encoding encoding_of(const DeltaIndex& idx, const std::string& tensor) {
  if (!idx.per_tensor) return idx.encoding;
  return idx.encodings.at(tensor);
}

std::string seal_delta_index(std::string_view text) {
  json j = json::parse(text);
  if (!j.contains("metadata") || !j["metadata"].is_object()) return std::string(text);
  j["metadata"].erase(key::index_checksum);
  const std::string rest = j.dump();
  j["metadata"][key::index_checksum] =
      xxh3_128({reinterpret_cast<const std::uint8_t*>(rest.data()), rest.size()}).hex();
  return j.dump(2) + "\n";
}

namespace {

// The lowest revision that can apply the delta: the highest of its
// encodings' (an "auto" index is revision 2 on), 3 for a structural delta.
unsigned lowest_revision(const DeltaIndex& d) {
  unsigned r = d.per_tensor ? 2 : encoding_info(d.encoding).revision;
  if (d.structural()) r = std::max(r, 3u);
  if (d.context_layers) r = std::max(r, encoding_info(Encoding::context).revision);
  if (d.parts_layers) r = std::max(r, encoding_info(Encoding::parts).revision);
  if (d.per_tensor)
    for (const auto& [name, enc] : d.encodings) r = std::max(r, encoding_info(enc).revision);
  return r;
}

}  // namespace

std::string write_delta_index_json(const DeltaIndex& d, std::uint64_t total_size) {
  json m = json::object();
  m[key::total_size] = total_size;
  m[key::version] = format_version(d.version);
  m[key::base_version] = format_version(d.base_version);
  m[key::delta_encoding] = std::string(d.per_tensor ? kAutoEncoding : encoding_name(d.encoding));
  m[key::compression_format] = "zstd";
  m[key::checksum_format] = "xxh3-128";
  m[key::format] = lowest_revision(d);
  if (d.per_tensor) {
    json e = json::object();
    for (const auto& [name, enc] : d.encodings) e[name] = std::string(encoding_name(enc));
    m[key::encodings] = std::move(e);
  }
  json b = json::object();
  for (const auto& [name, h] : d.base_checksums) b[name] = h.hex();
  m[key::base_checksums] = std::move(b);
  json files = json::array();
  for (const auto& f : d.files) {
    if (f.op == FileChange::Op::remove) {
      files.push_back({{"path", f.path}, {"op", "remove"}});
    } else {
      files.push_back({{"path", f.path}, {"op", "put"}, {"size", f.size}, {"xxh3-128", f.hash.hex()}});
    }
  }
  m[key::files] = std::move(files);
  if (!d.targets.empty()) m[key::targets] = d.targets;
  if (d.elements) m[key::elements] = {{"changed", d.elements->changed}, {"total", d.elements->total}};
  if (d.structural()) {
    json shards = json::array();
    for (const auto& s : d.shards) {
      json e = {{"file", s.file}};
      const json header = {{"size", s.header_size}, {"xxh3-128", s.header_hash.hex()}};
      switch (s.op) {
        case ShardOp::Op::remove:
          e["op"] = "remove";
          break;
        case ShardOp::Op::header:
          e["op"] = "header";
          e["header"] = header;
          e["base_header"] = s.base_header_hash.hex();
          if (!s.renamed.empty()) e["renamed"] = s.renamed;
          break;
        case ShardOp::Op::build: {
          e["op"] = "build";
          e["header"] = header;
          e["size"] = s.size;
          e["replaces"] = s.replaces;
          json ts = json::array();
          for (const auto& t : s.tensors) {
            json o = {{"name", t.name}, {"xxh3-128", t.hash.hex()}};
            if (t.from) o["from"] = *t.from;
            ts.push_back(std::move(o));
          }
          e["tensors"] = std::move(ts);
          break;
        }
      }
      shards.push_back(std::move(e));
    }
    m[key::shards] = std::move(shards);
  }
  const json j = {{"metadata", std::move(m)}, {"weight_map", d.weight_map}};
  return seal_delta_index(j.dump());
}

EntryChecksum check_delta_entry(const DeltaIndex& idx, const std::string& file, const SafetensorsHeader& hdr,
                                const TensorInfo& t, const std::string& w) {
  auto wm = idx.weight_map.find(t.name);
  if (wm == idx.weight_map.end() || wm->second != file)
    fail(Exit::bad_input, w, "entry '" + t.name + "' is not mapped to this file by the delta index");
  if (t.dtype != "U8" || t.shape.size() != 1)
    fail(Exit::bad_input, w, "entry '" + t.name + "' must be U8 with shape [L]");
  auto mh = hdr.metadata.find(t.name);
  if (mh == hdr.metadata.end()) fail(Exit::bad_input, w, "__metadata__ has no checksum for '" + t.name + "'");
  const std::string what = w + ": __metadata__[\"" + t.name + "\"]";
  if (idx.checksum_format == ChecksumFormat::adler32) return {{}, parse_adler32_hex(mh->second, what)};
  return {parse_hash_hex(mh->second, what), std::nullopt};
}

}  // namespace hfdelta
