#!/usr/bin/env python3
"""Compares the Qwen3 text rows the engine computed with rows from an independent implementation.

Usage: compare_rows.py OURS.safetensors REFERENCE.raw

OURS is what `bench_text --dump OURS.safetensors` writes: float32 tensors "ids" and "mask"
(the 512 token ids and the attention mask of the benchmark's prompt) and "rows" (512 x 7680,
hidden states 9, 18 and 27 stacked per token). REFERENCE.raw is the same rows as raw little-
endian float32 from the reference run on the same weights and the same ids (the procedure is in
docs/architecture.md#text). Prints one JSON line per hidden state and one for all of them, with
max |diff| / max |reference|; exit 0 only when that is <= 1e-3 for all. Standard library only.
"""
import json
import struct
import sys


def read_safetensors(path):
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise SystemExit(f"{path}: {name} is {info['dtype']}, expected F32")
        begin, end = info["data_offsets"]
        tensors[name] = (info["shape"], struct.unpack(f"<{(end - begin) // 4}f", data[begin:end]))
    return tensors


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    ours = read_safetensors(sys.argv[1])
    (tokens, width), rows = ours["rows"]
    raw = open(sys.argv[2], "rb").read()
    ref = struct.unpack(f"<{len(raw) // 4}f", raw)
    if len(ref) != len(rows):
        raise SystemExit(f"{sys.argv[2]} holds {len(ref)} floats, expected {len(rows)} ({tokens} x {width})")
    parts = 3
    hidden = width // parts
    ok = True
    for part, layer in enumerate((9, 18, 27)):
        diff = top = 0.0
        for t in range(tokens):
            base = t * width + part * hidden
            for j in range(base, base + hidden):
                diff = max(diff, abs(rows[j] - ref[j]))
                top = max(top, abs(ref[j]))
        print(json.dumps({"hidden_state": layer, "max_abs_diff": diff, "max_abs_reference": top, "rel": diff / top}))
    diff = max(abs(a - b) for a, b in zip(rows, ref))
    top = max(abs(b) for b in ref)
    ok = diff / top <= 1e-3
    print(json.dumps({"all": True, "max_abs_diff": diff, "max_abs_reference": top, "rel": diff / top, "ok": ok}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
