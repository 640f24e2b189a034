// delta-apply: thin command over hfdelta's apply functions.
#include <algorithm>
#include <cstdio>
#include <iostream>

#include <boost/filesystem/operations.hpp>
#include <nlohmann/json.hpp>

#include "cli_common.hpp"
#include "forms.hpp"
#include "hfdelta/apply.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/host_report.hpp"
#include "hfdelta/metrics_textfile.hpp"
#include "hfdelta/peers.hpp"
#include "hfdelta/report_json.hpp"
#include "hfdelta/signals.hpp"
#include "hfdelta/verify.hpp"
#include "hfdelta/version.hpp"

using namespace hfdelta;

namespace {

using ull = unsigned long long;

// What the command line asks for.
struct ApplyCommandLine {
  std::vector<std::string> paths;
  std::string root, then, pre_read, metrics;
  bool init = false, status = false, recover = false, verify = false, no_sync = false, json_out = false, quiet = false,
       progress = false;
  std::optional<std::uint64_t> target, version;
  ApplyOptions apply;
  const CLI::Option* root_opt = nullptr;  // --root given (its ROOT may come among the paths)
  // Host reports (--report-to), an engine across hosts (--peers, --follow).
  std::string report, host, follow;
  std::vector<std::string> peers;
  double peer_timeout = 300;
  double stop_grace = cli::kStopGrace;      // --stop-grace
  std::optional<cli::ShellStop> then_stop;  // a stop signal during (or just before) --then
  std::optional<FollowResult> followed;     // --follow: what the pull found
};

// The options of every form, written into `o` when `app` parses.
void add_options(CLI::App& app, ApplyCommandLine& o) {
  app.add_option("PATHS", o.paths, "DELTA LOCAL, SRC LOCAL (--init), or LOCAL (--root, --status, --recover, --verify)")
      ->expected(1, 2)
      ->group("");  // the usage lines name them per form
  app.add_flag("--init", o.init, "Make LOCAL an exact copy of the full checkpoint SRC");
  o.root_opt = app.add_option("--root", o.root,
                              "Publication root holding weight_vNNNNNN version directories; ROOT may also come "
                              "after other options, before LOCAL")
                   ->type_name("ROOT")
                   ->expected(0, 1);  // `--root --json ROOT LOCAL`: ROOT is then the first path
  app.add_flag("--status", o.status, "Report LOCAL's version: exit 0 clean, 10 interrupted, 11 uninitialised");
  app.add_flag("--recover", o.recover, "Only roll back an interrupted apply, if any");
  app.add_flag("--verify", o.verify,
               "Re-hash LOCAL against the checksums recorded for its version: exit 0 clean, "
               "10 interrupted, 11 uninitialised, 12 corrupt");
  app.add_option("--target", o.target, "Version to bring LOCAL to with --root (default: newest)")
      ->type_name("N")
      ->transform(cli::whole_number());
  app.add_option("--init-version", o.version, "Version recorded by --init (default 0)")
      ->type_name("N")
      ->transform(cli::whole_number());
  app.add_option("--then", o.then,
                 "Shell command to run after success while LOCAL is still locked "
                 "(HFDELTA_LOCAL and HFDELTA_VERSION are set)")
      ->type_name("CMD");
  app.add_option("--pre-read", o.pre_read,
                 "With --root: shell command to run before ROOT is read (HFDELTA_ROOT and HFDELTA_LOCAL are set), "
                 "e.g. to refresh a view of an object store; failure exits 14, LOCAL untouched")
      ->type_name("CMD");
  app.add_option("--stop-grace", o.stop_grace,
                 "After a stop signal, which is passed on to the --then (or --pre-read) command, give it SECONDS "
                 "to exit (a reload script resumes its engine) before killing it (default 60)")
      ->type_name("SECONDS")
      ->check(cli::seconds("leave it out for 60"));
  app.add_flag("--require-marker", o.apply.require_marker,
               "With --root: take a version only once its completion marker (hfdelta_complete.json) "
               "and every file it lists are there, even in a root where no version has one yet");
  app.add_flag("--force", o.apply.force,
               "Let --init replace a non-empty directory that is not a LOCAL (no .weight_sync/state.json), "
               "deleting its files");
  app.add_option("--lock-timeout", o.apply.lock_timeout, "Give up after SECONDS waiting for the lock (default: wait)")
      ->type_name("SECONDS")
      ->check(cli::seconds());
  app.add_option("--threads", o.apply.threads, "Worker threads (default: all cores)")
      ->type_name("N")
      ->transform(cli::whole_number())
      ->check(cli::threads());
  app.add_flag("--no-sync", o.no_sync, "Do not flush data before recording the version");
  app.add_flag(
      "--progress", o.progress,
      "Show progress on stderr (bytes done, rate, time left); the default on a terminal, never with -q or --json");
  app.add_flag("--json", o.json_out, "Print the result as one JSON object on stdout");
  app.add_option("--metrics", o.metrics,
                 "Write the run's outcome to FILE as a Prometheus textfile (node_exporter's textfile collector), "
                 "atomically, also when the run fails")
      ->type_name("FILE")
      ->check(CLI::Validator([](std::string& f) { return metrics_file_problem(f); }, ""));
  app.add_flag("-q,--quiet", o.quiet, "Print nothing on success");
}

// --report-to, --host, --peers, --peer-timeout, --follow (docs/operations.md,
// docs/engines.md); the fleet view that reads the reports is delta-fleet.
void add_report_options(CLI::App& app, ApplyCommandLine& o) {
  app.add_option("--report-to", o.report,
                 "With --root: after the pull, write DIR/NAME.json saying what LOCAL holds "
                 "(DIR shared by the hosts, apart from ROOT)")
      ->type_name("DIR");
  app.add_option("--host", o.host, "With --report-to: the report's NAME (default: this machine's host name)")
      ->type_name("NAME");
  app.add_option("--peers", o.peers,
                 "With --report-to and --then: run --then only once every peer's report in DIR says "
                 "it holds LOCAL's version; exit 15 after --peer-timeout")
      ->type_name("NAME,...")
      ->delimiter(',');
  app.add_option("--peer-timeout", o.peer_timeout, "With --peers: give up after SECONDS (default 300)")
      ->type_name("SECONDS")
      ->check(cli::seconds());
  app.add_option("--follow", o.follow,
                 "With --report-to: pull no further than the version NAME's report in DIR holds (the other nodes "
                 "of an engine across hosts)")
      ->type_name("NAME");
}

// Which option goes with which form: the one table the command line is
// checked against, --help's usage lines and the completion are made from.
const cli::Command& apply_command() {
  static const cli::Command c{
      "delta-apply",
      "Bring a host-local checkpoint to a new version, in place. See delta-apply(1).",
      {{"",
        {"DELTA", "LOCAL"},
        {"--then", "--metrics"},
        "apply one delta version directory (or copy one full version)"},
       {"--init",
        {"SRC", "LOCAL"},
        {"--init-version", "--force", "--then", "--metrics"},
        "make LOCAL an exact copy of the full checkpoint SRC"},
       {"--root",
        {"LOCAL"},
        {"--target", "--pre-read", "--require-marker", "--then", "--metrics", "--report-to", "--host", "--peers",
         "--peer-timeout", "--follow"},
        "pull: bring LOCAL to ROOT's newest version (or --target N); --report-to DIR: write DIR/NAME.json after it"},
       {"--status", {"LOCAL"}, {}, "report LOCAL's version: exit 0 clean, 10 interrupted, 11 uninitialised"},
       {"--verify", {"LOCAL"}, {}, "re-hash LOCAL against its recorded checksums: also 12 corrupt"},
       {"--recover", {"LOCAL"}, {}, "only roll back an interrupted apply"}},
      {"--stop-grace", "--lock-timeout", "--threads", "--no-sync", "--progress", "--json", "-q"},
      {{"--host", {"--report-to"}, {}},
       {"--peers", {"--report-to", "--then"}, {}},
       {"--peer-timeout", {"--peers"}, {}},
       {"--follow", {"--report-to"}, {"--peers", "--then", "--target"}}},
      {{"--fleet", "the fleet view is a command of its own: delta-fleet [--reports DIR] ROOT"},
       {"--report", "a pull's host report is written with --report-to DIR"}}};
  return c;
}

std::string version_or_none(const std::optional<std::uint64_t>& v) { return v ? format_version(*v) : "none"; }

void print_pending(const std::optional<std::uint64_t>& pending) {
  if (pending)
    std::printf(", apply of %s interrupted (the next delta-apply rolls it back)", format_version(*pending).c_str());
}

// ---- --status ------------------------------------------------------------------

void print_status_human(const std::string& local, const LocalStatus& s, const char* state) {
  std::printf("%s: %s, version %s", local.c_str(), state, version_or_none(s.version).c_str());
  print_pending(s.pending);
  std::printf("\n");
}

// Reports LOCAL's state; its exit code tells clean, interrupted or uninitialised.
void run_status(const ApplyCommandLine& o, const std::string& local) {
  const LocalStatus s = local_status(local, o.apply);
  const Exit code = status_exit(s);
  if (o.json_out)
    cli::print_json(status_json(local, s));
  else if (!o.quiet)
    print_status_human(local, s, status_state_name(s));
  if (code != Exit::ok) throw Error(code, "");
}

// ---- --verify ------------------------------------------------------------------

void print_verify_human(const std::string& local, const VerifyReport& v) {
  std::printf("%s: %s, version %s", local.c_str(), verify_state_name(v.state), version_or_none(v.version).c_str());
  if (v.state == VerifyReport::State::clean || v.state == VerifyReport::State::corrupt)
    std::printf(" (%s, %s, %s, %s checked)", cli::count(v.weight_files, "weight file").c_str(),
                cli::count(v.tensors, "tensor").c_str(), cli::count(v.files, "other file").c_str(),
                cli::human_bytes(double(v.bytes)).c_str());
  print_pending(v.pending);
  std::printf("\n");
  for (const auto& p : v.problems) std::printf("  %s\n", p.c_str());
}

// Re-hashes LOCAL; its exit code tells clean, interrupted, uninitialised or corrupt.
void run_verify(const ApplyCommandLine& o, const std::string& local) {
  const VerifyReport v = verify_local(local, o.apply.lock_timeout, o.apply.threads);
  cli::ProgressLine::stop_current();
  const Exit code = verify_exit(v);
  if (o.json_out)
    cli::print_json(verify_json(local, v));
  else if (!o.quiet || v.state != VerifyReport::State::clean)
    print_verify_human(local, v);
  if (code != Exit::ok) throw Error(code, "");
}

// ---- --report-to, --peers ------------------------------------------------------------

// Writes DIR/NAME.json; a report that cannot be written is a warning, not
// the pull's failure (the fleet view shows it growing old: --fail-stale).
void write_report(const ApplyCommandLine& o, const std::string& local, Exit code, const std::string& msg,
                  bool waiting) {
  const StopDeferred finish;  // a stop after the pull's commit must not cut the report short
  try {
    HostReport r = current_report({o.report, o.host, local, o.root, cli::program_version()});
    r.exit_code = static_cast<int>(code);
    r.error = msg;
    r.error_kind = code == Exit::ok ? "" : exit_kind(static_cast<int>(code));
    r.waiting_for_peers = waiting;
    write_host_report(o.report, r);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "delta-apply: warning: cannot write the report %s: %s\n",
                 host_report_path(o.report, o.host).string().c_str(), e.what());
  }
}

// --peers: LOCAL holds `v`; says so in its report, then waits for the peers.
void await_peers(const ApplyCommandLine& o, const std::string& local, std::uint64_t v) {
  write_report(o, local, Exit::ok, "", true);
  PeerWaitOptions w{o.peers, o.peer_timeout, 0.5, nullptr};
  if (!o.quiet)
    w.waiting = [&](const std::string& lack) {
      std::fprintf(stderr, "delta-apply: waiting up to %g s for the peers to hold version %s: %s\n", o.peer_timeout,
                   format_version(v).c_str(), lack.c_str());
    };
  const double s = wait_for_peers(o.report, v, w);
  if (!o.quiet && s > 0)
    std::fprintf(stderr, "delta-apply: every peer holds version %s (after %.1f s)\n", format_version(v).c_str(), s);
}

// ---- apply, --init, --root, --recover ------------------------------------------------

// A stop signal during --then (or before it, after the commit): the version
// is applied all the same, and the message says so.
[[noreturn]] void then_stopped(ApplyCommandLine& o, const std::string& local, std::uint64_t v, const Error& e,
                               const cli::ShellStop& s) {
  o.then_stop = s;
  const std::string state = local + " is at version " + format_version(v) + ", applied and committed; ";
  const std::string sig = stop_signal_name(s.signal);
  if (!s.started)
    throw Error(e.code(), "interrupted by " + sig + " before --then: " + state +
                              "the --then command was not run; the next run runs it");
  throw Error(e.code(), "interrupted by " + sig + " during --then: " + state +
                            "the reload was interrupted: the --then command " + cli::describe(s) +
                            "; the next run runs --then again");
}

// Runs the form that changes LOCAL, with --then's command hooked in.
ApplyResult run_change(ApplyCommandLine& o, const std::string& local) {
  if (!o.then.empty())
    o.apply.then = [&o, &local, command = o.then,
                    abs = boost::filesystem::absolute(local).lexically_normal().string()](std::uint64_t v) {
      if (!o.peers.empty()) await_peers(o, local, v);
      cli::ShellStop s;
      try {
        cli::run_shell(command, {{"HFDELTA_LOCAL", abs}, {"HFDELTA_VERSION", format_version(v)}}, Exit::then_failed,
                       "--then", o.stop_grace, &s);
      } catch (const Error& e) {
        if (!s.signal) throw;
        then_stopped(o, local, v, e, s);
      }
    };
  if (o.recover) return recover_local(local, o.apply);
  if (o.init) return init_local(o.paths[0], local, o.version.value_or(0), o.apply);
  if (!o.root.empty()) {
    if (!o.pre_read.empty())
      cli::run_shell(o.pre_read,
                     {{"HFDELTA_ROOT", boost::filesystem::absolute(o.root).lexically_normal().string()},
                      {"HFDELTA_LOCAL", boost::filesystem::absolute(local).lexically_normal().string()}},
                     Exit::hook_pre_read, "--pre-read", o.stop_grace);
    if (!o.follow.empty()) {
      o.followed = pull_following(o.root, local, o.report, o.follow, o.apply);
      return o.followed->result;
    }
    return pull(o.root, local, o.target, o.apply);
  }
  return apply_delta(o.paths[0], local, o.apply);
}

// --metrics: the run's outcome written to FILE whether it succeeds or fails.
// A file that cannot be written is a warning: the run's own outcome stands.
ApplyResult run_with_metrics(ApplyCommandLine& o, const std::string& local) {
  if (o.metrics.empty()) return run_change(o, local);
  RunOutcome run{local, o.root.empty() ? std::nullopt : std::optional<boost::filesystem::path>(o.root), o.apply};
  const auto write = [&](int code) {
    run.exit_code = code;
    try {
      write_metrics_textfile(o.metrics, run);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "delta-apply: warning: %s\n", e.what());
    }
  };
  try {
    const ApplyResult r = run_change(o, local);
    run.result = &r;
    write(static_cast<int>(r.then_error ? r.then_code : Exit::ok));
    return r;
  } catch (const Error& e) {
    write(static_cast<int>(e.code()));
    throw;
  } catch (const std::exception&) {
    write(static_cast<int>(Exit::failure));
    throw;
  }
}

// Where the time went: before --then (the engine serves the old weights),
// and --then itself (its reload: the pause); each version of a pull.
void print_phases_human(const std::string& local, const ApplyResult& r) {
  const PhaseTimes& t = r.phases;
  std::printf("%s: phases: lock %.3f s, read %.3f s, patch %.3f s, sync %.3f s: %.3f s before --then", local.c_str(),
              t.lock, t.read, t.patch, t.sync, t.before_then());
  if (t.then)
    std::printf("; then %.3f s\n", *t.then);
  else
    std::printf("; no --then\n");
  if (r.version_phases.size() < 2) return;
  for (const VersionPhases& v : r.version_phases)
    std::printf("  version %s (%s): read %.3f s, patch %.3f s, sync %.3f s\n", format_version(v.version).c_str(),
                v.full ? "full" : "delta", v.read, v.patch, v.sync);
}

// Complete versions above one that is not: it was most likely cut short,
// and stops every host until the operator withdraws it.
void print_stall(const ApplyResult& r) {
  std::string list;
  for (const auto v : r.newer_complete) list += (list.empty() ? "" : ", ") + format_version(v);
  const std::string stuck = format_version(*r.not_published_yet);
  std::fprintf(stderr,
               "delta-apply: warning: version %s is incomplete, but newer version(s) %s are complete: if its "
               "publisher died, version %s will never arrive; withdraw it on the publishing side (delta-diff "
               "--withdraw ROOT/weight_v%s), then publish a full version (delta-diff --full NEW ROOT) for the "
               "hosts below it\n",
               stuck.c_str(), list.c_str(), stuck.c_str(), stuck.c_str());
}

void print_change_human(const std::string& local, const ApplyResult& r, bool recover) {
  if (r.rolled_back)
    std::printf("%s: rolled back an interrupted apply of version %s\n", local.c_str(),
                format_version(*r.rolled_back).c_str());
  const std::string from = version_or_none(r.from_version);
  const std::string to = format_version(r.to_version);
  if (recover) {
    if (!r.rolled_back) std::printf("%s: nothing to recover, version %s\n", local.c_str(), from.c_str());
  } else if (r.record_rewritten) {
    std::printf("%s: files already at version %s; its missing or damaged checksum record was rewritten\n",
                local.c_str(), to.c_str());
  } else if (r.noop && r.not_published_yet) {
    std::printf("%s: version %s is not published yet (%s); %s\n", local.c_str(),
                format_version(*r.not_published_yet).c_str(), r.waiting_for.c_str(),
                r.no_version ? "no version yet" : ("stays at version " + to).c_str());
    if (!r.newer_complete.empty()) print_stall(r);
  } else if (r.published && !r.newest) {
    std::printf("%s: nothing published yet; %s\n", local.c_str(),
                r.from_version ? ("stays at version " + from).c_str() : "no version yet");
  } else if (r.noop) {
    std::printf("%s: already at %sversion %s\n", local.c_str(), r.newest == r.to_version ? "the newest " : "",
                to.c_str());
  } else {
    if (!r.fallback.empty()) std::printf("%s: %s\n", local.c_str(), r.fallback.c_str());
    // The entries are what the patching read; a delta version directory
    // (delta-diff's "delta" figure) also holds its headers, index and marker.
    const std::string read_from =
        r.root_bytes ? " (" + cli::human_bytes(double(r.root_bytes)) + " of versions read)" : "";
    std::printf("%s: version %s -> %s (%s), %s patched from %s of tensor entries%s, %s written, %llu removed, %.3f s\n",
                local.c_str(), from.c_str(), to.c_str(), cli::count(r.applied.size(), "version").c_str(),
                cli::count(r.tensors_patched, "tensor").c_str(), cli::human_bytes(double(r.delta_bytes)).c_str(),
                read_from.c_str(), cli::count(r.files_written, "file").c_str(), ull(r.files_removed), r.seconds);
  }
  if (!recover && (!r.applied.empty() || r.phases.then)) print_phases_human(local, r);
}

// --report-to DIR: the pull, then DIR/NAME.json, whatever the outcome.
ApplyResult run_reported(ApplyCommandLine& o, const std::string& local) {
  check_reports_dir(o.report, o.root);
  if (o.host.empty()) o.host = default_host_name();
  check_host_name(o.host, "--host");
  for (const std::string& p : o.peers) check_host_name(p, "--peers");
  if (!o.follow.empty()) check_host_name(o.follow, "--follow");
  try {
    ApplyResult r = run_with_metrics(o, local);
    write_report(o, local, r.then_error ? r.then_code : Exit::ok, r.then_error.value_or(""), false);
    return r;
  } catch (const Error& e) {
    write_report(o, local, e.code(), e.what(), false);
    throw;
  } catch (const CLI::ParseError& e) {
    write_report(o, local, Exit::usage, e.what(), false);
    throw;
  } catch (const std::exception& e) {
    write_report(o, local, Exit::failure, e.what(), false);
    throw;
  }
}

// --json's "stopped": the signal, the version LOCAL holds (applied and
// committed) and how the --then command ended.
nlohmann::json then_stop_json(const cli::ShellStop& s, const ApplyResult& r) {
  using nlohmann::json;
  return {{"signal", stop_signal_name(s.signal)},
          {"during", "then"},
          {"version", format_version(r.to_version)},
          {"then",
           {{"started", s.started},
            {"exit_status", s.exit_status ? json(*s.exit_status) : json()},
            {"ended_by_signal", s.ended_by ? json(s.ended_by) : json()},
            {"killed", s.killed},
            {"grace_seconds", s.started ? json(s.grace) : json()}}}};
}

void print_change(const ApplyCommandLine& o, const std::string& local, const ApplyResult& r) {
  if (o.json_out) {
    nlohmann::json j = change_json(local, r);
    if (o.followed) j["follow"] = follow_json(o.follow, *o.followed);
    if (o.then_stop) j["stopped"] = then_stop_json(*o.then_stop, r);
    return cli::print_json(j);
  }
  if (o.quiet) return;
  if (o.followed && !o.followed->pulled)
    std::printf("%s: %s\n", local.c_str(), o.followed->note.c_str());
  else
    print_change_human(local, r, o.recover);
}

// The body of every form, once the command line has parsed and fits its form.
void run_command(const CLI::App& app, ApplyCommandLine& o) {
  const cli::Form& form = cli::select_form(app, apply_command());
  if (*o.root_opt && o.root.empty()) {  // --root without its ROOT right after it: the first of two paths
    if (o.paths.size() != 2) throw CLI::ValidationError("--root", "needs ROOT: --root ROOT LOCAL");
    o.root = o.paths.front();
    o.paths.erase(o.paths.begin());
  }
  cli::check_form(app, apply_command(), form, o.paths);
  o.apply.sync = !o.no_sync;
  const cli::ProgressLine progress_line(cli::progress_wanted(o.progress, o.quiet, o.json_out));
  for (std::string& p : o.paths) p = strip_trailing_slashes(p).string();  // "LOCAL/" names LOCAL
  if (!o.root.empty()) o.root = strip_trailing_slashes(o.root).string();
  const std::string local = o.paths.back();
  if (o.status) return run_status(o, local);
  if (o.verify) return run_verify(o, local);
  const ApplyResult r = o.report.empty() ? run_with_metrics(o, local) : run_reported(o, local);
  cli::ProgressLine::stop_current();
  print_change(o, local, r);
  if (!r.then_error) return;  // after the summary: the version is applied
  if (static_cast<int>(r.then_code) > 128) throw cli::StopReported(r.then_code, *r.then_error);
  throw Error(r.then_code, *r.then_error);
}

}  // namespace

int main(int argc, char** argv) {
  hfdelta::handle_stop_signals();  // first: every thread started later inherits the mask
  CLI::App app{apply_command().about, "delta-apply"};
  ApplyCommandLine o;
  add_options(app, o);
  add_report_options(app, o);
  cli::set_forms(app, apply_command());
  return cli::run(
      app, argc, argv, [&] { run_command(app, o); }, &o.json_out);
}
