# mk/cuda.mk: the CUDA kernels (src/cuda/*.cu, in libxent) and the model's
# GPU products and resident pass (src/model/*.cu, in libxent_tools) when
# nvcc is on PATH;
# else the stubs (src/cuda/stub.c, rl_stub.c, src/model/gemm_stub.c, compiled
# only then) whose functions return XENT_ERR_UNSUPPORTED; src/cuda/plan.c
# (the kernel plan's checks) is in both. `make NVCC=` builds without
# CUDA where nvcc is present. Kernels: sm_90 machine code plus compute_90
# PTX (for later GPUs), no fast math, no FMA contraction (fma is written
# explicitly). NVCC_LINEINFO=1 adds line tables for profilers (three times
# the size; the code is the same).
NVCC ?= $(shell command -v nvcc 2>/dev/null)
ifneq ($(strip $(NVCC)),)
CUDA ?= $(patsubst %/bin/nvcc,%,$(realpath $(NVCC)))
NVCCFLAGS ?= -O3 -std=c++17 $(if $(NVCC_LINEINFO),-lineinfo) -fmad=false \
  -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
  -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra -Werror all-warnings -Iinclude -Isrc
CUDA_SRC := $(sort $(wildcard src/cuda/*.cu))
CUDA_TOOLS_SRC := $(sort $(wildcard src/model/*.cu))
XENT_EXTRA_OBJ += $(CUDA_SRC:%.cu=$(BUILD)/%.o) $(BUILD)/src/cuda/plan.o
TOOLS_EXTRA_OBJ += $(CUDA_TOOLS_SRC:%.cu=$(BUILD)/%.o)
CFLAGS += -DXENT_WITH_CUDA -I$(CUDA)/include
CUDA_RPATH ?= -Wl,-rpath,$(CUDA)/lib64
XENT_LDLIBS += -L$(CUDA)/lib64 $(CUDA_RPATH) -lcublas -lcudart -lstdc++

$(BUILD)/src/%.o: src/%.cu $(wildcard src/cuda/*.h src/core/*.h src/rl/*.h src/model/*.h) \
                  include/xent.h include/xent/cuda.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@
else
XENT_EXTRA_OBJ += $(BUILD)/src/cuda/stub.o $(BUILD)/src/cuda/rl_stub.o $(BUILD)/src/cuda/plan.o
TOOLS_EXTRA_OBJ += $(BUILD)/src/model/gemm_stub.o
endif

# dev/: experiments, built by `make dev` only (never by `make`, never in
# the wheel). Each compiles against the library's internal headers.
DEV_CU := $(sort $(wildcard dev/cuda/*.cu dev/*.cu))
dev: $(if $(strip $(NVCC)),$(DEV_CU:%.cu=$(BUILD)/%.o))
$(BUILD)/dev/%.o: dev/%.cu $(wildcard src/cuda/*.h src/core/*.h)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -Isrc/cuda -c $< -o $@
