// Publishing straight from the trainer's memory.
//
// A trainer that syncs weights by deltas holds the new weights in memory
// after each optimizer step; saving them only to diff the save against the
// previous one costs a full write and two full reads per step. A
// MemoryPublisher instead diffs each tensor, as it is given, against a
// *mirror*: a LOCAL (delta-apply --init) on the trainer's host that holds the
// last published version. Then it publishes version newest + 1 into ROOT,
// byte for byte the delta `delta-diff MIRROR NEW ROOT/weight_vN` writes for a
// NEW holding the same tensors in the mirror's layout, and advances the
// mirror by applying that delta (delta-apply's crash-safe, checked path).
//
// Memory stays bounded: a tensor's bytes are read while put() runs and never
// kept; the encoded entries wait in spool files in the version's temporary
// directory under ROOT.
//
// The base checksums the delta records come from the mirror's record of its
// version; the mirror's bytes are hashed as they are compared with the new
// ones and must match that record, so a mirror altered since (one bit) is
// refused (Error(verify_failed)) before anything is published. Each tensor's
// bytes are copied a block at a time before they are hashed and encoded, so
// an entry always gives the bytes whose checksum it records, even of a
// tensor written while it is read; a large tensor read twice (once for its
// checksum, once per range for its entry) that changed in between is
// refused (Error(verify_failed)) and nothing is published.
//
// Crash safety: the version appears in ROOT whole or not at all (written
// under a hidden name, flushed, renamed); the mirror is advanced only after
// that. Opening a publisher reconciles the two: an interrupted mirror
// advance is rolled back, and a mirror behind ROOT (the process died after
// publishing) is caught up from ROOT; any other disagreement is refused with
// what to do.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <boost/filesystem/path.hpp>

#include "hfdelta/apply.hpp"
#include "hfdelta/diff.hpp"
#include "hfdelta/encodings.hpp"
#include "hfdelta/found.hpp"
#include "hfdelta/hash.hpp"

namespace hfdelta {

struct PublisherOptions {
  std::optional<Encoding> encoding = Encoding::context;  // delta-diff's default; none: "auto"
  int level = kDefaultLevel;                             // zstd level (codec.hpp)
  int threads = 0;                                       // 0: all cores
  bool sync = true;                                      // flush the delta, and the mirror, before recording them
  double lock_timeout = -1;  // seconds to wait for another publisher of the mirror (< 0: forever)
  // Advance the mirror in a thread of its own once the version is
  // published, so that the trainer goes on at once; the next call (or
  // wait(), or the destructor) waits for it, and reports its failure.
  bool background = true;
};

// One tensor as the trainer holds it: its safetensors dtype ("BF16", "F32",
// ...), shape, and its bytes in row-major order, valid during the call.
struct TensorBytes {
  std::string_view name;
  std::string_view dtype;
  std::span<const std::uint64_t> shape;
  std::span<const std::uint8_t> bytes;
};

// One tensor whose changes were found elsewhere (the CUDA path finds them
// on the device and copies only them to the host): one FoundChunk per chunk
// of the chunked encodings, found against the mirror's bytes of the tensor
// (context: each chunk's changes ranked among its `groups`).
struct TensorFound {
  std::string_view name;
  std::string_view dtype;
  std::span<const std::uint64_t> shape;
  std::uint64_t nbytes = 0;
  std::span<const FoundChunk> chunks;
  std::span<const ContextGroups> groups;  // context only: one per chunk
};

// What opening found and did to bring mirror and root together.
struct PublisherOpening {
  std::uint64_t version = 0;                 // the mirror's: the newest published
  std::optional<std::uint64_t> rolled_back;  // an interrupted mirror advance, undone
  std::vector<std::uint64_t> caught_up;      // versions applied to the mirror from ROOT
};

struct PublishSummary {
  boost::filesystem::path out;  // ROOT/weight_vNNNNNN
  DiffSummary diff;             // as delta-diff reports it
  std::uint64_t tensors_given = 0, tensors_declared_unchanged = 0;
};

class MemoryPublisher {
 public:
  // Takes the mirror's publisher lock (MIRROR/.weight_sync/publisher.lock:
  // one publisher per mirror; Error(lock_timeout)) and reconciles the mirror
  // with ROOT. Errors: ROOT or MIRROR missing (Error(usage)), MIRROR not
  // initialised (Error(uninitialised)), ROOT behind the mirror or publishing
  // versions the mirror cannot reach (Error(out_of_order)), ROOT's version of
  // the mirror's number holding other bytes (Error(verify_failed)).
  MemoryPublisher(const boost::filesystem::path& root, const boost::filesystem::path& mirror,
                  const PublisherOptions& opts);
  // Abandons an unfinished version and waits for the mirror's advance (its
  // failure, if any, is not reported: call wait() first to see it).
  ~MemoryPublisher();
  MemoryPublisher(const MemoryPublisher&) = delete;
  MemoryPublisher& operator=(const MemoryPublisher&) = delete;

  const PublisherOpening& opening() const;
  // The newest published version (the mirror's, once advanced).
  std::uint64_t version() const;
  // Starts version() + 1; put(), unchanged() and publish() start it when
  // none is under way, except after a version was lost: an error inside
  // put() or publish() (not a refused tensor) abandons the version under way
  // with the tensors given to it, and those calls then refuse to go on in a
  // new one until begin() or abort() says so. Before it starts a version it
  // waits for the mirror's advance, and reconciles mirror and root again
  // when the mirror is not at the version published last.
  void begin();
  // Diffs one tensor of the new version against the mirror. Error(unsupported)
  // for a name the mirror does not have or another dtype or shape (the
  // publisher patches tensors; a new layout is a full version's to publish),
  // Error(bad_input) for bytes of the wrong length, Error(usage) for a name
  // given twice.
  void put(const TensorBytes& t);
  // The same for several tensors at once, encoded side by side (a batch of
  // small tensors keeps every core busy; each is still read only during the
  // call). A mistake in any of them fails the whole batch before any is read.
  void put(std::span<const TensorBytes> batch);
  // put() for a tensor whose changes were found elsewhere, against the
  // mirror's bytes of it: the entry is byte for byte the one put() writes
  // for the same new bytes, and the new checksum is of the mirror's bytes
  // (read and checked against its record as put() does) with the changes
  // applied. For a publisher of sparse or context only (Error(usage)
  // otherwise); the same errors as put() for a name, dtype, shape or size.
  void put_found(const TensorFound& t);
  // For a tensor about to be given by put_found() (the CUDA path asks
  // before it finds the changes, against bytes it keeps of the mirror's
  // tensor): starts the version as put() does, makes the checks put_found()
  // makes of the encoding, name, dtype, shape and size (the same errors),
  // and returns the checksum the mirror records for the tensor at the
  // version's base (none where it records none).
  std::optional<Hash128> found_base(std::string_view name, std::string_view dtype, std::span<const std::uint64_t> shape,
                                    std::uint64_t nbytes);
  // The checksum of a tensor's bytes as given to the version under way (by
  // put() or put_found()); none where it was not given.
  std::optional<Hash128> given_checksum(std::string_view name) const;
  // The mirror (absolute), and the options this publisher was opened with.
  const boost::filesystem::path& mirror() const;
  const PublisherOptions& options() const;
  // Declares a tensor unchanged since the mirror's version: it is not read.
  void unchanged(std::string_view name);
  // Publishes the version begun: every tensor of the mirror must have been
  // given or declared unchanged (`rest_unchanged`: all those not given are),
  // else Error(usage) naming them and nothing is published. Then advances
  // the mirror (in the background if so configured).
  PublishSummary publish(bool rest_unchanged);
  // Abandons the version begun, if any: nothing was published.
  void abort();
  // A version is under way (begun, not yet published or abandoned).
  bool in_progress() const;
  // Waits for the mirror's advance; rethrows its failure once (the version
  // stays published; the next begin() catches the mirror up from ROOT).
  // Returns the apply's result, if one ran since the last wait.
  std::optional<ApplyResult> wait();

 private:
  void open_step();
  void lose_step(const std::string& why);
  void abort_step();
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace hfdelta
