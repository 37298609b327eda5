#!/bin/sh
# bench/run_cpu.sh: the CPU benchmark behind `make bench`.
# Times xent_ce forward+backward and the forward-only logprobs for
# T = 2048, V = 128256, bf16 logits and gradient, reduction mean, 5% ignored
# labels, with 1 and 2 threads, next to the memory floor measured in the same
# run (see `xent bench --help`), and the anchors: a plain vectorised fp32
# kernel (bench/plain_ce.h, in the same run) and, when PyTorch is installed,
# its CPU F.cross_entropy (fp32, bf16) and log_softmax + gather
# (bench/torch_anchor.py), as fractions of the same floor, with the Python
# xent call (xent.nn.functional.cross_entropy fwd+bwd, xent.logprobs) next to
# them; the last lines are one Markdown table of every row (date, commit,
# CPU, threads) for bench/RESULTS.md. Extra arguments
# are passed to `xent bench` (e.g. --isa baseline|avx2|avx512).
# Run it on an otherwise idle machine: the floor and the kernel share the
# memory system and the cores with anything else that runs.
set -eu
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-python3}
XENT="$BUILD/xent"
if [ ! -x "$XENT" ]; then
    echo "bench/run_cpu.sh: $XENT not found: run 'make' first" >&2
    exit 1
fi
echo "== $(uname -m), $(getconf _NPROCESSORS_ONLN) cores, load: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$XENT" bench --T 2048 --V 128256 --threads 1,2 --reps 5 "$@" | tee "$out"
BUILD="$BUILD" "$PYTHON" "$(dirname "$0")/torch_anchor.py" "$out" 2048 128256 5 || echo "torch anchor: failed"
