// hfdelta-bench's measuring half: what one subcommand measures, as a plain
// struct. records.hpp writes each as the JSON record that scripts/bench/bench.sh
// collects; report.hpp reads those records back, after the run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace bench {

// `t` threads, or all that OpenMP has when `t` is 0.
int threads_or_all(int t);

// ---- bound: the order-0 entropy bound of the change between two checkpoints

struct Bound {
  struct Tensor {
    std::string name, dtype;
    std::size_t width = 0;  // bytes per element it was read as (1, 2, 4 or 8)
    std::uint64_t elements = 0, changed = 0, distinct_xor = 0;
    double position_bits = 0, value_bits = 0;
  };
  std::string base, target;
  std::uint64_t tensors = 0, tensors_changed = 0, elements = 0, elements_changed = 0;
  std::uint64_t tensor_bytes = 0;            // the tensors' data
  std::uint64_t shard_bytes = 0;             // NEW's shard files
  std::uint64_t full_bytes = 0;              // every regular file of NEW
  double position_bits = 0, value_bits = 0;  // summed over the tensors
  double conditioned_bits = 0;               // given the base exponent (2-byte context fields; else the order-0 bits)
  int threads = 0;
  double seconds = 0;
  std::optional<std::vector<Tensor>> per_tensor;  // with --per-tensor
};

Bound measure_bound(const std::string& base, const std::string& target, int threads, bool per_tensor);

// ---- readfloor and warm: reading checkpoints from the page cache

// What a floor pass does besides reading.
struct PassKind {
  bool hash = false;        // XXH3-128 of every byte read (per piece)
  bool write_back = false;  // every buffer written back where it was read; with `hash`, hashed
                            // twice: as the base and as the result of a checked patch
};

struct ReadFloor {
  std::vector<std::string> paths;
  std::size_t files = 0;
  std::uint64_t bytes = 0;
  PassKind kind;
  int threads = 0;
  double warm_pass_s = 0;       // the first pass, not counted
  std::vector<double> seconds;  // each measured pass
  std::uint64_t checksum = 0;   // of what was read, so that no read can be skipped
  // The fastest measured pass (the warm pass if none was measured).
  double best() const;
};

ReadFloor measure_readfloor(const std::vector<std::string>& paths, int repeat, int threads, PassKind kind);

struct Warm {
  std::size_t files = 0;
  std::uint64_t bytes = 0;
  double seconds = 0;
};

Warm warm(const std::vector<std::string>& paths, int threads);

// ---- run: one command, timed, its memory sampled

struct RunOptions {
  std::string stdout_file;  // the command's stdout goes there ("" = inherited)
  double interval_ms = 5;   // sampling /proc
  bool time_v = false;      // under /usr/bin/time -v, for its maximum RSS
};

struct Run {
  std::vector<std::string> argv;  // the command as given
  int exit = 0;                   // its exit code, 128 + the signal that ended it
  double wall_s = 0, user_s = 0, sys_s = 0;
  long ru_maxrss_kib = 0;                                    // wait4's
  std::uint64_t peak_vm_rss_kib = 0, peak_rss_anon_kib = 0;  // of the process tree, sampled
  std::uint64_t samples = 0;
  double interval_ms = 0;
  std::optional<std::uint64_t> time_max_rss_kib;  // GNU time's, with time_v
};

Run run_command(const std::vector<std::string>& argv, const RunOptions& o);

// ---- size and machine

struct Size {
  std::vector<std::string> paths;
  std::uint64_t bytes = 0, files = 0;  // regular files under the paths
};

Size measure_size(const std::vector<std::string>& paths);

// What the layout of checkpoints or delta directories costs: their tensors,
// the safetensors headers (8-byte length and JSON, every .safetensors file)
// and the JSON files (indexes, configs), all files below the paths counted.
struct Layout {
  std::vector<std::string> paths;
  std::uint64_t safetensors_files = 0, tensors = 0, header_bytes = 0;
  std::uint64_t json_files = 0, json_bytes = 0, bytes = 0, files = 0;
};

Layout measure_layout(const std::vector<std::string>& paths);

// The mount holding a path (the longest mount point above it), from /proc/mounts.
struct Mount {
  std::string device, mount, fs_type;
};

// The block device under a path (the whole disk, not the partition).
struct BlockDevice {
  std::string name, rotational, model, vendor;
  std::uint64_t size_bytes = 0;
};

struct Disk {
  std::string path;
  std::optional<std::uint64_t> fs_size_bytes, fs_avail_bytes;  // from statvfs
  std::optional<Mount> mount;
  std::optional<BlockDevice> block;
};

struct Machine {
  int nproc = 0;  // CPUs this process may run on
  unsigned hardware_threads = 0;
  std::optional<std::string> cpu_model;
  std::optional<std::uint64_t> mem_total_bytes, mem_available_bytes;
  std::optional<std::string> kernel;
  std::string os;  // PRETTY_NAME of /etc/os-release
  Disk disk;
};

Machine describe_machine(const std::string& path);

}  // namespace bench
