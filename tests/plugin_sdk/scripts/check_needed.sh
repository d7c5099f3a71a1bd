#!/bin/sh
# libinfill_client depends on no libtorch, c10, Qt or engine library: only the C/C++ runtime.
set -eu
lib="$1"
needed=$(readelf -d "$lib" | awk '/\(NEEDED\)/ {print $5}' | tr -d '[]')
echo "NEEDED: $(echo $needed)"
if printf '%s\n' "$needed" | grep -Eiq 'torch|c10|qt|infill_(engine|server|serving|pipeline|model|cache|kernels)|gomp|oiio|OpenImageIO|boost'; then
  echo "libinfill_client must not depend on libtorch, c10, Qt, OpenImageIO, Boost libraries or the engine"
  exit 1
fi
readelf -d "$lib" | grep -q 'SONAME.*libinfill_client\.so\.' || { echo "no versioned SONAME"; exit 1; }
