// Publishing one version from the pieces many processes hold (a sharded
// trainer), with no gather: see docs/sharded.md. The core knows nothing of
// torch or of how the processes talk; the caller (python/hfdelta/sharded.py)
// moves the small plan and part records between them.
//
//   every rank:   check_shard_plan(layout, all pieces)        same error everywhere
//   rank 0:       stage = make_shard_stage(root, version)      broadcast
//   every rank:   ShardWriter w(mirror, stage, rank, ...); w.put(...) ...; w.finish()
//   rank 0:       commit_sharded(root, mirror, stage, ..., every rank's parts)
//   host leaders: apply the version to their mirror (apply_delta)
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <boost/filesystem/path.hpp>

#include "hfdelta/checkpoint.hpp"
#include "hfdelta/encodings.hpp"
#include "hfdelta/hash.hpp"
#include "hfdelta/region.hpp"

namespace hfdelta {

// One piece of the plan: a region of a tensor of the mirror, held by `rank`.
struct ShardPiece {
  std::string name;
  Region region;
  std::uint32_t rank = 0;
};

// Every element of every tensor of `layout` covered by exactly one piece,
// every piece a region of a tensor the mirror has. Error(usage) naming the
// first tensor with a gap or an overlap (and the ranks), Error(unsupported)
// for a name the mirror lacks.
void check_shard_plan(const Checkpoint& layout, const std::vector<ShardPiece>& pieces);

// One part a rank wrote: where in its spool, and what it covers.
struct ShardPart {
  std::string tensor;
  Region region;
  Encoding enc = Encoding::sparse;
  std::uint32_t rank = 0;
  std::uint64_t offset = 0, size = 0;  // in the rank's spool
  Hash128 hash;                        // of the region's new bytes
  std::uint64_t elements_changed = 0;  // the index's hfdelta_elements, summed over parts
};
// As text (one line per part) and back: what the ranks exchange.
std::string shard_parts_text(const std::vector<ShardPart>& parts);
std::vector<ShardPart> parse_shard_parts(std::string_view text);

// The version's staging directory, ROOT/.shard_vNNNNNN.tmp-XXXXXXXX, made.
boost::filesystem::path make_shard_stage(const boost::filesystem::path& root, std::uint64_t version);
boost::filesystem::path shard_spool(const boost::filesystem::path& stage, std::uint32_t rank);

// One rank's writer: diffs each piece it is given against its region of the
// mirror (reading that region only) and appends the part, if the region
// changed, to its spool in the stage.
class ShardWriter {
 public:
  ShardWriter(const boost::filesystem::path& mirror, const boost::filesystem::path& stage, std::uint32_t rank,
              Encoding enc, int level);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;
  // `bytes`: the region's elements, row-major (a piece as the rank holds
  // it). Each byte is read once, copied a chunk (2^20 elements) at a time,
  // and the part's checksum is of that copy: a caller writing `bytes`
  // meanwhile gets a part every host applies, holding each chunk as it was
  // when copied. Error(unsupported) for a name, dtype or shape the mirror
  // lacks, Error(bad_input) for bytes of the wrong length or a region outside it.
  void put(std::string_view name, std::string_view dtype, std::span<const std::uint64_t> shape, const Region& region,
           std::span<const std::uint8_t> bytes);
  // Flushes the spool; the parts written (none for regions without change).
  std::vector<ShardPart> finish(bool sync);
  std::uint64_t mirror_bytes_read() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

struct ShardCommit {
  boost::filesystem::path out;
  std::uint64_t tensors_changed = 0, delta_bytes = 0;
};

// Rank 0: the version from every rank's parts, on the mirror's version
// `base` (ROOT's newest): the parts entries, the index (base checksums from
// the mirror's record), the marker; published in one rename (Error(exists)
// if the number was taken meanwhile). The stage is removed.
ShardCommit commit_sharded(const boost::filesystem::path& root, const boost::filesystem::path& mirror,
                           const boost::filesystem::path& stage, std::uint64_t version, std::uint64_t base,
                           std::vector<ShardPart> parts, bool sync);

}  // namespace hfdelta
