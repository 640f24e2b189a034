#include "hfdelta/checkpoint.hpp"

#include <algorithm>
#include <set>

#include <boost/filesystem/operations.hpp>
#include <nlohmann/json.hpp>

#include "format/completion_marker.hpp"
#include "hfdelta/error.hpp"
#include "util/io.hpp"
#include "util/json_text.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;
using nlohmann::json;

namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string link_target(const fs::path& p) {
  boost::system::error_code ec;
  return fs::read_symlink(p, ec).string();
}

// Every regular file below `dir`, relative, with '/' separators; hfdelta's own
// state directory is not part of the checkpoint. Symlinked files are followed
// (read, like cp -L, never written); symlinked directories are refused.
std::vector<std::string> list_files(const fs::path& dir) {
  std::vector<std::string> out;
  boost::system::error_code ec;
  fs::recursive_directory_iterator it(dir, ec), end;
  if (ec) fail(Exit::failure, dir, "cannot list: " + ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec) fail(Exit::failure, dir, "cannot list: " + ec.message());
    const fs::path& p = it->path();
    const std::string rel = relative_name(p, dir);  // a hub snapshot's file, not its blob
    if (it.depth() == 0 && p.filename() == kStateDir) {
      it.disable_recursion_pending();
      continue;
    }
    if (it.depth() == 0 && p.filename() == kCompleteFile) {  // a published version's marker, not a file of the model
      it.disable_recursion_pending();
      continue;
    }
    const bool link = fs::is_symlink(it->symlink_status());
    const fs::file_status st = fs::status(p, ec);  // follows links: HF caches link to blobs
    if (ec || !fs::exists(st)) {
      const std::string why = ec ? ec.message() : "does not exist";
      if (link) fail(Exit::bad_input, p, "is a dangling symlink (to " + link_target(p) + ": " + why + ")");
      fail(Exit::bad_input, p, why);
    }
    if (fs::is_directory(st)) {
      // Followed, a directory link could leave the source or loop.
      if (link)
        fail(Exit::bad_input, p,
             "is a symlink to a directory (" + link_target(p) +
                 "); only symlinked files are followed; copy it in (cp -rL)");
      continue;
    }
    if (!fs::is_regular_file(st))
      fail(Exit::bad_input, p, "not a regular file" + (link ? " (a symlink to " + link_target(p) + ")" : ""));
    out.push_back(rel);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

const Shard* Checkpoint::find_shard(const std::string& file) const {
  for (const auto& s : shards)
    if (s.file == file) return &s;
  return nullptr;
}

std::uint64_t Checkpoint::tensor_bytes() const {
  std::uint64_t n = 0;
  for (const auto& s : shards)
    for (const auto& t : s.header.tensors) n += t.nbytes();
  return n;
}

Checkpoint open_checkpoint(const fs::path& dir) {
  require_dir(dir, "give a checkpoint directory");
  Checkpoint c;
  c.dir = dir;
  const std::vector<std::string> files = list_files(dir);

  std::set<std::string> shard_names;
  std::map<std::string, std::string> mapped;  // tensor -> shard, from the indexes
  for (const auto& f : files) {
    if (f.find('/') != std::string::npos || !ends_with(f, ".safetensors.index.json")) continue;
    c.index_files.push_back(f);
    const fs::path p = dir / f;
    const json j = parse_json_text(read_small_file(p, kIndexJson.bytes), p.string(), "index", kIndexJson);
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      fail(Exit::bad_input, p, "no \"weight_map\" object");
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it->is_string()) fail(Exit::bad_input, p, "weight_map[\"" + it.key() + "\"] is not a file name");
      const std::string shard = it->get<std::string>();
      check_relative_path(shard, p.string() + ": weight_map[\"" + it.key() + "\"]");
      if (shard.find('/') != std::string::npos || !ends_with(shard, ".safetensors"))
        fail(Exit::bad_input, p,
             "weight_map[\"" + it.key() + "\"] = \"" + shard + "\" is not a .safetensors file of this directory");
      if (!std::binary_search(files.begin(), files.end(), shard))
        fail(Exit::bad_input, p, "weight_map[\"" + it.key() + "\"] names missing file " + shard);
      auto [at, fresh] = mapped.emplace(it.key(), shard);
      if (!fresh && at->second != shard)
        fail(Exit::bad_input, p, "tensor '" + it.key() + "' is mapped to both " + at->second + " and " + shard);
      shard_names.insert(shard);
    }
  }
  if (c.index_files.empty()) {
    for (const auto& f : files)
      if (f.find('/') == std::string::npos && ends_with(f, ".safetensors")) shard_names.insert(f);
  }

  for (const auto& name : shard_names) c.shards.push_back({name, read_safetensors(dir / name)});
  for (std::size_t s = 0; s < c.shards.size(); ++s) {
    const auto& tensors = c.shards[s].header.tensors;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const std::string& t = tensors[i].name;
      auto [at, fresh] = c.tensors.emplace(t, TensorRef{s, i});
      if (!fresh)
        fail(Exit::bad_input, dir / c.shards[s].file,
             "tensor '" + t + "' is also in " + c.shards[at->second.shard].file);
    }
  }
  if (!c.index_files.empty())
    for (const auto& s : c.shards)
      for (const auto& t : s.header.tensors)
        if (!mapped.count(t.name))
          fail(Exit::bad_input, dir / s.file,
               "tensor '" + t.name + "' is not in the index's weight_map, so loaders would not see it");
  for (const auto& [t, shard] : mapped) {
    auto it = c.tensors.find(t);
    if (it == c.tensors.end() || c.shards[it->second.shard].file != shard)
      fail(Exit::bad_input, dir / shard, "has no tensor '" + t + "', which the index maps to it");
  }
  for (const auto& f : files)
    if (!shard_names.count(f)) c.other_files.push_back(f);
  return c;
}

}  // namespace hfdelta
