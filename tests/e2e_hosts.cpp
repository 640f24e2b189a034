// End-to-end: hosts report what they hold (--report-to DIR), the fleet view
// reads a root and the reports (delta-fleet), and an engine across hosts
// reloads only once every node holds the version (--peers, --follow): the
// real binaries, each "host" a LOCAL of its own with its own runs.
#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <thread>

#include "e2e_util.hpp"

using namespace e2e;

namespace {

#define CHECK_ERR_MENTIONS(res, text) \
  CHECK_MESSAGE(contains((res).err, (text)), "stderr should mention \"" << (text) << "\"\n" << (res).describe())

double now_unix() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

std::string hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

// A root of versions 1..n, each the delta from save v-1 to save v.
fs::path root_of(const TempDir& t, const fs::path& series, int n) {
  const fs::path root = t / "root";
  fs::create_directories(root);
  for (int v = 1; v <= n; ++v)
    E2E_REQUIRE_CODE(diff({"-q", save_dir(series, v - 1).string(), save_dir(series, v).string(), root.string()}), 0);
  return root;
}

fs::path host_at_zero(const TempDir& t, const fs::path& series, const std::string& name) {
  const fs::path local = t / name;
  require_init(save_dir(series, 0), local);
  return local;
}

// Every file of ROOT with its bytes and mtime: a reader must leave it as it was.
std::map<std::string, std::string> root_state(const fs::path& root) {
  std::map<std::string, std::string> out;
  for (fs::recursive_directory_iterator it(root), end; it != end; ++it)
    out[it->path().string()] = fs::is_regular_file(it->path())
                                   ? read_file(it->path()) + "@" + std::to_string(fs::last_write_time(it->path()))
                                   : "dir@" + std::to_string(fs::last_write_time(it->path()));
  return out;
}

}  // namespace

TEST_CASE("hosts: --report-to writes DIR/NAME.json after every pull, success or failure; never into ROOT") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 3);
  const fs::path root = root_of(t, s, 2);
  const fs::path reports = t / "reports";
  fs::create_directories(reports);
  const fs::path local = host_at_zero(t, s, "a");
  const auto with_report = [&](std::vector<std::string> extra) {
    std::vector<std::string> args{"--root", root.string(), "--report-to", reports.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back(local.string());
    return apply(args);
  };

  const double t0 = now_unix();
  E2E_REQUIRE_CODE(with_report({"-q", "--host", "a"}), 0);
  json j = read_json(reports / "a.json");
  CHECK(j["schema"] == 1);
  CHECK(j["host"] == "a");
  CHECK(j["local"] == fs::absolute(local).lexically_normal().string());
  CHECK(j["root"] == fs::absolute(root).lexically_normal().string());
  CHECK(j["version"] == "000002");
  CHECK(j["newest_version"] == "000002");
  CHECK(j["behind"] == 0);
  CHECK(j["state"] == "done");
  CHECK(j["exit_code"] == 0);
  CHECK(j["error"].is_null());
  CHECK(j["hfdelta_version"].is_string());
  CHECK(j["time_unix"].get<double>() >= std::floor(t0));
  CHECK(j["time_unix"].get<double>() <= now_unix() + 1);
  const std::string iso = j["time"];
  CHECK((iso.size() == 20 && iso[10] == 'T' && iso.back() == 'Z'));
  CHECK(list_names(reports) == std::vector<std::string>{"a.json"});  // no temporary file left

  SUBCASE("a failed pull is reported too, with its exit code and error; LOCAL's version as it is") {
    const RunResult r = with_report({"--host", "a", "--target", "9"});
    E2E_CHECK_CODE(r, 4);
    j = read_json(reports / "a.json");
    CHECK(j["exit_code"] == 4);
    CHECK(j["error"]["kind"] == "out_of_order");
    CHECK(contains(j["error"]["message"].get<std::string>(), "000009"));
    CHECK(j["version"] == "000002");
  }
  SUBCASE("NAME defaults to the host name") {
    E2E_REQUIRE_CODE(with_report({"-q"}), 0);
    CHECK(fs::exists(reports / (hostname() + ".json")));
  }
  SUBCASE("DIR inside ROOT, or ROOT itself, is refused (exit 3) before anything is pulled or written") {
    E2E_REQUIRE_CODE(diff({"-q", save_dir(s, 2).string(), save_dir(s, 3).string(), root.string()}), 0);
    const auto before = root_state(root);
    for (const fs::path& dir : {root / "reports", root}) {
      const RunResult r = apply({"--root", root.string(), "--report-to", dir.string(), local.string()});
      E2E_CHECK_CODE(r, 3);
      CHECK_ERR_MENTIONS(r, "publication root");
    }
    CHECK(root_state(root) == before);
    CHECK(state_version(local) == "000002");
  }
  SUBCASE("a DIR that does not exist is a usage error (exit 2), LOCAL not pulled") {
    E2E_REQUIRE_CODE(diff({"-q", save_dir(s, 2).string(), save_dir(s, 3).string(), root.string()}), 0);
    const RunResult r = apply({"--root", root.string(), "--report-to", (t / "nope").string(), local.string()});
    E2E_CHECK_CODE(r, 2);
    CHECK_ERR_MENTIONS(r, "mkdir -p");
    CHECK(state_version(local) == "000002");
  }
  SUBCASE("a NAME that is no plain file name is a usage error") {
    E2E_CHECK_CODE(with_report({"--host", "../x"}), 2);
    E2E_CHECK_CODE(with_report({"--host", ".hidden"}), 2);
  }
  SUBCASE("the options it needs") {
    E2E_CHECK_CODE(apply({"--report-to", reports.string(), "--status", local.string()}), 2);
    E2E_CHECK_CODE(with_report({"--peers", "b"}), 2);                                      // --peers needs --then
    E2E_CHECK_CODE(with_report({"--follow", "b", "--then", "true"}), 2);                   // a follower reloads nothing
    E2E_CHECK_CODE(apply({"--root", root.string(), "--follow", "b", local.string()}), 2);  // --follow needs --report-to
  }
  SUBCASE("the names of earlier releases are refused, naming what replaced them") {
    RunResult r = with_report({"--report", reports.string()});
    E2E_CHECK_CODE(r, 2);
    CHECK(r.err.find("--report-to DIR") != std::string::npos);
    r = apply({"--fleet", root.string()});
    E2E_CHECK_CODE(r, 2);
    CHECK(r.err.find("delta-fleet") != std::string::npos);
    CHECK(r.out.empty());
  }
}

TEST_CASE("hosts: delta-fleet shows every version of ROOT and each host's report, reading only; --fail-* exit 16") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 6);
  const fs::path root = t / "root";
  fs::create_directories(root);
  // 1 a delta; 2 a full version with the delta beside it; 3 a delta; 4
  // withdrawn; 5 still uploading (a file its marker lists is missing); 6
  // complete above it (so 5 is stalled).
  // Each version's density as delta-diff reports it (the full version's: its delta beside's).
  std::map<std::string, double> density;
  const auto publish = [&](std::vector<std::string> args) {
    args.insert(args.begin(), "--json");
    const RunResult r = diff(args);
    E2E_REQUIRE_CODE(r, 0);
    const json j = parse_json(r.out);
    density[j["version"].get<std::string>()] = (j.contains("sidecar") ? j["sidecar"] : j)["density"].get<double>();
  };
  publish({save_dir(s, 0).string(), save_dir(s, 1).string(), root.string()});
  publish({"--full", save_dir(s, 1).string(), save_dir(s, 2).string(), root.string()});
  publish({save_dir(s, 2).string(), save_dir(s, 3).string(), root.string()});
  publish({save_dir(s, 3).string(), save_dir(s, 4).string(), root.string()});
  E2E_REQUIRE_CODE(diff({"-q", "--withdraw", version_dir(root, 4).string()}), 0);
  publish({save_dir(s, 3).string(), save_dir(s, 4).string(), root.string()});  // 5
  publish({save_dir(s, 4).string(), save_dir(s, 5).string(), root.string()});  // 6
  REQUIRE(density.size() == 6);
  std::string cut;
  for (const std::string& f : list_names(version_dir(root, 5)))
    if (contains(f, ".safetensors") && !contains(f, "index")) cut = f;
  REQUIRE(!cut.empty());
  fs::remove(version_dir(root, 5) / cut);

  const fs::path reports = t / "reports";
  fs::create_directories(reports);
  const fs::path up = host_at_zero(t, s, "up"), low = host_at_zero(t, s, "low");
  // `up` stops below the version still uploading, at 3; `low` is held at 1.
  E2E_REQUIRE_CODE(apply({"-q", "--root", root.string(), "--report-to", reports.string(), "--host", "up", up.string()}),
                   0);
  E2E_REQUIRE_CODE(apply({"-q", "--root", root.string(), "--target", "1", "--report-to", reports.string(), "--host",
                          "low", low.string()}),
                   0);
  write_file(reports / "bad.json", "{not json");
  auto before = root_state(root);
  const auto fleet = [&](std::vector<std::string> extra) {
    std::vector<std::string> args{"--reports", reports.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back(root.string());
    return delta_fleet(args);
  };

  RunResult r = fleet({"--json"});
  E2E_REQUIRE_CODE(r, 0);
  json j = parse_json(r.out);
  CHECK(j["ok"] == true);
  CHECK(j["newest_version"] == "000006");
  CHECK(j["newest_complete"] == "000006");
  CHECK(j["stalled"] == json::array({"000005"}));
  REQUIRE(j["versions"].size() == 6);
  std::map<std::string, json> v;
  for (const json& e : j["versions"]) v[e["version"]] = e;
  CHECK(v["000001"]["kind"] == "delta");
  CHECK(v["000001"]["base_version"] == "000000");
  CHECK(v["000001"]["status"] == "complete");
  CHECK(v["000001"]["marker"] == true);
  CHECK(v["000002"]["kind"] == "full");
  CHECK(v["000002"]["delta_beside"] == true);
  CHECK(v["000002"]["base_version"] == "000001");
  CHECK(v["000002"]["bytes"].get<std::uint64_t>() > v["000002"]["delta_beside_bytes"].get<std::uint64_t>());
  CHECK(v["000003"]["base_version"] == "000002");
  CHECK(v["000004"]["status"] == "withdrawn");
  CHECK(v["000005"]["status"] == "uploading");
  CHECK(contains(v["000005"]["note"].get<std::string>(), cut));
  CHECK(v["000005"]["base_version"] == "000003");
  CHECK(v["000006"]["status"] == "complete");
  for (const auto& version : v) {  // not a structured binding: clang 14's CHECK_MESSAGE cannot capture one
    const std::string& name = version.first;
    const json& e = version.second;
    CHECK_MESSAGE(e["bytes"].get<std::uint64_t>() > 0, name);
    CHECK(e["age_seconds"].get<double>() >= 0);
    // From the index's hfdelta_elements: what delta-diff reported.
    REQUIRE_MESSAGE(e["density"].is_number(), name);
    CHECK_MESSAGE(e["density"].get<double>() == doctest::Approx(density.at(name)), name);
    CHECK(e["density"].get<double>() > 0);
  }
  REQUIRE(j["hosts"].size() == 3);
  std::map<std::string, json> h;
  for (const json& e : j["hosts"]) h[e["host"]] = e;
  CHECK(h["up"]["version"] == "000003");
  CHECK(h["up"]["behind"] == 2);  // 5 and 6; the withdrawn 4 does not count
  CHECK(h["up"]["exit_code"] == 0);
  CHECK(h["up"]["report_age_seconds"].get<double>() < 600);
  CHECK(h["low"]["version"] == "000001");
  CHECK(h["low"]["behind"] == 4);  // 2, 3, 5, 6
  CHECK(h["bad"]["problem"].is_string());
  CHECK(h["bad"]["version"].is_null());

  r = fleet({});
  E2E_CHECK_CODE(r, 0);
  for (const char* text : {"version", "withdrawn", "uploading", "delta beside", "stalled", "up ", "low ", "bad "})
    CHECK_MESSAGE(contains(r.out, text), text << "\n" << r.out);

  SUBCASE("--fail-behind N: exit 16 naming the hosts more than N behind, and the unreadable report") {
    r = fleet({"--json", "--fail-behind", "3"});
    E2E_CHECK_CODE(r, 16);
    j = parse_json(r.out);
    CHECK(j["ok"] == false);
    CHECK(j["exit_code"] == 16);
    CHECK(j["error"]["kind"] == "fleet_alert");
    CHECK(j["versions"].size() == 6);  // the view is printed all the same
    CHECK_ERR_MENTIONS(r, "low: 4 versions behind");
    CHECK_ERR_MENTIONS(r, "bad: its report cannot be read");
    CHECK(!contains(r.err, "up:"));
    fs::remove(reports / "bad.json");
    E2E_CHECK_CODE(fleet({"-q", "--fail-behind", "4"}), 0);
  }
  SUBCASE("--fail-stale S: exit 16 for a report older than S seconds") {
    fs::remove(reports / "bad.json");
    E2E_CHECK_CODE(fleet({"-q", "--fail-stale", "3600"}), 0);
    json old = read_json(reports / "up.json");
    old["time_unix"] = now_unix() - 7200;
    write_json(reports / "up.json", old);
    r = fleet({"-q", "--fail-stale", "3600"});
    E2E_CHECK_CODE(r, 16);
    CHECK_ERR_MENTIONS(r, "up: its report is 72");
    CHECK(r.out.empty());
  }
  SUBCASE("without --reports: the versions only; the thresholds need --reports") {
    r = delta_fleet({root.string(), "--json"});
    E2E_CHECK_CODE(r, 0);
    CHECK(parse_json(r.out)["hosts"].empty());
    E2E_CHECK_CODE(delta_fleet({root.string(), "--fail-behind", "1"}), 2);
  }
  SUBCASE("--require-marker: a version without a marker is still uploading") {
    fs::remove(version_dir(root, 6) / "hfdelta_complete.json");
    before = root_state(root);
    j = parse_json(fleet({"--json"}).out);
    CHECK(j["versions"][5]["status"] == "complete");
    CHECK(j["versions"][5]["marker"] == false);
    j = parse_json(fleet({"--json", "--require-marker"}).out);
    CHECK(j["versions"][5]["status"] == "uploading");
    CHECK(j["newest_complete"] == "000003");
  }
  SUBCASE("usage: a ROOT or DIR that does not exist, a LOCAL given too") {
    E2E_CHECK_CODE(delta_fleet({(t / "nope").string()}), 2);
    E2E_CHECK_CODE(delta_fleet({root.string(), "--reports", (t / "nope").string()}), 2);
    E2E_CHECK_CODE(delta_fleet({root.string(), up.string()}), 2);
    E2E_CHECK_CODE(delta_fleet({}), 2);             // no ROOT
    E2E_CHECK_CODE(delta_fleet({up.string()}), 3);  // a LOCAL is no root
  }
  CHECK(root_state(root) == before);  // delta-fleet wrote nothing into ROOT
}

namespace {

// Three nodes of one engine, each with its own LOCAL, pulling one ROOT and
// reporting into one DIR: n1 has the engine reload (--peers n2,n3 --then),
// n2 and n3 follow it. The reload command records the version it reloads and
// what n2's and n3's LOCALs hold at that moment.
struct Engine {
  TempDir t;
  fs::path series, root, reports, log;
  fs::path n1, n2, n3;
  Engine() {
    series = gen_series(t / "series", 3);
    root = root_of(t, series, 1);
    reports = t / "reports";
    fs::create_directories(reports);
    log = t / "reloads.log";
    n1 = host_at_zero(t, series, "n1");
    n2 = host_at_zero(t, series, "n2");
    n3 = host_at_zero(t, series, "n3");
    write_file(t / "reload.sh",
               "held() { sed -n 's/.*\"version\": *\"\\([0-9]*\\)\".*/\\1/p' \"$1/.weight_sync/state.json\"; }\n"
               "echo \"$HFDELTA_VERSION n2=$(held " +
                   sh_quote(n2.string()) + ") n3=$(held " + sh_quote(n3.string()) + ")\" >> " + sh_quote(log.string()) +
                   "\n");
  }
  void publish(int v) {
    E2E_REQUIRE_CODE(diff({"-q", save_dir(series, v - 1).string(), save_dir(series, v).string(), root.string()}), 0);
  }
  // The trigger, in the background.
  std::unique_ptr<Background> trigger(const std::string& timeout, bool json = false) {
    std::vector<std::string> args{"--root",         root.string(), "--report-to",
                                  reports.string(), "--host",      "n1",
                                  "--peers",        "n2,n3",       "--peer-timeout",
                                  timeout,          "--then",      "sh " + sh_quote((t / "reload.sh").string()),
                                  n1.string()};
    if (json) args.insert(args.begin(), "--json");
    return std::make_unique<Background>(args, t.path(), "trigger");
  }
  // A follower's pull, in the foreground.
  json follow(const fs::path& local, const std::string& name) {
    const RunResult r = apply({"--json", "--root", root.string(), "--report-to", reports.string(), "--host", name,
                               "--follow", "n1", local.string()});
    E2E_REQUIRE_CODE(r, 0);
    return parse_json(r.out);
  }
  // Until n1's report says it waits for its peers (true) or the trigger ended.
  bool waiting(Background& bg) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline && bg.running()) {
      if (fs::exists(reports / "n1.json") && read_json(reports / "n1.json")["state"] == "waiting_for_peers")
        return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  std::vector<std::string> reloads() const {
    std::vector<std::string> lines;
    if (!fs::exists(log)) return lines;
    std::string all = read_file(log), line;
    for (char c : all)
      if (c == '\n')
        lines.push_back(line), line.clear();
      else
        line += c;
    return lines;
  }
};

}  // namespace

TEST_CASE("hosts: an engine across 3 hosts reloads once every node holds the version, and only then") {
  Engine e;

  // Before the trigger has a report, a follower pulls nothing.
  json f = e.follow(e.n2, "n2");
  CHECK(f["follow"]["pulled"] == false);
  CHECK(contains(f["follow"]["note"].get<std::string>(), "no report yet"));
  CHECK(state_version(e.n2) == "000000");

  // Every node online: the trigger holds 1, says so, waits; the followers pull
  // to 1; the engine is reloaded once, with every node at 1.
  {
    auto trig = e.trigger("60");
    REQUIRE_MESSAGE(e.waiting(*trig), trig->output());
    CHECK(state_version(e.n1) == "000001");
    CHECK(e.reloads().empty());  // not before the peers hold it
    f = e.follow(e.n2, "n2");
    CHECK(f["follow"]["pulled"] == true);
    CHECK(f["to_version"] == "000001");
    e.follow(e.n3, "n3");
    CHECK_MESSAGE(trig->wait() == 0, trig->output());
    CHECK(contains(trig->output(), "every peer holds version 000001"));
  }
  CHECK(e.reloads() == std::vector<std::string>{"000001 n2=000001 n3=000001"});
  json n1 = read_json(e.reports / "n1.json");
  CHECK(n1["state"] == "done");
  CHECK(n1["exit_code"] == 0);

  // A peer offline: the trigger gives up after --peer-timeout with exit 15,
  // naming it and what it holds; no reload; n1 keeps the version.
  e.publish(2);
  {
    auto trig = e.trigger("3", true);
    REQUIRE_MESSAGE(e.waiting(*trig), trig->output());
    e.follow(e.n2, "n2");  // n3 is offline
    CHECK(trig->wait() == 15);
    const std::string out = trig->output();
    const std::string error = out.substr(out.find("delta-apply: error:"));
    CHECK_MESSAGE(contains(error, "1 of 2 peers do not hold version 000002: n3: holds 000001"), out);
    CHECK_MESSAGE(!contains(error, "n2: holds"), out);
    CHECK_MESSAGE(contains(out, "\"exit_code\":15"), out);
    CHECK_MESSAGE(contains(out, "\"kind\":\"peers_not_ready\""), out);
    CHECK_MESSAGE(contains(out, "\"to_version\":\"000002\""), out);
  }
  CHECK(e.reloads().size() == 1);
  CHECK(state_version(e.n1) == "000002");
  n1 = read_json(e.reports / "n1.json");
  CHECK(n1["exit_code"] == 15);
  CHECK(n1["error"]["kind"] == "peers_not_ready");
  CHECK(n1["version"] == "000002");

  // A follower never passes the trigger: n1 holds 2, version 3 is out; n3
  // (back online) goes to 2 only.
  e.publish(3);
  f = e.follow(e.n3, "n3");
  CHECK(f["to_version"] == "000002");
  CHECK(state_version(e.n3) == "000002");

  // A peer behind that catches up while the trigger waits: it succeeds.
  {
    auto trig = e.trigger("60");
    REQUIRE_MESSAGE(e.waiting(*trig), trig->output());
    e.follow(e.n2, "n2");
    std::this_thread::sleep_for(std::chrono::seconds(1));
    CHECK(trig->running());  // n3 still at 2
    CHECK(e.reloads().size() == 1);
    e.follow(e.n3, "n3");
    CHECK_MESSAGE(trig->wait() == 0, trig->output());
  }
  CHECK(e.reloads() == std::vector<std::string>{"000001 n2=000001 n3=000001", "000003 n2=000003 n3=000003"});
  CHECK(state_version(e.n1) == "000003");
}
