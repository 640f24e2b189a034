// delta-diff: thin command over hfdelta::diff_checkpoints.
#include <cstdio>
#include <iostream>

#include <boost/filesystem/path.hpp>
#include <nlohmann/json.hpp>

#include "cli_common.hpp"
#include "hfdelta/diff.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/version.hpp"

using namespace hfdelta;

int main(int argc, char** argv) {
  CLI::App app{"Write the delta version directory OUT that turns checkpoint BASE into NEW.", "delta-diff"};
  std::string base, target, out, encoding = "auto";
  std::optional<std::uint64_t> version, base_version;
  DiffOptions o;
  bool no_sync = false, json_out = false, quiet = false;
  app.add_option("BASE", base, "Previous save (HF checkpoint directory)")->required();
  app.add_option("NEW", target, "New save (HF checkpoint directory)")->required();
  app.add_option("OUT", out, "Delta version directory to create (must not exist)")->required();
  app.add_option("--encoding", encoding,
                 "Delta encoding: auto (hfdelta's sparse encoding, or xor for a tensor where that is smaller), "
                 "sparse, or the slime layout's xor or overwrite")
      ->check(CLI::IsMember({"xor", "overwrite", "sparse", "auto"}))
      ->capture_default_str();
  app.add_option("--level", o.level, "zstd compression level")->check(CLI::Range(1, 19))->capture_default_str();
  app.add_option("--version", version, "Version number of OUT (default: from an OUT named weight_vNNNNNN)");
  app.add_option("--base-version", base_version, "Version of BASE (default: version - 1)");
  app.add_option("--threads", o.threads, "Worker threads (default: all cores)")->check(CLI::NonNegativeNumber);
  app.add_flag("--no-sync", no_sync, "Do not flush the delta to disk before publishing it");
  app.add_flag("--json", json_out, "Print the summary as one JSON object on stdout");
  app.add_flag("-q,--quiet", quiet, "Print no summary");

  return cli::run(app, argc, argv, [&] {
    o.encoding = encoding == "auto" ? std::nullopt : parse_encoding(encoding);
    o.sync = !no_sync;
    if (!version) version = version_from_dirname(boost::filesystem::path(out).filename().string());
    if (!version) throw CLI::ValidationError("--version", "OUT is not named weight_vNNNNNN; give --version");
    if (!base_version && *version == 0) throw CLI::ValidationError("--base-version", "version 0 has no base; give --base-version");
    o.version = *version;
    o.base_version = base_version ? *base_version : *version - 1;
    if (o.base_version >= o.version) throw CLI::ValidationError("--base-version", "must be lower than the version");

    const DiffSummary s = diff_checkpoints(base, target, out, o);
    const double density = s.elements ? double(s.elements_changed) / double(s.elements) : 0.0;
    if (json_out) {
      nlohmann::json j = {
          {"out", out}, {"version", format_version(s.version)}, {"base_version", format_version(s.base_version)},
          {"encoding", encoding}, {"tensors", s.tensors}, {"tensors_changed", s.tensors_changed},
          {"elements", s.elements}, {"elements_changed", s.elements_changed}, {"density", density},
          {"tensor_bytes", s.tensor_bytes}, {"bytes_changed", s.bytes_changed}, {"full_bytes", s.full_bytes},
          {"delta_bytes", s.delta_bytes}, {"files_changed", s.files_changed}, {"files_removed", s.files_removed},
          {"entries", {{"sparse", s.tensors_sparse}, {"xor", s.tensors_xor}, {"overwrite", s.tensors_overwrite}}},
          {"seconds", s.seconds}};
      std::cout << j.dump() << std::endl;
    } else if (!quiet) {
      std::printf("%s: version %s on base %s, %s\n", out.c_str(), format_version(s.version).c_str(),
                  format_version(s.base_version).c_str(), encoding.c_str());
      std::printf("  tensors changed  %llu of %llu\n", (unsigned long long)s.tensors_changed, (unsigned long long)s.tensors);
      std::printf("  changed          %llu of %llu elements (density %.4f%%), %s of bytes differ\n",
                  (unsigned long long)s.elements_changed, (unsigned long long)s.elements, 100.0 * density,
                  cli::human_bytes(double(s.bytes_changed)).c_str());
      std::printf("  files            %llu changed, %llu removed\n", (unsigned long long)s.files_changed,
                  (unsigned long long)s.files_removed);
      std::printf("  delta            %s for a %s checkpoint (%.3f%%)\n", cli::human_bytes(double(s.delta_bytes)).c_str(),
                  cli::human_bytes(double(s.full_bytes)).c_str(),
                  s.full_bytes ? 100.0 * double(s.delta_bytes) / double(s.full_bytes) : 0.0);
      std::printf("  time             %.3f s\n", s.seconds);
    }
  });
}
