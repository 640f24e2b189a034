// Executing an apply plan: stage what is built or carried beside LOCAL,
// then patch LOCAL (journaled first, or in one pass), then record the new
// version's checksums. Every write happens inside a transaction step.
#include <map>
#include <memory>
#include <mutex>

#include <boost/filesystem/operations.hpp>

#include "apply/apply_internal.hpp"
#include "apply/apply_patch.hpp"
#include "apply/phase_clock.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/progress.hpp"
#include "hfdelta/version.hpp"
#include "store/checksum_record.hpp"
#include "store/local_store.hpp"
#include "util/parallel.hpp"
#include "util/scope_guard.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

namespace {

struct ExecuteContext {
  Txn& txn;
  const OpenDelta& d;
  ApplyPlan& plan;
  const fs::path& local;
  const ApplyOptions& opts;
  int threads = 1;
  std::vector<File> files;  // LOCAL's weight files patched in place, by manifest slot
  fs::path step;

  std::string shard_path(std::uint32_t slot) const { return (local / plan.manifest.shards[slot]).string(); }
  std::uint64_t version() const { return d.index.version; }
};

using Writers = std::vector<std::unique_ptr<JournalWriter>>;
using Buffers = std::vector<std::vector<std::uint8_t>>;

// A split entry's base is checked before anything is written (its pieces
// are patched apart, so no single pass sees the whole tensor).
void check_split_bases(ExecuteContext& ctx) {
  parallel_for(ctx.plan.split.size(), ctx.threads, [&](std::size_t k, std::size_t) {
    const Patch& p = ctx.plan.patches[ctx.plan.split[k]];
    if (!p.base_hash) return;
    std::vector<std::uint8_t> buf;
    const Hash128 h = hash_file_range(ctx.files[p.local_shard], p.offset, p.nbytes, buf);
    if (h != *p.base_hash)
      fail(Exit::verify_failed, ctx.shard_path(p.local_shard) + ": tensor '" + p.tensor +
                                    "' is not the base of delta " + format_version(ctx.version()) + " (checksum " +
                                    h.hex() + ", the delta expects " + p.base_hash->hex() + "); nothing was changed");
  });
}

// ... and what was written is read back and checked before the version is recorded.
void check_split_results(ExecuteContext& ctx) {
  std::mutex mu;
  std::vector<std::string> bad;
  parallel_for(ctx.plan.split.size(), ctx.threads, [&](std::size_t k, std::size_t) {
    const Patch& p = ctx.plan.patches[ctx.plan.split[k]];
    std::vector<std::uint8_t> buf;
    const Hash128 h = hash_file_range(ctx.files[p.local_shard], p.offset, p.nbytes, buf);
    std::lock_guard<std::mutex> g(mu);
    if (h != p.new_hash)
      bad.push_back("tensor '" + p.tensor + "' in " + ctx.shard_path(p.local_shard) + " reads back with checksum " +
                    h.hex() + ", the delta records " + p.new_hash.hex());
  });
  if (bad.empty()) return;
  std::string msg = "verification failed after applying " + ctx.d.dir.string() + "; LOCAL was rolled back:";
  for (const auto& b : bad) msg += "\n  " + b;
  fail(Exit::verify_failed, msg);
}

fs::path stage_path(const ExecuteContext& ctx, std::size_t mfile) {
  const fs::path staged = txn_stage(ctx.step, mfile);
  boost::system::error_code ec;
  fs::create_directories(staged.parent_path(), ec);
  if (ec) fail(Exit::failure, staged.parent_path(), "cannot create: " + ec.message());
  return staged;
}

// One weight file built beside LOCAL from LOCAL's base bytes (unchanged
// until the swap) and the delta: checked tensor by tensor as it is written.
void build_file(const ExecuteContext& ctx, const Build& bd, const std::vector<File>& src) {
  const std::string name = (ctx.local / bd.file).string();  // the file built beside LOCAL's
  File out(stage_path(ctx, bd.mfile), File::Mode::create_exclusive);
  out.pwrite_all(bd.prefix.data(), bd.prefix.size(), 0);
  out.truncate(bd.size);  // tensors without base bytes start as zeros
  std::vector<std::uint8_t> buf;
  for (const BuildTensor& t : bd.tensors) {
    if (t.src) copy_range(src[t.src->first], t.src->second, t.nbytes, out, t.dst);
    if (t.entry) {
      const Patch& p = ctx.plan.build_patches[*t.entry];
      if (!p.layers.empty())
        lay_stack(p, out, {}, buf, name, ctx.version());  // parts layers: refused by the plan here
      else
        journal_patch(p, out, nullptr, buf, name, ctx.version(), &out);
      continue;
    }
    const Hash128 h = hash_file_range(out, t.dst, t.nbytes, buf);
    if (h != t.hash)
      fail(Exit::verify_failed, name,
           "tensor '" + t.name + "' has checksum " + h.hex() + " when built, the delta records " + t.hash.hex() +
               "; LOCAL is not this delta's base, nothing was changed");
  }
  if (ctx.opts.sync) out.sync();
  out.close();
}

// The new contents of whole files, staged inside the step: files the delta
// carries (manifest.files[k] is index.files[k]) and weight files built anew.
void stage_files(ExecuteContext& ctx) {
  const DeltaIndex& idx = ctx.d.index;
  for (std::size_t k = 0; k < idx.files.size(); ++k) {
    const FileChange& fc = idx.files[k];
    if (fc.op == FileChange::Op::put)
      copy_file_atomic(ctx.d.dir / kFilesDir / fc.path, stage_path(ctx, k), ctx.opts.sync);
  }
  if (ctx.plan.builds.empty()) return;
  std::vector<File> src;
  for (const auto& f : ctx.plan.sources) src.emplace_back(ctx.local / f, File::Mode::read);
  parallel_for(ctx.plan.builds.size(), ctx.threads,
               [&](std::size_t k, std::size_t) { build_file(ctx, ctx.plan.builds[k], src); });
}

void run_unit(ExecuteContext& ctx, const PatchUnit& u, JournalWriter& jw, std::vector<std::uint8_t>& buf, bool write) {
  const Patch& p = ctx.plan.patches[u.patch];
  File* out = write ? &ctx.files[p.local_shard] : nullptr;
  if (p.split)
    journal_range(p, u.c0, u.c1, ctx.files[p.local_shard], jw, buf, out);
  else if (p.parts || !p.layers.empty())
    journal_copy(p, ctx.files[p.local_shard], ctx.step / ((p.parts ? "parts-" : "stack-") + std::to_string(u.patch)),
                 &jw, buf, ctx.shard_path(p.local_shard), ctx.version(), out);
  else
    journal_patch(p, ctx.files[p.local_shard], &jw, buf, ctx.shard_path(p.local_shard), ctx.version(), out);
}

// Every unit decoded against LOCAL in parallel, its changes journaled by the
// worker's own journal part (and with `write`, written as it goes).
void journal_units(ExecuteContext& ctx, Writers& writers, bool write) {
  Buffers bufs(static_cast<std::size_t>(ctx.threads));
  std::uint64_t total = 0;
  for (const auto& u : ctx.plan.units) total += u.bytes;
  progress::begin("apply", total);
  parallel_for(ctx.plan.units.size(), ctx.threads, [&](std::size_t k, std::size_t tid) {
    if (!writers[tid]) writers[tid] = std::make_unique<JournalWriter>(txn_part(ctx.step, tid), 1);
    run_unit(ctx, ctx.plan.units[k], *writers[tid], bufs[tid], write);
    progress::add(ctx.plan.units[k].bytes);
  });
}

// One pass per journal part, tensor by tensor: every window of the tensor is
// read, patched where the journal says, written back if it changed, and
// hashed as written, so the checksum covers exactly what LOCAL holds.
void write_from_journal(ExecuteContext& ctx) {
  const std::vector<Patch>& patches = ctx.plan.patches;
  std::map<std::pair<std::uint32_t, std::uint64_t>, std::size_t> at;
  for (std::size_t i = 0; i < patches.size(); ++i) at[{patches[i].local_shard, patches[i].offset}] = i;
  std::mutex mu;
  std::vector<std::string> mismatches;
  parallel_for(ctx.plan.manifest.parts, ctx.threads, [&](std::size_t i, std::size_t) {
    const fs::path part = txn_part(ctx.step, i);
    TensorWriter tw(ctx.files, part.string());
    const JournalEdges edges{[&](std::uint32_t shard, std::uint64_t offset) {
                               auto it = at.find({shard, offset});
                               if (it == at.end())
                                 fail(Exit::failure, part, "journal names a tensor this delta does not patch");
                               tw.begin(patches[it->second]);
                             },
                             [&] {
                               const Patch& p = tw.patch();
                               const Hash128 h = tw.end();
                               if (p.split) return;  // checked by check_split_results
                               std::lock_guard<std::mutex> g(mu);
                               const Hash128& want = p.computed ? *p.computed : p.new_hash;
                               if (h != want)
                                 mismatches.push_back("tensor '" + p.tensor + "' in " + ctx.shard_path(p.local_shard) +
                                                      " was written with checksum " + h.hex() + ", " +
                                                      (p.computed ? "laying it gave " : "the delta records ") +
                                                      want.hex());
                             }};
    replay_journal(
        part, true,
        [&](std::uint32_t, std::span<const std::uint64_t> o, std::span<const std::uint8_t> b) { tw.change(o, b); },
        &edges);
  });
  if (mismatches.empty()) return;
  std::string msg = "verification failed after applying " + ctx.d.dir.string() + "; LOCAL was rolled back:";
  for (const auto& s : mismatches) msg += "\n  " + s;
  fail(Exit::verify_failed, msg);
}

// The checksums of the new version, for --verify: the base version's record
// with the delta's checksums laid over it (no extra read), or LOCAL hashed
// whole when the base version has none.
void record(ExecuteContext& ctx) {
  std::optional<ChecksumRecord> rec = read_record(ctx.local, *ctx.plan.manifest.base);
  const ChecksumRecord next =
      rec ? next_record(std::move(*rec), ctx.d.index, ctx.plan) : compute_record(ctx.local, ctx.opts.threads);
  write_record(ctx.local, ctx.version(), next, ctx.opts.sync);
}

// Without flushing, nothing is gained by journaling the whole delta before
// the first write, and LOCAL is read once instead of twice. Each window's
// undo records reach the journal file before the window is written, so a
// kill is still rolled back by the next run.
void execute_one_pass(ExecuteContext& ctx) {
  ctx.step = ctx.txn.begin_step();
  {
    const OnFailure abandon([&] { ctx.txn.abandon_step(); });
    stage_files(ctx);
  }
  Manifest& m = ctx.plan.manifest;
  m.parts = static_cast<std::size_t>(ctx.threads);
  m.live = true;
  Writers writers(static_cast<std::size_t>(ctx.threads));
  run_step(ctx.txn, ctx.local, m, ctx.opts, [&] {
    journal_units(ctx, writers, true);
    for (auto& w : writers)
      if (w) w->finish(false);
    check_split_results(ctx);
    run_file_ops(ctx.local, ctx.step, m);
    enter_phase(Phase::sync);
    record(ctx);
  });
}

// Every change journaled with its old and new byte, checked and made
// durable before LOCAL is written.
void execute_journaled(ExecuteContext& ctx) {
  ctx.step = ctx.txn.begin_step();
  Manifest& m = ctx.plan.manifest;
  Writers writers(static_cast<std::size_t>(ctx.threads));
  {
    const OnFailure abandon([&] {
      writers.clear();  // their part files closed before the step goes
      ctx.txn.abandon_step();
    });
    journal_units(ctx, writers, false);
    enter_phase(Phase::sync);                           // the journal durable before LOCAL is written
    for (std::size_t t = 0; t < writers.size(); ++t) {  // parts are numbered densely in the manifest
      if (!writers[t]) continue;
      writers[t]->finish(ctx.opts.sync);
      if (t != m.parts) rename_path(txn_part(ctx.step, t), txn_part(ctx.step, m.parts));
      ++m.parts;
    }
    enter_phase(Phase::patch);
    stage_files(ctx);
    sync_dir(ctx.step);
  }
  run_step(ctx.txn, ctx.local, m, ctx.opts, [&] {
    write_from_journal(ctx);
    check_split_results(ctx);
    run_file_ops(ctx.local, ctx.step, m);
    enter_phase(Phase::sync);
    for (auto& f : ctx.files) f.sync();
    sync_dirs_of(ctx.local, m.files);
    record(ctx);
  });
}

}  // namespace

void execute_plan(Txn& txn, const OpenDelta& d, ApplyPlan& plan, const fs::path& local, const ApplyOptions& opts) {
  enter_phase(Phase::patch);
  ExecuteContext ctx{txn, d, plan, local, opts, default_threads(opts.threads), {}, {}};
  for (Patch& p : plan.patches) p.live = !opts.sync;  // without flushing, LOCAL is patched as the entries are decoded
  for (const auto& f : plan.manifest.shards) ctx.files.emplace_back(local / f, File::Mode::read_write);
  check_split_bases(ctx);
  if (opts.sync)
    execute_journaled(ctx);
  else
    execute_one_pass(ctx);
  for (auto& f : ctx.files) f.close();
}

}  // namespace hfdelta
