// plan_apply and next_record on a delta and a LOCAL described in memory:
// no LOCAL directory exists, and planning has no way to create one.
#include <cstring>

#include <doctest/doctest.h>
#include <boost/filesystem/operations.hpp>

#include "apply/apply_plan.hpp"
#include "hfdelta/error.hpp"
#include "unit_util.hpp"

using namespace hfdelta;
namespace bfs = boost::filesystem;

namespace {

const bfs::path kLocal = "/nonexistent/hfdelta-plan/local";
const bfs::path kDelta = "/nonexistent/hfdelta-plan/weight_v000002";

Hash128 h(std::uint64_t v) { return {v, ~v}; }

void expect_error(const std::optional<Error>& e, Exit code, const std::vector<std::string>& parts) {
  REQUIRE(e.has_value());
  CHECK(e->code() == code);
  for (const auto& part : parts) CHECK_MESSAGE(unit::contains(e->what(), part), e->what());
}

SafetensorsHeader header_of(std::vector<TensorSpec> specs) {
  const SafetensorsLayout l = layout_safetensors(std::move(specs), nullptr);
  return parse_safetensors(l.prefix, l.file_size, "in memory");
}

// LOCAL at version 1: model.safetensors holding `a` (8 bytes) and `b` (4 MiB of bf16).
LocalView local_view() {
  LocalView lv;
  lv.dir = kLocal;
  lv.version = 1;
  lv.checkpoint.dir = kLocal;
  lv.checkpoint.shards.push_back(
      {"model.safetensors", header_of({{"a", "F32", {2}, 8}, {"b", "BF16", {2u << 20}, 4u << 20}})});
  lv.checkpoint.shards.push_back({"other.safetensors", header_of({{"c", "F32", {4}, 16}})});
  for (std::size_t s = 0; s < lv.checkpoint.shards.size(); ++s)
    for (std::size_t i = 0; i < lv.checkpoint.shards[s].header.tensors.size(); ++i)
      lv.checkpoint.tensors[lv.checkpoint.shards[s].header.tensors[i].name] = {s, i};
  return lv;
}

// A delta 1 -> 2 with one entry per tensor named, frames from `frames`.
struct DeltaInMemory {
  OpenDelta d;
  std::vector<std::vector<std::uint8_t>> frames;
};

DeltaInMemory delta_of(const std::vector<std::pair<std::string, Encoding>>& tensors) {
  DeltaInMemory m;
  m.d.dir = kDelta;
  m.d.index.version = 2;
  m.d.index.base_version = 1;
  std::vector<TensorSpec> specs;
  for (const auto& [name, enc] : tensors) {
    specs.push_back({name, "U8", {64}, 64});
    m.d.index.weight_map[name] = "model-00000-of-00001.safetensors";
    m.d.index.base_checksums[name] = h(name.size());
  }
  auto [it, _] = m.d.headers.emplace("model-00000-of-00001.safetensors", header_of(specs));
  m.frames.resize(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    m.frames[i].assign(64, 0);
    if (tensors[i].second == Encoding::sparse) sparse_entry_head(2, 4u << 20, m.frames[i].data());
    DeltaEntry e;
    e.file = &it->first;
    e.info = &it->second.tensors[i];
    e.encoding = tensors[i].second;
    e.frame = m.frames[i];
    e.new_hash = h(100 + i);
    e.base_hash = m.d.index.base_checksums[tensors[i].first];
    m.d.entries.push_back(e);
  }
  return m;
}

}  // namespace

TEST_CASE("plan: entries become patches of LOCAL's tensors in place") {
  const LocalView lv = local_view();
  const DeltaInMemory m = delta_of({{"a", Encoding::xor_bytes}, {"c", Encoding::overwrite}});
  const ApplyPlan p = plan_apply(m.d, lv, 1);
  CHECK_FALSE(bfs::exists(kLocal.parent_path()));
  CHECK(p.manifest.base == 1u);
  CHECK(p.manifest.version == 2u);
  CHECK(p.manifest.shards == std::vector<std::string>{"model.safetensors", "other.safetensors"});
  CHECK(p.manifest.files.empty());
  REQUIRE(p.patches.size() == 2);
  const SafetensorsHeader& mh = lv.checkpoint.shards[0].header;
  CHECK(p.patches[0].tensor == "a");
  CHECK(p.patches[0].local_shard == 0);
  CHECK(p.patches[0].offset == mh.file_offset(mh.tensors[0]));
  CHECK(p.patches[0].nbytes == 8);
  CHECK(p.patches[0].encoding == Encoding::xor_bytes);
  CHECK(p.patches[0].delta_file == (kDelta / "model-00000-of-00001.safetensors").string());
  CHECK(p.patches[1].tensor == "c");
  CHECK(p.patches[1].local_shard == 1);
  CHECK(p.patches[1].nbytes == 16);
  CHECK(p.units.size() == 2);
  CHECK(p.split.empty());
  CHECK(p.tensors_patched == 2);
  CHECK(p.delta_bytes == 128);
}

TEST_CASE("plan: a large sparse entry is cut into chunk ranges for several threads") {
  const LocalView lv = local_view();
  const DeltaInMemory m = delta_of({{"a", Encoding::xor_bytes}, {"b", Encoding::sparse}});
  const ApplyPlan one = plan_apply(m.d, lv, 1);
  CHECK(one.split.empty());
  CHECK(one.units.size() == 2);
  const ApplyPlan p = plan_apply(m.d, lv, 2);
  REQUIRE(p.split.size() == 1);
  const Patch& b = p.patches[p.split[0]];
  CHECK(b.tensor == "b");
  CHECK(b.split);
  CHECK(b.chunk_bytes == kSparseChunkElements * 2);
  // 2 Mi bf16 elements: two chunks, each a unit; with `a`, three units, largest first.
  REQUIRE(p.units.size() == 3);
  CHECK(p.units[0].bytes >= p.units[1].bytes);
  CHECK(p.units[1].bytes >= p.units[2].bytes);
  std::uint64_t covered = 0;
  for (const PatchUnit& u : p.units)
    if (u.patch == p.split[0]) covered += u.bytes;
  CHECK(covered == b.nbytes);
}

TEST_CASE("plan: refusals before anything is written") {
  LocalView lv = local_view();
  SUBCASE("an entry for a tensor LOCAL does not have") {
    const DeltaInMemory m = delta_of({{"zz", Encoding::xor_bytes}});
    expect_error(unit::error_of([&] { plan_apply(m.d, lv, 1); }), Exit::bad_input,
                 {"'zz' does not exist in", kLocal.string()});
  }
  SUBCASE("a weight file patched in place that is hard-linked elsewhere") {
    lv.hard_links["model.safetensors"] = 2;
    const DeltaInMemory m = delta_of({{"a", Encoding::xor_bytes}});
    expect_error(unit::error_of([&] { plan_apply(m.d, lv, 1); }), Exit::bad_input,
                 {(kLocal / "model.safetensors").string(), "2 hard links", "nothing was changed"});
  }
  SUBCASE("a plain-file operation on what is a weight file in LOCAL") {
    DeltaInMemory m = delta_of({{"a", Encoding::xor_bytes}});
    m.d.index.files.push_back({"other.safetensors", FileChange::Op::remove, 0, {}});
    expect_error(unit::error_of([&] { plan_apply(m.d, lv, 1); }), Exit::verify_failed,
                 {"removes", (kLocal / "other.safetensors").string(), "is a weight file there"});
  }
  SUBCASE("removing a weight file LOCAL does not have") {
    DeltaInMemory m = delta_of({{"a", Encoding::xor_bytes}});
    ShardOp so;
    so.file = "gone.safetensors";
    so.op = ShardOp::Op::remove;
    m.d.index.shards.push_back(so);
    expect_error(unit::error_of([&] { plan_apply(m.d, lv, 1); }), Exit::verify_failed,
                 {"hfdelta_shards \"gone.safetensors\" removes a weight file", "nothing was changed"});
  }
  CHECK_FALSE(bfs::exists(kLocal.parent_path()));
}

TEST_CASE("plan: file operations and weight files removed, in execution order") {
  LocalView lv = local_view();
  DeltaInMemory m = delta_of({{"a", Encoding::xor_bytes}});
  m.d.index.files.push_back({"config.json", FileChange::Op::put, 10, h(7)});
  m.d.index.files.push_back({"new.txt", FileChange::Op::put, 3, h(8)});
  m.d.index.files.push_back({"old.txt", FileChange::Op::remove, 0, {}});
  ShardOp so;
  so.file = "other.safetensors";
  so.op = ShardOp::Op::remove;
  m.d.index.shards.push_back(so);
  lv.named = {{"config.json", LocalView::Kind::regular},
              {"new.txt", LocalView::Kind::none},
              {"old.txt", LocalView::Kind::regular},
              {"other.safetensors", LocalView::Kind::regular}};
  const ApplyPlan p = plan_apply(m.d, lv, 1);
  CHECK(p.manifest.shards ==
        std::vector<std::string>{"model.safetensors"});  // the removed file is not patched in place
  REQUIRE(p.manifest.files.size() == 4);
  CHECK(p.manifest.files[0].path == "config.json");
  CHECK(p.manifest.files[0].op == TxnFile::Op::put);
  CHECK(p.manifest.files[0].existed);
  CHECK(p.manifest.files[1].path == "new.txt");
  CHECK_FALSE(p.manifest.files[1].existed);
  CHECK(p.manifest.files[2].path == "old.txt");
  CHECK(p.manifest.files[2].op == TxnFile::Op::remove);
  CHECK(p.manifest.files[2].existed);
  CHECK(p.manifest.files[3].path == "other.safetensors");
  CHECK(p.manifest.files[3].op == TxnFile::Op::remove);

  // The new version's checksum record: the base's with the delta laid over it.
  ChecksumRecord base;
  base.weights["model.safetensors"] = {100, h(1), {{"a", h(2)}, {"b", h(3)}}};
  base.weights["other.safetensors"] = {50, h(4), {{"c", h(5)}}};
  base.files["config.json"] = {9, h(6)};
  base.files["old.txt"] = {1, h(9)};
  const ChecksumRecord next = next_record(base, m.d.index, p);
  CHECK(next.weights.size() == 1);
  CHECK(next.weights.at("model.safetensors").tensors.at("a") == h(100));
  CHECK(next.weights.at("model.safetensors").tensors.at("b") == h(3));
  CHECK(next.files.size() == 2);
  CHECK(next.files.at("config.json").hash == h(7));
  CHECK(next.files.at("new.txt").size == 3);
  CHECK_FALSE(next.files.count("old.txt"));
}
