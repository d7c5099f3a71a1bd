"""One repaint of a Krita layer's selection through the engine, start to finish.

Repaint.start() exports the layer and the selection and submits the edit (on the caller's
thread: Krita's document calls must run on the GUI thread); the engine's callbacks arrive on
the SDK's thread and are handed on as they are; finish() turns the result into a new layer
(GUI thread again). The docker (docker.py) and the headless tests drive the same class.
"""
from . import layer_io

try:
    from . import infill_client  # the copy the packages ship beside this module
except ImportError:  # the source tree: plugin_sdk/python on sys.path
    import infill_client


class Settings:
    """What the docker asks for. `steps` 0 and `strength` 0 mean the model's defaults;
    `adapters`: LoRAs as (adapter id, strength) pairs, applied in order (FLUX.2 models);
    `references`: template ids of reference images (FLUX.2 models)."""

    def __init__(self, prompt="", seed=0, steps=0, strength=0.0, live=False, preview_every_steps=1, adapters=(),
                 references=()):
        self.prompt, self.seed, self.steps, self.strength = prompt, seed, steps, strength
        self.live, self.preview_every_steps = live, preview_every_steps
        self.adapters = list(adapters)
        self.references = list(references)


class Repaint:
    """An edit of `node`'s selected region. Callbacks (SDK thread): on_progress(done, total),
    on_preview(png_bytes, steps_done), on_done(state, error, data, media_type)."""

    def __init__(self, krita, client, document, node, settings):
        layer_io.check_layer(document, node)
        self.krita, self.client, self.document, self.node, self.settings = krita, client, document, node, settings
        self.mask, self.width, self.height = layer_io.selection_mask(document)
        self.job = None

    def start(self, supersedes=0, on_progress=None, on_preview=None, on_done=None):
        data, name = layer_io.export_layer(self.krita, self.document, self.node)
        info = self.client.upload(data, name)
        s = self.settings
        self.job = self.client.submit(
            info["id"], mask=(self.mask, self.width, self.height), prompt=s.prompt, seed=s.seed, steps=s.steps,
            strength=s.strength, edit_class="live" if s.live else "interactive",
            preview_every_steps=s.preview_every_steps, supersedes=supersedes, output_format="template",
            adapters=s.adapters, references=s.references, on_progress=on_progress, on_preview=on_preview, on_done=on_done)
        return self.job

    def finish(self, data, media_type):
        """The result as a new layer above the repainted one; returns the layer."""
        result = layer_io.import_result(self.krita, self.document, self.node, data, media_type)
        original = bytes(self.node.pixelData(0, 0, self.width, self.height))
        pixels = layer_io.merge_inside_selection(original, result, self.mask, layer_io.pixel_bytes(self.node))
        name = f"Infill: {self.settings.prompt}" if self.settings.prompt else "Infill"
        return layer_io.add_result_layer(self.document, self.node, pixels, name)


def repaint_and_wait(krita, client, document, node, settings, timeout_ms=600000):
    """Runs one repaint to the end on this thread (scripts, tests); returns the new layer."""
    r = Repaint(krita, client, document, node, settings)
    job = r.start()
    if not job.wait(timeout_ms):
        job.cancel()
        raise infill_client.InfillError(0, "timeout", f"edit {job.id} did not finish within {timeout_ms} ms")
    data, media_type = job.result()
    return r.finish(data, media_type)
