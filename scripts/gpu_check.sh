#!/usr/bin/env bash
# The GPU checks of the engine (issues 18, 19 and 39), on a machine with an NVIDIA GPU and a CUDA
# torch (pytorch.org's libtorch or a pip torch). Builds the engine core without OpenImageIO,
# ICU, Qt, GIMP and the service (the gpu-core preset, build/gpu-core), or with --prebuilt DIR
# takes the binaries scripts/gpu_prebuild.sh built on another machine against the same torch
# (DIR/prebuilt.tar.xz, unpacked into build/gpu-prebuilt: no compiler, no build minutes; the
# manifest's torch and CUDA versions must match python3's torch, and ldd must find every
# library), then runs
#   1. the [cuda] tests: FLUX.2 against the upstream reference tensors on the GPU (float32
#      and bf16), CPU equals CUDA, mask-aware equals full, packed equals alone, the device
#      K/V tier, row attention against matmul-softmax, edits through the worker;
#   2. infill-model-check --device cuda on the reference files (float32, then --bf16, then
#      --bf16 --fp8: the float8_weights option; then --fused-norms in float32 and bf16: the
#      fused_norm_kernels option) and on the LoRA reference files (float32) where they were
#      staged;
#   3. bench_row_attention --device cuda, bench_flux2 --device cuda at klein 4B sizes at 512x512
#      and 1024x1024 (2560 and 8704 tokens; with FP8 block weights and with the fused norm
#      kernels, each against libtorch's bf16 path in the same run),
#      bench_loading --device cuda (the bundled model
#      through the worker, its entry resident, streamed from disk under the load plan, read
#      whole first), bench_adapters --device cuda (LoRAs of rank 16 and 64 at klein 4B sizes,
#      bf16; reference tokens) and bench_multi_device --only nccl (the Ulysses forward at klein
#      4B sizes over NCCL on every GPU present, degree 1 through NCCL on a one-GPU machine) and
#      bench_gpu_serving --device cuda (the serving runtime at klein 4B sizes: live painting at
#      1024x1024, 1 to 16 live editors, continuous vs static and deadline vs FCFS batching, an
#      entry resident / pinned / on disk; issue 39's serving targets) and bench_text --device cuda
#      (the Qwen3-4B text encoder on the CPU and on the GPU: a new prompt's encoding) (JSON);
#   4. the peer: the upstream FLUX.2 transformer (SHARED/peers/flux2_upstream/time_full_step.py,
#      staged by scripts/gpu_deps.sh --shared; it stays outside the project) at the same sizes on
#      the same GPU, eager and with torch.compile, then one JSON line with our full and masked
#      steps as ratios to its full steps (scripts/flux2_peer_ratios.py).
# Tests find the shared data through $INFILL_SHARED_DIR and the source tree through
# $INFILL_SOURCE_DIR, which this script sets (--shared, this tree). The benchmarks' JSON is also
# written to the results folder, and every check's whole output (stdout and stderr) to
# RESULTS/logs/NAME.log: on the terminal each check shows its last lines and its exit code, so
# that a short tail of the run (what the device tool returns) still holds every check's outcome.
# With --budget S, a check that would start after S seconds is skipped and named as such, so the
# run ends with its summary before the machine's limit. Prints one summary JSON line last; exit
# 0 only when every check ran and passed. With --prebuilt, carry DIR and .gpu-shared to the GPU machine
# (scripts/gpu_prebuild.sh says how big they are).
#
# usage: scripts/gpu_check.sh [--prebuilt DIR] [--deps DIR] [--shared DIR] [--results DIR]
#                             [--skip-bench] [--benches LIST] [--budget SECONDS] [--tail N]
#   --prebuilt: run what scripts/gpu_prebuild.sh staged in DIR (e.g. .gpu-prebuilt), not a build
#   --deps: what scripts/gpu_deps.sh staged (default .gpu-deps; system packages otherwise)
#   --shared: the shared test data (default .gpu-shared, else ../shared)
#   --results: where the benchmarks' JSON goes (default build/gpu-check-results)
#   --benches: which benchmarks, comma-separated (default
#              row_attention,flux2,peer,loading,adapters,multi_device,serving_gpu,text; flux2
#              and peer together also print the ratios)
#   --budget: start no check after this many seconds of the run (default: no limit)
#   --tail: lines of each check's output shown on the terminal (default 12; the log has all)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
deps=.gpu-deps
shared=""
build=build/gpu-core
prebuilt=""
results=build/gpu-check-results
bench=1
benches=row_attention,flux2,peer,loading,adapters,multi_device,serving_gpu,text
budget=0
tail_lines=12
run_start=$(date +%s)
while [ $# -gt 0 ]; do
  case "$1" in
    --prebuilt) prebuilt="$2"; shift 2 ;;
    --deps) deps="$2"; shift 2 ;;
    --shared) shared="$2"; shift 2 ;;
    --results) results="$2"; shift 2 ;;
    --skip-bench) bench=0; shift ;;
    --benches) benches="$2"; shift 2 ;;
    --budget) budget="$2"; shift 2 ;;
    --tail) tail_lines="$2"; shift 2 ;;
    -h|--help) sed -n '2,49p' "$0"; exit 0 ;;
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
torch_lib=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')

failed=()
if [ -n "$prebuilt" ]; then
  # The binaries of scripts/gpu_prebuild.sh, built elsewhere against this torch's version.
  if [ ! -f "$prebuilt/manifest.json" ] || [ ! -f "$prebuilt/prebuilt.tar.xz" ]; then
    echo "gpu_check: $prebuilt holds no manifest.json and prebuilt.tar.xz (run scripts/gpu_prebuild.sh)" >&2; exit 2
  fi
  python3 scripts/gpu_prebuilt.py check "$prebuilt/manifest.json" || exit 2
  unpacked=$PWD/build/gpu-prebuilt
  python3 scripts/gpu_prebuilt.py unpack "$prebuilt/prebuilt.tar.xz" "$unpacked" || exit 2
  build=$unpacked/bin
  # torch/lib first (and pip's nvidia packages' lib folders, should a binary need one of them
  # itself): LD_LIBRARY_PATH precedes the binaries' RUNPATH, which names the build machine's
  # folders.
  nvidia_libs=$(python3 -c 'import glob, os, nvidia
print(":".join(sorted(d for p in nvidia.__path__ for d in glob.glob(os.path.join(p, "*", "lib")))))' 2>/dev/null || true)
  export LD_LIBRARY_PATH="$torch_lib${nvidia_libs:+:$nvidia_libs}:$unpacked/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  for f in "$build"/*/*; do
    unresolved=$(ldd "$f" 2>&1 | grep "not found")
    if [ -n "$unresolved" ]; then
      echo "gpu_check: $f: not found: $unresolved"; failed+=("prebuilt_libraries")
    fi
  done
  echo "gpu_check: prebuilt binaries from $prebuilt in $build"
else
  prefix="$torch_prefix"
  [ -d "$deps" ] && prefix="$prefix;$(cd "$deps" && pwd)"
  jobs=$(nproc)
  configure_log=$(mktemp)
  if ! cmake --preset gpu-core -DINFILL_SHARED_DIR="$shared" -DCMAKE_PREFIX_PATH="$prefix" >"$configure_log" 2>&1; then
    cat "$configure_log"; echo "gpu_check: configure failed" >&2; exit 1
  fi
  grep -E "Infill|CUDA|Torch" "$configure_log" | head -20
  targets=(infill_tests_model infill_tests_pipeline infill_tests_serving infill-model-check bench_flux2 bench_row_attention bench_loading
           bench_adapters bench_multi_device bench_gpu_serving bench_text)
  start=$(date +%s)
  # -k 0: every compile error of this libtorch at once; a target that fails to build fails its
  # checks below, the others still run.
  cmake --build "$build" -j "$jobs" --target "${targets[@]}" -- -k 0 >"$build/build.log" 2>&1
  build_rc=$?
  echo "gpu_check: build of ${targets[*]}: rc $build_rc in $(( $(date +%s) - start )) s"
  [ $build_rc -eq 0 ] || grep -E -B2 -A12 "error:|FAILED:" "$build/build.log" | head -150
  [ $build_rc -eq 0 ] || failed+=("build")
  build=$PWD/$build
  deps_lib=$(cd "$deps" 2>/dev/null && pwd)/lib
  export LD_LIBRARY_PATH="$torch_lib:$deps_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export INFILL_SHARED_DIR="$shared" INFILL_SOURCE_DIR="$PWD"
mkdir -p "$results/logs"
results=$(cd "$results" && pwd)

skipped=()
check() {  # check [--out FILE] NAME COMMAND...: runs it (its stdout into FILE too), reports its exit code
  local out=""
  if [ "$1" = --out ]; then out=$2; shift 2; fi
  local name=$1; shift
  if [ "$budget" -gt 0 ] && [ $(( $(date +%s) - run_start )) -ge "$budget" ]; then
    echo "gpu_check: $name: skipped, the run's budget of $budget s is spent"; skipped+=("$name"); return
  fi
  if [ ! -x "$1" ]; then echo "gpu_check: $name: $1 was not built"; failed+=("$name"); return; fi
  local t0 rc log="$results/logs/$name.log"
  t0=$(date +%s)
  # stdout (a benchmark's JSON) into FILE; both streams into the log.
  if [ -n "$out" ]; then
    : >"$log"
    "$@" 2>>"$log" | tee "$out" >>"$log"; rc=${PIPESTATUS[0]}
  else
    "$@" >"$log" 2>&1; rc=$?
  fi
  tail -n "$tail_lines" "$log" | sed "s/^/  $name| /"
  echo "gpu_check: $name: rc $rc in $(( $(date +%s) - t0 )) s (whole output: $log)"
  [ "$rc" -eq 0 ] || failed+=("$name")
}
check tests_model_cuda "$build/tests/infill_tests_model" "[cuda],[device]" -w NoTests
check tests_pipeline_cuda "$build/tests/infill_tests_pipeline" "[cuda]" -w NoTests
check tests_serving_cuda "$build/tests/infill_tests_serving" "[cuda]" -w NoTests
refs=("$shared/testdata/flux2/flux2_dit_klein.safetensors" "$shared/testdata/flux2/flux2_dit_dev.safetensors")
check model_check_float32 "$build/app/infill-model-check" --device cuda --blocks "${refs[@]}"
check model_check_bf16 "$build/app/infill-model-check" --device cuda --bf16 --blocks "${refs[@]}"
# The float8_weights option: FP8 block weights against the same upstream tensors.
check model_check_fp8 "$build/app/infill-model-check" --device cuda --bf16 --fp8 --blocks "${refs[@]}"
# The fused norm kernels (kernels/fused_norms.h) against the same tensors, in float32 and bf16.
check model_check_fused_float32 "$build/app/infill-model-check" --device cuda --fused-norms --blocks "${refs[@]}"
check model_check_fused_bf16 "$build/app/infill-model-check" --device cuda --bf16 --fused-norms --blocks "${refs[@]}"
# LoRAs applied on the GPU (each reference file names its LoRA files beside it).
lora_refs=()
for c in aitoolkit kohya diffusers stack; do
  [ -f "$shared/testdata/flux2_lora/flux2_lora_$c.safetensors" ] && lora_refs+=("$shared/testdata/flux2_lora/flux2_lora_$c.safetensors")
done
[ ${#lora_refs[@]} -gt 0 ] && check model_check_lora_float32 "$build/app/infill-model-check" --device cuda --blocks "${lora_refs[@]}"
wanted() { [ $bench -eq 1 ] && [[ ",$benches," == *",$1,"* ]]; }
wanted row_attention && check bench_row_attention_cuda "$build/bench/bench_row_attention" --device cuda
# klein 4B at 512x512 and 1024x1024: image, reference and 512 text tokens, as the peer counts them.
for grid in 32 64; do
  wanted flux2 && check --out "$results/bench_flux2_grid$grid.json" "bench_flux2_cuda_grid$grid" \
    "$build/bench/bench_flux2" --device cuda --grid $grid --repeats 10 --full-repeats 5
done
peer=$shared/peers/flux2_upstream/time_full_step.py
if wanted peer && [ ! -f "$peer" ]; then
  echo "gpu_check: peer: $peer is missing (scripts/gpu_deps.sh --shared ../shared stages it)"; failed+=("peer")
elif wanted peer; then
  python=$(command -v python3)
  check --out "$results/peer_eager.jsonl" peer_eager "$python" "$peer" --grids 32,64
  check --out "$results/peer_compile.jsonl" peer_compile "$python" "$peer" --grids 32,64 --compile
  wanted flux2 && check --out "$results/flux2_vs_peer.json" flux2_vs_peer "$python" scripts/flux2_peer_ratios.py \
    --ours "$results/bench_flux2_grid32.json" --ours "$results/bench_flux2_grid64.json" \
    --peer "$results/peer_eager.jsonl" --peer "$results/peer_compile.jsonl"
fi
# The cache folder on the build's disk (a tmpfs /tmp would not read a device); the bundled model
# of this tree (a prebuilt binary's compiled-in source tree may not exist here).
wanted loading && check bench_loading_cuda "$build/bench/bench_loading" --device cuda --repeats 7 \
  --model "$PWD/resources/models/infill-tiny-2" --dir "$build/bench-loading-cache"
wanted adapters && check bench_adapters_cuda "$build/bench/bench_adapters" --device cuda --repeats 10
wanted multi_device && check bench_multi_device_nccl "$build/bench/bench_multi_device" --only nccl --repeats 5
# After bench_flux2, whose klein 4B weights file it reuses; its disk tier on the build's disk.
wanted serving_gpu && check --out "$results/bench_gpu_serving.json" bench_gpu_serving_cuda \
  "$build/bench/bench_gpu_serving" --device cuda --dir "$build/bench-gpu-serving-cache"
# The Qwen3-4B text encoder (random bf16 weights, generated on the build's disk) on the CPU and
# on the GPU, where the engine puts it when it fits: a new prompt's encoding.
wanted text && check --out "$results/bench_text.json" bench_text_cuda "$build/bench/bench_text" --device cuda \
  --weights "$build/bench-qwen3-4b" --repeats 2
json_list() { local IFS=,; local names="$*"; [ -n "$names" ] && printf '"%s"' "${names//,/\",\"}"; }
printf '{"gpu_check":"summary","ok":%s,"seconds":%d,"failed":[%s],"skipped_for_budget":[%s],"logs":"%s"}\n' \
  "$([ ${#failed[@]} -eq 0 ] && [ ${#skipped[@]} -eq 0 ] && echo true || echo false)" \
  $(( $(date +%s) - run_start )) "$(json_list "${failed[@]}")" "$(json_list "${skipped[@]}")" "$results/logs"
[ ${#failed[@]} -eq 0 ] && [ ${#skipped[@]} -eq 0 ]
