/* xent/rl.h: RL loss math. Included by xent.h; do not include directly. */
#ifndef XENT_RL_H
#define XENT_RL_H
#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif /* XENT_RL_H */
