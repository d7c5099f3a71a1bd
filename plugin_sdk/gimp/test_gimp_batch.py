#!/usr/bin/env python3
"""Drives the GIMP plug-in through GIMP's batch mode against a real infill-engine.

Starts infill-engine (the build's random model, a private Unix socket, no journal), gives GIMP
a private profile (GIMP2_DIRECTORY) whose plug-ins folder holds the freshly built plug-in, and
runs Script-Fu that loads a small PNG, selects a rectangle and calls plug-in-infill-repaint.
Checks:
  - the image gains one layer, named "Infill", above the original and at its offsets;
  - the new layer equals the original outside the selection and differs inside it, for an RGB
    layer with offsets, a greyscale layer with alpha, and 16-bit integer and 32-bit float linear
    images (compared at that depth, through uncompressed TIFF exports);
  - error cases end with a clear message and GIMP still exits 0: no selection, a prompt word
    the model does not know, an engine that is not running;
  - killing the plug-in mid-edit, as GIMP's progress cancel button does, cancels the edit on
    the engine (the plug-in's watcher process).
With --flux2-maker (infill-test-flux2: a tiny FLUX.2 model and LoRA files) it checks the LoRA
arguments against a FLUX.2 engine instead: the file is uploaded (the engine lists it), a repaint
with it differs from one without inside the selection and equals a repeat, and a missing file,
a LoRA for another model and a strength outside the parameter table's range end with messages
naming them. Exit 4 (skipped) when the maker cannot write the model (no Qwen3 tokenizer).
Every step is bounded in time; the engine is stopped with SIGTERM and must exit 0."""
import argparse
import hashlib
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "support"))
from engine_process import http_get, wait_healthy  # noqa: E402  (after the search path)

W, H = 64, 48
RECT = (16, 12, 24, 16)  # x, y, w, h of the selection
OFFSET = (5, 3)          # the layer's offsets in a larger canvas (second case)


def write_png(path, width, height, pixels):
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    rows = b"".join(b"\0" + bytes(pixels[y * width * 3:(y + 1) * width * 3]) for y in range(height))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def read_pnm(path):
    """Binary PGM / PPM (P5 / P6, maxval 255) as written by GIMP's file-pnm-save ->
    (w, h, channels, bytes)."""
    with open(path, "rb") as f:
        data = f.read()
    fields, pos = [], 0
    while len(fields) < 4:
        while data[pos:pos + 1].isspace():
            pos += 1
        if data[pos:pos + 1] == b"#":
            pos = data.index(b"\n", pos) + 1
            continue
        end = pos
        while not data[end:end + 1].isspace():
            end += 1
        fields.append(data[pos:end])
        pos = end
    assert fields[0] in (b"P5", b"P6") and fields[3] == b"255", f"{path}: {fields}"
    w, h, channels = int(fields[1]), int(fields[2]), 3 if fields[0] == b"P6" else 1
    return w, h, channels, data[pos + 1:pos + 1 + w * h * channels]


def read_tiff(path):
    """An uncompressed TIFF as GIMP's file-tiff-save writes it (compression 0) ->
    (w, h, channels, bits, is_float, bytes)."""
    with open(path, "rb") as f:
        data = f.read()
    order = "<" if data[:2] == b"II" else ">"
    (ifd,) = struct.unpack(order + "I", data[4:8])
    (count,) = struct.unpack(order + "H", data[ifd:ifd + 2])
    tags = {}
    for i in range(count):
        tag, kind, n, value = struct.unpack(order + "HHI4s", data[ifd + 2 + 12 * i:ifd + 14 + 12 * i])
        size = {3: 2, 4: 4}.get(kind, 1)
        raw = value if n * size <= 4 else data[struct.unpack(order + "I", value)[0]:][:n * size]
        tags[tag] = list(struct.unpack(order + ("H" if size == 2 else "I" if size == 4 else "B") * n, raw[:n * size]))
    assert tags.get(259, [1])[0] == 1, f"{path}: compressed ({tags[259]})"
    strips = b"".join(data[o:o + c] for o, c in zip(tags[273], tags[279]))
    return (tags[256][0], tags[257][0], tags[277][0], tags[258][0], tags.get(339, [1])[0] == 3, strips)


def changed_pixels(before, after, channels, rect):
    """(inside, outside): pixels of two W x H images that differ inside / outside rect."""
    x, y, w, h = rect
    inside = outside = 0
    for py in range(H):
        for px in range(W):
            i = (py * W + px) * channels
            if before[i:i + channels] != after[i:i + channels]:
                if x <= px < x + w and y <= py < y + h:
                    inside += 1
                else:
                    outside += 1
    return inside, outside


def processes_of(binary):
    """(pid, argv) of the running processes started from `binary`."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        if argv and argv[0] == binary:
            found.append((int(pid), argv))
    return found


def kill_plugin_and_check_cancel(binary, sock_path):
    """Waits for the plug-in's cancel watcher (the edit is submitted), SIGKILLs the plug-in as
    GIMP's cancel does, and checks that the engine cancels the edit. Returns failures."""
    end, watcher, plugin = time.time() + 90, None, None
    while time.time() < end and not watcher:
        for pid, argv in processes_of(binary):
            if len(argv) > 3 and argv[1] == "--cancel-watch":
                watcher = (pid, argv)
            elif len(argv) > 1 and argv[1] == "-gimp":
                plugin = pid
        time.sleep(0.05)
    if not watcher or not plugin:
        return ["the plug-in did not start its cancel watcher within 90 s"]
    edit_id = watcher[1][3]
    os.kill(plugin, signal.SIGKILL)
    print(f"killed the plug-in (pid {plugin}) during edit {edit_id}")
    state, end = "", time.time() + 30
    while time.time() < end:
        answer = http_get(sock_path, f"/v1/edits/{edit_id}")
        for candidate in ("cancelled", "done", "failed", "expired"):
            if f'"state":"{candidate}"' in answer:
                state = candidate
        if state:
            break
        time.sleep(0.1)
    print(f"edit {edit_id} ended {state or 'not within 30 s'}")
    return [] if state == "cancelled" else [f"the edit of the killed plug-in ended {state or 'not at all'}, expected cancelled"]


def scheme_string(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def table_strength_range():
    """The strength range of the "adapters" row of the parameter table, as "-10..10"."""
    path = os.path.join(HERE, "..", "..", "protocol", "infill_protocol", "edit_parameters.h")
    row = re.search(r'\{\.name = "adapters",.*?\.min = (-?[\d.]+), \.max = (-?[\d.]+)', open(path).read(), re.S)
    return f"{float(row.group(1)):g}..{float(row.group(2)):g}"


def lora_main(args, work, env, sock_dir, image_in, pixels):
    """The plug-in's LoRA arguments against a FLUX.2 engine (--flux2-maker). Returns failures, or
    None when skipped."""
    files = os.path.join(work, "files")
    made = subprocess.run([args.flux2_maker, files]).returncode
    if made == 4:
        return None
    if made != 0:
        return [f"infill-test-flux2 exited {made}"]
    style, wider = os.path.join(files, "style.safetensors"), os.path.join(files, "wider.safetensors")
    sock = os.path.join(sock_dir, "engine.sock")
    log = open(os.path.join(work, "engine.log"), "w")
    engine = subprocess.Popen([args.engine, "--model", os.path.join(files, "flux2"), "--socket", sock, "--journal", "off",
                               "--no-calibrate", "--threads", "1"], stdout=log, stderr=subprocess.STDOUT, env=env)
    failures = []
    try:
        wait_healthy(sock, engine, 120)
        endpoint = "unix:" + sock
        out = lambda name: scheme_string(os.path.join(work, name))  # noqa: E731

        def case(tag, adapter, strength):
            """A repaint of the selection with (adapter, strength); the result layer as tag.ppm."""
            return f"""
(let* ((image (car (gimp-file-load RUN-NONINTERACTIVE {scheme_string(image_in)} "in.png")))
       (layer (car (gimp-image-get-active-layer image))))
  (gimp-context-set-feather FALSE)
  (gimp-image-select-rectangle image CHANNEL-OP-REPLACE {RECT[0]} {RECT[1]} {RECT[2]} {RECT[3]})
  (let* ((result (car (plug-in-infill-repaint RUN-NONINTERACTIVE image layer "make it red" 7 0 1.0 0.0
                                              {scheme_string(endpoint)} "" {scheme_string(adapter)} {strength}))))
    (file-pnm-save RUN-NONINTERACTIVE image result {out(tag + ".ppm")} "{tag}.ppm" 1))
  (gimp-image-delete image))"""

        cases = [case("plain", "", 1.0), case("adapted", style, 1.5), case("repeat", style, 1.5),
                 case("strength1", style, 1.0),
                 case("missing", os.path.join(files, "missing.safetensors"), 1.0), case("wider", wider, 1.0),
                 case("strong", style, 11.0)]
        cmd = [args.gimp, "-i", "-d", "-f", "--no-interface", "--console-messages"]
        for script in cases:
            cmd += ["-b", script]
        cmd += ["-b", "(gimp-quit 0)"]
        try:
            run = subprocess.run(cmd, env=env, cwd=work, capture_output=True, text=True, timeout=240)
        except subprocess.TimeoutExpired as e:
            raise SystemExit(f"gimp did not finish within 240 s\n{e.stdout}\n{e.stderr}")
        output = run.stdout + run.stderr
        with open(os.path.join(work, "gimp.log"), "w") as f:
            f.write(output)
        if run.returncode != 0:
            failures.append(f"gimp exited {run.returncode}")

        results = {}
        for tag in ("plain", "adapted", "repeat", "strength1"):
            try:
                w, h, _, px = read_pnm(os.path.join(work, tag + ".ppm"))
            except OSError:
                failures.append(f"{tag}: the repaint did not finish (no {tag}.ppm)")
                continue
            inside, outside = changed_pixels(bytes(pixels), px, 3, RECT)
            print(f"{tag}: {inside} pixels changed inside the selection, {outside} outside")
            if (w, h) != (W, H) or outside:
                failures.append(f"{tag}: {w}x{h}, {outside} pixels outside the selection changed")
            results[tag] = px
        if len(results) == 4:
            lora_inside, _ = changed_pixels(results["plain"], results["adapted"], 3, RECT)
            print(f"the LoRA changed {lora_inside} pixels inside the selection")
            if lora_inside == 0:
                failures.append("the repaint with the LoRA equals the one without")
            if results["repeat"] != results["adapted"]:
                failures.append("the same repaint with the LoRA came out different")
            if results["strength1"] == results["adapted"]:
                failures.append("the LoRA's strength was not applied (1.0 and 1.5 came out the same)")
        lora_id = hashlib.sha256(open(style, "rb").read()).hexdigest()
        if lora_id not in http_get(sock, "/v1/adapters"):
            failures.append(f"the engine does not list the uploaded LoRA {lora_id}")
        for what, text in (("a missing LoRA file", "the LoRA was not accepted: cannot open the LoRA file"),
                           ("a missing LoRA file", "missing.safetensors"),
                           ("a LoRA for another model", "wider.safetensors"),
                           ("a LoRA for another model", "invalid_adapter"),
                           ("a strength out of range", "adapter-strength 11 must be " + table_strength_range())):
            if text not in output:
                failures.append(f"{what}: no message containing {text!r}")
        if "terminated" in output.lower() or "crashed" in output.lower():
            failures.append("the plug-in crashed")
    finally:
        engine.send_signal(signal.SIGTERM)
        try:
            code = engine.wait(timeout=30)
        except subprocess.TimeoutExpired:
            engine.kill()
            code = "killed"
        log.close()
    if code != 0:
        failures.append(f"infill-engine exited {code}")
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True)
    ap.add_argument("--model", help="the engine's model (the repaint, error and cancel checks)")
    ap.add_argument("--flux2-maker", help="infill-test-flux2: check the LoRA arguments on a FLUX.2 engine instead")
    ap.add_argument("--plugin", required=True)
    ap.add_argument("--gimp", default="gimp")
    ap.add_argument("--work-dir", required=True)
    args = ap.parse_args()
    if not args.model and not args.flux2_maker:
        ap.error("give --model (the repaint checks) or --flux2-maker (the LoRA checks)")

    work = os.path.abspath(args.work_dir)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    # Unix socket paths are limited to 107 bytes: keep the socket in a short temporary folder.
    sock_dir = tempfile.mkdtemp(prefix="infill-gimp-")
    sock = os.path.join(sock_dir, "engine.sock")

    # The test image: a smooth gradient, so any repaint shows.
    pixels = bytearray()
    for y in range(H):
        for x in range(W):
            pixels += bytes((x * 4 & 255, y * 5 & 255, (x + y) * 2 & 255))
    image_in = os.path.join(work, "in.png")
    write_png(image_in, W, H, pixels)

    # A private GIMP profile holding only our plug-in (GIMP wants plug-ins/<name>/<name>).
    profile = os.path.join(work, "profile")
    plugin_dir = os.path.join(profile, "plug-ins", "infill-repaint")
    os.makedirs(plugin_dir)
    # A profile folder that exists counts as installed: create the data folders GIMP writes to.
    for folder in ("brushes", "dynamics", "fonts", "gradients", "palettes", "patterns", "scripts",
                   "templates", "tool-presets", "mypaint-brushes"):
        os.makedirs(os.path.join(profile, folder))
    shutil.copy2(args.plugin, os.path.join(plugin_dir, "infill-repaint"))

    env = dict(os.environ)
    env["GIMP2_DIRECTORY"] = profile
    env["HOME"] = work                         # GIMP writes caches under $HOME too
    env["XDG_CONFIG_HOME"] = os.path.join(work, "config")
    env["XDG_CACHE_HOME"] = os.path.join(work, "cache")
    env["XDG_RUNTIME_DIR"] = sock_dir
    env.pop("INFILL_ENDPOINT", None)
    env.pop("DISPLAY", None)                   # batch mode needs no display

    if args.flux2_maker:
        try:
            failures = lora_main(args, work, env, sock_dir, image_in, pixels)
        finally:
            shutil.rmtree(sock_dir, ignore_errors=True)
        if failures is None:
            print("SKIPPED: infill-test-flux2 could not write the FLUX.2 model (no Qwen3 tokenizer; scripts/setup.sh "
                  "installs it)")
            return 4
        for f in failures:
            print("FAIL:", f)
        print("LoRA:", "failed" if failures else "ok: uploaded, applied, repeatable; bad files and strengths reported")
        return 1 if failures else 0

    log = open(os.path.join(work, "engine.log"), "w")
    engine = subprocess.Popen([args.engine, "--model", args.model, "--socket", sock, "--journal", "off",
                               "--no-calibrate", "--threads", "1"], stdout=log, stderr=subprocess.STDOUT, env=env)
    failures = []
    try:
        wait_healthy(sock, engine, 60)

        endpoint = "unix:" + sock
        x, y, w, h = RECT
        out = lambda name: scheme_string(os.path.join(work, name))

        def repaint(image, layer, prompt, ep):
            return (f"(plug-in-infill-repaint RUN-NONINTERACTIVE {image} {layer} {scheme_string(prompt)} 7 4 1.0 0.0 "
                    f"{scheme_string(ep)} \"\" \"\" 1.0)")

        # 1. The repaint, on a layer at offsets in a larger canvas: the selection is in image
        #    coordinates, the mask in layer coordinates.
        ok_case = f"""
(let* ((image (car (gimp-file-load RUN-NONINTERACTIVE {scheme_string(image_in)} "in.png")))
       (layer (car (gimp-image-get-active-layer image))))
  (gimp-image-resize image {W + 2 * OFFSET[0]} {H + 2 * OFFSET[1]} {OFFSET[0]} {OFFSET[1]})
  (gimp-context-set-feather FALSE)
  (gimp-image-select-rectangle image CHANNEL-OP-REPLACE {x + OFFSET[0]} {y + OFFSET[1]} {w} {h})
  (let* ((result (car {repaint("image", "layer", "", endpoint)}))
         (layers (gimp-image-get-layers image))
         (offsets (gimp-drawable-offsets result))
         (port (open-output-file {out("info.txt")})))
    (file-pnm-save RUN-NONINTERACTIVE image layer {out("before.ppm")} "before.ppm" 1)
    (file-pnm-save RUN-NONINTERACTIVE image result {out("after.ppm")} "after.ppm" 1)
    (display (car layers) port) (newline port)
    (display (if (= (vector-ref (cadr layers) 0) result) "top" "not-top") port) (newline port)
    (display (car (gimp-item-get-name result)) port) (newline port)
    (display (car offsets) port) (display " " port) (display (cadr offsets) port) (newline port)
    (close-output-port port))
  (gimp-image-delete image))"""

        # 1b. A greyscale image whose layer has alpha: the plug-in sends RGBA and writes the
        #     result back into a grey layer.
        grey_case = f"""
(let* ((image (car (gimp-file-load RUN-NONINTERACTIVE {scheme_string(image_in)} "in.png")))
       (layer (car (gimp-image-get-active-layer image))))
  (gimp-image-convert-grayscale image)
  (gimp-layer-add-alpha layer)
  (gimp-context-set-feather FALSE)
  (gimp-image-select-rectangle image CHANNEL-OP-REPLACE {x} {y} {w} {h})
  (let* ((result (car {repaint("image", "layer", "", endpoint)}))
         (port (open-output-file {out("grey_info.txt")})))
    (display (car (gimp-drawable-type result)) port) (newline port)
    (close-output-port port)
    ; PNM has no alpha: drop it (both layers are opaque) before exporting.
    (gimp-layer-flatten layer)
    (gimp-layer-flatten result)
    (file-pnm-save RUN-NONINTERACTIVE image layer {out("grey_before.pgm")} "grey_before.pgm" 1)
    (file-pnm-save RUN-NONINTERACTIVE image result {out("grey_after.pgm")} "grey_after.pgm" 1))
  (gimp-image-delete image))"""

        # 1c. Deeper images: 16-bit integer and 32-bit float linear, blurred so that every bit
        #     carries detail. The plug-in sends them as TIFF at that depth; outside the
        #     selection the new layer keeps the original's samples exactly.
        def deep_case(precision, tag):
            return f"""
(let* ((image (car (gimp-file-load RUN-NONINTERACTIVE {scheme_string(image_in)} "in.png")))
       (layer (car (gimp-image-get-active-layer image))))
  (gimp-image-convert-precision image {precision})
  (plug-in-gauss RUN-NONINTERACTIVE image layer 3 3 0)
  (gimp-context-set-feather FALSE)
  (gimp-image-select-rectangle image CHANNEL-OP-REPLACE {x} {y} {w} {h})
  (let* ((result (car {repaint("image", "layer", "", endpoint)})))
    ; file-tiff-save writes the image, not the drawable it is given: each layer goes out as the
    ; only layer of an image of the same precision.
    (define (export-alone drawable path)
      (let* ((alone (car (gimp-image-new-with-precision {W} {H} RGB {precision})))
             (copy (car (gimp-layer-new-from-drawable drawable alone))))
        (gimp-image-insert-layer alone copy 0 0)
        (file-tiff-save RUN-NONINTERACTIVE alone copy path "layer.tif" 0)
        (gimp-image-delete alone)))
    (export-alone layer {out(tag + "_before.tif")})
    (export-alone result {out(tag + "_after.tif")}))
  (gimp-image-delete image))"""
        deep_cases = {"u16": deep_case("PRECISION-U16-GAMMA", "u16"), "float": deep_case("PRECISION-FLOAT-LINEAR", "float")}

        # 2. Errors: each batch command fails on its own; GIMP goes on to the next one.
        no_selection = f"""
(let* ((image (car (gimp-file-load RUN-NONINTERACTIVE {scheme_string(image_in)} "in.png")))
       (layer (car (gimp-image-get-active-layer image))))
  (gimp-selection-none image)
  {repaint("image", "layer", "", endpoint)})"""
        bad_word = f"""
(let* ((image (car (gimp-file-load RUN-NONINTERACTIVE {scheme_string(image_in)} "in.png")))
       (layer (car (gimp-image-get-active-layer image))))
  (gimp-image-select-rectangle image CHANNEL-OP-REPLACE 1 1 8 8)
  {repaint("image", "layer", "banana", endpoint)})"""
        unreachable = f"""
(let* ((image (car (gimp-file-load RUN-NONINTERACTIVE {scheme_string(image_in)} "in.png")))
       (layer (car (gimp-image-get-active-layer image))))
  (gimp-image-select-rectangle image CHANNEL-OP-REPLACE 1 1 8 8)
  {repaint("image", "layer", "", "unix:" + os.path.join(sock_dir, "nobody.sock"))})"""

        cmd = [args.gimp, "-i", "-d", "-f", "--no-interface", "--console-messages"]
        for script in (ok_case, grey_case, *deep_cases.values(), no_selection, bad_word, unreachable):
            cmd += ["-b", script]
        cmd += ["-b", "(gimp-quit 0)"]
        t0 = time.time()
        try:
            run = subprocess.run(cmd, env=env, cwd=work, capture_output=True, text=True, timeout=240)
        except subprocess.TimeoutExpired as e:
            raise SystemExit(f"gimp did not finish within 240 s\n{e.stdout}\n{e.stderr}")
        output = run.stdout + run.stderr
        with open(os.path.join(work, "gimp.log"), "w") as f:
            f.write(output)
        print(f"gimp ran {time.time() - t0:.1f} s, exit {run.returncode}")
        if run.returncode != 0:
            failures.append(f"gimp exited {run.returncode}")

        # The repaint.
        try:
            info = open(os.path.join(work, "info.txt")).read().split("\n")
        except OSError:
            info = []
            failures.append("the repaint did not finish (no info.txt)")
        if info:
            if info[0] != "2":
                failures.append(f"the image has {info[0]} layers, expected 2")
            if info[1] != "top":
                failures.append("the new layer is not above the original")
            if info[2] != "Infill":
                failures.append(f"the new layer is named {info[2]!r}, expected 'Infill'")
            if info[3] != f"{OFFSET[0]} {OFFSET[1]}":
                failures.append(f"the new layer is at {info[3]}, expected the original's offsets {OFFSET}")
            bw, bh, _, before = read_pnm(os.path.join(work, "before.ppm"))
            aw, ah, _, after = read_pnm(os.path.join(work, "after.ppm"))
            if (bw, bh) != (W, H) or (aw, ah) != (W, H):
                failures.append(f"layers are {bw}x{bh} and {aw}x{ah}, expected {W}x{H}")
            elif before != bytes(pixels):
                failures.append("the original layer changed")
            else:
                inside, outside = changed_pixels(before, after, 3, RECT)
                print(f"RGB: {inside} pixels changed inside the selection ({w * h}), {outside} outside")
                if outside:
                    failures.append(f"RGB: {outside} pixels outside the selection changed")
                if inside < w * h // 4:
                    failures.append(f"RGB: only {inside} of {w * h} pixels inside the selection changed")

        # The greyscale image.
        try:
            grey_type = open(os.path.join(work, "grey_info.txt")).read().split()[0]
            _, _, gc, before = read_pnm(os.path.join(work, "grey_before.pgm"))
            _, _, _, after = read_pnm(os.path.join(work, "grey_after.pgm"))
            inside, outside = changed_pixels(before, after, gc, RECT)
            print(f"grey: {inside} pixels changed inside the selection ({w * h}), {outside} outside")
            if grey_type != "3":  # GRAYA-IMAGE
                failures.append(f"grey: the new layer's type is {grey_type}, expected 3 (GRAYA-IMAGE)")
            if gc != 1:
                failures.append("grey: the result was not exported as PGM")
            if outside:
                failures.append(f"grey: {outside} pixels outside the selection changed")
            if inside < w * h // 4:
                failures.append(f"grey: only {inside} of {w * h} pixels inside the selection changed")
        except (OSError, IndexError):
            failures.append("the greyscale repaint did not finish (no grey_info.txt)")

        # The deeper images.
        for tag, (bits, is_float) in (("u16", (16, False)), ("float", (32, True))):
            try:
                bw, bh, bc, bb, bf, before = read_tiff(os.path.join(work, tag + "_before.tif"))
                aw, ah, ac, ab, af, after = read_tiff(os.path.join(work, tag + "_after.tif"))
            except (OSError, KeyError, AssertionError, struct.error) as e:
                failures.append(f"{tag}: the repaint did not finish or its TIFF is unreadable ({e})")
                continue
            if (bw, bh, bb, bf) != (W, H, bits, is_float) or (aw, ah, ac, ab, af) != (bw, bh, bc, bb, bf):
                failures.append(f"{tag}: layers exported as {bw}x{bh}x{bc} {bb}-bit ({bf}) and "
                                f"{aw}x{ah}x{ac} {ab}-bit ({af}), expected {W}x{H} {bits}-bit")
                continue
            inside, outside = changed_pixels(before, after, bc * bits // 8, RECT)
            print(f"{tag}: {inside} pixels changed inside the selection ({w * h}), {outside} outside")
            if outside:
                failures.append(f"{tag}: {outside} pixels outside the selection changed")
            if inside < w * h // 4:
                failures.append(f"{tag}: only {inside} of {w * h} pixels inside the selection changed")

        # The errors: a message each, the procedure failed, GIMP went on.
        for what, text in (("no selection", "select the region to repaint first"),
                           ("unknown prompt word", "takes no prompt"),
                           ("engine not running", "cannot reach the Infill engine"),
                           ("engine not running", "nobody.sock")):
            if text not in output:
                failures.append(f"{what}: no message containing {text!r}")
        if output.count("plug-in-infill-repaint") < 3:
            failures.append("expected three failed calls of plug-in-infill-repaint in GIMP's output")
        if "terminated" in output.lower() or "crashed" in output.lower():
            failures.append("the plug-in crashed")

        # 3. GIMP's progress cancel button kills the plug-in (a quit message, then SIGKILL): the
        #    plug-in's watcher process must cancel the edit on the engine. 1000 steps on a
        #    template not prepared for them take several seconds.
        kill_case = f"""
(let* ((image (car (gimp-file-load RUN-NONINTERACTIVE {scheme_string(image_in)} "in.png")))
       (layer (car (gimp-image-get-active-layer image))))
  (gimp-image-select-rectangle image CHANNEL-OP-REPLACE 1 1 8 8)
  (plug-in-infill-repaint RUN-NONINTERACTIVE image layer "" 7 1000 1.0 0.0 {scheme_string(endpoint)} "" "" 1.0))"""
        kill_log = open(os.path.join(work, "gimp_kill.log"), "w")
        gimp = subprocess.Popen([args.gimp, "-i", "-d", "-f", "--console-messages", "-b", kill_case, "-b", "(gimp-quit 0)"],
                                env=env, cwd=work, stdout=kill_log, stderr=subprocess.STDOUT)
        try:
            failures += kill_plugin_and_check_cancel(os.path.join(plugin_dir, "infill-repaint"), sock)
            try:
                code = gimp.wait(timeout=120)
                if code != 0:
                    failures.append(f"gimp exited {code} after its plug-in was killed")
            except subprocess.TimeoutExpired:
                failures.append("gimp did not exit within 120 s after its plug-in was killed")
        finally:
            if gimp.poll() is None:
                gimp.kill()
                gimp.wait()
            kill_log.close()
    finally:
        engine.send_signal(signal.SIGTERM)
        try:
            code = engine.wait(timeout=30)
        except subprocess.TimeoutExpired:
            engine.kill()
            code = "killed"
        log.close()
        shutil.rmtree(sock_dir, ignore_errors=True)
    if code != 0:
        failures.append(f"infill-engine exited {code}")

    if failures:
        print("GIMP output:\n" + open(os.path.join(work, "gimp.log")).read() if os.path.exists(os.path.join(work, "gimp.log")) else "")
        for f in failures:
            print("FAIL:", f)
        return 1
    print("ok: repaint inside the selection only, a new layer above; errors reported, GIMP exited 0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
