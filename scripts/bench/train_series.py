#!/usr/bin/env python3
"""Series of bf16 saves from REAL training, and what hfdelta's encodings make of them.

Run by scripts/bench/train-series.sh (which picks the virtual environment). Builds a
small transformers causal LM from a config (byte-level: vocabulary 256, the
tokens are the bytes of the text, so nothing is downloaded), pre-trains it
briefly on text this machine has (licences, copyright files, Python's standard
library), then for each learning rate runs AdamW steps on the fp32 master
weights from the same pre-trained state, saving a bf16 copy with
save_pretrained after every step. For each consecutive pair of saves it runs
`hfdelta-bench bound` (order-0 bound and the bound given each base element's
exponent) and `delta-diff` with each encoding, and writes OUT/results.md
(and OUT/results.json) with the table, plus per-exponent facts computed in
torch: the change probability per base exponent and the share of changes that
are exactly one ulp.
"""

import argparse
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

ENCODINGS = ("context", "sparse", "auto", "xor", "overwrite")
STAGES = []


def stage(name, t0):
    dt = time.monotonic() - t0
    STAGES.append((name, dt))
    print(f"train-series: {name}: {dt:.1f} s", flush=True)


def build_model(hidden, layers, inter, heads, kv_heads):
    common = dict(
        vocab_size=256,
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=inter,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    for cfg_name, model_name, extra in (
        ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": hidden // heads}),
        ("Qwen2Config", "Qwen2ForCausalLM", {}),
        ("LlamaConfig", "LlamaForCausalLM", {}),
    ):
        if hasattr(transformers, cfg_name) and hasattr(transformers, model_name):
            cfg = getattr(transformers, cfg_name)(**common, **extra)
            model = getattr(transformers, model_name)(cfg)
            return model, model_name
    raise SystemExit("train-series: transformers has none of Qwen3, Qwen2, Llama")


def load_text(limit):
    """Bytes of text files this machine has: licences, copyright files, Python's stdlib."""
    paths = sorted(glob.glob("/usr/share/common-licenses/*"))
    paths += sorted(glob.glob("/usr/share/doc/*/copyright"))
    libdir = os.path.dirname(os.__file__)
    for root, dirs, files in os.walk(libdir):
        dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "dist-packages", "test", "tests"))
        paths += [os.path.join(root, f) for f in sorted(files) if f.endswith(".py")]
    chunks, total = [], 0
    for p in paths:
        if total >= limit:
            break
        try:
            if not os.path.isfile(p):
                continue
            with open(p, "rb") as f:
                b = f.read(limit - total)
        except OSError:
            continue
        chunks.append(b)
        total += len(b)
    data = b"\n".join(chunks)
    if len(data) < 1 << 16:
        raise SystemExit(f"train-series: found only {len(data)} bytes of text")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def batches(data, batch, seq, gen):
    while True:
        idx = torch.randint(0, len(data) - seq - 1, (batch,), generator=gen)
        yield torch.stack([data[i:i + seq] for i in idx.tolist()])


def train_step(model, opt, x):
    out = model(input_ids=x, labels=x)
    opt.zero_grad(set_to_none=True)
    out.loss.backward()
    opt.step()
    return out.loss.item()


def bf16_bits(model):
    """Every parameter as bf16 (what the save holds), viewed as int16 bits, flattened."""
    return {n: p.detach().to(torch.bfloat16).view(torch.int16).reshape(-1).clone()
            for n, p in model.named_parameters()}


def save_bf16(model, path):
    # A bf16 copy of the weights is saved; the fp32 master (model) keeps training.
    state = {n: t.detach().to(torch.bfloat16).contiguous() for n, t in model.state_dict().items()}
    model.save_pretrained(path, state_dict=state, safe_serialization=True)
    cfg_path = os.path.join(path, "config.json")  # the config says what the files hold
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["dtype"] = "bfloat16"
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


class ExpStats:
    """Changed elements per base exponent, and exact one-ulp changes."""

    def __init__(self):
        self.total = torch.zeros(256, dtype=torch.int64)
        self.changed = torch.zeros(256, dtype=torch.int64)
        self.ulp1 = 0

    def add(self, base, new):
        for n in base:
            b, w = base[n], new[n]
            e = ((b.int() >> 7) & 0xFF).long()
            ch = b != w
            self.total += torch.bincount(e, minlength=256)
            self.changed += torch.bincount(e[ch], minlength=256)
            bb, ww = b[ch].int(), w[ch].int()
            same_sign = (bb < 0) == (ww < 0)
            self.ulp1 += int(((bb - ww).abs() == 1).logical_and(same_sign).sum())

    def facts(self):
        nchanged = int(self.changed.sum())
        ntotal = int(self.total.sum())
        rows = []
        for e in range(256):
            t = int(self.total[e])
            if t >= max(1, ntotal // 1000):  # exponents holding >= 0.1% of the elements
                rows.append({"exponent": e, "unbiased": e - 127, "elements": t,
                             "share": t / ntotal, "changed": int(self.changed[e]),
                             "p_change": int(self.changed[e]) / t})
        return {"elements": ntotal, "changed": nchanged,
                "one_ulp_share": (self.ulp1 / nchanged) if nchanged else 0.0,
                "per_exponent": rows}


def h2(k, n):
    """n·H(k/n) in bits, elementwise over tensors of counts (0 where k is 0 or n)."""
    n = n.double()
    k = k.double()
    p = (k / n.clamp(min=1)).clamp(1e-300, 1 - 1e-16)
    bits = -(k * torch.log2(p) + (n - k) * torch.log2(1 - p))
    return torch.where((k == 0) | (k == n), torch.zeros_like(bits), bits)


class PrevStats:
    """The previous step's changed positions as a second context of the positions.

    For each step after the first: the bits the changed positions need at their
    order-0 entropy within each tensor, given each base element's exponent (what
    `context` codes), and given its exponent and whether it changed in the step
    before; how much more often an element changes right after a change; and
    how often such a change goes the same way as the one before (the signs
    cost a bit per change)."""

    def __init__(self):
        self.bits_plain = self.bits_exp = self.bits_exp_prev = 0.0
        self.elements = self.changed = self.prev_changed = self.both = self.same_way = 0

    def add(self, prev_dir, base, new):
        for n in base:
            b, w, pd = base[n], new[n], prev_dir[n]
            pc = pd != 0
            ch = b != w
            self.same_way += int(((torch.sign(w.int() - b.int()) == pd) & ch & pc).sum())
            e = ((b.int() >> 7) & 0xFF).long()
            idx = e * 2 + pc.long()
            nn = torch.bincount(idx, minlength=512)
            kk = torch.bincount(idx[ch], minlength=512)
            self.bits_exp_prev += float(h2(kk, nn).sum())
            self.bits_exp += float(h2(kk.view(256, 2).sum(1), nn.view(256, 2).sum(1)).sum())
            self.bits_plain += float(h2(kk.sum(), nn.sum()))
            self.elements += b.numel()
            self.changed += int(ch.sum())
            self.prev_changed += int(pc.sum())
            self.both += int((ch & pc).sum())

    def facts(self):
        if not self.elements:
            return None
        p_ch = self.changed / self.elements
        p_after = self.both / max(1, self.prev_changed)
        same = self.same_way / max(1, self.both)
        sign_saved = 0.0
        if 0 < same < 1:
            sign_saved = self.both * (1 + same * math.log2(same) + (1 - same) * math.log2(1 - same)) / 8
        return {"same_way_after_change": same, "sign_bytes_saved": sign_saved, "elements": self.elements, "changed": self.changed,
                "p_change": p_ch, "p_change_after_change": p_after,
                "overlap_over_chance": p_after / p_ch if p_ch else None,
                "position_bytes_order0": self.bits_plain / 8,
                "position_bytes_exponent": self.bits_exp / 8,
                "position_bytes_exponent_prev": self.bits_exp_prev / 8}


def dir_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stdout + r.stderr)
        raise SystemExit(f"train-series: failed ({r.returncode}): {' '.join(cmd)}")
    return r.stdout


def fmt_bytes(n):
    return f"{n:,}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="build/train-series")
    ap.add_argument("--builddir", default="build")
    ap.add_argument("--params", default="small", choices=("tiny", "small", "medium"),
                    help="model size: tiny (~0.13M), small (~25M, default), medium (~60M)")
    ap.add_argument("--pretrain-steps", type=int, default=200)
    ap.add_argument("--pretrain-lr", type=float, default=1e-3)
    ap.add_argument("--steps", type=int, default=4, help="AdamW steps (saves after the first) per lr")
    ap.add_argument("--lrs", default="1e-6 1e-5")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--text-bytes", type=int, default=8 << 20)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(a.seed)
    sizes = {"tiny": (64, 2, 192, 4, 2), "small": (512, 8, 1536, 8, 4),
             "medium": (768, 8, 2304, 12, 4)}
    bench = os.path.join(a.builddir, "bench", "hfdelta-bench")
    diff = os.path.join(a.builddir, "src", "delta-diff")
    for tool in (bench, diff):
        if not os.access(tool, os.X_OK):
            raise SystemExit(f"train-series: {tool} is missing; build the project first")
    lrs = [float(x) for x in a.lrs.split()]
    if os.path.exists(a.out):
        shutil.rmtree(a.out)
    os.makedirs(a.out)

    t = time.monotonic()
    data = load_text(a.text_bytes)
    model, arch = build_model(*sizes[a.params])
    nparams = sum(p.numel() for p in model.parameters())
    print(f"train-series: {arch} ({a.params}), {nparams:,} parameters; {len(data):,} bytes of text; "
          f"torch {torch.__version__}, transformers {transformers.__version__}", flush=True)
    stage("setup", t)

    # ---- pre-training ------------------------------------------------------------
    t = time.monotonic()
    model.train()
    gen = torch.Generator().manual_seed(a.seed)
    it = batches(data, a.batch, a.seq, gen)
    opt = torch.optim.AdamW(model.parameters(), lr=a.pretrain_lr, weight_decay=0.01)
    warm = max(1, a.pretrain_steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))
    first = last = None
    for s in range(a.pretrain_steps):
        loss = train_step(model, opt, next(it))
        sched.step()
        first = loss if first is None else first
        last = loss
        if s % max(1, a.pretrain_steps // 10) == 0 or s == a.pretrain_steps - 1:
            print(f"  pretrain step {s:4d}  loss {loss:.3f} (nats/byte)", flush=True)
    pre_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    stage(f"pre-training ({a.pretrain_steps} steps, batch {a.batch}x{a.seq})", t)

    # ---- fine-tuning series, one per lr --------------------------------------------
    series = {}
    stats = {}
    prev_stats = {}
    for lr in lrs:
        t = time.monotonic()
        name = f"lr-{lr:.0e}"
        sdir = os.path.join(a.out, name)
        model.load_state_dict(pre_state)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
        gen = torch.Generator().manual_seed(a.seed + 1)  # the same batches for every lr
        it = batches(data, a.batch, a.seq, gen)
        saves = [os.path.join(sdir, "save_000")]
        save_bf16(model, saves[0])
        prev = bf16_bits(model)
        st = ExpStats()
        ps = PrevStats()
        prev_dir = None
        for s in range(1, a.steps + 1):
            loss = train_step(model, opt, next(it))
            saves.append(os.path.join(sdir, f"save_{s:03d}"))
            save_bf16(model, saves[-1])
            cur = bf16_bits(model)
            st.add(prev, cur)
            if prev_dir is not None:
                ps.add(prev_dir, prev, cur)
            prev_dir = {n: torch.sign(cur[n].int() - prev[n].int()) for n in cur}
            prev = cur
            print(f"  lr {lr:g} step {s}  loss {loss:.3f}", flush=True)
        series[lr] = saves
        stats[lr] = st.facts()
        prev_stats[lr] = ps.facts()
        stage(f"training + saves at lr {lr:g} ({a.steps} steps)", t)

    # ---- bounds and deltas -----------------------------------------------------------
    t = time.monotonic()
    rows = []
    for lr, saves in series.items():
        for k in range(1, len(saves)):
            base, new = saves[k - 1], saves[k]
            b = json.loads(run([bench, "bound", "--threads", str(a.threads), base, new]).strip().splitlines()[-1])
            row = {"lr": lr, "pair": f"{k - 1}->{k}", "bound": b}
            for enc in ENCODINGS:
                out = os.path.join(a.out, "deltas", f"lr-{lr:.0e}", f"pair-{k:03d}", enc, "weight_v000001")
                os.makedirs(os.path.dirname(out), exist_ok=True)
                run([diff, "-q", "--no-sync", "--threads", str(a.threads), "--encoding", enc,
                     "--delta-version", "1", base, new, out])
                row[enc] = dir_bytes(out)
            rows.append(row)
    stage(f"bounds and deltas ({len(rows)} pairs x {len(ENCODINGS)} encodings)", t)

    # ---- report -------------------------------------------------------------------------
    def g(b, *keys):
        for k in keys:
            if k in b:
                return b[k]
        return None

    lines = [
        f"# hfdelta on real training: {arch}, {nparams:,} parameters (bf16 saves)",
        "",
        f"Pre-trained {a.pretrain_steps} steps (AdamW, lr {a.pretrain_lr:g}, batch {a.batch}x{a.seq} bytes, fp32) "
        f"on {len(data):,} bytes of local text: loss {first:.3f} -> {last:.3f} nats/byte. Then per lr, "
        f"{a.steps} AdamW steps on the fp32 master from that state, a bf16 save_pretrained after each.",
        "Sizes in bytes (delta directory totals); bounds from `hfdelta-bench bound`.",
        "",
        "| lr | pair | density | order-0 bound | conditioned bound | conditioned/order-0 | context | context/order-0 | sparse | sparse/order-0 | auto | xor | overwrite |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        b = r["bound"]
        dens = g(b, "density")
        o0 = g(b, "bound_bytes")
        cb = g(b, "conditioned_bound_bytes")
        ratio = f"{cb / o0:.3f}" if (o0 and cb is not None) else "-"
        sp = f"{r['sparse'] / o0:.3f}" if o0 else "-"
        cx = f"{r['context'] / o0:.3f}" if o0 else "-"
        lines.append(
            f"| {r['lr']:g} | {r['pair']} | {dens:.3e} | {fmt_bytes(int(o0))} | "
            f"{fmt_bytes(int(cb)) if cb is not None else '-'} | {ratio} | {fmt_bytes(r['context'])} | {cx} | "
            f"{fmt_bytes(r['sparse'])} | {sp} | "
            f"{fmt_bytes(r['auto'])} | {fmt_bytes(r['xor'])} | {fmt_bytes(r['overwrite'])} |")
    lines += ["", "## Changes per base exponent (all pairs of a series together)", ""]
    for lr, f in stats.items():
        lines.append(f"lr {lr:g}: {f['changed']:,} of {f['elements']:,} element-steps changed "
                     f"({f['changed'] / max(1, f['elements']):.3e}); exactly one ulp: {f['one_ulp_share']:.1%} of the changes")
        lines.append("")
    exps = sorted({row["exponent"] for f in stats.values() for row in f["per_exponent"]})
    head = "| base exponent (unbiased) | share of elements | " + " | ".join(f"P(change) lr {lr:g}" for lr in stats) + " |"
    lines += [head, "|---|---|" + "---|" * len(stats)]
    for e in exps:
        cells, share = [], None
        for f in stats.values():
            m = next((x for x in f["per_exponent"] if x["exponent"] == e), None)
            cells.append(f"{m['p_change']:.3e}" if m else "-")
            share = share if share is not None else (m["share"] if m else None)
        lines.append(f"| {e - 127} | {share:.2%} | " + " | ".join(cells) + " |")
    lines += ["", "## The previous step's changed positions as a second context", "",
              "Bytes the changed positions need at their order-0 entropy within each tensor (steps 2 on, "
              "summed): given nothing, given each base element's exponent (what `context` codes), and "
              "given the exponent and whether the element changed in the step before.", "",
              "| lr | P(change) | P(change after a change) | x chance | positions, order-0 | given exponent | "
              "given exponent + previous change | saved | same way as the change before | sign bytes saved |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for lr, f in prev_stats.items():
        if not f:
            continue
        lines.append(f"| {lr:g} | {f['p_change']:.3e} | {f['p_change_after_change']:.3e} | "
                     f"{f['overlap_over_chance']:.1f} | {fmt_bytes(int(f['position_bytes_order0']))} | "
                     f"{fmt_bytes(int(f['position_bytes_exponent']))} | "
                     f"{fmt_bytes(int(f['position_bytes_exponent_prev']))} | "
                     f"{1 - f['position_bytes_exponent_prev'] / f['position_bytes_exponent']:.1%} | "
                     f"{f['same_way_after_change']:.1%} | {fmt_bytes(int(f['sign_bytes_saved']))} |")
    lines += ["", "Stage durations: " + "; ".join(f"{n}: {d:.1f} s" for n, d in STAGES), ""]
    text = "\n".join(lines)
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write(text)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"arch": arch, "params": nparams, "args": vars(a), "rows": rows,
                   "exponent_stats": {str(k): v for k, v in stats.items()},
                   "previous_change_context": {str(k): v for k, v in prev_stats.items()},
                   "stages": STAGES}, f, indent=1)
    print()
    print(text)
    print(f"train-series: results in {os.path.join(a.out, 'results.md')}")


if __name__ == "__main__":
    main()
