// End-to-end: structural deltas. BASE and NEW differ in their tensors (added,
// removed, renamed, reshaped, retyped, moved), their weight files (headers,
// number, names, single file or sharded) or their other files; delta-diff
// writes a delta, delta-apply brings LOCAL to NEW byte for byte. Each delta
// is also checked against the rules of its format: which weight files are
// built, rewritten or removed, where each built tensor comes from, which
// tensors travel.
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <set>
#include <sstream>

#include "ckpt_edit.hpp"
#include "e2e_util.hpp"

using namespace e2e;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// ---- reading checkpoints as delta-diff sees them ------------------------------

// Weight files of a checkpoint directory: those its index names, or without
// an index every top-level .safetensors file.
std::set<std::string> weight_files_of(const fs::path& dir) {
  std::set<std::string> s;
  if (fs::exists(dir / kIndexName)) {
    const json idx = read_json(dir / kIndexName);
    for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) s.insert(it->get<std::string>());
  } else {
    for (const auto& f : list_names(dir))
      if (ends_with(f, ".safetensors") && fs::is_regular_file(dir / f)) s.insert(f);
  }
  return s;
}

struct StTensor {
  std::string name, file;
  std::uint64_t begin = 0, end = 0;  // in the file
  Bytes bytes;
};

struct StView {
  std::uint64_t header_len = 0, size = 0;
  Bytes prefix;                   // 8-byte length and header
  std::vector<StTensor> tensors;  // by data offset
};

struct CkptView {
  std::map<std::string, StView> files;
  std::map<std::string, StTensor> tensors;
};

CkptView view_of(const fs::path& dir) {
  CkptView v;
  for (const auto& f : weight_files_of(dir)) {
    const StFile st = read_st(dir / f);
    StView& sv = v.files[f];
    sv.header_len = st.header_len;
    sv.size = st.raw.size();
    sv.prefix.assign(st.raw.begin(), st.raw.begin() + static_cast<std::ptrdiff_t>(st.data_start()));
    for (const auto& n : st.tensor_names()) {
      const auto [b, e] = st.file_range(n);
      sv.tensors.push_back({n, f, b, e, st.tensor(n)});
    }
    std::stable_sort(sv.tensors.begin(), sv.tensors.end(), [](const StTensor& x, const StTensor& y) {
      return x.begin != y.begin ? x.begin < y.begin : x.end < y.end;
    });
    for (const auto& t : sv.tensors) v.tensors[t.name] = t;
  }
  return v;
}

// What the format says must happen to each weight file: "" (patched in
// place), "header", "build" or "remove".
std::map<std::string, std::string> expected_ops(const CkptView& base, const CkptView& target) {
  std::map<std::string, std::string> ops;
  for (const auto& [f, nv] : target.files) {
    auto b = base.files.find(f);
    if (b == base.files.end()) {
      ops[f] = "build";
      continue;
    }
    const StView& bv = b->second;
    if (bv.prefix == nv.prefix) {
      ops[f] = "";
      continue;
    }
    bool same = bv.header_len == nv.header_len && bv.size == nv.size && bv.tensors.size() == nv.tensors.size();
    for (std::size_t i = 0; same && i < nv.tensors.size(); ++i)
      same = bv.tensors[i].begin == nv.tensors[i].begin && bv.tensors[i].end == nv.tensors[i].end;
    ops[f] = same ? "header" : "build";
  }
  for (const auto& [f, bv] : base.files)
    if (!target.files.count(f)) ops[f] = "remove";
  return ops;
}

bool all_zero(const Bytes& b) {
  return std::all_of(b.begin(), b.end(), [](std::uint8_t c) { return c == 0; });
}

const json& shard_entry(const json& index, const std::string& file) {
  for (const auto& e : index["metadata"]["hfdelta_shards"])
    if (e["file"] == file) return e;
  throw std::runtime_error("no hfdelta_shards entry for " + file);
}

// The "from" of a tensor of a built file ("" when it has none).
std::string from_of(const json& index, const std::string& file, const std::string& tensor) {
  for (const auto& t : shard_entry(index, file)["tensors"])
    if (t["name"] == tensor) return t.contains("from") ? t["from"].get<std::string>() : std::string();
  throw std::runtime_error("tensor '" + tensor + "' not listed for " + file);
}

std::set<std::string> entries_of(const json& index) {
  std::set<std::string> s;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) s.insert(it.key());
  return s;
}

std::string describe(const std::set<std::string>& s) {
  std::string o = "{";
  for (const auto& x : s) o += (o.size() > 1 ? ", " : "") + x;
  return o + "}";
}

// Checks a delta against the rules of the format, from BASE and NEW alone:
// which weight files get which operation, the new headers it carries, where
// each tensor of a built file comes from, and exactly which tensors have an
// entry (those whose bytes differ from their source; zeros for none).
void check_delta(const fs::path& base_dir, const fs::path& new_dir, const fs::path& delta, const json& summary) {
  const json index = delta_index(delta);
  const json& md = index["metadata"];
  const CkptView base = view_of(base_dir), target = view_of(new_dir);

  const auto want = expected_ops(base, target);
  std::map<std::string, std::string> want_ops;
  for (const auto& [f, op] : want)
    if (!op.empty()) want_ops[f] = op;
  const auto got_ops = ops_of(index);
  CHECK(got_ops == want_ops);
  int built = 0, rewritten = 0, removed = 0;
  for (const auto& [f, op] : got_ops) (op == "build" ? built : op == "header" ? rewritten : removed) += 1;
  const json& st = summary["structure"];
  CHECK(st["weight_files_built"] == built);
  CHECK(st["headers_rewritten"] == rewritten);
  CHECK(st["weight_files_removed"] == removed);

  if (!got_ops.empty()) {
    // Structural: revision 3, or 5 where some entry is a context entry (auto's choice).
    bool context = false;
    for (const auto& [name, enc] : md["hfdelta_encodings"].items()) context = context || enc == "context";
    CHECK(md["hfdelta_format"] == (context ? 5 : 3));
    CHECK(md["delta_encoding"] == "auto");
    for (const auto& name : entries_of(index)) CHECK_MESSAGE(md["hfdelta_encodings"].contains(name), name);
  } else {
    CHECK_FALSE(md.contains("hfdelta_shards"));
  }

  std::set<std::string> expect_entries;
  std::uint64_t fresh = 0;
  for (const auto& [file, nv] : target.files) {
    const std::string& f = file;  // INFO below captures it: clang 14 cannot capture a structured binding
    const std::string op = want.at(f);
    if (op == "header" || op == "build") {
      // The new header travels byte for byte.
      const json& e = shard_entry(index, f);
      const fs::path hp = delta / "headers" / f;
      REQUIRE_MESSAGE(fs::is_regular_file(hp), hp);
      CHECK(read_bytes(hp) == nv.prefix);
      CHECK(e["header"]["size"] == nv.prefix.size());
      CHECK(e["header"]["xxh3-128"] == xxh3_hex(nv.prefix));
      if (op == "header") CHECK(e["base_header"] == xxh3_hex(base.files.at(f).prefix));
    }
    if (op.empty()) {
      for (const auto& t : nv.tensors)
        if (t.bytes != base.tensors.at(t.name).bytes) expect_entries.insert(t.name);
    } else if (op == "header") {
      // Tensors are patched in place: each from the base tensor at its range.
      const StView& bv = base.files.at(f);
      for (std::size_t i = 0; i < nv.tensors.size(); ++i)
        if (nv.tensors[i].bytes != bv.tensors[i].bytes) expect_entries.insert(nv.tensors[i].name);
    } else {
      const json& e = shard_entry(index, f);
      CHECK(e["size"] == nv.size);
      REQUIRE(e["tensors"].size() == nv.tensors.size());
      for (std::size_t i = 0; i < nv.tensors.size(); ++i) {
        // In data order; 0-byte tensors at one offset may come in any order.
        const json& et = e["tensors"][i];
        const std::string name = et["name"].get<std::string>();
        REQUIRE_MESSAGE(target.tensors.count(name), name);
        const StTensor& t = target.tensors.at(name);
        CHECK(t.file == f);
        CHECK((t.begin == nv.tensors[i].begin && t.end == nv.tensors[i].end));
        CHECK(et["xxh3-128"] == xxh3_hex(t.bytes));
        const std::string from = et.contains("from") ? et["from"].get<std::string>() : "";
        INFO("built tensor '" << t.name << "' of " << f << ", from '" << from << "'");
        auto same = base.tensors.find(t.name);
        if (same != base.tensors.end() && same->second.bytes.size() == t.bytes.size()) {
          CHECK(from == t.name);  // same name and length
        } else if (!t.bytes.empty()) {
          // A vanished base tensor with the very same bytes is a rename or a
          // move: it is referenced, never re-sent.
          bool vanished_copy = false;
          for (const auto& [bn, bt] : base.tensors)
            vanished_copy = vanished_copy || (!target.tensors.count(bn) && bt.bytes == t.bytes);
          if (vanished_copy) CHECK(!from.empty());
        }
        if (!from.empty()) {
          REQUIRE(base.tensors.count(from));
          CHECK(base.tensors.at(from).bytes.size() == t.bytes.size());
          if (from != t.name) CHECK_FALSE(target.tensors.count(from));
          if (base.tensors.at(from).bytes != t.bytes) expect_entries.insert(t.name);
        } else {
          fresh += 1;
          if (!all_zero(t.bytes)) expect_entries.insert(t.name);
        }
      }
    }
  }
  CHECK_MESSAGE(entries_of(index) == expect_entries,
                "weight_map " << describe(entries_of(index)) << ", expected " << describe(expect_entries));
  CHECK(st["tensors_new"] == fresh);
}

// Every directory below dir, relative, .weight_sync/ left out.
std::set<std::string> dirs_of(const fs::path& dir) {
  std::set<std::string> s;
  for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator(); ++it) {
    if (!fs::is_directory(it->symlink_status())) continue;
    if (it.depth() == 0 && it->path().filename() == ".weight_sync") {
      it.disable_recursion_pending();
      continue;
    }
    s.insert(fs::relative(it->path(), dir).generic_string());
  }
  return s;
}

// LOCAL is NEW byte for byte (directories included: none left empty), --verify
// agrees, nothing is left over in LOCAL or its state directory.
void check_local(const fs::path& local, const fs::path& target) {
  E2E_CHECK_TREE_EQUAL(local, target);
  CHECK_MESSAGE(dirs_of(local) == dirs_of(target),
                "directories " << describe(dirs_of(local)) << ", expected " << describe(dirs_of(target)));
  E2E_CHECK_CODE(apply({"--verify", local.string()}), 0);
  CHECK_FALSE(has_txn(local));
  const std::string v = state_version(local);
  for (const auto& f : list_files(local / ".weight_sync"))
    CHECK_MESSAGE((f == "lock" || f == "state.json" || f == "checksums/" + v + ".json"), "left in .weight_sync: " << f);
}

// ---- one diff and apply ---------------------------------------------------------

struct Variant {
  std::string encoding;  // "" for the default
  bool no_sync = false;
};

std::vector<Variant> plain_variants() { return {{"", false}, {"", true}}; }
std::vector<Variant> all_variants() {
  return {{"", false}, {"", true}, {"xor", false}, {"overwrite", true}, {"auto", false}};
}

struct Outcome {
  json summary;  // delta-diff --json
  json index;    // the delta's index
  fs::path delta;
  std::uint64_t delta_bytes = 0;
};

std::vector<std::string> variant_args(const Variant& v) {
  std::vector<std::string> a;
  if (!v.encoding.empty()) a.insert(a.end(), {"--encoding", v.encoding});
  if (v.no_sync) a.push_back("--no-sync");
  return a;
}

// Diffs BASE -> NEW into WORK/root/weight_v000001, initialises WORK/local
// from BASE, applies, and checks the delta, LOCAL and a repeated apply.
Outcome round_trip(const fs::path& base, const fs::path& target, const fs::path& work, const Variant& v) {
  INFO("encoding " << (v.encoding.empty() ? "default" : v.encoding) << (v.no_sync ? ", --no-sync" : ""));
  Outcome o;
  fs::create_directories(work / "root");
  o.delta = version_dir(work / "root", 1);
  std::vector<std::string> args{"--json"};
  for (const auto& a : variant_args(v)) args.push_back(a);
  args.insert(args.end(), {base.string(), target.string(), o.delta.string()});
  const RunResult d = diff(args);
  E2E_REQUIRE_CODE(d, 0);
  o.summary = parse_json(d.out);
  o.index = delta_index(o.delta);
  o.delta_bytes = tree_size(o.delta);
  check_delta(base, target, o.delta, o.summary);

  const fs::path local = work / "local";
  E2E_REQUIRE_CODE(apply({"-q", "--init", base.string(), local.string()}), 0);
  std::vector<std::string> aargs{"-q"};
  if (v.no_sync) aargs.push_back("--no-sync");
  aargs.insert(aargs.end(), {o.delta.string(), local.string()});
  E2E_REQUIRE_CODE(apply(aargs), 0);
  CHECK(state_version(local) == "000001");
  check_local(local, target);
  // Removed weight files are gone (unless NEW has a plain file of that name).
  for (const auto& entry : ops_of(o.index)) {
    const std::string& f = entry.first;  // a plain reference: CHECK_MESSAGE captures it
    if (entry.second == "remove" && !fs::exists(target / f)) CHECK_MESSAGE(!fs::exists(local / f), f);
  }

  // The same delta again: nothing to do, nothing changed.
  const LocalSnapshot snap(local);
  E2E_CHECK_CODE(apply(aargs), 0);
  E2E_CHECK_UNCHANGED(snap);
  return o;
}

// Round trips of BASE -> NEW for every variant; the first variant's outcome.
Outcome round_trips(const fs::path& base, const fs::path& target, const fs::path& work,
                    const std::vector<Variant>& variants = plain_variants()) {
  Outcome first;
  for (std::size_t i = 0; i < variants.size(); ++i) {
    Outcome o = round_trip(base, target, work / ("variant-" + std::to_string(i)), variants[i]);
    if (i == 0) first = std::move(o);
  }
  return first;
}

// ---- a hand-made base ----------------------------------------------------------

const std::string F1 = "model-00001-of-00003.safetensors";
const std::string F2 = "model-00002-of-00003.safetensors";
const std::string F3 = "model-00003-of-00003.safetensors";
constexpr std::size_t kBig = 64 * 1024;  // model.big.weight: random bytes, so it compresses to about itself

// Three weight files, several dtypes, a scalar and a 0-byte tensor, other
// files in the top directory and a subdirectory.
Ckpt hand_base() {
  Ckpt c;
  c.add("model.big.weight", "BF16", {128, 256}, random_bytes(kBig, 1), F1);
  c.add("model.a.weight", "F16", {4, 8}, random_bytes(64, 2), F1);
  c.add("model.norm.weight", "F32", {32}, random_bytes(128, 3), F1);
  c.add("model.b.weight", "BF16", {8, 8}, random_bytes(128, 4), F2);
  c.add("model.c.bias", "F32", {16}, random_bytes(64, 5), F2);
  c.add("model.k.weight", "F32", {4, 4}, random_bytes(64, 11), F2);
  c.add("model.q.weight", "F32", {16}, random_bytes(64, 12), F2);
  c.add("model.scalar", "F32", {}, random_bytes(4, 6), F2);
  c.add("model.empty", "F16", {0, 4}, {}, F2);
  c.add("model.d.weight", "F16", {32, 32}, random_bytes(2048, 7), F3);
  c.add("model.e.index", "I64", {8}, random_bytes(64, 8), F3);
  c.add("lm_head.weight", "BF16", {64, 64}, random_bytes(8192, 9), F3);
  for (const auto& f : {F1, F2, F3}) c.metadata[f] = {{"format", "pt"}};
  c.files["config.json"] = "{\n  \"model_type\": \"test\",\n  \"hidden_size\": 64\n}\n";
  c.files["generation_config.json"] = "{\n  \"max_length\": 32\n}\n";
  c.files["tokenizer/tokenizer.json"] = "{\"vocab\": [\"a\", \"b\"]}\n";
  return c;
}

// A BASE and a NEW made from it, written under a temporary directory (in
// memory where possible: the many flushes are exercised, not their effect).
struct Pair {
  std::unique_ptr<TempDir> tmp = scratch_dir();
  const TempDir& t = *tmp;
  Ckpt base = hand_base();
  Ckpt next;
  fs::path base_dir() const { return t / "base"; }
  fs::path new_dir() const { return t / "new"; }
  void write() {
    base.save(base_dir());
    next.save(new_dir());
  }
  Outcome check(const std::vector<Variant>& variants = plain_variants()) {
    return round_trips(base_dir(), new_dir(), t / "work", variants);
  }
};

std::map<std::string, std::string> ops(std::initializer_list<std::pair<const std::string, std::string>> l) { return l; }

void flip(Bytes& b, std::size_t count, std::uint64_t seed) {
  const Bytes r = random_bytes(count * 2, seed);
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t at = ((std::size_t{r[2 * i]} << 8) | r[2 * i + 1]) % b.size();
    b[at] ^= static_cast<std::uint8_t>(r[2 * i] | 1);
  }
}

}  // namespace

// ---- one kind of difference at a time ----------------------------------------------

TEST_CASE("structure: a tensor added") {
  Pair p;
  p.next = p.base;
  SUBCASE("to an existing weight file") {
    p.next.add("model.added.weight", "F32", {3, 5}, random_bytes(60, 20), F2);
    p.write();
    const Outcome o = p.check(all_variants());
    CHECK(ops_of(o.index) == ops({{F2, "build"}}));
    CHECK(entries_of(o.index) == std::set<std::string>{"model.added.weight"});
    CHECK(from_of(o.index, F2, "model.added.weight").empty());
    CHECK(from_of(o.index, F2, "model.b.weight") == "model.b.weight");
    CHECK(o.summary["structure"]["tensors_new"] == 1);
  }
  SUBCASE("in a new weight file") {
    p.next.add("model.added.weight", "BF16", {16}, random_bytes(32, 21), "model-00004-of-00004.safetensors");
    p.write();
    const Outcome o = p.check();
    CHECK(ops_of(o.index) == ops({{"model-00004-of-00004.safetensors", "build"}}));
    CHECK(entries_of(o.index) == std::set<std::string>{"model.added.weight"});
  }
  SUBCASE("all zeros: built from zeros, no entry") {
    p.next.add("model.zeros", "F32", {8, 8}, Bytes(256, 0), F3);
    p.write();
    const Outcome o = p.check();
    CHECK(ops_of(o.index) == ops({{F3, "build"}}));
    CHECK(entries_of(o.index).empty());
    CHECK(from_of(o.index, F3, "model.zeros").empty());
  }
}

TEST_CASE("structure: a tensor removed") {
  Pair p;
  p.next = p.base;
  SUBCASE("from a weight file that keeps others") {
    p.next.remove("model.c.bias");
    p.write();
    const Outcome o = p.check(all_variants());
    CHECK(ops_of(o.index) == ops({{F2, "build"}}));
    CHECK(entries_of(o.index).empty());
    CHECK(o.summary["structure"]["tensors_new"] == 0);
  }
  SUBCASE("every tensor of a weight file: the file is removed") {
    for (const auto& n : p.base.tensors_in(F3)) p.next.remove(n);
    p.write();
    const Outcome o = p.check();
    CHECK(ops_of(o.index) == ops({{F3, "remove"}}));
    CHECK(o.summary["structure"]["weight_files_removed"] == 1);
    CHECK(entries_of(o.index).empty());
  }
}

TEST_CASE("structure: a tensor renamed, bytes unchanged: referenced, not re-sent") {
  Pair p;
  p.next = p.base;
  SUBCASE("to a longer name: its weight file is built, the tensor copied from the old name") {
    p.next.rename("model.big.weight", "model.layers.0.renamed_big.weight");
    p.write();
    const Outcome o = p.check(all_variants());
    CHECK(ops_of(o.index) == ops({{F1, "build"}}));
    CHECK(from_of(o.index, F1, "model.layers.0.renamed_big.weight") == "model.big.weight");
    CHECK_FALSE(o.index["weight_map"].contains("model.layers.0.renamed_big.weight"));
    CHECK(entries_of(o.index).empty());
    CHECK(o.summary["structure"]["tensors_new"] == 0);
    CHECK(o.delta_bytes < kBig / 4);
  }
  SUBCASE("to a name as long: only the header is rewritten") {
    p.next.rename("model.big.weight", "model.fat.weight");
    p.write();
    const Outcome o = p.check(all_variants());
    CHECK(ops_of(o.index) == ops({{F1, "header"}}));
    CHECK(entries_of(o.index).empty());
    CHECK(o.summary["structure"]["headers_rewritten"] == 1);
    CHECK(o.summary["structure"]["weight_files_built"] == 0);
    CHECK(o.delta_bytes < kBig / 4);
  }
}

TEST_CASE("structure: a tensor renamed with changed bytes: its entry is against the old tensor") {
  Pair p;
  p.next = p.base;
  p.next.rename("model.big.weight", "model.layers.0.huge.weight");
  flip(p.next.at("model.layers.0.huge.weight").bytes, 16, 30);
  p.write();
  const Outcome o = p.check(all_variants());
  CHECK(ops_of(o.index) == ops({{F1, "build"}}));
  CHECK(from_of(o.index, F1, "model.layers.0.huge.weight") == "model.big.weight");
  CHECK(entries_of(o.index) == std::set<std::string>{"model.layers.0.huge.weight"});
  CHECK(o.summary["structure"]["tensors_new"] == 0);
  CHECK(o.delta_bytes < kBig / 4);
}

TEST_CASE("structure: a tensor reshaped (same byte count)") {
  Pair p;
  p.next = p.base;
  SUBCASE("a shape written as long: header rewritten, nothing re-sent") {
    p.next.at("model.a.weight").shape = {8, 4};
    p.write();
    const Outcome o = p.check(all_variants());
    CHECK(ops_of(o.index) == ops({{F1, "header"}}));
    CHECK(entries_of(o.index).empty());
  }
  SUBCASE("another rank") {
    p.next.at("model.d.weight").shape = {2, 16, 32};
    p.write();
    const Outcome o = p.check();
    CHECK(entries_of(o.index).empty());
  }
  SUBCASE("a scalar becomes [1], the 0-byte tensor [4, 0]") {
    p.next.at("model.scalar").shape = {1};
    p.next.at("model.empty").shape = {4, 0};
    p.write();
    const Outcome o = p.check();
    CHECK(entries_of(o.index).empty());
  }
}

TEST_CASE("structure: a tensor retyped") {
  Pair p;
  p.next = p.base;
  SUBCASE("same size (F16 -> BF16): bytes kept, nothing re-sent") {
    p.next.at("model.d.weight").dtype = "BF16";
    p.write();
    const Outcome o = p.check(all_variants());
    CHECK_FALSE(ops_of(o.index).empty());
    CHECK(entries_of(o.index).empty());
  }
  SUBCASE("another size (F32 -> BF16): built from zeros") {
    CkptTensor& t = p.next.at("model.norm.weight");
    t.dtype = "BF16";
    t.bytes = random_bytes(64, 40);
    p.write();
    const Outcome o = p.check(all_variants());
    CHECK(ops_of(o.index) == ops({{F1, "build"}}));
    CHECK(from_of(o.index, F1, "model.norm.weight").empty());
    CHECK(entries_of(o.index) == std::set<std::string>{"model.norm.weight"});
    CHECK(o.summary["structure"]["tensors_new"] == 1);
  }
  SUBCASE("a scalar F32 -> F64") {
    CkptTensor& t = p.next.at("model.scalar");
    t.dtype = "F64";
    t.bytes = random_bytes(8, 41);
    p.write();
    const Outcome o = p.check();
    CHECK(ops_of(o.index) == ops({{F2, "build"}}));
    CHECK(entries_of(o.index) == std::set<std::string>{"model.scalar"});
  }
}

TEST_CASE("structure: __metadata__ changed, header length kept: only the header is rewritten") {
  Pair p;
  SUBCASE("a value of the same length") {
    p.next = p.base;
    p.next.metadata[F2]["format"] = "np";
    p.write();
  }
  SUBCASE("its keys in another order") {
    p.base.metadata[F2] = {{"alpha", "2"}, {"format", "pt"}};
    p.next = p.base;
    p.write();
    edit_header_text(p.new_dir() / F2, R"("alpha":"2","format":"pt")", R"("format":"pt","alpha":"2")");
  }
  SUBCASE("two tensors' names swapped (different shapes, same byte ranges): both patched in place") {
    p.next = p.base;
    std::swap(p.next.at("model.k.weight").bytes, p.next.at("model.q.weight").bytes);
    std::swap(p.next.at("model.k.weight").shape, p.next.at("model.q.weight").shape);
    p.write();
  }
  const Outcome o = p.check(all_variants());
  CHECK(ops_of(o.index) == ops({{F2, "header"}}));
  CHECK(o.summary["structure"]["weight_files_built"] == 0);
  CHECK(o.summary["structure"]["headers_rewritten"] == 1);
  CHECK(read_bytes(p.new_dir() / F2).size() == read_bytes(p.base_dir() / F2).size());
}

TEST_CASE("structure: __metadata__ changed with another header length: the file is built from its own tensors") {
  Pair p;
  p.next = p.base;
  SUBCASE("a key added") { p.next.metadata[F1]["training_step"] = "1234567890123456789012345678901234567890"; }
  SUBCASE("__metadata__ removed") { p.next.metadata.erase(F1); }
  p.write();
  const Outcome o = p.check();
  CHECK(ops_of(o.index) == ops({{F1, "build"}}));
  for (const auto& n : p.next.tensors_in(F1)) CHECK(from_of(o.index, F1, n) == n);
  CHECK(entries_of(o.index).empty());
  CHECK(o.delta_bytes < kBig / 4);
}

TEST_CASE("structure: the number of weight files changes (generator save, 5 files -> 2 and 2 -> 5)") {
  const auto tmp = scratch_dir();
  const TempDir& t = *tmp;
  const fs::path s = gen_series(t / "series", 1, {"--max-shard-size", "300kb"});
  const Ckpt save0 = Ckpt::load(save_dir(s, 0));
  REQUIRE(save0.weight_files().size() == 5);
  SUBCASE("5 -> 2, bytes unchanged") {
    Ckpt two = save0;
    two.reshard(2);
    two.save(t / "two");
    const Outcome o = round_trips(save_dir(s, 0), t / "two", t / "work", all_variants());
    std::map<std::string, std::string> want;
    for (const auto& f : save0.weight_files()) want[f] = "remove";
    for (const auto& f : two.weight_files()) want[f] = "build";
    CHECK(ops_of(o.index) == want);
    CHECK(entries_of(o.index).empty());
    CHECK(o.summary["structure"]["tensors_new"] == 0);
    CHECK(o.delta_bytes < tree_size(save_dir(s, 0)) / 20);
  }
  SUBCASE("2 -> 5, with the generator's next step") {
    Ckpt two = save0;
    two.reshard(2);
    two.save(t / "two");
    const Outcome o = round_trips(t / "two", save_dir(s, 1), t / "work", all_variants());
    CHECK(o.summary["structure"]["weight_files_built"] == 5);
    CHECK(o.summary["structure"]["weight_files_removed"] == 2);
    CHECK(o.summary["tensors_changed"].get<int>() > 0);
  }
}

TEST_CASE("structure: a weight file renamed") {
  Pair p;
  p.next = p.base;
  p.next.rename_file(F2, "weights-b.safetensors");
  p.write();
  const Outcome o = p.check(all_variants());
  CHECK(ops_of(o.index) == ops({{F2, "remove"}, {"weights-b.safetensors", "build"}}));
  CHECK(entries_of(o.index).empty());
  for (const auto& n : p.next.tensors_in("weights-b.safetensors"))
    CHECK(from_of(o.index, "weights-b.safetensors", n) == n);
}

TEST_CASE("structure: a tensor moved between weight files, bytes unchanged: referenced, not re-sent") {
  Pair p;
  p.next = p.base;
  std::map<std::string, std::string> want;
  SUBCASE("into another existing file") {
    p.next.move("model.big.weight", F3);
    want = {{F1, "build"}, {F3, "build"}};
  }
  SUBCASE("into a new file") {
    p.next.move("model.big.weight", "model-00004-of-00004.safetensors");
    want = {{F1, "build"}, {"model-00004-of-00004.safetensors", "build"}};
  }
  SUBCASE("two tensors swap files") {
    p.next.move("model.big.weight", F3);
    p.next.move("model.d.weight", F1);
    want = {{F1, "build"}, {F3, "build"}};
  }
  SUBCASE("moved and renamed") {
    p.next.move("model.big.weight", F2);
    p.next.rename("model.big.weight", "model.layers.7.moved.weight");
    want = {{F1, "build"}, {F2, "build"}};
  }
  p.write();
  const Outcome o = p.check(all_variants());
  CHECK(ops_of(o.index) == want);
  CHECK(entries_of(o.index).empty());
  CHECK(o.summary["structure"]["tensors_new"] == 0);
  const std::string name = p.next.has("model.big.weight") ? "model.big.weight" : "model.layers.7.moved.weight";
  CHECK(from_of(o.index, p.next.at(name).file, name) == "model.big.weight");
  CHECK(o.delta_bytes < kBig / 4);
}

TEST_CASE("structure: single file <-> sharded") {
  Pair p;
  Ckpt single = p.base;
  single.to_single_file();
  SUBCASE("sharded -> single file") {
    p.next = single;
    p.write();
    const Outcome o = p.check(all_variants());
    CHECK(ops_of(o.index) == ops({{F1, "remove"}, {F2, "remove"}, {F3, "remove"}, {kSingleFile, "build"}}));
    CHECK(entries_of(o.index).empty());
    CHECK_FALSE(fs::exists(p.t / "work" / "variant-0" / "local" / kIndexName));
  }
  SUBCASE("single file -> sharded") {
    p.next = p.base;
    p.base = single;
    p.write();
    const Outcome o = p.check(all_variants());
    CHECK(ops_of(o.index) == ops({{F1, "build"}, {F2, "build"}, {F3, "build"}, {kSingleFile, "remove"}}));
    CHECK(entries_of(o.index).empty());
  }
  SUBCASE("single file -> single file with a tensor added and one renamed") {
    p.base = single;
    p.next = single;
    p.next.add("model.added", "F16", {7}, random_bytes(14, 50), kSingleFile);
    p.next.rename("model.big.weight", "model.big_renamed.weight");
    p.write();
    const Outcome o = p.check();
    CHECK(ops_of(o.index) == ops({{kSingleFile, "build"}}));
    CHECK(entries_of(o.index) == std::set<std::string>{"model.added"});
    CHECK(from_of(o.index, kSingleFile, "model.big_renamed.weight") == "model.big.weight");
  }
}

TEST_CASE("structure: other files added, changed and removed, in subdirectories too") {
  Pair p;
  p.next = p.base;
  p.next.files["notes.txt"] = "added\n";
  p.next.files["config.json"] = "{\n  \"model_type\": \"test\",\n  \"hidden_size\": 128\n}\n";
  p.next.files.erase("generation_config.json");
  p.next.files["sub/dir/extra.json"] = "{\"deep\": true}\n";
  p.next.files["tokenizer/tokenizer.json"] = "{\"vocab\": [\"a\", \"b\", \"c\"]}\n";
  p.next.files["tokenizer/empty.txt"] = "";
  SUBCASE("weights unchanged") {}
  SUBCASE("with a structural change") { p.next.rename("model.c.bias", "model.c.bias_renamed"); }
  SUBCASE("every file of a subdirectory removed") {
    p.next.files.erase("tokenizer/tokenizer.json");
    p.next.files.erase("tokenizer/empty.txt");
  }
  p.write();
  const Outcome o = p.check(all_variants());
  std::map<std::string, std::string> files;
  for (const auto& f : o.index["metadata"]["hfdelta_files"])
    files[f["path"].get<std::string>()] = f["op"].get<std::string>();
  CHECK(files["notes.txt"] == "put");
  CHECK(files["config.json"] == "put");
  CHECK(files["generation_config.json"] == "remove");
  CHECK(files["sub/dir/extra.json"] == "put");
  for (const auto& [path, op] : files)
    if (op == "put") CHECK(read_file(o.delta / "files" / path) == read_file(p.new_dir() / path));
}

TEST_CASE("structure: a weight file becomes a plain file of the same name, and back") {
  Pair p;
  p.next = p.base;
  SUBCASE("a shard dropped from the index but kept on disk with other bytes") {
    for (const auto& n : p.base.tensors_in(F3)) p.next.move(n, F2);
    p.next.files[F3] = "no longer a weight file\n";
    p.write();
    const Outcome o = p.check(all_variants());
    CHECK(ops_of(o.index) == ops({{F2, "build"}, {F3, "remove"}}));
  }
  SUBCASE("a plain .safetensors file taken into the index") {
    p.base.files["model-00004-of-00004.safetensors"] = "a plain file, not yet a weight file\n";
    p.next.move("model.big.weight", "model-00004-of-00004.safetensors");
    p.write();
    const Outcome o = p.check(all_variants());
    CHECK(ops_of(o.index) == ops({{F1, "build"}, {"model-00004-of-00004.safetensors", "build"}}));
  }
}

TEST_CASE("structure: a tensor moves out of a file whose header is rewritten and whose range it reused") {
  // The moved tensor is copied from LOCAL's old file while the same bytes of
  // that file are patched in place with the tensor taking its place.
  Pair p;
  p.base.add("model.x1", "F32", {256}, random_bytes(1024, 60), F1);
  p.next = p.base;
  p.next.move("model.x1", F3);
  p.next.add("model.x2", "F32", {256}, random_bytes(1024, 61), F1);
  SUBCASE("a new tensor takes its range") {}
  SUBCASE("a tensor of the other file takes its range") {
    p.base.add("model.y2", "F32", {256}, random_bytes(1024, 62), F3);
    p.next = p.base;
    p.next.move("model.x1", F3);
    p.next.move("model.y2", F1);
    p.next.rename("model.y2", "model.x2");
  }
  p.write();
  const Outcome o = p.check(all_variants());
  CHECK(ops_of(o.index).at(F1) == "header");
  CHECK(ops_of(o.index).at(F3) != "");
}

TEST_CASE("structure: renamed tensors whose bytes are equal to each other") {
  Pair p;
  const Bytes same = random_bytes(512, 70);
  p.base.add("model.dup1", "F16", {256}, same, F2);
  p.base.add("model.dup2", "F16", {256}, same, F3);
  p.next = p.base;
  p.next.rename("model.dup1", "model.layers.0.dup_one");
  p.next.rename("model.dup2", "model.layers.1.dup_two");
  p.next.move("model.layers.1.dup_two", F1);
  p.write();
  const Outcome o = p.check(all_variants());
  CHECK(entries_of(o.index).empty());
  CHECK(o.summary["structure"]["tensors_new"] == 0);
}

TEST_CASE("structure: structural and value changes together (generator saves)") {
  const auto tmp = scratch_dir();
  const TempDir& t = *tmp;
  const fs::path s = gen_series(t / "series", 2, {"--max-shard-size", "300kb"});
  Ckpt next = Ckpt::load(save_dir(s, 2));
  // A load and save of a generator save is the save itself, byte for byte.
  next.save(t / "resaved");
  {
    const TreeDiff td = tree_equal(t / "resaved", save_dir(s, 2));
    REQUIRE_MESSAGE(td.equal, td.report());
  }
  const std::vector<std::string> files = next.weight_files();
  next.rename("model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.up_proj_renamed.weight");
  next.remove("model.layers.1.self_attn.q_norm.weight");
  next.add("model.layers.1.extra.bias", "BF16", {64}, random_bytes(128, 80), files[1]);
  next.move("lm_head.weight", files[0]);
  next.at("model.norm.weight").dtype = "F16";
  next.metadata[files[2]]["step"] = "2";
  next.files["config.json"] += " ";
  next.files["chat_template.jinja"] = "{{ messages }}\n";
  next.save(t / "new");
  const Outcome o = round_trips(save_dir(s, 0), t / "new", t / "work", all_variants());
  CHECK(o.summary["tensors_changed"].get<int>() > 3);
  CHECK(o.summary["structure"]["weight_files_built"].get<int>() >= 3);
  CHECK(from_of(o.index, next.at("lm_head.weight").file, "lm_head.weight") == "lm_head.weight");
  CHECK(from_of(o.index, next.at("model.layers.0.mlp.up_proj_renamed.weight").file,
                "model.layers.0.mlp.up_proj_renamed.weight") == "model.layers.0.mlp.up_proj.weight");
}

TEST_CASE("structure: a tensor of several sparse chunks, unknown dtypes, weight files without an index") {
  Pair p;
  SUBCASE("a large tensor renamed and moved with changed bytes, another grown") {
    // More than two sparse chunks of elements: its work is split across threads.
    constexpr std::size_t kLarge = (2u << 20) * 2 + 4096;
    p.base.add("model.large.weight", "BF16", {kLarge / 2}, random_bytes(kLarge, 200), F2);
    p.base.add("model.grown.weight", "F32", {1u << 19}, random_bytes(2u << 20, 201), F3);
    p.next = p.base;
    p.next.rename("model.large.weight", "model.layers.9.large.weight");
    p.next.move("model.layers.9.large.weight", F1);
    Bytes& b = p.next.at("model.layers.9.large.weight").bytes;
    for (std::size_t i = 0; i < b.size(); i += 4099) b[i] ^= 0x10;
    CkptTensor& g = p.next.at("model.grown.weight");
    g.shape = {(1u << 19) + 8};
    g.bytes.resize(g.bytes.size() + 32, 7);
    p.write();
    const Outcome o = p.check({{"", false}, {"xor", true}, {"auto", false}});
    CHECK(from_of(o.index, F1, "model.layers.9.large.weight") == "model.large.weight");
    CHECK(from_of(o.index, F3, "model.grown.weight").empty());
    // The grown tensor travels whole (random bytes); the large one as its few changes.
    CHECK(o.delta_bytes < (2u << 20) + kLarge / 8);
  }
  SUBCASE("tensors of a dtype the tool does not know (F4), renamed, moved and retyped") {
    p.base.add("model.packed.a", "F4", {64}, random_bytes(32, 210), F1);
    p.base.add("model.packed.b", "F4", {16}, random_bytes(8, 211), F2);
    p.next = p.base;
    p.next.rename("model.packed.a", "model.layers.0.packed_a");
    p.next.move("model.layers.0.packed_a", F3);
    p.next.at("model.packed.b").dtype = "U8";
    p.next.at("model.packed.b").shape = {8};
    p.write();
    const Outcome o = p.check(all_variants());
    CHECK(from_of(o.index, F3, "model.layers.0.packed_a") == "model.packed.a");
    CHECK(entries_of(o.index).empty());
  }
  SUBCASE("several weight files without an index: one renamed, one rewritten") {
    // Without an index every top-level .safetensors file is a weight file.
    const auto at = [&](const std::string& n) { return p.base.at(n).bytes; };
    write_safetensors(p.base_dir() / "first.safetensors",
                      {{"model.big.weight", "BF16", {128, 256}, at("model.big.weight")}});
    write_safetensors(p.base_dir() / "second.safetensors", {{"model.a.weight", "F16", {4, 8}, at("model.a.weight")},
                                                            {"model.c.bias", "F32", {16}, at("model.c.bias")}});
    write_file(p.base_dir() / "config.json", "{}\n");
    write_safetensors(p.new_dir() / "first-renamed.safetensors",
                      {{"model.big.weight", "BF16", {128, 256}, at("model.big.weight")}});
    write_safetensors(p.new_dir() / "second.safetensors", {{"model.a.weight", "F16", {8, 4}, at("model.a.weight")},
                                                           {"model.c.bias", "F32", {16}, at("model.c.bias")}});
    write_file(p.new_dir() / "config.json", "{}\n");
    const Outcome o = p.check(all_variants());
    CHECK(ops_of(o.index) == ops({{"first.safetensors", "remove"},
                                  {"first-renamed.safetensors", "build"},
                                  {"second.safetensors", "header"}}));
    CHECK(entries_of(o.index).empty());
    CHECK(o.delta_bytes < kBig / 4);
  }
}

TEST_CASE("structure: a structural delta on a LOCAL that is not its base: exit 5, LOCAL unchanged") {
  Pair p;
  p.next = p.base;
  p.next.rename("model.big.weight", "model.layers.0.renamed_big.weight");  // F1 built, copying it
  p.next.metadata[F2]["format"] = "np";                                    // F2's header rewritten
  for (const auto& n : p.base.tensors_in(F3)) p.next.remove(n);            // F3 removed
  p.write();
  const fs::path delta = version_dir(p.t / "root", 1);
  fs::create_directories(p.t / "root");
  E2E_REQUIRE_CODE(diff({"-q", p.base_dir().string(), p.new_dir().string(), delta.string()}), 0);
  REQUIRE(ops_of(delta_index(delta)) == ops({{F1, "build"}, {F2, "header"}, {F3, "remove"}}));
  const fs::path local = p.t / "local";
  E2E_REQUIRE_CODE(apply({"-q", "--init", p.base_dir().string(), local.string()}), 0);
  SUBCASE("the tensor a build copies has other bytes") {
    const auto [b, e] = read_st(local / F1).file_range("model.big.weight");
    Bytes raw = read_bytes(local / F1);
    raw[b + (e - b) / 2] ^= 0x01;
    write_bytes(local / F1, raw);
  }
  SUBCASE("the header to rewrite is another one") { edit_header_text(local / F2, R"("pt")", R"("PT")"); }
  SUBCASE("the weight file to remove is not a weight file of LOCAL") {
    json idx = read_json(local / kIndexName);
    for (const auto& n : p.base.tensors_in(F3)) idx["weight_map"].erase(n);
    fs::remove(local / F3);
    write_file(local / kIndexName, idx.dump(2) + "\n");
  }
  for (const std::string sync : {"", "--no-sync"}) {
    CAPTURE(sync);
    const LocalSnapshot snap(local);
    std::vector<std::string> args;
    if (!sync.empty()) args.push_back(sync);
    args.insert(args.end(), {delta.string(), local.string()});
    E2E_CHECK_CODE(apply(args), 5);
    E2E_CHECK_UNCHANGED(snap);
    CHECK(state_version(local) == "000000");
  }
}

// ---- a chain through a publication root ---------------------------------------------

TEST_CASE("structure: --root pull across versions mixing structural and value changes") {
  const auto tmp = scratch_dir();
  const TempDir& t = *tmp;
  const fs::path s = gen_series(t / "series", 4, {"--max-shard-size", "300kb"});
  // Each version: the generator's save of that step, edited cumulatively.
  std::function<void(Ckpt&, int)> edit = [&](Ckpt& c, int v) {
    if (v >= 1) {
      c.rename("model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.gate.weight");
      c.reshard(3);
    }
    if (v >= 2) {
      c.to_single_file();
      c.files["notes/readme.md"] = "version 2\n";
      c.add("model.bias_v2", "F32", {10}, random_bytes(40, 90), kSingleFile);
    }
    if (v >= 3) {
      c.reshard(4);
      c.remove("model.layers.1.self_attn.k_norm.weight");
      c.metadata["model-00002-of-00004.safetensors"]["note"] = "v3";
      c.files.erase("notes/readme.md");
    }
    // 4: values only
  };
  std::vector<fs::path> dirs;
  for (int v = 0; v <= 4; ++v) {
    Ckpt c = Ckpt::load(save_dir(s, v));
    edit(c, v);
    dirs.push_back(t / ("v" + std::to_string(v)));
    c.save(dirs.back());
  }
  const fs::path root = t / "root";
  fs::create_directories(root);
  const char* enc[] = {"", "xor", "auto", "overwrite"};
  for (int v = 1; v <= 4; ++v) {
    std::vector<std::string> args{"--json"};
    if (*enc[v - 1]) args.insert(args.end(), {"--encoding", enc[v - 1]});
    args.insert(args.end(), {dirs[v - 1].string(), dirs[v].string(), version_dir(root, v).string()});
    const RunResult r = diff(args);
    E2E_REQUIRE_CODE(r, 0);
    check_delta(dirs[v - 1], dirs[v], version_dir(root, v), parse_json(r.out));
  }
  CHECK(ops_of(delta_index(version_dir(root, 4))).empty());

  const fs::path local = t / "local";
  E2E_REQUIRE_CODE(apply({"-q", "--init", dirs[0].string(), local.string()}), 0);
  SUBCASE("to 2, then on") {
    const json a = pull(root, local, {"--target", "2"});
    CHECK(a["to_version"] == "000002");
    check_local(local, dirs[2]);
    const json b = pull(root, local, {"--no-sync"});
    CHECK(b["applied"].size() == 2);
  }
  SUBCASE("in one pull") {
    const json a = pull(root, local);
    CHECK(a["applied"].size() == 4);
  }
  check_local(local, dirs[4]);
  CHECK(state_json(local) == json{{"version", "000004"}});
  const LocalSnapshot snap(local);
  CHECK(pull(root, local)["noop"] == true);
  E2E_CHECK_UNCHANGED(snap);
}

// ---- random edits -------------------------------------------------------------------

namespace {

// splitmix64: the same sequence on every platform, unlike the standard
// distributions.
struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  std::size_t below(std::size_t n) { return n ? static_cast<std::size_t>(next() % n) : 0; }
  bool chance(int percent) { return below(100) < static_cast<std::size_t>(percent); }
  template <class C>
  const typename C::value_type& pick(const C& c) {
    auto it = c.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(below(c.size())));
    return *it;
  }
};

struct DtypeInfo {
  const char* name;
  std::size_t size;
};
const std::vector<DtypeInfo> kDtypes = {{"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4},
                                        {"U8", 1},  {"I8", 1},  {"F64", 8},  {"I16", 2}, {"F8_E4M3", 1}};

std::size_t dtype_size_of(const std::string& d) {
  if (d == "BOOL") return 1;
  for (const auto& x : kDtypes)
    if (d == x.name) return x.size;
  throw std::runtime_error("unknown dtype " + d);
}

std::uint64_t elements_of(const std::vector<std::uint64_t>& shape) {
  std::uint64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string shape_text(const std::vector<std::uint64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// Another shape with `n` elements.
std::vector<std::uint64_t> reshape_of(std::uint64_t n, Rng& r) {
  if (n == 0) {
    const std::vector<std::vector<std::uint64_t>> z = {{0}, {0, 3}, {5, 0}, {2, 0, 2}};
    return r.pick(z);
  }
  if (n == 1) {
    const std::vector<std::vector<std::uint64_t>> one = {{}, {1}, {1, 1}};
    return r.pick(one);
  }
  std::vector<std::uint64_t> divisors;
  for (std::uint64_t d = 1; d <= n; ++d)
    if (n % d == 0) divisors.push_back(d);
  const std::uint64_t a = r.pick(divisors);
  switch (r.below(3)) {
    case 0:
      return {n};
    case 1:
      return {a, n / a};
    default:
      return {n / a, 1, a};
  }
}

std::vector<std::uint64_t> random_shape(Rng& r) {
  switch (r.below(6)) {
    case 0:
      return {};  // scalar
    case 1:
      return {r.below(3), 4};  // possibly 0 elements
    case 2:
      return {1 + r.below(64)};
    case 3:
      return {1 + r.below(16), 1 + r.below(16)};
    default:
      return {1 + r.below(4), 1 + r.below(8), 1 + r.below(8)};
  }
}

// The fixed base of the random chains: three weight files, ten dtypes among
// its tensors, a 0-byte tensor and a scalar, other files in a subdirectory.
Ckpt random_base() {
  Ckpt c;
  const std::string f[] = {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                           "model-00003-of-00003.safetensors"};
  c.add("model.embed.weight", "BF16", {32, 32}, random_bytes(2048, 101), f[0]);
  c.add("model.layers.0.w", "F32", {16, 16}, random_bytes(1024, 102), f[0]);
  c.add("model.layers.0.b", "F16", {16}, random_bytes(32, 103), f[0]);
  c.add("model.layers.1.w", "F16", {8, 32}, random_bytes(512, 104), f[1]);
  c.add("model.layers.1.idx", "I64", {6}, random_bytes(48, 105), f[1]);
  c.add("model.layers.1.mask", "BOOL", {10}, Bytes{0, 1, 1, 0, 0, 1, 0, 1, 1, 0}, f[1]);
  c.add("model.step", "F32", {}, Bytes{0, 0, 0x80, 0x3f}, f[1]);
  c.add("model.empty", "F16", {0, 4}, {}, f[1]);
  c.add("model.layers.2.w", "F8_E4M3", {64}, random_bytes(64, 106), f[2]);
  c.add("model.layers.2.q", "I8", {4, 4}, random_bytes(16, 107), f[2]);
  c.add("model.layers.2.d", "F64", {4}, random_bytes(32, 108), f[2]);
  c.add("lm_head.weight", "BF16", {32, 32}, random_bytes(2048, 109), f[2]);
  for (const auto& x : f) c.metadata[x] = {{"format", "pt"}};
  c.files["config.json"] = "{\"layers\": 3}\n";
  c.files["tokenizer/tokenizer.json"] = "{\"vocab\": []}\n";
  return c;
}

// Applies one random edit to c and says what it was.
std::string random_edit(Ckpt& c, Rng& r, int& counter) {
  std::vector<std::string> names;
  for (const auto& [n, t] : c.tensors) names.push_back(n);
  const std::vector<std::string> files = c.weight_files();
  auto new_name = [&] {
    std::string n;
    do
      n = "t." + std::to_string(r.below(8)) + "." + std::string(1 + r.below(6), static_cast<char>('a' + r.below(26))) +
          std::to_string(counter++);
    while (c.has(n));
    return n;
  };
  auto some_file = [&]() -> std::string {
    if (!c.sharded) return kSingleFile;
    if (r.chance(25)) return "extra-" + std::to_string(counter++) + ".safetensors";
    return r.pick(files);
  };
  const std::string victim = r.pick(names);
  std::ostringstream log;
  // Value edits are the most common, as between training saves.
  const std::size_t kind = r.below(16);
  switch (kind) {
    case 0: {
      const DtypeInfo d = r.pick(kDtypes);
      const auto shape = random_shape(r);
      const std::size_t n = elements_of(shape) * d.size;
      const std::string name = new_name(), file = some_file();
      c.add(name, d.name, shape, r.chance(15) ? Bytes(n, 0) : random_bytes(n, r.next()), file);
      log << "add " << name << " " << d.name << shape_text(shape) << " to " << file;
      break;
    }
    case 1:
      if (names.size() < 2) return "nothing (remove of the last tensor)";
      c.remove(victim);
      log << "remove " << victim;
      break;
    case 2:
    case 3: {
      std::string to = victim;
      if (r.chance(50)) {
        // A name as long, which can keep the header's length.
        do
          to[victim.size() - 1 - r.below(std::min<std::size_t>(victim.size(), 3))] =
              static_cast<char>('a' + r.below(26));
        while (c.has(to));
      } else {
        to = new_name();
      }
      c.rename(victim, to);
      log << "rename " << victim << " -> " << to;
      if (kind == 3 && !c.at(to).bytes.empty()) {
        Bytes& b = c.at(to).bytes;
        b[r.below(b.size())] ^= static_cast<std::uint8_t>(1 + r.below(255));
        log << " and change a byte";
      }
      break;
    }
    case 4: {
      CkptTensor& t = c.at(victim);
      t.shape = reshape_of(elements_of(t.shape), r);
      log << "reshape " << victim << " to " << shape_text(t.shape);
      break;
    }
    case 5: {
      CkptTensor& t = c.at(victim);
      if (t.dtype == "BOOL") return "nothing (retype of a BOOL)";
      const DtypeInfo d = r.pick(kDtypes);
      if (d.size != dtype_size_of(t.dtype)) t.bytes = random_bytes(elements_of(t.shape) * d.size, r.next());
      log << "retype " << victim << " " << t.dtype << " -> " << d.name;
      t.dtype = d.name;
      break;
    }
    case 6: {
      if (!c.sharded) return "nothing (move in a single file)";
      const std::string to = some_file();
      c.move(victim, to);
      log << "move " << victim << " to " << to;
      break;
    }
    case 7: {
      const int n = 1 + static_cast<int>(r.below(4));
      c.reshard(n);
      log << "reshard into " << n;
      break;
    }
    case 8:
      if (c.sharded) {
        c.to_single_file();
        log << "to a single file";
      } else {
        const int n = 1 + static_cast<int>(r.below(3));
        c.reshard(n);
        log << "to " << n << " sharded files";
      }
      break;
    case 9: {
      const std::string f = r.pick(files);
      auto& m = c.metadata[f];
      switch (r.below(4)) {
        case 0:
          m["format"] = m["format"] == "pt" ? "np" : "pt";
          break;  // same length
        case 1:
          m["k" + std::to_string(r.below(5))] = std::to_string(r.next());
          break;
        case 2:
          m.erase(m.empty() ? std::string() : m.begin()->first);
          break;
        default:
          c.metadata.erase(f);
          break;
      }
      log << "edit __metadata__ of " << f;
      break;
    }
    case 10: {
      if (!c.sharded) return "nothing (weight file rename in a single file)";
      const std::string f = r.pick(files), to = "renamed-" + std::to_string(counter++) + ".safetensors";
      c.rename_file(f, to);
      log << "rename weight file " << f << " -> " << to;
      break;
    }
    case 11: {
      const std::vector<std::string> paths = {"notes.txt", "tokenizer/tokenizer.json", "sub/a.json", "sub/deep/b.bin",
                                              "config.json"};
      const std::string p = r.pick(paths);
      if (c.files.count(p) && r.chance(40)) {
        c.files.erase(p);
        log << "remove file " << p;
      } else {
        const Bytes b = random_bytes(r.below(200), r.next());
        c.files[p] = std::string(b.begin(), b.end());
        log << "write file " << p;
      }
      break;
    }
    default: {
      // Flip random bytes in a few tensors.
      const std::size_t k = 1 + r.below(3);
      log << "change bytes of";
      for (std::size_t i = 0; i < k; ++i) {
        const std::string n = r.pick(names);
        Bytes& b = c.at(n).bytes;
        if (b.empty()) continue;
        const std::size_t m = 1 + r.below(std::min<std::size_t>(b.size(), 16));
        for (std::size_t j = 0; j < m; ++j) {
          std::uint8_t& x = b[r.below(b.size())];
          x = c.at(n).dtype == "BOOL" ? static_cast<std::uint8_t>(x ^ 1)
                                      : static_cast<std::uint8_t>(x ^ (1 + r.below(255)));
        }
        log << " " << n;
      }
      break;
    }
  }
  // A plain file may not take a weight file's name; without an index every
  // top-level .safetensors file is a weight file.
  for (const auto& f : c.weight_files()) c.files.erase(f);
  if (!c.sharded)
    for (auto it = c.files.begin(); it != c.files.end();)
      it = it->first.find('/') == std::string::npos && ends_with(it->first, ".safetensors") ? c.files.erase(it)
                                                                                            : std::next(it);
  return log.str();
}

}  // namespace

TEST_CASE("structure: random structural and value edits, chained through direct applies and a --root pull") {
  constexpr std::uint64_t kSeed = 20240611;
  constexpr int kChains = 30, kVersions = 4;
  const char* encodings[] = {"", "xor", "overwrite", "auto"};
  int rounds = 0;
  // What the deltas did, so that a generator that stopped producing some kind
  // of difference is noticed.
  std::map<std::string, int> seen;
  for (int chain = 0; chain < kChains; ++chain) {
    const std::uint64_t seed = kSeed + static_cast<std::uint64_t>(chain);
    CAPTURE(seed);
    Rng r{seed};
    const auto tmp = scratch_dir();
    const TempDir& t = *tmp;
    Ckpt c = random_base();
    int counter = 0;
    std::vector<fs::path> dirs{t / "v0"};
    c.save(dirs[0]);
    const fs::path root = t / "root", local = t / "local";
    fs::create_directories(root);
    E2E_REQUIRE_CODE(apply({"-q", "--init", dirs[0].string(), local.string()}), 0);
    std::string history;
    bool ok = true;
    for (int v = 1; v <= kVersions && ok; ++v) {
      CAPTURE(v);
      const std::size_t edits = 1 + r.below(4);
      for (std::size_t e = 0; e < edits; ++e)
        history += "  v" + std::to_string(v) + ": " + random_edit(c, r, counter) + "\n";
      INFO("edits so far:\n" << history);
      dirs.push_back(t / ("v" + std::to_string(v)));
      c.save(dirs.back());

      const std::string enc = encodings[r.below(4)];
      const bool no_sync = r.chance(50);
      CAPTURE(enc);
      CAPTURE(no_sync);
      std::vector<std::string> args{"--json"};
      if (!enc.empty()) args.insert(args.end(), {"--encoding", enc});
      if (no_sync) args.push_back("--no-sync");
      args.insert(args.end(), {dirs[v - 1].string(), dirs[v].string(), version_dir(root, v).string()});
      const RunResult d = diff(args);
      E2E_REQUIRE_CODE(d, 0);
      check_delta(dirs[v - 1], dirs[v], version_dir(root, v), parse_json(d.out));
      const json index = delta_index(version_dir(root, v));
      for (const auto& [f, op] : ops_of(index)) seen[op] += 1;
      for (const auto& e : index["metadata"].value("hfdelta_shards", json::array()))
        for (const auto& bt : e.value("tensors", json::array()))
          seen[!bt.contains("from")       ? "tensor from zeros"
               : bt["from"] == bt["name"] ? "tensor copied"
                                          : "tensor renamed or moved"] += 1;
      seen[index["metadata"]["hfdelta_files"].empty() ? "no file operation" : "file operations"] += 1;

      std::vector<std::string> aargs{"-q"};
      if (no_sync) aargs.push_back("--no-sync");
      aargs.insert(aargs.end(), {version_dir(root, v).string(), local.string()});
      const RunResult a = apply(aargs);
      E2E_CHECK_CODE(a, 0);
      check_local(local, dirs[v]);
      ok = a.code == 0 && tree_equal(local, dirs[v]).equal;
      ++rounds;
    }
    if (!ok) break;  // the first failure is the one to read
    INFO("edits:\n" << history);
    // The whole chain again through the publication root, from a fresh LOCAL.
    const fs::path pulled = t / "pulled";
    E2E_REQUIRE_CODE(apply({"-q", "--init", dirs[0].string(), pulled.string()}), 0);
    const json j = pull(root, pulled, chain % 2 ? std::vector<std::string>{"--no-sync"} : std::vector<std::string>{});
    CHECK(j["applied"].size() == kVersions);
    check_local(pulled, dirs[kVersions]);
  }
  CHECK(rounds == kChains * kVersions);
  std::ostringstream summary;
  for (const auto& [k, n] : seen) summary << "  " << k << ": " << n << "\n";
  INFO("seen:\n" << summary.str());
  for (const char* k : {"build", "header", "remove", "tensor from zeros", "tensor copied", "tensor renamed or moved",
                        "file operations"})
    CHECK_MESSAGE(seen[k] > 0, k);
}
