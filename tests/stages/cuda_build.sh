#!/bin/sh
# tests/stages/cuda_build.sh: on a machine with nvcc but no GPU, where
# `make test` builds and tests the CPU-only library, this stage compiles the
# CUDA library (`make lib` in build/, the kernels of src/cuda and the
# experiments of dev/) and checks its exported symbols (layers.sh), so that
# a change that breaks the CUDA code fails here too. It takes minutes on two
# cores, so it runs under CI (CI=true) or XENT_CUDA_BUILD=1, and says why it
# skips otherwise. With a GPU the CUDA library is the one under test, built
# by `make test` itself, and this stage has nothing to add.
# Prints "N passed, N failed[, N skipped]" last.
BUILD=${BUILD:-build}
cd "$(dirname "$0")/../.." || exit 1
if ! command -v nvcc >/dev/null 2>&1; then
    echo "cuda build: nvcc not found: skipped"; echo "0 passed, 0 failed, 1 skipped"; exit 0
fi
case "$BUILD" in
*/cpu) ;;
*) echo "cuda build: $BUILD is the build under test (with CUDA): nothing to add"
   echo "0 passed, 0 failed, 1 skipped"; exit 0 ;;
esac
if [ "${CI:-}" != true ] && [ "${XENT_CUDA_BUILD:-0}" != 1 ]; then
    echo "cuda build: compiling the CUDA kernels takes minutes here: set XENT_CUDA_BUILD=1 (CI does): skipped"
    echo "0 passed, 0 failed, 1 skipped"; exit 0
fi
out=${BUILD%/cpu}
pass=0; fail=0
mkdir -p "$out"
jobs=$(nproc 2>/dev/null || echo 2)
if make --no-print-directory -j"$jobs" BUILD="$out" lib tools-lib dev > "$out/cuda_build.log" 2>&1; then
    pass=$((pass + 1)); echo "ok   the CUDA library and dev/ compile ($out/libxent.so)"
    ls -l "$out/libxent.so" | awk '{print "     size " $5 " bytes"}'
    if BUILD="$out" sh tests/stages/layers.sh > "$out/cuda_layers.log" 2>&1; then
        pass=$((pass + 1)); echo "ok   the CUDA library exports only the public API"
    else
        fail=$((fail + 1)); echo "FAIL the CUDA library's layers:"; grep FAIL -A5 "$out/cuda_layers.log"
    fi
else
    fail=$((fail + 1)); echo "FAIL the CUDA build:"; grep -E "error|Error" "$out/cuda_build.log" | head -20
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
