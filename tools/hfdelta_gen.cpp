// hfdelta-gen: writes a series of HF checkpoint directories that look like
// successive saves of a bf16 training run (test data for diff/apply, demos and
// benchmarks). Besides dense models: mixture-of-experts (Qwen3-MoE layout,
// --experts or the *-moe presets), fine-grained FP8 (--fp8: F8_E4M3 weights
// with an F32 weight_scale_inv per 128x128 block), and PEFT LoRA adapters
// (--lora R: adapter_model.safetensors and adapter_config.json).
//
// Every element's trajectory is a pure function of (seed, tensor name, element
// index, step): an fp32 master weight trained by Adam on pseudo-random
// gradients and rounded to the output dtype at each save. Tensors are cut into
// chunks; a chunk runs all steps and writes its bytes into every save's file at
// once, so memory stays flat whatever the model size, and the output does not
// depend on the thread count or the chunk size.

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

#include <omp.h>

#include <CLI/CLI.hpp>
#include <boost/filesystem.hpp>
#include <nlohmann/json.hpp>

#include "codec/codec.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/safetensors.hpp"
#include "util/io.hpp"

namespace fs = boost::filesystem;
using hfdelta::Error;
using hfdelta::Exit;
using hfdelta::fail;
using nlohmann::json;

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

// ---- model description ------------------------------------------------------

struct ModelShape {
  std::uint64_t hidden = 0, layers = 0, intermediate = 0, vocab = 0;
  std::uint64_t heads = 0, kv_heads = 0, head_dim = 0;
  bool tie_embeddings = false;
  // Mixture of experts (Qwen3-MoE): 0 experts is a dense MLP.
  std::uint64_t experts = 0, experts_per_tok = 0, moe_intermediate = 0;
};

struct Preset {
  const char* name;
  ModelShape shape;
};

// tiny ≈ 1.8 MB, small ≈ 116 MB, qwen3-0.6b ≈ 1.2 GB per bf16 save. tiny and
// small keep a separate lm_head (Llama-like) so that tensor exists in tests.
// tiny-moe ≈ 4.5 MB and 405 tensors (64 experts in each of 2 layers);
// qwen3-moe has Qwen3-30B-A3B's tensor count (48 layers of 128 experts,
// 18 867 tensors) at a width that keeps a bf16 save near 170 MB. qwen3-8b is
// Qwen3-8B's shape, about 16.4 GB per bf16 save (scripts/bench/scale.sh).
const Preset kPresets[] = {
    {"tiny", {128, 2, 384, 2048, 4, 2, 32, false}},
    {"small", {512, 8, 1536, 32000, 8, 4, 64, false}},
    {"qwen3-0.6b", {1024, 28, 3072, 151936, 16, 8, 128, true}},
    {"tiny-moe", {128, 2, 384, 2048, 4, 2, 32, false, 64, 4, 32}},
    {"qwen3-moe", {128, 48, 768, 32000, 4, 2, 32, false, 128, 8, 32}},
    {"qwen3-8b", {4096, 36, 12288, 151936, 32, 8, 128, false}},
};

enum class Dtype { bf16, f16, f32, f8e4m3 };

struct DtypeInfo {
  const char* cli;
  const char* safetensors;
  const char* torch;
  std::size_t size;
};

DtypeInfo dtype_info(Dtype d) {
  switch (d) {
    case Dtype::bf16:
      return {"bf16", "BF16", "bfloat16", 2};
    case Dtype::f16:
      return {"f16", "F16", "float16", 2};
    case Dtype::f32:
      return {"f32", "F32", "float32", 4};
    case Dtype::f8e4m3:
      return {"f8e4m3", "F8_E4M3", "float8_e4m3fn", 1};
  }
  return {"?", "?", "?", 0};
}

// One tensor of the model, with its training character and where it lives.
struct Tensor {
  std::string name;
  std::vector<std::uint64_t> shape;
  bool is_norm = false;      // RMSNorm weight: starts at 1.0
  bool sparse_rows = false;  // embedding: rows of tokens absent from a batch get no gradient
  std::uint64_t elements = 0;
  std::uint64_t cols = 0;  // last dimension; gradient scale varies per row
  std::uint64_t key = 0;   // mix of seed and name: the root of all its random streams
  float grad_scale = 0;    // typical gradient magnitude, near Adam's eps
  float bias = 0;          // strength of a persistent gradient direction
  float row_sigma = 0;     // log-normal spread of per-row, per-step gradient scale
  std::size_t shard = 0;
  std::uint64_t offset = 0;  // absolute file offset of its first byte in its shard
  Dtype dtype = Dtype::bf16;
  // Routed expert rows: rows [k*expert_rows, (k+1)*expert_rows) belong to
  // expert expert_base + k, which gets a gradient only at the steps the router
  // sends it tokens (a whole expert, all three projections, at once).
  std::uint64_t expert_rows = 0, expert_base = 0, layer_key = 0;
  // FP8: index of this weight's weight_scale_inv tensor (written with it);
  // a scale tensor is derived, never trained on its own.
  std::size_t scale = SIZE_MAX;
  bool derived = false;
  bool zero_init = false;      // LoRA B: starts at zero
  bool no_first_grad = false;  // LoRA A: no gradient at step 1, since B is still zero
};

struct Shard {
  std::string file;
  std::vector<std::size_t> tensors;  // indices into the tensor list, in model order
  hfdelta::SafetensorsLayout layout;
};

// ---- counter-based random numbers -----------------------------------------
// No generator state: each value is a hash of what names it, which is what makes
// the output independent of chunking and thread scheduling.

constexpr std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

constexpr std::uint64_t mix(std::uint64_t a, std::uint64_t b) { return splitmix64(a ^ splitmix64(b)); }

// Distinct streams per tensor.
enum Stream : std::uint64_t {
  kInitA = 1,
  kInitB,
  kDirection,
  kNoise,
  kRowScale,
  kRowFreq,
  kRowActive,
  kTensorParams,
};

// Key of a per-element stream: element indices are hashed as 32-bit words, so
// the high half of the index goes into the key (chunks never straddle 2^32).
std::uint32_t element_key(std::uint64_t tensor_key, Stream s, std::uint64_t step, std::uint64_t hi) {
  return static_cast<std::uint32_t>(mix(mix(mix(tensor_key, s), step), hi));
}

// 32-bit hash of (key, index); cheap enough to vectorise in the hot loops.
inline std::uint32_t hash32(std::uint32_t key, std::uint32_t i) {
  std::uint32_t x = i * 0x9E3779B9u + key;
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

// Approximately standard normal: sum of four uniform bytes (Irwin-Hall). Coarse,
// but only used for gradient noise, which Adam normalises anyway.
inline float gauss8(std::uint32_t h) {
  const std::uint32_t s = (h & 0xFF) + ((h >> 8) & 0xFF) + ((h >> 16) & 0xFF) + (h >> 24);
  return (static_cast<float>(s) - 510.0f) * (1.0f / 147.80f);
}

// Approximately standard normal from four 16-bit uniforms: fine enough that the
// initial weights are not visibly gridded at bf16 resolution.
inline float gauss16(std::uint32_t a, std::uint32_t b) {
  const std::uint32_t s = (a & 0xFFFF) + (a >> 16) + (b & 0xFFFF) + (b >> 16);
  return (static_cast<float>(s) - 131070.0f) * (1.0f / 37837.2f);
}

inline double unit(std::uint64_t h) { return static_cast<double>(h >> 11) * 0x1.0p-53; }

std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

// ---- dtype conversion -------------------------------------------------------

inline std::uint16_t to_bf16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40);  // quiet NaN
  return static_cast<std::uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);                 // round to nearest even
}

// IEEE binary16, round to nearest even, with subnormals and overflow to inf.
inline std::uint16_t to_f16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return sign | 0x7E00u;   // NaN
  if (ax >= 0x477FF000u) return sign | 0x7C00u;  // rounds to 65536 or more: inf
  if (ax >= 0x38800000u) {                       // normal in f16: rebias, round the 13 dropped bits
    const std::uint32_t r = ax - 0x38000000u;
    return sign | static_cast<std::uint16_t>((r + 0xFFFu + ((r >> 13) & 1u)) >> 13);
  }
  // Subnormal (units of 2^-24): scaling by 2^24 is exact, nearbyint rounds to
  // even, and 1024 is exactly the encoding of the smallest normal.
  const float scaled = std::bit_cast<float>(ax) * 16777216.0f;
  return sign | static_cast<std::uint16_t>(std::nearbyint(scaled));
}

void encode(const float* w, std::size_t n, Dtype dt, std::uint8_t* out) {
  switch (dt) {
    case Dtype::bf16:
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint16_t v = to_bf16(w[i]);
        std::memcpy(out + 2 * i, &v, 2);
      }
      break;
    case Dtype::f16:
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint16_t v = to_f16(w[i]);
        std::memcpy(out + 2 * i, &v, 2);
      }
      break;
    case Dtype::f32:
      std::memcpy(out, w, 4 * n);
      break;
    case Dtype::f8e4m3:
      fail(Exit::failure, "FP8 weights are quantised with their block scales");
  }
}

// ---- options ----------------------------------------------------------------

struct GenCommandLine {
  std::string outdir;
  std::string preset = "tiny";
  ModelShape shape;
  std::uint64_t saves = 3;
  std::uint64_t steps_per_save = 1;
  double lr = 1e-6;
  std::uint64_t seed = 0;
  std::uint64_t max_shard_size = 256ull << 20;
  bool single_file = false;
  Dtype dtype = Dtype::bf16;
  int threads = 0;  // 0: OpenMP's default
  std::uint64_t chunk = 1ull << 20;
  bool force = false;
  bool json = false;
  bool fp8 = false;             // F8_E4M3 linear weights with 128x128 block scales
  std::uint64_t lora_rank = 0;  // > 0: a PEFT LoRA adapter of this rank instead of the model
  bool stack_experts = false;   // experts of a layer as three [E, rows, cols] tensors
};

constexpr std::uint64_t kFp8Block = 128;  // weight_block_size [128, 128]
constexpr float kFp8Max = 448.0f;         // largest finite F8_E4M3 (e4m3fn)

bool checked_mul(std::uint64_t a, std::uint64_t b, std::uint64_t& out) { return !__builtin_mul_overflow(a, b, &out); }

// ---- the model's tensors ----------------------------------------------------

class TensorList {
 public:
  TensorList(std::uint64_t seed, Dtype dtype) : seed_(seed), dtype_(dtype) {}
  Tensor& add(std::string name, std::vector<std::uint64_t> shape, bool norm, bool sparse = false) {
    Tensor t;
    t.name = std::move(name);
    t.shape = std::move(shape);
    t.is_norm = norm;
    t.sparse_rows = sparse;
    t.dtype = dtype_;
    t.elements = 1;
    for (auto d : t.shape)
      if (!checked_mul(t.elements, d, t.elements) || t.elements > (1ull << 40))
        fail(Exit::usage, "tensor " + t.name + " is too large");
    t.cols = t.shape.back();
    // Keyed by name, not position: a tensor keeps its values if layers are added.
    t.key = mix(seed_, fnv1a(t.name));
    const std::uint64_t p = mix(t.key, kTensorParams);
    // Per-element gradients of a large-batch LLM run are tiny, around Adam's
    // eps, so eps damps the update and the gradient scale (spread over a
    // decade) sets how often a tensor's bf16 values change. The persistent
    // direction and row spread add variation on top.
    t.grad_scale = static_cast<float>(2e-9 * std::pow(10.0, unit(p)));
    t.bias = static_cast<float>(0.6 * unit(splitmix64(p)));
    t.row_sigma = static_cast<float>(0.2 + 0.6 * unit(splitmix64(p + 1)));
    ts_.push_back(std::move(t));
    return ts_.back();
  }
  // A linear weight: with fp8, F8_E4M3 followed by its F32 weight_scale_inv,
  // one per 128x128 block (ceil in both dimensions), as fine-grained FP8
  // checkpoints (DeepSeek-V3, Qwen3-*-FP8) store them.
  Tensor& linear(std::string name, std::vector<std::uint64_t> shape, bool fp8) {
    add(name, shape, false);
    if (!fp8) return ts_.back();
    const std::size_t w = ts_.size() - 1;
    ts_[w].dtype = Dtype::f8e4m3;
    if (ts_[w].elements >= (1ull << 32)) fail(Exit::usage, "FP8 tensor " + ts_[w].name + " is too large");
    std::vector<std::uint64_t> sshape = shape;
    for (auto& d : sshape) d = (d + kFp8Block - 1) / kFp8Block;
    if (sshape.size() == 3) sshape[0] = shape[0];  // stacked experts: blocks per expert
    std::string sname = name;
    sname.replace(sname.size() - std::string("weight").size(), std::string::npos, "weight_scale_inv");
    Tensor& sc = add(sname, sshape, false);
    sc.dtype = Dtype::f32;
    sc.derived = true;
    ts_[w].scale = ts_.size() - 1;
    return ts_[w];
  }
  std::vector<Tensor> take() { return std::move(ts_); }

 private:
  std::uint64_t seed_;
  Dtype dtype_;
  std::vector<Tensor> ts_;
};

// The seven projections LoRA adapts, with (out, in) features.
std::vector<std::pair<std::string, std::pair<std::uint64_t, std::uint64_t>>> lora_targets(const ModelShape& m) {
  const std::uint64_t q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim;
  return {{"self_attn.q_proj", {q, m.hidden}},           {"self_attn.k_proj", {kv, m.hidden}},
          {"self_attn.v_proj", {kv, m.hidden}},          {"self_attn.o_proj", {m.hidden, q}},
          {"mlp.gate_proj", {m.intermediate, m.hidden}}, {"mlp.up_proj", {m.intermediate, m.hidden}},
          {"mlp.down_proj", {m.hidden, m.intermediate}}};
}

// A PEFT adapter: lora_A [r, in] and lora_B [out, r] for every target module,
// named as PEFT's save_pretrained names them.
std::vector<Tensor> lora_tensors(const ModelShape& m, std::uint64_t rank, std::uint64_t seed, Dtype dt) {
  TensorList ts(seed, dt);
  for (std::uint64_t i = 0; i < m.layers; ++i)
    for (const auto& [mod, dims] : lora_targets(m)) {
      const std::string p = "base_model.model.model.layers." + std::to_string(i) + "." + mod + ".";
      Tensor& a = ts.add(p + "lora_A.weight", {rank, dims.second}, false);
      // Adapter gradients are large against Adam's eps (few parameters, each
      // seeing the whole batch), so every element moves by about lr per step.
      a.grad_scale = 1e-3f;
      a.no_first_grad = true;
      Tensor& b = ts.add(p + "lora_B.weight", {dims.first, rank}, false);
      b.grad_scale = 1e-3f;
      b.zero_init = true;
    }
  return ts.take();
}

std::vector<Tensor> model_tensors(const GenCommandLine& o) {
  const ModelShape& m = o.shape;
  if (o.lora_rank > 0) return lora_tensors(m, o.lora_rank, o.seed, o.dtype);
  TensorList ts(o.seed, o.dtype);
  const bool f8 = o.fp8;
  const std::uint64_t q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim;
  ts.add("model.embed_tokens.weight", {m.vocab, m.hidden}, false, true);
  for (std::uint64_t i = 0; i < m.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    ts.linear(p + "self_attn.q_proj.weight", {q, m.hidden}, f8);
    ts.linear(p + "self_attn.k_proj.weight", {kv, m.hidden}, f8);
    ts.linear(p + "self_attn.v_proj.weight", {kv, m.hidden}, f8);
    ts.linear(p + "self_attn.o_proj.weight", {m.hidden, q}, f8);
    ts.add(p + "self_attn.q_norm.weight", {m.head_dim}, true);
    ts.add(p + "self_attn.k_norm.weight", {m.head_dim}, true);
    if (m.experts == 0) {
      ts.linear(p + "mlp.gate_proj.weight", {m.intermediate, m.hidden}, f8);
      ts.linear(p + "mlp.up_proj.weight", {m.intermediate, m.hidden}, f8);
      ts.linear(p + "mlp.down_proj.weight", {m.hidden, m.intermediate}, f8);
    } else {
      // The router stays in the model dtype in FP8 checkpoints.
      ts.add(p + "mlp.gate.weight", {m.experts, m.hidden}, false);
      const std::uint64_t lk = mix(o.seed, fnv1a(p + "mlp.experts"));
      const std::uint64_t mi = m.moe_intermediate, h = m.hidden;
      auto expert = [&](const std::string& name, std::vector<std::uint64_t> shape, std::uint64_t base,
                        std::uint64_t rows) {
        Tensor& t = ts.linear(name, std::move(shape), f8);
        t.layer_key = lk;
        t.expert_base = base;
        t.expert_rows = rows;
      };
      if (o.stack_experts) {
        const std::uint64_t E = m.experts;
        expert(p + "mlp.experts.gate_proj.weight", {E, mi, h}, 0, mi);
        expert(p + "mlp.experts.up_proj.weight", {E, mi, h}, 0, mi);
        expert(p + "mlp.experts.down_proj.weight", {E, h, mi}, 0, h);
      } else {
        for (std::uint64_t e = 0; e < m.experts; ++e) {
          const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
          expert(x + "gate_proj.weight", {mi, h}, e, mi);
          expert(x + "up_proj.weight", {mi, h}, e, mi);
          expert(x + "down_proj.weight", {h, mi}, e, h);
        }
      }
    }
    ts.add(p + "input_layernorm.weight", {m.hidden}, true);
    ts.add(p + "post_attention_layernorm.weight", {m.hidden}, true);
  }
  ts.add("model.norm.weight", {m.hidden}, true);
  if (!m.tie_embeddings) ts.add("lm_head.weight", {m.vocab, m.hidden}, false);
  return ts.take();
}

// Greedy packing in model order, as HF's save_pretrained does: a new shard
// starts when the next tensor would push the current one past the limit.
std::vector<Shard> plan_shards(std::vector<Tensor>& ts, const GenCommandLine& o) {
  std::vector<std::vector<std::size_t>> groups(1);
  std::uint64_t cur = 0;
  for (std::size_t i = 0; i < ts.size(); ++i) {
    const std::uint64_t nb = ts[i].elements * dtype_info(ts[i].dtype).size;
    if (!o.single_file && !groups.back().empty() && cur + nb > o.max_shard_size) {
      groups.emplace_back();
      cur = 0;
    }
    groups.back().push_back(i);
    cur += nb;
  }
  std::vector<Shard> shards(groups.size());
  const std::map<std::string, std::string> meta{{"format", "pt"}};
  for (std::size_t k = 0; k < groups.size(); ++k) {
    Shard& s = shards[k];
    s.tensors = groups[k];
    if (o.lora_rank > 0) {
      s.file = "adapter_model.safetensors";
    } else if (o.single_file) {
      s.file = "model.safetensors";
    } else {
      char buf[64];
      std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", k + 1, groups.size());
      s.file = buf;
    }
    std::vector<hfdelta::TensorSpec> specs;
    std::map<std::string, std::size_t> by_name;
    for (std::size_t i : s.tensors) {
      specs.push_back({ts[i].name, dtype_info(ts[i].dtype).safetensors, ts[i].shape,
                       ts[i].elements * dtype_info(ts[i].dtype).size});
      by_name[ts[i].name] = i;
    }
    s.layout = hfdelta::layout_safetensors(std::move(specs), &meta);
    for (const auto& info : s.layout.tensors) {
      Tensor& t = ts.at(by_name.at(info.name));
      t.shard = k;
      t.offset = s.layout.prefix.size() + info.begin;
    }
  }
  return shards;
}

// ---- training simulation ----------------------------------------------------

constexpr float kBeta1 = 0.9f, kBeta2 = 0.999f, kEps = 1e-8f, kInitStd = 0.02f;

// Gradient scale of one row at one step; 0 for an embedding row whose token is
// not in the batch. Token frequencies are skewed: many rows are rarely hit.
float row_scale(const Tensor& t, std::uint64_t row, std::uint64_t step) {
  if (t.no_first_grad && step == 1) return 0.0f;
  if (t.expert_rows > 0) {
    // Routed expert: each gets tokens at a step with its own probability
    // (load imbalance: 0.5 to 1); without tokens, no gradient (Adam's momentum
    // still moves it).
    const std::uint64_t ek = mix(t.layer_key, t.expert_base + row / t.expert_rows);
    const double p = 0.5 + 0.5 * unit(mix(ek, kRowFreq));
    if (unit(mix(mix(ek, kRowActive), step)) >= p) return 0.0f;
  }
  if (t.sparse_rows) {
    const double u = unit(mix(mix(t.key, kRowFreq), row));
    const double p = 0.02 + 0.98 * u * u;
    if (unit(mix(mix(mix(t.key, kRowActive), row), step)) >= p) return 0.0f;
  }
  const std::uint64_t h = mix(mix(mix(t.key, kRowScale), row), step);
  const float z = gauss16(static_cast<std::uint32_t>(h), static_cast<std::uint32_t>(h >> 32));
  return t.grad_scale * std::exp(t.row_sigma * z);
}

struct Buffers {
  std::vector<float> w, m, v, dir;
  std::vector<std::uint8_t> out, prev;
  std::vector<float> scale;                         // FP8: this chunk's block scales
  std::vector<std::uint8_t> scale_out, scale_prev;  // ... as F32 bytes
  Buffers(std::size_t n, std::size_t es) : w(n), m(n), v(n), dir(n), out(n * es), prev(n * es) {}
};

struct Run {
  const GenCommandLine& o;
  const std::vector<Tensor>& tensors;
  std::vector<std::vector<hfdelta::File>>& files;  // [save][shard]; pwrite is safe across threads
};

// F8_E4M3 (e4m3fn: bias 7, no infinities, 0x7F NaN), round to nearest even,
// saturating at 448 as FP8 quantisers do.
inline std::uint8_t to_e4m3(float f) {
  const std::uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::fabs(f);
  if (std::isnan(f)) return 0x7F;
  if (a >= kFp8Max) return sign | 0x7E;
  int e = 0;
  std::frexp(a, &e);
  int E = std::max(e - 1, -6);                     // unbiased exponent; below -6 the subnormal grid
  float q = std::nearbyint(std::ldexp(a, 3 - E));  // multiples of 2^(E-3)
  if (q >= 16.0f) {
    ++E;
    q = 8.0f;
  }
  if (q < 8.0f) return sign | static_cast<std::uint8_t>(q);  // E == -6: subnormal (or zero)
  const int bits = ((E + 7) << 3) | (static_cast<int>(q) - 8);
  return sign | static_cast<std::uint8_t>(std::min(bits, 0x7E));
}

// FP8 blocks of one chunk: matrix shape R x C (the last two dimensions), and
// the chunk's first row within its matrix and row count.
struct Fp8Chunk {
  std::uint64_t R = 0, C = 0, row0 = 0, rows = 0, first_scale = 0, nscales = 0, ncb = 0;
};

Fp8Chunk fp8_chunk(const Tensor& t, std::uint64_t a, std::uint64_t b) {
  Fp8Chunk c;
  c.C = t.shape.back();
  c.R = t.shape.size() >= 2 ? t.shape[t.shape.size() - 2] : 1;
  const std::uint64_t mat = a / (c.R * c.C);
  c.row0 = (a - mat * c.R * c.C) / c.C;
  c.rows = (b - a) / c.C;
  c.ncb = (c.C + kFp8Block - 1) / kFp8Block;
  const std::uint64_t nrb = (c.R + kFp8Block - 1) / kFp8Block;
  c.first_scale = (mat * nrb + c.row0 / kFp8Block) * c.ncb;
  c.nscales = ((c.rows + kFp8Block - 1) / kFp8Block) * c.ncb;
  return c;
}

// Quantises the chunk's master weights: per 128x128 block, scale_inv =
// amax / 448 (F32) and q = e4m3(w / scale_inv).
void quantise_fp8(const Fp8Chunk& c, const float* w, Buffers& buf) {
  const std::size_t ns = c.nscales;
  buf.scale.assign(ns, 0.0f);
  for (std::uint64_t r = 0; r < c.rows; ++r)
    for (std::uint64_t col = 0; col < c.C; ++col) {
      float& s = buf.scale[(r / kFp8Block) * c.ncb + col / kFp8Block];
      s = std::max(s, std::fabs(w[r * c.C + col]));
    }
  for (auto& s : buf.scale) s = s > 0.0f ? s / kFp8Max : 1.0f;
  for (std::uint64_t r = 0; r < c.rows; ++r)
    for (std::uint64_t col = 0; col < c.C; ++col) {
      const float s = buf.scale[(r / kFp8Block) * c.ncb + col / kFp8Block];
      buf.out[r * c.C + col] = to_e4m3(w[r * c.C + col] / s);
    }
  buf.scale_out.resize(4 * ns);
  std::memcpy(buf.scale_out.data(), buf.scale.data(), 4 * ns);
}

// One chunk [a, b) of one tensor through every step, writing each save's bytes.
void run_chunk(const Run& r, const Tensor& t, std::uint64_t a, std::uint64_t b, Buffers& buf,
               std::vector<std::uint64_t>& changed) {
  const std::size_t n = b - a;
  const std::uint64_t hi = a >> 32;
  const std::size_t es = dtype_info(t.dtype).size;
  const bool fp8 = t.scale != SIZE_MAX;
  float* w = buf.w.data();
  float* m = buf.m.data();
  float* v = buf.v.data();
  float* dir = buf.dir.data();
  const auto lo0 = static_cast<std::uint32_t>(a);

  if (t.is_norm) {
    std::fill_n(w, n, 1.0f);
  } else if (t.zero_init) {
    std::fill_n(w, n, 0.0f);
  } else {
    const std::uint32_t ka = element_key(t.key, kInitA, 0, hi), kb = element_key(t.key, kInitB, 0, hi);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t lo = lo0 + static_cast<std::uint32_t>(i);
      w[i] = (t.no_first_grad ? 1.0f / std::sqrt(float(t.cols)) : kInitStd) * gauss16(hash32(ka, lo), hash32(kb, lo));
    }
  }
  const std::uint32_t kd = element_key(t.key, kDirection, 0, hi);
  for (std::size_t i = 0; i < n; ++i) {
    dir[i] = t.bias * gauss8(hash32(kd, lo0 + static_cast<std::uint32_t>(i)));
    m[i] = 0.0f;
    v[i] = 0.0f;
  }

  auto write = [&](std::uint64_t save, const std::vector<std::uint8_t>& bytes) {
    r.files[save][t.shard].pwrite_all(bytes.data(), n * es, t.offset + a * es);
  };
  Fp8Chunk fc;
  const Tensor* sct = fp8 ? &r.tensors[t.scale] : nullptr;
  auto save_bytes = [&](std::uint64_t save) {  // encodes w into buf.out (and the scales), writes them
    if (!fp8) {
      encode(w, n, t.dtype, buf.out.data());
    } else {
      quantise_fp8(fc, w, buf);
      r.files[save][sct->shard].pwrite_all(buf.scale_out.data(), buf.scale_out.size(),
                                           sct->offset + 4 * fc.first_scale);
    }
    write(save, buf.out);
  };
  if (fp8) fc = fp8_chunk(t, a, b);
  save_bytes(0);
  std::swap(buf.out, buf.prev);
  std::swap(buf.scale_out, buf.scale_prev);

  const std::uint64_t K = r.o.steps_per_save;
  for (std::uint64_t s = 1; s <= r.o.saves; ++s) {
    for (std::uint64_t k = 1; k <= K; ++k) {
      const std::uint64_t step = (s - 1) * K + k;
      const std::uint32_t kn = element_key(t.key, kNoise, step, hi);
      // Bias-corrected Adam folded into two constants.
      const auto st = static_cast<double>(step);
      const auto c1 = static_cast<float>(r.o.lr / (1.0 - std::pow(double(kBeta1), st)));
      const auto c2 = static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(double(kBeta2), st)));
      for (std::uint64_t row = a / t.cols; row * t.cols < b; ++row) {
        const float rs = row_scale(t, row, step);
        const std::size_t i0 = std::max(a, row * t.cols) - a;
        const std::size_t i1 = std::min(b, (row + 1) * t.cols) - a;
        for (std::size_t i = i0; i < i1; ++i) {
          const float g = rs * (dir[i] + gauss8(hash32(kn, lo0 + static_cast<std::uint32_t>(i))));
          m[i] = kBeta1 * m[i] + (1.0f - kBeta1) * g;
          v[i] = kBeta2 * v[i] + (1.0f - kBeta2) * (g * g);
          w[i] -= c1 * m[i] / (std::sqrt(v[i]) * c2 + kEps);
        }
      }
    }
    save_bytes(s);
    changed[s] += hfdelta::count_changes({buf.out.data(), n * es}, {buf.prev.data(), n * es}, es).elements;
    if (fp8)
      changed[s] += hfdelta::count_changes({buf.scale_out.data(), buf.scale_out.size()},
                                           {buf.scale_prev.data(), buf.scale_prev.size()}, 4)
                        .elements;
    std::swap(buf.out, buf.prev);
    std::swap(buf.scale_out, buf.scale_prev);
  }
}

// ---- small files --------------------------------------------------------------

// Qwen's special token ids where the vocabulary has them, else its last ids.
std::uint64_t bos_id(const ModelShape& m) {
  return m.vocab > 151645 ? 151643 : m.vocab - std::min<std::uint64_t>(m.vocab, 3);
}
std::uint64_t eos_id(const ModelShape& m) { return m.vocab > 151645 ? 151645 : m.vocab - 1; }

json config_json(const GenCommandLine& o) {
  const ModelShape& m = o.shape;
  const Dtype dt = o.dtype;
  const std::uint64_t bos = bos_id(m), eos = eos_id(m);
  json c = {
      {"architectures", {"Qwen3ForCausalLM"}},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"bos_token_id", bos},
      {"eos_token_id", eos},
      {"head_dim", m.head_dim},
      {"hidden_act", "silu"},
      {"hidden_size", m.hidden},
      {"initializer_range", 0.02},
      {"intermediate_size", m.intermediate},
      {"max_position_embeddings", 40960},
      {"max_window_layers", m.layers},
      {"model_type", "qwen3"},
      {"num_attention_heads", m.heads},
      {"num_hidden_layers", m.layers},
      {"num_key_value_heads", m.kv_heads},
      {"rms_norm_eps", 1e-6},
      {"rope_scaling", nullptr},
      {"rope_theta", 1000000},
      {"sliding_window", nullptr},
      {"tie_word_embeddings", m.tie_embeddings},
      {"torch_dtype", dtype_info(dt).torch},
      {"transformers_version", "4.51.0"},
      {"use_cache", true},
      {"use_sliding_window", false},
      {"vocab_size", m.vocab},
  };
  if (m.experts > 0) {  // Qwen3-MoE: every layer sparse
    c["architectures"] = {"Qwen3MoeForCausalLM"};
    c["model_type"] = "qwen3_moe";
    c["num_experts"] = m.experts;
    c["num_experts_per_tok"] = m.experts_per_tok;
    c["moe_intermediate_size"] = m.moe_intermediate;
    c["decoder_sparse_step"] = 1;
    c["mlp_only_layers"] = json::array();
    c["norm_topk_prob"] = true;
    c["output_router_logits"] = false;
    c["router_aux_loss_coef"] = 0.001;
  }
  if (o.fp8)
    c["quantization_config"] = {{"activation_scheme", "dynamic"},
                                {"fmt", "e4m3"},
                                {"quant_method", "fp8"},
                                {"weight_block_size", {kFp8Block, kFp8Block}}};
  return c;
}

// PEFT's adapter_config.json for a LoRA of rank r on the seven projections.
json adapter_config_json(const GenCommandLine& o) {
  json targets = json::array();
  for (const auto& [mod, dims] : lora_targets(o.shape)) targets.push_back(mod.substr(mod.find('.') + 1));
  return {{"alpha_pattern", json::object()},
          {"auto_mapping", nullptr},
          {"base_model_name_or_path", "hfdelta-gen/" + o.preset},
          {"bias", "none"},
          {"fan_in_fan_out", false},
          {"inference_mode", true},
          {"init_lora_weights", true},
          {"layers_pattern", nullptr},
          {"layers_to_transform", nullptr},
          {"lora_alpha", 2 * o.lora_rank},
          {"lora_dropout", 0.0},
          {"modules_to_save", nullptr},
          {"peft_type", "LORA"},
          {"r", o.lora_rank},
          {"rank_pattern", json::object()},
          {"revision", nullptr},
          {"target_modules", targets},
          {"task_type", "CAUSAL_LM"},
          {"use_dora", false},
          {"use_rslora", false}};
}

json generation_config_json(const ModelShape& m) {
  const std::uint64_t bos = bos_id(m), eos = eos_id(m);
  return {{"bos_token_id", bos},
          {"do_sample", true},
          {"eos_token_id", {eos, bos}},
          {"pad_token_id", bos},
          {"temperature", 0.6},
          {"top_k", 20},
          {"top_p", 0.95},
          {"transformers_version", "4.51.0"}};
}

json tokenizer_config_json() {
  return {{"add_bos_token", false},        {"add_prefix_space", false},
          {"bos_token", nullptr},          {"clean_up_tokenization_spaces", false},
          {"eos_token", "<|im_end|>"},     {"errors", "replace"},
          {"model_max_length", 131072},    {"pad_token", "<|endoftext|>"},
          {"split_special_tokens", false}, {"tokenizer_class", "Qwen2Tokenizer"},
          {"unk_token", nullptr}};
}

void write_small_file(const fs::path& path, const std::string& content) {
  hfdelta::File f(path, hfdelta::File::Mode::create_exclusive);
  f.write_all(content.data(), content.size());
  f.sync();
  f.close();
}

std::string save_name(std::uint64_t s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "save_%03llu", static_cast<unsigned long long>(s));
  return buf;
}

// Raises the soft limit on open files when many saves x shards need it.
void ensure_open_files(std::uint64_t needed) {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= needed) return;
  if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < needed)
    fail(Exit::usage, std::to_string(needed) + " open files needed (saves x shards) but the limit is " +
                          std::to_string(rl.rlim_max) + ": use fewer saves or a larger --max-shard-size");
  rl.rlim_cur = needed;
  if (::setrlimit(RLIMIT_NOFILE, &rl) != 0)
    fail(Exit::failure, std::string("cannot raise the open file limit: ") + std::strerror(errno));
}

bool path_exists(const fs::path& p) { return fs::symlink_status(p).type() != fs::file_not_found; }

// ---- the steps of a run ------------------------------------------------------

void validate(const GenCommandLine& o) {
  const ModelShape& m = o.shape;
  const std::pair<const char*, std::uint64_t> dims[] = {
      {"--hidden", m.hidden}, {"--layers", m.layers},     {"--intermediate", m.intermediate}, {"--vocab", m.vocab},
      {"--heads", m.heads},   {"--kv-heads", m.kv_heads}, {"--head-dim", m.head_dim}};
  for (const auto& [flag, value] : dims)
    if (value == 0 || value >= (1ull << 32)) fail(Exit::usage, std::string(flag) + " must be between 1 and 2^32-1");
  if (m.heads % m.kv_heads != 0) fail(Exit::usage, "--heads must be a multiple of --kv-heads");
  if (o.steps_per_save == 0) fail(Exit::usage, "--steps-per-save must be at least 1");
  if (o.saves > 100000) fail(Exit::usage, "--saves is limited to 100000");
  if (!(o.lr >= 0.0) || !std::isfinite(o.lr)) fail(Exit::usage, "--lr must be a finite number >= 0");
  if (o.max_shard_size == 0) fail(Exit::usage, "--max-shard-size must be positive");
  if (m.experts > 0 && (m.experts_per_tok == 0 || m.experts_per_tok > m.experts || m.moe_intermediate == 0))
    fail(Exit::usage, "--experts needs --experts-per-tok between 1 and --experts, and --moe-intermediate");
  if (o.lora_rank > 0 && (o.fp8 || m.experts > 0))
    fail(Exit::usage, "--lora adapts a dense model: not with --fp8 or --experts");
  if (o.stack_experts && m.experts == 0) fail(Exit::usage, "--stack-experts needs --experts");
  if (o.chunk == 0 || !std::has_single_bit(o.chunk) || o.chunk > (1ull << 30))
    fail(Exit::usage, "--chunk-elements must be a power of two up to 2^30");
}

// The model's tensors, packed into shard files, with their totals.
struct Model {
  std::vector<Tensor> tensors;
  std::vector<Shard> shards;
  std::uint64_t elements = 0, tensor_bytes = 0;
};

Model plan_model(const GenCommandLine& o) {
  Model model;
  model.tensors = model_tensors(o);
  model.shards = plan_shards(model.tensors, o);
  for (const auto& t : model.tensors) {
    model.elements += t.elements;
    model.tensor_bytes += t.elements * dtype_info(t.dtype).size;
  }
  return model;
}

// Small files (name, content), identical in every save.
using SmallFiles = std::vector<std::pair<std::string, std::string>>;

SmallFiles small_files(const GenCommandLine& o, const Model& model) {
  SmallFiles small;
  if (o.lora_rank > 0) {  // an adapter directory: no model config, one weight file
    small.emplace_back("adapter_config.json", adapter_config_json(o).dump(2) + "\n");
    return small;
  }
  small.emplace_back("config.json", config_json(o).dump(2) + "\n");
  small.emplace_back("generation_config.json", generation_config_json(o.shape).dump(2) + "\n");
  small.emplace_back("tokenizer_config.json", tokenizer_config_json().dump(2) + "\n");
  if (!o.single_file) {
    json wm = json::object();
    for (const auto& t : model.tensors) wm[t.name] = model.shards[t.shard].file;
    json index = {{"metadata", {{"total_size", model.tensor_bytes}}}, {"weight_map", wm}};
    small.emplace_back("model.safetensors.index.json", index.dump(2) + "\n");
  }
  return small;
}

// Where the saves go: each is built under a hidden temporary name and renamed
// when complete, so an interrupted run never leaves a save that looks finished.
struct SaveDirs {
  fs::path outdir;
  std::vector<fs::path> finals, temps;  // [save]
};

// Checks no save is in the way (unless --force), then creates every save's
// temporary directory with its small files.
SaveDirs prepare_saves(const GenCommandLine& o, std::size_t nshards, const SmallFiles& small) {
  SaveDirs d;
  d.outdir = fs::absolute(fs::path(o.outdir)).lexically_normal();
  const std::uint64_t nsaves = o.saves + 1;
  ensure_open_files(nsaves * nshards + 64);
  fs::create_directories(d.outdir);
  for (std::uint64_t s = 0; s < nsaves; ++s) {
    d.finals.push_back(d.outdir / save_name(s));
    d.temps.push_back(d.outdir / ("." + save_name(s) + ".partial"));
    if (path_exists(d.finals.back()) && !o.force)
      fail(Exit::exists, d.finals.back(), "already exists (use --force to replace it)");
  }
  for (std::uint64_t s = 0; s < nsaves; ++s) {
    if (o.force) fs::remove_all(d.finals[s]);
    fs::remove_all(d.temps[s]);  // left by an interrupted run
    fs::create_directory(d.temps[s]);
    for (const auto& [name, content] : small) write_small_file(d.temps[s] / name, content);
  }
  return d;
}

using ShardFiles = std::vector<std::vector<hfdelta::File>>;  // [save][shard]

// Every save's shard files, sized and with their headers written. They stay
// open: each chunk writes into all of them.
ShardFiles open_shard_files(const SaveDirs& d, const std::vector<Shard>& shards) {
  ShardFiles files(d.temps.size());
  for (std::size_t s = 0; s < d.temps.size(); ++s) {
    for (const auto& sh : shards) {
      hfdelta::File f(d.temps[s] / sh.file, hfdelta::File::Mode::create_exclusive);
      if (::ftruncate(f.fd(), static_cast<off_t>(sh.layout.file_size)) != 0)
        fail(Exit::failure, f.path(), std::string("cannot set size: ") + std::strerror(errno));
      f.pwrite_all(sh.layout.prefix.data(), sh.layout.prefix.size(), 0);
      files[s].push_back(std::move(f));
    }
  }
  return files;
}

// One work item: elements [begin, end) of one tensor.
struct Work {
  std::size_t tensor;
  std::uint64_t begin, end;
};

// An FP8 weight is cut at 128-row bands of each matrix (its last two
// dimensions), so that every chunk holds whole scale blocks; its scale tensor
// is written with it.
std::vector<Work> cut_work(const std::vector<Tensor>& tensors, std::uint64_t chunk) {
  std::vector<Work> work;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (t.derived) continue;
    if (t.scale == SIZE_MAX) {
      for (std::uint64_t a = 0; a < t.elements; a += chunk) work.push_back({i, a, std::min(t.elements, a + chunk)});
      continue;
    }
    const std::uint64_t C = t.shape.back(), R = t.shape.size() >= 2 ? t.shape[t.shape.size() - 2] : 1;
    const std::uint64_t band = std::max<std::uint64_t>(1, chunk / (kFp8Block * C)) * kFp8Block;
    for (std::uint64_t m0 = 0; m0 < t.elements; m0 += R * C)
      for (std::uint64_t r0 = 0; r0 < R; r0 += band) work.push_back({i, m0 + r0 * C, m0 + std::min(R, r0 + band) * C});
  }
  return work;
}

// Trains every chunk through every step on all threads, writing each save's
// bytes; returns the number of elements changed at each save. The first
// error of any thread stops the others and is rethrown.
std::vector<std::uint64_t> write_chunks(const GenCommandLine& o, const std::vector<Tensor>& tensors,
                                        ShardFiles& files) {
  const std::vector<Work> work = cut_work(tensors, o.chunk);
  const Run r{o, tensors, files};
  const std::uint64_t nsaves = o.saves + 1;
  const std::size_t es = 4;  // the widest element
  std::vector<std::uint64_t> changed(nsaves, 0);
  std::exception_ptr error;
  std::atomic<bool> failed{false};
  std::uint64_t largest = 0;
  for (const auto& wk : work) largest = std::max(largest, wk.end - wk.begin);
  const auto chunk_cap = static_cast<std::size_t>(largest);
  const auto nwork = static_cast<std::int64_t>(work.size());
#pragma omp parallel
  {
    std::vector<std::uint64_t> local(nsaves, 0);
    std::unique_ptr<Buffers> buf;
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t wi = 0; wi < nwork; ++wi) {
      if (failed.load(std::memory_order_relaxed)) continue;
      try {
        if (!buf) buf = std::make_unique<Buffers>(chunk_cap, es);
        const Work& wk = work[static_cast<std::size_t>(wi)];
        run_chunk(r, tensors[wk.tensor], wk.begin, wk.end, *buf, local);
      } catch (...) {
#pragma omp critical(hfdelta_gen_error)
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
#pragma omp critical(hfdelta_gen_sum)
    for (std::uint64_t s = 0; s < nsaves; ++s) changed[s] += local[s];
  }
  if (error) std::rethrow_exception(error);
  return changed;
}

// Flushes and closes every shard file, then gives each save its final name.
void publish_saves(ShardFiles& files, const SaveDirs& d) {
  for (auto& per_save : files)
    for (auto& f : per_save) {
      f.sync();
      f.close();
    }
  files.clear();
  for (std::size_t s = 0; s < d.temps.size(); ++s) {
    hfdelta::sync_dir(d.temps[s]);
    fs::rename(d.temps[s], d.finals[s]);
  }
  hfdelta::sync_dir(d.outdir);
}

// ---- the report -----------------------------------------------------------------

// What a run wrote, for the report.
struct Written {
  const Model& model;
  const SaveDirs& dirs;
  const std::vector<std::uint64_t>& changed;  // [save]
  std::size_t small_count = 0;                // small files per save
  std::uint64_t bytes_per_save = 0;
  double seconds = 0;
};

double changed_fraction(const Written& w, std::uint64_t s) {
  return w.model.elements ? double(w.changed[s]) / double(w.model.elements) : 0.0;
}

// One line per save on stderr.
void print_saves(const GenCommandLine& o, const Written& w) {
  for (std::uint64_t s = 0; s < w.changed.size(); ++s)
    std::fprintf(stderr, "hfdelta-gen: %s step=%llu files=%zu bytes=%llu changed=%llu/%llu (%.3f%%)\n",
                 save_name(s).c_str(), static_cast<unsigned long long>(s * o.steps_per_save),
                 w.model.shards.size() + w.small_count, static_cast<unsigned long long>(w.bytes_per_save),
                 static_cast<unsigned long long>(w.changed[s]), static_cast<unsigned long long>(w.model.elements),
                 100.0 * changed_fraction(w, s));
}

json params_json(const GenCommandLine& o) {
  const ModelShape& m = o.shape;
  return {{"preset", o.preset},
          {"hidden_size", m.hidden},
          {"num_hidden_layers", m.layers},
          {"intermediate_size", m.intermediate},
          {"vocab_size", m.vocab},
          {"num_attention_heads", m.heads},
          {"num_key_value_heads", m.kv_heads},
          {"head_dim", m.head_dim},
          {"tie_word_embeddings", m.tie_embeddings},
          {"dtype", dtype_info(o.dtype).cli},
          {"saves", o.saves},
          {"steps_per_save", o.steps_per_save},
          {"lr", o.lr},
          {"seed", o.seed},
          {"max_shard_size", o.max_shard_size},
          {"single_file", o.single_file},
          {"chunk_elements", o.chunk},
          {"num_experts", m.experts},
          {"num_experts_per_tok", m.experts_per_tok},
          {"moe_intermediate_size", m.moe_intermediate},
          {"stack_experts", o.stack_experts},
          {"fp8", o.fp8},
          {"lora_rank", o.lora_rank}};
}

// The --json description of the series, on stdout.
void print_series_json(const GenCommandLine& o, const Written& w) {
  json series = json::array();
  json paths = json::array();
  for (std::uint64_t s = 0; s < w.changed.size(); ++s) {
    paths.push_back(w.dirs.finals[s].string());
    series.push_back({{"name", save_name(s)},
                      {"path", w.dirs.finals[s].string()},
                      {"step", s * o.steps_per_save},
                      {"changed_elements", w.changed[s]},
                      {"changed_fraction", changed_fraction(w, s)}});
  }
  json shard_files = json::array();
  for (const auto& s : w.model.shards) shard_files.push_back(s.file);
  json out = {
      {"outdir", w.dirs.outdir.string()},
      {"paths", paths},
      {"saves", series},
      {"tensors", w.model.tensors.size()},
      {"elements", w.model.elements},
      {"tensor_bytes", w.model.tensor_bytes},
      {"bytes_per_save", w.bytes_per_save},
      {"shard_files", shard_files},
      {"threads", omp_get_max_threads()},
      {"seconds", w.seconds},
      {"params", params_json(o)},
  };
  std::printf("%s\n", out.dump().c_str());
}

// ---- the run, step by step -----------------------------------------------------

int run(GenCommandLine& o) {
  validate(o);
  if (o.threads > 0) omp_set_num_threads(o.threads);
  const auto t0 = std::chrono::steady_clock::now();
  const Model model = plan_model(o);
  const SmallFiles small = small_files(o, model);
  std::uint64_t bytes_per_save = 0;
  for (const auto& s : model.shards) bytes_per_save += s.layout.file_size;
  for (const auto& [name, content] : small) bytes_per_save += content.size();

  const SaveDirs dirs = prepare_saves(o, model.shards.size(), small);
  ShardFiles files = open_shard_files(dirs, model.shards);
  const std::vector<std::uint64_t> changed = write_chunks(o, model.tensors, files);
  publish_saves(files, dirs);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const Written w{model, dirs, changed, small.size(), bytes_per_save, secs};
  print_saves(o, w);
  if (o.json) print_series_json(o, w);
  return 0;
}

// ---- the command line ---------------------------------------------------------------

// Shape overrides, applied on top of the preset, and the dtype, as given.
constexpr int kDims = 10;
const char* const kDimFlags[kDims] = {"--hidden",          "--layers",          "--intermediate", "--vocab",
                                      "--heads",           "--kv-heads",        "--head-dim",     "--experts",
                                      "--experts-per-tok", "--moe-intermediate"};
std::uint64_t ModelShape::*const kDimFields[kDims] = {
    &ModelShape::hidden,          &ModelShape::layers,          &ModelShape::intermediate, &ModelShape::vocab,
    &ModelShape::heads,           &ModelShape::kv_heads,        &ModelShape::head_dim,     &ModelShape::experts,
    &ModelShape::experts_per_tok, &ModelShape::moe_intermediate};

struct ShapeArgs {
  std::uint64_t dims[kDims] = {};
  CLI::Option* dim_opts[kDims] = {};
  bool tie = false;
  CLI::Option* tie_opt = nullptr;
  std::string dtype = "bf16";
  CLI::Option* dtype_opt = nullptr;
  CLI::Option* lr_opt = nullptr;
};

void add_shape_options(CLI::App& app, GenCommandLine& o, ShapeArgs& a) {
  std::vector<std::string> presets;
  for (const auto& p : kPresets) presets.emplace_back(p.name);
  app.add_option("--preset", o.preset, "Model size to start from")
      ->check(CLI::IsMember(presets))
      ->capture_default_str();
  for (int i = 0; i < kDims; ++i)
    a.dim_opts[i] = app.add_option(kDimFlags[i], a.dims[i], "Override the preset's value");
  a.tie_opt =
      app.add_flag("--tie-embeddings,!--no-tie-embeddings", a.tie, "Share embed_tokens with lm_head (override)");
}

void add_run_options(CLI::App& app, GenCommandLine& o, ShapeArgs& a) {
  app.add_option("--saves", o.saves, "Saves after the initial one")->capture_default_str();
  app.add_option("--steps-per-save", o.steps_per_save, "Optimizer steps between saves")->capture_default_str();
  a.lr_opt = app.add_option("--lr", o.lr, "Adam learning rate (--lora: default 1e-4)")->capture_default_str();
  app.add_option("--seed", o.seed, "Random seed")->capture_default_str();
  app.add_option("--max-shard-size", o.max_shard_size, "Largest shard (e.g. 200MB, 1GiB)")
      ->transform(CLI::AsSizeValue(true))
      ->capture_default_str();
  app.add_flag("--single-file", o.single_file, "Write one model.safetensors, no index");
  a.dtype_opt = app.add_option("--dtype", a.dtype, "Output dtype (--lora: default f32, as PEFT keeps adapters)")
                    ->check(CLI::IsMember({"bf16", "f16", "f32"}))
                    ->capture_default_str();
  app.add_flag("--fp8", o.fp8,
               "Linear weights in F8_E4M3 with an F32 weight_scale_inv per 128x128 block (fine-grained FP8)");
  app.add_option("--lora", o.lora_rank,
                 "Write a PEFT LoRA adapter of this rank for the model (adapter_model.safetensors, "
                 "adapter_config.json) instead of the model")
      ->check(CLI::Range(1, 4096));
  app.add_flag("--stack-experts", o.stack_experts,
               "Each layer's experts as three [experts, rows, cols] tensors (same bytes, fewer tensors)");
  app.add_option("--threads", o.threads, "Worker threads (default: all cores)")->check(CLI::Range(1, 4096));
  app.add_option("--chunk-elements", o.chunk, "Elements per work item (power of two; output does not depend on it)")
      ->capture_default_str();
  app.add_flag("--force", o.force, "Replace existing save directories");
  app.add_flag("--json", o.json, "Print a JSON description of the series on stdout");
}

// The model shape (the preset's, with the overrides given) and the dtype.
void resolve_shape(GenCommandLine& o, const ShapeArgs& a) {
  for (const auto& p : kPresets)
    if (o.preset == p.name) o.shape = p.shape;
  for (int i = 0; i < kDims; ++i)
    if (a.dim_opts[i]->count() > 0) o.shape.*kDimFields[i] = a.dims[i];
  if (a.tie_opt->count() > 0) o.shape.tie_embeddings = a.tie;
  o.dtype = a.dtype == "f16" ? Dtype::f16 : a.dtype == "f32" ? Dtype::f32 : Dtype::bf16;
  if (o.lora_rank > 0) {
    if (a.dtype_opt->count() == 0) o.dtype = Dtype::f32;
    if (a.lr_opt->count() == 0) o.lr = 1e-4;
    o.single_file = true;
  }
}

}  // namespace

int main(int argc, char** argv) {
  GenCommandLine o;
  ShapeArgs a;
  CLI::App app{
      "Writes OUTDIR/save_000 .. save_NNN: HF checkpoints resembling successive saves of a "
      "training run (test data for hfdelta)",
      "hfdelta-gen"};
  app.add_option("OUTDIR", o.outdir, "Directory to write the saves into")->required();
  app.set_version_flag("--version", std::string("hfdelta-gen (hfdelta) ") + HFDELTA_PROGRAM_VERSION,
                       "Print the program's version and exit");
  add_shape_options(app, o, a);
  add_run_options(app, o, a);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : static_cast<int>(Exit::usage);
  }
  try {
    resolve_shape(o, a);
    return run(o);
  } catch (const Error& e) {
    std::fprintf(stderr, "hfdelta-gen: error: %s\n", e.what());
    return static_cast<int>(e.code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hfdelta-gen: error: %s\n", e.what());
    return static_cast<int>(Exit::failure);
  }
}
