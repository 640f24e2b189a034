// delta-diff: thin command over hfdelta::diff_checkpoints, inspect_delta and prune_root.
#include <algorithm>
#include <cstdio>
#include <iostream>

#include <boost/filesystem/path.hpp>
#include <nlohmann/json.hpp>

#include "cli_common.hpp"
#include "forms.hpp"
#include "hfdelta/diff.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/inspect.hpp"
#include "hfdelta/option_rules.hpp"
#include "hfdelta/prune.hpp"
#include "hfdelta/publication.hpp"
#include "hfdelta/report_json.hpp"
#include "hfdelta/root.hpp"
#include "hfdelta/signals.hpp"
#include "hfdelta/squash.hpp"
#include "hfdelta/version.hpp"
#include "hfdelta/withdraw.hpp"

using namespace hfdelta;

namespace {

using ull = unsigned long long;

void print_inspection(const DeltaInspection& d) {
  std::printf("%s: version %s on base %s, encoding %s", d.dir.string().c_str(), format_version(d.version).c_str(),
              format_version(d.base_version).c_str(), d.encoding.c_str());
  if (d.format) std::printf(", hfdelta_format %llu", ull(*d.format));
  if (d.checksum_format != "xxh3-128") std::printf(", %s checksums", d.checksum_format.c_str());
  std::printf("\n");
  if (!d.entries.empty()) {
    std::printf("  %-9s  %10s  %10s  %-18s  %-32s  %-32s  %s\n", "ENCODING", "ENTRY", "TENSOR", "CHANGED", "CHECKSUM",
                "BASE CHECKSUM", "NAME");
    for (const auto& e : d.entries) {
      const std::string changed = e.changed_elements ? std::to_string(*e.changed_elements) + " elements"
                                  : e.changed_bytes  ? std::to_string(*e.changed_bytes) + " bytes"
                                                     : "-";
      std::printf("  %-9s  %10s  %10s  %-18s  %-32s  %-32s  %s\n", std::string(encoding_name(e.encoding)).c_str(),
                  cli::human_bytes(double(e.entry_bytes)).c_str(),
                  e.tensor_bytes ? cli::human_bytes(double(*e.tensor_bytes)).c_str() : "-", changed.c_str(),
                  e.checksum_hex().c_str(), e.base_checksum ? e.base_checksum->hex().c_str() : "-", e.tensor.c_str());
    }
  }
  if (!d.files.empty()) std::printf("  %-9s  %10s  %-32s  %s\n", "FILE OP", "SIZE", "CHECKSUM", "PATH");
  for (const auto& f : d.files) {
    const bool put = f.op == FileChange::Op::put;
    std::printf("  %-9s  %10s  %-32s  %s\n", put ? "put" : "remove",
                put ? cli::human_bytes(double(f.size)).c_str() : "-", put ? f.checksum.hex().c_str() : "-",
                f.path.c_str());
  }
  if (!d.shards.empty())
    std::printf("  %-9s  %10s  %10s  %-40s  %s\n", "WEIGHT OP", "SIZE", "HEADER", "TENSORS", "FILE");
  for (const auto& s : d.shards) {
    const bool build = s.op == ShardOp::Op::build;
    const std::string tensors = build ? std::to_string(s.tensors) + " (" + std::to_string(s.copied) + " copied, " +
                                            std::to_string(s.renamed) + " renamed or moved, " +
                                            std::to_string(s.fresh) + " new)"
                                      : "-";
    std::printf("  %-9s  %10s  %10s  %-40s  %s\n",
                s.op == ShardOp::Op::remove   ? "remove"
                : s.op == ShardOp::Op::header ? "header"
                                              : "build",
                build ? cli::human_bytes(double(s.size)).c_str() : "-",
                s.op == ShardOp::Op::remove ? "-" : cli::human_bytes(double(s.header_bytes)).c_str(), tensors.c_str(),
                s.file.c_str());
  }
  std::string counts;  // entries of each encoding
  for (const EncodingInfo& enc : kEncodings)
    counts += (counts.empty() ? "" : ", ") + std::to_string(d.entries_by_encoding[enc.encoding]) + " " +
              std::string(enc.name);
  std::printf("  total   %zu tensors (%s), entries %s\n", d.entries.size(), counts.c_str(),
              cli::human_bytes(double(d.entry_bytes)).c_str());
  bool needs_base = false;
  for (const auto& e : d.entries) needs_base = needs_base || e.needs_base;
  if (needs_base)
    std::printf(
        "  context entries are checked whole but for their positions, which count base elements per context "
        "group: delta-apply checks those against LOCAL\n");
  std::printf("  changed %llu elements (sparse and context entries), %llu bytes (xor and overwrite entries)\n",
              ull(d.changed_elements), ull(d.changed_bytes));
  std::printf("  files   %llu put (%s), %llu removed\n", ull(d.files_put),
              cli::human_bytes(double(d.file_bytes)).c_str(), ull(d.files_removed));
  if (!d.shards.empty())
    std::printf("  weights %llu files built, %llu headers rewritten, %llu files removed\n", ull(d.shards_built),
                ull(d.shards_rewritten), ull(d.shards_removed));
  std::printf("  delta   %s on disk\n", cli::human_bytes(double(d.delta_bytes)).c_str());
}

void print_prune(const PruneResult& r) {
  const std::string root = r.root.string();
  if (!r.base_full) {
    std::printf("%s: no full version%s; nothing to remove (a host initialised outside the root needs every delta)\n",
                root.c_str(), r.keep_from ? (" at or below " + format_version(*r.keep_from)).c_str() : "");
  } else {
    std::printf(
        "%s: keeping full version %s%s and the %zu version(s) after it\n", root.c_str(),
        format_version(*r.base_full).c_str(),
        r.keep_from ? (" (the newest at or below " + format_version(*r.keep_from) + ")").c_str() : " (the newest)",
        std::size_t(std::count_if(r.kept.begin(), r.kept.end(), [](const PrunedVersion& d) { return !d.sidecar; })) -
            1);
  }
  const char* verb = r.dry_run ? "would remove" : "removed";
  for (const auto& d : r.removed)
    std::printf("  %s  %s  (%s)\n", verb, d.path.filename().string().c_str(),
                d.withdrawn ? "withdrawn"
                : d.full    ? "full"
                : d.sidecar ? "delta beside a full version"
                            : "delta");
  for (const auto& p : r.leftovers)
    std::printf("  %s  %s  (left by an interrupted prune)\n", verb, p.filename().string().c_str());
  std::printf("  %s %zu version(s) and %zu leftover(s), %s%s\n", verb, r.removed.size(), r.leftovers.size(),
              cli::human_bytes(double(r.bytes_removed)).c_str(), r.dry_run ? "; nothing was changed (--dry-run)" : "");
}

// ---- the command line ------------------------------------------------------------

// What the command line asks for.
struct DiffCommandLine {
  std::string base, target, out, encoding = "context", inspect, prune, withdraw, post_publish, squash_base;
  std::optional<std::uint64_t> version, base_version, keep_from;
  DiffOptions diff;
  bool no_sync = false, json_out = false, quiet = false, dry_run = false, squash = false, full = false,
       progress = false;
};

// The options of writing a delta: the checkpoints and how to encode.
void add_diff_options(CLI::App& app, DiffCommandLine& o) {
  app.add_option("BASE", o.base, "Previous save (HF checkpoint directory)");
  app.add_option("NEW", o.target, "New save (HF checkpoint directory)");
  app.add_option("OUT", o.out,
                 "Version directory to create, ROOT/weight_vNNNNNN (ROOT's newest version + 1; must not "
                 "exist), or ROOT itself to publish its newest version + 1");
  app.add_option("--encoding", o.encoding,
                 "Delta encoding: context (hfdelta's, the default: the changes coded in contexts of the "
                 "base elements' exponents, about 0.7 of sparse on training steps; needs delta-apply of "
                 "format revision 5), sparse (hfdelta's: changed positions and values, about half of xor), "
                 "auto (context or xor per tensor; its index lists each tensor's), "
                 "or the slime layout's xor or overwrite (what slime, miles and SGLang's receivers read)")
      ->type_name("NAME")
      ->check(cli::encoding())
      ->capture_default_str();
  app.add_option("--level", o.diff.level,
                 "zstd compression level, 1 to 19 (default: 1 for the slime layout's xor and overwrite entries, "
                 "as its publishers write them; 3 for the others)")
      ->type_name("N")
      ->check(cli::level());
  app.add_option("--delta-version", o.version,
                 "Version number of OUT (default: from OUT's name, or ROOT's newest + 1; must agree with them)")
      ->type_name("N")
      ->transform(cli::whole_number());
  app.add_option("--base-version", o.base_version, "Version of BASE (default: version - 1)")
      ->type_name("M")
      ->transform(cli::whole_number());
  app.add_option("--threads", o.diff.threads, "Worker threads (default: all cores)")
      ->type_name("N")
      ->transform(cli::whole_number())
      ->check(cli::threads());
  app.add_option("--post-publish", o.post_publish,
                 "Shell command to run after each version directory is published and durable "
                 "(HFDELTA_VERSION, HFDELTA_VERSION_PATH, HFDELTA_NAME and HFDELTA_ROOT are set), "
                 "e.g. to upload it to an object store; failure exits 13")
      ->type_name("CMD");
  app.add_flag("--no-sync", o.no_sync, "Do not flush the delta (with --prune: ROOT) to disk before publishing it");
  app.add_flag(
      "--progress", o.progress,
      "Show progress on stderr (bytes done, rate, time left); the default on a terminal, never with -q or --json");
  app.add_flag("--json", o.json_out,
               "Print the summary (or the --inspect or --prune report) as one JSON object on stdout");
  app.add_flag("-q,--quiet", o.quiet, "Print no summary (or report)");
}

// The options of the other forms: --inspect, --squash and --prune.
void add_form_options(CLI::App& app, DiffCommandLine& o) {
  const std::string inspect_group = "Inspect a delta (instead of writing one)";
  app.add_option("--inspect", o.inspect,
                 "Describe delta version directory DELTA: versions, encoding, per-tensor entries "
                 "with their changed counts and checksums, file operations; checks it as "
                 "delta-apply would (a damaged delta exits 3); DELTA may also come after other options")
      ->type_name("DELTA")
      ->expected(0, 1)  // `--inspect --json DELTA`: DELTA is then the one path argument
      ->group(inspect_group);
  const std::string squash_group = "Squash a chain of deltas (instead of diffing checkpoints)";
  app.add_flag("--squash", o.squash,
               "Write OUT as one delta equal to applying the delta versions FIRST, ..., LAST "
               "(given as BASE and NEW; every version between them must be beside them), "
               "composed from the deltas alone (and --squash-base CKPT)")
      ->group(squash_group);
  app.add_option("--squash-base", o.squash_base,
                 "With --squash: the checkpoint of the chain's first base (FIRST's base version), "
                 "to compose context entries against its bytes into one context entry per tensor "
                 "(without it each stays a stacked layer); a checkpoint whose bytes differ from "
                 "the chain's base exits 5")
      ->type_name("CKPT")
      ->group(squash_group);
  app.add_flag("--full", o.full,
               "Publish checkpoint NEW itself as full version OUT (given as NEW OUT); given BASE NEW OUT, "
               "first publish the delta BASE -> NEW beside it as ROOT/delta_vNNNNNN, so that a host one "
               "version behind fetches only that")
      ->group("Publish a full version (instead of only a delta)");
  const std::string prune_group = "Prune a publication root (instead of writing a delta)";
  app.add_option("--prune", o.prune,
                 "Remove the version directories of ROOT older than its newest full version "
                 "(with --keep-from N: older than the newest full version at or below N); ROOT may also "
                 "come after other options")
      ->type_name("ROOT")
      ->expected(0, 1)  // `--prune --dry-run ROOT`: ROOT is then the one path argument
      ->group(prune_group);
  app.add_option("--keep-from", o.keep_from,
                 "Keep every version a delta-apply --root pull to version N or later can need")
      ->type_name("N")
      ->transform(cli::whole_number())
      ->group(prune_group);
  app.add_flag("--dry-run", o.dry_run, "Print what --prune would remove; remove nothing")->group(prune_group);
  app.add_option("--withdraw", o.withdraw,
                 "Take version directory VERSION (ROOT/weight_vNNNNNN) back out of its root: renamed to "
                 "ROOT/withdrawn_vNNNNNN, so hosts that never applied it skip it, its number is never "
                 "published again, and hosts that applied it are told so by their next pull")
      ->type_name("VERSION")
      ->expected(0, 1)  // `--withdraw --json VERSION`: VERSION is then the one path argument
      ->group("Withdraw a bad version (instead of writing a delta)");
}

// The forms, in the order of diff_command()'s table (choose_form counts on it).
enum class Form { diff, full, inspect, squash, prune, withdraw };

// Which option goes with which form: the one table the command line is
// checked against, --help's usage lines and the completion are made from.
const cli::Command& diff_command() {
  const std::vector<std::string> writing{"--encoding", "--level",        "--delta-version", "--base-version",
                                         "--threads",  "--post-publish", "--no-sync"};
  static const cli::Command c{
      "delta-diff",
      "Write the delta version directory OUT that turns checkpoint BASE into NEW; or publish, describe, squash, "
      "prune or withdraw versions of a publication root. See delta-diff(1).",
      {{"", {"BASE", "NEW", "OUT"}, writing, "write a delta: OUT is ROOT/weight_vNNNNNN, or ROOT (its newest + 1)"},
       {"--full",
        {"[BASE]", "NEW", "OUT"},
        writing,
        "publish NEW as a full version (and the delta BASE -> NEW beside it)"},
       {"--inspect", {}, {}, "describe and check a delta version directory"},
       {"--squash",
        {"FIRST", "LAST", "OUT"},
        {"--squash-base", "--level", "--threads", "--post-publish", "--no-sync"},
        "one delta equal to the versions FIRST..LAST of a root (its versions and encodings from the deltas)"},
       {"--prune",
        {},
        {"--keep-from", "--dry-run", "--no-sync"},
        "remove the versions no delta-apply --root pull to N or later needs"},
       {"--withdraw", {}, {"--no-sync"}, "take a bad version back out of its root"}},
      {"--progress", "--json", "-q"},
      {}};
  return c;
}

// A form's path follows its option, or is the one path argument
// (`--prune --dry-run ROOT`); any other path argument is refused.
void take_form_path(DiffCommandLine& o, std::string& path, const std::string& form, const std::string& what) {
  std::vector<std::string> args;
  for (const std::string* a : {&o.base, &o.target, &o.out})
    if (!a->empty()) args.push_back(*a);
  if (path.empty() && !args.empty()) path = args.front(), args.erase(args.begin());
  if (!args.empty()) throw CLI::ValidationError(form, "unexpected argument \"" + args.front() + "\"");
  if (path.empty()) throw CLI::RequiredError(form + " " + what);
  o.base.clear(), o.target.clear(), o.out.clear();
}

// Which form the command line asks for, once its options and paths fit that form.
Form choose_form(const CLI::App& app, DiffCommandLine& o) {
  const cli::Form& f = cli::select_form(app, diff_command());
  if (f.selector == "--inspect") take_form_path(o, o.inspect, "--inspect", "DELTA");
  if (f.selector == "--prune") take_form_path(o, o.prune, "--prune", "ROOT");
  if (f.selector == "--withdraw") take_form_path(o, o.withdraw, "--withdraw", "VERSION");
  std::vector<std::string> paths;
  for (const std::string* a : {&o.base, &o.target, &o.out})
    if (!a->empty()) paths.push_back(*a);
  cli::check_form(app, diff_command(), f, paths);
  return static_cast<Form>(&f - diff_command().forms.data());
}

// ---- --inspect and --prune -----------------------------------------------------------

void run_inspect(const DiffCommandLine& o) {
  const DeltaInspection d = inspect_delta(o.inspect);
  cli::ProgressLine::stop_current();
  if (o.json_out)
    cli::print_json(inspection_json(d));
  else if (!o.quiet)
    print_inspection(d);
}

void run_prune(const DiffCommandLine& o) {
  PruneOptions po;
  po.keep_from = o.keep_from;
  po.dry_run = o.dry_run;
  po.sync = !o.no_sync;
  const PruneResult r = prune_root(o.prune, po);
  cli::ProgressLine::stop_current();
  if (o.json_out)
    cli::print_json(prune_json(r));
  else if (!o.quiet)
    print_prune(r);
}

void print_withdraw(const WithdrawResult& r) {
  const std::string v = format_version(r.version);
  if (r.already)
    std::printf("%s: version %s was withdrawn already (%s); nothing changed\n", r.root.string().c_str(), v.c_str(),
                r.withdrawn.filename().string().c_str());
  else
    std::printf("%s: version %s withdrawn (now %s%s); hosts that never applied it skip it\n", r.root.string().c_str(),
                v.c_str(), r.withdrawn.filename().string().c_str(),
                r.sidecar ? (", and its delta beside it " + r.sidecar->filename().string()).c_str() : "");
  std::printf("  the next version is published on %s\n",
              r.newest ? ("version " + format_version(*r.newest)).c_str() : "nothing: publish a full version");
  std::printf(
      "  hosts that applied version %s are refused by their next pull until they take a newer full version "
      "(delta-diff --full NEW ROOT) or are re-initialised (delta-apply --init CHECKPOINT LOCAL --init-version M)\n",
      v.c_str());
  if (!r.stranded.empty()) {
    std::string list;
    for (const auto s : r.stranded) list += (list.empty() ? "" : ", ") + format_version(s);
    std::fprintf(stderr,
                 "delta-diff: warning: version(s) %s were published on version %s: no delta path reaches them any "
                 "more; withdraw them too, or publish a full version\n",
                 list.c_str(), v.c_str());
  }
  for (const auto& p : r.in_flight)
    std::fprintf(stderr,
                 "delta-diff: warning: a publication is under way in the root (%s): if it is built on version %s, "
                 "its publisher refuses it at its commit (or withdraws it, if it was renamed in between) and "
                 "says so\n",
                 p.string().c_str(), v.c_str());
}

void run_withdraw(const DiffCommandLine& o) {
  const WithdrawResult r = withdraw_version(o.withdraw, !o.no_sync);
  if (o.json_out)
    cli::print_json(withdraw_json(r));
  else if (!o.quiet)
    print_withdraw(r);
}

// ---- publishing ----

// --post-publish, run for each directory once it is published and durable.
void post_publish(const DiffCommandLine& o, const boost::filesystem::path& dir, std::uint64_t version) {
  if (o.post_publish.empty()) return;
  const boost::filesystem::path parent = dir.parent_path().empty() ? boost::filesystem::path(".") : dir.parent_path();
  cli::run_shell(o.post_publish,
                 {{"HFDELTA_VERSION", format_version(version)},
                  {"HFDELTA_VERSION_PATH", dir.string()},
                  {"HFDELTA_NAME", dir.filename().string()},
                  {"HFDELTA_ROOT", parent.string()}},
                 Exit::hook_published, "--post-publish");
}

// ---- --squash ----------------------------------------------------------------------

void print_squash_human(const std::string& out, const SquashSummary& s) {
  std::printf("%s: version %s on base %s, squashed from %llu deltas\n", out.c_str(), format_version(s.version).c_str(),
              format_version(s.base_version).c_str(), ull(s.deltas));
  std::printf("  entries          %llu (%llu composed of several, %llu stacked, %llu cancelled out)\n", ull(s.entries),
              ull(s.entries_composed), ull(s.entries_stacked), ull(s.entries_dropped));
  if (s.shards_built || s.shards_rewritten || s.shards_removed)
    std::printf("  structure        %llu weight files built, %llu headers rewritten, %llu weight files removed\n",
                ull(s.shards_built), ull(s.shards_rewritten), ull(s.shards_removed));
  std::printf("  files            %llu changed, %llu removed\n", ull(s.files_changed), ull(s.files_removed));
  std::printf("  delta            %s, from %s of deltas\n", cli::human_bytes(double(s.delta_bytes)).c_str(),
              cli::human_bytes(double(s.input_bytes)).c_str());
  std::printf("  time             %.3f s\n", s.seconds);
}

void run_squash(const DiffCommandLine& o) {
  SquashOptions so;
  so.level = o.diff.level;
  so.threads = o.diff.threads;
  so.sync = !o.no_sync;
  if (!o.squash_base.empty()) so.base = o.squash_base;
  const SquashSummary s = squash_deltas(chain_between(o.base, o.target), o.out, so);
  cli::ProgressLine::stop_current();
  post_publish(o, o.out, s.version);
  if (o.json_out)
    cli::print_json(squash_json(o.out, s));
  else if (!o.quiet)
    print_squash_human(o.out, s);
}

// ---- writing a delta ---------------------------------------------------------------

// DiffOptions from the command line: encoding, sync, and the versions of OUT
// (publish_target: from its name, --version, or its root) and BASE.
DiffOptions diff_options(const DiffCommandLine& o, const PublishTarget& t) {
  DiffOptions d = o.diff;
  d.encoding = encoding_option(o.encoding);
  d.sync = !o.no_sync;
  set_diff_versions(d, t, o.base_version, "--base-version");
  return d;
}

void print_diff_human(const DiffCommandLine& o, const DiffSummary& s) {
  const double density = s.elements ? double(s.elements_changed) / double(s.elements) : 0.0;
  std::printf("%s: version %s on base %s, %s\n", o.out.c_str(), format_version(s.version).c_str(),
              format_version(s.base_version).c_str(), o.encoding.c_str());
  std::printf("  tensors changed  %llu of %llu\n", ull(s.tensors_changed), ull(s.tensors));
  std::printf("  changed          %llu of %llu elements (density %.4f%%), %s of bytes differ\n",
              ull(s.elements_changed), ull(s.elements), 100.0 * density,
              cli::human_bytes(double(s.bytes_changed)).c_str());
  std::printf("  files            %llu changed, %llu removed\n", ull(s.files_changed), ull(s.files_removed));
  if (s.shards_built || s.shards_rewritten || s.shards_removed)
    std::printf(
        "  structure        %llu weight files built, %llu headers rewritten, %llu weight files removed, "
        "%llu tensors without base bytes\n",
        ull(s.shards_built), ull(s.shards_rewritten), ull(s.shards_removed), ull(s.tensors_new));
  std::printf("  delta            %s for a %s checkpoint (%.3f%%)\n", cli::human_bytes(double(s.delta_bytes)).c_str(),
              cli::human_bytes(double(s.full_bytes)).c_str(),
              s.full_bytes ? 100.0 * double(s.delta_bytes) / double(s.full_bytes) : 0.0);
  std::printf("  time             %.3f s\n", s.seconds);
}

void run_diff(DiffCommandLine o) {
  check_out_apart(o.out, {{"BASE", o.base}, {"NEW", o.target}});  // before a missing root's hint says to create it
  const PublishTarget t = publish_target(o.out, o.version);
  o.out = t.out.string();  // ROOT given: the version directory chosen in it
  const DiffSummary s = diff_checkpoints(o.base, o.target, o.out, diff_options(o, t));
  cli::ProgressLine::stop_current();
  post_publish(o, t.out, t.version);
  for (const auto& w : diff_warnings(s)) std::cerr << "delta-diff: warning: " << o.out << ": " << w << "\n";
  if (o.json_out)
    cli::print_json(diff_json(o.out, o.encoding, s));
  else if (!o.quiet)
    print_diff_human(o, s);
}

// ---- --full --------------------------------------------------------------------------

void print_full(const DiffCommandLine& o, const PublishTarget& t, const FullSummary& f, const std::string& side,
                const DiffSummary* s) {
  if (o.json_out) {
    cli::print_json(full_json(t.out.string(), f, s, side));
  } else if (!o.quiet) {
    if (s)
      std::printf("%s: delta beside the full version, version %s on base %s, %s\n", side.c_str(),
                  format_version(s->version).c_str(), format_version(s->base_version).c_str(),
                  cli::human_bytes(double(s->delta_bytes)).c_str());
    std::printf("%s: full version %s, %llu files, %s, %.3f s\n", t.out.string().c_str(),
                format_version(f.version).c_str(), ull(f.files), cli::human_bytes(double(f.bytes)).c_str(), f.seconds);
  }
}

// --full [BASE] NEW OUT: the delta beside it first (if BASE is given), then the full version.
void run_full(DiffCommandLine o) {
  if (o.out.empty()) {  // NEW OUT
    o.out = o.target;
    o.target = o.base;
    o.base.clear();
  }
  if (o.base.empty())
    check_out_apart(o.out, {{"NEW", o.target}});
  else
    check_out_apart(o.out, {{"BASE", o.base}, {"NEW", o.target}});
  const PublishTarget t = publish_target(o.out, o.version);
  DiffSummary s;
  std::string side;
  if (!o.base.empty()) {
    side = publish_sidecar(o.base, o.target, t.out, diff_options(o, t), s).string();
    for (const auto& w : diff_warnings(s)) std::cerr << "delta-diff: warning: " << side << ": " << w << "\n";
    post_publish(o, side, t.version);
  }
  const FullSummary f = publish_full(o.target, t.out, t.version, !o.no_sync, o.diff.threads);
  cli::ProgressLine::stop_current();
  post_publish(o, t.out, t.version);
  print_full(o, t, f, side, o.base.empty() ? nullptr : &s);
}

// Trailing slashes on path arguments are harmless ("ROOT/", "OUT/").
void strip_slashes(DiffCommandLine& o) {
  for (std::string* p : {&o.base, &o.target, &o.out, &o.inspect, &o.prune, &o.withdraw, &o.squash_base})
    if (!p->empty()) *p = strip_trailing_slashes(*p).string();
}

// The body of every form, once the command line has parsed.
void run_command(const CLI::App& app, DiffCommandLine& o) {
  strip_slashes(o);
  const Form form = choose_form(app, o);
  const cli::ProgressLine progress_line(cli::progress_wanted(o.progress, o.quiet, o.json_out));
  switch (form) {
    case Form::inspect:
      return run_inspect(o);
    case Form::prune:
      return run_prune(o);
    case Form::squash:
      return run_squash(o);
    case Form::diff:
      return run_diff(o);
    case Form::full:
      return run_full(o);
    case Form::withdraw:
      return run_withdraw(o);
  }
}

}  // namespace

int main(int argc, char** argv) {
  hfdelta::handle_stop_signals();  // first: every thread started later inherits the mask
  CLI::App app{diff_command().about, "delta-diff"};
  app.footer("See delta-diff(1).");
  DiffCommandLine o;
  add_diff_options(app, o);
  add_form_options(app, o);
  cli::set_forms(app, diff_command());
  return cli::run(
      app, argc, argv, [&] { run_command(app, o); }, &o.json_out);
}
