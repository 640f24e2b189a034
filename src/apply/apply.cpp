// delta-apply's operations: the paths checked, LOCAL locked and recovered,
// then one delta applied as a pipeline (open_delta -> survey_local ->
// plan_apply -> execute_plan), a full checkpoint installed (apply_init.cpp),
// or a chain of versions pulled from a publication root.
#include "hfdelta/apply.hpp"

#include <exception>
#include <map>
#include <optional>
#include <set>

#include <boost/filesystem/operations.hpp>

#include "apply/apply_internal.hpp"
#include "apply/apply_plan.hpp"
#include "apply/phase_clock.hpp"
#include "delta/delta_reader.hpp"
#include "format/completion_marker.hpp"
#include "hfdelta/checkpoint.hpp"
#include "hfdelta/delta_format.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/version.hpp"
#include "root/pull_plan.hpp"
#include "root/root_view.hpp"
#include "store/checksum_record.hpp"
#include "store/journal.hpp"
#include "store/local_store.hpp"
#include "util/io.hpp"
#include "util/parallel.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

namespace {

std::uint64_t full_version_of(const fs::path& dir) {
  if (auto v = version_from_dirname(fs::absolute(dir).filename().string())) return *v;
  fail(Exit::usage, dir, "a full version must be named weight_vNNNNNN (or use --init with --init-version)");
}

[[noreturn]] void fail_no_version(const fs::path& local) {
  fail(Exit::out_of_order, local, "has no recorded version; initialise it with --init or a full version first");
}

// LOCAL's recorded version against the delta's: none (exit 4), the delta's
// own (nothing to do) or its base (go on); anything else is out of order.
bool already_applied(const OpenDelta& d, const LocalState& st, const fs::path& local) {
  const DeltaIndex& idx = d.index;
  if (!st.version) fail_no_version(local);
  if (st.version == idx.version) return true;
  if (idx.base_version != *st.version)
    fail(Exit::out_of_order, d.dir,
         "delta " + format_version(idx.version) + " applies on top of version " + format_version(idx.base_version) +
             ", but LOCAL is at version " + format_version(*st.version));
  return false;
}

// One opened delta on top of LOCAL's version, in a step of `txn`.
ApplyResult apply_opened(Txn& txn, const OpenDelta& d, const fs::path& local, const ApplyOptions& opts) {
  const auto t0 = Clock::now();
  const LocalState st = read_state(local);
  ApplyResult r;
  r.from_version = st.version;
  r.to_version = d.index.version;
  if (already_applied(d, st, local)) {
    r.noop = true;
    r.seconds = seconds_since(t0);
    return r;
  }
  begin_version_phases(d.index.version, false);
  const LocalView lv = survey_local(local, *st.version, d);           // reads LOCAL, writes nothing
  ApplyPlan plan = plan_apply(d, lv, default_threads(opts.threads));  // cannot write
  execute_plan(txn, d, plan, local, opts);                            // stage, execute, record
  r.tensors_patched = plan.tensors_patched;
  r.delta_bytes = plan.delta_bytes;
  for (const auto& f : plan.manifest.files)
    (f.op == TxnFile::Op::put ? r.files_written : r.files_removed) += f.op == TxnFile::Op::put || f.existed;
  r.applied.push_back(d.index.version);
  r.seconds = seconds_since(t0);
  return r;
}

void merge(ApplyResult& into, const ApplyResult& step) {
  into.applied.insert(into.applied.end(), step.applied.begin(), step.applied.end());
  into.tensors_patched += step.tensors_patched;
  into.delta_bytes += step.delta_bytes;
  into.files_written += step.files_written;
  into.files_removed += step.files_removed;
  into.to_version = step.to_version;
}

// ---- the command line's paths, checked before the lock creates anything -----------

bool is_dir(const fs::path& p) {
  boost::system::error_code ec;
  return fs::is_directory(p, ec);
}

// A directory with .weight_sync/ is some host's LOCAL, never published data.
void check_not_local(const fs::path& dir, const char* role, const std::string& form) {
  if (exists_nofollow(dir / kStateDir))
    fail(Exit::bad_input, dir,
         std::string("has ") + kStateDir + "/, so it is a LOCAL checkpoint, not " + role +
             "; the arguments look swapped (" + form + ")");
}

// No run ever wrote LOCAL: it has no .weight_sync/, so it holds no version
// and nothing to recover. Such a directory (a training save given by
// mistake, a new host's empty one) gets nothing, not even the lock, until
// the run knows, reading only, that it will write a version there: a form
// that refuses it, or finds nothing to do, leaves it exactly as it was.
bool never_written(const fs::path& local) { return !exists_nofollow(local / kStateDir); }

// `p` is strictly below `dir` (both canonical).
bool is_below(const fs::path& p, const fs::path& dir) {
  std::string d = dir.generic_string();
  if (d.empty() || d.back() != '/') d += '/';
  return p.generic_string().rfind(d, 0) == 0;
}

// --init (or a full version): SRC must be a full checkpoint with weights,
// apart from LOCAL (copying one into the other would delete or recurse).
void check_src(const fs::path& src, const fs::path& local) {
  boost::system::error_code es, el;
  const fs::path s = fs::canonical(src, es), l = fs::weakly_canonical(fs::absolute(local), el);
  if (es || el) fail(Exit::failure, es ? src : local, "cannot resolve: " + (es ? es : el).message());
  if (s == l)
    throw Error(Exit::bad_input, src.string() + " and " + local.string() + ": SRC and LOCAL are the same directory",
                local.string());
  if (is_below(l, s)) fail(Exit::bad_input, local, "LOCAL is inside SRC " + src.string());
  if (is_below(s, l)) fail(Exit::bad_input, src, "SRC is inside LOCAL " + local.string());
  check_has_weights(open_checkpoint(src), src);
}

// --init replaces everything in LOCAL: only in a directory that is a LOCAL
// already, or holds nothing but hfdelta's state, unless forced. (A full
// version pulled into a directory that is not a LOCAL replaces it, as the
// slime layout's pull does.)
// An SRC that is a LOCAL and a LOCAL that is a plain checkpoint: the
// arguments are swapped (--init LOCAL CHECKPOINT), and --force would
// replace the checkpoint; that is said first.
void check_replaceable(const fs::path& src, const fs::path& local, const ApplyOptions& opts) {
  if (opts.force || !is_dir(local) || has_state_file(local)) return;
  boost::system::error_code ec;
  for (fs::directory_iterator it(local, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().filename() == kStateDir) continue;
    if (has_state_file(src))
      fail(Exit::bad_input, local,
           std::string("is a non-empty directory that is not a LOCAL (no ") + kStateDir + "/state.json), and SRC " +
               src.string() + " is a LOCAL (it has " + kStateDir +
               "/state.json): the arguments look swapped (delta-apply --init SRC LOCAL copies SRC "
               "into LOCAL); nothing was changed");
    fail(Exit::exists, local,
         std::string("is a non-empty directory that is not a LOCAL (no ") + kStateDir +
             "/state.json); --init would delete its files; give --force to replace it");
  }
}

}  // namespace

// Takes the lock, undoes an interrupted earlier run, runs `op`, then the
// caller's `then` hook while the lock is still held. `create`: see LocalLock
// (without it, a LOCAL that has no .weight_sync/ runs `op` unlocked).
template <class Op>
ApplyResult locked(const fs::path& local, const ApplyOptions& opts, Op&& op, bool create = true) {
  // Refused before the lock would create .weight_sync/ (the operation checks it again under the lock).
  if (create && never_written(local)) refuse_local_symlinks(local);
  PhaseClock clock;  // Phase::lock
  LocalLock lock(local, opts.lock_timeout, create ? LocalLock::Mode::create : LocalLock::Mode::existing);
  std::optional<std::uint64_t> undone;
  try {
    undone = recover(local, opts.sync);  // outside the operation's own transaction: nothing of it to undo yet
  } catch (const Error& e) {
    fail_recover(local, e);
  }
  clock.enter(Phase::read);
  Txn txn(local, opts.sync);
  ApplyResult r;
  try {
    r = op(txn);
    clock.enter(Phase::sync);
    txn.commit();
  } catch (...) {
    const std::exception_ptr cause = std::current_exception();
    bool removed = true;
    try {
      removed = txn.rollback_all();  // the steps this command already committed
    } catch (const std::exception& e) {
      fail_rollback(local, cause, e);
    }
    if (!removed && !txn.kept()) {
      try {
        throw;
      } catch (const Error& e) {
        fail_again(e, std::string(e.what()) + "\n" + local.string() + " is back as it was, but its undone journal (" +
                          kStateDir + "/txn) could not be removed; the next delta-apply on it removes it");
      }
    }
    throw;
  }
  r.rolled_back = undone;
  if (!r.noop) prune_records(local, r.to_version);  // older versions' checksums are of no use any more
  if (opts.then && !r.no_version) {
    clock.enter(Phase::then);
    try {
      opts.then(r.to_version);
    } catch (const Error& e) {  // the version is applied: the caller still reports it
      // Also when a stop signal ended the hook (128 + N).
      const bool stopped = static_cast<int>(e.code()) > 128;
      if (e.code() != Exit::then_failed && e.code() != Exit::peers_unready && !stopped) throw;
      r.then_error = e.what();
      r.then_code = e.code();
    }
  }
  clock.stop(r.phases, r.version_phases);
  return r;
}

ApplyResult init_local(const fs::path& src, const fs::path& local, std::uint64_t version, const ApplyOptions& opts) {
  check_local_path(local, std::nullopt);
  require_dir(src, "give the checkpoint directory to copy");
  if (is_delta_dir(src)) fail(Exit::bad_input, src, "is a delta version, not a full checkpoint");
  check_src(src, local);
  check_replaceable(src, local, opts);
  return locked(local, opts, [&](Txn& txn) { return init_locked(txn, src, local, version, opts); });
}

ApplyResult apply_delta(const fs::path& delta, const fs::path& local, const ApplyOptions& opts) {
  check_local_path(local, Exit::out_of_order);
  require_dir(delta, "give a published version directory (ROOT/weight_vNNNNNN)");
  check_not_local(delta, "a published version", "delta-apply DELTA LOCAL");
  std::optional<DeltaIndex> idx = read_index_if_delta(delta);  // the one read of its index
  if (!idx) {                                                  // a full version: as --init
    const std::uint64_t version = full_version_of(delta);
    check_src(delta, local);
    return locked(local, opts, [&](Txn& txn) { return init_locked(txn, delta, local, version, opts); });
  }
  if (never_written(local)) fail_no_version(local);  // a delta needs a version to apply on
  return locked(local, opts,
                [&](Txn& txn) { return apply_opened(txn, open_delta(delta, std::move(*idx)), local, opts); });
}

ApplyResult recover_local(const fs::path& local, const ApplyOptions& opts) {
  check_local_path(local, Exit::uninitialised);
  ApplyOptions o = opts;
  o.then = nullptr;
  return locked(
      local, o,
      [&](Txn&) {
        ApplyResult r;
        const LocalState st = read_state(local);
        r.from_version = st.version;
        r.to_version = st.version.value_or(0);
        r.noop = true;
        return r;
      },
      false);  // only a LOCAL with .weight_sync/ can hold something to recover
}

LocalStatus local_status(const fs::path& local, const ApplyOptions& opts) {
  check_local_path(local, Exit::uninitialised);
  LocalLock lock(local, opts.lock_timeout, LocalLock::Mode::shared);  // read-only LOCALs and other users too
  const LocalState st = read_state(local);
  LocalStatus s{st.version, st.pending};
  if (const auto v = interrupted_version(local)) s.pending = v;
  return s;
}

namespace {

// Nothing to do: `r` says why (LOCAL at `want`, nothing published, or the
// next version still arriving).
ApplyResult& nothing_to_do(ApplyResult& r, const LocalState& st, Clock::time_point t0) {
  r.noop = true;
  r.no_version = !st.version;
  r.to_version = st.version.value_or(0);
  r.seconds = seconds_since(t0);
  return r;
}

// One version of the pull, committed on its own: a pull that fails later
// keeps it. What the commit depends on is looked at as it commits: a
// version withdrawn while it was applied is rolled back (hosts that never
// held it skip it), not kept to be refused by every later pull.
template <class Step>
void commit_version(Txn& txn, const fs::path& root, std::uint64_t version, Step&& step) {
  txn.set_final(version);
  step();
  if (exists_nofollow(root / withdrawn_dirname(version)))
    fail(Exit::out_of_order, "version " + format_version(version) + " was withdrawn from " + root.string() +
                                 " while this pull applied it; it is rolled back, and the next pull skips it");
  txn.commit();
}

// Runs plan `p`; a delta LOCAL refuses is reported by its version in
// `refused_at` (LOCAL keeps every version before it).
void run_plan(Txn& txn, const fs::path& root, const PullPlan& p, const fs::path& local, const ApplyOptions& opts,
              ApplyResult& r, std::optional<std::uint64_t>& refused_at) {
  if (p.full)
    commit_version(txn, root, p.full->version, [&] {
      merge(r, init_locked(txn, p.full->path, local, p.full->version, opts, p.full_marker));
      r.full_copied = p.full->version;
    });
  for (const OpenDelta& d : p.chain) {
    try {
      commit_version(txn, root, d.index.version, [&] { merge(r, apply_opened(txn, d, local, opts)); });
    } catch (const Error& e) {
      if (e.code() != Exit::verify_failed && e.code() != Exit::bad_input) throw;
      refused_at = d.index.version;
      drop_version_phases();  // not applied: its time counts in the totals only
      throw;
    }
  }
}

// Where a pull of LOCAL (in state `st`) stands before anything is applied:
// the version it goes to, or nothing to do (`result` says why). Throws
// what it refuses. Reads only.
struct PullStart {
  RootView view;
  ApplyResult result;
  std::optional<std::uint64_t> want;  // none: nothing to do
};

PullStart start_pull(const fs::path& root, const fs::path& local, const LocalState& st,
                     std::optional<std::uint64_t> target, const ApplyOptions& opts, Clock::time_point t0) {
  PullStart p{view_root(root, st.version, opts.require_marker), {}, std::nullopt};
  const RootView& v = p.view;
  const std::vector<VersionDir>& all = v.all;
  ApplyResult& r = p.result;
  r.from_version = st.version;
  r.published = all.size();
  if (!all.empty()) r.newest = all.back().version;
  r.not_published_yet = v.incomplete;
  r.waiting_for = v.waiting_for;
  for (const VersionDir& d : v.beyond) r.newer_complete.push_back(d.version);
  r.newest_complete = v.newest_complete();
  if (target && v.incomplete && *target >= *v.incomplete && (!st.version || *target > *st.version)) {
    nothing_to_do(r, st, t0);  // the target, or a version below it, is still arriving
    return p;
  }
  const bool held_withdrawn = st.version && v.withdrawn.count(*st.version);
  if (!target && (v.versions.empty() || (st.version && v.versions.back().version <= *st.version))) {
    if (held_withdrawn) fail(Exit::out_of_order, local, withdrawn_held(root, *st.version));
    nothing_to_do(r, st, t0);  // nothing published, nothing newer, or the next still arriving
    return p;
  }
  const std::uint64_t want = target ? *target : v.versions.back().version;
  if (std::none_of(all.begin(), all.end(), [&](const VersionDir& d) { return d.version == want; }))
    fail(Exit::out_of_order, root,
         "version " + format_version(want) + " is not published" +
             (v.withdrawn.count(want) ? " (it was withdrawn)" : ""));
  r.to_version = want;
  if (st.version && *st.version > want)
    fail(Exit::out_of_order, local,
         "is at version " + format_version(*st.version) + ", newer than the target " + format_version(want));
  if (st.version == want) {
    nothing_to_do(r, st, t0);
    return p;
  }
  p.want = want;
  return p;
}

// A pull into a directory no run has written (never_written): what it
// would do, found reading only. Returns the result when there is nothing to
// do, throws what the pull would refuse (no full version to start from, a
// damaged one), and returns none when it is to copy a full version, which
// makes the directory a LOCAL.
std::optional<ApplyResult> first_pull(const fs::path& root, const fs::path& local, std::optional<std::uint64_t> target,
                                      const ApplyOptions& opts) {
  PullStart s = start_pull(root, local, LocalState{}, target, opts, Clock::now());
  if (!s.want) return s.result;
  const PullPlan p = plan_pull(s.view, std::nullopt, *s.want, local, {});
  check_has_weights(open_checkpoint(p.full->path), p.full->path);  // no version: plan_pull starts from a full one
  return std::nullopt;
}

ApplyResult pull_locked(Txn& txn, const fs::path& root, const fs::path& local, std::optional<std::uint64_t> target,
                        const ApplyOptions& opts) {
  const auto t0 = Clock::now();
  const LocalState st = read_state(local);
  PullStart s = start_pull(root, local, st, target, opts, t0);
  if (!s.want) return s.result;
  const RootView& v = s.view;
  ApplyResult& r = s.result;
  const std::uint64_t want = *s.want;
  // A delta LOCAL refuses (its base bytes are not LOCAL's) leaves LOCAL at
  // the version before it; a full version above it is taken instead, if
  // there is one.
  std::set<std::uint64_t> refused;
  std::optional<Error> refusal;
  for (;;) {
    const std::optional<std::uint64_t> cur = read_state(local).version;
    PullPlan p;
    try {
      p = plan_pull(v, cur, want, local, refused);
    } catch (const Error& e) {
      if (!refusal) throw;
      fail_again(*refusal, std::string(refusal->what()) + "\n" + local.string() + " keeps version " +
                               format_version(cur.value_or(0)) +
                               ", the last it could apply; no full version above it to take instead (" + e.what() +
                               ")");
    }
    if (!p.fallback.empty()) r.fallback += (r.fallback.empty() ? "" : "; ") + p.fallback;
    std::optional<std::uint64_t> refused_at;
    try {
      run_plan(txn, root, p, local, opts, r, refused_at);
    } catch (const Error& e) {
      if (!refused_at) {
        if (r.applied.empty()) throw;
        fail_again(e, std::string(e.what()) + "\n" + local.string() + " keeps version " +
                          format_version(read_state(local).version.value_or(0)) + ", the last it could apply");
      }
      refused.insert(*refused_at);
      refusal = e;
      r.fallback += (r.fallback.empty() ? "" : "; ") + std::string("version ") + format_version(*refused_at) +
                    " was refused (" + e.what() + ")";
      continue;
    }
    r.sidecars_applied += p.sidecars;
    r.root_bytes += p.bytes;
    break;
  }
  r.to_version = want;
  r.seconds = seconds_since(t0);
  return r;
}

}  // namespace

ApplyResult pull(const fs::path& root, const fs::path& local, std::optional<std::uint64_t> target,
                 const ApplyOptions& opts) {
  check_local_path(local, Exit::out_of_order);
  require_dir(root, "give the publication root (is the share mounted?)");
  check_not_local(root, "a publication root", "delta-apply --root ROOT LOCAL");
  if (never_written(local))
    if (std::optional<ApplyResult> r = first_pull(root, local, target, opts)) return *r;
  return locked(local, opts, [&](Txn& txn) { return pull_locked(txn, root, local, target, opts); });
}

}  // namespace hfdelta
