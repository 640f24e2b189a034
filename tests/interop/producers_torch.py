"""Tensors of every dtype safetensors.torch writes (needs torch)."""

import numpy as np
import torch

# torch dtype name -> safetensors dtype. F8_E4M3FNUZ, F8_E5M2FNUZ, C64 and F4
# (two 4-bit values per byte, shape counted in values) are unknown to hfdelta
# and travel as opaque bytes.
TORCH_DTYPES = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16",
    "int32": "I32", "uint32": "U32", "int64": "I64", "uint64": "U64",
    "float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "float8_e8m0fnu": "F8_E8M0",
    "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "complex64": "C64", "float4_e2m1fn_x2": "F4",
}


def available():
    return {n: s for n, s in TORCH_DTYPES.items() if hasattr(torch, n)}


def _from_bytes(raw, dtype, shape):
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape).clone()


def random_tensor(rng, name, shape):
    dt = getattr(torch, name)
    if name == "bool":
        return torch.from_numpy(rng.integers(0, 2, size=shape).astype(np.bool_)).clone()
    if name == "float4_e2m1fn_x2":
        n = int(np.prod(shape, dtype=np.int64))
        return _from_bytes(rng.integers(0, 256, size=n, dtype=np.uint8).tobytes(), dt, shape)
    if name.startswith(("int", "uint")):
        itemsize = torch.empty((), dtype=dt).element_size()
        n = int(np.prod(shape, dtype=np.int64))
        return _from_bytes(rng.integers(0, 256, size=n * itemsize, dtype=np.uint8).tobytes(), dt, shape)
    vals = torch.from_numpy(np.asarray(rng.standard_normal(size=shape), dtype=np.float32))
    if name == "complex64":
        im = torch.from_numpy(np.asarray(rng.standard_normal(size=shape), dtype=np.float32))
        return torch.complex(vals, im)
    if name == "float8_e8m0fnu":
        return torch.exp2(torch.round(vals * 4)).to(dt)
    return vals.to(dt)


def all_dtypes_tensors(seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for name in available():
        out[f"{name}.matrix"] = random_tensor(rng, name, (5, 7))
        if name != "float4_e2m1fn_x2":  # a packed pair has no scalar form
            out[f"{name}.scalar"] = random_tensor(rng, name, ())
        out[f"{name}.empty"] = random_tensor(rng, name, (0,))
    out["float32.empty_2d"] = torch.zeros((3, 0), dtype=torch.float32)
    return out


def raw_bytes(t):
    """The bytes safetensors stores for a tensor."""
    t = t.contiguous()
    if t.numel() == 0:
        return b""
    return bytes(t.reshape(-1).view(torch.uint8).numpy().tobytes())
