// End-to-end: the publisher fed from memory (hfdelta/publisher.hpp), driven
// through the library with the tensors of a real save mapped into memory,
// against delta-diff on the same save. The Python tests drive it from numpy
// arrays and kill it; these pin the library's contract.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>

#include "e2e_util.hpp"
#include "hfdelta/checkpoint.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/progress.hpp"
#include "hfdelta/publisher.hpp"
#include "util/io.hpp"

using namespace e2e;

namespace {

hfdelta::PublisherOptions options(const std::string& encoding, bool background = false) {
  hfdelta::PublisherOptions o;
  o.encoding = encoding == "auto" ? std::nullopt : std::optional(hfdelta::parse_encoding(encoding));
  o.sync = false;
  o.background = background;
  return o;
}

// Gives every tensor of checkpoint `dir`, in a shuffled order, from its mapping.
void put_checkpoint(hfdelta::MemoryPublisher& p, const fs::path& dir, unsigned seed, std::size_t skip_last = 0) {
  const hfdelta::Checkpoint c = hfdelta::open_checkpoint(dir);
  std::vector<hfdelta::MappedFile> maps;
  for (const auto& s : c.shards) maps.emplace_back(dir / s.file);
  std::vector<std::pair<std::size_t, const hfdelta::TensorInfo*>> all;
  for (std::size_t s = 0; s < c.shards.size(); ++s)
    for (const auto& t : c.shards[s].header.tensors) all.emplace_back(s, &t);
  std::shuffle(all.begin(), all.end(), std::mt19937(seed));
  for (std::size_t i = 0; i + skip_last < all.size(); ++i) {
    const auto& [s, t] = all[i];
    p.put({t->name, t->dtype, t->shape, maps[s].bytes(c.shards[s].header.file_offset(*t), t->nbytes())});
  }
}

// ROOT (empty) and MIRROR (save 0 of `series`) under `t`.
std::pair<fs::path, fs::path> root_and_mirror(const TempDir& t, const fs::path& series) {
  const fs::path root = t / "root", mirror = t / "mirror";
  fs::create_directories(root);
  require_init(save_dir(series, 0), mirror);
  return {root, mirror};
}

}  // namespace

TEST_CASE("publisher: the delta is byte for byte delta-diff's, for every encoding; the mirror advances") {
  TempDir t;
  const fs::path series = gen_series(t / "series", 2);
  for (const std::string enc : {"sparse", "context", "auto", "xor", "overwrite"}) {
    CAPTURE(enc);
    const fs::path root = t / ("root-" + enc), ref = t / ("ref-" + enc), mirror = t / ("mirror-" + enc);
    fs::create_directories(root);
    fs::create_directories(ref);
    require_init(save_dir(series, 0), mirror);
    {
      hfdelta::MemoryPublisher p(root, mirror, options(enc, true));
      CHECK(p.version() == 0);
      put_checkpoint(p, save_dir(series, 1), 7);
      const hfdelta::PublishSummary s = p.publish(false);
      CHECK(s.out == version_dir(root, 1));
      CHECK(s.diff.tensors_changed > 0);
      CHECK(p.version() == 1);
      REQUIRE(p.wait());
    }
    require_diff(save_dir(series, 0), save_dir(series, 1), version_dir(ref, 1), enc);
    E2E_CHECK_TREE_EQUAL(version_dir(root, 1), version_dir(ref, 1));
    E2E_CHECK_TREE_EQUAL(mirror, save_dir(series, 1));
    CHECK(state_version(mirror) == "000001");
    E2E_REQUIRE_CODE(apply({"--verify", mirror.string()}), 0);
  }
}

TEST_CASE("publisher: a version with tensors neither given nor declared unchanged, or unknown, is not published") {
  TempDir t;
  const fs::path series = gen_series(t / "series", 1);
  const auto rm = root_and_mirror(t, series);  // not a structured binding: lambdas capture these
  const fs::path &root = rm.first, &mirror = rm.second;
  hfdelta::MemoryPublisher p(root, mirror, options("sparse"));
  put_checkpoint(p, save_dir(series, 1), 1, 1);  // all but one
  CHECK(code_of([&] { p.publish(false); }) == static_cast<int>(hfdelta::Exit::usage));
  CHECK(list_names(root).empty() == false);  // the step's temporary directory, still open
  const std::vector<std::uint8_t> two(2);
  const std::vector<std::uint64_t> shape{1};
  CHECK(code_of([&] {
          p.put({"no.such.tensor", "BF16", shape, two});
        }) == static_cast<int>(hfdelta::Exit::unsupported));
  p.abort();
  CHECK(list_names(root).empty());
  // all but one, the rest declared unchanged: published
  put_checkpoint(p, save_dir(series, 1), 1, 1);
  const hfdelta::PublishSummary s = p.publish(true);
  CHECK(s.tensors_declared_unchanged == 1);
  CHECK(list_names(root) == std::vector<std::string>{"weight_v000001"});
}

TEST_CASE("publisher: opening catches a mirror up from ROOT, and refuses a root behind it") {
  TempDir t;
  const fs::path series = gen_series(t / "series", 2);
  const auto rm = root_and_mirror(t, series);  // not a structured binding: lambdas capture these
  const fs::path &root = rm.first, &mirror = rm.second;
  require_diff(save_dir(series, 0), save_dir(series, 1), version_dir(root, 1), "sparse");
  require_diff(save_dir(series, 1), save_dir(series, 2), version_dir(root, 2), "sparse");
  {
    hfdelta::MemoryPublisher p(root, mirror, options("sparse"));
    CHECK(p.opening().caught_up == std::vector<std::uint64_t>{1, 2});
    CHECK(p.version() == 2);
  }
  E2E_CHECK_TREE_EQUAL(mirror, save_dir(series, 2));
  const fs::path empty = t / "empty";
  fs::create_directories(empty);
  CHECK(code_of([&] { hfdelta::MemoryPublisher p(empty, mirror, options("sparse")); }) ==
        static_cast<int>(hfdelta::Exit::out_of_order));
  // a second publisher on the same mirror waits, then gives up
  hfdelta::MemoryPublisher p(root, mirror, options("sparse"));
  hfdelta::PublisherOptions o = options("sparse");
  o.lock_timeout = 0.1;
  CHECK(code_of([&] { hfdelta::MemoryPublisher q(root, mirror, o); }) == static_cast<int>(hfdelta::Exit::lock_timeout));
}

TEST_CASE(
    "publisher: tensors larger than a chunk, split over threads, across versions: delta-diff's bytes, progress whole") {
  // The tiny preset's tensors are all below one sparse chunk (1M elements);
  // these are cut into ranges of chunks and hashed in a unit of their own.
  TempDir t;
  auto make = [&](const fs::path& dir, unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<TensorData> ts;
    auto add = [&](const std::string& name, const std::string& dtype, std::vector<std::uint64_t> shape,
                   std::size_t es) {
      std::uint64_t n = 1;
      for (auto d : shape) n *= d;
      Bytes b(n * es);
      std::mt19937 base_rng(7);  // the same base in every version, changed below
      for (auto& x : b) x = static_cast<std::uint8_t>(base_rng());
      for (std::uint64_t i = 0; i < n / 100; ++i) b[(rng() % n) * es] ^= 1;  // about 1% of the elements
      ts.push_back({name, dtype, std::move(shape), std::move(b)});
    };
    add("big.bf16", "BF16", {4096, 1100}, 2);          // 4.5M elements, 5 chunks
    add("big.f32", "F32", {3 * 1024 * 1024 + 17}, 4);  // odd length
    add("small", "BF16", {1000}, 2);
    write_safetensors(dir / "model.safetensors", ts);
    write_file(dir / "config.json", "{}\n");
  };
  std::vector<fs::path> saves;
  for (unsigned v = 0; v < 3; ++v) {
    saves.push_back(t / ("save" + std::to_string(v)));
    make(saves.back(), v);
  }
  for (const std::string enc : {"sparse", "context", "auto"}) {
    CAPTURE(enc);
    const fs::path root = t / ("root-" + enc), ref = t / ("ref-" + enc), mirror = t / ("mirror-" + enc);
    fs::create_directories(root);
    fs::create_directories(ref);
    require_init(saves[0], mirror);
    hfdelta::PublisherOptions o = options(enc);
    o.threads = 2;
    hfdelta::MemoryPublisher p(root, mirror, o);
    for (int v = 1; v <= 2; ++v) {
      CAPTURE(v);
      put_checkpoint(p, saves[static_cast<std::size_t>(v)], static_cast<unsigned>(v));
      const hfdelta::progress::Snapshot s = hfdelta::progress::snapshot();
      CHECK(std::string(s.what) == "publish");
      CHECK(s.done == s.total);
      p.publish(false);
      E2E_REQUIRE_CODE(
          diff({"-q", "--no-sync", "--threads", "2", "--encoding", enc, saves[static_cast<std::size_t>(v - 1)].string(),
                saves[static_cast<std::size_t>(v)].string(), ref.string()}),
          0);
      E2E_CHECK_TREE_EQUAL(version_dir(root, v), version_dir(ref, v));
    }
    p.wait();
    E2E_CHECK_TREE_EQUAL(mirror, saves[2]);
  }
}
