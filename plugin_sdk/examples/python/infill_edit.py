#!/usr/bin/env python3
"""infill_edit.py: upload a template, submit one edit with a mask, print its progress, write
the result -- libinfill_client through its Python binding, infill_client.py (docs/sdk.md).

    python3 infill_edit.py [--endpoint E] [--token T] [--library PATH] [--steps N]
                           [--lora FILE[:STRENGTH]]... TEMPLATE MASK OUT.png|OUT.tif|OUT.exr

MASK is an image file (0 = keep, 255 = regenerate) or a rectangle "rect:X,Y,W,H". OUT's
extension picks the result's format (TIFF and OpenEXR keep 16-bit and float templates' depth).
--lora uploads a LoRA (.safetensors, FLUX.2 models) and applies it at STRENGTH (-10..10,
default 1); several apply in the order given.
The library is found through --library, $INFILL_CLIENT_LIBRARY, or the linker's search path;
the binding beside this script, in the source tree (plugin_sdk/python) or installed
(libinfill-dev puts it into Python's dist-packages).
Exit status: 0 done, 1 the engine or the edit failed, 2 bad usage.
"""
import argparse
import os
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "..", "python")]
import infill_client  # noqa: E402  (after the search path above)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoint", default=None)
    ap.add_argument("--token", default=None)
    ap.add_argument("--library", default=None)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default=None, help="a model id from GET /v1/models; default: the engine's default")
    ap.add_argument("--lora", action="append", default=[], metavar="FILE[:STRENGTH]",
                    help="a LoRA to upload and apply (FLUX.2 models); strength -10..10, default 1")
    ap.add_argument("template")
    ap.add_argument("mask")
    ap.add_argument("out")
    args = ap.parse_args()

    try:
        with infill_client.Client(endpoint=args.endpoint, token=args.token, library=args.library) as client:
            print("engine", client.endpoint)
            client.wait_ready(30000)
            with open(args.template, "rb") as f:
                info = client.upload(f.read(), os.path.basename(args.template))
            print(f"template {info['id'][:12]}... {info['width']}x{info['height']}")
            adapters = []
            for spec in args.lora:
                path, strength = spec, 1.0
                head, _, tail = spec.rpartition(":")
                if head:
                    try:
                        path, strength = head, float(tail)
                    except ValueError:
                        pass  # a ':' in the file name
                lora = client.upload_adapter(path, model=args.model)
                print(f"adapter {lora['id'][:12]}... {lora['name']} ({lora['format']}, rank {lora['max_rank']}, "
                      f"{lora['layers']} layers) at {strength:g}")
                adapters.append((lora["id"], strength))

            mask = {}
            if args.mask.startswith("rect:"):
                mask["mask_rect"] = [int(v) for v in args.mask[5:].split(",")]
            else:
                with open(args.mask, "rb") as f:
                    mask["mask_png"] = f.read()
            extension = os.path.splitext(args.out)[1].lower().lstrip(".")
            finished = threading.Event()
            outcome = {}

            def on_done(state, error, data, media_type):
                outcome.update(state=state, error=error, data=data, media_type=media_type)
                finished.set()

            job = client.submit(
                info["id"], steps=args.steps, seed=args.seed, model=args.model, adapters=adapters, preview_every_steps=2,
                output_format={"tif": "tiff", "tiff": "tiff", "exr": "exr"}.get(extension, "png"),
                on_progress=lambda done, total: print(f"progress {done}/{total}", flush=True),
                on_preview=lambda png, steps: print(f"preview at step {steps}: {len(png)} bytes of PNG", flush=True),
                on_done=on_done, **mask)
            print("edit", job.id, "submitted")
            job.wait(600000)
            finished.wait(5)
            if outcome.get("state") != "done":
                print(f"edit {outcome.get('state')}: {outcome.get('error')}", file=sys.stderr)
                return 1
            with open(args.out, "wb") as f:
                f.write(outcome["data"])
            print(f"wrote {args.out} ({len(outcome['data'])} bytes, {outcome['media_type']})")
            return 0
    except (infill_client.InfillError, OSError) as e:
        print(f"infill_edit.py: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
