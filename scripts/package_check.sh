#!/usr/bin/env bash
# Builds the DEB packages from a built tree, installs them (dpkg + apt for dependencies), checks
# the installed files work, removes them and verifies nothing of ours is left behind.
# Needs root (or sudo). Usage: scripts/package_check.sh [build dir, default build/ci]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build/ci}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive

step() { echo "package_check: $*"; }

rm -rf "$build/packages"
(cd "$build" && cpack -G DEB >/dev/null)
mapfile -t debs < <(ls "$build"/packages/*.deb)
[ ${#debs[@]} -gt 0 ] || { echo "package_check: no packages were built" >&2; exit 1; }
names=()
for deb in "${debs[@]}"; do
  names+=("$(dpkg-deb -f "$deb" Package)")
  step "built $(basename "$deb"): $(dpkg-deb -f "$deb" Depends)"
done

step "installing ${names[*]}"
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "$(realpath "${debs[0]}")" \
  $(for d in "${debs[@]:1}"; do realpath "$d"; done) >/dev/null
# Every file the packages installed, to check the removal against.
installed=$(mktemp)
for n in "${names[@]}"; do dpkg -L "$n"; done | sort -u > "$installed"

work=$(mktemp -d)
engine_pid=""
cleanup() {
  [ -n "$engine_pid" ] && kill "$engine_pid" 2>/dev/null || true
  rm -rf "$work" "$installed"
}
trap cleanup EXIT

step "infill-render-slurm finds its infill-render and checks its input"
/usr/bin/infill-render-slurm --help | grep -q 'as one job array'
{ /usr/bin/infill-render-slurm "$work/no-job.json" 2>&1 || true; } | grep -q "job file $work/no-job.json does not exist"

step "infill-engine --check"
/usr/bin/infill-engine --check --journal off | tee "$work/check.json" | grep -q '"ok": true'
grep -q '/usr/share/infill/models/infill-tiny-2' "$work/check.json"

step "infill-model-check answers and names what it cannot load"
/usr/bin/infill-model-check --help | grep -q -- '--folder'
{ /usr/bin/infill-model-check --folder "$work/no-model" || true; } | grep -q '"ok":false'
step "infill-tokenize names the tokenizer folder it cannot read"
{ /usr/bin/infill-tokenize "$work/no-tokenizer" </dev/null 2>&1 || true; } | grep -q 'no-tokenizer'

step "systemd-analyze verify the user units (socket and service)"
systemd-analyze verify /usr/lib/systemd/user/infill-engine.socket /usr/lib/systemd/user/infill-engine.service
for link in default.target.wants/infill-engine.service sockets.target.wants/infill-engine.socket; do
  [ -L "/etc/systemd/user/$link" ] || {
    echo "package_check: $link was not enabled globally" >&2
    exit 1
  }
done

if dpkg -s infill >/dev/null 2>&1; then
  step "appstreamcli validate, desktop-file-validate"
  appstreamcli validate --no-net /usr/share/metainfo/io.github.infill.Infill.metainfo.xml
  desktop-file-validate /usr/share/applications/infill.desktop
  [ -f /usr/share/icons/hicolor/48x48/apps/infill.png ] && [ -f /usr/share/icons/hicolor/scalable/apps/infill.svg ]
  /usr/bin/infill --version
fi

step "infill-render on the installed sample job"
mkdir -p "$work/share/jobs" "$work/share/templates"
cp /usr/share/infill/jobs/sample.json "$work/share/jobs/"
cp /usr/share/infill/templates/sample.png /usr/share/infill/templates/sample_mask.png "$work/share/templates/"
(cd "$work" && /usr/bin/infill-render share/jobs/sample.json) | tee "$work/render.log"
grep -q '^Saved: ' "$work/render.log"

if dpkg -s libinfill-dev >/dev/null 2>&1; then
  step "an external C program against the installed SDK (pkg-config infill_client)"
  cc -std=c99 -Wall -Werror $(pkg-config --cflags infill_client) \
    /usr/share/doc/infill_client/examples/infill_edit.c -o "$work/infill_edit" $(pkg-config --libs infill_client)
  ! ldd "$work/infill_edit" | grep -E 'torch|Qt' >/dev/null
  /usr/bin/infill-engine --socket "$work/run/engine.sock" --journal off --no-calibrate --threads 1 \
    2> "$work/engine.log" &
  engine_pid=$!
  for _ in $(seq 1 200); do [ -S "$work/run/engine.sock" ] && break; sleep 0.1; done
  (cd "$work" && ./infill_edit -e "unix:$work/run/engine.sock" -w 60 -s 4 \
    share/templates/sample.png share/templates/sample_mask.png "$work/edited.png")
  [ -s "$work/edited.png" ]
  kill -TERM "$engine_pid"
  wait "$engine_pid" || true
  engine_pid=""
fi

if dpkg -s infill-krita >/dev/null 2>&1; then
  step "the Krita plug-in where Krita looks for it, and its zip for Krita's importer"
  [ -f /usr/share/krita/pykrita/infill_krita.desktop ]
  for f in __init__ docker layer_io repaint infill_client; do
    python3 -c "import ast, sys; ast.parse(open(sys.argv[1]).read(), sys.argv[1])" "/usr/share/krita/pykrita/infill_krita/$f.py"
  done
  zip=$(ls "$build"/plugin_sdk/krita/infill-krita-*.zip)
  python3 - "$zip" <<'PY'
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
need = {"infill_krita.desktop", "infill_krita/__init__.py", "infill_krita/infill_client.py", "infill_krita/docker.py"}
missing = need - names
sys.exit(f"{sys.argv[1]} lacks {sorted(missing)}" if missing else 0)
PY
fi

step "removing ${names[*]}"
"${sudo_cmd[@]}" apt-get purge -y -q "${names[@]}" >/dev/null
left=0
while read -r path; do
  # Directories shared with other packages (/usr, /usr/share, ...) stay; our files must not.
  if [ -e "$path" ] && [ ! -d "$path" ]; then
    echo "package_check: left behind: $path" >&2
    left=1
  fi
done < "$installed"
for path in /usr/share/infill /usr/lib/infill /etc/systemd/user/default.target.wants/infill-engine.service \
  /etc/systemd/user/sockets.target.wants/infill-engine.socket /usr/include/infill; do
  if [ -e "$path" ] || [ -L "$path" ]; then
    echo "package_check: left behind: $path" >&2
    left=1
  fi
done
[ "$left" -eq 0 ]
step "ok: built, installed, checked and removed ${#names[@]} packages"
