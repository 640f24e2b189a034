// The sharded publisher's core: pieces from several "ranks" (row ranges,
// column slices, whole tensors, mixed) over two hosts' mirrors, committed as
// one version of parts entries (format revision 6), applied by hosts byte for
// byte to the gathered tensors; plan errors; --inspect and --squash.
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <map>
#include <random>

#include <boost/filesystem/operations.hpp>

#include "hfdelta/apply.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/inspect.hpp"
#include "hfdelta/safetensors.hpp"
#include "hfdelta/sharded_publisher.hpp"
#include "hfdelta/squash.hpp"
#include "hfdelta/verify.hpp"

namespace fs = boost::filesystem;
using namespace hfdelta;

namespace {

struct T {
  std::string name, dtype;
  std::vector<std::uint64_t> shape;
  std::vector<std::uint8_t> bytes;
};

void write_ckpt(const fs::path& dir, const std::vector<T>& ts) {
  fs::create_directories(dir);
  std::vector<TensorSpec> specs;
  for (const T& t : ts) specs.push_back({t.name, t.dtype, t.shape, t.bytes.size()});
  const SafetensorsLayout l = layout_safetensors(specs, nullptr);
  std::vector<char> out(l.file_size);
  std::memcpy(out.data(), l.prefix.data(), l.prefix.size());
  for (const TensorInfo& ti : l.tensors)
    for (const T& t : ts)
      if (t.name == ti.name) std::memcpy(out.data() + l.prefix.size() + ti.begin, t.bytes.data(), t.bytes.size());
  std::ofstream(dir / "model.safetensors", std::ios::binary)
      .write(out.data(), static_cast<std::streamsize>(out.size()));
  std::ofstream(dir / "config.json") << "{}\n";
}

std::vector<std::uint8_t> read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// The region's bytes of a tensor, row-major.
std::vector<std::uint8_t> region_bytes(const T& t, const Region& g) {
  const MatrixShape m = matrix_shape(t.shape, dtype_size(t.dtype));
  std::vector<std::uint8_t> out;
  for (std::uint64_t r = 0; r < g.rows; ++r) {
    const auto* p = t.bytes.data() + ((g.row0 + r) * m.cols + g.col0) * m.es;
    out.insert(out.end(), p, p + g.cols * m.es);
  }
  return out;
}

std::vector<T> base_tensors() {
  std::mt19937 rng(7);
  auto make = [&](std::string n, std::string d, std::vector<std::uint64_t> s) {
    T t{std::move(n), std::move(d), std::move(s), {}};
    std::uint64_t e = 1;
    for (auto x : t.shape) e *= x;
    t.bytes.resize(e * dtype_size(t.dtype));
    for (auto& b : t.bytes) b = static_cast<std::uint8_t>(rng());
    return t;
  };
  return {make("embed.weight", "BF16", {96, 40}), make("qkv.weight", "BF16", {60, 32}),
          make("o.weight", "F32", {32, 30}), make("norm.weight", "BF16", {40}),
          make("big.weight", "BF16", {1100, 1000})};
}

std::vector<T> stepped(std::vector<T> ts, unsigned seed) {
  std::mt19937 rng(seed);
  for (T& t : ts)
    if (t.name != "norm.weight")  // one tensor unchanged
      for (std::size_t i = 0; i < t.bytes.size(); i += 1 + rng() % 7)
        t.bytes[i] = static_cast<std::uint8_t>(t.bytes[i] + 1);
  return ts;
}

// 4 ranks, 2 hosts: rank r's pieces of each tensor.
std::vector<ShardPiece> plan_of(const std::vector<T>& ts) {
  std::vector<ShardPiece> ps;
  for (const T& t : ts) {
    const MatrixShape m = matrix_shape(t.shape, dtype_size(t.dtype));
    if (t.name == "embed.weight" || t.name == "big.weight")  // FSDP: rows split
      for (std::uint32_t r = 0; r < 4; ++r) ps.push_back({t.name, {m.rows * r / 4, m.rows / 4, 0, m.cols}, r});
    else if (t.name == "qkv.weight")  // tensor parallel: column slices
      for (std::uint32_t r = 0; r < 4; ++r) ps.push_back({t.name, {0, m.rows, m.cols * r / 4, m.cols / 4}, r});
    else if (t.name == "o.weight")  // mixed: rows on host 0's ranks, columns by rank
      for (std::uint32_t r = 0; r < 4; ++r) ps.push_back({t.name, {(r / 2) * 16, 16, (r % 2) * 15, 15}, r});
    else
      ps.push_back({t.name, {0, m.rows, 0, m.cols}, 3});  // a pipeline stage's whole tensor
  }
  return ps;
}

struct World {
  fs::path dir, root, mirror[2], host;
  World() : dir(fs::temp_directory_path() / fs::unique_path("hfdelta-sharded-%%%%%%%%")) {
    root = dir / "root";
    mirror[0] = dir / "mirror0", mirror[1] = dir / "mirror1";
    host = dir / "host";
    fs::create_directories(root);
    write_ckpt(dir / "v0", base_tensors());
    ApplyOptions o;
    for (const auto& m : mirror) init_local(dir / "v0", m, 0, o);
    init_local(dir / "v0", host, 0, o);
  }
  ~World() {
    boost::system::error_code ec;
    fs::remove_all(dir, ec);
  }
  // Publishes `ts` from 4 ranks (ranks 0, 1 on mirror 0; 2, 3 on mirror 1).
  ShardCommit publish(const std::vector<T>& ts, Encoding enc, std::uint64_t version) {
    const std::vector<ShardPiece> plan = plan_of(ts);
    check_shard_plan(open_checkpoint(mirror[0]), plan);
    const fs::path stage = make_shard_stage(root, version);
    std::vector<ShardPart> all;
    for (std::uint32_t r = 0; r < 4; ++r) {
      ShardWriter w(mirror[r / 2], stage, r, enc, 3);
      std::uint64_t held = 0;
      for (const ShardPiece& p : plan)
        if (p.rank == r)
          for (const T& t : ts)
            if (t.name == p.name) {
              const auto b = region_bytes(t, p.region);
              held += b.size();
              w.put(t.name, t.dtype, t.shape, p.region, b);
            }
      CHECK(w.mirror_bytes_read() == held);  // its own ranges of the mirror only
      const auto parts = parse_shard_parts(shard_parts_text(w.finish(true)));
      all.insert(all.end(), parts.begin(), parts.end());
    }
    const ShardCommit c = commit_sharded(root, mirror[0], stage, version, version - 1, all, true);
    CHECK(!fs::exists(stage));
    ApplyOptions o;
    for (const auto& m : mirror) apply_delta(c.out, m, o);
    return c;
  }
};

}  // namespace

TEST_CASE("sharded: row, column, whole and mixed pieces land byte for byte on every host") {
  for (const Encoding enc : {Encoding::sparse, Encoding::context, Encoding::xor_bytes}) {
    CAPTURE(encoding_name(enc));
    World w;
    std::vector<T> ts = base_tensors();
    for (std::uint64_t v = 1; v <= 2; ++v) {
      ts = stepped(ts, static_cast<unsigned>(v * 11));
      const ShardCommit c = w.publish(ts, enc, v);
      CHECK(c.out == w.root / ("weight_v00000" + std::to_string(v)));
      CHECK(c.tensors_changed == 4);  // norm.weight unchanged: no entry
      write_ckpt(w.dir / ("new" + std::to_string(v)), ts);
      const auto want = read_all(w.dir / ("new" + std::to_string(v)) / "model.safetensors");
      CHECK(read_all(w.mirror[0] / "model.safetensors") == want);
      CHECK(read_all(w.mirror[1] / "model.safetensors") == want);
      const DeltaInspection di = inspect_delta(c.out);
      CHECK(di.format == std::optional<std::uint64_t>(6));
    }
    ApplyOptions o;
    pull(w.root, w.host, std::nullopt, o);  // a host two versions behind
    CHECK(read_all(w.host / "model.safetensors") == read_all(w.dir / "new2" / "model.safetensors"));
    CHECK(local_status(w.host, o).version == std::optional<std::uint64_t>(2));
    const VerifyReport vr = verify_local(w.host, -1, 0);  // the record holds the whole tensors' checksums
    CHECK(vr.state == VerifyReport::State::clean);
    CHECK(vr.problems.empty());
    // --squash refuses a chain with parts entries
    const auto e = [&]() -> std::optional<Error> {
      try {
        SquashOptions so;
        squash_deltas(chain_between(w.root / "weight_v000001", w.root / "weight_v000002"), w.dir / "sq", so);
      } catch (const Error& x) {
        return x;
      }
      return std::nullopt;
    }();
    REQUIRE(e);
    // Refused; the chain check (which takes a parts entry's head checksum for
    // the tensor's) comes before the refusal naming the parts entry.
    CAPTURE(std::string(e->what()));
    CHECK(std::string(e->what()).find("nothing was written") != std::string::npos);
  }
}

TEST_CASE("sharded: a gap, an overlap or an unknown tensor in the plan is refused") {
  World w;
  const Checkpoint c = open_checkpoint(w.mirror[0]);
  std::vector<ShardPiece> plan = plan_of(base_tensors());
  auto err = [&](const std::vector<ShardPiece>& p) -> std::string {
    try {
      check_shard_plan(c, p);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  CHECK(err(plan).empty());
  auto gap = plan;
  gap.erase(gap.begin());
  CHECK(err(gap).find("a gap") != std::string::npos);
  auto over = plan;
  over.push_back(over.front());
  over.back().rank = 2;
  CHECK(err(over).find("overlap") != std::string::npos);
  auto unknown = plan;
  unknown.push_back({"nope", {0, 1, 0, 1}, 1});
  CHECK(err(unknown).find("not in the mirror") != std::string::npos);
  // a wrong dtype at the writer
  const fs::path stage = make_shard_stage(w.root, 1);
  ShardWriter wr(w.mirror[0], stage, 0, Encoding::sparse, 3);
  const std::vector<std::uint64_t> shape{40};
  std::vector<std::uint8_t> b(160);
  CHECK_THROWS_AS(wr.put("norm.weight", "F32", shape, {0, 40, 0, 1}, b), Error);
}
