#include "store/journal.hpp"

#include <algorithm>
#include <cstring>
#include <set>

#include <boost/filesystem/operations.hpp>
#include <nlohmann/json.hpp>

#include "codec/codec_internal.hpp"
#include "hfdelta/checkpoint.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/signals.hpp"
#include "hfdelta/version.hpp"
#include "store/checksum_record.hpp"
#include "store/local_store.hpp"
#include "util/json_text.hpp"
#include "util/scope_guard.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;
using nlohmann::json;

namespace {

constexpr std::uint8_t kTensor = 'T';
constexpr std::uint8_t kEnd = 'E';
constexpr std::size_t kReplayWindow = 1 << 20;
constexpr std::size_t kBatch = 64 * 1024;

// Bytes of a decoded journal part, one at a time, over bounded pieces.
class ByteReader {
 public:
  ByteReader(FrameReader& r) : r_(r) {}
  std::uint8_t get() {
    if (pos_ == piece_.size()) {
      piece_ = r_.next();
      pos_ = 0;
      if (piece_.empty()) r_.bad("journal ends early");
    }
    return piece_[pos_++];
  }
  std::uint64_t get_le(int n) {
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= std::uint64_t(get()) << (8 * i);
    return v;
  }
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const std::uint8_t b = get();
      v |= std::uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    r_.bad("journal has an overlong number");
  }

 private:
  FrameReader& r_;
  std::span<const std::uint8_t> piece_;
  std::size_t pos_ = 0;
};

void remove_empty_parents(const fs::path& local, fs::path d) {
  boost::system::error_code ec;
  for (; d != local && d.string().size() > local.string().size(); d = d.parent_path()) {
    if (!fs::is_directory(fs::symlink_status(d, ec)) || !fs::is_empty(d, ec)) break;
    remove_path(d);
  }
}

void make_parents(const fs::path& p) { make_dirs(p.parent_path()); }

bool is_empty_dir(const fs::path& p) {
  boost::system::error_code ec;
  return fs::is_directory(fs::symlink_status(p, ec)) && fs::is_empty(p, ec) && !ec;
}

// `dir` holds `name` and nothing else.
bool holds_only(const fs::path& dir, const fs::path& name) {
  boost::system::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  if (ec || it == end || it->path().filename() != name) return false;
  it.increment(ec);
  return !ec && it == end;
}

std::size_t depth_of(const std::string& rel) {
  return static_cast<std::size_t>(std::count(rel.begin(), rel.end(), '/')) + 1;
}

fs::path up_from(fs::path p, std::size_t up) {
  while (up-- > 0) p = p.parent_path();
  return p;
}

// Where removal `op` set LOCAL's entry aside: the file itself (up 0), or the
// directory `up` levels above it that the removal emptied, with the file in it.
fs::path txn_aside(const fs::path& step, std::size_t op, std::size_t up) {
  return up == 0 ? txn_undo(step, op) : step / "undo" / (std::to_string(op) + "+" + std::to_string(up));
}

// How many levels above `rel`'s file a removal empties: the directories that
// hold nothing but the path down to it. They go into the journal with the
// file, so a rollback puts them back with one rename: re-creating a
// directory needs a free block, which a full disk lacks.
std::size_t levels_emptied(const fs::path& local, const std::string& rel) {
  const std::size_t depth = depth_of(rel);
  std::size_t up = 0;
  for (fs::path p = local / rel; up + 1 < depth && holds_only(p.parent_path(), p.filename()); p = p.parent_path()) ++up;
  return up;
}

}  // namespace

fs::path txn_root(const fs::path& local) { return local / kStateDir / "txn"; }
fs::path txn_part(const fs::path& step, std::size_t i) { return step / ("part-" + std::to_string(i)); }
fs::path txn_stage(const fs::path& step, std::size_t op) { return step / "stage" / std::to_string(op); }
fs::path txn_undo(const fs::path& step, std::size_t op) { return step / "undo" / std::to_string(op); }
fs::path txn_state(const fs::path& step, bool pending) {
  return step / (pending ? "state-pending.json" : "state-undone.json");
}

void reserve_rollback(const fs::path& step, const Manifest& m, bool sync) {
  reserve_state(txn_state(step, true), {m.base, m.version}, sync);
  reserve_state(txn_state(step, false), {m.base, std::nullopt}, sync);
}

// ---- journal parts --------------------------------------------------------------

JournalWriter::JournalWriter(const fs::path& path, int level)
    : file_(path, File::Mode::create_exclusive), comp_(level) {
  comp_.begin(Compressor::kUnknownSize);
  buf_.resize(kBatch + 32);
}

void JournalWriter::put(const std::uint8_t* p, std::size_t n) {  // n: a record's head, at most 32
  std::memcpy(buf_.data() + len_, p, n);
  len_ += n;
  if (len_ >= kBatch) flush_buf();
}

void JournalWriter::flush_buf() {
  comp_.put({buf_.data(), len_}, [&](std::span<const std::uint8_t> s) { file_.write_all(s.data(), s.size()); });
  len_ = 0;
}

void JournalWriter::begin_tensor(std::uint32_t shard, std::uint64_t offset) {
  std::uint8_t h[13];
  h[0] = kTensor;
  for (int i = 0; i < 4; ++i) h[1 + i] = static_cast<std::uint8_t>(shard >> (8 * i));
  for (int i = 0; i < 8; ++i) h[5 + i] = static_cast<std::uint8_t>(offset >> (8 * i));
  put(h, sizeof h);
  next_ = 0;
}

void JournalWriter::change(std::uint64_t pos, std::uint8_t old_byte, std::uint8_t new_byte) {
  // Gap to the previous change plus one, so 0 can end the tensor's list.
  std::uint64_t v = pos - next_ + 1;
  // Written in place (called once per changed byte): the buffer has room
  // for one more record past kBatch.
  std::uint8_t* b = buf_.data() + len_;
  std::size_t n = 0;
  while (v >= 0x80) b[n++] = static_cast<std::uint8_t>(v | 0x80), v >>= 7;
  b[n++] = static_cast<std::uint8_t>(v);
  b[n++] = old_byte;
  b[n++] = new_byte;
  len_ += n;
  next_ = pos + 1;
  if (len_ >= kBatch) flush_buf();
}

void JournalWriter::end_tensor() {
  const std::uint8_t z = 0;
  put(&z, 1);
}

void JournalWriter::flush() {
  flush_buf();
  comp_.flush([&](std::span<const std::uint8_t> s) { file_.write_all(s.data(), s.size()); });
}

void JournalWriter::finish(bool sync) {
  const std::uint8_t e = kEnd;
  put(&e, 1);
  flush_buf();
  comp_.end([&](std::span<const std::uint8_t> s) { file_.write_all(s.data(), s.size()); });
  if (sync) file_.sync();
  file_.close();
}

void replay_journal(const fs::path& part, bool new_values, const JournalSink& sink, const JournalEdges* edges,
                    bool partial_ok) {
  const MappedFile m(part);
  Decompressor d;
  std::vector<std::uint64_t> offs;
  std::vector<std::uint8_t> vals;
  offs.reserve(kBatch);
  vals.reserve(kBatch);
  bool in_sink = false;
  auto emit = [&](std::uint32_t shard) {
    in_sink = true;
    sink(shard, offs, vals);
    in_sink = false;
    offs.clear(), vals.clear();
  };
  std::uint32_t shard = 0;
  try {
    FrameReader fr(d, m.bytes(), part.string());
    ByteReader r(fr);
    for (;;) {
      const std::uint8_t tag = r.get();
      if (tag == kEnd) break;
      if (tag != kTensor) fr.bad("journal has an unknown record");
      shard = static_cast<std::uint32_t>(r.get_le(4));
      const std::uint64_t base = r.get_le(8);
      if (edges) edges->begin(shard, base);
      std::uint64_t next = 0;
      for (;;) {
        const std::uint64_t v = r.varint();
        if (v == 0) break;
        const std::uint64_t pos = next + v - 1;
        const std::uint8_t o = r.get(), n = r.get();
        offs.push_back(base + pos);
        vals.push_back(new_values ? n : o);
        next = pos + 1;
        if (offs.size() == kBatch) emit(shard);
      }
      if (!offs.empty()) emit(shard);
      if (edges) edges->end();
    }
    fr.expect_end();
  } catch (const Error&) {
    if (!partial_ok || in_sink) throw;
    if (!offs.empty()) emit(shard);  // whole records read before the cut
  }
}

void write_scattered(File& f, std::span<const std::uint64_t> offs, std::span<const std::uint8_t> bytes,
                     std::vector<std::uint8_t>& window) {
  for (std::size_t k = 0; k < offs.size();) {
    const std::uint64_t start = offs[k];
    std::size_t last = k;
    while (last + 1 < offs.size() && offs[last + 1] < start + kReplayWindow) ++last;
    const std::size_t len = static_cast<std::size_t>(offs[last] - start + 1);
    window.resize(len);
    f.pread_exact(window.data(), len, start);
    for (; k <= last; ++k) window[offs[k] - start] = bytes[k];
    f.pwrite_all(window.data(), len, start);
  }
}

// ---- manifest ---------------------------------------------------------------------

void write_manifest(const fs::path& step, const Manifest& m, bool sync) {
  json files = json::array();
  for (const auto& f : m.files)
    files.push_back({{"path", f.path}, {"op", f.op == TxnFile::Op::put ? "put" : "remove"}, {"existed", f.existed}});
  json j = {{"version", format_version(m.version)},
            {"base_version", m.base ? json(format_version(*m.base)) : json()},
            {"shards", m.shards},
            {"parts", m.parts},
            {"live", m.live},
            {"files", files}};
  write_file_atomic(step / "manifest.json", j.dump(1) + "\n", sync);
}

std::optional<Manifest> read_manifest(const fs::path& step) {
  const fs::path p = step / "manifest.json";
  if (!exists_nofollow(p)) return std::nullopt;
  const std::string w = p.string();
  try {
    const json j = parse_json_text(read_small_file(p, kManifestJson.bytes), w, "manifest", kManifestJson);
    Manifest m;
    m.version = parse_version(j.at("version").get<std::string>(), w);
    if (!j.at("base_version").is_null()) m.base = parse_version(j.at("base_version").get<std::string>(), w);
    m.shards = j.at("shards").get<std::vector<std::string>>();
    m.parts = j.at("parts").get<std::size_t>();
    m.live = j.value("live", false);
    for (const auto& f : j.at("files")) {
      TxnFile t;
      t.path = f.at("path").get<std::string>();
      check_relative_path(t.path, w);
      t.op = f.at("op").get<std::string>() == "put" ? TxnFile::Op::put : TxnFile::Op::remove;
      t.existed = f.at("existed").get<bool>();
      m.files.push_back(std::move(t));
    }
    for (const auto& s : m.shards) check_relative_path(s, w);
    return m;
  } catch (const json::exception& e) {
    fail(Exit::bad_input, w, std::string("damaged transaction manifest: ") + e.what());
  }
}

// ---- file operations ------------------------------------------------------------

void run_file_ops(const fs::path& local, const fs::path& step, const Manifest& m) {
  for (std::size_t i = 0; i < m.files.size(); ++i) {
    const TxnFile& f = m.files[i];
    if (f.op != TxnFile::Op::remove || !f.existed) continue;
    const fs::path dst = local / f.path;
    if (!exists_nofollow(dst)) continue;
    const std::size_t up = levels_emptied(local, f.path);
    make_parents(txn_aside(step, i, up));
    rename_path(up_from(dst, up), txn_aside(step, i, up));
  }
  for (std::size_t i = 0; i < m.files.size(); ++i) {
    const TxnFile& f = m.files[i];
    if (f.op != TxnFile::Op::put) continue;
    const fs::path dst = local / f.path;
    if (f.existed) {
      make_parents(txn_undo(step, i));
      rename_path(dst, txn_undo(step, i));
    } else if (is_empty_dir(dst)) {  // an empty directory where a file now goes: set aside too
      make_parents(txn_undo(step, i));
      rename_path(dst, txn_undo(step, i));
    } else if (exists_nofollow(dst)) {
      remove_path(dst);  // a directory with files in it: fails, and the step rolls back
    }
    make_parents(dst);
    rename_path(txn_stage(step, i), dst);
  }
}

void rollback(const fs::path& local, const fs::path& step, const Manifest& m, bool sync) {
  const StopDeferred defer;  // a stop signal waits for the rollback to finish
  // Pending first: if this is cut short, the next run knows to finish it.
  // Nothing below allocates space (patches in place, renames, links of the
  // reserved state files; the directories a removal emptied were set aside,
  // not deleted), so a full disk cannot stop a rollback.
  install_state(local, {m.base, m.version}, txn_state(step, true), sync);
  std::vector<File> shards;
  for (const auto& s : m.shards) shards.emplace_back(local / s, File::Mode::read_write);
  std::vector<std::uint8_t> window;
  for (std::size_t i = 0; i < m.parts; ++i) {
    const fs::path part = txn_part(step, i);
    if (!exists_nofollow(part)) {
      if (m.live) continue;  // that thread had not written anything yet
      fail(Exit::failure, part, "journal part missing; cannot roll back");
    }
    replay_journal(
        part, false,
        [&](std::uint32_t shard, std::span<const std::uint64_t> o, std::span<const std::uint8_t> b) {
          if (shard >= shards.size()) fail(Exit::failure, part, "journal names an unknown weight file");
          write_scattered(shards[shard], o, b, window);
        },
        nullptr, m.live);
  }
  // Puts were done after removals, so they are undone first; directories a
  // put created go too, so that a removed file can take its name back.
  std::set<fs::path> dirs{local};
  for (std::size_t k = m.files.size(); k-- > 0;) {
    const TxnFile& f = m.files[k];
    if (f.op != TxnFile::Op::put) continue;
    const fs::path dst = local / f.path;
    boost::system::error_code ec;
    // A put's own file is always a regular file: a directory at dst is one a
    // removal put back in a rollback cut short, which is not ours to remove.
    const bool ours =
        !f.existed && !exists_nofollow(txn_stage(step, k)) && fs::is_regular_file(fs::symlink_status(dst, ec));
    if (exists_nofollow(txn_undo(step, k))) {
      if (ours) remove_path(dst);  // over the empty directory set aside for it
      rename_path(txn_undo(step, k), dst);
    } else if (ours) {
      remove_path(dst);
    }
    remove_empty_parents(local, dst.parent_path());
    dirs.insert(dst.parent_path());
  }
  for (std::size_t k = m.files.size(); k-- > 0;) {
    const TxnFile& f = m.files[k];
    if (f.op != TxnFile::Op::remove) continue;
    for (std::size_t up = 0; up < depth_of(f.path); ++up) {
      const fs::path aside = txn_aside(step, k, up);
      if (!exists_nofollow(aside)) continue;
      const fs::path dst = up_from(local / f.path, up);
      if (is_empty_dir(dst)) remove_path(dst);
      // Only a journal of an older hfdelta, which deleted emptied directories, lacks the parent.
      make_parents(dst);
      rename_path(aside, dst);
      dirs.insert(dst.parent_path());
      break;
    }
  }
  // The step may have recorded checksums of the version it was applying; a
  // step that re-installed LOCAL's own version number saved the old record.
  if (exists_nofollow(step / "record.json"))
    rename_path(step / "record.json", record_file(local, m.version));
  else if (m.base != m.version)
    remove_record(local, m.version);
  if (sync) {
    for (auto& f : shards) f.sync();
    for (const auto& d : dirs)
      if (fs::is_directory(d)) sync_dir(d);
  }
  for (auto& f : shards) f.close();
  install_state(local, {m.base, std::nullopt}, txn_state(step, false), sync);
}

// ---- transactions -------------------------------------------------------------------

namespace {

// Step directories of LOCAL's transaction, last first.
std::vector<fs::path> steps_of(const fs::path& local) {
  std::vector<std::pair<std::uint64_t, fs::path>> v;
  boost::system::error_code ec;
  const fs::path root = txn_root(local);
  if (!fs::is_directory(root, ec)) return {};
  for (fs::directory_iterator it(root, ec), end; it != end && !ec; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.empty() || name.size() > 9 || name.find_first_not_of("0123456789") != std::string::npos) continue;
    if (fs::is_directory(it->path())) v.emplace_back(std::stoull(name), it->path());
  }
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<fs::path> out;
  for (auto& [n, p] : v) out.push_back(p);
  return out;
}

// Removing the journal is the commit point of an operation, so it must be
// atomic: rename it out of the way first, then delete at leisure.
void discard(const fs::path& local, bool sync) {
  const fs::path root = txn_root(local);
  if (!exists_nofollow(root)) return;
  const fs::path gone = temp_path_beside(root);
  rename_path(root, gone);  // the commit point; past it nothing may fail the operation
  try {
    if (sync) sync_dir(root.parent_path());
  } catch (const std::exception&) {}
  boost::system::error_code ec;
  fs::remove_all(gone, ec);
}

// What a killed run left under .weight_sync: a journal renamed away at its
// commit but not yet removed (.txn.tmp-*), and the temporary files of
// atomic replacements (.state.json.tmp-*, checksums/.NNNNNN.json.tmp-*).
// Every writer holds the lock, so none of them is in use.
void remove_stale_temp_files(const fs::path& local) {
  boost::system::error_code ec;
  for (const fs::path& dir : {local / kStateDir, local / kStateDir / "checksums"})
    for (fs::directory_iterator it(dir, ec), end; it != end && !ec; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.size() > 1 && name[0] == '.' && name.find(".tmp-") != std::string::npos) {
        boost::system::error_code rm;
        fs::remove_all(it->path(), rm);
      }
    }
}

}  // namespace

fs::path Txn::begin_step() {
  step_ = txn_root(local_) / std::to_string(next_++);
  boost::system::error_code ec;
  fs::remove_all(step_, ec);
  fs::create_directories(step_, ec);
  if (ec) fail(Exit::failure, step_, "cannot create: " + ec.message());
  return step_;
}

void Txn::abandon_step() {
  boost::system::error_code ec;
  fs::remove_all(step_, ec);
}

bool Txn::rollback_all() {
  const StopDeferred defer;
  if (kept_) return false;  // a step could not be undone: its journal stays for the next run
  {
    const OnFailure keep_journal([this] { kept_ = true; });
    for (std::size_t k = done_.size(); k-- > 0;)
      rollback(local_, txn_root(local_) / std::to_string(k), done_[k], sync_);
  }
  done_.clear();
  try {
    discard(local_, sync_);  // only now is LOCAL back at its recorded version
  } catch (const std::exception&) {
    return false;  // undone already, so the next run's recover() has nothing left to do but remove it
  }
  return true;
}

void Txn::commit() {
  discard(local_, sync_);  // the commit point: once the journal is gone, nothing is undone
  done_.clear();
  next_ = 0;  // a pull commits each version: the next one's steps start a journal of their own
}

std::optional<std::uint64_t> interrupted_version(const fs::path& local) {
  const LocalState st = read_state(local);
  if (st.pending) return st.pending;
  for (const auto& step : steps_of(local))
    if (const auto m = read_manifest(step)) return m->version;
  return std::nullopt;
}

std::optional<std::uint64_t> recover(const fs::path& local, bool sync) {
  const StopDeferred defer;
  remove_stale_temp_files(local);
  const std::optional<std::uint64_t> was = interrupted_version(local);
  std::optional<std::uint64_t> undone;
  for (const auto& step : steps_of(local)) {
    if (const auto m = read_manifest(step)) {
      undone = was;
      rollback(local, step, *m, sync);
    }
  }
  discard(local, sync);
  const LocalState st = read_state(local);
  if (st.pending) {  // cut short before its journal was complete: LOCAL untouched
    write_state(local, {st.version, std::nullopt}, sync);
    if (!undone) undone = st.pending;
  }
  return undone;
}

}  // namespace hfdelta
