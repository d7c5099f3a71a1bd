#!/bin/sh
# Installs the SDK components into a fresh prefix, then builds host programs against it with
# find_package(infill_client) and with pkg-config, and runs them.
set -eu
build="$1"; consumer="$2"; work="$3"
rm -rf "$work"; mkdir -p "$work"
prefix="$work/prefix"
cmake --install "$build" --prefix "$prefix" --component sdk
cmake --install "$build" --prefix "$prefix" --component sdk_dev
libdir=$(dirname "$(find "$prefix" -name 'libinfill_client.so.1' | head -1)")
test -f "$prefix/include/infill/infill_client.h"
test -f "$prefix/include/infill/infill_client.hpp"
test -f "$libdir/pkgconfig/infill_client.pc"
test -f "$libdir/cmake/infill_client/infill_clientConfig.cmake"
test -f "$libdir/cmake/infill_client/infill_clientConfigVersion.cmake"
test -L "$libdir/libinfill_client.so"

cmake -S "$consumer" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release > "$work/cmake.log"
cmake --build "$work/cmake" > "$work/build.log"
LD_LIBRARY_PATH="$libdir" "$work/cmake/consumer_c"
LD_LIBRARY_PATH="$libdir" "$work/cmake/consumer_cxx"

# pkg-config: the .pc file is relocatable (its prefix is relative to where it lies).
PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --exists --print-errors infill_client
flags=$(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --cflags --libs infill_client)
echo "pkg-config: $flags"
cc -std=c99 -Wall -Werror -pedantic "$consumer/consumer.c" $flags -o "$work/consumer_pc"
LD_LIBRARY_PATH="$libdir" "$work/consumer_pc"
echo "install ok"
