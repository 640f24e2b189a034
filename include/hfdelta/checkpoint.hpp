// An HF checkpoint directory: weight files (one file, or shards with an
// index), and every other file of the directory, which an engine reads too.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include <boost/filesystem/path.hpp>

#include "hfdelta/safetensors.hpp"

namespace hfdelta {

struct Shard {
  std::string file;  // name inside the directory
  SafetensorsHeader header;
};

struct TensorRef {
  std::size_t shard = 0;
  std::size_t index = 0;  // into shards[shard].header.tensors
};

struct Checkpoint {
  boost::filesystem::path dir;
  std::vector<Shard> shards;             // sorted by file name
  std::vector<std::string> index_files;  // "*.safetensors.index.json" read for weight_map
  std::vector<std::string> other_files;  // every non-shard file, relative, sorted (indexes too)
  std::map<std::string, TensorRef> tensors;

  const TensorInfo& info(const TensorRef& r) const { return shards[r.shard].header.tensors[r.index]; }
  const Shard* find_shard(const std::string& file) const;
  std::uint64_t tensor_bytes() const;  // sum of all tensors' sizes
};

// Name of the directory hfdelta keeps its own state in; never part of a checkpoint.
inline constexpr const char* kStateDir = ".weight_sync";

// Opens and validates a directory:
// - with one or more "*.safetensors.index.json", the shards are the files their
//   weight_map names (each must exist and hold the tensors mapped to it, and
//   each of its tensors must be mapped to it); other *.safetensors files are
//   ordinary files;
// - without an index, every top-level *.safetensors file is a shard.
// Tensor names are unique across shards. Throws Error(bad_input) naming the file.
Checkpoint open_checkpoint(const boost::filesystem::path& dir);

}  // namespace hfdelta
