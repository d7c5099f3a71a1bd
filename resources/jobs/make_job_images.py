#!/usr/bin/env python3
"""Draws the small templates and masks of the sample jobs, the golden test and bench_render.

Reuses the scene of scripts/make_sample_template.py at smaller sizes (our own drawing, pure
standard library). The outputs are committed; this script documents how they were made:

  resources/jobs/hills_256.png, hills_256_mask.png   the scene, mask over the house (~10%)
  resources/jobs/dusk_256.png,  dusk_256_mask.png    a mirrored dusk variant, mask in the sky (~10%)
  tests/data/golden/hills_128.png, hills_128_mask.png  the golden test's template and mask
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from make_sample_template import clamp, scene, write_png  # noqa: E402


def ellipse_mask(w, h, cx, cy, rx, ry):
    return [[255 if ((x - cx * w) / (rx * w)) ** 2 + ((y - cy * h) / (ry * h)) ** 2 <= 1 else 0
             for x in range(w)] for y in range(h)]


def hills(w):
    return [[c for x in range(w) for c in scene(x, y, w, w)] for y in range(w)]


def dusk(w):
    rows = []
    for y in range(w):
        row = []
        for x in range(w):
            r, g, b = scene(w - 1 - x, y, w, w)
            row.extend((clamp(r * 0.9 + 40), clamp(g * 0.6), clamp(b * 0.7 + 20)))
        rows.append(row)
    return rows


def ratio(mask):
    return sum(v > 0 for row in mask for v in row) / (len(mask) * len(mask[0]))


def main():
    jobs = HERE
    golden = os.path.join(ROOT, "tests", "data", "golden")
    write_png(os.path.join(jobs, "hills_256.png"), 256, 256, 3, hills(256))
    m = ellipse_mask(256, 256, 0.33, 0.58, 0.15, 0.2)
    write_png(os.path.join(jobs, "hills_256_mask.png"), 256, 256, 1, m)
    print("hills_256_mask ratio", ratio(m))
    write_png(os.path.join(jobs, "dusk_256.png"), 256, 256, 3, dusk(256))
    m = ellipse_mask(256, 256, 0.3, 0.22, 0.2, 0.15)
    write_png(os.path.join(jobs, "dusk_256_mask.png"), 256, 256, 1, m)
    print("dusk_256_mask ratio", ratio(m))
    os.makedirs(golden, exist_ok=True)
    write_png(os.path.join(golden, "hills_128.png"), 128, 128, 3, hills(128))
    write_png(os.path.join(golden, "hills_128_mask.png"), 128, 128, 1, ellipse_mask(128, 128, 0.33, 0.58, 0.15, 0.2))


if __name__ == "__main__":
    main()
