#!/usr/bin/env bash
# Builds what scripts/gpu_check.sh runs, here, without a GPU, against the GPU machines' torch
# (pip's torch 2.11.0+cu130, through ../shared/cuda-libtorch-kit: its headers and link-only stub
# libraries), and stages it for `scripts/gpu_check.sh --prebuilt DIR` there, so that a GPU
# machine's few minutes go to running the checks rather than building them (issue 39 item 5).
#   1. makes what is missing: build/cuda-kit (the kit's make_kit.sh), .gpu-deps
#      (scripts/gpu_deps.sh) and build/gpu-kit (the gpu-core preset against both);
#   2. builds gpu_check's targets in build/gpu-kit one by one (a target that fails is left out
#      and named in the manifest), each under flock on $INFILL_BUILD_LOCK (default
#      /tmp/infill-build.lock) where flock exists, so builds sharing a tree take turns;
#   3. stages each built binary, stripped, and the libraries they need that a pip-torch machine
#      lacks (libpcre2-8 from .gpu-deps; libgomp as a fallback behind torch's own) into
#      DIR/prebuilt.tar.xz (bin/{tests,app,bench}/..., lib/), with DIR/manifest.json: commit,
#      torch and CUDA versions, each binary's size, sha256 and NEEDED libraries, the glibc and
#      libstdc++ versions they need (scripts/gpu_prebuilt.py writes and reads this bundle).
# The binaries are never run here: against the stubs they only link.
#
# Size: the eleven targets stripped come to about 28 MB, 6 MB as prebuilt.tar.xz (printed at the
# end). What travels to the GPU machine is this tree's tracked files (about 33 MB) plus
# DIR plus the shared data (scripts/gpu_deps.sh --shared ../shared --no-lora: about 23 MB in
# .gpu-shared); carry DIR and .gpu-shared (not .gpu-deps: prebuilt mode does not build).
#
# What the GPU machine must provide: x86-64 Linux with the C and C++ runtimes of this machine's
# compiler or newer (the manifest's "requires": today glibc >= 2.35 and libstdc++ with
# GLIBCXX_3.4.30, GCC 12's; Ubuntu 22.04 and later; libstdc++ is not staged, since torch's own
# libraries may need a newer one than ours), a python3 whose pip torch is 2.11.0 with CUDA 13
# (torch/lib holds libtorch*.so, libc10*.so and libgomp; pip's nvidia-* packages hold libcudart,
# cuBLAS, cuDNN, NCCL, found by torch's own RPATH), and the NVIDIA driver's libcuda.so.1.
# gpu_check.sh --prebuilt puts torch/lib, the nvidia packages' lib folders and DIR's lib/ on
# LD_LIBRARY_PATH (searched before the binaries' RUNPATH, which names this machine's build
# folders) and checks with ldd that nothing is missing before it runs.
#
# usage: scripts/gpu_prebuild.sh [--out DIR] [--build DIR] [--targets LIST] [--jobs N] [--no-build]
#   --out: where the staged files go (default .gpu-prebuilt, ignored by git)
#   --build: the build tree (default build/gpu-kit)
#   --targets: comma-separated (default every target gpu_check.sh runs)
#   --no-build: stage what the build tree holds now
set -Eeuo pipefail
trap 'echo "gpu_prebuild: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
cd "$(dirname "$0")/.."
out=.gpu-prebuilt
build=build/gpu-kit
kit=build/cuda-kit
targets=infill_tests_model,infill_tests_pipeline,infill_tests_serving,infill-model-check,bench_flux2,bench_row_attention,bench_loading,bench_adapters,bench_multi_device,bench_gpu_serving,bench_text
jobs=$(nproc)
do_build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --targets) targets="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --no-build) do_build=0; shift ;;
    -h|--help) sed -n '2,37p' "$0"; exit 0 ;;
    *) echo "gpu_prebuild: unknown option $1" >&2; exit 2 ;;
  esac
done
IFS=, read -r -a target_list <<<"$targets"

locked() {  # one build at a time in a tree others build in too
  if command -v flock >/dev/null; then flock "${INFILL_BUILD_LOCK:-/tmp/infill-build.lock}" "$@"; else "$@"; fi
}
# Caffe2's CMake probes for a GPU unless told the architectures (no CUDA code of ours uses them).
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" PATH="/usr/local/cuda/bin:$PATH"

failed_build=()
if [ $do_build -eq 1 ]; then
  if [ ! -f "$kit/lib/libtorch_cuda.so" ]; then
    bash ../shared/cuda-libtorch-kit/make_kit.sh "$kit"
  fi
  [ -f .gpu-deps/include/pcre2.h ] || bash scripts/gpu_deps.sh
  if [ ! -f "$build/CMakeCache.txt" ]; then
    # The kit first, or CMake finds Debian's CPU libtorch in /usr/lib.
    locked cmake --preset gpu-core -B "$build" \
      -DCMAKE_PREFIX_PATH="$PWD/$kit;$PWD/$kit/share/cmake;$PWD/.gpu-deps" >/dev/null
  fi
  # One target at a time, each under the lock: a target that fails to build is known by its own
  # exit code and left out (its binary in the tree is older than its sources), the others staged.
  log="$build/prebuild.log"
  : >"$log"
  for t in "${target_list[@]}"; do
    start=$(date +%s)
    if locked cmake --build "$build" -j "$jobs" --target "$t" -- -k 0 >>"$log" 2>&1; then
      echo "gpu_prebuild: built $t in $(( $(date +%s) - start )) s"
    else
      echo "gpu_prebuild: $t failed to build (log: $log)"; failed_build+=("$t")
    fi
  done
  [ ${#failed_build[@]} -eq 0 ] || grep -E -B2 -A12 "error:|FAILED:" "$log" | head -80 || true
  grep -E "warning:" "$log" | sort -u | head -20 || true
fi

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
built=()
missing=("${failed_build[@]}")
for t in "${target_list[@]}"; do
  [[ " ${failed_build[*]} " == *" $t "* ]] && continue
  path=""
  for sub in tests app bench; do
    if [ -x "$build/$sub/$t" ]; then path="$sub/$t"; break; fi
  done
  if [ -z "$path" ]; then missing+=("$t"); continue; fi
  mkdir -p "$stage/bin/$(dirname "$path")"
  strip --strip-unneeded -o "$stage/bin/$path" "$build/$path"
  built+=("$path")
done
[ ${#built[@]} -gt 0 ] || { echo "gpu_prebuild: nothing built in $build" >&2; exit 1; }

# Libraries a pip-torch GPU machine provides: torch/lib (libtorch*, libc10*, libgomp), pip's
# nvidia packages (CUDA 13's runtime and libraries), the driver (libcuda) and the C/C++ runtime.
provided='^(libtorch.*|libc10.*|libcaffe2_nvrtc\.so|libcuda\.so\.1|libcudart\.so\..*|libcublas.*|libcudnn.*|libnccl\.so\..*|libnvrtc.*|libcupti.*|libcusparse.*|libcufft.*|libcurand.*|libcusolver.*|libcufile.*|libnvshmem.*|libc\.so\.6|libm\.so\.6|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|ld-linux-x86-64\.so\.2|libstdc\+\+\.so\.6|libgcc_s\.so\.1)$'
needed_of() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
staged_libs=()
stage_lib() {  # stage_lib SONAME: from .gpu-deps/lib, else where this machine's loader finds it
  local name=$1 from=""
  if [ -e ".gpu-deps/lib/$name" ]; then from=".gpu-deps/lib/$name"
  # awk reads to the end: leaving early would break ldconfig's pipe (SIGPIPE under pipefail).
  else from=$(ldconfig -p | awk -v n="$name" '$1 == n && /x86-64/ && !found {found = $NF} END {print found}'); fi
  [ -n "$from" ] || { echo "gpu_prebuild: $name is needed and not found here" >&2; exit 1; }
  cp -L "$from" "$stage/lib/$name"
  strip --strip-unneeded "$stage/lib/$name"
  staged_libs+=("$name=$from")
}
declare -A seen=()
for path in "${built[@]}"; do
  while read -r lib; do
    [ -n "${seen[$lib]:-}" ] && continue
    seen[$lib]=1
    # libgomp: torch/lib holds one, searched first; this copy is the fallback should it not.
    if [[ "$lib" == libgomp.so.1 || ! "$lib" =~ $provided ]]; then stage_lib "$lib"; fi
  done < <(needed_of "$stage/bin/$path")
done

mkdir -p "$out"
rm -f "$out/prebuilt.tar.xz" "$out/manifest.json"
XZ_OPT="-6 -T${jobs}" tar -C "$stage" -cJf "$out/prebuilt.tar.xz" bin lib
torch_version=$(sed -n 's/^set(PACKAGE_VERSION "\(.*\)")/\1/p' "$kit/share/cmake/Torch/TorchConfigVersion.cmake" 2>/dev/null || true)
cuda_version=$(sed -n 's/^CUDA_VERSION:STRING=//p' "$build/CMakeCache.txt")
source_dir=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")
commit=$(git rev-parse HEAD)
manifest_args=(--torch "$torch_version" --cuda "$cuda_version" --source-dir "$source_dir" --commit "$commit"
               --build-dir "$build" --missing "${missing[@]}" --lib "${staged_libs[@]}")
git diff --quiet HEAD -- 2>/dev/null || manifest_args+=(--uncommitted)
[ $do_build -eq 1 ] || manifest_args+=(--not-built-now)
python3 scripts/gpu_prebuilt.py manifest "$stage" "$out" "${manifest_args[@]}"
echo "gpu_prebuild: staged ${#built[@]} binaries (${built[*]}) and lib/ (${staged_libs[*]:-none}) in $out:" \
  "$(du -sh --apparent-size "$stage" | cut -f1) stripped, $(du -sh --apparent-size "$out" | cut -f1) staged"
[ ${#missing[@]} -eq 0 ] || echo "gpu_prebuild: not built, left out: ${missing[*]}"
[ $do_build -eq 1 ] || echo "gpu_prebuild: staged as $build held them (--no-build): they may be older than their sources"
echo "gpu_prebuild: on the GPU machine: scripts/gpu_check.sh --prebuilt $out (carry $out and .gpu-shared)"
[ ${#missing[@]} -eq 0 ]
