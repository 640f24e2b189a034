#include "hfdelta/diff.hpp"

#include <fcntl.h>
#include <stdio.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <set>

#include <boost/filesystem/operations.hpp>

#include "hfdelta/checkpoint.hpp"
#include "hfdelta/delta_format.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/hash.hpp"
#include "hfdelta/io.hpp"
#include "hfdelta/safetensors.hpp"
#include "hfdelta/version.hpp"
#include "parallel.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

namespace {

// Stops with Error(unsupported) at the first structural difference, named
// precisely, so the user knows which save changed shape.
void require_same_layout(const Checkpoint& a, const Checkpoint& b) {
  const std::string A = a.dir.string(), B = b.dir.string();
  for (const auto& [name, ref] : a.tensors)
    if (!b.tensors.count(name))
      fail(Exit::unsupported, "tensor '" + name + "' of " + A + " is missing from " + B +
                                  " (changes of the tensor set are not supported yet)");
  for (const auto& [name, ref] : b.tensors) {
    auto it = a.tensors.find(name);
    if (it == a.tensors.end())
      fail(Exit::unsupported, "tensor '" + name + "' of " + B + " is new (changes of the tensor set are not supported yet)");
    const TensorInfo& ta = a.info(it->second);
    const TensorInfo& tb = b.info(ref);
    if (ta.dtype != tb.dtype || ta.shape != tb.shape)
      fail(Exit::unsupported, "tensor '" + name + "' changed from " + ta.dtype + " " + shape_string(ta.shape) + " to " +
                                  tb.dtype + " " + shape_string(tb.shape) + " (not supported yet)");
    if (a.shards[it->second.shard].file != b.shards[ref.shard].file)
      fail(Exit::unsupported, "tensor '" + name + "' moved from " + a.shards[it->second.shard].file + " to " +
                                  b.shards[ref.shard].file + " (shard layout changes are not supported yet)");
  }
  if (a.shards.size() != b.shards.size())
    fail(Exit::unsupported, "number of weight files differs: " + std::to_string(a.shards.size()) + " in " + A + ", " +
                                std::to_string(b.shards.size()) + " in " + B + " (not supported yet)");
  for (std::size_t i = 0; i < a.shards.size(); ++i) {
    if (a.shards[i].file != b.shards[i].file)
      fail(Exit::unsupported, "weight file " + a.shards[i].file + " of " + A + " is " + b.shards[i].file + " in " + B +
                                  " (not supported yet)");
    if (a.shards[i].header.header != b.shards[i].header.header)
      fail(Exit::unsupported, "safetensors header bytes of " + a.shards[i].file + " differ between " + A + " and " + B +
                                  " (tensor order, offsets or __metadata__ changed; not supported yet)");
  }
}

struct Job {
  std::size_t shard;
  const TensorInfo* tensor;
};

struct Entry {
  std::string name;
  std::size_t shard = 0;   // target shard it belongs to (groups entries into delta files)
  int spool = 0;           // thread spool file holding the frame
  std::uint64_t offset = 0, size = 0;
  Hash128 new_hash, base_hash;
  Encoding encoding;
};

// One append-only scratch file per thread: frames are streamed there while
// tensors are compressed in parallel, then gathered into the delta files.
struct Spool {
  File file;
  std::uint64_t size = 0;
};

std::uint64_t size_of(const fs::path& p) {
  boost::system::error_code ec;
  const auto n = fs::file_size(p, ec);
  if (ec) fail(Exit::failure, p.string() + ": " + ec.message());
  return n;
}

}  // namespace

DiffSummary diff_checkpoints(const fs::path& base_dir, const fs::path& new_dir, const fs::path& out_arg,
                             const DiffOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path out = fs::absolute(out_arg);
  boost::system::error_code ec;
  if (fs::exists(fs::symlink_status(out, ec))) fail(Exit::exists, out.string() + ": already exists; refusing to overwrite");
  if (!fs::is_directory(out.parent_path(), ec)) fail(Exit::bad_input, out.parent_path().string() + ": not a directory");

  const Checkpoint base = open_checkpoint(base_dir);
  const Checkpoint target = open_checkpoint(new_dir);
  require_same_layout(base, target);

  DiffSummary sum;
  sum.version = opts.version;
  sum.base_version = opts.base_version;

  // Non-weight files: whatever differs travels whole, whatever vanished is removed.
  std::vector<FileChange> files;
  for (const auto& f : target.other_files) {
    const bool same = std::binary_search(base.other_files.begin(), base.other_files.end(), f) &&
                      same_contents(base.dir / f, target.dir / f);
    if (same) continue;
    const MappedFile m(target.dir / f);
    files.push_back({f, FileChange::Op::put, m.size(), xxh3_128(m.bytes())});
  }
  for (const auto& f : base.other_files)
    if (!std::binary_search(target.other_files.begin(), target.other_files.end(), f))
      files.push_back({f, FileChange::Op::remove, 0, {}});

  std::vector<MappedFile> base_maps, new_maps;
  for (const auto& s : target.shards) {
    base_maps.emplace_back(base.dir / s.file);
    new_maps.emplace_back(target.dir / s.file);
    sum.full_bytes += new_maps.back().size();
  }
  for (const auto& f : target.other_files) sum.full_bytes += size_of(target.dir / f);

  std::vector<Job> jobs;
  for (std::size_t s = 0; s < target.shards.size(); ++s)
    for (const auto& t : target.shards[s].header.tensors) jobs.push_back({s, &t});
  // Largest first, so one big tensor does not finish alone at the end.
  std::stable_sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) { return a.tensor->nbytes() > b.tensor->nbytes(); });

  const fs::path tmp = temp_path_beside(out);
  if (!fs::create_directory(tmp, ec) || ec) fail(Exit::failure, tmp.string() + ": cannot create: " + ec.message());
  try {
    const int threads = default_threads(opts.threads);
    std::vector<Spool> spools(static_cast<std::size_t>(threads));
    std::vector<std::unique_ptr<Compressor>> comps(static_cast<std::size_t>(threads));
    std::vector<Entry> entries;
    std::mutex mu;
    parallel_for(jobs.size(), threads, [&](std::size_t j, std::size_t tid) {
      const Job& job = jobs[j];
      const TensorInfo& t = *job.tensor;
      const auto& hdr = target.shards[job.shard].header;
      const auto a = base_maps[job.shard].bytes(hdr.file_offset(t), t.nbytes());
      const auto b = new_maps[job.shard].bytes(hdr.file_offset(t), t.nbytes());
      const std::size_t es = dtype_size(t.dtype) ? dtype_size(t.dtype) : 1;
      const std::uint64_t elems = dtype_size(t.dtype) ? t.elements() : t.nbytes();
      if (std::memcmp(a.data(), b.data(), a.size()) == 0) {
        std::lock_guard<std::mutex> g(mu);
        sum.tensors += 1, sum.elements += elems, sum.tensor_bytes += t.nbytes();
        return;
      }
      const ChangeCount cc = count_changes(a, b, es);
      if (!comps[tid]) {
        comps[tid] = std::make_unique<Compressor>(opts.level);
        spools[tid].file = File(tmp / (".spool-" + std::to_string(tid)), File::Mode::create_exclusive);
      }
      Spool& sp = spools[tid];
      Entry e{t.name, job.shard, static_cast<int>(tid), sp.size, 0, xxh3_128(b), xxh3_128(a), Encoding::xor_bytes};
      const ByteSink sink = [&](std::span<const std::uint8_t> s) {
        sp.file.write_all(s.data(), s.size());
        sp.size += s.size();
      };
      auto encode = [&](Encoding enc) {
        switch (enc) {
          case Encoding::xor_bytes: return encode_xor(*comps[tid], a, b, sink);
          case Encoding::overwrite: return encode_overwrite(*comps[tid], a, b, cc.bytes, sink);
          case Encoding::sparse: return encode_sparse(*comps[tid], a, b, es, sink);
        }
        return std::uint64_t{0};
      };
      if (opts.encoding) {
        e.encoding = *opts.encoding;
        e.size = encode(e.encoding);
      } else {
        // Both candidates go to the spool; the index points at the smaller one,
        // so "auto" is never larger than xor for any tensor.
        const std::uint64_t sparse_at = sp.size, sparse_len = encode(Encoding::sparse);
        const std::uint64_t xor_at = sp.size, xor_len = encode(Encoding::xor_bytes);
        const bool sparse_wins = sparse_len <= xor_len;
        e.encoding = sparse_wins ? Encoding::sparse : Encoding::xor_bytes;
        e.offset = sparse_wins ? sparse_at : xor_at;
        e.size = sparse_wins ? sparse_len : xor_len;
      }
      std::lock_guard<std::mutex> g(mu);
      (e.encoding == Encoding::sparse ? sum.tensors_sparse : e.encoding == Encoding::xor_bytes ? sum.tensors_xor
                                                                                               : sum.tensors_overwrite) += 1;
      sum.tensors += 1, sum.elements += elems, sum.tensor_bytes += t.nbytes();
      sum.tensors_changed += 1, sum.elements_changed += cc.elements, sum.bytes_changed += cc.bytes;
      entries.push_back(std::move(e));
    });

    // Gather the frames into one delta file per changed weight file, entries
    // by name, so the output does not depend on thread scheduling.
    std::sort(entries.begin(), entries.end(), [](const Entry& x, const Entry& y) {
      return x.shard != y.shard ? x.shard < y.shard : x.name < y.name;
    });
    std::vector<std::pair<std::size_t, std::size_t>> groups;  // [begin, end) into entries
    for (std::size_t i = 0; i < entries.size();) {
      std::size_t k = i;
      while (k < entries.size() && entries[k].shard == entries[i].shard) ++k;
      groups.emplace_back(i, k);
      i = k;
    }
    DeltaIndex idx;
    idx.version = opts.version;
    idx.base_version = opts.base_version;
    idx.per_tensor = !opts.encoding;
    idx.encoding = opts.encoding.value_or(Encoding::xor_bytes);
    idx.files = files;
    std::uint64_t total = 0;
    char name[64];
    for (std::size_t g = 0; g < groups.size(); ++g) {
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", g, groups.size());
      std::vector<TensorInfo> infos;
      std::map<std::string, std::string> meta;
      std::uint64_t pos = 0;
      for (std::size_t i = groups[g].first; i < groups[g].second; ++i) {
        const Entry& e = entries[i];
        infos.push_back({e.name, "U8", {e.size}, pos, pos + e.size});
        pos += e.size;
        meta[e.name] = e.new_hash.hex();
        idx.weight_map[e.name] = name;
        idx.base_checksums[e.name] = e.base_hash;
        if (idx.per_tensor) idx.encodings[e.name] = e.encoding;
        total += e.size;
      }
      const std::string prefix = encode_safetensors_header(infos, &meta);
      File f(tmp / name, File::Mode::create_exclusive);
      f.pwrite_all(prefix.data(), prefix.size(), 0);
      std::uint64_t at = prefix.size();
      for (std::size_t i = groups[g].first; i < groups[g].second; ++i) {
        const Entry& e = entries[i];
        copy_range(spools[static_cast<std::size_t>(e.spool)].file, e.offset, e.size, f, at);
        at += e.size;
      }
      if (opts.sync) f.sync();
      f.close();
    }
    for (std::size_t t = 0; t < spools.size(); ++t)
      if (spools[t].file.fd() >= 0) {
        spools[t].file.close();
        fs::remove(tmp / (".spool-" + std::to_string(t)));
      }

    std::set<fs::path> dirs{tmp};
    for (const auto& fc : files) {
      if (fc.op != FileChange::Op::put) continue;
      const fs::path dst = tmp / kFilesDir / fc.path;
      fs::create_directories(dst.parent_path());
      for (fs::path d = dst.parent_path(); d != tmp; d = d.parent_path()) dirs.insert(d);
      copy_file_atomic(target.dir / fc.path, dst, opts.sync);
      sum.files_changed += 1;
    }
    for (const auto& fc : files) sum.files_removed += fc.op == FileChange::Op::remove;

    write_file_atomic(tmp / kIndexFile, write_delta_index_json(idx, total), opts.sync);
    if (opts.sync)
      for (const auto& d : dirs) sync_dir(d);

    for (fs::recursive_directory_iterator it(tmp), end; it != end; ++it)
      if (fs::is_regular_file(it->symlink_status())) sum.delta_bytes += size_of(it->path());

    // RENAME_NOREPLACE: publication never replaces a version someone else
    // published meanwhile, not even an empty directory.
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, out.c_str(), RENAME_NOREPLACE) != 0) {
      if (errno == EEXIST) fail(Exit::exists, out.string() + ": already exists; refusing to overwrite");
      fail(Exit::failure, out.string() + ": rename from " + tmp.filename().string() + ": " + std::strerror(errno));
    }
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  if (opts.sync) sync_dir(out.parent_path());

  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return sum;
}

}  // namespace hfdelta
