// The host-local checkpoint's bookkeeping: LOCAL/.weight_sync/lock (flock) and
// LOCAL/.weight_sync/state.json, interchangeable with the delta format's hosts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <boost/filesystem/path.hpp>

#include "hfdelta/error.hpp"

namespace hfdelta {

struct LocalState {
  std::optional<std::uint64_t> version;  // none: LOCAL was never initialised
  // Set while an apply is under way: the version being applied. A state with
  // `pending` means an apply was interrupted and LOCAL may be partly patched.
  std::optional<std::uint64_t> pending;
  bool operator==(const LocalState&) const = default;
};

// flock on LOCAL/.weight_sync/lock for the object's lifetime. timeout_s < 0
// waits forever; otherwise throws Error(lock_timeout) after it.
// - create: exclusive; makes .weight_sync/ if it is missing (forms that write);
// - existing: exclusive, but a LOCAL without .weight_sync/ is left as it is
//   and nothing is locked: no run ever wrote there, so none can be under way;
// - shared: for readers (--status, --verify), which must work on a read-only
//   LOCAL and for a user who cannot write it: the lock file opened read-only,
//   a shared flock, which waits for an apply and lets other readers in. Where
//   the file is missing or cannot be opened, nothing is locked.
//   `file`: the lock file in .weight_sync/ ("publisher.lock": one
//   MemoryPublisher per mirror, apart from the applies it runs there).
class LocalLock {
 public:
  enum class Mode { create, existing, shared };
  LocalLock(const boost::filesystem::path& local, double timeout_s, Mode mode = Mode::create,
            const char* file = "lock");
  ~LocalLock();
  LocalLock(const LocalLock&) = delete;
  LocalLock& operator=(const LocalLock&) = delete;

 private:
  int fd_ = -1;
};

LocalState read_state(const boost::filesystem::path& local);

// True if LOCAL/.weight_sync/state.json exists: a run has recorded LOCAL.
bool has_state_file(const boost::filesystem::path& local);

// Refuses, before anything is created, a LOCAL argument that cannot be one:
// a path that does not exist (Error(`missing`), saying to run --init; none:
// allowed, for --init), not a directory, or a delta version or publication
// root (the arguments are swapped) (Error(bad_input)).
void check_local_path(const boost::filesystem::path& local, std::optional<Exit> missing);

// Every file below LOCAL but its state directory (anything not a directory,
// symlinks too), relative, sorted.
std::vector<std::string> list_local_files(const boost::filesystem::path& local);

// Refuses (Error(bad_input), naming it) a symlink anywhere below LOCAL but its
// state directory: LOCAL is written only through files and directories of its
// own, so a link (to a base checkpoint, a cache blob) is never patched,
// replaced or removed through.
void refuse_local_symlinks(const boost::filesystem::path& local);

// Replaces state.json atomically (temp, flush, rename, flush directory).
void write_state(const boost::filesystem::path& local, const LocalState& s, bool sync);

// Writes `s` as a state file at `reserved` (outside state.json), so that
// install_state can later record it without allocating anything.
void reserve_state(const boost::filesystem::path& reserved, const LocalState& s, bool sync);
// Records `s` unless state.json holds it already: by a hard link of
// `reserved` (written by reserve_state) and a rename, which need no free
// space; by writing where `reserved` is missing or links are not supported.
void install_state(const boost::filesystem::path& local, const LocalState& s, const boost::filesystem::path& reserved,
                   bool sync);

}  // namespace hfdelta
