#!/usr/bin/env python3
"""Tables of scripts/bench/kinds.sh from its records (one JSON object a line).

  kinds_report.py RECORDS OUT.md OUT.json [--commit C]

Mixture of experts: for each encoding, the minimum diff and apply --no-sync
wall time of the save with its experts apart (moe-experts) and stacked
(moe-stacked, the same bytes in fewer tensors), their ratio, and the time
per extra tensor: (t_apart - t_stacked) / (tensors_apart - tensors_stacked).
FP8 (each learning rate) and LoRA adapters (each dtype): for each encoding,
the wire bytes against the order-0 bound of the change and against the save,
and the times.
"""
import argparse
import json
from collections import defaultdict


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("records")
    ap.add_argument("md")
    ap.add_argument("json")
    ap.add_argument("--commit", default="unknown")
    a = ap.parse_args()
    recs = [json.loads(line) for line in open(a.records) if line.strip()]
    times = defaultdict(list)   # (series, encoding, mode) -> [wall]
    size, delta_layout, save_layout, bound, machine = {}, {}, {}, {}, {}
    for r in recs:
        k, s, e = r["kind"], r.get("series"), r.get("encoding")
        if k == "run":
            times[(s, e, r["mode"])].append(r["wall_s"])
        elif k == "size":
            size[(s, e)] = r["bytes"]
        elif k == "layout" and r.get("what") == "delta":
            delta_layout[(s, e)] = r
        elif k == "layout":
            save_layout[s] = r
        elif k == "bound":
            bound[s] = r
        elif k == "machine":
            machine = dict(r, **{"loadavg": machine.get("loadavg", "?")})
        elif k == "load":
            machine["loadavg"] = r["loadavg"]
    best = {k: min(v) for k, v in times.items()}
    encodings = sorted({e for (_, e, _) in best}, key=lambda e: ["sparse", "context", "auto", "xor", "overwrite"].index(e)
                       if e in ["sparse", "context", "auto", "xor", "overwrite"] else 9)
    out = {"commit": a.commit, "machine": machine, "moe": [], "fp8": [], "lora": []}
    md = ["# Checkpoint kinds: mixture of experts, FP8, LoRA", ""]
    md.append(f"Commit {a.commit}; {machine.get('nproc', '?')} CPUs ({machine.get('cpu_model', '?')}), "
              f"load average at the end {machine.get('loadavg', '?')}; page cache warm; minimum of "
              f"{max((len(v) for v in times.values()), default=0)} runs.")
    md.append("")
    if "moe-experts" in save_layout and "moe-stacked" in save_layout:
        xa, xs = save_layout["moe-experts"], save_layout["moe-stacked"]
        ba, bs = bound.get("moe-experts", {}), bound.get("moe-stacked", {})
        dn = xa["tensors"] - xs["tensors"]
        md += ["## Mixture of experts: experts apart against stacked (same bytes)", "",
               f"Save: {xa['tensors']} tensors apart, {xs['tensors']} stacked; {xa['bytes'] / 1e6:.1f} MB and "
               f"{xs['bytes'] / 1e6:.1f} MB; safetensors headers {xa['header_bytes'] / 1e3:.0f} kB and "
               f"{xs['header_bytes'] / 1e3:.0f} kB; JSON files (index, configs) {xa['json_bytes'] / 1e3:.0f} kB and "
               f"{xs['json_bytes'] / 1e3:.0f} kB. Density {ba.get('density', 0) * 100:.2f}% and "
               f"{bs.get('density', 0) * 100:.2f}%.", "",
               "| encoding | diff apart / stacked | ratio | per extra tensor | apply `--no-sync` apart / stacked | ratio | per extra tensor | wire apart / stacked | delta headers + index apart / stacked |",
               "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for e in encodings:
            row = {"encoding": e}
            cells = [e]
            for mode in ("diff", "apply_nosync"):
                ta, ts = best.get(("moe-experts", e, mode)), best.get(("moe-stacked", e, mode))
                if ta is None or ts is None:
                    cells += ["–", "–", "–"]
                    continue
                per = (ta - ts) / dn * 1e6
                row[mode] = {"apart_s": ta, "stacked_s": ts, "ratio": ta / ts, "us_per_extra_tensor": per}
                cells += [f"{ta:.3f} / {ts:.3f} s", f"{ta / ts:.2f}", f"{per:.1f} µs"]
            wa, ws = size.get(("moe-experts", e)), size.get(("moe-stacked", e))
            la, ls = delta_layout.get(("moe-experts", e), {}), delta_layout.get(("moe-stacked", e), {})
            oa = la.get("header_bytes", 0) + la.get("json_bytes", 0)
            os_ = ls.get("header_bytes", 0) + ls.get("json_bytes", 0)
            row.update(wire_apart=wa, wire_stacked=ws, delta_overhead_apart=oa, delta_overhead_stacked=os_)
            cells += [f"{(wa or 0) / 1e6:.2f} / {(ws or 0) / 1e6:.2f} MB", f"{oa / 1e3:.0f} / {os_ / 1e3:.0f} kB"]
            out["moe"].append(row)
            md.append("| " + " | ".join(cells) + " |")
        out["moe_layout"] = {"apart": xa, "stacked": xs, "bound_apart": ba, "bound_stacked": bs}
        md.append("")
    others = sorted({s for s in bound if s.startswith(("fp8-", "lora-"))})
    if others:
        md += ["## FP8 with block scales and LoRA adapters: wire against the order-0 bound", "",
               "| series | save | density | bound | encoding | wire | wire / bound | wire / save | diff | apply `--no-sync` |",
               "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
        for s in others:
            b = bound[s]
            for e in encodings:
                w = size.get((s, e))
                if w is None:
                    continue
                ratio = w / b["bound_bytes"] if b["bound_bytes"] else float("nan")
                d, ap = best.get((s, e, "diff")), best.get((s, e, "apply_nosync"))
                out["fp8" if s.startswith("fp8-") else "lora"].append(
                    {"series": s, "encoding": e, "wire": w, "bound_bytes": b["bound_bytes"],
                     "wire_over_bound": ratio, "density": b["density"], "save_bytes": b["full_bytes"],
                     "diff_s": d, "apply_nosync_s": ap})
                md.append(f"| {s} | {b['full_bytes'] / 1e6:.1f} MB | {b['density'] * 100:.2f}% | "
                          f"{b['bound_bytes'] / 1e6:.3f} MB | {e} | {w / 1e6:.3f} MB | {ratio:.3f} | "
                          f"{w / b['full_bytes']:.3f} | {d:.3f} s | {ap:.3f} s |")
        md.append("")
    open(a.md, "w").write("\n".join(md) + "\n")
    json.dump(out, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
