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
#include "hfdelta/local_store.hpp"
#include "hfdelta/safetensors.hpp"
#include "hfdelta/version.hpp"
#include "parallel.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

namespace {

constexpr std::size_t kWindow = 1 << 20;  // bytes of LOCAL read/written at a time

using Clock = std::chrono::steady_clock;

int thread_count(const ApplyOptions& o) { return default_threads(o.threads); }

Hash128 hash_range(const File& f, std::uint64_t off, std::uint64_t n, std::vector<std::uint8_t>& buf) {
  Hasher h;
  buf.resize(kWindow);
  while (n > 0) {
    const std::size_t k = static_cast<std::size_t>(std::min<std::uint64_t>(n, kWindow));
    f.pread_exact(buf.data(), k, off);
    h.update({buf.data(), k});
    off += k, n -= k;
  }
  return h.digest();
}

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

ApplyResult init_locked(const fs::path& src, const fs::path& local, std::uint64_t version, const ApplyOptions& opts) {
  const auto t0 = Clock::now();
  if (is_delta_dir(src))
    fail(Exit::bad_input, src.string() + ": is a delta version, not a full checkpoint");
  const Checkpoint c = open_checkpoint(src);  // validates every weight file before LOCAL is touched
  LocalState st = read_state(local);
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
    differs[i] = !fs::is_regular_file(fs::symlink_status(dst, ec)) || !same_contents(src / want[i], dst);
  });
  std::vector<fs::path> extra;
  {
    boost::system::error_code ec;
    for (fs::recursive_directory_iterator it(local, ec), end; it != end; it.increment(ec)) {
      if (ec) fail(Exit::failure, local.string() + ": cannot list: " + ec.message());
      if (it.depth() == 0 && it->path().filename() == kStateDir) {
        it.disable_recursion_pending();
        continue;
      }
      if (fs::is_directory(it->symlink_status())) continue;
      const std::string rel = fs::relative(it->path(), local).generic_string();
      if (!std::binary_search(want.begin(), want.end(), rel)) extra.push_back(it->path());
    }
  }
  const bool changes = std::count(differs.begin(), differs.end(), 1) > 0 || !extra.empty();
  if (!changes && st.version == version && !st.pending) {
    r.noop = true;
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return r;
  }

  write_state(local, {st.version, version}, opts.sync);
  std::set<fs::path> dirs{local};
  std::mutex mu;
  parallel_for(want.size(), thread_count(opts), [&](std::size_t i, std::size_t) {
    if (!differs[i]) return;
    const fs::path dst = local / want[i];
    boost::system::error_code ec;
    fs::create_directories(dst.parent_path(), ec);
    if (ec) fail(Exit::failure, dst.parent_path().string() + ": cannot create: " + ec.message());
    copy_file_atomic(src / want[i], dst, opts.sync);
    std::lock_guard<std::mutex> g(mu);
    dirs.insert(dst.parent_path());
    r.files_written += 1;
  });
  for (const auto& p : extra) {
    fs::remove(p);
    dirs.insert(p.parent_path());
    r.files_removed += 1;
  }
  if (opts.sync)
    for (const auto& d : dirs) sync_dir(d);
  write_state(local, {version, std::nullopt}, opts.sync);
  r.applied.push_back(version);
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
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
  std::size_t local_shard = 0;
  std::uint64_t offset = 0, nbytes = 0;  // absolute in the LOCAL shard
  bool done = false;                     // already at the new bytes (resumed apply)
};

ApplyResult apply_locked(const fs::path& delta, const fs::path& local, const ApplyOptions& opts) {
  const auto t0 = Clock::now();
  if (!is_delta_dir(delta)) return init_locked(delta, local, full_version_of(delta), opts);

  const DeltaIndex idx = read_delta_index(delta);
  const LocalState st = read_state(local);
  ApplyResult r;
  r.from_version = st.version;
  r.to_version = idx.version;
  if (!st.version)
    fail(Exit::out_of_order, local.string() + ": has no recorded version; initialise it with --init or a full version first");
  if (st.version == idx.version && !st.pending) {
    r.noop = true;
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return r;
  }
  if (st.pending && *st.pending != idx.version)
    fail(Exit::verify_failed, local.string() + ": an apply of version " + format_version(*st.pending) +
                                  " was interrupted; LOCAL may be partly patched. Re-run that version or re-initialise LOCAL");
  if (idx.base_version != *st.version)
    fail(Exit::out_of_order, delta.string() + ": delta " + format_version(idx.version) + " applies on top of version " +
                                 format_version(idx.base_version) + ", but LOCAL is at version " + format_version(*st.version));
  const bool resuming = st.pending.has_value();
  if (resuming && idx.encoding == Encoding::xor_bytes && idx.base_checksums.size() < idx.weight_map.size())
    fail(Exit::verify_failed, local.string() + ": an xor apply of version " + format_version(idx.version) +
                                  " was interrupted and the delta has no base checksums to tell patched tensors apart; "
                                  "re-initialise LOCAL");

  // ---- validate everything before the first write ----
  const Checkpoint lc = open_checkpoint(local);
  std::map<std::string, MappedFile> maps;
  std::map<std::string, SafetensorsHeader> headers;
  for (const auto& [tensor, file] : idx.weight_map) {
    if (maps.count(file)) continue;
    const fs::path p = delta / file;
    boost::system::error_code ec;
    if (!fs::is_regular_file(fs::symlink_status(p, ec)))
      fail(Exit::bad_input, p.string() + ": named by the delta index but missing or not a regular file");
    headers.emplace(file, read_safetensors(p));
    maps.emplace(file, MappedFile(p));
  }
  std::vector<Patch> patches;
  for (const auto& [file, hdr] : headers) {
    const std::string w = (delta / file).string();
    for (const auto& t : hdr.tensors) {
      auto wm = idx.weight_map.find(t.name);
      if (wm == idx.weight_map.end() || wm->second != file)
        fail(Exit::bad_input, w + ": entry '" + t.name + "' is not mapped to this file by the delta index");
      if (t.dtype != "U8" || t.shape.size() != 1)
        fail(Exit::bad_input, w + ": entry '" + t.name + "' must be U8 with shape [L]");
      auto mh = hdr.metadata.find(t.name);
      if (mh == hdr.metadata.end()) fail(Exit::bad_input, w + ": __metadata__ has no checksum for '" + t.name + "'");
      auto lt = lc.tensors.find(t.name);
      if (lt == lc.tensors.end())
        fail(Exit::bad_input, w + ": tensor '" + t.name + "' does not exist in " + local.string());
      Patch p;
      p.tensor = t.name;
      p.delta_file = w;
      p.frame = maps.at(file).bytes(hdr.file_offset(t), t.nbytes());
      p.new_hash = parse_hash_hex(mh->second, w + ": __metadata__[\"" + t.name + "\"]");
      if (auto b = idx.base_checksums.find(t.name); b != idx.base_checksums.end()) p.base_hash = b->second;
      p.local_shard = lt->second.shard;
      const auto& lh = lc.shards[p.local_shard].header;
      p.offset = lh.file_offset(lc.info(lt->second));
      p.nbytes = lc.info(lt->second).nbytes();
      patches.push_back(std::move(p));
    }
  }
  for (const auto& [tensor, file] : idx.weight_map) {
    const auto& h = headers.at(file);
    if (!h.find(tensor)) fail(Exit::bad_input, (delta / file).string() + ": has no entry '" + tensor + "' named by the delta index");
  }
  for (const auto& fc : idx.files) {
    if (fc.path == kStateDir || fc.path.rfind(std::string(kStateDir) + "/", 0) == 0)
      fail(Exit::bad_input, (delta / kIndexFile).string() + ": hfdelta_files may not touch " + fc.path);
    check_no_symlink(local, fc.path, (delta / kIndexFile).string());
    if (fc.op != FileChange::Op::put) continue;
    check_no_symlink(delta / kFilesDir, fc.path, delta.string());
    const fs::path p = delta / kFilesDir / fc.path;
    boost::system::error_code ec;
    if (!fs::is_regular_file(fs::symlink_status(p, ec)))
      fail(Exit::bad_input, p.string() + ": listed in the delta index's hfdelta_files but missing or not a regular file");
    const MappedFile m(p);
    if (m.size() != fc.size || xxh3_128(m.bytes()) != fc.hash)
      fail(Exit::bad_input, p.string() + ": does not match the size and checksum the delta index records");
  }
  for (const auto& s : lc.shards)
    if (fs::is_symlink(fs::symlink_status(local / s.file)))
      fail(Exit::bad_input, (local / s.file).string() + ": is a symlink; delta-apply patches real files only (use --init)");

  const int threads = thread_count(opts);
  std::vector<File> files;
  for (const auto& s : lc.shards) files.emplace_back(local / s.file, File::Mode::read_write);

  // Every frame must decode cleanly to the right size, and LOCAL must hold the
  // base bytes, before anything is written.
  parallel_for(patches.size(), threads, [&](std::size_t i, std::size_t) {
    Patch& p = patches[i];
    Decompressor d1, d2;
    if (idx.encoding == Encoding::xor_bytes)
      decode_xor(d1, p.frame, p.nbytes, p.delta_file + ": entry '" + p.tensor + "'", [](std::uint64_t, auto) {});
    else
      decode_overwrite(d1, d2, p.frame, p.nbytes, p.delta_file + ": entry '" + p.tensor + "'", [](auto, auto) {});
    if (!p.base_hash && !resuming) return;
    std::vector<std::uint8_t> buf;
    const Hash128 h = hash_range(files[p.local_shard], p.offset, p.nbytes, buf);
    if (resuming && h == p.new_hash) {
      p.done = true;
      return;
    }
    if (p.base_hash && h != *p.base_hash)
      fail(Exit::verify_failed, (local / lc.shards[p.local_shard].file).string() + ": tensor '" + p.tensor +
                                    "' is not the base of delta " + format_version(idx.version) + " (checksum " + h.hex() +
                                    ", the delta expects " + p.base_hash->hex() + "); nothing was changed");
  });

  write_state(local, {st.version, idx.version}, opts.sync);

  std::mutex mu;
  std::vector<std::string> mismatches;
  parallel_for(patches.size(), threads, [&](std::size_t i, std::size_t) {
    Patch& p = patches[i];
    if (p.done) return;
    File& f = files[p.local_shard];
    std::vector<std::uint8_t> buf(kWindow);
    Decompressor d1, d2;
    const std::string what = p.delta_file + ": entry '" + p.tensor + "'";
    if (idx.encoding == Encoding::xor_bytes) {
      decode_xor(d1, p.frame, p.nbytes, what, [&](std::uint64_t off, std::span<const std::uint8_t> x) {
        buf.resize(x.size());
        f.pread_exact(buf.data(), x.size(), p.offset + off);
        for (std::size_t k = 0; k < x.size(); ++k) buf[k] ^= x[k];
        f.pwrite_all(buf.data(), x.size(), p.offset + off);
      });
    } else {
      decode_overwrite(d1, d2, p.frame, p.nbytes, what,
                       [&](std::span<const std::uint64_t> pos, std::span<const std::uint8_t> val) {
                         // Read-modify-write one window of LOCAL per run of nearby positions.
                         for (std::size_t k = 0; k < pos.size();) {
                           const std::uint64_t start = pos[k];
                           const std::uint64_t len = std::min<std::uint64_t>(kWindow, p.nbytes - start);
                           buf.resize(len);
                           f.pread_exact(buf.data(), len, p.offset + start);
                           for (; k < pos.size() && pos[k] < start + len; ++k) buf[pos[k] - start] = val[k];
                           f.pwrite_all(buf.data(), len, p.offset + start);
                         }
                       });
    }
    const Hash128 h = hash_range(f, p.offset, p.nbytes, buf);
    std::lock_guard<std::mutex> g(mu);
    r.tensors_patched += 1;
    r.delta_bytes += p.frame.size();
    if (h != p.new_hash)
      mismatches.push_back("tensor '" + p.tensor + "' in " + (local / lc.shards[p.local_shard].file).string() +
                           " has checksum " + h.hex() + " after patching, the delta records " + p.new_hash.hex());
  });
  if (!mismatches.empty()) {
    std::string msg = "verification failed after applying " + delta.string() + " (LOCAL stays marked as interrupted):";
    for (const auto& m : mismatches) msg += "\n  " + m;
    fail(Exit::verify_failed, msg);
  }

  // Removals first, then the directories they leave empty, then new
  // contents: a file may have become a directory of the same name or back.
  std::set<fs::path> dirs{local};
  for (const auto& fc : idx.files) {
    if (fc.op != FileChange::Op::remove) continue;
    const fs::path dst = local / fc.path;
    if (fs::remove(dst)) r.files_removed += 1;
    for (fs::path d = dst.parent_path(); d != local && fs::is_empty(d); d = d.parent_path()) fs::remove(d);
    dirs.insert(dst.parent_path());
  }
  for (const auto& fc : idx.files) {
    if (fc.op != FileChange::Op::put) continue;
    const fs::path dst = local / fc.path;
    boost::system::error_code ec;
    if (fs::is_directory(fs::symlink_status(dst, ec)) && fs::is_empty(dst)) fs::remove(dst);
    fs::create_directories(dst.parent_path(), ec);
    if (ec) fail(Exit::failure, dst.parent_path().string() + ": cannot create: " + ec.message());
    copy_file_atomic(delta / kFilesDir / fc.path, dst, opts.sync);
    r.files_written += 1;
    for (fs::path d = dst.parent_path(); d != local; d = d.parent_path()) dirs.insert(d);
  }
  for (auto it = dirs.begin(); it != dirs.end();) it = fs::is_directory(*it) ? std::next(it) : dirs.erase(it);
  if (opts.sync) {
    for (auto& f : files) f.sync();
    for (const auto& d : dirs) sync_dir(d);
  }
  for (auto& f : files) f.close();
  write_state(local, {idx.version, std::nullopt}, opts.sync);
  r.applied.push_back(idx.version);
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
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

}  // namespace

ApplyResult init_local(const fs::path& src, const fs::path& local, std::uint64_t version, const ApplyOptions& opts) {
  LocalLock lock(local, opts.lock_timeout);
  return init_locked(src, local, version, opts);
}

ApplyResult apply_delta(const fs::path& delta, const fs::path& local, const ApplyOptions& opts) {
  LocalLock lock(local, opts.lock_timeout);
  return apply_locked(delta, local, opts);
}

ApplyResult pull(const fs::path& root, const fs::path& local, std::optional<std::uint64_t> target, const ApplyOptions& opts) {
  const auto t0 = Clock::now();
  LocalLock lock(local, opts.lock_timeout);
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
  if (st.version == want && !st.pending) {
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
    // An interrupted apply is resumed by re-running the version it was applying.
    if (st.pending && *st.pending == cur + 1 && find(cur + 1) == nullptr)
      fail(Exit::out_of_order, root.string() + ": version " + format_version(cur + 1) + " is not published");
  } else {
    fail(Exit::out_of_order, local.string() + ": has no version, and " + root.string() + " has no full version at or below " +
                                 format_version(want) + "; initialise it with --init");
  }
  // The whole chain must be there and link up before LOCAL is touched.
  std::vector<const VersionDir*> chain;
  for (std::uint64_t v = cur + 1; v <= want; ++v) {
    const VersionDir* d = find(v);
    if (!d) fail(Exit::out_of_order, root.string() + ": version " + format_version(v) + " is missing; cannot reach " + format_version(want));
    const DeltaIndex idx = read_delta_index(d->path);
    if (idx.version != v || idx.base_version != v - 1)
      fail(Exit::out_of_order, (d->path / kIndexFile).string() + ": records version " + format_version(idx.version) +
                                   " on base " + format_version(idx.base_version) + ", expected " + format_version(v) +
                                   " on base " + format_version(v - 1));
    chain.push_back(d);
  }
  if (full) {
    merge(r, init_locked(full->path, local, full->version, opts));
  }
  for (const VersionDir* d : chain) merge(r, apply_locked(d->path, local, opts));
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

}  // namespace hfdelta
