#!/usr/bin/env python3
"""Runs the SDK's C and Python examples against a real infill-engine process (Unix socket for
the C example, TCP with the engine's token for the Python one) and checks their results: the
size of the template, and every pixel outside the mask unchanged. Bounded in time; the engine
is stopped with SIGTERM and must exit 0.

With --flux2-maker (infill-test-flux2: a tiny FLUX.2 model and LoRA files) it checks the Python
binding's adapters against a FLUX.2 engine instead: an upload gives the same id for the same
bytes, the list shows it, an edit with it differs from one without inside the mask and equals a
repeat (the example's --lora too), one whose adapters_from_step is its steps equals one without,
each edit's job states the K it ran with (Job.adapters_from_step), bad files, strengths and ids are refused naming them with the
engine's code, and a delete removes it; reference images (references) change the edit and repeat
exactly, and bad lists are refused. Exit 4 (skipped) when the maker cannot write the model
(no Qwen3 tokenizer)."""
import argparse
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import zlib

W, H = 64, 48
RECT = (8, 8, 24, 16)


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def write_png(path, width, height, channels, pixels):
    colour = {1: 0, 3: 2}[channels]
    raw = b"".join(b"\0" + bytes(pixels[y * width * channels:(y + 1) * width * channels]) for y in range(height))
    data = (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, colour, 0, 0, 0))
            + png_chunk(b"IDAT", zlib.compress(raw)) + png_chunk(b"IEND", b""))
    with open(path, "wb") as f:
        f.write(data)


def read_png(path):
    """8-bit, non-interlaced PNG -> (width, height, channels, bytes)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = ihdr
    assert depth == 8 and interlace == 0, f"{path}: depth {depth}, interlace {interlace}"
    channels = {0: 1, 2: 3, 4: 2, 6: 4}[colour]
    raw, stride, out, prev = zlib.decompress(idat), width * channels, bytearray(), bytearray(width * channels)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out += line
        prev = line
    return width, height, channels, bytes(out)


def check_result(path, template, mask):
    w, h, ch, px = read_png(path)
    assert (w, h) == (W, H), f"{path} is {w}x{h}, the template is {W}x{H}"
    assert ch == 3, f"{path} has {ch} channels"
    inside_diff = 0
    for i in range(W * H):
        for c in range(3):
            if mask[i] == 0:
                assert px[i * 3 + c] == template[i * 3 + c], f"{path}: pixel {i % W},{i // W} outside the mask changed"
            else:
                inside_diff += px[i * 3 + c] != template[i * 3 + c]
    assert inside_diff > 0, f"{path}: nothing changed inside the mask"


def run(cmd, env, timeout=240):
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    print(p.stdout, flush=True)
    return p


def start_engine(cmd, env, log_path):
    """An infill-engine process logging to `log_path`; (process, log file)."""
    log = open(log_path, "w+")
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=log), log


def stop_engine(engine, log):
    """SIGTERM, then the exit code ("killed" when it did not exit within 30 s)."""
    engine.send_signal(signal.SIGTERM)
    try:
        code = engine.wait(timeout=30)
    except subprocess.TimeoutExpired:
        engine.kill()
        code = "killed"
    log.close()
    return code


def pixels_of(path):
    """The RGB bytes of an 8-bit PNG of the template's size."""
    w, h, ch, px = read_png(path)
    assert (w, h, ch) == (W, H, 3), f"{path} is {w}x{h} with {ch} channels, expected {W}x{H} RGB"
    return px


def expect_error(call, name, *fragments, engine_code=None):
    """Runs `call`; it must raise InfillError `name` whose message holds every fragment."""
    import infill_client
    try:
        call()
    except infill_client.InfillError as e:
        print(f"refused as expected: {e}", flush=True)
        assert e.name == name, f"expected a {name} error, got {e.name}: {e}"
        for f in fragments:
            assert f in e.message, f"the message {e.message!r} does not name {f!r}"
        if engine_code is not None:
            assert e.engine_code == engine_code, f"engine code {e.engine_code!r}, expected {engine_code!r}"
        return e
    raise AssertionError(f"expected a {name} error naming {fragments}, the call succeeded")


def flux2_checks(args):
    """The binding's adapter calls, the Python example's --lora and an edit's references against a
    FLUX.2 engine."""
    for what, path in (("infill-engine", args.engine), ("infill-test-flux2", args.flux2_maker),
                       ("libinfill_client", args.library), ("the Python example", args.python_example)):
        if not path or not os.path.exists(path):
            print(f"{what} is not built or given ({path})")
            return 1
    shutil.rmtree(args.work_dir, ignore_errors=True)
    os.makedirs(args.work_dir)
    d = lambda *p: os.path.join(args.work_dir, *p)  # noqa: E731
    made = subprocess.run([args.flux2_maker, d("files")]).returncode
    if made == 4:
        print("SKIPPED: infill-test-flux2 could not write the FLUX.2 model (no Qwen3 tokenizer; scripts/setup.sh installs it)")
        return 4
    assert made == 0, f"infill-test-flux2 exited {made}"
    style, wider = d("files", "style.safetensors"), d("files", "wider.safetensors")
    template = bytes(((x * 3 + y * 5 + c * 70) % 256) for y in range(H) for x in range(W) for c in range(3))
    write_png(d("template.png"), W, H, 3, template)
    inside = lambda x, y: RECT[0] <= x < RECT[0] + RECT[2] and RECT[1] <= y < RECT[1] + RECT[3]  # noqa: E731

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(args.python_example)), "..", "..", "python"))
    import infill_client
    env = dict(os.environ, XDG_CONFIG_HOME=d("config"), XDG_STATE_HOME=d("state"), XDG_CACHE_HOME=d("cache"),
               XDG_RUNTIME_DIR=d("run"), INFILL_CLIENT_LIBRARY=args.library)
    env.pop("INFILL_ENDPOINT", None)
    sock = d("run", "infill", "engine.sock")
    engine, log = start_engine([args.engine, "--model", d("files", "flux2"), "--socket", sock, "--journal", "off",
                                "--no-calibrate", "--threads", "1"], env, d("engine.log"))
    try:
        with infill_client.Client(endpoint="unix:" + sock, library=args.library, client_name="python-lora") as client:
            client.wait_ready(120000)
            lora = client.upload_adapter(style)
            print("uploaded", lora, flush=True)
            assert lora["created"] and len(lora["id"]) == 64, lora
            assert (lora["name"], lora["format"], lora["max_rank"]) == ("style.safetensors", "upstream", 4), lora
            assert lora["bytes"] == os.path.getsize(style) and lora["layers"] > 0, lora
            again = client.upload_adapter(style)
            assert again["id"] == lora["id"] and not again["created"], f"the same bytes again: {again}"
            assert [a["id"] for a in client.adapters()] == [lora["id"]], client.adapters()
            assert client.adapter(lora["id"])["layers"] == lora["layers"]
            expect_error(lambda: client.upload_adapter(wider), "rejected", "wider.safetensors", engine_code="invalid_adapter")
            expect_error(lambda: client.upload_adapter(d("missing.safetensors")), "io", d("missing.safetensors"))
            assert len(client.adapters()) == 1, "a refused file was kept"

            tid = client.upload(open(d("template.png"), "rb").read(), "template.png")["id"]

            def edit(adapters=(), name="edit", references=(), adapters_from_step=0):
                job = client.submit(tid, mask_rect=RECT, seed=5, steps=4, prompt="make it red", output_format="png",
                                    adapters=adapters, references=references, adapters_from_step=adapters_from_step)
                assert job.wait(120000), f"{name}: edit {job.id} did not finish"
                # The done event states the K the edit ran with (0 for an edit without adapters).
                want_k = adapters_from_step if adapters else 0
                assert job.adapters_from_step == want_k, f"{name}: done says K = {job.adapters_from_step}, not {want_k}"
                data, media_type = job.result()
                assert media_type == "image/png", media_type
                with open(d(name + ".png"), "wb") as f:
                    f.write(data)
                return pixels_of(d(name + ".png"))

            plain = edit(name="plain")
            adapted = edit([(lora["id"], 1.5)], "adapted")
            repeat = edit([(lora["id"], 1.5)], "repeat")
            differ = sum(plain[(y * W + x) * 3:(y * W + x + 1) * 3] != adapted[(y * W + x) * 3:(y * W + x + 1) * 3]
                         for y in range(H) for x in range(W) if inside(x, y))
            print(f"the LoRA changed {differ} of {RECT[2] * RECT[3]} pixels inside the mask", flush=True)
            assert differ > 0, "the edit with the LoRA equals the one without inside the mask"
            assert adapted == repeat, "the same edit with the LoRA came out different"
            for name, px in (("plain", plain), ("adapted", adapted)):
                outside = sum(px[i * 3:i * 3 + 3] != template[i * 3:i * 3 + 3] for i in range(W * H)
                              if not inside(i % W, i // W))
                assert outside == 0, f"{name}: {outside} pixels outside the mask changed"
            # An id as a bare string means strength 1, which differs from 1.5.
            assert edit([lora["id"]], "strength1") != adapted, "strength 1 came out as strength 1.5"

            # Katz's K: from step K on the LoRA applies, so K = the edit's 4 steps is no LoRA at all;
            # K beyond the steps is the engine's refusal, beyond the table's range the SDK's.
            assert edit([(lora["id"], 1.5)], "from_step4", adapters_from_step=4) == plain, \
                "adapters_from_step = steps came out different from the edit without the LoRA"
            expect_error(lambda: client.submit(tid, mask_rect=RECT, steps=4, adapters=[lora["id"]], adapters_from_step=5),
                         "rejected", "adapters_from_step is 5, expected 0..4", engine_code="invalid_parameter")
            expect_error(lambda: client.submit(tid, mask_rect=RECT, adapters=[lora["id"]], adapters_from_step=1001),
                         "invalid_argument", "adapters_from_step is 1001, expected 0..1000")

            # The example's --lora makes the same request (seed 5, 4 steps, the prompt aside:
            # compare with an edit without prompt).
            no_prompt = client.submit(tid, mask_rect=RECT, seed=5, steps=4, output_format="png",
                                      adapters=[(lora["id"], 1.5)])
            assert no_prompt.wait(120000)
            with open(d("no_prompt.png"), "wb") as f:
                f.write(no_prompt.result()[0])
            p = run([sys.executable, args.python_example, "--endpoint", "unix:" + sock, "--steps", "4", "--seed", "5",
                     "--lora", style + ":1.5", d("template.png"), "rect:%d,%d,%d,%d" % RECT, d("out_lora.png")], env)
            assert p.returncode == 0, f"the Python example with --lora exited {p.returncode}"
            assert "adapter " + lora["id"][:12] in p.stdout, "the example did not print the adapter"
            assert pixels_of(d("out_lora.png")) == pixels_of(d("no_prompt.png")), "the example's --lora edit differs"

            # Reference images: two more templates change the edit inside the mask and repeat exactly.
            refs = []
            for i, (rw, rh) in enumerate(((64, 96), (80, 64))):
                rnd = random.Random(i)
                write_png(d(f"ref{i}.png"), rw, rh, 3, bytes(rnd.getrandbits(8) for _ in range(rw * rh * 3)))
                refs.append(client.upload(open(d(f"ref{i}.png"), "rb").read(), f"ref{i}.png")["id"])
            referenced = edit(name="referenced", references=refs)
            assert referenced != plain, "the edit with references equals the one without"
            assert edit(name="referenced_again", references=refs) == referenced, "the same references came out different"
            expect_error(lambda: client.submit(tid, mask_rect=RECT, references=[refs[0], refs[0]]), "invalid_argument",
                         "references[1] repeats references[0]")
            expect_error(lambda: client.submit(tid, mask_rect=RECT, references=[refs[0], "f" * 64]), "not_found",
                         "references[1]", engine_code="template_not_found")

            expect_error(lambda: client.submit(tid, mask_rect=RECT, adapters=[(lora["id"], 11)]), "invalid_argument",
                         "adapters[0].strength is 11, expected -10..10")
            unknown = "a" * 64
            e = expect_error(lambda: client.submit(tid, mask_rect=RECT, adapters=[unknown]), "not_found", unknown,
                             engine_code="unknown_adapter")
            assert e.http_status == 404, e.http_status

            client.delete_adapter(lora["id"])
            assert client.adapters() == [], client.adapters()
            expect_error(lambda: client.adapter(lora["id"]), "not_found", lora["id"], engine_code="unknown_adapter")
            expect_error(lambda: client.delete_adapter(lora["id"]), "not_found", lora["id"])
            expect_error(lambda: client.submit(tid, mask_rect=RECT, adapters=[lora["id"]]), "not_found", lora["id"],
                         engine_code="unknown_adapter")
    finally:
        code = stop_engine(engine, log)
    assert code == 0, f"the engine exited {code}"
    print("python adapters ok")
    return 0


def main():
    ap = argparse.ArgumentParser()
    for a in ("--engine", "--library", "--work-dir"):
        ap.add_argument(a, required=True)
    for a in ("--model", "--c-example", "--python-example", "--flux2-maker"):
        ap.add_argument(a)
    args = ap.parse_args()
    if args.flux2_maker:
        return flux2_checks(args)
    for what, path in (("infill-engine", args.engine), ("the random model", os.path.join(args.model or "", "manifest.json")),
                       ("the C example", args.c_example), ("libinfill_client", args.library),
                       ("the Python example", args.python_example)):
        if not path or not os.path.exists(path):
            print(f"{what} is not built ({path}); build the targets infill-engine, infill_edit_example, infill_client")
            return 1
    shutil.rmtree(args.work_dir, ignore_errors=True)
    os.makedirs(args.work_dir)
    d = lambda *p: os.path.join(args.work_dir, *p)  # noqa: E731

    template = bytes(((x * 3 + y * 5 + c * 70) % 256) for y in range(H) for x in range(W) for c in range(3))
    write_png(d("template.png"), W, H, 3, template)
    mask = bytearray(W * H)
    for y in range(RECT[1], RECT[1] + RECT[3]):
        for x in range(RECT[0], RECT[0] + RECT[2]):
            mask[y * W + x] = 255
    write_png(d("mask.png"), W, H, 1, mask)

    env = dict(os.environ, XDG_CONFIG_HOME=d("config"), XDG_STATE_HOME=d("state"), XDG_CACHE_HOME=d("cache"),
               XDG_RUNTIME_DIR=d("run"))
    env.pop("INFILL_ENDPOINT", None)
    env.pop("INFILL_TOKEN", None)
    sock = d("run", "infill", "engine.sock")
    log = open(d("engine.log"), "w+")
    engine = subprocess.Popen([args.engine, "--model", args.model, "--socket", sock, "--listen", "127.0.0.1:0",
                               "--no-calibrate", "--threads", "1"], env=env, stdout=log, stderr=log)
    try:
        port = None
        deadline = time.time() + 60
        while time.time() < deadline and port is None:
            log.seek(0)
            m = re.search(r"tcp:127\.0\.0\.1:(\d+)", log.read())
            port = m and m.group(1)
            if engine.poll() is not None:
                break
            time.sleep(0.1)
        assert port, "the engine did not report its TCP port:\n" + open(d("engine.log")).read()

        # C example: the default endpoint (from $XDG_RUNTIME_DIR, as the engine), a PNG mask.
        p = run([args.c_example, "-s", "4", "-S", "3", d("template.png"), d("mask.png"), d("out_c.png")], env)
        assert p.returncode == 0, f"the C example exited {p.returncode}"
        assert re.search(r"progress 4/4", p.stdout), "the C example printed no final progress"
        check_result(d("out_c.png"), template, mask)

        # Python example over TCP with the token the engine created, a rectangle mask.
        token = open(d("config", "infill", "token")).read().strip()
        pyenv = dict(env, INFILL_CLIENT_LIBRARY=args.library)
        p = run([sys.executable, args.python_example, "--endpoint", f"http://127.0.0.1:{port}", "--token", token,
                 "--steps", "4", "--seed", "5", d("template.png"), "rect:%d,%d,%d,%d" % RECT, d("out_py.png")], pyenv)
        assert p.returncode == 0, f"the Python example exited {p.returncode}"
        assert "progress 4/4" in p.stdout, "the Python example printed no final progress"
        check_result(d("out_py.png"), template, mask)

        # A wrong token is a clear error, exit 1.
        p = run([sys.executable, args.python_example, "--endpoint", f"http://127.0.0.1:{port}", "--token", "0" * 64,
                 d("template.png"), "rect:0,0,8,8", d("never.png")], pyenv)
        assert p.returncode == 1, f"a wrong token: exit {p.returncode}"
        assert "token" in p.stdout and "unauthorized" in p.stdout, "a wrong token gave no clear message"

        # No engine at the endpoint: a clear error, exit 1.
        p = run([args.c_example, "-w", "1", "-e", "unix:" + d("nowhere.sock"), d("template.png"), "rect:0,0,8,8", d("never.png")], env)
        assert p.returncode == 1 and "cannot connect" in p.stdout, "an unreachable engine gave no clear message"
        p = run([args.c_example, "only-one-argument"], env)
        assert p.returncode == 2, "bad usage must exit 2"
    finally:
        engine.send_signal(signal.SIGTERM)
        try:
            code = engine.wait(timeout=30)
        except subprocess.TimeoutExpired:
            engine.kill()
            code = "killed"
        log.close()
    assert code == 0, f"the engine exited {code}"
    print("examples ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
