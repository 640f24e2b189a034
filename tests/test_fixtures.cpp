// Fixtures written by the real safetensors library and by a reference
// publisher of the slime disk-delta layout (testdata/, made by
// testdata/make_fixtures.py): the reader parses every file as the library
// wrote it, and the library applies the reference deltas byte for byte.
// Runs without Python: the expectations come from testdata/MANIFEST.json and
// from the tables below.
#include <doctest/doctest.h>

#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <boost/filesystem/operations.hpp>
#include <nlohmann/json.hpp>

#include "hfdelta/apply.hpp"
#include "hfdelta/checkpoint.hpp"
#include "hfdelta/delta_format.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/hash.hpp"
#include "hfdelta/safetensors.hpp"
#include "store/local_store.hpp"
#include "unit_util.hpp"
#include "util/io.hpp"

using namespace hfdelta;
using nlohmann::json;
using unit::contains;
using unit::error_of;
using unit::TempDir;
namespace fs = boost::filesystem;

namespace {

fs::path testdata() {
  const char* e = std::getenv("HFDELTA_TESTDATA");
  REQUIRE_MESSAGE(e != nullptr, "HFDELTA_TESTDATA is not set (meson test sets it to the source tree's testdata/)");
  return fs::path(e);
}

json manifest() { return json::parse(read_small_file(testdata() / "MANIFEST.json")); }

// Every regular file below `dir`, relative, outside .weight_sync.
std::set<std::string> files_below(const fs::path& dir) {
  std::set<std::string> out;
  for (fs::recursive_directory_iterator it(dir), end; it != end; ++it) {
    if (it.depth() == 0 && it->path().filename() == kStateDir) {
      it.disable_recursion_pending();
      continue;
    }
    if (fs::is_regular_file(it->status())) out.insert(fs::relative(it->path(), dir).generic_string());
  }
  return out;
}

void check_same_tree(const fs::path& a, const fs::path& b) {
  const auto fa = files_below(a), fb = files_below(b);
  CHECK(fa == fb);
  for (const auto& f : fa) {
    if (!fb.count(f)) continue;
    INFO("file ", f);
    CHECK(same_contents(a / f, b / f));
  }
}

std::vector<std::uint64_t> shape_of(const json& j) { return j.get<std::vector<std::uint64_t>>(); }

}  // namespace

TEST_CASE("fixtures: every safetensors file parses as the library wrote it") {
  const json m = manifest();
  REQUIRE(m["files"].size() >= 9);
  for (auto it = m["files"].begin(); it != m["files"].end(); ++it) {
    const fs::path p = testdata() / it.key();
    const json& want = *it;
    INFO("file ", it.key());
    const SafetensorsHeader h = read_safetensors(p);
    CHECK(h.file_size == want["size"].get<std::uint64_t>());
    CHECK(h.header_len == want["header_len"].get<std::uint64_t>());
    CHECK(h.header_len % 8 == 0);  // the reference writer pads to 8
    if (want["metadata"].is_null()) {
      CHECK_FALSE(h.has_metadata);
    } else {
      CHECK(h.has_metadata);
      CHECK(h.metadata == want["metadata"].get<std::map<std::string, std::string>>());
    }
    REQUIRE(h.tensors.size() == want["tensors"].size());
    const MappedFile data(p);
    for (const auto& t : h.tensors) {
      INFO("tensor ", t.name);
      REQUIRE(want["tensors"].contains(t.name));
      const json& wt = want["tensors"][t.name];
      CHECK(t.dtype == wt["dtype"].get<std::string>());
      CHECK(t.shape == shape_of(wt["shape"]));
      CHECK(t.nbytes() == wt["nbytes"].get<std::uint64_t>());
      if (const auto es = dtype_size(t.dtype)) CHECK(t.nbytes() == t.elements() * es);
      CHECK(xxh3_128(data.bytes(h.file_offset(t), t.nbytes())).hex() == wt["xxh3_128"].get<std::string>());
    }
  }
}

TEST_CASE("fixtures: numpy_all_dtypes holds every dtype safetensors.numpy writes") {
  struct D {
    const char* dtype;
    const char* prefix;
    std::uint64_t size;  // bytes per element
    bool known;          // hfdelta knows its element size
  };
  const std::vector<D> dtypes = {
      {"BOOL", "bool", 1, true},
      {"U8", "u8", 1, true},
      {"I8", "i8", 1, true},
      {"I16", "i16", 2, true},
      {"U16", "u16", 2, true},
      {"I32", "i32", 4, true},
      {"U32", "u32", 4, true},
      {"I64", "i64", 8, true},
      {"U64", "u64", 8, true},
      {"F16", "f16", 2, true},
      {"BF16", "bf16", 2, true},
      {"F32", "f32", 4, true},
      {"F64", "f64", 8, true},
      {"F8_E4M3", "f8_e4m3", 1, true},
      {"F8_E5M2", "f8_e5m2", 1, true},
      {"F8_E8M0", "f8_e8m0", 1, true},
      {"F8_E4M3FNUZ", "f8_e4m3fnuz", 1, false},
      {"F8_E5M2FNUZ", "f8_e5m2fnuz", 1, false},
      {"C64", "c64", 8, false},
  };
  const SafetensorsHeader h = read_safetensors(testdata() / "producers" / "numpy_all_dtypes.safetensors");
  CHECK(h.metadata == std::map<std::string, std::string>{{"format", "np"}});
  CHECK(h.tensors.size() == dtypes.size() * 3 + 2);
  for (const auto& d : dtypes) {
    INFO("dtype ", d.dtype);
    CHECK((dtype_size(d.dtype) != 0) == d.known);
    const std::string p = d.prefix;
    const TensorInfo* m = h.find(p + ".matrix");
    const TensorInfo* s = h.find(p + ".scalar");
    const TensorInfo* e = h.find(p + ".empty");
    REQUIRE(m);
    REQUIRE(s);
    REQUIRE(e);
    CHECK(m->dtype == d.dtype);
    CHECK(m->shape == std::vector<std::uint64_t>{5, 7});
    CHECK(m->nbytes() == 35 * d.size);
    CHECK(s->dtype == d.dtype);
    CHECK(s->shape.empty());
    CHECK(s->elements() == 1);
    CHECK(s->nbytes() == d.size);
    CHECK(e->dtype == d.dtype);
    CHECK(e->shape == std::vector<std::uint64_t>{0});
    CHECK(e->nbytes() == 0);
  }
  const TensorInfo* e2 = h.find("f32.empty_2d");
  REQUIRE(e2);
  CHECK(e2->shape == std::vector<std::uint64_t>{3, 0});
  CHECK(e2->nbytes() == 0);
  const TensorInfo* cube = h.find("bf16.cube");
  REQUIRE(cube);
  CHECK(cube->shape == std::vector<std::uint64_t>{4, 3, 2});
  CHECK(cube->nbytes() == 48);
}

TEST_CASE("fixtures: scalars and empty tensors without __metadata__") {
  const SafetensorsHeader h = read_safetensors(testdata() / "producers" / "numpy_scalars_empty.safetensors");
  CHECK_FALSE(h.has_metadata);
  CHECK(h.tensors.size() == 7);
  const std::map<std::string, std::pair<std::string, std::vector<std::uint64_t>>> want = {
      {"scalar.f32", {"F32", {}}},       {"scalar.bf16", {"BF16", {}}}, {"scalar.bool", {"BOOL", {}}},
      {"scalar.i64", {"I64", {}}},       {"empty.f16", {"F16", {0}}},   {"empty.u8_2d", {"U8", {4, 0}}},
      {"empty.f8", {"F8_E5M2", {0, 3}}},
  };
  for (const auto& [tensor, ds] : want) {
    const std::string& name = tensor;  // INFO captures it, and clang 14 cannot capture a structured binding
    INFO("tensor ", name);
    const TensorInfo* t = h.find(name);
    REQUIRE(t);
    CHECK(t->dtype == ds.first);
    CHECK(t->shape == ds.second);
  }
  // The values, read back through the offsets.
  const MappedFile f(testdata() / "producers" / "numpy_scalars_empty.safetensors");
  const auto f32 = f.bytes(h.file_offset(*h.find("scalar.f32")), 4);
  CHECK(std::vector<std::uint8_t>(f32.begin(), f32.end()) ==
        std::vector<std::uint8_t>{0x00, 0x00, 0x50, 0x40});  // 3.25f
  const auto bf16 = f.bytes(h.file_offset(*h.find("scalar.bf16")), 2);
  CHECK(std::vector<std::uint8_t>(bf16.begin(), bf16.end()) == std::vector<std::uint8_t>{0x00, 0xc0});  // -2.0
  const auto i64 = f.bytes(h.file_offset(*h.find("scalar.i64")), 8);
  CHECK(i64[0] == 0xf9);  // -7
  CHECK(i64[7] == 0xff);
  CHECK(f.bytes(h.file_offset(*h.find("scalar.bool")), 1)[0] == 1);
}

TEST_CASE("fixtures: torch_all_dtypes, including the packed F4 type") {
  const fs::path p = testdata() / "producers" / "torch_all_dtypes.safetensors";
  if (!fs::exists(p)) {
    MESSAGE("no torch fixture; make it with testdata/make_fixtures.py --torch");
    return;
  }
  const SafetensorsHeader h = read_safetensors(p);
  CHECK(h.metadata == std::map<std::string, std::string>{{"format", "pt"}});
  const TensorInfo* f4 = h.find("float4_e2m1fn_x2.matrix");
  REQUIRE(f4);
  CHECK(f4->dtype == "F4");
  CHECK(dtype_size("F4") == 0);                           // carried as opaque bytes
  CHECK(f4->shape == std::vector<std::uint64_t>{5, 14});  // shape counts 4-bit values
  CHECK(f4->nbytes() == 35);
  for (const char* n : {"bool", "uint8", "int8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16",
                        "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"}) {
    INFO("torch dtype ", n);
    const TensorInfo* t = h.find(std::string(n) + ".matrix");
    REQUIRE(t);
    CHECK(dtype_size(t->dtype) != 0);
    CHECK(t->nbytes() == 35 * dtype_size(t->dtype));
  }
}

namespace {

// The order in which safetensors (0.8) lays out tensor data: by dtype,
// descending in this rank, then by name. The rank groups dtypes by element
// size but also orders dtypes of the same size (BF16 before F16, F32 before
// U32 before I32, ...).
int writer_rank(const std::string& dtype) {
  static const std::vector<std::string> ascending = {
      "BOOL", "U8",   "I8",  "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16",
      "F16",  "BF16", "I32", "U32",     "F32",     "C64",     "F64",         "I64",         "U64"};
  for (std::size_t i = 0; i < ascending.size(); ++i)
    if (ascending[i] == dtype) return static_cast<int>(i);
  return -1;
}

std::vector<fs::path> layout_fixture_files() {
  std::vector<fs::path> files = {testdata() / "producers" / "numpy_all_dtypes.safetensors",
                                 testdata() / "producers" / "numpy_scalars_empty.safetensors"};
  for (const char* which : {"base", "new"})
    for (const auto& e : fs::directory_iterator(testdata() / "checkpoint" / which))
      if (e.path().extension() == ".safetensors") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

TEST_CASE("fixtures: the library lays data out by dtype rank, then by name") {
  const auto files = layout_fixture_files();
  REQUIRE(files.size() == 8);
  for (const auto& p : files) {
    INFO("file ", p.string());
    const SafetensorsHeader h = read_safetensors(p);
    for (std::size_t i = 1; i < h.tensors.size(); ++i) {
      const TensorInfo& a = h.tensors[i - 1];
      const TensorInfo& b = h.tensors[i];
      INFO("tensors ", a.name, " then ", b.name);
      REQUIRE(writer_rank(a.dtype) >= 0);
      REQUIRE(writer_rank(b.dtype) >= 0);
      const bool ordered = writer_rank(a.dtype) > writer_rank(b.dtype) ||
                           (writer_rank(a.dtype) == writer_rank(b.dtype) && a.name < b.name);
      CHECK(ordered);
    }
  }
}

// layout_safetensors lays data out as the reference writer does, dtypes of the
// same size (BF16 and F16 in checkpoint shard 2, several in numpy_all_dtypes)
// kept apart by dtype rather than interleaved by name.
TEST_CASE("fixtures: layout_safetensors reproduces the library's offsets") {
  for (const auto& p : layout_fixture_files()) {
    INFO("file ", p.string());
    const SafetensorsHeader h = read_safetensors(p);
    bool all_known = true;
    std::vector<TensorSpec> specs;
    for (const auto& t : h.tensors) {
      specs.push_back({t.name, t.dtype, t.shape, t.nbytes()});
      all_known = all_known && dtype_size(t.dtype) != 0;
    }
    if (!all_known) continue;  // dtypes this tool does not know have no size to order by
    const SafetensorsLayout L = layout_safetensors(specs, h.has_metadata ? &h.metadata : nullptr);
    REQUIRE(L.tensors.size() == h.tensors.size());
    for (std::size_t i = 0; i < L.tensors.size(); ++i) {
      INFO("tensor ", h.tensors[i].name);
      CHECK(L.tensors[i].name == h.tensors[i].name);
      CHECK(L.tensors[i].begin == h.tensors[i].begin);
    }
  }
}

TEST_CASE("fixtures: the sharded checkpoint pair opens as one checkpoint") {
  const Checkpoint base = open_checkpoint(testdata() / "checkpoint" / "base");
  const Checkpoint next = open_checkpoint(testdata() / "checkpoint" / "new");
  REQUIRE(base.shards.size() == 3);
  REQUIRE(next.shards.size() == 3);
  CHECK(base.index_files == std::vector<std::string>{"model.safetensors.index.json"});
  CHECK(base.other_files == std::vector<std::string>{"config.json", "model.safetensors.index.json"});
  CHECK(base.tensors.size() == 23);
  CHECK(base.tensors.size() == next.tensors.size());
  for (std::size_t s = 0; s < 3; ++s) {
    CHECK(base.shards[s].file == next.shards[s].file);
    CHECK(base.shards[s].header.header == next.shards[s].header.header);  // the same header bytes
    CHECK(base.shards[s].header.metadata == std::map<std::string, std::string>{{"format", "pt"}});
  }
  const TensorInfo& emb = base.info(base.tensors.at("embed.weight"));
  CHECK(emb.dtype == "BF16");
  CHECK(emb.shape == std::vector<std::uint64_t>{96, 64});
  CHECK(base.info(base.tensors.at("head.scale")).shape.empty());
  CHECK(base.info(base.tensors.at("empty.buffer")).nbytes() == 0);
  CHECK(base.info(base.tensors.at("unknown.c64")).dtype == "C64");
}

TEST_CASE("fixtures: slime-style deltas from the reference publisher apply byte for byte") {
  const fs::path base = testdata() / "checkpoint" / "base";
  const fs::path target = testdata() / "checkpoint" / "new";
  ApplyOptions opts;
  opts.sync = false;
  for (const char* enc : {"xor", "overwrite"}) {
    CAPTURE(enc);
    const fs::path delta = testdata() / "slime" / enc;
    const DeltaIndex idx = read_delta_index(delta);
    CHECK(idx.version == 1);
    CHECK(idx.base_version == 0);
    CHECK(idx.encoding == *parse_encoding(enc));
    CHECK(idx.base_checksums.empty());  // a plain publisher has no hfdelta extensions
    CHECK(idx.files.empty());
    CHECK(idx.weight_map.size() >= 10);
    for (const auto& [tensor, file] : idx.weight_map) CHECK(file == "model-00000-of-00001.safetensors");
    CHECK(is_delta_dir(delta));

    TempDir tmp;
    const fs::path local = tmp.path() / "local";
    const ApplyResult init = init_local(base, local, 0, opts);
    CHECK(init.to_version == 0);
    check_same_tree(local, base);

    const ApplyResult r = apply_delta(delta, local, opts);
    CHECK(r.applied == std::vector<std::uint64_t>{1});
    CHECK(r.tensors_patched == idx.weight_map.size());
    CHECK_FALSE(r.noop);
    check_same_tree(local, target);
    CHECK(read_state(local).version == std::optional<std::uint64_t>(1));
    CHECK_FALSE(read_state(local).pending.has_value());

    // Already at version 1: nothing to do.
    CHECK(apply_delta(delta, local, opts).noop);
    check_same_tree(local, target);

    // Through a publication root, onto a fresh LOCAL.
    const fs::path root = tmp.path() / "root";
    fs::create_directories(root / "weight_v000001");
    for (const auto& e : fs::directory_iterator(delta))
      fs::copy_file(e.path(), root / "weight_v000001" / e.path().filename());
    const fs::path local2 = tmp.path() / "local2";
    init_local(base, local2, 0, opts);
    const ApplyResult p = pull(root, local2, std::nullopt, opts);
    CHECK(p.applied == std::vector<std::uint64_t>{1});
    check_same_tree(local2, target);
  }
}

TEST_CASE("fixtures: a reference delta on the wrong base fails verification") {
  // No base checksums in a plain delta: the new-bytes checksums catch it.
  ApplyOptions opts;
  opts.sync = false;
  TempDir tmp;
  const fs::path local = tmp.path() / "local";
  init_local(testdata() / "checkpoint" / "new", local, 0, opts);
  try {
    apply_delta(testdata() / "slime" / "xor", local, opts);
    FAIL("applied on top of the wrong base");
  } catch (const Error& e) {
    CHECK(e.code() == Exit::verify_failed);
  }
  CHECK(read_state(local).version == std::optional<std::uint64_t>(0));  // version 1 is not recorded
}
