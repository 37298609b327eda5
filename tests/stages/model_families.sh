#!/bin/sh
# tests/stages/model_families.sh: one tiny random checkpoint per architecture
# family (llama, qwen2, qwen3, mistral, gemma2, gemma3_text), written by
# tests/families/make_families.py as Hugging Face directories (sharded F32
# safetensors + model.safetensors.index.json, config.json, tokenizer.json)
# with a float64 numpy reference of each architecture; the C test
# model_families (tests/test_families.c, tolerances there) loads them and
# checks tokenizer ids, loss, logits and gradients of the f64 and fp32 paths.
# Prints "N passed, N failed[, N skipped]" last. Needs numpy (else skipped).
BUILD=${BUILD:-build}
T="$BUILD/xent_tests"
if [ ! -x "$T" ]; then echo "$T not built"; echo "0 passed, 0 failed, 1 skipped"; exit 0; fi
if ! python3 -c "import numpy" 2>/dev/null; then
    echo "numpy not installed: skipped"; echo "0 passed, 0 failed, 1 skipped"; exit 0
fi
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
if ! python3 tests/families/make_families.py "$dir"; then
    echo "make_families.py failed"; echo "0 passed, 1 failed"; exit 1
fi
XENT_FAMILIES_DIR="$dir" "$T" model_families
