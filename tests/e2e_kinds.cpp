// End-to-end: the checkpoint kinds users run besides dense bf16 saves, as
// hfdelta-gen writes them: a PEFT LoRA adapter directory (f32, every element
// moving), fine-grained FP8 (F8_E4M3 weights with F32 block scales) and a
// Qwen3-MoE save (64 experts a layer, hundreds of tensors). For each, in every
// encoding: a chain of deltas pulled with --root reproduces the last save byte
// for byte and --verify is clean, each delta applied by hand reproduces its
// save, and the chain squashed into one delta does too.
#include <doctest/doctest.h>

#include "e2e_util.hpp"

using namespace e2e;

namespace {

const char* const kEncodings[] = {"xor", "overwrite", "sparse", "context", "auto"};

// hfdelta-gen ARGS... OUTDIR --saves N; returns OUTDIR.
fs::path gen_kind(const fs::path& outdir, int saves, const std::vector<std::string>& args) {
  std::vector<std::string> argv{gen_bin()};
  argv.insert(argv.end(), args.begin(), args.end());
  for (const auto& s : {std::string("--saves"), std::to_string(saves), outdir.string()}) argv.push_back(s);
  const RunResult r = run(argv);
  REQUIRE_MESSAGE(r.code == 0, r.describe());
  return outdir;
}

// Every encoding: publish saves 1..n of SERIES into a root of its own, pull
// it into a fresh LOCAL, --verify it, apply each delta by hand, and squash
// versions 1..n into one delta applied to save 0.
void all_encodings_round_trip(const fs::path& series, int n, const fs::path& work) {
  for (const char* enc : kEncodings) {
    CAPTURE(enc);
    const fs::path root = work / (std::string("root-") + enc);
    fs::create_directories(root);
    for (int v = 1; v <= n; ++v)
      E2E_REQUIRE_CODE(diff({"-q", "--no-sync", "--encoding", enc, save_dir(series, v - 1).string(),
                             save_dir(series, v).string(), root.string()}),
                       0);

    // A host pulling the chain with --root.
    const fs::path local = work / (std::string("local-") + enc);
    E2E_REQUIRE_CODE(apply({"-q", "--no-sync", "--init", save_dir(series, 0).string(), local.string()}), 0);
    const json j = pull(root, local, {"--no-sync"});
    CHECK(j["to_version"] == v6(n));
    CHECK(state_version(local) == v6(n));
    E2E_CHECK_TREE_EQUAL(local, save_dir(series, n));
    E2E_CHECK_CODE(apply({"-q", "--verify", local.string()}), 0);

    // Each delta by hand, checked against its save.
    const fs::path step = work / (std::string("step-") + enc);
    E2E_REQUIRE_CODE(apply({"-q", "--no-sync", "--init", save_dir(series, 0).string(), step.string()}), 0);
    for (int v = 1; v <= n; ++v) {
      CAPTURE(v);
      E2E_REQUIRE_CODE(apply({"-q", "--no-sync", version_dir(root, v).string(), step.string()}), 0);
      E2E_CHECK_TREE_EQUAL(step, save_dir(series, v));
    }

    // The chain squashed into one delta.
    const fs::path out = work / (std::string("squash-") + enc) / ("weight_v" + v6(n));
    fs::create_directories(out.parent_path());
    E2E_REQUIRE_CODE(diff({"-q", "--no-sync", "--squash", version_dir(root, 1).string(), version_dir(root, n).string(),
                           out.string()}),
                     0);
    const fs::path sq = work / (std::string("sq-") + enc);
    E2E_REQUIRE_CODE(apply({"-q", "--no-sync", "--init", save_dir(series, 0).string(), sq.string()}), 0);
    E2E_REQUIRE_CODE(apply({"-q", out.string(), sq.string()}), 0);
    E2E_CHECK_TREE_EQUAL(sq, save_dir(series, n));
    E2E_CHECK_CODE(apply({"-q", "--verify", sq.string()}), 0);
  }
}

// Every tensor of a checkpoint directory's .safetensors files: name -> (file, header entry).
std::map<std::string, std::pair<fs::path, json>> tensors_of(const fs::path& dir) {
  std::map<std::string, std::pair<fs::path, json>> out;
  for (const auto& f : list_files(dir)) {
    if (f.size() <= 12 || f.substr(f.size() - 12) != ".safetensors" || f.find('/') != std::string::npos) continue;
    const StFile st = read_st(dir / f);
    for (const auto& n : st.tensor_names()) out[n] = {dir / f, st.header[n]};
  }
  return out;
}

// Tensors whose bytes differ between two saves of one layout.
std::set<std::string> changed(const fs::path& a, const fs::path& b) {
  std::set<std::string> out;
  const auto ta = tensors_of(a), tb = tensors_of(b);
  for (const auto& [name, where] : tb)
    if (read_st(ta.at(name).first).tensor(name) != read_st(where.first).tensor(name)) out.insert(name);
  return out;
}

}  // namespace

TEST_CASE("LoRA adapter directory: every encoding, --root, --verify and --squash byte for byte") {
  TempDir t;
  const fs::path series = gen_kind(t / "series", 3, {"--preset", "tiny", "--lora", "8"});
  const fs::path s0 = save_dir(series, 0);
  CHECK(list_files(s0) == std::vector<std::string>{"adapter_config.json", "adapter_model.safetensors"});
  const json cfg = read_json(s0 / "adapter_config.json");
  CHECK(cfg["peft_type"] == "LORA");
  CHECK(cfg["r"] == 8);
  const auto ts = tensors_of(s0);
  CHECK(ts.size() == 2 * 7 * 2);  // A and B of 7 modules in 2 layers
  const json& a = ts.at("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight").second;
  CHECK(a["dtype"] == "F32");
  CHECK(a["shape"] == json::array({8, 128}));
  CHECK(ts.at("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight").second["shape"] == json::array({128, 8}));
  // Step 1 moves only B (A's gradient is zero while B is); later steps move both.
  const std::set<std::string> first = changed(s0, save_dir(series, 1));
  for (const auto& n : first) CHECK_MESSAGE(n.find("lora_B") != std::string::npos, n);
  CHECK(first.size() == 14);
  CHECK(changed(save_dir(series, 1), save_dir(series, 2)).size() == 28);
  all_encodings_round_trip(series, 3, t.path());
}

TEST_CASE("FP8 with block scales: every encoding, --root, --verify and --squash byte for byte") {
  TempDir t;
  const fs::path series = gen_kind(t / "series", 3, {"--preset", "tiny", "--fp8", "--lr", "1e-5"});
  const fs::path s0 = save_dir(series, 0);
  const json cfg = read_json(s0 / "config.json");
  CHECK(cfg["quantization_config"]["quant_method"] == "fp8");
  CHECK(cfg["quantization_config"]["weight_block_size"] == json::array({128, 128}));
  const auto ts = tensors_of(s0);
  const json& q = ts.at("model.layers.0.mlp.gate_proj.weight").second;
  CHECK(q["dtype"] == "F8_E4M3");
  CHECK(q["shape"] == json::array({384, 128}));
  const json& sc = ts.at("model.layers.0.mlp.gate_proj.weight_scale_inv").second;
  CHECK(sc["dtype"] == "F32");
  CHECK(sc["shape"] == json::array({3, 1}));
  CHECK(ts.at("model.embed_tokens.weight").second["dtype"] == "BF16");
  // Both FP8 weights and their scales change from save to save.
  int f8 = 0, scales = 0;
  for (const auto& n : changed(s0, save_dir(series, 1))) {
    const std::string dt = ts.at(n).second["dtype"];
    f8 += dt == "F8_E4M3";
    scales += n.find("weight_scale_inv") != std::string::npos;
  }
  CHECK(f8 > 0);
  CHECK(scales > 0);
  all_encodings_round_trip(series, 3, t.path());
}

TEST_CASE("Qwen3-MoE with 64 experts a layer: every encoding, --root, --verify and --squash byte for byte") {
  TempDir t;
  const fs::path series = gen_kind(t / "series", 2, {"--preset", "tiny-moe", "--max-shard-size", "1MB"});
  const fs::path s0 = save_dir(series, 0);
  const json cfg = read_json(s0 / "config.json");
  CHECK(cfg["model_type"] == "qwen3_moe");
  CHECK(cfg["num_experts"] == 64);
  const auto ts = tensors_of(s0);
  CHECK(ts.size() == 405);
  CHECK(ts.at("model.layers.1.mlp.experts.63.down_proj.weight").second["shape"] == json::array({128, 32}));
  CHECK(ts.at("model.layers.0.mlp.gate.weight").second["shape"] == json::array({64, 128}));
  // Experts the router sent no tokens still move (Adam's momentum), so most change.
  CHECK(changed(s0, save_dir(series, 1)).size() > 200);
  all_encodings_round_trip(series, 2, t.path());
}

TEST_CASE("Qwen3-MoE in FP8 (block scales per expert): every encoding byte for byte") {
  TempDir t;
  const fs::path series = gen_kind(t / "series", 2, {"--preset", "tiny-moe", "--fp8", "--lr", "1e-5"});
  const auto ts = tensors_of(save_dir(series, 0));
  CHECK(ts.at("model.layers.1.mlp.experts.63.up_proj.weight").second["dtype"] == "F8_E4M3");
  CHECK(ts.at("model.layers.1.mlp.experts.63.up_proj.weight_scale_inv").second["shape"] == json::array({1, 1}));
  CHECK(ts.at("model.layers.1.mlp.gate.weight").second["dtype"] == "BF16");
  all_encodings_round_trip(series, 2, t.path());
}
