// End-to-end: delta-diff and delta-apply on real directories, success paths.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <zstd.h>

#include <algorithm>
#include <cstdio>
#include <set>

#include "ckpt_edit.hpp"
#include "e2e_util.hpp"
#include "hfdelta/checkpoint.hpp"
#include "hfdelta/sharded_publisher.hpp"
#include "util/io.hpp"

using namespace e2e;

namespace {

std::vector<std::string> shard_files(const fs::path& dir) {
  std::vector<std::string> v;
  for (const auto& f : list_names(dir))
    if (f.size() > 12 && f.substr(f.size() - 12) == ".safetensors") v.push_back(f);
  return v;
}

// Diffs save_{v-1} -> save_v into ROOT/weight_v for v = 1..n, then initialises
// LOCAL from save_000 and applies every delta in order, checking LOCAL against
// the matching save after each step.
void chain_round_trip(const fs::path& series, const fs::path& root, const fs::path& local, int n,
                      const std::string& encoding) {
  fs::create_directories(root);
  for (int v = 1; v <= n; ++v) {
    const RunResult r = diff({"-q", "--encoding", encoding, save_dir(series, v - 1).string(),
                              save_dir(series, v).string(), version_dir(root, v).string()});
    E2E_REQUIRE_CODE(r, 0);
    REQUIRE(fs::is_directory(version_dir(root, v)));
    CHECK(delta_index(version_dir(root, v))["metadata"]["delta_encoding"] == encoding);
    // A delta of a training step is much smaller than the save itself.
    CHECK(tree_size(version_dir(root, v)) < tree_size(save_dir(series, v)) / 2);
  }
  E2E_REQUIRE_CODE(apply({"-q", "--init", save_dir(series, 0).string(), local.string()}), 0);
  CHECK(state_version(local) == "000000");
  E2E_CHECK_TREE_EQUAL(local, save_dir(series, 0));
  for (int v = 1; v <= n; ++v) {
    INFO("applying version " << v);
    E2E_REQUIRE_CODE(apply({"-q", version_dir(root, v).string(), local.string()}), 0);
    CHECK(state_version(local) == v6(v));
    E2E_CHECK_TREE_EQUAL(local, save_dir(series, v));
  }
  // The final state is exactly {"version": "00000n"}: no pending apply left.
  CHECK(state_json(local) == json{{"version", v6(n)}});
  // Reader-visible leftovers: no temporary files beside the patched ones.
  for (const auto& f : list_files(local)) CHECK_MESSAGE(f.find(".tmp-") == std::string::npos, f);
}

// Deterministic filler bytes.
Bytes filler(std::size_t n, std::uint32_t seed) {
  Bytes b(n);
  std::uint32_t x = seed * 2654435761u + 12345u;
  for (auto& c : b) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<std::uint8_t>(x >> 24);
  }
  return b;
}

}  // namespace

TEST_CASE("sharded series: xor deltas applied in order reproduce every save byte for byte") {
  TempDir t;
  const fs::path series = gen_series(t / "series", 3, {"--max-shard-size", "600KB"});
  REQUIRE(fs::exists(save_dir(series, 0) / "model.safetensors.index.json"));
  REQUIRE(shard_files(save_dir(series, 0)).size() >= 2);
  chain_round_trip(series, t / "root", t / "local", 3, "xor");
}

TEST_CASE("sharded series: overwrite deltas applied in order reproduce every save byte for byte") {
  TempDir t;
  const fs::path series = gen_series(t / "series", 3, {"--max-shard-size", "600KB"});
  REQUIRE(shard_files(save_dir(series, 0)).size() >= 2);
  chain_round_trip(series, t / "root", t / "local", 3, "overwrite");
}

TEST_CASE("single-file checkpoints round-trip (bf16, f16, f32; both encodings)") {
  std::string dtype, encoding;
  SUBCASE("bf16 xor") { dtype = "bf16", encoding = "xor"; }
  SUBCASE("f16 overwrite") { dtype = "f16", encoding = "overwrite"; }
  SUBCASE("f32 xor") { dtype = "f32", encoding = "xor"; }
  CAPTURE(dtype);
  CAPTURE(encoding);
  TempDir t;
  const fs::path series = gen_series(t / "series", 2, {"--single-file", "--dtype", dtype});
  REQUIRE(fs::exists(save_dir(series, 0) / "model.safetensors"));
  REQUIRE_FALSE(fs::exists(save_dir(series, 0) / "model.safetensors.index.json"));
  chain_round_trip(series, t / "root", t / "local", 2, encoding);
  // One delta file, numbered from 0.
  CHECK(shard_files(version_dir(t / "root", 1)) == std::vector<std::string>{"model-00000-of-00001.safetensors"});
}

TEST_CASE("mixed dtypes built by hand: only changed tensors travel, as U8 [L] with checksums, and apply exactly") {
  std::string encoding;
  SUBCASE("xor") { encoding = "xor"; }
  SUBCASE("overwrite") { encoding = "overwrite"; }
  CAPTURE(encoding);
  TempDir t;

  std::vector<TensorData> base = {
      {"bf16.w", "BF16", {4, 8}, filler(64, 1)},
      {"bf16.frozen", "BF16", {8}, filler(16, 2)},
      {"f16.w", "F16", {16}, filler(32, 3)},
      {"f32.w", "F32", {3, 5}, filler(60, 4)},
      {"f8.w", "F8_E4M3", {32}, filler(32, 5)},
      {"i64.idx", "I64", {6}, filler(48, 6)},
      {"bool.mask", "BOOL", {10}, Bytes{0, 1, 1, 0, 0, 1, 0, 1, 1, 0}},
      {"scalar.step", "F32", {}, Bytes{0x00, 0x00, 0x80, 0x3f}},  // 1.0f
      {"empty.t", "F16", {0, 4}, Bytes{}},
      {"f4.packed", "F4", {16}, filler(8, 7)},  // unknown dtype: opaque bytes
  };
  std::vector<TensorData> target = base;
  auto find = [&](std::vector<TensorData>& v, const std::string& n) -> Bytes& {
    for (auto& x : v)
      if (x.name == n) return x.bytes;
    throw std::runtime_error("no tensor " + n);
  };
  find(target, "bf16.w")[13] ^= 0x01;               // one byte only
  for (auto& c : find(target, "f32.w")) c ^= 0xff;  // every byte
  find(target, "f8.w")[3] ^= 0x40, find(target, "f8.w")[17] ^= 0x02;
  find(target, "i64.idx")[16] ^= 0x01, find(target, "i64.idx")[17] ^= 0x80;  // one element, two bytes
  find(target, "bool.mask")[9] = 1;
  find(target, "scalar.step") = Bytes{0x00, 0x00, 0x00, 0x40};  // 2.0f: two bytes differ
  find(target, "f4.packed")[0] ^= 0x0f, find(target, "f4.packed")[5] ^= 0xf0;
  const std::set<std::string> changed = {"bf16.w", "f32.w", "f8.w", "i64.idx", "bool.mask", "scalar.step", "f4.packed"};

  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  write_safetensors(t / "base" / "model.safetensors", base, &meta);
  write_safetensors(t / "new" / "model.safetensors", target, &meta);
  write_file(t / "base" / "config.json", "{\"model_type\": \"toy\"}\n");
  write_file(t / "new" / "config.json", "{\"model_type\": \"toy\"}\n");
  fs::create_directories(t / "root");
  const fs::path out = version_dir(t / "root", 1);

  const RunResult d =
      diff({"--json", "--encoding", encoding, (t / "base").string(), (t / "new").string(), out.string()});
  E2E_REQUIRE_CODE(d, 0);
  const json s = parse_json(d.out);
  CHECK(s["tensors"] == 10);
  CHECK(s["tensors_changed"] == 7);
  // Elements: one byte per element for the unknown dtype (8 bytes of F4).
  CHECK(s["elements"] == 32 + 8 + 16 + 15 + 32 + 6 + 10 + 1 + 0 + 8);
  CHECK(s["elements_changed"] == 1 + 15 + 2 + 1 + 1 + 1 + 2);
  CHECK(s["tensor_bytes"] == 64 + 16 + 32 + 60 + 32 + 48 + 10 + 4 + 0 + 8);
  CHECK(s["bytes_changed"] == 1 + 60 + 2 + 2 + 1 + 2 + 2);
  CHECK(s["files_changed"] == 0);
  CHECK(s["files_removed"] == 0);

  // The delta: one file, only the changed tensors, U8 [L], checksum per tensor;
  // its index; and its completion marker, listing both.
  CHECK(list_files(out) == std::vector<std::string>{"hfdelta_complete.json", "model-00000-of-00001.safetensors",
                                                    "model.safetensors.index.json"});
  const StFile df = read_st(out / "model-00000-of-00001.safetensors");
  const auto names = df.tensor_names();
  CHECK(std::set<std::string>(names.begin(), names.end()) == changed);
  const json md = df.metadata();
  REQUIRE(md.is_object());
  CHECK(keys_of(md) == changed);
  const json idx = delta_index(out);
  CHECK(keys_of(idx["weight_map"]) == changed);
  CHECK(keys_of(idx["metadata"]["hfdelta_base_checksums"]) == changed);
  std::uint64_t entry_bytes = 0;
  for (const auto& name : changed) {
    CAPTURE(name);
    const json& e = df.header[name];
    CHECK(e["dtype"] == "U8");
    REQUIRE(e["shape"].size() == 1);
    const auto [b, en] = df.file_range(name);
    CHECK(e["shape"][0].get<std::uint64_t>() == en - b);
    CHECK(en > b);
    entry_bytes += en - b;
    const Bytes oldb = find(base, name), newb = find(target, name);
    CHECK(md[name] == xxh3_hex(newb));
    CHECK(idx["metadata"]["hfdelta_base_checksums"][name] == xxh3_hex(oldb));
    CHECK(idx["weight_map"][name] == "model-00000-of-00001.safetensors");
    const Bytes dec = zstd_decompress(df.tensor(name));
    if (encoding == "xor") {
      Bytes x(oldb.size());
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = oldb[i] ^ newb[i];
      CHECK(dec == x);
    } else {
      std::vector<std::uint32_t> pos;
      Bytes val;
      for (std::size_t i = 0; i < oldb.size(); ++i)
        if (oldb[i] != newb[i]) pos.push_back(static_cast<std::uint32_t>(i)), val.push_back(newb[i]);
      Bytes want(4 + 5 * pos.size());
      auto le32 = [&](std::size_t at, std::uint32_t v) {
        for (int k = 0; k < 4; ++k) want[at + static_cast<std::size_t>(k)] = static_cast<std::uint8_t>(v >> (8 * k));
      };
      le32(0, static_cast<std::uint32_t>(pos.size()));
      for (std::size_t i = 0; i < pos.size(); ++i) le32(4 + 4 * i, pos[i]);
      std::copy(val.begin(), val.end(), want.begin() + static_cast<std::ptrdiff_t>(4 + 4 * pos.size()));
      CHECK(dec == want);
    }
  }
  CHECK(idx["metadata"]["total_size"] == entry_bytes);

  // Applied on top of a copy of BASE, it gives NEW.
  const fs::path local = t / "local";
  E2E_REQUIRE_CODE(apply({"-q", "--init", (t / "base").string(), local.string()}), 0);
  const RunResult a = apply({"--json", out.string(), local.string()});
  E2E_REQUIRE_CODE(a, 0);
  const json aj = parse_json(a.out);
  CHECK(aj["tensors_patched"] == 7);
  CHECK(aj["delta_bytes"] == entry_bytes);
  E2E_CHECK_TREE_EQUAL(local, t / "new");
  CHECK(state_version(local) == "000001");
}

TEST_CASE("no change at all: a delta with an empty weight_map that applies as a version bump") {
  TempDir t;
  const fs::path series = gen_series(t / "series", 1);
  copy_tree(save_dir(series, 0), t / "same");  // identical content, another directory
  fs::create_directories(t / "root");
  const fs::path out = version_dir(t / "root", 1);
  const RunResult d = diff({"--json", save_dir(series, 0).string(), (t / "same").string(), out.string()});
  E2E_REQUIRE_CODE(d, 0);
  const json s = parse_json(d.out);
  CHECK(s["tensors_changed"] == 0);
  CHECK(s["elements_changed"] == 0);
  CHECK(s["bytes_changed"] == 0);
  CHECK(s["density"] == 0.0);
  CHECK(s["files_changed"] == 0);
  CHECK(s["files_removed"] == 0);
  CHECK(s["tensors"].get<std::uint64_t>() > 0);

  CHECK(list_files(out) == std::vector<std::string>{"hfdelta_complete.json", "model.safetensors.index.json"});
  const json idx = delta_index(out);
  CHECK(idx["weight_map"].is_object());
  CHECK(idx["weight_map"].empty());
  CHECK(idx["metadata"]["version"] == "000001");
  CHECK(idx["metadata"]["base_version"] == "000000");
  CHECK(idx["metadata"].contains("delta_encoding"));
  CHECK(idx["metadata"]["total_size"] == 0);

  const fs::path local = t / "local";
  E2E_REQUIRE_CODE(apply({"-q", "--init", save_dir(series, 0).string(), local.string()}), 0);
  const RunResult a = apply({"--json", out.string(), local.string()});
  E2E_REQUIRE_CODE(a, 0);
  const json aj = parse_json(a.out);
  CHECK(aj["noop"] == false);
  CHECK(aj["from_version"] == "000000");
  CHECK(aj["to_version"] == "000001");
  CHECK(aj["applied"] == json::array({"000001"}));
  CHECK(aj["tensors_patched"] == 0);
  CHECK(state_json(local) == json{{"version", "000001"}});
  E2E_CHECK_TREE_EQUAL(local, save_dir(series, 0));
}

TEST_CASE("non-weight files: changed, new in a subdirectory, and removed travel under OUT/files and apply exactly") {
  TempDir t;
  const fs::path series = gen_series(t / "series", 1, {"--max-shard-size", "600KB"});
  const fs::path base = t / "base", target = t / "new";
  copy_tree(save_dir(series, 0), base);
  copy_tree(save_dir(series, 1), target);
  write_file(base / "old" / "notes.txt", "only in the base\n");
  std::string cfg = read_file(target / "config.json");
  cfg.insert(cfg.rfind('}'), ",\n  \"hfdelta_test\": 42\n");
  write_file(target / "config.json", cfg);
  const std::string chat = "{% for m in messages %}{{ m.content }}{% endfor %}\n";
  write_file(target / "templates" / "chat" / "template.jinja", chat);
  fs::remove(target / "tokenizer_config.json");
  REQUIRE(read_file(base / "config.json") != cfg);

  fs::create_directories(t / "root");
  const fs::path out = version_dir(t / "root", 1);
  const RunResult d = diff({"--json", base.string(), target.string(), out.string()});
  E2E_REQUIRE_CODE(d, 0);
  const json s = parse_json(d.out);
  CHECK(s["files_changed"] == 2);
  CHECK(s["files_removed"] == 2);
  CHECK(s["tensors_changed"].get<std::uint64_t>() > 0);

  CHECK(read_file(out / "files" / "config.json") == cfg);
  CHECK(read_file(out / "files" / "templates" / "chat" / "template.jinja") == chat);
  CHECK_FALSE(fs::exists(out / "files" / "tokenizer_config.json"));
  CHECK_FALSE(fs::exists(out / "files" / "old"));
  // Files that did not change do not travel.
  CHECK_FALSE(fs::exists(out / "files" / "generation_config.json"));
  CHECK_FALSE(fs::exists(out / "files" / "model.safetensors.index.json"));

  const json files = delta_index(out)["metadata"]["hfdelta_files"];
  REQUIRE(files.is_array());
  std::map<std::string, json> by_path;
  for (const auto& e : files) by_path[e["path"].get<std::string>()] = e;
  CHECK(files.size() == 4);
  REQUIRE(by_path.count("config.json"));
  CHECK(by_path["config.json"] ==
        json{{"path", "config.json"}, {"op", "put"}, {"size", cfg.size()}, {"xxh3-128", xxh3_hex(cfg)}});
  REQUIRE(by_path.count("templates/chat/template.jinja"));
  CHECK(by_path["templates/chat/template.jinja"] == json{{"path", "templates/chat/template.jinja"},
                                                         {"op", "put"},
                                                         {"size", chat.size()},
                                                         {"xxh3-128", xxh3_hex(chat)}});
  CHECK(by_path["tokenizer_config.json"] == json{{"path", "tokenizer_config.json"}, {"op", "remove"}});
  CHECK(by_path["old/notes.txt"] == json{{"path", "old/notes.txt"}, {"op", "remove"}});

  const fs::path local = t / "local";
  E2E_REQUIRE_CODE(apply({"-q", "--init", base.string(), local.string()}), 0);
  const RunResult a = apply({"--json", out.string(), local.string()});
  E2E_REQUIRE_CODE(a, 0);
  const json aj = parse_json(a.out);
  CHECK(aj["files_written"] == 2);
  CHECK(aj["files_removed"] == 2);
  E2E_CHECK_TREE_EQUAL(local, target);
}

TEST_CASE("--json output of delta-diff and delta-apply: documented keys with plausible values") {
  TempDir t;
  const fs::path series = gen_series(t / "series", 1, {"--max-shard-size", "600KB"});
  fs::create_directories(t / "root");
  const fs::path out = version_dir(t / "root", 1);
  const RunResult d = diff({"--json", save_dir(series, 0).string(), save_dir(series, 1).string(), out.string()});
  E2E_REQUIRE_CODE(d, 0);
  const json s = parse_json(d.out);  // stdout is exactly one JSON object
  REQUIRE(s.is_object());
  for (const char* k : {"out", "version", "base_version", "encoding", "tensors", "tensors_changed", "elements",
                        "elements_changed", "density", "tensor_bytes", "bytes_changed", "full_bytes", "delta_bytes",
                        "files_changed", "files_removed", "seconds"})
    CHECK_MESSAGE(s.contains(k), "delta-diff --json lacks \"" << k << "\": " << d.out);
  CHECK(s["out"] == out.string());
  CHECK(s["version"] == "000001");
  CHECK(s["base_version"] == "000000");
  CHECK(s["encoding"] == "context");  // the default
  const auto tensors = s["tensors"].get<std::uint64_t>();
  const auto changed = s["tensors_changed"].get<std::uint64_t>();
  CHECK(tensors == checkpoint_tensors(save_dir(series, 1)).size());
  CHECK(changed > 0);
  CHECK(changed <= tensors);
  CHECK(changed == changed_tensors(save_dir(series, 0), save_dir(series, 1)).size());
  const double density = s["density"].get<double>();
  CHECK(density > 0.0);
  CHECK(density <= 1.0);
  CHECK(s["elements_changed"].get<std::uint64_t>() <= s["elements"].get<std::uint64_t>());
  CHECK(density == doctest::Approx(double(s["elements_changed"].get<std::uint64_t>()) /
                                   double(s["elements"].get<std::uint64_t>())));
  CHECK(s["bytes_changed"].get<std::uint64_t>() <= s["tensor_bytes"].get<std::uint64_t>());
  CHECK(s["bytes_changed"].get<std::uint64_t>() >= s["elements_changed"].get<std::uint64_t>());
  CHECK(s["full_bytes"] == tree_size(save_dir(series, 1)));
  CHECK(s["delta_bytes"] == tree_size(out));
  CHECK(s["delta_bytes"].get<std::uint64_t>() < s["full_bytes"].get<std::uint64_t>());
  CHECK(s["files_changed"] == 0);
  CHECK(s["files_removed"] == 0);
  CHECK(s["seconds"].get<double>() >= 0.0);

  const fs::path local = t / "local";
  const RunResult i = apply({"--json", "--init", save_dir(series, 0).string(), local.string()});
  E2E_REQUIRE_CODE(i, 0);
  const json ij = parse_json(i.out);
  CHECK(ij["from_version"].is_null());
  CHECK(ij["to_version"] == "000000");
  CHECK(ij["noop"] == false);
  CHECK(ij["files_written"] == list_files(save_dir(series, 0)).size());

  const RunResult a = apply({"--json", out.string(), local.string()});
  E2E_REQUIRE_CODE(a, 0);
  const json aj = parse_json(a.out);
  REQUIRE(aj.is_object());
  for (const char* k : {"local", "from_version", "to_version", "applied", "noop", "tensors_patched", "delta_bytes",
                        "files_written", "files_removed", "seconds"})
    CHECK_MESSAGE(aj.contains(k), "delta-apply --json lacks \"" << k << "\": " << a.out);
  CHECK(aj["local"] == local.string());
  CHECK(aj["from_version"] == "000000");
  CHECK(aj["to_version"] == "000001");
  CHECK(aj["applied"] == json::array({"000001"}));
  CHECK(aj["noop"] == false);
  CHECK(aj["tensors_patched"] == changed);
  CHECK(aj["delta_bytes"] == delta_index(out)["metadata"]["total_size"]);
  CHECK(aj["delta_bytes"].get<std::uint64_t>() > 0);
  CHECK(aj["delta_bytes"].get<std::uint64_t>() < s["delta_bytes"].get<std::uint64_t>());
  CHECK(aj["files_written"] == 0);
  CHECK(aj["files_removed"] == 0);
  CHECK(aj["seconds"].get<double>() >= 0.0);
  E2E_CHECK_TREE_EQUAL(local, save_dir(series, 1));

  // -q prints nothing on success (in a directory of its own: ROOT's next version is 2).
  fs::create_directories(t / "aside");
  const RunResult q = diff({"-q", save_dir(series, 0).string(), save_dir(series, 1).string(),
                            version_dir(t / "aside", 9).string(), "--base-version", "8"});
  E2E_CHECK_CODE(q, 0);
  CHECK(q.out.empty());
}

namespace {

// "12.34 KiB", as the commands print sizes.
std::string kib(std::uint64_t n) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f KiB", double(n) / 1024);
  return buf;
}

}  // namespace

TEST_CASE(
    "human summaries: versions counted as versions, one of a thing in the singular, the versions read beside the "
    "entries; --json names LOCAL absolute whatever the command line gave") {
  TempDir t;
  const fs::path series = gen_series(t / "series", 2), root = t / "root", local = t / "local";
  fs::create_directories(root);
  std::uint64_t published = 0;  // delta-diff's "delta" figures, summed
  for (int v = 1; v <= 2; ++v) {
    const RunResult d = diff({"--json", save_dir(series, v - 1).string(), save_dir(series, v).string(), root.string()});
    E2E_REQUIRE_CODE(d, 0);
    published += parse_json(d.out)["delta_bytes"].get<std::uint64_t>();
  }
  REQUIRE(published < 1024 * 1024);  // printed in KiB
  require_init(save_dir(series, 0), local);
  const RunResult p = apply({"--root", root.string(), local.string()});
  E2E_REQUIRE_CODE(p, 0);
  CHECK_MESSAGE(contains(p.out, "version 000000 -> 000002 (2 versions), "), p.out);
  CHECK_MESSAGE(contains(p.out, " of tensor entries (" + kib(published) + " of versions read), "), p.out);
  const RunResult v = apply({"--verify", local.string()});
  E2E_REQUIRE_CODE(v, 0);
  REQUIRE(shard_files(local).size() == 1);
  CHECK_MESSAGE(contains(v.out, "(1 weight file, "), v.out);

  const fs::path other = t / "other";
  require_init(save_dir(series, 0), other);
  const RunResult one = apply({version_dir(root, 1).string(), other.string()});
  E2E_REQUIRE_CODE(one, 0);
  CHECK_MESSAGE(contains(one.out, "version 000000 -> 000001 (1 version), "), one.out);

  // Relative, with ./ and a trailing slash, from LOCAL's parent.
  for (const std::string form : {"--status", "--verify", "--recover"}) {
    const RunResult r = run(
        {"/bin/sh", "-c",
         "cd " + sh_quote(t.path().string()) + " && exec " + sh_quote(apply_bin()) + " --json " + form + " ./local/"});
    E2E_REQUIRE_CODE(r, 0);
    CHECK_MESSAGE(parse_json(r.out)["local"] == local.string(), form << ": " << r.out);
  }
}

namespace {

// Adler-32 as RFC 1950 defines it, computed here apart from zlib.
std::uint32_t adler32_of(const Bytes& b) {
  std::uint32_t a = 1, s = 0;
  for (const std::uint8_t c : b) a = (a + c) % 65521, s = (s + a) % 65521;
  return (s << 16) | a;
}

std::string hex8(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

// Rewrites delta DIR (xor or overwrite) as a publisher of the plain slime
// layout writes it with adler32 checksums (miles'
// --update-weight-delta-checksum adler32): no hfdelta_* keys, files/ or
// marker; checksum_format "adler32"; each entry's checksum in __metadata__
// the Adler-32 of the tensor's bytes in NEW, as 8 lowercase hex digits.
void as_slime_adler32(const fs::path& dir, const fs::path& new_ckpt) {
  json idx = delta_index(dir);
  json md = json::object();
  for (auto it = idx["metadata"].begin(); it != idx["metadata"].end(); ++it)
    if (it.key().rfind("hfdelta_", 0) != 0) md[it.key()] = *it;
  md["checksum_format"] = "adler32";
  idx["metadata"] = md;
  write_json(dir / "model.safetensors.index.json", idx);
  fs::remove_all(dir / "files");
  fs::remove(dir / "hfdelta_complete.json");
  std::set<std::string> delta_files;
  for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) delta_files.insert(*it);
  for (const std::string& f : delta_files) {
    const StFile st = read_st(dir / f);
    std::vector<TensorData> entries;
    std::map<std::string, std::string> checksums;
    for (const std::string& name : st.tensor_names()) {
      const Bytes e = st.tensor(name);
      entries.push_back({name, "U8", {e.size()}, e});
      checksums[name] = hex8(adler32_of(checkpoint_tensor(new_ckpt, name)));
    }
    fs::remove(dir / f);
    write_safetensors(dir / f, entries, &checksums);
  }
}

// Sets metadata.checksum_format of delta DIR's index.
void set_checksum_format(const fs::path& dir, const std::string& format) {
  json idx = delta_index(dir);
  idx["metadata"]["checksum_format"] = format;
  write_json(dir / "model.safetensors.index.json", idx);
}

}  // namespace

TEST_CASE(
    "adler32 checksums of a slime-layout publisher (miles' --update-weight-delta-checksum adler32): checked, applied "
    "byte for byte, a mismatch refused; blake3 refused naming the publisher's setting") {
  TempDir t;
  const fs::path series = gen_series(t / "series", 3), root = t / "root";
  fs::create_directories(root);
  for (int v = 1; v <= 3; ++v) {
    const fs::path out = version_dir(root, v);
    require_diff(save_dir(series, v - 1), save_dir(series, v), out, v % 2 ? "xor" : "overwrite");
    as_slime_adler32(out, save_dir(series, v));
  }

  SUBCASE("a pull applies them, records the version's checksums, and --verify passes") {
    const fs::path local = t / "local";
    require_init(save_dir(series, 0), local);
    const json j = pull(root, local);
    CHECK(j["applied"] == json::array({"000001", "000002", "000003"}));
    E2E_CHECK_TREE_EQUAL(local, save_dir(series, 3));
    E2E_CHECK_CODE(apply({"--verify", local.string()}), 0);
  }
  SUBCASE("--inspect shows them as written") {
    const RunResult r = diff({"--inspect", "--json", version_dir(root, 1).string()});
    E2E_REQUIRE_CODE(r, 0);
    const json j = parse_json(r.out);
    CHECK(j["checksum_format"] == "adler32");
    REQUIRE(!j["tensors"].empty());
    const json& e = j["tensors"][0];
    CHECK(e["checksum"] == hex8(adler32_of(checkpoint_tensor(save_dir(series, 1), e["name"]))));
  }
  SUBCASE("a LOCAL that is not the base: the Adler-32 differs, exit 5, LOCAL untouched") {
    const fs::path local = t / "local";  // claims version 2, holds save 1's bytes; version 3 is xor
    E2E_REQUIRE_CODE(apply({"-q", "--init", save_dir(series, 1).string(), local.string(), "--init-version", "2"}), 0);
    const LocalSnapshot before(local);
    const RunResult r = apply({version_dir(root, 3).string(), local.string()});
    E2E_CHECK_CODE(r, 5);
    CHECK_MESSAGE(contains(r.err, "would have adler32 "), r.err);
    E2E_CHECK_UNCHANGED(before);
  }
  SUBCASE("a damaged checksum: exit 5, LOCAL untouched") {
    const fs::path local = t / "local";
    require_init(save_dir(series, 0), local);
    const fs::path v1 = version_dir(root, 1), file = v1 / delta_index(v1)["weight_map"].begin()->get<std::string>();
    const StFile st = read_st(file);
    const std::string name = st.tensor_names().front(), was = st.metadata()[name].get<std::string>();
    edit_header_text(file, "\"" + was + "\"",
                     "\"" + hex8(~adler32_of(checkpoint_tensor(save_dir(series, 1), name))) + "\"");
    const LocalSnapshot before(local);
    E2E_CHECK_CODE(apply({v1.string(), local.string()}), 5);
    E2E_CHECK_UNCHANGED(before);
  }
  SUBCASE("blake3: exit 6, naming the setting that makes the versions pullable") {
    set_checksum_format(version_dir(root, 1), "blake3");
    const fs::path local = t / "local";
    require_init(save_dir(series, 0), local);
    const RunResult r = apply({"--root", root.string(), local.string()});
    E2E_CHECK_CODE(r, 6);
    CHECK_MESSAGE(contains(r.err, "--update-weight-delta-checksum xxh3-128"), r.err);
    CHECK(state_version(local) == "000000");
  }
  SUBCASE("--squash composes only xxh3-128 deltas: exit 6") {
    const RunResult r =
        diff({"--squash", version_dir(root, 1).string(), version_dir(root, 2).string(), (t / "squashed").string()});
    E2E_CHECK_CODE(r, 6);
    CHECK(!fs::exists(t / "squashed"));
  }
}

TEST_CASE("re-applying the same delta is a no-op that leaves LOCAL unchanged (both encodings)") {
  std::string encoding;
  SUBCASE("xor") { encoding = "xor"; }
  SUBCASE("overwrite") { encoding = "overwrite"; }
  CAPTURE(encoding);
  TempDir t;
  const fs::path series = gen_series(t / "series", 1, {"--max-shard-size", "600KB"});
  fs::create_directories(t / "root");
  const fs::path out = version_dir(t / "root", 1);
  E2E_REQUIRE_CODE(
      diff({"-q", "--encoding", encoding, save_dir(series, 0).string(), save_dir(series, 1).string(), out.string()}),
      0);
  const fs::path local = t / "local";
  E2E_REQUIRE_CODE(apply({"-q", "--init", save_dir(series, 0).string(), local.string()}), 0);
  E2E_REQUIRE_CODE(apply({"-q", out.string(), local.string()}), 0);
  E2E_CHECK_TREE_EQUAL(local, save_dir(series, 1));

  const LocalSnapshot snap(local);
  const RunResult again = apply({"--json", out.string(), local.string()});
  E2E_REQUIRE_CODE(again, 0);
  const json j = parse_json(again.out);
  CHECK(j["noop"] == true);
  CHECK(j["from_version"] == "000001");
  CHECK(j["to_version"] == "000001");
  CHECK(j["applied"] == json::array());
  CHECK(j["tensors_patched"] == 0);
  E2E_CHECK_UNCHANGED(snap);
  E2E_CHECK_TREE_EQUAL(local, save_dir(series, 1));
}

TEST_CASE("--init run twice: the second run is a no-op that rewrites nothing") {
  TempDir t;
  const fs::path series = gen_series(t / "series", 0, {"--max-shard-size", "600KB"});
  const fs::path local = t / "local";
  const RunResult first = apply({"--json", "--init", save_dir(series, 0).string(), local.string()});
  E2E_REQUIRE_CODE(first, 0);
  CHECK(parse_json(first.out)["noop"] == false);
  E2E_CHECK_TREE_EQUAL(local, save_dir(series, 0));

  std::map<std::string, ino_t> inodes;
  for (const auto& f : list_files(local)) {
    struct stat st {};
    REQUIRE(::stat((local / f).c_str(), &st) == 0);
    inodes[f] = st.st_ino;
  }
  const LocalSnapshot snap(local);
  const RunResult second = apply({"--json", "--init", save_dir(series, 0).string(), local.string()});
  E2E_REQUIRE_CODE(second, 0);
  const json j = parse_json(second.out);
  CHECK(j["noop"] == true);
  CHECK(j["from_version"] == "000000");
  CHECK(j["to_version"] == "000000");
  CHECK(j["files_written"] == 0);
  CHECK(j["files_removed"] == 0);
  E2E_CHECK_UNCHANGED(snap);
  for (const auto& f : list_files(local)) {
    struct stat st {};
    REQUIRE(::stat((local / f).c_str(), &st) == 0);
    CHECK_MESSAGE(inodes[f] == st.st_ino, f << " was rewritten by a no-op --init");
  }
}

TEST_CASE("--init removes the files LOCAL has and SRC lacks, and keeps .weight_sync") {
  TempDir t;
  // LOCAL starts as a sharded checkpoint with extras; SRC is a single-file one.
  const fs::path sharded = gen_series(t / "sharded", 0, {"--max-shard-size", "600KB", "--seed", "3"});
  const fs::path single = gen_series(t / "single", 0, {"--single-file"});
  const fs::path local = t / "local";
  copy_tree(save_dir(sharded, 0), local);
  write_file(local / "extra.bin", "stale");
  write_file(local / "sub" / "deep" / "x.txt", "stale too");
  write_file(local / ".weight_sync" / "keep.txt", "hfdelta's own directory");
  write_file(local / ".weight_sync" / "state.json", "{\"version\": \"000005\"}\n");
  REQUIRE(fs::exists(local / "model.safetensors.index.json"));

  const RunResult r = apply({"--json", "--init", save_dir(single, 0).string(), local.string()});
  E2E_REQUIRE_CODE(r, 0);
  const json j = parse_json(r.out);
  CHECK(j["from_version"] == "000005");
  CHECK(j["to_version"] == "000000");
  // 4 shards + index + 2 extras removed.
  CHECK(j["files_removed"] == shard_files(save_dir(sharded, 0)).size() + 3);
  E2E_CHECK_TREE_EQUAL(local, save_dir(single, 0));
  CHECK_FALSE(fs::exists(local / "extra.bin"));
  CHECK_FALSE(fs::exists(local / "sub" / "deep" / "x.txt"));
  CHECK_FALSE(fs::exists(local / "model.safetensors.index.json"));
  REQUIRE(fs::exists(local / ".weight_sync" / "keep.txt"));
  CHECK(read_file(local / ".weight_sync" / "keep.txt") == "hfdelta's own directory");
  CHECK(state_json(local) == json{{"version", "000000"}});

  // --init-version records another version.
  E2E_REQUIRE_CODE(apply({"-q", "--init", "--init-version", "7", save_dir(single, 0).string(), local.string()}), 0);
  CHECK(state_json(local) == json{{"version", "000007"}});
}

TEST_CASE("xor delta frames decode with plain ZSTD_decompress to old XOR new, checksums are XXH3-128 of the bytes") {
  TempDir t;
  const fs::path series = gen_series(t / "series", 1, {"--max-shard-size", "600KB"});
  const fs::path base = save_dir(series, 0), target = save_dir(series, 1);
  fs::create_directories(t / "root");
  const fs::path out = version_dir(t / "root", 1);
  E2E_REQUIRE_CODE(diff({"-q", "--encoding", "xor", base.string(), target.string(), out.string()}), 0);

  const json idx = delta_index(out);
  const std::set<std::string> changed = changed_tensors(base, target);
  REQUIRE(!changed.empty());
  CHECK(keys_of(idx["weight_map"]) == changed);

  // Delta files are numbered from 0, contiguously, and each holds only its entries.
  std::set<std::string> delta_files;
  for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it)
    delta_files.insert(it->get<std::string>());
  const auto on_disk = shard_files(out);
  CHECK(std::set<std::string>(on_disk.begin(), on_disk.end()) == delta_files);
  for (std::size_t i = 0; i < on_disk.size(); ++i) {
    char want[64];
    std::snprintf(want, sizeof want, "model-%05zu-of-%05zu.safetensors", i, on_disk.size());
    CHECK(on_disk[i] == want);
  }

  std::uint64_t entries = 0;
  std::size_t checked = 0;
  for (const auto& file : on_disk) {
    const StFile df = read_st(out / file);
    const json md = df.metadata();
    for (const auto& name : df.tensor_names()) {
      CAPTURE(name);
      CHECK(idx["weight_map"][name] == file);
      const Bytes oldb = checkpoint_tensor(base, name), newb = checkpoint_tensor(target, name);
      const Bytes frame = df.tensor(name);
      entries += frame.size();
      CHECK(df.header[name]["dtype"] == "U8");
      CHECK(df.header[name]["shape"] == json::array({frame.size()}));
      const Bytes dec = zstd_decompress(frame);
      REQUIRE(dec.size() == oldb.size());
      Bytes x(oldb.size());
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = oldb[i] ^ newb[i];
      CHECK(dec == x);
      CHECK(md[name] == xxh3_hex(newb));
      CHECK(idx["metadata"]["hfdelta_base_checksums"][name] == xxh3_hex(oldb));
      ++checked;
    }
  }
  CHECK(checked == changed.size());
  CHECK(idx["metadata"]["total_size"] == entries);
}

namespace {

// What a zstd frame's header says: whether it carries a content checksum, and
// the window its decoder needs (the content size, for a single-segment frame).
struct FrameHead {
  bool checksum = false;
  std::uint64_t window = 0;
};

FrameHead frame_head(const Bytes& f) {
  REQUIRE(f.size() >= 6);
  const std::uint8_t fhd = f[4];
  FrameHead h;
  h.checksum = (fhd & 0x04) != 0;
  if (fhd & 0x20) {
    h.window = ZSTD_getFrameContentSize(f.data(), f.size());
  } else {
    const unsigned exponent = f[5] >> 3, mantissa = f[5] & 7;
    const std::uint64_t base = std::uint64_t{1} << (10 + exponent);
    h.window = base + base / 8 * mantissa;
  }
  return h;
}

// The frame slime's and miles' publishers write for an entry's content:
// python-zstandard's ZstdCompressor(level=1).compress, one call.
std::size_t peer_frame_size(const Bytes& content) {
  Bytes out(ZSTD_compressBound(content.size()));
  const std::size_t n = ZSTD_compress(out.data(), out.size(), content.data(), content.size(), 1);
  REQUIRE_FALSE(ZSTD_isError(n));
  return n;
}

}  // namespace

TEST_CASE("xor and overwrite entries are written as the slime layout's publishers write them, and no larger") {
  std::string encoding;
  SUBCASE("xor") { encoding = "xor"; }
  SUBCASE("overwrite") { encoding = "overwrite"; }
  CAPTURE(encoding);
  TempDir t;
  // tiny: embed_tokens and lm_head of 512 KiB, frames over the 128 KiB window.
  const fs::path series = gen_series(t / "series", 1);
  const fs::path base = save_dir(series, 0), target = save_dir(series, 1);
  fs::create_directories(t / "root");
  fs::create_directories(t / "level1");
  const fs::path out = version_dir(t / "root", 1), at1 = version_dir(t / "level1", 1);
  E2E_REQUIRE_CODE(diff({"-q", "--encoding", encoding, base.string(), target.string(), out.string()}), 0);
  E2E_REQUIRE_CODE(diff({"-q", "--encoding", encoding, "--level", "1", base.string(), target.string(), at1.string()}),
                   0);

  std::uint64_t ours = 0, peers = 0;
  std::size_t over_window = 0;
  for (const auto& file : shard_files(out)) {
    CAPTURE(file);
    // The default level is theirs, 1.
    CHECK(read_bytes(out / file) == read_bytes(at1 / file));
    const StFile df = read_st(out / file);
    for (const auto& name : df.tensor_names()) {
      CAPTURE(name);
      const Bytes frame = df.tensor(name);
      const Bytes content = zstd_decompress(frame);
      const FrameHead h = frame_head(frame);
      CHECK_FALSE(h.checksum);  // as theirs: the entry's checksum covers the tensor
      CHECK(h.window <= 128 * 1024);
      over_window += content.size() > 128 * 1024;
      ours += frame.size();
      peers += peer_frame_size(content);
    }
  }
  CHECK(over_window >= (encoding == "xor" ? 2 : 0));
  // Never larger than what those publishers write for the same changes.
  CHECK(ours <= peers);
}

TEST_CASE("delta index metadata: version, base_version, delta_encoding, compression and checksum formats") {
  std::string encoding;
  SUBCASE("xor") { encoding = "xor"; }
  SUBCASE("overwrite") { encoding = "overwrite"; }
  CAPTURE(encoding);
  TempDir t;
  const fs::path series = gen_series(t / "series", 2);
  fs::create_directories(t / "root");
  E2E_REQUIRE_CODE(diff({"-q", "--encoding", encoding, save_dir(series, 1).string(), save_dir(series, 2).string(),
                         version_dir(t / "root", 2).string()}),
                   0);
  const json m = delta_index(version_dir(t / "root", 2))["metadata"];
  CHECK(m["version"] == "000002");
  CHECK(m["base_version"] == "000001");
  CHECK(m["delta_encoding"] == encoding);
  CHECK(m["compression_format"] == "zstd");
  CHECK(m["checksum_format"] == "xxh3-128");
  CHECK(m["hfdelta_format"] == 1);
  CHECK(m["hfdelta_base_checksums"].is_object());
  CHECK(m["hfdelta_files"] == json::array());

  // --delta-version / --base-version for an OUT not named weight_vNNNNNN.
  const fs::path custom = t / "root" / "custom-name";
  E2E_REQUIRE_CODE(diff({"-q", "--encoding", encoding, "--delta-version", "7", "--base-version", "5",
                         save_dir(series, 0).string(), save_dir(series, 1).string(), custom.string()}),
                   0);
  const json c = delta_index(custom)["metadata"];
  CHECK(c["version"] == "000007");
  CHECK(c["base_version"] == "000005");
}

TEST_CASE("a non-weight file replaced by a directory of the same name (and the reverse) applies exactly") {
  // delta-diff publishes such a change (a put under the new directory and a
  // remove of the old file, or the reverse); applied on top of BASE it must give NEW.
  TempDir t;
  const fs::path series = gen_series(t / "series", 1);
  const fs::path base = t / "base", target = t / "new";
  copy_tree(save_dir(series, 0), base);
  copy_tree(save_dir(series, 1), target);
  SUBCASE("file -> directory") {
    write_file(base / "extra", "a file\n");
    write_file(target / "extra" / "inner.txt", "now a directory\n");
  }
  SUBCASE("directory -> file") {
    write_file(base / "extra" / "inner.txt", "a directory\n");
    write_file(target / "extra", "now a file\n");
  }
  fs::create_directories(t / "root");
  const fs::path out = version_dir(t / "root", 1);
  E2E_REQUIRE_CODE(diff({"-q", base.string(), target.string(), out.string()}), 0);
  const fs::path local = t / "local";
  E2E_REQUIRE_CODE(apply({"-q", "--init", base.string(), local.string()}), 0);
  const RunResult r = apply({out.string(), local.string()});
  E2E_CHECK_CODE(r, 0);
  E2E_CHECK_TREE_EQUAL(local, target);
  CHECK(state_json(local) == json{{"version", "000001"}});
}

TEST_CASE("delta-diff cuts large tensors into ranges and their checksums into units: the same delta at 1-3 threads") {
  // embed_tokens and lm_head, 5 chunks each, each 48% of the work: at 3
  // threads both are scanned as ranges, their new and base bytes hashed by
  // units of their own (auto: by one, beside its XOR stream); at 2, whole.
  TempDir t;
  const fs::path series = gen_series(t / "series", 1, {"--vocab", "40000"});
  for (const char* enc : {"sparse", "context", "auto"}) {
    CAPTURE(enc);
    for (const char* th : {"1", "2", "3"}) {
      const fs::path root = t / (std::string(enc) + "-" + th);
      fs::create_directories(root);
      E2E_REQUIRE_CODE(diff({"-q", "--no-sync", "--threads", th, "--encoding", enc, save_dir(series, 0).string(),
                             save_dir(series, 1).string(), version_dir(root, 1).string()}),
                       0);
      if (std::string(th) != "1")
        E2E_CHECK_TREE_EQUAL(version_dir(t / (std::string(enc) + "-1"), 1), version_dir(root, 1));
    }
    const fs::path local = t / (std::string("local-") + enc);
    E2E_REQUIRE_CODE(apply({"-q", "--init", "--no-sync", save_dir(series, 0).string(), local.string()}), 0);
    E2E_REQUIRE_CODE(apply({"-q", "--no-sync", "--threads", "3", version_dir(t / (std::string(enc) + "-3"), 1).string(),
                            local.string()}),
                     0);
    E2E_CHECK_TREE_EQUAL(local, save_dir(series, 1));
  }
}

TEST_CASE("delta-diff output does not depend on --threads, --no-sync or the run") {
  TempDir t;
  const fs::path series = gen_series(t / "series", 1, {"--max-shard-size", "600KB"});
  for (const char* r : {"r1", "r2", "r3"}) fs::create_directories(t / r);
  E2E_REQUIRE_CODE(diff({"-q", "--threads", "1", save_dir(series, 0).string(), save_dir(series, 1).string(),
                         version_dir(t / "r1", 1).string()}),
                   0);
  E2E_REQUIRE_CODE(diff({"-q", "--threads", "3", "--no-sync", save_dir(series, 0).string(),
                         save_dir(series, 1).string(), version_dir(t / "r2", 1).string()}),
                   0);
  E2E_REQUIRE_CODE(
      diff({"-q", save_dir(series, 0).string(), save_dir(series, 1).string(), version_dir(t / "r3", 1).string()}), 0);
  E2E_CHECK_TREE_EQUAL(version_dir(t / "r1", 1), version_dir(t / "r2", 1));
  E2E_CHECK_TREE_EQUAL(version_dir(t / "r1", 1), version_dir(t / "r3", 1));
  // A higher level gives other frames that apply to the same result.
  fs::create_directories(t / "r4");
  E2E_REQUIRE_CODE(diff({"-q", "--level", "19", save_dir(series, 0).string(), save_dir(series, 1).string(),
                         version_dir(t / "r4", 1).string()}),
                   0);
  const fs::path local = t / "local";
  E2E_REQUIRE_CODE(apply({"-q", "--init", save_dir(series, 0).string(), local.string()}), 0);
  E2E_REQUIRE_CODE(apply({"-q", "--no-sync", "--threads", "1", version_dir(t / "r4", 1).string(), local.string()}), 0);
  E2E_CHECK_TREE_EQUAL(local, save_dir(series, 1));
}

// A sharded publisher's version (docs/sharded.md): every entry a "parts"
// entry, whose parts are xor, sparse and context. --inspect and its --json
// count those entries as parts entries, not as xor entries.
TEST_CASE("--inspect of a sharded version counts its parts entries as parts") {
  TempDir t;
  const fs::path series = gen_series(t / "series", 1);
  const fs::path root = t / "root", mirror = t / "mirror";
  fs::create_directories(root);
  require_init(save_dir(series, 0), mirror);
  const hfdelta::Checkpoint next = hfdelta::open_checkpoint(save_dir(series, 1));
  const fs::path stage = hfdelta::make_shard_stage(root, 1);
  const hfdelta::Encoding encs[] = {hfdelta::Encoding::xor_bytes, hfdelta::Encoding::sparse,
                                    hfdelta::Encoding::context};
  std::vector<hfdelta::ShardPart> parts;
  for (std::uint32_t r = 0; r < 3; ++r) {  // rank r holds every third tensor, whole
    hfdelta::ShardWriter w(mirror, stage, r, encs[r], 3);
    std::size_t i = 0;
    for (const auto& sh : next.shards) {
      const hfdelta::MappedFile m(save_dir(series, 1) / sh.file);
      for (const auto& ti : sh.header.tensors) {
        if (i++ % 3 != r) continue;
        const hfdelta::MatrixShape ms = hfdelta::matrix_shape(ti.shape, hfdelta::dtype_size(ti.dtype));
        w.put(ti.name, ti.dtype, ti.shape, hfdelta::Region{0, ms.rows, 0, ms.cols},
              m.bytes(sh.header.file_offset(ti), ti.nbytes()));
      }
    }
    const auto p = w.finish(false);
    parts.insert(parts.end(), p.begin(), p.end());
  }
  REQUIRE(!parts.empty());
  hfdelta::commit_sharded(root, mirror, stage, 1, 0, parts, false);

  const RunResult r = diff({"--inspect", "--json", version_dir(root, 1).string()});
  E2E_REQUIRE_CODE(r, 0);
  const json j = parse_json(r.out);
  const std::size_t n = j["tensors"].size();
  REQUIRE(n > 0);
  for (const json& e : j["tensors"]) CHECK(e["encoding"] == "parts");
  const json& entries = j["totals"]["entries"];
  CHECK(entries["parts"] == n);
  for (const char* other : {"xor", "overwrite", "sparse", "stack", "context"}) {
    CAPTURE(other);
    CHECK(entries[other] == 0);
  }

  const RunResult text = diff({"--inspect", version_dir(root, 1).string()});
  E2E_REQUIRE_CODE(text, 0);
  CHECK_MESSAGE(contains(text.out, "0 xor,"), text.out);
  CHECK_MESSAGE(contains(text.out, ", " + std::to_string(n) + " parts)"), text.out);
}
