#include "ckpt_edit.hpp"

#include <algorithm>
#include <cstdio>
#include <set>
#include <stdexcept>

namespace e2e {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Ckpt Ckpt::load(const fs::path& dir) {
  Ckpt c;
  std::set<std::string> weight_files;
  const std::vector<std::string> all = list_files(dir);
  if (fs::exists(dir / kIndexName)) {
    const json idx = read_json(dir / kIndexName);
    for (auto it = idx.at("weight_map").begin(); it != idx.at("weight_map").end(); ++it)
      weight_files.insert(it->get<std::string>());
    if (idx.contains("metadata"))
      for (auto it = idx["metadata"].begin(); it != idx["metadata"].end(); ++it)
        if (it.key() != "total_size") c.index_metadata[it.key()] = *it;
  } else {
    c.sharded = false;
    for (const auto& f : all)
      if (f.find('/') == std::string::npos && ends_with(f, ".safetensors")) weight_files.insert(f);
    if (weight_files != std::set<std::string>{kSingleFile})
      throw std::runtime_error(dir.string() + ": without an index, only a single model.safetensors is supported");
  }
  for (const auto& wf : weight_files) {
    const StFile st = read_st(dir / wf);
    if (st.header.contains("__metadata__")) {
      auto& m = c.metadata[wf];
      for (auto it = st.header["__metadata__"].begin(); it != st.header["__metadata__"].end(); ++it)
        m[it.key()] = it->get<std::string>();
    }
    for (const auto& name : st.tensor_names()) {
      const json& h = st.header[name];
      CkptTensor t;
      t.dtype = h.at("dtype").get<std::string>();
      t.shape = h.at("shape").get<std::vector<std::uint64_t>>();
      t.bytes = st.tensor(name);
      t.file = wf;
      if (!c.tensors.emplace(name, std::move(t)).second)
        throw std::runtime_error(dir.string() + ": tensor '" + name + "' is in two weight files");
    }
  }
  for (const auto& f : all) {
    if (f == kIndexName || weight_files.count(f) || f.rfind(".weight_sync/", 0) == 0) continue;
    c.files[f] = read_file(dir / f);
  }
  return c;
}

void Ckpt::save(const fs::path& dir) const {
  if (fs::exists(dir)) throw std::runtime_error(dir.string() + ": already exists");
  fs::create_directories(dir);
  std::map<std::string, std::vector<TensorData>> by_file;
  std::uint64_t total = 0;
  json wm = json::object();
  for (const auto& [name, t] : tensors) {
    if (!sharded && t.file != kSingleFile)
      throw std::runtime_error("single-file checkpoint with tensor '" + name + "' in " + t.file);
    by_file[t.file].push_back({name, t.dtype, t.shape, t.bytes});
    total += t.bytes.size();
    wm[name] = t.file;
  }
  for (const auto& [file, ts] : by_file) {
    auto m = metadata.find(file);
    write_safetensors(dir / file, ts, m == metadata.end() ? nullptr : &m->second);
  }
  if (sharded) {
    json meta = index_metadata;
    meta["total_size"] = total;
    const json idx = {{"metadata", meta}, {"weight_map", wm}};
    write_file(dir / kIndexName, idx.dump(2) + "\n");
  }
  for (const auto& [rel, content] : files) {
    if (by_file.count(rel) || rel == kIndexName)
      throw std::runtime_error("other file " + rel + " collides with a weight file");
    write_file(dir / rel, content);
  }
}

std::vector<std::string> Ckpt::weight_files() const {
  std::set<std::string> s;
  for (const auto& [name, t] : tensors) s.insert(t.file);
  return {s.begin(), s.end()};
}

std::vector<std::string> Ckpt::tensors_in(const std::string& file) const {
  std::vector<std::string> v;
  for (const auto& [name, t] : tensors)
    if (t.file == file) v.push_back(name);
  return v;
}

CkptTensor& Ckpt::at(const std::string& name) {
  auto it = tensors.find(name);
  if (it == tensors.end()) throw std::runtime_error("no tensor '" + name + "'");
  return it->second;
}

const CkptTensor& Ckpt::at(const std::string& name) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) throw std::runtime_error("no tensor '" + name + "'");
  return it->second;
}

void Ckpt::add(const std::string& name, const std::string& dtype, std::vector<std::uint64_t> shape, Bytes bytes,
               const std::string& file) {
  if (has(name)) throw std::runtime_error("tensor '" + name + "' already exists");
  tensors[name] = CkptTensor{dtype, std::move(shape), std::move(bytes), file};
}

void Ckpt::remove(const std::string& name) {
  if (!tensors.erase(name)) throw std::runtime_error("no tensor '" + name + "'");
}

void Ckpt::rename(const std::string& from, const std::string& to) {
  if (has(to)) throw std::runtime_error("tensor '" + to + "' already exists");
  CkptTensor t = at(from);
  tensors.erase(from);
  tensors[to] = std::move(t);
}

void Ckpt::move(const std::string& name, const std::string& file) { at(name).file = file; }

void Ckpt::rename_file(const std::string& from, const std::string& to) {
  for (auto& [name, t] : tensors)
    if (t.file == from) t.file = to;
  if (auto m = metadata.find(from); m != metadata.end()) {
    auto meta = m->second;
    metadata.erase(m);
    metadata[to] = std::move(meta);
  }
}

void Ckpt::reshard(int n, const std::map<std::string, std::string>& meta) {
  metadata.clear();
  const std::size_t count = tensors.size();
  std::size_t i = 0;
  char buf[64];
  for (auto& [name, t] : tensors) {
    const int k = static_cast<int>(i++ * static_cast<std::size_t>(n) / count);
    std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", k + 1, n);
    t.file = buf;
    metadata[buf] = meta;
  }
  sharded = true;
}

void Ckpt::to_single_file(const std::map<std::string, std::string>& meta) {
  for (auto& [name, t] : tensors) t.file = kSingleFile;
  metadata.clear();
  metadata[kSingleFile] = meta;
  sharded = false;
}

Bytes random_bytes(std::size_t n, std::uint64_t seed) {
  Bytes b(n);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
  for (std::size_t i = 0; i < n; ++i) {
    // splitmix64: every byte of the output is usable.
    x += 0x9E3779B97F4A7C15ull;
    std::uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    b[i] = static_cast<std::uint8_t>((z ^ (z >> 31)) >> 24);
  }
  return b;
}

void edit_header_text(const fs::path& st_file, const std::string& from, const std::string& to) {
  REQUIRE(from.size() == to.size());
  Bytes raw = read_bytes(st_file);
  const StFile st = read_st(st_file);
  const std::string header(raw.begin() + 8, raw.begin() + static_cast<std::ptrdiff_t>(st.data_start()));
  const std::size_t at = header.find(from);
  REQUIRE_MESSAGE(at != std::string::npos, "\"" << from << "\" not in the header of " << st_file << ": " << header);
  REQUIRE_MESSAGE(header.find(from, at + 1) == std::string::npos, "\"" << from << "\" twice in " << st_file);
  std::copy(to.begin(), to.end(), raw.begin() + 8 + static_cast<std::ptrdiff_t>(at));
  write_bytes(st_file, raw);
  read_st(st_file);  // still a valid header
}

}  // namespace e2e
