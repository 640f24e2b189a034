// End-to-end: the chain tools of delta-diff, --inspect DELTA and --prune ROOT.
// Inspect's counts are checked against counts made here from the raw bytes of
// the two checkpoints; prune is checked by pulling from what it leaves.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <set>

#include "ckpt_edit.hpp"
#include "e2e_util.hpp"

using namespace e2e;

namespace {

#define CHECK_ERR_MENTIONS(res, text) \
  CHECK_MESSAGE(contains((res).err, (text)), "stderr should mention \"" << (text) << "\"\n" << (res).describe())

// ---- checkpoints, read independently of the library ---------------------------

// Shard holding `tensor` in an HF checkpoint directory.
fs::path shard_of(const fs::path& dir, const std::string& tensor) {
  if (!fs::exists(dir / "model.safetensors.index.json")) return dir / "model.safetensors";
  return dir / read_json(dir / "model.safetensors.index.json").at("weight_map").at(tensor).get<std::string>();
}

std::size_t dtype_bytes(const std::string& dtype) {
  if (dtype == "BF16" || dtype == "F16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  return 1;
}

// Differing elements (of `es` bytes) and differing bytes of two equal-length buffers.
struct Changes {
  std::uint64_t elements = 0, bytes = 0;
};
Changes count_changes(const Bytes& a, const Bytes& b, std::size_t es) {
  REQUIRE(a.size() == b.size());
  Changes c;
  for (std::size_t e = 0; e < a.size(); e += es) {
    bool any = false;
    for (std::size_t k = 0; k < es; ++k)
      if (a[e + k] != b[e + k]) any = true, ++c.bytes;
    c.elements += any;
  }
  return c;
}

// What the two checkpoints say about one changed tensor.
struct Expected {
  std::uint64_t nbytes = 0, elements = 0, bytes = 0, elem_size = 1;
  std::string new_hash, base_hash;
};
Expected expected(const fs::path& base, const fs::path& target, const std::string& tensor) {
  const Bytes a = checkpoint_tensor(base, tensor), b = checkpoint_tensor(target, tensor);
  Expected x;
  x.nbytes = b.size();
  // The sparse encoding's element: the dtype's size where it divides the tensor.
  const std::size_t es = dtype_bytes(read_st(shard_of(target, tensor)).header[tensor]["dtype"].get<std::string>());
  x.elem_size = b.size() % es == 0 ? es : 1;
  const Changes c = count_changes(a, b, x.elem_size);
  x.elements = c.elements;
  x.bytes = count_changes(a, b, 1).bytes;
  x.new_hash = xxh3_hex(b);
  x.base_hash = xxh3_hex(a);
  return x;
}

json inspect_json(const fs::path& delta) {
  const RunResult r = diff({"--inspect", delta.string(), "--json"});
  E2E_REQUIRE_CODE(r, 0);
  return parse_json(r.out);
}

// ---- a publication root ---------------------------------------------------------

void publish_full(const fs::path& root, int v, const fs::path& src) { copy_tree(src, version_dir(root, v)); }

void publish_delta(const fs::path& root, int v, const fs::path& base, const fs::path& target) {
  E2E_REQUIRE_CODE(diff({"-q", base.string(), target.string(), version_dir(root, v).string()}), 0);
}

std::vector<std::string> v6s(std::initializer_list<int> vs) {
  std::vector<std::string> out;
  for (int v : vs) out.push_back(v6(v));
  return out;
}

std::vector<std::string> versions_of(const json& list) {
  std::vector<std::string> v;
  for (const auto& e : list) v.push_back(e.at("version").get<std::string>());
  return v;
}

json prune_json(const fs::path& root, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args{"--prune", root.string(), "--json"};
  args.insert(args.end(), extra.begin(), extra.end());
  const RunResult r = diff(args);
  E2E_REQUIRE_CODE(r, 0);
  return parse_json(r.out);
}

std::vector<std::string> version_names(std::initializer_list<int> vs) {
  std::vector<std::string> out;
  for (int v : vs) out.push_back(version_dir("", v).filename().string());
  return out;
}

// Saves 0..6 of one series; ROOT = full 0, deltas 1..3, full 4, deltas 5..6.
struct Publication {
  TempDir t;
  fs::path series, root;
  Publication() {
    series = gen_series(t / "series", 6, {"--max-shard-size", "600KB"});
    root = t / "root";
    fs::create_directories(root);
    publish_full(root, 0, save_dir(series, 0));
    for (int v = 1; v <= 3; ++v) publish_delta(root, v, save_dir(series, v - 1), save_dir(series, v));
    publish_full(root, 4, save_dir(series, 4));
    for (int v = 5; v <= 6; ++v) publish_delta(root, v, save_dir(series, v - 1), save_dir(series, v));
  }
};

}  // namespace

// ---- --inspect --------------------------------------------------------------------

TEST_CASE("--inspect: per-tensor changed counts, lengths and checksums match the two checkpoints") {
  TempDir t;
  std::string encoding;
  std::vector<std::string> gen{"--max-shard-size", "600KB"};
  SUBCASE("xor") { encoding = "xor"; }
  SUBCASE("overwrite") { encoding = "overwrite"; }
  SUBCASE("sparse, bf16") { encoding = "sparse"; }
  SUBCASE("sparse, f32 (4-byte elements)") {
    encoding = "sparse";
    gen.insert(gen.end(), {"--dtype", "f32"});
  }
  SUBCASE("context, bf16") { encoding = "context"; }
  SUBCASE("context, f32 (4-byte elements)") {
    encoding = "context";
    gen.insert(gen.end(), {"--dtype", "f32"});
  }
  SUBCASE("auto, dense steps so that some tensors go xor") {
    // Large steps change most elements: auto then keeps xor where it is smaller.
    encoding = "auto";
    gen.insert(gen.end(), {"--lr", "1e-3", "--steps-per-save", "3"});
  }
  SUBCASE("default (context)") {}
  const fs::path s = gen_series(t / "series", 1, gen);
  const fs::path base = save_dir(s, 0), target = t / "target", delta = t / "root" / "weight_v000001";
  // A target whose non-weight files differ too: one new (in a subdirectory), one gone.
  copy_tree(save_dir(s, 1), target);
  write_file(target / "extra" / "notes.txt", "carried whole\n");
  fs::remove(target / "generation_config.json");
  fs::create_directories(t / "root");
  std::vector<std::string> args{"-q"};
  if (!encoding.empty()) args.insert(args.end(), {"--encoding", encoding});
  args.insert(args.end(), {base.string(), target.string(), delta.string()});
  E2E_REQUIRE_CODE(diff(args), 0);

  const json j = inspect_json(delta);
  CAPTURE(j.dump(2));
  CHECK(keys_of(j) == std::set<std::string>{"delta", "version", "base_version", "format", "encoding", "checksum_format",
                                            "index_checksum", "tensors", "files", "weight_files", "totals", "schema",
                                            "ok"});
  CHECK(j["checksum_format"] == "xxh3-128");
  CHECK(j["weight_files"] == json::array());  // the same layout: no weight-file operations
  CHECK(j["delta"] == delta.string());
  CHECK(j["version"] == "000001");
  CHECK(j["base_version"] == "000000");
  const std::string want_encoding = encoding.empty() ? "context" : encoding;
  CHECK(j["encoding"] == want_encoding);
  const json meta = delta_index(delta)["metadata"];
  CHECK(j["format"] == meta["hfdelta_format"]);
  // auto keeps context or xor entries: revision 5 (context) unless every one went xor.
  const int want_format = want_encoding == "xor" || want_encoding == "overwrite" ? 1
                          : want_encoding == "sparse"                            ? 2
                          : want_encoding == "context"                           ? 5
                                                                                 : meta["hfdelta_format"].get<int>();
  CHECK(j["format"] == want_format);
  CHECK(j["index_checksum"] == meta["hfdelta_index_checksum"]);

  const std::set<std::string> changed = changed_tensors(base, target);
  REQUIRE(!changed.empty());
  std::set<std::string> listed;
  std::uint64_t sum_entry = 0, sum_elements = 0, sum_bytes = 0, sum_tensor = 0;
  std::map<std::string, int> per_encoding;
  for (const json& e : j["tensors"]) {
    const std::string name = e.at("name").get<std::string>();
    INFO("tensor " << name);
    CHECK(keys_of(e) == std::set<std::string>{"name", "file", "encoding", "entry_bytes", "tensor_bytes", "element_size",
                                              "changed_elements", "changed_bytes", "checksum", "base_checksum",
                                              "stack_parts", "needs_base"});
    CHECK(e["stack_parts"].is_null());  // a diff never stacks; see e2e_squash
    listed.insert(name);
    const Expected x = expected(base, target, name);
    const std::string enc = e["encoding"].get<std::string>();
    ++per_encoding[enc];
    if (want_encoding == "auto") {
      CHECK(meta["hfdelta_encodings"][name] == enc);
      CHECK((enc == "context" || enc == "xor"));
    } else {
      CHECK(enc == want_encoding);
    }
    // The entry as the delta file lays it out.
    CHECK(e["file"] == delta_index(delta)["weight_map"][name]);
    const auto [b, en] = read_st(delta / e["file"].get<std::string>()).file_range(name);
    CHECK(e["entry_bytes"] == en - b);
    CHECK(e["checksum"] == x.new_hash);
    CHECK(e["base_checksum"] == x.base_hash);
    CHECK(e["needs_base"] == (enc == "context"));  // its positions count base elements
    if (enc == "sparse" || enc == "context") {
      CHECK(e["changed_elements"] == x.elements);
      CHECK(e["changed_bytes"].is_null());
      CHECK(e["element_size"] == x.elem_size);
      CHECK(e["tensor_bytes"] == x.nbytes);
      sum_elements += x.elements;
    } else {
      CHECK(e["changed_bytes"] == x.bytes);
      CHECK(e["changed_elements"].is_null());
      CHECK(e["element_size"].is_null());
      if (enc == "xor")
        CHECK(e["tensor_bytes"] == x.nbytes);
      else
        CHECK(e["tensor_bytes"].is_null());  // an overwrite entry does not say
      sum_bytes += x.bytes;
    }
    sum_entry += e["entry_bytes"].get<std::uint64_t>();
    sum_tensor += x.nbytes;
  }
  CHECK(listed == changed);
  if (want_encoding == "auto")
    WARN_MESSAGE(per_encoding.size() == 2,
                 "this auto delta has entries of one encoding only; both were meant to be covered");

  const json files = j["files"];
  REQUIRE(files.size() == 2);
  std::map<std::string, json> by_path;
  for (const json& f : files) by_path[f.at("path").get<std::string>()] = f;
  REQUIRE(by_path.count("extra/notes.txt"));
  REQUIRE(by_path.count("generation_config.json"));
  CHECK(by_path["extra/notes.txt"] == json{{"path", "extra/notes.txt"},
                                           {"op", "put"},
                                           {"size", 14},
                                           {"checksum", xxh3_hex(std::string("carried whole\n"))}});
  CHECK(by_path["generation_config.json"] ==
        json{{"path", "generation_config.json"}, {"op", "remove"}, {"size", nullptr}, {"checksum", nullptr}});

  const json tot = j["totals"];
  CHECK(keys_of(tot) == std::set<std::string>{"tensors", "entries", "entry_bytes", "tensor_bytes", "changed_elements",
                                              "changed_bytes", "files_put", "files_removed", "file_bytes",
                                              "delta_bytes", "weight_files_built", "headers_rewritten",
                                              "weight_files_removed"});
  for (const char* k : {"weight_files_built", "headers_rewritten", "weight_files_removed"}) CHECK(tot[k] == 0);
  CHECK(tot["tensors"] == changed.size());
  CHECK(tot["entries"] == json{{"sparse", per_encoding["sparse"]},
                               {"xor", per_encoding["xor"]},
                               {"overwrite", per_encoding["overwrite"]},
                               {"stack", 0},
                               {"context", per_encoding["context"]},
                               {"parts", 0}});
  CHECK(tot["entry_bytes"] == sum_entry);
  CHECK(tot["changed_elements"] == sum_elements);
  CHECK(tot["changed_bytes"] == sum_bytes);
  if (want_encoding == "overwrite")
    CHECK(tot["tensor_bytes"].is_null());
  else
    CHECK(tot["tensor_bytes"] == sum_tensor);
  CHECK(tot["files_put"] == 1);
  CHECK(tot["files_removed"] == 1);
  CHECK(tot["file_bytes"] == 14);
  CHECK(tot["delta_bytes"] == tree_size(delta));

  // The human table: one line per tensor, the versions, the file operations.
  const RunResult h = diff({"--inspect", delta.string()});
  E2E_REQUIRE_CODE(h, 0);
  CHECK_MESSAGE(contains(h.out, "version 000001 on base 000000, encoding " + want_encoding), h.out);
  for (const auto& name : changed) CHECK_MESSAGE(contains(h.out, "  " + name + "\n"), name << "\n" << h.out);
  CHECK_MESSAGE(contains(h.out, "extra/notes.txt"), h.out);
  CHECK_MESSAGE(contains(h.out, "generation_config.json"), h.out);
  // -q prints nothing; inspecting changed nothing.
  const Snapshot before = snapshot(delta);
  const RunResult q = diff({"-q", "--inspect", delta.string()});
  E2E_CHECK_CODE(q, 0);
  CHECK(q.out.empty());
  CHECK(snapshot(delta) == before);
}

TEST_CASE("--inspect: a structural delta's weight-file operations, and a damaged new header exits 3") {
  TempDir t;
  const Bytes a = random_bytes(16, 1), bb = random_bytes(16, 2), n = random_bytes(12, 3), e = random_bytes(8, 4);
  Bytes a2 = a;
  a2[3] ^= 0x40;
  write_safetensors(t / "base" / "model.safetensors", {{"a", "F32", {4}, a}, {"bb", "F16", {8}, bb}});
  // NEW: `a` changed, `bb` renamed (a longer name: the file is built), a new
  // tensor, and a second weight file holding one more new tensor.
  write_safetensors(t / "new" / "model.safetensors",
                    {{"a", "F32", {4}, a2}, {"bbb", "F16", {8}, bb}, {"n", "I32", {3}, n}});
  write_safetensors(t / "new" / "extra.safetensors", {{"e", "U8", {8}, e}});
  const fs::path delta = t / "weight_v000001";
  E2E_REQUIRE_CODE(diff({"-q", (t / "base").string(), (t / "new").string(), delta.string()}), 0);

  const json j = inspect_json(delta);
  CAPTURE(j.dump(2));
  CHECK(j["format"] == 5);  // the default encoding, context (revision 5)
  CHECK(j["encoding"] == "auto");
  const auto header_bytes = [&](const char* f) { return read_st(t / "new" / f).data_start(); };
  CHECK(j["weight_files"] == json::array({
                                 {{"file", "extra.safetensors"},
                                  {"op", "build"},
                                  {"header_bytes", header_bytes("extra.safetensors")},
                                  {"size", fs::file_size(t / "new" / "extra.safetensors")},
                                  {"tensors", 1},
                                  {"copied", 0},
                                  {"renamed", 0},
                                  {"new", 1}},
                                 {{"file", "model.safetensors"},
                                  {"op", "build"},
                                  {"header_bytes", header_bytes("model.safetensors")},
                                  {"size", fs::file_size(t / "new" / "model.safetensors")},
                                  {"tensors", 3},
                                  {"copied", 1},
                                  {"renamed", 1},
                                  {"new", 1}},
                             }));
  CHECK(j["totals"]["weight_files_built"] == 2);
  CHECK(j["totals"]["headers_rewritten"] == 0);
  CHECK(j["totals"]["weight_files_removed"] == 0);
  // Entries: `a` against its base, the new tensors against zeros; `bbb` is referenced.
  std::set<std::string> names;
  for (const auto& x : j["tensors"]) names.insert(x["name"].get<std::string>());
  CHECK(names == std::set<std::string>{"a", "e", "n"});
  const RunResult human = diff({"--inspect", delta.string()});
  E2E_CHECK_CODE(human, 0);
  CHECK(contains(human.out, "weights 2 files built, 0 headers rewritten, 0 files removed"));

  // One flipped byte of a carried header: the index's checksum of it no longer matches.
  const fs::path hp = delta / "headers" / "model.safetensors";
  Bytes raw = read_bytes(hp);
  raw[raw.size() / 2] ^= 0x01;
  write_bytes(hp, raw);
  const RunResult r = diff({"--inspect", delta.string()});
  E2E_CHECK_CODE(r, 3);
  CHECK_ERR_MENTIONS(r, hp.string());
}

TEST_CASE("--inspect: a damaged delta exits 3 with a message naming the file and the problem") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 1, {"--max-shard-size", "600KB"});
  const fs::path target = t / "target", local = t / "local";
  copy_tree(save_dir(s, 1), target);
  write_file(target / "notes.txt", "carried whole\n");
  E2E_REQUIRE_CODE(apply({"-q", "--init", save_dir(s, 0).string(), local.string()}), 0);

  enum class Damage { cut_file, cut_entry, flip_payload, flip_index, carried_file, unsealed };
  Damage damage = Damage::cut_file;
  SUBCASE("the delta file is cut short") { damage = Damage::cut_file; }
  SUBCASE("one entry is cut short inside a well-formed delta file") { damage = Damage::cut_entry; }
  SUBCASE("one byte of an entry's payload is flipped (the last frame's content checksum, where it has one)") {
    damage = Damage::flip_payload;
  }
  SUBCASE("one byte of the index is flipped") { damage = Damage::flip_index; }
  SUBCASE("a carried file differs from its recorded checksum") { damage = Damage::carried_file; }
  // Storage damage: a byte of a delta file changed after the version was
  // sealed. The completion marker finds it in any encoding, a context entry's
  // raw parts (no frame checksum of their own) included. The cases above
  // reseal the marker, as a publisher writing a bad delta would, so that each
  // encoding's own checks are what answers.
  SUBCASE("one byte of a sealed version's delta file changed (its completion marker)") { damage = Damage::unsealed; }

  // Each encoding has its own checks of an entry's structure.
  std::vector<std::string> encodings{"xor", "overwrite", "sparse"};
  if (damage == Damage::unsealed) encodings.push_back("context");
  for (const std::string& encoding : encodings) {
    INFO("encoding " << encoding);
    const fs::path delta = t / ("root-" + encoding) / "weight_v000001";
    fs::create_directories(delta.parent_path());
    E2E_REQUIRE_CODE(diff({"-q", "--encoding", encoding, save_dir(s, 0).string(), target.string(), delta.string()}), 0);
    E2E_REQUIRE_CODE(diff({"-q", "--inspect", delta.string()}), 0);

    // The largest entry and its delta file.
    const json idx = delta_index(delta);
    std::string tensor;
    std::uint64_t largest = 0;
    for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
      const auto [b, e] = read_st(delta / it.value().get<std::string>()).file_range(it.key());
      if (e - b > largest) largest = e - b, tensor = it.key();
    }
    const fs::path file = delta / idx["weight_map"][tensor].get<std::string>();

    std::string names;  // what the message must name
    switch (damage) {
      case Damage::cut_file: {
        Bytes raw = read_bytes(file);
        raw.resize(raw.size() - 7);
        write_bytes(file, raw);
        names = file.string();
        break;
      }
      case Damage::cut_entry: {
        // Rewrite the file with the entry 3 bytes shorter: the safetensors
        // layer is intact, only the entry's own structure can tell.
        const StFile st = read_st(file);
        std::vector<TensorData> tensors;
        for (const auto& n : st.tensor_names()) {
          Bytes b = st.tensor(n);
          if (n == tensor) b.resize(b.size() - 3);
          tensors.push_back({n, "U8", {b.size()}, b});
        }
        std::map<std::string, std::string> meta;
        const json md = st.metadata();
        for (auto it = md.begin(); it != md.end(); ++it) meta[it.key()] = it.value().get<std::string>();
        write_safetensors(file, tensors, &meta);
        REQUIRE(read_st(file).tensor(tensor).size() == largest - 3);
        names = file.string() + ": entry '" + tensor + "'";
        break;
      }
      case Damage::flip_payload: {
        // Every frame stays complete and of its declared size: only decoding
        // the whole entry finds that its content no longer matches.
        const auto [b, e] = read_st(file).file_range(tensor);
        Bytes raw = read_bytes(file);
        REQUIRE(e > b);
        raw[e - 1] ^= 0x01;
        write_bytes(file, raw);
        names = file.string() + ": entry '" + tensor + "'";
        break;
      }
      case Damage::flip_index: {
        const fs::path p = delta / "model.safetensors.index.json";
        std::string text = read_file(p);
        // A hex digit of a base checksum: still valid JSON, caught by the index's own checksum.
        const std::size_t key = text.find("\"hfdelta_base_checksums\"");
        REQUIRE(key != std::string::npos);
        const std::size_t at = text.find('"', text.find(':', key + 25) + 1) + 1;
        REQUIRE(at < text.size());
        text[at] = text[at] == '0' ? '1' : '0';
        write_file(p, text);
        names = p.string();
        break;
      }
      case Damage::carried_file:
        write_file(delta / "files" / "notes.txt", "carried whole!");
        names = (delta / "files" / "notes.txt").string();
        break;
      case Damage::unsealed: {
        const auto [b, e] = read_st(file).file_range(tensor);
        Bytes raw = read_bytes(file);
        raw[(b + e) / 2] ^= 0x10;
        write_bytes(file, raw);
        names = file.string() + ": does not have the size and checksum its completion marker records";
        break;
      }
    }
    if (damage != Damage::unsealed) reseal_marker(delta);
    const Snapshot before = snapshot(delta);
    // The slime layout's frames carry no content checksum (as its publishers
    // write them): a flipped byte that still decodes is found only against
    // the base, by the entry's checksum of the tensor. delta-apply refuses it
    // before anything is committed.
    if (damage == Damage::flip_payload && (encoding == "xor" || encoding == "overwrite")) {
      const RunResult a = apply({"-q", delta.string(), local.string()});
      // 3 where zstd's decoding finds the damage, else 5 (the tensor's checksum).
      CHECK_MESSAGE((a.code == 3 || a.code == 5), a.describe());
      CHECK_ERR_MENTIONS(a, tensor);
      CHECK(state_version(local) == "000000");
      CHECK(snapshot(delta) == before);
      continue;
    }
    for (const bool as_json : {false, true}) {
      std::vector<std::string> args{"--inspect", delta.string()};
      if (as_json) args.push_back("--json");
      const RunResult r = diff(args);
      E2E_CHECK_CODE(r, 3);
      CHECK_ERR_MENTIONS(r, names);
      if (as_json) {  // one object saying so (schema 1)
        const json j = parse_json(r.out);
        CHECK(j["ok"] == false);
        CHECK(j["error"]["kind"] == "bad_input");
      } else {
        CHECK_MESSAGE(r.out.empty(), r.describe());
      }
    }
    CHECK(snapshot(delta) == before);
    // delta-apply refuses the same delta: inspect finds nothing the applier would accept.
    const RunResult a = apply({"-q", delta.string(), local.string()});
    CHECK_MESSAGE(a.code != 0, a.describe());
    if (damage == Damage::unsealed) {  // damage, before LOCAL is touched; not "LOCAL is not the base" (5)
      E2E_CHECK_CODE(a, 3);
      CHECK_ERR_MENTIONS(a, names);
    }
    CHECK(state_version(local) == "000000");
  }
}

TEST_CASE("--inspect refuses what is not a delta (exit 3), and bad command lines (exit 2)") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 1);
  SUBCASE("a full checkpoint") {
    const RunResult r = diff({"--inspect", save_dir(s, 0).string()});
    E2E_CHECK_CODE(r, 3);
    CHECK_ERR_MENTIONS(r, "not a delta");
  }
  SUBCASE("a directory without an index") {
    fs::create_directories(t / "empty");
    const RunResult r = diff({"--inspect", (t / "empty").string()});
    E2E_CHECK_CODE(r, 3);
    CHECK_ERR_MENTIONS(r, "model.safetensors.index.json");
  }
  SUBCASE("a path that does not exist") {
    const RunResult r = diff({"--inspect", (t / "nothing").string()});
    E2E_CHECK_CODE(r, 2);
    CHECK_ERR_MENTIONS(r, (t / "nothing").string());
  }
  SUBCASE("usage errors") {
    const std::string d = (t / "d").string();
    for (const auto& args :
         std::vector<std::vector<std::string>>{{},                                     // no form at all
                                               {"--inspect"},                          // DELTA missing
                                               {"--inspect", d, "extra"},              // a positional too
                                               {"--inspect", d, "--encoding", "xor"},  // an option of the diff form
                                               {"--inspect", d, "--prune", d},         // two forms
                                               {"--keep-from", "3", save_dir(s, 0).string(), save_dir(s, 1).string(),
                                                d},                                 // --prune's option alone
                                               {"--prune", d, "--keep-from", "x"},  // not a number
                                               {save_dir(s, 0).string(), save_dir(s, 1).string()}})  // OUT missing
    {
      const RunResult r = diff(args);
      E2E_CHECK_CODE(r, 2);
      CHECK_MESSAGE(contains(r.err, "error"), r.describe());
    }
    CHECK_FALSE(fs::exists(d));
  }
}

// ---- --prune ----------------------------------------------------------------------

TEST_CASE("--prune: full 0, deltas 1..3, full 4, deltas 5..6; hosts still reach 6 afterwards") {
  Publication p;
  const fs::path& root = p.root;
  // Hosts that are somewhere in the chain before the prune.
  const fs::path at2 = p.t / "host-at-2", at4 = p.t / "host-at-4";
  pull(root, at2, {"--target", "2"});
  pull(root, at4, {"--target", "4"});
  REQUIRE(state_version(at2) == "000002");
  REQUIRE(state_version(at4) == "000004");
  // Left by an earlier prune that was interrupted; and a publication in progress, not ours.
  write_file(root / ".pruned.weight_v000000.tmp-0badc0de" / "model.safetensors", "half deleted");
  write_file(root / ".weight_v000007.tmp-12345678" / "config.json", "{}");

  const Snapshot before = snapshot(root);
  const json dry = prune_json(root, {"--dry-run"});
  CHECK(snapshot(root) == before);  // nothing removed, nothing renamed
  CHECK(dry["dry_run"] == true);
  CHECK(versions_of(dry["removed"]) == v6s({0, 1, 2, 3}));
  CHECK(versions_of(dry["kept"]) == v6s({4, 5, 6}));
  CHECK(dry["base_full"] == "000004");
  CHECK(dry["keep_from"].is_null());
  CHECK(dry["leftovers"] == json::array({(root / ".pruned.weight_v000000.tmp-0badc0de").string()}));
  CHECK(dry["bytes_removed"].get<std::uint64_t>() > 0);
  {
    const RunResult h = diff({"--prune", root.string(), "--dry-run"});
    E2E_REQUIRE_CODE(h, 0);
    for (const auto& n : version_names({0, 1, 2, 3})) CHECK_MESSAGE(contains(h.out, "would remove  " + n), h.out);
    for (const auto& n : version_names({4, 5, 6})) CHECK_MESSAGE(!contains(h.out, "remove  " + n), h.out);
    CHECK_MESSAGE(contains(h.out, ".pruned.weight_v000000.tmp-0badc0de"), h.out);
    CHECK(snapshot(root) == before);
  }

  const json done = prune_json(root);
  CHECK(done["dry_run"] == false);
  CHECK(done["removed"] == dry["removed"]);
  CHECK(done["kept"] == dry["kept"]);
  CHECK(done["leftovers"] == dry["leftovers"]);
  CHECK(done["bytes_removed"] == dry["bytes_removed"]);
  std::vector<std::string> want = version_names({4, 5, 6});
  want.insert(want.begin(), ".weight_v000007.tmp-12345678");  // a publication in progress stays
  CHECK(list_names(root) == want);
  // The kept versions are untouched.
  const Snapshot after = snapshot(root);
  for (int v = 4; v <= 6; ++v) {
    const std::string prefix = version_dir("", v).filename().string() + "/";
    for (const auto& entry : before) {
      const std::string& k = entry.first;  // a plain reference: CHECK_MESSAGE captures it
      if (k.rfind(prefix, 0) == 0) CHECK_MESSAGE((after.count(k) && after.at(k) == entry.second), k);
    }
  }

  // A second prune finds nothing to do.
  const json again = prune_json(root);
  CHECK(again["removed"].empty());
  CHECK(again["leftovers"].empty());
  CHECK(versions_of(again["kept"]) == v6s({4, 5, 6}));

  // Every host still reaches the newest version, byte for byte the last save.
  const fs::path fresh = p.t / "host-new";
  const json a = pull(root, fresh);
  CHECK(a["applied"] == json::array({"000004", "000005", "000006"}));
  E2E_CHECK_TREE_EQUAL(fresh, save_dir(p.series, 6));
  const json b = pull(root, at4);
  CHECK(b["applied"] == json::array({"000005", "000006"}));
  E2E_CHECK_TREE_EQUAL(at4, save_dir(p.series, 6));
  const json c = pull(root, at2);
  CHECK(c["applied"] == json::array({"000004", "000005", "000006"}));
  E2E_CHECK_TREE_EQUAL(at2, save_dir(p.series, 6));
}

TEST_CASE("--prune --keep-from N keeps the newest full version at or below N and everything after it") {
  Publication p;
  const fs::path& root = p.root;
  const std::vector<std::string> all = version_names({0, 1, 2, 3, 4, 5, 6});

  SUBCASE("--keep-from 2: the full base of 2 is version 0, so everything stays") {
    const json j = prune_json(root, {"--keep-from", "2"});
    CHECK(j["keep_from"] == "000002");
    CHECK(j["base_full"] == "000000");
    CHECK(j["removed"].empty());
    CHECK(versions_of(j["kept"]) == v6s({0, 1, 2, 3, 4, 5, 6}));
    CHECK(list_names(root) == all);
    // A new host can still be brought to 2, the oldest version promised.
    const fs::path local = p.t / "local";
    CHECK(pull(root, local, {"--target", "2"})["applied"] == json::array({"000000", "000001", "000002"}));
    E2E_CHECK_TREE_EQUAL(local, save_dir(p.series, 2));
  }
  SUBCASE("--keep-from 5: from full version 4") {
    const json j = prune_json(root, {"--keep-from", "5"});
    CHECK(j["base_full"] == "000004");
    CHECK(versions_of(j["removed"]) == v6s({0, 1, 2, 3}));
    CHECK(list_names(root) == version_names({4, 5, 6}));
  }
  SUBCASE("--keep-from 4 and --keep-from 99 (past the newest) both start at full version 4") {
    const json d4 = prune_json(root, {"--keep-from", "4", "--dry-run"});
    const json d99 = prune_json(root, {"--keep-from", "99", "--dry-run"});
    CHECK(versions_of(d4["removed"]) == v6s({0, 1, 2, 3}));
    CHECK(d99["removed"] == d4["removed"]);
    CHECK(list_names(root) == all);
  }
  SUBCASE("a root with no full version at or below N: nothing is removed") {
    // Hosts initialised outside ROOT (delta-apply --init) need every delta.
    fs::remove_all(version_dir(root, 0));
    const json j = prune_json(root, {"--keep-from", "3"});
    CHECK(j["base_full"].is_null());
    CHECK(j["removed"].empty());
    CHECK(list_names(root) == version_names({1, 2, 3, 4, 5, 6}));
  }
}

TEST_CASE("--prune killed half way: versions already hidden are removed by the next prune") {
  Publication p;
  const fs::path& root = p.root;
  {
    // Write step 2 is the second rename: version 0 is hidden, 1..3 are not yet.
    ScopedEnv f("HFDELTA_FAULT_AT", "2"), m("HFDELTA_FAULT_MODE", "kill");
    const RunResult r = diff({"--prune", root.string()});
    E2E_REQUIRE_CODE(r, 128 + 9);
  }
  std::vector<std::string> hidden;
  for (const auto& n : list_names(root))
    if (n.rfind(".pruned.weight_v000000.tmp-", 0) == 0) hidden.push_back(n);
  REQUIRE_MESSAGE(hidden.size() == 1, "names in ROOT: " << json(list_names(root)).dump());
  CHECK_FALSE(fs::exists(version_dir(root, 0)));
  CHECK(fs::exists(version_dir(root, 1)));
  // Readers skip hidden names: a pull sees a consistent root meanwhile.
  const fs::path local = p.t / "local";
  pull(root, local);
  E2E_CHECK_TREE_EQUAL(local, save_dir(p.series, 6));

  const json j = prune_json(root);
  CHECK(versions_of(j["removed"]) == v6s({1, 2, 3}));
  CHECK(j["leftovers"] == json::array({(root / hidden[0]).string()}));
  CHECK(list_names(root) == version_names({4, 5, 6}));
}

TEST_CASE("--prune refusals: exit 3 for a root or kept full version it cannot read, and nothing removed") {
  Publication p;
  const fs::path& root = p.root;
  SUBCASE("the full version every host would start from is damaged") {
    const fs::path shard = version_dir(root, 4) / read_json(version_dir(root, 4) / "model.safetensors.index.json")
                                                      .at("weight_map")
                                                      .begin()
                                                      .value()
                                                      .get<std::string>();
    Bytes raw = read_bytes(shard);
    raw.resize(raw.size() / 2);
    write_bytes(shard, raw);
    const Snapshot before = snapshot(root);
    const RunResult r = diff({"--prune", root.string()});
    E2E_CHECK_CODE(r, 3);
    CHECK_ERR_MENTIONS(r, shard.string());
    CHECK(snapshot(root) == before);
  }
  SUBCASE("ROOT is not a directory") {
    const RunResult r = diff({"--prune", (p.t / "nothing").string()});
    E2E_CHECK_CODE(r, 2);
    CHECK_ERR_MENTIONS(r, (p.t / "nothing").string());
  }
}

TEST_CASE(
    "hfdelta-bench readfloor: plain, --hash and --hash --write-back read every shard byte and leave the files as they "
    "were") {
  TempDir t;
  const fs::path ck = save_dir(gen_series(t / "series", 0), 0);
  std::uint64_t shard_bytes = 0;
  for (const auto& f : list_files(ck))
    if (f.size() > 12 && f.substr(f.size() - 12) == ".safetensors") shard_bytes += fs::file_size(ck / f);
  const Snapshot before = snapshot(ck);
  const std::vector<std::vector<std::string>> variants{{}, {"--hash"}, {"--hash", "--write-back"}};
  for (const auto& flags : variants) {
    std::vector<std::string> argv{bench_bin(), "readfloor", "--repeat", "2", "--threads", "2"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.push_back(ck.string());
    const RunResult r = run(argv);
    E2E_CHECK_CODE(r, 0);
    const json j = json::parse(r.out);
    CHECK(j["bytes"] == shard_bytes);
    CHECK(j["hash"] == (flags.size() >= 1));
    CHECK(j["write_back"] == (flags.size() == 2));
    CHECK(j["seconds"].size() == 2);
    CHECK(j["min_s"].get<double>() > 0);
    CHECK(snapshot(ck) == before);
  }
}
