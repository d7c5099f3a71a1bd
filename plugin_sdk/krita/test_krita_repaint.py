#!/usr/bin/env python3
"""Drives the Krita plug-in inside Debian's Krita (kritarunner, headless) against a real
infill-engine: the build's random model on a private Unix socket.

For a paint layer at each colour depth Krita has (8 and 16-bit integer, 16 and 32-bit float)
krita_repaint_check.py selects a rectangle and repaints it through the plug-in's code and
libinfill_client. Checks per depth: the result comes back in the layer's own format (TIFF for
integers, OpenEXR for floats); a new layer lands above the original, in the same colour space;
outside the selection it equals the original byte for byte; inside it equals the engine's result
for that request and differs from the original; no selection is refused with a clear message.

With --flux2-maker (infill-test-flux2: a tiny FLUX.2 model and LoRA files) it checks the docker's
LoRA list against a FLUX.2 engine instead: a missing file and one the model cannot use are
refused with a message naming them, a file is uploaded once (added twice: one entry), the
strength range is the parameter table's, a repaint with the LoRA differs from one without inside
the selection and equals a repeat, a LoRA the engine lost is uploaded again, and after removing
it the repaint is the plain one again; and its reference images: a missing file is refused naming
it, an image added twice is listed once, the list holds the parameter table's 4 and refuses a
fifth, a repaint with them repeats exactly, one too small for the engine is refused naming its
entry (so the list is sent; the tiny model's repaint does not reliably change with references),
and after removing them the repaint is the plain one again.
Exit 0 passed, 1 failed, 4 skipped (kritarunner missing: Debian package krita; or no FLUX.2
model: infill-test-flux2 exited 4)."""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "support"))
from engine_process import wait_healthy  # noqa: E402  (after the search path)
SKIP = 4


def check_docker(c):
    """The docker's Repaint selection: an edit done with a preview shown and its layer added,
    then a long one cancelled from the docker once it reported progress."""
    if "exception" in c:
        return [f"docker: {c['exception']}"]
    checks = {
        "idle": c["idle"] and c["idle_after_first"],
        "first edit done, the second cancelled": c["states"] == ["done", "cancelled"],
        "layer added": c["result_layers"] == ["Infill"],
        "a preview shown": c["preview_shown"],
        "progress at its end": c["progress_after_first"][0] == c["progress_after_first"][1] > 0,
        "cancelled while running": c["cancel_after_progress"],
        "status says so": c["status"].startswith("Edit cancelled"),
    }
    return [f"docker: {name} ({c})" for name, ok in checks.items() if not ok]


def check_live(c, who):
    """A live painter's strokes: each supersedes its own last; the final one is done, none failed."""
    if "exception" in c:
        return [f"{who}: {c['exception']}"]
    checks = {
        "idle": c["idle"],
        "every stroke submitted": all(c["serials"]),
        "final stroke done": bool(c["states"]) and c["states"][-1] == "done",
        "nothing failed": "failed" not in c["states"] and "expired" not in c["states"],
        "one live layer": c["live_layers"] == 1,
    }
    return [f"{who}: {name} ({c})" for name, ok in checks.items() if not ok]


def write_png(path, width, height):
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    rows = b"".join(b"\0" + bytes((x * 3 + y * 5 + c * 70) & 255 for x in range(width) for c in range(3))
                    for y in range(height))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def live_painters(args, env, work):
    """Two Kritas, the editor (its EditController, when --editor-test is given) and an SDK client
    live painting on one engine at once: nobody's final stroke may be cancelled by another's."""
    sys.path.insert(0, os.path.join(HERE, "..", "python"))
    import infill_client
    failures, runs = [], []
    for i in range(2):
        out = os.path.join(work, f"live{i}.jsonl")
        e = dict(env, INFILL_TEST_MODE="live", INFILL_TEST_OUT=out)
        log = open(os.path.join(work, f"kritarunner-live{i}.log"), "w")
        runs.append((subprocess.Popen([args.kritarunner, "-s", "krita_repaint_check", "-f", "main"], stdout=log,
                                      stderr=subprocess.STDOUT, env=e), out, log))
    editor_run = None
    if args.editor_test:
        editor_log = open(os.path.join(work, "editor-live.log"), "w")
        editor_run = subprocess.Popen([args.editor_test, "[krita-peer]"], stdout=editor_log, stderr=subprocess.STDOUT,
                                      env=env)
        runs.append((editor_run, None, editor_log))
    png = os.path.join(work, "editor.png")
    write_png(png, 64, 48)
    states = []
    with infill_client.Client(endpoint=env["INFILL_TEST_ENDPOINT"], client_name="sdk-painter",
                              library=args.library) as editor:
        tid = editor.upload(open(png, "rb").read(), "editor.png")["id"]
        last, jobs = 0, []
        deadline = time.time() + 240
        # Strokes until both Kritas are done, so that they overlap the Kritas' own.
        while any(p.poll() is None for p, _, _ in runs) and time.time() < deadline:
            job = editor.submit(tid, mask_rect=(8 + len(jobs) % 16, 8, 24, 16), steps=2, edit_class="live",
                                supersedes=last, output_format="png")
            jobs.append(job)
            last = job.id
            time.sleep(0.3)
        for job in jobs:
            job.wait(120000)
            states.append(job.state)
    for p, out, log in runs:
        try:
            p.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            failures.append("a live Krita did not finish in time")
        log.close()
    if editor_run is not None:
        print(json.dumps({"case": "editor", "exit": editor_run.returncode}), flush=True)
        if editor_run.returncode != 0:
            failures.append(f"the editor's live painting failed (exit {editor_run.returncode}, log {work}/editor-live.log)")
    for i, (_, out, _) in enumerate(runs):
        if out is None:
            continue
        cases = []
        if os.path.exists(out):
            with open(out) as f:
                cases = [json.loads(line) for line in f if line.strip()]
        if len(cases) != 1:
            failures.append(f"live Krita {i}: no result (log {work}/kritarunner-live{i}.log)")
            continue
        print(json.dumps(cases[0]), flush=True)
        failures += check_live(cases[0], f"live Krita {i}")
    print(json.dumps({"case": "sdk-client", "states": states}), flush=True)
    if not states or states[-1] != "done" or "failed" in states:
        failures.append(f"SDK client: {states}")
    return failures


def table_strength_range():
    """The strength range of the "adapters" row of the parameter table."""
    path = os.path.join(HERE, "..", "..", "protocol", "infill_protocol", "edit_parameters.h")
    row = re.search(r'\{\.name = "adapters",.*?\.min = (-?[\d.]+), \.max = (-?[\d.]+)', open(path).read(), re.S)
    return [float(row.group(1)), float(row.group(2))]


def table_reference_limit():
    """max_length of the "references" row of the parameter table."""
    path = os.path.join(HERE, "..", "..", "protocol", "infill_protocol", "edit_parameters.h")
    row = re.search(r'\{\.name = "references",.*?\.max_length = (\d+)', open(path).read(), re.S)
    return int(row.group(1))


def check_lora(c):
    """The docker's LoRA list (krita_repaint_check.lora_case)."""
    if "exception" in c:
        return [f"lora: {c['exception']}"]
    by_name = {r["name"]: r for r in c["repaints"]}
    failed_repaints = [f"lora: the {r['name']} repaint did not start: {r['status']}" for r in c["repaints"] if "status" in r]
    if failed_repaints:
        return failed_repaints
    plain, adapted = by_name["plain"]["inside"], by_name["adapted"]["inside"]
    checks = {
        "a missing file refused, naming it": c["missing_row"] == -1 and "cannot open the LoRA file" in c["missing_status"]
        and "missing.safetensors" in c["missing_status"],
        "a LoRA for another model refused, naming it": c["wider_row"] == -1 and "wider.safetensors" in c["wider_status"],
        "refused files are not listed": c["rows_after_refused"] == 0,
        "added once": c["row"] == 0 and c["again_row"] == 0 and c["rows"] == 1 and "in the list already" in c["again_status"],
        "uploaded to the engine": c["engine_lists_it"],
        "strength range is the parameter table's": c["strength_range"] == table_strength_range(),
        "every repaint done": c["states"] == ["done"] * len(c["repaints"]),
        "outside the selection kept": all(r["outside_bad"] == 0 for r in c["repaints"]),
        "the LoRA changes the repaint": adapted != plain,
        "the same repaint again is the same": by_name["repeat"]["inside"] == adapted,
        "a LoRA the engine lost is uploaded again": by_name["reuploaded"]["inside"] == adapted,
        "removed: the plain repaint again": c["rows_after_remove"] == 0 and by_name["removed"]["inside"] == plain,
        "reference limit is the parameter table's": c["reference_limit"] == table_reference_limit(),
        "a missing reference refused, naming it": c["ref_missing_row"] == -1 and "missing.png" in c["ref_missing_status"],
        "a reference added once": c["ref_row"] == 0 and c["ref_again_row"] == 0
        and "in the list already" in c["ref_again_status"],
        "references up to the limit, one more refused": c["ref_rows"] == list(range(1, c["reference_limit"])) + [-1]
        and f"At most {c['reference_limit']}" in c["ref_full_status"] and c["ref_count"] == c["reference_limit"],
        "references are sent: a too-small one refused naming its entry": c["small_row"] == 0
        and c["small_serial"] == 0 and "references[0]" in c["small_status"] and "invalid_reference" in c["small_status"],
        "the same references again are the same": by_name["referenced_again"]["inside"] == by_name["referenced"]["inside"],
        "references removed: the plain repaint again": by_name["unreferenced"]["inside"] == plain,
    }
    return [f"lora: {name}" for name, ok in checks.items() if not ok]


def lora_main(args, work, env, sock_dir):
    """The docker's LoRA list and reference images against a FLUX.2 engine (--flux2-maker)."""
    made = subprocess.run([args.flux2_maker, os.path.join(work, "files")]).returncode
    if made == 4:
        print("SKIPPED: infill-test-flux2 could not write the FLUX.2 model (no Qwen3 tokenizer; scripts/setup.sh installs it)",
              flush=True)
        return SKIP
    if made != 0:
        print(f"FAILED: infill-test-flux2 exited {made}", flush=True)
        return 1
    # One more image than an edit takes (distinct sizes: distinct files, so distinct ids).
    references = []
    for i in range(table_reference_limit() + 1):
        references.append(os.path.join(work, f"reference{i}.png"))
        write_png(references[-1], 64 + 8 * i, 64)
    write_png(references[-1].replace(".png", "_small.png"), 32, 32)
    sock = os.path.join(sock_dir, "engine.sock")
    log = open(os.path.join(work, "engine.log"), "w")
    engine = subprocess.Popen([args.engine, "--model", os.path.join(work, "files", "flux2"), "--socket", sock,
                               "--journal", "off", "--no-calibrate", "--threads", "1"], stdout=log,
                              stderr=subprocess.STDOUT, env=env)
    failures = []
    try:
        wait_healthy(sock, engine, 120)
        out = os.path.join(work, "lora.jsonl")
        env.update(INFILL_TEST_ENDPOINT="unix:" + sock, INFILL_TEST_OUT=out, INFILL_TEST_MODE="lora",
                   INFILL_TEST_LORA=os.path.join(work, "files", "style.safetensors"),
                   INFILL_TEST_WIDER_LORA=os.path.join(work, "files", "wider.safetensors"),
                   INFILL_TEST_REFERENCES=os.pathsep.join(references))
        krita_log = os.path.join(work, "kritarunner-lora.log")
        with open(krita_log, "w") as kl:
            rc = subprocess.run([args.kritarunner, "-s", "krita_repaint_check", "-f", "main"], stdout=kl,
                                stderr=subprocess.STDOUT, env=env, timeout=540).returncode
        cases = []
        if os.path.exists(out):
            with open(out) as f:
                cases = [json.loads(line) for line in f if line.strip()]
        if len(cases) != 1:
            failures.append(f"kritarunner exited {rc} with {len(cases)} of 1 case; its log: {krita_log}")
        for c in cases:
            print(json.dumps({k: v for k, v in c.items() if k != "repaints"}), flush=True)
            failures += check_lora(c)
    finally:
        engine.terminate()
        try:
            code = engine.wait(30)
        except subprocess.TimeoutExpired:
            engine.kill()
            code = engine.wait()
        if code != 0:
            failures.append(f"infill-engine exited {code}")
        shutil.rmtree(sock_dir, ignore_errors=True)
    for f in failures:
        print("FAILED:", f, flush=True)
    print("krita LoRA list and references:", "failed" if failures else "passed", flush=True)
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", required=True)
    ap.add_argument("--model", help="the engine's model (the depth and live checks)")
    ap.add_argument("--flux2-maker", help="infill-test-flux2: check the docker's LoRA list on a FLUX.2 engine instead")
    ap.add_argument("--library", required=True, help="libinfill_client.so of the build")
    ap.add_argument("--kritarunner", default=shutil.which("kritarunner"))
    ap.add_argument("--work-dir", required=True)
    ap.add_argument("--editor-test", default=None,
                    help="infill_tests_ui: its hidden [krita-peer] test live paints as the editor beside the Kritas")
    args = ap.parse_args()
    if not args.model and not args.flux2_maker:
        ap.error("give --model (the depth and live checks) or --flux2-maker (the LoRA list)")
    if not args.kritarunner:
        print("SKIPPED: kritarunner not found (Debian package krita, installed by scripts/setup.sh)", flush=True)
        return SKIP

    shutil.rmtree(args.work_dir, ignore_errors=True)
    os.makedirs(args.work_dir)
    work = args.work_dir
    sock_dir = tempfile.mkdtemp(prefix="infill-krita-")  # short: Unix socket paths are limited
    sock = os.path.join(sock_dir, "engine.sock")
    env = dict(os.environ)
    # Krita writes its settings and resource database under $HOME: a private one per run.
    env.update(HOME=work, XDG_CONFIG_HOME=os.path.join(work, "config"), XDG_DATA_HOME=os.path.join(work, "data"),
               XDG_CACHE_HOME=os.path.join(work, "cache"), XDG_RUNTIME_DIR=sock_dir, QT_QPA_PLATFORM="offscreen")
    env.pop("INFILL_ENDPOINT", None)
    env.update(INFILL_CLIENT_LIBRARY=args.library, PYTHONPATH=os.pathsep.join([HERE, os.path.join(HERE, "..", "python")]),
               # Krita's embedded Python takes its prefix from the first python3 on PATH: the
               # system's, whose dist-packages hold PyQt5, not a pyenv or venv interpreter's.
               PATH="/usr/bin:/bin:" + env.get("PATH", ""))
    if args.flux2_maker:
        return lora_main(args, work, env, sock_dir)
    log = open(os.path.join(work, "engine.log"), "w")
    engine = subprocess.Popen([args.engine, "--model", args.model, "--socket", sock, "--journal", "off",
                               "--no-calibrate", "--threads", "1"], stdout=log, stderr=subprocess.STDOUT, env=env)
    failures = []
    try:
        wait_healthy(sock, engine, 60)
        out = os.path.join(work, "cases.jsonl")
        env.update(INFILL_TEST_ENDPOINT="unix:" + sock, INFILL_TEST_OUT=out)
        krita_log = os.path.join(work, "kritarunner.log")
        with open(krita_log, "w") as kl:
            rc = subprocess.run([args.kritarunner, "-s", "krita_repaint_check", "-f", "main"], stdout=kl,
                                stderr=subprocess.STDOUT, env=env, timeout=540).returncode
        cases = []
        if os.path.exists(out):
            with open(out) as f:
                cases = [json.loads(line) for line in f if line.strip()]
        if len(cases) != 5:
            failures.append(f"kritarunner exited {rc} with {len(cases)} of 5 cases; its log: {krita_log}")
        expected_type = {"U8": "image/tiff", "U16": "image/tiff", "F16": "image/x-exr", "F32": "image/x-exr"}
        for c in cases:
            print(json.dumps(c), flush=True)
            if c.get("case") == "docker":
                failures += check_docker(c)
                continue
            d = c.get("depth", "?")
            if "exception" in c:
                failures.append(f"{d}: {c['exception']}")
                continue
            checks = {
                "no selection refused": "Nothing is selected" in c["no_selection_error"],
                "finished": c["finished"],
                "result format": c["media_type"] == expected_type[d],
                # Krita lists the global selection as a "Selection Mask" node beside the layers.
                "layer above the original": [n for n in c["layers"] if n != "Selection Mask"] == ["Background", "Infill"],
                "same depth": c["layer_depth"] == d,
                "same profile": c["layer_profile"] == c["profile"],
                "outside kept": c["kept_bad"] == 0,
                "inside changed": c["changed_inside"] > 0,
                "inside is the engine's result": c["inside_bad"] == 0,
            }
            failures += [f"{d}: {name}" for name, ok in checks.items() if not ok]
        failures += live_painters(args, env, work)
    finally:
        engine.terminate()
        try:
            code = engine.wait(30)
        except subprocess.TimeoutExpired:
            engine.kill()
            code = engine.wait()
        if code != 0:
            failures.append(f"infill-engine exited {code}")
        shutil.rmtree(sock_dir, ignore_errors=True)
    for f in failures:
        print("FAILED:", f, flush=True)
    print("krita plug-in:", "failed" if failures else "passed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
