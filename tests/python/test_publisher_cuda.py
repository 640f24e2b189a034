"""hfdelta.Publisher with torch tensors on a CUDA device (a package built with CUDA): each version byte for byte
the one published from the same tensors on the host, the mirror advanced, only the changes copied to the host.
Skipped, saying why, without torch, a CUDA device or CUDA in the build (the C++ check hfdelta-gpu-check
--publisher, run by scripts/lab/gpu-check.sh, covers the device path on a GPU machine)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ml_dtypes  # noqa: F401  (numpy knows bfloat16 only once it is imported: safetensors.numpy needs it)
import numpy as np
import pytest
from safetensors.numpy import load_file

from conftest import files_of

import hfdelta
from hfdelta import Publisher


def _torch() -> Any:
    if not hfdelta._core.cuda:
        pytest.skip("this build of hfdelta has no CUDA (-Dcuda)")
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch.cuda is not available (no CUDA device)")
    return torch


def _to_cuda(torch: Any, a: np.ndarray) -> Any:
    """The array's bytes on the CUDA device as a torch tensor of its dtype and shape."""
    dtypes = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
    if a.dtype.name not in dtypes:
        return torch.from_numpy(np.ascontiguousarray(a)).cuda()
    raw = torch.from_numpy(np.ascontiguousarray(a).reshape(-1).view(np.uint8).copy()).cuda()
    return raw.view(dtypes[a.dtype.name]).reshape(a.shape)


@pytest.mark.parametrize("encoding", ["sparse", "context"])
def test_cuda_tensors_publish_what_host_tensors_do(series: list[Path], tmp_path: Path, encoding: str) -> None:
    torch = _torch()
    roots, mirrors = {}, {}
    for kind in ("host", "cuda"):
        roots[kind], mirrors[kind] = tmp_path / f"root-{kind}", tmp_path / f"mirror-{kind}"
        roots[kind].mkdir()
        hfdelta.init(series[0], mirrors[kind], sync=False)
    with Publisher(roots["host"], mirrors["host"], encoding=encoding, sync=False) as ph, \
            Publisher(roots["cuda"], mirrors["cuda"], encoding=encoding, sync=False) as pc:
        for v, save in enumerate(series[1:], start=1):
            tensors = {}
            for f in sorted(save.glob("*.safetensors")):
                tensors.update(load_file(f))
            ph.publish(tensors, wait=True)
            on_device = {k: _to_cuda(torch, a) for k, a in tensors.items()}
            pc.publish(on_device, wait=True)
            name = f"weight_v{v:06d}"
            assert files_of(roots["cuda"] / name) == files_of(roots["host"] / name)
            for f in sorted(save.glob("*.safetensors")):  # the mirrors advanced to the version's bytes
                assert (mirrors["cuda"] / f.name).read_bytes() == f.read_bytes()
        stats = json.loads(pc._core.device_stats())
        total = stats["tensor_bytes"]
        assert stats["tensors"] > 0 and stats["host_bytes"] < total
