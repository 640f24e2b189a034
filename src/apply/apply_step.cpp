// The transaction step every write of delta-apply runs in (see journal.hpp
// for what is recorded, apply_internal.hpp for the contract).
#include <optional>
#include <set>
#include <string>

#include <boost/filesystem/operations.hpp>

#include "apply/apply_internal.hpp"
#include "hfdelta/error.hpp"
#include "store/local_store.hpp"
#include "util/io.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void fail_rollback(const fs::path& local, const std::exception_ptr& cause, const std::exception& undo) {
  std::string why = "unknown error";
  try {
    std::rethrow_exception(cause);
  } catch (const std::exception& e) {
    why = e.what();
  } catch (...) {}
  // A failed step's own error is often the rollback's too (a full disk).
  std::string msg = why;
  if (std::string(undo.what()) != why)
    msg += "\nrolling it back failed too: " + std::string(undo.what());
  else
    msg += "\nrolling it back failed too";
  msg += "\n" + local.string() + " is left interrupted (--status exits 10) with its undo journal in " + kStateDir +
         "/txn; once the cause is fixed (free space?), the next delta-apply on it, or delta-apply --recover, "
         "finishes the rollback";
  fail(Exit::failure, msg);  // whatever stopped the operation, LOCAL now waits on an I/O failure
}

void fail_recover(const fs::path& local, const Error& e) {
  std::optional<std::uint64_t> pending;
  try {
    pending = interrupted_version(local);
  } catch (const Error&) {  // a damaged state or manifest: `e` says so already
  }
  std::string msg = std::string(e.what()) + "\nundoing the apply an earlier run left interrupted on " + local.string() +
                    " failed, so nothing else was done; ";
  if (pending) {
    msg += local.string() + " is left interrupted (--status exits 10)";
    if (exists_nofollow(txn_root(local))) msg += " with its undo journal in " + std::string(kStateDir) + "/txn";
    msg +=
        "; once the cause is fixed (free space?), the next delta-apply on it, or delta-apply --recover, "
        "finishes the rollback";
  } else {
    msg += "once the cause is fixed, the next delta-apply on it, or delta-apply --recover, tries again";
  }
  fail_again(e, msg);
}

void run_step(Txn& txn, const fs::path& local, const Manifest& m, const ApplyOptions& opts,
              const std::function<void()>& body) {
  // Before the manifest: while it is missing, there is nothing to undo.
  reserve_rollback(txn.step(), m, opts.sync);
  write_manifest(txn.step(), m, opts.sync);
  try {
    install_state(local, {m.base, m.version}, txn_state(txn.step(), true), opts.sync);
    body();
    const auto end = txn.final_version();
    write_state(local, {m.version, end && *end != m.version ? end : std::nullopt}, opts.sync);
  } catch (...) {
    const std::exception_ptr cause = std::current_exception();
    try {
      rollback(local, txn.step(), m, opts.sync);
    } catch (const std::exception& e) {
      txn.keep();
      fail_rollback(local, cause, e);
    }
    throw;
  }
  txn.step_done(m);
}

void sync_dirs_of(const fs::path& local, const std::vector<TxnFile>& files) {
  std::set<fs::path> dirs{local};
  for (const auto& f : files)
    for (fs::path d = (local / f.path).parent_path(); d.string().size() > local.string().size(); d = d.parent_path())
      dirs.insert(d);
  for (const auto& d : dirs)
    if (fs::is_directory(d)) sync_dir(d);
}

}  // namespace hfdelta
