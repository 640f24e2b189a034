// hfdelta-bench's measurements (measure.hpp): the entropy bound of a change,
// the read floors, a command's time and memory, sizes and the machine.

#include "measure.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <omp.h>

#include <boost/filesystem.hpp>

#include "codec/codec.hpp"
#include "hfdelta/checkpoint.hpp"
#include "hfdelta/hash.hpp"
#include "hfdelta/safetensors.hpp"
#include "util/io.hpp"

namespace fs = boost::filesystem;

namespace bench {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// ---- bound ---------------------------------------------------------------------

double binary_entropy_bits(std::uint64_t n, std::uint64_t k) {
  if (k == 0 || k == n) return 0;
  const double p = static_cast<double>(k) / static_cast<double>(n);
  return static_cast<double>(n) * (-p * std::log2(p) - (1 - p) * std::log2(1 - p));
}

template <class T>
T load(const std::uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Changed elements of one tensor and the entropy of their positions and XOR values.
struct Counts {
  std::uint64_t elements = 0, changed = 0, distinct = 0;
  double position_bits = 0, value_bits = 0;
};

// Counts changed elements of width W (1 or 2 bytes) with a histogram of the
// XOR values, in parallel over chunks of the tensor.
template <class T>
Counts bound_small(const std::uint8_t* a, const std::uint8_t* b, std::uint64_t n, int threads,
                   std::vector<std::vector<std::uint64_t>>& hists) {
  constexpr std::size_t kValues = std::size_t{1} << (8 * sizeof(T));
  std::vector<std::uint64_t> total(kValues, 0);
  std::uint64_t k = 0;
#pragma omp parallel num_threads(threads) reduction(+ : k)
  {
    auto& h = hists[static_cast<std::size_t>(omp_get_thread_num())];
    h.assign(kValues, 0);
#pragma omp for schedule(static)
    for (std::uint64_t i = 0; i < n; ++i) {
      const T x = static_cast<T>(load<T>(a + i * sizeof(T)) ^ load<T>(b + i * sizeof(T)));
      if (x) {
        ++h[x];
        ++k;
      }
    }
#pragma omp critical
    for (std::size_t v = 0; v < kValues; ++v) total[v] += h[v];
  }
  Counts r;
  r.elements = n;
  r.changed = k;
  for (std::size_t v = 1; v < kValues; ++v)
    if (const std::uint64_t c = total[v]) {
      ++r.distinct;
      r.value_bits += static_cast<double>(c) * std::log2(static_cast<double>(k) / static_cast<double>(c));
    }
  r.position_bits = binary_entropy_bits(n, k);
  return r;
}

// Wider elements: collect the changed XOR values and count runs after sorting.
template <class T>
Counts bound_wide(const std::uint8_t* a, const std::uint8_t* b, std::uint64_t n, int threads) {
  std::vector<std::vector<T>> parts(static_cast<std::size_t>(threads));
#pragma omp parallel num_threads(threads)
  {
    auto& out = parts[static_cast<std::size_t>(omp_get_thread_num())];
#pragma omp for schedule(static)
    for (std::uint64_t i = 0; i < n; ++i) {
      const T x = static_cast<T>(load<T>(a + i * sizeof(T)) ^ load<T>(b + i * sizeof(T)));
      if (x) out.push_back(x);
    }
  }
  std::vector<T> all;
  for (auto& p : parts) all.insert(all.end(), p.begin(), p.end());
  std::sort(all.begin(), all.end());
  Counts r;
  r.elements = n;
  r.changed = all.size();
  const double k = static_cast<double>(all.size());
  for (std::size_t i = 0; i < all.size();) {
    std::size_t j = i;
    while (j < all.size() && all[j] == all[i]) ++j;
    const double c = static_cast<double>(j - i);
    r.value_bits += c * std::log2(k / c);
    ++r.distinct;
    i = j;
  }
  r.position_bits = binary_entropy_bits(n, all.size());
  return r;
}

// 2-byte elements with a context field (BF16, F16: the base element's
// exponent, as hfdelta's context encoding reads it): one pass over the tensor
// collects each change as its context << 16 | its XOR value, and each
// context's element count. The same changes give the order-0 figures (as
// bound_small) and the change coded in the contexts both ends can derive
// from the base: per context c, n_c·H(k_c/n_c) bits for the positions and
// the XOR values' entropy among c's changes. What a context-modelled encoding
// could reach at best (issue #17's "conditioned bound").
struct ContextBound {
  Counts order0;
  double conditioned_bits = 0;
};

ContextBound bound_in_contexts(const std::uint8_t* a, const std::uint8_t* b, std::uint64_t n, hfdelta::ContextField f,
                               int threads) {
  const std::size_t contexts = std::size_t{1} << f.bits;
  std::vector<std::uint64_t> per_n(contexts, 0);
  std::vector<std::vector<std::uint32_t>> parts(static_cast<std::size_t>(threads));  // context << 16 | xor
  std::vector<std::vector<std::uint64_t>> counts(static_cast<std::size_t>(threads),
                                                 std::vector<std::uint64_t>(contexts, 0));
#pragma omp parallel num_threads(threads)
  {
    const auto tid = static_cast<std::size_t>(omp_get_thread_num());
    auto& out = parts[tid];
    auto& cnt = counts[tid];
#pragma omp for schedule(static)
    for (std::uint64_t i = 0; i < n; ++i) {
      const auto va = load<std::uint16_t>(a + 2 * i);
      const std::uint32_t c = (va >> f.shift) & (contexts - 1);
      ++cnt[c];
      if (const std::uint16_t x = static_cast<std::uint16_t>(va ^ load<std::uint16_t>(b + 2 * i)))
        out.push_back(c << 16 | x);
    }
  }
  std::vector<std::uint32_t> all;
  for (std::size_t t = 0; t < parts.size(); ++t) {
    all.insert(all.end(), parts[t].begin(), parts[t].end());
    for (std::size_t c = 0; c < contexts; ++c) per_n[c] += counts[t][c];
  }
  ContextBound r;
  const std::uint64_t k = all.size();
  std::vector<std::uint64_t> values(std::size_t{1} << 16, 0);
  for (const std::uint32_t v : all) ++values[v & 0xffff];
  r.order0.elements = n;
  r.order0.changed = k;
  for (std::size_t v = 1; v < values.size(); ++v)
    if (const std::uint64_t c = values[v]) {
      ++r.order0.distinct;
      r.order0.value_bits += static_cast<double>(c) * std::log2(static_cast<double>(k) / static_cast<double>(c));
    }
  r.order0.position_bits = binary_entropy_bits(n, k);

  std::sort(all.begin(), all.end());
  std::vector<std::uint64_t> per_k(contexts, 0);
  for (const std::uint32_t v : all) ++per_k[v >> 16];
  double total = 0;
  for (std::size_t c = 0; c < contexts; ++c) total += binary_entropy_bits(per_n[c], per_k[c]);
  for (std::size_t i = 0; i < all.size();) {
    std::size_t j = i;
    while (j < all.size() && all[j] == all[i]) ++j;
    const double cnt = static_cast<double>(j - i);
    total += cnt * std::log2(static_cast<double>(per_k[all[i] >> 16]) / cnt);
    i = j;
  }
  r.conditioned_bits = total;
  return r;
}

std::uint64_t dir_bytes(const fs::path& dir, std::uint64_t* files = nullptr) {
  std::uint64_t total = 0, count = 0;
  if (fs::is_regular_file(dir)) {
    total = fs::file_size(dir);
    count = 1;
  } else {
    for (fs::recursive_directory_iterator it(dir), end; it != end; ++it)
      if (fs::is_regular_file(it->symlink_status())) {
        total += fs::file_size(it->path());
        ++count;
      }
  }
  if (files) *files += count;
  return total;
}

// The bound of one tensor, read as elements of `w` bytes (1, 2, 4 or 8; else bytes, and `w` becomes 1).
Counts bound_tensor(const std::uint8_t* pa, const std::uint8_t* pb, std::uint64_t nbytes, std::size_t& w, int threads,
                    std::vector<std::vector<std::uint64_t>>& hists) {
  const std::uint64_t n = nbytes / w;
  switch (w) {
    case 1:
      return bound_small<std::uint8_t>(pa, pb, n, threads, hists);
    case 2:
      return bound_small<std::uint16_t>(pa, pb, n, threads, hists);
    case 4:
      return bound_wide<std::uint32_t>(pa, pb, n, threads);
    case 8:
      return bound_wide<std::uint64_t>(pa, pb, n, threads);
    default:
      w = 1;
      return bound_small<std::uint8_t>(pa, pb, nbytes, threads, hists);
  }
}

// ---- reading -------------------------------------------------------------------

struct Piece {
  std::size_t file;
  std::uint64_t offset, len;
};

// One pass reading every piece through pread into a 1 MiB buffer per thread.
double read_pass(std::vector<hfdelta::File>& files, const std::vector<Piece>& pieces, int threads, std::uint64_t* sink,
                 PassKind kind = {}) {
  constexpr std::size_t kBuf = 1u << 20;
  std::uint64_t acc = 0;
  const auto t0 = Clock::now();
#pragma omp parallel num_threads(threads) reduction(^ : acc)
  {
    std::vector<std::uint64_t> buf(kBuf / sizeof(std::uint64_t));
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(buf.data());
#pragma omp for schedule(dynamic, 1)
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      const Piece& p = pieces[i];
      hfdelta::Hasher h, h2;
      for (std::uint64_t off = 0; off < p.len; off += kBuf) {
        const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kBuf, p.len - off));
        files[p.file].pread_exact(buf.data(), n, p.offset + off);
        if (kind.hash) h.update({bytes, n});
        // Touch one word per page so the copy cannot be skipped.
        for (std::size_t w = 0; w < n / 8; w += 512) acc ^= buf[w];
        if (kind.write_back && kind.hash) h2.update({bytes, n});
        if (kind.write_back) files[p.file].pwrite_all(buf.data(), n, p.offset + off);
      }
      if (kind.hash) acc ^= h.digest().low ^ h2.digest().low;
    }
  }
  *sink ^= acc;
  return since(t0);
}

std::vector<Piece> cut_pieces(const std::vector<hfdelta::File>& files) {
  constexpr std::uint64_t kPiece = 32ull << 20;
  std::vector<Piece> pieces;
  for (std::size_t f = 0; f < files.size(); ++f) {
    const std::uint64_t size = files[f].size();
    for (std::uint64_t off = 0; off < size; off += kPiece) pieces.push_back({f, off, std::min(kPiece, size - off)});
  }
  return pieces;
}

// ---- run -----------------------------------------------------------------------

// "Key:   1234 kB" lines of /proc/PID/status.
void read_status(pid_t pid, std::uint64_t& vm_rss, std::uint64_t& rss_anon) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    auto val = [&](const char* key, std::uint64_t& out) {
      const std::size_t n = std::strlen(key);
      if (line.compare(0, n, key) == 0) out += std::strtoull(line.c_str() + n, nullptr, 10);
    };
    val("VmRSS:", vm_rss);
    val("RssAnon:", rss_anon);
  }
}

// The process and every descendant, through /proc/PID/task/TID/children.
void collect_tree(pid_t root, std::vector<pid_t>& out) {
  out.clear();
  out.push_back(root);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const fs::path task = "/proc/" + std::to_string(out[i]) + "/task";
    boost::system::error_code ec;
    for (fs::directory_iterator it(task, ec), end; !ec && it != end; it.increment(ec)) {
      std::ifstream f(it->path() / "children");
      pid_t c;
      while (f >> c) out.push_back(c);
    }
  }
}

std::optional<std::uint64_t> parse_time_v(const std::string& path, const char* key) {
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    const auto p = line.find(key);
    if (p != std::string::npos) {
      const auto colon = line.rfind(':');
      return std::strtoull(line.c_str() + colon + 1, nullptr, 10);
    }
  }
  return std::nullopt;
}

// Starts ARGS with its stdout sent to STDOUT_FILE (unless empty).
pid_t spawn_command(std::vector<char*>& args, const std::string& stdout_file) {
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("run: fork failed");
  if (pid == 0) {
    if (!stdout_file.empty()) {
      const int fd = ::open(stdout_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0 || dup2(fd, 1) < 0) _exit(126);
      ::close(fd);
    }
    execvp(args[0], args.data());
    _exit(127);
  }
  return pid;
}

// What sampling a process tree until it exits saw.
struct Samples {
  std::uint64_t peak_rss = 0, peak_anon = 0, count = 0;
  int status = 0;
  struct rusage ru {};
};

// Samples the tree of PID every INTERVAL_MS until PID exits.
Samples sample_until_exit(pid_t pid, double interval_ms) {
  Samples sm;
  std::vector<pid_t> tree;
  const auto interval = std::chrono::microseconds(static_cast<std::int64_t>(interval_ms * 1000));
  for (;;) {
    const pid_t w = wait4(pid, &sm.status, WNOHANG, &sm.ru);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) throw std::runtime_error("run: wait4 failed");
    collect_tree(pid, tree);
    std::uint64_t rss = 0, anon = 0;
    for (pid_t p : tree) read_status(p, rss, anon);
    sm.peak_rss = std::max(sm.peak_rss, rss);
    sm.peak_anon = std::max(sm.peak_anon, anon);
    ++sm.count;
    std::this_thread::sleep_for(interval);
  }
  return sm;
}

// A temporary file for GNU time's report.
std::string make_time_file() {
  char tmpl[] = "/tmp/hfdelta-bench-time-XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd < 0) throw std::runtime_error("run: mkstemp failed");
  ::close(fd);
  return tmpl;
}

// ---- machine -------------------------------------------------------------------

std::string first_line(const fs::path& p) {
  std::ifstream f(p.string());
  std::string s;
  std::getline(f, s);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n')) s.pop_back();
  return s;
}

// CPU count and model.
void describe_cpu(Machine& m) {
  cpu_set_t set;
  CPU_ZERO(&set);
  m.nproc = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
  m.hardware_threads = std::thread::hardware_concurrency();
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      m.cpu_model = line.substr(line.find(':') + 2);
      break;
    }
}

// Total and available memory.
void describe_memory(Machine& m) {
  std::ifstream f("/proc/meminfo");
  std::string key;
  std::uint64_t kb;
  std::string unit;
  while (f >> key >> kb) {
    std::getline(f, unit);
    if (key == "MemTotal:") m.mem_total_bytes = kb * 1024;
    if (key == "MemAvailable:") m.mem_available_bytes = kb * 1024;
  }
}

// PRETTY_NAME of /etc/os-release.
std::string os_name() {
  std::ifstream f("/etc/os-release");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("PRETTY_NAME=", 0) == 0) {
      std::string v = line.substr(12);
      v.erase(std::remove(v.begin(), v.end(), '"'), v.end());
      return v;
    }
  return std::string();
}

// The mount holding PATH (the longest mount point above it), from /proc/mounts.
std::optional<Mount> find_mount(const fs::path& path) {
  const std::string abs = fs::canonical(path).string();
  std::ifstream f("/proc/mounts");
  std::string dev, mnt, type, rest;
  std::size_t best = 0;
  std::optional<Mount> found;
  while (f >> dev >> mnt >> type && std::getline(f, rest))
    if (abs.rfind(mnt, 0) == 0 && mnt.size() >= best &&
        (abs.size() == mnt.size() || mnt == "/" || abs[mnt.size()] == '/')) {
      best = mnt.size();
      found = Mount{dev, mnt, type};
    }
  return found;
}

// The block device under PATH, from /sys/dev/block (the whole disk, not the partition).
std::optional<BlockDevice> find_block_device(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  fs::path sys = "/sys/dev/block/" + std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
  boost::system::error_code ec;
  fs::path real = fs::canonical(sys, ec);
  if (ec) return std::nullopt;
  if (fs::exists(real / "partition")) real = real.parent_path();
  BlockDevice b;
  b.name = real.filename().string();
  b.rotational = first_line(real / "queue/rotational");
  b.model = first_line(real / "device/model");
  b.vendor = first_line(real / "device/vendor");
  const std::string size = first_line(real / "size");
  b.size_bytes = size.empty() ? 0ull : std::strtoull(size.c_str(), nullptr, 10) * 512;
  return b;
}

// The filesystem and block device under PATH.
Disk describe_disk(const fs::path& path) {
  Disk d;
  d.path = path.string();
  struct statvfs vfs {};
  if (statvfs(path.c_str(), &vfs) == 0) {
    d.fs_size_bytes = static_cast<std::uint64_t>(vfs.f_blocks) * vfs.f_frsize;
    d.fs_avail_bytes = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  }
  d.mount = find_mount(path);
  d.block = find_block_device(path);
  return d;
}

}  // namespace

int threads_or_all(int t) { return t > 0 ? t : omp_get_max_threads(); }

// ---- bound ---------------------------------------------------------------------

Bound measure_bound(const std::string& base, const std::string& target, int threads_opt, bool per_tensor) {
  const auto t0 = Clock::now();
  const int threads = threads_or_all(threads_opt);
  const hfdelta::Checkpoint a = hfdelta::open_checkpoint(base);
  const hfdelta::Checkpoint b = hfdelta::open_checkpoint(target);
  if (a.tensors.size() != b.tensors.size()) throw std::runtime_error("bound: BASE and NEW have different tensor sets");
  std::vector<hfdelta::MappedFile> ma, mb;
  for (const auto& s : a.shards) ma.emplace_back(a.dir / s.file);
  for (const auto& s : b.shards) mb.emplace_back(b.dir / s.file);

  std::vector<std::vector<std::uint64_t>> hists(static_cast<std::size_t>(threads));
  Bound sum;
  sum.base = base;
  sum.target = target;
  sum.threads = threads;
  if (per_tensor) sum.per_tensor.emplace();
  for (const auto& [name, rb] : b.tensors) {
    const auto ia = a.tensors.find(name);
    if (ia == a.tensors.end()) throw std::runtime_error("bound: " + name + " is not in BASE");
    const hfdelta::TensorInfo& tb = b.info(rb);
    const hfdelta::TensorInfo& ta = a.info(ia->second);
    if (ta.dtype != tb.dtype || ta.nbytes() != tb.nbytes())
      throw std::runtime_error("bound: " + name + " changes dtype or size");
    std::size_t w = hfdelta::dtype_size(tb.dtype);
    if (w == 0 || tb.nbytes() % w != 0) w = 1;
    const std::uint8_t* pa =
        ma[ia->second.shard].bytes(a.shards[ia->second.shard].header.file_offset(ta), ta.nbytes()).data();
    const std::uint8_t* pb = mb[rb.shard].bytes(b.shards[rb.shard].header.file_offset(tb), tb.nbytes()).data();
    // Tensors with a 2-byte context field are read once, for both bounds.
    const hfdelta::ContextField field = w == 2 ? hfdelta::context_field(tb.dtype, 2) : hfdelta::ContextField{};
    Counts t;
    double cond = 0;
    if (field.bits) {
      const ContextBound cb = bound_in_contexts(pa, pb, tb.nbytes() / 2, field, threads);
      t = cb.order0;
      cond = cb.conditioned_bits;
    } else {
      t = bound_tensor(pa, pb, tb.nbytes(), w, threads, hists);
      cond = t.position_bits + t.value_bits;
    }
    sum.tensors += 1;
    sum.elements += t.elements;
    sum.elements_changed += t.changed;
    sum.tensors_changed += t.changed ? 1 : 0;
    sum.tensor_bytes += tb.nbytes();
    sum.position_bits += t.position_bits;
    sum.value_bits += t.value_bits;
    sum.conditioned_bits += cond;
    if (per_tensor)
      sum.per_tensor->push_back({name, tb.dtype, w, t.elements, t.changed, t.distinct, t.position_bits, t.value_bits});
  }
  for (const auto& s : b.shards) sum.shard_bytes += s.header.file_size;
  sum.full_bytes = dir_bytes(target);
  sum.seconds = since(t0);
  return sum;
}

// ---- reading -------------------------------------------------------------------

double ReadFloor::best() const {
  return seconds.empty() ? warm_pass_s : *std::min_element(seconds.begin(), seconds.end());
}

ReadFloor measure_readfloor(const std::vector<std::string>& dirs, int repeat, int threads_opt, PassKind kind) {
  ReadFloor r;
  r.paths = dirs;
  r.kind = kind;
  r.threads = threads_or_all(threads_opt);
  const auto mode = kind.write_back ? hfdelta::File::Mode::read_write : hfdelta::File::Mode::read;
  std::vector<hfdelta::File> files;
  for (const auto& d : dirs) {
    if (fs::is_regular_file(d)) {
      files.emplace_back(d, mode);
    } else {
      const hfdelta::Checkpoint c = hfdelta::open_checkpoint(d);
      for (const auto& s : c.shards) files.emplace_back(c.dir / s.file, mode);
    }
  }
  r.files = files.size();
  for (const auto& f : files) r.bytes += f.size();
  const std::vector<Piece> pieces = cut_pieces(files);
  std::uint64_t sink = 0;
  r.warm_pass_s = read_pass(files, pieces, r.threads, &sink, kind);
  for (int i = 0; i < repeat; ++i) r.seconds.push_back(read_pass(files, pieces, r.threads, &sink, kind));
  r.checksum = sink & 0xff;
  return r;
}

Warm warm(const std::vector<std::string>& paths, int threads_opt) {
  const int threads = threads_or_all(threads_opt);
  std::vector<hfdelta::File> files;
  for (const auto& p : paths) {
    if (fs::is_regular_file(p)) {
      files.emplace_back(p, hfdelta::File::Mode::read);
    } else if (fs::is_directory(p)) {
      for (fs::recursive_directory_iterator it(p), end; it != end; ++it)
        if (fs::is_regular_file(it->symlink_status())) files.emplace_back(it->path(), hfdelta::File::Mode::read);
    } else {
      throw std::runtime_error("warm: " + p + ": not a file or directory");
    }
  }
  Warm r;
  r.files = files.size();
  std::uint64_t sink = 0;
  for (const auto& f : files) r.bytes += f.size();
  r.seconds = read_pass(files, cut_pieces(files), threads, &sink);
  return r;
}

// ---- run -----------------------------------------------------------------------

Run run_command(const std::vector<std::string>& command, const RunOptions& o) {
  if (command.empty()) throw std::runtime_error("run: no command");
  std::vector<std::string> argv = command;
  std::string time_file;
  if (o.time_v) {
    time_file = make_time_file();
    argv.insert(argv.begin(), {"/usr/bin/time", "-v", "-o", time_file});
  }
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);

  const auto t0 = Clock::now();
  const pid_t pid = spawn_command(args, o.stdout_file);
  const Samples sm = sample_until_exit(pid, o.interval_ms);
  Run r;
  r.wall_s = since(t0);
  r.argv = command;
  r.exit = WIFEXITED(sm.status) ? WEXITSTATUS(sm.status) : 128 + WTERMSIG(sm.status);
  r.user_s = static_cast<double>(sm.ru.ru_utime.tv_sec) + sm.ru.ru_utime.tv_usec / 1e6;
  r.sys_s = static_cast<double>(sm.ru.ru_stime.tv_sec) + sm.ru.ru_stime.tv_usec / 1e6;
  r.ru_maxrss_kib = sm.ru.ru_maxrss;
  r.peak_vm_rss_kib = sm.peak_rss;
  r.peak_rss_anon_kib = sm.peak_anon;
  r.samples = sm.count;
  r.interval_ms = o.interval_ms;
  if (o.time_v) {
    r.time_max_rss_kib = parse_time_v(time_file, "Maximum resident set size (kbytes)");
    ::unlink(time_file.c_str());
  }
  return r;
}

// ---- size and machine ----------------------------------------------------------

Size measure_size(const std::vector<std::string>& paths) {
  Size r;
  r.paths = paths;
  for (const auto& p : paths) r.bytes += dir_bytes(p, &r.files);
  return r;
}

Layout measure_layout(const std::vector<std::string>& paths) {
  Layout r;
  r.paths = paths;
  auto ends = [](const std::string& s, const std::string& suf) {
    return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
  };
  for (const auto& p : paths) {
    std::vector<fs::path> files;
    if (fs::is_directory(p)) {
      for (fs::recursive_directory_iterator it(p), end; it != end; ++it)
        if (fs::is_regular_file(it->symlink_status())) files.push_back(it->path());
    } else {
      files.emplace_back(p);
    }
    for (const auto& f : files) {
      const std::string name = f.filename().string();
      const std::uint64_t size = fs::file_size(f);
      ++r.files;
      r.bytes += size;
      if (ends(name, ".json")) {
        ++r.json_files;
        r.json_bytes += size;
      } else if (ends(name, ".safetensors")) {
        const hfdelta::SafetensorsHeader h = hfdelta::read_safetensors(f);
        ++r.safetensors_files;
        r.tensors += h.tensors.size();
        r.header_bytes += h.data_start();
      }
    }
  }
  return r;
}

Machine describe_machine(const std::string& path) {
  Machine m;
  describe_cpu(m);
  describe_memory(m);
  struct utsname u {};
  if (uname(&u) == 0) m.kernel = std::string(u.sysname) + " " + u.release + " " + u.machine;
  m.os = os_name();
  m.disk = describe_disk(path);
  return m;
}

}  // namespace bench
