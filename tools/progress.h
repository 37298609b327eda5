/* tools/progress.h: a live progress line on stderr for the long steps of
 * the `xent` commands: "xent audit: 2/5 variants, 11.8 s/variant, ETA 35 s".
 *
 * Shown only when stderr is a terminal and the command is not --quiet, and
 * only once the step has run for XENT_PROGRESS_AFTER seconds (default 2):
 * a short step prints nothing. A background thread redraws the line twice a
 * second (so the elapsed time and the ETA move during a long item); log
 * lines go through xent_progress_log, which clears the line, prints the log
 * line and redraws, so the two never mix. Off the terminal the log lines
 * are printed as they come and no progress line is drawn. */
#ifndef XENT_TOOLS_PROGRESS_H
#define XENT_TOOLS_PROGRESS_H

#include <stddef.h>
#include <stdint.h>

typedef struct xent_progress xent_progress;

/* Whether a progress line can show: stderr is a terminal and !quiet. */
int xent_progress_wanted(int quiet);

/* Starts a step of `total` items called `unit` ("variants"); prefix starts
 * the line ("xent audit"). enabled = xent_progress_wanted(quiet). Never
 * NULL: without memory it runs disabled. */
xent_progress *xent_progress_start(const char *prefix, const char *unit, int64_t total,
                                   int enabled);
/* done items so far; label: what runs now (copied; NULL: none). */
void xent_progress_update(xent_progress *p, int64_t done, const char *label);
/* Prints one log line (with its newline) to stderr without mixing it with
 * the progress line. */
void xent_progress_log(xent_progress *p, const char *line);
/* Clears the line, stops the thread, frees p (NULL ok). */
void xent_progress_end(xent_progress *p);

/* The line for `done` of `total` after `elapsed` seconds (used by the
 * thread; exposed for the tests). */
void xent_progress_format(char *buf, size_t cap, const char *prefix, const char *unit,
                          int64_t done, int64_t total, double elapsed, const char *label);

#endif
