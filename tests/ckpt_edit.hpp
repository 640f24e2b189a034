// A small HF checkpoint directory held in memory, to be edited by a test
// (tensors added, removed, renamed, reshaped, retyped, moved between weight
// files; weight files renamed, split or merged; __metadata__ and other files
// changed) and written back out as a fresh directory.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "e2e_util.hpp"

namespace e2e {

inline constexpr const char* kSingleFile = "model.safetensors";
inline constexpr const char* kIndexName = "model.safetensors.index.json";

struct CkptTensor {
  std::string dtype;
  std::vector<std::uint64_t> shape;
  Bytes bytes;
  std::string file;  // the weight file holding it
};

struct Ckpt {
  std::map<std::string, CkptTensor> tensors;
  // __metadata__ of weight files; a file without an entry is written without one.
  std::map<std::string, std::map<std::string, std::string>> metadata;
  // Every other file, by relative path with '/', the index excluded.
  std::map<std::string, std::string> files;
  // Written with model.safetensors.index.json; otherwise every tensor must be
  // in model.safetensors.
  bool sharded = true;
  // Keys of the index's "metadata" besides total_size (which is recomputed).
  json index_metadata = json::object();

  // Reads a checkpoint written by hfdelta-gen, by save(), or by hand
  // (.weight_sync/ is skipped).
  static Ckpt load(const fs::path& dir);
  // Writes every weight file holding at least one tensor (laid out by
  // write_safetensors), the index when sharded (weight_map and
  // metadata.total_size, as hfdelta-gen writes it), and the other files.
  // `dir` must not exist yet.
  void save(const fs::path& dir) const;

  // Weight files holding at least one tensor, sorted.
  std::vector<std::string> weight_files() const;
  // Tensor names of one weight file, sorted.
  std::vector<std::string> tensors_in(const std::string& file) const;
  CkptTensor& at(const std::string& name);
  const CkptTensor& at(const std::string& name) const;
  bool has(const std::string& name) const { return tensors.count(name) != 0; }

  void add(const std::string& name, const std::string& dtype, std::vector<std::uint64_t> shape, Bytes bytes,
           const std::string& file);
  void remove(const std::string& name);
  void rename(const std::string& from, const std::string& to);
  void move(const std::string& name, const std::string& file);
  // Renames a weight file (its __metadata__ follows it).
  void rename_file(const std::string& from, const std::string& to);
  // Spreads the tensors, in name order, over `n` files named
  // model-0000i-of-0000n.safetensors (1-based), about as many in each; each
  // file gets `meta`.
  void reshard(int n, const std::map<std::string, std::string>& meta = {{"format", "pt"}});
  // Everything into model.safetensors without an index, with `meta`.
  void to_single_file(const std::map<std::string, std::string>& meta = {{"format", "pt"}});
};

// Deterministic pseudo-random bytes.
Bytes random_bytes(std::size_t n, std::uint64_t seed);

// Replaces the text `from` with `to` (same length) once inside the JSON header
// of a safetensors file, so that the header keeps its length and byte ranges
// (e.g. __metadata__ keys reordered, a name swapped for one as long).
// Fails the test if `from` is not found exactly once or the lengths differ.
void edit_header_text(const fs::path& st_file, const std::string& from, const std::string& to);

}  // namespace e2e
