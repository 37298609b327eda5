# xent build. Two libraries and a program (docs/architecture.md):
#   build/libxent.a, build/libxent.so   the product: src/core, src/cpu, src/io,
#                                       src/rl and src/cuda (the kernels when
#                                       nvcc is on PATH, else their stubs);
#                                       the .so exports the xent_* API alone
#   build/libxent_tools.a               the model, the audit and compare
#                                       (src/model, src/audit, src/compare),
#                                       on libxent's public API
#   build/xent                          the CLI (tools/), on both
# `make test` runs every test stage and ends with one line "N passed, N failed".
# `make demo` runs the main job. `make dev` builds the experiments of dev/.
# Fragments in mk/*.mk add parts (CUDA, model, audit, fuzzers).

CC      ?= cc
CXX     ?= c++
# The baseline of the architecture, so that one binary runs on every x86-64
# (SSE2) or aarch64 (armv8-a) machine; the CPU kernels add AVX2 and AVX-512
# paths chosen at run time (src/cpu/ce_kern.h). ARCH=native for a build
# tuned to this machine alone.
# The target is the compiler's (`make CC=aarch64-linux-gnu-gcc` cross-builds).
TARGET_CPU := $(firstword $(subst -, ,$(shell $(CC) -dumpmachine 2>/dev/null || uname -m)))
ARCH    ?= $(or $(ARCH_$(TARGET_CPU)),native)
ARCH_x86_64  = x86-64
ARCH_aarch64 = armv8-a
OPT     ?= -O2
BUILD   ?= build
PYTHON  ?= python3
# parallel compile jobs of `make test` and `make demo`: the cores available
JOBS    ?= $(shell nproc 2>/dev/null || echo 2)

# Exact paths: no fast-math anywhere; fma() is used where the proofs assume
# it, and the compiler may not contract anything else.
CFLAGS_COMMON = -std=c11 $(OPT) -g -Wall -Wextra -Werror -fPIC \
                -ffp-contract=off -fno-fast-math -fno-math-errno \
                -march=$(ARCH) -Iinclude -Isrc \
                -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE
CFLAGS  += $(CFLAGS_COMMON) $(EXTRA_CFLAGS)
# libxent's own link line; the tools add theirs (OpenBLAS: mk/model.mk).
XENT_LDLIBS += -lm -lpthread
TOOLS_LDLIBS ?=

# The layers, by folder. The stubs of a build without CUDA come from
# mk/cuda.mk (src/cuda/*.c, src/model/gemm_stub.c).
XENT_SRC  := $(sort $(wildcard src/core/*.c src/cpu/*.c src/io/*.c src/rl/*.c))
TOOLS_SRC := $(sort $(filter-out src/model/gemm_stub.c, \
               $(wildcard src/model/*.c src/audit/*.c src/compare/*.c)))
CLI_SRC   := $(sort $(wildcard tools/xent.c tools/cmd_*.c))
# the CLI's support (flag parser, input readers, progress line), which the
# tests link too
CLI_LIB_SRC := $(sort $(filter-out $(CLI_SRC), $(wildcard tools/*.c)))
TEST_SRC  := $(sort $(wildcard tests/*.c))

XENT_OBJ  = $(XENT_SRC:%.c=$(BUILD)/%.o) $(XENT_EXTRA_OBJ)
TOOLS_OBJ = $(TOOLS_SRC:%.c=$(BUILD)/%.o) $(TOOLS_EXTRA_OBJ)
CLI_OBJ   = $(CLI_SRC:%.c=$(BUILD)/%.o)
CLI_LIB_OBJ = $(CLI_LIB_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ  = $(TEST_SRC:%.c=$(BUILD)/%.o)
# Extra objects of each library (CUDA kernels or stubs, from mk/cuda.mk).
XENT_EXTRA_OBJ ?=
TOOLS_EXTRA_OBJ ?=

HEADERS := $(wildcard include/*.h include/xent/*.h src/*/*.h tools/*.h tests/*.h bench/*.h)

.PHONY: all lib tools-lib cli tests test test-c setup-demo test-asan demo clean bench header-check \
        setup dev
all: lib cli tests header-check

-include mk/*.mk

lib: $(BUILD)/libxent.a $(BUILD)/libxent.so
tools-lib: $(BUILD)/libxent_tools.a
cli: $(BUILD)/xent
tests: $(BUILD)/xent_tests

$(BUILD)/%.o: %.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

# libxent's objects: hidden visibility, XENT_API (include/xent.h) exports
# the public functions; the kernels are vectorised at -O3.
$(XENT_OBJ): CFLAGS += -fvisibility=hidden
$(BUILD)/src/cpu/%.o: OPT = -O3 $(VEC512)
# The sanitizer builds take the AVX-512 loops uninstrumented (ISA512_EXTRA =
# -fno-sanitize=all): instrumented, that one file alone took 34 s (gcc) and
# 141 s (clang) to compile on two cores, and the sanitizer stages run the
# generic loops (XENT_NO_SIMD) they are there to check.
$(BUILD)/src/cpu/ce_isa_avx512.o: CFLAGS += $(ISA512_EXTRA)
VEC512 := $(if $(filter x86_64,$(TARGET_CPU)),-mprefer-vector-width=512)

$(BUILD)/libxent.a: $(XENT_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libxent.so: $(XENT_OBJ)
	$(CC) -shared -o $@ $^ $(LDFLAGS) $(XENT_LDLIBS)

$(BUILD)/libxent_tools.a: $(TOOLS_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libxent_cli.a: $(CLI_LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

# The tools, the CLI and the tests are built on this machine, for it
# (TOOLS_ARCH); the library itself for ARCH. A cross build builds all of
# them for the target's baseline.
$(TOOLS_OBJ) $(CLI_OBJ) $(CLI_LIB_OBJ) $(TEST_OBJ): ARCH = $(TOOLS_ARCH)
TOOLS_ARCH ?= $(if $(filter $(TARGET_CPU),$(shell uname -m)),native,$(ARCH))

# The CLI and the tests link the static libraries, the upper layers first.
LINK_ALL = $(BUILD)/libxent_cli.a $(BUILD)/libxent_tools.a $(BUILD)/libxent.a $(LDFLAGS) \
           $(TOOLS_LDLIBS) $(XENT_LDLIBS)
$(BUILD)/xent: $(CLI_OBJ) $(BUILD)/libxent_cli.a $(BUILD)/libxent_tools.a $(BUILD)/libxent.a
	$(CC) -o $@ $(CLI_OBJ) $(LINK_ALL)

$(BUILD)/xent_tests: $(TEST_OBJ) $(BUILD)/libxent_cli.a $(BUILD)/libxent_tools.a $(BUILD)/libxent.a
	$(CC) -o $@ $(TEST_OBJ) $(LINK_ALL)

# The public header must compile as C and as C++.
header-check: $(BUILD)/header_check.stamp
$(BUILD)/header_check.stamp: $(wildcard include/*.h include/xent/*.h)
	@mkdir -p $(BUILD)
	printf '#include "xent.h"\nint main(void){return xent_strerror(XENT_OK)==0;}\n' > $(BUILD)/hc.c
	$(CC) -std=c11 -Wall -Wextra -Werror -pedantic -Iinclude -c $(BUILD)/hc.c -o $(BUILD)/hc_c.o
	$(CXX) -std=c++11 -Wall -Wextra -Werror -pedantic -Iinclude -x c++ -c $(BUILD)/hc.c -o $(BUILD)/hc_cxx.o
	@touch $@

test-c: all
	$(BUILD)/xent_tests $(TEST_ARGS)

# Same tests under AddressSanitizer + UndefinedBehaviorSanitizer, built with
# the generic (non-AVX-512) loops, which must give the same bits. The CUDA
# kernels are not built there (their stubs are): the sanitizers check the
# host code, and the GPU stage runs compute-sanitizer on the kernels.
test-asan:
	$(MAKE) BUILD=build-asan OPT=-O1 NVCC= \
	  EXTRA_CFLAGS="-DXENT_NO_SIMD -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" \
	  ISA512_EXTRA=-fno-sanitize=all \
	  LDFLAGS="-fsanitize=address,undefined" build-asan/xent_tests build-asan/xent
	XENT_SANITIZER=1 build-asan/xent_tests $(TEST_ARGS)

# Installs missing Debian/Python packages (scripts/setup.sh; idempotent).
setup:
	@sh scripts/setup.sh

setup-demo:
	@sh scripts/setup.sh --demo

# `make test` and `make demo` build where the kernels will run: with a GPU
# (and nvcc), the full build in $(BUILD); without one, the CPU-only build in
# $(BUILD)/cpu (no CUDA compile). The CUDA part is then compiled by the
# test stage tests/stages/cuda_build.sh where CI asks for it.
HAVE_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
RUN_CUDA := $(and $(HAVE_GPU),$(strip $(NVCC)))
RUN_BUILD ?= $(if $(RUN_CUDA),$(BUILD),$(if $(strip $(NVCC)),$(BUILD)/cpu,$(BUILD)))
RUN_MAKE = $(MAKE) --no-print-directory BUILD=$(RUN_BUILD) $(if $(RUN_CUDA),,NVCC=)

test: setup
	@echo "test: building in $(RUN_BUILD)$(if $(RUN_CUDA), (with CUDA), (CPU only))"
	@$(RUN_MAKE) -j$(JOBS) all
	@BUILD=$(RUN_BUILD) sh tests/run_all.sh

# The main job: the dead-zone table, then the layer-by-layer audit of the
# default model (fetched on first use) with the default precision variants.
demo: setup-demo
	@echo "demo: building the CLI in $(RUN_BUILD)$(if $(RUN_CUDA), (with CUDA), (CPU only))"
	@$(RUN_MAKE) -j$(JOBS) cli
	$(RUN_BUILD)/xent sweep
	@$(MAKE) --no-print-directory model
	$(DEMO_BLAS) $(RUN_BUILD)/xent audit $(DEMO_ARGS)

bench: all
	@sh bench/run_cpu.sh

clean:
	rm -rf build build-asan
