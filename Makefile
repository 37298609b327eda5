# xent build. `make` builds build/libxent.a, build/libxent.so and build/xent.
# `make test` runs every test stage (C tests, sanitizer build, Python, GPU
# when present) and ends with one line "N passed, N failed".
# `make demo` runs the main job. Fragments in mk/*.mk add parts (CUDA, model).

CC      ?= cc
CXX     ?= c++
ARCH    ?= native
OPT     ?= -O2
BUILD   ?= build
PYTHON  ?= python3

# Exact paths: no fast-math anywhere; fma() is used where the proofs assume
# it, and the compiler may not contract anything else.
CFLAGS_COMMON = -std=c11 $(OPT) -g -Wall -Wextra -Werror -fPIC \
                -ffp-contract=off -fno-fast-math -fno-math-errno \
                -march=$(ARCH) -Iinclude -Isrc \
                -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE
CFLAGS  += $(CFLAGS_COMMON) $(EXTRA_CFLAGS)
LDLIBS  += -lm -lpthread

# NO_MODEL=1 leaves out the model and the audit (and so OpenBLAS): enough
# for `make lib` of the kernels, as the Python package builds it.
LIB_SRC  := $(sort $(wildcard src/*.c src/cpu/*.c src/io/*.c src/rl/*.c \
              src/compare/*.c $(if $(NO_MODEL),,src/model/*.c src/audit/*.c)))
CLI_SRC  := $(sort $(wildcard tools/*.c))
TEST_SRC := $(sort $(wildcard tests/*.c))
BENCH_SRC:= $(sort $(wildcard bench/*.c))

LIB_OBJ  = $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ  = $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ = $(TEST_SRC:%.c=$(BUILD)/%.o)
# Extra objects linked into the library (CUDA kernels, from mk/cuda.mk).
LIB_EXTRA_OBJ ?=

HEADERS := $(wildcard include/*.h include/xent/*.h src/*.h src/*/*.h tools/*.h tests/*.h)

.PHONY: all lib cli tests test test-c test-asan demo clean bench header-check setup
all: lib cli tests header-check

-include mk/*.mk

lib: $(BUILD)/libxent.a $(BUILD)/libxent.so
cli: $(BUILD)/xent
tests: $(BUILD)/xent_tests

$(BUILD)/%.o: %.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

# The kernels are vectorised at -O3.
$(BUILD)/src/cpu/%.o: OPT = -O3 $(VEC512)
VEC512 := $(if $(filter x86_64,$(shell uname -m)),-mprefer-vector-width=512)

$(BUILD)/libxent.a: $(LIB_OBJ) $(LIB_EXTRA_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libxent.so: $(LIB_OBJ) $(LIB_EXTRA_OBJ)
	$(CC) -shared -o $@ $^ $(LDFLAGS) $(LDLIBS)

# Whole-archive so constructor-registered CLI commands/tests in the library
# are kept; the CLI and the tests link the static library.
$(BUILD)/xent: $(CLI_OBJ) $(BUILD)/libxent.a
	$(CC) -o $@ $(CLI_OBJ) $(BUILD)/libxent.a $(LDFLAGS) $(LDLIBS)

$(BUILD)/xent_tests: $(TEST_OBJ) $(BUILD)/libxent.a
	$(CC) -o $@ $(TEST_OBJ) $(BUILD)/libxent.a $(LDFLAGS) $(LDLIBS)

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
# the generic (non-AVX-512) loops, which must give the same bits.
test-asan:
	$(MAKE) BUILD=build-asan OPT=-O1 \
	  EXTRA_CFLAGS="-DXENT_NO_SIMD -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" \
	  LDFLAGS="-fsanitize=address,undefined" build-asan/xent_tests build-asan/xent
	XENT_SANITIZER=1 build-asan/xent_tests $(TEST_ARGS)

# Installs missing Debian/Python packages (scripts/setup.sh; idempotent).
setup:
	@sh scripts/setup.sh

test: setup
	@$(MAKE) --no-print-directory all
	@sh tests/run_all.sh

# The main job: the dead-zone table, then the layer-by-layer audit of the
# default model (fetched on first use) with the default precision variants.
demo: setup
	@$(MAKE) --no-print-directory all
	$(BUILD)/xent sweep
	@$(MAKE) --no-print-directory model
	$(DEMO_BLAS) $(BUILD)/xent audit $(DEMO_ARGS)

bench: all
	@sh bench/run_cpu.sh

clean:
	rm -rf build build-asan
