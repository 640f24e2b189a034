"""A trainer's publishing loop, for the restart tests: opens a Publisher on ROOT
and MIRROR and publishes saves version+1 .. LAST of SERIES (save_NNN
directories) from memory, one version after another, each from its tensors
loaded into numpy arrays in a shuffled order.

Usage: publish_child.py ROOT MIRROR SERIES LAST ENCODING
Prints the opening (JSON) and each version published; exits 0 when the root
publishes LAST.
"""

import json
import random
import sys
from pathlib import Path

import ml_dtypes  # noqa: F401  (bfloat16 for safetensors' numpy loader)
from safetensors.numpy import load_file

import hfdelta


def main() -> None:
    root, mirror, series, last, encoding = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    with hfdelta.Publisher(root, mirror, encoding=encoding) as pub:
        o = pub.opening
        print(json.dumps({"version": o.version, "rolled_back": o.rolled_back, "caught_up": o.caught_up}), flush=True)
        while pub.version < last:
            v = pub.version + 1
            tensors = {}
            for f in sorted((series / f"save_{v:03d}").glob("*.safetensors")):
                tensors.update(load_file(str(f)))
            items = list(tensors.items())
            random.Random(v).shuffle(items)
            r = pub.publish(items)
            print(f"published {r.version}", flush=True)


if __name__ == "__main__":
    main()
