#!/bin/sh
# GPU stage: the CUDA tests under compute-sanitizer (memcheck, then
# racecheck) when a GPU and compute-sanitizer are present; otherwise says
# why and counts as skipped. (The plain CUDA tests run in the C test stage.)
BUILD=${BUILD:-build}
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu stage: no GPU here (nvidia-smi finds none): skipped"
    echo "0 passed, 0 failed, 1 skipped"; exit 0
fi
if [ ! -x "$CS" ]; then
    echo "gpu stage: compute-sanitizer not found: skipped"
    echo "0 passed, 0 failed, 1 skipped"; exit 0
fi
pass=0; fail=0
# racecheck reports shared-memory hazards inside cuBLAS's own Hopper GEMM
# kernels (nvjet_sm90_*, called by the fused LM head); they are not this
# project's code and are left out of racecheck (memcheck still covers
# them). Every xent kernel is checked by both tools.
for tool in memcheck racecheck; do
    skip=""
    [ $tool = racecheck ] && skip="--kernel-name-exclude kns=nvjet"
    if XENT_SANITIZER=1 "$CS" --tool $tool $skip --error-exitcode 3 "$BUILD/xent_tests" cuda_ >/tmp/xent_gpu_$tool.log 2>&1; then
        echo "gpu stage: compute-sanitizer $tool: clean"; pass=$((pass + 1))
    else
        echo "gpu stage: compute-sanitizer $tool: FAILED (log /tmp/xent_gpu_$tool.log)"
        tail -n 30 /tmp/xent_gpu_$tool.log; fail=$((fail + 1))
    fi
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
