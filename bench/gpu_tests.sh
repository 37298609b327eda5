#!/bin/sh
# Builds and runs the CUDA tests alone (no OpenBLAS needed: the model and the
# audit are left out), then the GPU stage (compute-sanitizer memcheck and
# racecheck). For GPU machines that lack the CPU-side packages.
set -u
BUILD=${BUILD:-build-gpu}
CUDA=${CUDA:-/usr/local/cuda}
lib=$(ls src/*.c src/cpu/*.c src/io/*.c src/rl/*.c | tr '\n' ' ')
make -j"$(nproc)" BUILD="$BUILD" "$BUILD/xent_tests" LIB_SRC="$lib" \
    TEST_SRC="tests/main.c tests/test_ce.c tests/test_cuda.c tests/test_cuda_rl.c tests/test_cuda_linear.c" \
    LDLIBS="-lm -lpthread -L$CUDA/lib64 -Wl,-rpath,$CUDA/lib64 -lcublas -lcudart -lstdc++" >"${OUT:-/tmp}/gpu_build.log" 2>&1 \
    || { tail -n 30 "${OUT:-/tmp}/gpu_build.log"; exit 1; }
"$BUILD/xent_tests" ${TESTS:-cuda_ ce_golden ce_shards}
[ "${SANITIZE:-1}" = 0 ] || BUILD="$BUILD" sh tests/stages/gpu.sh
