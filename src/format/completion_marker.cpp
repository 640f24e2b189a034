// Completion markers (see completion_marker.hpp).
#include "format/completion_marker.hpp"

#include <algorithm>

#include <boost/filesystem/operations.hpp>
#include <nlohmann/json.hpp>

#include "hfdelta/error.hpp"
#include "hfdelta/version.hpp"
#include "util/io.hpp"
#include "util/parallel.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;
using nlohmann::json;

namespace {

constexpr int kMarkerFormat = 1;

// Every regular file below `dir` but the marker, relative, sorted.
std::vector<std::string> marked_files(const fs::path& dir) {
  std::vector<std::string> out;
  boost::system::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; it != end && !ec; it.increment(ec)) {
    if (!fs::is_regular_file(it->symlink_status())) continue;
    const std::string rel = relative_name(it->path(), dir);
    if (rel != kCompleteFile) out.push_back(rel);
  }
  if (ec) fail(Exit::failure, dir, "cannot list: " + ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

Hash128 hash_whole_file(const File& f) {
  std::vector<std::uint8_t> buf;
  return hash_file_range(f, 0, f.size(), buf);
}

json marker_json(const CompletionMarker& m) {
  json files = json::object();
  for (const auto& [rel, f] : m.files) files[rel] = {{"size", f.size}, {"xxh3_128", f.hash.hex()}};
  return {{"hfdelta_complete", kMarkerFormat},
          {"version", format_version(m.version)},
          {"kind", m.full ? "full" : "delta"},
          {"bytes", m.bytes},
          {"files", std::move(files)}};
}

CompletionMarker marker_of_json(const json& j, const std::string& w) {
  if (!j.is_object() || !j.contains("hfdelta_complete") || !j["hfdelta_complete"].is_number_unsigned())
    fail(Exit::bad_input, w, "not a completion marker (no \"hfdelta_complete\" format number)");
  if (j["hfdelta_complete"].get<std::uint64_t>() != kMarkerFormat)
    fail(Exit::unsupported, w,
         "completion marker format " + j["hfdelta_complete"].dump() + " is newer than this build's");
  CompletionMarker m;
  try {
    m.version = parse_version(j.at("version").get<std::string>(), w);
    const std::string kind = j.at("kind").get<std::string>();
    if (kind != "full" && kind != "delta") fail(Exit::bad_input, w, "kind \"" + kind + "\" is neither full nor delta");
    m.full = kind == "full";
    for (const auto& [rel, f] : j.at("files").items()) {
      check_relative_path(rel, w + ": file \"" + rel + "\"");
      m.files[rel] = {f.at("size").get<std::uint64_t>(),
                      parse_hash_hex(f.at("xxh3_128").get<std::string>(), w + ": " + rel)};
      m.bytes += m.files[rel].size;
    }
  } catch (const json::exception& e) {
    fail(Exit::bad_input, w, std::string("malformed completion marker: ") + e.what());
  }
  return m;
}

}  // namespace

CompletionMarker write_marker(const fs::path& dir, std::uint64_t version, bool full, bool sync, int threads) {
  const std::vector<std::string> rels = marked_files(dir);
  std::vector<MarkedFile> files(rels.size());
  parallel_for(rels.size(), default_threads(threads), [&](std::size_t i, std::size_t) {
    const File f(dir / rels[i], File::Mode::read);
    files[i] = {f.size(), hash_whole_file(f)};
  });
  CompletionMarker m{version, full, {}, 0};
  for (std::size_t i = 0; i < rels.size(); ++i) {
    m.files[rels[i]] = files[i];
    m.bytes += files[i].size;
  }
  write_file_atomic(dir / kCompleteFile, marker_json(m).dump(1) + "\n", sync);
  return m;
}

bool matches_marker(const fs::path& p, const MarkedFile& want) {
  const File f(p, File::Mode::read);
  return f.size() == want.size && hash_whole_file(f) == want.hash;
}

Completeness check_complete(const fs::path& dir, bool required) {
  Completeness c;
  const fs::path mp = dir / kCompleteFile;
  boost::system::error_code ec;
  if (!fs::is_regular_file(fs::symlink_status(mp, ec))) {
    c.complete = !required;
    c.missing = "its completion marker " + std::string(kCompleteFile);
    return c;
  }
  json j;
  try {
    j = json::parse(read_small_file(mp, 64u << 20));
  } catch (const json::exception& e) {
    fail(Exit::bad_input, mp, std::string("not valid JSON: ") + e.what());
  }
  c.marker = marker_of_json(j, mp.string());
  for (const auto& [rel, f] : c.marker->files) {
    const fs::path p = dir / rel;
    const fs::file_status st = fs::symlink_status(p, ec);
    if (!fs::is_regular_file(st)) {
      c.missing = rel;
      return c;
    }
    const std::uint64_t size = fs::file_size(p, ec);
    if (ec || size < f.size) {  // still being written; a larger one is damage, found by the checksums
      c.missing = rel + " (" + std::to_string(ec ? 0 : size) + " of " + std::to_string(f.size) + " bytes)";
      return c;
    }
  }
  c.complete = true;
  return c;
}

}  // namespace hfdelta
