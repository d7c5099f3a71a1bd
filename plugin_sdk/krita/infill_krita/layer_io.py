"""A Krita layer and selection in and out of files the engine reads, at the layer's own depth.

Krita exports whole images, so the layer goes through a one-layer copy of the document in the
layer's colour space and profile: TIFF for 8- and 16-bit integer layers (with the ICC profile,
display-referred as the engine reads integers), OpenEXR for half and float layers (linear
light, as the engine reads EXR). Both round-trip the layer's pixels exactly through Krita's own
exporters and importers (opaque pixels; Krita's TIFF export stores colour premultiplied by
alpha, so semi-transparent pixels may shift by a rounding step: see merge_inside_selection).
"""
import os
import tempfile

EXTENSION = {"U8": "tif", "U16": "tif", "F16": "exr", "F32": "exr"}
BYTES_PER_CHANNEL = {"U8": 1, "U16": 2, "F16": 2, "F32": 4}


class LayerError(Exception):
    """What the user must change (no selection, an unsupported layer), in their words."""


def check_layer(document, node):
    """Raises LayerError unless `node` is a paint layer the engine can repaint."""
    if document is None:
        raise LayerError("No document is open.")
    if node is None or node.type() != "paintlayer":
        kind = node.type() if node is not None else "nothing"
        raise LayerError(f"The active layer is a {kind}; select a paint layer to repaint.")
    if node.colorModel() not in ("RGBA", "GRAYA"):
        raise LayerError(f"Layer \"{node.name()}\" is in the {node.colorModel()} colour model; "
                         "Infill repaints RGB and greyscale layers (Image > Convert Image Color Space).")
    if node.colorDepth() not in EXTENSION:
        raise LayerError(f"Layer \"{node.name()}\" has colour depth {node.colorDepth()}, "
                         "expected 8 or 16-bit integer, 16 or 32-bit float.")


def selection_mask(document):
    """The selection as 8-bit grey bytes of the document's size (0 = keep, 255 = regenerate),
    with its width and height. Raises LayerError when nothing is selected."""
    selection = document.selection()
    if selection is None or selection.width() <= 0 or selection.height() <= 0:
        raise LayerError("Nothing is selected: select the region to repaint.")
    w, h = document.width(), document.height()
    mask = bytes(selection.pixelData(0, 0, w, h))
    if not any(mask):
        raise LayerError("The selection is empty: select the region to repaint.")
    return mask, w, h


def _one_layer_copy(krita, document, node):
    """A hidden document of `document`'s size holding only `node`'s pixels, in its colour space."""
    w, h = document.width(), document.height()
    copy = krita.createDocument(w, h, "infill-template", node.colorModel(), node.colorDepth(),
                                node.colorProfile(), document.resolution())
    copy.setBatchmode(True)
    for top in copy.topLevelNodes():  # createDocument adds a white background layer
        top.remove()
    layer = copy.createNode("template", "paintlayer")
    copy.rootNode().addChildNode(layer, None)
    layer.setPixelData(node.pixelData(0, 0, w, h), 0, 0, w, h)
    copy.refreshProjection()
    copy.waitForDone()
    return copy


def export_layer(krita, document, node):
    """The layer encoded at its depth: (file bytes, file name for the engine's messages)."""
    from krita import InfoObject
    ext = EXTENSION[node.colorDepth()]
    copy = _one_layer_copy(krita, document, node)
    try:
        with tempfile.TemporaryDirectory(prefix="infill-krita-") as folder:
            path = os.path.join(folder, f"template.{ext}")
            if not copy.exportImage(path, InfoObject()) or not os.path.exists(path):
                raise LayerError(f"Krita could not export layer \"{node.name()}\" as {ext.upper()}.")
            with open(path, "rb") as f:
                data = f.read()
    finally:
        copy.close()
    base = os.path.splitext(os.path.basename(document.fileName() or "untitled"))[0]
    return data, f"{base} - {node.name()}.{ext}"


def import_result(krita, document, node, data, media_type):
    """The result file's pixels converted to `node`'s colour space: bytes of the document's size."""
    ext = {"image/tiff": "tif", "image/x-exr": "exr", "image/png": "png"}.get(media_type)
    if ext is None:
        raise LayerError(f"The engine answered with a {media_type or 'unknown'} file, expected TIFF, EXR or PNG.")
    w, h = document.width(), document.height()
    with tempfile.TemporaryDirectory(prefix="infill-krita-") as folder:
        path = os.path.join(folder, f"result.{ext}")
        with open(path, "wb") as f:
            f.write(data)
        result = krita.openDocument(path)
        if result is None:
            raise LayerError(f"Krita could not open the engine's result ({len(data)} bytes of {media_type}).")
        try:
            result.setBatchmode(True)
            if (result.width(), result.height()) != (w, h):
                raise LayerError(f"The engine's result is {result.width()}x{result.height()}, the image {w}x{h}.")
            if (result.colorModel(), result.colorDepth(), result.colorProfile()) != \
                    (node.colorModel(), node.colorDepth(), node.colorProfile()):
                # E.g. a half layer's result comes back as float: the same values in half.
                result.setColorSpace(node.colorModel(), node.colorDepth(), node.colorProfile())
                result.waitForDone()
            top = result.topLevelNodes()
            if not top:
                raise LayerError("The engine's result opened without a layer.")
            return bytes(top[0].pixelData(0, 0, w, h))
        finally:
            result.close()


def merge_inside_selection(original, result, mask, pixel_bytes):
    """`original` with the pixels where `mask` > 0 taken from `result` (all bytes per pixel):
    outside the selection the layer keeps its own bytes whatever the file round trip did."""
    out = bytearray(original)
    width_runs = []
    start = None
    for i, m in enumerate(mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            width_runs.append((start, i))
            start = None
    if start is not None:
        width_runs.append((start, len(mask)))
    for a, b in width_runs:
        out[a * pixel_bytes:b * pixel_bytes] = result[a * pixel_bytes:b * pixel_bytes]
    return bytes(out)


def add_result_layer(document, node, pixels, name):
    """A new paint layer above `node` holding `pixels` (the document's size, node's colour space)."""
    w, h = document.width(), document.height()
    layer = document.createNode(name, "paintlayer")
    if (layer.colorModel(), layer.colorDepth(), layer.colorProfile()) != \
            (node.colorModel(), node.colorDepth(), node.colorProfile()):
        layer.setColorSpace(node.colorModel(), node.colorDepth(), node.colorProfile())
    node.parentNode().addChildNode(layer, node)
    layer.setPixelData(pixels, 0, 0, w, h)
    document.refreshProjection()
    return layer


def pixel_bytes(node):
    channels = 4 if node.colorModel() == "RGBA" else 2
    return channels * BYTES_PER_CHANNEL[node.colorDepth()]
