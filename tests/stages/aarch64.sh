#!/bin/sh
# tests/stages/aarch64.sh: libxent for aarch64 (armv8-a baseline, the
# build Grace Hopper nodes would run), cross-built with Debian's
# gcc-aarch64-linux-gnu, and the library's own C tests (core, CPU
# cross-entropy against the long-double oracle, sampler, RL, readers) run
# under qemu-user: the same tests and bounds as on x86-64. Emulation is
# slow, so the tests run at their sanitizer sizes (XENT_SANITIZER=1) and,
# unless XENT_AARCH64_ALL=1, without the three longest sweeps; it runs
# under CI (CI=true) or XENT_AARCH64=1 and says why it skips otherwise.
# Under CI a missing cross compiler or qemu is a failure (.ci/setup-packages.txt
# installs them). Prints "N passed, N failed[, N skipped]" last.
BUILD=${BUILD:-build}
cd "$(dirname "$0")/../.." || exit 1
CROSS=${XENT_CROSS_CC:-aarch64-linux-gnu-gcc}
QEMU=${XENT_QEMU:-qemu-aarch64}
if [ "${CI:-}" != true ] && [ "${XENT_AARCH64:-0}" != 1 ]; then
    echo "aarch64: the cross build and qemu run take minutes here: set XENT_AARCH64=1 (CI does): skipped"
    echo "0 passed, 0 failed, 1 skipped"; exit 0
fi
for t in "$CROSS" "$QEMU"; do
    if ! command -v "$t" >/dev/null 2>&1; then
        echo "aarch64: $t not found (Debian: gcc-aarch64-linux-gnu qemu-user)"
        if [ "${CI:-}" = true ]; then echo "0 passed, 1 failed"; exit 1; fi
        echo "0 passed, 0 failed, 1 skipped"; exit 0
    fi
done
out=${BUILD%/cpu}/aarch64
log=$out.log
jobs=$(nproc 2>/dev/null || echo 2)
mkdir -p "$out/t"
if ! make --no-print-directory -j"$jobs" CC="$CROSS" NVCC= BUILD="$out" lib >"$log" 2>&1; then
    tail -n 20 "$log"; echo "aarch64: the cross build failed (log $log)"; echo "0 passed, 1 failed"; exit 1
fi
# the tests that use libxent alone (the tools' tests need OpenBLAS for aarch64)
objs=""
for f in main test_core test_ce test_ce_f64 test_sampler test_rl test_io; do
    if ! "$CROSS" -std=c11 -O2 -Wall -Wextra -Werror -ffp-contract=off -fno-fast-math \
            -march=armv8-a -Iinclude -Isrc -Itests -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE \
            -c "tests/$f.c" -o "$out/t/$f.o" >>"$log" 2>&1; then
        tail -n 20 "$log"; echo "0 passed, 1 failed"; exit 1
    fi
    objs="$objs $out/t/$f.o"
done
# shellcheck disable=SC2086
if ! "$CROSS" -o "$out/xent_tests" $objs "$out/libxent.a" -lm -lpthread >>"$log" 2>&1; then
    tail -n 20 "$log"; echo "0 passed, 1 failed"; exit 1
fi
file "$out/libxent.so" 2>/dev/null | sed 's/^/aarch64: /'
export QEMU_LD_PREFIX=${QEMU_LD_PREFIX:-/usr/aarch64-linux-gnu}
names=$("$QEMU" "$out/xent_tests" --list) || { echo "0 passed, 1 failed"; exit 1; }
if [ "${XENT_AARCH64_ALL:-0}" != 1 ]; then
    names=$(echo "$names" | grep -vxE 'ce_margins_all_dtypes|ce_options_vs_oracle|ce_batch_invariance_threads_positions')
fi
# shellcheck disable=SC2086
XENT_SANITIZER=1 "$QEMU" "$out/xent_tests" $names
