// End-to-end: one publication root shared by every host. Nothing is
// published that would not turn the newest version into NEW (a retried job,
// a stale BASE, a mirror altered, a tensor written while it is read); a
// pull keeps every version it could apply and takes a full version where the
// deltas cannot be taken; a bad version is withdrawn; a version cut short
// says what stands behind it. The fleet view (delta-fleet --reports DIR ROOT)
// shows every entry named like a report, whatever it is, and a host whose
// clock runs ahead.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include "e2e_util.hpp"
#include "hfdelta/checkpoint.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/publisher.hpp"
#include "hfdelta/version.hpp"
#include "util/io.hpp"

using namespace e2e;

namespace {

#define CHECK_ERR_MENTIONS(res, text) \
  CHECK_MESSAGE(contains((res).err, (text)), "stderr should mention \"" << (text) << "\"\n" << (res).describe())

// delta-diff -q BASE NEW ROOT (its newest version + 1).
RunResult publish(const fs::path& base, const fs::path& target, const fs::path& root,
                  const std::string& enc = "sparse") {
  return diff({"-q", "--encoding", enc, base.string(), target.string(), root.string()});
}

// A version published by hand (as an older build, or a copy, would): the
// delta BASE -> NEW written outside ROOT, then moved in as version `v`.
void publish_unchecked(const fs::path& base, const fs::path& target, const fs::path& root, int v, const fs::path& tmp) {
  const fs::path out = tmp / ("unchecked-" + std::to_string(v));
  E2E_REQUIRE_CODE(diff({"-q", "--delta-version", std::to_string(v), base.string(), target.string(), out.string()}), 0);
  fs::rename(out, version_dir(root, v));
}

// A root of versions 1..n, each the delta from save v-1 to save v.
fs::path root_of(const TempDir& t, const fs::path& series, int n) {
  const fs::path root = t / "root";
  fs::create_directories(root);
  for (int v = 1; v <= n; ++v) E2E_REQUIRE_CODE(publish(save_dir(series, v - 1), save_dir(series, v), root), 0);
  return root;
}

fs::path host_at(const TempDir& t, const fs::path& series, const std::string& name, int v, const fs::path& root) {
  const fs::path local = t / name;
  require_init(save_dir(series, 0), local);
  if (v > 0) E2E_REQUIRE_CODE(apply({"-q", "--root", root.string(), "--target", std::to_string(v), local.string()}), 0);
  return local;
}

}  // namespace

TEST_CASE("fleet: a retried publish or a stale BASE is refused (exit 5), naming the version, the root unchanged") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 4);
  const fs::path root = root_of(t, s, 2);
  const Snapshot before = snapshot(root);
  for (const std::string enc : {"sparse", "context", "xor", "auto"}) {
    CAPTURE(enc);
    const RunResult retry = publish(save_dir(s, 1), save_dir(s, 2), root, enc);  // the job that published 2, again
    E2E_CHECK_CODE(retry, 5);
    CHECK_ERR_MENTIONS(retry, "version 000002");
    CHECK_ERR_MENTIONS(retry, "nothing was published");
    E2E_CHECK_CODE(publish(save_dir(s, 0), save_dir(s, 3), root, enc), 5);  // stale
    CHECK(snapshot_diff(before, snapshot(root)).empty());
  }
  // --full with a stale BASE: neither the delta beside it nor the full version
  const RunResult full = diff({"-q", "--full", save_dir(s, 1).string(), save_dir(s, 3).string(), root.string()});
  E2E_CHECK_CODE(full, 5);
  CHECK(snapshot_diff(before, snapshot(root)).empty());
  CHECK(list_names(root) == std::vector<std::string>{"weight_v000001", "weight_v000002"});
  // the right BASE, in every form
  E2E_CHECK_CODE(publish(save_dir(s, 2), save_dir(s, 3), root), 0);
  E2E_CHECK_CODE(diff({"-q", "--full", save_dir(s, 3).string(), save_dir(s, 4).string(), root.string()}), 0);
  // a full newest version: BASE must be its files
  E2E_CHECK_CODE(publish(save_dir(s, 3), save_dir(s, 4), root), 5);
  const fs::path host = host_at(t, s, "host", 0, root);
  CHECK(pull(root, host)["to_version"] == "000004");
  E2E_CHECK_TREE_EQUAL(host, save_dir(s, 4));
}

TEST_CASE("fleet: a pull keeps every version it could apply; a refused one leaves LOCAL at the one before (exit 5)") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 4);
  const fs::path root = root_of(t, s, 2);
  publish_unchecked(save_dir(s, 1), save_dir(s, 3), root, 3, t.path());  // on the wrong base
  const fs::path host = t / "host";
  require_init(save_dir(s, 0), host);
  const RunResult r = apply({"--root", root.string(), host.string()});
  E2E_CHECK_CODE(r, 5);
  CHECK_ERR_MENTIONS(r, "delta 000003");
  CHECK_ERR_MENTIONS(r, "keeps version 000002");
  CHECK(state_version(host) == "000002");
  E2E_CHECK_TREE_EQUAL(host, save_dir(s, 2));
  E2E_CHECK_CODE(apply({"--verify", host.string()}), 0);

  SUBCASE("a newer full version (with the delta beside it) is taken instead, and the pull says so") {
    // --full BASE NEW: BASE is what version 3 records (save 3), so it is accepted
    E2E_REQUIRE_CODE(diff({"-q", "--full", save_dir(s, 3).string(), save_dir(s, 4).string(), root.string()}), 0);
    const json j = pull(root, host);
    CHECK(j["to_version"] == "000004");
    CHECK(j["full_copied"] == "000004");
    REQUIRE(j["fallback"].is_string());
    CHECK(contains(j["fallback"].get<std::string>(), "version 000003 was refused"));
    E2E_CHECK_TREE_EQUAL(host, save_dir(s, 4));
  }
  SUBCASE("withdrawn, and republished on version 2: the next pull goes on from 2") {
    E2E_REQUIRE_CODE(diff({"-q", "--withdraw", version_dir(root, 3).string()}), 0);
    E2E_REQUIRE_CODE(publish(save_dir(s, 2), save_dir(s, 3), root), 0);
    CHECK(fs::is_directory(version_dir(root, 4)));
    CHECK(delta_index(version_dir(root, 4))["metadata"]["base_version"] == "000002");
    const json j = pull(root, host);
    CHECK(j["to_version"] == "000004");
    CHECK(j["fallback"].is_null());
    E2E_CHECK_TREE_EQUAL(host, save_dir(s, 3));
  }
}

TEST_CASE("fleet: a host offline during a prune takes the full version, and says so") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 4);
  const fs::path root = root_of(t, s, 2);
  const fs::path at0 = host_at(t, s, "at0", 0, root), at1 = host_at(t, s, "at1", 1, root),
                 at2 = host_at(t, s, "at2", 2, root);
  E2E_REQUIRE_CODE(diff({"-q", "--full", save_dir(s, 2).string(), save_dir(s, 3).string(), root.string()}), 0);
  CHECK(fs::is_directory(root / "delta_v000003"));
  E2E_REQUIRE_CODE(diff({"-q", "--prune", root.string()}), 0);
  REQUIRE_FALSE(fs::exists(version_dir(root, 1)));
  E2E_REQUIRE_CODE(publish(save_dir(s, 3), save_dir(s, 4), root), 0);
  for (const fs::path& host : {at0, at1}) {
    CAPTURE(host);
    const json j = pull(root, host);
    CHECK(j["full_copied"] == "000003");
    REQUIRE(j["fallback"].is_string());
    CHECK(contains(j["fallback"].get<std::string>(), "took full version 000003"));
    E2E_CHECK_TREE_EQUAL(host, save_dir(s, 4));
  }
  const json j = pull(root, at2);  // one behind the full version: the delta beside it
  CHECK(j["full_copied"].is_null());
  CHECK(j["sidecars_applied"] == 1);
  E2E_CHECK_TREE_EQUAL(at2, save_dir(s, 4));
  // the text form says it too
  const fs::path late = host_at(t, s, "late", 0, root);
  fs::remove_all(version_dir(root, 4));
  const RunResult r = apply({"--root", root.string(), late.string()});
  E2E_CHECK_CODE(r, 0);
  CHECK(contains(r.out, "took full version 000003"));
}

TEST_CASE("fleet: a publisher whose mirror is behind a pruned root catches up through the full version") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 4);
  const fs::path root = root_of(t, s, 2);
  const fs::path mirror = host_at(t, s, "mirror", 1, root);
  E2E_REQUIRE_CODE(diff({"-q", "--full", save_dir(s, 2).string(), save_dir(s, 3).string(), root.string()}), 0);
  E2E_REQUIRE_CODE(diff({"-q", "--prune", root.string()}), 0);
  hfdelta::PublisherOptions o;
  o.sync = false;
  o.background = false;
  hfdelta::MemoryPublisher p(root, mirror, o);
  CHECK(p.version() == 3);
  E2E_CHECK_TREE_EQUAL(mirror, save_dir(s, 3));
}

TEST_CASE("fleet: --squash across a chain that does not connect exits 3 and writes nothing") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 4);
  const fs::path root = root_of(t, s, 2);
  publish_unchecked(save_dir(s, 1), save_dir(s, 3), root, 3, t.path());
  const RunResult r =
      diff({"--squash", version_dir(root, 1).string(), version_dir(root, 3).string(), (t / "sq").string()});
  E2E_CHECK_CODE(r, 3);
  CHECK_ERR_MENTIONS(r, "does not connect");
  CHECK_FALSE(fs::exists(t / "sq"));
  E2E_CHECK_CODE(
      diff({"-q", "--squash", version_dir(root, 1).string(), version_dir(root, 2).string(), (t / "ok").string()}), 0);
}

TEST_CASE("fleet: --withdraw takes a bad version back; hosts that applied it are told, and take a newer full version") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 4);
  const fs::path root = root_of(t, s, 2);
  // version 3: applicable, but the wrong weights (back to save 0)
  E2E_REQUIRE_CODE(publish(save_dir(s, 2), save_dir(s, 0), root), 0);
  const fs::path applied = host_at(t, s, "applied", 3, root), skipped = host_at(t, s, "skipped", 2, root);

  const RunResult w = diff({"--withdraw", "--json", version_dir(root, 3).string() + "/"});
  E2E_REQUIRE_CODE(w, 0);
  const json jw = json::parse(w.out);
  CHECK(jw["version"] == "000003");
  CHECK(jw["already_withdrawn"] == false);
  CHECK(jw["next_base"] == "000002");
  CHECK(list_names(root) == std::vector<std::string>{"weight_v000001", "weight_v000002", "withdrawn_v000003"});
  const RunResult again = diff({"--withdraw", version_dir(root, 3).string()});  // a retried job
  E2E_CHECK_CODE(again, 0);
  CHECK(contains(again.out, "withdrawn already"));
  E2E_CHECK_CODE(diff({"--withdraw", version_dir(root, 7).string()}), 3);
  E2E_CHECK_CODE(diff({"--withdraw", (root / "weight_v3").string()}), 2);

  // a publisher whose mirror applied it is told to re-create the mirror
  {
    hfdelta::PublisherOptions o;
    o.sync = false;
    std::string what;
    try {
      hfdelta::MemoryPublisher p(root, applied, o);
    } catch (const hfdelta::Error& e) {
      what = e.what();
    }
    CHECK(contains(what, "withdrawn"));
    CHECK(contains(what, "re-create the mirror"));
  }
  // nothing newer: the host that skipped it stays; the one that applied it is told
  CHECK(pull(root, skipped)["noop"] == true);
  const RunResult told = apply({"--root", root.string(), applied.string()});
  E2E_CHECK_CODE(told, 4);
  CHECK_ERR_MENTIONS(told, "withdrawn");
  CHECK_ERR_MENTIONS(told, "--init");

  // the next version is 4, on 2; the host that skipped 3 takes it
  E2E_REQUIRE_CODE(publish(save_dir(s, 2), save_dir(s, 3), root), 0);
  CHECK(delta_index(version_dir(root, 4))["metadata"]["base_version"] == "000002");
  CHECK(pull(root, skipped)["to_version"] == "000004");
  E2E_CHECK_TREE_EQUAL(skipped, save_dir(s, 3));
  E2E_CHECK_CODE(apply({"--root", root.string(), applied.string()}), 4);
  CHECK(state_version(applied) == "000003");

  // a full version reaches it too
  E2E_REQUIRE_CODE(diff({"-q", "--full", save_dir(s, 3).string(), save_dir(s, 4).string(), root.string()}), 0);
  const json j = pull(root, applied);
  CHECK(j["full_copied"] == "000005");
  CHECK(contains(j["fallback"].get<std::string>(), "withdrawn"));
  E2E_CHECK_TREE_EQUAL(applied, save_dir(s, 4));
  // --squash skips the withdrawn number
  E2E_CHECK_CODE(
      diff({"-q", "--squash", version_dir(root, 2).string(), version_dir(root, 4).string(), (t / "sq").string()}), 0);
  // a prune removes it with the versions before the full one; the numbering goes on
  const RunResult pr = diff({"--json", "--prune", root.string()});
  E2E_REQUIRE_CODE(pr, 0);
  bool listed = false;
  const json pruned = json::parse(pr.out);
  for (const json& d : pruned["removed"]) listed = listed || (d["withdrawn"] == true && d["version"] == "000003");
  CHECK(listed);
  CHECK(list_names(root) == std::vector<std::string>{"delta_v000005", "weight_v000005"});
  E2E_REQUIRE_CODE(publish(save_dir(s, 4), save_dir(s, 3), root), 0);
  CHECK(fs::is_directory(version_dir(root, 6)));
}

TEST_CASE("fleet: a version cut short below complete ones: every poll says which exist and what to do") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 3);
  const fs::path root = root_of(t, s, 3);
  const fs::path host = host_at(t, s, "host", 1, root);
  // version 2 lost a file on its way (its marker lists it)
  const std::vector<std::string> files = list_files(version_dir(root, 2));
  for (const auto& f : files)
    if (f.find(".safetensors") != std::string::npos && f.find("index") == std::string::npos) {
      fs::remove(version_dir(root, 2) / f);
      break;
    }
  const RunResult r = apply({"--root", root.string(), host.string()});
  E2E_CHECK_CODE(r, 0);
  CHECK_ERR_MENTIONS(r, "000003");
  CHECK_ERR_MENTIONS(r, "--withdraw");
  const json j = pull(root, host);
  CHECK(j["not_published_yet"] == "000002");
  CHECK(j["newer_complete"] == json::array({"000003"}));
  CHECK(state_version(host) == "000001");
}

TEST_CASE("fleet: a mirror altered by one bit is refused before anything is published") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 2);
  const fs::path root = t / "root", mirror = t / "mirror";
  fs::create_directories(root);
  require_init(save_dir(s, 0), mirror);
  const hfdelta::Checkpoint c = hfdelta::open_checkpoint(mirror);
  const fs::path victim = mirror / c.shards[0].file;
  Bytes b = read_bytes(victim);
  b[c.shards[0].header.file_offset(c.shards[0].header.tensors[0]) + 1] ^= 0x10;
  write_bytes(victim, b);
  for (const std::string enc : {"sparse", "xor"}) {
    CAPTURE(enc);
    hfdelta::PublisherOptions o;
    o.encoding = hfdelta::parse_encoding(enc);
    o.sync = false;
    o.background = false;
    hfdelta::MemoryPublisher p(root, mirror, o);
    const hfdelta::Checkpoint n = hfdelta::open_checkpoint(save_dir(s, 1));
    int code = 0;
    std::string what;
    try {
      for (std::size_t k = 0; k < n.shards.size(); ++k) {
        const hfdelta::MappedFile m(save_dir(s, 1) / n.shards[k].file);
        for (const auto& ti : n.shards[k].header.tensors)
          p.put({ti.name, ti.dtype, ti.shape, m.bytes(n.shards[k].header.file_offset(ti), ti.nbytes())});
      }
      p.publish(false);
    } catch (const hfdelta::Error& e) {
      code = static_cast<int>(e.code());
      what = e.what();
    }
    CHECK(code == 5);
    CHECK(contains(what, "altered"));
    CHECK(contains(what, c.shards[0].header.tensors[0].name));
    CHECK(list_names(root).empty());
  }
}

TEST_CASE("fleet: a tensor written while the publisher reads it never publishes an entry that misses its checksum") {
  TempDir t;
  // one tensor of 3M bf16 elements: three chunks, split over threads
  const std::size_t n = 3u << 20;
  Bytes zero(2 * n, 0);
  const fs::path ckpt = t / "ckpt";
  write_safetensors(ckpt / "model.safetensors", {{"w", "BF16", {n}, zero}});
  const fs::path root = t / "root", mirror = t / "mirror", host = t / "host";
  fs::create_directories(root);
  require_init(ckpt, mirror);
  require_init(ckpt, host);
  std::vector<std::uint8_t> live(2 * n, 1);
  int published = 0, refused = 0;
  for (int round = 0; round < 6; ++round) {
    hfdelta::PublisherOptions o;
    o.sync = false;
    o.background = false;
    o.threads = 2;
    o.encoding = round % 2 ? hfdelta::Encoding::xor_bytes : hfdelta::Encoding::sparse;
    hfdelta::MemoryPublisher p(root, mirror, o);
    std::atomic<bool> stop{false};
    std::thread writer([&] {  // a trainer thread stepping the live parameter
      std::uint8_t x = static_cast<std::uint8_t>(round);
      while (!stop.load(std::memory_order_relaxed))
        for (std::size_t i = 0; i < live.size(); i += 4099) __atomic_store_n(&live[i], ++x, __ATOMIC_RELAXED);
    });
    const std::vector<std::uint64_t> shape{n};
    try {
      p.put({"w", "BF16", shape, live});
      p.publish(false);
      ++published;
    } catch (const hfdelta::Error& e) {
      CHECK_MESSAGE(e.code() == hfdelta::Exit::verify_failed, e.what());
      CHECK(contains(e.what(), "changed while they were read"));
      ++refused;
    }
    stop = true;
    writer.join();
  }
  INFO("published " << published << ", refused " << refused);
  CHECK(published + refused == 6);
  // whatever was published, every host applies, and lands on the mirror's bytes
  const json j = pull(root, host);
  CHECK(j["to_version"] == json(published ? hfdelta::format_version(static_cast<std::uint64_t>(published)) : "000000"));
  E2E_CHECK_TREE_EQUAL(host, mirror);
  E2E_CHECK_CODE(apply({"--verify", mirror.string()}), 0);
}

// ---- the fleet view's reports ------------------------------------------------------

namespace {

double now_unix() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

// A root of versions 1 and 2, and DIR with the report of host "good", at 2.
struct Reports {
  TempDir t;
  fs::path series, root, reports, local;
  Reports() {
    series = gen_series(t / "series", 2);
    root = root_of(t, series, 2);
    reports = t / "reports";
    fs::create_directories(reports);
    local = t / "good";
    require_init(save_dir(series, 0), local);
    E2E_REQUIRE_CODE(
        apply({"-q", "--root", root.string(), "--report-to", reports.string(), "--host", "good", local.string()}), 0);
  }
  RunResult fleet(const std::vector<std::string>& extra) const {
    std::vector<std::string> args{"--reports", reports.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back(root.string());
    return delta_fleet(args);
  }
};

}  // namespace

TEST_CASE(
    "fleet: a report that is a FIFO, a link or a directory, or dated in the future, is a row with its problem, "
    "and exit 16 with --fail-behind or --fail-stale") {
  Reports f;
  // The good report alone: no alert.
  E2E_REQUIRE_CODE(f.fleet({"-q", "--fail-behind", "0", "--fail-stale", "3600"}), 0);

  std::string name, problem;
  SUBCASE("a FIFO (the view must not wait for a writer)") {
    REQUIRE(::mkfifo((f.reports / "fifo.json").c_str(), 0644) == 0);
    name = "fifo", problem = "not a regular file: a FIFO";
  }
  SUBCASE("a symlink, even to a valid report: a report is never written as a link, and a link is not followed") {
    fs::create_symlink("good.json", f.reports / "link.json");
    name = "link", problem = "not a regular file: a symlink to good.json";
  }
  SUBCASE("a dangling symlink") {
    fs::create_symlink("gone.json", f.reports / "dangling.json");
    name = "dangling", problem = "not a regular file: a symlink to gone.json";
  }
  SUBCASE("a directory") {
    fs::create_directories(f.reports / "dir.json");
    name = "dir", problem = "not a regular file: a directory";
  }
  SUBCASE("a report dated an hour ahead: its host's clock runs ahead") {
    json j = read_json(f.reports / "good.json");
    j["host"] = "ahead";
    j["time_unix"] = now_unix() + 3600;
    write_json(f.reports / "ahead.json", j);
    name = "ahead", problem = "s in the future: the host's clock runs ahead";
  }

  RunResult r = f.fleet({});
  E2E_CHECK_CODE(r, 0);
  bool row = false;
  for (std::size_t at = 0, end; at < r.out.size(); at = end + 1) {
    end = r.out.find('\n', at);
    if (end == std::string::npos) end = r.out.size();
    const std::string line = r.out.substr(at, end - at);
    row = row || (line.rfind(name + " ", 0) == 0 && contains(line, problem));
  }
  CHECK_MESSAGE(row, "no row \"" << name << " ...  " << problem << "\" in\n" << r.out);
  CHECK(contains(r.out, "2 host reports"));

  r = f.fleet({"--json"});
  E2E_REQUIRE_CODE(r, 0);
  const json j = parse_json(r.out);
  REQUIRE(j["hosts"].size() == 2);
  std::map<std::string, json> hosts;
  for (const json& h : j["hosts"]) hosts[h["host"]] = h;
  REQUIRE(hosts.count(name));
  REQUIRE_MESSAGE(hosts[name]["problem"].is_string(), hosts[name].dump());
  CHECK_MESSAGE(contains(hosts[name]["problem"].get<std::string>(), problem), hosts[name].dump());
  CHECK(hosts["good"]["problem"].is_null());

  for (const std::vector<std::string>& flag :
       std::vector<std::vector<std::string>>{{"--fail-stale", "3600"}, {"--fail-behind", "0"}}) {
    CAPTURE(flag[0]);
    r = f.fleet({"-q", flag[0], flag[1]});
    E2E_CHECK_CODE(r, 16);
    CHECK_ERR_MENTIONS(r, "1 alert(s): " + name + ": its report cannot be");
    CHECK_ERR_MENTIONS(r, problem);
  }
  fs::remove(f.reports / (name + ".json"));
  E2E_CHECK_CODE(f.fleet({"-q", "--fail-behind", "0", "--fail-stale", "3600"}), 0);
}

TEST_CASE("fleet: a peer's report that is a FIFO is a peer not ready, not a wait for a writer (exit 15)") {
  Reports f;
  REQUIRE(::mkfifo((f.reports / "fifo.json").c_str(), 0644) == 0);
  const RunResult r = apply({"--root", f.root.string(), "--report-to", f.reports.string(), "--host", "good", "--peers",
                             "fifo", "--peer-timeout", "0.2", "--then", "true", f.local.string()});
  E2E_CHECK_CODE(r, 15);
  CHECK_ERR_MENTIONS(r, "not a regular file: a FIFO");
}

TEST_CASE("fleet: delta-fleet --reports DIR that is ROOT, lies inside it or contains it: exit 3, as --report-to") {
  Reports f;
  fs::create_directories(f.root / "hosts");
  for (const fs::path& dir : {f.root, f.root / "hosts", f.t.path()}) {
    CAPTURE(dir);
    RunResult r = delta_fleet({"--reports", dir.string(), f.root.string()});
    E2E_CHECK_CODE(r, 3);
    CHECK_ERR_MENTIONS(r, "publication root " + f.root.string());
    CHECK_ERR_MENTIONS(r, "--reports");
    CHECK(r.out.empty());
    r = apply({"--root", f.root.string(), "--report-to", dir.string(), "--host", "good", f.local.string()});
    E2E_CHECK_CODE(r, 3);
    CHECK_ERR_MENTIONS(r, "publication root " + f.root.string());
    CHECK_ERR_MENTIONS(r, "--report-to");
  }
  CHECK(list_names(f.root / "hosts").empty());
  CHECK(list_names(f.t.path()) == std::vector<std::string>{"good", "reports", "root", "series"});
}
