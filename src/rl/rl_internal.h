/* src/rl/rl_internal.h: helpers shared by the RL sources in src/rl. */
#ifndef XENT_RL_INTERNAL_H
#define XENT_RL_INTERNAL_H

#include "core/xent_internal.h"
#include "rl/rl_math.h"

/* offsets [nseq + 1]: offsets[0] = 0, non-decreasing, offsets[nseq] = T.
 * `what` names the array in messages ("in->offsets"). */
xent_status xent__rl_check_offsets(const char *what, const int64_t *offsets,
                                   int64_t nseq, int64_t T);

/* mask [T] of 0 / 1 bytes, or NULL. */
xent_status xent__rl_check_mask(const char *what, const uint8_t *mask,
                                int64_t T);

#endif
