// End-to-end: a delta read from a shared filesystem that others can write.
// Damaged and crafted deltas (flipped bits and truncations in every file,
// frames of the wrong size, decompression bombs, wrong checksums, wrong
// bases, paths that leave LOCAL) are refused with exit 3 or 5, and LOCAL is
// byte-identical afterwards, state.json included; nothing outside LOCAL is
// created or changed.
#include <doctest/doctest.h>

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include <zstd.h>

#include "delta/parts.hpp"
#include "e2e_util.hpp"
#include "hfdelta/safetensors.hpp"
#include "hfdelta/sharded_publisher.hpp"

using namespace e2e;

namespace {

// A temporary directory on a RAM-backed filesystem when there is one with
// room (hundreds of runs here), else in the usual place.

long& hostile_total() {
  static long n = 0;
  return n;
}

// Problems grouped by description, with a few of the inputs that showed each.
class Problems {
 public:
  void add(const std::string& what, const std::string& at) {
    auto& e = by_what_[what];
    if (e.first.size() < 6) e.first.push_back(at);
    ++e.second;
  }
  bool empty() const { return by_what_.empty(); }
  std::string text() const {
    std::ostringstream o;
    for (const auto& [what, e] : by_what_) {
      o << what << "\n    e.g. ";
      for (std::size_t i = 0; i < e.first.size(); ++i) o << (i ? "; " : "") << e.first[i];
      o << " (" << e.second << " in all)\n";
    }
    return o.str();
  }

 private:
  std::map<std::string, std::pair<std::vector<std::string>, std::size_t>> by_what_;
};

Bytes bytes_of(const std::string& s) { return Bytes(s.begin(), s.end()); }

// ---- the delta under attack and the LOCAL it is applied to ------------------------

// LOCAL at version 0 (save 0) and what a correct apply of version 1 gives.
struct Bench {
  fs::path local, start, target;
  std::function<void(const fs::path&)> after_reset;  // adds to LOCAL what `start` cannot hold
  // The delta under attack: every attempt also runs `delta-diff --inspect` on
  // it, which must refuse exactly what delta-apply refuses with exit 3 or 6
  // (the delta itself is bad) and accept what it accepts or refuses with 5
  // (LOCAL is not its base: only an apply can tell).
  fs::path delta;
  bool fits_local = false;  // the attempts test whether entries fit LOCAL's tensors: only delta-apply can see that
  // A crafted delta is sealed as its publisher would seal it (its completion
  // marker rewritten for the files as they are), so that the check under
  // test answers, not the marker's. Flips and truncations stand for storage
  // damage after the seal: the marker is left as published.
  bool reseal = true;
  Snapshot pristine;  // LOCAL before every attempt, state.json included
  Problems problems;
  std::map<std::string, long> codes;     // exit code → attempts
  std::map<std::string, long> accepted;  // what an attempt that exited 0 changed → attempts
  long attempts = 0;
  std::string last_err;  // stderr of the latest attempt

  void reset() {
    fs::remove_all(local);
    copy_tree(start, local);
    if (after_reset) after_reset(local);
  }

  // Runs delta-apply ARGS against LOCAL. Exit codes in `refusals` are
  // refusals: LOCAL must be as before. Exit 0 is accepted only if LOCAL ends
  // the target (and is counted under `harmless`); anything else is a problem.
  int attempt(const std::vector<std::string>& args, const std::set<int>& refusals, const std::string& what,
              const std::string& at, const std::string& harmless = "") {
    ++attempts;
    ++hostile_total();
    if (reseal && !delta.empty()) reseal_marker(delta);
    const RunResult ins = delta.empty() ? RunResult{} : diff({"-q", "--inspect", delta.string()});
    const RunResult r = apply(args);
    last_err = r.err;
    ++codes[std::to_string(r.code)];
    if (!delta.empty()) check_inspect(ins, r.code, what, at);
    if (r.code == 0) {
      const TreeDiff d = tree_equal(local, target);
      const json st = state_json(local);
      if (!d.equal)
        problems.add(what + ": exit 0 but LOCAL is not the target: " + d.differences.front(), at);
      else if (st != json{{"version", "000001"}})
        problems.add(what + ": exit 0 but state.json is " + st.dump(), at);
      else if (has_txn(local))
        problems.add(what + ": exit 0 but .weight_sync/txn is left", at);
      else
        ++accepted[harmless.empty() ? what : harmless];
      reset();
      return 0;
    }
    if (!refusals.count(r.code)) problems.add(what + ": exit " + std::to_string(r.code) + ": " + first_line(r.err), at);
    const std::vector<std::string> diff = snapshot_diff(pristine, snapshot(local, true), "before", "after");
    if (!diff.empty()) {
      problems.add(what + ": refused (exit " + std::to_string(r.code) + ") but LOCAL changed: " + diff.front(), at);
      reset();
    }
    if (has_txn(local)) {
      problems.add(what + ": refused but .weight_sync/txn is left", at);
      reset();
    }
    return r.code;
  }

  // --inspect's answer `ins` against delta-apply's exit `code`.
  void check_inspect(const RunResult& ins, int code, const std::string& what, const std::string& at) {
    const bool of_delta =
        (code == 3 || code == 6) && !after_reset && !fits_local;  // after_reset: LOCAL is what is hostile
    const int want = of_delta ? code : 0;
    if (ins.code != want)
      problems.add(what + ": delta-apply exit " + std::to_string(code) + " but --inspect exit " +
                       std::to_string(ins.code) + ": " + first_line(ins.err),
                   at);
  }

  void report(const std::string& name) {
    std::ostringstream o;
    for (const auto& [c, n] : codes) o << " exit " << c << ": " << n << ";";
    std::ostringstream a;
    for (const auto& [w, n] : accepted) a << "\n  " << w << ": " << n;
    CHECK_MESSAGE(problems.empty(), name << ":\n" << problems.text());
    MESSAGE(name << ": " << attempts << " hostile inputs;" << o.str()
                 << (accepted.empty() ? std::string() : "\n accepted with LOCAL ending the target:" + a.str()));
  }
};

// A tiny series, its version 1 as an xor and an overwrite delta carrying a
// changed config.json, LOCAL at version 0, and a delta of another model.
struct Inputs {
  std::unique_ptr<TempDir> t = scratch_dir();
  // root_auto: context entries (and xor where smaller); root_sparse: sparse entries.
  fs::path series, next, start, other, root_xor, root_overwrite, root_auto, root_sparse, other_xor, other_overwrite,
      other_auto,
      other_context;  // other_auto: the default encoding (context)
  // A structural delta (weight files built, rewritten in place, removed and
  // patched, files carried), LOCAL at its base, and the same delta of another
  // model of the same layouts.
  fs::path st_base, st_next, st_start, root_struct, other_struct;
  // Save 0 -> 1 as a sharded publisher's version 1 (parts entries, format
  // revision 6): LOCAL `start` turns into save 1 itself (no carried file).
  fs::path root_parts;

  Inputs() {
    const TempDir& d = *t;
    series = gen_series(d / "series", 1, {"--max-shard-size", "600KB"});
    next = d / "next";
    copy_tree(save_dir(series, 1), next);
    json cfg = read_json(next / "config.json");
    cfg["use_cache"] = false;
    write_json(next / "config.json", cfg);
    root_xor = d / "root-xor";
    root_overwrite = d / "root-overwrite";
    root_auto = d / "root-auto";
    root_sparse = d / "root-sparse";
    for (const auto& [root, enc] : {std::pair{root_xor, "xor"}, std::pair{root_overwrite, "overwrite"},
                                    std::pair{root_auto, "auto"}, std::pair{root_sparse, "sparse"}}) {
      fs::create_directories(root);
      E2E_REQUIRE_CODE(
          diff({"-q", "--encoding", enc, save_dir(series, 0).string(), next.string(), version_dir(root, 1).string()}),
          0);
      const json idx = delta_index(version_dir(root, 1));
      REQUIRE(idx["weight_map"].size() >= 4);
      REQUIRE(idx["metadata"]["hfdelta_files"].size() == 1);
      REQUIRE(fs::exists(version_dir(root, 1) / "files" / "config.json"));
    }
    start = d / "start";
    E2E_REQUIRE_CODE(apply({"-q", "--init", save_dir(series, 0).string(), start.string()}), 0);

    // Another model's save 0 -> 1, as if published against a different base.
    const fs::path os = gen_series(d / "other-series", 1, {"--max-shard-size", "600KB", "--seed", "99"});
    other_xor = version_dir(d / "other-xor", 1);
    other_overwrite = version_dir(d / "other-overwrite", 1);
    fs::create_directories(other_xor.parent_path());
    fs::create_directories(other_overwrite.parent_path());
    E2E_REQUIRE_CODE(
        diff({"-q", "--encoding", "xor", save_dir(os, 0).string(), save_dir(os, 1).string(), other_xor.string()}), 0);
    other_auto = version_dir(d / "other-auto", 1);
    fs::create_directories(other_auto.parent_path());
    E2E_REQUIRE_CODE(diff({"-q", save_dir(os, 0).string(), save_dir(os, 1).string(), other_auto.string()}), 0);
    other_context = version_dir(d / "other-context", 1);
    fs::create_directories(other_context.parent_path());
    E2E_REQUIRE_CODE(diff({"-q", "--encoding", "context", save_dir(os, 0).string(), save_dir(os, 1).string(),
                           other_context.string()}),
                     0);
    E2E_REQUIRE_CODE(diff({"-q", "--encoding", "overwrite", save_dir(os, 0).string(), save_dir(os, 1).string(),
                           other_overwrite.string()}),
                     0);

    st_base = d / "struct-0";
    st_next = d / "struct-1";
    write_structural_checkpoint(st_base, 0);
    write_structural_checkpoint(st_next, 1);
    root_struct = d / "root-struct";
    fs::create_directories(root_struct);
    // sparse entries (format revision 3): the rules of hfdelta_shards under
    // test are the first a reader meets (a context entry would need revision 5).
    E2E_REQUIRE_CODE(
        diff({"-q", "--encoding", "sparse", st_base.string(), st_next.string(), version_dir(root_struct, 1).string()}),
        0);
    const json sidx = delta_index(version_dir(root_struct, 1));
    std::multiset<std::string> ops;
    for (const auto& op : sidx["metadata"]["hfdelta_shards"]) ops.insert(op["op"].get<std::string>());
    REQUIRE(ops == std::multiset<std::string>{"build", "build", "header", "remove"});
    st_start = d / "start-struct";
    E2E_REQUIRE_CODE(apply({"-q", "--init", st_base.string(), st_start.string()}), 0);
    write_structural_checkpoint(d / "other-struct-0", 0, 2);
    write_structural_checkpoint(d / "other-struct-1", 1, 2);
    other_struct = version_dir(d / "other-struct", 1);
    fs::create_directories(other_struct.parent_path());
    E2E_REQUIRE_CODE(
        diff({"-q", (d / "other-struct-0").string(), (d / "other-struct-1").string(), other_struct.string()}), 0);

    root_parts = d / "root-parts";
    fs::create_directories(root_parts);
    publish_sharded(save_dir(series, 0), save_dir(series, 1), d / "parts-mirror", root_parts);
  }

  // Version 1 of ROOT from three "ranks" of one host (rank 0 sparse, 1 xor,
  // 2 context parts): a matrix's rows split between ranks 0 and 1, its
  // columns between 1 and 2, or held whole by 2, tensor after tensor.
  static void publish_sharded(const fs::path& base, const fs::path& next, const fs::path& mirror,
                              const fs::path& root) {
    E2E_REQUIRE_CODE(apply({"-q", "--init", base.string(), mirror.string()}), 0);
    const hfdelta::Checkpoint ck = hfdelta::open_checkpoint(next);
    const fs::path stage = hfdelta::make_shard_stage(root, 1);
    const hfdelta::Encoding encs[] = {hfdelta::Encoding::sparse, hfdelta::Encoding::xor_bytes,
                                      hfdelta::Encoding::context};
    std::vector<std::unique_ptr<hfdelta::ShardWriter>> ranks;
    for (std::uint32_t r = 0; r < 3; ++r)
      ranks.push_back(std::make_unique<hfdelta::ShardWriter>(mirror, stage, r, encs[r], 3));
    std::size_t i = 0;
    for (const auto& entry : ck.tensors) {
      const std::string& name = entry.first;  // not a structured binding: clang 14 lambdas cannot capture one
      const hfdelta::TensorInfo& t = ck.info(entry.second);
      const hfdelta::MatrixShape m = hfdelta::matrix_shape(t.shape, hfdelta::dtype_size(t.dtype));
      const Bytes bytes = checkpoint_tensor(next, name);
      auto put = [&](std::uint32_t r, const hfdelta::Region& g) {
        Bytes b;
        for (std::uint64_t row = 0; row < g.rows; ++row) {
          const auto at = bytes.begin() + static_cast<std::ptrdiff_t>(((g.row0 + row) * m.cols + g.col0) * m.es);
          b.insert(b.end(), at, at + static_cast<std::ptrdiff_t>(g.cols * m.es));
        }
        ranks[r]->put(name, t.dtype, t.shape, g, b);
      };
      const std::size_t k = i++ % 3;
      if (k == 0 && m.rows >= 2) {
        put(0, {0, m.rows / 2, 0, m.cols});
        put(1, {m.rows / 2, m.rows - m.rows / 2, 0, m.cols});
      } else if (k == 1 && m.cols >= 2) {
        put(1, {0, m.rows, 0, m.cols / 2});
        put(2, {0, m.rows, m.cols / 2, m.cols - m.cols / 2});
      } else {
        put(2, {0, m.rows, 0, m.cols});
      }
    }
    std::vector<hfdelta::ShardPart> parts;
    for (auto& w : ranks) {
      const auto p = w->finish(false);
      parts.insert(parts.end(), p.begin(), p.end());
    }
    hfdelta::commit_sharded(root, mirror, stage, 1, 0, parts, false);
  }
};

Inputs& inputs() {
  static Inputs in;
  return in;
}

// A bench in a fresh directory: LOCAL at version 0, a working copy of the
// delta under ROOT/weight_v000001.
struct Attack {
  std::unique_ptr<TempDir> t = scratch_dir();
  Bench b;
  fs::path root, delta, pristine_delta;

  explicit Attack(const fs::path& source_root) : Attack(source_root, inputs().start, inputs().next) {}
  // LOCAL at `start`, the delta to turn it into `target`.
  Attack(const fs::path& source_root, const fs::path& start, const fs::path& target) {
    b.local = *t / "local";
    b.start = start;
    b.target = target;
    b.reset();
    b.pristine = snapshot(b.local, true);
    root = *t / "root";
    delta = version_dir(root, 1);
    b.delta = delta;
    pristine_delta = version_dir(source_root, 1);
    restore();
  }
  void restore() {
    fs::remove_all(root);
    copy_tree(pristine_delta, delta);
  }
  std::vector<std::string> single() const { return {delta.string(), b.local.string()}; }
  std::vector<std::string> pull() const { return {"--root", root.string(), b.local.string()}; }
};

// The delta files of a delta directory, and its entries with their ranges.
std::vector<std::string> delta_files(const fs::path& delta) {
  std::set<std::string> s;
  const json idx = delta_index(delta);
  for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) s.insert(it->get<std::string>());
  return {s.begin(), s.end()};
}

std::map<std::string, std::string> st_metadata(const StFile& f) {
  std::map<std::string, std::string> m;
  const json md = f.metadata();
  if (md.is_object())
    for (auto it = md.begin(); it != md.end(); ++it) m[it.key()] = it->get<std::string>();
  return m;
}

// Rewrites a delta file with one entry's bytes replaced (and, optionally, its
// __metadata__ checksum).
void replace_entry(const fs::path& file, const std::string& tensor, const Bytes& frame,
                   const std::optional<std::string>& checksum = std::nullopt) {
  const StFile f = read_st(file);
  std::vector<TensorData> ts;
  for (const auto& name : f.tensor_names()) {
    const Bytes b = name == tensor ? frame : f.tensor(name);
    ts.push_back({name, "U8", {b.size()}, b});
  }
  auto md = st_metadata(f);
  if (checksum) md[tensor] = *checksum;
  write_safetensors(file, ts, &md);
}

Bytes zstd_compress(const Bytes& in) {
  Bytes out(ZSTD_compressBound(in.size()));
  const std::size_t n = ZSTD_compress(out.data(), out.size(), in.data(), in.size(), 3);
  REQUIRE_FALSE(ZSTD_isError(n));
  out.resize(n);
  return out;
}

// One frame of `total` zero bytes, written in pieces with the zstd streaming
// API; with `declare`, the frame header records the size.
Bytes zero_frame(std::uint64_t total, bool declare) {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 1);
  ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, declare ? 1 : 0);
  if (declare) ZSTD_CCtx_setPledgedSrcSize(c, total);
  const Bytes zeros(1 << 20, 0);
  Bytes out;
  Bytes buf(ZSTD_CStreamOutSize());
  for (std::uint64_t done = 0; done < total;) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(zeros.size(), total - done));
    done += n;
    ZSTD_inBuffer in{zeros.data(), n, 0};
    const ZSTD_EndDirective mode = done == total ? ZSTD_e_end : ZSTD_e_continue;
    for (;;) {
      ZSTD_outBuffer o{buf.data(), buf.size(), 0};
      const std::size_t left = ZSTD_compressStream2(c, &o, &in, mode);
      REQUIRE_FALSE(ZSTD_isError(left));
      out.insert(out.end(), buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(o.pos));
      if (mode == ZSTD_e_end ? left == 0 : in.pos == in.size) break;
    }
  }
  ZSTD_freeCCtx(c);
  return out;
}

// The entry of a delta with the smallest / largest tensor, and where it lives.
struct Entry {
  std::string tensor, file;
  std::uint64_t nbytes = 0;  // the tensor's size in LOCAL
};
Entry pick_entry(const fs::path& delta, bool smallest) {
  const json idx = delta_index(delta);
  Entry best;
  for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
    const std::uint64_t n = checkpoint_tensor(save_dir(inputs().series, 0), it.key()).size();
    if (best.tensor.empty() || (smallest ? n < best.nbytes : n > best.nbytes))
      best = {it.key(), it->get<std::string>(), n};
  }
  return best;
}

// ---- what a damaged index means --------------------------------------------------

// How the library sees a changed index, decided by parsing it: which metadata
// fields changed decides which refusals are legitimate besides 3 and 5 (4: a
// version number now points elsewhere; 6: a feature this build lacks).
struct IndexChange {
  bool parses = false, same = false;
  std::set<int> refusals{3, 5};
  std::string fields;  // the changed JSON paths, for the report
};

IndexChange classify_index(const json& original, const std::string& text) {
  IndexChange c;
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception&) {
    return c;
  }
  c.parses = true;
  if (j == original) {
    c.same = true;
    return c;
  }
  std::set<std::string> paths;
  for (const auto& op : json::diff(original, j)) {
    std::string p = op["path"].get<std::string>();
    // Group list and map members: /metadata/hfdelta_files/0/op -> /metadata/hfdelta_files/*/op
    std::string g;
    for (std::size_t start = 1; start <= p.size();) {
      const std::size_t slash = std::min(p.find('/', start), p.size());
      const bool keyed = g == "/weight_map" || g == "/metadata/hfdelta_base_checksums" ||
                         g == "/metadata/hfdelta_files" || g == "/metadata/hfdelta_shards" ||
                         g == "/metadata/hfdelta_encodings";
      g += '/';
      g += keyed ? std::string("*") : p.substr(start, slash - start);
      start = slash + 1;
    }
    paths.insert(g);
  }
  for (const auto& p : paths) {
    if (!c.fields.empty()) c.fields += ' ';
    c.fields += p;
    if (p == "/metadata/version" || p == "/metadata/base_version") c.refusals.insert(4);
    if (p == "/metadata/delta_encoding" || p == "/metadata/compression_format" || p == "/metadata/checksum_format" ||
        p == "/metadata/hfdelta_format" || p == "/metadata/hfdelta_files/*/op" ||
        p == "/metadata/hfdelta_shards/*/op" || p == "/metadata/hfdelta_encodings/*")
      c.refusals.insert(6);
  }
  return c;
}

// ---- positions to flip -------------------------------------------------------------

struct Flip {
  std::string file;  // relative to the delta directory
  std::string region;
  std::uint64_t offset = 0;
  int bit = 0;
};

void spread(std::vector<Flip>& out, const std::string& file, const std::string& region, std::uint64_t begin,
            std::uint64_t end, int count, int salt) {
  if (end <= begin) return;
  const std::uint64_t n = end - begin;
  std::set<std::uint64_t> seen;
  for (int i = 0; i < count; ++i) {
    const std::uint64_t off =
        begin + (n * static_cast<std::uint64_t>(2 * i + 1)) / static_cast<std::uint64_t>(2 * count);
    if (!seen.insert(off).second) continue;
    out.push_back({file, region, off, (i * 3 + salt) % 8});
  }
}

std::vector<Flip> flips_for(const fs::path& delta) {
  std::vector<Flip> v;
  int salt = 0;
  for (const auto& f : delta_files(delta)) {
    const StFile st = read_st(delta / f);
    for (int i = 0; i < 8; ++i) v.push_back({f, "header length", static_cast<std::uint64_t>(i), (i * 5 + salt) % 8});
    spread(v, f, "header JSON", 8, st.data_start(), 28, salt);
    spread(v, f, "frames", st.data_start(), st.raw.size(), 28, salt + 1);
    ++salt;
  }
  // New safetensors headers of a structural delta: the whole file is a header.
  for (const auto& f : list_files(delta)) {
    if (f.rfind("headers/", 0) != 0) continue;
    for (int i = 0; i < 8; ++i)
      v.push_back({f, "new header's length", static_cast<std::uint64_t>(i), (i * 5 + salt) % 8});
    spread(v, f, "new header's JSON", 8, fs::file_size(delta / f), 28, salt);
    ++salt;
  }
  spread(v, "model.safetensors.index.json", "index JSON", 0, fs::file_size(delta / "model.safetensors.index.json"), 90,
         2);
  // The first letter of every key the format gives meaning to: a renamed key
  // is an absent one to a reader.
  const std::string text = read_file(delta / "model.safetensors.index.json");
  for (const char* key : {"metadata",
                          "weight_map",
                          "version",
                          "base_version",
                          "delta_encoding",
                          "compression_format",
                          "checksum_format",
                          "total_size",
                          "hfdelta_format",
                          "hfdelta_base_checksums",
                          "hfdelta_files",
                          "path",
                          "op",
                          "size",
                          "xxh3-128",
                          "hfdelta_encodings",
                          "hfdelta_shards",
                          "file",
                          "header",
                          "base_header",
                          "tensors",
                          "name",
                          "from"}) {
    const std::size_t at = text.find("\"" + std::string(key) + "\":");
    if (at != std::string::npos) v.push_back({"model.safetensors.index.json", "index JSON", at + 1, 0});
  }
  for (const auto& f : list_files(delta))
    if (f.rfind("files/", 0) == 0) spread(v, f, "carried file", 0, fs::file_size(delta / f), 24, 5);
  return v;
}

void flip_bit(const fs::path& p, std::uint64_t offset, int bit) {
  Bytes b = read_bytes(p);
  b.at(static_cast<std::size_t>(offset)) ^= static_cast<std::uint8_t>(1u << bit);
  write_bytes(p, b);
}

// Lengths to cut a file of `size` bytes at: the edges of its parts and
// evenly spread ones, at least `count` in all.
std::vector<std::uint64_t> cut_lengths(std::uint64_t size, const std::vector<std::uint64_t>& edges, std::size_t count) {
  std::set<std::uint64_t> s{0, 1, size - 1};
  for (auto e : edges)
    for (std::uint64_t x : {e - 1, e, e + 1})
      if (x < size) s.insert(x);
  for (std::size_t i = 1; s.size() < count && i <= 4 * count; ++i) s.insert(size * i / (count + 1));
  return {s.begin(), s.end()};
}

// Which flips and truncations are tried: by default every one. The sanitizer
// run (scripts/ci/sanitize.sh), where each try costs several times as much,
// sets HFDELTA_HOSTILE_STRIDE and HFDELTA_HOSTILE_OFFSET (see Sampling), as it
// samples the crash sweeps' write steps; the release run tries them all.
const Sampling& sampling() {
  static const Sampling s("HFDELTA_HOSTILE_STRIDE", "HFDELTA_HOSTILE_OFFSET");
  return s;
}
std::string describe_sampling(std::size_t planned, long tried) {
  return std::to_string(tried) + " of " + std::to_string(planned) + " tried" +
         (sampling().all() ? std::string()
                           : " (the n-th with n % " + std::to_string(sampling().stride) +
                                 " == " + std::to_string(sampling().offset) +
                                 ": HFDELTA_HOSTILE_STRIDE, HFDELTA_HOSTILE_OFFSET)");
}

// Flips at every region of the delta's files (flips_for): returns how many
// were planned, whatever the sampling tried.
std::size_t run_flips(Attack& a, bool pull) {
  a.b.reseal = false;  // storage damage
  const std::vector<Flip> flips = flips_for(a.delta);
  const json original = delta_index(a.delta);
  std::map<std::string, int> per_file;
  long tried = 0;
  for (std::size_t n = 0; n < flips.size(); ++n) {
    if (!sampling().take(static_cast<long>(n))) continue;
    const Flip& f = flips[n];
    ++tried;
    const fs::path p = a.delta / f.file;
    flip_bit(p, f.offset, f.bit);
    std::set<int> refusals{3, 5};
    std::string harmless = "flip in " + f.region;
    if (f.region == "index JSON") {
      const IndexChange c = classify_index(original, read_file(p));
      refusals = c.refusals;
      harmless = c.same ? "flip in index JSON, same JSON" : "flip in index JSON changing " + c.fields;
    }
    const std::string at = f.file + " byte " + std::to_string(f.offset) + " bit " + std::to_string(f.bit);
    a.b.attempt(pull ? a.pull() : a.single(), refusals, "bit flip in " + f.region, at, harmless);
    flip_bit(p, f.offset, f.bit);
    ++per_file[f.file];
  }
  std::string s;
  for (const auto& [f, n] : per_file) s += " " + f + ": " + std::to_string(n) + ";";
  MESSAGE("flips " << describe_sampling(flips.size(), tried) << "; tried per file:" << s);
  return flips.size();
}

void run_truncations(Attack& a) {
  a.b.reseal = false;  // storage damage
  const json original = delta_index(a.delta);
  const std::vector<std::string> files = list_files(a.delta);  // entries, index, carried files, new headers
  std::size_t planned = 0;
  long tried = 0;
  for (const auto& f : files) {
    const fs::path p = a.delta / f;
    const Bytes whole = read_bytes(p);
    std::vector<std::uint64_t> edges;
    if (f.size() > 12 && f.compare(f.size() - 12, 12, ".safetensors") == 0) {
      const StFile st = read_st(p);
      edges = {8, st.data_start()};
      for (const auto& name : st.tensor_names()) edges.push_back(st.file_range(name).second);
    }
    const auto lengths = cut_lengths(whole.size(), edges, 24);
    CHECK(lengths.size() >= 20);
    for (const auto n : lengths) {
      if (!sampling().take(static_cast<long>(planned++))) continue;
      ++tried;
      write_bytes(p, Bytes(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(n)));
      std::set<int> refusals{3, 5};
      std::string harmless = "truncated " + f;
      if (f == "model.safetensors.index.json") {
        const IndexChange c = classify_index(original, read_file(p));
        refusals = c.refusals;
        if (c.same) harmless = "index JSON truncated to the same JSON";
      }
      a.b.attempt(a.single(), refusals, "truncated " + f,
                  f + " cut to " + std::to_string(n) + " of " + std::to_string(whole.size()) + " bytes", harmless);
    }
    write_bytes(p, whole);
  }
  MESSAGE("truncations " << describe_sampling(planned, tried));
}

}  // namespace

TEST_CASE(
    "hostile: one flipped bit anywhere in an xor, overwrite, sparse or auto (context) delta is refused, "
    "LOCAL untouched") {
  for (const auto& [name, root] : {std::pair{"xor", inputs().root_xor}, std::pair{"overwrite", inputs().root_overwrite},
                                   std::pair{"sparse", inputs().root_sparse}, std::pair{"auto", inputs().root_auto}}) {
    Attack a(root);
    CAPTURE(name);
    CHECK(run_flips(a, true) >= 300);
    a.b.report(std::string("bit flips in the ") + name + " delta, applied with --root");
  }
}

TEST_CASE("hostile: every delta file truncated at 20+ lengths is refused, LOCAL untouched") {
  for (const auto& [name, root] : {std::pair{"xor", inputs().root_xor}, std::pair{"overwrite", inputs().root_overwrite},
                                   std::pair{"sparse", inputs().root_sparse}, std::pair{"auto", inputs().root_auto}}) {
    Attack a(root);
    run_truncations(a);
    a.b.report(std::string("truncations of the ") + name + " delta");
  }
}

TEST_CASE("hostile: frames of the wrong size, decompression bombs, wrong checksums") {
  for (const auto& [name, root] :
       {std::pair{"xor", inputs().root_xor}, std::pair{"overwrite", inputs().root_overwrite}}) {
    Attack a(root);
    const bool is_xor = std::string(name) == "xor";
    const Entry big = pick_entry(a.delta, false), small = pick_entry(a.delta, true);
    const fs::path file = a.delta / big.file;
    const Bytes real = zstd_decompress(read_st(file).tensor(big.tensor));

    // A valid frame whose content is longer or shorter than the encoding needs.
    std::vector<std::pair<std::string, Bytes>> wrong;
    if (is_xor) {
      wrong = {{"xor frame 1 byte longer than the tensor", Bytes(big.nbytes + 1, 0)},
               {"xor frame 1 byte shorter than the tensor", Bytes(big.nbytes - 1, 0)},
               {"xor frame twice the tensor", Bytes(2 * big.nbytes, 0)},
               {"xor frame half the tensor", Bytes(big.nbytes / 2, 0)},
               {"empty frame", Bytes()}};
    } else {
      Bytes more = real, fewer = real;
      more.push_back(0);
      fewer.pop_back();
      wrong = {{"overwrite payload 1 byte longer than its count says", more},
               {"overwrite payload 1 byte shorter than its count says", fewer},
               {"overwrite payload the size of the tensor", Bytes(big.nbytes, 0)},
               {"empty frame", Bytes()}};
    }
    // An xor frame's length is checked against LOCAL's tensor, which --inspect does not have.
    a.b.fits_local = is_xor;
    for (const auto& [what, content] : wrong) {
      replace_entry(file, big.tensor, zstd_compress(content));
      a.b.attempt(a.single(), {3}, what, std::string(name) + " delta, entry " + big.tensor);
      a.restore();
    }
    a.b.fits_local = false;
    // Not a frame at all, and two frames back to back.
    {
      replace_entry(file, big.tensor, bytes_of("not a zstd frame at all"));
      a.b.attempt(a.single(), {3}, "entry that is not a zstd frame", name);
      a.restore();
      Bytes two = read_st(file).tensor(big.tensor);
      const Bytes again = two;
      two.insert(two.end(), again.begin(), again.end());
      replace_entry(file, big.tensor, two);
      a.b.attempt(a.single(), {3}, "entry holding the frame twice", name);
      a.restore();
    }

    // Decompression bombs: 1 GiB of zeros in a small frame, declared as a
    // small tensor, with and without the size in the frame header.
    a.b.fits_local = is_xor;  // 1 GiB of zeros is a valid xor frame of a 1 GiB tensor
    for (const bool declare : {true, false}) {
      static std::map<bool, Bytes> bombs;
      if (!bombs.count(declare)) bombs[declare] = zero_frame(1ull << 30, declare);
      REQUIRE(bombs[declare].size() < (1u << 20));
      const fs::path sf = a.delta / small.file;
      replace_entry(sf, small.tensor, bombs[declare]);
      a.b.attempt(a.single(), {3}, std::string("1 GiB decompression bomb") + (declare ? "" : " without declared size"),
                  std::string(name) + " delta, " + std::to_string(small.nbytes) + "-byte tensor " + small.tensor);
      a.restore();
    }
    a.b.fits_local = false;

    // A valid frame whose checksum in __metadata__ is another valid checksum.
    {
      replace_entry(file, big.tensor, read_st(file).tensor(big.tensor), xxh3_hex(std::string("something else")));
      const int code = a.b.attempt(a.single(), {5}, "wrong checksum in __metadata__", name);
      CHECK(code == 5);
      a.restore();
    }
    a.b.report(std::string("frames and checksums of the ") + name + " delta");
  }
}

TEST_CASE("hostile: a delta of another base, with and without base checksums, is refused with exit 5") {
  const Inputs& in = inputs();
  for (const auto& [name, src] : {std::pair{"xor", in.other_xor}, std::pair{"overwrite", in.other_overwrite},
                                  std::pair{"auto", in.other_auto}, std::pair{"context", in.other_context}}) {
    Attack a(in.root_xor);
    fs::remove_all(a.delta);
    copy_tree(src, a.delta);
    int code = a.b.attempt(a.single(), {5}, "delta made against another base", name);
    CHECK(code == 5);
    // Without flushing, apply patches in one pass and finds the wrong base
    // after writing: the rollback must leave LOCAL as it was all the same.
    std::vector<std::string> no_sync = a.single();
    no_sync.insert(no_sync.begin(), "--no-sync");
    code = a.b.attempt(no_sync, {5}, "delta made against another base, --no-sync", name);
    CHECK(code == 5);
    if (std::string(name) == "auto" ||
        std::string(name) == "context") {  // sparse and context entries exist only with hfdelta's keys
      a.b.report("deltas of another base (auto)");
      continue;
    }
    // The same delta as a publisher of the plain layout writes it: no hfdelta_* keys.
    json idx = delta_index(a.delta);
    json md = json::object();
    for (auto it = idx["metadata"].begin(); it != idx["metadata"].end(); ++it)
      if (it.key().rfind("hfdelta_", 0) != 0) md[it.key()] = *it;
    idx["metadata"] = md;
    write_json(a.delta / "model.safetensors.index.json", idx);
    fs::remove_all(a.delta / "files");
    code = a.b.attempt(a.single(), {5}, "slime-style delta (no base checksums) against another base", name);
    CHECK(code == 5);
    a.b.report(std::string("deltas of another base (") + name + ")");
  }
}

TEST_CASE("hostile: crafted safetensors headers in a delta file") {
  Attack a(inputs().root_xor);
  const Entry e = pick_entry(a.delta, false);
  const fs::path file = a.delta / e.file;
  auto raw_file = [&](const std::string& header, std::uint64_t declared_len, std::size_t data) {
    std::string b;
    for (int i = 0; i < 8; ++i) b.push_back(static_cast<char>((declared_len >> (8 * i)) & 0xff));
    b += header;
    b.append(data, '\0');
    write_file(file, b);
  };
  const std::string md = "\"__metadata__\":{\"" + e.tensor + "\":\"" + std::string(32, '0') + "\"}";
  auto header_with_shape = [&](const std::string& shape, std::uint64_t end) {
    return "{" + md + ",\"" + e.tensor + "\":{\"dtype\":\"U8\",\"shape\":" + shape + ",\"data_offsets\":[0," +
           std::to_string(end) + "]}}";
  };
  const std::vector<std::pair<std::string, std::string>> shapes = {
      {"shape whose product overflows 64 bits", "[4294967296,4294967296,16]"},
      {"shape of 2^64-1 bytes", "[18446744073709551615]"},
      {"shape larger than a 64-bit integer", "[18446744073709551616]"},
      {"negative shape", "[-16]"},
      {"two-dimensional U8 entry", "[4,4]"},
  };
  for (const auto& [what, shape] : shapes) {
    const std::string h = header_with_shape(shape, 16);
    raw_file(h, h.size(), 16);
    a.b.attempt(a.single(), {3}, what, e.file);
    a.restore();
  }
  for (const std::uint64_t len : {100'000'001ull, 1ull << 40, ~0ull}) {
    const std::string h = header_with_shape("[16]", 16);
    raw_file(h, len, 16);
    a.b.attempt(a.single(), {3}, "header length " + std::to_string(len), e.file);
    a.restore();
  }
  // A header length just over the limit that the file really has.
  {
    std::string h = header_with_shape("[16]", 16);
    h.resize(100'000'008, ' ');
    raw_file(h, h.size(), 16);
    a.b.attempt(a.single(), {3}, "a real header of 100,000,008 bytes", e.file);
    a.restore();
  }
  a.b.report("crafted safetensors headers");
}

TEST_CASE("hostile: weight_map entries naming files outside the delta's top level") {
  Attack a(inputs().root_xor);
  const Entry e = pick_entry(a.delta, false);
  for (const std::string& target :
       std::vector<std::string>{"../x.safetensors", "/etc/x", "sub/x.safetensors", "./" + e.file, "", "."}) {
    // The file is really there where it can be, so only the path rule refuses it.
    if (target == "../x.safetensors") fs::copy_file(a.delta / e.file, a.delta.parent_path() / "x.safetensors");
    if (target == "sub/x.safetensors") {
      fs::create_directories(a.delta / "sub");
      fs::copy_file(a.delta / e.file, a.delta / "sub" / "x.safetensors");
    }
    json idx = delta_index(a.delta);
    for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it)
      if (it->get<std::string>() == e.file) *it = target;
    write_json(a.delta / "model.safetensors.index.json", idx);
    a.b.attempt(a.single(), {3}, "weight_map names \"" + target + "\"", e.file);
    a.restore();  // removes ROOT/x.safetensors too
  }
  a.b.report("weight_map paths");
}

TEST_CASE("hostile: hfdelta_files paths that leave LOCAL") {
  const std::unique_ptr<TempDir> scratch = scratch_dir();
  const TempDir& t = *scratch;
  Attack a(inputs().root_xor);
  // Directories outside LOCAL that a hostile path could reach.
  const fs::path outside = a.b.local.parent_path() / "outside";
  const fs::path outside_src = t / "outside-src";
  write_file(outside / "victim.txt", "must survive\n");
  write_file(outside / "config.json", "must survive\n");
  const std::string evil = "{\"evil\": true}\n";
  write_file(outside_src / "evil.txt", evil);
  const Snapshot outside_before = snapshot(outside);
  const std::vector<std::string> parent_before = list_names(a.b.local.parent_path());
  const std::vector<std::string> src_before = list_names(outside_src);

  auto with_files = [&](const json& files) {
    json idx = delta_index(a.delta);
    idx["metadata"]["hfdelta_files"] = files;
    write_json(a.delta / "model.safetensors.index.json", idx);
  };
  auto put = [&](const std::string& path) {
    return json{{"path", path}, {"op", "put"}, {"size", evil.size()}, {"xxh3-128", xxh3_hex(evil)}};
  };
  auto remove = [&](const std::string& path) { return json{{"path", path}, {"op", "remove"}}; };
  auto check_outside = [&](const std::string& what) {
    const auto d = snapshot_diff(outside_before, snapshot(outside), "before", "after");
    CHECK_MESSAGE(d.empty(), what << ": outside LOCAL changed: " << d.front());
    CHECK_MESSAGE(list_names(a.b.local.parent_path()) == parent_before, what << ": a file appeared beside LOCAL");
    CHECK_MESSAGE(list_names(outside_src) == src_before, what);
  };

  const std::string abs = (outside / "evil.txt").string();
  const std::vector<std::pair<std::string, json>> cases = {
      {"absolute put", put(abs)},
      {"absolute remove", remove((outside / "victim.txt").string())},
      {"put through ..", put("../outside/evil.txt")},
      {"remove through ..", remove("../outside/victim.txt")},
      {"put through a later ..", put("sub/../../outside/evil.txt")},
      {"put into .weight_sync", put(".weight_sync/state.json")},
      {"remove of .weight_sync/state.json", remove(".weight_sync/state.json")},
  };
  for (const auto& [what, entry] : cases) {
    // The content is there, inside the delta, wherever a relative path leads.
    const std::string path = entry["path"].get<std::string>();
    if (entry["op"] == "put" && path.front() != '/') write_file(a.delta / "files" / path, evil);
    with_files(json::array({entry}));
    a.b.attempt(a.single(), {3}, "hfdelta_files " + what, entry["path"].get<std::string>());
    check_outside(what);
    a.restore();
  }

  // A directory symlink inside LOCAL that points outside it.
  {
    a.b.after_reset = [&](const fs::path& local) { fs::create_directory_symlink(outside, local / "linkdir"); };
    a.b.reset();
    a.b.pristine = snapshot(a.b.local, true);
    for (const auto& [what, entry] : std::vector<std::pair<std::string, json>>{
             {"put through a symlinked directory in LOCAL", put("linkdir/evil.txt")},
             {"remove through a symlinked directory in LOCAL", remove("linkdir/victim.txt")},
             {"put over a file through a symlinked directory in LOCAL", put("linkdir/config.json")}}) {
      write_file(a.delta / "files" / "linkdir" / "evil.txt", evil);
      write_file(a.delta / "files" / "linkdir" / "config.json", evil);
      with_files(json::array({entry}));
      a.b.attempt(a.single(), {3}, "hfdelta_files " + what, entry["path"].get<std::string>());
      check_outside(what);
      a.restore();
    }
    a.b.after_reset = nullptr;
    a.b.reset();
    a.b.pristine = snapshot(a.b.local, true);
  }

  // Symlinks inside the delta's files/ directory.
  {
    fs::create_directories(a.delta / "files");
    fs::create_directory_symlink(outside_src, a.delta / "files" / "cfgdir");
    with_files(json::array({put("cfgdir/evil.txt")}));
    a.b.attempt(a.single(), {3}, "hfdelta_files put through a symlinked directory in files/", "cfgdir/evil.txt");
    check_outside("symlinked directory in files/");
    a.restore();
    fs::create_directories(a.delta / "files");
    fs::create_symlink(outside_src / "evil.txt", a.delta / "files" / "evil.txt");
    with_files(json::array({put("evil.txt")}));
    a.b.attempt(a.single(), {3}, "hfdelta_files put of a symlink in files/", "evil.txt");
    check_outside("symlinked file in files/");
    a.restore();
  }
  CHECK(snapshot(outside) == outside_before);
  a.b.report("hfdelta_files paths");
}

// ---- structural deltas --------------------------------------------------------------

namespace {

// LOCAL at the structural base, the structural delta under ROOT/weight_v000001.
struct StructAttack : Attack {
  StructAttack() : Attack(inputs().root_struct, inputs().st_start, inputs().st_next) {}
  explicit StructAttack(const fs::path& source_root) : Attack(source_root, inputs().st_start, inputs().st_next) {}

  // Applies the delta with and without --no-sync (which writes LOCAL in one
  // pass, so a late refusal is a rollback): refused with exactly `code` each
  // time, the message naming each of `names`, LOCAL as before (Bench::attempt).
  void refused(int code, const std::string& what, const std::vector<std::string>& names) {
    for (const bool no_sync : {false, true}) {
      std::vector<std::string> args = single();
      if (no_sync) args.insert(args.begin(), "--no-sync");
      const std::string w = what + (no_sync ? ", --no-sync" : "");
      const int got = b.attempt(args, {code}, w, w);
      CHECK_MESSAGE(got == code, w << ": exit " << got << ", expected " << code << ":\n" << b.last_err);
      for (const auto& n : names)
        CHECK_MESSAGE(b.last_err.find(n) != std::string::npos, w << ": the message does not name " << n << ":\n"
                                                                 << b.last_err);
    }
    restore();
  }

  // Rewrites the index with `edit` applied to its metadata; write_json
  // reseals hfdelta_index_checksum, so the rule under test is what answers.
  void edit_metadata(const std::function<void(json&)>& edit) const {
    json idx = delta_index(delta);
    edit(idx["metadata"]);
    write_json(delta / "model.safetensors.index.json", idx);
  }
  void edit_shard(const std::string& file, const std::function<void(json&)>& edit) const {
    edit_metadata([&](json& md) {
      for (auto& e : md["hfdelta_shards"])
        if (e["file"] == file) return edit(e);
      FAIL("no hfdelta_shards entry for " << file);
    });
  }
  void edit_tensor(const std::string& file, const std::string& tensor, const std::function<void(json&)>& edit) const {
    edit_shard(file, [&](json& e) {
      for (auto& entry : e["tensors"])
        if (entry["name"] == tensor) return edit(entry);
      FAIL("no tensor " << tensor << " in the build of " << file);
    });
  }
};

const char* const kIndex = "model.safetensors.index.json";

}  // namespace

TEST_CASE(
    "hostile: a structural delta's new headers missing, truncated or with a byte flipped are refused with exit 3") {
  StructAttack a;
  const json idx = delta_index(a.delta);
  std::vector<std::string> headers;  // the header rewrite's and both builds'
  for (const auto& e : idx["metadata"]["hfdelta_shards"])
    if (e["op"] != "remove") headers.push_back("headers/" + e["file"].get<std::string>());
  REQUIRE(headers.size() == 3);
  for (const auto& h : headers) {
    INFO(h);
    const fs::path p = a.delta / h;
    const Bytes whole = read_bytes(p);
    REQUIRE(whole.size() > 16);
    fs::remove(p);
    a.refused(3, h + " missing", {h});
    fs::remove(p);
    fs::create_directories(p);
    a.refused(3, h + " a directory", {h});
    for (const std::size_t n : {std::size_t{0}, std::size_t{7}, std::size_t{8}, whole.size() / 2, whole.size() - 1}) {
      write_bytes(p, Bytes(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(n)));
      a.refused(3, h + " cut to " + std::to_string(n) + " bytes", {h});
    }
    Bytes longer = whole;
    longer.push_back(' ');
    write_bytes(p, longer);
    a.refused(3, h + " one byte longer", {h});
    // The length, the opening brace, the middle and the last padding byte.
    for (const std::size_t at : {std::size_t{0}, std::size_t{8}, whole.size() / 2, whole.size() - 1}) {
      Bytes b = whole;
      b[at] ^= 0xff;
      write_bytes(p, b);
      a.refused(3, h + " byte " + std::to_string(at) + " flipped", {h});
    }
    // Padding turned into a tab: the same JSON and tensors, only its
    // checksum in the index tells.
    REQUIRE(whole.back() == ' ');
    Bytes tab = whole;
    tab.back() = '\t';
    write_bytes(p, tab);
    a.refused(3, h + " padding changed", {h});
  }
  a.b.report("new headers of a structural delta");
}

TEST_CASE("hostile: a structural delta's hfdelta_shards edited (index resealed) is refused, LOCAL untouched") {
  StructAttack a;
  const std::string d = "model-d.safetensors", c = "model-c.safetensors", bf = "model-b.safetensors";

  SUBCASE("a build's tensor list does not match its header: exit 3") {
    a.edit_tensor(c, "c.new", [](json& t) { t["name"] = "c.other"; });
    a.refused(3, "a built tensor listed under another name", {"headers/" + c, "c.other"});
    a.edit_shard(c, [](json& e) { std::swap(e["tensors"][0]["name"], e["tensors"][1]["name"]); });
    a.refused(3, "a build's tensors listed out of order", {"headers/" + c});
    a.edit_shard(c, [](json& e) { e["tensors"].erase(e["tensors"].size() - 1); });
    a.refused(3, "a build's tensor list one short", {"headers/" + c});
    a.edit_shard(c, [](json& e) { e["tensors"].push_back({{"name", "c.extra"}, {"xxh3-128", std::string(32, '0')}}); });
    a.refused(3, "a build's tensor list one too many", {"headers/" + c});
    a.edit_shard(d, [](json& e) { e["size"] = e["size"].get<std::uint64_t>() + 4; });
    a.refused(3, "a build's size 4 bytes more than its header's tensors", {"headers/" + d});
    a.edit_shard(d, [](json& e) { e["header"]["size"] = e["header"]["size"].get<std::uint64_t>() - 8; });
    a.refused(3, "a new header's size recorded 8 bytes short", {"headers/" + d});
    a.edit_shard(d, [](json& e) { e["header"]["xxh3-128"] = xxh3_hex(std::string("another header")); });
    a.refused(3, "a new header's checksum recorded wrong", {"headers/" + d});
    // A header rewrite whose new header (of the same length, sealed in the
    // index) swaps the two tensors' byte ranges.
    {
      const StFile h = read_st(a.delta / "headers" / bf);
      std::vector<hfdelta::TensorInfo> infos;
      std::uint64_t pos = 0;
      // Laid out in the other order than the file's (by name: b.norm first).
      for (const std::string name : {"b.weight", "b.norm"}) {
        const json& t = h.header.at(name);
        const std::uint64_t n = t["data_offsets"][1].get<std::uint64_t>() - t["data_offsets"][0].get<std::uint64_t>();
        infos.push_back(
            {name, t["dtype"].get<std::string>(), t["shape"].get<std::vector<std::uint64_t>>(), pos, pos + n});
        pos += n;
      }
      const std::map<std::string, std::string> md = st_metadata(h);
      const std::string moved = hfdelta::encode_safetensors_header(infos, &md, h.header_len);
      REQUIRE(moved.size() == h.raw.size());
      REQUIRE(read_st(a.delta / "headers" / bf).header.at("b.norm")["data_offsets"][0] == 0);
      write_file(a.delta / "headers" / bf, moved);
      a.edit_shard(bf, [&](json& e) { e["header"] = {{"size", moved.size()}, {"xxh3-128", xxh3_hex(moved)}}; });
      a.b.fits_local = true;  // the ranges are LOCAL's file's, which --inspect does not have
      a.refused(3, "a header rewrite that changes tensor byte ranges", {"headers/" + bf, "byte ranges"});
      a.b.fits_local = false;
    }
  }
  SUBCASE("a build's tensor checksum is wrong: exit 5 when built, 3 against its entry") {
    // Copied from LOCAL without an entry, and zeros without an entry: only
    // the built bytes can show it.
    a.edit_tensor(c, "c.emb", [](json& t) { t["xxh3-128"] = xxh3_hex(std::string("x")); });
    a.refused(5, "a copied tensor's checksum", {c, "c.emb"});
    a.edit_tensor(d, "d.zero", [](json& t) { t["xxh3-128"] = xxh3_hex(std::string("x")); });
    a.refused(5, "a zero tensor's checksum", {d, "d.zero"});
    // A tensor with an entry: the delta contradicts itself.
    a.edit_tensor(c, "c.new", [](json& t) { t["xxh3-128"] = xxh3_hex(std::string("x")); });
    a.refused(3, "a patched tensor's checksum against its entry", {"c.new"});
  }
  SUBCASE("a build copies a tensor LOCAL lacks or has other bytes of: exit 5") {
    a.edit_tensor(d, "e.moved", [](json& t) { t["from"] = "no.such.tensor"; });
    a.refused(5, "`from` names a tensor LOCAL lacks", {kIndex, d, "no.such.tensor"});
    a.edit_tensor(d, "e.moved", [](json& t) { t["from"] = "a.bias"; });
    a.refused(5, "`from` names a tensor of another length", {kIndex, d, "a.bias"});
    // c.emb has e.moved's length but not its bytes: the copy is built and fails its checksum.
    a.edit_tensor(d, "e.moved", [](json& t) { t["from"] = "c.emb"; });
    a.refused(5, "`from` names a tensor of the same length with other bytes", {d, "e.moved"});
    a.edit_tensor(d, "d.zero", [](json& t) { t["from"] = "e.dropped"; });
    a.refused(5, "a zero tensor built from a tensor of another length", {kIndex, d, "e.dropped"});
  }
  SUBCASE("a header rewrite of another base header: exit 5") {
    a.edit_shard(bf, [](json& e) { e["base_header"] = xxh3_hex(std::string("another base header")); });
    a.refused(5, "base_header wrong", {bf});
  }
  SUBCASE("operations on weight files LOCAL does not have: exit 5") {
    a.edit_metadata([](json& md) {
      md["hfdelta_shards"].push_back({{"file", "model-z.safetensors"}, {"op", "remove"}});
    });
    a.refused(5, "remove of a file LOCAL lacks", {kIndex, "model-z.safetensors"});
    a.edit_metadata([](json& md) { md["hfdelta_shards"].push_back({{"file", "config.json"}, {"op", "remove"}}); });
    a.refused(5, "remove of a file that is not a weight file", {kIndex, "config.json"});
    a.edit_shard(bf, [](json& e) { e["file"] = "model-z.safetensors"; });
    fs::copy_file(a.delta / "headers" / bf, a.delta / "headers" / "model-z.safetensors");
    a.refused(5, "header rewrite of a file LOCAL lacks", {kIndex, "model-z.safetensors"});
  }
  SUBCASE("an unknown operation: exit 6") {
    a.edit_shard("model-e.safetensors", [](json& e) { e["op"] = "rename"; });
    a.refused(6, "op \"rename\"", {kIndex, "model-e.safetensors", "rename"});
    a.edit_shard(c, [](json& e) { e["op"] = "splice"; });
    a.refused(6, "op \"splice\"", {kIndex, c, "splice"});
  }
  SUBCASE("hfdelta_shards with a format revision before 3: exit 3") {
    for (const int rev : {1, 2}) {
      a.edit_metadata([&](json& md) { md["hfdelta_format"] = rev; });
      a.refused(3, "hfdelta_format " + std::to_string(rev), {kIndex, "hfdelta_shards"});
    }
  }
  SUBCASE("malformed entries: exit 3") {
    a.edit_metadata([](json& md) { md["hfdelta_shards"] = json::object(); });
    a.refused(3, "hfdelta_shards an object", {kIndex, "hfdelta_shards"});
    a.edit_shard(c, [](json& e) { e.erase("op"); });
    a.refused(3, "an entry without op", {kIndex, "hfdelta_shards"});
    a.edit_metadata([&](json& md) { md["hfdelta_shards"].push_back({{"file", c}, {"op", "remove"}}); });
    a.refused(3, "a file listed twice", {kIndex, c, "twice"});
    a.edit_tensor(d, "e.moved", [](json& t) { t["from"] = 7; });
    a.refused(3, "`from` not a string", {kIndex, d, "from"});
    a.edit_tensor(d, "e.moved", [](json& t) { t["name"] = "c.weight"; });
    a.refused(3, "a tensor built twice", {kIndex, "c.weight", "twice"});
  }
  a.b.report("hfdelta_shards edited");
}

namespace {

// model-d's build moved to another path, its new header with it.
void move_build(const StructAttack& a, const std::string& to) {
  a.edit_shard("model-d.safetensors", [&](json& e) { e["file"] = to; });
  if (to.front() != '/') {
    fs::create_directories((a.delta / "headers" / to).parent_path());
    fs::rename(a.delta / "headers" / "model-d.safetensors", a.delta / "headers" / to);
  }
}

}  // namespace

// The state, the lock and the transaction live in LOCAL/.weight_sync:
// hfdelta_files may not touch it, and neither may a weight file operation.
TEST_CASE("hostile: a structural build into LOCAL/.weight_sync is refused with exit 3") {
  StructAttack a;
  for (const std::string& to :
       {std::string(".weight_sync/state.json"), std::string(".weight_sync/lock"),
        std::string(".weight_sync/evil.safetensors"), std::string(".weight_sync/txn/x.safetensors")}) {
    move_build(a, to);
    a.refused(3, "build of " + to, {kIndex, to});
  }
  a.b.report("structural builds into .weight_sync");
}

TEST_CASE("hostile: structural operations on paths outside LOCAL or through symlinks are refused with exit 3") {
  const std::unique_ptr<TempDir> scratch = scratch_dir();
  StructAttack a;
  const fs::path outside = a.b.local.parent_path() / "outside";
  write_file(outside / "victim.safetensors", "must survive\n");
  const Snapshot outside_before = snapshot(outside);
  const std::vector<std::string> parent_before = list_names(a.b.local.parent_path());
  auto check_outside = [&](const std::string& what) {
    const auto diff = snapshot_diff(outside_before, snapshot(outside), "before", "after");
    CHECK_MESSAGE(diff.empty(), what << ": outside LOCAL changed: " << diff.front());
    CHECK_MESSAGE(list_names(a.b.local.parent_path()) == parent_before, what << ": a file appeared beside LOCAL");
  };
  for (const std::string& to : {std::string("../outside/evil.safetensors"), (outside / "evil.safetensors").string(),
                                std::string("sub/../../outside/evil.safetensors")}) {
    move_build(a, to);
    a.refused(3, "build of " + to, {kIndex});
    check_outside("build of " + to);
  }
  a.edit_shard("model-e.safetensors", [](json& e) { e["file"] = "../outside/victim.safetensors"; });
  a.refused(3, "remove through ..", {kIndex});
  check_outside("remove through ..");

  // A symlinked directory inside LOCAL that points outside it.
  a.b.after_reset = [&](const fs::path& local) { fs::create_directory_symlink(outside, local / "linkdir"); };
  a.b.reset();
  a.b.pristine = snapshot(a.b.local, true);
  move_build(a, "linkdir/evil.safetensors");
  a.refused(3, "build through a symlinked directory in LOCAL", {"linkdir"});
  check_outside("build through a symlinked directory in LOCAL");
  a.edit_shard("model-e.safetensors", [](json& e) { e["file"] = "linkdir/victim.safetensors"; });
  a.refused(3, "remove through a symlinked directory in LOCAL", {"linkdir"});
  check_outside("remove through a symlinked directory in LOCAL");
  a.b.after_reset = nullptr;
  a.b.reset();
  a.b.pristine = snapshot(a.b.local, true);

  // A new header that is a symlink in the delta (to a copy of itself).
  const fs::path copy = scratch->path() / "header-copy";
  fs::copy_file(a.delta / "headers" / "model-c.safetensors", copy);
  fs::remove(a.delta / "headers" / "model-c.safetensors");
  fs::create_symlink(copy, a.delta / "headers" / "model-c.safetensors");
  a.refused(3, "a new header that is a symlink", {"headers/model-c.safetensors"});
  a.b.report("structural operations on paths they may not touch");
}

TEST_CASE(
    "hostile: a structural delta applied to a LOCAL that is not its base is refused with exit 5, LOCAL untouched") {
  const Inputs& in = inputs();
  SUBCASE("a delta of another model of the same layouts") {
    StructAttack a(in.other_struct.parent_path());
    a.refused(5, "structural delta of another model", {a.b.local.string()});
    a.b.report("structural delta of another base");
  }
  // LOCAL edited so that only one kind of check can notice.
  StructAttack a;
  auto local_edited = [&](const std::string& what, const std::function<void(const fs::path&)>& edit,
                          const std::vector<std::string>& names) {
    a.b.after_reset = edit;
    a.b.reset();
    a.b.pristine = snapshot(a.b.local, true);
    a.refused(5, what, names);
    a.b.after_reset = nullptr;
    a.b.reset();
    a.b.pristine = snapshot(a.b.local, true);
  };
  // A tensor only copied into a built file (no entry, no base checksum).
  SUBCASE("a tensor copied into a built file differs") {
    local_edited("LOCAL's e.moved differs",
                 [](const fs::path& local) {
                   StFile f = read_st(local / "model-e.safetensors");
                   f.raw[static_cast<std::size_t>(f.file_range("e.moved").first)] ^= 1;
                   write_bytes(local / "model-e.safetensors", f.raw);
                 },
                 {"model-d.safetensors", "e.moved"});
    a.b.report("LOCAL not the base: a copied tensor");
  }
  // A header rewritten in place whose base header is not LOCAL's (same length).
  SUBCASE("the header to rewrite differs") {
    local_edited("LOCAL's model-b header differs",
                 [](const fs::path& local) {
                   Bytes b = read_bytes(local / "model-b.safetensors");
                   const std::string text(b.begin(), b.end());
                   const std::size_t at = text.find("\"base\"");
                   REQUIRE(at != std::string::npos);
                   b[at + 1] = 'c';  // "case": the same length
                   write_bytes(local / "model-b.safetensors", b);
                 },
                 {"model-b.safetensors"});
    a.b.report("LOCAL not the base: a header");
  }
  // A tensor of another length where a build copies from.
  SUBCASE("a tensor a build copies from has another length") {
    local_edited("LOCAL's e.moved of another length",
                 [](const fs::path& local) {
                   StFile f = read_st(local / "model-e.safetensors");
                   std::vector<TensorData> ts;
                   for (const auto& name : f.tensor_names()) {
                     const auto& h = f.header[name];
                     Bytes bytes = f.tensor(name);
                     std::vector<std::uint64_t> shape = h["shape"].get<std::vector<std::uint64_t>>();
                     if (name == "e.moved") shape = {20}, bytes.resize(80);
                     ts.push_back({name, h["dtype"].get<std::string>(), shape, bytes});
                   }
                   write_safetensors(local / "model-e.safetensors", ts);
                 },
                 {kIndex, "model-d.safetensors", "e.moved"});
    a.b.report("LOCAL not the base: a tensor's length");
  }
}

TEST_CASE("hostile: one flipped bit anywhere in a structural delta is refused, LOCAL untouched") {
  StructAttack a;
  CHECK(run_flips(a, true) >= 400);
  a.b.report("bit flips in the structural delta, applied with --root");
}

TEST_CASE("hostile: every file of a structural delta truncated at 20+ lengths is refused, LOCAL untouched") {
  StructAttack a;
  run_truncations(a);
  a.b.report("truncations of the structural delta");
}

// ---- one list of named hostile deltas, each refused alike by --inspect and delta-apply ----

namespace {

// A hostile delta built from a valid one (the xor delta, or the structural
// delta when `structural`), and what it must get: delta-apply's exit code,
// and --inspect's, which is the same unless only LOCAL shows the problem.
struct HostileDelta {
  std::string name;
  bool structural = false;
  int code = 3;
  bool of_local = false;  // only delta-apply can see it: --inspect accepts the delta
  std::function<void(Attack&)> build;
};

// Edits the index's metadata; write_json reseals hfdelta_index_checksum, so
// the rule under test is what answers.
void edit_index(const Attack& a, const std::function<void(json&)>& edit) {
  json idx = delta_index(a.delta);
  edit(idx["metadata"]);
  write_json(a.delta / kIndex, idx);
}

json carried(const std::string& path, const std::string& content) {
  return {{"path", path}, {"op", "put"}, {"size", content.size()}, {"xxh3-128", xxh3_hex(content)}};
}

// Moves `rel` of the delta out of it and leaves a symlink to it in its
// place: the same bytes, reached through a link.
void link_out(const Attack& a, const std::string& rel) {
  const fs::path away = a.t->path() / "elsewhere" / rel;
  fs::create_directories(away.parent_path());
  fs::rename(a.delta / rel, away);
  if (fs::is_directory(away))
    fs::create_directory_symlink(away, a.delta / rel);
  else
    fs::create_symlink(away, a.delta / rel);
}

// A weight file an entry of the delta patches, as its hfdelta_targets says.
std::string target_of(const Attack& a) {
  const json idx = delta_index(a.delta);
  REQUIRE(idx["metadata"].contains("hfdelta_targets"));
  return idx["metadata"]["hfdelta_targets"].begin()->get<std::string>();
}

std::vector<HostileDelta> hostile_deltas() {
  const std::string evil = "{\"evil\": true}\n";
  std::vector<HostileDelta> v;
  // Symlinks anywhere in the delta: none is followed, whatever it links to.
  v.push_back({"files/ is a symlink to a directory of the same carried files", false, 3, false,
               [](Attack& a) { link_out(a, "files"); }});
  v.push_back({"a subdirectory of files/ is a symlink", false, 3, false, [evil](Attack& a) {
                 write_file(a.delta / "files" / "sub" / "x.txt", evil);
                 link_out(a, "files/sub");
                 edit_index(a, [&](json& md) { md["hfdelta_files"].push_back(carried("sub/x.txt", evil)); });
               }});
  v.push_back({"a carried file is a symlink", false, 3, false, [](Attack& a) { link_out(a, "files/config.json"); }});
  v.push_back({"the index is a symlink", false, 3, false, [](Attack& a) { link_out(a, kIndex); }});
  // Taken for "no index", it would make the delta pass for a full version.
  v.push_back({"the index is a symlink to nothing", false, 3, false, [](Attack& a) {
                 fs::remove(a.delta / kIndex);
                 fs::create_symlink(a.t->path() / "nowhere.json", a.delta / kIndex);
               }});
  v.push_back(
      {"a delta file is a symlink", false, 3, false, [](Attack& a) { link_out(a, delta_files(a.delta).front()); }});
  v.push_back({"a symlink the index does not name, at the delta's top level", false, 3, false,
               [](Attack& a) { fs::create_symlink("/etc/hostname", a.delta / "README.md"); }});
  v.push_back({"headers/ is a symlink to a directory of the same headers", true, 3, false,
               [](Attack& a) { link_out(a, "headers"); }});
  v.push_back(
      {"a new header is a symlink", true, 3, false, [](Attack& a) { link_out(a, "headers/model-c.safetensors"); }});
  // hfdelta_files over what the delta itself treats as a weight file.
  v.push_back({"hfdelta_files put of a weight file hfdelta_targets names", false, 3, false, [evil](Attack& a) {
                 const std::string f = target_of(a);
                 write_file(a.delta / "files" / f, evil);
                 edit_index(a, [&](json& md) { md["hfdelta_files"].push_back(carried(f, evil)); });
               }});
  v.push_back({"hfdelta_files remove of a weight file hfdelta_targets names", false, 3, false, [](Attack& a) {
                 const std::string f = target_of(a);
                 edit_index(a, [&](json& md) { md["hfdelta_files"].push_back({{"path", f}, {"op", "remove"}}); });
               }});
  v.push_back({"hfdelta_files put of a weight file hfdelta_shards builds", true, 3, false, [evil](Attack& a) {
                 write_file(a.delta / "files" / "model-d.safetensors", evil);
                 edit_index(a, [&](json& md) { md["hfdelta_files"].push_back(carried("model-d.safetensors", evil)); });
               }});
  v.push_back(
      {"hfdelta_files remove of a weight file whose header hfdelta_shards rewrites", true, 3, false, [](Attack& a) {
         edit_index(a, [](json& md) {
           md["hfdelta_files"].push_back({{"path", "model-b.safetensors"}, {"op", "remove"}});
         });
       }});
  // A weight file of LOCAL the delta treats as a plain file: LOCAL is not
  // its base (exit 5), which only an apply can see.
  for (const std::string op : {"put", "remove"})
    v.push_back(
        {"hfdelta_files " + op + " of a weight file of LOCAL the delta does not name", false, 5, true,
         [evil, op](Attack& a) {
           const std::string f = "model-00001-of-00004.safetensors";
           REQUIRE(fs::exists(a.b.local / f));
           if (op == "put") write_file(a.delta / "files" / f, evil);
           edit_index(a, [&](json& md) {
             for (auto it = md["hfdelta_targets"].begin(); it != md["hfdelta_targets"].end();)
               it = *it == f ? md["hfdelta_targets"].erase(it) : std::next(it);
             md["hfdelta_files"].push_back(op == "put" ? carried(f, evil) : json{{"path", f}, {"op", "remove"}});
           });
         }});
  v.push_back({"hfdelta_files put into .weight_sync", false, 3, false, [evil](Attack& a) {
                 write_file(a.delta / "files" / ".weight_sync" / "state.json", evil);
                 edit_index(a,
                            [&](json& md) { md["hfdelta_files"].push_back(carried(".weight_sync/state.json", evil)); });
               }});
  v.push_back({"a carried file of another size than recorded", false, 3, false,
               [](Attack& a) { write_file(a.delta / "files" / "config.json", "{}\n"); }});
  v.push_back(
      {"a delta file missing", false, 3, false, [](Attack& a) { fs::remove(a.delta / delta_files(a.delta).front()); }});
  v.push_back({"an entry that is not a zstd frame", false, 3, false, [](Attack& a) {
                 const Entry e = pick_entry(a.delta, false);
                 replace_entry(a.delta / e.file, e.tensor, bytes_of("not a zstd frame at all"));
               }});
  // The tensor's length is LOCAL's: only an apply can tell the frame is too long.
  v.push_back({"an xor frame one byte longer than the tensor", false, 3, true, [](Attack& a) {
                 const Entry e = pick_entry(a.delta, false);
                 replace_entry(a.delta / e.file, e.tensor, zstd_compress(Bytes(e.nbytes + 1, 0)));
               }});
  v.push_back({"an unknown delta_encoding", false, 6, false,
               [](Attack& a) { edit_index(a, [](json& md) { md["delta_encoding"] = "magic"; }); }});
  v.push_back({"a build's entry of another checksum than hfdelta_shards records", true, 3, false, [](Attack& a) {
                 edit_index(a, [](json& md) {
                   for (auto& e : md["hfdelta_shards"])
                     if (e.contains("tensors"))
                       for (auto& t : e["tensors"])
                         if (t["name"] == "c.new") t["xxh3-128"] = xxh3_hex(std::string("x"));
                 });
               }});
  return v;
}

}  // namespace

TEST_CASE("hostile: --inspect and delta-apply refuse every listed hostile delta alike, LOCAL untouched") {
  int n = 0;
  for (const HostileDelta& h : hostile_deltas()) {
    CAPTURE(h.name);
    auto check = [&](Attack& a) {
      a.b.fits_local = h.of_local;
      h.build(a);
      reseal_marker(a.delta);  // as attempt() does: --inspect runs first here
      const RunResult ins = diff({"-q", "--inspect", a.delta.string()});
      const int got = a.b.attempt(a.single(), {h.code}, h.name, h.name);  // checks LOCAL is untouched
      CHECK_MESSAGE(got == h.code, h.name << ": delta-apply exit " << got << ", expected " << h.code << ":\n"
                                          << a.b.last_err);
      CHECK_MESSAGE(ins.code == (h.of_local ? 0 : h.code), h.name << ": " << ins.describe());
      a.b.report(h.name);
    };
    if (h.structural) {
      StructAttack a;
      check(a);
    } else {
      Attack a(inputs().root_xor);
      check(a);
    }
    ++n;
  }
  CHECK(n >= 20);
}

TEST_CASE("hostile: --inspect and delta-apply both accept the valid deltas the hostile ones are made from") {
  const Inputs& in = inputs();
  for (const auto& [kind, root] :
       {std::pair{"xor", in.root_xor}, std::pair{"overwrite", in.root_overwrite}, std::pair{"auto", in.root_auto},
        std::pair{"sparse", in.root_sparse}, std::pair{"structural", in.root_struct}}) {
    const char* name = kind;  // clang 14 cannot capture a structured binding (CAPTURE)
    CAPTURE(name);
    const bool st = std::string(name) == "structural";
    Attack a(root, st ? in.st_start : in.start, st ? in.st_next : in.next);
    E2E_CHECK_CODE(diff({"-q", "--inspect", a.delta.string()}), 0);
    E2E_CHECK_CODE(apply(a.single()), 0);
    E2E_CHECK_TREE_EQUAL(a.b.local, a.b.target);
  }
}

namespace {

// A parts entry of the sharded version with the most parts, its file and bytes.
struct PartsVictim {
  std::string tensor, file;
  Bytes frame;
  std::uint32_t count = 0;
};
PartsVictim parts_victim(const fs::path& delta) {
  PartsVictim v;
  const json idx = delta_index(delta);
  for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
    const Bytes f = read_st(delta / it->get<std::string>()).tensor(it.key());
    const std::uint32_t n = static_cast<std::uint32_t>(f.at(4) | f.at(5) << 8 | f.at(6) << 16 | f.at(7) << 24);
    if (n > v.count) v = {it.key(), it->get<std::string>(), f, n};
  }
  return v;
}

void set_le(Bytes& b, std::size_t at, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b.at(at + static_cast<std::size_t>(i)) = static_cast<std::uint8_t>(v >> (8 * i));
}
std::uint64_t get_le(const Bytes& b, std::size_t at, int n) {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | b.at(at + static_cast<std::size_t>(i));
  return v;
}

// The checksum a delta records for a parts entry: of its head (as long as
// the entry holds it).
std::string parts_head_hex(const Bytes& e) {
  const std::uint64_t n = get_le(e, 4, 4);
  const std::size_t head = static_cast<std::size_t>(std::min<std::uint64_t>(e.size(), 32 + 64 * n));
  return hfdelta::parts_checksum(std::span(e).first(head)).hex();
}

}  // namespace

TEST_CASE("hostile: one flipped bit anywhere in a sharded version (parts entries) is refused, LOCAL untouched") {
  Attack a(inputs().root_parts, inputs().start, save_dir(inputs().series, 1));
  E2E_REQUIRE_CODE(apply(a.single()), 0);  // the version as published lands on save 1
  a.b.reset();
  CHECK(run_flips(a, true) >= 150);
  run_truncations(a);
  a.b.report("bit flips and truncations in a sharded version");
}

TEST_CASE("hostile: damaged parts entries (head resealed) are refused with exit 3 or 5, LOCAL untouched") {
  Attack a(inputs().root_parts, inputs().start, save_dir(inputs().series, 1));
  const PartsVictim v = parts_victim(a.delta);
  REQUIRE(v.count >= 2);
  const std::uint64_t rows = get_le(v.frame, 8, 8), cols = get_le(v.frame, 16, 8);
  constexpr std::size_t r0 = 32, r1 = 32 + 64;  // the first two part records
  struct Damage {
    std::string what;
    std::function<void(Bytes&)> edit;
    int code;
    bool reseal = true;       // the __metadata__ checksum made the damaged head's
    std::set<int> also = {};  // other refusals that may answer
  };
  const std::vector<Damage> damages = {
      {"a region below the matrix", [&](Bytes& e) { set_le(e, r1, rows, 8); }, 3},
      {"a region right of the matrix", [&](Bytes& e) { set_le(e, r0 + 24, cols + 1, 8); }, 3},
      {"a region of no rows", [&](Bytes& e) { set_le(e, r0 + 8, 0, 8); }, 3},
      {"a region whose end overflows", [&](Bytes& e) { set_le(e, r1 + 8, ~0ull, 8); }, 3},
      {"regions overlapping",  // the second region moved one row (or column) onto the first
       [&](Bytes& e) {
         if (get_le(e, r1, 8) > get_le(e, r0, 8))
           set_le(e, r1, get_le(e, r1, 8) - 1, 8);
         else
           set_le(e, r1 + 16, get_le(e, r1 + 16, 8) - 1, 8);
       },
       3},
      {"regions out of order",
       [&](Bytes& e) {
         Bytes first(e.begin() + r0, e.begin() + r1);
         std::copy_n(e.begin() + r1, 64, e.begin() + r0);
         std::copy(first.begin(), first.end(), e.begin() + r1);
       },
       3},
      {"a part of encoding overwrite", [&](Bytes& e) { set_le(e, r0 + 32, 1, 4); }, 3},
      {"a record's reserved word set", [&](Bytes& e) { set_le(e, r0 + 36, 7, 4); }, 3},
      {"element size 3", [&](Bytes& e) { set_le(e, 24, 3, 8); }, 3},
      {"a count of 65537 parts", [&](Bytes& e) { set_le(e, 4, 65537, 4); }, 3},
      {"a count one larger than the records", [&](Bytes& e) { set_le(e, 4, v.count + 1, 4); }, 3},
      {"a count of 0", [&](Bytes& e) { set_le(e, 4, 0, 4); }, 3},
      {"another magic", [&](Bytes& e) { e[3] = '2'; }, 3},
      {"the last part cut by one byte", [&](Bytes& e) { e.pop_back(); }, 3},
      {"cut inside the records", [&](Bytes& e) { e.resize(r1 + 10); }, 3},
      {"a byte after the last part", [&](Bytes& e) { e.push_back(0); }, 3},
      {"a part's size one larger", [&](Bytes& e) { set_le(e, r0 + 40, get_le(e, r0 + 40, 8) + 1, 8); }, 3},
      {"a part's checksum changed, the head's not resealed", [&](Bytes& e) { e[r0 + 63] ^= 1; }, 3, false},
      {"a part's region checksum wrong", [&](Bytes& e) { e[r1 + 63] ^= 1; }, 5},
      {"a matrix of another size", [&](Bytes& e) { set_le(e, 8, rows + 1, 8); }, 5},
      {"a part's frame damaged",
       [&](Bytes& e) { e.at(32 + 64 * static_cast<std::size_t>(v.count) + get_le(e, r0 + 40, 8) / 2) ^= 0x40; },
       3,
       true,
       {5}},  // a context part may find it only against the base
  };
  for (const Damage& d : damages) {
    Bytes e = v.frame;
    d.edit(e);
    replace_entry(a.delta / v.file, v.tensor, e, d.reseal ? std::optional(parts_head_hex(e)) : std::nullopt);
    std::set<int> refusals = d.also;
    refusals.insert(d.code);
    const int code = a.b.attempt(a.single(), refusals, "parts entry: " + d.what, v.tensor);
    CHECK_MESSAGE(refusals.count(code), d.what << ": exit " << code << ": " << first_line(a.b.last_err));
    a.restore();
  }
  // A parts entry without its base checksum (index resealed).
  json idx = delta_index(a.delta);
  idx["metadata"]["hfdelta_base_checksums"].erase(v.tensor);
  write_json(a.delta / "model.safetensors.index.json", idx);
  CHECK(a.b.attempt(a.single(), {3}, "parts entry without a base checksum", v.tensor) == 3);
  a.restore();
  a.b.report("damaged parts entries");
}

TEST_CASE("hostile: total") { MESSAGE("hostile inputs tried: " << hostile_total()); }
