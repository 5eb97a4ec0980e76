#!/usr/bin/env python3
"""Regenerates the corrupt-file corpus from a fresh good bundle.

The files are committed: a reader change that stops reading an old file, or changes what it
says about a damaged one, fails tests/cli (expected.json). Run only when the format changes
on purpose:  tests/corpus/make_corpus.py build/bin/crashcap
"""
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
crashcap = sys.argv[1]

with tempfile.TemporaryDirectory() as tmp:
    w = np.linspace(-1, 1, 3000, dtype=np.float32).reshape(30, 100)
    w[3, 7] = np.nan
    np.save(f"{tmp}/w.npy", w)
    np.save(f"{tmp}/labels.npy", np.array([1, 0, 7, 3], dtype=np.int64))
    np.save(f"{tmp}/images.npy", (np.arange(2 * 3 * 16 * 16) % 251).astype(np.uint8).reshape(2, 3, 16, 16))
    good = f"{here}/good.ccap"
    if os.path.exists(good):
        os.remove(good)
    subprocess.check_call([crashcap, "import", good, f"weights/w={tmp}/w.npy", f"batch/labels={tmp}/labels.npy",
                           f"batch/images={tmp}/images.npy", "--note", "user.comment=corpus"])

data = open(f"{here}/good.ccap", "rb").read()


def records(b):
    pos, out = 64, []
    while pos + 64 <= len(b) - 48:
        meta, body = struct.unpack_from("<I", b, pos + 16)[0], struct.unpack_from("<Q", b, pos + 24)[0]
        out.append((pos, struct.unpack_from("<H", b, pos + 4)[0], 64 + meta + body))
        pos += 64 + meta + body
    return out


recs = records(data)
chunks = [r for r in recs if r[1] == 2]
weights = chunks[0]


def write(name, b):
    open(f"{here}/{name}", "wb").write(b)


write("truncated-in-body.ccap", data[: weights[0] + 64 + 200])
write("truncated-in-header.ccap", data[:30])
write("no-footer.ccap", data[:-48])
flip = bytearray(data)
flip[weights[0] + weights[2] - 10] ^= 0x10
write("flipped-body.ccap", bytes(flip))
magic = bytearray(data)
magic[2] ^= 0x01
write("flipped-magic.ccap", bytes(magic))
write("not-a-bundle.txt", b"this is a text file, not a crashcap bundle\n" * 3)
write("empty.ccap", b"")
print("corpus written; record offsets:", recs)
