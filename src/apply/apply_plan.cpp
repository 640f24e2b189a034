// plan_apply: a flat list of named passes over one planning context, each
// reading the opened delta and LOCAL's survey and filling the plan.
#include "apply/apply_plan.hpp"

#include <algorithm>
#include <cstring>
#include <set>

#include <boost/filesystem/operations.hpp>

#include "codec/codec_internal.hpp"
#include "delta/delta_format_internal.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/safetensors.hpp"
#include "hfdelta/version.hpp"
#include "store/local_store.hpp"
#include "util/parallel.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

LocalView::Kind LocalView::kind(const std::string& path) const {
  auto it = named.find(path);
  return it == named.end() ? Kind::none : it->second;
}

namespace {

LocalView::Kind kind_of(const fs::path& p) {
  boost::system::error_code ec;
  const fs::file_status st = fs::symlink_status(p, ec);
  if (ec || !fs::exists(st)) return LocalView::Kind::none;
  return fs::is_regular_file(st) ? LocalView::Kind::regular : LocalView::Kind::other;
}

}  // namespace

LocalView survey_local(const fs::path& local, std::uint64_t version, const OpenDelta& d) {
  refuse_local_symlinks(local);  // nothing is patched, replaced or removed through a link
  LocalView lv;
  lv.dir = local;
  lv.version = version;
  lv.checkpoint = open_checkpoint(local);
  for (const FileChange& fc : d.index.files) lv.named[fc.path] = kind_of(local / fc.path);
  for (const ShardOp& so : d.index.shards) lv.named[so.file] = kind_of(local / so.file);
  for (const Shard& s : lv.checkpoint.shards) {
    boost::system::error_code ec;
    const std::uint64_t n = fs::hard_link_count(local / s.file, ec);
    if (!ec && n > 1) lv.hard_links[s.file] = n;
  }
  return lv;
}

namespace {

// Where a tensor patched in place lies in LOCAL.
struct Loc {
  std::uint32_t slot;
  std::uint64_t offset, nbytes;
};

struct PlanContext {
  PlanContext(const OpenDelta& od, const LocalView& view, ApplyPlan& out)
      : d(od), idx(od.index), lv(view), lc(view.checkpoint), plan(out), iw(od.index_path()) {}
  const OpenDelta& d;
  const DeltaIndex& idx;
  const LocalView& lv;
  const Checkpoint& lc;
  ApplyPlan& plan;
  std::string iw;  // the delta's index, for messages
  std::string nothing = "; LOCAL is not this delta's base, nothing was changed";
  std::vector<std::uint32_t> slot;   // LOCAL weight file -> manifest slot (~0u: not in place)
  std::map<std::string, Loc> where;  // tensors patched in place, by their name in the target
  std::map<std::string, std::pair<std::size_t, std::size_t>> built;  // tensor -> (build, its tensor)

  std::string local_path(const std::string& rel) const { return (lv.dir / rel).string(); }
};

// A file hard-linked elsewhere (cp -al from a base checkpoint) is not
// LOCAL's own: patched in place, every linked copy would change too.
void refuse_hard_linked(const PlanContext& ctx, const std::string& file) {
  auto it = ctx.lv.hard_links.find(file);
  if (it == ctx.lv.hard_links.end()) return;
  fail(Exit::bad_input, ctx.local_path(file),
       "has " + std::to_string(it->second) +
           " hard links (made with cp -al or ln?); patching it in place would change every linked "
           "copy too; nothing was changed. Give LOCAL its own copy: delta-apply --init SRC LOCAL "
           "copies such files, or cp --remove-destination");
}

// Weight files that keep their place get a slot in the manifest; their
// tensors, unless their header is rewritten, are where LOCAL has them.
void plan_slots(PlanContext& ctx) {
  ApplyPlan& p = ctx.plan;
  ctx.slot.assign(ctx.lc.shards.size(), ~0u);
  for (std::size_t s = 0; s < ctx.lc.shards.size(); ++s) {
    const ShardOp* so = shard_op(ctx.idx, ctx.lc.shards[s].file);
    if (so && so->op != ShardOp::Op::header) continue;
    ctx.slot[s] = static_cast<std::uint32_t>(p.manifest.shards.size());
    p.manifest.shards.push_back(ctx.lc.shards[s].file);
    refuse_hard_linked(ctx, ctx.lc.shards[s].file);  // patched in place: must be LOCAL's own
  }
  for (const auto& [name, ref] : ctx.lc.tensors)
    if (ctx.slot[ref.shard] != ~0u && !shard_op(ctx.idx, ctx.lc.shards[ref.shard].file))
      ctx.where[name] = {ctx.slot[ref.shard], ctx.lc.shards[ref.shard].header.file_offset(ctx.lc.info(ref)),
                         ctx.lc.info(ref).nbytes()};
}

// A "header" operation: the new header laid over the old one in place (same
// length, same tensor ranges), its tensors found under their new names.
void plan_header_rewrite(PlanContext& ctx, const ShardOp& so, const Shard& ls) {
  const std::string hp = (ctx.d.dir / kHeadersDir / so.file).string();
  const std::string_view hb = ctx.d.new_header(so.file);
  const SafetensorsHeader nh = parse_safetensors(hb, ls.header.file_size, hp);
  if (nh.data_start() != hb.size() || !same_tensor_ranges(nh, ls.header))
    fail(Exit::bad_input, hp,
         "a header rewritten in place must keep the length and tensor byte ranges of " + ctx.local_path(so.file));
  const std::uint32_t sl = ctx.slot[static_cast<std::size_t>(&ls - ctx.lc.shards.data())];
  for (const auto& t : nh.tensors) ctx.where[t.name] = {sl, nh.file_offset(t), t.nbytes()};
  auto& renames = ctx.plan.renames[so.file];
  for (std::size_t i = 0; i < nh.tensors.size(); ++i)
    renames.emplace_back(nh.tensors[i].name, ls.header.tensors[i].name);
  Patch p;
  p.tensor = "(header)";
  p.delta_file = p.delta_path = hp;
  p.new_hash = so.header_hash;
  p.base_hash = so.base_header_hash;
  p.local_shard = sl;
  p.offset = 0;
  p.nbytes = hb.size();
  p.replace = {reinterpret_cast<const std::uint8_t*>(hb.data()), hb.size()};
  ctx.plan.patches.push_back(std::move(p));
}

// A "build" operation: the file built beside LOCAL from its new header,
// LOCAL's base tensors and zeros.
void plan_build(PlanContext& ctx, const ShardOp& so, const std::string& what) {
  const std::string hp = (ctx.d.dir / kHeadersDir / so.file).string();
  const std::string_view hb = ctx.d.new_header(so.file);
  const SafetensorsHeader nh = parse_built_header(hb, so, hp);
  Build bd;
  bd.file = so.file;
  bd.size = so.size;
  bd.prefix = {reinterpret_cast<const std::uint8_t*>(hb.data()), hb.size()};
  for (std::size_t i = 0; i < nh.tensors.size(); ++i) {
    const TensorInfo& t = nh.tensors[i];
    const ShardOp::Tensor& st = so.tensors[i];
    BuildTensor bt;
    bt.name = t.name;
    bt.dst = nh.file_offset(t);
    bt.nbytes = t.nbytes();
    bt.hash = st.hash;
    if (st.from) {
      auto it = ctx.lc.tensors.find(*st.from);
      if (it == ctx.lc.tensors.end() || ctx.lc.info(it->second).nbytes() != t.nbytes())
        fail(Exit::verify_failed, what + ": tensor '" + t.name + "' is built from '" + *st.from + "' of " +
                                      std::to_string(t.nbytes()) + " bytes, which " + ctx.lv.dir.string() +
                                      " does not have" + ctx.nothing);
      bt.src =
          std::make_pair(it->second.shard, ctx.lc.shards[it->second.shard].header.file_offset(ctx.lc.info(it->second)));
    }
    ctx.built[t.name] = {ctx.plan.builds.size(), bd.tensors.size()};
    bd.tensors.push_back(std::move(bt));
  }
  ctx.plan.builds.push_back(std::move(bd));
}

void plan_shard_ops(PlanContext& ctx) {
  for (const ShardOp& so : ctx.idx.shards) {
    const std::string what = ctx.iw + ": hfdelta_shards \"" + so.file + "\"";
    const Shard* ls = ctx.lc.find_shard(so.file);
    const char* verb = so.op == ShardOp::Op::remove   ? " removes a weight file "
                       : so.op == ShardOp::Op::header ? " rewrites the header of a weight file "
                                                      : nullptr;
    // Its errors are about the index, unless they name another file.
    about_file(ctx.iw, [&] {
      if (verb && !ls) fail(Exit::verify_failed, what + verb + ctx.lv.dir.string() + " does not have" + ctx.nothing);
      if (so.op == ShardOp::Op::header)
        plan_header_rewrite(ctx, so, *ls);
      else if (so.op == ShardOp::Op::build)
        plan_build(ctx, so, what);
    });
  }
}

// An entry holding a parts entry (itself one, or a stacked layer).
bool parted(const Patch& p) {
  return p.parts || std::any_of(p.layer_parts.begin(), p.layer_parts.end(), [](const auto& s) { return s != nullptr; });
}

Patch patch_of(const OpenDelta& d, const DeltaEntry& e) {
  Patch p;
  p.tensor = e.tensor();
  p.delta_file = p.delta_path = d.path_of(e);
  p.frame = e.frame;
  p.encoding = e.encoding;
  p.new_hash = e.new_hash;
  p.adler32 = e.adler32;
  p.base_hash = e.base_hash;
  p.layers = e.layers;
  p.layer_parts = e.layer_parts;
  p.parts = e.parts;
  if (!new_bytes_of(e).whole) p.computed = std::make_shared<Hash128>();
  return p;
}

// Every entry becomes a patch of a tensor in place or of a built file's.
void plan_entries(PlanContext& ctx) {
  for (const DeltaEntry& e : ctx.d.entries) {
    const auto target = ctx.idx.targets.find(*e.file);
    Patch p = patch_of(ctx.d, e);
    auto check_target = [&](const std::string& in) {
      if (target != ctx.idx.targets.end() && target->second != in)
        fail(Exit::bad_input, p.delta_file,
             "entry '" + p.tensor + "' patches " + in + ", but hfdelta_targets names " + target->second);
    };
    if (auto bi = ctx.built.find(p.tensor); bi != ctx.built.end()) {
      Build& bd = ctx.plan.builds[bi->second.first];
      BuildTensor& bt = bd.tensors[bi->second.second];  // its checksum checked by open_delta
      if (parted(p))
        fail(Exit::bad_input, p.delta_file,
             "entry '" + p.tensor +
                 "' holds a parts entry, for a tensor in a weight file the delta builds; parts "
                 "entries patch tensors in place only");
      if (!bt.src) p.base_hash.reset();  // its base is zeros
      check_target(bd.file);
      p.offset = bt.dst;
      p.nbytes = bt.nbytes;
      bt.entry = ctx.plan.build_patches.size();
      ctx.plan.build_patches.push_back(std::move(p));
      continue;
    }
    auto lt = ctx.where.find(p.tensor);
    if (lt == ctx.where.end())
      fail(Exit::bad_input, p.delta_file, "tensor '" + p.tensor + "' does not exist in " + ctx.lv.dir.string());
    check_target(ctx.plan.manifest.shards[lt->second.slot]);
    p.local_shard = lt->second.slot;
    p.offset = lt->second.offset;
    p.nbytes = lt->second.nbytes;
    std::vector<const PartsEntry*> heads{p.parts.get()};
    for (const auto& sp : p.layer_parts) heads.push_back(sp.get());
    for (const PartsEntry* pe : heads)
      if (pe && pe->m.bytes() != p.nbytes)
        fail(Exit::verify_failed, p.delta_file,
             "entry '" + p.tensor + "' has parts of a " + std::to_string(pe->m.rows) + " x " +
                 std::to_string(pe->m.cols) + " matrix of " + std::to_string(pe->m.es) +
                 "-byte elements, but the tensor in " + ctx.lv.dir.string() + " has " + std::to_string(p.nbytes) +
                 " bytes; LOCAL is not this delta's base" + ctx.nothing);
    ctx.plan.patches.push_back(std::move(p));
  }
}

// Weight files that stay weight files after the delta.
std::set<std::string> weight_files_after(const PlanContext& ctx) {
  std::set<std::string> out;
  for (const auto& s : ctx.lc.shards) {
    const ShardOp* so = shard_op(ctx.idx, s.file);
    if (!so || so->op != ShardOp::Op::remove) out.insert(s.file);
  }
  for (const auto& so : ctx.idx.shards)
    if (so.op != ShardOp::Op::remove) out.insert(so.file);
  return out;
}

// Whole-file operations: hfdelta_files first (manifest.files[k] is
// idx.files[k], for the staging of carried files), then the builds' puts,
// then the removals of weight files.
void plan_file_ops(PlanContext& ctx) {
  Manifest& m = ctx.plan.manifest;
  const std::set<std::string> weights = weight_files_after(ctx);
  for (const auto& fc : ctx.idx.files) {
    const bool put = fc.op == FileChange::Op::put;
    const ShardOp* so = shard_op(ctx.idx, fc.path);
    // A file that stops or starts being a weight file (a build or removal of
    // the same name) is moved aside by the shard operation.
    const bool swap = so && (so->op == ShardOp::Op::remove ? put : so->op == ShardOp::Op::build && !put);
    // What the delta itself names as a weight file was refused by
    // open_delta; a weight file of LOCAL it treats as a plain file means
    // LOCAL is not its base.
    if (weights.count(fc.path) && !swap)
      fail(Exit::verify_failed, ctx.iw,
           std::string("hfdelta_files ") + (put ? "replaces" : "removes") + " " + ctx.local_path(fc.path) +
               " as a plain file, but it is a weight file there" + ctx.nothing);
    const LocalView::Kind k = ctx.lv.kind(fc.path);
    m.files.push_back({fc.path, put ? TxnFile::Op::put : TxnFile::Op::remove,
                       put ? k == LocalView::Kind::regular : k != LocalView::Kind::none && !swap});
  }
  for (Build& bd : ctx.plan.builds) {
    bd.mfile = m.files.size();
    m.files.push_back({bd.file, TxnFile::Op::put, ctx.lv.kind(bd.file) == LocalView::Kind::regular});
  }
  for (const ShardOp& so : ctx.idx.shards) {
    if (so.op != ShardOp::Op::remove) continue;
    bool put = false;
    for (const auto& fc : ctx.idx.files) put = put || (fc.path == so.file && fc.op == FileChange::Op::put);
    if (!put) m.files.push_back({so.file, TxnFile::Op::remove, true});
  }
}

// Chunks of a sparse or context entry that can be cut into ranges (of
// p.chunk_bytes): 0 where it cannot. Both heads hold the element size at
// byte 4, and both encodings chunk alike.
std::uint64_t entry_chunks(Patch& p) {
  static_assert(kContextHeadSize >= kSparseHeadSize);
  if (!p.replace.empty() || p.adler32 || !chunked(p.encoding) || p.frame.size() < kSparseHeadSize) return 0;
  std::uint32_t es = 0;
  std::memcpy(&es, p.frame.data() + 4, 4);  // checked again by the decoder
  if (es != sparse_elem_size(es, p.nbytes)) return 0;
  p.chunk_bytes = kSparseChunkElements * es;
  return sparse_chunk_count(p.nbytes, es);
}

// The patches as units of parallel work, largest first; a split entry's
// checksums (which run front to back) get passes of their own.
void plan_units(ApplyPlan& plan, int threads) {
  std::uint64_t total = 0;
  for (const Patch& p : plan.patches) total += p.nbytes;
  for (std::size_t i = 0; i < plan.patches.size(); ++i) {
    Patch& p = plan.patches[i];
    const std::uint64_t chunks = entry_chunks(p);
    const std::vector<ChunkRange> ranges = split_chunk_ranges(p.nbytes, chunks, p.chunk_bytes, total, threads);
    if (ranges.empty()) {
      plan.units.push_back({i, 0, 0, p.nbytes});
      continue;
    }
    p.split = true;
    plan.split.push_back(i);
    for (const ChunkRange& r : ranges) plan.units.push_back({i, r.c0, r.c1, r.bytes});
  }
  std::stable_sort(plan.units.begin(), plan.units.end(),
                   [](const PatchUnit& a, const PatchUnit& b) { return a.bytes > b.bytes; });
}

}  // namespace

ApplyPlan plan_apply(const OpenDelta& d, const LocalView& lv, int threads) {
  ApplyPlan plan;
  plan.manifest.base = lv.version;
  plan.manifest.version = d.index.version;
  PlanContext ctx(d, lv, plan);
  for (const Shard& s : lv.checkpoint.shards) plan.sources.push_back(s.file);
  plan_slots(ctx);
  plan_shard_ops(ctx);
  plan_entries(ctx);
  plan_file_ops(ctx);
  plan_units(plan, threads);
  for (const auto* ps : {&plan.patches, &plan.build_patches})
    for (const Patch& p : *ps) plan.tensors_patched += p.replace.empty(), plan.delta_bytes += p.frame.size();
  return plan;
}

ChecksumRecord next_record(ChecksumRecord rec, const DeltaIndex& idx, const ApplyPlan& plan) {
  for (const ShardOp& so : idx.shards) {
    if (so.op == ShardOp::Op::remove) {
      rec.weights.erase(so.file);
    } else if (so.op == ShardOp::Op::build) {
      WeightRecord& w = rec.weights[so.file];
      w = {so.size, so.header_hash, {}};
      for (const auto& t : so.tensors) w.tensors[t.name] = t.hash;
      rec.files.erase(so.file);
    } else {
      // Same ranges: each tensor keeps the checksum of the one it replaces
      // (its entry, if any, is laid over below).
      WeightRecord& w = rec.weights[so.file];
      std::map<std::string, Hash128> tensors;
      for (const auto& [now, was] : plan.renames.at(so.file))
        if (auto it = w.tensors.find(was); it != w.tensors.end()) tensors[now] = it->second;
      w.tensors = std::move(tensors);
      w.header = so.header_hash;
    }
  }
  for (const Patch& p : plan.patches)
    if (p.replace.empty())
      rec.weights[plan.manifest.shards[p.local_shard]].tensors[p.tensor] = p.computed ? *p.computed : p.new_hash;
  for (const FileChange& fc : idx.files) {
    if (fc.op == FileChange::Op::put)
      rec.files[fc.path] = {fc.size, fc.hash}, rec.weights.erase(fc.path);
    else
      rec.files.erase(fc.path);
  }
  return rec;
}

}  // namespace hfdelta
