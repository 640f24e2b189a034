// One function per form of delta-diff and delta-apply, doing what the form's
// CLI body does (src/cli/delta_diff.cpp, delta_apply.cpp) and returning its
// --json object (report_json.hpp) as a JSON string. The arguments are checked
// by the rules the CLI checks its options by (option_rules.hpp; a bad one is
// Error(usage)); paths arrive as
// str (hfdelta/_api.py takes os.PathLike too). Each releases the GIL while
// the library works; the callbacks take it back.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <boost/filesystem/path.hpp>

#include "bindings.hpp"
#include "hfdelta/apply.hpp"
#include "hfdelta/diff.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/inspect.hpp"
#include "hfdelta/option_rules.hpp"
#include "hfdelta/prune.hpp"
#include "hfdelta/publication.hpp"
#include "hfdelta/report_json.hpp"
#include "hfdelta/root.hpp"
#include "hfdelta/squash.hpp"
#include "hfdelta/verify.hpp"
#include "hfdelta/version.hpp"
#include "hfdelta/withdraw.hpp"
#include "progress_callback.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace hfdelta::python {

void check_threads(int threads) { check_option("threads", threads_problem(threads)); }

int check_level(std::optional<int> level) {
  if (!level) return kDefaultLevel;
  check_option("level (of zstd)", level_problem(*level));
  return *level;
}

std::optional<Encoding> encoding_of(const std::string& name) {
  check_option("encoding", encoding_problem(name));
  return encoding_option(name);
}

double lock_seconds(std::optional<double> lock_timeout) {
  if (!lock_timeout) return -1;  // wait forever
  check_option("lock_timeout", lock_timeout_problem(*lock_timeout, "None: wait"));
  return *lock_timeout;
}

namespace {

using Version = std::optional<std::uint64_t>;

// The one JSON object the CLI prints for the result (schema and ok added).
std::string report(nlohmann::json j) { return json_report(std::move(j)).dump(); }

// "LOCAL/" names LOCAL, as on the command line.
std::string stripped(const std::string& p) { return strip_trailing_slashes(p).string(); }

// Runs `work` with the GIL released and `progress` (None or a callable) fed
// while it runs; the feeder stops before the GIL is taken back.
template <class Work>
auto released(nb::handle progress, Work&& work) {
  nb::gil_scoped_release release;
  const ProgressCallback feed(progress);
  return work();
}

// What a Python exception was, for a message: "ValueError('boom')". Needs the GIL.
std::string describe(nb::python_error& e) {
  try {
    return nb::repr(e.value()).c_str();
  } catch (...) {
    return "an exception";
  }
}

// `then`: ApplyOptions::then calling a Python callable with the version; its
// exception makes the operation's result carry then_error (exit 9).
void set_then(ApplyOptions& o, nb::handle then) {
  if (then.is_none()) return;
  PyObject* callback = then.ptr();  // borrowed: the caller's argument outlives the call
  o.then = [callback](std::uint64_t version) {
    std::string what;
    {
      nb::gil_scoped_acquire gil;
      try {
        nb::handle{callback}(version);
        return;
      } catch (nb::python_error& e) {
        what = describe(e);
      }
    }
    fail(Exit::then_failed, "then raised " + what);
  };
}

ApplyOptions apply_options(std::optional<double> lock_timeout, int threads, bool sync) {
  check_threads(threads);
  ApplyOptions o;
  o.lock_timeout = lock_seconds(lock_timeout);
  o.threads = threads;
  o.sync = sync;
  return o;
}

// DiffOptions as delta-diff's diff_options makes them: the encoding, and the
// versions of OUT (publish_target's) and of BASE.
DiffOptions diff_options(const std::string& encoding, std::optional<int> level, Version base_version, int threads,
                         bool sync, const PublishTarget& t) {
  DiffOptions d;
  d.level = check_level(level);
  check_threads(threads);
  d.encoding = encoding_of(encoding);
  d.threads = threads;
  d.sync = sync;
  set_diff_versions(d, t, base_version, "base_version");
  return d;
}

// ---- delta-diff ----

std::pair<std::string, std::vector<std::string>> diff(const std::string& base, const std::string& target,
                                                      const std::string& out_arg, const std::string& encoding,
                                                      std::optional<int> level, Version delta_version,
                                                      Version base_version, int threads, bool sync,
                                                      nb::handle progress) {
  return released(progress, [&] {
    check_out_apart(stripped(out_arg), {{"BASE", stripped(base)}, {"NEW", stripped(target)}});
    const PublishTarget t = publish_target(stripped(out_arg), delta_version);
    const std::string out = t.out.string();  // ROOT given: the version directory chosen in it
    const DiffSummary s = diff_checkpoints(stripped(base), stripped(target), out,
                                           diff_options(encoding, level, base_version, threads, sync, t));
    return std::pair{report(diff_json(out, encoding, s)), diff_warnings(s)};
  });
}

std::pair<std::string, std::vector<std::string>> full(const std::string& target, const std::string& out_arg,
                                                      const std::optional<std::string>& base,
                                                      const std::string& encoding, std::optional<int> level,
                                                      Version delta_version, Version base_version, int threads,
                                                      bool sync, nb::handle progress) {
  return released(progress, [&] {
    if (base)
      check_out_apart(stripped(out_arg), {{"BASE", stripped(*base)}, {"NEW", stripped(target)}});
    else
      check_out_apart(stripped(out_arg), {{"NEW", stripped(target)}});
    const PublishTarget t = publish_target(stripped(out_arg), delta_version);
    DiffSummary s;
    std::string side;
    std::vector<std::string> warnings;
    if (base) {
      side = publish_sidecar(stripped(*base), stripped(target), t.out,
                             diff_options(encoding, level, base_version, threads, sync, t), s)
                 .string();
      warnings = diff_warnings(s);
    } else {
      check_threads(threads);
    }
    const FullSummary f = publish_full(stripped(target), t.out, t.version, sync, threads);
    return std::pair{report(full_json(t.out.string(), f, base ? &s : nullptr, side)), warnings};
  });
}

std::string squash(const std::string& first, const std::string& last, const std::string& out_arg,
                   const std::optional<std::string>& base, std::optional<int> level, int threads, bool sync,
                   nb::handle progress) {
  const int lv = check_level(level);
  check_threads(threads);
  return released(progress, [&] {
    SquashOptions so;
    so.level = lv;
    so.threads = threads;
    so.sync = sync;
    if (base) so.base = stripped(*base);
    const std::string out = stripped(out_arg);
    const SquashSummary s = squash_deltas(chain_between(stripped(first), stripped(last)), out, so);
    return report(squash_json(out, s));
  });
}

std::string inspect(const std::string& delta) {
  return released(nb::none(), [&] { return report(inspection_json(inspect_delta(stripped(delta)))); });
}

std::string prune(const std::string& root, Version keep_from, bool dry_run, bool sync) {
  return released(nb::none(), [&] {
    PruneOptions po;
    po.keep_from = keep_from;
    po.dry_run = dry_run;
    po.sync = sync;
    return report(prune_json(prune_root(stripped(root), po)));
  });
}

std::string withdraw(const std::string& version_dir, bool sync) {
  return released(nb::none(), [&] { return report(withdraw_json(withdraw_version(stripped(version_dir), sync))); });
}

// ---- delta-apply ----

std::string init(const std::string& src, const std::string& local_arg, std::uint64_t version, bool force,
                 std::optional<double> lock_timeout, int threads, bool sync, nb::handle then, nb::handle progress) {
  ApplyOptions o = apply_options(lock_timeout, threads, sync);
  o.force = force;
  set_then(o, then);
  return released(progress, [&] {
    const std::string local = stripped(local_arg);
    return report(change_json(local, init_local(stripped(src), local, version, o)));
  });
}

std::string apply(const std::string& delta, const std::string& local_arg, std::optional<double> lock_timeout,
                  int threads, bool sync, nb::handle then, nb::handle progress) {
  ApplyOptions o = apply_options(lock_timeout, threads, sync);
  set_then(o, then);
  return released(progress, [&] {
    const std::string local = stripped(local_arg);
    return report(change_json(local, apply_delta(stripped(delta), local, o)));
  });
}

std::string pull_root(const std::string& root, const std::string& local_arg, Version target, bool require_marker,
                      std::optional<double> lock_timeout, int threads, bool sync, nb::handle then,
                      nb::handle progress) {
  ApplyOptions o = apply_options(lock_timeout, threads, sync);
  o.require_marker = require_marker;
  set_then(o, then);
  return released(progress, [&] {
    const std::string local = stripped(local_arg);
    return report(change_json(local, pull(stripped(root), local, target, o)));
  });
}

std::string status(const std::string& local_arg, std::optional<double> lock_timeout) {
  const ApplyOptions o = apply_options(lock_timeout, 0, true);
  return released(nb::none(), [&] {
    const std::string local = stripped(local_arg);
    return report(status_json(local, local_status(local, o)));
  });
}

std::string verify(const std::string& local_arg, std::optional<double> lock_timeout, int threads, nb::handle progress) {
  const ApplyOptions o = apply_options(lock_timeout, threads, true);
  return released(progress, [&] {
    const std::string local = stripped(local_arg);
    return report(verify_json(local, verify_local(local, o.lock_timeout, o.threads)));
  });
}

std::string recover(const std::string& local_arg, std::optional<double> lock_timeout, bool sync) {
  const ApplyOptions o = apply_options(lock_timeout, 0, sync);
  return released(nb::none(), [&] {
    const std::string local = stripped(local_arg);
    return report(change_json(local, recover_local(local, o)));
  });
}

}  // namespace

void bind_forms(nb::module_& m) {
  m.def("diff", &diff, "base"_a, "new"_a, "out"_a, "encoding"_a, "level"_a.none(), "delta_version"_a.none(),
        "base_version"_a.none(), "threads"_a, "sync"_a, "progress"_a.none(),
        "delta-diff BASE NEW OUT: (--json object, warnings).");
  m.def("publish_full", &full, "new"_a, "out"_a, "base"_a.none(), "encoding"_a, "level"_a.none(),
        "delta_version"_a.none(), "base_version"_a.none(), "threads"_a, "sync"_a, "progress"_a.none(),
        "delta-diff --full [BASE] NEW OUT: (--json object, warnings).");
  m.def("squash", &squash, "first"_a, "last"_a, "out"_a, "base"_a.none(), "level"_a.none(), "threads"_a, "sync"_a,
        "progress"_a.none(), "delta-diff --squash [--squash-base BASE] FIRST LAST OUT: the --json object.");
  m.def("inspect", &inspect, "delta"_a, "delta-diff --inspect DELTA: the --json object.");
  m.def("prune", &prune, "root"_a, "keep_from"_a.none(), "dry_run"_a, "sync"_a,
        "delta-diff --prune ROOT: the --json object.");
  m.def("withdraw", &withdraw, "version_dir"_a, "sync"_a,
        "delta-diff --withdraw ROOT/weight_vNNNNNN: the --json object.");
  m.def("init", &init, "src"_a, "local"_a, "version"_a, "force"_a, "lock_timeout"_a.none(), "threads"_a, "sync"_a,
        "then"_a.none(), "progress"_a.none(), "delta-apply --init SRC LOCAL: the --json object.");
  m.def("apply", &apply, "delta"_a, "local"_a, "lock_timeout"_a.none(), "threads"_a, "sync"_a, "then"_a.none(),
        "progress"_a.none(), "delta-apply DELTA LOCAL: the --json object.");
  m.def("pull", &pull_root, "root"_a, "local"_a, "target"_a.none(), "require_marker"_a, "lock_timeout"_a.none(),
        "threads"_a, "sync"_a, "then"_a.none(), "progress"_a.none(),
        "delta-apply --root ROOT LOCAL: the --json object.");
  m.def("status", &status, "local"_a, "lock_timeout"_a.none(), "delta-apply --status LOCAL: the --json object.");
  m.def("verify", &verify, "local"_a, "lock_timeout"_a.none(), "threads"_a, "progress"_a.none(),
        "delta-apply --verify LOCAL: the --json object.");
  m.def("recover", &recover, "local"_a, "lock_timeout"_a.none(), "sync"_a,
        "delta-apply --recover LOCAL: the --json object.");
}

}  // namespace hfdelta::python
