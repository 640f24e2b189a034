// End-to-end: the publisher fed changes found elsewhere
// (MemoryPublisher::put_found, what the CUDA path hands it). The changes are
// found here from the mirror's bytes and the new save's by the CUDA path's
// CPU reference (found_reference.hpp, what ChangeFinder must hand out; the
// GPU's own are checked against it by hfdelta-gpu-check): the version
// published is byte for byte the one put() publishes from the bytes, and
// the mirror's checks still hold.
#include <doctest/doctest.h>

#include "e2e_util.hpp"
#include "found_reference.hpp"
#include "hfdelta/checkpoint.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/publisher.hpp"
#include "hfdelta/safetensors.hpp"
#include "util/io.hpp"

using namespace e2e;

namespace {

hfdelta::PublisherOptions options(const std::string& encoding) {
  hfdelta::PublisherOptions o;
  o.encoding = encoding == "auto" ? std::nullopt : std::optional(hfdelta::parse_encoding(encoding));
  o.sync = false;
  o.background = false;
  return o;
}

// Every tensor of save `next`, given as its bytes (`found` false) or as its
// changes against save `base` (the mirror's version).
void put_save(hfdelta::MemoryPublisher& p, const fs::path& base, const fs::path& next, bool found, bool context) {
  const hfdelta::Checkpoint cb = hfdelta::open_checkpoint(base), cn = hfdelta::open_checkpoint(next);
  REQUIRE(cb.shards.size() == cn.shards.size());
  for (std::size_t s = 0; s < cn.shards.size(); ++s) {
    const hfdelta::MappedFile mb(base / cb.shards[s].file), mn(next / cn.shards[s].file);
    const hfdelta::SafetensorsHeader &hb = cb.shards[s].header, &hn = cn.shards[s].header;
    for (const hfdelta::TensorInfo& t : hn.tensors) {
      const auto b = mn.bytes(hn.file_offset(t), t.nbytes());
      if (!found) {
        p.put({t.name, t.dtype, t.shape, b});
        continue;
      }
      const auto tb =
          std::find_if(hb.tensors.begin(), hb.tensors.end(), [&](const auto& x) { return x.name == t.name; });
      REQUIRE(tb != hb.tensors.end());
      const auto a = mb.bytes(hb.file_offset(*tb), tb->nbytes());
      const hfdelta::ChunkLayout l = hfdelta::chunk_layout(t.dtype, t.nbytes());
      hfdelta::gpu::Found f = hfdelta::gpu::reference_find(a, b, l.es, l.field);
      std::vector<hfdelta::ContextGroups> groups;
      if (context) {
        groups = hfdelta::gpu::context_groups_of(f, l.field);
        hfdelta::gpu::reference_rank(a, l.field, groups, f);
      } else {
        f.ctx.clear(), f.sample.clear();
      }
      std::vector<hfdelta::FoundChunk> chunks(f.chunks);
      for (std::uint64_t c = 0; c < f.chunks; ++c) chunks[c] = f.chunk(c);
      p.put_found({t.name, t.dtype, t.shape, t.nbytes(), chunks, groups});
    }
  }
}

}  // namespace

TEST_CASE("publisher, found changes: the versions put() publishes from the bytes, byte for byte; the mirror advances") {
  TempDir t;
  const fs::path series = gen_series(t / "series", 3);
  for (const std::string enc : {"sparse", "context"}) {
    CAPTURE(enc);
    const fs::path ref = t / ("ref-" + enc), root = t / ("root-" + enc);
    const fs::path ref_mirror = t / ("ref-mirror-" + enc), mirror = t / ("mirror-" + enc);
    for (const fs::path& d : {ref, root}) fs::create_directories(d);
    require_init(save_dir(series, 0), ref_mirror);
    require_init(save_dir(series, 0), mirror);
    hfdelta::MemoryPublisher pr(ref, ref_mirror, options(enc)), pf(root, mirror, options(enc));
    for (int v = 1; v <= 2; ++v) {
      CAPTURE(v);
      put_save(pr, save_dir(series, v - 1), save_dir(series, v), false, enc == "context");
      put_save(pf, save_dir(series, v - 1), save_dir(series, v), true, enc == "context");
      const hfdelta::PublishSummary sr = pr.publish(false), sf = pf.publish(false);
      CHECK(sf.diff.tensors_changed == sr.diff.tensors_changed);
      CHECK(sf.diff.elements_changed == sr.diff.elements_changed);
      CHECK(sf.diff.bytes_changed == sr.diff.bytes_changed);
      CHECK(sf.diff.tensors_changed > 0);
      E2E_CHECK_TREE_EQUAL(version_dir(root, v), version_dir(ref, v));
      E2E_CHECK_TREE_EQUAL(mirror, save_dir(series, v));
      CHECK(state_version(mirror) == state_version(ref_mirror));
    }
    E2E_REQUIRE_CODE(apply({"--verify", mirror.string()}), 0);
  }
}

TEST_CASE(
    "publisher, found changes: refused for encodings other than sparse and context, and against an altered mirror") {
  TempDir t;
  const fs::path series = gen_series(t / "series", 2);
  for (const std::string enc : {"xor", "auto"}) {
    CAPTURE(enc);
    const fs::path root = t / ("root-" + enc), mirror = t / ("mirror-" + enc);
    fs::create_directories(root);
    require_init(save_dir(series, 0), mirror);
    hfdelta::MemoryPublisher p(root, mirror, options(enc));
    CHECK(code_of([&] { put_save(p, save_dir(series, 0), save_dir(series, 1), true, false); }) ==
          static_cast<int>(hfdelta::Exit::usage));
    CHECK(p.in_progress());  // refused before anything was read: the version goes on
    p.abort();
  }
  // One byte of the mirror's weights altered since it was recorded: the
  // base check of put() holds for found changes too, and nothing is published.
  const fs::path root = t / "root", mirror = t / "mirror";
  fs::create_directories(root);
  require_init(save_dir(series, 0), mirror);
  const hfdelta::Checkpoint c = hfdelta::open_checkpoint(mirror);
  const fs::path weights = mirror / c.shards[0].file;
  {
    hfdelta::File f(weights, hfdelta::File::Mode::read_write);
    std::uint8_t x = 0;
    const std::uint64_t at = f.size() - 1;
    f.pread_exact(&x, 1, at);
    x ^= 0x40;
    f.pwrite_all(&x, 1, at);
  }
  hfdelta::MemoryPublisher p(root, mirror, options("sparse"));
  CHECK(code_of([&] { put_save(p, save_dir(series, 0), save_dir(series, 1), true, false); }) ==
        static_cast<int>(hfdelta::Exit::verify_failed));
  CHECK_FALSE(fs::exists(version_dir(root, 1)));
}
