// hfdelta-gpu-check: the CUDA path against the CPU path on a machine with a
// GPU (scripts/gpu-check.sh).
//   1. identity: generated pairs (BF16, F16, F32, F8, F64, unknown dtypes;
//      odd sizes, several chunks, unaligned device pointers; densities 0.1 to
//      10%): the sparse and context entries written from the changes found
//      on the device, byte for byte encode_sparse's and encode_context's.
//   2. throughput: change finding on the device against a device-to-device
//      cudaMemcpy of the same bytes, and the bytes copied to the host against
//      the changes.
// Exit 0: every entry identical; 1: a mismatch or an error; 77: no GPU.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "change_finder.hpp"
#include "found_reference.hpp"
#include "hfdelta/codec.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/safetensors.hpp"

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

// One case: both encodings from the device against the CPU's. Returns the failures.
int check_case(gpu::ChangeFinder& finder, const Case& k) {
  const ChunkLayout l = chunk_layout(k.dtype, k.nbytes);
  const gpu::Pair p = gpu::make_pair_data(k.nbytes, l.es, l.field, k.density, k.nbytes + k.offset);
  DevicePair d(p, l.es, l.field, k.offset);
  int failures = 0;
  char name[160];
  std::snprintf(name, sizeof name, "%-8s %10llu bytes  density %5.3f%%  offset %zu", k.dtype,
                static_cast<unsigned long long>(k.nbytes), 100 * k.density, k.offset);
  for (const bool context : {false, true}) {
    gpu::Found f;
    finder.find(d.t, context, f);
    Bytes got;
    if (context) {
      const std::vector<ContextGroups> groups = gpu::context_groups_of(f, l.field);
      finder.rank(d.t, groups, f);
      got = gpu::context_entry(f, k.nbytes, l.field, groups, 3);
    } else {
      got = gpu::sparse_entry(f, k.nbytes, 3);
    }
    const Bytes want = gpu::cpu_entry(p.base, p.next, l.es, l.field, context);
    const bool same = got == want;
    std::printf("%s %-7s  %s  (%llu changes, entry %zu bytes)\n", same ? "PASS" : "FAIL", context ? "context" : "sparse", name,
                static_cast<unsigned long long>(f.changes()), want.size());
    if (!same) {
      ++failures;
      const gpu::Found r = gpu::reference_find(p.base, p.next, l.es, l.field);
      std::printf("     entry %zu bytes, CPU's %zu, first difference at byte %zu; changes %llu, reference %llu; positions %s, differences %s\n",
                  got.size(), want.size(), first_difference(got, want), static_cast<unsigned long long>(f.changes()),
                  static_cast<unsigned long long>(r.changes()), f.pos == r.pos ? "same" : "differ",
                  f.diff == r.diff ? "same" : "differ");
    }
  }
  return failures;
}

int identity() {
  gpu::ChangeFinder finder;
  const std::uint64_t M = kSparseChunkElements;
  std::vector<Case> cases;
  for (const double density : {0.001, 0.01, 0.1}) {
    cases.push_back({"BF16", 2 * (3 * M + 12345), density, 0});
    cases.push_back({"F16", 2 * (M + 1), density, 0});
    cases.push_back({"F32", 4 * (2 * M + 77), density, 0});
    cases.push_back({"F8_E4M3", 3 * M + 5, density, 0});
    cases.push_back({"F8_E5M2", M + 4097, density, 0});
  }
  const Case odd[] = {
      {"BF16", 2, 1.0, 0},           {"BF16", 2 * 31, 0.1, 0},       {"BF16", 2 * 33, 0.1, 0},   {"BF16", 2 * 4099, 0.01, 0},
      {"BF16", 2 * 4099 + 1, 0.1, 0},  // odd bytes: 1-byte elements, no field
      {"BF16", 2 * (M + 3), 0.01, 2},  // unaligned pointers
      {"F32", 4 * 100003, 0.05, 4},    {"F8_E4M3", 1000001, 0.02, 1},  {"F64", 8 * 300001, 0.1, 0}, {"I32", 4 * 250000, 0.1, 0},
      {"BF16", 2 * 100000, 0.0, 0},    {"BF16", 2 * 65536, 1.0, 0},
  };
  cases.insert(cases.end(), std::begin(odd), std::end(odd));
  int failures = 0;
  for (const Case& k : cases) failures += check_case(finder, k);
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

bool throughput(std::uint64_t nbytes) {
  gpu::ChangeFinder finder;
  constexpr int kReps = 7;
  bool goal_met = false;
  std::printf("\n%-8s %7s | %8s | %8s %5s %7s %7s | %8s %5s %7s %7s | %9s %10s %8s %8s\n", "dtype", "density", "D2D GB/s",
              "find GB/s", "ratio", "find ms", "host ms", "+ctx GB/s", "ratio", "ctx ms", "rank ms", "changes", "to host B",
              "B/change", "host/N");
  struct Row {
    const char* dtype;
    double density;
  };
  const Row rows[] = {{"BF16", 0.001}, {"BF16", 0.01}, {"BF16", 0.1}, {"F32", 0.01}, {"F8_E4M3", 0.01}};
  for (const Row& r : rows) {
    const ChunkLayout l = chunk_layout(r.dtype, nbytes);
    const gpu::Pair p = gpu::make_pair_data(nbytes, l.es, l.field, r.density, 7);
    DevicePair d(p, l.es, l.field, 0);
    void* dst = nullptr;
    ck(cudaMalloc(&dst, nbytes), "cudaMalloc");
    const float copy = memcpy_ms(d.t.base, dst, nbytes, kReps);
    cudaFree(dst);
    gpu::Found f;
    std::vector<float> find, host, cfind, crank;
    bool again = false;
    for (int i = 0; i <= kReps; ++i) {  // the first grows the finder's buffers
      finder.find(d.t, false, f);
      if (i) find.push_back(finder.timing().find_ms), host.push_back(finder.timing().total_ms - finder.timing().find_ms);
      if (i) again |= finder.timing().found_again;
    }
    const std::uint64_t sparse_host = f.host_bytes;
    for (int i = 0; i <= kReps; ++i) {
      finder.find(d.t, true, f);
      const float find_ms = finder.timing().find_ms;
      finder.rank(d.t, gpu::context_groups_of(f, l.field), f);
      if (i) cfind.push_back(find_ms), crank.push_back(finder.timing().find_ms);
    }
    const float fm = median(find), hm = median(host), cm = median(cfind), rm = median(crank);
    const double gb = static_cast<double>(nbytes) / 1e6;  // GB/s from bytes per ms
    const double ratio = copy / fm, ratio_ctx = copy / (cm + rm);
    std::printf("%-8s %6.2f%% | %8.0f | %8.0f %4.0f%% %7.3f %7.3f | %8.0f %4.0f%% %7.3f %7.3f | %9llu %10llu %8.2f %7.4f%%%s\n",
                r.dtype, 100 * r.density, gb / copy, gb / fm, 100 * ratio, fm, hm, gb / (cm + rm), 100 * ratio_ctx, cm, rm,
                static_cast<unsigned long long>(f.changes()), static_cast<unsigned long long>(sparse_host),
                f.changes() ? static_cast<double>(sparse_host) / static_cast<double>(f.changes()) : 0.0,
                100.0 * static_cast<double>(sparse_host) / static_cast<double>(nbytes), again ? "  (found again)" : "");
    if (r.dtype == std::string("BF16") && r.density == 0.01) goal_met = ratio >= 0.7;
  }
  std::printf("(%.0f MiB tensors, medians of %d; GB/s: tensor bytes per second; find: sparse's change finding on the\n"
              " device, one pass; host ms: its wait for the count and copies to the host; ctx ms: context's find (with\n"
              " contexts and sample), rank ms: its ranks on the device; +ctx GB/s: over both; to host B: sparse's bytes\n"
              " copied to the host)\n", static_cast<double>(nbytes) / (1 << 20), kReps);
  return goal_met;
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t mib = 512;
  bool only_identity = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--identity") == 0)
      only_identity = true;
    else if (std::strcmp(argv[i], "--mib") == 0 && i + 1 < argc)
      mib = std::stoull(argv[++i]);
    else {
      std::fprintf(stderr, "usage: hfdelta-gpu-check [--identity] [--mib N (throughput tensor size, default 512)]\n");
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
    const auto t0 = std::chrono::steady_clock::now();
    const int failures = identity();
    std::printf("%s: identity, %d mismatches (%.1f s)\n", failures ? "FAIL" : "PASS", failures,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (!only_identity) {
      const bool met = throughput(mib << 20);
      std::printf("%s: BF16 at 1%% density finds changes at >= 70%% of D2D memcpy bandwidth\n", met ? "GOAL MET" : "GOAL MISSED");
    }
    return failures ? 1 : 0;
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
}
