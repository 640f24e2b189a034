// hfdelta-gpu-check: the CUDA path against the CPU path on a machine with a
// GPU (scripts/lab/gpu-check.sh).
//   1. identity: generated pairs (BF16, F16, F32, F8, F64, unknown dtypes;
//      odd sizes, several chunks, unaligned device pointers; densities 0.1 to
//      10%): the sparse and context entries written from the changes found
//      on the device, byte for byte encode_sparse's and encode_context's.
//   2. publisher: a small checkpoint of 3 versions (BF16, F32, F16 tensors,
//      one of more than 2^20 elements), each version published twice, by
//      MemoryPublisher::put() from host memory into one root and by
//      DevicePublisher::put() from device memory into another, each root with
//      its own mirror (sparse and context): the version directories
//      identical file by file, byte by byte, the mirrors advanced to the
//      version's bytes, and the bases loaded from the mirror only where
//      they must be (first use; after an abandoned version).
//   3. throughput: change finding on the device against a device-to-device
//      cudaMemcpy of the same bytes, and the bytes copied to the host against
//      the changes; with each row the read floor (both inputs read as tiles
//      reads them, only counted: what tiles' loads alone take). --only,
//      --reps, --sparse and a --design list narrow it (gpu-check.sh
//      --profile runs one row under Nsight Compute).
// Exit 0: every entry identical; 1: a mismatch or an error; 77: no GPU.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <boost/filesystem.hpp>

#include "change_finder.hpp"
#include "codec/codec.hpp"
#include "device_publisher.hpp"
#include "found_reference.hpp"
#include "hfdelta/apply.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/publisher.hpp"
#include "hfdelta/safetensors.hpp"
#include "util/io.hpp"

using namespace hfdelta;
using Bytes = std::vector<std::uint8_t>;

namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(Exit::failure, std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}

// A pair on the device, `offset` bytes into its allocations (0: aligned).
struct DevicePair {
  std::uint8_t *a0 = nullptr, *b0 = nullptr;
  gpu::DeviceTensor t;
  DevicePair(const gpu::Pair& p, std::size_t es, ContextField f, std::size_t offset) {
    ck(cudaMalloc(&a0, p.base.size() + offset + 1), "cudaMalloc");
    ck(cudaMalloc(&b0, p.next.size() + offset + 1), "cudaMalloc");
    ck(cudaMemcpy(a0 + offset, p.base.data(), p.base.size(), cudaMemcpyHostToDevice), "copy base");
    ck(cudaMemcpy(b0 + offset, p.next.data(), p.next.size(), cudaMemcpyHostToDevice), "copy new");
    // A copy from pageable memory may still be under way when cudaMemcpy
    // returns, and the finder's stream does not wait for the default one.
    ck(cudaDeviceSynchronize(), "synchronize");
    t = {a0 + offset, b0 + offset, p.base.size(), es, f};
  }
  ~DevicePair() {
    cudaFree(a0);
    cudaFree(b0);
  }
  DevicePair(const DevicePair&) = delete;
  DevicePair& operator=(const DevicePair&) = delete;
};

// The first byte where two entries differ, for the report.
std::size_t first_difference(const Bytes& x, const Bytes& y) {
  std::size_t i = 0;
  while (i < x.size() && i < y.size() && x[i] == y[i]) ++i;
  return i;
}

struct Case {
  const char* dtype;
  std::uint64_t nbytes;
  double density;
  std::size_t offset;
};

constexpr gpu::Design kAllDesigns[] = {
    gpu::Design::tiles,      gpu::Design::small_tiles,  gpu::Design::select,     gpu::Design::pipelined_tiles,
    gpu::Design::warp_tiles, gpu::Design::warp_tiles64, gpu::Design::warp_tiles4};  // the newest last
std::vector<gpu::Design> designs(std::begin(kAllDesigns), std::end(kAllDesigns));   // --design: one

std::vector<gpu::ChangeFinder> finders_of(const std::vector<gpu::Design>& ds) {
  std::vector<gpu::ChangeFinder> fs(ds.size());
  for (std::size_t di = 0; di < ds.size(); ++di) fs[di].set_design(ds[di]);
  return fs;
}

// One case: both encodings from the device, by each design, against the CPU's. Returns the failures.
int check_case(std::vector<gpu::ChangeFinder>& finders, const Case& k) {
  const ChunkLayout l = chunk_layout(k.dtype, k.nbytes);
  const gpu::Pair p = gpu::make_pair_data(k.nbytes, l.es, l.field, k.density, k.nbytes + k.offset);
  DevicePair d(p, l.es, l.field, k.offset);
  int failures = 0;
  char name[160];
  std::snprintf(name, sizeof name, "%-8s %10llu bytes  density %5.3f%%  offset %zu", k.dtype,
                static_cast<unsigned long long>(k.nbytes), 100 * k.density, k.offset);
  for (const bool context : {false, true}) {
    const Bytes want = gpu::cpu_entry(p.base, p.next, l.es, l.field, context);
    for (std::size_t di = 0; di < designs.size(); ++di) {
      gpu::ChangeFinder& finder = finders[di];
      gpu::Found f;
      Bytes got;
      std::string error;
      try {
        finder.find(d.t, context, f);
        if (context) {
          const std::vector<ContextGroups> groups = gpu::context_groups_of(f, l.field);
          finder.rank(d.t, groups, f);
          got = gpu::context_entry(f, k.nbytes, l.field, groups, 3);
        } else {
          got = gpu::sparse_entry(f, k.nbytes, 3);
        }
      } catch (const std::exception& e) {
        error = e.what();
      }
      const bool same = error.empty() && got == want;
      std::printf("%s %-7s %-7s  %s  (%llu changes, entry %zu bytes)\n", same ? "PASS" : "FAIL",
                  context ? "context" : "sparse", gpu::name(designs[di]), name,
                  static_cast<unsigned long long>(f.changes()), want.size());
      if (!same) {
        ++failures;
        if (!error.empty()) {
          std::printf("     error: %s\n", error.c_str());
          continue;
        }
        const gpu::Found r = gpu::reference_find(p.base, p.next, l.es, l.field);
        std::printf(
            "     entry %zu bytes, CPU's %zu, first difference at byte %zu; changes %llu, reference %llu; starts %s, "
            "changed bytes %s, positions %s, differences %s\n",
            got.size(), want.size(), first_difference(got, want), static_cast<unsigned long long>(f.changes()),
            static_cast<unsigned long long>(r.changes()), f.start == r.start ? "same" : "differ",
            f.bytes == r.bytes ? "same" : "differ", f.pos == r.pos ? "same" : "differ",
            f.diff == r.diff ? "same" : "differ");
        if (context && f.pos == r.pos)
          std::printf("     contexts %s, sample %s\n", f.ctx == r.ctx ? "same" : "differ",
                      f.sample == r.sample ? "same" : "differ");
      }
    }
  }
  return failures;
}

int identity() {
  std::vector<gpu::ChangeFinder> finders = finders_of(designs);
  const std::uint64_t M = kSparseChunkElements;
  // First, while the finders' room is that of one change in 64: more
  // changes than that, found again with room.
  std::vector<Case> cases = {{"BF16", 2 * (M + 77), 0.3, 0}};
  for (const double density : {0.001, 0.01, 0.1}) {
    cases.push_back({"BF16", 2 * (3 * M + 12345), density, 0});
    cases.push_back({"F16", 2 * (M + 1), density, 0});
    cases.push_back({"F32", 4 * (2 * M + 77), density, 0});
    cases.push_back({"F8_E4M3", 3 * M + 5, density, 0});
    cases.push_back({"F8_E5M2", M + 4097, density, 0});
  }
  const Case odd[] = {
      {"BF16", 2, 1.0, 0},
      {"BF16", 2 * 31, 0.1, 0},
      {"BF16", 2 * 33, 0.1, 0},
      {"BF16", 2 * 4099, 0.01, 0},
      {"BF16", 2 * 4099 + 1, 0.1, 0},  // odd bytes: 1-byte elements, no field
      {"BF16", 2 * (M + 3), 0.01, 2},  // unaligned pointers
      {"F32", 4 * 100003, 0.05, 4},
      {"F8_E4M3", 1000001, 0.02, 1},
      {"F64", 8 * 300001, 0.1, 0},
      {"I32", 4 * 250000, 0.1, 0},
      {"BF16", 2 * 100000, 0.0, 0},
      {"BF16", 2 * 65536, 1.0, 0},
      {"F32", 4 * 5000, 0.01, 1},  // pointers not aligned to the element
  };
  cases.insert(cases.end(), std::begin(odd), std::end(odd));
  int failures = 0;
  for (const Case& k : cases) failures += check_case(finders, k);
  return failures;
}

// ---- 2. the publisher from device memory ----------------------------------

namespace fs = boost::filesystem;

struct GenTensor {
  std::string name, dtype;
  std::vector<std::uint64_t> shape;
  Bytes bytes;
};
using Save = std::vector<GenTensor>;

// A save's tensors into DIR/model.safetensors, laid out as the reference writer does.
void write_save(const fs::path& dir, const Save& save) {
  fs::create_directories(dir);
  std::vector<TensorSpec> specs;
  for (const GenTensor& t : save) specs.push_back({t.name, t.dtype, t.shape, t.bytes.size()});
  const SafetensorsLayout l = layout_safetensors(specs, nullptr);
  File f(dir / "model.safetensors", File::Mode::create_exclusive);
  f.pwrite_all(l.prefix.data(), l.prefix.size(), 0);
  for (const TensorInfo& ti : l.tensors)
    for (const GenTensor& t : save)
      if (t.name == ti.name && !t.bytes.empty())
        f.pwrite_all(t.bytes.data(), t.bytes.size(), l.prefix.size() + ti.begin);
}

// Version 0 at random; each next version changes about 1% of every tensor's
// elements by a small step of their low bytes (and one element always).
std::vector<Save> make_series(int versions) {
  std::uint64_t x = 0x9e3779b97f4a7c15ull;
  auto rnd = [&x] {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return x;
  };
  Save s0 = {{"model.embed", "BF16", {1100, 1000}, {}},  // 1.1 M elements: two chunks
             {"model.layer0.w", "F32", {300, 257}, {}},
             {"model.layer0.norm", "F16", {4099}, {}},
             {"model.layer0.b", "F32", {33}, {}},
             {"model.head", "BF16", {257, 129}, {}}};
  for (GenTensor& t : s0) {
    std::uint64_t n = dtype_size(t.dtype);
    for (const std::uint64_t d : t.shape) n *= d;
    t.bytes.resize(n);
    for (std::uint8_t& b : t.bytes) b = static_cast<std::uint8_t>(rnd());
  }
  std::vector<Save> series = {s0};
  for (int v = 1; v < versions; ++v) {
    Save s = series.back();
    for (GenTensor& t : s) {
      const std::size_t es = dtype_size(t.dtype), n = t.bytes.size() / es;
      const std::size_t k = std::max<std::size_t>(1, n / 100);
      for (std::size_t i = 0; i < k; ++i) {
        std::uint8_t* e = t.bytes.data() + (rnd() % n) * es;
        e[0] = static_cast<std::uint8_t>(e[0] + 1 + rnd() % 7);
        if (es > 1 && rnd() % 4 == 0) e[1] ^= 1;
      }
    }
    series.push_back(s);
  }
  return series;
}

// Byte for byte the same trees (every file and directory, by relative path).
bool same_tree(const fs::path& a, const fs::path& b, std::string& why) {
  std::vector<std::string> fa, fb;
  for (fs::recursive_directory_iterator it(a), end; it != end; ++it) fa.push_back(relative_name(it->path(), a));
  for (fs::recursive_directory_iterator it(b), end; it != end; ++it) fb.push_back(relative_name(it->path(), b));
  std::sort(fa.begin(), fa.end());
  std::sort(fb.begin(), fb.end());
  if (fa != fb) {
    why = "the files differ: " + std::to_string(fa.size()) + " against " + std::to_string(fb.size());
    return false;
  }
  for (const std::string& f : fa) {
    if (fs::is_directory(a / f) != fs::is_directory(b / f)) return why = f + ": a directory in one only", false;
    if (!fs::is_directory(a / f) && !same_contents(a / f, b / f)) return why = f + ": other bytes", false;
  }
  return true;
}

struct DeviceSave {
  std::vector<void*> data;
  explicit DeviceSave(const Save& s) {
    for (const GenTensor& t : s) {
      void* p = nullptr;
      ck(cudaMalloc(&p, t.bytes.size()), "cudaMalloc");
      data.push_back(p);
      ck(cudaMemcpy(p, t.bytes.data(), t.bytes.size(), cudaMemcpyHostToDevice), "copy tensor");
    }
    ck(cudaDeviceSynchronize(), "synchronize");
  }
  ~DeviceSave() {
    for (void* p : data) cudaFree(p);
  }
  DeviceSave(const DeviceSave&) = delete;
  DeviceSave& operator=(const DeviceSave&) = delete;
};

int expect_code(const std::function<void()>& f, Exit want, const char* what) {
  try {
    f();
  } catch (const Error& e) {
    if (e.code() == want) {
      std::printf("PASS refused: %s (%s)\n", what, e.what());
      return 0;
    }
    std::printf("FAIL refused: %s: exit %d, not %d (%s)\n", what, static_cast<int>(e.code()), static_cast<int>(want),
                e.what());
    return 1;
  }
  std::printf("FAIL refused: %s: not refused\n", what);
  return 1;
}

int publisher_check() {
  int failures = 0;
  char tmpl[] = "/tmp/hfdelta-gpu-publisher-XXXXXX";
  if (!mkdtemp(tmpl)) fail(Exit::failure, "mkdtemp failed");
  const fs::path t = tmpl;
  const std::vector<Save> series = make_series(4);
  std::uint64_t total = 0;
  for (const GenTensor& g : series[0]) total += g.bytes.size();
  for (std::size_t v = 0; v < series.size(); ++v) write_save(t / ("save" + std::to_string(v)), series[v]);
  ApplyOptions ao;
  ao.sync = false;
  for (const char* enc : {"sparse", "context"}) {
    const fs::path ra = t / (std::string("root-host-") + enc), rb = t / (std::string("root-device-") + enc);
    const fs::path ma = t / (std::string("mirror-host-") + enc), mb = t / (std::string("mirror-device-") + enc);
    fs::create_directories(ra), fs::create_directories(rb);
    init_local(t / "save0", ma, 0, ao);
    init_local(t / "save0", mb, 0, ao);
    PublisherOptions o;
    o.encoding = parse_encoding(enc);
    o.sync = false;
    o.background = false;
    MemoryPublisher pa(ra, ma, o);
    o.background = true;  // the device's publisher: the mirror advanced while the next version is put
    MemoryPublisher pb(rb, mb, o);
    gpu::DevicePublisher dp(pb);
    const std::uint64_t N = series[0].size();
    for (std::size_t v = 1; v < series.size(); ++v) {
      const Save& s = series[v];
      DeviceSave d(s);
      auto put_device = [&] {
        for (std::size_t i = 0; i < s.size(); ++i)
          dp.put({s[i].name, s[i].dtype, s[i].shape, d.data[i], s[i].bytes.size()});
      };
      const gpu::DevicePublishStats before = dp.stats();
      std::uint64_t want_loads = v == 1 ? N : 0;
      if (v == 2) {
        // A version abandoned after its tensors were given: the bases went
        // forward, the mirror did not; each base is loaded again.
        put_device();
        pb.abort();
        want_loads = N;
      }
      const gpu::DevicePublishStats mid = dp.stats();
      for (const GenTensor& g : s) pa.put({g.name, g.dtype, g.shape, g.bytes});
      put_device();
      const PublishSummary sa = pa.publish(false), sb = pb.publish(false);
      pb.wait();
      const gpu::DevicePublishStats after = dp.stats();
      std::string why;
      const bool same = same_tree(sa.out, sb.out, why);
      const bool names = sa.out.filename() == sb.out.filename();
      const bool advanced =
          pa.version() == v && pb.version() == v &&
          same_contents(mb / "model.safetensors", t / ("save" + std::to_string(v)) / "model.safetensors");
      const std::uint64_t loads = after.loads - mid.loads, host = after.host_bytes - mid.host_bytes;
      const bool ok = same && names && advanced && loads == want_loads && sb.diff.tensors_changed == N;
      failures += !ok;
      std::printf(
          "%s publisher %-7s version %zu: %s, %s, mirror %s; bases loaded %llu (want %llu); device->host %llu bytes "
          "for %llu tensor bytes (%.3f%%), %llu elements changed\n",
          ok ? "PASS" : "FAIL", enc, v, same ? "version directories identical" : ("versions DIFFER: " + why).c_str(),
          names ? sb.out.filename().string().c_str() : "OTHER NAMES", advanced ? "advanced" : "NOT ADVANCED",
          static_cast<unsigned long long>(loads), static_cast<unsigned long long>(want_loads),
          static_cast<unsigned long long>(host), static_cast<unsigned long long>(total),
          100.0 * static_cast<double>(host) / static_cast<double>(total),
          static_cast<unsigned long long>(sb.diff.elements_changed));
      (void)before;
    }
    std::printf("     %s: bases on the device %llu bytes (the tensors': %llu)\n", enc,
                static_cast<unsigned long long>(dp.base_bytes()), static_cast<unsigned long long>(total));
    failures += dp.base_bytes() != total;
  }
  // Refusals: an encoding other than sparse and context; host memory.
  {
    const fs::path r = t / "root-xor", m = t / "mirror-xor";
    fs::create_directories(r);
    init_local(t / "save0", m, 0, ao);
    PublisherOptions o;
    o.encoding = Encoding::xor_bytes;
    o.sync = false, o.background = false;
    MemoryPublisher p(r, m, o);
    gpu::DevicePublisher dp(p);
    DeviceSave d(series[1]);
    const GenTensor& g = series[1][0];
    failures += expect_code(
        [&] {
          dp.put({g.name, g.dtype, g.shape, d.data[0], g.bytes.size()});
        },
        Exit::usage, "xor from device memory");
    PublisherOptions os = o;
    os.encoding = Encoding::sparse;
    const fs::path r2 = t / "root-host-pointer", m2 = t / "mirror-host-pointer";
    fs::create_directories(r2);
    init_local(t / "save0", m2, 0, ao);
    MemoryPublisher p2(r2, m2, os);
    gpu::DevicePublisher dp2(p2);
    failures += expect_code(
        [&] {
          dp2.put({g.name, g.dtype, g.shape, g.bytes.data(), g.bytes.size()});
        },
        Exit::usage, "host memory given as device memory");
  }
  boost::system::error_code ec;
  fs::remove_all(t, ec);
  return failures;
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Device-to-device copies of `bytes`: the median of `reps` (after one to warm up), in ms.
float memcpy_ms(const void* src, void* dst, std::uint64_t bytes, int reps) {
  cudaEvent_t e0, e1;
  ck(cudaEventCreate(&e0), "event");
  ck(cudaEventCreate(&e1), "event");
  std::vector<float> ms;
  for (int i = 0; i <= reps; ++i) {
    ck(cudaEventRecord(e0), "record");
    ck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice), "D2D copy");
    ck(cudaEventRecord(e1), "record");
    ck(cudaEventSynchronize(e1), "sync");
    float t = 0;
    ck(cudaEventElapsedTime(&t, e0, e1), "elapsed");
    if (i) ms.push_back(t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return median(ms);
}

struct Measured {
  float find_ms = 0, copy_ms = 0, ctx_ms = 0, rank_ms = 0;
  std::uint64_t changes = 0, host_bytes = 0;
  bool again = false;
};

// --only ROW, --reps N, --sparse: the throughput table's rows (e.g. bf16-1:
// BF16 at 1%), repeats, and sparse's find alone (no context columns).
std::string only_row;
int reps_wanted = 7;
bool sparse_only = false;

// One design on one pair: medians of `reps` (after one that grows the buffers).
Measured measure(gpu::ChangeFinder& finder, const gpu::DeviceTensor& t, ContextField field, int reps, gpu::Found& f) {
  Measured m;
  std::vector<float> find, copy, cfind, crank;
  for (int i = 0; i <= reps; ++i) {
    finder.find(t, false, f);
    if (i)
      find.push_back(finder.timing().find_ms), copy.push_back(finder.timing().copy_ms),
          m.again |= finder.timing().found_again;
  }
  m.changes = f.changes(), m.host_bytes = f.host_bytes;
  gpu::Found fc;
  for (int i = 0; i <= reps && !sparse_only; ++i) {
    finder.find(t, true, fc);
    const float find_ms = finder.timing().find_ms;
    finder.rank(t, gpu::context_groups_of(fc, field), fc);
    if (i) cfind.push_back(find_ms), crank.push_back(finder.timing().find_ms);
  }
  m.find_ms = median(find), m.copy_ms = median(copy);
  if (!sparse_only) m.ctx_ms = median(cfind), m.rank_ms = median(crank);
  return m;
}

bool throughput(std::uint64_t nbytes) {
  std::vector<gpu::ChangeFinder> finders = finders_of(designs);
  const int kReps = std::max(1, reps_wanted);
  bool goal_met = false;
  std::printf("\n%-8s %7s %-7s | %8s | %8s %5s %7s %7s | %8s %5s %7s %7s | %9s %10s %8s %8s\n", "dtype", "density",
              "design", "D2D GB/s", "find GB/s", "ratio", "find ms", "copy ms", "+ctx GB/s", "ratio", "ctx ms",
              "rank ms", "changes", "to host B", "B/change", "host/N");
  struct Row {
    const char* dtype;
    double density;
  };
  const Row rows[] = {{"BF16", 0.001}, {"BF16", 0.01}, {"BF16", 0.1}, {"F32", 0.01}, {"F8_E4M3", 0.01}};
  const double gb = static_cast<double>(nbytes) / 1e6;  // GB/s from bytes per ms
  for (const Row& r : rows) {
    // The row's name for --only: bf16-0.1, bf16-1, bf16-10, f32-1, f8-1.
    std::string key = r.dtype;
    key = key.substr(0, key.find('_'));
    std::transform(key.begin(), key.end(), key.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    char pct[32];
    std::snprintf(pct, sizeof pct, "-%g", 100 * r.density);
    key += pct;
    if (!only_row.empty() && only_row != key) continue;
    try {
      const ChunkLayout l = chunk_layout(r.dtype, nbytes);
      const gpu::Pair p = gpu::make_pair_data(nbytes, l.es, l.field, r.density, 7);
      DevicePair d(p, l.es, l.field, 0);
      void* dst = nullptr;
      ck(cudaMalloc(&dst, nbytes), "cudaMalloc");
      const float copy = memcpy_ms(d.t.base, dst, nbytes, kReps);
      ck(cudaFree(dst), "cudaFree");
      {
        // The read floor: both inputs read as tiles read them, only counted.
        gpu::ChangeFinder reader;
        std::vector<float> ms;
        std::uint64_t counted = 0;
        for (int i = 0; i <= kReps; ++i) {
          counted = reader.read_floor(d.t);
          if (i) ms.push_back(reader.timing().find_ms);
        }
        const float read = median(ms);
        std::printf("%-8s %6.2f%% %-7s | %8.0f | %8.0f %4.0f%% %7.3f %7s | (changed bytes counted: %llu)\n", r.dtype,
                    100 * r.density, "read", gb / copy, gb / read, 100 * copy / read, read, "-",
                    static_cast<unsigned long long>(counted));
      }
      gpu::Found first;  // the first design's changes, which the others must equal
      for (std::size_t di = 0; di < designs.size(); ++di) {
        try {
          gpu::Found f;
          const Measured m = measure(finders[di], d.t, l.field, kReps, f);
          std::string agree;
          if (di == 0)
            first = f;
          else if (first.chunks == f.chunks &&
                   (f.start != first.start || f.bytes != first.bytes || f.pos != first.pos || f.diff != first.diff))
            agree = "  (CHANGES DIFFER FROM tiles')";
          const double ratio = copy / m.find_ms, ratio_ctx = sparse_only ? 0.0 : copy / (m.ctx_ms + m.rank_ms);
          std::printf(
              "%-8s %6.2f%% %-7s | %8.0f | %8.0f %4.0f%% %7.3f %7.3f | %8.0f %4.0f%% %7.3f %7.3f | %9llu %10llu %8.2f "
              "%7.4f%%%s%s\n",
              r.dtype, 100 * r.density, gpu::name(designs[di]), gb / copy, gb / m.find_ms, 100 * ratio, m.find_ms,
              m.copy_ms, sparse_only ? 0.0 : gb / (m.ctx_ms + m.rank_ms), 100 * ratio_ctx, m.ctx_ms, m.rank_ms,
              static_cast<unsigned long long>(m.changes), static_cast<unsigned long long>(m.host_bytes),
              m.changes ? static_cast<double>(m.host_bytes) / static_cast<double>(m.changes) : 0.0,
              100.0 * static_cast<double>(m.host_bytes) / static_cast<double>(nbytes), m.again ? "  (found again)" : "",
              agree.c_str());
          if (r.dtype == std::string("BF16") && r.density == 0.01 && ratio >= 0.7) goal_met = true;
        } catch (const std::exception& e) {
          std::printf("%-8s %6.2f%% %-7s | ERROR: %s\n", r.dtype, 100 * r.density, gpu::name(designs[di]), e.what());
          cudaGetLastError();
        }
      }
    } catch (const std::exception& e) {
      std::printf("%-8s %6.2f%% | ERROR: %s\n", r.dtype, 100 * r.density, e.what());
      cudaGetLastError();
    }
    std::fflush(stdout);
  }
  std::printf(
      "(%.0f MiB tensors, medians of %d; GB/s: tensor bytes per second; D2D: cudaMemcpy device to device;\n"
      " ratio: D2D time over find time; find: sparse's change finding on the device, from both inputs to the\n"
      " changes and counts in device memory; copy ms: the copies of the changes to page-locked host memory;\n"
      " ctx ms: context's find (with contexts and the sample), rank ms: its ranks on the device; +ctx GB/s:\n"
      " over both; to host B: sparse's bytes copied to the host. tiles: one kernel, 32 KiB tiles; tiles16:\n"
      " 16 KiB tiles; select: cub::DeviceSelect::If; tiles64: 16 KiB tiles, as many blocks as fit, each loading\n"
      " its next tile before working on the one it has; tilesw (the default): 32 KiB tiles in at most 80\n"
      " registers (sparse), each lane's place from its warp's by ballots; tilesw64: tilesw with 64 KiB tiles;\n"
      " tilesw4: 16 KiB tiles in at most 64 registers (sparse); read: the floor for tiles' loads,\n"
      " both inputs read as tiles reads them (32 KiB tiles) and only their changed bytes counted%s)\n",
      static_cast<double>(nbytes) / (1 << 20), kReps, sparse_only ? "; --sparse: no context columns" : "");
  return goal_met;
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t mib = 512;
  bool run_identity = true, run_throughput = true, run_publisher = true;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--identity") == 0) {
      run_throughput = run_publisher = false;
    } else if (std::strcmp(argv[i], "--throughput") == 0) {
      run_identity = run_publisher = false;
    } else if (std::strcmp(argv[i], "--publisher") == 0) {
      run_identity = run_throughput = false;
    } else if (std::strcmp(argv[i], "--mib") == 0 && i + 1 < argc) {
      mib = std::stoull(argv[++i]);
    } else if (std::strcmp(argv[i], "--design") == 0 && i + 1 < argc) {
      // One design, or several separated by commas.
      const std::string list = argv[++i];
      designs.clear();
      for (std::size_t at = 0; at <= list.size();) {
        const std::size_t end = std::min(list.find(',', at), list.size());
        const std::string d = list.substr(at, end - at);
        at = end + 1;
        bool known = false;
        for (const gpu::Design x : kAllDesigns)
          if (d == gpu::name(x)) designs.push_back(x), known = true;
        if (!known) {
          std::fprintf(stderr,
                       "hfdelta-gpu-check: no design %s (tiles, tiles16, select, tiles64, tilesw, tilesw64, tilesw4)\n",
                       d.c_str());
          return 2;
        }
      }
    } else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
      only_row = argv[++i];
    } else if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps_wanted = std::stoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--sparse") == 0) {
      sparse_only = true;
    } else {
      std::fprintf(
          stderr,
          "usage: hfdelta-gpu-check [--identity | --publisher | --throughput] [--design D[,D...]] (D: tiles, tiles16,\n"
          "       select, tiles64, tilesw, tilesw64, tilesw4) [--mib N (throughput tensor size, default 512)] [--only "
          "ROW (throughput: one row,\n"
          "       bf16-0.1 bf16-1 bf16-10 f32-1 f8-1)] [--reps N (throughput repeats, default 7)] [--sparse\n"
          "       (throughput: sparse's find only)]\n");
      return 2;
    }
  }
  std::string why;
  if (gpu::ChangeFinder::devices(why) == 0) {
    std::printf("SKIP: %s\n", why.c_str());
    return 77;
  }
  try {
    cudaDeviceProp prop{};
    ck(cudaGetDeviceProperties(&prop, 0), "device properties");
    std::printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
    int failures = 0;
    if (run_identity) {
      const auto t0 = std::chrono::steady_clock::now();
      failures = identity();
      std::printf("%s: identity, %d mismatches (%.1f s)\n", failures ? "FAIL" : "PASS", failures,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    if (run_publisher) {
      // An error here is reported, and the throughput table still runs.
      const auto t0 = std::chrono::steady_clock::now();
      int pf = 0;
      try {
        pf = publisher_check();
      } catch (const std::exception& e) {
        std::printf("ERROR: publisher: %s\n", e.what());
        cudaGetLastError();
        pf = 1;
      }
      std::printf("%s: publisher from device memory, %d failures (%.1f s)\n", pf ? "FAIL" : "PASS", pf,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      failures += pf;
      std::fflush(stdout);
    }
    if (run_throughput) {
      const bool met = throughput(mib << 20);
      std::printf("%s: BF16 at 1%% density finds changes at >= 70%% of D2D memcpy bandwidth (by one design at least)\n",
                  met ? "GOAL MET" : "GOAL MISSED");
    }
    return failures ? 1 : 0;
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
}
