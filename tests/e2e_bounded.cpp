// End-to-end: hostile JSON costs bounded memory. Every JSON document hfdelta
// reads (safetensors headers and indexes of a delta, of BASE and NEW, of
// LOCAL; LOCAL's checksum record, state and transaction manifest) is refused
// past the limits docs/crash-safety.md documents, and whatever the input, no
// process peaks above 256 MiB resident (measured with wait4's ru_maxrss).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "delta/delta_format_internal.hpp"
#include "e2e_util.hpp"
#include "hfdelta/delta_format.hpp"

using namespace e2e;

namespace {

constexpr long kMaxRssKib = 256 * 1024;

// The limits of docs/crash-safety.md, "Hostile input".
constexpr std::uint64_t kHeaderBytes = 32u << 20;
constexpr std::uint64_t kIndexBytes = 64u << 20;
constexpr std::uint64_t kManifestBytes = 16u << 20;
constexpr std::uint64_t kMaxValues = 1'000'000;

// Under ASan the resident set includes shadow memory and quarantine, so the
// peak is asserted only in plain builds (scripts/ci/sanitize.sh sets ASAN_OPTIONS).
bool sanitized() { return std::getenv("ASAN_OPTIONS") != nullptr; }

struct Measured : RunResult {
  long peak_kib = 0;
};

// PROGRAM ARGS... run under tests/peak_rss.cpp (HFDELTA_PEAK_RSS).
Measured measure(const std::string& program, const std::vector<std::string>& args) {
  const char* probe = std::getenv("HFDELTA_PEAK_RSS");
  if (!probe) throw std::runtime_error("HFDELTA_PEAK_RSS is not set (meson test sets it)");
  TempDir t;
  std::vector<std::string> argv{probe, (t / "peak").string(), program};
  argv.insert(argv.end(), args.begin(), args.end());
  Measured m;
  static_cast<RunResult&>(m) = run(argv);
  m.peak_kib = std::stol(read_file(t / "peak"));
  return m;
}
Measured apply_m(const std::vector<std::string>& args) { return measure(apply_bin(), args); }
Measured diff_m(const std::vector<std::string>& args) { return measure(diff_bin(), args); }

void check_peak(const Measured& r, const std::string& what) {
  INFO(what << ": " << r.describe());
  MESSAGE(what << ": exit " << r.code << ", peak RSS " << r.peak_kib / 1024 << " MiB");
  if (sanitized()) return;
  CHECK(r.peak_kib > 0);
  CHECK(r.peak_kib < kMaxRssKib);
}

// `"<prefix>0000001":"<value>",` pairs until the text reaches `bytes` or
// `pairs` pairs, closed as an object. Keys are distinct.
std::string many_keys(std::uint64_t bytes, std::uint64_t pairs, const std::string& prefix, const std::string& value) {
  std::string s = "{";
  const std::size_t add = 6 + prefix.size() + 9 + value.size();
  s.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(bytes, pairs * add + 2)));
  char key[32];
  for (std::uint64_t i = 0; i < pairs; ++i) {
    std::snprintf(key, sizeof key, "%09llu", static_cast<unsigned long long>(i));
    if (s.size() + add + 1 > bytes) break;
    // Piece by piece, with no temporary strings: millions of pairs.
    if (i) s += ',';
    s += '"';
    s += prefix;
    s.append(key, 9);
    s += "\":\"";
    s += value;
    s += '"';
  }
  s += '}';
  return s;
}

// A safetensors file holding no tensors and `header` as its header.
void write_header_only(const fs::path& p, const std::string& header) {
  std::string b(8, '\0');
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(n >> (8 * i));
  write_file(p, b + header);
}

// The first weight file of a checkpoint or delta directory.
fs::path first_weight_file(const fs::path& dir) {
  for (const auto& f : list_files(dir))
    if (f.size() > 12 && f.substr(f.size() - 12) == ".safetensors" && f.find('/') == std::string::npos) return dir / f;
  FAIL("no weight file in " << dir.string());
  return {};
}

// A series, a delta 0 → 1 and a LOCAL at version 0.
struct Setup {
  std::unique_ptr<TempDir> t = scratch_dir();
  fs::path series, delta, local;
  Setup() {
    series = gen_series(t->path() / "series", 2);
    delta = version_dir(t->path() / "root", 1);
    fs::create_directories(delta.parent_path());
    E2E_REQUIRE_CODE(diff({"-q", save_dir(series, 0).string(), save_dir(series, 1).string(), delta.string()}), 0);
    local = t->path() / "local";
    E2E_REQUIRE_CODE(apply({"-q", "--init", save_dir(series, 0).string(), local.string()}), 0);
  }
  fs::path copy_delta(const std::string& name) {
    const fs::path d = version_dir(t->path() / name, 1);
    copy_tree(delta, d);
    return d;
  }
};

// delta-apply and --inspect on a damaged delta: both refuse it within the
// memory bound, and LOCAL is untouched.
void refuse_delta(Setup& s, const fs::path& d, const std::string& what) {
  const LocalSnapshot before(s.local);
  const Measured a = apply_m({"-q", d.string(), s.local.string()});
  CHECK_MESSAGE(a.code == 3, a.describe());
  check_peak(a, "delta-apply, " + what);
  const TreeDiff changed = before.compare();
  CHECK_MESSAGE(changed.equal, changed.report());
  const Measured i = diff_m({"--inspect", d.string()});
  CHECK_MESSAGE(i.code == 3, i.describe());
  check_peak(i, "--inspect, " + what);
}

}  // namespace

TEST_CASE("bounded memory: delta headers of a hundred megabytes and of the most values allowed") {
  Setup s;
  SUBCASE("a 100 MB header of metadata keys, within the format's limit") {
    const fs::path d = s.copy_delta("big");
    write_header_only(first_weight_file(d), "{\"__metadata__\":" + many_keys(99'000'000, ~0ull, "m", "") + "}");
    refuse_delta(s, d, "100 MB header");
  }
  SUBCASE("a header at hfdelta's byte limit, with twice the values allowed") {
    const fs::path d = s.copy_delta("values");
    write_header_only(first_weight_file(d),
                      "{\"__metadata__\":" + many_keys(kHeaderBytes - 32, kMaxValues, "", "") + "}");
    refuse_delta(s, d, "header with 2M values");
  }
  SUBCASE("a header just within every limit") {
    // The most a header may cost: as many values as allowed, long keys.
    const fs::path d = s.copy_delta("within");
    const std::string header =
        "{\"__metadata__\":" +
        many_keys(kHeaderBytes - 32, kMaxValues / 2 - 4, "model.layers.0.", std::string(40, 'v')) + "}";
    REQUIRE(header.size() > kHeaderBytes / 2);
    write_header_only(first_weight_file(d), header);
    refuse_delta(s, d, "header within the limits");  // refused later: not the delta's entries
  }
  SUBCASE("a header nested a million levels deep") {
    const fs::path d = s.copy_delta("deep");
    write_header_only(first_weight_file(d), "{\"__metadata__\":" + std::string(1'000'000, '[') + "}");
    refuse_delta(s, d, "deeply nested header");
  }
}

TEST_CASE("bounded memory: delta indexes of 179 MB and of the most values allowed") {
  Setup s;
  const std::string index_name = "model.safetensors.index.json";
  SUBCASE("a 179 MB index") {
    const fs::path d = s.copy_delta("big");
    json j = read_json(d / index_name);
    std::string text = j.dump();
    text.pop_back();
    text += ",\"padding\":" + many_keys(179'000'000, ~0ull, "p", "") + "}";
    write_file(d / index_name, text);
    refuse_delta(s, d, "179 MB index");
  }
  SUBCASE("an index just within every limit, its checksum valid") {
    // Half a million tensors the delta does not have, in its weight_map:
    // parsed, checked and converted before being refused.
    const fs::path d = s.copy_delta("within");
    json j = read_json(d / index_name);
    const std::string file = j["weight_map"].begin()->get<std::string>();
    const std::string prefix = "model.layers.10.mlp.experts.100.";
    for (std::uint64_t i = 0; i < kMaxValues / 2 - 1000; ++i) {
      char n[16];
      std::snprintf(n, sizeof n, "%09llu", static_cast<unsigned long long>(i));
      j["weight_map"][prefix + n + std::string(36, 'w')] = file;
    }
    const std::string text = hfdelta::seal_delta_index(j.dump());
    REQUIRE(text.size() > kIndexBytes / 2);
    REQUIRE(text.size() < kIndexBytes);
    j = nullptr;
    write_file(d / index_name, text);
    refuse_delta(s, d, "index within the limits");
  }
}

TEST_CASE("bounded memory: LOCAL's checksum record, manifest and headers, and delta-diff's inputs") {
  Setup s;
  SUBCASE("a checksum record of 64 MB") {
    const fs::path rec = s.local / ".weight_sync" / "checksums" / "000000.json";
    json j = read_json(rec);
    std::string text = j.dump();
    text.pop_back();
    text += ",\"padding\":" + many_keys(kIndexBytes + 1000, ~0ull, "p", "") + "}";
    write_file(rec, text);
    const Measured v = apply_m({"--verify", s.local.string()});
    CHECK_MESSAGE(v.code == 3, v.describe());
    CHECK(contains(v.err, rec.string()));
    check_peak(v, "--verify, 64 MB checksum record");
  }
  SUBCASE("a checksum record just within the limits") {
    const fs::path rec = s.local / ".weight_sync" / "checksums" / "000000.json";
    std::string text = read_json(rec).dump();
    text.pop_back();
    text += ",\"padding\":" +
            many_keys(kIndexBytes - text.size() - 64, kMaxValues / 2 - 1000, "model.layers.10.mlp.experts.100.",
                      std::string(32, 'f')) +
            "}";
    REQUIRE(text.size() > kIndexBytes / 2);
    write_file(rec, text);
    const Measured v = apply_m({"--verify", s.local.string()});
    CHECK_MESSAGE((v.code == 0 || v.code == 3), v.describe());
    check_peak(v, "--verify, checksum record within the limits");
  }
  SUBCASE("a transaction manifest of 16 MB") {
    // An interrupted apply leaves a journal; its manifest is then replaced.
    fs::path manifest;
    for (int step = 1; step < 200 && manifest.empty(); ++step) {
      ScopedEnv at("HFDELTA_FAULT_AT", std::to_string(step));
      ScopedEnv mode("HFDELTA_FAULT_MODE", "kill");
      REQUIRE(apply({"-q", s.delta.string(), s.local.string()}).code != 0);
      if (has_journal(s.local))
        for (const auto& e : fs::directory_iterator(s.local / ".weight_sync" / "txn"))
          if (fs::exists(e.path() / "manifest.json")) manifest = e.path() / "manifest.json";
    }
    REQUIRE(!manifest.empty());
    write_file(manifest, many_keys(kManifestBytes + 1000, ~0ull, "p", ""));
    const Measured st = apply_m({"--status", s.local.string()});
    check_peak(st, "--status, 16 MB manifest");
    const Measured a = apply_m({"-q", s.delta.string(), s.local.string()});
    CHECK_MESSAGE(a.code == 3, a.describe());
    CHECK(contains(a.err, manifest.string()));
    check_peak(a, "delta-apply, 16 MB manifest");
  }
  SUBCASE("a weight file of LOCAL and of BASE with a 100 MB header") {
    const fs::path w = first_weight_file(s.local);
    write_header_only(w, "{\"__metadata__\":" + many_keys(99'000'000, ~0ull, "m", "") + "}");
    const Measured a = apply_m({"-q", s.delta.string(), s.local.string()});
    CHECK_MESSAGE(a.code == 3, a.describe());
    CHECK(contains(a.err, w.filename().string()));
    check_peak(a, "delta-apply, LOCAL weight file with a 100 MB header");

    const fs::path base = s.t->path() / "base";
    fs::create_directories(s.t->path() / "out");
    copy_tree(save_dir(s.series, 0), base);
    write_header_only(first_weight_file(base), "{\"__metadata__\":" + many_keys(99'000'000, ~0ull, "m", "") + "}");
    const Measured d =
        diff_m({"-q", base.string(), save_dir(s.series, 1).string(), version_dir(s.t->path() / "out", 1).string()});
    CHECK_MESSAGE(d.code == 3, d.describe());
    check_peak(d, "delta-diff, BASE weight file with a 100 MB header");
  }
}

// A sharded publisher's rank (ShardWriter, docs/sharded.md) diffs a piece a
// batch (32 MiB) at a time: what it adds to the rank's memory, measured by
// tests/shard_probe.cpp as VmHWM after put() less VmRSS before, stays well
// under the piece (about 256 MiB), here under 96 MiB, for a column slice
// (every row read apart, batches ending mid-row) and the whole tensor.
TEST_CASE("bounded: a sharded rank's extra memory is a batch, not its 256 MiB piece") {
  const char* probe = std::getenv("HFDELTA_SHARD_PROBE");
  REQUIRE_MESSAGE(probe, "HFDELTA_SHARD_PROBE is not set (meson test sets it)");
  for (const auto& [enc, mode] : {std::pair<std::string, std::string>{"sparse", "columns"},
                                  std::pair<std::string, std::string>{"context", "columns"},
                                  std::pair<std::string, std::string>{"xor", "rows"}}) {
    TempDir t;
    const RunResult r = run({probe, t.path().string(), enc, mode});
    INFO(r.describe());
    REQUIRE(r.code == 0);
    long before = 0, hwm = 0;
    unsigned long long piece = 0, part = 0;
    REQUIRE(std::sscanf(r.out.c_str(), "rss_before_kib=%ld hwm_after_kib=%ld piece_bytes=%llu part_bytes=%llu", &before,
                        &hwm, &piece, &part) == 4);
    const long extra_kib = hwm - before;
    MESSAGE("ShardWriter, " << enc << ", " << mode << ": piece " << piece / (1 << 20) << " MiB, part "
                            << part / (1 << 20) << " MiB, VmRSS before put " << before / 1024 << " MiB, VmHWM after "
                            << hwm / 1024 << " MiB: " << extra_kib / 1024 << " MiB added");
    CHECK(piece >= 250ull << 20);
    CHECK(contains(r.out, "mirror holds the piece"));
    if (sanitized()) continue;
    CHECK(before * 1024 >= static_cast<long>(piece));  // the piece itself is resident
    CHECK(extra_kib < 96 * 1024);
  }
}
