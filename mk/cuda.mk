# mk/cuda.mk: the CUDA kernels (src/cuda/*.cu) when nvcc is on PATH, else the
# stubs (src/cuda/*.c, compiled only then) whose xent_cuda_* functions return
# XENT_ERR_UNSUPPORTED. Kernels: sm_90 machine code plus compute_90 PTX (for
# later GPUs), no fast math, no FMA contraction (fma is written explicitly).
NVCC ?= $(shell command -v nvcc 2>/dev/null)
ifneq ($(strip $(NVCC)),)
CUDA ?= $(patsubst %/bin/nvcc,%,$(realpath $(NVCC)))
NVCCFLAGS ?= -O3 -std=c++17 -lineinfo -fmad=false \
  -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
  -Xcompiler -fPIC,-Wall,-Wextra -Werror all-warnings -Iinclude -Isrc
CUDA_SRC := $(sort $(wildcard src/cuda/*.cu))
CUDA_OBJ := $(CUDA_SRC:%.cu=$(BUILD)/%.o)
LIB_EXTRA_OBJ += $(CUDA_OBJ)
CFLAGS += -DXENT_WITH_CUDA -I$(CUDA)/include
LDLIBS += -L$(CUDA)/lib64 -Wl,-rpath,$(CUDA)/lib64 -lcublas -lcudart -lstdc++

$(BUILD)/src/cuda/%.o: src/cuda/%.cu $(wildcard src/cuda/*.h) include/xent.h include/xent/cuda.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@
else
LIB_EXTRA_OBJ += $(BUILD)/src/cuda/stub.o $(BUILD)/src/cuda/rl_stub.o
endif
