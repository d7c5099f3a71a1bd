#!/usr/bin/env python3
"""Draws the bundled sample template and its mask (our own drawing, no third-party image).

Writes resources/templates/sample.png (512x512 RGB) and sample_mask.png (512x512 grey,
255 = regenerate). Pure standard library, so it runs anywhere; the outputs are committed and
this script documents how they were made.
"""
import math
import os
import struct
import sys
import zlib


def write_png(path, width, height, channels, rows):
    color_type = {1: 0, 3: 2}[channels]
    raw = b"".join(b"\x00" + bytes(row) for row in rows)
    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(png)


def clamp(v):
    return max(0, min(255, int(round(v))))


def scene(x, y, w, h):
    u, v = x / w, y / h
    # Sky: a vertical gradient with a sun.
    r, g, b = 90 + 120 * v, 150 + 70 * v, 235 - 30 * v
    d = math.hypot(x - 0.78 * w, y - 0.2 * h)
    if d < 0.08 * w:
        r, g, b = 255, 225, 120
    elif d < 0.12 * w:
        t = (d - 0.08 * w) / (0.04 * w)
        r, g, b = r + (255 - r) * (1 - t) * 0.6, g + (225 - g) * (1 - t) * 0.6, b
    # Two hills.
    hill1 = 0.62 * h + 0.06 * h * math.sin(u * 5.0 + 0.5)
    hill2 = 0.72 * h + 0.04 * h * math.sin(u * 9.0 + 2.0)
    if y > hill1:
        r, g, b = 70 + 30 * u, 140 + 20 * math.sin(u * 30), 60
    if y > hill2:
        shade = 0.85 + 0.15 * math.sin(x * 0.15) * math.sin(y * 0.11)
        r, g, b = 50 * shade, 115 * shade, 45 * shade
    # A house: red wall, dark roof, a window.
    if 0.22 * w < x < 0.44 * w and 0.5 * h < y < 0.74 * h:
        r, g, b = 180, 60, 50
        if 0.28 * w < x < 0.34 * w and 0.56 * h < y < 0.64 * h:
            r, g, b = 240, 230, 160
    roof_top = 0.38 * h
    if 0.2 * w < x < 0.46 * w and roof_top < y <= 0.5 * h:
        half = (y - roof_top) / (0.12 * h) * 0.13 * w
        if abs(x - 0.33 * w) < half:
            r, g, b = 70, 50, 45
    return clamp(r), clamp(g), clamp(b)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "resources", "templates")
    w = h = 512
    rows = []
    for y in range(h):
        row = []
        for x in range(w):
            row.extend(scene(x, y, w, h))
        rows.append(row)
    write_png(os.path.join(out, "sample.png"), w, h, 3, rows)
    # Mask: an ellipse over the house (about 10% of the image).
    mask = []
    for y in range(h):
        mask.append([255 if ((x - 0.33 * w) / (0.15 * w)) ** 2 + ((y - 0.58 * h) / (0.2 * h)) ** 2 <= 1 else 0
                     for x in range(w)])
    write_png(os.path.join(out, "sample_mask.png"), w, h, 1, mask)


if __name__ == "__main__":
    main()
