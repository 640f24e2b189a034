// delta-apply: thin command over hfdelta::init_local / apply_delta / pull.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cli_common.hpp"
#include "hfdelta/apply.hpp"
#include "hfdelta/version.hpp"

using namespace hfdelta;

int main(int argc, char** argv) {
  CLI::App app{"Bring a host-local checkpoint to a new version, in place.\n"
               "  delta-apply [OPTIONS] DELTA LOCAL\n"
               "  delta-apply --init [--version N] SRC LOCAL\n"
               "  delta-apply --root ROOT [--target N] LOCAL",
               "delta-apply"};
  std::vector<std::string> paths;
  std::string root;
  bool init = false, no_sync = false, json_out = false, quiet = false;
  std::optional<std::uint64_t> target, version;
  ApplyOptions o;
  app.add_option("PATHS", paths, "DELTA LOCAL, SRC LOCAL (--init), or LOCAL (--root)")->expected(1, 2);
  auto* init_opt = app.add_flag("--init", init, "Make LOCAL an exact copy of the full checkpoint SRC");
  auto* root_opt = app.add_option("--root", root, "Publication root holding weight_vNNNNNN version directories");
  app.add_option("--target", target, "Version to bring LOCAL to with --root (default: newest)")->needs(root_opt);
  app.add_option("--version", version, "Version recorded by --init (default 0)")->needs(init_opt);
  root_opt->excludes(init_opt);
  app.add_option("--lock-timeout", o.lock_timeout, "Give up after SECONDS waiting for the lock (default: wait)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--threads", o.threads, "Worker threads (default: all cores)")->check(CLI::NonNegativeNumber);
  app.add_flag("--no-sync", no_sync, "Do not flush data before recording the version");
  app.add_flag("--json", json_out, "Print the result as one JSON object on stdout");
  app.add_flag("-q,--quiet", quiet, "Print nothing on success");

  return cli::run(app, argc, argv, [&] {
    o.sync = !no_sync;
    const std::size_t want = root.empty() ? 2 : 1;
    if (paths.size() != want)
      throw CLI::ValidationError("PATHS", root.empty() ? (init ? "expected SRC LOCAL" : "expected DELTA LOCAL")
                                                       : "expected LOCAL only with --root");
    const std::string local = paths.back();
    ApplyResult r;
    if (init) r = init_local(paths[0], local, version.value_or(0), o);
    else if (!root.empty()) r = pull(root, local, target, o);
    else r = apply_delta(paths[0], local, o);

    auto v = [](const std::optional<std::uint64_t>& x) { return x ? nlohmann::json(format_version(*x)) : nlohmann::json(); };
    if (json_out) {
      nlohmann::json applied = nlohmann::json::array();
      for (auto a : r.applied) applied.push_back(format_version(a));
      nlohmann::json j = {{"local", local}, {"from_version", v(r.from_version)}, {"to_version", format_version(r.to_version)},
                          {"applied", applied}, {"noop", r.noop}, {"tensors_patched", r.tensors_patched},
                          {"delta_bytes", r.delta_bytes}, {"files_written", r.files_written},
                          {"files_removed", r.files_removed}, {"seconds", r.seconds}};
      std::cout << j.dump() << std::endl;
    } else if (!quiet) {
      const std::string from = r.from_version ? format_version(*r.from_version) : "none";
      if (r.noop) {
        std::printf("%s: already at version %s\n", local.c_str(), format_version(r.to_version).c_str());
      } else {
        std::printf("%s: version %s -> %s (%zu step%s), %llu tensors patched from %s of deltas, %llu files written, "
                    "%llu removed, %.3f s\n",
                    local.c_str(), from.c_str(), format_version(r.to_version).c_str(), r.applied.size(),
                    r.applied.size() == 1 ? "" : "s", (unsigned long long)r.tensors_patched,
                    cli::human_bytes(double(r.delta_bytes)).c_str(), (unsigned long long)r.files_written,
                    (unsigned long long)r.files_removed, r.seconds);
      }
    }
  });
}
