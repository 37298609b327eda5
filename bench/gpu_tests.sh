#!/bin/sh
# Builds the whole tree with CUDA and runs the GPU tests: the C tests whose
# names start with the given filters (default: every CUDA test and the CPU
# goldens they are checked against), then the GPU stage (compute-sanitizer
# memcheck and racecheck; SANITIZE=0 skips it). For GPU machines without
# Debian's libopenblas-dev: OPENBLAS=DIR names a folder holding the
# package's files (DIR/usr/include/..., DIR/usr/lib/x86_64-linux-gnu/...).
#   BUILD=build-gpu TESTS="cuda_ core_cuda ce_golden ce_shards" sh bench/gpu_tests.sh
set -u
BUILD=${BUILD:-build-gpu}
if [ -n "${OPENBLAS:-}" ]; then
    inc=$(dirname "$(find "$OPENBLAS" -name cblas.h | head -n 1)")
    lib=$(dirname "$(find "$OPENBLAS" -name 'libopenblas.so' | head -n 1)")
    export CPATH="$inc${CPATH:+:$CPATH}"
    export LIBRARY_PATH="$lib:$(dirname "$lib")${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export LD_LIBRARY_PATH="$LIBRARY_PATH"
fi
log=${OUT:-/tmp}/gpu_build.log
make -j"$(nproc)" BUILD="$BUILD" all tests >"$log" 2>&1 \
    || { tail -n 30 "$log"; exit 1; }
# shellcheck disable=SC2086
"$BUILD/xent_tests" ${TESTS:-cuda_ core_cuda ce_golden ce_shards} || exit 1
[ "${SANITIZE:-1}" = 0 ] || BUILD="$BUILD" sh tests/stages/gpu.sh
