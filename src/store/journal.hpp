// Transactions on a host-local checkpoint.
//
// Before LOCAL is changed, everything needed to undo the change is made
// durable in LOCAL/.weight_sync/txn/: for tensors patched in place, the old
// and new value of every changed byte (so its size follows the delta, not the
// model); for whole files, the new contents staged beside LOCAL and the old
// ones moved aside rather than deleted. A manifest written last marks the
// journal complete. Whatever interrupts an apply (a kill, a power cut, an I/O
// error), the next run finds the manifest and rolls LOCAL back to the recorded
// version before doing anything else.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <boost/filesystem/path.hpp>

#include "codec/codec.hpp"
#include "util/io.hpp"

namespace hfdelta {

struct TxnFile {
  enum class Op { put, remove };
  std::string path;  // relative to LOCAL
  Op op = Op::put;
  bool existed = false;  // a file was at `path` before the transaction
};

struct Manifest {
  std::optional<std::uint64_t> base;  // LOCAL's version before (none: LOCAL was new)
  std::uint64_t version = 0;          // the version being applied
  std::vector<std::string> shards;    // weight files the journal parts refer to, by index
  std::size_t parts = 0;              // journal part files part-0 .. part-(N-1)
  // The parts are written while LOCAL is patched (apply without flushing):
  // each window's record is in its part before the window is written, but a
  // part may be missing or end early.
  bool live = false;
  std::vector<TxnFile> files;  // whole-file operations, in execution order
};

// LOCAL/.weight_sync/txn/ holds the transaction of the operation under way:
// one numbered step directory per version it applies (txn/0, txn/1, ...).
boost::filesystem::path txn_root(const boost::filesystem::path& local);
boost::filesystem::path txn_part(const boost::filesystem::path& step, std::size_t i);
boost::filesystem::path txn_stage(const boost::filesystem::path& step, std::size_t op);  // new contents of m.files[op]
boost::filesystem::path txn_undo(const boost::filesystem::path& step, std::size_t op);   // old contents of m.files[op]

// Writes one journal part: a zstd stream of per-tensor records of
// (position, old byte, new byte), positions ascending within a tensor.
class JournalWriter {
 public:
  JournalWriter(const boost::filesystem::path& path, int level);
  void begin_tensor(std::uint32_t shard, std::uint64_t offset);
  void change(std::uint64_t pos, std::uint8_t old_byte, std::uint8_t new_byte);
  void end_tensor();
  // Makes every record so far readable from the file (the stream stays
  // open): called before the bytes it records are written to LOCAL.
  void flush();
  void finish(bool sync);  // ends the stream; flushed if sync

 private:
  void put(const std::uint8_t* p, std::size_t n);
  void flush_buf();
  File file_;
  Compressor comp_;
  std::vector<std::uint8_t> buf_;  // its whole size: kBatch and room for a record past it
  std::size_t len_ = 0;            // the records in it
  std::uint64_t next_ = 0;
};

// Replays a journal part, handing out batches of (absolute offset in the
// shard, byte) with either the new or the old values.
using JournalSink = std::function<void(std::uint32_t shard, std::span<const std::uint64_t> offsets,
                                       std::span<const std::uint8_t> bytes)>;
// `edges`, if given, hears where each tensor record begins (shard, offset of
// the tensor) and ends, so a replay can work tensor by tensor.
struct JournalEdges {
  std::function<void(std::uint32_t shard, std::uint64_t offset)> begin;
  std::function<void()> end;
};
// With `partial_ok` (a live part), a part that ends early or is damaged at its
// end yields the records before that point instead of an error.
void replay_journal(const boost::filesystem::path& part, bool new_values, const JournalSink& sink,
                    const JournalEdges* edges = nullptr, bool partial_ok = false);

// Writes `bytes` at `offsets` (ascending) of `f`, one read-modify-write of a
// bounded window per run of nearby offsets.
void write_scattered(File& f, std::span<const std::uint64_t> offsets, std::span<const std::uint8_t> bytes,
                     std::vector<std::uint8_t>& window);

// The state files a rollback installs, written when the step begins (see
// install_state): `pending` marks the step interrupted, the other records
// its base version again.
boost::filesystem::path txn_state(const boost::filesystem::path& step, bool pending);
void reserve_rollback(const boost::filesystem::path& step, const Manifest& m, bool sync);

void write_manifest(const boost::filesystem::path& step, const Manifest& m, bool sync);
std::optional<Manifest> read_manifest(const boost::filesystem::path& step);

// Runs a step's whole-file operations: removals (old files moved aside, with
// the directories they empty, so that nothing a rollback puts back needs a
// new block), then puts (old moved aside, staged contents renamed in).
void run_file_ops(const boost::filesystem::path& local, const boost::filesystem::path& step, const Manifest& m);

// Undoes one step: marks the state pending again, puts the old bytes and old
// files back, then records m.base. Idempotent, so it may be cut short and rerun.
void rollback(const boost::filesystem::path& local, const boost::filesystem::path& step, const Manifest& m, bool sync);

// One operation's transaction: the steps it has committed are undone together
// unless the whole operation commits, so a command that fails or is killed
// leaves LOCAL as it was before the command.
class Txn {
 public:
  Txn(const boost::filesystem::path& local, bool sync) : local_(local), sync_(sync) {}
  boost::filesystem::path begin_step();  // creates the next step directory
  void abandon_step();                   // its journal was never completed: LOCAL untouched
  void step_done(const Manifest& m) { done_.push_back(m); }
  // Undoes the committed steps, last first, then discards the journal. If a
  // rollback fails (or failed in keep()), the journal is kept for the next
  // run. False if it, though undone, could not be removed.
  bool rollback_all();
  void keep() { kept_ = true; }  // the current step's rollback failed
  bool kept() const { return kept_; }
  void commit();  // what was done so far is complete: discards the journal (steps may follow)
  const boost::filesystem::path& step() const { return step_; }
  // The version the whole operation ends at; steps before it leave the state
  // marked pending, since the operation is not over yet.
  void set_final(std::uint64_t v) { final_ = v; }
  std::optional<std::uint64_t> final_version() const { return final_; }

 private:
  boost::filesystem::path local_;
  bool sync_;
  boost::filesystem::path step_;
  std::size_t next_ = 0;
  std::vector<Manifest> done_;
  std::optional<std::uint64_t> final_;
  bool kept_ = false;
};

// Called under the lock before any operation: undoes whatever an earlier,
// interrupted operation left. Returns the version whose apply was rolled back.
std::optional<std::uint64_t> recover(const boost::filesystem::path& local, bool sync);

// The version an interrupted operation was applying, if LOCAL holds one.
std::optional<std::uint64_t> interrupted_version(const boost::filesystem::path& local);

}  // namespace hfdelta
