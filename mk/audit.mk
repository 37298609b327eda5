# mk/audit.mk: `make demo` runs `xent audit` on the default model (fetched by
# `make model`, mk/model.mk) with the default variants and a real English
# text, prints the tables and writes the report files (opens nothing).
DEMO_TEXT ?= $(firstword $(wildcard /usr/share/common-licenses/GPL-3) README.md)
DEMO_ARGS ?= --model $(XENT_MODEL_GGUF) --text $(DEMO_TEXT) \
             --json $(BUILD)/audit.json --html $(BUILD)/audit.html
# OpenBLAS 0.3.21 does not know some AVX-512 CPUs (e.g. Intel family 6
# model 207) and falls back to its SSE3 "Prescott" kernels, 2.5x slower. On
# a CPU with AVX-512 the demo asks for the SkylakeX kernels unless
# OPENBLAS_CORETYPE is already set (docs/audit.md: the kernels' summation
# order moves the emulated errors; xent audit prints the kernel it got).
DEMO_BLAS ?= $(if $(shell grep -qw avx512f /proc/cpuinfo 2>/dev/null && echo y),OPENBLAS_CORETYPE=$${OPENBLAS_CORETYPE:-SkylakeX})
