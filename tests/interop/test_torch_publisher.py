"""hfdelta.Publisher fed torch CPU tensors (scripts/ci/interop.sh --full, which
installs the package and torch): bf16 parameters as a trainer holds them --
nn.Parameter with autograd history, non-contiguous views, float32 buffers --
published from memory must give byte for byte the delta delta-diff writes
between the two saves written by safetensors.torch.
"""

import os

import pytest

pytestmark = pytest.mark.full

try:
    import safetensors.torch
    import torch

    import hfdelta
except ImportError:  # light mode, or the package not installed: deselected or skipped
    torch = None


@pytest.fixture(autouse=True)
def _needs_torch_and_package():
    if torch is None:
        pytest.skip("torch or the hfdelta package is not installed (scripts/ci/interop.sh --full installs both)")


def _files(d):
    out = {}
    for dirpath, _, names in os.walk(d):
        if ".weight_sync" in dirpath:
            continue
        for n in names:
            p = os.path.join(dirpath, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, d)] = f.read()
    return out


@pytest.mark.parametrize("encoding", ["sparse", "auto", "xor", "overwrite"])
def test_torch_tensors_publish_delta_diffs_delta(hf, tmp_path, encoding):
    g = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 256)).to(torch.bfloat16)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    state["norm.weight"] = torch.ones(256, dtype=torch.float32)
    base, new = tmp_path / "base", tmp_path / "new"
    base.mkdir()
    new.mkdir()
    safetensors.torch.save_file(state, str(base / "model.safetensors"))
    # an optimizer step on about 2% of the elements
    with torch.no_grad():
        for p in model.parameters():
            mask = torch.rand(p.shape, generator=g) < 0.02
            p.add_(mask.to(p.dtype) * 1e-2)
    norm = torch.ones(256, dtype=torch.float32)
    norm[::7] = 1.5
    after = {k: v.detach().clone() for k, v in model.state_dict().items()}
    after["norm.weight"] = norm
    safetensors.torch.save_file(after, str(new / "model.safetensors"))

    root, mirror, ref = tmp_path / "root", tmp_path / "mirror", tmp_path / "ref"
    root.mkdir()
    ref.mkdir()
    hfdelta.init(base, mirror, sync=False)
    tensors = dict(model.named_parameters())  # Parameters, requiring grad
    w = tensors["0.weight"]
    tensors["0.weight"] = w.detach().t().contiguous().t()  # same values, not contiguous
    assert not tensors["0.weight"].is_contiguous()
    tensors["norm.weight"] = norm
    with hfdelta.Publisher(root, mirror, encoding=encoding, sync=False) as pub:
        r = pub.publish(list(tensors.items()), wait=True)
    assert r.tensors_changed == len(after)
    hf.diff(str(base), str(new), str(ref / "weight_v000001"), encoding=encoding,
            extra=("--delta-version", "1", "--no-sync"), check=False)
    assert _files(root / "weight_v000001") == _files(ref / "weight_v000001")
    assert _files(mirror) == _files(new)
