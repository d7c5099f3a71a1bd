"""infill_client: libinfill_client (the engine's C SDK, docs/sdk.md) for Python, through ctypes.

Every Python host of the engine (the Krita plug-in, plugin_sdk/examples/python) goes through
this module, so cancel, reconnect, limits and errors behave as in every other host.

    client = Client(endpoint=None, token=None, client_name="krita")
    info = client.upload(open("photo.exr", "rb").read(), "photo.exr")
    job = client.submit(info["id"], mask=(mask_bytes, width, height), prompt="dark blue",
                        output_format="template", on_progress=..., on_preview=..., on_done=...)
    job.wait(60000)
    data, media_type = job.result()

    lora = client.upload_adapter("style.safetensors")   # {"id", "name", "format", ...}
    job = client.submit(info["id"], mask_rect=(8, 8, 32, 16), adapters=[(lora["id"], 0.8)])

Callbacks run on the library's own thread (ctypes takes the GIL for them): hand work to your
GUI thread from there. The library is found through `library`, $INFILL_CLIENT_LIBRARY, the
linker's search path, or libinfill_client.so.1.
"""
import ctypes
import ctypes.util
import os
import threading

API_MAJOR = 1
API_MINOR = 3  # the header version these mirrors follow (INFILL_CLIENT_API_VERSION_MINOR)

c_size_t, c_u32, c_u64, c_i32 = ctypes.c_size_t, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int32
c_char_p, c_void_p, c_double, c_int = ctypes.c_char_p, ctypes.c_void_p, ctypes.c_double, ctypes.c_int


# Mirrors of the structs in infill/infill_client.h (same field order and types, API 1.3).
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


class AdapterInfo(ctypes.Structure):  # API 1.3
    _fields_ = [("struct_size", c_size_t), ("id", ctypes.c_char * 80), ("name", ctypes.c_char * 256),
                ("format", ctypes.c_char * 16), ("min_rank", c_u32), ("max_rank", c_u32), ("layers", c_u32),
                ("bytes", c_u64), ("created", c_int)]


class EditAdapter(ctypes.Structure):  # API 1.3
    _fields_ = [("struct_size", c_size_t), ("id", c_char_p), ("strength", c_double)]


class Progress(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("edit_id", c_u64), ("steps_done", c_u32),
                ("steps_total", c_u32)]


class Preview(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("edit_id", c_u64), ("steps_done", c_u32),
                ("width", c_u32), ("height", c_u32), ("png", c_void_p), ("png_size", c_size_t)]


class Done(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("edit_id", c_u64), ("state", c_int),
                ("error", c_void_p), ("png", c_void_p), ("png_size", c_size_t),
                ("steps_run", c_u32), ("total_ms", c_double), ("cache_mode", c_char_p),
                ("prompt_truncated", c_int), ("media_type", c_char_p),
                ("adapters_from_step", c_u32)]  # API 1.3: read only when struct_size covers it


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
                ("output_format", c_char_p),  # API 1.2
                ("adapters", ctypes.POINTER(EditAdapter)), ("adapter_count", c_size_t),  # API 1.3
                ("references", ctypes.POINTER(c_char_p)), ("reference_count", c_size_t),
                ("adapters_from_step", c_u32)]


JOB_STATES = {1: "queued", 2: "running", 3: "done", 4: "failed", 5: "cancelled", 6: "expired"}
EDIT_CLASSES = {"": 0, "live": 1, "interactive": 2, "batch": 3}


class InfillError(Exception):
    """An error of the library: `code` (infill_error_code), `name` ("not_found", ...), the
    message (naming the input at fault), and when the engine answered its HTTP status and its
    own code (`engine_code`: "unknown_adapter", "invalid_mask", ...; docs/api.md)."""

    def __init__(self, code, name, message, http_status=0, engine_code=""):
        super().__init__(f"{message} [{name}{', HTTP %d' % http_status if http_status else ''}]")
        self.code, self.name, self.message, self.http_status = code, name, message, http_status
        self.engine_code = engine_code


def load_library(path=None):
    """Opens libinfill_client and declares the functions used here; checks the API major."""
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
        "infill_error_engine_code": (c_char_p, [E]),
        "infill_error_code_name": (c_char_p, [c_int]),
        "infill_error_delete": (None, [E]),
        "infill_client_options_init": (None, [ctypes.POINTER(ClientOptions)]),
        "infill_client_create": (E, [ctypes.POINTER(ClientOptions), ctypes.POINTER(c_void_p)]),
        "infill_client_destroy": (None, [c_void_p]),
        "infill_client_endpoint": (c_char_p, [c_void_p]),
        "infill_client_wait_ready": (E, [c_void_p, c_u32]),
        "infill_template_info_init": (None, [ctypes.POINTER(TemplateInfo)]),
        "infill_client_upload_template": (E, [c_void_p, c_void_p, c_size_t, c_char_p, ctypes.POINTER(TemplateInfo)]),
        "infill_adapter_info_init": (None, [ctypes.POINTER(AdapterInfo)]),
        "infill_client_upload_adapter_file": (E, [c_void_p, c_char_p, c_char_p, ctypes.POINTER(AdapterInfo)]),
        "infill_client_get_adapter": (E, [c_void_p, c_char_p, ctypes.POINTER(AdapterInfo)]),
        "infill_client_delete_adapter": (E, [c_void_p, c_char_p]),
        "infill_client_list_adapters": (E, [c_void_p, ctypes.POINTER(c_void_p)]),
        "infill_adapter_list_count": (c_size_t, [c_void_p]),
        "infill_adapter_list_get": (ctypes.POINTER(AdapterInfo), [c_void_p, c_size_t]),
        "infill_adapter_list_delete": (None, [c_void_p]),
        "infill_edit_adapter_init": (None, [ctypes.POINTER(EditAdapter)]),
        "infill_edit_params_init": (None, [ctypes.POINTER(EditParams)]),
        "infill_client_submit_edit": (E, [c_void_p, ctypes.POINTER(EditParams), ctypes.POINTER(c_void_p)]),
        "infill_job_id": (c_u64, [c_void_p]),
        "infill_job_wait": (E, [c_void_p, c_u32]),
        "infill_job_cancel": (E, [c_void_p]),
        "infill_job_get_state": (c_int, [c_void_p]),
        "infill_job_result": (E, [c_void_p, ctypes.POINTER(c_void_p), ctypes.POINTER(c_size_t)]),
        "infill_job_result_media_type": (c_char_p, [c_void_p]),
        "infill_job_error": (E, [c_void_p]),
        "infill_job_release": (None, [c_void_p]),
    }
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    version = lib.infill_api_version()
    if version >> 16 != API_MAJOR or (version & 0xFFFF) < API_MINOR:
        raise InfillError(0, "version_mismatch",
                          f"{path} speaks API {version >> 16}.{version & 0xFFFF}, "
                          f"this module needs {API_MAJOR}.{API_MINOR} or a later 1.x")
    return lib


def check_layout(struct):
    """The library's *_init wrote its own struct_size: it must match this mirror's size."""
    if struct.struct_size != ctypes.sizeof(struct):
        raise RuntimeError(f"{type(struct).__name__}: the library's struct is {struct.struct_size} bytes, "
                           f"this module's mirror {ctypes.sizeof(struct)}: update the mirror")


def adapter_dict(info):
    """An infill_adapter_info as a dict."""
    return {"id": info.id.decode(), "name": info.name.decode(errors="replace"), "format": info.format.decode(),
            "min_rank": info.min_rank, "max_rank": info.max_rank, "layers": info.layers, "bytes": info.bytes,
            "created": bool(info.created)}


def error_of(lib, err, free=True):
    """The InfillError for a non-NULL infill_error* (freed unless the job owns it)."""
    try:
        code = lib.infill_error_get_code(err)
        return InfillError(code, lib.infill_error_code_name(code).decode(),
                           lib.infill_error_message(err).decode(errors="replace"),
                           lib.infill_error_http_status(err), lib.infill_error_engine_code(err).decode())
    finally:
        if free:
            lib.infill_error_delete(err)


def check(lib, err):
    """Raises InfillError for a non-NULL infill_error* (and frees it)."""
    if err:
        raise error_of(lib, err)


class Job:
    """A submitted edit. Its callbacks stay alive until on_done has run."""

    def __init__(self, client, handle, callbacks, slot):
        self._client, self._handle, self._callbacks, self._slot = client, handle, callbacks, slot
        self.id = client.lib.infill_job_id(handle)

    @property
    def adapters_from_step(self):
        """The K the edit ran with (submit's `adapters_from_step`), as the engine reported it on
        done; 0 without adapters or when the edit did not end done; None until it ended."""
        return self._slot.get("adapters_from_step")

    @property
    def state(self):
        return JOB_STATES.get(self._client.lib.infill_job_get_state(self._handle), "unknown")

    def wait(self, timeout_ms=0xFFFFFFFF):
        """True once on_done has returned; False after `timeout_ms`."""
        err = self._client.lib.infill_job_wait(self._handle, timeout_ms)
        if err:
            e = error_of(self._client.lib, err)
            if e.name == "timeout":
                return False
            raise e
        return True

    def cancel(self):
        check(self._client.lib, self._client.lib.infill_job_cancel(self._handle))

    def result(self):
        """(bytes, media type) of a done edit; raises the edit's error otherwise."""
        lib = self._client.lib
        data, size = c_void_p(), c_size_t()
        err = lib.infill_job_result(self._handle, ctypes.byref(data), ctypes.byref(size))
        if err:
            why = lib.infill_job_error(self._handle)
            lib.infill_error_delete(err)
            raise error_of(lib, why, free=False) if why else InfillError(0, "conflict", f"edit {self.id} has no result")
        return ctypes.string_at(data, size.value), lib.infill_job_result_media_type(self._handle).decode()

    def release(self):
        if self._handle:
            self._client.lib.infill_job_release(self._handle)
            self._handle = None

    def __del__(self):
        self.release()


class Client:
    """One connection to an engine (`endpoint` None: the local one, as docs/sdk.md says)."""

    def __init__(self, endpoint=None, token=None, client_name=None, library=None, cancel_on_destroy=True):
        self.lib = load_library(library)
        opts = ClientOptions()
        self.lib.infill_client_options_init(ctypes.byref(opts))
        check_layout(opts)
        opts.endpoint = endpoint.encode() if endpoint else None
        opts.token = token.encode() if token else None
        opts.client_name = client_name.encode() if client_name else None
        opts.cancel_on_destroy = 1 if cancel_on_destroy else 0
        self._handle = c_void_p()
        check(self.lib, self.lib.infill_client_create(ctypes.byref(opts), ctypes.byref(self._handle)))
        self._live = {}  # id(callbacks) -> (callbacks, state): the ctypes objects outlive the edit
        self._lock = threading.Lock()

    @property
    def endpoint(self):
        return self.lib.infill_client_endpoint(self._handle).decode()

    def wait_ready(self, timeout_ms=30000):
        check(self.lib, self.lib.infill_client_wait_ready(self._handle, timeout_ms))

    def upload(self, data, name):
        """Uploads an encoded image (PNG, TIFF, EXR, ...); returns the template as a dict."""
        info = TemplateInfo()
        self.lib.infill_template_info_init(ctypes.byref(info))
        check_layout(info)
        check(self.lib, self.lib.infill_client_upload_template(self._handle, data, len(data), name.encode(),
                                                               ctypes.byref(info)))
        return {"id": info.id.decode(), "width": info.width, "height": info.height,
                "channels": info.channels, "format": info.format.decode()}

    def upload_adapter(self, path, model=None):
        """Uploads a LoRA file (.safetensors) for `model` (None: the engine's default model);
        returns the adapter as a dict: id, name, format, min_rank, max_rank, layers, bytes and
        created (False when the engine had these bytes already: the same id)."""
        info = AdapterInfo()
        self.lib.infill_adapter_info_init(ctypes.byref(info))
        check_layout(info)
        check(self.lib, self.lib.infill_client_upload_adapter_file(self._handle, os.fsencode(path),
                                                                   model.encode() if model else None, ctypes.byref(info)))
        return adapter_dict(info)

    def adapter(self, adapter_id):
        """One adapter of the engine's store as a dict; InfillError "not_found" when it has none."""
        info = AdapterInfo()
        self.lib.infill_adapter_info_init(ctypes.byref(info))
        check(self.lib, self.lib.infill_client_get_adapter(self._handle, adapter_id.encode(), ctypes.byref(info)))
        return adapter_dict(info)

    def adapters(self):
        """The engine's adapters, as dicts (see upload_adapter)."""
        handle = c_void_p()
        check(self.lib, self.lib.infill_client_list_adapters(self._handle, ctypes.byref(handle)))
        try:
            return [adapter_dict(self.lib.infill_adapter_list_get(handle, i).contents)
                    for i in range(self.lib.infill_adapter_list_count(handle))]
        finally:
            self.lib.infill_adapter_list_delete(handle)

    def delete_adapter(self, adapter_id):
        """Removes an adapter from the engine's store; InfillError "not_found" when it has none."""
        check(self.lib, self.lib.infill_client_delete_adapter(self._handle, adapter_id.encode()))

    def submit(self, template_id, mask=None, mask_rect=None, mask_png=None, prompt="", seed=0, steps=0, strength=0.0,
               edit_class="", preview_every_steps=0, supersedes=0, output_format="template", model=None,
               adapters=(), references=(), adapters_from_step=0, on_progress=None, on_preview=None, on_done=None):
        """Submits an edit. The mask, one of: `mask` (8-bit grey bytes, width, height; 0 = keep,
        255 = regenerate), `mask_rect` (x, y, w, h) or `mask_png` (an encoded image's bytes).
        `adapters`: LoRAs applied in order, each an id (strength 1) or an (id, strength) pair;
        `references`: template ids of reference images (FLUX.2 models); `adapters_from_step`: Katz's K, the first
        step that applies the adapters (0 = from the first; at most the edit's steps). Callbacks: on_progress(steps_done, steps_total),
        on_preview(png_bytes, steps_done), on_done(state, error or None, data, media_type). Once the edit
        ended, the returned Job's `adapters_from_step` is the K it ran with."""
        p = EditParams()
        self.lib.infill_edit_params_init(ctypes.byref(p))
        check_layout(p)
        p.template_id = template_id.encode()
        keep = []  # buffers the library reads during submit
        if mask is not None:
            pixels, width, height = mask
            buf = ctypes.create_string_buffer(bytes(pixels), len(pixels))
            keep.append(buf)
            p.mask_pixels = ctypes.cast(buf, c_void_p)
            p.mask_width, p.mask_height, p.mask_stride = width, height, width
        elif mask_rect is not None:
            p.mask_rect[:] = list(mask_rect)
        elif mask_png is not None:
            buf = ctypes.create_string_buffer(bytes(mask_png), len(mask_png))
            keep.append(buf)
            p.mask_png, p.mask_png_size = ctypes.cast(buf, c_void_p), len(mask_png)
        p.prompt = prompt.encode() if prompt else None
        p.seed, p.steps, p.strength = seed, steps, strength
        p.edit_class = EDIT_CLASSES[edit_class]
        p.preview_every_steps, p.supersedes = preview_every_steps, supersedes
        p.model = model.encode() if model else None
        p.output_format = output_format.encode() if output_format else None
        if adapters:
            array = (EditAdapter * len(adapters))()
            for element, adapter in zip(array, adapters):
                adapter_id, weight = (adapter, 1.0) if isinstance(adapter, str) else adapter
                self.lib.infill_edit_adapter_init(ctypes.byref(element))
                element.id, element.strength = adapter_id.encode(), weight
            keep.append(array)
            p.adapters, p.adapter_count = array, len(adapters)
        if references:
            ids = (c_char_p * len(references))(*[r.encode() for r in references])
            keep.append(ids)
            p.references, p.reference_count = ids, len(references)
        p.adapters_from_step = adapters_from_step

        slot = {}
        lib = self.lib

        def progress(_user, pr):
            if on_progress:
                on_progress(pr.contents.steps_done, pr.contents.steps_total)

        def preview(_user, pv):
            if on_preview:
                on_preview(ctypes.string_at(pv.contents.png, pv.contents.png_size), pv.contents.steps_done)

        def done(_user, d):
            d = d.contents
            covers = d.struct_size >= Done.adapters_from_step.offset + ctypes.sizeof(c_u32)
            slot["adapters_from_step"] = d.adapters_from_step if covers else 0
            if on_done:
                error = error_of(lib, d.error, free=False) if d.error else None
                data = ctypes.string_at(d.png, d.png_size) if d.png else b""
                media_type = d.media_type.decode() if d.media_type else ""
                on_done(JOB_STATES.get(d.state, "unknown"), error, data, media_type)
            slot["finished"] = True

        callbacks = (PROGRESS_FN(progress), PREVIEW_FN(preview), DONE_FN(done))
        slot["key"] = id(callbacks)
        with self._lock:
            # Callbacks of edits that ended one submit ago are surely no longer running: drop
            # them (freeing a ctypes thunk while C runs it would crash the host).
            for key in [k for k, (_, s) in self._live.items() if s.get("stale")]:
                del self._live[key]
            for _, s in self._live.values():
                if s.get("finished"):
                    s["stale"] = True
            self._live[slot["key"]] = (callbacks, slot)
        p.on_progress, p.on_preview, p.on_done = callbacks
        handle = c_void_p()
        err = self.lib.infill_client_submit_edit(self._handle, ctypes.byref(p), ctypes.byref(handle))
        if err:
            with self._lock:
                self._live.pop(slot["key"], None)
            raise error_of(self.lib, err)
        return Job(self, handle, callbacks, slot)

    def close(self):
        """Ends the connection; edits in flight end (cancelled when cancel_on_destroy)."""
        if self._handle:
            self.lib.infill_client_destroy(self._handle)
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
