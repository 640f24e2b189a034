// End-to-end: crash safety of delta-apply. A fault is injected at every write
// step in turn (HFDELTA_FAULT_AT), once as a SIGKILL, once as an I/O error and
// once as an I/O error at that step and every later one (a full or dying
// disk), for each kind of operation. After a kill, state.json never claims a version
// whose bytes are not all in place and the next run converges; after an error,
// LOCAL is byte-identical to before. Then a larger pull is SIGKILLed at random
// moments.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "e2e_util.hpp"

extern char** environ;

using namespace e2e;

namespace {

constexpr long kMaxSteps = 4000;  // a run with more write steps than this fails the test
constexpr int kKilled = 128 + SIGKILL;

// Which write steps the sweeps fault. By default every one (`meson test
// --suite crash` keeps the whole matrix). scripts/test.sh (K=3) and the
// sanitizer run (K=10) set HFDELTA_CRASH_STRIDE=K and HFDELTA_CRASH_OFFSET=R
// to fault the steps n with (n - 1) % K == R (see Sampling).
const Sampling& sampling() {
  static const Sampling s("HFDELTA_CRASH_STRIDE", "HFDELTA_CRASH_OFFSET");
  return s;
}
long first_step() { return sampling().offset + 1; }
std::string describe_sampling() {
  return sampling().all() ? std::string("every write step")
                          : "every " + std::to_string(sampling().stride) + "th write step from step " +
                                std::to_string(first_step());
}

// delta-apply ARGS with the N-th write step failing in `mode` ("kill" or "error").
RunResult apply_faulty(const std::vector<std::string>& args, long at, const char* mode) {
  ScopedEnv a("HFDELTA_FAULT_AT", std::to_string(at));
  ScopedEnv m("HFDELTA_FAULT_MODE", mode);
  return apply(args);
}

std::vector<std::string> with_json(const std::vector<std::string>& args) {
  std::vector<std::string> v{"--json"};
  v.insert(v.end(), args.begin(), args.end());
  return v;
}

// Every directory below `dir` outside .weight_sync, relative, sorted: the
// snapshots compare files only, and a stray or vanished directory matters too.
std::vector<std::string> list_dirs(const fs::path& dir) {
  std::vector<std::string> v;
  for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator(); ++it) {
    if (it.depth() == 0 && it->path().filename() == ".weight_sync") {
      it.disable_recursion_pending();
      continue;
    }
    if (fs::is_directory(it->symlink_status())) v.push_back(fs::relative(it->path(), dir).generic_string());
  }
  std::sort(v.begin(), v.end());
  return v;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return "[" + s + "]";
}

// Problems seen over many runs, grouped by description with the runs that
// showed each, and reported once: a broken invariant shows up as a few lines,
// not as one failure per write step.
class Problems {
 public:
  void add(const std::string& what, long at) {
    auto& e = by_what_[what];
    if (e.first.size() < 10) e.first.push_back(at);
    ++e.second;
  }
  bool empty() const { return by_what_.empty(); }
  std::string text(const std::string& at_what) const {
    std::ostringstream o;
    std::size_t shown = 0;
    for (const auto& [what, e] : by_what_) {
      if (++shown > 25) {
        o << "... and " << (by_what_.size() - 25) << " more kinds of problem\n";
        break;
      }
      o << what << "\n    at " << at_what << " ";
      for (std::size_t i = 0; i < e.first.size(); ++i) o << (i ? ", " : "") << e.first[i];
      if (e.second > e.first.size()) o << ", ...";
      o << " (" << e.second << " in all)\n";
    }
    return o.str();
  }

 private:
  std::map<std::string, std::pair<std::vector<long>, std::size_t>> by_what_;
};

// One operation of delta-apply, run again and again from the same LOCAL.
struct Scenario {
  std::string name;
  std::vector<std::string> args;  // delta-apply options and paths (LOCAL among them)
  fs::path local;                 // LOCAL, as named in args
  fs::path start;                 // what LOCAL holds before the command; copied in for every run
  std::string old_version;        // LOCAL's version before ("" none)
  std::string target;             // the version the command records
  // Every version state.json may record during the command, with its
  // checkpoint ("" → start: no version recorded).
  std::map<std::string, fs::path> trees;
  // A --root pull commits each version as it applies it: a failed run may
  // leave LOCAL at any version of `trees`, whole and recorded.
  bool per_version = false;
};

void reset(const Scenario& s) {
  fs::remove_all(s.local);
  copy_tree(s.start, s.local);
}

// LOCAL is the target in every file, state.json records exactly the target,
// and (if `clean`) no transaction is left.
void check_target(const Scenario& s, Problems& p, long at, const std::string& when, bool clean = true) {
  const TreeDiff d = tree_equal(s.local, s.trees.at(s.target));
  if (!d.equal) p.add(when + ": LOCAL is not the target: " + d.differences.front(), at);
  const json st = state_json(s.local);
  if (st != json{{"version", s.target}})
    p.add(when + ": state.json is " + st.dump() + ", not {\"version\": \"" + s.target + "\"}", at);
  if (clean && has_txn(s.local)) p.add(when + ": .weight_sync/txn is left behind", at);
}

// The same command without a fault converges, and reports the rollback of
// the interrupted version it found.
void check_rerun(const Scenario& s, Problems& p, long at, const std::string& pending) {
  const RunResult r = apply(with_json(s.args));
  if (r.code != 0) {
    p.add("re-run without the fault exits " + std::to_string(r.code) + ": " + first_line(r.err), at);
    return;
  }
  json j;
  try {
    j = json::parse(r.out);
  } catch (const std::exception&) {
    p.add("re-run: --json output is not JSON", at);
  }
  if (j.is_object()) {
    if (j.value("to_version", json()) != json(s.target)) p.add("re-run: to_version is not the target", at);
    if (!pending.empty() && j.value("rolled_back", json()) != json(pending))
      p.add("re-run: rolled_back is " + j.value("rolled_back", json()).dump() + " though state.json had pending " +
                pending,
            at);
  }
  check_target(s, p, at, "after the re-run");
}

struct StateSeen {
  std::string version, pending;
};

// state.json as an interrupted or failed run left it, checked against what
// LOCAL holds. With `one_transaction`, a version between the old one and the target is a
// problem too: the whole command is meant to be one transaction.
StateSeen check_recorded_state(const Scenario& s, Problems& p, long at, bool one_transaction = true) {
  StateSeen seen;
  const json st = state_json(s.local);
  if (!st.is_null()) {
    if (!st.is_object()) {
      p.add("state.json is not an object", at);
      return seen;
    }
    for (auto it = st.begin(); it != st.end(); ++it) {
      if (it.key() != "version" && it.key() != "pending")
        p.add("state.json has key \"" + it.key() + "\"", at);
      else if (!it->is_string())
        p.add("state.json \"" + it.key() + "\" is not a string", at);
      else
        (it.key() == "version" ? seen.version : seen.pending) = it->get<std::string>();
    }
  }
  if (!s.trees.count(seen.version)) {
    p.add("state.json records version \"" + seen.version + "\", which the command never goes through", at);
    return seen;
  }
  if (seen.pending.empty()) {
    // Nothing pending: the recorded version's bytes must all be in place.
    const TreeDiff d = tree_equal(s.local, s.trees.at(seen.version));
    if (!d.equal)
      p.add("state.json records version \"" + seen.version +
                "\" with nothing pending, but LOCAL is not that version: " + d.differences.front(),
            at);
  } else {
    if (!s.trees.count(seen.pending) || seen.pending == seen.version)
      p.add("state.json has pending \"" + seen.pending + "\" on version \"" + seen.version + "\"", at);
  }
  // An intermediate version may show only while the operation is marked pending.
  if (one_transaction && seen.pending.empty() && seen.version != s.old_version && seen.version != s.target)
    p.add("state.json records intermediate version " + seen.version + " (expected the old version " +
              (s.old_version.empty() ? "none" : s.old_version) + " or the target " + s.target +
              "): the operation is not one transaction",
          at);
  return seen;
}

// --status agrees with state.json and changes nothing.
void check_status(const Scenario& s, Problems& p, long at, const StateSeen& seen) {
  const Snapshot before = snapshot(s.local, true);
  const RunResult r = apply({"--status", "--json", s.local.string()});
  if (snapshot(s.local, true) != before) p.add("--status changed LOCAL", at);
  if (!seen.pending.empty()) {
    if (r.code != 10) p.add("--status exits " + std::to_string(r.code) + " while state.json has pending", at);
  } else if (r.code == 10) {
    // The journal may be complete before state.json is marked: still interrupted.
    if (!has_txn(s.local)) p.add("--status exits 10 with nothing pending and no transaction", at);
  } else if (r.code != (seen.version.empty() ? 11 : 0)) {
    p.add(
        "--status exits " + std::to_string(r.code) + " for state version \"" + seen.version + "\" with nothing pending",
        at);
  }
  json j;
  try {
    j = json::parse(r.out);
  } catch (const std::exception&) {
    p.add("--status --json output is not JSON: " + first_line(r.out + r.err), at);
    return;
  }
  const json want_version = seen.version.empty() ? json() : json(seen.version);
  if (j.value("version", json("?")) != want_version)
    p.add("--status reports version " + j.value("version", json()).dump(), at);
  const json pend = j.value("pending", json());
  if ((r.code == 10) == pend.is_null()) p.add("--status: exit code and \"pending\" disagree", at);
  if (!seen.pending.empty() && pend != json(seen.pending)) p.add("--status reports pending " + pend.dump(), at);
}

struct Totals {
  long kill_steps = 0, error_steps = 0, swallowed = 0, persist_steps = 0, kept = 0;
};
std::map<std::string, Totals>& totals() {
  static std::map<std::string, Totals> t;
  return t;
}

// The number of write steps of the command, known to lie in [killed, done):
// a kill at step `killed` landed (0: none tried), one at `done` did not fire.
// Sampled sweeps find it by bisection; a full sweep already has it.
long count_steps(const Scenario& s, long killed, long done) {
  while (done - killed > 1) {
    const long mid = killed + (done - killed) / 2;
    reset(s);
    (apply_faulty(s.args, mid, "kill").code == 0 ? done : killed) = mid;
  }
  return killed;
}

// Kill at write step 1, 2, ... (or the sampled ones) until a run completes
// without the fault firing. Returns the number of write steps.
long kill_every_step(const Scenario& s, Problems& p) {
  long killed = 0;  // the last step a kill landed at
  for (long n = first_step(); n <= kMaxSteps; n += sampling().stride) {
    reset(s);
    const RunResult r = apply_faulty(s.args, n, "kill");
    if (r.code == 0) {
      check_target(s, p, n, "run without the fault firing");
      return count_steps(s, killed, n);
    }
    killed = n;
    if (r.code != kKilled) {
      p.add("exit " + std::to_string(r.code) + " instead of SIGKILL: " + first_line(r.err), n);
      continue;
    }
    const StateSeen seen = check_recorded_state(s, p, n, !s.per_version);
    check_status(s, p, n, seen);
    check_rerun(s, p, n, seen.pending);
  }
  FAIL(s.name << ": still faulting after " << kMaxSteps << " write steps");
  return kMaxSteps;
}

// An I/O error at write step 1, 2, ... A run that exits 0 though its step
// was within the command's steps met the fault in the cleanup after the
// commit, which only leaves garbage for the next run: LOCAL must be the
// target then. Returns the steps seen, counting those faults in `swallowed`.
long error_every_step(const Scenario& s, long kill_steps, Problems& p, Problems& stray_dirs, long& swallowed) {
  for (long n = first_step(); n <= kMaxSteps; n += sampling().stride) {
    reset(s);
    const LocalSnapshot snap(s.local);
    const std::vector<std::string> dirs = list_dirs(s.local);
    const RunResult r = apply_faulty(s.args, n, "error");
    if (r.code == 0) {
      if (n > kill_steps) {
        check_target(s, p, n, "run without the fault firing");
        return n - 1;
      }
      ++swallowed;
      check_target(s, p, n, "exit 0 with the fault in the post-commit cleanup", false);
      check_rerun(s, p, n, "");
      continue;
    }
    if (r.code != 1) p.add("exit " + std::to_string(r.code) + " instead of 1: " + first_line(r.err), n);
    if (!contains(r.err, "injected fault"))
      p.add("the message does not say \"injected fault\": " + first_line(r.err), n);
    const StateSeen seen = check_recorded_state(s, p, n, !s.per_version);
    // A pull that committed versions before the failure keeps them
    // (check_recorded_state compared LOCAL with the version it records).
    const bool moved = s.per_version && seen.pending.empty() && seen.version != s.old_version;
    const TreeDiff d = moved ? TreeDiff{} : snap.compare();
    for (const auto& line : d.differences)  // a transaction left behind is reported once, below
      if (line.rfind(".weight_sync/txn/", 0) != 0) p.add("LOCAL differs from before the failed run: " + line, n);
    // Files are what a loader sees; an emptied directory left behind is
    // reported apart (as a warning) from differences in the files.
    const std::vector<std::string> now = list_dirs(s.local);
    if (!moved && now != dirs)
      stray_dirs.add("directories differ from before the failed run: " + join(dirs) + " before, " + join(now) + " now",
                     n);
    if (has_txn(s.local)) p.add(".weight_sync/txn is left after the failed run", n);
    const RunResult st = apply({"--status", s.local.string()});
    const int want = s.old_version.empty() && seen.version.empty() ? 11 : 0;
    if (st.code != want)
      p.add("--status after the failed run exits " + std::to_string(st.code) + ", not " + std::to_string(want), n);
    check_rerun(s, p, n, "");
  }
  FAIL(s.name << ": still faulting after " << kMaxSteps << " write steps");
  return kMaxSteps;
}

// Every write step from N on fails (a full or dying disk), so the rollback
// of a failed run usually fails too. Either LOCAL is back as it was and the
// journal is gone, or the journal is kept, LOCAL reads as interrupted and
// the message says so; the next run (the disk healed) converges either way.
long persist_every_step(const Scenario& s, long kill_steps, Problems& p, long& kept) {
  for (long n = first_step(); n <= kMaxSteps; n += sampling().stride) {
    reset(s);
    const LocalSnapshot snap(s.local);
    const RunResult r = apply_faulty(s.args, n, "persist");
    if (r.code == 0) {
      if (n > kill_steps) {
        check_target(s, p, n, "run without the fault firing");
        return n - 1;
      }
      check_target(s, p, n, "exit 0 with the faults in the cleanup after the commit", false);
      check_rerun(s, p, n, "");
      continue;
    }
    if (r.code != 1) p.add("exit " + std::to_string(r.code) + " instead of 1: " + first_line(r.err), n);
    if (!contains(r.err, "injected fault"))
      p.add("the message does not say \"injected fault\": " + first_line(r.err), n);
    const StateSeen seen = check_recorded_state(s, p, n, !s.per_version);
    const bool moved = s.per_version && seen.pending.empty() && seen.version != s.old_version;
    const RunResult st = apply({"--status", s.local.string()});
    if (has_journal(s.local)) {
      ++kept;
      if (!contains(r.err, "undo journal") && !contains(r.err, "undone journal"))
        p.add("the journal is kept but the message does not say so: " + r.err, n);
      if (st.code != 10) p.add("--status exits " + std::to_string(st.code) + " with the journal kept, not 10", n);
      check_status(s, p, n, seen);
    } else {
      if (contains(r.err, "undo journal in")) p.add("the message speaks of a kept journal, but none is left", n);
      const TreeDiff d = moved ? TreeDiff{} : snap.compare();
      for (const auto& line : d.differences)
        if (line.rfind(".weight_sync/txn/", 0) != 0) p.add("LOCAL differs from before the failed run: " + line, n);
      const int want = s.old_version.empty() && seen.version.empty() ? 11 : 0;
      if (st.code != want)
        p.add("--status after the failed run exits " + std::to_string(st.code) + ", not " + std::to_string(want), n);
    }
    check_rerun(s, p, n, seen.pending);
  }
  FAIL(s.name << ": still faulting after " << kMaxSteps << " write steps");
  return kMaxSteps;
}

void run_scenario(const Scenario& s) {
  INFO("scenario: " << s.name);
  Problems pk, pe, pd;
  Totals t;
  t.kill_steps = kill_every_step(s, pk);
  CHECK_MESSAGE(pk.empty(), s.name << ", SIGKILL at each write step:\n" << pk.text("write step"));
  t.error_steps = error_every_step(s, t.kill_steps, pe, pd, t.swallowed);
  CHECK_MESSAGE(pe.empty(), s.name << ", I/O error at each write step:\n" << pe.text("write step"));
  WARN_MESSAGE(pd.empty(), s.name << ", I/O error at each write step, empty directories left behind:\n"
                                  << pd.text("write step"));
  Problems pp;
  t.persist_steps = persist_every_step(s, t.kill_steps, pp, t.kept);
  CHECK_MESSAGE(pp.empty(), s.name << ", every write step failing from each one on:\n" << pp.text("write step"));
  CHECK(t.kill_steps > 0);
  totals()[s.name] = t;
  MESSAGE(s.name << " (" << describe_sampling() << "): " << t.kill_steps << " write steps killed, " << t.error_steps
                 << " failed with an I/O error (" << t.swallowed
                 << " of them in the cleanup after the commit, which the run ignores); with every step "
                 << "failing from one on, " << t.kept << " of " << t.persist_steps << " runs kept their journal");
}

// ---- inputs --------------------------------------------------------------------------

// Saves, deltas and starting points shared by the scenarios.
struct Inputs {
  std::unique_ptr<TempDir> t = scratch_dir();
  fs::path series, local, empty;
  // Single deltas: BASE -> NEXT, with every kind of non-weight change.
  fs::path base, next, base_start, root_xor, root_overwrite;
  // The same without a file turned into a directory.
  fs::path plain_base, plain_next, plain_start, root_plain;
  // A directory turned into a file.
  fs::path dir_base, dir_next, dir_start, root_dir, root_auto, root_sparse;
  // A chain: 1 a delta, 2 a full version with a file of its own, 3 a delta on it.
  fs::path chain, v2_full, v3_new, s0_start;
  // LOCAL holding another model with stray files.
  fs::path other_start;
  // One tensor larger than the rest together (several sparse chunks): with 2
  // threads its entry is patched in chunk ranges by both threads.
  fs::path big, big_start, root_big;
  // Structural deltas: 0 -> 1 builds a weight file under a new name and one
  // under its old name, rewrites a header in place, removes a weight file,
  // patches one in place and carries config.json and the index; 1 -> 2 goes
  // back to the first layout, so a chain 0 -> 2 has two structural steps.
  fs::path st0, st1, st2, st_start, root_struct, root_struct_chain;
  // Saves 0 -> 1 as xor, 1 -> 2 as sparse, squashed into one delta 0 -> 2
  // whose entries are stacked (the two kinds do not compose).
  fs::path root_mixed, stacked;

  Inputs() {
    const TempDir& d = *t;
    series = gen_series(d / "series", 3, {"--max-shard-size", "600KB"});
    local = d / "local";
    empty = d / "empty";
    fs::create_directories(empty);

    // Save 1's weights with a changed config.json, a new file in a new
    // subdirectory and a removed file.
    plain_base = d / "plain-base";
    copy_tree(save_dir(series, 0), plain_base);
    plain_next = d / "plain-next";
    copy_tree(save_dir(series, 1), plain_next);
    json cfg = read_json(plain_next / "config.json");
    cfg["use_cache"] = false;
    cfg["hfdelta_note"] = "changed by the new save";
    write_json(plain_next / "config.json", cfg);
    write_file(plain_next / "extra" / "notes" / "readme.txt", "a new file in a new subdirectory\n");
    fs::remove(plain_next / "tokenizer_config.json");
    // ... and a file that becomes a directory of the same name.
    base = d / "base";
    copy_tree(plain_base, base);
    write_file(base / "assets", "a file that becomes a directory\n");
    next = d / "next";
    copy_tree(plain_next, next);
    write_file(next / "assets" / "vocab.txt", "alpha\nbeta\n");
    write_file(next / "assets" / "merges.txt", "a b\n");
    // A directory that becomes a file of the same name.
    dir_base = d / "dir-base";
    copy_tree(save_dir(series, 0), dir_base);
    write_file(dir_base / "layout" / "readme.txt", "a directory that becomes a file\n");
    dir_next = d / "dir-next";
    copy_tree(save_dir(series, 1), dir_next);
    write_file(dir_next / "layout", "now a file\n");

    root_xor = d / "root-xor";
    root_overwrite = d / "root-overwrite";
    root_plain = d / "root-plain";
    root_dir = d / "root-dir";
    root_auto = d / "root-auto";
    root_sparse = d / "root-sparse";
    for (const fs::path& r : {root_xor, root_overwrite, root_plain, root_dir, root_auto, root_sparse})
      fs::create_directories(r);
    require_diff(plain_base, plain_next, version_dir(root_auto, 1), "auto");  // context entries (and xor where smaller)
    require_diff(plain_base, plain_next, version_dir(root_sparse, 1), "sparse");
    {
      bool context = false;  // the auto delta is meant to cover context entries
      const json idx = delta_index(version_dir(root_auto, 1));
      for (const auto& [name, enc] : idx["metadata"]["hfdelta_encodings"].items())
        context = context || enc == "context";
      REQUIRE(context);
    }
    require_diff(base, next, version_dir(root_xor, 1), "xor");
    require_diff(base, next, version_dir(root_overwrite, 1), "overwrite");
    require_diff(plain_base, plain_next, version_dir(root_plain, 1), "xor");
    require_diff(dir_base, dir_next, version_dir(root_dir, 1), "xor");
    auto ops_of = [](const fs::path& delta) {
      std::map<std::string, std::string> ops;
      const json idx = delta_index(delta);
      for (const auto& f : idx["metadata"]["hfdelta_files"])
        ops[f["path"].get<std::string>()] = f["op"].get<std::string>();
      return ops;
    };
    for (const fs::path& r : {root_xor, root_overwrite}) {
      auto ops = ops_of(version_dir(r, 1));
      REQUIRE(ops["config.json"] == "put");
      REQUIRE(ops["extra/notes/readme.txt"] == "put");
      REQUIRE(ops["tokenizer_config.json"] == "remove");
      REQUIRE(ops["assets"] == "remove");
      REQUIRE(ops["assets/vocab.txt"] == "put");
    }
    REQUIRE(ops_of(version_dir(root_dir, 1))["layout/readme.txt"] == "remove");
    REQUIRE(ops_of(version_dir(root_dir, 1))["layout"] == "put");

    chain = d / "root-chain";
    fs::create_directories(chain);
    std::tie(v2_full, v3_new) = make_full_version_chain(series, chain, d / "v3");

    base_start = d / "start-base";
    REQUIRE(require_init(base, base_start) == "000000");
    plain_start = d / "start-plain";
    REQUIRE(require_init(plain_base, plain_start) == "000000");
    dir_start = d / "start-dir";
    REQUIRE(require_init(dir_base, dir_start) == "000000");
    s0_start = d / "start-save0";
    REQUIRE(require_init(save_dir(series, 0), s0_start) == "000000");
    // Another model (one shard, another seed) with stray files and directories.
    const fs::path other = gen_series(d / "other", 0, {"--seed", "7"});
    other_start = d / "start-other";
    REQUIRE(require_init(save_dir(other, 0), other_start) == "000000");
    write_file(other_start / "stray.txt", "stray\n");
    write_file(other_start / "stale" / "deep" / "x.txt", "stray\n");

    big = gen_series(d / "big", 1,
                     {"--hidden", "64", "--vocab", "65536", "--layers", "1", "--intermediate", "128",
                      "--tie-embeddings", "--lr", "1e-5"});
    root_big = d / "root-big";
    fs::create_directories(root_big);
    require_diff(save_dir(big, 0), save_dir(big, 1), version_dir(root_big, 1), "auto");
    big_start = d / "start-big";
    REQUIRE(require_init(save_dir(big, 0), big_start) == "000000");

    st0 = d / "struct-0";
    st1 = d / "struct-1";
    st2 = d / "struct-2";
    write_structural_checkpoint(st0, 0);
    write_structural_checkpoint(st1, 1);
    write_structural_checkpoint(st2, 2);
    root_struct = d / "root-struct";
    root_struct_chain = d / "root-struct-chain";
    fs::create_directories(root_struct);
    fs::create_directories(root_struct_chain);
    require_diff(st0, st1, version_dir(root_struct, 1), "auto");
    require_diff(st0, st1, version_dir(root_struct_chain, 1), "auto");
    require_diff(st1, st2, version_dir(root_struct_chain, 2), "auto");
    // The scenario is only worth its time with every operation in it.
    const json sidx = delta_index(version_dir(root_struct, 1));
    std::multiset<std::string> shard_ops;
    for (const auto& op : sidx["metadata"]["hfdelta_shards"]) shard_ops.insert(op["op"].get<std::string>());
    REQUIRE(shard_ops == std::multiset<std::string>{"build", "build", "header", "remove"});
    REQUIRE(ops_of(version_dir(root_struct, 1)).size() == 2);  // config.json and the index
    REQUIRE(sidx["weight_map"].contains("a.weight"));          // model-a is patched in place
    st_start = d / "start-struct";
    REQUIRE(require_init(st0, st_start) == "000000");

    root_mixed = d / "root-mixed";
    fs::create_directories(root_mixed);
    require_diff(save_dir(series, 0), save_dir(series, 1), version_dir(root_mixed, 1), "xor");
    require_diff(save_dir(series, 1), save_dir(series, 2), version_dir(root_mixed, 2), "sparse");
    stacked = d / "stacked";
    const RunResult sq = diff({"--json", "--squash", version_dir(root_mixed, 1).string(),
                               version_dir(root_mixed, 2).string(), stacked.string()});
    E2E_REQUIRE_CODE(sq, 0);
    REQUIRE(parse_json(sq.out)["entries_stacked"].get<int>() >= 2);
  }
};

Inputs& inputs() {
  static Inputs in;
  return in;
}

Scenario single_delta(const std::string& name, const fs::path& root, const fs::path& start, const fs::path& base,
                      const fs::path& next, const std::string& threads, bool no_sync = false) {
  Scenario s;
  s.name = name;
  s.local = inputs().local;
  s.args = {"--threads", threads, version_dir(root, 1).string(), s.local.string()};
  if (no_sync) s.args.insert(s.args.begin(), "--no-sync");
  s.start = start;
  s.old_version = "000000";
  s.target = "000001";
  s.trees = {{"000000", base}, {"000001", next}};
  return s;
}

// ---- random kills --------------------------------------------------------------------

int wait_status(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw std::runtime_error(std::string("waitpid: ") + std::strerror(errno));
  return status;
}

}  // namespace

TEST_CASE("crash: xor delta with non-weight file changes, a fault at every write step") {
  const Inputs& in = inputs();
  run_scenario(single_delta("xor delta", in.root_xor, in.base_start, in.base, in.next, "1"));
}

TEST_CASE("crash: overwrite delta with non-weight file changes, a fault at every write step") {
  const Inputs& in = inputs();
  run_scenario(single_delta("overwrite delta", in.root_overwrite, in.base_start, in.base, in.next, "1"));
}

TEST_CASE("crash: xor delta, no file turned into a directory, 2 threads, a fault at every write step") {
  const Inputs& in = inputs();
  run_scenario(single_delta("xor delta without file/directory swap, 2 threads", in.root_plain, in.plain_start,
                            in.plain_base, in.plain_next, "2"));
}

TEST_CASE("crash: sparse delta, 2 threads, a fault at every write step") {
  const Inputs& in = inputs();
  run_scenario(
      single_delta("sparse delta, 2 threads", in.root_sparse, in.plain_start, in.plain_base, in.plain_next, "2"));
}

TEST_CASE("crash: auto (context) delta, 2 threads, a fault at every write step") {
  const Inputs& in = inputs();
  run_scenario(single_delta("auto delta, 2 threads", in.root_auto, in.plain_start, in.plain_base, in.plain_next, "2"));
}

// Without flushing, apply patches in one pass with a live journal: every
// write of LOCAL must still be undone after a kill or an error.
TEST_CASE("crash: --no-sync one-pass apply of a sparse delta, 2 threads, a fault at every write step") {
  const Inputs& in = inputs();
  run_scenario(single_delta("sparse delta, --no-sync, 2 threads", in.root_sparse, in.plain_start, in.plain_base,
                            in.plain_next, "2", true));
}

TEST_CASE("crash: --no-sync one-pass apply of an auto (context) delta, 2 threads, a fault at every write step") {
  const Inputs& in = inputs();
  run_scenario(single_delta("auto delta, --no-sync, 2 threads", in.root_auto, in.plain_start, in.plain_base,
                            in.plain_next, "2", true));
}

TEST_CASE("crash: --no-sync one-pass apply of an xor delta with file changes, a fault at every write step") {
  const Inputs& in = inputs();
  run_scenario(single_delta("xor delta, --no-sync", in.root_xor, in.base_start, in.base, in.next, "1", true));
}

TEST_CASE(
    "crash: one tensor patched in chunk ranges by 2 threads, with and without --no-sync, a fault at every write step") {
  const Inputs& in = inputs();
  for (bool no_sync : {false, true})
    run_scenario(single_delta(no_sync ? "split entry, --no-sync, 2 threads" : "split entry, 2 threads", in.root_big,
                              in.big_start, save_dir(in.big, 0), save_dir(in.big, 1), "2", no_sync));
}

// Weight files built in the transaction's stage directory and swapped in,
// a header rewritten in place, a weight file removed, with in-place patches
// and carried files in the same transaction.
TEST_CASE(
    "crash: structural delta (build, header rewrite, remove), with and without --no-sync, a fault at every write "
    "step") {
  const Inputs& in = inputs();
  run_scenario(single_delta("structural delta", in.root_struct, in.st_start, in.st0, in.st1, "1"));
  run_scenario(
      single_delta("structural delta, --no-sync, 2 threads", in.root_struct, in.st_start, in.st0, in.st1, "2", true));
}

// Stacked entries: each laid part by part over a scratch copy in the
// transaction's step directory, the copy then journaled against LOCAL.
TEST_CASE("crash: squashed delta with stacked entries, with and without --no-sync, a fault at every write step") {
  const Inputs& in = inputs();
  for (const bool no_sync : {false, true}) {
    Scenario s;
    s.name = no_sync ? "stacked entries, --no-sync, 2 threads" : "stacked entries";
    s.local = in.local;
    s.args = {"--threads", no_sync ? "2" : "1", in.stacked.string(), in.local.string()};
    if (no_sync) s.args.insert(s.args.begin(), "--no-sync");
    s.start = in.s0_start;
    s.old_version = "000000";
    s.target = "000002";
    s.trees = {{"000000", save_dir(in.series, 0)}, {"000002", save_dir(in.series, 2)}};
    run_scenario(s);
  }
}

TEST_CASE("crash: --root chain of 2 structural deltas, a fault at every write step") {
  const Inputs& in = inputs();
  run_scenario({.name = "--root chain of structural deltas 0 -> 2",
                .args = {"--threads", "1", "--root", in.root_struct_chain.string(), in.local.string()},
                .local = in.local,
                .start = in.st_start,
                .old_version = "000000",
                .target = "000002",
                .trees = {{"000000", in.st0}, {"000001", in.st1}, {"000002", in.st2}},
                .per_version = true});
}

TEST_CASE("crash: xor delta turning a directory into a file, a fault at every write step") {
  const Inputs& in = inputs();
  run_scenario(single_delta("xor delta, directory -> file", in.root_dir, in.dir_start, in.dir_base, in.dir_next, "1"));
}

TEST_CASE("crash: --root chain of 3 versions with a full version in the middle, a fault at every write step") {
  const Inputs& in = inputs();
  run_scenario({.name = "--root chain 0 -> 3",
                .args = {"--threads", "1", "--root", in.chain.string(), in.local.string()},
                .local = in.local,
                .start = in.s0_start,
                .old_version = "000000",
                .target = "000003",
                .trees = {{"000000", save_dir(in.series, 0)},
                          {"000001", save_dir(in.series, 1)},
                          {"000002", in.v2_full},
                          {"000003", in.v3_new}},
                .per_version = true});
}

TEST_CASE("crash: a full version given as DELTA, a fault at every write step") {
  const Inputs& in = inputs();
  run_scenario({.name = "full version as DELTA",
                .args = {"--threads", "1", in.v2_full.string(), in.local.string()},
                .local = in.local,
                .start = in.s0_start,
                .old_version = "000000",
                .target = "000002",
                .trees = {{"000000", save_dir(in.series, 0)}, {"000002", in.v2_full}}});
}

TEST_CASE("crash: --init into an empty LOCAL, a fault at every write step") {
  const Inputs& in = inputs();
  run_scenario({.name = "--init into an empty LOCAL",
                .args = {"--threads", "1", "--init", in.next.string(), in.local.string()},
                .local = in.local,
                .start = in.empty,
                .old_version = "",
                .target = "000000",
                .trees = {{"", in.empty}, {"000000", in.next}}});
}

TEST_CASE("crash: --init over a different LOCAL, a fault at every write step") {
  const Inputs& in = inputs();
  run_scenario({.name = "--init over a different LOCAL",
                .args = {"--threads", "1", "--init", "--init-version", "7", in.next.string(), in.local.string()},
                .local = in.local,
                .start = in.other_start,
                .old_version = "000000",
                .target = "000007",
                .trees = {{"000000", in.other_start}, {"000007", in.next}}});
}

TEST_CASE("crash: fault points, totals") {
  long kill = 0, error = 0, swallowed = 0;
  std::ostringstream o;
  for (const auto& [name, t] : totals()) {
    o << "\n  " << name << ": " << t.kill_steps << " (I/O error: " << t.error_steps << ", " << t.swallowed
      << " ignored after commit)";
    kill += t.kill_steps, error += t.error_steps, swallowed += t.swallowed;
  }
  MESSAGE("fault points per scenario:" << o.str() << "\n  total: " << kill << " killed, " << error << " I/O errors ("
                                       << swallowed << " ignored after commit)");
}

// Kills at random moments of a pull; `no_sync` pulls auto (context)
// deltas with --no-sync, the one-pass apply with a live journal.
static void random_kills(bool no_sync) {
  const std::unique_ptr<TempDir> scratch = scratch_dir();
  const TempDir& t = *scratch;
  const fs::path series = gen_series(t / "series", 2,
                                     {"--hidden", "256", "--intermediate", "768", "--vocab", "8000", "--layers", "4",
                                      "--lr", "1e-5", "--max-shard-size", "4MB"});
  const std::uint64_t size = tree_size(save_dir(series, 0));
  CHECK(size > 8'000'000);
  CHECK(size < 30'000'000);
  const fs::path root = t / "root";
  fs::create_directories(root);
  const std::string encoding = no_sync ? "auto" : "xor";
  require_diff(save_dir(series, 0), save_dir(series, 1), version_dir(root, 1), encoding);
  require_diff(save_dir(series, 1), save_dir(series, 2), version_dir(root, 2), encoding);

  Scenario s;
  s.name = no_sync ? "random kills, --no-sync" : "random kills";
  s.local = t / "local";
  s.start = t / "start";
  REQUIRE(require_init(save_dir(series, 0), s.start) == "000000");
  s.args = {"--root", root.string(), s.local.string()};
  if (no_sync) s.args.insert(s.args.begin(), "--no-sync");
  s.old_version = "000000";
  s.target = "000002";
  s.trees = {{"000000", save_dir(series, 0)}, {"000001", save_dir(series, 1)}, {"000002", save_dir(series, 2)}};

  // How long one whole pull takes (process start included): the kills land in [0, that].
  using Clock = std::chrono::steady_clock;
  double longest = 0;
  for (int i = 0; i < 3; ++i) {
    reset(s);
    const auto t0 = Clock::now();
    const RunResult r = apply(s.args);
    longest = std::max(longest, std::chrono::duration<double>(Clock::now() - t0).count());
    E2E_REQUIRE_CODE(r, 0);
  }

  std::mt19937_64 rng(20240611);
  std::uniform_real_distribution<double> delay(0.0, longest);
  // 40 kills when the sweeps fault every step; 12 when they sample (CI's
  // runs, whose time the sweeps share): the seed is fixed, so those are the
  // first 12 of the 40.
  const int kRuns = sampling().all() ? 40 : 12;
  int mid_run = 0, intermediate = 0;
  Problems p;
  std::vector<std::string> argv{apply_bin()};
  argv.insert(argv.end(), s.args.begin(), s.args.end());
  for (int i = 1; i <= kRuns; ++i) {
    reset(s);
    const double d = delay(rng);
    const pid_t pid = [&] {
      // In a sanitized build a kill can land during LeakSanitizer's check at
      // exit, whose helper process may then log a stray line about threads it
      // could not stop. The leak checks are the unkilled runs' (same command).
      const char* lsan = std::getenv("LSAN_OPTIONS");
      const ScopedEnv no_leak_check("LSAN_OPTIONS",
                                    (lsan ? std::string(lsan) + ":" : std::string()) + "detect_leaks=0");
      return spawn(argv);
    }();
    std::this_thread::sleep_for(std::chrono::duration<double>(d));
    ::kill(pid, SIGKILL);
    const int status = wait_status(pid);
    const bool killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    if (killed) {
      ++mid_run;
      const StateSeen seen = check_recorded_state(s, p, i, false);
      intermediate += seen.version == "000001";
      check_status(s, p, i, seen);
      check_rerun(s, p, i, seen.pending);
    } else {
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) p.add("a run that was not killed failed", i);
      check_target(s, p, i, "a run that finished before the kill");
    }
  }
  CHECK_MESSAGE(p.empty(), s.name << ":\n" << p.text("run"));
  MESSAGE(s.name << ": " << kRuns << " runs of " << tree_size(save_dir(series, 0)) << "-byte checkpoints, one pull "
                 << longest << " s at most; " << mid_run << " kills landed mid-run (" << intermediate
                 << " of them after version 1 was recorded), " << (kRuns - mid_run) << " runs had finished");
}

TEST_CASE("crash: random SIGKILLs of a --root pull of 2 versions converge") { random_kills(false); }

TEST_CASE("crash: random SIGKILLs of a --no-sync pull of 2 auto (context) versions converge") { random_kills(true); }
