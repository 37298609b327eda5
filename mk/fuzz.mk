# mk/fuzz.mk: libFuzzer targets for the file readers (needs clang).
#   make fuzz                 builds $(BUILD)/fuzz/fuzz_safetensors, fuzz_npy
#   make fuzz-run FUZZ_TIME=60  runs each for FUZZ_TIME seconds, seeded from
#                             tests/data/broken/ and tests/fuzz/seeds/
# `make test` does not run the fuzzers; it runs the broken corpus through the
# loaders (tests/test_io.c).
FUZZ_CC    ?= clang
FUZZ_TIME  ?= 60
FUZZ_DIR    = $(BUILD)/fuzz
FUZZ_FLAGS  = -std=c11 -g -O1 -Wall -Wextra -Werror -ffp-contract=off -fsanitize=fuzzer,address,undefined \
              -fno-sanitize-recover=undefined -Iinclude -Isrc \
              -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE
FUZZ_LIB    = $(sort $(wildcard src/io/*.c)) src/core.c
FUZZ_BINS   = $(FUZZ_DIR)/fuzz_safetensors $(FUZZ_DIR)/fuzz_npy

.PHONY: fuzz fuzz-run
fuzz: $(FUZZ_BINS)

$(FUZZ_DIR)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_LIB) $(HEADERS)
	@mkdir -p $(FUZZ_DIR)
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ $< $(FUZZ_LIB) -lm -lpthread

# One corpus directory per target, seeded with the matching files.
fuzz-run: fuzz
	@mkdir -p $(FUZZ_DIR)/corpus_safetensors $(FUZZ_DIR)/corpus_npy
	cp tests/data/broken/*.safetensors tests/fuzz/seeds/*.safetensors $(FUZZ_DIR)/corpus_safetensors/
	cp tests/data/broken/*.npy tests/fuzz/seeds/*.npy $(FUZZ_DIR)/corpus_npy/
	$(FUZZ_DIR)/fuzz_safetensors -max_total_time=$(FUZZ_TIME) -rss_limit_mb=2048 \
	  -dict=tests/fuzz/safetensors.dict -artifact_prefix=$(FUZZ_DIR)/ $(FUZZ_DIR)/corpus_safetensors
	$(FUZZ_DIR)/fuzz_npy -max_total_time=$(FUZZ_TIME) -rss_limit_mb=2048 \
	  -dict=tests/fuzz/npy.dict -artifact_prefix=$(FUZZ_DIR)/ $(FUZZ_DIR)/corpus_npy
