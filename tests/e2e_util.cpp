#include "e2e_util.hpp"

#include <sys/statvfs.h>
#include <unistd.h>

#include "delta/delta_format_internal.hpp"
#include "format/completion_marker.hpp"
#include "hfdelta/delta_format.hpp"
#include "hfdelta/error.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <xxhash.h>
#include <zstd.h>

#include "hfdelta/safetensors.hpp"

extern char** environ;

namespace e2e {

namespace {

[[noreturn]] void sys_error(const std::string& what) { throw std::runtime_error(what + ": " + std::strerror(errno)); }

// A file descriptor on an unlinked temporary file, closed on destruction.
struct CaptureFile {
  int fd = -1;
  CaptureFile() {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/hfdelta-e2e-out-XXXXXX";
    fd = ::mkostemp(tmpl.data(), O_CLOEXEC);
    if (fd < 0) sys_error("mkostemp " + tmpl);
    ::unlink(tmpl.c_str());
  }
  ~CaptureFile() {
    if (fd >= 0) ::close(fd);
  }
  std::string read_all() const {
    std::string s;
    char buf[65536];
    off_t off = 0;
    for (;;) {
      const ssize_t n = ::pread(fd, buf, sizeof buf, off);
      if (n < 0) {
        if (errno == EINTR) continue;
        sys_error("pread of captured output");
      }
      if (n == 0) break;
      s.append(buf, static_cast<std::size_t>(n));
      off += n;
    }
    return s;
  }
};

std::string env_or_throw(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) throw std::runtime_error(std::string(name) + " is not set (run the e2e tests through meson test)");
  return v;
}

std::string quote(const std::string& s) {
  if (!s.empty() && s.find_first_of(" \t\n'\"\\$") == std::string::npos) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace

// ---- running commands -------------------------------------------------------

std::string RunResult::describe() const {
  std::ostringstream o;
  o << "$ " << cmdline << "\nexit code: " << code << "\n--- stdout ---\n" << out << "--- stderr ---\n" << err;
  return o.str();
}

pid_t spawn(const std::vector<std::string>& argv, int out_fd, int err_fd) {
  posix_spawn_file_actions_t fa;
  if (posix_spawn_file_actions_init(&fa) != 0) throw std::runtime_error("posix_spawn_file_actions_init failed");
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  for (const auto& [fd, to] : {std::pair{out_fd, 1}, std::pair{err_fd, 2}}) {
    if (fd >= 0)
      posix_spawn_file_actions_adddup2(&fa, fd, to);
    else
      posix_spawn_file_actions_addopen(&fa, to, "/dev/null", O_WRONLY, 0);
  }
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, argv[0].c_str(), &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error("cannot start " + argv[0] + ": " + std::strerror(rc));
  return pid;
}

std::string sh_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

Background::Background(const std::vector<std::string>& args, const fs::path& out_dir, const std::string& name)
    : out_(out_dir / (name + ".out")), err_(out_dir / (name + ".err")) {
  std::vector<std::string> argv{apply_bin()};
  argv.insert(argv.end(), args.begin(), args.end());
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char*> cargs;
  for (const auto& a : argv) cargs.push_back(const_cast<char*>(a.c_str()));
  cargs.push_back(nullptr);
  const int rc = ::posix_spawn(&pid_, argv[0].c_str(), &fa, nullptr, cargs.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error("cannot start " + argv[0] + ": " + std::strerror(rc));
}

Background::~Background() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    wait();
  }
}

bool Background::running() {
  if (pid_ <= 0) return false;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == 0) return true;
  code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  pid_ = -1;
  return false;
}

int Background::wait() {
  if (pid_ > 0) {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0)
      if (errno != EINTR) throw std::runtime_error(std::string("waitpid: ") + std::strerror(errno));
    code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    pid_ = -1;
  }
  return code_;
}

std::string Background::output() const {
  return "--- background stdout ---\n" + (fs::exists(out_) ? read_file(out_) : "") + "--- background stderr ---\n" +
         (fs::exists(err_) ? read_file(err_) : "");
}

bool wait_for_file(const fs::path& p, Background& bg, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (fs::exists(p)) return true;
    if (!bg.running()) return fs::exists(p);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return fs::exists(p);
}

RunResult run(const std::vector<std::string>& argv) {
  if (argv.empty()) throw std::runtime_error("run: empty argv");
  RunResult r;
  for (const auto& a : argv) {
    if (!r.cmdline.empty()) r.cmdline += ' ';
    r.cmdline += quote(a);
  }

  CaptureFile out, err;
  const pid_t pid = spawn(argv, out.fd, err.fd);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) sys_error("waitpid " + argv[0]);
  }
  if (WIFEXITED(status))
    r.code = WEXITSTATUS(status);
  else if (WIFSIGNALED(status))
    r.code = 128 + WTERMSIG(status);
  r.out = out.read_all();
  r.err = err.read_all();
  return r;
}

// HFDELTA_CLI_DIR (scripts/ci/sanitize.sh): the commands under test from
// another build, the sanitized one, while the tests themselves (copying,
// comparing and hashing trees) run at full speed from this one.
static std::string cli_bin(const char* name, const char* var) {
  if (const char* dir = std::getenv("HFDELTA_CLI_DIR"); dir && *dir) return std::string(dir) + "/" + name;
  return env_or_throw(var);
}
std::string diff_bin() { return cli_bin("delta-diff", "HFDELTA_DIFF"); }
std::string apply_bin() { return cli_bin("delta-apply", "HFDELTA_APPLY"); }
std::string fleet_bin() { return cli_bin("delta-fleet", "HFDELTA_FLEET"); }
std::string gen_bin() { return env_or_throw("HFDELTA_GEN"); }
std::string bench_bin() { return env_or_throw("HFDELTA_BENCH"); }

RunResult diff(const std::vector<std::string>& args) {
  std::vector<std::string> v{diff_bin()};
  v.insert(v.end(), args.begin(), args.end());
  return run(v);
}

RunResult apply(const std::vector<std::string>& args) {
  std::vector<std::string> v{apply_bin()};
  v.insert(v.end(), args.begin(), args.end());
  return run(v);
}

RunResult delta_fleet(const std::vector<std::string>& args) {
  std::vector<std::string> v{fleet_bin()};
  v.insert(v.end(), args.begin(), args.end());
  return run(v);
}

json pull(const fs::path& root, const fs::path& local, const std::vector<std::string>& extra) {
  fs::create_directories(local);  // a new host's mkdir: delta-apply creates no LOCAL
  std::vector<std::string> args{"--json", "--root", root.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  args.push_back(local.string());
  const RunResult r = apply(args);
  E2E_REQUIRE_CODE(r, 0);
  return parse_json(r.out);
}

// ---- temporary directories --------------------------------------------------

TempDir::TempDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/hfdelta-e2e-XXXXXX";
  if (!::mkdtemp(tmpl.data())) sys_error("mkdtemp " + tmpl);
  path_ = tmpl;
}

TempDir::~TempDir() {
  boost::system::error_code ec;
  // Make everything writable again first, in case a test removed permissions.
  for (fs::recursive_directory_iterator it(path_, fs::directory_options::skip_permission_denied, ec), end;
       !ec && it != end; it.increment(ec)) {
    if (fs::is_directory(it->symlink_status(ec)))
      fs::permissions(it->path(), fs::perms::owner_all | fs::perms::add_perms, ec);
  }
  fs::remove_all(path_, ec);
}

// ---- files and directories --------------------------------------------------

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + p.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

Bytes read_bytes(const fs::path& p) {
  const std::string s = read_file(p);
  return Bytes(s.begin(), s.end());
}

void write_file(const fs::path& p, const std::string& content) {
  if (p.has_parent_path()) fs::create_directories(p.parent_path());
  std::ofstream o(p, std::ios::binary | std::ios::trunc);
  if (!o) throw std::runtime_error("cannot write " + p.string());
  o.write(content.data(), static_cast<std::streamsize>(content.size()));
  o.close();
  if (!o) throw std::runtime_error("cannot write " + p.string());
}

void write_bytes(const fs::path& p, const Bytes& content) {
  write_file(p, std::string(content.begin(), content.end()));
}

void copy_tree(const fs::path& from, const fs::path& to) {
  // By hand: Boost's copy fails across filesystems (a test's own mount).
  fs::create_directories(to);
  for (auto it = fs::recursive_directory_iterator(from); it != fs::recursive_directory_iterator(); ++it) {
    const fs::path dst = to / fs::relative(it->path(), from);
    const fs::file_status st = it->symlink_status();
    if (fs::is_symlink(st))
      fs::copy_symlink(it->path(), dst);
    else if (fs::is_directory(st))
      fs::create_directories(dst);
    else
      write_bytes(dst, read_bytes(it->path()));
  }
}

std::uint64_t tree_size(const fs::path& dir) {
  std::uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (fs::is_regular_file(e.status())) n += fs::file_size(e.path());
  return n;
}

std::vector<std::string> list_files(const fs::path& dir) {
  std::vector<std::string> v;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (fs::is_regular_file(e.status())) v.push_back(fs::relative(e.path(), dir).generic_string());
  std::sort(v.begin(), v.end());
  return v;
}

std::vector<std::string> list_names(const fs::path& dir) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

Snapshot snapshot(const fs::path& dir, bool with_state) {
  Snapshot s;
  if (!fs::exists(dir)) return s;
  for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator(); ++it) {
    const std::string rel = fs::relative(it->path(), dir).generic_string();
    if (it.depth() == 0 && it->path().filename() == ".weight_sync" && !with_state) {
      it.disable_recursion_pending();
      continue;
    }
    if (rel == ".weight_sync/lock") continue;
    if (fs::is_symlink(it->symlink_status())) {
      s[rel] = "<symlink to " + fs::read_symlink(it->path()).string() + ">";
      continue;
    }
    if (fs::is_regular_file(it->status())) s[rel] = read_file(it->path());
  }
  return s;
}

std::vector<std::string> snapshot_diff(const Snapshot& a, const Snapshot& b, const std::string& na,
                                       const std::string& nb) {
  std::vector<std::string> d;
  for (const auto& [k, v] : a) {
    auto it = b.find(k);
    if (it == b.end()) {
      d.push_back(k + ": only in " + na);
      continue;
    }
    if (it->second == v) continue;
    if (it->second.size() != v.size()) {
      d.push_back(k + ": size " + std::to_string(v.size()) + " in " + na + ", " + std::to_string(it->second.size()) +
                  " in " + nb);
      continue;
    }
    std::size_t first = 0, count = 0;
    for (std::size_t i = v.size(); i-- > 0;)
      if (v[i] != it->second[i]) first = i, ++count;
    d.push_back(k + ": " + std::to_string(count) + " bytes differ, first at offset " + std::to_string(first));
  }
  for (const auto& [k, v] : b)
    if (!a.count(k)) d.push_back(k + ": only in " + nb);
  return d;
}

std::string TreeDiff::report() const {
  std::string s;
  for (const auto& l : differences) s += l + "\n";
  return s;
}

TreeDiff tree_equal(const fs::path& a, const fs::path& b) {
  TreeDiff t;
  if (!fs::is_directory(a)) t.differences.push_back(a.string() + " is not a directory");
  if (!fs::is_directory(b)) t.differences.push_back(b.string() + " is not a directory");
  if (t.differences.empty())
    t.differences = snapshot_diff(snapshot(a, false), snapshot(b, false), a.string(), b.string());
  t.equal = t.differences.empty();
  return t;
}

TreeDiff LocalSnapshot::compare() const {
  TreeDiff t;
  t.differences = snapshot_diff(before, snapshot(dir, true), "the snapshot before", dir.string() + " now");
  t.equal = t.differences.empty();
  return t;
}

// ---- safetensors -------------------------------------------------------------

void write_safetensors(const fs::path& p, const std::vector<TensorData>& tensors,
                       const std::map<std::string, std::string>* metadata) {
  std::vector<hfdelta::TensorSpec> specs;
  std::map<std::string, const TensorData*> by_name;
  for (const auto& t : tensors) {
    specs.push_back({t.name, t.dtype, t.shape, t.bytes.size()});
    by_name[t.name] = &t;
  }
  const hfdelta::SafetensorsLayout L = hfdelta::layout_safetensors(specs, metadata);
  std::string out = L.prefix;
  out.resize(L.file_size, '\0');
  for (const auto& ti : L.tensors) {
    const TensorData& t = *by_name.at(ti.name);
    std::copy(t.bytes.begin(), t.bytes.end(), out.begin() + static_cast<std::ptrdiff_t>(L.prefix.size() + ti.begin));
  }
  write_file(p, out);
}

StFile read_st(const fs::path& p) {
  StFile f;
  f.raw = read_bytes(p);
  if (f.raw.size() < 8) throw std::runtime_error(p.string() + ": shorter than 8 bytes");
  for (int i = 7; i >= 0; --i) f.header_len = (f.header_len << 8) | f.raw[static_cast<std::size_t>(i)];
  if (8 + f.header_len > f.raw.size()) throw std::runtime_error(p.string() + ": header runs past the end");
  f.header = json::parse(f.raw.begin() + 8, f.raw.begin() + static_cast<std::ptrdiff_t>(8 + f.header_len));
  return f;
}

std::vector<std::string> StFile::tensor_names() const {
  std::vector<std::string> v;
  for (auto it = header.begin(); it != header.end(); ++it)
    if (it.key() != "__metadata__") v.push_back(it.key());
  std::sort(v.begin(), v.end());
  return v;
}

json StFile::metadata() const { return header.contains("__metadata__") ? header["__metadata__"] : json(); }

std::pair<std::uint64_t, std::uint64_t> StFile::file_range(const std::string& name) const {
  if (!header.contains(name)) throw std::runtime_error("no tensor '" + name + "' in safetensors header");
  const auto& o = header[name]["data_offsets"];
  return {data_start() + o[0].get<std::uint64_t>(), data_start() + o[1].get<std::uint64_t>()};
}

Bytes StFile::tensor(const std::string& name) const {
  const auto [b, e] = file_range(name);
  if (e > raw.size() || b > e) throw std::runtime_error("tensor '" + name + "' lies outside the file");
  return Bytes(raw.begin() + static_cast<std::ptrdiff_t>(b), raw.begin() + static_cast<std::ptrdiff_t>(e));
}

Bytes checkpoint_tensor(const fs::path& dir, const std::string& tensor) {
  std::string shard = "model.safetensors";
  if (fs::exists(dir / "model.safetensors.index.json")) {
    const json idx = read_json(dir / "model.safetensors.index.json");
    shard = idx.at("weight_map").at(tensor).get<std::string>();
  }
  return read_st(dir / shard).tensor(tensor);
}

std::vector<std::string> checkpoint_tensors(const fs::path& dir) {
  std::vector<std::string> v;
  if (fs::exists(dir / "model.safetensors.index.json")) {
    const json idx = read_json(dir / "model.safetensors.index.json");
    for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) v.push_back(it.key());
  } else {
    v = read_st(dir / "model.safetensors").tensor_names();
  }
  std::sort(v.begin(), v.end());
  return v;
}

std::set<std::string> changed_tensors(const fs::path& a, const fs::path& b) {
  std::set<std::string> s;
  for (const auto& t : checkpoint_tensors(b))
    if (checkpoint_tensor(a, t) != checkpoint_tensor(b, t)) s.insert(t);
  return s;
}

std::string xxh3_hex(const Bytes& b) {
  const XXH128_hash_t h = XXH3_128bits(b.data(), b.size());
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return buf;
}

std::string xxh3_hex(const std::string& s) { return xxh3_hex(Bytes(s.begin(), s.end())); }

Bytes zstd_decompress(const Bytes& frame) {
  const unsigned long long n = ZSTD_getFrameContentSize(frame.data(), frame.size());
  if (n == ZSTD_CONTENTSIZE_ERROR || n == ZSTD_CONTENTSIZE_UNKNOWN)
    throw std::runtime_error("not a zstd frame with a known content size");
  if (ZSTD_findFrameCompressedSize(frame.data(), frame.size()) != frame.size())
    throw std::runtime_error("the entry is not exactly one zstd frame");
  Bytes out(static_cast<std::size_t>(n));
  const std::size_t r = ZSTD_decompress(out.data(), out.size(), frame.data(), frame.size());
  if (ZSTD_isError(r)) throw std::runtime_error(std::string("ZSTD_decompress: ") + ZSTD_getErrorName(r));
  if (r != out.size()) throw std::runtime_error("zstd frame decoded to fewer bytes than it declares");
  return out;
}

// ---- JSON -------------------------------------------------------------------

json parse_json(const std::string& text) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw std::runtime_error(std::string("not valid JSON (") + e.what() + "): " + text);
  }
}

json read_json(const fs::path& p) { return parse_json(read_file(p)); }

void write_json(const fs::path& p, const json& j) {
  // Tests edit delta indexes on purpose to reach one rule at a time: keep the
  // index's own checksum valid so that it is that rule which answers.
  if (p.filename() == "model.safetensors.index.json" && j.contains("metadata") && j["metadata"].is_object() &&
      j["metadata"].contains("hfdelta_index_checksum")) {
    write_file(p, hfdelta::seal_delta_index(j.dump()));
    return;
  }
  write_file(p, j.dump(2) + "\n");
}

// ---- series -----------------------------------------------------------------

fs::path gen_series(const fs::path& outdir, int saves, const std::vector<std::string>& extra) {
  std::vector<std::string> argv{gen_bin(), "--preset", "tiny", "--saves", std::to_string(saves), "--threads", "2"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.push_back(outdir.string());
  const RunResult r = run(argv);
  if (r.code != 0) throw std::runtime_error("hfdelta-gen failed:\n" + r.describe());
  return outdir;
}

fs::path save_dir(const fs::path& series, int i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "save_%03d", i);
  return series / buf;
}

fs::path version_dir(const fs::path& root, int v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "weight_v%06d", v);
  return root / buf;
}

json state_json(const fs::path& local) {
  const fs::path p = local / ".weight_sync" / "state.json";
  if (!fs::exists(p)) return json();
  return read_json(p);
}

std::string state_version(const fs::path& local) {
  const json j = state_json(local);
  if (!j.is_object() || !j.contains("version") || !j["version"].is_string()) return "";
  return j["version"].get<std::string>();
}

json delta_index(const fs::path& delta) { return read_json(delta / "model.safetensors.index.json"); }

namespace {

// ARGV stopped at write step `step` (HFDELTA_FAULT_MODE `how`), `at_stop`
// run, then signal `sig` (none: 0) and SIGCONT sent.
Signalled stop_at_step(const std::vector<std::string>& argv, long step, const char* how, int sig,
                       const std::function<void()>& at_stop) {
  const TempDir t;
  const fs::path err = t / "err";
  const int fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  pid_t pid = -1;
  {  // ARGV only: the commands `at_stop` runs are not stopped
    ScopedEnv at("HFDELTA_FAULT_AT", std::to_string(step));
    ScopedEnv mode("HFDELTA_FAULT_MODE", how);
    pid = spawn(argv, -1, fd);
  }
  ::close(fd);
  Signalled s;
  int status = 0;
  REQUIRE(::waitpid(pid, &status, WUNTRACED) == pid);
  if (WIFSTOPPED(status)) {
    s.paused = true;
    try {
      if (at_stop) at_stop();
    } catch (...) {  // no stopped process left behind
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      throw;
    }
    if (sig) ::kill(pid, sig);
    ::kill(pid, SIGCONT);
    REQUIRE(::waitpid(pid, &status, 0) == pid);
  }
  s.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  s.err = read_file(err);
  return s;
}

}  // namespace

Signalled signal_at_step(const std::vector<std::string>& argv, long step, int sig,
                         const std::function<void()>& at_stop) {
  return stop_at_step(argv, step, "pause", sig, at_stop);
}

Signalled hold_at_step(const std::vector<std::string>& argv, long step, const std::function<void()>& at_stop) {
  return stop_at_step(argv, step, "hold", 0, at_stop);
}

std::string system_tool(const std::string& name) {
  for (const char* dir : {"/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/"})
    if (::access((dir + name).c_str(), X_OK) == 0) return dir + name;
  return "";
}

std::string mount_loop_image(const fs::path& dir, std::uint64_t size, const std::vector<std::string>& mkfs) {
  std::vector<std::string> argv{system_tool(mkfs.at(0))};
  const std::string mount = system_tool("mount");
  if (argv[0].empty() || mount.empty()) return mkfs[0] + " or mount is not installed";
  fs::create_directories(dir);
  const fs::path image = dir.string() + ".img";
  write_file(image, "");
  fs::resize_file(image, size);
  argv.insert(argv.end(), mkfs.begin() + 1, mkfs.end());
  argv.push_back(image.string());
  RunResult r = run(argv);
  if (r.code == 0) r = run({mount, "-o", "loop", image.string(), dir.string()});
  return r.code == 0 ? "" : r.cmdline + ": exit " + std::to_string(r.code) + ": " + first_line(r.err);
}

void unmount(const fs::path& dir) {
  if (::umount2(dir.c_str(), 0) != 0) ::umount2(dir.c_str(), MNT_DETACH);
}

std::string first_line(const std::string& s) {
  const std::size_t nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

std::unique_ptr<TempDir> scratch_dir() {
  std::optional<ScopedEnv> env;
  struct statvfs sv {};
  if (::statvfs("/dev/shm", &sv) == 0 && ::access("/dev/shm", W_OK) == 0 &&
      static_cast<unsigned long long>(sv.f_bavail) * sv.f_frsize >= (2ull << 30))
    env.emplace("TMPDIR", "/dev/shm");
  return std::make_unique<TempDir>();
}

std::string require_init(const fs::path& src, const fs::path& local, const std::string& version) {
  const RunResult r = apply({"-q", "--init", "--init-version", version, src.string(), local.string()});
  E2E_REQUIRE_CODE(r, 0);
  return state_version(local);
}

void require_diff(const fs::path& a, const fs::path& b, const fs::path& out, const std::string& encoding) {
  const RunResult r = diff({"-q", "--encoding", encoding, a.string(), b.string(), out.string()});
  E2E_REQUIRE_CODE(r, 0);
}

std::pair<fs::path, fs::path> make_full_version_chain(const fs::path& series, const fs::path& root,
                                                      const fs::path& new3) {
  require_diff(save_dir(series, 0), save_dir(series, 1), version_dir(root, 1), "xor");
  const fs::path full = version_dir(root, 2);
  copy_tree(save_dir(series, 2), full);
  write_file(full / "chat_template.jinja", "{{ messages }}\n");
  copy_tree(save_dir(series, 3), new3);
  write_file(new3 / "chat_template.jinja", "{{ messages | join }}\n");
  require_diff(full, new3, version_dir(root, 3), "overwrite");
  return {full, new3};
}

int code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const hfdelta::Error& e) {
    return static_cast<int>(e.code());
  }
  return 0;
}

bool has_txn(const fs::path& local) {
  boost::system::error_code ec;
  return fs::exists(fs::symlink_status(local / ".weight_sync" / "txn", ec));
}

bool has_journal(const fs::path& local) {
  const fs::path txn = local / ".weight_sync" / "txn";
  if (!fs::is_directory(txn)) return false;
  for (const auto& e : fs::directory_iterator(txn))
    if (fs::exists(e.path() / "manifest.json")) return true;
  return false;
}

namespace {

// `n` deterministic bytes from a tensor's name and a seed.
Bytes seeded_bytes(const std::string& name, std::size_t n, std::uint32_t seed) {
  std::uint64_t x = 0x9e3779b97f4a7c15ull * (seed + 1ull);
  for (const char c : name) x = (x ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  Bytes b(n);
  for (auto& v : b) {
    x += 0x9e3779b97f4a7c15ull;
    std::uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    v = static_cast<std::uint8_t>((z ^ (z >> 31)) >> 24);
  }
  return b;
}

// The same bytes with every fifth one changed for generation `g` (0: as is),
// so that a save differs sparsely from the one before.
Bytes touched(Bytes b, int g) {
  if (g == 0) return b;
  for (std::size_t i = static_cast<std::size_t>(g) % 5; i < b.size(); i += 5)
    b[i] ^= static_cast<std::uint8_t>(0x11 * g);
  return b;
}

}  // namespace

void write_structural_checkpoint(const fs::path& dir, int layout, std::uint32_t seed) {
  if (layout < 0 || layout > 2) throw std::invalid_argument("write_structural_checkpoint: layout 0, 1 or 2");
  auto tensor = [&](const std::string& name, const std::string& dtype, std::uint64_t elements, int gen = 0,
                    const std::string& bytes_of = "") {
    const std::size_t es = dtype == "F32" ? 4 : 2;
    const std::size_t n = static_cast<std::size_t>(elements) * es;
    return TensorData{name, dtype, {elements}, touched(seeded_bytes(bytes_of.empty() ? name : bytes_of, n, seed), gen)};
  };
  std::map<std::string, std::vector<TensorData>> shards;
  std::map<std::string, std::map<std::string, std::string>> metadata;
  // Header rewrites keep the header's length: the notes are all 4 letters.
  const char* note = layout == 0 ? "base" : layout == 1 ? "next" : "last";
  shards["model-a.safetensors"] = {tensor("a.weight", "F32", 64, layout), tensor("a.bias", "F32", 16)};
  shards["model-b.safetensors"] = {tensor("b.weight", "F32", 32, layout), tensor("b.norm", "F32", 8)};
  metadata["model-b.safetensors"] = {{"format", "pt"}, {"note", note}};
  if (layout != 1) {
    shards["model-c.safetensors"] = {tensor("c.weight", "F32", 32, layout), tensor("c.emb", "F16", 48)};
    shards["model-e.safetensors"] = {tensor("e.moved", "F32", 24), tensor("e.renamed", "BF16", 16),
                                     tensor("e.dropped", "F32", 4, layout)};
  } else {
    shards["model-c.safetensors"] = {tensor("c.weight", "F32", 32, layout), tensor("c.emb", "BF16", 48),
                                     tensor("c.new", "F32", 8)};
    TensorData zero{"d.zero", "F32", {6}, Bytes(24, 0)};
    shards["model-d.safetensors"] = {tensor("e.moved", "F32", 24), tensor("d.renamed", "BF16", 16, 0, "e.renamed"),
                                     zero};
  }
  json weight_map = json::object();
  std::uint64_t total = 0;
  fs::create_directories(dir);
  for (const auto& [file, tensors] : shards) {
    const auto md = metadata.find(file);
    write_safetensors(dir / file, tensors, md == metadata.end() ? nullptr : &md->second);
    for (const auto& t : tensors) weight_map[t.name] = file, total += t.bytes.size();
  }
  write_json(dir / "model.safetensors.index.json", {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}});
  write_json(dir / "config.json", {{"architectures", {"Toy"}}, {"hidden_size", 8}, {"layout", layout}});
  write_file(dir / "tokenizer.json", "{\"unchanged\": true}\n");
}

std::set<std::string> keys_of(const json& obj) {
  std::set<std::string> s;
  for (auto it = obj.begin(); it != obj.end(); ++it) s.insert(it.key());
  return s;
}

std::map<std::string, std::string> ops_of(const json& index) {
  std::map<std::string, std::string> m;
  const json& md = index["metadata"];
  if (md.contains("hfdelta_shards"))
    for (const auto& e : md["hfdelta_shards"]) m[e["file"].get<std::string>()] = e["op"].get<std::string>();
  return m;
}

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

std::string v6(int v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%06d", v);
  return buf;
}

void reseal_marker(const fs::path& dir) {
  const hfdelta::Completeness c = hfdelta::check_complete(dir, false);
  if (!c.marker) return;
  fs::remove(dir / hfdelta::kCompleteFile);
  hfdelta::write_marker(dir, c.marker->version, c.marker->full, false, 1);
}

}  // namespace e2e
