"""Checkpoints written by the real safetensors library (safetensors.numpy), with
every dtype it accepts, scalars, empty tensors, with and without __metadata__,
single file or sharded with an index, in successive saves where some tensors
change sparsely, one changes fully and the rest stay the same.
"""

import json
import os

import ml_dtypes
import numpy as np
import safetensors.numpy

# safetensors dtype -> numpy dtype, for everything safetensors.numpy writes.
# F8_E4M3FNUZ, F8_E5M2FNUZ and C64 are dtypes hfdelta does not know: it must
# carry them as opaque bytes.
NUMPY_DTYPES = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype(np.uint8),
    "I8": np.dtype(np.int8),
    "I16": np.dtype(np.int16),
    "U16": np.dtype(np.uint16),
    "I32": np.dtype(np.int32),
    "U32": np.dtype(np.uint32),
    "I64": np.dtype(np.int64),
    "U64": np.dtype(np.uint64),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F32": np.dtype(np.float32),
    "F64": np.dtype(np.float64),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
    "F8_E4M3FNUZ": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "F8_E5M2FNUZ": np.dtype(ml_dtypes.float8_e5m2fnuz),
    "C64": np.dtype(np.complex64),
}


def _random_of(rng, st_dtype, shape):
    """Random values of a safetensors dtype: any bit pattern for integers,
    finite drawn values for floating and complex types, 0/1 for bool."""
    dt = NUMPY_DTYPES[st_dtype]
    if st_dtype == "BOOL":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if st_dtype[0] in "IU":
        n = int(np.prod(shape, dtype=np.int64))
        return rng.integers(0, 256, size=n * dt.itemsize, dtype=np.uint8).view(dt).reshape(shape)
    vals = np.asarray(rng.standard_normal(size=shape), dtype=np.float32)
    if st_dtype == "C64":
        im = np.asarray(rng.standard_normal(size=shape), dtype=np.float32)
        return np.asarray(vals + 1j * im, dtype=dt)
    if st_dtype == "F8_E8M0":  # exponent-only: positive powers of two
        return np.asarray(np.exp2(np.round(vals * 4)), dtype=np.float32).astype(dt)
    return np.asarray(vals, dtype=dt)


def all_dtypes_tensors(seed=0):
    """One tensor of every dtype in a few shapes, scalars and empty tensors."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, dt in NUMPY_DTYPES.items():
        key = name.lower()
        out[f"{key}.matrix"] = _random_of(rng, name, (5, 7))
        out[f"{key}.scalar"] = _random_of(rng, name, ())
        out[f"{key}.empty"] = np.zeros((0,), dtype=dt)
    out["f32.empty_2d"] = np.zeros((3, 0), dtype=np.float32)
    out["bf16.cube"] = _random_of(rng, "BF16", (4, 3, 2))
    return out


def model_tensors(rng, scale=1):
    """The tensors of a small model-like checkpoint (bf16 weights and friends)."""
    bf16 = NUMPY_DTYPES["BF16"]
    t = {}
    t["embed.weight"] = (rng.standard_normal((96 * scale, 64)) * 0.02).astype(bf16)
    for layer in range(2):
        p = f"layers.{layer}."
        t[p + "attn.qkv.weight"] = (rng.standard_normal((192, 64)) * 0.02).astype(bf16)
        t[p + "attn.o.weight"] = (rng.standard_normal((64, 64)) * 0.02).astype(bf16)
        t[p + "mlp.up.weight"] = (rng.standard_normal((128, 64)) * 0.02).astype(bf16)
        t[p + "mlp.down.weight"] = (rng.standard_normal((64, 128)) * 0.02).astype(bf16)
        t[p + "norm.weight"] = np.ones((64,), dtype=np.float32)
        t[p + "norm.bias"] = np.zeros((64,), dtype=np.float16)
    t["head.weight"] = (rng.standard_normal((96 * scale, 64)) * 0.02).astype(bf16)
    t["head.scale"] = np.array(1.5, dtype=np.float64)            # scalar, unchanged
    t["rope.inv_freq"] = (1.0 / 10000 ** (np.arange(16) / 16)).astype(np.float32)
    t["position_ids"] = np.arange(128, dtype=np.int64)          # unchanged
    t["attn_mask"] = np.tril(np.ones((16, 16), dtype=np.bool_))  # unchanged
    t["quant.weight_fp8"] = (rng.standard_normal((32, 64))).astype(NUMPY_DTYPES["F8_E4M3"])
    t["quant.scale_e8m0"] = np.full((32,), 127, dtype=np.uint8).view(NUMPY_DTYPES["F8_E8M0"])
    t["step"] = np.array(0, dtype=np.int32)                      # scalar, changes every save
    t["empty.buffer"] = np.zeros((0, 64), dtype=NUMPY_DTYPES["BF16"])
    t["unknown.c64"] = (rng.standard_normal((8,)) + 1j).astype(np.complex64)  # unchanged, opaque to hfdelta
    return t


def next_save(rng, prev, density=0.01):
    """The following save: bf16 weights change in about `density` of their
    elements (one bf16 ulp up or down), the layer-0 norm and `step` change
    fully, fp8 weights change a little, everything else is unchanged."""
    bf16 = NUMPY_DTYPES["BF16"]
    out = {}
    for name, a in prev.items():
        b = a.copy()
        if a.dtype == bf16 and a.size and name.endswith(".weight"):
            bits = b.reshape(-1).view(np.uint16)
            k = max(1, int(round(a.size * density)))
            idx = rng.choice(a.size, size=k, replace=False)
            step = rng.choice(np.array([1, 0xFFFF], dtype=np.uint16), size=k)
            bits[idx] = bits[idx] + step  # wraps: one ulp either way
        elif name == "layers.0.norm.weight":
            b = (a * (1.0 + rng.uniform(1e-3, 2e-3, size=a.shape))).astype(a.dtype)
        elif name == "step":
            b = np.array(int(a) + 1, dtype=a.dtype)
        elif name == "quant.weight_fp8":
            u8 = b.reshape(-1).view(np.uint8)
            idx = rng.choice(u8.size, size=max(1, u8.size // 50), replace=False)
            u8[idx] ^= 1
        out[name] = b
    return out


def save_single(tensors, d, metadata=None, extra_files=None):
    os.makedirs(d, exist_ok=True)
    safetensors.numpy.save_file(tensors, os.path.join(d, "model.safetensors"), metadata=metadata)
    _write_extra(d, extra_files)


def shard_plan(names, nshards):
    """Deterministic assignment of tensor names to shard files."""
    names = sorted(names)
    files = [f"model-{i + 1:05d}-of-{nshards:05d}.safetensors" for i in range(nshards)]
    return {n: files[i * nshards // len(names)] for i, n in enumerate(names)}


def save_sharded(tensors, d, nshards=3, metadata=None, extra_files=None):
    """Shards written one by one with safetensors.numpy.save_file, plus an index."""
    os.makedirs(d, exist_ok=True)
    plan = shard_plan(tensors, nshards)
    total = 0
    for f in sorted(set(plan.values())):
        part = {n: tensors[n] for n in sorted(tensors) if plan[n] == f}
        total += sum(int(a.nbytes) for a in part.values())
        safetensors.numpy.save_file(part, os.path.join(d, f), metadata=metadata)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(plan.items()))}
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as fh:
        json.dump(index, fh, indent=2)
        fh.write("\n")
    _write_extra(d, extra_files)


def _write_extra(d, extra_files):
    for rel, content in (extra_files or {}).items():
        p = os.path.join(d, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as fh:
            fh.write(content)


CONFIG = json.dumps({"model_type": "tiny", "hidden_size": 64, "num_hidden_layers": 2}, indent=2) + "\n"


def series(root, nsaves, seed, sharded, metadata=None, density=0.01):
    """Saves save_000 .. save_{nsaves-1} under root; returns their paths."""
    rng = np.random.default_rng(seed)
    t = model_tensors(rng)
    paths = []
    for i in range(nsaves):
        d = os.path.join(root, f"save_{i:03d}")
        extra = {"config.json": CONFIG}
        if sharded:
            save_sharded(t, d, metadata=metadata, extra_files=extra)
        else:
            save_single(t, d, metadata=metadata, extra_files=extra)
        paths.append(d)
        t = next_save(rng, t, density)
    return paths
