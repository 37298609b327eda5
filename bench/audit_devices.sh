#!/bin/sh
# bench/audit_devices.sh MODEL [TEXT]: `xent audit` of MODEL twice on the same
# tokens, the variants' matrix products first by OpenBLAS on the CPU
# (emulated bf16/fp16 storage, exact fp32 accumulation of the products),
# then by cuBLAS on the GPU (real tensor-core products of the same values),
# and prints both tables; the JSON reports go to $OUT (default /tmp).
# Needs a build with CUDA and a GPU. The fp32 reference runs on the CPU in
# both. TEXT defaults to the demo text.
set -u
MODEL=${1:?usage: bench/audit_devices.sh MODEL [TEXT]}
TEXT=${2:-$(ls /usr/share/common-licenses/GPL-3 2>/dev/null || echo README.md)}
BUILD=${BUILD:-build}
OUT=${OUT:-/tmp}
for dev in cpu cuda; do
    echo "=== variants' products: $dev"
    "$BUILD/xent" audit --model "$MODEL" --text "$TEXT" --device $dev \
        --json "$OUT/audit_$dev.json" || exit 1
done
