#!/usr/bin/env python3
"""infill_edit.py: upload a template, submit one edit with a mask, print its progress, write
the result -- libinfill_client through ctypes (docs/sdk.md).

    python3 infill_edit.py [--endpoint E] [--token T] [--library PATH] [--steps N]
                           TEMPLATE MASK OUT.png

MASK is an image file (0 = keep, 255 = regenerate) or a rectangle "rect:X,Y,W,H".
The library is found through --library, $INFILL_CLIENT_LIBRARY, or the linker's search path.
Exit status: 0 done, 1 the engine or the edit failed, 2 bad usage.
"""
import argparse
import ctypes
import ctypes.util
import os
import sys
import threading

API_MAJOR = 1
API_VERSION = (1 << 16) | 0  # INFILL_CLIENT_API_VERSION of the header this mirrors

# Mirrors of the structs in infill/infill_client.h (same field order and types).
c_size_t, c_u32, c_u64, c_i32 = ctypes.c_size_t, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int32
c_char_p, c_void_p, c_double, c_int = ctypes.c_char_p, ctypes.c_void_p, ctypes.c_double, ctypes.c_int


class ClientOptions(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("api_version", c_u32), ("endpoint", c_char_p),
                ("token", c_char_p), ("token_file", c_char_p), ("client_name", c_char_p),
                ("connect_timeout_ms", c_u32), ("request_timeout_ms", c_u32),
                ("stream_idle_timeout_ms", c_u32), ("reconnect_interval_ms", c_u32),
                ("engine_lost_timeout_ms", c_u32), ("cancel_on_destroy", c_int)]


class TemplateInfo(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("id", ctypes.c_char * 80), ("width", c_u32),
                ("height", c_u32), ("model_width", c_u32), ("model_height", c_u32),
                ("channels", c_u32), ("format", ctypes.c_char * 16), ("state", c_int),
                ("edits_waiting", c_u32), ("created", c_int)]


class Progress(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("edit_id", c_u64), ("steps_done", c_u32),
                ("steps_total", c_u32)]


class Preview(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("edit_id", c_u64), ("steps_done", c_u32),
                ("width", c_u32), ("height", c_u32), ("png", c_void_p), ("png_size", c_size_t)]


class Done(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("edit_id", c_u64), ("state", c_int),
                ("error", c_void_p), ("png", c_void_p), ("png_size", c_size_t),
                ("steps_run", c_u32), ("total_ms", c_double)]


PROGRESS_FN = ctypes.CFUNCTYPE(None, c_void_p, ctypes.POINTER(Progress))
PREVIEW_FN = ctypes.CFUNCTYPE(None, c_void_p, ctypes.POINTER(Preview))
DONE_FN = ctypes.CFUNCTYPE(None, c_void_p, ctypes.POINTER(Done))


class EditParams(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("template_id", c_char_p),
                ("mask_png", c_void_p), ("mask_png_size", c_size_t),
                ("mask_pixels", c_void_p), ("mask_width", c_u32), ("mask_height", c_u32),
                ("mask_stride", c_size_t), ("mask_rect", c_i32 * 4),
                ("prompt", c_char_p), ("seed", c_u64), ("steps", c_u32), ("strength", c_double),
                ("guidance", c_double), ("sampler", c_char_p), ("edit_class", c_int),
                ("deadline_ms", c_double), ("preview_every_steps", c_u32), ("supersedes", c_u64),
                ("halo_tokens", c_i32), ("feather_px", c_double),
                ("on_progress", PROGRESS_FN), ("on_preview", PREVIEW_FN), ("on_done", DONE_FN),
                ("user_data", c_void_p),
                ("model", c_char_p),  # API 1.1
                ("output_format", c_char_p)]  # API 1.2


JOB_STATES = {1: "queued", 2: "running", 3: "done", 4: "failed", 5: "cancelled", 6: "expired"}


class InfillError(Exception):
    def __init__(self, code, name, message, http_status):
        super().__init__(f"{message} [{name}{', HTTP %d' % http_status if http_status else ''}]")
        self.code, self.name, self.http_status = code, name, http_status


def load_library(path=None):
    path = path or os.environ.get("INFILL_CLIENT_LIBRARY") or ctypes.util.find_library("infill_client") \
        or "libinfill_client.so.1"
    lib = ctypes.CDLL(path)
    E = c_void_p  # infill_error*
    sigs = {
        "infill_api_version": (c_u32, []),
        "infill_library_version": (c_char_p, []),
        "infill_error_get_code": (c_int, [E]),
        "infill_error_message": (c_char_p, [E]),
        "infill_error_http_status": (c_int, [E]),
        "infill_error_code_name": (c_char_p, [c_int]),
        "infill_error_delete": (None, [E]),
        "infill_client_options_init": (None, [ctypes.POINTER(ClientOptions)]),
        "infill_client_create": (E, [ctypes.POINTER(ClientOptions), ctypes.POINTER(c_void_p)]),
        "infill_client_destroy": (None, [c_void_p]),
        "infill_client_endpoint": (c_char_p, [c_void_p]),
        "infill_client_wait_ready": (E, [c_void_p, c_u32]),
        "infill_template_info_init": (None, [ctypes.POINTER(TemplateInfo)]),
        "infill_client_upload_template": (E, [c_void_p, c_void_p, c_size_t, c_char_p, ctypes.POINTER(TemplateInfo)]),
        "infill_edit_params_init": (None, [ctypes.POINTER(EditParams)]),
        "infill_client_submit_edit": (E, [c_void_p, ctypes.POINTER(EditParams), ctypes.POINTER(c_void_p)]),
        "infill_job_id": (c_u64, [c_void_p]),
        "infill_job_wait": (E, [c_void_p, c_u32]),
        "infill_job_get_state": (c_int, [c_void_p]),
        "infill_job_result": (E, [c_void_p, ctypes.POINTER(c_void_p), ctypes.POINTER(c_size_t)]),
        "infill_job_release": (None, [c_void_p]),
    }
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    if lib.infill_api_version() >> 16 != API_MAJOR:
        raise RuntimeError(f"{path}: API {lib.infill_api_version() >> 16}.x, this script speaks {API_MAJOR}.x")
    return lib


def check_layout(struct):
    """The library's *_init wrote its own struct_size: it must match this mirror's size."""
    if struct.struct_size != ctypes.sizeof(struct):
        raise RuntimeError(f"{type(struct).__name__}: the library's struct is {struct.struct_size} bytes, "
                           f"this script's mirror {ctypes.sizeof(struct)}: update the mirror")


def check(lib, err):
    """Raises InfillError for a non-NULL infill_error* (and frees it)."""
    if not err:
        return
    try:
        code = lib.infill_error_get_code(err)
        raise InfillError(code, lib.infill_error_code_name(code).decode(),
                          lib.infill_error_message(err).decode(errors="replace"),
                          lib.infill_error_http_status(err))
    finally:
        lib.infill_error_delete(err)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoint", default=None)
    ap.add_argument("--token", default=None)
    ap.add_argument("--library", default=None)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default=None, help="a model id from GET /v1/models; default: the engine's default")
    ap.add_argument("template")
    ap.add_argument("mask")
    ap.add_argument("out")
    args = ap.parse_args()

    lib = load_library(args.library)
    opts = ClientOptions()
    lib.infill_client_options_init(ctypes.byref(opts))
    check_layout(opts)
    opts.endpoint = args.endpoint.encode() if args.endpoint else None
    opts.token = args.token.encode() if args.token else None
    client = c_void_p()
    check(lib, lib.infill_client_create(ctypes.byref(opts), ctypes.byref(client)))
    job = c_void_p()
    try:
        print("engine", lib.infill_client_endpoint(client).decode())
        check(lib, lib.infill_client_wait_ready(client, 30000))
        with open(args.template, "rb") as f:
            image = f.read()
        info = TemplateInfo()
        lib.infill_template_info_init(ctypes.byref(info))
        check_layout(info)
        check(lib, lib.infill_client_upload_template(client, image, len(image),
                                                     os.path.basename(args.template).encode(),
                                                     ctypes.byref(info)))
        print(f"template {info.id.decode()[:12]}... {info.width}x{info.height}")

        params = EditParams()
        lib.infill_edit_params_init(ctypes.byref(params))
        check_layout(params)
        params.template_id = info.id
        mask_bytes = None
        if args.mask.startswith("rect:"):
            params.mask_rect[:] = [int(v) for v in args.mask[5:].split(",")]
        else:
            with open(args.mask, "rb") as f:
                mask_bytes = ctypes.create_string_buffer(f.read())
            params.mask_png = ctypes.cast(mask_bytes, c_void_p)
            params.mask_png_size = len(mask_bytes) - 1  # without create_string_buffer's NUL
        params.steps = args.steps
        params.seed = args.seed
        params.model = args.model.encode() if args.model else None
        # The result in the format the output file's name asks for (16-bit and float kept).
        extension = os.path.splitext(args.out)[1].lower().lstrip(".")
        params.output_format = {"tif": b"tiff", "tiff": b"tiff", "exr": b"exr"}.get(extension, b"png")
        params.preview_every_steps = 2

        finished = threading.Event()
        outcome = {}

        # The callbacks run on the library's thread; ctypes takes the GIL for them.
        def on_progress(_user, p):
            print(f"progress {p.contents.steps_done}/{p.contents.steps_total}", flush=True)

        def on_preview(_user, p):
            print(f"preview at step {p.contents.steps_done}: {p.contents.width}x{p.contents.height}")

        def on_done(_user, d):
            d = d.contents
            outcome["state"] = JOB_STATES.get(d.state, "unknown")
            if d.error:
                outcome["error"] = lib.infill_error_message(d.error).decode(errors="replace")
            else:
                outcome["png"] = ctypes.string_at(d.png, d.png_size)  # copy: valid during the call only
            finished.set()

        # Keep the ctypes callback objects alive until on_done has run.
        callbacks = (PROGRESS_FN(on_progress), PREVIEW_FN(on_preview), DONE_FN(on_done))
        params.on_progress, params.on_preview, params.on_done = callbacks
        check(lib, lib.infill_client_submit_edit(client, ctypes.byref(params), ctypes.byref(job)))
        print("edit", lib.infill_job_id(job), "submitted")
        check(lib, lib.infill_job_wait(job, 600000))
        if outcome.get("state") != "done":
            print(f"edit {outcome.get('state')}: {outcome.get('error')}", file=sys.stderr)
            return 1
        with open(args.out, "wb") as f:
            f.write(outcome["png"])
        print(f"wrote {args.out} ({len(outcome['png'])} bytes)")
        return 0
    except InfillError as e:
        print(f"infill_edit.py: {e}", file=sys.stderr)
        return 1
    finally:
        lib.infill_job_release(job)
        lib.infill_client_destroy(client)


if __name__ == "__main__":
    sys.exit(main())
