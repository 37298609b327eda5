/* tools/input.h: input tensors and output names of the `xent` commands.
 *
 * xent_cli_load reads what xent_tensor_load reads and, in addition, the
 * bfloat16 .npy that numpy writes for ml_dtypes.bfloat16 arrays: descr
 * '<V2' (ml_dtypes 0.x with numpy 1.x and 2.x; a plain 2-byte void array is
 * '|V2' and stays refused, with a hint). xent_cli_to_f32 rounds f64 values
 * once to f32, the dtype the kernels compute from. */
#ifndef XENT_TOOLS_INPUT_H
#define XENT_TOOLS_INPUT_H

#include "xent.h"

/* Loads spec ("FILE" or "FILE:NAME"); on failure prints
 * "xent CMD: FLAG: message" and returns 1, else 0. */
int xent_cli_load(const char *cmd, const char *flag, const char *spec, xent_tensor *out);

/* An F64 tensor becomes F32 (each value rounded to nearest once); other
 * dtypes are left alone. Returns 0, or 1 (out of memory, message printed). */
int xent_cli_to_f32(const char *cmd, xent_tensor *t);

/* The file a load spec reads: "x.safetensors:NAME" -> x.safetensors,
 * "o.npy:nll" -> o.nll.npy, else the spec itself. */
void xent_cli_spec_file(const char *spec, char *buf, size_t cap);

/* The file xent_tensors_save writes for tensor `name` of n tensors:
 * PATH.safetensors -> PATH, PATH.npy -> PATH with ".NAME" before ".npy"
 * when n > 1. */
void xent_cli_out_file(const char *path, const char *name, int n, char *buf, size_t cap);

/* An input of the command: the flag and the path it reads. */
typedef struct xent_cli_file {
    const char *flag, *path;
} xent_cli_file;

/* Checks the outputs before any work: each output's directory exists and
 * is writable, no two outputs are the same file, and no output is an input.
 * Prints "xent CMD: FLAG ..." and returns 2 on a conflict, else 0. */
int xent_cli_check_outputs(const char *cmd, const xent_cli_file *outs, int nouts,
                           const xent_cli_file *ins, int nins);

#endif
