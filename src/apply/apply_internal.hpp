// What the parts of delta-apply share: the transaction step every write
// runs in, and the operations one --root pull chains.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <vector>

#include <boost/filesystem/path.hpp>

#include "apply/apply_plan.hpp"
#include "delta/delta_reader.hpp"
#include "hfdelta/apply.hpp"
#include "hfdelta/checkpoint.hpp"
#include "hfdelta/error.hpp"
#include "store/journal.hpp"

namespace hfdelta {

struct CompletionMarker;

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0);

// The operation failed (`cause`) and undoing it failed too (`undo`): the
// journal is kept, so the next run finishes the rollback. Says so, with both.
[[noreturn]] void fail_rollback(const boost::filesystem::path& local, const std::exception_ptr& cause,
                                const std::exception& undo);

// The next run's recover() failed (`e`): whatever it undid stays undone, and
// the rest waits for the run after. Says so, and what LOCAL reads as now.
[[noreturn]] void fail_recover(const boost::filesystem::path& local, const Error& e);

// Records the step's journal as complete and LOCAL as pending, runs `body`,
// records the new version; on any error rolls the step back and rethrows.
void run_step(Txn& txn, const boost::filesystem::path& local, const Manifest& m, const ApplyOptions& opts,
              const std::function<void()>& body);

// Flushes LOCAL and every directory holding a file of `files`.
void sync_dirs_of(const boost::filesystem::path& local, const std::vector<TxnFile>& files);

// Refuses an SRC without weight files (an unmounted share, a save still
// being written), which would make LOCAL an empty checkpoint.
void check_has_weights(const Checkpoint& c, const boost::filesystem::path& src);

// Makes LOCAL an exact copy of the full checkpoint SRC at `version` (--init,
// or a full version pulled), in a step of `txn`. Every caller has already
// told SRC from a delta version (is_delta_dir, read_index_if_delta), so its
// index is not read again here. With `expect` (a published full version's
// completion marker), every file LOCAL is to hold is checked against it
// before LOCAL is changed: a damaged copy is Error(bad_input).
ApplyResult init_locked(Txn& txn, const boost::filesystem::path& src, const boost::filesystem::path& local,
                        std::uint64_t version, const ApplyOptions& opts, const CompletionMarker* expect = nullptr);

// Stages, executes and records `plan` of delta `d` in a step of `txn`:
// journaled first and then written (opts.sync), or in one pass.
void execute_plan(Txn& txn, const OpenDelta& d, ApplyPlan& plan, const boost::filesystem::path& local,
                  const ApplyOptions& opts);

}  // namespace hfdelta
