// Full versions and the deltas beside them (see publication.hpp).
#include "hfdelta/publication.hpp"

#include <chrono>
#include <set>

#include <boost/filesystem/operations.hpp>

#include "format/completion_marker.hpp"
#include "format/root_commit.hpp"
#include "hfdelta/checkpoint.hpp"
#include "hfdelta/delta_format.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/progress.hpp"
#include "hfdelta/signals.hpp"
#include "hfdelta/version.hpp"
#include "util/io.hpp"
#include "util/parallel.hpp"
#include "util/scope_guard.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

FullSummary publish_full(const fs::path& src, const fs::path& out, std::uint64_t version, bool sync, int threads) {
  const auto t0 = std::chrono::steady_clock::now();
  check_out_apart(out, {{"NEW", src}});
  if (is_delta_dir(src)) fail(Exit::bad_input, src, "is a delta version, not a full checkpoint");
  const Checkpoint c = open_checkpoint(src);  // every weight file valid before anything is copied
  if (c.shards.empty())
    fail(Exit::bad_input, src, "has no weight files (*.safetensors); not a checkpoint (a save still being written?)");
  std::vector<std::string> rels;
  for (const auto& s : c.shards) rels.push_back(s.file);
  rels.insert(rels.end(), c.other_files.begin(), c.other_files.end());
  if (exists_nofollow(out)) fail(Exit::exists, out, "already exists; refusing to overwrite");
  const fs::path tmp = temp_path_beside(out);
  const OnFailure remove_tmp([&] {
    boost::system::error_code ec;
    fs::remove_all(tmp, ec);
  });
  make_dirs(tmp);
  std::set<fs::path> dirs{tmp};
  for (const auto& rel : rels)
    for (fs::path d = (tmp / rel).parent_path(); d != tmp; d = d.parent_path()) dirs.insert(d);
  for (const auto& d : dirs) make_dirs(d);
  std::uint64_t total = 0;
  for (const auto& rel : rels) total += fs::file_size(src / rel);
  progress::begin("copy", total);
  parallel_for(rels.size(), default_threads(threads), [&](std::size_t i, std::size_t) {
    copy_file_atomic(src / rels[i], tmp / rels[i], sync);
    progress::add(fs::file_size(tmp / rels[i]));
  });
  const CompletionMarker m = write_marker(tmp, version, true, sync, threads);
  if (sync)
    for (const auto& d : dirs) sync_dir(d);
  // A full version depends on no other; only its number must still be free.
  PublishExpectation expect;
  if (version_from_dirname(out.filename().string()) == version)
    expect = {out.parent_path().empty() ? fs::path(".") : out.parent_path(), version, std::nullopt};
  publish_checked(tmp, out, expect);
  const StopDeferred published;  // a stop signal now no longer undoes anything
  if (sync) sync_dir(out.parent_path().empty() ? fs::path(".") : out.parent_path());
  return {version, rels.size(), m.bytes, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

fs::path publish_sidecar(const fs::path& base, const fs::path& src, const fs::path& full_out, const DiffOptions& opts,
                         DiffSummary& summary) {
  const fs::path root = full_out.parent_path().empty() ? fs::path(".") : full_out.parent_path();
  const fs::path side = root / sidecar_dirname(opts.version);
  check_out_apart(full_out, {{"BASE", base}, {"NEW", src}});
  const fs::path cand = temp_path_beside(side);  // hidden: no reader lists it
  const PublishExpectation expect{root, opts.version, opts.base_version};
  if (!exists_nofollow(side)) check_publishable(expect, false);
  DiffOptions inner = opts;
  inner.root_checks = false;  // checked here, at the rename that publishes it
  summary = diff_checkpoints(base, src, cand, inner);
  if (!exists_nofollow(side)) {
    {
      const OnFailure remove_cand([&] {
        boost::system::error_code ec;
        fs::remove_all(cand, ec);
      });
      publish_checked(cand, side, expect);
    }
    if (opts.sync) sync_dir(root);
    return side;
  }
  boost::system::error_code ec;
  const bool same = fs::is_regular_file(side / kIndexFile, ec) &&
                    read_small_file(side / kIndexFile) == read_small_file(cand / kIndexFile);
  fs::remove_all(cand, ec);
  if (!same)
    fail(Exit::exists, side,
         "already exists with another delta (another publisher of version " + format_version(opts.version) +
             "?); refusing to replace it");
  return side;  // this publication's own, from a run interrupted before the full version
}

}  // namespace hfdelta
