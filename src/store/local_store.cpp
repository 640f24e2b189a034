#include "store/local_store.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include <boost/filesystem/operations.hpp>
#include <nlohmann/json.hpp>

#include "hfdelta/checkpoint.hpp"
#include "hfdelta/delta_format.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/signals.hpp"
#include "hfdelta/version.hpp"
#include "util/io.hpp"
#include "util/json_text.hpp"
#include "util/scope_guard.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;
using nlohmann::json;

namespace {
fs::path state_dir(const fs::path& local) { return local / kStateDir; }
fs::path state_file(const fs::path& local) { return state_dir(local) / "state.json"; }
}  // namespace

LocalLock::LocalLock(const fs::path& local, double timeout_s, Mode mode, const char* file) {
  const fs::path lock = state_dir(local) / file;
  if (mode == Mode::shared) {
    fd_ = ::open(lock.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) return;  // never locked by a run (or not readable to us): nothing to wait for
  } else {
    if (mode == Mode::existing && !exists_nofollow(state_dir(local))) return;
    boost::system::error_code ec;
    fs::create_directories(state_dir(local), ec);
    if (ec) fail(Exit::failure, state_dir(local), "cannot create: " + ec.message());
    fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) fail(Exit::failure, lock, std::string("open: ") + std::strerror(errno));
  }
  const int how = mode == Mode::shared ? LOCK_SH : LOCK_EX;
  // A constructor that throws runs no destructor: the descriptor is closed here.
  const OnFailure close_lock([this] { ::close(fd_); });
  // flock has no timeout of its own, and a blocked flock would not see a
  // stop signal: poll with a short back-off.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(std::max(timeout_s, 0.0));
  for (;;) {
    if (::flock(fd_, how | LOCK_NB) == 0) return;
    if (errno != EWOULDBLOCK && errno != EINTR) {
      const int e = errno;
      fail(Exit::failure, lock, std::string("flock: ") + std::strerror(e));
    }
    if (timeout_s >= 0 && std::chrono::steady_clock::now() >= deadline)
      fail(Exit::lock_timeout, lock, "still locked by another process after " + std::to_string(timeout_s) + " s");
    check_stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

LocalLock::~LocalLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

bool has_state_file(const fs::path& local) { return exists_nofollow(state_file(local)); }

namespace {

// A damaged index of LOCAL's own is --verify's to report, not a sign of a delta.
bool looks_like_delta(const fs::path& dir) {
  try {
    return is_delta_dir(dir);
  } catch (const Error&) {
    return false;
  }
}

bool holds_versions(const fs::path& dir) {
  boost::system::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (version_from_dirname(it->path().filename().string())) return true;
  return false;
}

}  // namespace

void check_local_path(const fs::path& local, std::optional<Exit> missing) {
  const std::string L = local.string();
  boost::system::error_code ec;
  if (!fs::exists(local, ec)) {
    if (missing) fail(*missing, L, "does not exist; set it up first with delta-apply --init SRC " + L);
    return;
  }
  if (!fs::is_directory(local, ec)) fail(Exit::bad_input, L, "not a directory");
  if (looks_like_delta(local))
    fail(Exit::bad_input, L,
         "is a delta version, not a LOCAL checkpoint; the arguments look swapped "
         "(delta-apply DELTA LOCAL)");
  if (holds_versions(local))
    fail(Exit::bad_input, L,
         "holds published versions (weight_vNNNNNN), so it is a publication root, not a LOCAL "
         "checkpoint; the arguments look swapped (delta-apply --root ROOT LOCAL)");
}

LocalState read_state(const fs::path& local) {
  const fs::path p = state_file(local);
  boost::system::error_code ec;
  if (!fs::exists(p, ec)) return {};
  const std::string text = read_small_file(p, kStateJson.bytes);
  const json j = parse_json_text(text, p.string(), "state", kStateJson);
  if (!j.is_object()) fail(Exit::bad_input, p, "not a JSON object");
  LocalState s;
  auto version_field = [&](const char* k) -> std::optional<std::uint64_t> {
    if (!j.contains(k) || j[k].is_null()) return std::nullopt;
    if (j[k].is_string()) return parse_version(j[k].get<std::string>(), p.string() + ": \"" + k + "\"");
    if (j[k].is_number_unsigned()) return j[k].get<std::uint64_t>();
    fail(Exit::bad_input, p, std::string("\"") + k + "\" must be a version string");
  };
  s.version = version_field("version");
  s.pending = version_field("pending");
  return s;
}

namespace {

std::string state_text(const LocalState& s) {
  json j = json::object();
  if (s.version) j["version"] = format_version(*s.version);
  if (s.pending) j["pending"] = format_version(*s.pending);
  return j.dump() + "\n";
}

void make_state_dir(const fs::path& local) {
  boost::system::error_code ec;
  fs::create_directories(state_dir(local), ec);
  if (ec) fail(Exit::failure, state_dir(local), "cannot create: " + ec.message());
}

}  // namespace

void write_state(const fs::path& local, const LocalState& s, bool sync) {
  if (!s.version && !s.pending) {  // back to never initialised: no state file at all
    if (remove_path(state_file(local)) && sync) sync_dir(state_dir(local));
    return;
  }
  make_state_dir(local);
  write_file_atomic(state_file(local), state_text(s), sync);
}

void reserve_state(const fs::path& reserved, const LocalState& s, bool sync) {
  write_file_atomic(reserved, state_text(s), sync);
}

void install_state(const fs::path& local, const LocalState& s, const fs::path& reserved, bool sync) {
  try {
    if (read_state(local) == s) return;
  } catch (const Error&) {  // damaged: replaced below
  }
  if (!s.version && !s.pending) return write_state(local, s, sync);
  if (exists_nofollow(reserved)) {
    make_state_dir(local);
    const fs::path tmp = temp_path_beside(state_file(local));
    if (link_path(reserved, tmp)) {
      {
        const OnFailure remove_tmp([&] { ::unlink(tmp.c_str()); });
        rename_path(tmp, state_file(local));
      }
      if (sync) sync_dir(state_dir(local));
      return;
    }
  }
  write_state(local, s, sync);
}

namespace {

// Calls `visit` with every entry under LOCAL (links not followed), but not
// its state directory .weight_sync/ or what that holds.
template <class Visit>
void walk_local(const fs::path& local, Visit visit) {
  boost::system::error_code ec;
  for (fs::recursive_directory_iterator it(local, ec), end; it != end; it.increment(ec)) {
    if (ec) fail(Exit::failure, local, "cannot list: " + ec.message());
    if (it.depth() == 0 && it->path().filename() == kStateDir) {
      it.disable_recursion_pending();
      continue;
    }
    visit(*it);
  }
}

}  // namespace

std::vector<std::string> list_local_files(const fs::path& local) {
  std::vector<std::string> out;
  walk_local(local, [&](const fs::directory_entry& e) {
    if (!fs::is_directory(e.symlink_status()))
      out.push_back(relative_name(e.path(), local));  // the link itself, not its target
  });
  std::sort(out.begin(), out.end());
  return out;
}

void refuse_local_symlinks(const fs::path& local) {
  walk_local(local, [&](const fs::directory_entry& e) {
    if (fs::is_symlink(e.symlink_status()))
      fail(Exit::bad_input, e.path(),
           "is a symlink; LOCAL is written only through files of its own, so "
           "nothing was changed. Replace it with a copy of its target (cp --remove-destination) or remove it "
           "(rm removes the link, not its target)");
  });
}

}  // namespace hfdelta
