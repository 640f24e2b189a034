#include "publish/mirror.hpp"

#include <boost/filesystem/operations.hpp>

#include "delta/delta_reader.hpp"
#include "hfdelta/checkpoint.hpp"
#include "hfdelta/delta_format.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/version.hpp"
#include "root/root_view.hpp"
#include "store/checksum_record.hpp"
#include "store/local_store.hpp"
#include "util/io.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

ApplyOptions mirror_apply_options(const PublisherOptions& o) {
  ApplyOptions a;
  a.sync = o.sync;
  a.threads = o.threads;
  a.lock_timeout = o.lock_timeout;
  return a;
}

namespace {

// ROOT's version `v` must hold the bytes the mirror records for `v`: the new
// checksum of each of its entries against the mirror's record (a full
// version, or a mirror without a record, is not checked).
void check_same_version(const fs::path& root, const fs::path& mirror, std::uint64_t v) {
  const fs::path dir = root / version_dirname(v);
  std::optional<DeltaIndex> idx = read_index_if_delta(dir);
  const std::optional<ChecksumRecord> rec = read_record(mirror, v);
  if (!idx || !rec) return;
  const OpenDelta d = open_delta(dir, std::move(*idx));
  for (const DeltaEntry& e : d.entries) {
    // A parts entry (a sharded publisher's, or a squash ending with one):
    // its regions' checksums were checked when the mirror applied it.
    if (!new_bytes_of(e).whole) continue;
    for (const auto& [file, w] : rec->weights) {
      const auto t = w.tensors.find(e.tensor());
      if (t == w.tensors.end() || t->second == e.new_hash) continue;
      fail(Exit::verify_failed, dir,
           "tensor '" + e.tensor() + "' is not the one mirror " + mirror.string() + " holds at version " +
               format_version(v) +
               ": ROOT and MIRROR were published by different publishers. Use the mirror this "
               "root was published from, or re-create the mirror from ROOT (delta-apply --init CHECKPOINT MIRROR, "
               "then delta-apply --root ROOT MIRROR)");
    }
  }
}

// Brings the mirror and ROOT together (see publisher.hpp).
}  // namespace

void reconcile_mirror(const fs::path& root, const fs::path& mirror, const PublisherOptions& opts,
                      PublisherOpening& opening) {
  const ApplyOptions ao = mirror_apply_options(opts);
  const ApplyResult rec = recover_local(mirror, ao);
  if (rec.rolled_back) opening.rolled_back = rec.rolled_back;
  const LocalState st = read_state(mirror);
  if (!st.version)
    fail(Exit::uninitialised, mirror,
         "mirror has no recorded version; make it a copy of the version the "
         "hosts start from: delta-apply --init CHECKPOINT " +
             mirror.string());
  const std::uint64_t m = *st.version;
  const RootListing listing = list_root(root);
  const std::uint64_t newest = listing.newest().value_or(0);
  if (listing.all.empty() && m != 0)
    fail(Exit::out_of_order, root,
         "publishes no version, but mirror " + mirror.string() + " is at version " + format_version(m) +
             ": open the publisher on the root the mirror was published to, "
             "or publish the mirror's checkpoint there first (delta-diff --full)");
  if (newest < m && listing.withdrawn.count(m))
    fail(Exit::out_of_order, mirror,
         "mirror is at version " + format_version(m) +
             ", which was withdrawn "
             "from " +
             root.string() + "; re-create the mirror from the checkpoint of version " + format_version(newest) +
             " (delta-apply --init CHECKPOINT MIRROR --init-version " + std::to_string(newest) + ")");
  if (newest < m)
    fail(Exit::out_of_order, root,
         "its newest version is " + format_version(newest) + ", but mirror " + mirror.string() + " is at version " +
             format_version(m) +
             ": the root lost versions or is another root; open the publisher on the root the "
             "mirror was published to, or re-create the mirror from this root");
  opening.version = m;
  if (newest == m) {
    if (!listing.all.empty()) check_same_version(root, mirror, m);
    return;
  }
  // Published, but the mirror was not advanced (the process died in
  // between): catch it up the way a host would.
  try {
    const ApplyResult r = pull(root, mirror, std::nullopt, ao);
    opening.caught_up.insert(opening.caught_up.end(), r.applied.begin(), r.applied.end());
    opening.version = r.to_version;
  } catch (const Error& e) {
    fail_again(e, "mirror " + mirror.string() + " (version " + format_version(m) + ") cannot be caught up from " +
                      root.string() + " (newest " + format_version(newest) + "): " + e.what() +
                      "; if ROOT is right, re-create the mirror from it (delta-apply --init CHECKPOINT MIRROR, "
                      "then delta-apply --root ROOT MIRROR)");
  }
}

// The checks delta-diff and delta-apply make of their paths, made of ROOT
// and MIRROR before anything is created in either: the mirror's lock would
// otherwise make ROOT/.weight_sync/ (after which every host's pull refuses
// the root as a LOCAL), or the first version would be written into a
// host's LOCAL given as ROOT.
void check_mirror_paths(const fs::path& root, const fs::path& mirror, const std::string& form) {
  require_dir(root, "create the publication root first (mkdir -p " + root.string() + ")");
  if (exists_nofollow(root / kStateDir))
    fail(Exit::bad_input, root,
         std::string("has ") + kStateDir +
             "/, so it is a LOCAL checkpoint (a host's, or a "
             "mirror), not a publication root; the arguments look swapped" +
             form);
  if (const Nesting n = nesting(root, mirror); n != Nesting::apart)
    fail(Exit::bad_input, root.string() +
                              (n == Nesting::same ? ": ROOT and the mirror are the same directory"
                                                  : ": ROOT is inside mirror " + mirror.string()) +
                              "; the mirror is a LOCAL, apart from the root it publishes into" + form);
  if (nesting(mirror, root) == Nesting::inside)
    fail(Exit::bad_input, mirror,
         "the mirror is inside ROOT " + root.string() +
             "; the mirror is a LOCAL, apart from the root it publishes into" + form);
  check_local_path(mirror, Exit::uninitialised);
  if (!has_state_file(mirror))
    fail(Exit::uninitialised, mirror,
         std::string("mirror has no recorded version (no ") + kStateDir +
             "/state.json); make it a copy of the version the hosts start from: "
             "delta-apply --init CHECKPOINT " +
             mirror.string());
}

}  // namespace hfdelta
