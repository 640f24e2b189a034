// hfdelta-bench: the measuring half of scripts/bench/bench.sh.
//
// Subcommands (each can append its result as one JSON line to a records file,
// with string labels added, so the script only has to name what it measured):
//   bound BASE NEW     order-0 entropy bound of the change between two checkpoints, and
//                      the bound given each base element's exponent (BF16, F16)
//   readfloor DIR...   wall time of reading every shard of the checkpoints from the page cache;
//                      --hash also checksums every byte (XXH3-128, as hfdelta does), --write-back
//                      also writes every buffer back where it was read (the same bytes; with
//                      --hash, hashed again as a checked patch hashes its result): the floors
//                      of a verified diff and of a verified in-place apply
//   warm PATH...       read every regular file once (fills the page cache)
//   run -- CMD...      run a command: wall time, max RSS (GNU time -v and wait4), and the
//                      peak VmRSS / RssAnon of its process tree, sampled from /proc
//   size PATH...       total bytes of the regular files under the paths
//   layout PATH...     tensors, safetensors header bytes and JSON (index, config) bytes under the
//                      paths (checkpoints or deltas)
//   machine PATH       CPU, memory, kernel and the disk holding PATH
//   note               a record made of labels only
//   report RECORDS     builds results.md and results.json from a records file
//
// measure.hpp measures, records.hpp writes and reads the records, report.hpp
// writes the report. Not installed; benchmarks only.

#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "hfdelta/error.hpp"
#include "measure.hpp"
#include "records.hpp"
#include "report.hpp"

using nlohmann::json;

namespace {

void add_record_options(CLI::App* sub, bench::RecordOut& r) {
  sub->add_option("--append", r.append, "Append the result as one JSON line to this file");
  sub->add_option("--label", r.labels, "KEY=VALUE added to the record (repeatable)")->allow_extra_args(false);
}

// What the command line asks for: each subcommand's arguments and records file.
struct Args {
  std::string base, target;  // bound
  int threads = 0;
  bool per_tensor = false;
  std::vector<std::string> paths;  // readfloor, warm, size
  int repeat = 3;
  bool floor_hash = false, floor_write_back = false;  // readfloor
  bench::RunOptions run;
  std::vector<std::string> command;
  std::string where = ".";  // machine
  std::string note_kind = "note";
  std::string records, md_out, json_out;  // report
  bench::RecordOut bound_out, floor_out, warm_out, run_out, size_out, machine_out, note_out, layout_out;
};

struct Subcommands {
  CLI::App *bound = nullptr, *floor = nullptr, *warm = nullptr, *run = nullptr;
  CLI::App *size = nullptr, *machine = nullptr, *note = nullptr, *report = nullptr, *layout = nullptr;
};

// The subcommands that read checkpoints: bound, readfloor, warm.
void add_read_commands(CLI::App& app, Args& a, Subcommands& sc) {
  sc.bound = app.add_subcommand("bound", "Order-0 entropy bound of the change from BASE to NEW");
  sc.bound->add_option("BASE", a.base)->required();
  sc.bound->add_option("NEW", a.target)->required();
  sc.bound->add_option("--threads", a.threads, "Threads (default: all)");
  sc.bound->add_flag("--per-tensor", a.per_tensor, "Include every tensor's figures");
  add_record_options(sc.bound, a.bound_out);

  sc.floor = app.add_subcommand("readfloor", "Time warm passes reading every shard of the checkpoints");
  sc.floor->add_option("DIR", a.paths, "Checkpoint directories (or single files)")->required();
  sc.floor->add_option("--repeat", a.repeat, "Measured passes after the warm-up pass")->capture_default_str();
  sc.floor->add_option("--threads", a.threads, "Threads (default: all)");
  sc.floor->add_flag("--hash", a.floor_hash, "Also checksum every byte read (XXH3-128)");
  sc.floor->add_flag("--write-back", a.floor_write_back,
                     "Also write every buffer back where it was read (the same bytes; the files must be writable); "
                     "with --hash, each buffer is hashed twice, as a checked patch hashes its base and its result");
  add_record_options(sc.floor, a.floor_out);

  sc.warm = app.add_subcommand("warm", "Read every regular file under the paths once");
  sc.warm->add_option("PATH", a.paths)->required();
  sc.warm->add_option("--threads", a.threads, "Threads (default: all)");
  add_record_options(sc.warm, a.warm_out);
}

// run, size, machine and note.
void add_other_commands(CLI::App& app, Args& a, Subcommands& sc) {
  sc.run = app.add_subcommand("run", "Run a command and measure it: run [OPTIONS] -- CMD ARGS...");
  sc.run->add_option("--stdout", a.run.stdout_file, "Send the command's stdout to this file");
  sc.run->add_option("--interval-ms", a.run.interval_ms, "Sampling interval of /proc")->capture_default_str();
  sc.run->add_flag("--time-v", a.run.time_v, "Run the command under /usr/bin/time -v and record its maximum RSS");
  sc.run->add_option("CMD", a.command, "The command and its arguments (after --)")->required();
  add_record_options(sc.run, a.run_out);

  sc.size = app.add_subcommand("size", "Total bytes of the regular files under the paths");
  sc.size->add_option("PATH", a.paths)->required();
  add_record_options(sc.size, a.size_out);

  sc.layout = app.add_subcommand("layout", "Tensors, safetensors header and JSON bytes under the paths");
  sc.layout->add_option("PATH", a.paths)->required();
  add_record_options(sc.layout, a.layout_out);

  sc.machine = app.add_subcommand("machine", "Describe the machine and the disk holding PATH");
  sc.machine->add_option("PATH", a.where);
  add_record_options(sc.machine, a.machine_out);

  sc.note = app.add_subcommand("note", "A record of labels only");
  sc.note->add_option("--kind", a.note_kind, "Record kind")->capture_default_str();
  add_record_options(sc.note, a.note_out);
}

void add_report_command(CLI::App& app, Args& a, Subcommands& sc) {
  sc.report = app.add_subcommand("report", "Write the Markdown and JSON results from a records file");
  sc.report->add_option("RECORDS", a.records)->required();
  sc.report->add_option("--md", a.md_out, "Markdown output")->required();
  sc.report->add_option("--json", a.json_out, "JSON output")->required();
}

// Runs the measured command; its exit code is the result.
int run_measured(const Args& a) {
  const bench::Run r = bench::run_command(a.command, a.run);
  if (r.exit == 0) {
    // Records are for successful runs only; a failing tool fails the benchmark.
    bench::emit(bench::to_record(r), "run", a.run_out);
  } else {
    std::cerr << "hfdelta-bench: command failed with exit code " << r.exit << ": " << json(r.argv).dump() << '\n';
  }
  return r.exit;
}

// Runs the subcommand given; returns the exit code.
int run_subcommand(const Args& a, const Subcommands& sc) {
  using namespace bench;
  if (*sc.bound) emit(to_record(measure_bound(a.base, a.target, a.threads, a.per_tensor)), "bound", a.bound_out);
  if (*sc.floor)
    emit(to_record(measure_readfloor(a.paths, a.repeat, a.threads, {a.floor_hash, a.floor_write_back})), "readfloor",
         a.floor_out);
  if (*sc.warm) emit(to_record(warm(a.paths, a.threads)), "warm", a.warm_out);
  if (*sc.size) emit(to_record(measure_size(a.paths)), "size", a.size_out);
  if (*sc.layout) emit(to_record(measure_layout(a.paths)), "layout", a.layout_out);
  if (*sc.machine) emit(to_record(describe_machine(a.where)), "machine", a.machine_out);
  if (*sc.note) emit(json::object(), a.note_kind, a.note_out);
  if (*sc.report) write_report(sort_records(read_records(a.records)), a.md_out, a.json_out);
  if (*sc.run) return run_measured(a);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Measurements for scripts/bench/bench.sh (not installed)", "hfdelta-bench"};
  app.require_subcommand(1);
  Args a;
  Subcommands sc;
  add_read_commands(app, a, sc);
  add_other_commands(app, a, sc);
  add_report_command(app, a, sc);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return run_subcommand(a, sc);
  } catch (const hfdelta::Error& e) {
    std::cerr << "hfdelta-bench: error: " << e.what() << '\n';
    return static_cast<int>(e.code());
  } catch (const std::exception& e) {
    std::cerr << "hfdelta-bench: error: " << e.what() << '\n';
    return 1;
  }
}
