// delta-apply: thin command over hfdelta's apply functions.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cli_common.hpp"
#include "hfdelta/signals.hpp"
#include "hfdelta/apply.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/verify.hpp"
#include "hfdelta/version.hpp"

using namespace hfdelta;

namespace {

using ull = unsigned long long;

nlohmann::json version_json(const std::optional<std::uint64_t>& v) {
  return v ? nlohmann::json(format_version(*v)) : nlohmann::json();
}

}  // namespace

int main(int argc, char** argv) {
  hfdelta::handle_stop_signals();  // first: every thread started later inherits the mask
  CLI::App app{"Bring a host-local checkpoint to a new version, in place.\n"
               "  delta-apply [OPTIONS] DELTA LOCAL\n"
               "  delta-apply --init [--version N] [--force] SRC LOCAL\n"
               "  delta-apply --root ROOT [--target N] LOCAL\n"
               "  delta-apply --status LOCAL | --recover LOCAL | --verify LOCAL",
               "delta-apply"};
  std::vector<std::string> paths;
  std::string root, then;
  bool init = false, status = false, recover = false, verify = false, no_sync = false, json_out = false, quiet = false;
  std::optional<std::uint64_t> target, version;
  ApplyOptions o;
  app.add_option("PATHS", paths, "DELTA LOCAL, SRC LOCAL (--init), or LOCAL (--root, --status, --recover, --verify)")
      ->expected(1, 2);
  auto* init_opt = app.add_flag("--init", init, "Make LOCAL an exact copy of the full checkpoint SRC");
  auto* root_opt = app.add_option("--root", root, "Publication root holding weight_vNNNNNN version directories");
  auto* status_opt = app.add_flag("--status", status, "Report LOCAL's version: exit 0 clean, 10 interrupted, 11 uninitialised");
  auto* recover_opt = app.add_flag("--recover", recover, "Only roll back an interrupted apply, if any");
  auto* verify_opt = app.add_flag("--verify", verify,
                                  "Re-hash LOCAL against the checksums recorded for its version: exit 0 clean, "
                                  "10 interrupted, 11 uninitialised, 12 corrupt");
  app.add_option("--target", target, "Version to bring LOCAL to with --root (default: newest)")->needs(root_opt);
  app.add_option("--version", version, "Version recorded by --init (default 0)")->needs(init_opt);
  root_opt->excludes(init_opt, status_opt, recover_opt, verify_opt);
  init_opt->excludes(status_opt, recover_opt, verify_opt);
  status_opt->excludes(recover_opt, verify_opt);
  recover_opt->excludes(verify_opt);
  auto* then_opt = app.add_option("--then", then,
                                  "Shell command to run after success while LOCAL is still locked "
                                  "(HFDELTA_LOCAL and HFDELTA_VERSION are set)");
  then_opt->excludes(status_opt, recover_opt, verify_opt);
  app.add_flag("--force", o.force,
               "Let --init replace a non-empty directory that is not a LOCAL (no .weight_sync/state.json), "
               "deleting its files")
      ->needs(init_opt);
  app.add_option("--lock-timeout", o.lock_timeout, "Give up after SECONDS waiting for the lock (default: wait)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--threads", o.threads, "Worker threads (default: all cores)")->check(CLI::NonNegativeNumber);
  app.add_flag("--no-sync", no_sync, "Do not flush data before recording the version");
  app.add_flag("--json", json_out, "Print the result as one JSON object on stdout");
  app.add_flag("-q,--quiet", quiet, "Print nothing on success");

  return cli::run(app, argc, argv, [&] {
    o.sync = !no_sync;
    const std::size_t want = (root.empty() && !status && !recover && !verify) ? 2 : 1;
    if (paths.size() != want)
      throw CLI::ValidationError("PATHS", want == 1 ? "expected LOCAL only" : (init ? "expected SRC LOCAL" : "expected DELTA LOCAL"));
    const std::string local = paths.back();

    if (status) {
      const LocalStatus s = local_status(local, o);
      const char* state = s.pending ? "interrupted" : s.version ? "clean" : "uninitialised";
      if (json_out) {
        std::cout << nlohmann::json{{"local", local}, {"state", state}, {"version", version_json(s.version)},
                                    {"pending", version_json(s.pending)}}
                         .dump()
                  << std::endl;
      } else if (!quiet) {
        std::printf("%s: %s, version %s", local.c_str(), state, s.version ? format_version(*s.version).c_str() : "none");
        if (s.pending) std::printf(", apply of %s interrupted (the next delta-apply rolls it back)", format_version(*s.pending).c_str());
        std::printf("\n");
      }
      if (s.pending) throw Error(Exit::interrupted, "");
      if (!s.version) throw Error(Exit::uninitialised, "");
      return;
    }

    if (verify) {
      const VerifyReport v = verify_local(local, o.lock_timeout, o.threads);
      const char* state = v.state == VerifyReport::State::clean         ? "clean"
                          : v.state == VerifyReport::State::interrupted ? "interrupted"
                          : v.state == VerifyReport::State::uninitialised ? "uninitialised"
                                                                          : "corrupt";
      if (json_out) {
        std::cout << nlohmann::json{{"local", local},          {"state", state},
                                    {"version", version_json(v.version)}, {"pending", version_json(v.pending)},
                                    {"weight_files", v.weight_files}, {"tensors", v.tensors},
                                    {"files", v.files},        {"bytes", v.bytes},
                                    {"problems", v.problems}}
                         .dump()
                  << std::endl;
      } else if (!quiet || v.state != VerifyReport::State::clean) {
        std::printf("%s: %s, version %s", local.c_str(), state, v.version ? format_version(*v.version).c_str() : "none");
        if (v.state == VerifyReport::State::clean || v.state == VerifyReport::State::corrupt)
          std::printf(" (%llu weight files, %llu tensors, %llu other files, %s checked)", ull(v.weight_files),
                      ull(v.tensors), ull(v.files), cli::human_bytes(double(v.bytes)).c_str());
        if (v.pending) std::printf(", apply of %s interrupted (the next delta-apply rolls it back)", format_version(*v.pending).c_str());
        std::printf("\n");
        for (const auto& p : v.problems) std::printf("  %s\n", p.c_str());
      }
      switch (v.state) {
        case VerifyReport::State::clean: return;
        case VerifyReport::State::interrupted: throw Error(Exit::interrupted, "");
        case VerifyReport::State::uninitialised: throw Error(Exit::uninitialised, "");
        case VerifyReport::State::corrupt: throw Error(Exit::corrupt, "");
      }
    }

    if (!then.empty())
      o.then = [&](std::uint64_t v) { cli::run_shell(then, {{"HFDELTA_LOCAL", local}, {"HFDELTA_VERSION", format_version(v)}}); };
    ApplyResult r;
    if (recover) r = recover_local(local, o);
    else if (init) r = init_local(paths[0], local, version.value_or(0), o);
    else if (!root.empty()) r = pull(root, local, target, o);
    else r = apply_delta(paths[0], local, o);

    if (json_out) {
      nlohmann::json applied = nlohmann::json::array();
      for (auto a : r.applied) applied.push_back(format_version(a));
      nlohmann::json j = {{"local", local}, {"from_version", version_json(r.from_version)},
                          {"to_version", format_version(r.to_version)}, {"applied", applied}, {"noop", r.noop}, {"record_rewritten", r.record_rewritten},
                          {"rolled_back", version_json(r.rolled_back)}, {"tensors_patched", r.tensors_patched},
                          {"delta_bytes", r.delta_bytes}, {"files_written", r.files_written},
                          {"files_removed", r.files_removed}, {"seconds", r.seconds}};
      std::cout << j.dump() << std::endl;
    } else if (!quiet) {
      if (r.rolled_back)
        std::printf("%s: rolled back an interrupted apply of version %s\n", local.c_str(), format_version(*r.rolled_back).c_str());
      const std::string from = r.from_version ? format_version(*r.from_version) : "none";
      if (recover) {
        if (!r.rolled_back) std::printf("%s: nothing to recover, version %s\n", local.c_str(), from.c_str());
      } else if (r.record_rewritten) {
        std::printf("%s: files already at version %s; its missing or damaged checksum record was rewritten\n", local.c_str(),
                    format_version(r.to_version).c_str());
      } else if (r.noop) {
        std::printf("%s: already at version %s\n", local.c_str(), format_version(r.to_version).c_str());
      } else {
        std::printf("%s: version %s -> %s (%zu step%s), %llu tensors patched from %s of deltas, %llu files written, "
                    "%llu removed, %.3f s\n",
                    local.c_str(), from.c_str(), format_version(r.to_version).c_str(), r.applied.size(),
                    r.applied.size() == 1 ? "" : "s", ull(r.tensors_patched),
                    cli::human_bytes(double(r.delta_bytes)).c_str(), ull(r.files_written),
                    ull(r.files_removed), r.seconds);
      }
    }
  });
}
