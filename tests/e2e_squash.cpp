// End-to-end: delta-diff --squash FIRST LAST OUT. A chain of deltas
// ROOT/weight_v000001.. between checkpoints C0, C1, ... is squashed over a
// range [a, b] into one delta, composed from the deltas alone; applied to a
// LOCAL at version a-1 it must give exactly what applying the chain does (C_b,
// byte for byte, state version b, --verify clean). Also: changes that cancel
// out leave no entry, chains that cannot be composed are refused without a
// trace, and the squashed delta is no larger than its inputs.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <set>
#include <sstream>

#include "ckpt_edit.hpp"
#include "e2e_util.hpp"

using namespace e2e;

namespace {

// Diffs C_{v-1} -> C_v into ROOT/weight_v for v = 1..n.
// Version v of `root` is the delta C_{v-1} -> C_v written with encodings[v-1].
void write_mixed_chain(const std::vector<fs::path>& ckpts, const fs::path& root,
                       const std::vector<std::string>& encodings) {
  fs::create_directories(root);
  for (std::size_t v = 1; v <= encodings.size(); ++v) {
    CAPTURE(v);
    E2E_REQUIRE_CODE(diff({"-q", "--no-sync", "--encoding", encodings[v - 1], ckpts[v - 1].string(), ckpts[v].string(),
                           version_dir(root, static_cast<int>(v)).string()}),
                     0);
  }
}

// "a, b, c", for CAPTURE.
std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) {
    if (!s.empty()) s += ", ";
    s += x;
  }
  return s;
}

void write_chain(const std::vector<fs::path>& ckpts, const fs::path& root, const std::string& encoding) {
  write_mixed_chain(ckpts, root, std::vector<std::string>(ckpts.size() - 1, encoding));
}

// Applies the whole chain to a LOCAL initialised from C0, checking LOCAL
// against C_v after each version: what the squashed deltas must reproduce.
void check_chain(const std::vector<fs::path>& ckpts, const fs::path& root, const fs::path& local) {
  E2E_REQUIRE_CODE(apply({"-q", "--no-sync", "--init", ckpts[0].string(), local.string()}), 0);
  for (std::size_t v = 1; v < ckpts.size(); ++v) {
    CAPTURE(v);
    E2E_REQUIRE_CODE(apply({"-q", "--no-sync", version_dir(root, static_cast<int>(v)).string(), local.string()}), 0);
    const TreeDiff d = tree_equal(local, ckpts[v]);
    REQUIRE_MESSAGE(d.equal, d.report());
  }
}

// delta-diff --json --squash ROOT/weight_a ROOT/weight_b OUT (after the
// options `extra`), required to succeed; checks the summary against the
// chain and OUT (whose base is version a-1 unless `base` says otherwise), and
// that nothing but OUT appeared beside it.
json squash_ok(const fs::path& root, int a, int b, const fs::path& out, bool no_sync = true, int base = -1,
               const std::vector<std::string>& extra = {}) {
  if (base < 0) base = a - 1;
  fs::create_directories(out.parent_path());
  std::vector<std::string> names = list_names(out.parent_path());
  std::vector<std::string> args{"--json"};
  if (no_sync) args.push_back("--no-sync");
  args.insert(args.end(), extra.begin(), extra.end());
  for (const auto& s :
       {std::string("--squash"), version_dir(root, a).string(), version_dir(root, b).string(), out.string()})
    args.push_back(s);
  const RunResult r = diff(args);
  E2E_REQUIRE_CODE(r, 0);
  const json j = parse_json(r.out);
  CHECK(j["out"] == out.string());
  CHECK(j["version"] == v6(b));
  CHECK(j["base_version"] == v6(base));
  CHECK(j["deltas"] == b - a + 1);
  for (const char* k : {"entries", "entries_composed", "entries_dropped", "files_changed", "files_removed",
                        "input_bytes", "delta_bytes"})
    CHECK_MESSAGE(j[k].is_number_unsigned(), k);
  CHECK(j["seconds"].is_number());
  for (const char* k : {"weight_files_built", "headers_rewritten", "weight_files_removed"})
    CHECK_MESSAGE(j["structure"][k].is_number_unsigned(), k);
  // The counts are those of the chain's files and of OUT.
  std::uint64_t input = 0;
  for (int v = a; v <= b; ++v) input += tree_size(version_dir(root, v));
  CHECK(j["input_bytes"] == input);
  CHECK(j["delta_bytes"] == tree_size(out));
  const json idx = delta_index(out);
  CHECK(j["entries"] == idx["weight_map"].size());
  CHECK(j["entries_composed"].get<std::uint64_t>() <= j["entries"].get<std::uint64_t>());
  CHECK(idx["metadata"]["version"] == v6(b));
  CHECK(idx["metadata"]["base_version"] == v6(base));
  // A well-formed delta, as delta-diff --inspect checks it.
  E2E_CHECK_CODE(diff({"--inspect", out.string(), "-q"}), 0);
  names.push_back(out.filename().string());
  std::sort(names.begin(), names.end());
  CHECK(list_names(out.parent_path()) == names);
  return j;
}

// Applies `delta` (versions a-1 -> b) to a fresh LOCAL initialised from
// C_{a-1} with version a-1, and checks it is C_b byte for byte, records b and
// verifies clean.
void check_squash_applies(const fs::path& delta, const std::vector<fs::path>& ckpts, int a, int b,
                          const fs::path& local, bool no_sync = true) {
  CAPTURE(no_sync);
  fs::remove_all(local);
  E2E_REQUIRE_CODE(apply({"-q", "--no-sync", "--init", ckpts[a - 1].string(), "--init-version", std::to_string(a - 1),
                          local.string()}),
                   0);
  REQUIRE(state_version(local) == v6(a - 1));
  std::vector<std::string> args{"-q"};
  if (no_sync) args.push_back("--no-sync");
  args.push_back(delta.string());
  args.push_back(local.string());
  E2E_REQUIRE_CODE(apply(args), 0);
  E2E_CHECK_TREE_EQUAL(local, ckpts[b]);
  CHECK(state_json(local) == json{{"version", v6(b)}});
  E2E_CHECK_CODE(apply({"--verify", local.string()}), 0);
}

std::string squash_name(int a, int b) { return "sq_" + std::to_string(a) + "_" + std::to_string(b); }

// ---- a chain of generator saves with structural edits ------------------------

// BF16 -> F32 of the same values: each element's two bytes become the high
// half of a float (a retype that changes the byte count).
Bytes bf16_to_f32(const Bytes& b) {
  Bytes o(b.size() * 2, 0);
  for (std::size_t i = 0; i + 1 < b.size(); i += 2) o[2 * i + 2] = b[i], o[2 * i + 3] = b[i + 1];
  return o;
}

// Weight file i (1-based) of a generator save of the tiny preset at 300kb.
std::string gen_file(int i) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-00005.safetensors", i);
  return buf;
}

// The structure of version k of the chain over generator save k: the edits
// of steps 1..k, applied in order to the save's tensors (so the values keep
// changing from save to save under every structural change).
void restructure(Ckpt& c, int k) {
  const std::string q_norm = "model.layers.0.self_attn.q_norm.weight";
  const std::string q_renamed = "model.layers.0.self_attn.q_norm.renamd";  // as long: the header keeps its length
  for (int step = 1; step <= k; ++step) {
    switch (step) {
      case 1:
        c.rename(q_norm, q_renamed);
        c.metadata[gen_file(5)] = {{"format", "np"}};  // same length: header rewritten in place
        c.add("extra.scale", "F32", {33}, random_bytes(33 * 4, 1), gen_file(4));
        c.files["notes/sub/readme.txt"] = "version one\n";
        break;
      case 2:
        c.remove("model.layers.1.self_attn.k_norm.weight");
        c.at("model.layers.0.mlp.up_proj.weight").shape = {128, 384};
        c.at("model.norm.weight").dtype = "F16";
        c.at("extra.scale").bytes = random_bytes(33 * 4, 2);
        c.metadata[gen_file(1)] = {{"format", "pt"}, {"step", "2"}};  // another length
        c.files["notes/sub/readme.txt"] = "version two, longer\n";
        break;
      case 3: {
        CkptTensor& t = c.at("model.layers.0.input_layernorm.weight");
        t.dtype = "F32";
        t.bytes = bf16_to_f32(t.bytes);
        c.files.erase("notes/sub/readme.txt");
        c.files["notes/other.txt"] = "another file\n";
        json cfg = parse_json(c.files.at("config.json"));
        cfg["hfdelta_test_note"] = "resharded";
        c.files["config.json"] = cfg.dump(2) + "\n";
        c.reshard(3);
        break;
      }
      case 4:
        c.to_single_file();
        break;
      case 5:
        c.rename(q_renamed, q_norm);
        c.remove("extra.scale");
        c.reshard(4);
        c.metadata["model-00002-of-00004.safetensors"] = {{"format", "pt"}, {"note", "five"}};
        break;
      case 6:
        c.metadata["model-00002-of-00004.safetensors"] = {{"format", "pt"}, {"note", "fivE"}};
        c.files["notes/deep/er/blob.bin"] = std::string("\0\1\2binary\xff", 10);
        break;
    }
  }
}

// Writes C0..Cn (n <= saves of the series) under dir, C_k = save k with the
// edits of steps 1..k.
// "c<k>": appended rather than written as "c" + std::string, which GCC 12
// warns about (a false -Wrestrict).
std::string ckpt_name(std::size_t k) {
  std::string s = "c";
  s += std::to_string(k);
  return s;
}

std::vector<fs::path> structured_chain(const fs::path& series, const fs::path& dir, int n) {
  std::vector<fs::path> ckpts;
  for (int k = 0; k <= n; ++k) {
    Ckpt c = Ckpt::load(save_dir(series, k));
    restructure(c, k);
    const fs::path p = dir / ckpt_name(k);
    c.save(p);
    ckpts.push_back(p);
  }
  // C0 is the save itself, rewritten: same bytes.
  const TreeDiff d = tree_equal(ckpts[0], save_dir(series, 0));
  REQUIRE_MESSAGE(d.equal, d.report());
  return ckpts;
}

// ---- a small hand-made checkpoint, edited at random --------------------------

std::size_t dtype_size(const std::string& dt) {
  if (dt == "F64" || dt == "I64") return 8;
  if (dt == "F32" || dt == "I32") return 4;
  if (dt == "BF16" || dt == "F16" || dt == "I16") return 2;
  return 1;
}

Ckpt small_checkpoint() {
  Ckpt c;
  const std::string f1 = "model-00001-of-00003.safetensors", f2 = "model-00002-of-00003.safetensors",
                    f3 = "model-00003-of-00003.safetensors";
  c.add("a.bf16", "BF16", {16, 8}, random_bytes(256, 11), f1);
  c.add("a.f16", "F16", {32}, random_bytes(64, 12), f1);
  c.add("a.i32", "I32", {9}, random_bytes(36, 13), f1);
  c.add("b.f32", "F32", {4, 6}, random_bytes(96, 14), f2);
  c.add("b.i64", "I64", {5}, random_bytes(40, 15), f2);
  c.add("b.u8", "U8", {40}, random_bytes(40, 16), f2);
  Bytes mask = random_bytes(12, 17);
  for (auto& x : mask) x &= 1;
  c.add("c.bool", "BOOL", {12}, mask, f3);
  c.add("c.empty", "F16", {0, 4}, {}, f3);
  c.add("c.scalar", "F32", {}, random_bytes(4, 18), f3);
  c.add("c.f64", "F64", {7}, random_bytes(56, 19), f3);
  for (const auto& f : {f1, f2, f3}) c.metadata[f] = {{"format", "pt"}};
  c.files["config.json"] = "{\"model_type\": \"toy\"}\n";
  c.files["tokenizer.json"] = "{\"vocab\": {}}\n";
  return c;
}

// One random chain of edits; `log` says what each step did.
class RandomEditor {
 public:
  RandomEditor(std::uint64_t seed, Ckpt base) : rng_(seed), base_(std::move(base)) {}

  // Version `step` from the previous ones (history.back() is the latest).
  Ckpt next(const std::vector<Ckpt>& history, int step, std::ostringstream& log) {
    Ckpt c = history.back();
    const int structural = pick(0, 3);
    for (int i = 0; i < structural; ++i) structural_edit(c, step, log);
    const int values = pick(1, 3);
    for (int i = 0; i < values; ++i) value_edit(c, history, log);
    return c;
  }

 private:
  std::mt19937_64 rng_;
  Ckpt base_;  // version 0, for names that come back
  int counter_ = 0;

  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  template <class T>
  const T& choose(const std::vector<T>& v) {
    return v.at(static_cast<std::size_t>(pick(0, static_cast<int>(v.size()) - 1)));
  }
  std::vector<std::string> names(const Ckpt& c, bool nonempty = false) {
    std::vector<std::string> v;
    for (const auto& [n, t] : c.tensors)
      if (!nonempty || !t.bytes.empty()) v.push_back(n);
    return v;
  }
  std::string fresh_name(int step) {
    std::string n = "t";  // appended piece by piece: GCC 12 misreads "t" + std::string (-Wrestrict)
    n += std::to_string(step);
    n += "_";
    n += std::to_string(counter_++);
    return n + ".w";
  }

  void value_edit(Ckpt& c, const std::vector<Ckpt>& history, std::ostringstream& log) {
    const auto ns = names(c, true);
    if (ns.empty()) return;
    const std::string n = choose(ns);
    CkptTensor& t = c.at(n);
    if (pick(0, 3) == 0 && history.size() >= 2) {
      // Back to an earlier version's bytes: changes that cancel out.
      const Ckpt& old = history.at(static_cast<std::size_t>(pick(0, static_cast<int>(history.size()) - 2)));
      if (old.has(n) && old.at(n).bytes.size() == t.bytes.size()) {
        t.bytes = old.at(n).bytes;
        log << "  revert " << n << "\n";
        return;
      }
    }
    const std::size_t es = dtype_size(t.dtype), elems = t.bytes.size() / es;
    const std::size_t m =
        pick(0, 4) == 0 ? elems : static_cast<std::size_t>(pick(1, static_cast<int>(std::min<std::size_t>(elems, 6))));
    for (std::size_t i = 0; i < m; ++i) {
      const std::size_t e = m == elems ? i : static_cast<std::size_t>(pick(0, static_cast<int>(elems) - 1));
      if (t.dtype == "BOOL") {
        t.bytes[e] ^= 1;
        continue;
      }
      for (std::size_t b = 0; b < es; ++b)
        if (pick(0, 1)) t.bytes[e * es + b] = static_cast<std::uint8_t>(pick(0, 255));
    }
    log << "  values of " << m << " element(s) of " << n << "\n";
  }

  void structural_edit(Ckpt& c, int step, std::ostringstream& log) {
    const auto ns = names(c);
    switch (pick(0, 13)) {
      case 0: {
        const std::string n = choose(ns), to = fresh_name(step);
        c.rename(n, to);
        log << "  rename " << n << " -> " << to << "\n";
        break;
      }
      case 1: {
        static const std::vector<std::string> dtypes = {"BF16", "F16", "F32", "I64", "U8", "F64"};
        const std::string dt = choose(dtypes), n = fresh_name(step);
        const std::uint64_t elems = static_cast<std::uint64_t>(pick(1, 40));
        const bool zeros = pick(0, 2) == 0;
        Bytes b = zeros ? Bytes(elems * dtype_size(dt), 0) : random_bytes(elems * dtype_size(dt), rng_());
        const auto files = c.weight_files();
        std::string file = c.sharded ? choose(files) : kSingleFile;
        if (c.sharded && pick(0, 2) == 0) file = "model-new-" + std::to_string(step) + ".safetensors";
        c.add(n, dt, {elems}, std::move(b), file);
        log << "  add " << n << " " << dt << " [" << elems << "]" << (zeros ? " zeros" : "") << " in " << file << "\n";
        break;
      }
      case 2:
        if (ns.size() > 3) {
          const std::string n = choose(ns);
          c.remove(n);
          log << "  remove " << n << "\n";
        }
        break;
      case 3: {
        const std::string n = choose(ns);
        CkptTensor& t = c.at(n);
        const std::uint64_t elems = t.bytes.size() / dtype_size(t.dtype);
        if (t.shape.size() != 1)
          t.shape = {elems};
        else if (elems % 2 == 0)
          t.shape = {2, elems / 2};
        else
          t.shape = {1, elems};
        log << "  reshape " << n << "\n";
        break;
      }
      case 4: {
        // Retype keeping the element size (the bytes stay valid for either).
        static const std::map<std::string, std::string> same = {{"BF16", "F16"}, {"F16", "BF16"}, {"F32", "I32"},
                                                                {"I32", "F32"},  {"F64", "I64"},  {"I64", "F64"},
                                                                {"U8", "I8"},    {"I8", "U8"}};
        const std::string n = choose(ns);
        CkptTensor& t = c.at(n);
        if (auto it = same.find(t.dtype); it != same.end()) {
          log << "  retype " << n << " " << t.dtype << " -> " << it->second << "\n";
          t.dtype = it->second;
        }
        break;
      }
      case 5: {
        // Retype to another element size: BF16 -> F32 of the same values.
        const std::string n = choose(ns);
        CkptTensor& t = c.at(n);
        if (t.dtype == "BF16") {
          t.dtype = "F32";
          t.bytes = bf16_to_f32(t.bytes);
          log << "  retype " << n << " BF16 -> F32\n";
        }
        break;
      }
      case 6:
        if (c.sharded) {
          const auto files = c.weight_files();
          const std::string n = choose(ns), f = choose(files);
          c.move(n, f);
          log << "  move " << n << " to " << f << "\n";
        }
        break;
      case 7: {
        const int n = pick(1, 4);
        c.reshard(n);
        log << "  reshard into " << n << "\n";
        break;
      }
      case 8:
        c.to_single_file();
        log << "  single file\n";
        break;
      case 9: {
        const auto files = c.weight_files();
        const std::string f = choose(files);
        if (pick(0, 3) == 0) {
          c.metadata.erase(f);
          log << "  no __metadata__ in " << f << "\n";
        } else {
          const std::string v(static_cast<std::size_t>(pick(0, 12)), static_cast<char>('a' + pick(0, 25)));
          c.metadata[f] = {{"format", "pt"}, {"note", v}};
          log << "  __metadata__ of " << f << " note=" << v << "\n";
        }
        break;
      }
      case 10:
      case 11: {
        const std::string p =
            "extra/" + std::string(pick(0, 1) ? "sub/" : "") + "f" + std::to_string(pick(0, 3)) + ".txt";
        if (c.files.count(p) && pick(0, 1)) {
          c.files.erase(p);
          log << "  remove file " << p << "\n";
        } else {
          c.files[p] =
              "step " + std::to_string(step) + " " + std::string(static_cast<std::size_t>(pick(0, 30)), 'x') + "\n";
          log << "  put file " << p << "\n";
        }
        break;
      }
      case 12: {
        // A name used before comes back, with other bytes: not the old tensor.
        std::vector<std::string> gone;
        for (const auto& [n, t] : base_.tensors)
          if (!c.has(n)) gone.push_back(n);
        if (gone.empty()) break;
        const std::string n = choose(gone);
        CkptTensor t = base_.at(n);
        for (auto& x : t.bytes) x = static_cast<std::uint8_t>(x + 1);
        if (t.dtype == "BOOL") t.bytes = Bytes(t.bytes.size(), 1);
        const auto files = c.weight_files();
        c.add(n, t.dtype, t.shape, t.bytes, c.sharded ? choose(files) : kSingleFile);
        log << "  add " << n << " again\n";
        break;
      }
      case 13: {
        // Two tensors swap names.
        const std::string x = choose(ns), y = choose(ns);
        if (x == y) break;
        c.rename(x, "swap.tmp");
        c.rename(y, x);
        c.rename("swap.tmp", y);
        log << "  swap " << x << " and " << y << "\n";
        break;
      }
    }
  }
};

}  // namespace

// ---- 1. squash equivalence on chains mixing structural and value changes -------

TEST_CASE("squash: every sub-range of a chain of structural and value changes applies as the chain does") {
  std::string encoding;
  SUBCASE("sparse") { encoding = "sparse"; }
  SUBCASE("xor") { encoding = "xor"; }
  SUBCASE("overwrite") { encoding = "overwrite"; }
  CAPTURE(encoding);
  const auto t = scratch_dir();
  const int n = 6;
  const fs::path series = gen_series(t->path() / "series", n, {"--max-shard-size", "300kb"});
  const std::vector<fs::path> ckpts = structured_chain(series, t->path() / "ckpt", n);
  const fs::path root = t->path() / "root";
  write_chain(ckpts, root, encoding);
  check_chain(ckpts, root, t->path() / "chain_local");
  // The chain has the structural operations the squashes must carry.
  CHECK(delta_index(version_dir(root, 1))["metadata"].contains("hfdelta_shards"));
  CHECK(delta_index(version_dir(root, 4))["metadata"].contains("hfdelta_shards"));

  for (int a = 1; a <= n; ++a)
    for (int b = a + 1; b <= n; ++b) {
      CAPTURE(a);
      CAPTURE(b);
      const fs::path out = t->path() / "squashed" / squash_name(a, b);
      // Flushing or not changes nothing in what is written: half the ranges
      // are squashed, and half applied, with --no-sync.
      const json j = squash_ok(root, a, b, out, b % 2 == 0);
      check_squash_applies(out, ckpts, a, b, t->path() / "local", (a + b) % 2 == 0);
      if (a == 1 && b == 2) {
        // Headers rewritten at both steps compose into one header operation.
        CHECK(j["structure"]["headers_rewritten"].get<int>() >= 1);
      }
      if (a == 3 && b == 4) {
        // Sharded into three files at version 3, one file at version 4: the
        // five files of version 2 go, the three of version 3 never appear.
        CHECK(j["structure"]["weight_files_built"] == 1);
        CHECK(j["structure"]["weight_files_removed"] == 5);
        std::map<std::string, std::string> want{{kSingleFile, "build"}};
        for (int i = 1; i <= 5; ++i) want[gen_file(i)] = "remove";
        CHECK(ops_of(delta_index(out)) == want);
      }
      if (a == 1 && b == n) {
        // Over the whole chain: other files put and removed, weight files
        // built, the generator's tensors composed across every step.
        CHECK(j["files_changed"].get<int>() >= 3);  // config.json, notes/other.txt, notes/deep/er/blob.bin
        CHECK(j["structure"]["weight_files_built"].get<int>() >= 1);
        CHECK(j["entries_composed"].get<int>() >= 1);
      }
    }

  // A squashed delta is a delta like any other: published under its own
  // version beside the rest of the chain, it squashes again.
  const fs::path again = t->path() / "again";
  copy_tree(t->path() / "squashed" / squash_name(1, 3), version_dir(again, 3));
  for (int v = 4; v <= n; ++v) copy_tree(version_dir(root, v), version_dir(again, v));
  squash_ok(again, 3, n, t->path() / "again_squashed", true, 0);
  check_squash_applies(t->path() / "again_squashed", ckpts, 1, n, t->path() / "local");
}

TEST_CASE("squash: a sharded chain squashed to a single-file version and back") {
  // Direct single-file <-> sharded transitions at the ends of a squashed range.
  const auto t = scratch_dir();
  const fs::path series = gen_series(t->path() / "series", 3, {"--max-shard-size", "300kb"});
  std::vector<fs::path> ckpts;
  for (int k = 0; k <= 3; ++k) {
    Ckpt c = Ckpt::load(save_dir(series, k));
    if (k == 1 || k == 2) c.to_single_file();
    const fs::path p = t->path() / ckpt_name(static_cast<std::size_t>(k));
    c.save(p);
    ckpts.push_back(p);
  }
  for (const std::string encoding : {"sparse", "xor", "overwrite"}) {
    CAPTURE(encoding);
    const fs::path root = t->path() / ("root_" + encoding);
    write_chain(ckpts, root, encoding);
    for (const auto& range : std::vector<std::pair<int, int>>{{1, 2}, {2, 3}, {1, 3}}) {
      const int a = range.first, b = range.second;  // plain ints: CAPTURE takes them by reference
      CAPTURE(a);
      CAPTURE(b);
      const fs::path out = t->path() / ("sq_" + encoding) / squash_name(a, b);
      squash_ok(root, a, b, out);
      check_squash_applies(out, ckpts, a, b, t->path() / "local");
    }
  }
}

// ---- 2. random structural and value edits -----------------------------------------

namespace {

// Builds a chain of 3 to 6 random versions of small_checkpoint() from `seed`
// (the encoding too: one for the whole chain, or with `mixed` one per step,
// auto included, so that entries stack), checks the chain itself, then
// squashes the whole chain and two random sub-ranges and applies each.
void random_chain(std::uint64_t seed, bool mixed = false) {
  const auto t = scratch_dir();
  const std::vector<std::string> kinds{"sparse", "xor", "overwrite", "auto"};
  CAPTURE(seed);
  std::mt19937_64 rng(seed * 7919);
  const int n = std::uniform_int_distribution<int>(3, 6)(rng);
  std::vector<std::string> encodings;
  for (int step = 1; step <= n; ++step)
    encodings.push_back(mixed ? kinds[std::uniform_int_distribution<std::size_t>(0, 3)(rng)] : kinds[seed % 3]);
  const std::string encodings_used = joined(encodings);
  CAPTURE(encodings_used);
  std::vector<Ckpt> history{small_checkpoint()};
  RandomEditor ed(seed, history[0]);
  std::ostringstream log;
  const fs::path dir = t->path();
  std::vector<fs::path> ckpts{dir / "c0"};
  history[0].save(ckpts[0]);
  for (int step = 1; step <= n; ++step) {
    CAPTURE(step);
    log << "step " << step << ":\n";
    history.push_back(ed.next(history, step, log));
    ckpts.push_back(dir / ckpt_name(static_cast<std::size_t>(step)));
    history.back().save(ckpts.back());
  }
  INFO("edits:\n" << log.str());
  const fs::path root = dir / "root";
  write_mixed_chain(ckpts, root, encodings);
  check_chain(ckpts, root, dir / "chain_local");

  // The whole chain and two random sub-ranges of at least two deltas.
  std::vector<std::pair<int, int>> ranges{{1, n}};
  for (int i = 0; i < 2; ++i) {
    const int a = std::uniform_int_distribution<int>(1, n - 1)(rng);
    const int b = std::uniform_int_distribution<int>(a + 1, n)(rng);
    if (std::find(ranges.begin(), ranges.end(), std::make_pair(a, b)) == ranges.end()) ranges.emplace_back(a, b);
  }
  for (const auto& range : ranges) {
    const int a = range.first, b = range.second;  // plain ints: CAPTURE takes them by reference
    CAPTURE(a);
    CAPTURE(b);
    const fs::path out = dir / "squashed" / squash_name(a, b);
    squash_ok(root, a, b, out);
    check_squash_applies(out, ckpts, a, b, dir / "local");
  }
}

}  // namespace

// One test case a seed, so that a failing seed does not hide the others.
#define SQUASH_RANDOM_CHAIN(seed) \
  TEST_CASE("squash: random chain of structural and value edits, seed " #seed) { random_chain(seed); }
SQUASH_RANDOM_CHAIN(1)
SQUASH_RANDOM_CHAIN(2)
SQUASH_RANDOM_CHAIN(3)
SQUASH_RANDOM_CHAIN(4)
SQUASH_RANDOM_CHAIN(5)
SQUASH_RANDOM_CHAIN(6)
SQUASH_RANDOM_CHAIN(7)
SQUASH_RANDOM_CHAIN(8)
SQUASH_RANDOM_CHAIN(9)
#undef SQUASH_RANDOM_CHAIN
#define SQUASH_MIXED_CHAIN(seed)                                                                       \
  TEST_CASE("squash: random chain of structural and value edits, an encoding per step, seed " #seed) { \
    random_chain(seed, true);                                                                          \
  }
SQUASH_MIXED_CHAIN(10)
SQUASH_MIXED_CHAIN(11)
SQUASH_MIXED_CHAIN(12)
SQUASH_MIXED_CHAIN(13)
SQUASH_MIXED_CHAIN(14)
SQUASH_MIXED_CHAIN(15)
SQUASH_MIXED_CHAIN(16)
SQUASH_MIXED_CHAIN(17)
SQUASH_MIXED_CHAIN(18)
#undef SQUASH_MIXED_CHAIN

// ---- 3. changes that cancel out -------------------------------------------------

namespace {

// Writes each checkpoint as dir/cK and returns the paths.
std::vector<fs::path> save_all(const std::vector<Ckpt>& cs, const fs::path& dir) {
  std::vector<fs::path> ps;
  for (std::size_t k = 0; k < cs.size(); ++k) {
    ps.push_back(dir / ckpt_name(k));
    cs[k].save(ps.back());
  }
  return ps;
}

std::set<std::string> entry_names(const fs::path& delta) {
  std::set<std::string> s;
  const json wm = delta_index(delta)["weight_map"];
  for (auto it = wm.begin(); it != wm.end(); ++it) s.insert(it.key());
  return s;
}

// Three tensors in two weight files, and the other files of a checkpoint.
Ckpt three_tensors() {
  Ckpt c;
  c.add("keep.a", "F32", {64}, random_bytes(256, 21), "model-00001-of-00002.safetensors");
  c.add("flip.b", "BF16", {128}, random_bytes(256, 22), "model-00001-of-00002.safetensors");
  c.add("still.c", "F16", {32}, random_bytes(64, 23), "model-00002-of-00002.safetensors");
  c.metadata["model-00001-of-00002.safetensors"] = {{"format", "pt"}};
  c.metadata["model-00002-of-00002.safetensors"] = {{"format", "pt"}};
  c.files["config.json"] = "{\"model_type\": \"toy\"}\n";
  return c;
}

void poke(Ckpt& c, const std::string& tensor, std::initializer_list<std::size_t> at, std::uint8_t x) {
  for (std::size_t i : at) c.at(tensor).bytes.at(i) ^= x;
}

}  // namespace

TEST_CASE("squash: a tensor changed and changed back has no entry, and the squashed delta still applies") {
  std::string encoding;
  SUBCASE("sparse") { encoding = "sparse"; }
  SUBCASE("xor") { encoding = "xor"; }
  CAPTURE(encoding);
  TempDir t;
  std::vector<Ckpt> cs{three_tensors()};
  cs.push_back(cs.back());  // 1: flip.b and keep.a change
  poke(cs.back(), "flip.b", {0, 1, 17, 200}, 0x5a);
  poke(cs.back(), "keep.a", {3, 40}, 0x11);
  cs.push_back(cs.back());  // 2: flip.b back to version 0, keep.a changes again
  cs.back().at("flip.b").bytes = cs[0].at("flip.b").bytes;
  poke(cs.back(), "keep.a", {3, 100}, 0x22);
  cs.push_back(cs.back());  // 3: still.c changes
  poke(cs.back(), "still.c", {5}, 0x80);
  cs.push_back(cs[0]);  // 4: everything back to version 0
  const std::vector<fs::path> ckpts = save_all(cs, t / "ckpt");
  const fs::path root = t / "root";
  write_chain(ckpts, root, encoding);
  check_chain(ckpts, root, t / "chain_local");
  // Each delta of the chain has an entry for what it changes.
  REQUIRE(entry_names(version_dir(root, 1)) == std::set<std::string>{"flip.b", "keep.a"});
  REQUIRE(entry_names(version_dir(root, 2)) == std::set<std::string>{"flip.b", "keep.a"});

  struct Case {
    int a, b;
    std::set<std::string> entries;
    std::uint64_t dropped;
  };
  for (const Case& c : std::vector<Case>{
           {1, 2, {"keep.a"}, 1},             // flip.b cancels out
           {1, 3, {"keep.a", "still.c"}, 1},  // still.c: one entry, as it is
           {1, 4, {}, 3},                     // back to version 0: no entry at all
           {2, 4, {"flip.b", "keep.a"}, 1},   // flip.b: one entry; still.c cancels out
       }) {
    CAPTURE(c.a);
    CAPTURE(c.b);
    const fs::path out = t / "squashed" / squash_name(c.a, c.b);
    const json j = squash_ok(root, c.a, c.b, out);
    CHECK(entry_names(out) == c.entries);
    CHECK(j["entries"] == c.entries.size());
    CHECK(j["entries_dropped"] == c.dropped);
    check_squash_applies(out, ckpts, c.a, c.b, t / "local");
  }
}

// ---- 4. entries of different kinds: stacked ----------------------------------------

namespace {

// C0..C4 of three_tensors(): keep.a changes at every step, flip.b at step 2.
// With `build`, step 2 also adds a tensor to keep.a's weight file, so that
// the file is built and keep.a copied into it, not patched in place.
std::vector<fs::path> stacking_checkpoints(const fs::path& dir, bool build) {
  std::vector<Ckpt> cs{three_tensors()};
  for (int k = 1; k <= 4; ++k) {
    cs.push_back(cs.back());
    poke(cs.back(), "keep.a", {static_cast<std::size_t>(k), 60, 200}, static_cast<std::uint8_t>(0x11 * k));
    if (k == 2) poke(cs.back(), "flip.b", {9}, 0x01);
    if (k == 2 && build) cs.back().add("added.e", "F32", {8}, random_bytes(32, 41), "model-00001-of-00002.safetensors");
  }
  return save_all(cs, dir);
}

// The inspect --json entry of `tensor` in `delta`.
json inspected(const fs::path& delta, const std::string& tensor) {
  const RunResult r = diff({"--inspect", delta.string(), "--json"});
  E2E_REQUIRE_CODE(r, 0);
  const json j = parse_json(r.out);
  for (const json& e : j["tensors"])
    if (e["name"] == tensor) return e;
  FAIL("no entry '" << tensor << "' in --inspect of " << delta);
  return {};
}

}  // namespace

TEST_CASE(
    "squash: a tensor patched by entries of different kinds gets a stacked entry that applies as the chain does") {
  // keep.a's entries of steps 1..3, by encoding; runs of one kind compose
  // into one part (sparse differences add, xor masks XOR, overwrites merge).
  struct Case {
    std::vector<std::string> encodings;
    std::uint64_t parts;
  };
  Case c;
  SUBCASE("xor, sparse, sparse") { c = {{"xor", "sparse", "sparse"}, 2}; }
  SUBCASE("sparse, overwrite, xor") { c = {{"sparse", "overwrite", "xor"}, 3}; }
  SUBCASE("overwrite, xor, overwrite") { c = {{"overwrite", "xor", "overwrite"}, 3}; }
  // auto picks sparse or xor, whichever is smaller: two parts either way.
  SUBCASE("sparse, auto, xor") { c = {{"sparse", "auto", "xor"}, 2}; }
  const std::string encodings = joined(c.encodings);
  CAPTURE(encodings);
  for (const bool build : {false, true}) {
    CAPTURE(build);
    TempDir t;
    const std::vector<fs::path> ckpts = stacking_checkpoints(t / "ckpt", build);
    const fs::path root = t / "root";
    std::vector<std::string> encs = c.encodings;
    encs.push_back("sparse");  // step 4, for squashing a squashed delta below
    write_mixed_chain(ckpts, root, encs);
    check_chain(ckpts, root, t / "chain_local");

    const fs::path out = t / "sq" / squash_name(1, 3);
    const json j = squash_ok(root, 1, 3, out);
    CHECK(j["entries_stacked"] == 1);
    const json idx = delta_index(out);
    CHECK(idx["metadata"]["hfdelta_format"] == 4);  // older builds refuse it rather than misread it
    CHECK(idx["metadata"]["delta_encoding"] == "auto");
    CHECK(idx["metadata"]["hfdelta_encodings"]["keep.a"] == "stack");
    CHECK(idx["metadata"]["hfdelta_encodings"]["flip.b"] != "stack");  // one entry, as it is
    const json e = inspected(out, "keep.a");
    CHECK(e["encoding"] == "stack");
    CHECK(e["stack_parts"] == c.parts);
    CHECK(e["tensor_bytes"] == 256);
    CHECK(e["changed_elements"].is_null());  // not known without the base
    for (const bool no_sync : {true, false}) check_squash_applies(out, ckpts, 1, 3, t / "local", no_sync);

    // A LOCAL that is not the base: keep.a's base checksum is checked before
    // the stack is laid over it, and LOCAL is left as it was.
    const fs::path wrong = t / "wrong";
    E2E_REQUIRE_CODE(apply({"-q", "--no-sync", "--init", ckpts[1].string(), "--init-version", "0", wrong.string()}), 0);
    for (const bool no_sync : {true, false}) {
      CAPTURE(no_sync);
      const LocalSnapshot before(wrong);
      std::vector<std::string> args{"-q", out.string(), wrong.string()};
      if (no_sync) args.insert(args.begin(), "--no-sync");
      const RunResult r = apply(args);
      E2E_CHECK_CODE(r, 5);
      CHECK_MESSAGE(contains(r.err, "'keep.a'"), r.describe());
      const TreeDiff d = before.compare();
      CHECK_MESSAGE(d.equal, d.report());
      CHECK_FALSE(has_txn(wrong));
    }

    // A chain holding a squashed delta squashes again: its stacked entry is
    // taken apart into its parts, which compose with the next delta's entry.
    const fs::path again = t / "again";
    copy_tree(out, version_dir(again, 3));
    copy_tree(version_dir(root, 4), version_dir(again, 4));
    squash_ok(again, 3, 4, t / "again_sq", true, 0);
    check_squash_applies(t / "again_sq", ckpts, 1, 4, t / "local");
    // The whole chain at once gives the same result.
    squash_ok(root, 1, 4, t / "whole_sq");
    check_squash_applies(t / "whole_sq", ckpts, 1, 4, t / "local");
  }
}

TEST_CASE("squash: damage anywhere in a stacked entry is refused before LOCAL changes") {
  // Each byte of the entry flipped in turn. In the head (magic, part count,
  // each part's encoding, length and checksum): a malformed head is exit 3;
  // a wrong part checksum is caught when that part is laid (exit 5) or, for
  // the last part, against the entry's checksum (exit 3). In the parts: a
  // frame that does not decode is exit 3, one that decodes to other bytes
  // fails its part's checksum (exit 5); a flip zstd never reads (in a frame
  // header field it ignores, say) may apply, and must then give the target.
  TempDir t;
  const std::vector<fs::path> ckpts = stacking_checkpoints(t / "ckpt", false);
  const fs::path root = t / "root";
  write_mixed_chain(ckpts, root, {"xor", "sparse"});
  const fs::path out = t / "sq";
  squash_ok(root, 1, 2, out);
  REQUIRE(inspected(out, "keep.a")["stack_parts"] == 2);
  const std::string file = delta_index(out)["weight_map"]["keep.a"].get<std::string>();
  const StFile st = read_st(out / file);
  const auto [head, end] = st.file_range("keep.a");
  const std::uint64_t head_len = 8 + 2 * 32;
  REQUIRE(end - head > head_len);
  const fs::path local = t / "local";
  E2E_REQUIRE_CODE(apply({"-q", "--no-sync", "--init", ckpts[0].string(), local.string()}), 0);
  const fs::path start = t / "start";
  copy_tree(local, start);
  const LocalSnapshot before(local);
  std::map<int, int> codes, head_codes;
  for (std::uint64_t i = 0; i < end - head; ++i) {
    CAPTURE(i);
    const fs::path bad = t / "bad";
    fs::remove_all(bad);
    copy_tree(out, bad);
    Bytes raw = st.raw;
    raw[head + i] ^= i % 2 ? 0x01 : 0x80;
    write_bytes(bad / file, raw);
    reseal_marker(bad);  // the parts' own checks answer, not the marker's
    const RunResult r = apply({"-q", i % 3 ? "--no-sync" : "-q", bad.string(), local.string()});
    ++(i < head_len ? head_codes : codes)[r.code];
    if (r.code == 0 && i >= head_len) {
      E2E_CHECK_TREE_EQUAL(local, ckpts[2]);
      CHECK(state_version(local) == v6(2));
      fs::remove_all(local);
      copy_tree(start, local);
      continue;
    }
    CHECK_MESSAGE((r.code == 3 || r.code == 5), r.describe());
    CHECK_MESSAGE(contains(r.err, "keep.a"), r.describe());
    const TreeDiff d = before.compare();
    REQUIRE_MESSAGE(d.equal, d.report());
    CHECK_FALSE(has_txn(local));
  }
  // Both kinds of refusal were seen: the first part's checksum is only
  // known to be wrong once the part is laid.
  CHECK(head_codes[3] > 0);
  CHECK(head_codes[5] > 0);
  CHECK(codes[3] + codes[5] + codes[0] == end - head - head_len);
  CHECK(codes[0] < 8);  // flips that change nothing are rare
  MESSAGE("flips in the parts: " << codes[3] << " exit 3, " << codes[5] << " exit 5, " << codes[0] << " harmless");
  // The undamaged delta still applies.
  E2E_CHECK_CODE(apply({"-q", out.string(), local.string()}), 0);
  E2E_CHECK_TREE_EQUAL(local, ckpts[2]);
}

TEST_CASE("squash: a tensor created within the chain composes from entries of any kinds") {
  // Its bytes start as zeros, so they are known without the base.
  TempDir t;
  std::vector<Ckpt> cs{three_tensors()};
  cs.push_back(cs.back());  // 1: a tensor added (its file is built), keep.a changes
  cs.back().add("fresh.d", "F32", {16}, random_bytes(64, 31), "model-00002-of-00002.safetensors");
  poke(cs.back(), "keep.a", {7}, 0x44);
  cs.push_back(cs.back());  // 2: only the new tensor changes
  poke(cs.back(), "fresh.d", {0, 33, 63}, 0x0f);
  const std::vector<fs::path> ckpts = save_all(cs, t / "ckpt");
  for (const auto& kinds : std::vector<std::pair<std::string, std::string>>{
           {"xor", "sparse"}, {"sparse", "overwrite"}, {"overwrite", "xor"}}) {
    const std::string& first = kinds.first;  // plain references: CAPTURE takes them by reference
    const std::string& second = kinds.second;
    CAPTURE(first);
    CAPTURE(second);
    const fs::path root = t / ("root_" + first + "_" + second);
    fs::create_directories(root);
    E2E_REQUIRE_CODE(diff({"-q", "--no-sync", "--encoding", first, ckpts[0].string(), ckpts[1].string(),
                           version_dir(root, 1).string()}),
                     0);
    E2E_REQUIRE_CODE(diff({"-q", "--no-sync", "--encoding", second, ckpts[1].string(), ckpts[2].string(),
                           version_dir(root, 2).string()}),
                     0);
    REQUIRE(entry_names(version_dir(root, 2)) == std::set<std::string>{"fresh.d"});
    const fs::path out = t / ("sq_" + first + "_" + second);
    const json j = squash_ok(root, 1, 2, out);
    CHECK(j["entries_composed"] == 1);
    check_squash_applies(out, ckpts, 1, 2, t / "local");
  }
}

TEST_CASE("squash: sparse entries of another element size after a retype are stacked") {
  // F16 [32] retyped to F32 [16], same bytes, alone in its weight file:
  // sparse differences of 2-byte and of 4-byte elements carry differently, so
  // they do not add up without the base; they are laid one after the other.
  TempDir t;
  std::vector<Ckpt> cs{three_tensors()};
  cs.push_back(cs.back());
  poke(cs.back(), "still.c", {1, 2}, 0x03);
  cs.push_back(cs.back());
  cs.back().at("still.c").dtype = "F32";
  cs.back().at("still.c").shape = {16};
  poke(cs.back(), "still.c", {2, 9}, 0x30);
  const std::vector<fs::path> ckpts = save_all(cs, t / "ckpt");
  const fs::path root = t / "root";
  write_chain(ckpts, root, "sparse");
  check_chain(ckpts, root, t / "chain_local");
  const json j = squash_ok(root, 1, 2, t / "sq");
  CHECK(j["entries_stacked"] == 1);
  CHECK(inspected(t / "sq", "still.c")["stack_parts"] == 2);
  for (const bool no_sync : {true, false}) check_squash_applies(t / "sq", ckpts, 1, 2, t / "local", no_sync);
  // With xor masks the same chain composes into one entry.
  const fs::path xroot = t / "xroot";
  write_chain(ckpts, xroot, "xor");
  CHECK(squash_ok(xroot, 1, 2, t / "xsq")["entries_stacked"] == 0);
  check_squash_applies(t / "xsq", ckpts, 1, 2, t / "local");
}

// ---- 5. refusals ----------------------------------------------------------------

namespace {

// Runs delta-diff ARGS, which must fail with `code` and a message naming each
// of `names`, leaving no OUT and nothing new beside it or in `root`.
void check_refused(const std::vector<std::string>& args, int code, const std::vector<std::string>& names,
                   const fs::path& out, const fs::path& root) {
  fs::create_directories(out.parent_path());
  const Snapshot root_before = snapshot(root);
  const std::vector<std::string> beside = list_names(out.parent_path());
  const RunResult r = diff(args);
  E2E_CHECK_CODE(r, code);
  for (const auto& n : names) CHECK_MESSAGE(contains(r.err, n), "stderr should name " << n << "\n" << r.describe());
  boost::system::error_code ec;
  CHECK_FALSE(fs::exists(fs::symlink_status(out, ec)));
  CHECK(list_names(out.parent_path()) == beside);
  CHECK(snapshot_diff(root_before, snapshot(root)).empty());
}

std::vector<std::string> squash_args(const fs::path& first, const fs::path& last, const fs::path& out) {
  return {"--no-sync", "--squash", first.string(), last.string(), out.string()};
}

// C0..C3 of three_tensors(): keep.a changes at every step, flip.b at step 2.
std::vector<fs::path> refusal_checkpoints(const fs::path& dir) {
  std::vector<Ckpt> cs{three_tensors()};
  for (int k = 1; k <= 3; ++k) {
    cs.push_back(cs.back());
    poke(cs.back(), "keep.a", {static_cast<std::size_t>(k), 60}, static_cast<std::uint8_t>(k));
    if (k == 2) poke(cs.back(), "flip.b", {9}, 0x01);
  }
  return save_all(cs, dir);
}

}  // namespace

TEST_CASE("squash: FIRST and LAST that do not name a chain of deltas are refused (exit 3), naming the culprit") {
  TempDir t;
  const std::vector<fs::path> ckpts = refusal_checkpoints(t / "ckpt");
  const fs::path root = t / "root";
  write_chain(ckpts, root, "sparse");
  const fs::path v1 = version_dir(root, 1), v2 = version_dir(root, 2), v3 = version_dir(root, 3);
  const fs::path out = t / "out" / "squashed";

  SUBCASE("FIRST not named weight_vNNNNNN") {
    copy_tree(v1, root / "first");
    check_refused(squash_args(root / "first", v3, out), 3, {(root / "first").string()}, out, root);
  }
  SUBCASE("LAST not named weight_vNNNNNN") {
    copy_tree(v3, root / "weight_v3");
    check_refused(squash_args(v1, root / "weight_v3", out), 3, {(root / "weight_v3").string()}, out, root);
  }
  SUBCASE("FIRST and LAST in different directories") {
    const fs::path other = t / "other";
    copy_tree(root, other);
    check_refused(squash_args(v1, version_dir(other, 3), out), 3, {v1.string(), version_dir(other, 3).string()}, out,
                  root);
  }
  SUBCASE("LAST older than FIRST") {
    check_refused(squash_args(v2, v1, out), 3, {v1.string(), v2.string()}, out, root);
  }
  SUBCASE("LAST is FIRST") { check_refused(squash_args(v2, v2, out), 3, {v2.string()}, out, root); }
  SUBCASE("a version missing in between") {
    fs::remove_all(v2);
    check_refused(squash_args(v1, v3, out), 3, {v2.string()}, out, root);
  }
  SUBCASE("a full version in the chain") {
    fs::remove_all(v2);
    copy_tree(ckpts[2], v2);  // a plain copy of the checkpoint: what a root publishes as a full version
    check_refused(squash_args(v1, v3, out), 3, {v2.string()}, out, root);
  }
  SUBCASE("a full version as FIRST") {
    fs::remove_all(v1);
    copy_tree(ckpts[1], v1);
    check_refused(squash_args(v1, v3, out), 3, {v1.string()}, out, root);
  }
  // The checks delta-apply and --inspect make of a delta: a squash publishes
  // what it reads, so it must not read a file of this host through a link.
  const std::string extra = "{\"extra\": true}\n";
  auto carry_extra = [&](const fs::path& delta, const std::string& content) {
    json idx = delta_index(delta);
    idx["metadata"]["hfdelta_files"].push_back(
        {{"path", "extra.json"}, {"op", "put"}, {"size", extra.size()}, {"xxh3-128", xxh3_hex(extra)}});
    write_json(delta / "model.safetensors.index.json", idx);  // resealed
    write_file(t / "elsewhere" / "extra.json", content);
  };
  SUBCASE("files/ of a delta in the chain is a symlink to a directory") {
    carry_extra(v2, extra);
    fs::create_directory_symlink(t / "elsewhere", v2 / "files");
    check_refused(squash_args(v1, v3, out), 3, {(v2 / "files").string(), "symlink"}, out, root);
  }
  SUBCASE("a carried file of a delta in the chain is a symlink") {
    carry_extra(v2, extra);
    fs::create_directories(v2 / "files");
    fs::create_symlink(t / "elsewhere" / "extra.json", v2 / "files" / "extra.json");
    check_refused(squash_args(v1, v3, out), 3, {(v2 / "files" / "extra.json").string(), "symlink"}, out, root);
  }
  SUBCASE("a carried file of other bytes than its delta's index records") {
    carry_extra(v2, extra);
    write_file(v2 / "files" / "extra.json", "{\"extra\": 1}\n");
    check_refused(squash_args(v1, v3, out), 3, {(v2 / "files" / "extra.json").string()}, out, root);
  }
  SUBCASE("a delta whose base version does not follow the previous one") {
    // weight_v000002 from version 0: a valid delta, but not on top of weight_v000001
    // (written aside and moved in: delta-diff publishes only a root's next version).
    fs::remove_all(v2);
    const fs::path aside = t / "aside" / v2.filename().string();
    fs::create_directories(aside.parent_path());
    E2E_REQUIRE_CODE(diff({"-q", "--no-sync", "--delta-version", "2", "--base-version", "0", ckpts[0].string(),
                           ckpts[2].string(), aside.string()}),
                     0);
    fs::rename(aside, v2);
    check_refused(squash_args(v1, v3, out), 3, {v2.string()}, out, root);
  }
}

TEST_CASE("squash: an existing OUT is refused (exit 7) and left as it was") {
  TempDir t;
  const std::vector<fs::path> ckpts = refusal_checkpoints(t / "ckpt");
  const fs::path root = t / "root";
  write_chain(ckpts, root, "sparse");
  const fs::path out = t / "out" / "squashed";
  SUBCASE("a directory") { write_file(out / "keep.txt", "not to be touched\n"); }
  SUBCASE("an empty directory") { fs::create_directories(out); }
  SUBCASE("a file") { write_file(out, "a file\n"); }
  SUBCASE("a dangling symbolic link") {
    fs::create_directories(out.parent_path());
    fs::create_symlink(t / "nowhere", out);
  }
  const Snapshot before = snapshot(out.parent_path());
  const Snapshot root_before = snapshot(root);
  const std::vector<std::string> beside = list_names(out.parent_path());
  const RunResult r = diff(squash_args(version_dir(root, 1), version_dir(root, 3), out));
  E2E_CHECK_CODE(r, 7);
  CHECK_MESSAGE(contains(r.err, out.string()), r.describe());
  CHECK(snapshot_diff(before, snapshot(out.parent_path())).empty());
  CHECK(list_names(out.parent_path()) == beside);
  CHECK(snapshot_diff(root_before, snapshot(root)).empty());
  CHECK_FALSE(fs::exists(t / "nowhere"));
}

TEST_CASE("squash: --encoding, --delta-version and --base-version are refused with --squash (exit 2)") {
  TempDir t;
  const std::vector<fs::path> ckpts = refusal_checkpoints(t / "ckpt");
  const fs::path root = t / "root";
  write_chain(ckpts, root, "sparse");
  const fs::path out = t / "out" / "squashed";
  std::vector<std::string> opt;
  SUBCASE("--encoding") { opt = {"--encoding", "xor"}; }
  SUBCASE("--encoding context (the default, given)") { opt = {"--encoding", "context"}; }
  SUBCASE("--delta-version") { opt = {"--delta-version", "3"}; }
  SUBCASE("--base-version") { opt = {"--base-version", "0"}; }
  CAPTURE(opt[0]);
  std::vector<std::string> args = opt;
  for (const auto& a : squash_args(version_dir(root, 1), version_dir(root, 3), out)) args.push_back(a);
  check_refused(args, 2, {opt[0]}, out, root);
}

// ---- 6. size ----------------------------------------------------------------------

TEST_CASE("squash: a chain changing the same tensors at every step squashes to no more than its inputs") {
  std::string encoding;
  SUBCASE("sparse") { encoding = "sparse"; }
  SUBCASE("xor") { encoding = "xor"; }
  SUBCASE("overwrite") { encoding = "overwrite"; }
  CAPTURE(encoding);
  TempDir t;
  const int n = 4;
  const fs::path series = gen_series(t / "series", n, {"--max-shard-size", "300kb"});
  std::vector<fs::path> ckpts;
  for (int k = 0; k <= n; ++k) ckpts.push_back(save_dir(series, k));
  const fs::path root = t / "root";
  write_chain(ckpts, root, encoding);
  // Every step of a training run changes the same tensors.
  const std::set<std::string> changed = entry_names(version_dir(root, 1));
  REQUIRE(changed.size() >= 10);
  for (int v = 2; v <= n; ++v) REQUIRE(entry_names(version_dir(root, v)) == changed);
  const fs::path out = t / "squashed";
  const json j = squash_ok(root, 1, n, out);
  CAPTURE(j.dump());
  CHECK(entry_names(out) == changed);
  CHECK(j["entries_composed"] == changed.size());
  CHECK(j["entries_dropped"] == 0);
  CHECK(j["delta_bytes"].get<std::uint64_t>() <= j["input_bytes"].get<std::uint64_t>());
  check_squash_applies(out, ckpts, 1, n, t / "local");
}

// ---- known edge cases --------------------------------------------------------------

TEST_CASE("squash: a built weight file with a 0-byte tensor at the offset of the next tensor") {
  // The F16 tensor of no bytes is laid before the U8 ones, at the same offset
  // as a.u8, whose name sorts first: the built file's tensors must be listed
  // in the header's data order.
  TempDir t;
  std::vector<Ckpt> cs(1);
  cs[0].sharded = false;
  cs[0].add("z.empty", "F16", {0}, {}, kSingleFile);
  cs[0].add("a.u8", "U8", {4}, Bytes{1, 2, 3, 4}, kSingleFile);
  cs.push_back(cs.back());  // 1: a tensor added: the file is built
  cs.back().add("b.u8", "U8", {2}, Bytes{5, 6}, kSingleFile);
  cs.push_back(cs.back());  // 2: a value changes
  cs.back().at("a.u8").bytes[3] = 7;
  const std::vector<fs::path> ckpts = save_all(cs, t / "ckpt");
  const StFile st = read_st(ckpts[1] / kSingleFile);
  REQUIRE(st.file_range("z.empty").first == st.file_range("a.u8").first);
  REQUIRE(st.file_range("z.empty").second == st.file_range("a.u8").first);
  for (const std::string encoding : {"sparse", "xor", "overwrite"}) {
    CAPTURE(encoding);
    const fs::path root = t / ("root_" + encoding);
    write_chain(ckpts, root, encoding);
    const fs::path out = t / ("sq_" + encoding);
    squash_ok(root, 1, 2, out);
    check_squash_applies(out, ckpts, 1, 2, t / "local");
  }
}

// ---- 7. context entries, and --squash-base --------------------------------------

namespace {

// --squash-base CKPT, as squash_ok's extra options.
std::vector<std::string> on_base(const fs::path& ckpt) { return {"--squash-base", ckpt.string()}; }

// delta-diff --encoding context (and `extra`) A B OUT as one delta of versions base -> version:
// what a squash with --squash-base A must write.
void direct_context(const fs::path& a, const fs::path& b, const fs::path& out, int base, int version,
                    const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args{"-q",
                                "--no-sync",
                                "--encoding",
                                "context",
                                "--delta-version",
                                std::to_string(version),
                                "--base-version",
                                std::to_string(base)};
  args.insert(args.end(), extra.begin(), extra.end());
  for (const auto& p : {a, b, out}) args.push_back(p.string());
  fs::create_directories(out.parent_path());
  E2E_REQUIRE_CODE(diff(args), 0);
}

// Every entry of `delta` has encoding `enc` (from hfdelta_encodings, or the
// delta's one encoding).
bool all_entries(const fs::path& delta, const std::string& enc) {
  const json m = delta_index(delta)["metadata"];
  const json wm = delta_index(delta)["weight_map"];
  for (auto it = wm.begin(); it != wm.end(); ++it) {
    const std::string e = m.contains("hfdelta_encodings") ? m["hfdelta_encodings"][it.key()].get<std::string>()
                                                          : m["delta_encoding"].get<std::string>();
    if (e != enc) return false;
  }
  return !wm.empty();
}

// Saves 0..n of a generated series, every tensor changing at every save.
std::vector<fs::path> series_checkpoints(const fs::path& dir, int n) {
  const fs::path series = gen_series(dir, n, {"--max-shard-size", "300kb"});
  std::vector<fs::path> ckpts;
  for (int k = 0; k <= n; ++k) ckpts.push_back(save_dir(series, k));
  return ckpts;
}

}  // namespace

TEST_CASE(
    "squash: a chain of context deltas stays stacked, and with --squash-base is the direct context diff byte for "
    "byte") {
  TempDir t;
  const int n = 3;
  const std::vector<fs::path> ckpts = series_checkpoints(t / "series", n);
  const fs::path root = t / "root";
  write_chain(ckpts, root, "context");
  check_chain(ckpts, root, t / "chain_local");
  const std::set<std::string> changed = entry_names(version_dir(root, 1));
  REQUIRE(changed.size() >= 10);

  // Without the base's checkpoint: each context entry a stacked layer of its own.
  const json plain = squash_ok(root, 1, n, t / "plain");
  CHECK(plain["entries_stacked"] == changed.size());
  CHECK(all_entries(t / "plain", "stack"));
  CHECK(inspected(t / "plain", *changed.begin())["stack_parts"] == n);
  check_squash_applies(t / "plain", ckpts, 1, n, t / "local");

  // With it: one context entry per tensor, exactly what diffing the first
  // base's checkpoint against the last one writes (the index, its
  // checksums, every delta file and the completion marker), at any level.
  for (const std::string level : {"", "7"}) {
    CAPTURE(level);
    const std::vector<std::string> lv =
        level.empty() ? std::vector<std::string>{} : std::vector<std::string>{"--level", level};
    for (const auto& range : std::vector<std::pair<int, int>>{{1, n}, {2, n}}) {
      const int a = range.first, b = range.second;
      CAPTURE(a);
      CAPTURE(b);
      const fs::path out = t / ("sq" + level) / squash_name(a, b), direct = t / ("direct" + level) / squash_name(a, b);
      std::vector<std::string> extra = on_base(ckpts[a - 1]);
      extra.insert(extra.end(), lv.begin(), lv.end());
      const json j = squash_ok(root, a, b, out, true, -1, extra);
      CHECK(j["entries"] == changed.size());
      CHECK(j["entries_composed"] == changed.size());
      CHECK(j["entries_stacked"] == 0);
      CHECK(delta_index(out)["metadata"]["delta_encoding"] == "context");
      CHECK(all_entries(out, "context"));
      direct_context(ckpts[a - 1], ckpts[b], direct, a - 1, b, lv);
      E2E_CHECK_TREE_EQUAL(out, direct);
      CHECK(j["delta_bytes"].get<std::uint64_t>() < plain["delta_bytes"].get<std::uint64_t>());
      check_squash_applies(out, ckpts, a, b, t / "local");
    }
  }
  // A trailing slash on CKPT is harmless.
  squash_ok(root, 1, n, t / "slash", true, -1, {"--squash-base", ckpts[0].string() + "/"});
  E2E_CHECK_TREE_EQUAL(t / "slash", t / "sq" / squash_name(1, n));
}

TEST_CASE("squash: --squash-base composes a mixed chain with context entries into one context entry per tensor") {
  TempDir t;
  const std::vector<fs::path> ckpts = series_checkpoints(t / "series", 3);
  struct Case {
    std::vector<std::string> encodings;
  };
  Case c;
  SUBCASE("sparse, context") { c = {{"sparse", "context"}}; }
  SUBCASE("context, xor, sparse") { c = {{"context", "xor", "sparse"}}; }
  SUBCASE("auto, overwrite, context") { c = {{"auto", "overwrite", "context"}}; }
  const std::string encodings = joined(c.encodings);
  CAPTURE(encodings);
  const int n = static_cast<int>(c.encodings.size());
  const fs::path root = t / "root";
  write_mixed_chain(ckpts, root, c.encodings);
  check_chain({ckpts.begin(), ckpts.begin() + n + 1}, root, t / "chain_local");
  const std::set<std::string> changed = entry_names(version_dir(root, 1));

  // Without CKPT: a stack of parts for each tensor, which applies.
  const json plain = squash_ok(root, 1, n, t / "plain");
  CHECK(plain["entries_stacked"] == changed.size());
  check_squash_applies(t / "plain", ckpts, 1, n, t / "local");

  const json j = squash_ok(root, 1, n, t / "sq", true, -1, on_base(ckpts[0]));
  CHECK(j["entries_stacked"] == 0);
  CHECK(j["entries_composed"] == changed.size());
  CHECK(all_entries(t / "sq", "context"));
  direct_context(ckpts[0], ckpts[n], t / "direct", 0, n);
  E2E_CHECK_TREE_EQUAL(t / "sq", t / "direct");
  check_squash_applies(t / "sq", ckpts, 1, n, t / "local");
}

TEST_CASE("squash: --squash-base changes nothing for tensors without context entries") {
  // Chains of other encodings (stacked or composed without CKPT) give the
  // same bytes with the option as without.
  TempDir t;
  const std::vector<fs::path> ckpts = series_checkpoints(t / "series", 3);
  std::vector<std::string> encs;
  SUBCASE("xor, sparse, sparse") { encs = {"xor", "sparse", "sparse"}; }
  SUBCASE("sparse") { encs = {"sparse", "sparse", "sparse"}; }
  SUBCASE("overwrite, xor") { encs = {"overwrite", "xor"}; }
  const std::string encodings = joined(encs);
  CAPTURE(encodings);
  const int n = static_cast<int>(encs.size());
  const fs::path root = t / "root";
  write_mixed_chain(ckpts, root, encs);
  const json plain = squash_ok(root, 1, n, t / "plain");
  const json with = squash_ok(root, 1, n, t / "with", true, -1, on_base(ckpts[0]));
  E2E_CHECK_TREE_EQUAL(t / "with", t / "plain");
  for (const char* k : {"entries", "entries_composed", "entries_stacked", "entries_dropped", "delta_bytes"})
    CHECK_MESSAGE(with[k] == plain[k], k);
}

TEST_CASE("squash: a tensor created or changed once keeps its context entry, and changes that cancel out leave none") {
  TempDir t;
  std::vector<Ckpt> cs{three_tensors()};
  cs.push_back(cs.back());  // 1: keep.a and flip.b change, a tensor is added (its file built)
  poke(cs.back(), "keep.a", {3, 40}, 0x11);
  poke(cs.back(), "flip.b", {0, 17, 200}, 0x5a);
  cs.back().add("fresh.d", "F32", {16}, random_bytes(64, 31), "model-00002-of-00002.safetensors");
  cs.push_back(cs.back());  // 2: flip.b back, keep.a and fresh.d change
  cs.back().at("flip.b").bytes = cs[0].at("flip.b").bytes;
  poke(cs.back(), "keep.a", {3, 100}, 0x22);
  poke(cs.back(), "fresh.d", {0, 33}, 0x0f);
  cs.push_back(cs.back());  // 3: still.c changes, once
  poke(cs.back(), "still.c", {5}, 0x80);
  const std::vector<fs::path> ckpts = save_all(cs, t / "ckpt");
  const fs::path root = t / "root";
  write_chain(ckpts, root, "context");
  check_chain(ckpts, root, t / "chain_local");
  const json j = squash_ok(root, 1, 3, t / "sq", true, -1, on_base(ckpts[0]));
  CHECK(entry_names(t / "sq") == std::set<std::string>{"fresh.d", "keep.a", "still.c"});
  CHECK(j["entries_dropped"] == 1);  // flip.b
  CHECK(j["entries_stacked"] == 0);
  const json m = delta_index(t / "sq")["metadata"];
  CHECK(m["hfdelta_encodings"]["keep.a"] == "context");   // composed on the base
  CHECK(m["hfdelta_encodings"]["still.c"] == "context");  // one entry, as it is
  CHECK(m["hfdelta_encodings"]["fresh.d"] == "xor");      // from zeros: its bytes, as before
  CHECK(m["hfdelta_base_checksums"]["keep.a"] == xxh3_hex(cs[0].at("keep.a").bytes));
  check_squash_applies(t / "sq", ckpts, 1, 3, t / "local");
}

TEST_CASE("squash: every sub-range of a structural chain of context deltas applies, squashed with --squash-base") {
  // Renames, retypes, reshards and built files around context entries: the
  // origin tensor is read under its first name, and the encoded entry uses
  // the last version's dtype. Each entry is the direct context diff's of the
  // same tensor over the same base bytes (the weight-file operations around
  // them may differ: the chain's, composed, against the direct diff's own).
  const auto t = scratch_dir();
  const int n = 6;
  const fs::path series = gen_series(t->path() / "series", n, {"--max-shard-size", "300kb"});
  const std::vector<fs::path> ckpts = structured_chain(series, t->path() / "ckpt", n);
  const fs::path root = t->path() / "root";
  write_chain(ckpts, root, "context");
  check_chain(ckpts, root, t->path() / "chain_local");
  for (int a = 1; a <= n; ++a)
    for (int b = a + 1; b <= n; ++b) {
      CAPTURE(a);
      CAPTURE(b);
      const fs::path out = t->path() / "squashed" / squash_name(a, b);
      const json j = squash_ok(root, a, b, out, true, -1, on_base(ckpts[a - 1]));
      CHECK(j["entries_composed"].get<int>() >= 1);
      check_squash_applies(out, ckpts, a, b, t->path() / "local");
      const fs::path direct = t->path() / "direct" / squash_name(a, b);
      direct_context(ckpts[a - 1], ckpts[b], direct, a - 1, b);
      const json is = delta_index(out), id = delta_index(direct);
      int compared = 0;
      for (auto it = is["weight_map"].begin(); it != is["weight_map"].end(); ++it) {
        const std::string name = it.key();
        CAPTURE(name);
        const json& sb = is["metadata"]["hfdelta_base_checksums"];
        const json& db = id["metadata"]["hfdelta_base_checksums"];
        if (!id["weight_map"].contains(name) || !sb.contains(name) || !db.contains(name) || sb[name] != db[name])
          continue;
        CHECK(read_st(out / it->get<std::string>()).tensor(name) ==
              read_st(direct / id["weight_map"][name].get<std::string>()).tensor(name));
        ++compared;
      }
      CHECK(compared >= 10);
    }
}

TEST_CASE("squash: --squash-base that is not the chain's first base is refused (exit 5), OUT not created") {
  TempDir t;
  const std::vector<fs::path> ckpts = series_checkpoints(t / "series", 3);
  const fs::path root = t / "root";
  write_chain(ckpts, root, "context");
  const fs::path out = t / "out" / "squashed";
  const auto args = [&](const fs::path& base) {
    std::vector<std::string> a = on_base(base);
    for (const auto& x : squash_args(version_dir(root, 1), version_dir(root, 3), out)) a.push_back(x);
    return a;
  };
  SUBCASE("another save of the series") {
    // Each tensor read from CKPT names CKPT's weight file and the tensor.
    check_refused(args(ckpts[1]), 5,
                  {ckpts[1].string() + "/model-0000", "tensor '", "not the checkpoint of the chain's first base"}, out,
                  root);
  }
  SUBCASE("the last save") { check_refused(args(ckpts[3]), 5, {ckpts[3].string(), "tensor '"}, out, root); }
  SUBCASE("a checkpoint without the chain's tensors") {
    Ckpt c = three_tensors();
    c.save(t / "other");
    check_refused(args(t / "other"), 5, {(t / "other").string(), "has no tensor '"}, out, root);
  }
  SUBCASE("a delta version") {
    check_refused(args(version_dir(root, 1)), 3, {version_dir(root, 1).string(), "delta version"}, out, root);
  }
  SUBCASE("a directory that does not exist") {
    check_refused(args(t / "nowhere"), 2, {(t / "nowhere").string()}, out, root);
  }
}

TEST_CASE(
    "squash: with --squash-base, an entry that does not give the checksum its delta records is refused (exit 5)") {
  // weight_v000003's recorded checksum of one tensor, one hex digit changed
  // (the header keeps its length): composed on the real bytes, the entry
  // laid gives another checksum, and no squash is written. (The newest
  // version of the chain: a checksum changed in an earlier one breaks the
  // chain's connection first, exit 3.)
  TempDir t;
  const std::vector<fs::path> ckpts = series_checkpoints(t / "series", 3);
  const fs::path root = t / "root";
  write_chain(ckpts, root, "context");
  const fs::path v2 = version_dir(root, 3);
  const json idx = delta_index(v2);
  const std::string tensor = idx["weight_map"].begin().key(), file = idx["weight_map"].begin()->get<std::string>();
  Bytes raw = read_bytes(v2 / file);
  const StFile st = read_st(v2 / file);
  const std::string hex = st.metadata()[tensor].get<std::string>();
  const std::string text(raw.begin(), raw.begin() + static_cast<std::ptrdiff_t>(st.data_start()));
  const std::size_t at = text.find("\"" + hex + "\"");
  REQUIRE(at != std::string::npos);
  raw[at + 1] = hex[0] == '0' ? '1' : '0';
  write_bytes(v2 / file, raw);
  reseal_marker(v2);  // a publisher's bad checksum, sealed: the squash's own check answers
  const fs::path out = t / "out" / "squashed";
  std::vector<std::string> args = on_base(ckpts[0]);
  for (const auto& x : squash_args(version_dir(root, 1), version_dir(root, 3), out)) args.push_back(x);
  check_refused(args, 5, {v2.string(), "'" + tensor + "'", "the delta records"}, out, root);
}

TEST_CASE("squash: --squash-base without --squash is refused (exit 2)") {
  TempDir t;
  const std::vector<fs::path> ckpts = refusal_checkpoints(t / "ckpt");
  fs::create_directories(t / "root");
  const fs::path out = t / "root" / "weight_v000001";
  check_refused({"--no-sync", "--squash-base", ckpts[0].string(), ckpts[0].string(), ckpts[1].string(), out.string()},
                2, {"--squash-base", "--squash"}, out, t / "root");
}
