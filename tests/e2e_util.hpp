// Helpers for the end-to-end tests: run the real binaries, make and compare
// directories, write safetensors files by hand, read the published layout.
#pragma once

#include <boost/filesystem.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <sys/types.h>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

namespace e2e {

namespace fs = boost::filesystem;
using nlohmann::json;
using Bytes = std::vector<std::uint8_t>;

// ---- running commands -------------------------------------------------------

struct RunResult {
  int code = -1;        // exit status; 128 + signal when killed by a signal
  std::string out;      // stdout
  std::string err;      // stderr
  std::string cmdline;  // for messages
  // One text with everything, for CHECK_MESSAGE / INFO.
  std::string describe() const;
};

// Runs argv[0] (a path, no shell, no PATH search) with stdin from /dev/null,
// capturing stdout and stderr. Throws std::runtime_error if it cannot start.
RunResult run(const std::vector<std::string>& argv);
// Starts argv[0] with stdin from /dev/null and stdout, stderr on the given
// descriptors (-1: /dev/null), without waiting. Throws if it cannot start.
pid_t spawn(const std::vector<std::string>& argv, int out_fd = -1, int err_fd = -1);

// `s` quoted for /bin/sh (single quotes).
std::string sh_quote(const std::string& s);

// delta-apply ARGS... started in the background, its output going to
// OUT_DIR/NAME.out and NAME.err; waited for (and killed first if still
// running) on destruction.
class Background {
 public:
  Background(const std::vector<std::string>& args, const fs::path& out_dir, const std::string& name = "bg");
  ~Background();
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;
  bool running();  // true while the process has not exited
  int wait();      // its exit code (128 + N if signal N ended it)
  std::string output() const;

 private:
  fs::path out_, err_;
  pid_t pid_ = -1;
  int code_ = -1;
};

// Waits until `p` exists or `bg` has exited; true if it exists.
bool wait_for_file(const fs::path& p, Background& bg, double seconds = 120);

// ARGV run with HFDELTA_FAULT_MODE=pause at write step `step`: stopped there,
// `at_stop` runs (a test looks at or changes the files meanwhile), then the
// process gets `sig`, is continued and goes on to its end.
struct Signalled {
  bool paused = false;  // it reached the step (else it ran to the end first)
  int code = -1;        // its exit code, 128 + N if a signal ended it
  std::string err;      // its stderr
};
Signalled signal_at_step(const std::vector<std::string>& argv, long step, int sig,
                         const std::function<void()>& at_stop = {});
// ARGV stopped at write step `step` (HFDELTA_FAULT_MODE=hold) while
// `at_stop` runs (a second actor changes what ARGV checked), then continued.
Signalled hold_at_step(const std::vector<std::string>& argv, long step, const std::function<void()>& at_stop);

// Paths of the binaries, from HFDELTA_DIFF / HFDELTA_APPLY / HFDELTA_FLEET /
// HFDELTA_GEN / HFDELTA_BENCH. Throws std::runtime_error naming the variable when unset.
std::string diff_bin();
std::string apply_bin();
std::string fleet_bin();
std::string gen_bin();
std::string bench_bin();

// delta-diff ARGS..., delta-apply ARGS..., delta-fleet ARGS... (argv[0] added).
RunResult diff(const std::vector<std::string>& args);
RunResult apply(const std::vector<std::string>& args);
RunResult delta_fleet(const std::vector<std::string>& args);
// delta-apply --json --root ROOT [EXTRA...] LOCAL, required to succeed; its
// JSON result. Creates LOCAL first if it does not exist, as a new host would.
json pull(const fs::path& root, const fs::path& local, const std::vector<std::string>& extra = {});

// ---- temporary directories --------------------------------------------------

// A fresh directory made with mkdtemp, removed with everything in it on
// destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& rel) const { return path_ / rel; }

 private:
  fs::path path_;
};

// ---- files and directories --------------------------------------------------

std::string read_file(const fs::path& p);  // throws when it cannot be read
Bytes read_bytes(const fs::path& p);
void write_file(const fs::path& p, const std::string& content);  // creates parent dirs
void write_bytes(const fs::path& p, const Bytes& content);
// Recursive copy of a directory (files and subdirectories).
void copy_tree(const fs::path& from, const fs::path& to);
// Sum of the sizes of every regular file below dir.
std::uint64_t tree_size(const fs::path& dir);
// Every regular file below dir, relative with '/', sorted.
std::vector<std::string> list_files(const fs::path& dir);
// Every entry (file or directory) directly inside dir, names only, sorted.
std::vector<std::string> list_names(const fs::path& dir);

// Contents of every regular file below a directory, keyed by relative path.
// `with_state`: include .weight_sync/ (its lock file is always left out: it is
// created by any run and carries no data).
using Snapshot = std::map<std::string, std::string>;
Snapshot snapshot(const fs::path& dir, bool with_state = true);

// Differences between two snapshots as readable lines (empty: identical).
std::vector<std::string> snapshot_diff(const Snapshot& a, const Snapshot& b, const std::string& name_a = "a",
                                       const std::string& name_b = "b");

struct TreeDiff {
  bool equal = true;
  std::vector<std::string> differences;
  std::string report() const;  // one difference a line
};
// Compares every file of two directories byte for byte, ignoring .weight_sync/.
TreeDiff tree_equal(const fs::path& a, const fs::path& b);

// A snapshot of LOCAL compared later with the directory as it is then.
struct LocalSnapshot {
  fs::path dir;
  Snapshot before;
  explicit LocalSnapshot(const fs::path& d) : dir(d), before(snapshot(d, true)) {}
  TreeDiff compare() const;  // differences between before and now, .weight_sync/state.json included
};

// ---- safetensors by hand ------------------------------------------------------

struct TensorData {
  std::string name;
  std::string dtype;
  std::vector<std::uint64_t> shape;
  Bytes bytes;
};

// Writes a safetensors file laid out by hfdelta::layout_safetensors.
void write_safetensors(const fs::path& p, const std::vector<TensorData>& tensors,
                       const std::map<std::string, std::string>* metadata = nullptr);

// An independent reader of a safetensors file (header JSON and raw data), so
// the tests check the published layout without the library's parser.
struct StFile {
  std::uint64_t header_len = 0;
  json header;  // the parsed header object
  Bytes raw;    // the whole file
  std::uint64_t data_start() const { return 8 + header_len; }
  std::vector<std::string> tensor_names() const;                                      // sorted, without __metadata__
  json metadata() const;                                                              // __metadata__ or null
  Bytes tensor(const std::string& name) const;                                        // the tensor's bytes
  std::pair<std::uint64_t, std::uint64_t> file_range(const std::string& name) const;  // [begin, end) in the file
};
StFile read_st(const fs::path& p);

// Finds the shard of an HF checkpoint holding `tensor` (via its index, or the
// single model.safetensors) and returns its bytes.
Bytes checkpoint_tensor(const fs::path& dir, const std::string& tensor);
// Tensor names of a checkpoint (from its index or its single file), sorted.
std::vector<std::string> checkpoint_tensors(const fs::path& dir);
// Tensors whose bytes differ between two checkpoints of the same layout.
std::set<std::string> changed_tensors(const fs::path& a, const fs::path& b);

// XXH3-128 of bytes as 32 lowercase hex digits, high 64 bits first (computed
// with libxxhash directly, not through the library).
std::string xxh3_hex(const Bytes& b);
std::string xxh3_hex(const std::string& s);

// Decompresses one whole zstd frame with ZSTD_decompress; throws if it is not
// a valid frame with a known content size.
Bytes zstd_decompress(const Bytes& frame);

// A small sharded checkpoint written by hand, for structural deltas.
// Layout 0 has shards model-a, model-b, model-c and model-e. Layout 1 is its
// next save: model-a keeps its header (a tensor changes), model-b changes a
// __metadata__ value to one of the same length (a header rewrite) and a
// tensor, model-c is re-laid (a tensor retyped, one added), model-d is new (a
// tensor moved from model-e, one renamed, one of zeros) and model-e is gone;
// config.json and the index change too. Layout 2, the save after it, goes
// back to layout 0's files with other bytes. `seed` changes every tensor's
// bytes: another seed is another model of the same layouts.
void write_structural_checkpoint(const fs::path& dir, int layout, std::uint32_t seed = 1);

// ---- JSON -------------------------------------------------------------------

json parse_json(const std::string& text);  // throws with the text in the message
std::set<std::string> keys_of(const json& obj);
// file -> op of a delta index's hfdelta_shards (empty when it has none).
std::map<std::string, std::string> ops_of(const json& index);

// ---- small things -----------------------------------------------------------

bool contains(const std::string& hay, const std::string& needle);
std::string v6(int v);  // a version as six zero-padded digits
json read_json(const fs::path& p);
void write_json(const fs::path& p, const json& j);

// ---- series -----------------------------------------------------------------

// delta-apply -q --init --init-version VERSION SRC LOCAL, required to succeed;
// the version LOCAL then records.
std::string require_init(const fs::path& src, const fs::path& local, const std::string& version = "0");
// delta-diff -q --encoding ENCODING A B OUT, required to succeed.
void require_diff(const fs::path& a, const fs::path& b, const fs::path& out, const std::string& encoding);
// A chain in ROOT (which exists) over saves 0 to 3 of SERIES: version 1 an
// xor delta, 2 a full version with a file of its own, 3 an overwrite delta
// from it to NEW3 (made here: save 3 with that file changed). Returns the
// full version's directory and NEW3.
std::pair<fs::path, fs::path> make_full_version_chain(const fs::path& series, const fs::path& root,
                                                      const fs::path& new3);

// hfdelta-gen --preset tiny --saves N [extra...] OUTDIR; throws if it fails.
// Returns OUTDIR.
fs::path gen_series(const fs::path& outdir, int saves, const std::vector<std::string>& extra = {});
// OUTDIR/save_NNN
fs::path save_dir(const fs::path& series, int i);
// ROOT/weight_vNNNNNN
fs::path version_dir(const fs::path& root, int v);

// The version recorded in LOCAL/.weight_sync/state.json ("" when there is no
// state file), and the whole state object.
std::string state_version(const fs::path& local);
json state_json(const fs::path& local);

// The index of a delta directory.
json delta_index(const fs::path& delta);

// First line of a command's output, for short messages.
std::string first_line(const std::string& s);

// argv[0] for a system tool (mkfs.ext4, mount, ...), or "" when it is in none
// of the usual places.
std::string system_tool(const std::string& name);

// Makes a sparse image of `size` bytes beside `dir`, formats it with `mkfs`
// (a tool name then its options; the image path is appended) and loop-mounts
// it at `dir`. Returns "" when mounted, otherwise why not (a test then says so
// and skips). unmount() takes it down again.
std::string mount_loop_image(const fs::path& dir, std::uint64_t size, const std::vector<std::string>& mkfs);
void unmount(const fs::path& dir);

// One try in `stride` of a sweep, those with n % stride == offset (n from 0),
// both read from two environment variables; by default every try. CI's runs
// that cannot afford a whole sweep set them, with the offset drawn anew for
// each run and printed: successive runs cover every try, and a failure
// replays with the same two variables.
struct Sampling {
  long stride = 1, offset = 0;
  Sampling(const char* stride_var, const char* offset_var) {
    if (const char* v = std::getenv(stride_var)) stride = std::max(1L, std::atol(v));
    if (const char* v = std::getenv(offset_var)) offset = std::max(0L, std::atol(v)) % stride;
  }
  bool all() const { return stride == 1; }
  bool take(long n) const { return n % stride == offset; }
};

// Sets an environment variable for the commands started while it lives (the
// tests run one at a time, so the process environment is theirs).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// A temporary directory on a RAM-backed filesystem when there is one with
// room (flushes cost nothing there, and thousands of runs flush), else in the
// usual place. The faults tested are kills and I/O errors, not power cuts, so
// the filesystem does not change what is tested.
std::unique_ptr<TempDir> scratch_dir();

// The exit code of the hfdelta::Error that `f` throws (0: it throws none),
// for the tests that call the library directly.
int code_of(const std::function<void()>& f);

// True if LOCAL holds a transaction directory.
bool has_txn(const fs::path& local);

// Rewrites version directory `dir`'s completion marker (if it has one) for
// the files as they are now: a crafted delta as a publisher would seal it,
// so that the check under test, not the marker's, is what answers.
void reseal_marker(const fs::path& dir);
// A step of a transaction is journaled under .weight_sync/txn (a bare
// directory, or one without its manifest, is a leftover, not a journal).
bool has_journal(const fs::path& local);

}  // namespace e2e

// ---- assertions ---------------------------------------------------------------
// doctest checks whose failure message carries the command's whole output, or
// the list of differing files.

#define E2E_CHECK_CODE(res, want)                            \
  do {                                                       \
    const ::e2e::RunResult& e2e_r_ = (res);                  \
    CHECK_MESSAGE(e2e_r_.code == (want), e2e_r_.describe()); \
  } while (0)
#define E2E_REQUIRE_CODE(res, want)                            \
  do {                                                         \
    const ::e2e::RunResult& e2e_r_ = (res);                    \
    REQUIRE_MESSAGE(e2e_r_.code == (want), e2e_r_.describe()); \
  } while (0)
#define E2E_CHECK_TREE_EQUAL(a, b)                              \
  do {                                                          \
    const ::e2e::TreeDiff e2e_t_ = ::e2e::tree_equal((a), (b)); \
    CHECK_MESSAGE(e2e_t_.equal, e2e_t_.report());               \
  } while (0)
#define E2E_CHECK_UNCHANGED(snap)                    \
  do {                                               \
    const ::e2e::TreeDiff e2e_t_ = (snap).compare(); \
    CHECK_MESSAGE(e2e_t_.equal, e2e_t_.report());    \
  } while (0)
