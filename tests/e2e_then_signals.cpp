// End-to-end: a stop signal while delta-apply's --then (or --pre-read)
// command runs. delta-apply passes the signal on to the command's process
// group (a reload script's trap runs and resumes its engine; the script's own
// child, here a `sleep` in the foreground as curl would be, stops too), waits
// for it up to --stop-grace, kills the group after that, and exits 128 + N
// saying what it left: LOCAL at the new version, applied and committed, the
// reload interrupted, and how the command ended (in --json and --report-to too).
// No bound on any time: a run that does not end is killed after a minute and
// fails the test (without the signal passed on it would sleep 600 s).
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "e2e_util.hpp"

using namespace e2e;

namespace {

// ROOT publishing version 1, LOCAL at version 0, and a directory for the
// command's marker files.
struct Setup {
  TempDir t;
  fs::path series = gen_series(t / "series", 1);
  fs::path root = t / "root", local = t / "local", marks = t / "marks", reports = t / "reports";
  Setup() {
    fs::create_directories(root);
    fs::create_directories(marks);
    fs::create_directories(reports);
    require_diff(save_dir(series, 0), save_dir(series, 1), version_dir(root, 1), "xor");
    require_init(save_dir(series, 0), local);
  }
  fs::path mark(const std::string& name) const { return marks / name; }
};

// A hook command in the reload scripts' shape: `trap` set first, then its pid
// written, then a child in the foreground (its pid written, then it sleeps
// 600 s), then "finished" written (the child ended by itself).
std::string hook(const Setup& s, const std::string& trap) {
  const std::string m = sh_quote(s.marks.string());
  return trap + "; echo $$ > " + m + "/script.pid; sh -c 'echo $$ > \"$1\"/child.pid; exec sleep 600' child " + m +
         "; echo finished > " + m + "/finished";
}

// The same as a script file, as the contrib reload scripts are run: then
// `/bin/sh -c FILE` (the group's leader) dies of the signal at once while the
// script runs its trap.
std::string hook_file(const Setup& s, const std::string& trap) {
  const fs::path f = s.t / "hook.sh";
  write_file(f, "#!/bin/sh\n" + hook(s, trap) + "\n");
  fs::permissions(f, fs::owner_all);
  return f.string();
}

// delta-apply started with its stdout and stderr in files; killed (and the
// command's two processes) if the test ends before it did.
struct Run {
  const Setup& s;
  fs::path out, err;
  pid_t pid = -1;
  int code = -1;
  Run(const Setup& setup, const std::vector<std::string>& args) : s(setup), out(s.t / "out"), err(s.t / "err") {
    std::vector<std::string> argv{apply_bin()};
    argv.insert(argv.end(), args.begin(), args.end());
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    pid = spawn(argv, o, e);
    ::close(o);
    ::close(e);
  }
  ~Run() {
    if (pid <= 0) return;  // it ended: so did its command (or the test says otherwise)
    for (const char* f : {"script.pid", "child.pid"})
      if (fs::exists(s.mark(f))) ::kill(std::stoi(read_file(s.mark(f))), SIGKILL);
    ::kill(pid, SIGKILL);
    wait_exit(60);
  }
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  // Waits up to `seconds` for it to exit; false if it still runs.
  bool wait_exit(double seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (pid > 0) {
      int status = 0;
      const pid_t r = ::waitpid(pid, &status, WNOHANG);
      if (r == pid) {
        code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        pid = -1;
      } else if (r < 0 && errno != EINTR) {
        pid = -1;  // not ours to wait for (cannot happen)
      } else if (std::chrono::steady_clock::now() >= deadline) {
        return false;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    return true;
  }
  // Waits until the command's child runs (its pid file is written).
  void wait_command() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!fs::exists(s.mark("child.pid")) || read_file(s.mark("child.pid")).empty()) {
      REQUIRE_MESSAGE(!wait_exit(0), "delta-apply ended before --then ran: " << output());
      REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline, "--then did not start: " << output());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  // Sends `sig` once the command runs; its exit code.
  int stop(int sig) {
    wait_command();
    REQUIRE(::kill(pid, sig) == 0);
    REQUIRE_MESSAGE(wait_exit(60), "delta-apply still runs a minute after the signal: " << output());
    return code;
  }
  std::string output() const {
    return "--- stdout ---\n" + (fs::exists(out) ? read_file(out) : "") + "--- stderr ---\n" +
           (fs::exists(err) ? read_file(err) : "");
  }
};

// Whether process `pid` is gone (or a zombie waiting for its parent).
bool gone(const fs::path& pid_file) {
  const std::string stat = "/proc/" + std::to_string(std::stoi(read_file(pid_file))) + "/stat";
  if (!fs::exists(stat)) return true;
  const std::string st = read_file(stat);
  const std::size_t paren = st.rfind(')');
  return paren != std::string::npos && st.size() > paren + 2 && st[paren + 2] == 'Z';
}

// LOCAL at version 1, clean, and the message naming that state.
void check_applied(const Setup& s, const std::string& message) {
  CHECK(contains(message, s.local.string() + " is at version 000001, applied and committed"));
  CHECK(contains(message, "the reload was interrupted"));
  CHECK(state_version(s.local) == "000001");
  E2E_CHECK_TREE_EQUAL(s.local, save_dir(s.series, 1));
  E2E_CHECK_CODE(apply({"--status", s.local.string()}), 0);
}

}  // namespace

TEST_CASE("then-signals: SIGTERM during --then reaches the command's trap; exit 143, LOCAL at the new version") {
  Setup s;
  // The trap takes a while (a resume request): delta-apply waits for it.
  const std::string resumed = sh_quote(s.mark("resumed").string());
  Run r(s, {"--json", "--root", s.root.string(), "--report-to", s.reports.string(), "--host", "h1", "--then",
            hook_file(s, "trap 'sleep 0.5; echo resumed > " + resumed + "; exit 143' TERM"), s.local.string()});
  const int code = r.stop(SIGTERM);
  INFO(r.output());
  CHECK(code == 128 + SIGTERM);
  CHECK(fs::exists(s.mark("resumed")));         // the trap ran, before delta-apply exited ...
  CHECK_FALSE(fs::exists(s.mark("finished")));  // ... at once: its foreground child got the signal too
  CHECK(gone(s.mark("script.pid")));
  CHECK(gone(s.mark("child.pid")));

  const json j = parse_json(read_file(r.out));
  CHECK(j["ok"] == false);
  CHECK(j["exit_code"] == 128 + SIGTERM);
  CHECK(j["error"]["kind"] == "stopped");
  CHECK(j["to_version"] == "000001");
  CHECK(j["applied"] == json::array({"000001"}));
  const json& st = j["stopped"];
  CHECK(st["signal"] == "SIGTERM");
  CHECK(st["during"] == "then");
  CHECK(st["version"] == "000001");
  CHECK(st["then"]["started"] == true);
  // The shell running the file: dash dies of the signal, a shell that execs
  // the file is the script, which exits 143.
  CHECK((st["then"]["ended_by_signal"] == SIGTERM || st["then"]["exit_status"] == 143));
  CHECK(st["then"]["killed"] == false);
  CHECK(st["then"]["grace_seconds"] == 60);
  const std::string msg = j["error"]["message"];
  check_applied(s, msg);
  CHECK(contains(msg, "interrupted by SIGTERM during --then"));
  CHECK(contains(msg, "the --then command was passed SIGTERM; all its processes ended within 60 s"));
  CHECK(contains(read_file(r.err), "delta-apply: error: " + msg + "\n"));  // nothing added: no "rolled back"
  CHECK_FALSE(contains(read_file(r.err), "rolled back"));

  const json rep = read_json(s.reports / "h1.json");
  CHECK(rep["version"] == "000001");
  CHECK(rep["exit_code"] == 128 + SIGTERM);
  CHECK(rep["error"]["kind"] == "stopped");
  CHECK(rep["error"]["message"] == msg);

  // The next run runs --then again, on its no-op.
  E2E_CHECK_CODE(
      apply({"-q", "--root", s.root.string(), "--then", "echo again > " + s.mark("again").string(), s.local.string()}),
      0);
  CHECK(fs::exists(s.mark("again")));
}

TEST_CASE("then-signals: a --then command that ignores the signal is killed after --stop-grace") {
  Setup s;
  Run r(s,
        {"--stop-grace", "1", "--root", s.root.string(), "--then", hook(s, "trap '' INT TERM HUP"), s.local.string()});
  const int code = r.stop(SIGINT);
  INFO(r.output());
  CHECK(code == 128 + SIGINT);
  CHECK_FALSE(fs::exists(s.mark("finished")));
  CHECK(gone(s.mark("script.pid")));  // the whole group killed
  CHECK(gone(s.mark("child.pid")));
  const std::string err = read_file(r.err);
  check_applied(s, err);
  CHECK(contains(err, "interrupted by SIGINT during --then"));
  CHECK(contains(err, "the --then command was passed SIGINT; still running 1 s later, it was killed"));
  CHECK(contains(read_file(r.out), "version 000000 -> 000001"));  // the summary, before the error
}

TEST_CASE("then-signals: --json says how a killed --then command ended") {
  Setup s;
  Run r(s, {"--json", "--stop-grace", "0.5", "--root", s.root.string(), "--then", hook(s, "trap '' INT TERM HUP"),
            s.local.string()});
  CHECK(r.stop(SIGHUP) == 128 + SIGHUP);
  INFO(r.output());
  const json j = parse_json(read_file(r.out));
  check_applied(s, j["error"]["message"]);
  const json& st = j["stopped"];
  CHECK(st["signal"] == "SIGHUP");
  CHECK(st["then"]["killed"] == true);
  CHECK(st["then"]["ended_by_signal"] == SIGKILL);
  CHECK(st["then"]["exit_status"].is_null());
  CHECK(st["then"]["grace_seconds"] == 0.5);
}

TEST_CASE("then-signals: SIGTERM during --pre-read reaches its command; LOCAL untouched") {
  Setup s;
  Run r(s, {"--root", s.root.string(), "--pre-read",
            hook(s, "trap 'echo stopped > " + sh_quote(s.mark("stopped").string()) + "; exit 1' TERM"), "--then",
            "echo ran > " + s.mark("then").string(), s.local.string()});
  CHECK(r.stop(SIGTERM) == 128 + SIGTERM);
  INFO(r.output());
  CHECK(fs::exists(s.mark("stopped")));
  CHECK_FALSE(fs::exists(s.mark("then")));
  CHECK(contains(read_file(r.err),
                 "--pre-read command interrupted by SIGTERM: it was passed SIGTERM; all its processes ended "
                 "within 60 s (its shell: exit status 1)"));
  CHECK(state_version(s.local) == "000000");
  E2E_CHECK_TREE_EQUAL(s.local, save_dir(s.series, 0));
}

TEST_CASE("then-signals: --stop-grace takes seconds >= 0") {
  Setup s;
  const RunResult r = apply({"--stop-grace", "-1", "--root", s.root.string(), s.local.string()});
  E2E_CHECK_CODE(r, 2);
  CHECK(contains(r.err, "--stop-grace"));
  CHECK(state_version(s.local) == "000000");
}
