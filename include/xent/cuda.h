/* xent/cuda.h: the cross-entropy kernels on CUDA, same contract as the CPU.
 * Included by xent.h; do not include directly. The functions exist in every
 * build; without CUDA they return XENT_ERR_UNSUPPORTED. */
#ifndef XENT_CUDA_H
#define XENT_CUDA_H
#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif /* XENT_CUDA_H */
