#include "hfdelta/diff.hpp"

#include <fcntl.h>
#include <stdio.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>

#include <boost/filesystem/operations.hpp>

#include "codec/codec_internal.hpp"
#include "delta/delta_writer.hpp"
#include "diff/base_check.hpp"
#include "diff/diff_engine.hpp"
#include "format/root_commit.hpp"
#include "hfdelta/checkpoint.hpp"
#include "hfdelta/delta_format.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/hash.hpp"
#include "hfdelta/progress.hpp"
#include "hfdelta/safetensors.hpp"
#include "hfdelta/version.hpp"
#include "util/io.hpp"
#include "util/parallel.hpp"
#include "util/scope_guard.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

namespace {

std::uint64_t size_of(const fs::path& p) {
  boost::system::error_code ec;
  const auto n = fs::file_size(p, ec);
  if (ec) fail(Exit::failure, p, ec.message());
  return n;
}

void advise_sequential(const File& f) { ::posix_fadvise(f.fd(), 0, 0, POSIX_FADV_SEQUENTIAL); }

}  // namespace

namespace {

// What plan_shards decides, as it goes.
struct ShardPlan {
  const Checkpoint& base;
  const Checkpoint& target;
  std::vector<Work>& works;
  std::vector<ShardOp> ops;
};

using GoneTensor = std::pair<std::string, TensorRef>;  // a base tensor NEW does not have

// Pairs tensor `t` of NEW's file `nfile` with its base bytes at `src` (none:
// zeros). Every tensor is hashed (a built file lists its tensors' checksums).
void add_work(ShardPlan& sp, std::size_t nfile, const TensorInfo& t, const TensorRef* src) {
  const auto& hdr = sp.target.shards[nfile].header;
  Work w = make_work(nfile, t);
  w.noff = hdr.file_offset(t);
  if (src) {
    w.bfile = src->shard;
    w.boff = sp.base.shards[src->shard].header.file_offset(sp.base.info(*src));
    w.from = &sp.base.info(*src).name;
  } else {
    w.fresh = true;
  }
  sp.works.push_back(std::move(w));
}

// NEW's file `s` patched in place, if BASE's file of that name has the same
// header or the same tensor byte ranges (then its header is rewritten).
bool plan_in_place(ShardPlan& sp, std::size_t s) {
  const Shard& ns = sp.target.shards[s];
  const Shard* bs = sp.base.find_shard(ns.file);
  if (!bs || (bs->header.header != ns.header.header && !same_tensor_ranges(bs->header, ns.header))) return false;
  const std::size_t b = static_cast<std::size_t>(bs - sp.base.shards.data());
  if (bs->header.header != ns.header.header) {
    ShardOp op;
    op.file = ns.file;
    op.op = ShardOp::Op::header;
    for (std::size_t i = 0; i < ns.header.tensors.size(); ++i)
      if (ns.header.tensors[i].name != bs->header.tensors[i].name)
        op.renamed[ns.header.tensors[i].name] = bs->header.tensors[i].name;
    sp.ops.push_back(std::move(op));
  }
  for (std::size_t i = 0; i < ns.header.tensors.size(); ++i) {
    const TensorRef ref{b, i};
    add_work(sp, s, ns.header.tensors[i], &ref);
  }
  return true;
}

// NEW's file `s` built: each tensor's source is decided here and below; the
// list is filled in from the works once their checksums are known.
void plan_build(ShardPlan& sp, std::size_t s) {
  const Shard& ns = sp.target.shards[s];
  ShardOp op;
  op.file = ns.file;
  op.op = ShardOp::Op::build;
  op.size = ns.header.file_size;
  op.replaces = sp.base.find_shard(ns.file) != nullptr;
  for (const auto& t : ns.header.tensors) {
    const auto b = sp.base.tensors.find(t.name);
    add_work(sp, s, t,
             b != sp.base.tensors.end() && sp.base.info(b->second).nbytes() == t.nbytes() ? &b->second : nullptr);
  }
  sp.ops.push_back(std::move(op));
}

void plan_removes(ShardPlan& sp) {
  for (const auto& bs : sp.base.shards)
    if (!sp.target.find_shard(bs.file)) {
      ShardOp op;
      op.file = bs.file;
      op.op = ShardOp::Op::remove;
      sp.ops.push_back(std::move(op));
    }
}

// Base tensors gone from NEW of the length of some new tensor without a source.
std::vector<GoneTensor> gone_tensors(const ShardPlan& sp) {
  std::set<std::uint64_t> new_lengths;
  for (const auto& w : sp.works)
    if (w.fresh && w.nbytes > 0) new_lengths.insert(w.nbytes);
  std::vector<GoneTensor> gone;
  for (const auto& [name, ref] : sp.base.tensors)
    if (!sp.target.tensors.count(name) && new_lengths.count(sp.base.info(ref).nbytes())) gone.emplace_back(name, ref);
  return gone;
}

// A vanished base tensor becomes the source of a new one.
void take_source(const Checkpoint& base, Work& w, const GoneTensor& g) {
  w.fresh = false;
  w.bfile = g.second.shard;
  w.boff = base.shards[g.second.shard].header.file_offset(base.info(g.second));
  w.from = &base.info(g.second).name;
}

// Renames and moves: new tensors without a source that have the bytes of a
// base tensor gone from NEW, of the same length. Only those candidates are
// read an extra time.
void pair_by_checksum(ShardPlan& sp, const std::vector<GoneTensor>& gone, const std::vector<File>& base_files,
                      const std::vector<File>& new_files, int threads) {
  const Checkpoint& base = sp.base;
  std::set<std::uint64_t> gone_lengths;
  for (const auto& g : gone) gone_lengths.insert(base.info(g.second).nbytes());
  std::vector<std::size_t> orphans;
  for (std::size_t i = 0; i < sp.works.size(); ++i)
    if (sp.works[i].fresh && gone_lengths.count(sp.works[i].nbytes)) orphans.push_back(i);
  if (orphans.empty()) return;
  std::vector<Hash128> orphan_hash(orphans.size()), gone_hash(gone.size());
  parallel_for(orphans.size() + gone.size(), threads, [&](std::size_t k, std::size_t) {
    std::vector<std::uint8_t> buf;
    if (k < orphans.size()) {
      const Work& w = sp.works[orphans[k]];
      orphan_hash[k] = hash_file_range(new_files[w.nfile], w.noff, w.nbytes, buf);
    } else {
      const TensorRef& r = gone[k - orphans.size()].second;
      gone_hash[k - orphans.size()] = hash_file_range(
          base_files[r.shard], base.shards[r.shard].header.file_offset(base.info(r)), base.info(r).nbytes(), buf);
    }
  });
  using Key = std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>;  // length, checksum
  std::map<Key, std::size_t> by_content;                                // first by name wins
  for (std::size_t g = 0; g < gone.size(); ++g)
    by_content.emplace(Key{base.info(gone[g].second).nbytes(), gone_hash[g].high, gone_hash[g].low}, g);
  for (std::size_t k = 0; k < orphans.size(); ++k) {
    Work& w = sp.works[orphans[k]];
    auto m = by_content.find(Key{w.nbytes, orphan_hash[k].high, orphan_hash[k].low});
    if (m != by_content.end()) take_source(base, w, gone[m->second]);
  }
}

// Renames whose bytes changed too: a new tensor and a vanished one that are
// the only ones of their dtype and shape are paired, so the entry carries
// their difference rather than every byte.
void pair_lone_renames(ShardPlan& sp, const std::vector<GoneTensor>& gone) {
  using Kind = std::pair<std::string, std::vector<std::uint64_t>>;
  std::map<Kind, std::vector<std::size_t>> new_of, gone_of;
  std::set<std::string> used;  // vanished tensors already taken by checksum
  for (std::size_t i = 0; i < sp.works.size(); ++i) {
    const Work& w = sp.works[i];
    if (w.fresh && w.nbytes > 0) new_of[{w.t->dtype, w.t->shape}].push_back(i);
    if (w.from) used.insert(*w.from);
  }
  for (std::size_t g = 0; g < gone.size(); ++g)
    if (!used.count(gone[g].first))
      gone_of[{sp.base.info(gone[g].second).dtype, sp.base.info(gone[g].second).shape}].push_back(g);
  for (const auto& [kind, ws] : new_of) {
    auto it = gone_of.find(kind);
    if (ws.size() == 1 && it != gone_of.end() && it->second.size() == 1)
      take_source(sp.base, sp.works[ws[0]], gone[it->second[0]]);
  }
}

}  // namespace

// Decides, per weight file of NEW, how it is reached from BASE, and pairs
// every tensor of NEW with its base bytes (the `works`):
// - a file of BASE with the same name and header bytes: patched in place,
//   tensor by tensor (no operation);
// - the same name, header length and tensor byte ranges: the header is
//   rewritten in place and each tensor paired with the one at its range;
// - otherwise the file is built: each tensor from the base tensor of the same
//   name and length, else from a base tensor that is gone from NEW and has
//   the same bytes (a rename or a move, found by checksum), else from zeros;
// and base files NEW does not have are removed.
static std::vector<ShardOp> plan_shards(const Checkpoint& base, const Checkpoint& target,
                                        const std::vector<File>& base_files, const std::vector<File>& new_files,
                                        int threads, std::vector<Work>& works) {
  ShardPlan sp{base, target, works, {}};
  for (std::size_t s = 0; s < target.shards.size(); ++s)
    if (!plan_in_place(sp, s)) plan_build(sp, s);
  plan_removes(sp);
  const std::vector<GoneTensor> gone = gone_tensors(sp);
  pair_by_checksum(sp, gone, base_files, new_files, threads);
  pair_lone_renames(sp, gone);
  std::sort(sp.ops.begin(), sp.ops.end(), [](const ShardOp& a, const ShardOp& b) { return a.file < b.file; });
  return std::move(sp.ops);
}

namespace {

// BASE and NEW must be saves: a delta version diffed as a checkpoint, or a
// directory without weight files (a save still being written, an unmounted
// share), would publish "remove every weight file" to every host.
Checkpoint open_input(const fs::path& dir, const char* role) {
  if (is_delta_dir(dir))
    throw Error(Exit::bad_input, std::string(role) + " " + dir.string() + ": is a delta version, not a checkpoint",
                dir.string());
  Checkpoint c = open_checkpoint(dir);
  if (c.shards.empty())
    throw Error(Exit::bad_input,
                std::string(role) + " " + dir.string() +
                    ": has no weight files (*.safetensors); not a checkpoint (a save still being written?)",
                dir.string());
  return c;
}

// One delta-diff: its inputs and what the passes make of them. Members but
// the options start empty ({}), so a context is made by naming its inputs.
struct DiffContext {
  const DiffOptions& opts;
  Checkpoint base{}, target{};
  DiffSummary sum{};
  std::vector<FileChange> files{};  // non-weight files
  std::vector<File> base_files{}, new_files{};
  std::vector<MappedFile> base_maps{}, new_maps{};  // the whole-tensor encodings only
  std::vector<Source> base_srcs{}, new_srcs{};
  std::vector<Work> works{};
  std::vector<ShardOp> shard_ops{};
  std::unique_ptr<Encoder> encoder{};
};

// Non-weight files: whatever differs travels whole, whatever vanished is removed.
std::vector<FileChange> file_changes(const Checkpoint& base, const Checkpoint& target) {
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
  return files;
}

void open_weight_files(DiffContext& ctx) {
  for (const auto& sh : ctx.base.shards) {
    ctx.base_files.emplace_back(ctx.base.dir / sh.file, File::Mode::read);
    advise_sequential(ctx.base_files.back());
  }
  for (const auto& sh : ctx.target.shards) {
    ctx.new_files.emplace_back(ctx.target.dir / sh.file, File::Mode::read);
    advise_sequential(ctx.new_files.back());
    ctx.sum.full_bytes += ctx.new_files.back().size();
  }
  for (const auto& f : ctx.target.other_files) ctx.sum.full_bytes += size_of(ctx.target.dir / f);
}

void plan_tensors(DiffContext& ctx) {
  ctx.shard_ops =
      plan_shards(ctx.base, ctx.target, ctx.base_files, ctx.new_files, default_threads(ctx.opts.threads), ctx.works);
  for (const auto& op : ctx.shard_ops)
    (op.op == ShardOp::Op::remove   ? ctx.sum.shards_removed
     : op.op == ShardOp::Op::header ? ctx.sum.shards_rewritten
                                    : ctx.sum.shards_built) += 1;
}

// Each work's sources: the weight files, read in blocks (sparse, context,
// auto) or through their mappings (the slime encodings' whole-tensor frames).
void bind_sources(DiffContext& ctx) {
  const bool frames = ctx.opts.encoding && !chunked(*ctx.opts.encoding);
  for (const auto& f : ctx.base_files) ctx.base_srcs.push_back({&f});
  for (const auto& f : ctx.new_files) ctx.new_srcs.push_back({&f});
  if (frames) {
    for (std::size_t i = 0; i < ctx.base_files.size(); ++i) ctx.base_maps.emplace_back(ctx.base_files[i].path());
    for (std::size_t i = 0; i < ctx.new_files.size(); ++i) ctx.new_maps.emplace_back(ctx.new_files[i].path());
    for (std::size_t i = 0; i < ctx.base_srcs.size(); ++i) ctx.base_srcs[i].map = &ctx.base_maps[i];
    for (std::size_t i = 0; i < ctx.new_srcs.size(); ++i) ctx.new_srcs[i].map = &ctx.new_maps[i];
  }
  for (Work& w : ctx.works) {
    w.nsrc = &ctx.new_srcs[w.nfile];
    if (!w.fresh) w.bsrc = &ctx.base_srcs[w.bfile];
  }
}

void encode_tensors(DiffContext& ctx, const fs::path& tmp) {
  bind_sources(ctx);
  std::uint64_t total = 0;
  for (const Work& w : ctx.works) total += w.nbytes;
  progress::begin("diff", total);
  ctx.encoder = std::make_unique<Encoder>(tmp, ctx.opts.encoding, ctx.opts.level, ctx.opts.threads);
  std::vector<Work*> all;
  for (Work& w : ctx.works) all.push_back(&w);
  ctx.encoder->encode(all);
}

// The changed tensors, as the delta's entries (`of`: their works), counted
// into the summary with the rest.
std::vector<NewDeltaEntry> entries_of(DiffContext& ctx, std::vector<const Work*>& of) {
  DiffSummary& sum = ctx.sum;
  std::vector<NewDeltaEntry> entries;
  for (const Work& w : ctx.works) {
    const std::uint64_t elems = w.t->counted_elements();
    sum.tensors += 1, sum.elements += elems, sum.tensor_bytes += w.nbytes;
    sum.tensors_new += w.fresh;
    if (!w.changed()) continue;
    entries.push_back({w.t->name, ctx.target.shards[w.nfile].file, ctx.encoder->entry_size(w), w.new_hash,
                       w.fresh ? std::nullopt : std::optional<Hash128>(w.base_hash), w.encoding});
    of.push_back(&w);
    sum.count_entry(w.encoding);
    sum.tensors_changed += 1, sum.elements_changed += w.elements_changed, sum.bytes_changed += w.bytes_changed;
  }
  return entries;
}

DeltaIndex index_of(const DiffContext& ctx) {
  DeltaIndex idx;
  idx.version = ctx.opts.version;
  idx.base_version = ctx.opts.base_version;
  // A structural delta records every entry's encoding (new tensors are
  // always xor against zeros), which also makes readers of the plain
  // layout refuse it instead of patching tensors by name.
  idx.per_tensor = !ctx.opts.encoding || !ctx.shard_ops.empty();
  idx.encoding = ctx.opts.encoding.value_or(Encoding::xor_bytes);
  idx.files = ctx.files;
  idx.shards = ctx.shard_ops;
  return idx;
}

// The new headers of rewritten and built weight files, into the delta and
// (their checksums, a built file's tensors) into its index.
void place_headers(const DiffContext& ctx, DeltaIndex& idx, DeltaWriter& out) {
  std::map<std::string, const Work*> work_of;
  for (const Work& w : ctx.works) work_of[w.t->name] = &w;
  for (ShardOp& op : idx.shards) {
    if (op.op == ShardOp::Op::remove) continue;
    const std::string prefix = ctx.target.find_shard(op.file)->header.prefix();
    op.header_size = prefix.size();
    op.header_hash = xxh3_128({reinterpret_cast<const std::uint8_t*>(prefix.data()), prefix.size()});
    if (op.op == ShardOp::Op::header) {
      const std::string old = ctx.base.find_shard(op.file)->header.prefix();
      op.base_header_hash = xxh3_128({reinterpret_cast<const std::uint8_t*>(old.data()), old.size()});
    }
    for (const TensorInfo& t : ctx.target.find_shard(op.file)->header.tensors) {
      const Work& w = *work_of.at(t.name);
      op.tensors.push_back({t.name, w.fresh ? std::nullopt : std::optional<std::string>(*w.from), w.new_hash});
    }
    out.put_header(op.file, prefix);
  }
}

// BASE holds the bytes of the root's version it is the base of (see
// DiffOptions::root), from the checksums the encoder took of it.
void check_base(const DiffContext& ctx) {
  if (ctx.opts.root.empty() || !exists_nofollow(ctx.opts.root / version_dirname(ctx.opts.base_version))) return;
  const VersionBytes want = recorded_bytes(ctx.opts.root, ctx.opts.base_version);
  std::map<std::string, Hash128> hashed;
  for (const Work& w : ctx.works)
    if (!w.fresh && w.base_hashed) hashed.emplace(*w.from, w.base_hash);
  check_holds(
      ctx.base, "BASE", want,
      [&](const std::string& t) -> std::optional<Hash128> {
        const auto it = hashed.find(t);
        if (it == hashed.end()) return std::nullopt;
        return it->second;
      },
      default_threads(ctx.opts.threads));
}

// Encodes the tensors and writes the delta into `out`'s temporary directory.
void write_delta(DiffContext& ctx, DeltaWriter& out) {
  encode_tensors(ctx, out.tmp);
  std::vector<const Work*> of;
  const std::vector<NewDeltaEntry> entries = entries_of(ctx, of);
  DeltaIndex idx = index_of(ctx);
  idx.elements = DeltaIndex::Elements{ctx.sum.elements, ctx.sum.elements_changed};  // counted by entries_of
  place_headers(ctx, idx, out);
  // One delta file per changed weight file, entries by name, so the output
  // does not depend on thread scheduling.
  out.write_entries(idx, entries,
                    [&](std::size_t i, File& f, std::uint64_t at) { ctx.encoder->write_entry(*of[i], f, at); });
  ctx.encoder->close();
  for (const auto& fc : ctx.files) {
    if (fc.op != FileChange::Op::put) continue;
    out.copy_file(fc.path, ctx.target.dir / fc.path);
    ctx.sum.files_changed += 1;
  }
  for (const auto& fc : ctx.files) ctx.sum.files_removed += fc.op == FileChange::Op::remove;
  check_base(ctx);
  ctx.sum.delta_bytes = out.publish(idx);
}

}  // namespace

DiffSummary diff_checkpoints(const fs::path& base_dir, const fs::path& new_dir, const fs::path& out_arg,
                             const DiffOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path out = fs::absolute(out_arg);
  check_delta_out(out);
  check_out_apart(out, {{"BASE", base_dir}, {"NEW", new_dir}});
  PublishExpectation expect;
  if (!opts.root.empty() && opts.root_checks) expect = {opts.root, opts.version, opts.base_version};
  check_publishable(expect, false);
  DiffContext ctx{.opts = opts, .base = open_input(base_dir, "BASE"), .target = open_input(new_dir, "NEW")};
  ctx.sum.version = opts.version;
  ctx.sum.base_version = opts.base_version;
  ctx.files = file_changes(ctx.base, ctx.target);
  open_weight_files(ctx);
  plan_tensors(ctx);
  DeltaWriter writer(out, opts.sync);
  writer.expect = expect;
  {
    const OnFailure abandon([&] {
      ctx.encoder.reset();  // the spools closed before their directory goes
      writer.abandon();
    });
    write_delta(ctx, writer);
  }
  ctx.sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return ctx.sum;
}

std::vector<std::string> diff_warnings(const DiffSummary& s) {
  std::vector<std::string> w;
  if (2 * s.elements_changed > s.elements)
    w.push_back(std::to_string(s.elements_changed) + " of " + std::to_string(s.elements) +
                " elements changed (more than half); are BASE and NEW successive saves of the same model?");
  if (s.delta_bytes > s.tensor_bytes)
    w.push_back("the delta (" + std::to_string(s.delta_bytes) + " bytes) is larger than NEW's weights (" +
                std::to_string(s.tensor_bytes) + " bytes); are BASE and NEW successive saves of the same model?");
  return w;
}

}  // namespace hfdelta
