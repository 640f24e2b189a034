// hfdelta-bench's report (report.hpp): the records sorted into pairs, tools
// and modes, then results.md (the tables, the targets at the marked pair,
// squash, memory against model size) and results.json.

#include "report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "records.hpp"

using nlohmann::json;

namespace bench {

namespace {

std::string lab(const json& r, const char* key) {
  const auto it = r.find(key);
  if (it == r.end()) return "";
  return it->is_string() ? it->get<std::string>() : it->dump();
}

double num(const json& r, const char* key, double dflt = NAN) {
  const auto it = r.find(key);
  if (it == r.end() || it->is_null()) return dflt;
  if (it->is_number()) return it->get<double>();
  if (it->is_string()) return std::strtod(it->get<std::string>().c_str(), nullptr);
  return dflt;
}

// a = max(a, b), where NAN stands for "not measured".
void keep_max(double& a, double b) {
  if (!std::isnan(b)) a = std::isnan(a) ? b : std::max(a, b);
}

bool is_hfdelta(const std::string& tool) { return tool.rfind("hfdelta-", 0) == 0; }

std::string fmt(const char* f, double v) {
  if (std::isnan(v)) return "–";
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string mib(double bytes) {
  if (std::isnan(bytes)) return "–";
  char b[64];
  if (bytes >= 1e9)
    std::snprintf(b, sizeof b, "%.3f GB", bytes / 1e9);
  else if (bytes >= 1e6)
    std::snprintf(b, sizeof b, "%.2f MB", bytes / 1e6);
  else
    std::snprintf(b, sizeof b, "%.1f kB", bytes / 1e3);
  return b;
}

std::string kib_mib(double kib) { return std::isnan(kib) ? "–" : fmt("%.1f MiB", kib / 1024); }

double ratio(double a, double b) { return std::isnan(a) || std::isnan(b) || b == 0 ? NAN : a / b; }

json jnum(double v) { return std::isnan(v) ? json(nullptr) : json(v); }

bool same_lr(const std::string& a, const std::string& b) {
  const double x = std::strtod(a.c_str(), nullptr), y = std::strtod(b.c_str(), nullptr);
  return a == b || (x != 0 && std::fabs(x - y) <= 1e-9 * std::fabs(x));
}

// ---- report: the records, sorted -------------------------------------------------------

// The run's setup and notes (machine, config, version, load, timing, marked), whatever their series.
void add_setup_record(Records& rs, const json& r, const std::string& kind) {
  if (kind == "machine")
    rs.machine = r;
  else if (kind == "config")
    rs.config.update(r);
  else if (kind == "version")
    rs.versions.push_back(r);
  else if (kind == "load")
    rs.loads.push_back(r);
  else if (kind == "timing")
    rs.timings.push_back(r);
  else if (kind == "marked")
    rs.marked_rec = r;
}

void add_mem_record(Records& rs, const json& r, const std::string& kind) {
  const std::string preset = lab(r, "preset");
  if (kind == "run") rs.mem[preset][lab(r, "tool")].modes[lab(r, "mode")].add(r);
  if (kind == "size") rs.mem[preset][lab(r, "tool")].wire = num(r, "bytes");
  if (kind == "bound") rs.mem_full[preset] = num(r, "full_bytes");
}

void add_squash_record(Records& rs, const json& r, const std::string& kind) {
  if (!rs.squash.count(lab(r, "chain"))) rs.squash_order.push_back(lab(r, "chain"));
  ToolData& d = rs.squash[lab(r, "chain")][lab(r, "tool")];
  if (kind == "run") d.modes[lab(r, "mode")].add(r);
  if (kind == "size") d.wire = num(r, "bytes");
}

void add_main_record(Records& rs, const json& r, const std::string& kind) {
  const std::string lr = lab(r, "lr");
  const int pair = std::atoi(lab(r, "pair").c_str());
  if (kind == "bound")
    rs.pair_of(lr, pair).bound = r;
  else if (kind == "readfloor") {
    PairData& p = rs.pair_of(lr, pair);
    const std::string what = lab(r, "what");
    (what == "local"           ? p.floor_local
     : what == "local_rewrite" ? p.floor_local_rewrite
     : what == "inputs_hashed" ? p.floor_inputs_hashed
                               : p.floor_inputs) = num(r, "min_s");
  } else if (kind == "run")
    rs.pair_of(lr, pair).tool(lab(r, "tool")).modes[lab(r, "mode")].add(r);
  else if (kind == "size")
    rs.pair_of(lr, pair).tool(lab(r, "tool")).wire = num(r, "bytes");
}

// Pairs by lr, then pair; in each, hfdelta encodings first, then the peers,
// each in order of first appearance.
void order_pairs(std::vector<PairData>& pairs) {
  std::stable_sort(pairs.begin(), pairs.end(), [](const PairData& a, const PairData& b) {
    const double x = std::strtod(a.lr.c_str(), nullptr), y = std::strtod(b.lr.c_str(), nullptr);
    return x != y ? x < y : a.pair < b.pair;
  });
  for (auto& p : pairs) std::stable_partition(p.tool_order.begin(), p.tool_order.end(), is_hfdelta);
}

// The marked pair: as recorded by the script, else the median by density at the target lr.
const PairData* find_marked(const Records& rs, const std::string& target_lr) {
  const PairData* marked = nullptr;
  if (!rs.marked_rec.is_null()) {
    for (const auto& p : rs.pairs)
      if (same_lr(p.lr, lab(rs.marked_rec, "lr")) && p.pair == std::atoi(lab(rs.marked_rec, "pair").c_str()))
        marked = &p;
  } else {
    std::vector<const PairData*> at;
    for (const auto& p : rs.pairs)
      if (same_lr(p.lr, target_lr)) at.push_back(&p);
    std::stable_sort(at.begin(), at.end(),
                     [](auto* a, auto* b) { return num(a->bound, "density") < num(b->bound, "density"); });
    if (!at.empty()) marked = at[(at.size() - 1) / 2];
  }
  return marked;
}

// ---- report: the Markdown introduction ---------------------------------------------------

// The report under construction: the sorted records and the Markdown so far.
struct Report {
  Report(const Records& records, const std::string& lr)
      : rs(records),
        target_lr(lr),
        preset(records.config.value("preset", std::string("?"))),
        marked(find_marked(records, lr)) {}

  const Records& rs;
  const std::string target_lr, preset;
  const PairData* const marked;
  std::ostringstream md;

  std::string pair_name(const PairData& p) const {
    return fmt("%.0f", p.pair - 1) + "→" + std::to_string(p.pair) + (&p == marked ? " ★" : "");
  }
};

void md_setup(Report& rep) {
  const json& config = rep.rs.config;
  const std::string peers = config.value("peer_pairs", "?");
  rep.md << "# hfdelta benchmark\n\n";
  rep.md << "Preset `" << rep.preset << "`, " << config.value("saves", "?")
         << " saves after the initial one per learning rate, "
         << "learning rates " << config.value("lrs", "?") << ", steps per save " << config.value("steps_per_save", "1")
         << "; peers and 1-thread runs at "
         << (peers == "all"      ? "every pair"
             : peers == "median" ? "the median pair of each lr"
                                 : "the marked pair only")
         << ". Commit " << config.value("commit", "?") << ", started " << config.value("started", "?") << ".\n\n";
}

void md_machine(Report& rep) {
  const json& machine = rep.rs.machine;
  if (machine.is_null()) return;
  const json& d = machine.value("disk", json::object());
  rep.md << "Machine: " << machine.value("nproc", 0) << " CPUs (" << machine.value("cpu_model", std::string("?"))
         << "), " << fmt("%.1f GiB", machine.value("mem_total_bytes", 0.0) / (1024.0 * 1024 * 1024)) << " memory, "
         << machine.value("kernel", std::string("?")) << ", " << machine.value("os", std::string("")) << "; disk "
         << d.value("device", std::string("?")) << " (" << d.value("fs_type", std::string("?")) << ", model "
         << (d.value("model", std::string()).empty() ? "unknown" : d.value("model", std::string())) << ", rotational "
         << d.value("rotational", std::string("?")) << ", " << mib(d.value("fs_size_bytes", 0.0)) << ").\n\n";
}

void md_versions(Report& rep) {
  const std::vector<json>& versions = rep.rs.versions;
  if (versions.empty()) return;
  rep.md << "Peers (Debian package versions):";
  for (std::size_t i = 0; i < versions.size(); ++i)
    rep.md << (i ? ", " : " ") << lab(versions[i], "tool") << " " << lab(versions[i], "version");
  rep.md << ".\n\n";
}

void md_method(Report& rep) {
  const json& config = rep.rs.config;
  rep.md
      << "Method: every timed step runs with the page cache warm (its inputs are read once right before it, "
         "after a `sync`), "
      << config.value("repeat", "2")
      << " runs each; times below are the **minimum** of the runs (results.json has every run and the median). "
         "Peak RSS is GNU time's maximum resident set size; peak RssAnon is the largest sum of RssAnon over the "
         "command's process tree, sampled from /proc every "
      << config.value("interval_ms", "5")
      << " ms (mapped file pages are not anonymous memory). Read floor: one warm pass of pread into a 1 MiB buffer "
         "per thread over every shard file, all threads, minimum of 3 passes. hfdelta applies into a LOCAL made with "
         "`delta-apply --init` before each run; the peers (`zstd -3 --long=31 --patch-from`, `xdelta3 -e -s` with its "
         "default settings, `rsync -a -I --no-whole-file --only-write-batch` / `--read-batch`) rebuild NEW beside "
         "BASE and never flush, so they compare with `--no-sync`. zstd and xdelta3 work per shard file (summed; the "
         "other files of the checkpoint do not change between saves); every apply result is checked with cmp "
         "against NEW. Order-0 bound: per tensor N·H(k/N) bits for the positions plus "
         "Σ c_v·log2(k/c_v) bits for the changed elements' XOR values at element width.\n\n";
}

void md_loads(Report& rep) {
  const std::vector<json>& loads = rep.rs.loads;
  if (loads.empty()) return;
  double lo = 1e9, hi = 0;
  for (const auto& l : loads) {
    lo = std::min(lo, num(l, "load1", 0));
    hi = std::max(hi, num(l, "load1", 0));
  }
  rep.md << "Load average (1 min) seen at the start of each pair: " << fmt("%.2f", lo) << " to " << fmt("%.2f", hi)
         << " (other work on the machine makes times noisier).\n\n";
}

// ---- report: the tables of every pair -----------------------------------------------------

void md_pairs(Report& rep) {
  rep.md << "## Pairs\n\n| lr | pair | density | full checkpoint | order-0 bound | bound/full | "
            "bound given the base exponent | /order-0 | read floor BASE+NEW | read floor LOCAL | read+hash BASE+NEW | "
            "read+hash+write-back LOCAL |\n"
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& p : rep.rs.pairs) {
    rep.md << "| " << p.lr << " | " << rep.pair_name(p) << " | " << fmt("%.3f%%", 100 * num(p.bound, "density"))
           << " | " << mib(num(p.bound, "full_bytes")) << " | " << mib(num(p.bound, "bound_bytes")) << " | "
           << fmt("%.2f%%", 100 * ratio(num(p.bound, "bound_bytes"), num(p.bound, "full_bytes"))) << " | "
           << mib(num(p.bound, "conditioned_bound_bytes")) << " | "
           << fmt("%.3f", ratio(num(p.bound, "conditioned_bound_bytes"), num(p.bound, "bound_bytes"))) << " | "
           << fmt("%.3f s", p.floor_inputs) << " | " << fmt("%.3f s", p.floor_local) << " | "
           << fmt("%.3f s", p.floor_inputs_hashed) << " (" << fmt("%.2f×", ratio(p.floor_inputs_hashed, p.floor_inputs))
           << ") | " << fmt("%.3f s", p.floor_local_rewrite) << " ("
           << fmt("%.2f×", ratio(p.floor_local_rewrite, p.floor_local)) << ") |\n";
  }
  rep.md << "\n★ the marked pair: median density at lr " << rep.target_lr
         << ". The last two columns (× their read floor) are the floors of verified work: reading and hashing "
            "(XXH3-128) BASE+NEW, which any diff that records checksums does, and reading LOCAL, hashing it as the "
            "base and again as the result, and writing every page back, which a checked in-place apply does once "
            "every page holds a change (at these densities all do).\n\n";
}

void md_wire(Report& rep) {
  rep.md << "## Wire bytes\n\n| lr | pair | tool | wire | wire/bound | wire/xor | wire/full "
            "|\n|---|---|---|---:|---:|---:|---:|\n";
  for (const auto& p : rep.rs.pairs) {
    const ToolData* x = p.find("hfdelta-xor");
    for (const auto& t : p.tool_order) {
      const ToolData& d = p.tools.at(t);
      rep.md << "| " << p.lr << " | " << rep.pair_name(p) << " | " << t << " | " << mib(d.wire) << " | "
             << fmt("%.3f", ratio(d.wire, num(p.bound, "bound_bytes"))) << " | "
             << fmt("%.3f", ratio(d.wire, x ? x->wire : NAN)) << " | "
             << fmt("%.2f%%", 100 * ratio(d.wire, num(p.bound, "full_bytes"))) << " |\n";
    }
  }
}

void md_diff(Report& rep) {
  rep.md << "\n## Diff (BASE, NEW → delta)\n\n| lr | pair | tool | wall | CPU | diff/read floor | /read+hash floor | 1 "
            "thread | 1 thread/all | peak RSS | peak RssAnon |\n"
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& p : rep.rs.pairs)
    for (const auto& t : p.tool_order) {
      const ToolData& d = p.tools.at(t);
      const Stat* s = d.mode("diff");
      const Stat* s1 = d.mode("diff_1t");
      if (!s) continue;
      rep.md << "| " << p.lr << " | " << rep.pair_name(p) << " | " << t << " | " << fmt("%.3f s", s->min()) << " | "
             << fmt("%.2f s", s->cpu()) << " | " << fmt("%.2f", ratio(s->min(), p.floor_inputs)) << " | "
             << fmt("%.2f", ratio(s->min(), p.floor_inputs_hashed)) << " | " << fmt("%.3f s", s1 ? s1->min() : NAN)
             << " | " << fmt("%.2f", s1 ? ratio(s1->min(), s->min()) : NAN) << " | " << kib_mib(s->max_rss_kib) << " | "
             << kib_mib(s->peak_anon_kib) << " |\n";
    }
}

// One row of the apply table: a peer's only apply stands in the --no-sync column.
void md_apply_row(Report& rep, const PairData& p, const std::string& t, const ToolData& d) {
  const Stat* a = d.mode("apply");
  const Stat* n = d.mode("apply_nosync");
  const Stat* n1 = d.mode("apply_nosync_1t");
  if (!a && !n) return;
  double rss = NAN, anon = NAN;
  for (const Stat* s : {a, n, n1})
    if (s) {
      keep_max(rss, s->max_rss_kib);
      keep_max(anon, s->peak_anon_kib);
    }
  const bool peer = !is_hfdelta(t);
  const Stat* nosync = peer ? a : n;
  rep.md << "| " << p.lr << " | " << rep.pair_name(p) << " | " << t << " | "
         << (peer ? "–" : fmt("%.3f s", a ? a->min() : NAN)) << " | "
         << (peer ? "–" : fmt("%.2f", a ? ratio(a->min(), p.floor_local) : NAN)) << " | "
         << fmt("%.3f s", nosync ? nosync->min() : NAN) << " | "
         << fmt("%.2f", ratio(nosync ? nosync->min() : NAN, p.floor_local)) << " | "
         << fmt("%.2f", ratio(nosync ? nosync->min() : NAN, p.floor_local_rewrite)) << " | "
         << fmt("%.2f s", nosync ? nosync->cpu() : NAN) << " | " << fmt("%.3f s", n1 ? n1->min() : NAN) << " | "
         << fmt("%.2f", n1 && n ? ratio(n1->min(), n->min()) : NAN) << " | " << kib_mib(rss) << " | " << kib_mib(anon)
         << " |\n";
}

void md_apply(Report& rep) {
  rep.md << "\n## Apply (delta → LOCAL)\n\n| lr | pair | tool | wall (flushing) | /read floor | wall --no-sync | /read "
            "floor | /rewrite floor | CPU | 1 thread --no-sync | 1 thread/all | peak RSS | peak RssAnon |\n"
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& p : rep.rs.pairs)
    for (const auto& t : p.tool_order) md_apply_row(rep, p, t, p.tools.at(t));
  rep.md << "\nPeers never flush, so their apply time stands in the --no-sync column. Rewrite floor: reading LOCAL, "
            "hashing it twice and writing it back (see Pairs). CPU: user + sys seconds of the "
            "fastest run (all threads together); wall above CPU means waiting: for the disk, or for a core that other "
            "work holds.\n";
}

// results.json's figures of one tool at one pair.
json tool_json(const PairData& p, const std::string& t, const ToolData& d) {
  const ToolData* x = p.find("hfdelta-xor");
  json modes = json::object();
  for (const auto& [m, s] : d.modes) modes[m] = s.to_json();
  const Stat* diff = d.mode("diff");
  const Stat* diff1 = d.mode("diff_1t");
  const Stat* ap = d.mode(is_hfdelta(t) ? "apply_nosync" : "apply");
  const Stat* ap1 = d.mode("apply_nosync_1t");
  return {{"wire_bytes", jnum(d.wire)},
          {"modes", modes},
          {"ratios",
           {{"wire_over_bound", jnum(ratio(d.wire, num(p.bound, "bound_bytes")))},
            {"wire_over_xor", jnum(ratio(d.wire, x ? x->wire : NAN))},
            {"wire_over_full", jnum(ratio(d.wire, num(p.bound, "full_bytes")))},
            {"diff_over_read_floor", jnum(diff ? ratio(diff->min(), p.floor_inputs) : NAN)},
            {"apply_nosync_over_read_floor", jnum(ap ? ratio(ap->min(), p.floor_local) : NAN)},
            {"apply_over_read_floor", jnum(d.mode("apply") ? ratio(d.mode("apply")->min(), p.floor_local) : NAN)},
            {"diff_1thread_over_all", jnum(diff && diff1 ? ratio(diff1->min(), diff->min()) : NAN)},
            {"apply_1thread_over_all", jnum(ap && ap1 ? ratio(ap1->min(), ap->min()) : NAN)}}}};
}

json pairs_json(const Report& rep) {
  json jpairs = json::array();
  for (const auto& p : rep.rs.pairs) {
    json jp = {{"lr", p.lr},
               {"pair", p.pair},
               {"base", "save_" + fmt("%03.0f", p.pair - 1)},
               {"new", "save_" + fmt("%03.0f", p.pair)},
               {"marked", &p == rep.marked},
               {"bound", p.bound},
               {"read_floor_inputs_s", jnum(p.floor_inputs)},
               {"read_floor_local_s", jnum(p.floor_local)},
               {"read_hash_floor_inputs_s", jnum(p.floor_inputs_hashed)},
               {"read_hash_write_back_floor_local_s", jnum(p.floor_local_rewrite)}};
    json jt = json::object();
    for (const auto& t : p.tool_order) jt[t] = tool_json(p, t, p.tools.at(t));
    jp["tools"] = jt;
    jpairs.push_back(jp);
  }
  return jpairs;
}

// ---- report: the targets at the marked pair -------------------------------------------------

// The best peer figures at one pair, and which peer has each.
struct BestPeers {
  double wire = NAN, diff = NAN, apply = NAN;
  std::string wire_name, diff_name, apply_name;
};

BestPeers best_peers(const PairData& p) {
  BestPeers b;
  for (const auto& t : p.tool_order) {
    if (is_hfdelta(t)) continue;
    const ToolData& d = p.tools.at(t);
    if (!std::isnan(d.wire) && (std::isnan(b.wire) || d.wire < b.wire)) b.wire = d.wire, b.wire_name = t;
    if (const Stat* s = d.mode("diff"); s && (std::isnan(b.diff) || s->min() < b.diff))
      b.diff = s->min(), b.diff_name = t;
    if (const Stat* s = d.mode("apply"); s && (std::isnan(b.apply) || s->min() < b.apply))
      b.apply = s->min(), b.apply_name = t;
  }
  return b;
}

// Writes the rows of one encoding's targets, in Markdown and in JSON.
struct TargetRows {
  std::ostringstream& md;
  json& out;
  const std::string& encoding;

  void row(const std::string& what, const std::string& measured, double r, double goal, const std::string& goal_text) {
    const char* status = std::isnan(r) ? "not measured" : (r <= goal ? "met" : "not met");
    md << "| " << encoding << " | " << what << " | " << measured << " | " << fmt("%.3f", r) << " | " << goal_text
       << " | " << (std::string(status) == "met" ? "**met**" : status) << " |\n";
    out.push_back({{"encoding", encoding},
                   {"target", what},
                   {"measured", measured},
                   {"ratio", jnum(r)},
                   {"goal", goal},
                   {"status", status}});
  }
};

// The targets of hfdelta's own: against the bound, xor and the read floors.
void own_targets(TargetRows& rows, const PairData& p, const ToolData& d) {
  const double bound = num(p.bound, "bound_bytes");
  const ToolData* x = p.find("hfdelta-xor");
  const Stat* diff = d.mode("diff");
  const Stat* apn = d.mode("apply_nosync");
  rows.row("total wire ≤ 1.15 × order-0 bound", mib(d.wire) + " vs " + mib(bound), ratio(d.wire, bound), 1.15,
           "≤ 1.15");
  rows.row("total wire ≤ 0.6 × xor wire", mib(d.wire) + " vs " + mib(x ? x->wire : NAN),
           ratio(d.wire, x ? x->wire : NAN), 0.6, "≤ 0.6");
  rows.row("delta-diff wall ≤ 2 × read floor (BASE+NEW)",
           fmt("%.3f s", diff ? diff->min() : NAN) + " vs " + fmt("%.3f s", p.floor_inputs),
           diff ? ratio(diff->min(), p.floor_inputs) : NAN, 2, "≤ 2");
  rows.row("delta-apply --no-sync wall ≤ 2 × read floor (LOCAL)",
           fmt("%.3f s", apn ? apn->min() : NAN) + " vs " + fmt("%.3f s", p.floor_local),
           apn ? ratio(apn->min(), p.floor_local) : NAN, 2, "≤ 2");
  const double anon = d.peak_anon();
  rows.row("peak RssAnon ≤ 256 MiB (diff and apply)", kib_mib(anon), ratio(anon, 256.0 * 1024), 1, "≤ 1");
  if (rows.encoding == "hfdelta-context") {  // issue #17's targets for the context encoding
    rows.row("total wire ≤ 0.75 × order-0 bound", mib(d.wire) + " vs " + mib(bound), ratio(d.wire, bound), 0.75,
             "≤ 0.75");
    const double cond = num(p.bound, "conditioned_bound_bytes");
    rows.row("total wire ≤ 1.05 × bound given the base exponent", mib(d.wire) + " vs " + mib(cond), ratio(d.wire, cond),
             1.05, "≤ 1.05");
    rows.row("delta-apply --no-sync wall ≤ 2.5 × read floor (LOCAL)",
             fmt("%.3f s", apn ? apn->min() : NAN) + " vs " + fmt("%.3f s", p.floor_local),
             apn ? ratio(apn->min(), p.floor_local) : NAN, 2.5, "≤ 2.5");
  }
}

// Strictly better than every peer: a ratio below 1.
void peer_targets(TargetRows& rows, const ToolData& d, const BestPeers& b) {
  const double eps = 1 - 1e-12;
  const Stat* diff = d.mode("diff");
  const Stat* ap = d.mode("apply");
  const Stat* apn = d.mode("apply_nosync");
  rows.row("diff faster than every peer",
           fmt("%.3f s", diff ? diff->min() : NAN) + " vs " + fmt("%.3f s", b.diff) + " (" +
               (b.diff_name.empty() ? "none" : b.diff_name) + ")",
           diff ? ratio(diff->min(), b.diff) : NAN, eps, "< 1");
  rows.row("apply --no-sync faster than every peer",
           fmt("%.3f s", apn ? apn->min() : NAN) + " vs " + fmt("%.3f s", b.apply) + " (" +
               (b.apply_name.empty() ? "none" : b.apply_name) + ")",
           apn ? ratio(apn->min(), b.apply) : NAN, eps, "< 1");
  rows.row("apply (flushing) faster than every peer",
           fmt("%.3f s", ap ? ap->min() : NAN) + " vs " + fmt("%.3f s", b.apply) + " (" +
               (b.apply_name.empty() ? "none" : b.apply_name) + ")",
           ap ? ratio(ap->min(), b.apply) : NAN, eps, "< 1");
  rows.row("wire smaller than every peer",
           mib(d.wire) + " vs " + mib(b.wire) + " (" + (b.wire_name.empty() ? "none" : b.wire_name) + ")",
           ratio(d.wire, b.wire), eps, "< 1");
}

json targets(Report& rep) {
  json jtargets = json::array();
  if (!rep.marked) return jtargets;
  const PairData& p = *rep.marked;
  const BestPeers b = best_peers(p);
  rep.md << "\n## Targets at the marked pair (lr " << p.lr << ", " << rep.pair_name(p) << ")\n\n"
         << "| hfdelta encoding | target | measured | ratio | goal | status |\n|---|---|---:|---:|---:|---|\n";
  for (const auto& t : p.tool_order) {
    if (!is_hfdelta(t)) continue;
    TargetRows rows{rep.md, jtargets, t};
    own_targets(rows, p, p.tools.at(t));
    peer_targets(rows, p.tools.at(t), b);
  }
  rep.md << "\nA missed target is a measurement, not a failure of the benchmark.\n";
  return jtargets;
}

// ---- report: squash ----------------------------------------------------------------------

const Stat* stat_in(const ToolMap& m, const char* tool, const char* mode) {
  const auto it = m.find(tool);
  return it == m.end() ? nullptr : it->second.mode(mode);
}

double wire_in(const ToolMap& m, const char* tool) {
  const auto it = m.find(tool);
  return it == m.end() ? NAN : it->second.wire;
}

double min_of(const Stat* s) { return s ? s->min() : NAN; }
double rss_of(const Stat* s) { return s ? s->max_rss_kib : NAN; }
json json_of(const Stat* s) { return s ? s->to_json() : json(nullptr); }

// Bytes of the squash against the chain it replaces and a direct diff, and the squash itself.
json md_squash_bytes(Report& rep) {
  json jsquash = json::array();
  const std::string saves = rep.rs.config.value("saves", std::string("?"));
  rep.md << "\n## Squash (a chain of " << saves << " deltas, lr " << rep.target_lr << ")\n\n"
         << "`sparse`: the default encoding at every step; `mixed`: xor and sparse in turn, so the entries of one "
            "tensor stack; `context`: the context encoding at every step, squashed against the first save "
            "(`--squash-base`; the direct diff is `--encoding context` too). Chain: the "
         << saves << " deltas together; direct: one diff of the first and last saves.\n\n"
         << "| chain | chain bytes | squashed | direct diff | squashed/direct | squashed/chain | squash wall | squash "
            "peak RSS |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const std::string& kind : rep.rs.squash_order) {
    const ToolMap& m = rep.rs.squash.at(kind);
    const double chain = wire_in(m, "chain"), sq = wire_in(m, "squashed"), direct = wire_in(m, "direct");
    const Stat* s = stat_in(m, "squashed", "squash");
    rep.md << "| " << kind << " | " << mib(chain) << " | " << mib(sq) << " | " << mib(direct) << " | "
           << fmt("%.3f", ratio(sq, direct)) << " | " << fmt("%.3f", ratio(sq, chain)) << " | "
           << fmt("%.3f s", min_of(s)) << " | " << kib_mib(rss_of(s)) << " |\n";
    json j = {{"chain", kind},
              {"chain_bytes", jnum(chain)},
              {"squashed_bytes", jnum(sq)},
              {"direct_bytes", jnum(direct)},
              {"squash", json_of(s)}};
    for (const char* mode : {"apply", "apply_nosync"})
      j[mode] = {{"chain", json_of(stat_in(m, "chain", mode))}, {"squashed", json_of(stat_in(m, "squashed", mode))}};
    jsquash.push_back(j);
  }
  return jsquash;
}

// A --root pull of the chain against applying the squash.
void md_squash_apply(Report& rep) {
  rep.md << "\n| chain | apply: --root pull of the chain | squashed | squashed/chain | --no-sync: chain | squashed | "
            "squashed/chain | peak RSS: chain | squashed |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  auto rss2 = [](const Stat* a, const Stat* b) {
    double r = rss_of(a);
    keep_max(r, rss_of(b));
    return r;
  };
  for (const std::string& kind : rep.rs.squash_order) {
    const ToolMap& m = rep.rs.squash.at(kind);
    const Stat *ca = stat_in(m, "chain", "apply"), *sa = stat_in(m, "squashed", "apply");
    const Stat *cn = stat_in(m, "chain", "apply_nosync"), *sn = stat_in(m, "squashed", "apply_nosync");
    rep.md << "| " << kind << " | " << fmt("%.3f s", min_of(ca)) << " | " << fmt("%.3f s", min_of(sa)) << " | "
           << fmt("%.3f", ratio(min_of(sa), min_of(ca))) << " | " << fmt("%.3f s", min_of(cn)) << " | "
           << fmt("%.3f s", min_of(sn)) << " | " << fmt("%.3f", ratio(min_of(sn), min_of(cn))) << " | "
           << kib_mib(rss2(ca, cn)) << " | " << kib_mib(rss2(sa, sn)) << " |\n";
  }
  rep.md << "\nBoth end byte-identical to the last save. Walls: the fastest of the runs.\n";
}

// Squash against the chain it replaces and against a direct diff.
json squash(Report& rep) {
  if (rep.rs.squash.empty()) return json::array();
  json jsquash = md_squash_bytes(rep);
  md_squash_apply(rep);
  return jsquash;
}

// ---- report: memory against model size --------------------------------------------------

// Encodings in the order of the config, then any other tool measured.
std::vector<std::string> memory_tools(const Report& rep, const std::map<std::string, ToolMap>& mem,
                                      const std::vector<std::pair<double, std::string>>& order) {
  std::vector<std::string> encs;
  std::istringstream in(rep.rs.config.value("encodings", std::string()));
  for (std::string e; in >> e;) encs.push_back("hfdelta-" + e);
  for (const auto& [full, pr] : order)
    for (const auto& [pr_tool, pr_data] : mem.at(pr))
      if (std::find(encs.begin(), encs.end(), pr_tool) == encs.end()) encs.push_back(pr_tool);
  return encs;
}

// One row: the peaks of delta-diff and of delta-apply for one encoding at one preset.
void memory_row(Report& rep, json& jmem, const std::string& pr, double full, const std::string& t, const ToolData& d) {
  double danon = NAN, drss = NAN, aanon = NAN, arss = NAN;
  for (const auto& [m, s] : d.modes) {
    const bool is_diff = m.rfind("diff", 0) == 0;
    keep_max(is_diff ? danon : aanon, s.peak_anon_kib);
    keep_max(is_diff ? drss : arss, s.max_rss_kib);
  }
  rep.md << "| " << pr << " | " << mib(full) << " | " << t << " | " << kib_mib(danon) << " | " << kib_mib(drss) << " | "
         << kib_mib(aanon) << " | " << kib_mib(arss) << " |\n";
  jmem.push_back({{"preset", pr},
                  {"full_bytes", full},
                  {"tool", t},
                  {"diff_peak_rss_anon_kib", jnum(danon)},
                  {"diff_max_rss_kib", jnum(drss)},
                  {"apply_peak_rss_anon_kib", jnum(aanon)},
                  {"apply_max_rss_kib", jnum(arss)}});
}

json memory(Report& rep) {
  json jmem = json::array();
  std::map<std::string, ToolMap> mem = rep.rs.mem;
  std::map<std::string, double> mem_full = rep.rs.mem_full;
  // The main preset's figures come from the marked pair unless a separate series measured it.
  if (rep.marked && !mem.count(rep.preset)) {
    for (const auto& [t, d] : rep.marked->tools)
      if (is_hfdelta(t)) mem[rep.preset][t] = d;
    mem_full[rep.preset] = num(rep.marked->bound, "full_bytes");
  }
  std::vector<std::pair<double, std::string>> order;  // presets by checkpoint size
  for (const auto& [pr, tools] : mem) order.push_back({mem_full.count(pr) ? mem_full[pr] : 0, pr});
  std::sort(order.begin(), order.end());
  if (order.empty()) return jmem;
  rep.md << "\n## Peak memory against model size (lr " << rep.target_lr << ")\n\n"
         << "| preset | full checkpoint | encoding | delta-diff peak RssAnon | delta-diff peak RSS | delta-apply peak "
            "RssAnon | delta-apply peak RSS |\n"
            "|---|---:|---|---:|---:|---:|---:|\n";
  const std::vector<std::string> encs = memory_tools(rep, mem, order);
  for (const auto& [full, pr] : order)
    for (const auto& t : encs) {
      if (!is_hfdelta(t) || !mem[pr].count(t)) continue;
      memory_row(rep, jmem, pr, full, t, mem[pr].at(t));
    }
  return jmem;
}

void md_timings(Report& rep) {
  if (rep.rs.timings.empty()) return;
  rep.md << "\n## Run time\n\n";
  for (const auto& t : rep.rs.timings)
    rep.md << "- " << lab(t, "what") << ": " << fmt("%.0f s", num(t, "seconds")) << "\n";
}

}  // namespace

// ---- the sorted records --------------------------------------------------------------

double Stat::min() const { return walls.empty() ? NAN : *std::min_element(walls.begin(), walls.end()); }

double Stat::med() const { return median(walls); }

double Stat::cpu() const {
  return walls.empty() ? NAN
                       : cpus[static_cast<std::size_t>(std::min_element(walls.begin(), walls.end()) - walls.begin())];
}

void Stat::add(const json& r) {
  walls.push_back(num(r, "wall_s"));
  cpus.push_back(num(r, "user_s", 0) + num(r, "sys_s", 0));
  keep_max(max_rss_kib, num(r, "time_max_rss_kib", num(r, "ru_maxrss_kib")));
  keep_max(peak_anon_kib, num(r, "peak_rss_anon_kib"));
  keep_max(peak_vm_rss_kib, num(r, "peak_vm_rss_kib"));
}

json Stat::to_json() const {
  if (empty()) return nullptr;
  auto n = [](double v) -> json { return std::isnan(v) ? json(nullptr) : json(v); };
  return {{"runs", walls.size()},
          {"wall_s", walls},
          {"cpu_s", cpus},
          {"min_s", min()},
          {"median_s", med()},
          {"max_rss_kib", n(max_rss_kib)},
          {"peak_rss_anon_kib", n(peak_anon_kib)},
          {"peak_vm_rss_kib", n(peak_vm_rss_kib)}};
}

const Stat* ToolData::mode(const std::string& m) const {
  const auto it = modes.find(m);
  return it == modes.end() || it->second.empty() ? nullptr : &it->second;
}

double ToolData::peak_anon() const {
  double a = NAN;
  for (const auto& [k, s] : modes) keep_max(a, s.peak_anon_kib);
  return a;
}

ToolData& PairData::tool(const std::string& t) {
  if (!tools.count(t)) tool_order.push_back(t);
  return tools[t];
}

const ToolData* PairData::find(const std::string& t) const {
  const auto it = tools.find(t);
  return it == tools.end() ? nullptr : &it->second;
}

PairData& Records::pair_of(const std::string& lr, int pair) {
  for (auto& p : pairs)
    if (p.lr == lr && p.pair == pair) return p;
  pairs.push_back({});
  pairs.back().lr = lr;
  pairs.back().pair = pair;
  return pairs.back();
}

Records sort_records(std::vector<json> recs) {
  Records rs;
  rs.all = std::move(recs);
  for (const json& r : rs.all) {
    const std::string kind = lab(r, "kind"), series = lab(r, "series");
    add_setup_record(rs, r, kind);
    if (series == "mem")
      add_mem_record(rs, r, kind);
    else if (series == "squash")
      add_squash_record(rs, r, kind);
    else if (series == "main")
      add_main_record(rs, r, kind);
  }
  order_pairs(rs.pairs);
  return rs;
}

// ---- report ---------------------------------------------------------------------------------

void write_report(const Records& rs, const std::string& md_path, const std::string& json_path) {
  Report rep(rs, rs.config.value("target_lr", std::string("1e-6")));

  md_setup(rep);
  md_machine(rep);
  md_versions(rep);
  md_method(rep);
  md_loads(rep);
  md_pairs(rep);
  md_wire(rep);
  md_diff(rep);
  md_apply(rep);
  const json jpairs = pairs_json(rep);
  const json jtargets = targets(rep);
  const json jsquash = squash(rep);
  const json jmem = memory(rep);
  md_timings(rep);

  std::ofstream(md_path) << rep.md.str();
  json out = {{"machine", rs.machine},
              {"config", rs.config},
              {"tool_versions", rs.versions},
              {"pairs", jpairs},
              {"targets", jtargets},
              {"memory_scaling", jmem},
              {"squash", jsquash},
              {"marked", rep.marked ? json{{"lr", rep.marked->lr}, {"pair", rep.marked->pair}} : json(nullptr)},
              {"timings", rs.timings},
              {"loads", rs.loads},
              {"records", rs.all}};
  std::ofstream(json_path) << out.dump(1) << '\n';
}

}  // namespace bench
