// delta-diff --squash: one delta equivalent to a chain of consecutive deltas,
// composed from the deltas alone (no checkpoint is read, unless
// SquashOptions::base names the first base's, for context entries).
//
// Each tensor of the last version is traced back through the chain to where
// its bytes come from in the first base (a tensor of some name, or zeros),
// collecting the entries laid over it on the way. One entry is taken as it
// is; several are composed into one: entries of one kind compose element by
// element (xor masks XOR, sparse differences add, overwrites merge), and a
// tensor that starts from zeros composes from any kinds, since its bytes are
// known. Entries of different kinds (xor, then sparse: chains of --encoding
// auto, or of runs with different encodings) do not compose without the
// base bytes: each run of one kind is composed, and the runs are stacked in
// one entry (encoding "stack") that delta-apply lays in order. Context
// entries (their positions count base elements) compose with nothing
// without the base bytes: each stays a stacked layer of its own, unless
// SquashOptions::base gives the checkpoint of the chain's first base. Then a
// tensor of that base with a context entry among several is composed against
// its real bytes: read from the checkpoint (checked against the first
// entry's base checksum), every entry laid over a scratch copy in order
// (each checked against the checksum it records), and the result encoded as
// one context entry, as `delta-diff --encoding context` would write it.
// Parts entries (a sharded publisher's versions) are kept the same way: each
// is a stacked layer of its own (encoding 4 in the stack's head, revision 6),
// laid region by region by delta-apply; where it is the last, the squashed
// entry records its head's checksum, as a parts entry does, and delta-apply
// hashes the tensor for its record. With SquashOptions::base they are
// composed against the base's bytes like context entries (each region
// checked, and the tensor hashed after each, so every base checksum of the
// chain is checked). A tensor of a weight file OUT builds is refused
// (Error(unsupported)) where a parts entry patched it, unless it is composed
// so. Weight-file operations compose too: a file only ever rewritten in
// place keeps a header operation, anything built at some step is built.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <boost/filesystem/path.hpp>

#include "hfdelta/encodings.hpp"

namespace hfdelta {

struct SquashOptions {
  int level = kDefaultLevel;  // zstd level of composed entries (codec.hpp)
  int threads = 0;            // 0: all cores
  bool sync = true;           // flush OUT before publishing it
  // The checkpoint (HF directory) whose version is the first delta's base:
  // context entries are then composed against its bytes (see above). A
  // tensor whose bytes differ from what the chain records as its base is
  // refused with Error(verify_failed).
  std::optional<boost::filesystem::path> base;
};

struct SquashSummary {
  std::uint64_t version = 0, base_version = 0;
  std::uint64_t deltas = 0;            // versions squashed
  std::uint64_t entries = 0;           // entries of OUT
  std::uint64_t entries_composed = 0;  // of those, composed of two or more
  std::uint64_t entries_dropped = 0;   // changes that cancelled out
  std::uint64_t entries_stacked = 0;   // of OUT's entries, stacks of runs of different kinds
  std::uint64_t shards_built = 0, shards_rewritten = 0, shards_removed = 0;
  std::uint64_t files_changed = 0, files_removed = 0;
  std::uint64_t input_bytes = 0;  // every file of the chain's deltas
  std::uint64_t delta_bytes = 0;  // every file of OUT
  double seconds = 0;
};

// Writes OUT (which must not exist) atomically: the delta from the first
// delta's base version to the last one's version. Throws Error(bad_input) for
// a damaged delta or deltas that do not form a chain; with opts.base,
// Error(verify_failed) where that checkpoint is not the chain's first base, or
// an entry laid over its bytes does not give the checksum its delta records.
SquashSummary squash_deltas(const std::vector<boost::filesystem::path>& chain, const boost::filesystem::path& out,
                            const SquashOptions& opts);

}  // namespace hfdelta
