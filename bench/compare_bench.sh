#!/bin/sh
# bench/compare_bench.sh: times `xent compare` on N per-token log-probs
# (default 10 million) read from .npy files: A and B (f32), a reference
# (f32), sequence offsets (i64, sequences of 1..2000 tokens). Target: under
# 3 s for 10^7 tokens on a 2-core machine, for A vs B with boundaries.
#
# usage: sh bench/compare_bench.sh [N] [WORKDIR]
#   N        tokens                               (default: 10000000)
#   WORKDIR  where the generated files are kept   (default: a fresh mktemp -d)
# Needs build/xent (make -j2 all) and a C compiler for the tiny generator.
set -eu
N=${1:-10000000}
DIR=${2:-$(mktemp -d)}
XENT=${XENT:-build/xent}
CC=${CC:-cc}
[ -x "$XENT" ] || { echo "compare_bench: $XENT not built (make -j2 all)"; exit 1; }
mkdir -p "$DIR"

# A tiny generator: writes a.npy, b.npy, r.npy (<f4) and off.npy (<i8).
cat > "$DIR/gen.c" <<'EOF'
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static uint64_t s = 0x243F6A8885A308D3ull;
static double u01(void) { /* xorshift64*, [0, 1) */
    s ^= s >> 12; s ^= s << 25; s ^= s >> 27;
    return (double)((s * 2685821657736338717ull) >> 11) * 0x1p-53;
}
static double gauss(void) { return sqrt(-2 * log(1 - u01())) * cos(6.283185307179586 * u01()); }
static void npy(const char *dir, const char *name, const char *descr, const void *p,
                size_t esize, int64_t n) {
    char path[4096], hdr[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int h = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (%lld,), }",
                     descr, (long long)n);
    int total = 10 + h + 1, pad = (64 - total % 64) % 64;
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(1); }
    uint16_t hl = (uint16_t)(h + pad + 1);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fputc(hl & 0xFF, f); fputc(hl >> 8, f);
    fwrite(hdr, 1, (size_t)h, f);
    for (int i = 0; i < pad; i++) fputc(' ', f);
    fputc('\n', f);
    fwrite(p, esize, (size_t)n, f);
    if (fclose(f)) { perror(path); exit(1); }
}
int main(int argc, char **argv) {
    int64_t n = atoll(argv[1]);
    float *a = malloc(n * 4), *b = malloc(n * 4), *r = malloc(n * 4);
    int64_t *off = malloc((n + 1) * 8), ns = 0;
    for (int64_t i = 0; i < n; i++) {
        double ref = -8 * pow(u01(), 3);            /* many confident tokens */
        double common = 0.02 * gauss();
        r[i] = (float)ref;
        a[i] = (float)fmin(ref + common + 0.01 * gauss(), -1e-6);
        b[i] = (float)fmin(ref + common + 0.01 * gauss(), -1e-6);
    }
    for (int64_t p = 0; p < n; p += 1 + (int64_t)(u01() * 2000)) off[ns++] = p;
    off[ns++] = n;
    npy(argv[2], "a.npy", "<f4", a, 4, n);
    npy(argv[2], "b.npy", "<f4", b, 4, n);
    npy(argv[2], "r.npy", "<f4", r, 4, n);
    npy(argv[2], "off.npy", "<i8", off, 8, ns);
    return 0;
}
EOF
$CC -O2 -o "$DIR/gen" "$DIR/gen.c" -lm
if [ ! -f "$DIR/a.npy" ] || [ "$(cat "$DIR/n" 2>/dev/null)" != "$N" ]; then
    "$DIR/gen" "$N" "$DIR"
    echo "$N" > "$DIR/n"
fi

run() { # label, args...
    label=$1; shift
    t0=$(date +%s.%N)
    "$XENT" compare "$@" --quiet --json "$DIR/out.json"
    t1=$(date +%s.%N)
    awk -v l="$label" -v a="$t0" -v b="$t1" 'BEGIN { printf "%-40s %8.3f s\n", l, b - a }'
}

echo "xent compare on $N tokens ($(nproc) cores), files in $DIR"
run "A vs B (token bootstrap)" "$DIR/a.npy" "$DIR/b.npy"
run "A vs B, --offsets" "$DIR/a.npy" "$DIR/b.npy" --offsets "$DIR/off.npy"
run "A vs B, --offsets, --ref" "$DIR/a.npy" "$DIR/b.npy" --offsets "$DIR/off.npy" --ref "$DIR/r.npy"
run "A vs B, --bootstrap 0" "$DIR/a.npy" "$DIR/b.npy" --bootstrap 0
