#include "hfdelta/apply.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <set>

#include <boost/filesystem/operations.hpp>
#include <nlohmann/json.hpp>

#include "hfdelta/checkpoint.hpp"
#include "hfdelta/codec.hpp"
#include "hfdelta/delta_format.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/hash.hpp"
#include "hfdelta/io.hpp"
#include "hfdelta/journal.hpp"
#include "hfdelta/local_store.hpp"
#include "hfdelta/safetensors.hpp"
#include "hfdelta/verify.hpp"
#include "hfdelta/version.hpp"
#include "parallel.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

namespace {

constexpr std::size_t kWindow = 1 << 20;  // bytes of LOCAL read/written at a time

using Clock = std::chrono::steady_clock;

int thread_count(const ApplyOptions& o) { return default_threads(o.threads); }

// Refuses a LOCAL path that would leave the directory through a symlink.
void check_no_symlink(const fs::path& local, const std::string& rel, const std::string& what) {
  fs::path p = local;
  boost::system::error_code ec;
  for (const auto& part : fs::path(rel)) {
    p /= part;
    if (fs::is_symlink(fs::symlink_status(p, ec)))
      fail(Exit::bad_input, what + ": " + p.string() + " is a symlink; refusing to write through it");
  }
}

// ---- making LOCAL an exact copy of a full checkpoint ------------------------------

// The operation failed (`cause`) and undoing it failed too (`undo`): the
// journal is kept, so the next run finishes the rollback. Says so, with both.
[[noreturn]] void fail_rollback(const fs::path& local, const std::exception_ptr& cause, const std::exception& undo) {
  std::string why = "unknown error";
  try {
    std::rethrow_exception(cause);
  } catch (const std::exception& e) {
    why = e.what();
  } catch (...) {
  }
  // A failed step's own error is often the rollback's too (a full disk).
  std::string msg = why;
  if (std::string(undo.what()) != why) msg += "\nrolling it back failed too: " + std::string(undo.what());
  else msg += "\nrolling it back failed too";
  msg += "\n" + local.string() + " is left interrupted (--status exits 10) with its undo journal in " + kStateDir +
         "/txn; once the cause is fixed (free space?), the next delta-apply on it, or delta-apply --recover, "
         "finishes the rollback";
  fail(Exit::failure, msg);  // whatever stopped the operation, LOCAL now waits on an I/O failure
}

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Records the step's journal as complete and LOCAL as pending, runs `body`,
// records the new version; on any error rolls the step back and rethrows.
template <class Body>
void run_step(Txn& txn, const fs::path& local, const Manifest& m, const ApplyOptions& opts, Body&& body) {
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

// A file hard-linked elsewhere (cp -al from a base checkpoint) is not
// LOCAL's own: patched in place, every linked copy would change too.
bool hard_linked(const fs::path& p) {
  boost::system::error_code ec;
  return fs::hard_link_count(p, ec) > 1 && !ec;
}

void refuse_hard_linked(const fs::path& p) {
  if (!hard_linked(p)) return;
  boost::system::error_code ec;
  fail(Exit::bad_input, p.string() + ": has " + std::to_string(fs::hard_link_count(p, ec)) +
                            " hard links (made with cp -al or ln?); patching it in place would change every linked "
                            "copy too; nothing was changed. Give LOCAL its own copy: delta-apply --init SRC LOCAL "
                            "copies such files, or cp --remove-destination");
}

// An SRC without weight files (an unmounted share, a save still being
// written) would make LOCAL an empty checkpoint.
void check_has_weights(const Checkpoint& c, const fs::path& src) {
  if (c.shards.empty())
    fail(Exit::bad_input, src.string() + ": has no weight files (*.safetensors); refusing to make LOCAL a checkpoint "
                                         "without weights (an unmounted share, or a save still being written?)");
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

ApplyResult init_locked(Txn& txn, const fs::path& src, const fs::path& local, std::uint64_t version, const ApplyOptions& opts) {
  const auto t0 = Clock::now();
  if (is_delta_dir(src))
    fail(Exit::bad_input, src.string() + ": is a delta version, not a full checkpoint");
  const Checkpoint c = open_checkpoint(src);  // validates every weight file before LOCAL is touched
  check_has_weights(c, src);
  refuse_local_symlinks(local);  // a link is not LOCAL's own: not replaced, not taken for its target
  const LocalState st = read_state(local);
  ApplyResult r;
  r.from_version = st.version;
  r.to_version = version;

  std::vector<std::string> want;
  for (const auto& s : c.shards) want.push_back(s.file);
  want.insert(want.end(), c.other_files.begin(), c.other_files.end());
  std::sort(want.begin(), want.end());

  // Which files differ (compared in parallel: this is the bulk of the work of
  // an idempotent re-run).
  std::vector<char> differs(want.size(), 0);
  parallel_for(want.size(), thread_count(opts), [&](std::size_t i, std::size_t) {
    check_no_symlink(local, want[i], local.string());
    const fs::path dst = local / want[i];
    boost::system::error_code ec;
    // A hard-linked file is replaced by a copy, so LOCAL's files are its own.
    differs[i] = !fs::is_regular_file(fs::symlink_status(dst, ec)) || hard_linked(dst) || !same_contents(src / want[i], dst);
  });
  Manifest m;
  m.base = st.version;
  m.version = version;
  for (const auto& rel : list_local_files(local))
    if (!std::binary_search(want.begin(), want.end(), rel)) m.files.push_back({rel, TxnFile::Op::remove, true});
  for (std::size_t i = 0; i < want.size(); ++i)
    if (differs[i]) {
      boost::system::error_code ec;
      m.files.push_back({want[i], TxnFile::Op::put, fs::is_regular_file(fs::symlink_status(local / want[i], ec))});
    }
  if (m.files.empty() && st.version == version) {
    r.record_rewritten = repair_record(local, version, opts);
    r.noop = !r.record_rewritten;
    r.seconds = since(t0);
    return r;
  }

  // Stage every new file inside LOCAL's own filesystem first, so that
  // switching to it is a rename, and switching back one too.
  const fs::path step = txn.begin_step();
  std::vector<std::size_t> puts;
  for (std::size_t i = 0; i < m.files.size(); ++i)
    if (m.files[i].op == TxnFile::Op::put) puts.push_back(i);
  try {
    parallel_for(puts.size(), thread_count(opts), [&](std::size_t k, std::size_t) {
      const std::string& rel = m.files[puts[k]].path;
      const fs::path staged = txn_stage(step, puts[k]);
      boost::system::error_code ec;
      fs::create_directories(staged.parent_path(), ec);
      if (ec) fail(Exit::failure, staged.parent_path().string() + ": cannot create: " + ec.message());
      copy_file_atomic(src / rel, staged, opts.sync);
    });
  } catch (...) {
    txn.abandon_step();
    throw;
  }
  run_step(txn, local, m, opts, [&] {
    run_file_ops(local, step, m);
    if (opts.sync) sync_dirs_of(local, m.files);
    // Re-installing the version LOCAL records: keep its old checksums for a rollback.
    if (st.version == version && exists_nofollow(record_file(local, version)))
      copy_file_atomic(record_file(local, version), step / "record.json", opts.sync);
    write_record(local, version, compute_record(local, opts.threads), opts.sync);
  });
  for (const auto& f : m.files) (f.op == TxnFile::Op::put ? r.files_written : r.files_removed) += 1;
  r.applied.push_back(version);
  r.seconds = since(t0);
  return r;
}

std::uint64_t full_version_of(const fs::path& dir) {
  if (auto v = version_from_dirname(fs::absolute(dir).filename().string())) return *v;
  fail(Exit::usage, dir.string() + ": a full version must be named weight_vNNNNNN (or use --init with --version)");
}

// ---- applying one delta -------------------------------------------------------------

struct Patch {
  std::string tensor;
  std::span<const std::uint8_t> frame;  // view into the delta file's mapping
  std::string delta_file;
  Hash128 new_hash;
  std::optional<Hash128> base_hash;
  std::uint32_t local_shard = 0;
  std::uint64_t offset = 0, nbytes = 0;  // absolute in the LOCAL shard
  // A large sparse entry whose chunk ranges are patched by several threads:
  // its checksums are computed in passes of their own.
  bool split = false;
  std::uint64_t chunk_bytes = 0;
  // Header bytes rewritten in place (a "header" shard operation): the new
  // bytes, laid over [0, nbytes) of the file instead of a decoded entry.
  std::span<const std::uint8_t> replace;
  // A stacked entry's parts, laid in order.
  std::vector<StackPart> stack;
  // The tensor's new bytes in a file of their own (a stacked entry already
  // laid over a copy), laid over LOCAL instead of a decoded entry.
  const File* source = nullptr;
  // Patched in the one-pass apply: LOCAL may already hold writes that a
  // failure rolls back. Otherwise a failure comes before LOCAL is written.
  bool live = false;
};

// A weight file built beside LOCAL (a "build" shard operation): its header,
// then each tensor copied from LOCAL's base bytes or left zero, and patched
// by its entry if it has one.
struct BuildTensor {
  std::string name;
  std::uint64_t dst = 0, nbytes = 0;  // in the built file
  std::optional<std::pair<std::size_t, std::uint64_t>> src;  // LOCAL shard, absolute offset
  std::optional<std::size_t> entry;   // into the build patches
  Hash128 hash;                       // of its new bytes
};
struct Build {
  const ShardOp* op = nullptr;
  std::span<const std::uint8_t> prefix;  // the new header bytes
  std::vector<BuildTensor> tensors;
  std::size_t mfile = 0;                 // its put in the manifest
};

// A unit of parallel work: a whole entry, or chunks [c0, c1) of a split one.
struct Unit {
  std::size_t patch = 0;
  std::uint64_t c0 = 0, c1 = 0;
  std::uint64_t bytes = 0;  // for scheduling, largest first
};

// Walks a tensor of LOCAL front to back in windows while sparse changes are
// laid over it: hashes the old and the new bytes and journals each change.
class Walker {
 public:
  // With `out`, each window that changes is written there as soon as its
  // journal records are in the journal file (the one-pass apply).
  // A range walker ([lo, hi) of a split entry) only patches: it reads the
  // windows that change and hashes nothing.
  // Without a journal (`jw` null) it patches a file being built, which has
  // nothing to undo.
  Walker(const File& f, const Patch& p, JournalWriter* jw, std::vector<std::uint8_t>& buf, File* out)
      : f_(f), p_(p), jw_(jw), buf_(buf), out_(out), hi_(p.nbytes) {}
  Walker(const File& f, const Patch& p, JournalWriter* jw, std::vector<std::uint8_t>& buf, File* out, std::uint64_t lo,
         std::uint64_t hi)
      : f_(f), p_(p), jw_(jw), buf_(buf), out_(out), hash_(false), hi_(hi), ws_(lo), we_(lo), done_(lo) {}
  void set(std::uint64_t pos, std::uint8_t v) {
    if (pos >= we_) load(pos);
    std::uint8_t& b = buf_[pos - ws_];
    if (b == v) return;
    if (jw_) jw_->change(pos, b, v);
    b = v;
    dirty_ = true;
  }
  // `n` new bytes from `pos` on (calls ascending): only those that differ
  // are journaled and written; equal runs are skipped eight bytes at a time.
  void overlay(std::uint64_t pos, const std::uint8_t* src, std::size_t n) {
    while (n) {
      if (pos >= we_) load(pos);
      const std::size_t m = static_cast<std::size_t>(std::min<std::uint64_t>(n, we_ - pos));
      std::uint8_t* b = buf_.data() + (pos - ws_);
      for (std::size_t k = 0; k < m; ++k) {
        if (k + 8 <= m && std::memcmp(b + k, src + k, 8) == 0) {
          k += 7;
          continue;
        }
        if (b[k] == src[k]) continue;
        if (jw_) jw_->change(pos + k, b[k], src[k]);
        b[k] = src[k];
        dirty_ = true;
      }
      pos += m, src += m, n -= m;
    }
  }
  // One element of `es` bytes (windows hold whole elements).
  template <std::size_t ES>
  void element(std::uint64_t pos, const std::uint8_t* v, SparseOp op) {
    if (pos >= we_) load(pos);
    std::uint8_t* b = buf_.data() + (pos - ws_);
    std::uint8_t t[ES];
    std::memcpy(t, b, ES);
    sparse_apply_value_t<ES>(t, v, op);
    for (std::size_t k = 0; k < ES; ++k)
      if (t[k] != b[k]) {
        if (jw_) jw_->change(pos + k, b[k], t[k]);
        b[k] = t[k], dirty_ = true;
      }
  }
  void finish() {
    close();
    if (hash_)
      while (done_ < p_.nbytes) read_both(std::min<std::uint64_t>(kWindow, p_.nbytes - done_));
  }
  Hash128 old_hash() const { return hb_.digest(); }
  Hash128 new_hash() const { return hn_.digest(); }

 private:
  void close() {
    if (we_ > ws_) {
      if (out_ && dirty_) {
        if (jw_) jw_->flush();
        out_->pwrite_all(buf_.data(), static_cast<std::size_t>(we_ - ws_), p_.offset + ws_);
      }
      if (hash_) hn_.update({buf_.data(), static_cast<std::size_t>(we_ - ws_)});
    }
    dirty_ = false;
    done_ = ws_ = we_;
  }
  void read_both(std::uint64_t n) {
    buf_.resize(static_cast<std::size_t>(n));
    f_.pread_exact(buf_.data(), buf_.size(), p_.offset + done_);
    hb_.update(buf_);
    hn_.update(buf_);
    done_ += n;
    ws_ = we_ = done_;
  }
  void load(std::uint64_t pos) {
    close();
    if (hash_)
      while (done_ + kWindow <= pos) read_both(kWindow);
    ws_ = done_ + (pos - done_) / kWindow * kWindow;  // windows stay aligned to the range start
    we_ = std::min<std::uint64_t>(ws_ + kWindow, hi_);
    buf_.resize(static_cast<std::size_t>(we_ - ws_));
    f_.pread_exact(buf_.data(), buf_.size(), p_.offset + ws_);
    if (hash_) hb_.update(buf_);
  }

  const File& f_;
  const Patch& p_;
  JournalWriter* jw_;
  std::vector<std::uint8_t>& buf_;
  File* out_;
  bool hash_ = true;
  std::uint64_t hi_;
  bool dirty_ = false;
  Hasher hb_, hn_;
  std::uint64_t ws_ = 0, we_ = 0, done_ = 0;
};

// Writes one tensor of LOCAL from its journal record: window by window,
// front to back, hashing every window as it is written (or left alone).
class TensorWriter {
 public:
  TensorWriter(std::vector<File>& files, std::string what) : files_(files), what_(std::move(what)) {}
  void begin(const Patch& p) {
    p_ = &p;
    ws_ = we_ = 0;
    dirty_ = false;
    h_.reset();
  }
  const Patch& patch() const { return *p_; }
  void change(std::span<const std::uint64_t> offs, std::span<const std::uint8_t> bytes) {
    for (std::size_t k = 0; k < offs.size(); ++k) {
      const std::uint64_t rel = offs[k] - p_->offset;
      if (offs[k] < p_->offset || rel >= p_->nbytes || rel < ws_)
        fail(Exit::failure, what_ + ": journal change outside tensor '" + p_->tensor + "' or out of order");
      while (rel >= we_) next_window(rel);
      buf_[rel - ws_] = bytes[k];
      dirty_ = true;
    }
  }
  // The checksum of the tensor as written (not for a split entry, whose
  // windows are shared out between parts).
  Hash128 end() {
    if (!p_->split)
      while (we_ < p_->nbytes) next_window(we_);
    close_window();
    return h_.digest();
  }

 private:
  void close_window() {
    if (we_ == ws_) return;
    if (dirty_) files_[p_->local_shard].pwrite_all(buf_.data(), buf_.size(), p_->offset + ws_);
    if (!p_->split) h_.update(buf_);
    dirty_ = false;
  }
  // Moves to the next window, or for a split entry straight to the window
  // holding `rel` (windows are aligned to the tensor's start either way).
  void next_window(std::uint64_t rel) {
    close_window();
    ws_ = p_->split ? rel / kWindow * kWindow : we_;
    we_ = std::min<std::uint64_t>(ws_ + kWindow, p_->nbytes);
    buf_.resize(static_cast<std::size_t>(we_ - ws_));
    files_[p_->local_shard].pread_exact(buf_.data(), buf_.size(), p_->offset + ws_);
  }

  std::vector<File>& files_;
  std::string what_;
  const Patch* p_ = nullptr;
  std::vector<std::uint8_t> buf_;
  std::uint64_t ws_ = 0, we_ = 0;
  bool dirty_ = false;
  Hasher h_;
};

// The decoder's batches of sparse changes, laid over LOCAL by `w` (one
// element size per entry, so the loop is specialised for it).
SparsePatch sparse_sink(Walker& w) {
  return [&w](std::span<const std::uint64_t> offs, std::span<const std::uint8_t> x, std::size_t es, SparseOp op) {
    auto each = [&]<std::size_t ES>() {
      for (std::size_t i = 0; i < offs.size(); ++i) w.element<ES>(offs[i], x.data() + i * ES, op);
    };
    switch (es) {
      case 1: return each.template operator()<1>();
      case 2: return each.template operator()<2>();
      case 4: return each.template operator()<4>();
      default: return each.template operator()<8>();
    }
  };
}

// Decodes one entry against LOCAL's current bytes: journals every change and
// checks both checksums. Without `out`, LOCAL is not written, so a wrong base,
// a damaged frame or a wrong checksum is refused before anything is changed;
// with `out` (one pass), each window is written once its records are in the
// journal, and a refusal is undone by the rollback that follows.
// Without `jw` it patches a file being built beside LOCAL (`out` is `f`).
void journal_patch(const Patch& p, const File& f, Encoding enc, JournalWriter* jw, std::vector<std::uint8_t>& buf,
                   const std::string& local_file, std::uint64_t version, File* out) {
  const std::string outcome = p.live ? "LOCAL was rolled back" : "nothing was changed";
  thread_local Decompressor d1, d2;  // per thread: cheaper than one per tensor
  const std::string what = p.delta_file + ": entry '" + p.tensor + "'";
  if (jw) jw->begin_tensor(p.local_shard, p.offset);
  Hash128 old_h, new_h;
  if (!p.replace.empty() || p.source) {
    Walker w(f, p, jw, buf, out);
    if (p.source) {
      std::vector<std::uint8_t> nb(static_cast<std::size_t>(std::min<std::uint64_t>(kWindow, p.nbytes)));
      for (std::uint64_t at = 0; at < p.nbytes; at += nb.size()) {
        const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(nb.size(), p.nbytes - at));
        p.source->pread_exact(nb.data(), n, at);
        w.overlay(at, nb.data(), n);
      }
    } else {
      w.overlay(0, p.replace.data(), p.replace.size());
    }
    w.finish();
    old_h = w.old_hash();
    new_h = w.new_hash();
  } else if (enc == Encoding::xor_bytes) {
    Hasher hb, hn;
    decode_xor(d1, p.frame, p.nbytes, what, [&](std::uint64_t off, std::span<const std::uint8_t> x) {
      buf.resize(x.size());
      f.pread_exact(buf.data(), x.size(), p.offset + off);
      hb.update(buf);
      bool dirty = false;
      for (std::size_t k = 0; k < x.size(); ++k) {
        if (k + 8 <= x.size()) {  // mostly zero: skip eight at a time
          std::uint64_t w;
          std::memcpy(&w, x.data() + k, 8);
          if (w == 0) {
            k += 7;
            continue;
          }
        }
        if (!x[k]) continue;
        const std::uint8_t nb = buf[k] ^ x[k];
        if (jw) jw->change(off + k, buf[k], nb);
        buf[k] = nb;
        dirty = true;
      }
      if (out && dirty) {
        if (jw) jw->flush();
        out->pwrite_all(buf.data(), buf.size(), p.offset + off);
      }
      hn.update(buf);
    });
    old_h = hb.digest();
    new_h = hn.digest();
  } else if (enc == Encoding::sparse) {
    Walker w(f, p, jw, buf, out);
    decode_sparse(p.frame, p.nbytes, what,
                  sparse_sink(w));
    w.finish();
    old_h = w.old_hash();
    new_h = w.new_hash();
  } else {
    Walker w(f, p, jw, buf, out);
    decode_overwrite(d1, d2, p.frame, p.nbytes, what,
                     [&](std::span<const std::uint64_t> pos, std::span<const std::uint8_t> val) {
                       for (std::size_t k = 0; k < pos.size(); ++k) w.set(pos[k], val[k]);
                     });
    w.finish();
    old_h = w.old_hash();
    new_h = w.new_hash();
  }
  if (jw) jw->end_tensor();
  if (p.base_hash && old_h != *p.base_hash)
    fail(Exit::verify_failed, local_file + ": tensor '" + p.tensor + "' is not the base of delta " + format_version(version) +
                                  " (checksum " + old_h.hex() + ", the delta expects " + p.base_hash->hex() +
                                  "); " + outcome);
  if (new_h != p.new_hash)
    fail(Exit::verify_failed, local_file + ": tensor '" + p.tensor + "' patched by " + what + " would have checksum " +
                                  new_h.hex() + ", the delta records " + p.new_hash.hex() +
                                  " (LOCAL is not this delta's base, or the delta is damaged); " + outcome);
}

// Lays the parts of a stacked entry over [p.offset, p.offset + p.nbytes) of
// `f` in order, nothing journaled (a file being built, or a scratch copy);
// each part is checked against the checksum it records.
void lay_stack(const Patch& p, File& f, std::vector<std::uint8_t>& buf, const std::string& local_file, std::uint64_t version) {
  for (std::size_t i = 0; i < p.stack.size(); ++i) {
    Patch q;
    q.tensor = p.tensor;
    q.delta_file = p.delta_file + " (stacked part " + std::to_string(i + 1) + " of " + std::to_string(p.stack.size()) + ")";
    q.frame = p.stack[i].bytes;
    q.new_hash = p.stack[i].hash;
    if (i == 0) q.base_hash = p.base_hash;  // later bases are the parts' own checked results
    q.live = p.live;
    q.offset = p.offset;
    q.nbytes = p.nbytes;
    journal_patch(q, f, p.stack[i].enc, nullptr, buf, local_file, version, &f);
  }
}

// A stacked entry in place: its parts are laid over a copy of the tensor in
// `scratch` (inside the transaction's step, so nothing outlives it), and the
// copy is journaled against LOCAL like any other entry: the journal holds one
// record per byte that ends up changed, whatever the parts did in between.
void journal_stack(const Patch& p, const File& f, const fs::path& scratch, JournalWriter* jw, std::vector<std::uint8_t>& buf,
                   const std::string& local_file, std::uint64_t version, File* out) {
  File s(scratch, File::Mode::create_exclusive);
  try {
    copy_range(f, p.offset, p.nbytes, s, 0);
    Patch q = p;
    q.offset = 0;
    lay_stack(q, s, buf, local_file, version);
    Patch r = p;
    r.source = &s;
    journal_patch(r, f, Encoding::overwrite, jw, buf, local_file, version, out);
  } catch (...) {
    boost::system::error_code ec;
    fs::remove(scratch, ec);
    throw;
  }
  s.close();
  fs::remove(scratch);
}

// Journals (and with `out` writes) chunks [c0, c1) of a split sparse entry.
void journal_range(const Patch& p, std::uint64_t c0, std::uint64_t c1, const File& f, JournalWriter& jw,
                   std::vector<std::uint8_t>& buf, File* out) {
  const std::string what = p.delta_file + ": entry '" + p.tensor + "'";
  jw.begin_tensor(p.local_shard, p.offset);
  Walker w(f, p, &jw, buf, out, c0 * p.chunk_bytes, std::min(p.nbytes, c1 * p.chunk_bytes));
  decode_sparse_chunks(p.frame, p.nbytes, c0, c1, what,
                       sparse_sink(w));
  w.finish();
  jw.end_tensor();
}

Hash128 hash_tensor(const File& f, const Patch& p, std::vector<std::uint8_t>& buf) {
  Hasher h;
  buf.resize(kWindow);
  for (std::uint64_t at = 0; at < p.nbytes; at += kWindow) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kWindow, p.nbytes - at));
    f.pread_exact(buf.data(), n, p.offset + at);
    h.update({buf.data(), n});
  }
  return h.digest();
}

ApplyResult apply_locked(Txn& txn, const fs::path& delta, const fs::path& local, const ApplyOptions& opts) {
  const auto t0 = Clock::now();
  if (!is_delta_dir(delta)) return init_locked(txn, delta, local, full_version_of(delta), opts);

  // The delta on its own first, exactly as --inspect checks it.
  const ValidDelta vd = validate_delta(delta);
  const DeltaIndex& idx = vd.index;
  const LocalState st = read_state(local);
  ApplyResult r;
  r.from_version = st.version;
  r.to_version = idx.version;
  if (!st.version)
    fail(Exit::out_of_order, local.string() + ": has no recorded version; initialise it with --init or a full version first");
  if (st.version == idx.version) {
    r.noop = true;
    r.seconds = since(t0);
    return r;
  }
  if (idx.base_version != *st.version)
    fail(Exit::out_of_order, delta.string() + ": delta " + format_version(idx.version) + " applies on top of version " +
                                 format_version(idx.base_version) + ", but LOCAL is at version " + format_version(*st.version));

  // ---- validate everything before the first write ----
  refuse_local_symlinks(local);  // nothing is patched, replaced or removed through a link
  const Checkpoint lc = open_checkpoint(local);
  const std::string iw = (delta / kIndexFile).string();
  const std::string nothing = "; LOCAL is not this delta's base, nothing was changed";

  // Weight files of LOCAL that stay are patched in place (their journal
  // index is their slot); the others are removed or rebuilt beside LOCAL.
  Manifest m;
  m.base = st.version;
  m.version = idx.version;
  std::vector<std::uint32_t> slot(lc.shards.size(), ~0u);  // shard of lc -> index into m.shards
  for (std::size_t s = 0; s < lc.shards.size(); ++s) {
    const ShardOp* so = shard_op(idx, lc.shards[s].file);
    if (so && so->op != ShardOp::Op::header) continue;
    slot[s] = static_cast<std::uint32_t>(m.shards.size());
    m.shards.push_back(lc.shards[s].file);
    refuse_hard_linked(local / lc.shards[s].file);  // patched in place: must be LOCAL's own
  }
  struct Loc {
    std::uint32_t slot;
    std::uint64_t offset, nbytes;
  };
  std::map<std::string, Loc> where;  // tensors patched in place, by their name in the target
  for (const auto& [name, ref] : lc.tensors)
    if (slot[ref.shard] != ~0u && !shard_op(idx, lc.shards[ref.shard].file))
      where[name] = {slot[ref.shard], lc.shards[ref.shard].header.file_offset(lc.info(ref)), lc.info(ref).nbytes()};

  std::vector<Patch> patches;
  std::map<std::string, SafetensorsHeader> rewritten;  // new headers of "header" operations
  std::vector<Build> builds;
  std::map<std::string, std::pair<std::size_t, std::size_t>> built;  // tensor -> (build, tensor)
  for (const ShardOp& so : idx.shards) {
    const std::string what = iw + ": hfdelta_shards \"" + so.file + "\"";
    check_no_symlink(local, so.file, what);
    const Shard* ls = lc.find_shard(so.file);
    if (so.op == ShardOp::Op::remove) {
      if (!ls) fail(Exit::verify_failed, what + " removes a weight file " + local.string() + " does not have" + nothing);
      continue;
    }
    const fs::path hp = delta / kHeadersDir / so.file;
    const MappedFile& hm = vd.new_headers.at(so.file);
    const std::string_view hb(reinterpret_cast<const char*>(hm.bytes().data()), hm.size());
    if (so.op == ShardOp::Op::header) {
      if (!ls) fail(Exit::verify_failed, what + " rewrites the header of a weight file " + local.string() + " does not have" + nothing);
      const SafetensorsHeader nh = parse_safetensors(hb, ls->header.file_size, hp.string());
      if (nh.data_start() != hm.size() || !same_tensor_ranges(nh, ls->header)) fail(Exit::bad_input, hp.string() + ": a header rewritten in place must keep the length and tensor byte ranges of " +
                                           (local / so.file).string());
      const std::uint32_t sl = slot[static_cast<std::size_t>(ls - lc.shards.data())];
      for (const auto& t : nh.tensors) where[t.name] = {sl, nh.file_offset(t), t.nbytes()};
      rewritten.emplace(so.file, nh);
      Patch p;
      p.tensor = "(header)";
      p.delta_file = hp.string();
      p.new_hash = so.header_hash;
      p.base_hash = so.base_header_hash;
      p.local_shard = sl;
      p.offset = 0;
      p.nbytes = hm.size();
      p.replace = hm.bytes();
      patches.push_back(std::move(p));
      continue;
    }
    const SafetensorsHeader nh = parse_built_header(hb, so, hp.string());
    Build bd;
    bd.op = &so;
    bd.prefix = hm.bytes();
    for (std::size_t i = 0; i < nh.tensors.size(); ++i) {
      const TensorInfo& t = nh.tensors[i];
      const ShardOp::Tensor& st = so.tensors[i];
      BuildTensor bt;
      bt.name = t.name;
      bt.dst = nh.file_offset(t);
      bt.nbytes = t.nbytes();
      bt.hash = st.hash;
      if (st.from) {
        auto it = lc.tensors.find(*st.from);
        if (it == lc.tensors.end() || lc.info(it->second).nbytes() != t.nbytes())
          fail(Exit::verify_failed, what + ": tensor '" + t.name + "' is built from '" + *st.from + "' of " +
                                        std::to_string(t.nbytes()) + " bytes, which " + local.string() + " does not have" + nothing);
        bt.src = std::make_pair(it->second.shard, lc.shards[it->second.shard].header.file_offset(lc.info(it->second)));
      }
      built[t.name] = {builds.size(), bd.tensors.size()};
      bd.tensors.push_back(std::move(bt));
    }
    builds.push_back(std::move(bd));
  }

  const std::map<std::string, MappedFile>& maps = vd.maps;
  const std::map<std::string, SafetensorsHeader>& headers = vd.headers;
  std::vector<Patch> build_patches;  // entries of tensors of built files; offsets in the built file
  for (const auto& [file, hdr] : headers) {
    const std::string w = (delta / file).string();
    const auto target = idx.targets.find(file);
    auto check_target = [&](const std::string& tensor, const std::string& in) {
      if (target != idx.targets.end() && target->second != in)
        fail(Exit::bad_input, w + ": entry '" + tensor + "' patches " + in + ", but hfdelta_targets names " + target->second);
    };
    for (const auto& t : hdr.tensors) {
      const Hash128 checksum = check_delta_entry(idx, file, hdr, t, w);
      Patch p;
      p.tensor = t.name;
      p.delta_file = w;
      p.frame = maps.at(file).bytes(hdr.file_offset(t), t.nbytes());
      p.new_hash = checksum;
      if (encoding_of(idx, t.name) == Encoding::stack) {
        p.stack = read_stack(p.frame, checksum, w + ": entry '" + t.name + "'");
      }
      if (auto b = idx.base_checksums.find(t.name); b != idx.base_checksums.end()) p.base_hash = b->second;
      if (auto bi = built.find(t.name); bi != built.end()) {
        BuildTensor& bt = builds[bi->second.first].tensors[bi->second.second];  // its checksum checked by validate_delta
        if (!bt.src) p.base_hash.reset();  // its base is zeros
        check_target(t.name, builds[bi->second.first].op->file);
        p.offset = bt.dst;
        p.nbytes = bt.nbytes;
        bt.entry = build_patches.size();
        build_patches.push_back(std::move(p));
        continue;
      }
      auto lt = where.find(t.name);
      if (lt == where.end())
        fail(Exit::bad_input, w + ": tensor '" + t.name + "' does not exist in " + local.string());
      check_target(t.name, m.shards[lt->second.slot]);
      p.local_shard = lt->second.slot;
      p.offset = lt->second.offset;
      p.nbytes = lt->second.nbytes;
      patches.push_back(std::move(p));
    }
  }
  auto shard_removed = [&](const std::string& f) {
    const ShardOp* so = shard_op(idx, f);
    return so && so->op == ShardOp::Op::remove;
  };
  std::set<std::string> shard_names;  // weight files that stay weight files
  for (const auto& s : lc.shards)
    if (!shard_removed(s.file)) shard_names.insert(s.file);
  for (const auto& so : idx.shards)
    if (so.op != ShardOp::Op::remove) shard_names.insert(so.file);
  for (const auto& fc : idx.files) {
    const std::string w = iw;
    const ShardOp* so = shard_op(idx, fc.path);
    // A file that stops or starts being a weight file (a build or removal of
    // the same name) is moved aside by the shard operation.
    const bool swap = so && (so->op == ShardOp::Op::remove ? fc.op == FileChange::Op::put
                                                             : so->op == ShardOp::Op::build && fc.op == FileChange::Op::remove);
    // What the delta itself names as a weight file was refused by
    // validate_delta; a weight file of LOCAL it treats as a plain file means
    // LOCAL is not its base.
    if (shard_names.count(fc.path) && !swap)
      fail(Exit::verify_failed, w + ": hfdelta_files " + (fc.op == FileChange::Op::put ? "replaces" : "removes") + " " +
                                    (local / fc.path).string() + " as a plain file, but it is a weight file there" + nothing);
    check_no_symlink(local, fc.path, w);
    boost::system::error_code ec;
    m.files.push_back({fc.path, fc.op == FileChange::Op::put ? TxnFile::Op::put : TxnFile::Op::remove,
                       fc.op == FileChange::Op::put ? fs::is_regular_file(fs::symlink_status(local / fc.path, ec))
                                                    : exists_nofollow(local / fc.path) && !swap});
  }
  // Shard operations after the file operations (m.files[k] is idx.files[k]
  // for the staging of carried files).
  for (Build& bd : builds) {
    boost::system::error_code ec;
    bd.mfile = m.files.size();
    m.files.push_back({bd.op->file, TxnFile::Op::put, fs::is_regular_file(fs::symlink_status(local / bd.op->file, ec))});
  }
  for (const ShardOp& so : idx.shards) {
    if (so.op != ShardOp::Op::remove) continue;
    bool put = false;
    for (const auto& fc : idx.files) put = put || (fc.path == so.file && fc.op == FileChange::Op::put);
    if (!put) m.files.push_back({so.file, TxnFile::Op::remove, true});
  }

  for (Patch& p : patches) p.live = !opts.sync;  // without flushing, LOCAL is patched as the entries are decoded
  const int threads = thread_count(opts);
  std::vector<File> files;
  for (const auto& f : m.shards) files.emplace_back(local / f, File::Mode::read_write);

  // A sparse entry larger than its share of the work is cut into chunk
  // ranges, so that one tensor can keep every core busy; its checksums
  // (which run front to back) get passes of their own.
  std::uint64_t total = 0;
  for (const Patch& p : patches) total += p.nbytes;
  std::vector<Unit> units;
  std::vector<std::size_t> split;
  for (std::size_t i = 0; i < patches.size(); ++i) {
    Patch& p = patches[i];
    std::uint64_t chunks = 0;
    if (threads > 1 && p.replace.empty() && encoding_of(idx, p.tensor) == Encoding::sparse && p.frame.size() >= kSparseHeadSize &&
        p.nbytes > total / static_cast<std::uint64_t>(threads)) {
      std::uint32_t es = 0;
      std::memcpy(&es, p.frame.data() + 4, 4);  // checked again by the decoder
      if (es == sparse_elem_size(es, p.nbytes)) chunks = sparse_chunk_count(p.nbytes, es), p.chunk_bytes = kSparseChunkElements * es;
    }
    if (chunks < 2) {
      units.push_back({i, 0, 0, p.nbytes});
      continue;
    }
    p.split = true;
    split.push_back(i);
    const std::uint64_t per = std::max<std::uint64_t>(1, chunks / (4 * static_cast<std::uint64_t>(threads)));
    for (std::uint64_t c = 0; c < chunks; c += per) {
      const std::uint64_t c1 = std::min(chunks, c + per);
      units.push_back({i, c, c1, std::min(p.nbytes, c1 * p.chunk_bytes) - c * p.chunk_bytes});
    }
  }
  std::stable_sort(units.begin(), units.end(), [](const Unit& a, const Unit& b) { return a.bytes > b.bytes; });
  auto run_unit = [&](const Unit& u, JournalWriter& jw, std::vector<std::uint8_t>& buf, bool write) {
    const Patch& p = patches[u.patch];
    File* out = write ? &files[p.local_shard] : nullptr;
    if (p.split)
      journal_range(p, u.c0, u.c1, files[p.local_shard], jw, buf, out);
    else if (!p.stack.empty())
      journal_stack(p, files[p.local_shard], txn.step() / ("stack-" + std::to_string(u.patch)), &jw, buf,
                    (local / m.shards[p.local_shard]).string(), idx.version, out);
    else
      journal_patch(p, files[p.local_shard], p.replace.empty() ? encoding_of(idx, p.tensor) : Encoding::overwrite, &jw, buf,
                    (local / m.shards[p.local_shard]).string(), idx.version, out);
  };
  // Split entries: the base is checked before anything is written, and what
  // was written is read back and checked before the version is recorded.
  parallel_for(split.size(), threads, [&](std::size_t k, std::size_t) {
    const Patch& p = patches[split[k]];
    if (!p.base_hash) return;
    std::vector<std::uint8_t> buf;
    const Hash128 h = hash_tensor(files[p.local_shard], p, buf);
    if (h != *p.base_hash)
      fail(Exit::verify_failed, (local / m.shards[p.local_shard]).string() + ": tensor '" + p.tensor +
                                    "' is not the base of delta " + format_version(idx.version) + " (checksum " + h.hex() +
                                    ", the delta expects " + p.base_hash->hex() + "); nothing was changed");
  });
  auto check_split = [&] {
    std::mutex mu;
    std::vector<std::string> bad;
    parallel_for(split.size(), threads, [&](std::size_t k, std::size_t) {
      const Patch& p = patches[split[k]];
      std::vector<std::uint8_t> buf;
      const Hash128 h = hash_tensor(files[p.local_shard], p, buf);
      std::lock_guard<std::mutex> g(mu);
      if (h != p.new_hash)
        bad.push_back("tensor '" + p.tensor + "' in " + (local / m.shards[p.local_shard]).string() +
                      " reads back with checksum " + h.hex() + ", the delta records " + p.new_hash.hex());
    });
    if (bad.empty()) return;
    std::string msg = "verification failed after applying " + delta.string() + "; LOCAL was rolled back:";
    for (const auto& b : bad) msg += "\n  " + b;
    fail(Exit::verify_failed, msg);
  };
  for (const auto* ps : {&patches, &build_patches})
    for (const Patch& p : *ps) r.tensors_patched += p.replace.empty(), r.delta_bytes += p.frame.size();
  // The checksums of the new version, for --verify: the base version's record
  // with the delta's checksums laid over it (no extra read), or LOCAL hashed
  // whole when the base version has none.
  auto record_step = [&] {
    std::optional<ChecksumRecord> rec = read_record(local, *st.version);
    if (!rec) {
      rec = compute_record(local, opts.threads);
    } else {
      for (const ShardOp& so : idx.shards) {
        if (so.op == ShardOp::Op::remove) {
          rec->weights.erase(so.file);
        } else if (so.op == ShardOp::Op::build) {
          WeightRecord& w = rec->weights[so.file];
          w = {so.size, so.header_hash, {}};
          for (const auto& t : so.tensors) w.tensors[t.name] = t.hash;
          rec->files.erase(so.file);
        } else {
          // Same ranges: each tensor keeps the checksum of the one it replaces
          // (its entry, if any, is laid over below).
          WeightRecord& w = rec->weights[so.file];
          const SafetensorsHeader& oh = lc.find_shard(so.file)->header;
          const SafetensorsHeader& nh = rewritten.at(so.file);
          std::map<std::string, Hash128> tensors;
          for (std::size_t i = 0; i < nh.tensors.size(); ++i)
            if (auto it = w.tensors.find(oh.tensors[i].name); it != w.tensors.end()) tensors[nh.tensors[i].name] = it->second;
          w.tensors = std::move(tensors);
          w.header = so.header_hash;
        }
      }
      for (const Patch& p : patches)
        if (p.replace.empty()) rec->weights[m.shards[p.local_shard]].tensors[p.tensor] = p.new_hash;
      for (const FileChange& fc : idx.files) {
        if (fc.op == FileChange::Op::put) rec->files[fc.path] = {fc.size, fc.hash}, rec->weights.erase(fc.path);
        else rec->files.erase(fc.path);
      }
    }
    write_record(local, idx.version, *rec, opts.sync);
  };
  auto stage_files = [&](const fs::path& step) {
    for (std::size_t k = 0; k < idx.files.size(); ++k) {
      const FileChange& fc = idx.files[k];
      if (fc.op != FileChange::Op::put) continue;
      const fs::path staged = txn_stage(step, k);  // m.files[k] is idx.files[k]
      boost::system::error_code ec;
      fs::create_directories(staged.parent_path(), ec);
      if (ec) fail(Exit::failure, staged.parent_path().string() + ": cannot create: " + ec.message());
      copy_file_atomic(delta / kFilesDir / fc.path, staged, opts.sync);
    }
    // Weight files built anew, from LOCAL's base bytes (unchanged until the
    // swap) and the delta: checked tensor by tensor as they are written.
    if (builds.empty()) return;
    std::vector<File> src;
    for (const auto& sh : lc.shards) src.emplace_back(local / sh.file, File::Mode::read);
    parallel_for(builds.size(), threads, [&](std::size_t k, std::size_t) {
      const Build& bd = builds[k];
      const fs::path staged = txn_stage(step, bd.mfile);
      const std::string name = (local / bd.op->file).string() + " (built beside it)";
      boost::system::error_code ec;
      fs::create_directories(staged.parent_path(), ec);
      if (ec) fail(Exit::failure, staged.parent_path().string() + ": cannot create: " + ec.message());
      File out(staged, File::Mode::create_exclusive);
      out.pwrite_all(bd.prefix.data(), bd.prefix.size(), 0);
      out.truncate(bd.op->size);  // tensors without base bytes start as zeros
      std::vector<std::uint8_t> buf;
      for (const BuildTensor& t : bd.tensors) {
        if (t.src) copy_range(src[t.src->first], t.src->second, t.nbytes, out, t.dst);
        if (t.entry) {
          const Patch& p = build_patches[*t.entry];
          if (!p.stack.empty())
            lay_stack(p, out, buf, name, idx.version);
          else
            journal_patch(p, out, encoding_of(idx, p.tensor), nullptr, buf, name, idx.version, &out);
          continue;
        }
        Patch whole;
        whole.offset = t.dst, whole.nbytes = t.nbytes;
        const Hash128 h = hash_tensor(out, whole, buf);
        if (h != t.hash)
          fail(Exit::verify_failed, name + ": tensor '" + t.name + "' has checksum " + h.hex() + " when built, the delta records " +
                                        t.hash.hex() + nothing);
      }
      if (opts.sync) out.sync();
      out.close();
    });
  };

  if (!opts.sync) {
    // ---- one pass: without flushing, nothing is gained by journaling the
    // whole delta before the first write, and LOCAL is read once instead of
    // twice. Each window's undo records reach the journal file before the
    // window is written, so a kill is still rolled back by the next run. ----
    const fs::path step = txn.begin_step();
    try {
      stage_files(step);
    } catch (...) {
      txn.abandon_step();
      throw;
    }
    m.parts = static_cast<std::size_t>(threads);
    m.live = true;
    std::vector<std::unique_ptr<JournalWriter>> writers(static_cast<std::size_t>(threads));
    run_step(txn, local, m, opts, [&] {
      std::vector<std::vector<std::uint8_t>> bufs(static_cast<std::size_t>(threads));
      parallel_for(units.size(), threads, [&](std::size_t k, std::size_t tid) {
        if (!writers[tid]) writers[tid] = std::make_unique<JournalWriter>(txn_part(step, tid), 1);
        run_unit(units[k], *writers[tid], bufs[tid], true);
      });
      for (auto& w : writers)
        if (w) w->finish(false);
      check_split();
      run_file_ops(local, step, m);
      record_step();
    });
  } else {
    // ---- journal: every change with its old and new byte, checked, durable ----
    const fs::path step = txn.begin_step();
    std::vector<std::unique_ptr<JournalWriter>> writers(static_cast<std::size_t>(threads));
    try {
      std::vector<std::vector<std::uint8_t>> bufs(static_cast<std::size_t>(threads));
      parallel_for(units.size(), threads, [&](std::size_t k, std::size_t tid) {
        if (!writers[tid]) writers[tid] = std::make_unique<JournalWriter>(txn_part(step, tid), 1);
        run_unit(units[k], *writers[tid], bufs[tid], false);
      });
      // Parts are numbered densely in the manifest.
      for (std::size_t t = 0; t < writers.size(); ++t) {
        if (!writers[t]) continue;
        writers[t]->finish(opts.sync);
        if (t != m.parts) rename_path(txn_part(step, t), txn_part(step, m.parts));
        ++m.parts;
      }
      stage_files(step);
      sync_dir(step);
    } catch (...) {
      writers.clear();
      txn.abandon_step();
      throw;
    }

    run_step(txn, local, m, opts, [&] {
      // One pass per journal part, tensor by tensor: every window of the tensor
      // is read, patched where the journal says, written back if it changed,
      // and hashed as written, so the checksum covers exactly what LOCAL holds.
      std::map<std::pair<std::uint32_t, std::uint64_t>, std::size_t> at;
      for (std::size_t i = 0; i < patches.size(); ++i) at[{patches[i].local_shard, patches[i].offset}] = i;
      std::mutex mu;
      std::vector<std::string> mismatches;
      parallel_for(m.parts, threads, [&](std::size_t i, std::size_t) {
        const fs::path part = txn_part(step, i);
        TensorWriter tw(files, part.string());
        const JournalEdges edges{[&](std::uint32_t shard, std::uint64_t offset) {
                                   auto it = at.find({shard, offset});
                                   if (it == at.end()) fail(Exit::failure, part.string() + ": journal names a tensor this delta does not patch");
                                   tw.begin(patches[it->second]);
                                 },
                                 [&] {
                                   const Patch& p = tw.patch();
                                   const Hash128 h = tw.end();
                                   if (p.split) return;  // checked by check_split
                                   std::lock_guard<std::mutex> g(mu);
                                   if (h != p.new_hash)
                                     mismatches.push_back("tensor '" + p.tensor + "' in " +
                                                          (local / m.shards[p.local_shard]).string() +
                                                          " was written with checksum " + h.hex() + ", the delta records " +
                                                          p.new_hash.hex());
                                 }};
        replay_journal(part, true,
                       [&](std::uint32_t, std::span<const std::uint64_t> o, std::span<const std::uint8_t> b) { tw.change(o, b); },
                       &edges);
      });
      if (!mismatches.empty()) {
        std::string msg = "verification failed after applying " + delta.string() + "; LOCAL was rolled back:";
        for (const auto& s : mismatches) msg += "\n  " + s;
        fail(Exit::verify_failed, msg);
      }
      check_split();
      run_file_ops(local, step, m);
      for (auto& f : files) f.sync();
      sync_dirs_of(local, m.files);
      record_step();
    });
  }
  for (auto& f : files) f.close();
  for (const auto& f : m.files) (f.op == TxnFile::Op::put ? r.files_written : r.files_removed) += f.op == TxnFile::Op::put || f.existed;
  r.applied.push_back(idx.version);
  r.seconds = since(t0);
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
  if (!is_dir(src)) fail(Exit::bad_input, src.string() + ": not a directory");
  if (is_delta_dir(src)) fail(Exit::bad_input, src.string() + ": is a delta version, not a full checkpoint");
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
  const auto undone = recover(local, opts.sync);
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
  if (opts.then) opts.then(r.to_version);
  return r;
}

ApplyResult init_local(const fs::path& src, const fs::path& local, std::uint64_t version, const ApplyOptions& opts) {
  check_local_path(local, std::nullopt);
  check_src(src, local);
  check_replaceable(local, opts);
  return locked(local, opts, [&](Txn& txn) { return init_locked(txn, src, local, version, opts); });
}

ApplyResult apply_delta(const fs::path& delta, const fs::path& local, const ApplyOptions& opts) {
  check_local_path(local, Exit::out_of_order);
  if (!is_dir(delta)) fail(Exit::bad_input, delta.string() + ": not a directory");
  check_not_local(delta, "a published version", "delta-apply DELTA LOCAL");
  if (!is_delta_dir(delta)) {  // a full version: as --init
    full_version_of(delta);
    check_src(delta, local);
  }
  return locked(local, opts, [&](Txn& txn) { return apply_locked(txn, delta, local, opts); });
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

static ApplyResult pull_locked(Txn& txn, const fs::path& root, const fs::path& local,
                               std::optional<std::uint64_t> target, const ApplyOptions& opts);

ApplyResult pull(const fs::path& root, const fs::path& local, std::optional<std::uint64_t> target, const ApplyOptions& opts) {
  check_local_path(local, Exit::out_of_order);
  if (!is_dir(root)) fail(Exit::bad_input, root.string() + ": not a directory");
  check_not_local(root, "a publication root", "delta-apply --root ROOT LOCAL");
  return locked(local, opts, [&](Txn& txn) { return pull_locked(txn, root, local, target, opts); });
}

static ApplyResult pull_locked(Txn& txn, const fs::path& root, const fs::path& local,
                               std::optional<std::uint64_t> target, const ApplyOptions& opts) {
  const auto t0 = Clock::now();
  const std::vector<VersionDir> versions = scan_root(root);
  if (versions.empty()) fail(Exit::out_of_order, root.string() + ": no published versions (weight_vNNNNNN)");
  const std::uint64_t want = target ? *target : versions.back().version;
  auto find = [&](std::uint64_t v) -> const VersionDir* {
    for (const auto& d : versions)
      if (d.version == v) return &d;
    return nullptr;
  };
  if (!find(want)) fail(Exit::out_of_order, root.string() + ": version " + format_version(want) + " is not published");

  const LocalState st = read_state(local);
  ApplyResult r;
  r.from_version = st.version;
  r.to_version = want;
  if (st.version && *st.version > want)
    fail(Exit::out_of_order, local.string() + ": is at version " + format_version(*st.version) + ", newer than the target " +
                                 format_version(want));
  if (st.version == want) {
    r.noop = true;
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return r;
  }
  // Newest full version at or below the target that is newer than LOCAL.
  const VersionDir* full = nullptr;
  for (const auto& d : versions)
    if (d.full && d.version <= want && (!st.version || d.version > *st.version)) full = &d;
  std::uint64_t cur;
  if (full) {
    cur = full->version;
  } else if (st.version) {
    cur = *st.version;
  } else {
    fail(Exit::out_of_order, local.string() + ": has no version, and " + root.string() + " has no full version at or below " +
                                 format_version(want) + "; initialise it with --init");
  }
  // The whole chain must be there and link up before LOCAL is touched.
  std::vector<const VersionDir*> chain;
  for (std::uint64_t v = cur + 1; v <= want; ++v) {
    const VersionDir* d = find(v);
    if (!d) fail(Exit::out_of_order, root.string() + ": version " + format_version(v) + " is missing; cannot reach " + format_version(want));
    // Every delta of the chain checked whole before LOCAL is touched.
    const DeltaIndex idx = validate_delta(d->path).index;
    if (idx.version != v || idx.base_version != v - 1)
      fail(Exit::out_of_order, (d->path / kIndexFile).string() + ": records version " + format_version(idx.version) +
                                   " on base " + format_version(idx.base_version) + ", expected " + format_version(v) +
                                   " on base " + format_version(v - 1));
    chain.push_back(d);
  }
  txn.set_final(want);
  if (full) {
    merge(r, init_locked(txn, full->path, local, full->version, opts));
  }
  for (const VersionDir* d : chain) merge(r, apply_locked(txn, d->path, local, opts));
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

}  // namespace hfdelta
