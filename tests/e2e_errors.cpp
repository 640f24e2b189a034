// End-to-end: every refusal of delta-diff and delta-apply, with its exit code,
// its message, and the guarantee that nothing was changed.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <tuple>

#include "e2e_util.hpp"

using namespace e2e;

namespace {

#define CHECK_ERR_MENTIONS(res, text) \
  CHECK_MESSAGE(contains((res).err, (text)), "stderr should mention \"" << (text) << "\"\n" << (res).describe())

// A series, deltas 1..n published under ROOT, and LOCAL initialised from save_000.
struct Chain {
  TempDir t;
  fs::path series, root, local;
  explicit Chain(int n, const std::string& encoding = "xor",
                 std::vector<std::string> gen = {"--max-shard-size", "600KB"}) {
    series = gen_series(t / "series", n, gen);
    root = t / "root";
    local = t / "local";
    fs::create_directories(root);
    for (int v = 1; v <= n; ++v) {
      const RunResult r = diff({"-q", "--encoding", encoding, save_dir(series, v - 1).string(),
                                save_dir(series, v).string(), version_dir(root, v).string()});
      E2E_REQUIRE_CODE(r, 0);
    }
    E2E_REQUIRE_CODE(apply({"-q", "--init", save_dir(series, 0).string(), local.string()}), 0);
  }
  fs::path delta(int v) const { return version_dir(root, v); }
};

// The delta file holding `tensor` in a delta directory, and the tensor's frame range in it.
struct EntryLoc {
  fs::path file;
  std::uint64_t begin = 0, end = 0;
};
EntryLoc locate_entry(const fs::path& delta, const std::string& tensor) {
  const json idx = delta_index(delta);
  EntryLoc e;
  e.file = delta / idx["weight_map"][tensor].get<std::string>();
  std::tie(e.begin, e.end) = read_st(e.file).file_range(tensor);
  return e;
}

// The changed tensor with the largest frame.
std::string largest_entry(const fs::path& delta) {
  const json idx = delta_index(delta);
  std::string best;
  std::uint64_t size = 0;
  for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
    const EntryLoc e = locate_entry(delta, it.key());
    if (e.end - e.begin > size) size = e.end - e.begin, best = it.key();
  }
  return best;
}

// Holds an exclusive flock on LOCAL/.weight_sync/lock, as another delta-apply would.
class HeldLock {
 public:
  explicit HeldLock(const fs::path& local) {
    fs::create_directories(local / ".weight_sync");
    fd_ = ::open((local / ".weight_sync" / "lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    REQUIRE(fd_ >= 0);
    REQUIRE(::flock(fd_, LOCK_EX | LOCK_NB) == 0);
  }
  ~HeldLock() { release(); }
  void release() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

void put_le64(Bytes& b, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) b[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(v >> (8 * i));
}

Bytes filler(std::size_t n, std::uint32_t seed) {
  Bytes b(n);
  std::uint32_t x = seed * 2654435761u + 7u;
  for (auto& c : b) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<std::uint8_t>(x >> 24);
  }
  return b;
}

}  // namespace

TEST_CASE("out-of-order delta: exit 4 and LOCAL byte-identical, state.json included") {
  Chain c(2);
  SUBCASE("delta 2 onto version 0") {
    const LocalSnapshot snap(c.local);
    const RunResult r = apply({c.delta(2).string(), c.local.string()});
    E2E_CHECK_CODE(r, 4);
    CHECK_ERR_MENTIONS(r, "weight_v000002");
    CHECK_ERR_MENTIONS(r, "000001");  // the base it needs
    E2E_CHECK_UNCHANGED(snap);
    CHECK(state_json(c.local) == json{{"version", "000000"}});
  }
  SUBCASE("an older delta (1) onto version 2") {
    E2E_REQUIRE_CODE(apply({"-q", c.delta(1).string(), c.local.string()}), 0);
    E2E_REQUIRE_CODE(apply({"-q", c.delta(2).string(), c.local.string()}), 0);
    const LocalSnapshot snap(c.local);
    const RunResult r = apply({c.delta(1).string(), c.local.string()});
    E2E_CHECK_CODE(r, 4);
    E2E_CHECK_UNCHANGED(snap);
    E2E_CHECK_TREE_EQUAL(c.local, save_dir(c.series, 2));
  }
}

TEST_CASE("LOCAL that is not the delta's base: exit 5 before anything is written") {
  Chain c(1);
  SUBCASE("LOCAL initialised from another seed, recorded at the right version") {
    const fs::path other = gen_series(c.t / "other", 0, {"--max-shard-size", "600KB", "--seed", "99"});
    E2E_REQUIRE_CODE(apply({"-q", "--init", save_dir(other, 0).string(), c.local.string()}), 0);
    REQUIRE(state_version(c.local) == "000000");
    const LocalSnapshot snap(c.local);
    const RunResult r = apply({c.delta(1).string(), c.local.string()});
    E2E_CHECK_CODE(r, 5);
    CHECK_ERR_MENTIONS(r, "tensor '");
    E2E_CHECK_UNCHANGED(snap);
    CHECK(state_json(c.local) == json{{"version", "000000"}});
  }
  SUBCASE("one byte of one touched tensor differs from the base") {
    const std::string victim = largest_entry(c.delta(1));
    const json idx = read_json(c.local / "model.safetensors.index.json");
    const fs::path shard = c.local / idx["weight_map"][victim].get<std::string>();
    const auto [b, e] = read_st(shard).file_range(victim);
    Bytes raw = read_bytes(shard);
    raw[b + (e - b) / 3] ^= 0x01;
    write_bytes(shard, raw);
    const LocalSnapshot snap(c.local);
    const RunResult r = apply({c.delta(1).string(), c.local.string()});
    E2E_CHECK_CODE(r, 5);
    CHECK_ERR_MENTIONS(r, "'" + victim + "'");
    E2E_CHECK_UNCHANGED(snap);
  }
}

TEST_CASE("malformed safetensors in BASE or NEW: delta-diff exit 3 naming the file, nothing published") {
  TempDir t;
  const fs::path series = gen_series(t / "series", 1, {"--max-shard-size", "600KB"});
  const fs::path base = t / "base", target = t / "new", root = t / "root";
  copy_tree(save_dir(series, 0), base);
  copy_tree(save_dir(series, 1), target);
  fs::create_directories(root);
  const std::string shard = "model-00002-of-00004.safetensors";
  REQUIRE(fs::exists(base / shard));
  fs::path broken;
  SUBCASE("NEW shard truncated") {
    broken = target / shard;
    fs::resize_file(broken, fs::file_size(broken) - 100);
  }
  SUBCASE("BASE shard truncated inside its header") {
    broken = base / shard;
    fs::resize_file(broken, 20);
  }
  SUBCASE("BASE header length runs past the end of the file") {
    broken = base / shard;
    Bytes raw = read_bytes(broken);
    put_le64(raw, raw.size());
    write_bytes(broken, raw);
  }
  SUBCASE("NEW header length above the 100,000,000-byte limit") {
    broken = target / shard;
    Bytes raw = read_bytes(broken);
    put_le64(raw, 100'000'001);
    write_bytes(broken, raw);
  }
  SUBCASE("NEW header JSON broken") {
    broken = target / shard;
    Bytes raw = read_bytes(broken);
    REQUIRE(raw[8] == '{');
    raw[9] = '#';  // {"name"... -> {#name"...
    write_bytes(broken, raw);
  }
  SUBCASE("BASE header with a bad data_offsets value") {
    broken = base / shard;
    Bytes raw = read_bytes(broken);
    const std::size_t hlen = raw[0] | (std::size_t(raw[1]) << 8) | (std::size_t(raw[2]) << 16);
    std::string h(raw.begin() + 8, raw.begin() + 8 + static_cast<std::ptrdiff_t>(hlen));
    // Change one digit of a non-zero begin offset: valid JSON, but a gap in the data buffer.
    std::size_t at = 0;
    for (;;) {
      at = h.find("\"data_offsets\":[", at);
      REQUIRE(at != std::string::npos);
      at += 16;
      if (h[at] >= '1' && h[at] <= '8' && h[at + 1] >= '0' && h[at + 1] <= '9') break;
    }
    h[at] = static_cast<char>(h[at] + 1);
    std::copy(h.begin(), h.end(), raw.begin() + 8);
    write_bytes(broken, raw);
  }
  CAPTURE(broken.string());
  const fs::path out = version_dir(root, 1);
  const RunResult r = diff({base.string(), target.string(), out.string()});
  E2E_CHECK_CODE(r, 3);
  CHECK_ERR_MENTIONS(r, broken.string());
  CHECK_FALSE(fs::exists(out));
  CHECK_MESSAGE(list_names(root).empty(), "left in ROOT: " << list_names(root).size() << " entries, first "
                                                           << (list_names(root).empty() ? "" : list_names(root)[0]));
}

TEST_CASE("OUT already exists: exit 7 and the existing OUT untouched") {
  TempDir t;
  const fs::path series = gen_series(t / "series", 1);
  const fs::path root = t / "root";
  fs::create_directories(root);
  const fs::path out = version_dir(root, 1);
  SUBCASE("a published version") {
    E2E_REQUIRE_CODE(diff({"-q", save_dir(series, 0).string(), save_dir(series, 1).string(), out.string()}), 0);
  }
  SUBCASE("a directory with something else in it") { write_file(out / "marker.txt", "someone else's\n"); }
  SUBCASE("an empty directory") { fs::create_directories(out); }
  SUBCASE("a regular file") { write_file(out, "not a directory\n"); }
  const auto names_before = list_names(root);
  const Snapshot before = fs::is_directory(out) ? snapshot(out) : Snapshot{{"", read_file(out)}};
  const RunResult r =
      diff({"--encoding", "overwrite", save_dir(series, 1).string(), save_dir(series, 0).string(), out.string()});
  E2E_CHECK_CODE(r, 7);
  CHECK_ERR_MENTIONS(r, out.string());
  const Snapshot after = fs::is_directory(out) ? snapshot(out) : Snapshot{{"", read_file(out)}};
  const auto d = snapshot_diff(before, after, "before", "after");
  CHECK_MESSAGE(d.empty(), d.size() << " differences, first: " << (d.empty() ? "" : d[0]));
  CHECK(list_names(root) == names_before);  // and no temporary directory beside it
}

TEST_CASE("structural difference between BASE and NEW: no longer refused, the delta brings LOCAL to NEW") {
  TempDir t;
  const std::vector<TensorData> base = {
      {"model.a.weight", "BF16", {4, 4}, filler(32, 1)},
      {"model.b.weight", "F16", {8}, filler(16, 2)},
      {"model.c.bias", "F32", {2}, filler(8, 3)},
  };
  std::vector<TensorData> target = base;
  target[0].bytes[0] ^= 1;  // a value change beside the structural one
  SUBCASE("a tensor added") { target.push_back({"model.d.added", "F32", {3}, filler(12, 4)}); }
  SUBCASE("a tensor removed") { target.pop_back(); }
  SUBCASE("a shape changed (same byte count)") { target[1].shape = {2, 4}; }
  SUBCASE("a dtype changed (same element size)") { target[1].dtype = "BF16"; }
  write_safetensors(t / "base" / "model.safetensors", base);
  write_safetensors(t / "new" / "model.safetensors", target);
  fs::create_directories(t / "root");
  const fs::path out = version_dir(t / "root", 1);
  E2E_REQUIRE_CODE(diff({"-q", (t / "base").string(), (t / "new").string(), out.string()}), 0);
  CHECK(delta_index(out)["metadata"]["hfdelta_shards"].size() == 1);
  const fs::path local = t / "local";
  E2E_REQUIRE_CODE(apply({"-q", "--init", (t / "base").string(), local.string()}), 0);
  E2E_REQUIRE_CODE(apply({"-q", out.string(), local.string()}), 0);
  E2E_CHECK_TREE_EQUAL(local, t / "new");
  E2E_CHECK_CODE(apply({"--verify", local.string()}), 0);
}

TEST_CASE("damaged or hostile delta: delta-apply exit 3 and LOCAL byte-identical") {
  std::string encoding = "xor";
  std::function<void(Chain&)> damage;
  std::string mention;
  SUBCASE("a bit flipped inside an xor frame") {
    damage = [&](Chain& c) {
      const std::string name = largest_entry(c.delta(1));
      const EntryLoc e = locate_entry(c.delta(1), name);
      Bytes raw = read_bytes(e.file);
      raw[e.begin + (e.end - e.begin) / 2] ^= 0x08;
      write_bytes(e.file, raw);
      mention = name;
    };
  }
  SUBCASE("a bit flipped inside an overwrite frame") {
    encoding = "overwrite";
    damage = [&](Chain& c) {
      const std::string name = largest_entry(c.delta(1));
      const EntryLoc e = locate_entry(c.delta(1), name);
      Bytes raw = read_bytes(e.file);
      raw[e.begin + (e.end - e.begin) / 2] ^= 0x08;
      write_bytes(e.file, raw);
      mention = name;
    };
  }
  SUBCASE("a delta file truncated") {
    damage = [&](Chain& c) {
      const EntryLoc e = locate_entry(c.delta(1), largest_entry(c.delta(1)));
      fs::resize_file(e.file, fs::file_size(e.file) - 7);
      mention = e.file.filename().string();
    };
  }
  SUBCASE("weight_map names a missing file") {
    damage = [&](Chain& c) {
      json idx = delta_index(c.delta(1));
      const std::string name = idx["weight_map"].begin().key();
      idx["weight_map"][name] = "model-00007-of-00009.safetensors";
      write_json(c.delta(1) / "model.safetensors.index.json", idx);
      mention = "model-00007-of-00009.safetensors";
    };
  }
  SUBCASE("weight_map path with '..' (to a file that exists)") {
    damage = [&](Chain& c) {
      json idx = delta_index(c.delta(1));
      const std::string name = idx["weight_map"].begin().key();
      const std::string file = idx["weight_map"][name].get<std::string>();
      fs::copy_file(c.delta(1) / file, c.root / file);
      idx["weight_map"][name] = "../" + file;
      write_json(c.delta(1) / "model.safetensors.index.json", idx);
      mention = "..";
    };
  }
  SUBCASE("hfdelta_files put to ../escape (its content present and matching)") {
    damage = [&](Chain& c) {
      json idx = delta_index(c.delta(1));
      const std::string content = "escaped\n";
      write_file(c.delta(1) / "escape", content);  // = files/../escape
      idx["metadata"]["hfdelta_files"].push_back(
          {{"path", "../escape"}, {"op", "put"}, {"size", content.size()}, {"xxh3-128", xxh3_hex(content)}});
      write_json(c.delta(1) / "model.safetensors.index.json", idx);
      mention = "../escape";
    };
  }
  SUBCASE("hfdelta_files remove of ../escape (a file beside LOCAL)") {
    damage = [&](Chain& c) {
      json idx = delta_index(c.delta(1));
      idx["metadata"]["hfdelta_files"].push_back({{"path", "../escape"}, {"op", "remove"}});
      write_json(c.delta(1) / "model.safetensors.index.json", idx);
      mention = "../escape";
    };
  }
  SUBCASE("hfdelta_files remove of an absolute path") {
    damage = [&](Chain& c) {
      json idx = delta_index(c.delta(1));
      idx["metadata"]["hfdelta_files"].push_back({{"path", (c.t / "escape").string()}, {"op", "remove"}});
      write_json(c.delta(1) / "model.safetensors.index.json", idx);
      mention = (c.t / "escape").string();
    };
  }
  SUBCASE("hfdelta_files put into .weight_sync/state.json") {
    damage = [&](Chain& c) {
      json idx = delta_index(c.delta(1));
      const std::string content = "{\"version\": \"000009\"}\n";
      write_file(c.delta(1) / "files" / ".weight_sync" / "state.json", content);
      idx["metadata"]["hfdelta_files"].push_back({{"path", ".weight_sync/state.json"},
                                                  {"op", "put"},
                                                  {"size", content.size()},
                                                  {"xxh3-128", xxh3_hex(content)}});
      write_json(c.delta(1) / "model.safetensors.index.json", idx);
      mention = ".weight_sync";
    };
  }
  SUBCASE("hfdelta_files put whose content does not match its checksum") {
    damage = [&](Chain& c) {
      json idx = delta_index(c.delta(1));
      write_file(c.delta(1) / "files" / "config.json", "{\"tampered\": true}\n");
      idx["metadata"]["hfdelta_files"].push_back(
          {{"path", "config.json"}, {"op", "put"}, {"size", 18}, {"xxh3-128", std::string(32, '0')}});
      write_json(c.delta(1) / "model.safetensors.index.json", idx);
      mention = "config.json";
    };
  }
  SUBCASE("hfdelta_files put whose content is missing from files/") {
    damage = [&](Chain& c) {
      json idx = delta_index(c.delta(1));
      idx["metadata"]["hfdelta_files"].push_back(
          {{"path", "notes/readme.md"}, {"op", "put"}, {"size", 6}, {"xxh3-128", xxh3_hex(std::string("hello\n"))}});
      write_json(c.delta(1) / "model.safetensors.index.json", idx);
      mention = "readme.md";
    };
  }
  SUBCASE("index is not valid JSON") {
    damage = [&](Chain& c) {
      std::string text = read_file(c.delta(1) / "model.safetensors.index.json");
      text.resize(text.size() / 2);
      write_file(c.delta(1) / "model.safetensors.index.json", text);
      mention = "model.safetensors.index.json";
    };
  }
  CAPTURE(encoding);
  Chain c(1, encoding);
  write_file(c.t / "escape", "outside LOCAL; must survive\n");
  damage(c);
  reseal_marker(c.delta(1));  // a publisher's bad delta, sealed: the check under test answers, not the marker's
  const LocalSnapshot snap(c.local);
  const RunResult r = apply({c.delta(1).string(), c.local.string()});
  E2E_CHECK_CODE(r, 3);
  CHECK_ERR_MENTIONS(r, mention);
  E2E_CHECK_UNCHANGED(snap);
  CHECK(read_file(c.t / "escape") == "outside LOCAL; must survive\n");
}

TEST_CASE("delta needing an unsupported feature: exit 6 and LOCAL unchanged") {
  Chain c(1);
  json idx = delta_index(c.delta(1));
  std::string mention;
  SUBCASE("unknown delta_encoding") {
    idx["metadata"]["delta_encoding"] = "zigzag";
    mention = "zigzag";
  }
  SUBCASE("hfdelta_format 99") {
    idx["metadata"]["hfdelta_format"] = 99;
    mention = "99";
  }
  SUBCASE("compression_format lz4") {
    idx["metadata"]["compression_format"] = "lz4";
    mention = "lz4";
  }
  SUBCASE("checksum_format sha256") {
    idx["metadata"]["checksum_format"] = "sha256";
    mention = "sha256";
  }
  write_json(c.delta(1) / "model.safetensors.index.json", idx);
  const LocalSnapshot snap(c.local);
  const RunResult r = apply({c.delta(1).string(), c.local.string()});
  E2E_CHECK_CODE(r, 6);
  CHECK_ERR_MENTIONS(r, mention);
  E2E_CHECK_UNCHANGED(snap);
}

TEST_CASE("usage errors: exit 2, nothing created or changed") {
  Chain c(1);
  const std::string d1 = c.delta(1).string(), L = c.local.string(), S0 = save_dir(c.series, 0).string(),
                    S1 = save_dir(c.series, 1).string(), R = c.root.string();
  const fs::path out = c.t / "out" / "weight_v000005";
  fs::create_directories(out.parent_path());
  std::vector<std::string> args;
  bool is_diff = false;
  SUBCASE("delta-apply without arguments") { args = {}; }
  SUBCASE("delta-apply with only LOCAL") { args = {L}; }
  SUBCASE("delta-apply with three paths") { args = {d1, L, S0}; }
  SUBCASE("delta-apply --target without --root") { args = {"--target", "1", d1, L}; }
  SUBCASE("delta-apply --root with two paths") { args = {"--root", R, d1, L}; }
  SUBCASE("delta-apply --root with --init") { args = {"--root", R, "--init", L}; }
  SUBCASE("delta-apply --init-version without --init") { args = {"--init-version", "3", d1, L}; }
  SUBCASE("delta-apply --init with one path") { args = {"--init", L}; }
  SUBCASE("delta-apply negative --lock-timeout") { args = {"--lock-timeout", "-1", d1, L}; }
  SUBCASE("delta-apply unknown option") { args = {"--frobnicate", d1, L}; }
  SUBCASE("delta-diff without arguments") { is_diff = true, args = {}; }
  SUBCASE("delta-diff with two paths") { is_diff = true, args = {S0, S1}; }
  SUBCASE("delta-diff bad --encoding") { is_diff = true, args = {"--encoding", "rle", S0, S1, out.string()}; }
  SUBCASE("delta-diff --level 0") { is_diff = true, args = {"--level", "0", S0, S1, out.string()}; }
  SUBCASE("delta-diff --level 20") { is_diff = true, args = {"--level", "20", S0, S1, out.string()}; }
  SUBCASE("delta-diff OUT not named weight_vNNNNNN and no --delta-version") {
    is_diff = true, args = {S0, S1, (c.t / "out" / "latest").string()};
  }
  SUBCASE("delta-diff version 0 without --base-version") {
    is_diff = true, args = {S0, S1, (c.t / "out" / "weight_v000000").string()};
  }
  SUBCASE("delta-diff --base-version not below the version") {
    is_diff = true, args = {"--base-version", "5", S0, S1, out.string()};
  }
  const LocalSnapshot snap(c.local);
  const RunResult r = is_diff ? diff(args) : apply(args);
  E2E_CHECK_CODE(r, 2);
  CHECK_MESSAGE(!r.err.empty(), r.describe());
  E2E_CHECK_UNCHANGED(snap);
  CHECK(list_names(out.parent_path()).empty());
}

TEST_CASE("--lock-timeout while another process holds LOCAL's lock: exit 8, then it works once released") {
  Chain c(1);
  std::vector<std::string> args;
  SUBCASE("apply one delta") { args = {"--lock-timeout", "0.3", c.delta(1).string(), c.local.string()}; }
  SUBCASE("--init") { args = {"--lock-timeout", "0.3", "--init", save_dir(c.series, 1).string(), c.local.string()}; }
  SUBCASE("--root") { args = {"--lock-timeout", "0.3", "--root", c.root.string(), c.local.string()}; }
  const LocalSnapshot snap(c.local);
  {
    HeldLock lock(c.local);
    const RunResult r = apply(args);
    E2E_CHECK_CODE(r, 8);
    CHECK_ERR_MENTIONS(r, "lock");
    E2E_CHECK_UNCHANGED(snap);
  }
  const RunResult ok = apply(args);
  E2E_CHECK_CODE(ok, 0);
  E2E_CHECK_TREE_EQUAL(c.local, save_dir(c.series, 1));
}

TEST_CASE("a delta for a tensor LOCAL lacks: exit 3 naming it, LOCAL unchanged") {
  TempDir t;
  const std::vector<TensorData> base = {
      {"model.a.weight", "BF16", {4, 4}, filler(32, 1)},
      {"model.b.weight", "F16", {8}, filler(16, 2)},
      {"model.c.extra", "F32", {4}, filler(16, 3)},
  };
  std::vector<TensorData> target = base;
  target[2].bytes[5] ^= 0x10;  // only model.c.extra changes
  write_safetensors(t / "base" / "model.safetensors", base);
  write_safetensors(t / "new" / "model.safetensors", target);
  write_safetensors(t / "small" / "model.safetensors", {base[0], base[1]});
  fs::create_directories(t / "root");
  const fs::path out = version_dir(t / "root", 1);
  E2E_REQUIRE_CODE(diff({"-q", (t / "base").string(), (t / "new").string(), out.string()}), 0);
  const fs::path local = t / "local";
  E2E_REQUIRE_CODE(apply({"-q", "--init", (t / "small").string(), local.string()}), 0);
  const LocalSnapshot snap(local);
  const RunResult r = apply({out.string(), local.string()});
  E2E_CHECK_CODE(r, 3);
  CHECK_ERR_MENTIONS(r, "model.c.extra");
  E2E_CHECK_UNCHANGED(snap);
}

TEST_CASE("LOCAL without a recorded version: applying a delta is exit 4 and mentions --init") {
  Chain c(1);
  const fs::path plain = c.t / "plain";
  copy_tree(save_dir(c.series, 0), plain);
  const LocalSnapshot snap(plain);
  const RunResult r = apply({c.delta(1).string(), plain.string()});
  E2E_CHECK_CODE(r, 4);
  CHECK_ERR_MENTIONS(r, "--init");
  E2E_CHECK_UNCHANGED(snap);
  CHECK_FALSE(fs::exists(plain / ".weight_sync" / "state.json"));
}

TEST_CASE("--init from a malformed SRC: exit 3 naming the file, LOCAL unchanged") {
  Chain c(1);
  const fs::path bad = c.t / "bad";
  copy_tree(save_dir(c.series, 1), bad);
  const fs::path shard = bad / "model-00002-of-00004.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 1);
  const LocalSnapshot snap(c.local);
  const RunResult r = apply({"--init", bad.string(), c.local.string()});
  E2E_CHECK_CODE(r, 3);
  CHECK_ERR_MENTIONS(r, shard.string());
  E2E_CHECK_UNCHANGED(snap);
}
