// --init, and a full version pulled: LOCAL made an exact copy of a full
// checkpoint in one transaction step, files that already match kept.
#include <algorithm>
#include <map>

#include <boost/filesystem/operations.hpp>

#include "apply/apply_internal.hpp"
#include "apply/phase_clock.hpp"
#include "format/completion_marker.hpp"
#include "hfdelta/checkpoint.hpp"
#include "hfdelta/delta_format.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/progress.hpp"
#include "store/checksum_record.hpp"
#include "store/local_store.hpp"
#include "util/io.hpp"
#include "util/parallel.hpp"
#include "util/scope_guard.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

void check_has_weights(const Checkpoint& c, const fs::path& src) {
  if (c.shards.empty())
    fail(Exit::bad_input, src,
         "has no weight files (*.safetensors); refusing to make LOCAL a checkpoint "
         "without weights (an unmounted share, or a save still being written?)");
}

namespace {

// A file hard-linked elsewhere (cp -al from a base checkpoint) is not
// LOCAL's own: it is replaced by a copy.
bool hard_linked(const fs::path& p) {
  boost::system::error_code ec;
  return fs::hard_link_count(p, ec) > 1 && !ec;
}

// SRC's bytes are in place already, but the checksum record --verify reads
// may be missing or damaged (its errors send the user to --init): rewrite it
// when it differs from LOCAL hashed now. Returns whether it was rewritten.
bool repair_record(const fs::path& local, std::uint64_t version, const ApplyOptions& opts) {
  const ChecksumRecord now = compute_record(local, opts.threads);
  std::optional<ChecksumRecord> rec;
  try {
    rec = read_record(local, version);
  } catch (const Error& e) {
    if (e.code() != Exit::bad_input) throw;  // damaged: rewritten below
  }
  if (rec && *rec == now) return false;
  write_record(local, version, now, opts.sync);
  return true;
}

// Every file of SRC, relative, sorted.
std::vector<std::string> files_of(const Checkpoint& c) {
  std::vector<std::string> want;
  for (const auto& s : c.shards) want.push_back(s.file);
  want.insert(want.end(), c.other_files.begin(), c.other_files.end());
  std::sort(want.begin(), want.end());
  return want;
}

// What makes LOCAL a copy of SRC: its files not in SRC removed, SRC's files
// that differ put (compared in parallel: this is the bulk of the work of an
// idempotent re-run).
Manifest init_manifest(const fs::path& src, const fs::path& local, const std::vector<std::string>& want,
                       const ApplyOptions& opts) {
  std::vector<char> differs(want.size(), 0);
  parallel_for(want.size(), default_threads(opts.threads), [&](std::size_t i, std::size_t) {
    const fs::path dst = local / want[i];
    boost::system::error_code ec;
    // A hard-linked file is replaced by a copy, so LOCAL's files are its own.
    differs[i] =
        !fs::is_regular_file(fs::symlink_status(dst, ec)) || hard_linked(dst) || !same_contents(src / want[i], dst);
  });
  Manifest m;
  for (const auto& rel : list_local_files(local))
    if (!std::binary_search(want.begin(), want.end(), rel)) m.files.push_back({rel, TxnFile::Op::remove, true});
  for (std::size_t i = 0; i < want.size(); ++i)
    if (differs[i]) {
      boost::system::error_code ec;
      m.files.push_back({want[i], TxnFile::Op::put, fs::is_regular_file(fs::symlink_status(local / want[i], ec))});
    }
  return m;
}

// Every new file staged inside LOCAL's own filesystem first, so that
// switching to it is a rename, and switching back one too.
void stage_copies(const fs::path& step, const Manifest& m, const fs::path& src, const ApplyOptions& opts) {
  std::vector<std::size_t> puts;
  for (std::size_t i = 0; i < m.files.size(); ++i)
    if (m.files[i].op == TxnFile::Op::put) puts.push_back(i);
  std::uint64_t total = 0;
  for (std::size_t i : puts) total += fs::file_size(src / m.files[i].path);
  progress::begin("copy", total);
  parallel_for(puts.size(), default_threads(opts.threads), [&](std::size_t k, std::size_t) {
    const fs::path staged = txn_stage(step, puts[k]);
    boost::system::error_code ec;
    fs::create_directories(staged.parent_path(), ec);
    if (ec) fail(Exit::failure, staged.parent_path(), "cannot create: " + ec.message());
    copy_file_atomic(src / m.files[puts[k]].path, staged, opts.sync);
    progress::add(fs::file_size(staged));
  });
}

// The bytes LOCAL is to hold (staged copies, and LOCAL's own files that
// already matched SRC) against the checksums the publisher recorded: what
// was copied from shared storage is what was published.
void check_copies(const fs::path& step, const Manifest& m, const fs::path& local, const std::vector<std::string>& want,
                  const CompletionMarker& expect, const fs::path& src, const ApplyOptions& opts) {
  std::map<std::string, fs::path> at;
  for (const auto& rel : want) at[rel] = local / rel;
  for (std::size_t i = 0; i < m.files.size(); ++i)
    if (m.files[i].op == TxnFile::Op::put) at[m.files[i].path] = txn_stage(step, i);
  for (const auto& [rel, p] : at)
    if (!expect.files.count(rel))
      fail(Exit::bad_input, src / rel,
           std::string("is not listed in the version's completion marker ") + kCompleteFile);
  parallel_for(want.size(), default_threads(opts.threads), [&](std::size_t i, std::size_t) {
    if (!matches_marker(at.at(want[i]), expect.files.at(want[i])))
      fail(Exit::bad_input, src / want[i],
           "its copy does not match the size and checksum the version's "
           "completion marker records; the published version is damaged");
  });
}

}  // namespace

ApplyResult init_locked(Txn& txn, const fs::path& src, const fs::path& local, std::uint64_t version,
                        const ApplyOptions& opts, const CompletionMarker* expect) {
  const auto t0 = Clock::now();
  begin_version_phases(version, true);
  const Checkpoint c = open_checkpoint(src);  // validates every weight file before LOCAL is touched
  const std::vector<std::string> want = files_of(c);
  check_has_weights(c, src);
  refuse_local_symlinks(local);  // a link is not LOCAL's own: not replaced, not taken for its target
  const LocalState st = read_state(local);
  ApplyResult r;
  r.from_version = st.version;
  r.to_version = version;
  Manifest m = init_manifest(src, local, want, opts);
  m.base = st.version;
  m.version = version;
  if (m.files.empty() && st.version == version) {
    r.record_rewritten = repair_record(local, version, opts);
    r.noop = !r.record_rewritten;
    drop_version_phases();
    r.seconds = seconds_since(t0);
    return r;
  }
  enter_phase(Phase::patch);
  const fs::path step = txn.begin_step();
  {
    const OnFailure abandon([&] { txn.abandon_step(); });
    stage_copies(step, m, src, opts);
    if (expect) check_copies(step, m, local, want, *expect, src, opts);
  }
  run_step(txn, local, m, opts, [&] {
    run_file_ops(local, step, m);
    enter_phase(Phase::sync);
    if (opts.sync) sync_dirs_of(local, m.files);
    // Re-installing the version LOCAL records: keep its old checksums for a rollback.
    if (st.version == version && exists_nofollow(record_file(local, version)))
      copy_file_atomic(record_file(local, version), step / "record.json", opts.sync);
    write_record(local, version, compute_record(local, opts.threads), opts.sync);
  });
  for (const auto& f : m.files) (f.op == TxnFile::Op::put ? r.files_written : r.files_removed) += 1;
  r.applied.push_back(version);
  r.seconds = seconds_since(t0);
  return r;
}

}  // namespace hfdelta
