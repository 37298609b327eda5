# mk/audit.mk: `make demo` runs `xent audit` on the default model (fetched by
# `make model`, mk/model.mk) with the default variants and a real English
# text, prints the tables and writes the report files (opens nothing).
DEMO_TEXT ?= $(firstword $(wildcard /usr/share/common-licenses/GPL-3) README.md)
DEMO_ARGS ?= --model $(XENT_MODEL_GGUF) --text $(DEMO_TEXT) \
             --json $(BUILD)/audit.json --html $(BUILD)/audit.html
