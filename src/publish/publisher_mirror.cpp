#include "hfdelta/publisher_mirror.hpp"

#include <string>

#include <boost/filesystem/operations.hpp>

#include "hfdelta/error.hpp"
#include "hfdelta/version.hpp"
#include "publish/mirror.hpp"
#include "store/checksum_record.hpp"
#include "store/local_store.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

struct PublisherMirror::State {
  fs::path root, mirror;
  PublisherOptions opts;
  std::unique_ptr<LocalLock> lock;
  PublisherOpening opening;
  std::uint64_t version = 0;
  bool reconcile_needed = false;  // the last advance failed, or never started
};

PublisherMirror::PublisherMirror(const fs::path& root, const fs::path& mirror, const PublisherOptions& opts,
                                 const std::string& form)
    : s_(std::make_unique<State>()) {
  s_->root = fs::absolute(strip_trailing_slashes(root.string()));
  s_->mirror = fs::absolute(strip_trailing_slashes(mirror.string()));
  s_->opts = opts;
  check_mirror_paths(s_->root, s_->mirror, form);  // before the lock creates anything in either
  s_->lock = std::make_unique<LocalLock>(s_->mirror, opts.lock_timeout, LocalLock::Mode::create, "publisher.lock");
  reconcile_mirror(s_->root, s_->mirror, opts, s_->opening);
  s_->version = s_->opening.version;
}

PublisherMirror::~PublisherMirror() = default;

const fs::path& PublisherMirror::root() const { return s_->root; }
const fs::path& PublisherMirror::mirror() const { return s_->mirror; }
const PublisherOptions& PublisherMirror::options() const { return s_->opts; }
const PublisherOpening& PublisherMirror::opening() const { return s_->opening; }
std::uint64_t PublisherMirror::version() const { return s_->version; }

std::uint64_t PublisherMirror::reconcile() {
  if (s_->reconcile_needed || read_state(s_->mirror) != LocalState{s_->version, std::nullopt}) {
    PublisherOpening o;
    reconcile_mirror(s_->root, s_->mirror, s_->opts, o);
    s_->version = o.version;
    s_->reconcile_needed = false;
  }
  return s_->version;
}

void PublisherMirror::published(std::uint64_t v) {
  s_->version = v;
  s_->reconcile_needed = true;
}

Hash128 PublisherMirror::record_digest() const {
  const std::optional<ChecksumRecord> rec = read_record(s_->mirror, s_->version);
  if (!rec)
    fail(Exit::uninitialised, s_->mirror,
         "mirror has no checksum record of its version " + format_version(s_->version) +
             "; re-create it (delta-apply --init CHECKPOINT MIRROR, then delta-apply --root ROOT MIRROR)");
  // Names and checksums in the record's (sorted) order, each field ended,
  // so that no two records give one stream.
  Hasher h;
  auto add = [&](const std::string& s) {
    h.update({reinterpret_cast<const std::uint8_t*>(s.data()), s.size() + 1});  // with its terminating NUL
  };
  for (const auto& [file, w] : rec->weights) {
    add("w " + file + " " + std::to_string(w.size) + " " + w.header.hex());
    for (const auto& [name, hash] : w.tensors) add("t " + name + " " + hash.hex());
  }
  for (const auto& [file, f] : rec->files) add("f " + file + " " + std::to_string(f.size) + " " + f.hash.hex());
  return h.digest();
}

ApplyResult PublisherMirror::advance(const fs::path& delta) {
  s_->reconcile_needed = true;  // until the apply has recorded the version
  const ApplyResult r = apply_delta(delta, s_->mirror, mirror_apply_options(s_->opts));
  if (s_->version != r.to_version) s_->version = r.to_version;
  s_->reconcile_needed = false;
  return r;
}

}  // namespace hfdelta
