#!/usr/bin/env python3
"""The prebuilt bundle of the GPU checks: binaries built on a machine without a GPU against the
GPU machines' torch (scripts/gpu_prebuild.sh), run by scripts/gpu_check.sh --prebuilt DIR.

DIR holds prebuilt.tar.xz (bin/{tests,app,bench}/NAME, stripped; lib/ with the libraries a
pip-torch machine lacks) and manifest.json (what was built from which commit against which
torch and CUDA, each file's size, sha256 and NEEDED libraries, the glibc and libstdc++ versions
they need). Standard library only, so it runs under any python3.

    gpu_prebuilt.py manifest STAGE OUT --torch V --cuda V --source-dir D --commit C
                    --build-dir B [--uncommitted] [--not-built-now] [--missing T ...] [--lib NAME=FROM ...]
        (on the build machine) writes OUT/manifest.json for the files under STAGE, after
        OUT/prebuilt.tar.xz was packed from STAGE
    gpu_prebuilt.py check MANIFEST     (on the GPU machine) prints one JSON line; exit 1 unless
                                       python3's torch and CUDA versions match the manifest's
    gpu_prebuilt.py unpack TARBALL DIR (on the GPU machine) DIR emptied, then the bundle in it
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time


def _version_key(v):
    return tuple(int(x) for x in v.split(".")) if v else ()


def _elf(path, tool, pattern):
    text = subprocess.run(tool + [path], capture_output=True, text=True, check=True).stdout
    return re.findall(pattern, text)


def manifest(args):
    files, glibc, glibcxx = [], set(), set()
    for root, _, names in os.walk(args.stage):
        for name in sorted(names):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, args.stage)
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            entry = {"path": rel, "bytes": os.path.getsize(path), "sha256": digest,
                     "needed": _elf(path, ["readelf", "-d"], r"\(NEEDED\).*\[(.*)\]")}
            files.append(entry)
            symbols = _elf(path, ["objdump", "-T"], r"\((GLIBC(?:XX)?)_([0-9.]+)\)")
            glibc.update(v for k, v in symbols if k == "GLIBC")
            glibcxx.update(v for k, v in symbols if k == "GLIBCXX")
    files.sort(key=lambda f: f["path"])
    tarball = os.path.join(args.out, "prebuilt.tar.xz")
    doc = {
        "what": "binaries of scripts/gpu_check.sh built against ../shared/cuda-libtorch-kit (scripts/gpu_prebuild.sh)",
        "commit": args.commit,
        "tracked_changes_uncommitted": args.uncommitted,
        "built_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "build_dir": args.build_dir,
        # False with gpu_prebuild.sh --no-build: staged as the tree held them, maybe older than
        # their sources.
        "built_now": not args.not_built_now,
        "torch": args.torch,
        "cuda": args.cuda,
        # Compiled into the tests; gpu_check.sh sets INFILL_SOURCE_DIR and INFILL_SHARED_DIR.
        "source_dir_compiled": args.source_dir,
        "requires": {"glibc": max(glibc, key=_version_key, default=None),
                     "glibcxx": max(glibcxx, key=_version_key, default=None),
                     "python3_torch": f"{args.torch} with CUDA {args.cuda}",
                     "driver": "libcuda.so.1"},
        "targets_missing": args.missing,
        "libs_staged_from": dict(item.split("=", 1) for item in args.lib),
        "tarball": {"path": "prebuilt.tar.xz", "bytes": os.path.getsize(tarball)},
        "files": files,
    }
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    return 0


def check(args):
    with open(args.manifest) as f:
        m = json.load(f)
    import torch  # only here: the build machine needs no torch for the other commands

    here = torch.__version__.split("+")[0]
    cuda_here = torch.version.cuda or ""
    ok = here == m["torch"] and cuda_here.split(".")[0] == str(m["cuda"]).split(".")[0]
    print(json.dumps({"gpu_check": "prebuilt", "commit": m["commit"],
                      "tracked_changes_uncommitted": m["tracked_changes_uncommitted"],
                      "built_utc": m["built_utc"], "built_against": {"torch": m["torch"], "cuda": m["cuda"]},
                      "here": {"torch": torch.__version__, "cuda": cuda_here}, "requires": m["requires"],
                      "targets_missing": m["targets_missing"],
                      "built_now": m["built_now"], "ok": ok}), flush=True)
    if not ok:
        print(f"gpu_prebuilt: the binaries were built against torch {m['torch']} (CUDA {m['cuda']}); "
              f"python3's torch is {torch.__version__} (CUDA {cuda_here or 'none'})", file=sys.stderr)
    return 0 if ok else 1


def unpack(args):
    target = os.path.abspath(args.dir)
    if target in ("/", os.getcwd(), os.path.expanduser("~")):
        print(f"gpu_prebuilt: will not empty {target} to unpack into it", file=sys.stderr)
        return 2
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(args.dir)
    with tarfile.open(args.tarball) as t:
        try:
            t.extractall(args.dir, filter="data")
        except TypeError:  # a Python without extraction filters (before 3.12 and its backports)
            t.extractall(args.dir)
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("manifest")
    p.add_argument("stage")
    p.add_argument("out")
    for name in ("--torch", "--cuda", "--source-dir", "--commit", "--build-dir"):
        p.add_argument(name, required=True)
    p.add_argument("--uncommitted", action="store_true")
    p.add_argument("--missing", nargs="*", default=[])
    p.add_argument("--not-built-now", action="store_true")
    p.add_argument("--lib", nargs="*", default=[])
    p.set_defaults(run=manifest)
    p = sub.add_parser("check")
    p.add_argument("manifest")
    p.set_defaults(run=check)
    p = sub.add_parser("unpack")
    p.add_argument("tarball")
    p.add_argument("dir")
    p.set_defaults(run=unpack)
    args = parser.parse_args()
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
