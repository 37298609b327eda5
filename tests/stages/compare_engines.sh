#!/bin/sh
# tests/stages/compare_engines.sh: the three-engine run of docs/compare.md
# ("Three engines") at CI size: SmolLM2-135M (the GGUF of `make model`) on
# the first 256 tokens of the GPL-3 text, through transformers fp32 / bf16 /
# fp64 (python -m xent.dump hf's code) and xent's own model (xent audit fp32
# and bf16), every pair through `xent compare`; scripts/compare_engines.py
# prints the tables and one ok/FAIL line per sanity bound.
# Skips, with the reason, where torch, transformers, gguf or accelerate is
# missing (a failure under CI=true: .ci/setup-pip.txt installs them) or the
# model has not been fetched (`make model`; CI fetches it first).
# Last line: "N passed, N failed, N skipped". About 40 s on 2 cores.
set -u
BUILD=${BUILD:-build}
PY=${PYTHON:-python3}
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
MODEL=${XENT_MODEL_GGUF:-${XENT_CACHE:-$HOME/.cache/xent}/SmolLM2-135M-Instruct.Q4_1.gguf}
TEXT=${COMPARE_TEXT:-/usr/share/common-licenses/GPL-3}

skip() {
    echo "compare_engines: skipped: $1"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
}
if ! "$PY" -c "import torch, transformers, gguf, accelerate, numpy" 2>/dev/null; then
    why=$("$PY" -c "import torch, transformers, gguf, accelerate, numpy" 2>&1 | tail -n 1)
    if [ "${CI:-}" = true ]; then
        echo "FAIL compare_engines: transformers cannot load the GGUF here ($why); CI installs torch, transformers, gguf and accelerate (.ci/setup-pip.txt)"
        echo "0 passed, 1 failed"
        exit 1
    fi
    skip "transformers' GGUF loading needs torch, transformers, gguf and accelerate ($why)"
fi
[ -f "$MODEL" ] || skip "$MODEL is missing (make model)"
[ -f "$TEXT" ] || skip "$TEXT is missing (set COMPARE_TEXT)"
[ -x "$BUILD/xent" ] && [ -f "$BUILD/libxent.so" ] || skip "$BUILD/xent or $BUILD/libxent.so is not built"

out=$(mktemp -d); log=$(mktemp)
trap 'rm -rf "$out" "$log"' EXIT
case "$BUILD" in /*) lib=$BUILD/libxent.so ;; *) lib=$root/$BUILD/libxent.so ;; esac
XENT_LIBRARY=$lib "$PY" scripts/compare_engines.py --build "$BUILD" \
    --model "$MODEL" --text "$TEXT" --tokens 256 --seq-len 256 \
    --out-dir "$out" --check > "$log" 2> "$out/stderr"
rc=$?
cat "$log"
pass=$(grep -c '^ok ' "$log")
fail=$(grep -c '^FAIL ' "$log")
if [ "$rc" -ne 0 ] && [ "$fail" -eq 0 ]; then
    echo "FAIL scripts/compare_engines.py exited $rc:"
    grep -v 'it/s' "$out/stderr" | tail -n 20 | sed 's/^/     /'
    fail=1
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
