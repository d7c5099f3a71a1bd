"""Run inside Krita by kritarunner (test_krita_repaint.py starts it): repaints a rectangle
selection of a paint layer at each colour depth through the plug-in's own code and the real
engine, and prints one JSON line per case. Settings come from the environment:
INFILL_TEST_ENDPOINT (the engine), INFILL_TEST_OUT (where the JSON lines go); INFILL_TEST_MODE
"live" (one of several live painters) or "lora" (the docker's LoRA list and reference images
against a FLUX.2 engine, with the files INFILL_TEST_LORA and INFILL_TEST_WIDER_LORA and the image
files INFILL_TEST_REFERENCES, os.pathsep apart)."""
import json
import os
import random
import struct

W, H = 64, 48
RECT = (16, 8, 24, 16)
PROFILES = {"U8": "sRGB-elle-V2-srgbtrc.icc", "U16": "sRGB-elle-V2-srgbtrc.icc",
            "F16": "sRGB-elle-V2-g10.icc", "F32": "sRGB-elle-V2-g10.icc"}


def picture(depth):
    """An opaque RGBA picture (Krita's channel order) with detail in every bit of the depth."""
    rnd = random.Random(depth)
    out = bytearray()
    for y in range(H):
        for x in range(W):
            if depth == "U8":
                out += bytes([(x * 4 + rnd.getrandbits(2)) & 255, (y * 5) & 255, 128, 255])
            elif depth == "U16":
                out += struct.pack("<4H", (x * 1000 + rnd.getrandbits(8)) & 65535, y * 1300, 40000, 65535)
            else:
                fmt = "<4e" if depth == "F16" else "<4f"
                out += struct.pack(fmt, x / W * 2.5 + rnd.random() * 1e-3, y / H, 0.25, 1.0)
    return bytes(out)


def run_case(krita, client, depth, repaint, layer_io):
    from krita import Selection
    doc = krita.createDocument(W, H, f"infill-{depth}", "RGBA", depth, PROFILES[depth], 72.0)
    doc.setBatchmode(True)
    node = doc.topLevelNodes()[0]
    original = picture(depth)
    node.setPixelData(original, 0, 0, W, H)
    doc.setActiveNode(node)
    case = {"depth": depth, "profile": node.colorProfile()}
    try:
        try:
            repaint.Repaint(krita, client, doc, node, repaint.Settings(steps=2))
            case["no_selection_error"] = ""
        except Exception as e:  # the plug-in's LayerError
            case["no_selection_error"] = str(e)
        selection = Selection()
        selection.select(*RECT, 255)
        doc.setSelection(selection)
        r = repaint.Repaint(krita, client, doc, node, repaint.Settings(seed=3, steps=2))
        job = r.start()
        case["finished"] = job.wait(300000)
        data, media_type = job.result()
        case["media_type"] = media_type
        layer = r.finish(data, media_type)
        names = [n.name() for n in doc.topLevelNodes()]
        case["layers"] = names
        got = bytes(layer.pixelData(0, 0, W, H))
        # The engine's result for this request, as Krita's importer reads it.
        expected_inside = layer_io.import_result(krita, doc, node, data, media_type)
        px = len(original) // (W * H)
        kept_bad = changed_inside = inside_bad = 0
        x0, y0, w, h = RECT
        for y in range(H):
            for x in range(W):
                a = slice((y * W + x) * px, (y * W + x + 1) * px)
                inside = x0 <= x < x0 + w and y0 <= y < y0 + h
                if inside:
                    changed_inside += got[a] != original[a]
                    inside_bad += got[a] != expected_inside[a]
                else:
                    kept_bad += got[a] != original[a]
        case.update(kept_bad=kept_bad, changed_inside=changed_inside, inside_bad=inside_bad,
                    layer_depth=layer.colorDepth(), layer_profile=layer.colorProfile())
    except Exception as e:
        case["exception"] = f"{type(e).__name__}: {e}"
    finally:
        doc.close()
    return case


def wait_idle(docker, timeout_s):
    """Runs Qt's event loop until the docker has no edit in flight (the SDK's callbacks arrive
    as queued signals)."""
    import time
    from PyQt5.QtCore import QCoreApplication
    end = time.time() + timeout_s
    while docker.busy() and time.time() < end:
        QCoreApplication.processEvents()
        time.sleep(0.01)
    return not docker.busy()


def docker_case(krita, endpoint, live_strokes):
    """The docker's own path: Repaint selection, or `live_strokes` live strokes that each
    supersede the last (the selection moved between them)."""
    from krita import Selection
    from infill_krita.docker import InfillDocker, LIVE_LAYER
    doc = krita.createDocument(W, H, "infill-docker", "RGBA", "U8", PROFILES["U8"], 72.0)
    doc.setBatchmode(True)
    node = doc.topLevelNodes()[0]
    node.setPixelData(picture("U8"), 0, 0, W, H)
    docker = InfillDocker()
    docker.endpoint.setText(endpoint)
    docker.steps.setValue(2)
    states = []
    docker.bridge.done.connect(lambda serial, state, error, data, media: states.append(state))
    case = {"case": "live" if live_strokes else "docker"}
    try:
        selection = Selection()
        selection.select(*RECT, 255)
        doc.setSelection(selection)
        if not live_strokes:
            case["serial"] = docker.generate(doc, node)
            case["idle_after_first"] = wait_idle(docker, 300)
            case["progress_after_first"] = [docker.progress.value(), docker.progress.maximum()]
            case["preview_shown"] = docker.preview.pixmap() is not None and not docker.preview.pixmap().isNull()
            # Cancel: a long edit, stopped once its first step reported progress.
            from PyQt5.QtCore import QCoreApplication
            import time
            docker.steps.setValue(1000)
            started = []
            docker.bridge.progress.connect(lambda serial, done, total: started.append(done))
            docker.generate(doc, node)
            end = time.time() + 120
            while not started and time.time() < end:
                QCoreApplication.processEvents()
                time.sleep(0.01)
            case["cancel_after_progress"] = bool(started)
            docker.cancel()
        else:
            for i in range(live_strokes):
                moved = Selection()
                moved.select(RECT[0] + 2 * i, RECT[1], RECT[2], RECT[3], 255)
                doc.setSelection(moved)
                case.setdefault("serials", []).append(docker.live_tick(doc, node))
        case["idle"] = wait_idle(docker, 300)
        case["states"] = states
        case["status"] = docker.status.text()
        case["progress"] = [docker.progress.value(), docker.progress.maximum()]
        case["result_layers"] = [layer.name() for layer in docker.results]
        case["live_layers"] = sum(1 for n in doc.topLevelNodes() if n.name() == LIVE_LAYER)
    except Exception as e:
        case["exception"] = f"{type(e).__name__}: {e}"
    finally:
        doc.close()
    return case


def lora_case(krita, endpoint, lora, wider, references):
    """The docker's LoRA list: files added (uploaded through the binding) or refused with a
    message, a strength per entry, entries removed; then its reference images: added (uploaded
    as templates), refused past the limit, removed; each repaint's pixels inside the selection."""
    from krita import Selection
    from infill_krita.docker import InfillDocker, LORA_STRENGTH_RANGE, REFERENCE_LIMIT
    doc = krita.createDocument(W, H, "infill-lora", "RGBA", "U8", PROFILES["U8"], 72.0)
    doc.setBatchmode(True)
    node = doc.topLevelNodes()[0]
    original = picture("U8")
    node.setPixelData(original, 0, 0, W, H)
    docker = InfillDocker()
    docker.endpoint.setText(endpoint)
    docker.seed.setValue(3)
    states = []
    docker.bridge.done.connect(lambda serial, state, error, data, media: states.append(state))
    case = {"case": "lora", "strength_range": list(LORA_STRENGTH_RANGE), "reference_limit": REFERENCE_LIMIT}
    x0, y0, w, h = RECT

    def repaint(name):
        """One Repaint selection through the docker: the new layer's pixels inside the
        selection, and how many outside differ from the original."""
        serial = docker.generate(doc, node)
        if not serial:
            return {"name": name, "status": docker.status.text()}
        wait_idle(docker, 300)
        got = bytes(docker.results[-1].pixelData(0, 0, W, H)) if docker.results else b""
        inside, outside_bad = [], 0
        for y in range(H):
            for x in range(W):
                a = slice((y * W + x) * 4, (y * W + x + 1) * 4)
                if x0 <= x < x0 + w and y0 <= y < y0 + h:
                    inside.append(got[a].hex())
                else:
                    outside_bad += got[a] != original[a]
        return {"name": name, "inside": "".join(inside), "outside_bad": outside_bad, "layers": len(docker.results)}

    try:
        selection = Selection()
        selection.select(*RECT, 255)
        doc.setSelection(selection)
        case["missing_row"] = docker.add_lora(os.path.join(os.path.dirname(lora), "missing.safetensors"))
        case["missing_status"] = docker.status.text()
        case["wider_row"] = docker.add_lora(wider)
        case["wider_status"] = docker.status.text()
        case["rows_after_refused"] = docker.loras.rowCount()
        plain = repaint("plain")
        case["row"] = docker.add_lora(lora)
        case["again_row"] = docker.add_lora(lora)
        case["again_status"] = docker.status.text()
        case["rows"] = docker.loras.rowCount()
        docker.set_lora_strength(case["row"], 1.5)
        case["engine_lists_it"] = docker._loras[0]["id"] in [a["id"] for a in docker.client().adapters()]
        adapted, repeat = repaint("adapted"), repaint("repeat")
        # The engine loses the LoRA (deleted from its store): the docker uploads it again.
        docker.client().delete_adapter(docker._loras[0]["id"])
        reuploaded = repaint("reuploaded")
        docker.remove_lora(0)
        case["rows_after_remove"] = docker.loras.rowCount()
        removed = repaint("removed")
        # Reference images: a missing file refused, one added twice listed once, the limit kept.
        case["ref_missing_row"] = docker.add_reference(os.path.join(os.path.dirname(lora), "missing.png"))
        case["ref_missing_status"] = docker.status.text()
        case["ref_row"] = docker.add_reference(references[0])
        case["ref_again_row"] = docker.add_reference(references[0])
        case["ref_again_status"] = docker.status.text()
        case["ref_rows"] = [docker.add_reference(path) for path in references[1:]]
        case["ref_full_status"] = docker.status.text()
        case["ref_count"] = docker.references_list.count()
        referenced, referenced_again = repaint("referenced"), repaint("referenced_again")
        while docker.references_list.count():
            docker.remove_reference(0)
        # An image the engine takes as a template but not as a reference (under 64 pixels a
        # side): the edit is refused naming the list entry, which shows the list is sent.
        case["small_row"] = docker.add_reference(references[-1].replace(".png", "_small.png"))
        case["small_serial"] = docker.generate(doc, node)
        case["small_status"] = docker.status.text()
        docker.remove_reference(0)
        unreferenced = repaint("unreferenced")
        case["repaints"] = [plain, adapted, repeat, reuploaded, removed, referenced, referenced_again, unreferenced]
        case["states"] = states
        case["status"] = docker.status.text()
    except Exception as e:
        case["exception"] = f"{type(e).__name__}: {e}"
    finally:
        doc.close()
    return case


def main(args):
    from krita import Krita
    import infill_client
    from infill_krita import layer_io, repaint
    krita = Krita.instance()
    krita.setBatchmode(True)
    with open(os.environ["INFILL_TEST_OUT"], "w") as out:
        try:
            client = infill_client.Client(endpoint=os.environ["INFILL_TEST_ENDPOINT"], client_name="krita-test")
            client.wait_ready(60000)
            if os.environ.get("INFILL_TEST_MODE") == "lora":
                out.write(json.dumps(lora_case(krita, os.environ["INFILL_TEST_ENDPOINT"], os.environ["INFILL_TEST_LORA"],
                                               os.environ["INFILL_TEST_WIDER_LORA"],
                                               os.environ["INFILL_TEST_REFERENCES"].split(os.pathsep))) + "\n")
            elif os.environ.get("INFILL_TEST_MODE") == "live":
                # One of several Kritas live painting on one engine at once.
                out.write(json.dumps(docker_case(krita, os.environ["INFILL_TEST_ENDPOINT"], 4)) + "\n")
            else:
                for depth in ("U8", "U16", "F16", "F32"):
                    out.write(json.dumps(run_case(krita, client, depth, repaint, layer_io)) + "\n")
                    out.flush()
                out.write(json.dumps(docker_case(krita, os.environ["INFILL_TEST_ENDPOINT"], 0)) + "\n")
            client.close()
        except Exception as e:
            out.write(json.dumps({"exception": f"{type(e).__name__}: {e}"}) + "\n")
