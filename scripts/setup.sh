#!/usr/bin/env bash
# Installs every Debian package the build, the tests and the benchmarks need. Idempotent:
# when everything is present it changes nothing and needs no network.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev
  libgloo-dev           # headers of the Gloo libtorch carries: c10d process groups among CPU devices
  libopenblas0-openmp   # without it libtorch falls back to reference BLAS (~25x slower)
  libopenimageio-dev
  libgs-common          # a real ICC profile (ghostscript's srgb.icc) for the bit-depth tests
  libboost-dev
  catch2
  nlohmann-json3-dev
  libsqlite3-dev        # the engine's journal of accepted batch edits
  libpcre2-dev libicu-dev  # the tokenizer: Unicode pre-tokenizer regex, NFC
  zlib1g-dev            # CRCs of the PNG text chunks infill-render stamps the job hash in
  libsystemd-dev        # socket activation of infill-engine (sd_listen_fds)
  prometheus            # promtool: the tests check GET /metrics with Prometheus's own parser
  stress-ng             # scripts/soak.sh: the suite under full CPU load
  # Packaging (installer/, scripts/package_check.sh): icons rendered from SVG, metadata checks.
  librsvg2-bin desktop-file-utils appstream systemd
  # Training data of the bundled model (infill-train, bench_model_quality): wallpapers and
  # photos with their licences in /usr/share/doc/<package>/copyright.
  gnome-backgrounds mate-backgrounds plasma-workspace-wallpapers
  # Photos never used for training, which bench_model_quality also edits (CC BY-SA 3.0).
  ukui-wallpapers
  # infill-render-slurm's test: a one-node Slurm cluster with its own MUNGE key.
  slurm-wlm munge
  # The GIMP 2.10 plug-in (plugin_sdk/gimp/) and its batch-mode test.
  libgimp2.0-dev libtiff-dev gimp
  # The Krita 5 plug-in (plugin_sdk/krita/) and its headless test (kritarunner, PyQt5).
  krita python3-pyqt5
  # The Qt 6 editor (ui/) and its screenshot test under a virtual X server.
  qt6-base-dev xvfb xauth
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -q
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi

# libtorch must pick OpenBLAS (OpenMP build), not the reference BLAS.
blas=$(update-alternatives --query libblas.so.3-x86_64-linux-gnu 2>/dev/null | awk '/^Value:/ {print $2}')
case "$blas" in
  *openblas*) ;;
  *) echo "setup: warning: libblas.so.3 points to '${blas:-nothing}', not OpenBLAS" >&2 ;;
esac

# Upstream references run by the tests (npm, each pinned by its package-lock.json): the
# tokenizers of tests/reference/tokenizer and the OpenAPI validator of tests/reference/openapi.
# A reference that cannot be installed makes its test skip, not fail.
for name in tokenizer openapi; do
  reference="$(dirname "$0")/../tests/reference/$name"
  if ! command -v npm >/dev/null 2>&1; then
    echo "setup: warning: npm is missing; the $name reference test will be skipped" >&2
  elif [ ! -f "$reference/node_modules/.package-lock.json" ]; then
    (cd "$reference" && npm ci --no-audit --no-fund --loglevel=error) ||
      echo "setup: warning: npm ci in $reference failed; the $name reference test will be skipped" >&2
  fi
done
