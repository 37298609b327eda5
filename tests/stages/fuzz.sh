#!/bin/sh
# tests/stages/fuzz.sh: builds every libFuzzer target (make fuzz, mk/fuzz.mk)
# and runs each for a short fixed time from the generated seed corpora
# (scripts/make_fuzz_seeds.py): a crash, a sanitizer report, a leak, one
# input slower than 2 s (-timeout=2) or a process above 2 GB
# (-rss_limit_mb=2048, -malloc_limit_mb=2048) fails the target.
#   XENT_FUZZ_TIME   seconds per target (default 60 under CI=true, which has
#                    90 minutes; 4 elsewhere, a smoke run inside make test's 5)
#   XENT_FUZZ_JOBS   targets run at once (default 2)
# Longer, deliberate runs: make fuzz-run FUZZ_TIME=600.
# Skipped (with the reason) only when clang cannot build a fuzzer here; CI
# installs clang and its fuzzer runtime (.ci/setup-packages.txt).
# Prints "N passed, N failed" last.
BUILD=${BUILD:-build}
if [ "${CI:-}" = true ]; then T=${XENT_FUZZ_TIME:-60}; else T=${XENT_FUZZ_TIME:-4}; fi
JOBS=${XENT_FUZZ_JOBS:-2}
cd "$(dirname "$0")/../.." || exit 1
CC_FUZZ=${FUZZ_CC:-clang}
FD=$BUILD/fuzz

if ! command -v "$CC_FUZZ" >/dev/null 2>&1; then
    echo "fuzz: skipped: $CC_FUZZ is not installed (Debian: apt-get install clang libclang-rt-14-dev)"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
probe=$(mktemp -d)
printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' > "$probe/p.c"
if ! "$CC_FUZZ" -fsanitize=fuzzer,address -o "$probe/p" "$probe/p.c" >"$probe/log" 2>&1; then
    echo "fuzz: skipped: $CC_FUZZ cannot link -fsanitize=fuzzer (its runtime, e.g. libclang-rt-14-dev, is missing):"
    head -5 "$probe/log"
    rm -rf "$probe"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
rm -rf "$probe"

pass=0; fail=0
start=$(date +%s)
if ! make --no-print-directory -j"$JOBS" BUILD="$BUILD" FUZZ_CC="$CC_FUZZ" fuzz > "$FD.build.log" 2>&1; then
    echo "FAIL make fuzz"
    tail -30 "$FD.build.log"
    echo "0 passed, 1 failed"
    exit 1
fi
built=$(date +%s)
echo "fuzz: targets built in $((built - start)) s"
python3 scripts/make_fuzz_seeds.py "$FD/seeds" || { echo "FAIL seed generation"; echo "0 passed, 1 failed"; exit 1; }

targets=$(make --no-print-directory -s -f Makefile -f - fuzz-list <<'MK' 2>/dev/null
fuzz-list: ; @echo $(FUZZ_TARGETS)
MK
)
[ -n "$targets" ] || targets="safetensors npy gguf tokenizer hf_config compare cli"

# runs target $1; its verdict goes to $FD/stage_$1.rc
run_one() {
    t=$1
    work=$FD/stage_$t
    rm -rf "$work"; mkdir -p "$work/corpus"
    dict=""
    [ -f "tests/fuzz/$t.dict" ] && dict="-dict=tests/fuzz/$t.dict"
    "$FD/fuzz_$t" -max_total_time="$T" -timeout=2 -rss_limit_mb=2048 -malloc_limit_mb=2048 \
        -close_fd_mask=2 -print_final_stats=1 $dict -artifact_prefix="$work/" \
        "$work/corpus" "$FD/seeds/$t" > "$work/log" 2>&1
    echo $? > "$work.rc"
}

running=0
for t in $targets; do
    run_one "$t" &
    running=$((running + 1))
    if [ "$running" -ge "$JOBS" ]; then wait; running=0; fi
done
wait

for t in $targets; do
    work=$FD/stage_$t
    rc=$(cat "$work.rc" 2>/dev/null || echo 99)
    execs=$(grep -E 'stat::number_of_executed_units' "$work/log" | awk '{print $2}')
    if [ "$rc" -eq 0 ]; then
        pass=$((pass + 1)); echo "ok   fuzz_$t (${T} s, ${execs:-?} inputs)"
    else
        fail=$((fail + 1)); echo "FAIL fuzz_$t (exit $rc; artifacts in $work/)"
        grep -E 'ERROR|SUMMARY|==[0-9]+==|timeout|out-of-memory|leak' "$work/log" | head -15 | sed 's/^/     /'
        ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* 2>/dev/null | head -3 | sed 's/^/     /'
    fi
done
echo "fuzz: $(( $(date +%s) - start )) s in all"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
