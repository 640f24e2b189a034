"""The Python examples of docs/python.md, run as written: the trainer's loop
that publishes after every optimizer step and brings its engines to each
version (hfdelta.engines, against two stand-ins of vLLM with the hfdelta
backend: vllm_standin.py), the client's error handling, and the host's pull
that has the engine reload (contrib/reload-vllm.sh against the stand-in engine
scripts/lab/engine/fake_engine.py).

Each ```python block of docs/python.md runs in a process of its own, with the
page's paths (/models/base, /shared/weights,
/var/lib/hfdelta/mirror, /local/model) replaced by temporary ones and a
prelude defining what a trainer has (`model`, `train_step`, `num_steps`):
a tiny generated model as numpy arrays behind a torch-like state_dict().
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import hfdelta

from vllm_standin import StandIn, served_equals

REPO = Path(__file__).resolve().parents[2]

PRELUDE = textwrap.dedent("""
    import glob as _glob
    import ml_dtypes as _ml_dtypes  # noqa: F401
    import numpy as _np
    from safetensors.numpy import load_file as _load_file

    class _Tensor:  # what torch's state_dict() holds, as far as the example goes
        def __init__(self, a):
            self.a = a
        def detach(self):
            return self
        def cpu(self):
            return self.a

    class _Model:
        def __init__(self, path):
            self.params = {}
            for f in sorted(_glob.glob(path + "/*.safetensors")):
                self.params.update(_load_file(f))
        def state_dict(self):
            return {k: _Tensor(v) for k, v in self.params.items()}

    def train_step(model):  # an optimizer step: about 1% of the elements move by one ulp
        rng = _np.random.default_rng(len(_steps))
        _steps.append(1)
        for a in model.params.values():
            u = a.reshape(-1).view(_np.uint16)
            idx = rng.choice(u.size, max(1, u.size // 100), replace=False)
            u[idx] += 1

    _steps = []
    model = _Model(BASE)
    num_steps = 3
""")


def python_blocks() -> list[str]:
    text = (REPO / "docs" / "python.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
    assert blocks, "docs/python.md has no python block"
    return blocks


def run_block(block: str, paths: dict[str, Path], env: dict[str, str], cwd: Path,
              urls: dict[str, str]) -> str:
    code = block
    for page_path, real in paths.items():
        code = code.replace(f'"{page_path}"', repr(str(real)))
    for page_url, real_url in urls.items():
        code = code.replace(f'"{page_url}"', repr(real_url))
    code = code.replace('"contrib/', repr(str(REPO / "contrib")) + ' + "/')
    prelude = f"BASE = {str(paths['/models/base'])!r}\n" + PRELUDE
    r = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, env=env, cwd=cwd,
                       timeout=300)
    assert r.returncode == 0, f"docs/python.md block failed:\n{code}\n--- stderr:\n{r.stderr}"
    return r.stdout


def test_readme_trainer_loop_and_host_pull(series: list[Path], tmp_path: Path) -> None:
    base = tmp_path / "base"
    shutil.copytree(series[0], base)
    paths = {"/models/base": base, "/shared/weights": tmp_path / "weights",
             "/var/lib/hfdelta/mirror": tmp_path / "mirror", "/local/model": tmp_path / "local"}
    paths["/shared/weights"].mkdir()
    hfdelta.init(base, paths["/local/model"], sync=False)  # the host, set up as the README's quickstart says
    log, port_file = tmp_path / "engine.jsonl", tmp_path / "engine.port"
    standins = []  # the engines the trainer drives, each on a LOCAL of its own
    for i in range(2):
        hfdelta.init(base, tmp_path / f"engine{i}", sync=False)
        standins.append(StandIn(str(tmp_path / f"engine{i}")))
    urls = {"http://10.0.0.5:8000": standins[0].url, "http://10.0.0.6:8000": standins[1].url}
    engine = subprocess.Popen([sys.executable, str(REPO / "scripts" / "lab" / "engine" / "fake_engine.py"),
                               "--port-file", str(port_file), "--log", str(log)])
    try:
        for _ in range(100):
            if port_file.exists() and port_file.read_text().strip():
                break
            time.sleep(0.1)
        env = dict(os.environ, VLLM_URL=f"http://127.0.0.1:{port_file.read_text().strip()}",
                   VLLM_STATE_FILE=str(tmp_path / "served.version"))
        outputs = [run_block(b, paths, env, tmp_path, urls) for b in python_blocks()]
    finally:
        engine.terminate()
        engine.wait(timeout=30)
        for si in standins:
            si.close()
    assert len(outputs) >= 3, "docs/python.md should show the trainer's loop, the engines' client and the host's pull"
    # the trainer published a version per step, and its mirror holds the last
    published = sorted(os.listdir(paths["/shared/weights"]))
    assert published == ["weight_v000001", "weight_v000002", "weight_v000003"]
    assert hfdelta.status(paths["/var/lib/hfdelta/mirror"]).version == "000003"
    # the trainer brought both engines to each version; they serve the mirror's tensors
    for si in standins:
        assert si.version == "000003" and served_equals(si, str(paths["/var/lib/hfdelta/mirror"]))
        assert [r["local_version"] for r in si.reloads] == ["000001", "000002", "000003"]
        assert all(r["paused"] for r in si.reloads)
    assert "serves 000003, paused" in outputs[0]
    assert f"{standins[0].url}: serves 000003 (already: True)" in outputs[1]
    # the host pulled them and had the engine reload, under the lock
    st = hfdelta.status(paths["/local/model"])
    assert st.version == "000003" and st.state == "clean"
    assert hfdelta.verify(paths["/local/model"]).state == "clean"
    requests: list[dict[str, Any]] = [json.loads(line) for line in log.read_text().splitlines()]
    reloads = [r for r in requests if r["path"] == "/collective_rpc"]
    assert reloads and reloads[-1]["body"]["kwargs"]["weights_path"] == str(paths["/local/model"])
