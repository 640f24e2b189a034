// hfdelta-bench: the measuring half of scripts/bench.sh.
//
// Subcommands (each can append its result as one JSON line to a records file,
// with string labels added, so the script only has to name what it measured):
//   bound BASE NEW     order-0 entropy bound of the change between two checkpoints, and
//                      the bound given each base element's exponent (BF16, F16)
//   readfloor DIR...   wall time of reading every shard of the checkpoints from the page cache;
//                      --hash also checksums every byte (XXH3-128, as hfdelta does), --write-back
//                      also writes every buffer back where it was read (the same bytes; with
//                      --hash, hashed again as a checked patch hashes its result): the floors
//                      of a verified diff and of a verified in-place apply
//   warm PATH...       read every regular file once (fills the page cache)
//   run -- CMD...      run a command: wall time, max RSS (GNU time -v and wait4), and the
//                      peak VmRSS / RssAnon of its process tree, sampled from /proc
//   size PATH...       total bytes of the regular files under the paths
//   machine PATH       CPU, memory, kernel and the disk holding PATH
//   note               a record made of labels only
//   report RECORDS     builds results.md and results.json from a records file
//
// Not installed; benchmarks only.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <omp.h>

#include <CLI/CLI.hpp>
#include <boost/filesystem.hpp>
#include <nlohmann/json.hpp>

#include "hfdelta/checkpoint.hpp"
#include "hfdelta/codec.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/hash.hpp"
#include "hfdelta/io.hpp"
#include "hfdelta/safetensors.hpp"

namespace fs = boost::filesystem;
using nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int threads_or_all(int t) { return t > 0 ? t : omp_get_max_threads(); }

// ---- records -----------------------------------------------------------------

struct RecordOut {
  std::string append;               // JSONL file to append to ("" = none)
  std::vector<std::string> labels;  // "key=value"
};

void add_record_options(CLI::App* sub, RecordOut& r) {
  sub->add_option("--append", r.append, "Append the result as one JSON line to this file");
  sub->add_option("--label", r.labels, "KEY=VALUE added to the record (repeatable)")->allow_extra_args(false);
}

// Prints the record on stdout and appends it to the records file.
void emit(json rec, const std::string& kind, const RecordOut& r) {
  rec["kind"] = kind;
  for (const auto& l : r.labels) {
    const auto eq = l.find('=');
    if (eq == std::string::npos || eq == 0) throw std::runtime_error("--label " + l + ": expected KEY=VALUE");
    rec[l.substr(0, eq)] = l.substr(eq + 1);
  }
  const std::string line = rec.dump();
  std::cout << line << '\n';
  if (!r.append.empty()) {
    std::ofstream f(r.append, std::ios::app);
    f << line << '\n';
    if (!f) throw std::runtime_error(r.append + ": cannot append");
  }
}

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

struct TensorBound {
  std::uint64_t elements = 0, changed = 0, distinct = 0;
  double position_bits = 0, value_bits = 0;
};

// Counts changed elements of width W (1 or 2 bytes) with a histogram of the
// XOR values, in parallel over chunks of the tensor.
template <class T>
TensorBound bound_small(const std::uint8_t* a, const std::uint8_t* b, std::uint64_t n, int threads,
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
  TensorBound r;
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
TensorBound bound_wide(const std::uint8_t* a, const std::uint8_t* b, std::uint64_t n, int threads) {
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
  TensorBound r;
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
  TensorBound order0;
  double conditioned_bits = 0;
};

ContextBound bound_in_contexts(const std::uint8_t* a, const std::uint8_t* b, std::uint64_t n, hfdelta::ContextField f,
                               int threads) {
  const std::size_t contexts = std::size_t{1} << f.bits;
  std::vector<std::uint64_t> per_n(contexts, 0);
  std::vector<std::vector<std::uint32_t>> parts(static_cast<std::size_t>(threads));  // context << 16 | xor
  std::vector<std::vector<std::uint64_t>> counts(static_cast<std::size_t>(threads), std::vector<std::uint64_t>(contexts, 0));
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
      if (const std::uint16_t x = static_cast<std::uint16_t>(va ^ load<std::uint16_t>(b + 2 * i))) out.push_back(c << 16 | x);
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
TensorBound bound_tensor(const std::uint8_t* pa, const std::uint8_t* pb, std::uint64_t nbytes, std::size_t& w,
                         int threads, std::vector<std::vector<std::uint64_t>>& hists) {
  const std::uint64_t n = nbytes / w;
  switch (w) {
    case 1: return bound_small<std::uint8_t>(pa, pb, n, threads, hists);
    case 2: return bound_small<std::uint16_t>(pa, pb, n, threads, hists);
    case 4: return bound_wide<std::uint32_t>(pa, pb, n, threads);
    case 8: return bound_wide<std::uint64_t>(pa, pb, n, threads);
    default: w = 1; return bound_small<std::uint8_t>(pa, pb, nbytes, threads, hists);
  }
}

// The sums over every tensor.
struct BoundTotals {
  std::uint64_t elements = 0, changed = 0, n_changed = 0, tensor_bytes = 0;
  double pos_bits = 0, val_bits = 0;
  double cond_bits = 0;            // conditioned on the base exponent (2-byte context fields; else the order-0 bits)
  json tensors = json::array();  // per tensor, with --per-tensor
};

json cmd_bound(const fs::path& base, const fs::path& target, int threads_opt, bool per_tensor) {
  const auto t0 = Clock::now();
  const int threads = threads_or_all(threads_opt);
  const hfdelta::Checkpoint a = hfdelta::open_checkpoint(base);
  const hfdelta::Checkpoint b = hfdelta::open_checkpoint(target);
  if (a.tensors.size() != b.tensors.size())
    throw std::runtime_error("bound: BASE and NEW have different tensor sets");
  std::vector<hfdelta::MappedFile> ma, mb;
  for (const auto& s : a.shards) ma.emplace_back(a.dir / s.file);
  for (const auto& s : b.shards) mb.emplace_back(b.dir / s.file);

  std::vector<std::vector<std::uint64_t>> hists(static_cast<std::size_t>(threads));
  BoundTotals sum;
  for (const auto& [name, rb] : b.tensors) {
    const auto ia = a.tensors.find(name);
    if (ia == a.tensors.end()) throw std::runtime_error("bound: " + name + " is not in BASE");
    const hfdelta::TensorInfo& tb = b.info(rb);
    const hfdelta::TensorInfo& ta = a.info(ia->second);
    if (ta.dtype != tb.dtype || ta.nbytes() != tb.nbytes())
      throw std::runtime_error("bound: " + name + " changes dtype or size");
    std::size_t w = hfdelta::dtype_size(tb.dtype);
    if (w == 0 || tb.nbytes() % w != 0) w = 1;
    const std::uint8_t* pa = ma[ia->second.shard].bytes(a.shards[ia->second.shard].header.file_offset(ta), ta.nbytes()).data();
    const std::uint8_t* pb = mb[rb.shard].bytes(b.shards[rb.shard].header.file_offset(tb), tb.nbytes()).data();
    // Tensors with a 2-byte context field are read once, for both bounds.
    const hfdelta::ContextField field = w == 2 ? hfdelta::context_field(tb.dtype, 2) : hfdelta::ContextField{};
    TensorBound t;
    double cond = 0;
    if (field.bits) {
      const ContextBound cb = bound_in_contexts(pa, pb, tb.nbytes() / 2, field, threads);
      t = cb.order0;
      cond = cb.conditioned_bits;
    } else {
      t = bound_tensor(pa, pb, tb.nbytes(), w, threads, hists);
      cond = t.position_bits + t.value_bits;
    }
    sum.elements += t.elements;
    sum.changed += t.changed;
    sum.n_changed += t.changed ? 1 : 0;
    sum.tensor_bytes += tb.nbytes();
    sum.pos_bits += t.position_bits;
    sum.val_bits += t.value_bits;
    sum.cond_bits += cond;
    if (per_tensor)
      sum.tensors.push_back({{"name", name}, {"dtype", tb.dtype}, {"width", w}, {"elements", t.elements},
                             {"changed", t.changed}, {"distinct_xor", t.distinct},
                             {"position_bits", t.position_bits}, {"value_bits", t.value_bits}});
  }
  std::uint64_t shard_bytes = 0;
  for (const auto& s : b.shards) shard_bytes += s.header.file_size;
  json r = {{"base", base.string()},
            {"new", target.string()},
            {"tensors", b.tensors.size()},
            {"tensors_changed", sum.n_changed},
            {"elements", sum.elements},
            {"elements_changed", sum.changed},
            {"density", sum.elements ? static_cast<double>(sum.changed) / static_cast<double>(sum.elements) : 0.0},
            {"tensor_bytes", sum.tensor_bytes},
            {"shard_bytes", shard_bytes},
            {"full_bytes", dir_bytes(target)},
            {"position_bits", sum.pos_bits},
            {"value_bits", sum.val_bits},
            {"bound_bytes", (sum.pos_bits + sum.val_bits) / 8},
            {"conditioned_bound_bytes", sum.cond_bits / 8},
            {"threads", threads},
            {"seconds", since(t0)}};
  if (per_tensor) r["per_tensor"] = sum.tensors;
  return r;
}

// ---- reading -------------------------------------------------------------------

struct Piece {
  std::size_t file;
  std::uint64_t offset, len;
};

// One pass reading every piece through pread into a 1 MiB buffer per thread.
// What a floor pass does besides reading.
struct PassKind {
  bool hash = false;        // XXH3-128 of every byte read (per piece)
  bool write_back = false;  // every buffer written back where it was read; with `hash`, hashed
                            // twice: as the base and as the result of a checked patch
};

double read_pass(std::vector<hfdelta::File>& files, const std::vector<Piece>& pieces, int threads,
                 std::uint64_t* sink, PassKind kind = {}) {
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

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

json cmd_readfloor(const std::vector<std::string>& dirs, int repeat, int threads_opt, PassKind kind) {
  const int threads = threads_or_all(threads_opt);
  const auto mode = kind.write_back ? hfdelta::File::Mode::read_write : hfdelta::File::Mode::read;
  std::vector<hfdelta::File> files;
  std::uint64_t bytes = 0;
  for (const auto& d : dirs) {
    if (fs::is_regular_file(d)) {
      files.emplace_back(d, mode);
    } else {
      const hfdelta::Checkpoint c = hfdelta::open_checkpoint(d);
      for (const auto& s : c.shards) files.emplace_back(c.dir / s.file, mode);
    }
  }
  for (const auto& f : files) bytes += f.size();
  const std::vector<Piece> pieces = cut_pieces(files);
  std::uint64_t sink = 0;
  const double warm = read_pass(files, pieces, threads, &sink, kind);
  std::vector<double> secs;
  for (int i = 0; i < repeat; ++i) secs.push_back(read_pass(files, pieces, threads, &sink, kind));
  const double best = secs.empty() ? warm : *std::min_element(secs.begin(), secs.end());
  return {{"paths", dirs},          {"files", files.size()}, {"bytes", bytes},
          {"hash", kind.hash},      {"write_back", kind.write_back},
          {"threads", threads},     {"warm_pass_s", warm},   {"seconds", secs},
          {"min_s", best},          {"median_s", median(secs)},
          {"gb_per_s", best > 0 ? static_cast<double>(bytes) / best / 1e9 : 0.0},
          {"checksum", sink & 0xff}};
}

json cmd_warm(const std::vector<std::string>& paths, int threads_opt) {
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
  std::uint64_t bytes = 0, sink = 0;
  for (const auto& f : files) bytes += f.size();
  const double s = read_pass(files, cut_pieces(files), threads, &sink);
  return {{"files", files.size()}, {"bytes", bytes}, {"seconds", s}};
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

json cmd_run(std::vector<std::string> argv, const std::string& stdout_file, double interval_ms, bool time_v,
             int& exit_code) {
  if (argv.empty()) throw std::runtime_error("run: no command");
  std::string time_file;
  if (time_v) {
    time_file = make_time_file();
    argv.insert(argv.begin(), {"/usr/bin/time", "-v", "-o", time_file});
  }
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);

  const auto t0 = Clock::now();
  const pid_t pid = spawn_command(args, stdout_file);
  const Samples sm = sample_until_exit(pid, interval_ms);
  const double wall = since(t0);
  exit_code = WIFEXITED(sm.status) ? WEXITSTATUS(sm.status) : 128 + WTERMSIG(sm.status);
  json r = {{"argv", argv},
            {"exit", exit_code},
            {"wall_s", wall},
            {"user_s", static_cast<double>(sm.ru.ru_utime.tv_sec) + sm.ru.ru_utime.tv_usec / 1e6},
            {"sys_s", static_cast<double>(sm.ru.ru_stime.tv_sec) + sm.ru.ru_stime.tv_usec / 1e6},
            {"ru_maxrss_kib", sm.ru.ru_maxrss},
            {"peak_vm_rss_kib", sm.peak_rss},
            {"peak_rss_anon_kib", sm.peak_anon},
            {"samples", sm.count},
            {"interval_ms", interval_ms}};
  if (time_v) {
    r["argv"] = std::vector<std::string>(argv.begin() + 4, argv.end());
    if (auto v = parse_time_v(time_file, "Maximum resident set size (kbytes)")) r["time_max_rss_kib"] = *v;
    ::unlink(time_file.c_str());
  }
  return r;
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
void describe_cpu(json& m) {
  cpu_set_t set;
  CPU_ZERO(&set);
  m["nproc"] = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
  m["hardware_threads"] = std::thread::hardware_concurrency();
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      m["cpu_model"] = line.substr(line.find(':') + 2);
      break;
    }
}

// Total and available memory.
void describe_memory(json& m) {
  std::ifstream f("/proc/meminfo");
  std::string key;
  std::uint64_t kb;
  std::string unit;
  while (f >> key >> kb) {
    std::getline(f, unit);
    if (key == "MemTotal:") m["mem_total_bytes"] = kb * 1024;
    if (key == "MemAvailable:") m["mem_available_bytes"] = kb * 1024;
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
void describe_mount(json& d, const fs::path& path) {
  const std::string abs = fs::canonical(path).string();
  std::ifstream f("/proc/mounts");
  std::string dev, mnt, type, rest;
  std::size_t best = 0;
  while (f >> dev >> mnt >> type && std::getline(f, rest))
    if (abs.rfind(mnt, 0) == 0 && mnt.size() >= best && (abs.size() == mnt.size() || mnt == "/" || abs[mnt.size()] == '/')) {
      best = mnt.size();
      d["device"] = dev;
      d["mount"] = mnt;
      d["fs_type"] = type;
    }
}

// The block device under PATH, from /sys/dev/block (the whole disk, not the partition).
void describe_block_device(json& d, const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;
  fs::path sys = "/sys/dev/block/" + std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
  boost::system::error_code ec;
  fs::path real = fs::canonical(sys, ec);
  if (ec) return;
  if (fs::exists(real / "partition")) real = real.parent_path();
  d["block_device"] = real.filename().string();
  d["rotational"] = first_line(real / "queue/rotational");
  d["model"] = first_line(real / "device/model");
  d["vendor"] = first_line(real / "device/vendor");
  const std::string size = first_line(real / "size");
  d["size_bytes"] = size.empty() ? 0ull : std::strtoull(size.c_str(), nullptr, 10) * 512;
}

// The filesystem and block device under PATH.
json describe_disk(const fs::path& path) {
  json d;
  d["path"] = path.string();
  struct statvfs vfs {};
  if (statvfs(path.c_str(), &vfs) == 0) {
    d["fs_size_bytes"] = static_cast<std::uint64_t>(vfs.f_blocks) * vfs.f_frsize;
    d["fs_avail_bytes"] = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  }
  describe_mount(d, path);
  describe_block_device(d, path);
  return d;
}

json cmd_machine(const fs::path& path) {
  json m;
  describe_cpu(m);
  describe_memory(m);
  struct utsname u {};
  if (uname(&u) == 0) m["kernel"] = std::string(u.sysname) + " " + u.release + " " + u.machine;
  m["os"] = os_name();
  m["disk"] = describe_disk(path);
  return m;
}

// ---- report --------------------------------------------------------------------

std::string lab(const json& r, const char* key) {
  const auto it = r.find(key);
  if (it == r.end()) return "";
  return it->is_string() ? it->get<std::string>() : it->dump();
}

double num(const json& r, const char* key, double dflt = NAN) {
  const auto it = r.find(key);
  if (it == r.end() || it->is_null()) return dflt;
  if (it->is_number()) return it->get<double>();
  if (it->is_string()) return std::strtod(it->get<std::string>().c_str(), nullptr);
  return dflt;
}

// a = max(a, b), where NAN stands for "not measured".
void keep_max(double& a, double b) {
  if (!std::isnan(b)) a = std::isnan(a) ? b : std::max(a, b);
}

struct Stat {
  std::vector<double> walls, cpus;  // wall and user+sys seconds of each run
  double max_rss_kib = NAN, peak_anon_kib = NAN, peak_vm_rss_kib = NAN;
  bool empty() const { return walls.empty(); }
  double min() const { return walls.empty() ? NAN : *std::min_element(walls.begin(), walls.end()); }
  double med() const { return median(walls); }
  // CPU seconds of the fastest run.
  double cpu() const {
    return walls.empty() ? NAN : cpus[static_cast<std::size_t>(std::min_element(walls.begin(), walls.end()) - walls.begin())];
  }
  void add(const json& r) {
    walls.push_back(num(r, "wall_s"));
    cpus.push_back(num(r, "user_s", 0) + num(r, "sys_s", 0));
    keep_max(max_rss_kib, num(r, "time_max_rss_kib", num(r, "ru_maxrss_kib")));
    keep_max(peak_anon_kib, num(r, "peak_rss_anon_kib"));
    keep_max(peak_vm_rss_kib, num(r, "peak_vm_rss_kib"));
  }
  json to_json() const {
    if (empty()) return nullptr;
    auto n = [](double v) -> json { return std::isnan(v) ? json(nullptr) : json(v); };
    return {{"runs", walls.size()},        {"wall_s", walls},           {"cpu_s", cpus},
            {"min_s", min()},              {"median_s", med()},
            {"max_rss_kib", n(max_rss_kib)}, {"peak_rss_anon_kib", n(peak_anon_kib)},
            {"peak_vm_rss_kib", n(peak_vm_rss_kib)}};
  }
};

struct ToolData {
  double wire = NAN;
  std::map<std::string, Stat> modes;  // diff, diff_1t, apply, apply_nosync, apply_nosync_1t
  const Stat* mode(const std::string& m) const {
    const auto it = modes.find(m);
    return it == modes.end() || it->second.empty() ? nullptr : &it->second;
  }
  double peak_anon() const {
    double a = NAN;
    for (const auto& [k, s] : modes) keep_max(a, s.peak_anon_kib);
    return a;
  }
};

struct PairData {
  std::string lr;
  int pair = 0;
  json bound;
  double floor_inputs = NAN, floor_local = NAN;
  // The floors of verified work: reading and hashing BASE+NEW (what any
  // checked diff reads), and reading, hashing and writing back LOCAL (what an
  // in-place apply does where every page holds a change).
  double floor_inputs_hashed = NAN, floor_local_rewrite = NAN;
  std::vector<std::string> tool_order;
  std::map<std::string, ToolData> tools;
  ToolData& tool(const std::string& t) {
    if (!tools.count(t)) tool_order.push_back(t);
    return tools[t];
  }
  const ToolData* find(const std::string& t) const {
    const auto it = tools.find(t);
    return it == tools.end() ? nullptr : &it->second;
  }
};

bool is_hfdelta(const std::string& tool) { return tool.rfind("hfdelta-", 0) == 0; }

std::string fmt(const char* f, double v) {
  if (std::isnan(v)) return "–";
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string mib(double bytes) {
  if (std::isnan(bytes)) return "–";
  char b[64];
  if (bytes >= 1e9)
    std::snprintf(b, sizeof b, "%.3f GB", bytes / 1e9);
  else if (bytes >= 1e6)
    std::snprintf(b, sizeof b, "%.2f MB", bytes / 1e6);
  else
    std::snprintf(b, sizeof b, "%.1f kB", bytes / 1e3);
  return b;
}

std::string kib_mib(double kib) { return std::isnan(kib) ? "–" : fmt("%.1f MiB", kib / 1024); }

double ratio(double a, double b) { return std::isnan(a) || std::isnan(b) || b == 0 ? NAN : a / b; }

json jnum(double v) { return std::isnan(v) ? json(nullptr) : json(v); }

bool same_lr(const std::string& a, const std::string& b) {
  const double x = std::strtod(a.c_str(), nullptr), y = std::strtod(b.c_str(), nullptr);
  return a == b || (x != 0 && std::fabs(x - y) <= 1e-9 * std::fabs(x));
}

// ---- report: the records, sorted -------------------------------------------------------

std::vector<json> read_records(const std::string& records_file) {
  std::vector<json> recs;
  std::ifstream f(records_file);
  if (!f) throw std::runtime_error(records_file + ": cannot read");
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) recs.push_back(json::parse(line));
  return recs;
}

using ToolMap = std::map<std::string, ToolData>;  // tool -> data

// What the records say, sorted by what they describe.
struct Records {
  std::vector<json> all;
  json machine, config = json::object(), marked_rec;
  std::vector<json> versions, loads, timings;
  std::vector<PairData> pairs;  // main series
  // Memory series: preset -> tool -> data.
  std::map<std::string, ToolMap> mem;
  std::map<std::string, double> mem_full;
  // Squash series: chain kind -> chain, squashed or direct -> data.
  std::map<std::string, ToolMap> squash;
  std::vector<std::string> squash_order;  // chain kinds in the order the script ran them

  PairData& pair_of(const std::string& lr, int pair) {
    for (auto& p : pairs)
      if (p.lr == lr && p.pair == pair) return p;
    pairs.push_back({});
    pairs.back().lr = lr;
    pairs.back().pair = pair;
    return pairs.back();
  }
};

// The run's setup and notes (machine, config, version, load, timing, marked), whatever their series.
void add_setup_record(Records& rs, const json& r, const std::string& kind) {
  if (kind == "machine") rs.machine = r;
  else if (kind == "config") rs.config.update(r);
  else if (kind == "version") rs.versions.push_back(r);
  else if (kind == "load") rs.loads.push_back(r);
  else if (kind == "timing") rs.timings.push_back(r);
  else if (kind == "marked") rs.marked_rec = r;
}

void add_mem_record(Records& rs, const json& r, const std::string& kind) {
  const std::string preset = lab(r, "preset");
  if (kind == "run") rs.mem[preset][lab(r, "tool")].modes[lab(r, "mode")].add(r);
  if (kind == "size") rs.mem[preset][lab(r, "tool")].wire = num(r, "bytes");
  if (kind == "bound") rs.mem_full[preset] = num(r, "full_bytes");
}

void add_squash_record(Records& rs, const json& r, const std::string& kind) {
  if (!rs.squash.count(lab(r, "chain"))) rs.squash_order.push_back(lab(r, "chain"));
  ToolData& d = rs.squash[lab(r, "chain")][lab(r, "tool")];
  if (kind == "run") d.modes[lab(r, "mode")].add(r);
  if (kind == "size") d.wire = num(r, "bytes");
}

void add_main_record(Records& rs, const json& r, const std::string& kind) {
  const std::string lr = lab(r, "lr");
  const int pair = std::atoi(lab(r, "pair").c_str());
  if (kind == "bound") rs.pair_of(lr, pair).bound = r;
  else if (kind == "readfloor") {
    PairData& p = rs.pair_of(lr, pair);
    const std::string what = lab(r, "what");
    (what == "local" ? p.floor_local : what == "local_rewrite" ? p.floor_local_rewrite
                                     : what == "inputs_hashed" ? p.floor_inputs_hashed
                                                               : p.floor_inputs) = num(r, "min_s");
  } else if (kind == "run") rs.pair_of(lr, pair).tool(lab(r, "tool")).modes[lab(r, "mode")].add(r);
  else if (kind == "size") rs.pair_of(lr, pair).tool(lab(r, "tool")).wire = num(r, "bytes");
}

// Pairs by lr, then pair; in each, hfdelta encodings first, then the peers,
// each in order of first appearance.
void order_pairs(std::vector<PairData>& pairs) {
  std::stable_sort(pairs.begin(), pairs.end(), [](const PairData& a, const PairData& b) {
    const double x = std::strtod(a.lr.c_str(), nullptr), y = std::strtod(b.lr.c_str(), nullptr);
    return x != y ? x < y : a.pair < b.pair;
  });
  for (auto& p : pairs) std::stable_partition(p.tool_order.begin(), p.tool_order.end(), is_hfdelta);
}

Records sort_records(std::vector<json> recs) {
  Records rs;
  rs.all = std::move(recs);
  for (const json& r : rs.all) {
    const std::string kind = lab(r, "kind"), series = lab(r, "series");
    add_setup_record(rs, r, kind);
    if (series == "mem") add_mem_record(rs, r, kind);
    else if (series == "squash") add_squash_record(rs, r, kind);
    else if (series == "main") add_main_record(rs, r, kind);
  }
  order_pairs(rs.pairs);
  return rs;
}

// The marked pair: as recorded by the script, else the median by density at the target lr.
const PairData* find_marked(const Records& rs, const std::string& target_lr) {
  const PairData* marked = nullptr;
  if (!rs.marked_rec.is_null()) {
    for (const auto& p : rs.pairs)
      if (same_lr(p.lr, lab(rs.marked_rec, "lr")) && p.pair == std::atoi(lab(rs.marked_rec, "pair").c_str())) marked = &p;
  } else {
    std::vector<const PairData*> at;
    for (const auto& p : rs.pairs)
      if (same_lr(p.lr, target_lr)) at.push_back(&p);
    std::stable_sort(at.begin(), at.end(),
                     [](auto* a, auto* b) { return num(a->bound, "density") < num(b->bound, "density"); });
    if (!at.empty()) marked = at[(at.size() - 1) / 2];
  }
  return marked;
}

// ---- report: the Markdown introduction ---------------------------------------------------

// The report under construction: the sorted records and the Markdown so far.
struct Report {
  Report(const Records& records, const std::string& lr)
      : rs(records), target_lr(lr), preset(records.config.value("preset", std::string("?"))),
        marked(find_marked(records, lr)) {}

  const Records& rs;
  const std::string target_lr, preset;
  const PairData* const marked;
  std::ostringstream md;

  std::string pair_name(const PairData& p) const {
    return fmt("%.0f", p.pair - 1) + "→" + std::to_string(p.pair) + (&p == marked ? " ★" : "");
  }
};

void md_setup(Report& rep) {
  const json& config = rep.rs.config;
  const std::string peers = config.value("peer_pairs", "?");
  rep.md << "# hfdelta benchmark\n\n";
  rep.md << "Preset `" << rep.preset << "`, " << config.value("saves", "?") << " saves after the initial one per learning rate, "
         << "learning rates " << config.value("lrs", "?") << ", steps per save " << config.value("steps_per_save", "1")
         << "; peers and 1-thread runs at "
         << (peers == "all" ? "every pair" : peers == "median" ? "the median pair of each lr" : "the marked pair only")
         << ". Commit " << config.value("commit", "?") << ", started " << config.value("started", "?") << ".\n\n";
}

void md_machine(Report& rep) {
  const json& machine = rep.rs.machine;
  if (machine.is_null()) return;
  const json& d = machine.value("disk", json::object());
  rep.md << "Machine: " << machine.value("nproc", 0) << " CPUs (" << machine.value("cpu_model", std::string("?")) << "), "
         << fmt("%.1f GiB", machine.value("mem_total_bytes", 0.0) / (1024.0 * 1024 * 1024)) << " memory, "
         << machine.value("kernel", std::string("?")) << ", " << machine.value("os", std::string("")) << "; disk "
         << d.value("device", std::string("?")) << " (" << d.value("fs_type", std::string("?")) << ", model "
         << (d.value("model", std::string()).empty() ? "unknown" : d.value("model", std::string())) << ", rotational "
         << d.value("rotational", std::string("?")) << ", " << mib(d.value("fs_size_bytes", 0.0)) << ").\n\n";
}

void md_versions(Report& rep) {
  const std::vector<json>& versions = rep.rs.versions;
  if (versions.empty()) return;
  rep.md << "Peers (Debian package versions):";
  for (std::size_t i = 0; i < versions.size(); ++i)
    rep.md << (i ? ", " : " ") << lab(versions[i], "tool") << " " << lab(versions[i], "version");
  rep.md << ".\n\n";
}

void md_method(Report& rep) {
  const json& config = rep.rs.config;
  rep.md << "Method: every timed step runs with the page cache warm (its inputs are read once right before it, "
            "after a `sync`), "
         << config.value("repeat", "2")
         << " runs each; times below are the **minimum** of the runs (results.json has every run and the median). "
            "Peak RSS is GNU time's maximum resident set size; peak RssAnon is the largest sum of RssAnon over the "
            "command's process tree, sampled from /proc every "
         << config.value("interval_ms", "5")
         << " ms (mapped file pages are not anonymous memory). Read floor: one warm pass of pread into a 1 MiB buffer "
            "per thread over every shard file, all threads, minimum of 3 passes. hfdelta applies into a LOCAL made with "
            "`delta-apply --init` before each run; the peers (`zstd -3 --long=31 --patch-from`, `xdelta3 -e -s` with its "
            "default settings, `rsync -a -I --no-whole-file --only-write-batch` / `--read-batch`) rebuild NEW beside "
            "BASE and never flush, so they compare with `--no-sync`. zstd and xdelta3 work per shard file (summed; the "
            "other files of the checkpoint do not change between saves); every apply result is checked with cmp "
            "against NEW. Order-0 bound: per tensor N·H(k/N) bits for the positions plus "
            "Σ c_v·log2(k/c_v) bits for the changed elements' XOR values at element width.\n\n";
}

void md_loads(Report& rep) {
  const std::vector<json>& loads = rep.rs.loads;
  if (loads.empty()) return;
  double lo = 1e9, hi = 0;
  for (const auto& l : loads) {
    lo = std::min(lo, num(l, "load1", 0));
    hi = std::max(hi, num(l, "load1", 0));
  }
  rep.md << "Load average (1 min) seen at the start of each pair: " << fmt("%.2f", lo) << " to " << fmt("%.2f", hi)
         << " (other work on the machine makes times noisier).\n\n";
}

// ---- report: the tables of every pair -----------------------------------------------------

void md_pairs(Report& rep) {
  rep.md << "## Pairs\n\n| lr | pair | density | full checkpoint | order-0 bound | bound/full | "
            "bound given the base exponent | /order-0 | read floor BASE+NEW | read floor LOCAL | read+hash BASE+NEW | "
            "read+hash+write-back LOCAL |\n"
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& p : rep.rs.pairs) {
    rep.md << "| " << p.lr << " | " << rep.pair_name(p) << " | " << fmt("%.3f%%", 100 * num(p.bound, "density")) << " | "
           << mib(num(p.bound, "full_bytes")) << " | " << mib(num(p.bound, "bound_bytes")) << " | "
           << fmt("%.2f%%", 100 * ratio(num(p.bound, "bound_bytes"), num(p.bound, "full_bytes"))) << " | "
           << mib(num(p.bound, "conditioned_bound_bytes")) << " | "
           << fmt("%.3f", ratio(num(p.bound, "conditioned_bound_bytes"), num(p.bound, "bound_bytes"))) << " | "
           << fmt("%.3f s", p.floor_inputs) << " | " << fmt("%.3f s", p.floor_local) << " | "
           << fmt("%.3f s", p.floor_inputs_hashed) << " (" << fmt("%.2f×", ratio(p.floor_inputs_hashed, p.floor_inputs))
           << ") | " << fmt("%.3f s", p.floor_local_rewrite) << " ("
           << fmt("%.2f×", ratio(p.floor_local_rewrite, p.floor_local)) << ") |\n";
  }
  rep.md << "\n★ the marked pair: median density at lr " << rep.target_lr
         << ". The last two columns (× their read floor) are the floors of verified work: reading and hashing "
            "(XXH3-128) BASE+NEW, which any diff that records checksums does, and reading LOCAL, hashing it as the "
            "base and again as the result, and writing every page back, which a checked in-place apply does once "
            "every page holds a change (at these densities all do).\n\n";
}

void md_wire(Report& rep) {
  rep.md << "## Wire bytes\n\n| lr | pair | tool | wire | wire/bound | wire/xor | wire/full |\n|---|---|---|---:|---:|---:|---:|\n";
  for (const auto& p : rep.rs.pairs) {
    const ToolData* x = p.find("hfdelta-xor");
    for (const auto& t : p.tool_order) {
      const ToolData& d = p.tools.at(t);
      rep.md << "| " << p.lr << " | " << rep.pair_name(p) << " | " << t << " | " << mib(d.wire) << " | "
             << fmt("%.3f", ratio(d.wire, num(p.bound, "bound_bytes"))) << " | "
             << fmt("%.3f", ratio(d.wire, x ? x->wire : NAN)) << " | "
             << fmt("%.2f%%", 100 * ratio(d.wire, num(p.bound, "full_bytes"))) << " |\n";
    }
  }
}

void md_diff(Report& rep) {
  rep.md << "\n## Diff (BASE, NEW → delta)\n\n| lr | pair | tool | wall | CPU | diff/read floor | /read+hash floor | 1 thread | 1 thread/all | peak RSS | peak RssAnon |\n"
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& p : rep.rs.pairs)
    for (const auto& t : p.tool_order) {
      const ToolData& d = p.tools.at(t);
      const Stat* s = d.mode("diff");
      const Stat* s1 = d.mode("diff_1t");
      if (!s) continue;
      rep.md << "| " << p.lr << " | " << rep.pair_name(p) << " | " << t << " | " << fmt("%.3f s", s->min()) << " | "
             << fmt("%.2f s", s->cpu()) << " | " << fmt("%.2f", ratio(s->min(), p.floor_inputs)) << " | "
             << fmt("%.2f", ratio(s->min(), p.floor_inputs_hashed)) << " | " << fmt("%.3f s", s1 ? s1->min() : NAN) << " | " << fmt("%.2f", s1 ? ratio(s1->min(), s->min()) : NAN)
             << " | " << kib_mib(s->max_rss_kib) << " | " << kib_mib(s->peak_anon_kib) << " |\n";
    }
}

// One row of the apply table: a peer's only apply stands in the --no-sync column.
void md_apply_row(Report& rep, const PairData& p, const std::string& t, const ToolData& d) {
  const Stat* a = d.mode("apply");
  const Stat* n = d.mode("apply_nosync");
  const Stat* n1 = d.mode("apply_nosync_1t");
  if (!a && !n) return;
  double rss = NAN, anon = NAN;
  for (const Stat* s : {a, n, n1})
    if (s) {
      keep_max(rss, s->max_rss_kib);
      keep_max(anon, s->peak_anon_kib);
    }
  const bool peer = !is_hfdelta(t);
  const Stat* nosync = peer ? a : n;
  rep.md << "| " << p.lr << " | " << rep.pair_name(p) << " | " << t << " | "
         << (peer ? "–" : fmt("%.3f s", a ? a->min() : NAN)) << " | "
         << (peer ? "–" : fmt("%.2f", a ? ratio(a->min(), p.floor_local) : NAN)) << " | "
         << fmt("%.3f s", nosync ? nosync->min() : NAN) << " | "
         << fmt("%.2f", ratio(nosync ? nosync->min() : NAN, p.floor_local)) << " | "
         << fmt("%.2f", ratio(nosync ? nosync->min() : NAN, p.floor_local_rewrite)) << " | "
         << fmt("%.2f s", nosync ? nosync->cpu() : NAN) << " | " << fmt("%.3f s", n1 ? n1->min() : NAN) << " | "
         << fmt("%.2f", n1 && n ? ratio(n1->min(), n->min()) : NAN) << " | " << kib_mib(rss) << " | "
         << kib_mib(anon) << " |\n";
}

void md_apply(Report& rep) {
  rep.md << "\n## Apply (delta → LOCAL)\n\n| lr | pair | tool | wall (flushing) | /read floor | wall --no-sync | /read floor | /rewrite floor | CPU | 1 thread --no-sync | 1 thread/all | peak RSS | peak RssAnon |\n"
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& p : rep.rs.pairs)
    for (const auto& t : p.tool_order) md_apply_row(rep, p, t, p.tools.at(t));
  rep.md << "\nPeers never flush, so their apply time stands in the --no-sync column. Rewrite floor: reading LOCAL, "
            "hashing it twice and writing it back (see Pairs). CPU: user + sys seconds of the "
            "fastest run (all threads together); wall above CPU means waiting: for the disk, or for a core that other "
            "work holds.\n";
}

// results.json's figures of one tool at one pair.
json tool_json(const PairData& p, const std::string& t, const ToolData& d) {
  const ToolData* x = p.find("hfdelta-xor");
  json modes = json::object();
  for (const auto& [m, s] : d.modes) modes[m] = s.to_json();
  const Stat* diff = d.mode("diff");
  const Stat* diff1 = d.mode("diff_1t");
  const Stat* ap = d.mode(is_hfdelta(t) ? "apply_nosync" : "apply");
  const Stat* ap1 = d.mode("apply_nosync_1t");
  return {{"wire_bytes", jnum(d.wire)},
          {"modes", modes},
          {"ratios",
           {{"wire_over_bound", jnum(ratio(d.wire, num(p.bound, "bound_bytes")))},
            {"wire_over_xor", jnum(ratio(d.wire, x ? x->wire : NAN))},
            {"wire_over_full", jnum(ratio(d.wire, num(p.bound, "full_bytes")))},
            {"diff_over_read_floor", jnum(diff ? ratio(diff->min(), p.floor_inputs) : NAN)},
            {"apply_nosync_over_read_floor", jnum(ap ? ratio(ap->min(), p.floor_local) : NAN)},
            {"apply_over_read_floor", jnum(d.mode("apply") ? ratio(d.mode("apply")->min(), p.floor_local) : NAN)},
            {"diff_1thread_over_all", jnum(diff && diff1 ? ratio(diff1->min(), diff->min()) : NAN)},
            {"apply_1thread_over_all", jnum(ap && ap1 ? ratio(ap1->min(), ap->min()) : NAN)}}}};
}

json pairs_json(const Report& rep) {
  json jpairs = json::array();
  for (const auto& p : rep.rs.pairs) {
    json jp = {{"lr", p.lr}, {"pair", p.pair}, {"base", "save_" + fmt("%03.0f", p.pair - 1)},
               {"new", "save_" + fmt("%03.0f", p.pair)}, {"marked", &p == rep.marked}, {"bound", p.bound},
               {"read_floor_inputs_s", jnum(p.floor_inputs)}, {"read_floor_local_s", jnum(p.floor_local)},
               {"read_hash_floor_inputs_s", jnum(p.floor_inputs_hashed)},
               {"read_hash_write_back_floor_local_s", jnum(p.floor_local_rewrite)}};
    json jt = json::object();
    for (const auto& t : p.tool_order) jt[t] = tool_json(p, t, p.tools.at(t));
    jp["tools"] = jt;
    jpairs.push_back(jp);
  }
  return jpairs;
}

// ---- report: the targets at the marked pair -------------------------------------------------

// The best peer figures at one pair, and which peer has each.
struct BestPeers {
  double wire = NAN, diff = NAN, apply = NAN;
  std::string wire_name, diff_name, apply_name;
};

BestPeers best_peers(const PairData& p) {
  BestPeers b;
  for (const auto& t : p.tool_order) {
    if (is_hfdelta(t)) continue;
    const ToolData& d = p.tools.at(t);
    if (!std::isnan(d.wire) && (std::isnan(b.wire) || d.wire < b.wire)) b.wire = d.wire, b.wire_name = t;
    if (const Stat* s = d.mode("diff"); s && (std::isnan(b.diff) || s->min() < b.diff)) b.diff = s->min(), b.diff_name = t;
    if (const Stat* s = d.mode("apply"); s && (std::isnan(b.apply) || s->min() < b.apply))
      b.apply = s->min(), b.apply_name = t;
  }
  return b;
}

// Writes the rows of one encoding's targets, in Markdown and in JSON.
struct TargetRows {
  std::ostringstream& md;
  json& out;
  const std::string& encoding;

  void row(const std::string& what, const std::string& measured, double r, double goal, const std::string& goal_text) {
    const char* status = std::isnan(r) ? "not measured" : (r <= goal ? "met" : "not met");
    md << "| " << encoding << " | " << what << " | " << measured << " | " << fmt("%.3f", r) << " | " << goal_text
       << " | " << (std::string(status) == "met" ? "**met**" : status) << " |\n";
    out.push_back({{"encoding", encoding}, {"target", what}, {"measured", measured}, {"ratio", jnum(r)},
                   {"goal", goal}, {"status", status}});
  }
};

// The targets of hfdelta's own: against the bound, xor and the read floors.
void own_targets(TargetRows& rows, const PairData& p, const ToolData& d) {
  const double bound = num(p.bound, "bound_bytes");
  const ToolData* x = p.find("hfdelta-xor");
  const Stat* diff = d.mode("diff");
  const Stat* apn = d.mode("apply_nosync");
  rows.row("total wire ≤ 1.15 × order-0 bound", mib(d.wire) + " vs " + mib(bound), ratio(d.wire, bound), 1.15, "≤ 1.15");
  rows.row("total wire ≤ 0.6 × xor wire", mib(d.wire) + " vs " + mib(x ? x->wire : NAN),
           ratio(d.wire, x ? x->wire : NAN), 0.6, "≤ 0.6");
  rows.row("delta-diff wall ≤ 2 × read floor (BASE+NEW)",
           fmt("%.3f s", diff ? diff->min() : NAN) + " vs " + fmt("%.3f s", p.floor_inputs),
           diff ? ratio(diff->min(), p.floor_inputs) : NAN, 2, "≤ 2");
  rows.row("delta-apply --no-sync wall ≤ 2 × read floor (LOCAL)",
           fmt("%.3f s", apn ? apn->min() : NAN) + " vs " + fmt("%.3f s", p.floor_local),
           apn ? ratio(apn->min(), p.floor_local) : NAN, 2, "≤ 2");
  const double anon = d.peak_anon();
  rows.row("peak RssAnon ≤ 256 MiB (diff and apply)", kib_mib(anon), ratio(anon, 256.0 * 1024), 1, "≤ 1");
  if (rows.encoding == "hfdelta-context") {  // issue #17's targets for the context encoding
    rows.row("total wire ≤ 0.75 × order-0 bound", mib(d.wire) + " vs " + mib(bound), ratio(d.wire, bound), 0.75, "≤ 0.75");
    const double cond = num(p.bound, "conditioned_bound_bytes");
    rows.row("total wire ≤ 1.05 × bound given the base exponent", mib(d.wire) + " vs " + mib(cond), ratio(d.wire, cond), 1.05,
             "≤ 1.05");
    rows.row("delta-apply --no-sync wall ≤ 2.5 × read floor (LOCAL)",
             fmt("%.3f s", apn ? apn->min() : NAN) + " vs " + fmt("%.3f s", p.floor_local),
             apn ? ratio(apn->min(), p.floor_local) : NAN, 2.5, "≤ 2.5");
  }
}

// Strictly better than every peer: a ratio below 1.
void peer_targets(TargetRows& rows, const ToolData& d, const BestPeers& b) {
  const double eps = 1 - 1e-12;
  const Stat* diff = d.mode("diff");
  const Stat* ap = d.mode("apply");
  const Stat* apn = d.mode("apply_nosync");
  rows.row("diff faster than every peer", fmt("%.3f s", diff ? diff->min() : NAN) + " vs " + fmt("%.3f s", b.diff) +
               " (" + (b.diff_name.empty() ? "none" : b.diff_name) + ")",
           diff ? ratio(diff->min(), b.diff) : NAN, eps, "< 1");
  rows.row("apply --no-sync faster than every peer",
           fmt("%.3f s", apn ? apn->min() : NAN) + " vs " + fmt("%.3f s", b.apply) + " (" +
               (b.apply_name.empty() ? "none" : b.apply_name) + ")",
           apn ? ratio(apn->min(), b.apply) : NAN, eps, "< 1");
  rows.row("apply (flushing) faster than every peer",
           fmt("%.3f s", ap ? ap->min() : NAN) + " vs " + fmt("%.3f s", b.apply) + " (" +
               (b.apply_name.empty() ? "none" : b.apply_name) + ")",
           ap ? ratio(ap->min(), b.apply) : NAN, eps, "< 1");
  rows.row("wire smaller than every peer",
           mib(d.wire) + " vs " + mib(b.wire) + " (" + (b.wire_name.empty() ? "none" : b.wire_name) + ")",
           ratio(d.wire, b.wire), eps, "< 1");
}

json targets(Report& rep) {
  json jtargets = json::array();
  if (!rep.marked) return jtargets;
  const PairData& p = *rep.marked;
  const BestPeers b = best_peers(p);
  rep.md << "\n## Targets at the marked pair (lr " << p.lr << ", " << rep.pair_name(p) << ")\n\n"
         << "| hfdelta encoding | target | measured | ratio | goal | status |\n|---|---|---:|---:|---:|---|\n";
  for (const auto& t : p.tool_order) {
    if (!is_hfdelta(t)) continue;
    TargetRows rows{rep.md, jtargets, t};
    own_targets(rows, p, p.tools.at(t));
    peer_targets(rows, p.tools.at(t), b);
  }
  rep.md << "\nA missed target is a measurement, not a failure of the benchmark.\n";
  return jtargets;
}

// ---- report: squash ----------------------------------------------------------------------

const Stat* stat_in(const ToolMap& m, const char* tool, const char* mode) {
  const auto it = m.find(tool);
  return it == m.end() ? nullptr : it->second.mode(mode);
}

double wire_in(const ToolMap& m, const char* tool) {
  const auto it = m.find(tool);
  return it == m.end() ? NAN : it->second.wire;
}

double min_of(const Stat* s) { return s ? s->min() : NAN; }
double rss_of(const Stat* s) { return s ? s->max_rss_kib : NAN; }
json json_of(const Stat* s) { return s ? s->to_json() : json(nullptr); }

// Bytes of the squash against the chain it replaces and a direct diff, and the squash itself.
json md_squash_bytes(Report& rep) {
  json jsquash = json::array();
  const std::string saves = rep.rs.config.value("saves", std::string("?"));
  rep.md << "\n## Squash (a chain of " << saves << " deltas, lr " << rep.target_lr << ")\n\n"
         << "`sparse`: the default encoding at every step; `mixed`: xor and sparse in turn, so the entries of one "
            "tensor stack; `context`: the context encoding at every step, squashed against the first save "
            "(`--squash-base`; the direct diff is `--encoding context` too). Chain: the " << saves << " deltas together; direct: one diff of the first and last saves.\n\n"
         << "| chain | chain bytes | squashed | direct diff | squashed/direct | squashed/chain | squash wall | squash peak RSS |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const std::string& kind : rep.rs.squash_order) {
    const ToolMap& m = rep.rs.squash.at(kind);
    const double chain = wire_in(m, "chain"), sq = wire_in(m, "squashed"), direct = wire_in(m, "direct");
    const Stat* s = stat_in(m, "squashed", "squash");
    rep.md << "| " << kind << " | " << mib(chain) << " | " << mib(sq) << " | " << mib(direct) << " | "
           << fmt("%.3f", ratio(sq, direct)) << " | " << fmt("%.3f", ratio(sq, chain)) << " | "
           << fmt("%.3f s", min_of(s)) << " | " << kib_mib(rss_of(s)) << " |\n";
    json j = {{"chain", kind},
              {"chain_bytes", jnum(chain)},
              {"squashed_bytes", jnum(sq)},
              {"direct_bytes", jnum(direct)},
              {"squash", json_of(s)}};
    for (const char* mode : {"apply", "apply_nosync"})
      j[mode] = {{"chain", json_of(stat_in(m, "chain", mode))}, {"squashed", json_of(stat_in(m, "squashed", mode))}};
    jsquash.push_back(j);
  }
  return jsquash;
}

// A --root pull of the chain against applying the squash.
void md_squash_apply(Report& rep) {
  rep.md << "\n| chain | apply: --root pull of the chain | squashed | squashed/chain | --no-sync: chain | squashed | "
            "squashed/chain | peak RSS: chain | squashed |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  auto rss2 = [](const Stat* a, const Stat* b) {
    double r = rss_of(a);
    keep_max(r, rss_of(b));
    return r;
  };
  for (const std::string& kind : rep.rs.squash_order) {
    const ToolMap& m = rep.rs.squash.at(kind);
    const Stat *ca = stat_in(m, "chain", "apply"), *sa = stat_in(m, "squashed", "apply");
    const Stat *cn = stat_in(m, "chain", "apply_nosync"), *sn = stat_in(m, "squashed", "apply_nosync");
    rep.md << "| " << kind << " | " << fmt("%.3f s", min_of(ca)) << " | " << fmt("%.3f s", min_of(sa)) << " | "
           << fmt("%.3f", ratio(min_of(sa), min_of(ca))) << " | " << fmt("%.3f s", min_of(cn)) << " | "
           << fmt("%.3f s", min_of(sn)) << " | " << fmt("%.3f", ratio(min_of(sn), min_of(cn))) << " | "
           << kib_mib(rss2(ca, cn)) << " | " << kib_mib(rss2(sa, sn)) << " |\n";
  }
  rep.md << "\nBoth end byte-identical to the last save. Walls: the fastest of the runs.\n";
}

// Squash against the chain it replaces and against a direct diff.
json squash(Report& rep) {
  if (rep.rs.squash.empty()) return json::array();
  json jsquash = md_squash_bytes(rep);
  md_squash_apply(rep);
  return jsquash;
}

// ---- report: memory against model size --------------------------------------------------

// Encodings in the order of the config, then any other tool measured.
std::vector<std::string> memory_tools(const Report& rep, const std::map<std::string, ToolMap>& mem,
                                      const std::vector<std::pair<double, std::string>>& order) {
  std::vector<std::string> encs;
  std::istringstream in(rep.rs.config.value("encodings", std::string()));
  for (std::string e; in >> e;) encs.push_back("hfdelta-" + e);
  for (const auto& [full, pr] : order)
    for (const auto& [pr_tool, pr_data] : mem.at(pr))
      if (std::find(encs.begin(), encs.end(), pr_tool) == encs.end()) encs.push_back(pr_tool);
  return encs;
}

// One row: the peaks of delta-diff and of delta-apply for one encoding at one preset.
void memory_row(Report& rep, json& jmem, const std::string& pr, double full, const std::string& t, const ToolData& d) {
  double danon = NAN, drss = NAN, aanon = NAN, arss = NAN;
  for (const auto& [m, s] : d.modes) {
    const bool is_diff = m.rfind("diff", 0) == 0;
    keep_max(is_diff ? danon : aanon, s.peak_anon_kib);
    keep_max(is_diff ? drss : arss, s.max_rss_kib);
  }
  rep.md << "| " << pr << " | " << mib(full) << " | " << t << " | " << kib_mib(danon) << " | " << kib_mib(drss)
         << " | " << kib_mib(aanon) << " | " << kib_mib(arss) << " |\n";
  jmem.push_back({{"preset", pr}, {"full_bytes", full}, {"tool", t}, {"diff_peak_rss_anon_kib", jnum(danon)},
                  {"diff_max_rss_kib", jnum(drss)}, {"apply_peak_rss_anon_kib", jnum(aanon)},
                  {"apply_max_rss_kib", jnum(arss)}});
}

json memory(Report& rep) {
  json jmem = json::array();
  std::map<std::string, ToolMap> mem = rep.rs.mem;
  std::map<std::string, double> mem_full = rep.rs.mem_full;
  // The main preset's figures come from the marked pair unless a separate series measured it.
  if (rep.marked && !mem.count(rep.preset)) {
    for (const auto& [t, d] : rep.marked->tools)
      if (is_hfdelta(t)) mem[rep.preset][t] = d;
    mem_full[rep.preset] = num(rep.marked->bound, "full_bytes");
  }
  std::vector<std::pair<double, std::string>> order;  // presets by checkpoint size
  for (const auto& [pr, tools] : mem) order.push_back({mem_full.count(pr) ? mem_full[pr] : 0, pr});
  std::sort(order.begin(), order.end());
  if (order.empty()) return jmem;
  rep.md << "\n## Peak memory against model size (lr " << rep.target_lr << ")\n\n"
         << "| preset | full checkpoint | encoding | delta-diff peak RssAnon | delta-diff peak RSS | delta-apply peak RssAnon | delta-apply peak RSS |\n"
            "|---|---:|---|---:|---:|---:|---:|\n";
  const std::vector<std::string> encs = memory_tools(rep, mem, order);
  for (const auto& [full, pr] : order)
    for (const auto& t : encs) {
      if (!is_hfdelta(t) || !mem[pr].count(t)) continue;
      memory_row(rep, jmem, pr, full, t, mem[pr].at(t));
    }
  return jmem;
}

void md_timings(Report& rep) {
  if (rep.rs.timings.empty()) return;
  rep.md << "\n## Run time\n\n";
  for (const auto& t : rep.rs.timings) rep.md << "- " << lab(t, "what") << ": " << fmt("%.0f s", num(t, "seconds")) << "\n";
}

// ---- report ---------------------------------------------------------------------------------

void cmd_report(const std::string& records_file, const std::string& md_path, const std::string& json_path) {
  const Records rs = sort_records(read_records(records_file));
  Report rep(rs, rs.config.value("target_lr", std::string("1e-6")));

  md_setup(rep);
  md_machine(rep);
  md_versions(rep);
  md_method(rep);
  md_loads(rep);
  md_pairs(rep);
  md_wire(rep);
  md_diff(rep);
  md_apply(rep);
  const json jpairs = pairs_json(rep);
  const json jtargets = targets(rep);
  const json jsquash = squash(rep);
  const json jmem = memory(rep);
  md_timings(rep);

  std::ofstream(md_path) << rep.md.str();
  json out = {{"machine", rs.machine},  {"config", rs.config},  {"tool_versions", rs.versions},
              {"pairs", jpairs},        {"targets", jtargets},  {"memory_scaling", jmem}, {"squash", jsquash},
              {"marked", rep.marked ? json{{"lr", rep.marked->lr}, {"pair", rep.marked->pair}} : json(nullptr)},
              {"timings", rs.timings},  {"loads", rs.loads},    {"records", rs.all}};
  std::ofstream(json_path) << out.dump(1) << '\n';
}

// ---- the command line -------------------------------------------------------------

json cmd_size(const std::vector<std::string>& paths) {
  std::uint64_t files = 0, bytes = 0;
  for (const auto& p : paths) bytes += dir_bytes(p, &files);
  return {{"paths", paths}, {"bytes", bytes}, {"files", files}};
}

// What the command line asks for: each subcommand's arguments and records file.
struct Args {
  std::string base, target;  // bound
  int threads = 0;
  bool per_tensor = false;
  std::vector<std::string> paths;  // readfloor, warm, size
  int repeat = 3;
  bool floor_hash = false, floor_write_back = false;  // readfloor
  std::string stdout_file;  // run
  double interval_ms = 5;
  bool time_v = false;
  std::vector<std::string> command;
  std::string where = ".";  // machine
  std::string note_kind = "note";
  std::string records, md_out, json_out;  // report
  RecordOut bound_out, floor_out, warm_out, run_out, size_out, machine_out, note_out;
};

struct Subcommands {
  CLI::App *bound = nullptr, *floor = nullptr, *warm = nullptr, *run = nullptr;
  CLI::App *size = nullptr, *machine = nullptr, *note = nullptr, *report = nullptr;
};

// The subcommands that read checkpoints: bound, readfloor, warm.
void add_read_commands(CLI::App& app, Args& a, Subcommands& sc) {
  sc.bound = app.add_subcommand("bound", "Order-0 entropy bound of the change from BASE to NEW");
  sc.bound->add_option("BASE", a.base)->required();
  sc.bound->add_option("NEW", a.target)->required();
  sc.bound->add_option("--threads", a.threads, "Threads (default: all)");
  sc.bound->add_flag("--per-tensor", a.per_tensor, "Include every tensor's figures");
  add_record_options(sc.bound, a.bound_out);

  sc.floor = app.add_subcommand("readfloor", "Time warm passes reading every shard of the checkpoints");
  sc.floor->add_option("DIR", a.paths, "Checkpoint directories (or single files)")->required();
  sc.floor->add_option("--repeat", a.repeat, "Measured passes after the warm-up pass")->capture_default_str();
  sc.floor->add_option("--threads", a.threads, "Threads (default: all)");
  sc.floor->add_flag("--hash", a.floor_hash, "Also checksum every byte read (XXH3-128)");
  sc.floor->add_flag("--write-back", a.floor_write_back,
                     "Also write every buffer back where it was read (the same bytes; the files must be writable); "
                     "with --hash, each buffer is hashed twice, as a checked patch hashes its base and its result");
  add_record_options(sc.floor, a.floor_out);

  sc.warm = app.add_subcommand("warm", "Read every regular file under the paths once");
  sc.warm->add_option("PATH", a.paths)->required();
  sc.warm->add_option("--threads", a.threads, "Threads (default: all)");
  add_record_options(sc.warm, a.warm_out);
}

// run, size, machine and note.
void add_other_commands(CLI::App& app, Args& a, Subcommands& sc) {
  sc.run = app.add_subcommand("run", "Run a command and measure it: run [OPTIONS] -- CMD ARGS...");
  sc.run->add_option("--stdout", a.stdout_file, "Send the command's stdout to this file");
  sc.run->add_option("--interval-ms", a.interval_ms, "Sampling interval of /proc")->capture_default_str();
  sc.run->add_flag("--time-v", a.time_v, "Run the command under /usr/bin/time -v and record its maximum RSS");
  sc.run->add_option("CMD", a.command, "The command and its arguments (after --)")->required();
  add_record_options(sc.run, a.run_out);

  sc.size = app.add_subcommand("size", "Total bytes of the regular files under the paths");
  sc.size->add_option("PATH", a.paths)->required();
  add_record_options(sc.size, a.size_out);

  sc.machine = app.add_subcommand("machine", "Describe the machine and the disk holding PATH");
  sc.machine->add_option("PATH", a.where);
  add_record_options(sc.machine, a.machine_out);

  sc.note = app.add_subcommand("note", "A record of labels only");
  sc.note->add_option("--kind", a.note_kind, "Record kind")->capture_default_str();
  add_record_options(sc.note, a.note_out);
}

void add_report_command(CLI::App& app, Args& a, Subcommands& sc) {
  sc.report = app.add_subcommand("report", "Write the Markdown and JSON results from a records file");
  sc.report->add_option("RECORDS", a.records)->required();
  sc.report->add_option("--md", a.md_out, "Markdown output")->required();
  sc.report->add_option("--json", a.json_out, "JSON output")->required();
}

// Runs the measured command; its exit code is the result.
int run_measured(const Args& a) {
  int code = 0;
  json r = cmd_run(a.command, a.stdout_file, a.interval_ms, a.time_v, code);
  if (code == 0) {
    // Records are for successful runs only; a failing tool fails the benchmark.
    emit(r, "run", a.run_out);
  } else {
    std::cerr << "hfdelta-bench: command failed with exit code " << code << ": " << r["argv"].dump() << '\n';
  }
  return code;
}

// Runs the subcommand given; returns the exit code.
int run_subcommand(const Args& a, const Subcommands& sc) {
  if (*sc.bound) emit(cmd_bound(a.base, a.target, a.threads, a.per_tensor), "bound", a.bound_out);
  if (*sc.floor) emit(cmd_readfloor(a.paths, a.repeat, a.threads, {a.floor_hash, a.floor_write_back}), "readfloor", a.floor_out);
  if (*sc.warm) emit(cmd_warm(a.paths, a.threads), "warm", a.warm_out);
  if (*sc.size) emit(cmd_size(a.paths), "size", a.size_out);
  if (*sc.machine) emit(cmd_machine(a.where), "machine", a.machine_out);
  if (*sc.note) emit(json::object(), a.note_kind, a.note_out);
  if (*sc.report) cmd_report(a.records, a.md_out, a.json_out);
  if (*sc.run) return run_measured(a);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Measurements for scripts/bench.sh (not installed)", "hfdelta-bench"};
  app.require_subcommand(1);
  Args a;
  Subcommands sc;
  add_read_commands(app, a, sc);
  add_other_commands(app, a, sc);
  add_report_command(app, a, sc);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return run_subcommand(a, sc);
  } catch (const hfdelta::Error& e) {
    std::cerr << "hfdelta-bench: error: " << e.what() << '\n';
    return static_cast<int>(e.code());
  } catch (const std::exception& e) {
    std::cerr << "hfdelta-bench: error: " << e.what() << '\n';
    return 1;
  }
}
