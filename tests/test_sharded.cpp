// The sharded publisher's core: pieces from several "ranks" (row ranges,
// column slices, whole tensors, mixed) over two hosts' mirrors, committed as
// one version of parts entries (format revision 6), applied by hosts byte for
// byte to the gathered tensors; plan errors; --inspect and --squash; a
// piece written while its rank reads it.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>

#include <boost/filesystem/operations.hpp>

#include "delta/delta_format_internal.hpp"
#include "format/completion_marker.hpp"
#include "hfdelta/apply.hpp"
#include "hfdelta/diff.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/inspect.hpp"
#include "hfdelta/root.hpp"
#include "hfdelta/safetensors.hpp"
#include "hfdelta/sharded_publisher.hpp"
#include "hfdelta/squash.hpp"
#include "hfdelta/verify.hpp"
#include "hfdelta/version.hpp"

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

// The same tensors in two weight files (the first `first` in one), with the
// index that maps them: another layout of one checkpoint.
void write_ckpt_split(const fs::path& dir, const std::vector<T>& ts, std::size_t first) {
  const std::vector<T> a(ts.begin(), ts.begin() + static_cast<std::ptrdiff_t>(first)),
      b(ts.begin() + static_cast<std::ptrdiff_t>(first), ts.end());
  write_ckpt(dir, a);
  fs::rename(dir / "model.safetensors", dir / "model-00001-of-00002.safetensors");
  write_ckpt(dir / "b", b);
  fs::rename(dir / "b" / "model.safetensors", dir / "model-00002-of-00002.safetensors");
  fs::remove_all(dir / "b");
  std::string map;
  for (std::size_t i = 0; i < ts.size(); ++i)
    map += std::string(i ? "," : "") + "\"" + ts[i].name + "\": \"model-0000" + (i < first ? "1" : "2") +
           "-of-00002.safetensors\"";
  std::ofstream(dir / "model.safetensors.index.json") << "{\"metadata\": {}, \"weight_map\": {" << map << "}}\n";
}

std::vector<std::uint8_t> read_all(const fs::path& p) {
  std::vector<std::uint8_t> out(static_cast<std::size_t>(fs::file_size(p)));
  std::ifstream(p, std::ios::binary)
      .read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size()));
  return out;
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

// 4 ranks, 2 hosts: rank r's pieces of each tensor. Layout 1 (a trainer
// restarted on other ranks) splits the FSDP tensors otherwise: regions that
// overlap layout 0's partly.
std::vector<ShardPiece> plan_of(const std::vector<T>& ts, int layout = 0) {
  std::vector<ShardPiece> ps;
  for (const T& t : ts) {
    const MatrixShape m = matrix_shape(t.shape, dtype_size(t.dtype));
    if (layout == 1 && t.name == "big.weight")  // rows in three
      for (std::uint32_t r = 0; r < 3; ++r)
        ps.push_back({t.name, {m.rows * r / 3, m.rows * (r + 1) / 3 - m.rows * r / 3, 0, m.cols}, r});
    else if (layout == 1 && t.name == "embed.weight")  // columns in two
      for (std::uint32_t r = 0; r < 2; ++r) ps.push_back({t.name, {0, m.rows, m.cols * r / 2, m.cols / 2}, r + 2});
    else if (t.name == "embed.weight" || t.name == "big.weight")  // FSDP: rows split
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
  ShardCommit publish(const std::vector<T>& ts, Encoding enc, std::uint64_t version, int layout = 0) {
    const std::vector<ShardPiece> plan = plan_of(ts, layout);
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

void copy_directory_tree(const fs::path& from, const fs::path& to) {
  fs::create_directories(to);
  for (const auto& e : fs::recursive_directory_iterator(from)) {
    const fs::path rel = fs::relative(e.path(), from);
    if (fs::is_directory(e.path()))
      fs::create_directories(to / rel);
    else
      fs::copy_file(e.path(), to / rel);
  }
}

// The checkpoint of `ts` at DIR/NAME (once), its path.
fs::path saved(const World& w, const std::string& name, const std::vector<T>& ts) {
  const fs::path d = w.dir / name;
  if (!fs::exists(d)) write_ckpt(d, ts);
  return d;
}

// `delta-diff BASE NEW ROOT` as version `v` on v - 1, ROOT's base check
// included; both mirrors advanced to it.
void diff_version(World& w, const fs::path& base, const fs::path& next, std::uint64_t v) {
  DiffOptions o;
  o.version = v;
  o.base_version = v - 1;
  o.root = w.root;
  o.sync = false;
  diff_checkpoints(base, next, w.root / version_dirname(v), o);
  ApplyOptions a;
  for (const auto& m : w.mirror) apply_delta(w.root / version_dirname(v), m, a);
}

// FIRST..LAST of ROOT squashed into DIR/NAME/weight_vLAST.
fs::path squash(const World& w, std::uint64_t first, std::uint64_t last, const std::string& name,
                std::optional<fs::path> base = std::nullopt) {
  const fs::path out = w.dir / name / version_dirname(last);
  fs::create_directories(out.parent_path());
  SquashOptions so;
  so.sync = false;
  so.base = base;
  squash_deltas(chain_between(w.root / version_dirname(first), w.root / version_dirname(last)), out, so);
  return out;
}

// A copy of version 0 at DIR/NAME with `delta` applied: its weight file.
std::vector<std::uint8_t> applied_on_base(const World& w, const fs::path& delta, const std::string& name) {
  ApplyOptions o;
  init_local(w.dir / "v0", w.dir / name, 0, o);
  apply_delta(delta, w.dir / name, o);
  CHECK(verify_local(w.dir / name, -1, 0).state == VerifyReport::State::clean);
  return read_all(w.dir / name / "model.safetensors");
}

int code_of(const std::function<void()>& f, std::string* what = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (what) *what = e.what();
    return static_cast<int>(e.code());
  }
  return 0;
}

std::size_t count_of(const DeltaInspection& di, Encoding enc) {
  return static_cast<std::size_t>(
      std::count_if(di.entries.begin(), di.entries.end(), [&](const InspectEntry& e) { return e.encoding == enc; }));
}
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

TEST_CASE("sharded: --squash of sharded versions, on the chain's base, lands byte for byte where the chain does") {
  World w;
  std::vector<T> ts = base_tensors();
  // Three versions in three encodings, the second on other regions.
  const Encoding encs[] = {Encoding::sparse, Encoding::context, Encoding::xor_bytes};
  for (std::uint64_t v = 1; v <= 3; ++v) {
    ts = stepped(ts, static_cast<unsigned>(v * 13));
    w.publish(ts, encs[v - 1], v, v == 2 ? 1 : 0);
  }
  const auto want = read_all(saved(w, "new3", ts) / "model.safetensors");
  REQUIRE(read_all(w.mirror[0] / "model.safetensors") == want);  // the chain, version by version

  // Without the base: each parts entry a stacked layer of its own.
  const fs::path sq = squash(w, 1, 3, "sq");
  const DeltaInspection di = inspect_delta(sq);
  CHECK(di.format == std::optional<std::uint64_t>(6));
  CHECK(count_of(di, Encoding::stack) == 4);
  for (const InspectEntry& e : di.entries) CHECK(e.pieces == 3);
  CHECK(applied_on_base(w, sq, "host-sq") == want);
  // Squashed twice over: 1..2, then that and version 3 (a stack's parts layers read back).
  const fs::path sq12 = squash(w, 1, 2, "sq12");
  copy_directory_tree(w.root / version_dirname(3), sq12.parent_path() / version_dirname(3));
  SquashOptions so;
  so.sync = false;
  const fs::path sq123 = w.dir / "sq123" / version_dirname(3);
  fs::create_directories(sq123.parent_path());
  squash_deltas(chain_between(sq12, sq12.parent_path() / version_dirname(3)), sq123, so);
  CHECK(inspect_delta(sq123).format == std::optional<std::uint64_t>(6));
  CHECK(applied_on_base(w, sq123, "host-sq123") == want);

  // With the base: composed against its bytes into one context entry each.
  const fs::path sqb = squash(w, 1, 3, "sqb", w.dir / "v0");
  const DeltaInspection dib = inspect_delta(sqb);
  CHECK(dib.format == std::optional<std::uint64_t>(5));
  CHECK(count_of(dib, Encoding::context) == 4);
  CHECK(applied_on_base(w, sqb, "host-sqb") == want);
}

TEST_CASE("sharded: --squash of a chain mixing delta-diff and sharded versions") {
  World w;
  std::vector<T> ts = stepped(base_tensors(), 21);
  w.publish(ts, Encoding::sparse, 1);
  const fs::path new1 = saved(w, "new1", ts);
  ts = stepped(ts, 22);
  diff_version(w, new1, saved(w, "new2", ts), 2);  // ROOT's base check passes: BASE holds every region
  ts = stepped(ts, 23);
  w.publish(ts, Encoding::context, 3);
  const fs::path new3 = saved(w, "new3", ts);
  ts = stepped(ts, 24);
  diff_version(w, new3, saved(w, "new4", ts), 4);
  const auto want = read_all(w.dir / "new4" / "model.safetensors");
  REQUIRE(read_all(w.mirror[1] / "model.safetensors") == want);
  for (const auto& range : {std::pair{1, 4}, std::pair{1, 3}, std::pair{2, 4}, std::pair{2, 3}}) {
    const int first = range.first, last = range.second;  // not a structured binding: clang 14's CAPTURE refuses those
    CAPTURE(first);
    CAPTURE(last);
    const std::string name = "sq" + std::to_string(first) + std::to_string(last);
    const fs::path sq = squash(w, first, last, name);
    CHECK(inspect_delta(sq).format == std::optional<std::uint64_t>(6));
    ApplyOptions o;
    init_local(w.dir / "v0", w.dir / ("host-" + name), 0, o);
    for (std::uint64_t v = 1; v < static_cast<std::uint64_t>(first); ++v)
      apply_delta(w.root / version_dirname(v), w.dir / ("host-" + name), o);
    apply_delta(sq, w.dir / ("host-" + name), o);
    CHECK(verify_local(w.dir / ("host-" + name), -1, 0).state == VerifyReport::State::clean);
    // The chain applied version by version up to LAST on a second host.
    init_local(w.dir / "v0", w.dir / ("chain-" + name), 0, o);
    for (std::uint64_t v = 1; v <= static_cast<std::uint64_t>(last); ++v)
      apply_delta(w.root / version_dirname(v), w.dir / ("chain-" + name), o);
    CHECK(read_all(w.dir / ("host-" + name) / "model.safetensors") ==
          read_all(w.dir / ("chain-" + name) / "model.safetensors"));
  }
  CHECK(read_all(w.dir / "host-sq14" / "model.safetensors") == want);
  // And composed against the base.
  CHECK(applied_on_base(w, squash(w, 1, 4, "sqb", w.dir / "v0"), "host-sqb") == want);
}

TEST_CASE("sharded: delta-diff into a root whose newest version is sharded checks BASE's regions") {
  World w;
  std::vector<T> ts = stepped(base_tensors(), 31);
  w.publish(ts, Encoding::sparse, 1);
  const fs::path new1 = saved(w, "new1", ts);
  const fs::path new2 = saved(w, "new2", stepped(ts, 32));
  DiffOptions o;
  o.version = 2;
  o.base_version = 1;
  o.root = w.root;
  o.sync = false;
  const fs::path out = w.root / version_dirname(2);
  // A stale BASE (the save before the sharded version): every region differs.
  std::string what;
  CHECK(code_of([&] { diff_checkpoints(w.dir / "v0", new2, out, o); }, &what) == 5);
  CAPTURE(what);
  CHECK(what.find("nothing was published") != std::string::npos);
  CHECK(what.find("the version's part is") != std::string::npos);
  CHECK(!fs::exists(out));
  // One byte off in one region of one tensor (a column slice of qkv.weight).
  std::vector<T> off = ts;
  for (T& t : off)
    if (t.name == "qkv.weight") t.bytes[t.bytes.size() - 1] ^= 1;
  CHECK(code_of([&] { diff_checkpoints(saved(w, "off1", off), new2, out, o); }, &what) == 5);
  CHECK(what.find("tensor 'qkv.weight', rows 0..60 x columns 24..32") != std::string::npos);
  CHECK(!fs::exists(out));
  // The right BASE publishes.
  CHECK(code_of([&] { diff_checkpoints(new1, new2, out, o); }) == 0);
  CHECK(fs::exists(out));
}

TEST_CASE("sharded: a squashed version ending in parts entries is a base delta-diff checks region by region") {
  World w;
  std::vector<T> ts = base_tensors();
  for (std::uint64_t v = 1; v <= 2; ++v) {
    ts = stepped(ts, static_cast<unsigned>(v * 41));
    w.publish(ts, Encoding::sparse, v, static_cast<int>(v % 2));  // layouts 1, then 0: regions overlap partly
  }
  // The squash published as version 2 of a root of its own.
  const fs::path sq = squash(w, 1, 2, "sqroot");
  const fs::path new2 = saved(w, "new2", ts), new3 = saved(w, "new3", stepped(ts, 43));
  DiffOptions o;
  o.version = 3;
  o.base_version = 2;
  o.root = sq.parent_path();
  o.sync = false;
  const fs::path out = o.root / version_dirname(3);
  std::vector<T> off = ts;  // big.weight's last row: in the last of version 2's regions
  for (T& t : off)
    if (t.name == "big.weight") t.bytes[t.bytes.size() - 3] ^= 4;
  std::string what;
  CHECK(code_of([&] { diff_checkpoints(saved(w, "off", off), new3, out, o); }, &what) == 5);
  CAPTURE(what);
  CHECK(what.find("tensor 'big.weight'") != std::string::npos);
  CHECK(code_of([&] { diff_checkpoints(new2, new3, out, o); }) == 0);
}

TEST_CASE("sharded: --squash refuses a chain that does not connect where it can tell; hosts refuse the rest") {
  World w;
  std::vector<T> ts = stepped(base_tensors(), 51);
  w.publish(ts, Encoding::sparse, 1);
  const fs::path new2 = saved(w, "new2", stepped(ts, 52));
  // Version 2 diffed from the save before version 1 (a retried job),
  // published past ROOT's base check: its base is what version 1 changed.
  DiffOptions o;
  o.version = 2;
  o.base_version = 1;
  o.sync = false;
  diff_checkpoints(w.dir / "v0", new2, w.root / version_dirname(2), o);
  std::string what;
  const fs::path out = w.dir / "sq" / version_dirname(2);
  fs::create_directories(out.parent_path());
  SquashOptions so;
  so.sync = false;
  const auto chain = chain_between(w.root / version_dirname(1), w.root / version_dirname(2));
  CHECK(code_of([&] { squash_deltas(chain, out, so); }, &what) == 3);
  CAPTURE(what);
  CHECK(what.find("before the parts entry of version 000001 changed them") != std::string::npos);
  CHECK(what.find("nothing was written") != std::string::npos);
  CHECK(!fs::exists(out));

  // Version 2 diffed from a save one byte off version 1's: the deltas
  // cannot tell (version 1 records no checksum of the tensor).
  fs::remove_all(w.root / version_dirname(2));
  std::vector<T> off = ts;
  for (T& t : off)
    if (t.name == "o.weight") t.bytes[5] ^= 1;
  diff_checkpoints(saved(w, "off1", off), new2, w.root / version_dirname(2), o);
  // The base checkpoint can: every entry laid over its bytes, hashed after each.
  so.base = w.dir / "v0";
  CHECK(code_of([&] { squash_deltas(chain, out, so); }, &what) == 5);
  CHECK(what.find("o.weight") != std::string::npos);
  CHECK(!fs::exists(out));
  // Without it the squash is written, and a host refuses it: the stacked
  // part after the parts entry does not end at its checksum.
  so.base.reset();
  squash_deltas(chain, out, so);
  ApplyOptions ao;
  init_local(w.dir / "v0", w.dir / "host2", 0, ao);
  const auto before = read_all(w.dir / "host2" / "model.safetensors");
  CHECK(code_of([&] { apply_delta(out, w.dir / "host2", ao); }, &what) == 5);
  CHECK(what.find("o.weight") != std::string::npos);
  CHECK(read_all(w.dir / "host2" / "model.safetensors") == before);
  CHECK(local_status(w.dir / "host2", ao).version == std::optional<std::uint64_t>(0));
}

TEST_CASE("sharded: a squash's stacked parts layer damaged, or in an index of revision 5, is refused with exit 3") {
  World w;
  std::vector<T> ts = base_tensors();
  for (std::uint64_t v = 1; v <= 2; ++v) {
    ts = stepped(ts, static_cast<unsigned>(v * 61));
    w.publish(ts, Encoding::sparse, v);
  }
  const fs::path sq = squash(w, 1, 2, "sq");
  ApplyOptions o;
  init_local(w.dir / "v0", w.dir / "host", 0, o);
  const auto before = read_all(w.dir / "host" / "model.safetensors");
  auto refused = [&](const fs::path& delta, const std::string& why) {
    std::string what;
    CHECK(code_of([&] { apply_delta(delta, w.dir / "host", o); }, &what) == 3);
    CAPTURE(what);
    CHECK(what.find(why) != std::string::npos);
    CHECK(code_of([&] { inspect_delta(delta); }) == 3);
    CHECK(read_all(w.dir / "host" / "model.safetensors") == before);
  };
  // The index sealed anew at revision 5.
  const fs::path r5 = w.dir / "r5" / version_dirname(2);
  copy_directory_tree(sq, r5);
  {
    std::ifstream in(r5 / "model.safetensors.index.json");
    std::string text{std::istreambuf_iterator<char>(in), {}};
    const std::size_t at = text.find("\"hfdelta_format\": 6");
    REQUIRE(at != std::string::npos);
    text.replace(at, 19, "\"hfdelta_format\": 5");
    std::ofstream(r5 / "model.safetensors.index.json", std::ios::trunc) << seal_delta_index(text);
  }
  refused(r5, "needs hfdelta_format 6");
  // A byte of the first stacked layer's head (a parts entry's region) changed.
  const fs::path bad = w.dir / "bad" / version_dirname(2);
  copy_directory_tree(sq, bad);
  const SafetensorsHeader h = read_safetensors(bad / "model-00000-of-00001.safetensors");
  const TensorInfo* t = h.find("big.weight");
  REQUIRE(t);
  {
    std::fstream f(bad / "model-00000-of-00001.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(h.file_offset(*t) + 8 + 2 * 32 + 32 + 8));  // part 1's record 0: rows
    f.put(1);
  }
  {  // sealed as its publisher would, so that the parts' own check answers, not the marker's
    const Completeness c = check_complete(bad, false);
    REQUIRE(c.marker);
    fs::remove(bad / kCompleteFile);
    write_marker(bad, c.marker->version, c.marker->full, false, 1);
  }
  refused(bad, "head does not match");
  CHECK(local_status(w.dir / "host", o).version == std::optional<std::uint64_t>(0));
  apply_delta(sq, w.dir / "host", o);  // the undamaged one applies
  CHECK(read_all(w.dir / "host" / "model.safetensors") == read_all(saved(w, "new2", ts) / "model.safetensors"));
}

TEST_CASE("sharded: --squash across a layout change after a sharded version: on the base, or refused") {
  World w;
  std::vector<T> ts = stepped(base_tensors(), 71);
  w.publish(ts, Encoding::sparse, 1);
  const fs::path new1 = saved(w, "new1", ts);
  const std::vector<T> ts1 = ts;
  ts = stepped(ts, 72);
  for (std::size_t i = 0; i < ts.size(); ++i)
    if (ts[i].name == "o.weight") ts[i] = ts1[i];  // its only entry: version 1's parts entry
  const fs::path new2 = w.dir / "new2";
  write_ckpt_split(new2, ts, 3);
  diff_version(w, new1, new2, 2);  // builds both files: the tensors move
  // The parts entries' tensors land in built files: without the base their
  // last checksum would be a parts head's, which a built file cannot hold.
  std::string what;
  CHECK(code_of([&] { squash(w, 1, 2, "sq"); }, &what) == 6);
  CAPTURE(what);
  CHECK(what.find("which the squashed delta builds") != std::string::npos);
  const fs::path sq = squash(w, 1, 2, "sqb", w.dir / "v0");
  ApplyOptions o;
  init_local(w.dir / "v0", w.dir / "host", 0, o);
  apply_delta(sq, w.dir / "host", o);
  CHECK(verify_local(w.dir / "host", -1, 0).state == VerifyReport::State::clean);
  for (const char* f : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"})
    CHECK(read_all(w.dir / "host" / f) == read_all(new2 / f));
  CHECK(!fs::exists(w.dir / "host" / "model.safetensors"));
}

namespace {

// A trainer writing into its piece while put() reads it, made deterministic:
// the piece is watched in regions of the writer's batch (32 MiB), all but the
// first kept unreadable, and the first read of each (a SIGSEGV) stands for
// the trainer's step landing right then: it writes one byte in every region
// (those already read included), then the read goes on.
struct LivePiece {
  std::uint8_t* p = nullptr;
  std::size_t n = 0, region = 0, at = 0;  // at: the byte of each region the step writes
  int steps = 0;
  std::size_t regions() const { return (n + region - 1) / region; }
  void protect(std::size_t j, int prot) const {
    const std::size_t begin = j * region, end = std::min(n, begin + region);
    ::mprotect(p + begin, end - begin, prot);
  }
};
LivePiece* g_live = nullptr;

void on_read(int, siginfo_t* si, void*) {
  LivePiece& l = *g_live;
  const auto* a = static_cast<const std::uint8_t*>(si->si_addr);
  if (a < l.p || a >= l.p + l.n) {  // a real fault: crash as without this handler
    ::signal(SIGSEGV, SIG_DFL);
    return;
  }
  const std::size_t k = static_cast<std::size_t>(a - l.p) / l.region;
  l.protect(k, PROT_READ | PROT_WRITE);
  for (std::size_t j = 0; j < l.regions(); ++j) {
    if (j > k) l.protect(j, PROT_READ | PROT_WRITE);
    ++l.p[j * l.region + l.at];
    if (j > k) l.protect(j, PROT_NONE);
  }
  ++l.steps;
}

// The watch on: regions 1.. unreadable, on_read the SIGSEGV handler; off
// again (everything readable, the handler before) at the end of the scope.
struct Watch {
  struct sigaction before = {};
  explicit Watch(LivePiece& l) {
    g_live = &l;
    for (std::size_t j = 1; j < l.regions(); ++j) l.protect(j, PROT_NONE);
    struct sigaction sa = {};
    sa.sa_sigaction = on_read;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGSEGV, &sa, &before);
  }
  ~Watch() {
    ::sigaction(SIGSEGV, &before, nullptr);
    for (std::size_t j = 0; j < g_live->regions(); ++j) g_live->protect(j, PROT_READ | PROT_WRITE);
  }
};

// n bytes of a fixed pseudo-random pattern.
std::vector<std::uint8_t> pattern(std::size_t n, std::uint64_t seed) {
  std::vector<std::uint8_t> out(n);
  for (std::size_t i = 0; i < n; i += 8) {
    std::uint64_t z = seed + i * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 31)) * 0x94d049bb133111ebull;
    std::memcpy(out.data() + i, &z, std::min<std::size_t>(8, n - i));
  }
  return out;
}

}  // namespace

// What a sharded rank publishes must be one read of each byte: its part's
// checksum of the very bytes it encoded, whatever the trainer writes
// meanwhile. (Reading the piece twice, once to encode and once to hash,
// published versions every host refused, exit 5.)
TEST_CASE("sharded: a piece written while its rank reads it publishes a version every host applies") {
  // 80 MiB: two and a half of the writer's batches.
  constexpr std::size_t kRegion = 32u << 20, kRows = 80, kCols = 1u << 19, kBytes = kRows * kCols * 2;
  const fs::path dir = fs::temp_directory_path() / fs::unique_path("hfdelta-sharded-live-%%%%%%%%");
  struct Cleanup {
    fs::path d;
    ~Cleanup() {
      boost::system::error_code ec;
      fs::remove_all(d, ec);
    }
  } cleanup{dir};
  const T base{"w.weight", "BF16", {kRows, kCols}, pattern(kBytes, 1)};
  write_ckpt(dir / "v0", {base});
  std::vector<std::uint8_t> step = base.bytes;  // the trainer's step: one element in 500 moved
  for (std::size_t i = 0; i < kBytes; i += 1000) ++step[i + 1];

  void* mem = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(mem != MAP_FAILED);
  struct Unmap {
    void* m;
    ~Unmap() { ::munmap(m, kBytes); }
  } unmap{mem};
  LivePiece live{static_cast<std::uint8_t*>(mem), kBytes, kRegion, 12346, 0};

  for (const Encoding enc : {Encoding::sparse, Encoding::context, Encoding::xor_bytes}) {
    CAPTURE(encoding_name(enc));
    const fs::path at = dir / std::string(encoding_name(enc)), root = at / "root", mirror = at / "mirror",
                   host = at / "host";
    fs::create_directories(root);
    ApplyOptions o;
    o.sync = false;
    init_local(dir / "v0", mirror, 0, o);
    init_local(dir / "v0", host, 0, o);

    std::memcpy(live.p, step.data(), kBytes);
    live.steps = 0;
    const fs::path stage = make_shard_stage(root, 1);
    std::vector<ShardPart> parts;
    {
      const Watch watch(live);
      ShardWriter w(mirror, stage, 0, enc, 3);
      const std::vector<std::uint64_t> shape{kRows, kCols};
      w.put(base.name, base.dtype, shape, {0, kRows, 0, kCols}, {live.p, kBytes});
      parts = w.finish(false);
    }
    CHECK(live.steps == 2);  // as regions 1 and 2 were first read

    // Each region as it was when read: region j after j of the trainer's steps.
    std::vector<std::uint8_t> read = step;
    for (std::size_t j = 0; j < live.regions(); ++j) read[j * kRegion + live.at] += static_cast<std::uint8_t>(j);
    REQUIRE(parts.size() == 1);
    CHECK(parts[0].hash == xxh3_128(read));  // the checksum is of the bytes encoded

    // Every host applies it, the mirror too (the advance publish() makes).
    const ShardCommit c = commit_sharded(root, mirror, stage, 1, 0, parts, false);
    std::string what;
    CHECK_MESSAGE(code_of([&] { apply_delta(c.out, host, o); }, &what) == 0, what);
    CHECK_MESSAGE(code_of([&] { apply_delta(c.out, mirror, o); }, &what) == 0, what);
    const Checkpoint h = open_checkpoint(host);
    const std::size_t off = h.shards[0].header.file_offset(h.info(h.tensors.at(base.name)));
    const auto got = read_all(host / "model.safetensors");
    REQUIRE(got.size() == off + kBytes);
    CHECK(std::memcmp(got.data() + off, read.data(), kBytes) == 0);
    CHECK(read_all(mirror / "model.safetensors") == got);
    CHECK(verify_local(host, -1, 0).state == VerifyReport::State::clean);
  }
}
