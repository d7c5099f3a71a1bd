#!/usr/bin/env python3
"""Our FLUX.2 steps as ratios to the upstream peer's full step, measured on the same machine
(issue 39 item 6; scripts/gpu_check.sh runs it).

    flux2_peer_ratios.py --ours FILE [--ours FILE ...] --peer FILE [--peer FILE ...]

--ours: what `bench_flux2` printed on stdout (one JSON document per file, one grid each);
--peer: what `time_full_step.py` of ../shared/peers/flux2_upstream printed (JSON lines: an
information line, then one line per grid and mode, eager or compile). Sizes are matched by
token count (image + reference + text), so both must use the same text length (512).

Prints one JSON line: per size, our full step and every masked step (m, prompt- or
template-keyed, device-resident cache; eager, with its state on the device and through a step
graph where bench_flux2 timed those) in ms and as a ratio to the peer's eager and torch.compile
full steps (below 1: ours is faster), and at klein 4B sizes the issue's targets (masked steps
through the graph where timed).
Exit 0 when every size of ours has both peer figures, 1 when one is missing, 2 on bad input.
Uses only the standard library (python3 without torch can run it).
"""
import argparse
import json
import math
import sys

# Issue 39's targets at klein 4B sizes, by token count (512x512 and 1024x1024 with a
# reference image and 512 text tokens): masked steps at m = 0.1 in ms, full step vs compile.
TARGETS_MS = {2560: {"prompt_keyed_m0.1": 4.0, "template_keyed_m0.1": 7.0},
              8704: {"prompt_keyed_m0.1": 6.0, "template_keyed_m0.1": 12.0}}
TARGET_FULL_VS_COMPILE = 1.1


def fail(message, code=2):
    print("flux2_peer_ratios: " + message, file=sys.stderr)
    sys.exit(code)


def read_ours(path):
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path}: not a bench_flux2 JSON document ({e})")
    if doc.get("benchmark") != "bench_flux2":
        fail(f"{path}: 'benchmark' is {doc.get('benchmark')!r}, expected 'bench_flux2'")
    try:
        tokens = doc["full_step"]["tokens"]
        steps = {"full": doc["full_step"]["ms"]}
        for row in doc["masked_steps"]:
            for key in ("prompt_keyed", "template_keyed"):
                step = row[key]
                name = f"{key}_m{row['m']:g}"
                steps[name] = step["ms"]  # the eager step
                if "device_state_ms" in step:  # its state on the device
                    steps[name + "_device_state"] = step["device_state_ms"]
                if "graph" in step:  # through a step graph over its row bucket
                    steps[name + "_graph"] = step["graph"]["ms"]
        return {"grid": math.isqrt(tokens["image"]),
                "tokens": tokens["image"] + tokens["reference"] + tokens["text"], "size": doc["model"]["size"],
                "device": doc.get("device"), "gpu": doc["machine"].get("gpu"), "steps_ms": steps}
    except (KeyError, TypeError) as e:
        fail(f"{path}: bench_flux2 document without {e}")


def read_peer(path):
    """Returns (information line, {(tokens, mode): median ms})."""
    info, times = {}, {}
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        fail(f"{path}: {e}")
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue  # torch.compile's warnings and the like
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if "peer" in record:
            info = record
        elif "full_step_ms_median" in record:
            times[(record["tokens"], record["mode"])] = record["full_step_ms_median"]
    return info, times


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ours", action="append", required=True)
    parser.add_argument("--peer", action="append", required=True)
    args = parser.parse_args()

    ours = [read_ours(p) for p in args.ours]
    peer_info, peer = {}, {}
    for p in args.peer:
        info, times = read_peer(p)
        peer_info = peer_info or info
        peer.update(times)

    sizes, missing, targets = [], [], {}
    for run in sorted(ours, key=lambda r: r["tokens"]):
        tokens = run["tokens"]
        peer_ms = {mode: peer.get((tokens, mode)) for mode in ("eager", "compile")}
        entry = {"grid": run["grid"], "tokens": tokens, "ours_ms": run["steps_ms"], "peer_ms": peer_ms}
        for mode, ms in peer_ms.items():
            if ms is None:
                missing.append(f"peer {mode} at {tokens} tokens")
                continue
            entry["vs_" + mode] = {k: round(v / ms, 3) for k, v in run["steps_ms"].items()}
        sizes.append(entry)
        if run["size"] != "klein-4b" or tokens not in TARGETS_MS:
            continue
        for step, limit in TARGETS_MS[tokens].items():
            # The engine's masked step: through its step graph where bench_flux2 timed one.
            path = "graph" if step + "_graph" in run["steps_ms"] else "eager"
            value = run["steps_ms"].get(step + "_graph" if path == "graph" else step)
            targets[f"{step}_ms_at_{tokens}"] = {"value": value, "path": path, "target": f"<= {limit:g}",
                                                 "met": value is not None and value <= limit}
        if peer_ms["compile"] is not None:
            ratio = run["steps_ms"]["full"] / peer_ms["compile"]
            targets[f"full_vs_compile_at_{tokens}"] = {"value": round(ratio, 3),
                                                       "target": f"<= {TARGET_FULL_VS_COMPILE:g}",
                                                       "met": ratio <= TARGET_FULL_VS_COMPILE}

    ours_gpu = ours[0]["gpu"] if ours else None
    peer_gpu = peer_info.get("gpu")
    out = {"gpu_check": "flux2_vs_peer",
           "ours": {"device": ours[0]["device"] if ours else None, "model": ours[0]["size"] if ours else None},
           "peer": {"code": peer_info.get("peer"), "torch": peer_info.get("torch"), "gpu": peer_gpu},
           # The peer names the GPU as torch does; bench_flux2 as "cuda:0 (NAME, MEMORY)".
           "same_gpu": bool(ours_gpu and peer_gpu and peer_gpu in ours_gpu),
           "ratio": "ours_ms / peer full step ms (below 1: ours faster); medians",
           "sizes": sizes}
    if targets:
        out["targets"] = targets
    if missing:
        out["missing"] = missing
    print(json.dumps(out))
    return 1 if missing or not ours else 0


if __name__ == "__main__":
    sys.exit(main())
