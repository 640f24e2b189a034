// Completion markers, full versions and the deltas beside them (see publication.hpp).
#include "hfdelta/publication.hpp"

#include <algorithm>
#include <chrono>
#include <set>

#include <boost/filesystem/operations.hpp>
#include <nlohmann/json.hpp>

#include "hfdelta/checkpoint.hpp"
#include "hfdelta/delta_format.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/io.hpp"
#include "hfdelta/progress.hpp"
#include "hfdelta/signals.hpp"
#include "parallel.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;
using nlohmann::json;

namespace {

constexpr std::string_view kSidecarPrefix = "delta_v";
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
  if (ec) fail(Exit::failure, dir.string() + ": cannot list: " + ec.message());
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
    fail(Exit::bad_input, w + ": not a completion marker (no \"hfdelta_complete\" format number)");
  if (j["hfdelta_complete"].get<std::uint64_t>() != kMarkerFormat)
    fail(Exit::unsupported, w + ": completion marker format " + j["hfdelta_complete"].dump() + " is newer than this build's");
  CompletionMarker m;
  try {
    m.version = parse_version(j.at("version").get<std::string>(), w);
    const std::string kind = j.at("kind").get<std::string>();
    if (kind != "full" && kind != "delta") fail(Exit::bad_input, w + ": kind \"" + kind + "\" is neither full nor delta");
    m.full = kind == "full";
    for (const auto& [rel, f] : j.at("files").items()) {
      check_relative_path(rel, w + ": file \"" + rel + "\"");
      m.files[rel] = {f.at("size").get<std::uint64_t>(), parse_hash_hex(f.at("xxh3_128").get<std::string>(), w + ": " + rel)};
      m.bytes += m.files[rel].size;
    }
  } catch (const json::exception& e) {
    fail(Exit::bad_input, w + ": malformed completion marker: " + e.what());
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
    fail(Exit::bad_input, mp.string() + ": not valid JSON: " + e.what());
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

std::string sidecar_dirname(std::uint64_t v) { return std::string(kSidecarPrefix) + format_version(v); }

std::map<std::uint64_t, fs::path> scan_sidecars(const fs::path& root) {
  std::map<std::uint64_t, fs::path> out;
  boost::system::error_code ec;
  for (fs::directory_iterator it(root, ec), end; it != end && !ec; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const auto v = version_from_name(name, kSidecarPrefix);
    if (v && sidecar_dirname(*v) == name && fs::is_directory(it->symlink_status())) out.emplace(*v, it->path());
  }
  if (ec) fail(Exit::failure, root.string() + ": cannot list directory: " + ec.message());
  return out;
}

void check_out_apart(const fs::path& out, const std::vector<std::pair<std::string, fs::path>>& inputs) {
  for (const auto& [role, in] : inputs) {
    const Nesting n = nesting(out, in);
    if (n == Nesting::apart) continue;
    fail(Exit::bad_input, out.string() + (n == Nesting::same ? ": is " + role + " itself (" + in.string() + ")"
                                                              : ": is inside " + role + " " + in.string()) +
                              ": a publication root inside a checkpoint would be carried into every later delta as "
                              "the checkpoint's files, and into every host's LOCAL; put the root outside BASE and NEW "
                              "(nothing was written)");
  }
}

FullSummary publish_full(const fs::path& src, const fs::path& out, std::uint64_t version, bool sync, int threads) {
  const auto t0 = std::chrono::steady_clock::now();
  check_out_apart(out, {{"NEW", src}});
  if (is_delta_dir(src)) fail(Exit::bad_input, src.string() + ": is a delta version, not a full checkpoint");
  const Checkpoint c = open_checkpoint(src);  // every weight file valid before anything is copied
  if (c.shards.empty())
    fail(Exit::bad_input, src.string() + ": has no weight files (*.safetensors); not a checkpoint (a save still being written?)");
  std::vector<std::string> rels;
  for (const auto& s : c.shards) rels.push_back(s.file);
  rels.insert(rels.end(), c.other_files.begin(), c.other_files.end());
  if (exists_nofollow(out)) fail(Exit::exists, out.string() + ": already exists; refusing to overwrite");
  const fs::path tmp = temp_path_beside(out);
  try {
    make_dirs(tmp);
    std::set<fs::path> dirs{tmp};
    for (const auto& rel : rels)
      for (fs::path d = (tmp / rel).parent_path(); d != tmp; d = d.parent_path()) dirs.insert(d);
    for (const auto& d : dirs) make_dirs(d);
    std::uint64_t total = 0;
    for (const auto& rel : rels) total += fs::file_size(src / rel);
    progress::begin("copy", total);
    parallel_for(rels.size(), default_threads(threads), [&](std::size_t i, std::size_t) {
      copy_file_atomic(src / rels[i], tmp / rels[i], sync);
      progress::add(fs::file_size(tmp / rels[i]));
    });
    const CompletionMarker m = write_marker(tmp, version, true, sync, threads);
    if (sync)
      for (const auto& d : dirs) sync_dir(d);
    publish_dir(tmp, out);
    const StopDeferred published;  // a stop signal now no longer undoes anything
    if (sync) sync_dir(out.parent_path().empty() ? fs::path(".") : out.parent_path());
    return {version, rels.size(), m.bytes,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
  } catch (...) {
    boost::system::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

fs::path publish_sidecar(const fs::path& base, const fs::path& src, const fs::path& full_out, const DiffOptions& opts,
                         DiffSummary& summary) {
  const fs::path root = full_out.parent_path().empty() ? fs::path(".") : full_out.parent_path();
  const fs::path side = root / sidecar_dirname(opts.version);
  check_out_apart(full_out, {{"BASE", base}, {"NEW", src}});
  const fs::path cand = temp_path_beside(side);  // hidden: no reader lists it
  summary = diff_checkpoints(base, src, cand, opts);
  if (!exists_nofollow(side)) {
    try {
      publish_dir(cand, side);
    } catch (...) {
      boost::system::error_code ec;
      fs::remove_all(cand, ec);
      throw;
    }
    if (opts.sync) sync_dir(root);
    return side;
  }
  boost::system::error_code ec;
  const bool same = fs::is_regular_file(side / kIndexFile, ec) &&
                    read_small_file(side / kIndexFile) == read_small_file(cand / kIndexFile);
  fs::remove_all(cand, ec);
  if (!same)
    fail(Exit::exists, side.string() + ": already exists with another delta (another publisher of version " +
                           format_version(opts.version) + "?); refusing to replace it");
  return side;  // this publication's own, from a run interrupted before the full version
}

}  // namespace hfdelta
