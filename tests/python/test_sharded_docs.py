"""The example of docs/sharded.md, "Publishing from a sharded trainer", run as written on two gloo
ranks: its paths (/models/base, /shared/weights, /var/lib/hfdelta/mirror) replaced by temporary
ones holding a small Qwen-shaped checkpoint, its engines by two stand-ins of vLLM with the hfdelta
backend (vllm_standin.py). Both versions it publishes must reach a host, and the engines the last."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import hfdelta

from vllm_standin import StandIn, served_equals

torch = pytest.importorskip("torch", reason="torch is not installed: the example runs torch.distributed")
from safetensors.torch import load_file, save_file  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def example() -> str:
    page = (REPO / "docs" / "sharded.md").read_text()
    section = page.split("## Publishing from a sharded trainer", 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks, "docs/sharded.md has no python example under 'Publishing from a sharded trainer'"
    return blocks[0]


def test_the_example_runs_as_written(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(3)
    attn = "model.layers.0.self_attn."
    shapes = {"model.embed_tokens.weight": (64, 32), attn + "q_proj.weight": (32, 32),
              attn + "k_proj.weight": (16, 32), attn + "v_proj.weight": (16, 32), attn + "o_proj.weight": (32, 32),
              "model.norm.weight": (32,), "lm_head.weight": (64, 32)}
    base, root, mirror = tmp_path / "base", tmp_path / "root", tmp_path / "mirror"
    base.mkdir()
    root.mkdir()
    save_file({n: torch.randn(s, generator=g) for n, s in shapes.items()}, str(base / "model.safetensors"))
    (base / "config.json").write_text("{}")
    hfdelta.init(base, mirror, sync=False)
    standins = []
    for i in range(2):
        hfdelta.init(base, tmp_path / f"engine{i}", sync=False)
        standins.append(StandIn(str(tmp_path / f"engine{i}")))
    script = (example().replace('"/models/base"', repr(str(base))).replace('"/shared/weights"', repr(str(root)))
              .replace('"/var/lib/hfdelta/mirror"', repr(str(mirror)))
              .replace('"http://10.0.0.5:8000"', repr(standins[0].url))
              .replace('"http://10.0.0.6:8000"', repr(standins[1].url)))
    (tmp_path / "example.py").write_text(script)
    try:
        r = subprocess.run([sys.executable, str(tmp_path / "example.py")], capture_output=True, text=True,
                           timeout=300)
    finally:
        for si in standins:
            si.close()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rank 0: version 1" in r.stdout and "rank 1: version 2" in r.stdout, r.stdout
    for si in standins:
        assert f"{si.url}: serves 000002, paused" in r.stdout, r.stdout
        assert si.version == "000002" and served_equals(si, str(mirror))
    host = tmp_path / "host"
    hfdelta.init(base, host, sync=False)
    pulled = hfdelta.pull(root, host, sync=False)
    assert pulled.to_version == "000002"
    assert hfdelta.verify(host).ok
    a, b = load_file(str(host / "model.safetensors")), load_file(str(mirror / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
