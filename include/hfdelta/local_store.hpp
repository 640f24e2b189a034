// The host-local checkpoint's bookkeeping: LOCAL/.weight_sync/lock (flock) and
// LOCAL/.weight_sync/state.json, interchangeable with the delta format's hosts.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>
#include <string>

#include <boost/filesystem/path.hpp>

namespace hfdelta {

struct LocalState {
  std::optional<std::uint64_t> version;  // none: LOCAL was never initialised
  // Set while an apply is under way: the version being applied. A state with
  // `pending` means an apply was interrupted and LOCAL may be partly patched.
  std::optional<std::uint64_t> pending;
};

// Exclusive flock on LOCAL/.weight_sync/lock for the object's lifetime.
// timeout_s < 0 waits forever; otherwise throws Error(lock_timeout) after it.
class LocalLock {
 public:
  LocalLock(const boost::filesystem::path& local, double timeout_s);
  ~LocalLock();
  LocalLock(const LocalLock&) = delete;
  LocalLock& operator=(const LocalLock&) = delete;

 private:
  int fd_ = -1;
};

LocalState read_state(const boost::filesystem::path& local);

// Every file below LOCAL but its state directory (anything not a directory,
// symlinks too), relative, sorted.
std::vector<std::string> list_local_files(const boost::filesystem::path& local);
// Replaces state.json atomically (temp, flush, rename, flush directory).
void write_state(const boost::filesystem::path& local, const LocalState& s, bool sync);

}  // namespace hfdelta
