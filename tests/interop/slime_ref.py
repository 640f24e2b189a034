"""Reference publisher, applier and pull of the disk-delta layout published by
slime ("Delta Weight Sync"), written from the layout's description only
(docs/format.md, "Encodings") with numpy, zstandard, xxhash and the
safetensors library. It is the other side hfdelta must interoperate with; it
deliberately knows nothing of hfdelta's extensions (hfdelta_* keys, files/).
"""

import fcntl
import json
import os
import re
import shutil
import tempfile
import zlib

import numpy as np
import safetensors
import safetensors.numpy
import xxhash
import zstandard

import stio

INDEX = "model.safetensors.index.json"
DELTA_FILE = "model-00000-of-00001.safetensors"
VERSION_DIR = re.compile(r"^weight_v(\d{6,})$")


class OutOfOrder(Exception):
    pass


class VerifyFailed(Exception):
    pass


class Unsupported(Exception):
    pass


def fmt(v):
    return "%06d" % v


CHECKSUMS = ("xxh3-128", "adler32")


def checksum(b, algorithm="xxh3-128"):
    """A tensor's checksum as the layout writes it: xxh3-128 as 32 hex digits,
    or (miles' --update-weight-delta-checksum adler32) zlib's Adler-32, from 1,
    as 8 lowercase hex digits."""
    if algorithm == "adler32":
        return "%08x" % zlib.adler32(bytes(b), 1)
    if algorithm != "xxh3-128":
        raise Unsupported(f"checksum_format {algorithm}")
    return xxhash.xxh3_128_hexdigest(bytes(b))


# ---------------------------------------------------------------- encodings


def encode(encoding, old, new, level=1):
    """One zstd frame for one changed tensor."""
    a = np.frombuffer(old, dtype=np.uint8)
    b = np.frombuffer(new, dtype=np.uint8)
    assert a.size == b.size
    if encoding == "xor":
        raw = (a ^ b).tobytes()
    elif encoding == "overwrite":
        assert b.size < 2**32, "overwrite positions are 32-bit"
        pos = np.flatnonzero(a != b)
        raw = (
            np.array([pos.size], dtype="<u4").tobytes()
            + pos.astype("<u4").tobytes()
            + b[pos].tobytes()
        )
    else:
        raise Unsupported(encoding)
    return zstandard.ZstdCompressor(level=level).compress(raw)


def decode_frame(frame, limit):
    """Decodes exactly one zstd frame, refusing trailing data and output past `limit`."""
    d = zstandard.ZstdDecompressor().decompressobj()
    out = d.decompress(bytes(frame))
    if not d.eof:
        raise VerifyFailed("truncated zstd frame")
    if d.unused_data:
        raise VerifyFailed("data after the zstd frame")
    if len(out) > limit:
        raise VerifyFailed("frame decodes past the tensor")
    return out


def patch(encoding, buf, off, nbytes, frame):
    """Patches buf[off:off+nbytes] (a bytearray) in place."""
    view = np.frombuffer(buf, dtype=np.uint8, count=nbytes, offset=off)
    if encoding == "xor":
        x = np.frombuffer(decode_frame(frame, nbytes), dtype=np.uint8)
        if x.size != nbytes:
            raise VerifyFailed(f"xor frame decodes to {x.size} bytes, tensor has {nbytes}")
        view ^= x
    elif encoding == "overwrite":
        raw = decode_frame(frame, 4 + 5 * nbytes)
        (k,) = np.frombuffer(raw[:4], dtype="<u4")
        k = int(k)
        if len(raw) != 4 + 5 * k:
            raise VerifyFailed("overwrite frame has the wrong length for its count")
        pos = np.frombuffer(raw[4 : 4 + 4 * k], dtype="<u4").astype(np.int64)
        val = np.frombuffer(raw[4 + 4 * k :], dtype=np.uint8)
        if k and (np.any(np.diff(pos) <= 0) or pos[-1] >= nbytes):
            raise VerifyFailed("overwrite positions not ascending or out of range")
        view[pos] = val
    else:
        raise Unsupported(f"delta_encoding {encoding}")


# ---------------------------------------------------------------- publisher


def publish(base, new, out, version, base_version=None, encoding="xor", level=1, checksum_format="xxh3-128"):
    """Writes OUT, a delta version turning checkpoint BASE into NEW, its
    checksums in `checksum_format` (xxh3-128 or adler32)."""
    if base_version is None:
        base_version = version - 1
    old_t = stio.checkpoint_tensors(base)
    new_t = stio.checkpoint_tensors(new)
    assert sorted(old_t) == sorted(new_t), "tensor sets differ"
    frames, meta = {}, {}
    for name in sorted(new_t):
        _, dt, shape, nb = new_t[name]
        _, odt, oshape, ob = old_t[name]
        assert (dt, shape) == (odt, oshape)
        if nb == ob:
            continue
        frames[name] = np.frombuffer(encode(encoding, ob, nb, level), dtype=np.uint8)
        meta[name] = checksum(nb, checksum_format)
    tmp = tempfile.mkdtemp(prefix=".publish-", dir=os.path.dirname(os.path.abspath(out)))
    safetensors.numpy.save_file(frames, os.path.join(tmp, DELTA_FILE), metadata=meta)
    index = {
        "metadata": {
            "version": fmt(version),
            "base_version": fmt(base_version),
            "delta_encoding": encoding,
            "compression_format": "zstd",
            "checksum_format": checksum_format,
        },
        "weight_map": {name: DELTA_FILE for name in frames},
    }
    with open(os.path.join(tmp, INDEX), "w") as f:
        json.dump(index, f, indent=2)
    os.rename(tmp, out)
    return index


def publish_full(src, root, version):
    """Publishes an ordinary checkpoint as a full version."""
    tmp = os.path.join(root, f".weight_v{fmt(version)}.tmp")
    shutil.copytree(src, tmp)
    os.rename(tmp, os.path.join(root, f"weight_v{fmt(version)}"))


# ---------------------------------------------------------------- host-local side


class _Lock:
    def __init__(self, local):
        d = os.path.join(local, stio.STATE_DIR)
        os.makedirs(d, exist_ok=True)
        self.f = open(os.path.join(d, "lock"), "a+")

    def __enter__(self):
        fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


def local_version(local):
    s = stio.read_state(local)
    return None if s is None or s.get("version") is None else int(s["version"])


def write_state(local, version):
    d = os.path.join(local, stio.STATE_DIR)
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".state-", dir=d)
    with os.fdopen(fd, "w") as f:
        json.dump({"version": fmt(version)}, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, os.path.join(d, "state.json"))
    dfd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def is_delta(vdir):
    p = os.path.join(vdir, INDEX)
    if not os.path.exists(p):
        return False
    with open(p) as f:
        return "delta_encoding" in json.load(f).get("metadata", {})


def _reset_locked(src, local, version):
    """LOCAL becomes an exact copy of the full checkpoint SRC (state dir kept)."""
    for entry in os.listdir(local):
        if entry == stio.STATE_DIR:
            continue
        p = os.path.join(local, entry)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        else:
            os.remove(p)
    for entry in os.listdir(src):
        s, d = os.path.join(src, entry), os.path.join(local, entry)
        if os.path.isdir(s):
            shutil.copytree(s, d)
        else:
            shutil.copy2(s, d)
    write_state(local, version)


def init(src, local, version=0):
    os.makedirs(local, exist_ok=True)
    with _Lock(local):
        _reset_locked(src, local, version)


def _apply_locked(delta, local):
    with open(os.path.join(delta, INDEX)) as f:
        index = json.load(f)
    m = index["metadata"]
    if m.get("compression_format", "zstd") != "zstd":
        raise Unsupported(m["compression_format"])
    algorithm = m.get("checksum_format", "xxh3-128")
    if algorithm not in CHECKSUMS:
        raise Unsupported(algorithm)
    version, base = int(m["version"]), int(m["base_version"])
    cur = local_version(local)
    if cur == version:
        return "noop"
    if cur != base:
        raise OutOfOrder(f"delta {fmt(version)} needs base {fmt(base)}, LOCAL is at {cur}")
    encoding = m["delta_encoding"]
    where = stio.checkpoint_locations(local)
    by_file = {}
    for tensor, dfile in index["weight_map"].items():
        by_file.setdefault(dfile, []).append(tensor)
    # Whole LOCAL weight files in memory, patched there, written back in place.
    bufs = {}
    expect = {}
    for dfile, tensors in sorted(by_file.items()):
        with safetensors.safe_open(os.path.join(delta, dfile), framework="numpy") as f:
            meta = f.metadata() or {}
            for tensor in tensors:
                frame = f.get_tensor(tensor)
                assert frame.dtype == np.uint8 and frame.ndim == 1
                lfile, off, nb = where[tensor]
                if lfile not in bufs:
                    with open(os.path.join(local, lfile), "rb") as lf:
                        bufs[lfile] = bytearray(lf.read())
                patch(encoding, bufs[lfile], off, nb, frame.tobytes())
                expect[tensor] = (lfile, off, nb, meta[tensor])
    for tensor, (lfile, off, nb, want) in expect.items():
        got = checksum(bufs[lfile][off : off + nb], algorithm)
        if got != want:
            raise VerifyFailed(f"{tensor}: checksum {got} after patching, delta says {want}")
    for lfile, buf in bufs.items():
        with open(os.path.join(local, lfile), "r+b") as lf:
            lf.write(buf)
            lf.flush()
            os.fsync(lf.fileno())
    write_state(local, version)
    return "applied"


def apply(vdir, local):
    """Applies one version directory (delta, or full version reset)."""
    os.makedirs(local, exist_ok=True)
    with _Lock(local):
        if not is_delta(vdir):
            m = VERSION_DIR.match(os.path.basename(os.path.normpath(vdir)))
            _reset_locked(vdir, local, int(m.group(1)))
            return "reset"
        return _apply_locked(vdir, local)


def scan(root):
    out = {}
    for entry in os.listdir(root):
        m = VERSION_DIR.match(entry)
        if m and os.path.isdir(os.path.join(root, entry)):
            out[int(m.group(1))] = os.path.join(root, entry)
    return out


def pull(root, local, target=None):
    """Brings LOCAL to TARGET (default newest): newest full version above LOCAL's
    resets it, the deltas after it follow in order. Returns the versions applied."""
    os.makedirs(local, exist_ok=True)
    versions = scan(root)
    if not versions:
        raise OutOfOrder("nothing published")
    if target is None:
        target = max(versions)
    if target not in versions:
        raise OutOfOrder(f"{fmt(target)} not published")
    applied = []
    with _Lock(local):
        cur = local_version(local)
        if cur is not None and cur > target:
            raise OutOfOrder("target older than LOCAL")
        if cur == target:
            return applied
        full = None
        for v in range(target, -1 if cur is None else cur, -1):
            if v in versions and not is_delta(versions[v]):
                full = v
                break
        if full is not None:
            _reset_locked(versions[full], local, full)
            applied.append(full)
            cur = full
        elif cur is None:
            raise OutOfOrder("LOCAL is new and no full version is published")
        for v in range(cur + 1, target + 1):
            if v not in versions:
                raise OutOfOrder(f"version {fmt(v)} missing")
            _apply_locked(versions[v], local)
            applied.append(v)
    return applied
