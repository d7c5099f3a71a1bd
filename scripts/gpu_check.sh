#!/usr/bin/env bash
# The GPU checks of the engine (issues 18 and 19), on a machine with an NVIDIA GPU and a CUDA
# torch (pytorch.org's libtorch or a pip torch): builds the engine core without OpenImageIO,
# ICU, Qt, GIMP and the service (the gpu-core preset, build/gpu-core), then
#   1. the [cuda] tests: FLUX.2 against the upstream reference tensors on the GPU (float32
#      and bf16), CPU equals CUDA, mask-aware equals full, packed equals alone, the device
#      K/V tier, row attention against matmul-softmax, edits through the worker;
#   2. infill-model-check --device cuda on the reference files (float32, then --bf16) and on
#      the LoRA reference files (float32);
#   3. bench_row_attention --device cuda, bench_flux2 --device cuda at klein 4B sizes,
#      bench_loading --device cuda (the bundled model through the worker, its entry resident,
#      streamed from disk under the load plan, read whole first) and bench_adapters --device
#      cuda (LoRAs of rank 16 and 64 at klein 4B sizes, bf16; reference tokens) and
#      bench_multi_device --only nccl (the Ulysses forward at klein 4B sizes over NCCL on every
#      GPU present, degree 1 through NCCL on a one-GPU machine) (JSON).
# Prints each result and one summary JSON line last; exit 0 only when every check passed.
#
# usage: scripts/gpu_check.sh [--deps DIR] [--shared DIR] [--skip-bench] [--benches LIST]
#   --deps: what scripts/gpu_deps.sh staged (default .gpu-deps; system packages otherwise)
#   --shared: the shared test data (default .gpu-shared, else ../shared)
#   --benches: which benchmarks, comma-separated (default row_attention,flux2,loading,adapters,multi_device)
set -uo pipefail
cd "$(dirname "$0")/.."
deps=.gpu-deps
shared=""
build=build/gpu-core
bench=1
benches=row_attention,flux2,loading,adapters,multi_device
while [ $# -gt 0 ]; do
  case "$1" in
    --deps) deps="$2"; shift 2 ;;
    --shared) shared="$2"; shift 2 ;;
    --skip-bench) bench=0; shift ;;
    --benches) benches="$2"; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown option $1" >&2; exit 2 ;;
  esac
done
if [ -z "$shared" ]; then
  if [ -d .gpu-shared ]; then shared=$PWD/.gpu-shared; else shared=$(cd .. && pwd)/shared; fi
fi
shared=$(cd "$shared" 2>/dev/null && pwd || echo "$shared")

export PATH="/usr/local/cuda/bin:$PATH"  # nvcc for CMake's CUDA toolkit search
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null) || {
  echo "gpu_check: python3 cannot import torch; a CUDA torch is needed" >&2; exit 2; }
python3 - <<'PY' || exit 2
import json, torch
info = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu_available": torch.cuda.is_available()}
if torch.cuda.is_available():
    info["gpu"] = torch.cuda.get_device_name(0)
print(json.dumps({"gpu_check": "torch", **info}))
raise SystemExit(0 if torch.cuda.is_available() else 1)
PY
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu_check: nvidia-smi: /'

prefix="$torch_prefix"
[ -d "$deps" ] && prefix="$prefix;$(cd "$deps" && pwd)"
jobs=$(nproc)
configure_log=$(mktemp)
if ! cmake --preset gpu-core -DINFILL_SHARED_DIR="$shared" -DCMAKE_PREFIX_PATH="$prefix" >"$configure_log" 2>&1; then
  cat "$configure_log"; echo "gpu_check: configure failed" >&2; exit 1
fi
grep -E "Infill|CUDA|Torch" "$configure_log" | head -20
targets=(infill_tests_model infill_tests_pipeline infill_tests_serving infill-model-check bench_flux2 bench_row_attention bench_loading
         bench_adapters bench_multi_device)
start=$(date +%s)
# -k 0: every compile error of this libtorch at once; a target that fails to build fails its
# checks below, the others still run.
set -o pipefail
cmake --build "$build" -j "$jobs" --target "${targets[@]}" -- -k 0 >"$build/build.log" 2>&1
build_rc=$?
set +o pipefail
echo "gpu_check: build of ${targets[*]}: rc $build_rc in $(( $(date +%s) - start )) s"
[ $build_rc -eq 0 ] || grep -E -B2 -A12 "error:|FAILED:" "$build/build.log" | head -150

failed=()
[ $build_rc -eq 0 ] || failed+=("build")
check() {  # check NAME COMMAND...: runs it, reports its exit code
  local name=$1; shift
  if [ ! -x "$1" ]; then echo "gpu_check: $name: $1 was not built"; failed+=("$name"); return; fi
  local t0=$(date +%s)
  "$@"
  local rc=$?
  echo "gpu_check: $name: rc $rc in $(( $(date +%s) - t0 )) s"
  [ $rc -eq 0 ] || failed+=("$name")
}
export LD_LIBRARY_PATH="$(cd "$deps" 2>/dev/null && pwd)/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
check tests_model_cuda "$build/tests/infill_tests_model" "[cuda],[device]" -w NoTests
check tests_pipeline_cuda "$build/tests/infill_tests_pipeline" "[cuda]" -w NoTests
check tests_serving_cuda "$build/tests/infill_tests_serving" "[cuda]" -w NoTests
refs=("$shared/testdata/flux2/flux2_dit_klein.safetensors" "$shared/testdata/flux2/flux2_dit_dev.safetensors")
check model_check_float32 "$build/app/infill-model-check" --device cuda --blocks "${refs[@]}"
check model_check_bf16 "$build/app/infill-model-check" --device cuda --bf16 --blocks "${refs[@]}"
# LoRAs applied on the GPU (each reference file names its LoRA files beside it).
lora_refs=()
for c in aitoolkit kohya diffusers stack; do
  [ -f "$shared/testdata/flux2_lora/flux2_lora_$c.safetensors" ] && lora_refs+=("$shared/testdata/flux2_lora/flux2_lora_$c.safetensors")
done
[ ${#lora_refs[@]} -gt 0 ] && check model_check_lora_float32 "$build/app/infill-model-check" --device cuda --blocks "${lora_refs[@]}"
wanted() { [ $bench -eq 1 ] && [[ ",$benches," == *",$1,"* ]]; }
wanted row_attention && check bench_row_attention_cuda "$build/bench/bench_row_attention" --device cuda
wanted flux2 && check bench_flux2_cuda "$build/bench/bench_flux2" --device cuda --repeats 10 --full-repeats 5
# The cache folder on the build's disk (a tmpfs /tmp would not read a device).
wanted loading && check bench_loading_cuda "$build/bench/bench_loading" --device cuda --repeats 7 --dir "$PWD/$build/bench-loading-cache"
wanted adapters && check bench_adapters_cuda "$build/bench/bench_adapters" --device cuda --repeats 10
wanted multi_device && check bench_multi_device_nccl "$build/bench/bench_multi_device" --only nccl --repeats 5
if [ ${#failed[@]} -eq 0 ]; then
  echo '{"gpu_check":"summary","ok":true}'
else
  printf '{"gpu_check":"summary","ok":false,"failed":["%s"]}\n' "$(IFS=,; echo "${failed[*]}" | sed 's/,/","/g')"
  exit 1
fi
