#!/bin/sh
# Runs every test stage and ends with one line "N passed, N failed".
# Each stage prints its own "N passed, N failed" line last; this script adds
# them up. A stage that cannot run here says why and counts as skipped.
set -u
BUILD=${BUILD:-build}
total_pass=0; total_fail=0; total_skip=0
log=$(mktemp); trap 'rm -f "$log"' EXIT

stage() { # name, command...
    name=$1; shift
    echo "== $name: $*"
    t0=$(date +%s)
    "$@" 2>&1 | tee "$log"
    rc=$?
    echo "== $name: $(( $(date +%s) - t0 )) s"
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    if [ -z "$line" ]; then
        echo "== $name: no summary line (exit $rc): counted as 1 failure"
        total_fail=$((total_fail + 1)); return
    fi
    p=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')
    f=$(echo "$line" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/')
    s=$(echo "$line" | sed -nE 's/.*, ([0-9]+) skipped.*/\1/p'); s=${s:-0}
    total_pass=$((total_pass + p)); total_fail=$((total_fail + f)); total_skip=$((total_skip + s))
}

stage "C tests" "$BUILD/xent_tests"
for s in tests/stages/*.sh; do
    [ -f "$s" ] || continue
    stage "$(basename "$s" .sh)" sh "$s"
done
if [ "${XENT_SKIP_ASAN:-0}" = 1 ]; then
    echo "== sanitizer tests: skipped (XENT_SKIP_ASAN=1)"
else
    stage "sanitizer (ASan+UBSan) tests" make --no-print-directory test-asan
fi
echo "all stages: $total_pass passed, $total_fail failed, $total_skip skipped"
echo "$total_pass passed, $total_fail failed, $total_skip skipped"
[ "$total_fail" -eq 0 ]
