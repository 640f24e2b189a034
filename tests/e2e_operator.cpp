// End-to-end: the operator's side of both commands. One JSON object on stdout
// for every outcome with --json; the --then command's output kept off stdout
// and its failure still summarised; stdout write errors; --version; the
// reload command's environment; --status and --verify on a read-only LOCAL
// and as a user who cannot write it.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "e2e_util.hpp"

using namespace e2e;

namespace {

// The one JSON object a --json run printed, whatever its exit code.
json one_object(const RunResult& r) {
  INFO(r.describe());
  REQUIRE(!r.out.empty());
  REQUIRE(r.out.find('\n') == r.out.size() - 1);  // one line, one object
  json j = parse_json(r.out);
  REQUIRE(j.is_object());
  CHECK(j["schema"] == 1);
  return j;
}

void check_failure(const RunResult& r, int code, const std::string& kind, const std::string& path) {
  E2E_CHECK_CODE(r, code);
  const json j = one_object(r);
  CHECK(j["ok"] == false);
  CHECK(j["exit_code"] == code);
  CHECK(j["error"]["kind"] == kind);
  CHECK(contains(j["error"]["message"].get<std::string>(), path));
  CHECK(contains(r.err, j["error"]["message"].get<std::string>()));  // the same words on stderr
  if (!path.empty()) CHECK(j["error"]["path"] == path);
}

}  // namespace

TEST_CASE("--json: one object for every outcome, failures included") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 2);
  const fs::path root = t / "root", local = t / "local";
  fs::create_directories(root);
  E2E_REQUIRE_CODE(diff({"-q", save_dir(s, 0).string(), save_dir(s, 1).string(), root.string()}), 0);
  require_init(save_dir(s, 0), local);

  SUBCASE("success") {
    const json j = one_object(apply({"--json", "--root", root.string(), local.string()}));
    CHECK(j["ok"] == true);
    CHECK(j["to_version"] == "000001");
  }
  SUBCASE("delta-diff: a BASE that is not a checkpoint (3), an existing OUT (7)") {
    fs::create_directories(t / "empty");  // a share not mounted: no weight files
    check_failure(diff({"--json", (t / "empty").string(), save_dir(s, 1).string(), root.string()}), 3, "bad_input",
                  (t / "empty").string());
    check_failure(diff({"--json", (t / "nothing").string(), save_dir(s, 1).string(), root.string()}), 2, "usage",
                  (t / "nothing").string());
    check_failure(diff({"--json", save_dir(s, 0).string(), save_dir(s, 1).string(), version_dir(root, 1).string()}), 7,
                  "exists", version_dir(root, 1).string());
  }
  SUBCASE("delta-apply: out of order (4), a usage error (2), a damaged delta (3)") {
    check_failure(apply({"--json", "--root", root.string(), "--target", "9", local.string()}), 4, "out_of_order",
                  root.string());
    const RunResult u = apply({"--json", "--bogus", local.string()});
    E2E_CHECK_CODE(u, 2);
    CHECK(one_object(u)["error"]["kind"] == "usage");
    std::string index = read_file(version_dir(root, 1) / "model.safetensors.index.json");
    index[0] = '[';  // damaged, same size: complete by its marker
    write_file(version_dir(root, 1) / "model.safetensors.index.json", index);
    const RunResult d = apply({"--json", "--root", root.string(), local.string()});
    E2E_CHECK_CODE(d, 3);
    CHECK(one_object(d)["error"]["kind"] == "bad_input");
  }
  SUBCASE("--status on an interrupted-free, uninitialised LOCAL: exit 11, one object saying so") {
    fs::create_directories(t / "empty");
    const RunResult r = apply({"--json", "--status", (t / "empty").string()});
    E2E_CHECK_CODE(r, 11);
    const json j = one_object(r);
    CHECK(j["state"] == "uninitialised");
    CHECK(j["ok"] == false);
    CHECK(j["exit_code"] == 11);
  }
}

TEST_CASE("--then: its output goes to stderr; when it fails the summary still says what was applied (exit 9)") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 2);
  const fs::path root = t / "root", local = t / "local";
  fs::create_directories(root);
  for (int v = 1; v <= 2; ++v)
    E2E_REQUIRE_CODE(diff({"-q", save_dir(s, v - 1).string(), save_dir(s, v).string(), root.string()}), 0);
  require_init(save_dir(s, 0), local);
  // A relative LOCAL: the command is told its absolute path (an engine runs elsewhere).
  const std::string rel = fs::relative(local, fs::current_path()).string();

  const RunResult ok = apply({"--json", "--target", "1", "--root", root.string(), rel, "--then",
                              "echo '{\"fake\": 1}'; echo \"local=$HFDELTA_LOCAL\" >&2"});
  E2E_REQUIRE_CODE(ok, 0);
  CHECK(one_object(ok)["to_version"] == "000001");
  CHECK(contains(ok.err, "{\"fake\": 1}"));
  CHECK(contains(ok.err, "local=" + local.string()));

  const RunResult bad = apply({"--json", "--root", root.string(), local.string(), "--then", "echo reloading; exit 3"});
  E2E_CHECK_CODE(bad, 9);
  const json j = one_object(bad);
  CHECK(j["ok"] == false);
  CHECK(j["exit_code"] == 9);
  CHECK(j["error"]["kind"] == "then_failed");
  CHECK(j["to_version"] == "000002");  // applied all the same
  CHECK(j["applied"] == json::array({"000002"}));
  CHECK(state_json(local) == json{{"version", "000002"}});
  CHECK(contains(bad.err, "reloading"));

  // Without --json: the human summary, then the error.
  const RunResult human = apply({"--root", root.string(), local.string(), "--then", "exit 4"});
  E2E_CHECK_CODE(human, 9);
  CHECK(contains(human.out, "already at the newest version 000002"));
  CHECK(contains(human.err, "--then command failed (exit status 4)"));
}

TEST_CASE("stdout that cannot be written is an error; --version is the program's") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 1);
  const fs::path local = t / "local";
  require_init(save_dir(s, 0), local);
  // /dev/full: every write fails with ENOSPC.
  const RunResult full = run({"/bin/sh", "-c", "\"$0\" --status \"$1\" > /dev/full", apply_bin(), local.string()});
  E2E_CHECK_CODE(full, 1);
  CHECK(contains(full.err, "cannot write to standard output"));
  const RunResult fullj =
      run({"/bin/sh", "-c", "\"$0\" --json --status \"$1\" > /dev/full", apply_bin(), local.string()});
  E2E_CHECK_CODE(fullj, 1);

  for (const auto& [bin, name] : {std::pair{diff_bin(), "delta-diff"}, std::pair{apply_bin(), "delta-apply"}}) {
    const RunResult v = run({bin, "--version"});
    E2E_CHECK_CODE(v, 0);
    CHECK(v.out.rfind(std::string(name) + " (hfdelta) ", 0) == 0);
    // The old meaning (a version number) is refused, not taken for "print the version and exit 0".
    const RunResult old = run({bin, "--version", "7", "a", "b"});
    E2E_CHECK_CODE(old, 2);
    CHECK(contains(old.err, std::string(name) == "delta-diff" ? "--delta-version" : "--init-version"));
  }
  // The generator is installed with them, of the same version.
  const RunResult g = run({gen_bin(), "--version"});
  E2E_CHECK_CODE(g, 0);
  const std::string version = run({diff_bin(), "--version"}).out.substr(std::string("delta-diff").size());
  CHECK_MESSAGE(g.out == "hfdelta-gen" + version, g.out);
}

TEST_CASE("--status and --verify on a read-only LOCAL and as a user who cannot write it, with --lock-timeout") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 1);
  const fs::path local = t / "local";
  require_init(save_dir(s, 0), local);
  const fs::path ro = t / "ro";
  fs::create_directories(ro);
  const std::string mount = system_tool("mount");
  const RunResult m = run({mount, "--bind", "-o", "ro", local.string(), ro.string()});
  if (m.code != 0) {
    MESSAGE("skipped the read-only mount: " << m.describe());
  } else {
    for (const char* form : {"--status", "--verify"}) {
      const RunResult r = apply({form, "--json", "--lock-timeout", "5", ro.string()});
      E2E_CHECK_CODE(r, 0);
      CHECK(parse_json(r.out)["state"] == "clean");
    }
    unmount(ro);
  }
  // As nobody: LOCAL is root's, 0755 directories and 0644 files.
  const std::string setpriv = system_tool("setpriv");
  if (setpriv.empty() || ::geteuid() != 0) {
    MESSAGE("skipped the other user: needs root and setpriv");
  } else {
    fs::permissions(t.path(), fs::add_perms | fs::others_exe | fs::others_read);
    for (const char* form : {"--status", "--verify"}) {
      const RunResult r = run(
          {setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", apply_bin(), form, "--json", local.string()});
      E2E_CHECK_CODE(r, 0);
      CHECK(contains(r.out, "\"clean\""));
    }
  }
  // A writer holds the lock: the readers wait, and give up at --lock-timeout (exit 8).
  const pid_t held = spawn({"/usr/bin/flock", (local / ".weight_sync" / "lock").string(), "sleep", "5"});
  ::usleep(300 * 1000);
  for (const char* form : {"--status", "--verify"})
    E2E_CHECK_CODE(apply({form, "--lock-timeout", "0.2", local.string()}), 8);
  ::kill(held, SIGTERM);
  ::waitpid(held, nullptr, 0);
}

TEST_CASE("progress: on a terminal by default, with --progress in a log; never with -q or --json") {
  const std::string script = system_tool("script");
  if (script.empty()) {
    MESSAGE("skipped: script(1) is not installed (util-linux), so no terminal to run under");
    return;
  }
  TempDir t;
  // Large enough, at zstd level 12, that a one-thread diff outlasts a few
  // redraws (200 ms each) on a fast machine too (about 1 s here).
  const fs::path s = t / "series";
  E2E_REQUIRE_CODE(run({gen_bin(), "--preset", "small", "--saves", "1", s.string()}), 0);
  auto diff_cmd = [&](const std::string& out, const std::string& extra) {
    return diff_bin() + " --threads 1 --encoding auto --level 12 " + extra + " " + save_dir(s, 0).string() + " " +
           save_dir(s, 1).string() + " " + (t / out).string() + " --delta-version 1";
  };
  // Under script(1) stderr is a terminal: progress redrawn in place, cleared before the summary.
  const RunResult tty = run({script, "-qec", diff_cmd("d1", ""), "/dev/null"});
  E2E_REQUIRE_CODE(tty, 0);
  CHECK(contains(tty.out, "\r\033[Kdiff: "));
  CHECK(contains(tty.out, " of 110."));
  CHECK(contains(tty.out, "/s, "));
  CHECK(contains(tty.out, " s left"));
  CHECK(contains(tty.out, "tensors changed"));
  for (const char* quiet : {"-q", "--json"}) {
    const RunResult r = run({script, "-qec", diff_cmd(std::string("d-") + (quiet + 2), quiet), "/dev/null"});
    E2E_CHECK_CODE(r, 0);
    CHECK_FALSE(contains(r.out, "diff: "));
  }
  // Not a terminal: nothing unless asked.
  const RunResult plain = diff({"--threads", "1", save_dir(s, 0).string(), save_dir(s, 1).string(), (t / "d2").string(),
                                "--delta-version", "1"});
  E2E_CHECK_CODE(plain, 0);
  CHECK_FALSE(contains(plain.err, "diff: "));
  // --verify with --progress into a log: at most a line every 2 s, so a short run may print none; it must not break the summary.
  const fs::path local = t / "local";
  require_init(save_dir(s, 0), local);
  const RunResult v = apply({"--verify", "--progress", local.string()});
  E2E_CHECK_CODE(v, 0);
  CHECK(contains(v.out, "clean"));
}
