"""Stacked entries (encoding "stack", hfdelta_format 4) read by hand with the
real readers, following the layout docs/format.md documents.

delta-diff --squash of a chain written with xor, then overwrite, then xor
gives a tensor changed at every step three parts that do not compose without
its base. Here each entry is opened with safetensors, its head parsed with
struct, each part decoded with zstandard and laid over the base bytes with
numpy, and every checksum recomputed with xxhash: the first base's, each
part's, and the tensor's new bytes, which must be the last save's.
"""

import json
import os
import struct

import numpy as np
import safetensors
import xxhash
import zstandard

import stio

CODES = {0: "xor", 1: "overwrite", 2: "sparse"}


def _decode(frame):
    d = zstandard.ZstdDecompressor().decompressobj()
    raw = d.decompress(frame)
    assert d.eof and not d.unused_data, "not exactly one zstd frame"
    return raw


def _lay(encoding, buf, frame):
    """Lays one xor or overwrite entry over buf (uint8, in place)."""
    raw = _decode(frame)
    if encoding == "xor":
        assert len(raw) == buf.size
        buf ^= np.frombuffer(raw, dtype=np.uint8)
        return
    assert encoding == "overwrite", encoding
    (k,) = struct.unpack_from("<I", raw, 0)
    assert len(raw) == 4 + 5 * k
    pos = np.frombuffer(raw, dtype="<u4", count=k, offset=4)
    buf[pos] = np.frombuffer(raw, dtype=np.uint8, count=k, offset=4 + 4 * k)


def test_stacked_entries_read_by_hand(hf, tmp_path):
    series = tmp_path / "series"
    hf.run([hf.gen_bin, "--preset", "tiny", "--saves", "3", str(series)])
    saves = [str(series / f"save_{i:03d}") for i in range(4)]
    root = tmp_path / "root"
    root.mkdir()
    for v, enc in enumerate(["xor", "overwrite", "xor"], start=1):
        hf.diff(saves[v - 1], saves[v], str(root / f"weight_v{v:06d}"), encoding=enc)
    out = str(tmp_path / "squashed")
    hf.run([hf.diff_bin, "-q", "--squash", str(root / "weight_v000001"), str(root / "weight_v000003"), out])

    with open(os.path.join(out, "model.safetensors.index.json")) as f:
        m = json.load(f)["metadata"]
    assert m["hfdelta_format"] == 4 and m["delta_encoding"] == "auto"
    old_t = stio.checkpoint_tensors(saves[0])
    new_t = stio.checkpoint_tensors(saves[3])
    parts_seen = {}
    for f in sorted(x for x in os.listdir(out) if x.endswith(".safetensors")):
        with safetensors.safe_open(os.path.join(out, f), framework="numpy") as st:
            meta = st.metadata()
            for name in st.keys():
                entry = st.get_tensor(name).tobytes()
                buf = np.frombuffer(old_t[name][3], dtype=np.uint8).copy()
                assert xxhash.xxh3_128_hexdigest(buf.tobytes()) == m["hfdelta_base_checksums"][name]
                enc = m["hfdelta_encodings"][name]
                if enc != "stack":
                    _lay(enc, buf, entry)
                    parts_seen[name] = 1
                else:
                    assert entry[:4] == b"HFK1", name
                    (n,) = struct.unpack_from("<I", entry, 4)
                    at = 8 + 32 * n
                    for i in range(n):
                        code, zero, size, hi, lo = struct.unpack_from("<IIQQQ", entry, 8 + 32 * i)
                        assert zero == 0 and code in CODES, (name, i)
                        _lay(CODES[code], buf, entry[at:at + size])
                        at += size
                        # The checksum of the tensor after this part, high word first.
                        assert xxhash.xxh3_128_hexdigest(buf.tobytes()) == f"{hi:016x}{lo:016x}", (name, i)
                    assert at == len(entry), name
                    assert f"{hi:016x}{lo:016x}" == meta[name], name
                    parts_seen[name] = n
                assert meta[name] == xxhash.xxh3_128_hexdigest(buf.tobytes()), name
                assert buf.tobytes() == new_t[name][3], name
    assert sorted(parts_seen) == sorted(n for n in new_t if new_t[n][3] != old_t[n][3])
    # Changed at every step, most tensors get all three parts.
    assert sum(1 for p in parts_seen.values() if p == 3) > len(parts_seen) // 2, parts_seen
