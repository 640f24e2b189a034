// Unit tests of the delta directory format, versions, checksums, the
// host-local bookkeeping, checkpoint directories and the I/O helpers.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <xxhash.h>
#include <boost/filesystem/operations.hpp>
#include <nlohmann/json.hpp>

#include "delta/delta_format_internal.hpp"
#include "delta/delta_writer.hpp"
#include "hfdelta/checkpoint.hpp"
#include "hfdelta/delta_format.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/hash.hpp"
#include "hfdelta/safetensors.hpp"
#include "hfdelta/version.hpp"
#include "store/local_store.hpp"
#include "unit_util.hpp"
#include "util/io.hpp"

using namespace hfdelta;
using nlohmann::json;
using unit::contains;
using unit::error_of;
using unit::TempDir;

namespace {

namespace bfs = boost::filesystem;

void write_text(const bfs::path& p, const std::string& text) {
  bfs::create_directories(p.parent_path());
  std::ofstream f(p.string(), std::ios::binary | std::ios::trunc);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  f.close();
  REQUIRE(f.good());
}

std::string read_text(const bfs::path& p) {
  std::ifstream f(p.string(), std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> list_dir(const bfs::path& d) {
  std::vector<std::string> out;
  for (bfs::directory_iterator it(d), end; it != end; ++it) out.push_back(it->path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

void expect_error(const std::optional<Error>& e, Exit code, std::initializer_list<std::string> needles) {
  REQUIRE_MESSAGE(e.has_value(), "no Error thrown");
  const std::string msg = e->what();
  INFO("message: " << msg);
  CHECK(static_cast<int>(e->code()) == static_cast<int>(code));
  for (const auto& n : needles) CHECK_MESSAGE(contains(msg, n), "missing \"" << n << "\"");
}

std::string hex128(std::uint64_t high, std::uint64_t low) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(high),
                static_cast<unsigned long long>(low));
  return buf;
}

// Writes a valid safetensors file holding `specs`, data filled with `fill`.
void write_st(const bfs::path& p, const std::vector<TensorSpec>& specs, char fill = '\x01') {
  const auto L = layout_safetensors(specs, nullptr);
  write_text(p, L.prefix + std::string(L.file_size - L.prefix.size(), fill));
}

TensorSpec f32(const std::string& name, std::uint64_t n) { return {name, "F32", {n}, 4 * n}; }

// A valid hfdelta delta index, as JSON, to mutate in refusal tests.
json valid_delta_index() {
  DeltaIndex d;
  d.version = 7;
  d.base_version = 6;
  d.encoding = Encoding::xor_bytes;
  d.weight_map = {{"w", "model-00000-of-00001.safetensors"}};
  return json::parse(write_delta_index_json(d, 100));
}

}  // namespace

// ---- versions ------------------------------------------------------------------

TEST_CASE("format: version strings and directory names") {
  CHECK(format_version(0) == "000000");
  CHECK(format_version(7) == "000007");
  CHECK(format_version(123456) == "123456");
  CHECK(format_version(1234567) == "1234567");
  CHECK(format_version(18446744073709551615ull) == "18446744073709551615");

  CHECK(parse_version("000007", "v") == 7);
  CHECK(parse_version("7", "v") == 7);
  CHECK(parse_version("0", "v") == 0);
  CHECK(parse_version("1234567", "v") == 1234567);
  CHECK(parse_version("999999999999999999", "v") == 999999999999999999ull);
  for (const char* bad : {"", "-1", "+1", "abc", "12a", " 1", "1 ", "0x10", "1.0", "1e3", "\xd9\xa1"}) {
    CAPTURE(bad);
    expect_error(error_of([&] { parse_version(bad, "the-field"); }), Exit::bad_input, {"the-field", bad});
  }

  CHECK(version_dirname(7) == "weight_v000007");
  CHECK(version_dirname(1234567) == "weight_v1234567");
  CHECK(version_from_dirname("weight_v000001") == std::optional<std::uint64_t>(1));
  CHECK(version_from_dirname("weight_v000000") == std::optional<std::uint64_t>(0));
  CHECK(version_from_dirname("weight_v123456") == std::optional<std::uint64_t>(123456));
  CHECK(version_from_dirname("weight_v1234567") == std::optional<std::uint64_t>(1234567));
  for (std::uint64_t v : {0ull, 1ull, 42ull, 999999ull, 1000000ull, 987654321ull})
    CHECK(version_from_dirname(version_dirname(v)) == std::optional<std::uint64_t>(v));
  for (const char* bad :
       {"weight_v12", "weight_vabc123", "weight_v00000a", ".weight_v000001.tmp-x", "weight_v000001.tmp-x",
        "weight_v000001.tmp", "Weight_v000001", "weight_v-00001", "weight_v-000001", "", "weight_v", "xweight_v000001",
        "weight_v 000001", "weight_v000001 ", "weight_v+00001", "weight-v000001", "weight_v000001/"}) {
    CAPTURE(bad);
    CHECK_FALSE(version_from_dirname(bad).has_value());
  }
}

// ---- checksums -----------------------------------------------------------------

TEST_CASE("format: XXH3-128 checksums in canonical hex") {
  // Values confirmed with `xxhsum -H2` (xxhash 0.8.1), the canonical form.
  const std::string abc = "abc";
  CHECK(xxh3_128({}).hex() == "99aa06d3014798d86001c324468d497f");
  CHECK(xxh3_128({reinterpret_cast<const std::uint8_t*>(abc.data()), abc.size()}).hex() ==
        "06b05ab6733a618578af5f94892f3950");

  // hex() is high 64 bits first, lowercase, zero-padded.
  CHECK(Hash128{0x0123456789abcdefull, 0xfedcba9876543210ull}.hex() == "0123456789abcdeffedcba9876543210");
  CHECK(Hash128{0, 1}.hex() == "00000000000000000000000000000001");
  CHECK(Hash128{1, 0}.hex() == "00000000000000010000000000000000");
  CHECK(Hash128{}.hex() == std::string(32, '0'));

  // Same as the library function called directly, for several lengths
  // (XXH3 switches algorithms at 16, 128 and 240 bytes).
  std::mt19937_64 rng(1);
  std::vector<std::uint8_t> data(5000);
  for (auto& b : data) b = static_cast<std::uint8_t>(rng());
  for (std::size_t n : {0, 1, 3, 16, 17, 128, 129, 240, 241, 1024, 5000}) {
    CAPTURE(n);
    const XXH128_hash_t ref = XXH3_128bits(data.data(), n);
    const Hash128 h = xxh3_128({data.data(), n});
    CHECK(h.high == ref.high64);
    CHECK(h.low == ref.low64);
    const std::string hex = h.hex();
    CHECK(hex == hex128(ref.high64, ref.low64));
    CHECK(hex.size() == 32);
    CHECK(hex.find_first_not_of("0123456789abcdef") == std::string::npos);
    // The streaming form gives the same, whatever the chunking.
    Hasher s;
    for (std::size_t off = 0; off < n; off += 7) s.update({data.data() + off, std::min<std::size_t>(7, n - off)});
    CHECK(s.digest() == h);
    s.reset();
    s.update({data.data(), n});
    CHECK(s.digest() == h);
    // And it parses back.
    CHECK(parse_hash_hex(hex, "x") == h);
  }
}

TEST_CASE("format: parse_hash_hex refuses wrong lengths and non-hex digits") {
  const std::string good = "0123456789abcdeffedcba9876543210";
  const Hash128 h = parse_hash_hex(good, "x");
  CHECK(h.high == 0x0123456789abcdefull);
  CHECK(h.low == 0xfedcba9876543210ull);
  for (const std::string& bad :
       {std::string(""), good.substr(1), good + "0", std::string(31, 'a'), std::string(33, 'a'),
        std::string("g") + good.substr(1), good.substr(0, 31) + "-", std::string("0x") + good.substr(2),
        good.substr(0, 16) + " " + good.substr(17), std::string(32, ' ')}) {
    CAPTURE(bad);
    expect_error(error_of([&] { parse_hash_hex(bad, "the-checksum"); }), Exit::bad_input, {"the-checksum"});
  }
}

// ---- delta index ---------------------------------------------------------------

TEST_CASE("format: delta index round trip") {
  TempDir tmp;
  DeltaIndex d;
  d.version = 7;
  d.base_version = 6;
  d.encoding = Encoding::overwrite;
  d.weight_map = {{"model.layers.0.mlp.weight", "model-00000-of-00002.safetensors"},
                  {"lm_head.weight", "model-00001-of-00002.safetensors"}};
  d.base_checksums = {{"model.layers.0.mlp.weight", Hash128{0x0123456789abcdefull, 0x1ull}},
                      {"lm_head.weight", Hash128{0xffffffffffffffffull, 0xaabbccddeeff0011ull}}};
  FileChange put;
  put.path = "config.json";
  put.op = FileChange::Op::put;
  put.size = 1234;
  put.hash = Hash128{5, 6};
  FileChange put2;
  put2.path = "sub/dir/tokenizer.json";
  put2.size = 0;
  put2.hash = xxh3_128({});
  FileChange rm;
  rm.path = "old.txt";
  rm.op = FileChange::Op::remove;
  d.files = {put, put2, rm};

  d.elements = DeltaIndex::Elements{5'000'000'000ull, 12345};

  const std::string text = write_delta_index_json(d, 4242);
  write_text(tmp.path() / kIndexFile, text);
  CHECK(is_delta_dir(tmp.path()));
  const DeltaIndex r = read_delta_index(tmp.path());
  REQUIRE(r.elements);
  CHECK(r.elements->total == 5'000'000'000ull);
  CHECK(r.elements->changed == 12345);
  CHECK(r.version == 7);
  CHECK(r.base_version == 6);
  CHECK(r.encoding == Encoding::overwrite);
  CHECK(r.weight_map == d.weight_map);
  CHECK(r.base_checksums == d.base_checksums);
  REQUIRE(r.files.size() == 3);
  CHECK(r.files[0].path == "config.json");
  CHECK(r.files[0].op == FileChange::Op::put);
  CHECK(r.files[0].size == 1234);
  CHECK(r.files[0].hash == Hash128{5, 6});
  CHECK(r.files[1].path == "sub/dir/tokenizer.json");
  CHECK(r.files[1].size == 0);
  CHECK(r.files[1].hash == xxh3_128({}));
  CHECK(r.files[2].path == "old.txt");
  CHECK(r.files[2].op == FileChange::Op::remove);

  // The JSON itself is what readers of the plain format expect.
  const json j = json::parse(text);
  const json& m = j.at("metadata");
  CHECK(m.at("version") == "000007");
  CHECK(m.at("base_version") == "000006");
  CHECK(m.at("delta_encoding") == "overwrite");
  CHECK(m.at("compression_format") == "zstd");
  CHECK(m.at("checksum_format") == "xxh3-128");
  CHECK(m.at("total_size") == 4242);
  CHECK(m.at("hfdelta_format") == 1);
  CHECK(m.at("hfdelta_base_checksums").at("lm_head.weight") == "ffffffffffffffffaabbccddeeff0011");
  CHECK(m.at("hfdelta_elements") == json({{"changed", 12345}, {"total", 5'000'000'000ull}}));
  CHECK(j.at("weight_map").at("lm_head.weight") == "model-00001-of-00002.safetensors");
  CHECK(j.at("weight_map").size() == 2);

  SUBCASE("xor, no extensions") {
    DeltaIndex x;
    x.version = 1;
    x.base_version = 0;
    x.encoding = Encoding::xor_bytes;
    write_text(tmp.path() / kIndexFile, write_delta_index_json(x, 0));
    const DeltaIndex rx = read_delta_index(tmp.path());
    CHECK(rx.version == 1);
    CHECK(rx.base_version == 0);
    CHECK(rx.encoding == Encoding::xor_bytes);
    CHECK(rx.weight_map.empty());
    CHECK(rx.base_checksums.empty());
    CHECK(rx.files.empty());
    CHECK_FALSE(rx.elements);  // none written, none read
  }
  SUBCASE("an index as the reference publisher writes it") {
    write_text(tmp.path() / kIndexFile,
               R"({"metadata": {"version": "000007", "base_version": "000006", "delta_encoding": "xor",
                   "compression_format": "zstd", "checksum_format": "xxh3-128"},
                   "weight_map": {"a.weight": "model-00000-of-00001.safetensors"}})");
    const DeltaIndex s = read_delta_index(tmp.path());
    CHECK(s.version == 7);
    CHECK(s.base_version == 6);
    CHECK(s.encoding == Encoding::xor_bytes);
    CHECK(s.weight_map.at("a.weight") == "model-00000-of-00001.safetensors");
  }
  SUBCASE("versions as numbers, optional format names absent") {
    write_text(tmp.path() / kIndexFile,
               R"({"metadata": {"version": 12, "base_version": 11, "delta_encoding": "overwrite"}, "weight_map": {}})");
    const DeltaIndex s = read_delta_index(tmp.path());
    CHECK(s.version == 12);
    CHECK(s.base_version == 11);
    CHECK(s.encoding == Encoding::overwrite);
  }
}

TEST_CASE("format: read_delta_index refusals") {
  TempDir tmp;
  const bfs::path idx = tmp.path() / kIndexFile;
  const std::string w = idx.string();
  // The index is edited on purpose here: reseal its checksum so that each
  // case reaches the rule it is about.
  auto refused = [&](const json& j) {
    write_text(idx,
               j.contains("metadata") && j["metadata"].is_object() && j["metadata"].contains("hfdelta_index_checksum")
                   ? seal_delta_index(j.dump())
                   : j.dump());
    return error_of([&] { read_delta_index(tmp.path()); });
  };
  {
    write_text(idx, valid_delta_index().dump());
    CHECK_NOTHROW(read_delta_index(tmp.path()));
  }

  SUBCASE("no metadata") {
    json j = valid_delta_index();
    j.erase("metadata");
    expect_error(refused(j), Exit::bad_input, {w, "metadata"});
    j["metadata"] = "x";
    expect_error(refused(j), Exit::bad_input, {w, "metadata"});
  }
  SUBCASE("a damaged index is refused by its checksum") {
    std::string text = valid_delta_index().dump();
    const auto at = text.find("weight_map");
    text[at] = 'W';
    write_text(idx, text);
    expect_error(error_of([&] { read_delta_index(tmp.path()); }), Exit::bad_input, {w, "hfdelta_index_checksum"});
  }
  SUBCASE("not a delta") {
    json j = valid_delta_index();
    j["metadata"].erase("delta_encoding");
    expect_error(refused(j), Exit::bad_input, {w, "delta_encoding"});
    // Still a delta (base_version and hfdelta keys say so): a damaged key
    // must not turn a delta into something copied as a full version.
    CHECK(is_delta_dir(tmp.path()));
    j["metadata"] = {{"total_size", 1}};
    write_text(idx, j.dump());
    CHECK_FALSE(is_delta_dir(tmp.path()));
  }
  SUBCASE("hfdelta_elements that are not two counts, or more changed than there are") {
    for (const json& bad : {json("1/2"), json({{"changed", 1}}), json({{"changed", -1}, {"total", 2}}),
                            json({{"changed", 1.5}, {"total", 2}}), json({{"changed", 3}, {"total", 2}})}) {
      CAPTURE(bad.dump());
      json j = valid_delta_index();
      j["metadata"]["hfdelta_elements"] = bad;
      expect_error(refused(j), Exit::bad_input, {w, "hfdelta_elements"});
    }
  }
  SUBCASE("encoding this build does not know") {
    json j = valid_delta_index();
    j["metadata"]["delta_encoding"] = "sparse_bitmask";
    expect_error(refused(j), Exit::unsupported, {w, "sparse_bitmask"});
    j["metadata"]["delta_encoding"] = 5;
    expect_error(refused(j), Exit::bad_input, {w, "delta_encoding"});
  }
  SUBCASE("compression other than zstd") {
    json j = valid_delta_index();
    j["metadata"]["compression_format"] = "lz4";
    expect_error(refused(j), Exit::unsupported, {w, "lz4"});
    j["metadata"]["compression_format"] = 1;
    expect_error(refused(j), Exit::unsupported, {w, "compression_format"});
  }
  SUBCASE("checksum other than xxh3-128") {
    json j = valid_delta_index();
    j["metadata"]["checksum_format"] = "sha256";
    expect_error(refused(j), Exit::unsupported, {w, "sha256"});
    j["metadata"]["checksum_format"] = "XXH3-128";
    expect_error(refused(j), Exit::unsupported, {w, "checksum_format"});
  }
  SUBCASE("newer hfdelta format revision") {
    json j = valid_delta_index();
    j["metadata"]["hfdelta_format"] = 7;
    expect_error(refused(j), Exit::unsupported, {w, "revision 7"});
    j["metadata"]["hfdelta_format"] = "1";
    expect_error(refused(j), Exit::bad_input, {w, "hfdelta_format"});
    j["metadata"]["hfdelta_format"] = -1;
    expect_error(refused(j), Exit::bad_input, {w, "hfdelta_format"});
    j["metadata"]["hfdelta_format"] = 1;
    write_text(idx, j.dump());
    CHECK_NOTHROW(read_delta_index(tmp.path()));
  }
  SUBCASE("stacked entries: per tensor only, and only with revision 4") {
    json j = valid_delta_index();
    j["metadata"]["delta_encoding"] = "stack";
    expect_error(refused(j), Exit::bad_input, {w, "stack"});
    j["metadata"]["delta_encoding"] = "auto";
    j["metadata"]["hfdelta_encodings"] = json::object();
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it)
      j["metadata"]["hfdelta_encodings"][it.key()] = "stack";
    for (const int rev : {1, 2, 3}) {
      CAPTURE(rev);
      j["metadata"]["hfdelta_format"] = rev;
      expect_error(refused(j), Exit::bad_input, {w, "hfdelta_format 4"});
    }
    j["metadata"]["hfdelta_format"] = 4;
    write_text(idx, seal_delta_index(j.dump()));
    const DeltaIndex d = read_delta_index(tmp.path());
    for (const auto& [tensor, file] : d.weight_map) CHECK(encoding_of(d, tensor) == Encoding::stack);
    // The writer records the lowest revision that reads it: 4 with a stacked entry.
    CHECK(json::parse(write_delta_index_json(d, 100))["metadata"]["hfdelta_format"] == 4);
    DeltaIndex plain = d;
    for (auto& [tensor, enc] : plain.encodings) enc = Encoding::sparse;
    CHECK(json::parse(write_delta_index_json(plain, 100))["metadata"]["hfdelta_format"] == 2);
  }
  SUBCASE("bad versions") {
    for (const json& v : {json("abc"), json(-1), json(1.5), json(""), json(nullptr), json("-000001")}) {
      CAPTURE(v.dump());
      json j = valid_delta_index();
      j["metadata"]["version"] = v;
      expect_error(refused(j), Exit::bad_input, {w, "version"});
      json k = valid_delta_index();
      k["metadata"]["base_version"] = v;
      expect_error(refused(k), Exit::bad_input, {w, "base_version"});
    }
    json j = valid_delta_index();
    j["metadata"].erase("base_version");
    expect_error(refused(j), Exit::bad_input, {w, "base_version"});
  }
  SUBCASE("weight_map") {
    json j = valid_delta_index();
    j.erase("weight_map");
    expect_error(refused(j), Exit::bad_input, {w, "weight_map"});
    for (const char* bad : {"../model.safetensors", "/abs/model.safetensors", "sub/model.safetensors", "", "..",
                            "./model.safetensors", "a\\b.safetensors"}) {
      CAPTURE(bad);
      json k = valid_delta_index();
      k["weight_map"]["w"] = bad;
      expect_error(refused(k), Exit::bad_input, {w, "weight_map[\"w\"]"});
    }
    json k = valid_delta_index();
    k["weight_map"]["w"] = 3;
    expect_error(refused(k), Exit::bad_input, {w, "weight_map[\"w\"]"});
  }
  SUBCASE("files entries") {
    for (const char* bad : {"../x", "/etc/passwd", "a//b", "./a", "a/./b", "a/..", "a/", "", "..", "a\\b"}) {
      CAPTURE(bad);
      json j = valid_delta_index();
      j["metadata"]["hfdelta_files"] = json::array({{{"path", bad}, {"op", "remove"}}});
      expect_error(refused(j), Exit::bad_input, {w, "hfdelta_files"});
    }
    const std::string h = std::string(32, 'a');
    json j = valid_delta_index();
    j["metadata"]["hfdelta_files"] =
        json::array({{{"path", "x"}, {"op", "remove"}}, {{"path", "x"}, {"op", "put"}, {"size", 1}, {"xxh3-128", h}}});
    expect_error(refused(j), Exit::bad_input, {w, "\"x\"", "twice"});
    j["metadata"]["hfdelta_files"] = json::array({{{"path", "x"}, {"op", "chmod"}}});
    expect_error(refused(j), Exit::unsupported, {w, "chmod"});
    j["metadata"]["hfdelta_files"] = json::array({{{"path", "x"}, {"op", "put"}, {"size", 1}}});
    expect_error(refused(j), Exit::bad_input, {w, "xxh3-128"});
    j["metadata"]["hfdelta_files"] = json::array({{{"path", "x"}, {"op", "put"}, {"size", -1}, {"xxh3-128", h}}});
    expect_error(refused(j), Exit::bad_input, {w, "size"});
    j["metadata"]["hfdelta_files"] = json::array({{{"path", "x"}, {"op", "put"}, {"size", 1}, {"xxh3-128", "abc"}}});
    expect_error(refused(j), Exit::bad_input, {w, "abc"});
    j["metadata"]["hfdelta_files"] = json::array({{{"op", "remove"}}});
    expect_error(refused(j), Exit::bad_input, {w, "path"});
    j["metadata"]["hfdelta_files"] = json::object();
    expect_error(refused(j), Exit::bad_input, {w, "hfdelta_files"});
  }
  SUBCASE("base checksums") {
    json j = valid_delta_index();
    j["metadata"]["hfdelta_base_checksums"] = {{"w", "xyz"}};
    expect_error(refused(j), Exit::bad_input, {w, "xyz"});
    j["metadata"]["hfdelta_base_checksums"] = {{"w", 5}};
    expect_error(refused(j), Exit::bad_input, {w, "\"w\""});
    j["metadata"]["hfdelta_base_checksums"] = json::array();
    expect_error(refused(j), Exit::bad_input, {w, "hfdelta_base_checksums"});
  }
  SUBCASE("not JSON, not an object, missing") {
    write_text(idx, "{\"metadata\": ");
    expect_error(error_of([&] { read_delta_index(tmp.path()); }), Exit::bad_input, {w, "JSON"});
    write_text(idx, "[1, 2]");
    expect_error(error_of([&] { read_delta_index(tmp.path()); }), Exit::bad_input, {w, "object"});
    bfs::remove(idx);
    const auto e = error_of([&] { read_delta_index(tmp.path()); });
    REQUIRE(e);
    CHECK(contains(e->what(), w));
  }
}

namespace {

// A structural delta index with one operation of each kind.
DeltaIndex structural_index() {
  DeltaIndex d;
  d.version = 3;
  d.base_version = 2;
  d.per_tensor = true;
  d.weight_map = {{"b.weight", "model-00000-of-00002.safetensors"}, {"c.new", "model-00001-of-00002.safetensors"}};
  d.encodings = {{"b.weight", Encoding::sparse}, {"c.new", Encoding::xor_bytes}};
  d.base_checksums = {{"b.weight", Hash128{1, 2}}};
  ShardOp rm;
  rm.file = "model-e.safetensors";
  rm.op = ShardOp::Op::remove;
  ShardOp hd;
  hd.file = "model-b.safetensors";
  hd.op = ShardOp::Op::header;
  hd.header_size = 184;
  hd.header_hash = Hash128{0x1111222233334444ull, 0x5555666677778888ull};
  hd.base_header_hash = Hash128{0x9999aaaabbbbccccull, 0xddddeeeeffff0000ull};
  ShardOp bd;
  bd.file = "sub/model-c.safetensors";
  bd.op = ShardOp::Op::build;
  bd.header_size = 200;
  bd.header_hash = Hash128{7, 8};
  bd.size = 456;
  bd.tensors = {{"c.new", std::nullopt, Hash128{9, 10}},
                {"c.weight", std::string("c.weight"), Hash128{11, 12}},
                {"c.emb", std::string("old.emb"), Hash128{13, 14}}};
  d.shards = {hd, bd, rm};
  return d;
}

}  // namespace

TEST_CASE("format: delta index round trip of hfdelta_shards") {
  const DeltaIndex d = structural_index();
  const std::string text = write_delta_index_json(d, 999);
  const json j = json::parse(text);
  // The lowest revision that can apply it: older readers refuse it.
  CHECK(j["metadata"]["hfdelta_format"] == 3);
  REQUIRE(j["metadata"]["hfdelta_shards"].size() == 3);

  const DeltaIndex r = parse_delta_index(text, "idx");
  CHECK(r.structural());
  CHECK(r.version == 3);
  CHECK(r.base_version == 2);
  CHECK(r.weight_map == d.weight_map);
  CHECK(r.encodings == d.encodings);
  CHECK(r.base_checksums == d.base_checksums);
  REQUIRE(r.shards.size() == 3);
  const ShardOp* hd = shard_op(r, "model-b.safetensors");
  const ShardOp* bd = shard_op(r, "sub/model-c.safetensors");
  const ShardOp* rm = shard_op(r, "model-e.safetensors");
  REQUIRE(hd);
  REQUIRE(bd);
  REQUIRE(rm);
  CHECK(shard_op(r, "model-a.safetensors") == nullptr);

  CHECK(rm->op == ShardOp::Op::remove);

  CHECK(hd->op == ShardOp::Op::header);
  CHECK(hd->header_size == 184);
  CHECK(hd->header_hash == d.shards[0].header_hash);
  CHECK(hd->base_header_hash == d.shards[0].base_header_hash);
  CHECK(hd->tensors.empty());

  CHECK(bd->op == ShardOp::Op::build);
  CHECK(bd->header_size == 200);
  CHECK(bd->header_hash == Hash128{7, 8});
  CHECK(bd->size == 456);
  REQUIRE(bd->tensors.size() == 3);  // in data order, as written
  for (std::size_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    CHECK(bd->tensors[i].name == d.shards[1].tensors[i].name);
    CHECK(bd->tensors[i].from == d.shards[1].tensors[i].from);
    CHECK(bd->tensors[i].hash == d.shards[1].tensors[i].hash);
  }
  CHECK_FALSE(bd->tensors[0].from.has_value());
  CHECK(bd->tensors[2].from == std::optional<std::string>("old.emb"));

  // What the format documents: each op's keys, and no keys it does not need.
  for (const json& e : j["metadata"]["hfdelta_shards"]) {
    CAPTURE(e.dump());
    if (e["op"] == "remove") CHECK(e == json{{"file", "model-e.safetensors"}, {"op", "remove"}});
    if (e["op"] == "header") {
      CHECK(e["header"] == json{{"size", 184}, {"xxh3-128", "11112222333344445555666677778888"}});
      CHECK(e["base_header"] == "9999aaaabbbbccccddddeeeeffff0000");
      CHECK_FALSE(e.contains("tensors"));
    }
    if (e["op"] == "build") {
      CHECK(e["size"] == 456);
      CHECK(e["tensors"][0] == json{{"name", "c.new"}, {"xxh3-128", hex128(9, 10)}});
      CHECK(e["tensors"][2]["from"] == "old.emb");
      CHECK_FALSE(e.contains("base_header"));
    }
  }

  // Writing what was read gives the same text.
  CHECK(write_delta_index_json(r, 999) == text);
  // Without shard operations, no key and the revision of the encodings.
  DeltaIndex plain = d;
  plain.shards.clear();
  const json pj = json::parse(write_delta_index_json(plain, 999));
  CHECK_FALSE(pj["metadata"].contains("hfdelta_shards"));
  CHECK(pj["metadata"]["hfdelta_format"] == 2);
  CHECK_FALSE(parse_delta_index(pj.dump(), "idx").structural());
}

TEST_CASE("format: hfdelta_shards refusals") {
  const std::string w = "/r/weight_v000003/model.safetensors.index.json";
  const json valid = json::parse(write_delta_index_json(structural_index(), 999));
  REQUIRE_NOTHROW(parse_delta_index(valid.dump(), w));
  // Each case is sealed again, so that the rule it is about is what answers.
  auto refused = [&](const json& j) {
    const std::string text = j["metadata"].contains("hfdelta_index_checksum") ? seal_delta_index(j.dump()) : j.dump();
    return error_of([&] { parse_delta_index(text, w); });
  };
  auto accepted = [&](const json& j) {
    const auto e = refused(j);
    CHECK_MESSAGE(!e, (e ? e->what() : ""));
  };
  // The index with shard entry `i` (0: header, 1: build, 2: remove) edited.
  auto with_entry = [&](std::size_t i, const std::function<void(json&)>& edit) {
    json j = valid;
    edit(j["metadata"]["hfdelta_shards"][i]);
    return j;
  };
  auto with_shards = [&](const json& shards) {
    json j = valid;
    j["metadata"]["hfdelta_shards"] = shards;
    return j;
  };
  const std::string hb = "model-b.safetensors", hc = "sub/model-c.safetensors";

  SUBCASE("not a list") {
    for (const json& bad : {json::object(), json("model-b.safetensors"), json(1), json(nullptr)}) {
      CAPTURE(bad.dump());
      expect_error(refused(with_shards(bad)), Exit::bad_input, {w, "hfdelta_shards", "list"});
    }
    accepted(with_shards(json::array()));  // nothing structural
  }
  SUBCASE("entries without file or op") {
    expect_error(refused(with_entry(0, [](json& e) { e.erase("file"); })), Exit::bad_input, {w, "\"file\" and \"op\""});
    expect_error(refused(with_entry(1, [](json& e) { e.erase("op"); })), Exit::bad_input, {w, "\"file\" and \"op\""});
    expect_error(refused(with_entry(2, [](json& e) { e["file"] = 5; })), Exit::bad_input, {w, "\"file\" and \"op\""});
    expect_error(refused(with_entry(2, [](json& e) { e["op"] = json::array({"remove"}); })), Exit::bad_input,
                 {w, "\"file\" and \"op\""});
    expect_error(refused(with_shards(json::array({"model-e.safetensors"}))), Exit::bad_input,
                 {w, "\"file\" and \"op\""});
  }
  SUBCASE("a file listed twice") {
    json j = valid;
    j["metadata"]["hfdelta_shards"].push_back({{"file", hc}, {"op", "remove"}});
    expect_error(refused(j), Exit::bad_input, {w, hc, "twice"});
  }
  SUBCASE("a tensor built twice, in one build or in two") {
    expect_error(refused(with_entry(1, [](json& e) { e["tensors"][2]["name"] = "c.new"; })), Exit::bad_input,
                 {w, "'c.new'", "built twice"});
    json two = valid;
    two["metadata"]["hfdelta_shards"].push_back(
        {{"file", "model-f.safetensors"},
         {"op", "build"},
         {"header", {{"size", 64}, {"xxh3-128", hex128(1, 1)}}},
         {"size", 100},
         {"tensors", json::array({{{"name", "c.weight"}, {"xxh3-128", hex128(2, 2)}}})}});
    expect_error(refused(two), Exit::bad_input, {w, "model-f.safetensors", "'c.weight'", "built twice"});
    // The same name as a `from` is no conflict: a base tensor may be copied twice.
    json copies = two;
    copies["metadata"]["hfdelta_shards"][3]["tensors"][0] = {
        {"name", "f.copy"}, {"from", "c.weight"}, {"xxh3-128", hex128(2, 2)}};
    accepted(copies);
  }
  SUBCASE("paths that are absolute or leave the directory") {
    for (const char* bad : {"/etc/model.safetensors", "../model.safetensors", "sub/../../x.safetensors", "a/../b",
                            "./a", "a//b", "", "..", "a\\b"}) {
      CAPTURE(bad);
      for (std::size_t i : {0, 1, 2})
        expect_error(refused(with_entry(i, [&](json& e) { e["file"] = bad; })), Exit::bad_input, {w, "hfdelta_shards"});
    }
    accepted(with_entry(2, [](json& e) { e["file"] = "deep/er/model-e.safetensors"; }));
  }
  SUBCASE("header sizes out of range") {
    for (const std::uint64_t bad : {std::uint64_t{0}, std::uint64_t{7}, 8 + kMaxHeaderSize + 1, ~std::uint64_t{0}}) {
      CAPTURE(bad);
      for (std::size_t i : {0, 1})
        expect_error(refused(with_entry(i, [&](json& e) { e["header"]["size"] = bad; })), Exit::bad_input,
                     {w, "header size " + std::to_string(bad), "out of range"});
    }
    for (const std::uint64_t ok : {std::uint64_t{8}, 8 + kMaxHeaderSize}) {
      CAPTURE(ok);
      accepted(with_entry(0, [&](json& e) { e["header"]["size"] = ok; }));
    }
    for (const json& bad : {json(-8), json("184"), json(184.5), json(nullptr)}) {
      CAPTURE(bad.dump());
      expect_error(refused(with_entry(1, [&](json& e) { e["header"]["size"] = bad; })), Exit::bad_input,
                   {w, hc, "\"size\""});
    }
    expect_error(refused(with_entry(0, [](json& e) { e.erase("header"); })), Exit::bad_input, {w, hb, "\"header\""});
    expect_error(refused(with_entry(1, [](json& e) { e["header"] = "abc"; })), Exit::bad_input, {w, hc, "\"header\""});
  }
  SUBCASE("bad or missing checksums") {
    for (const json& bad : {json("xyz"), json(std::string(31, 'a')), json(std::string(33, 'a')),
                            json(std::string(31, 'a') + "g"), json(5)}) {
      CAPTURE(bad.dump());
      expect_error(refused(with_entry(0, [&](json& e) { e["header"]["xxh3-128"] = bad; })), Exit::bad_input, {w, hb});
      expect_error(refused(with_entry(0, [&](json& e) { e["base_header"] = bad; })), Exit::bad_input, {w, hb});
      expect_error(refused(with_entry(1, [&](json& e) { e["header"]["xxh3-128"] = bad; })), Exit::bad_input, {w, hc});
      expect_error(refused(with_entry(1, [&](json& e) { e["tensors"][1]["xxh3-128"] = bad; })), Exit::bad_input,
                   {w, hc});
    }
    expect_error(refused(with_entry(0, [](json& e) { e.erase("base_header"); })), Exit::bad_input,
                 {w, hb, "base_header"});
    expect_error(refused(with_entry(1, [](json& e) { e["tensors"][0].erase("xxh3-128"); })), Exit::bad_input,
                 {w, hc, "xxh3-128"});
    expect_error(refused(with_entry(1, [](json& e) { e["header"].erase("xxh3-128"); })), Exit::bad_input,
                 {w, hc, "xxh3-128"});
    // Upper-case hex digits are the same checksum.
    const DeltaIndex up = parse_delta_index(
        seal_delta_index(with_entry(0, [](json& e) { e["base_header"] = "9999AAAABBBBCCCCDDDDEEEEFFFF0000"; }).dump()),
        w);
    CHECK(shard_op(up, hb)->base_header_hash == structural_index().shards[0].base_header_hash);
  }
  SUBCASE("build entries: size, tensor list, names, `from`") {
    expect_error(refused(with_entry(1, [](json& e) { e.erase("size"); })), Exit::bad_input, {w, hc, "\"size\""});
    expect_error(refused(with_entry(1, [](json& e) { e["size"] = -1; })), Exit::bad_input, {w, hc, "\"size\""});
    expect_error(refused(with_entry(1, [](json& e) { e.erase("tensors"); })), Exit::bad_input, {w, hc, "\"tensors\""});
    expect_error(refused(with_entry(1, [](json& e) { e["tensors"] = json::object(); })), Exit::bad_input,
                 {w, hc, "\"tensors\""});
    expect_error(refused(with_entry(1, [](json& e) { e["tensors"][0].erase("name"); })), Exit::bad_input,
                 {w, hc, "\"name\""});
    expect_error(refused(with_entry(1, [](json& e) { e["tensors"][0]["name"] = 3; })), Exit::bad_input,
                 {w, hc, "\"name\""});
    expect_error(refused(with_entry(1, [](json& e) { e["tensors"][1] = "c.weight"; })), Exit::bad_input,
                 {w, hc, "\"name\""});
    for (const json& bad : {json(7), json(nullptr), json::array({"c.weight"}), json::object()}) {
      CAPTURE(bad.dump());
      expect_error(refused(with_entry(1, [&](json& e) { e["tensors"][1]["from"] = bad; })), Exit::bad_input,
                   {w, hc, "'c.weight'", "\"from\""});
    }
  }
  SUBCASE("an unknown op") {
    for (const char* op : {"rename", "Build", "", "put"}) {
      CAPTURE(op);
      expect_error(refused(with_entry(2, [&](json& e) { e["op"] = op; })), Exit::unsupported,
                   {w, "model-e.safetensors", "unknown op \"" + std::string(op) + "\""});
    }
  }
  SUBCASE("hfdelta_format before 3") {
    for (const int rev : {0, 1, 2}) {
      CAPTURE(rev);
      json j = valid;
      j["metadata"]["hfdelta_format"] = rev;
      expect_error(refused(j), Exit::bad_input, {w, "hfdelta_shards", "hfdelta_format 3"});
    }
    // Without the revision (nor the checksum that comes with it).
    json j = valid;
    j["metadata"].erase("hfdelta_format");
    j["metadata"].erase("hfdelta_index_checksum");
    expect_error(refused(j), Exit::bad_input, {w, "hfdelta_shards", "hfdelta_format 3"});
  }
}

TEST_CASE("format: is_delta_dir") {
  TempDir tmp;
  const bfs::path d = tmp.path();
  CHECK_FALSE(is_delta_dir(d));  // no index at all
  write_st(d / "model.safetensors", {f32("a", 2)});
  CHECK_FALSE(is_delta_dir(d));
  write_text(d / kIndexFile, R"({"metadata": {"total_size": 8}, "weight_map": {"a": "model.safetensors"}})");
  CHECK_FALSE(is_delta_dir(d));
  write_text(d / kIndexFile, R"({"weight_map": {"a": "model.safetensors"}})");
  CHECK_FALSE(is_delta_dir(d));
  write_text(d / kIndexFile, valid_delta_index().dump());
  CHECK(is_delta_dir(d));
  write_text(d / kIndexFile, "not json");
  const auto e = error_of([&] { is_delta_dir(d); });
  REQUIRE(e);
  CHECK(e->code() == Exit::bad_input);
}

// ---- scan_root -----------------------------------------------------------------

TEST_CASE("format: scan_root") {
  TempDir tmp;
  const bfs::path root = tmp.path();
  CHECK(scan_root(root).empty());

  // v1: delta; v2: full with an index; v3: full, single file.
  write_text(root / "weight_v000001" / kIndexFile, valid_delta_index().dump());
  write_st(root / "weight_v000002" / "model.safetensors", {f32("a", 2)});
  write_text(root / "weight_v000002" / kIndexFile,
             R"({"metadata": {"total_size": 8}, "weight_map": {"a": "model.safetensors"}})");
  write_st(root / "weight_v000003" / "model.safetensors", {f32("a", 2)});
  // Things that are not published versions.
  bfs::create_directories(root / ".weight_v000004.tmp-x");
  write_text(root / ".weight_v000004.tmp-x" / kIndexFile, "garbage");
  bfs::create_directories(root / "weight_v000005.tmp");
  bfs::create_directories(root / "weight_v000005.tmp-abc");
  bfs::create_directories(root / "weight_v12");
  bfs::create_directories(root / "weight_vabc123");
  bfs::create_directories(root / "other");
  write_text(root / "weight_v000006", "a file, not a directory");
  write_text(root / "README", "x");

  const auto vs = scan_root(root);
  REQUIRE(vs.size() == 3);
  CHECK(vs[0].version == 1);
  CHECK(is_delta_dir(vs[0].path));
  CHECK(vs[0].path.filename() == "weight_v000001");
  CHECK(vs[1].version == 2);
  CHECK_FALSE(is_delta_dir(vs[1].path));
  CHECK(vs[1].path.filename() == "weight_v000002");
  CHECK(vs[2].version == 3);
  CHECK_FALSE(is_delta_dir(vs[2].path));
  CHECK(vs[2].path == root / "weight_v000003");

  SUBCASE("larger numbers sort as numbers") {
    bfs::create_directories(root / "weight_v1000000");
    bfs::create_directories(root / "weight_v999999");
    const auto more = scan_root(root);
    REQUIRE(more.size() == 5);
    CHECK(more[3].version == 999999);
    CHECK(more[4].version == 1000000);
  }
  SUBCASE("a version published twice") {
    bfs::create_directories(root / "weight_v0000001");
    expect_error(error_of([&] { scan_root(root); }), Exit::bad_input,
                 {"published twice", "weight_v000001", "weight_v0000001"});
  }
  SUBCASE("root not a directory") {
    expect_error(error_of([&] { scan_root(root / "README"); }), Exit::bad_input, {(root / "README").string()});
    expect_error(error_of([&] { scan_root(root / "missing"); }), Exit::usage, {"missing", "does not exist"});
  }
}

// ---- local store ---------------------------------------------------------------

TEST_CASE("format: local state") {
  TempDir tmp;
  const bfs::path local = tmp.path();
  const bfs::path sdir = local / kStateDir;
  const bfs::path sfile = sdir / "state.json";

  SUBCASE("missing state means never initialised") {
    const LocalState s = read_state(local);
    CHECK_FALSE(s.version.has_value());
    CHECK_FALSE(s.pending.has_value());
  }
  SUBCASE("round trip, exact JSON") {
    bfs::create_directories(sdir);
    write_state(local, {6, std::nullopt}, true);
    CHECK(json::parse(read_text(sfile)) == json{{"version", "000006"}});
    LocalState s = read_state(local);
    CHECK(s.version == std::optional<std::uint64_t>(6));
    CHECK_FALSE(s.pending.has_value());

    write_state(local, {6, 7}, false);
    CHECK(json::parse(read_text(sfile)) == json{{"version", "000006"}, {"pending", "000007"}});
    s = read_state(local);
    CHECK(s.version == std::optional<std::uint64_t>(6));
    CHECK(s.pending == std::optional<std::uint64_t>(7));

    write_state(local, {std::nullopt, 1}, false);
    s = read_state(local);
    CHECK_FALSE(s.version.has_value());
    CHECK(s.pending == std::optional<std::uint64_t>(1));

    write_state(local, {1234567, std::nullopt}, true);
    CHECK(json::parse(read_text(sfile)) == json{{"version", "1234567"}});
    CHECK(read_state(local).version == std::optional<std::uint64_t>(1234567));
    // No temporary files left behind.
    CHECK(list_dir(sdir) == std::vector<std::string>{"state.json"});
  }
  SUBCASE("state written by another host of the format") {
    write_text(sfile, "{\"version\": \"000006\"}");
    CHECK(read_state(local).version == std::optional<std::uint64_t>(6));
    write_text(sfile, "{\"version\": 9, \"pending\": null}");
    const LocalState s = read_state(local);
    CHECK(s.version == std::optional<std::uint64_t>(9));
    CHECK_FALSE(s.pending.has_value());
  }
  SUBCASE("corrupt state") {
    for (const char* text : {"{\"version\": ", "", "[]", "\"000006\"", "{\"version\": \"abc\"}", "{\"version\": -1}",
                             "{\"version\": 1.5}", "{\"version\": \"000006\", \"pending\": true}"}) {
      CAPTURE(text);
      write_text(sfile, text);
      expect_error(error_of([&] { read_state(local); }), Exit::bad_input, {sfile.string()});
    }
  }
}

TEST_CASE("format: LocalLock") {
  TempDir tmp;
  const bfs::path local = tmp.path();
  const bfs::path lock_path = local / kStateDir / "lock";

  // Taking the lock creates LOCAL/.weight_sync/lock.
  { LocalLock first(local, 0.2); }
  CHECK(bfs::is_regular_file(lock_path));

  // Another open file description holds the lock.
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX) == 0);
  expect_error(error_of([&] { LocalLock l(local, 0.2); }), Exit::lock_timeout, {lock_path.string()});
  expect_error(error_of([&] { LocalLock l(local, 0); }), Exit::lock_timeout, {lock_path.string()});
  REQUIRE(::flock(fd, LOCK_UN) == 0);

  {
    LocalLock held(local, 0.2);
    // While held, nobody else gets it.
    errno = 0;
    CHECK(::flock(fd, LOCK_EX | LOCK_NB) != 0);
    CHECK(errno == EWOULDBLOCK);
    expect_error(error_of([&] { LocalLock l(local, 0.05); }), Exit::lock_timeout, {"lock"});
  }
  // Released by the destructor.
  CHECK(::flock(fd, LOCK_EX | LOCK_NB) == 0);
  CHECK(::flock(fd, LOCK_UN) == 0);
  ::close(fd);
  { LocalLock wait_forever(local, -1); }

  // Readers share the lock with each other, not with a writer.
  {
    LocalLock r1(local, 0.2, LocalLock::Mode::shared);
    LocalLock r2(local, 0.2, LocalLock::Mode::shared);
    expect_error(error_of([&] { LocalLock w(local, 0.05); }), Exit::lock_timeout, {"lock"});
  }
  {
    LocalLock w(local, 0.2);
    expect_error(error_of([&] { LocalLock r(local, 0.05, LocalLock::Mode::shared); }), Exit::lock_timeout, {"lock"});
  }
  // A reader creates nothing and locks nothing where no run ever wrote.
  TempDir fresh;
  { LocalLock r(fresh.path(), 0.2, LocalLock::Mode::shared); }
  { LocalLock e(fresh.path(), 0.2, LocalLock::Mode::existing); }
  CHECK_FALSE(bfs::exists(fresh.path() / kStateDir));
}

// ---- checkpoints ---------------------------------------------------------------

TEST_CASE("format: open_checkpoint, single file") {
  TempDir tmp;
  const bfs::path d = tmp.path();
  write_st(d / "model.safetensors", {f32("b", 3), f32("a", 2), {"c", "BF16", {4}, 8}});
  write_text(d / "config.json", "{}");
  write_text(d / "tokenizer.json", "{}");
  write_text(d / "sub" / "chat_template.jinja", "x");
  write_text(d / "sub" / "deeper" / "x.safetensors", "not parsed");
  write_text(d / kStateDir / "state.json", "{\"version\": \"000001\"}");
  write_text(d / kStateDir / "lock", "");

  const Checkpoint c = open_checkpoint(d);
  CHECK(c.dir == d);
  REQUIRE(c.shards.size() == 1);
  CHECK(c.shards[0].file == "model.safetensors");
  CHECK(c.index_files.empty());
  CHECK(c.other_files == std::vector<std::string>{"config.json", "sub/chat_template.jinja", "sub/deeper/x.safetensors",
                                                  "tokenizer.json"});
  REQUIRE(c.tensors.size() == 3);
  for (const char* t : {"a", "b", "c"}) {
    CAPTURE(t);
    const TensorRef& r = c.tensors.at(t);
    CHECK(r.shard == 0);
    CHECK(c.info(r).name == t);
  }
  CHECK(c.info(c.tensors.at("c")).dtype == "BF16");
  CHECK(c.tensor_bytes() == 12 + 8 + 8);
  CHECK(c.find_shard("model.safetensors") == &c.shards[0]);
  CHECK(c.find_shard("config.json") == nullptr);
}

TEST_CASE("format: open_checkpoint, sharded with an index") {
  TempDir tmp;
  const bfs::path d = tmp.path();
  const std::string s1 = "model-00001-of-00002.safetensors", s2 = "model-00002-of-00002.safetensors";
  write_st(d / s2, {f32("c", 1)});
  write_st(d / s1, {f32("a", 2), f32("b", 3)});
  write_text(d / "config.json", "{}");
  auto index = [&](const json& wm) {
    write_text(d / kIndexFile, json{{"metadata", {{"total_size", 24}}}, {"weight_map", wm}}.dump());
  };
  index({{"a", s1}, {"b", s1}, {"c", s2}});

  {
    const Checkpoint c = open_checkpoint(d);
    REQUIRE(c.shards.size() == 2);
    CHECK(c.shards[0].file == s1);
    CHECK(c.shards[1].file == s2);
    CHECK(c.index_files == std::vector<std::string>{kIndexFile});
    CHECK(c.other_files == std::vector<std::string>{"config.json", kIndexFile});
    CHECK(c.tensors.at("a").shard == 0);
    CHECK(c.tensors.at("b").shard == 0);
    CHECK(c.tensors.at("c").shard == 1);
    CHECK(c.info(c.tensors.at("c")).name == "c");
    CHECK(c.tensor_bytes() == 24);
  }

  SUBCASE("an unindexed .safetensors file beside the index is an ordinary file") {
    write_text(d / "extra.safetensors", "garbage, never parsed");
    const Checkpoint c = open_checkpoint(d);
    CHECK(c.shards.size() == 2);
    CHECK(c.find_shard("extra.safetensors") == nullptr);
    CHECK(c.other_files == std::vector<std::string>{"config.json", "extra.safetensors", kIndexFile});
  }
  SUBCASE("index names a missing shard") {
    index({{"a", s1}, {"b", s1}, {"c", "model-00003-of-00003.safetensors"}});
    expect_error(error_of([&] { open_checkpoint(d); }), Exit::bad_input,
                 {(d / kIndexFile).string(), "model-00003-of-00003.safetensors"});
  }
  SUBCASE("index maps a tensor to a shard that lacks it") {
    index({{"a", s1}, {"b", s1}, {"c", s2}, {"d", s2}});
    expect_error(error_of([&] { open_checkpoint(d); }), Exit::bad_input, {s2, "'d'"});
    index({{"a", s1}, {"b", s2}, {"c", s2}});
    expect_error(error_of([&] { open_checkpoint(d); }), Exit::bad_input, {"'b'"});
  }
  SUBCASE("a shard holds a tensor the index does not map to it") {
    // open_checkpoint documents: "each of its tensors must be mapped to it".
    index({{"a", s1}, {"c", s2}});
    expect_error(error_of([&] { open_checkpoint(d); }), Exit::bad_input, {s1, "'b'"});
  }
  SUBCASE("the same tensor in two shards") {
    write_st(d / s2, {f32("c", 1), f32("b", 3)});
    expect_error(error_of([&] { open_checkpoint(d); }), Exit::bad_input, {"'b'"});
  }
  SUBCASE("bad shard names in the index") {
    for (const char* bad : {"../model.safetensors", "/tmp/model.safetensors", "sub/model.safetensors", "config.json"}) {
      CAPTURE(bad);
      if (std::string(bad) == "sub/model.safetensors") write_st(d / "sub" / "model.safetensors", {f32("a", 2)});
      index({{"a", bad}});
      expect_error(error_of([&] { open_checkpoint(d); }), Exit::bad_input, {(d / kIndexFile).string()});
    }
  }
  SUBCASE("two indexes that disagree") {
    write_text(d / "other.safetensors.index.json", json{{"weight_map", {{"a", s2}}}}.dump());
    expect_error(error_of([&] { open_checkpoint(d); }), Exit::bad_input, {"'a'", s1, s2});
  }
  SUBCASE("two indexes that agree") {
    write_text(d / "other.safetensors.index.json", json{{"weight_map", {{"a", s1}}}}.dump());
    const Checkpoint c = open_checkpoint(d);
    CHECK(c.index_files == std::vector<std::string>{kIndexFile, "other.safetensors.index.json"});
    CHECK(c.tensors.size() == 3);
  }
  SUBCASE("a broken index or shard") {
    write_text(d / kIndexFile, "{");
    expect_error(error_of([&] { open_checkpoint(d); }), Exit::bad_input, {(d / kIndexFile).string()});
    write_text(d / kIndexFile, "{\"metadata\": {}}");
    expect_error(error_of([&] { open_checkpoint(d); }), Exit::bad_input, {"weight_map"});
    index({{"a", s1}, {"b", s1}, {"c", s2}});
    write_text(d / s2, "short");
    expect_error(error_of([&] { open_checkpoint(d); }), Exit::bad_input, {(d / s2).string()});
  }
}

TEST_CASE("format: open_checkpoint without an index") {
  TempDir tmp;
  const bfs::path d = tmp.path();
  write_st(d / "model-00001-of-00002.safetensors", {f32("a", 1)});
  write_st(d / "model-00002-of-00002.safetensors", {f32("b", 1)});
  write_st(d / "adapter_model.safetensors", {f32("lora", 1)});
  {
    const Checkpoint c = open_checkpoint(d);
    REQUIRE(c.shards.size() == 3);
    CHECK(c.shards[0].file == "adapter_model.safetensors");
    CHECK(c.tensors.size() == 3);
    CHECK(c.other_files.empty());
  }
  SUBCASE("duplicate tensor across files") {
    write_st(d / "model-00002-of-00002.safetensors", {f32("b", 1), f32("a", 1)});
    expect_error(error_of([&] { open_checkpoint(d); }), Exit::bad_input, {"'a'", "also in"});
  }
  SUBCASE("not a directory") {
    expect_error(error_of([&] { open_checkpoint(d / "adapter_model.safetensors"); }), Exit::bad_input,
                 {"not a directory"});
    expect_error(error_of([&] { open_checkpoint(d / "missing"); }), Exit::usage, {"missing", "does not exist"});
  }
}

// ---- io ------------------------------------------------------------------------

TEST_CASE("format: write_file_atomic") {
  TempDir tmp;
  const bfs::path p = tmp.path() / "config.json";
  write_file_atomic(p, "hello", true);
  CHECK(read_text(p) == "hello");
  write_file_atomic(p, "bye", false);
  CHECK(read_text(p) == "bye");
  write_file_atomic(p, std::string("a\0b", 3), true);
  CHECK(read_text(p) == std::string("a\0b", 3));
  write_file_atomic(p, "", true);
  CHECK(bfs::file_size(p) == 0);
  CHECK(list_dir(tmp.path()) == std::vector<std::string>{"config.json"});
  // A directory that does not exist: an Error, nothing left behind.
  const auto e = error_of([&] { write_file_atomic(tmp.path() / "nodir" / "x", "x", true); });
  REQUIRE(e);
  CHECK(contains(e->what(), "nodir"));
  CHECK(list_dir(tmp.path()) == std::vector<std::string>{"config.json"});
}

TEST_CASE("format: a DeltaWriter leaves its temporary directory only as OUT") {
  TempDir d;
  const bfs::path out = d.path() / version_dirname(1);
  DeltaIndex idx;
  idx.version = 1;
  SUBCASE("destroyed without publish or abandon: removed") {
    bfs::path tmp;
    {
      DeltaWriter w(out, false);
      tmp = w.tmp;
      w.put_header("model.safetensors", "x");
      REQUIRE(bfs::is_regular_file(tmp / kHeadersDir / "model.safetensors"));
    }
    CHECK_FALSE(bfs::exists(tmp));
    CHECK(list_dir(d.path()).empty());
  }
  SUBCASE("destroyed by an exception: removed") {
    CHECK(error_of([&] {
      DeltaWriter w(out, false);
      w.put_header("model.safetensors", "x");
      fail(Exit::failure, "a step failed");
    }));
    CHECK(list_dir(d.path()).empty());
  }
  SUBCASE("published: OUT stays") {
    {
      DeltaWriter w(out, false);
      w.put_header("model.safetensors", "x");
      w.publish(idx);
    }
    CHECK(list_dir(d.path()) == std::vector<std::string>{version_dirname(1)});
    CHECK(read_text(out / kHeadersDir / "model.safetensors") == "x");
  }
  SUBCASE("abandoned: removed") {
    DeltaWriter w(out, false);
    w.abandon();
    CHECK(list_dir(d.path()).empty());
  }
}

TEST_CASE("format: copy_file_atomic and same_contents") {
  TempDir tmp;
  const bfs::path src = tmp.path() / "src.bin";
  std::string data(3 * 1024 * 1024 + 17, '\0');
  std::mt19937_64 rng(3);
  for (auto& ch : data) ch = static_cast<char>(rng());
  write_text(src, data);
  ::chmod(src.c_str(), 0600);

  const bfs::path dst = tmp.path() / "dst.bin";
  copy_file_atomic(src, dst, true);
  CHECK(read_text(dst) == data);
  CHECK(same_contents(src, dst));
  struct stat st {};
  REQUIRE(::stat(dst.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0644);

  // Replacing an existing file.
  write_text(tmp.path() / "small.txt", "small");
  copy_file_atomic(tmp.path() / "small.txt", dst, false);
  CHECK(read_text(dst) == "small");
  CHECK_FALSE(same_contents(src, dst));
  // Empty file.
  write_text(tmp.path() / "empty", "");
  copy_file_atomic(tmp.path() / "empty", dst, true);
  CHECK(bfs::file_size(dst) == 0);
  CHECK(same_contents(tmp.path() / "empty", dst));
  CHECK(list_dir(tmp.path()) == std::vector<std::string>{"dst.bin", "empty", "small.txt", "src.bin"});

  // Missing source: an Error naming it, nothing created.
  const auto e = error_of([&] { copy_file_atomic(tmp.path() / "nope", tmp.path() / "out", true); });
  REQUIRE(e);
  CHECK(contains(e->what(), "nope"));
  CHECK(list_dir(tmp.path()) == std::vector<std::string>{"dst.bin", "empty", "small.txt", "src.bin"});

  // same_contents: same size, one byte different far into the file.
  std::string other = data;
  other[1024 * 1024 + 5] ^= 1;
  write_text(tmp.path() / "other.bin", other);
  CHECK_FALSE(same_contents(src, tmp.path() / "other.bin"));
  other[1024 * 1024 + 5] ^= 1;
  other.back() ^= 1;
  write_text(tmp.path() / "other.bin", other);
  CHECK_FALSE(same_contents(src, tmp.path() / "other.bin"));
  other.back() ^= 1;
  write_text(tmp.path() / "other.bin", other);
  CHECK(same_contents(src, tmp.path() / "other.bin"));
  write_text(tmp.path() / "other.bin", data.substr(0, data.size() - 1));
  CHECK_FALSE(same_contents(src, tmp.path() / "other.bin"));
}

TEST_CASE("format: check_relative_path") {
  for (const char* ok : {"a", "a/b", "a.b", "..a", "a..", ".hidden", "a/.b/c", "a b", "...", "model.safetensors",
                         "sub/dir/tokenizer.json"}) {
    CAPTURE(ok);
    CHECK_NOTHROW(check_relative_path(ok, "ctx"));
  }
  const std::vector<std::string> bad{"",    "/a",  "/",    "..", "../a", "a/..", "a/../b", ".",
                                     "./a", "a/.", "a//b", "a/", "//a",  "a\\b", "..\\a",  std::string("a\0b", 3)};
  for (const auto& b : bad) {
    CAPTURE(b);
    const auto e = error_of([&] { check_relative_path(b, "the-ctx"); });
    REQUIRE(e);
    CHECK(e->code() == Exit::bad_input);
    CHECK(contains(e->what(), "the-ctx"));
  }
}

TEST_CASE("format: read_small_file and MappedFile bounds") {
  TempDir tmp;
  const bfs::path p = tmp.path() / "f";
  write_text(p, "0123456789");
  CHECK(read_small_file(p) == "0123456789");
  expect_error(error_of([&] { read_small_file(p, 9); }), Exit::bad_input, {p.string(), "10 bytes"});
  const MappedFile m(p);
  CHECK(m.size() == 10);
  CHECK(m.bytes(2, 3)[0] == '2');
  CHECK(m.bytes(10, 0).empty());
  expect_error(error_of([&] { (void)m.bytes(8, 3); }), Exit::bad_input, {p.string()});
  expect_error(error_of([&] { (void)m.bytes(11, 0); }), Exit::bad_input, {p.string()});
  expect_error(error_of([&] { (void)m.bytes(1, ~0ull); }), Exit::bad_input, {p.string()});
  write_text(tmp.path() / "empty", "");
  const MappedFile e(tmp.path() / "empty");
  CHECK(e.size() == 0);
  CHECK(e.bytes().empty());
}
