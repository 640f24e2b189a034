// delta-apply's operations: the paths checked, LOCAL locked and recovered,
// then one delta applied as a pipeline (open_delta -> survey_local ->
// plan_apply -> execute_plan), a full checkpoint installed (apply_init.cpp),
// or a chain of versions pulled from a publication root.
#include "hfdelta/apply.hpp"

#include <exception>
#include <map>
#include <optional>

#include <boost/filesystem/operations.hpp>

#include "apply_internal.hpp"
#include "apply_plan.hpp"
#include "hfdelta/checkpoint.hpp"
#include "hfdelta/delta_format.hpp"
#include "hfdelta/delta_reader.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/io.hpp"
#include "hfdelta/journal.hpp"
#include "hfdelta/local_store.hpp"
#include "hfdelta/checksum_record.hpp"
#include "hfdelta/version.hpp"
#include "parallel.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

namespace {

std::uint64_t full_version_of(const fs::path& dir) {
  if (auto v = version_from_dirname(fs::absolute(dir).filename().string())) return *v;
  fail(Exit::usage, dir.string() + ": a full version must be named weight_vNNNNNN (or use --init with --version)");
}

// LOCAL's recorded version against the delta's: none (exit 6), the delta's
// own (nothing to do) or its base (go on); anything else is out of order.
bool already_applied(const OpenDelta& d, const LocalState& st, const fs::path& local) {
  const DeltaIndex& idx = d.index;
  if (!st.version)
    fail(Exit::out_of_order, local.string() + ": has no recorded version; initialise it with --init or a full version first");
  if (st.version == idx.version) return true;
  if (idx.base_version != *st.version)
    fail(Exit::out_of_order, d.dir.string() + ": delta " + format_version(idx.version) + " applies on top of version " +
                                 format_version(idx.base_version) + ", but LOCAL is at version " + format_version(*st.version));
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
  const LocalView lv = survey_local(local, *st.version, d);              // reads LOCAL, writes nothing
  ApplyPlan plan = plan_apply(d, lv, default_threads(opts.threads));  // cannot write
  execute_plan(txn, d, plan, local, opts);                             // stage, execute, record
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
    fail(Exit::bad_input, dir.string() + ": has " + kStateDir + "/, so it is a LOCAL checkpoint, not " + role +
                              "; the arguments look swapped (" + form + ")");
}

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
  if (es || el) fail(Exit::failure, (es ? src : local).string() + ": cannot resolve: " + (es ? es : el).message());
  if (s == l) fail(Exit::bad_input, src.string() + " and " + local.string() + ": SRC and LOCAL are the same directory");
  if (is_below(l, s)) fail(Exit::bad_input, local.string() + ": LOCAL is inside SRC " + src.string());
  if (is_below(s, l)) fail(Exit::bad_input, src.string() + ": SRC is inside LOCAL " + local.string());
  check_has_weights(open_checkpoint(src), src);
}

// --init replaces everything in LOCAL: only in a directory that is a LOCAL
// already, or holds nothing but hfdelta's state, unless forced. (A full
// version pulled into a directory that is not a LOCAL replaces it, as the
// slime layout's pull does.)
void check_replaceable(const fs::path& local, const ApplyOptions& opts) {
  if (opts.force || !is_dir(local) || has_state_file(local)) return;
  boost::system::error_code ec;
  for (fs::directory_iterator it(local, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename() != kStateDir)
      fail(Exit::exists, local.string() + ": is a non-empty directory that is not a LOCAL (no " + kStateDir +
                             "/state.json); --init would delete its files; give --force to replace it");
}

}  // namespace

// Takes the lock, undoes an interrupted earlier run, runs `op`, then the
// caller's `then` hook while the lock is still held. `create`: see LocalLock
// (without it, a LOCAL that has no .weight_sync/ runs `op` unlocked).
template <class Op>
ApplyResult locked(const fs::path& local, const ApplyOptions& opts, Op&& op, bool create = true) {
  LocalLock lock(local, opts.lock_timeout, create);
  std::optional<std::uint64_t> undone;
  try {
    undone = recover(local, opts.sync);  // outside the operation's own transaction: nothing of it to undo yet
  } catch (const Error& e) {
    fail_recover(local, e);
  }
  Txn txn(local, opts.sync);
  ApplyResult r;
  try {
    r = op(txn);
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
        fail(e.code(), std::string(e.what()) + "\n" + local.string() + " is back as it was, but its undone journal (" +
                           kStateDir + "/txn) could not be removed; the next delta-apply on it removes it");
      }
    }
    throw;
  }
  r.rolled_back = undone;
  if (!r.noop) prune_records(local, r.to_version);  // older versions' checksums are of no use any more
  if (opts.then && !r.no_version) opts.then(r.to_version);
  return r;
}

ApplyResult init_local(const fs::path& src, const fs::path& local, std::uint64_t version, const ApplyOptions& opts) {
  check_local_path(local, std::nullopt);
  if (!is_dir(src)) fail(Exit::bad_input, src.string() + ": not a directory");
  if (is_delta_dir(src)) fail(Exit::bad_input, src.string() + ": is a delta version, not a full checkpoint");
  check_src(src, local);
  check_replaceable(local, opts);
  return locked(local, opts, [&](Txn& txn) { return init_locked(txn, src, local, version, opts); });
}

ApplyResult apply_delta(const fs::path& delta, const fs::path& local, const ApplyOptions& opts) {
  check_local_path(local, Exit::out_of_order);
  if (!is_dir(delta)) fail(Exit::bad_input, delta.string() + ": not a directory");
  check_not_local(delta, "a published version", "delta-apply DELTA LOCAL");
  std::optional<DeltaIndex> idx = read_index_if_delta(delta);  // the one read of its index
  if (!idx) {                                                   // a full version: as --init
    const std::uint64_t version = full_version_of(delta);
    check_src(delta, local);
    return locked(local, opts, [&](Txn& txn) { return init_locked(txn, delta, local, version, opts); });
  }
  return locked(local, opts, [&](Txn& txn) { return apply_opened(txn, open_delta(delta, std::move(*idx)), local, opts); });
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
  LocalLock lock(local, opts.lock_timeout, false);
  const LocalState st = read_state(local);
  LocalStatus s{st.version, st.pending};
  if (const auto v = interrupted_version(local)) s.pending = v;
  return s;
}

namespace {

// What a pull does: the newest full version at or below the target that is
// newer than LOCAL (if any), then each delta after it, opened and checked.
struct PullPlan {
  const VersionDir* full = nullptr;
  std::vector<OpenDelta> chain;
};

// Versions from `want` down to LOCAL's are told apart by reading each index
// once, and kept for the chain: the search stops at the first full one.
PullPlan plan_pull(const fs::path& root, const std::vector<VersionDir>& versions, std::optional<std::uint64_t> local_version,
                   std::uint64_t want, const fs::path& local) {
  PullPlan p;
  std::map<std::uint64_t, DeltaIndex> deltas;
  for (auto it = versions.rbegin(); it != versions.rend() && !p.full; ++it) {
    if (it->version > want) continue;
    if (local_version && it->version <= *local_version) break;
    if (std::optional<DeltaIndex> idx = read_index_if_delta(it->path)) deltas.emplace(it->version, std::move(*idx));
    else p.full = &*it;
  }
  if (!p.full && !local_version)
    fail(Exit::out_of_order, local.string() + ": has no version, and " + root.string() + " has no full version at or below " +
                                 format_version(want) + "; initialise it with --init");
  const std::uint64_t cur = p.full ? p.full->version : *local_version;
  // The whole chain must be there and link up, every delta checked whole, before LOCAL is touched.
  for (std::uint64_t v = cur + 1; v <= want; ++v) {
    auto d = deltas.find(v);
    if (d == deltas.end())
      fail(Exit::out_of_order, root.string() + ": version " + format_version(v) + " is missing; cannot reach " + format_version(want));
    const fs::path dir = std::find_if(versions.begin(), versions.end(), [&](const VersionDir& x) { return x.version == v; })->path;
    OpenDelta od = open_delta(dir, std::move(d->second));
    if (od.index.version != v || od.index.base_version != v - 1)
      fail(Exit::out_of_order, od.index_path() + ": records version " + format_version(od.index.version) + " on base " +
                                   format_version(od.index.base_version) + ", expected " + format_version(v) + " on base " +
                                   format_version(v - 1));
    p.chain.push_back(std::move(od));
  }
  return p;
}

ApplyResult pull_locked(Txn& txn, const fs::path& root, const fs::path& local, std::optional<std::uint64_t> target,
                        const ApplyOptions& opts) {
  const auto t0 = Clock::now();
  const std::vector<VersionDir> versions = scan_root(root);
  const LocalState st = read_state(local);
  ApplyResult r;
  r.from_version = st.version;
  r.published = versions.size();
  if (!versions.empty()) r.newest = versions.back().version;
  if (versions.empty() && !target) {  // a root the trainer has not published to yet: nothing to do
    r.noop = true;
    r.no_version = !st.version;
    r.to_version = st.version.value_or(0);
    r.seconds = seconds_since(t0);
    return r;
  }
  const std::uint64_t want = target ? *target : versions.back().version;
  if (std::none_of(versions.begin(), versions.end(), [&](const VersionDir& d) { return d.version == want; }))
    fail(Exit::out_of_order, root.string() + ": version " + format_version(want) + " is not published");
  r.to_version = want;
  if (st.version && *st.version > want)
    fail(Exit::out_of_order, local.string() + ": is at version " + format_version(*st.version) + ", newer than the target " +
                                 format_version(want));
  if (st.version == want) {
    r.noop = true;
    r.seconds = seconds_since(t0);
    return r;
  }
  const PullPlan p = plan_pull(root, versions, st.version, want, local);
  txn.set_final(want);
  if (p.full) merge(r, init_locked(txn, p.full->path, local, p.full->version, opts));
  for (const OpenDelta& d : p.chain) merge(r, apply_opened(txn, d, local, opts));
  r.seconds = seconds_since(t0);
  return r;
}

}  // namespace

ApplyResult pull(const fs::path& root, const fs::path& local, std::optional<std::uint64_t> target, const ApplyOptions& opts) {
  check_local_path(local, Exit::out_of_order);
  if (!is_dir(root)) fail(Exit::bad_input, root.string() + ": not a directory");
  check_not_local(root, "a publication root", "delta-apply --root ROOT LOCAL");
  return locked(local, opts, [&](Txn& txn) { return pull_locked(txn, root, local, target, opts); });
}

}  // namespace hfdelta
