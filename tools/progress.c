/* tools/progress.c: the progress line of the `xent` commands (progress.h). */
#include "progress.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct xent_progress {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int enabled, running, stop, shown, heap;
    double t0, after;
    char prefix[64], unit[32], label[64];
    int64_t done, total;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int xent_progress_wanted(int quiet) { return !quiet && isatty(STDERR_FILENO); }

static void fmt_secs(char *buf, size_t cap, double s) {
    if (s < 60) snprintf(buf, cap, "%.0f s", s);
    else if (s < 3600) snprintf(buf, cap, "%d min %02d s", (int)(s / 60), (int)s % 60);
    else snprintf(buf, cap, "%d h %02d min", (int)(s / 3600), (int)(s / 60) % 60);
}

void xent_progress_format(char *buf, size_t cap, const char *prefix, const char *unit,
                          int64_t done, int64_t total, double elapsed, const char *label) {
    char el[32], rate[64] = "", eta[48] = "ETA ?";
    fmt_secs(el, sizeof el, elapsed);
    if (done > 0 && elapsed > 0) {
        double per = elapsed / (double)done;
        if (per >= 1) snprintf(rate, sizeof rate, ", %.1f s each", per);
        else snprintf(rate, sizeof rate, ", %.1f %s/s", 1 / per, unit);
        char t[32];
        fmt_secs(t, sizeof t, per * (double)(total > done ? total - done : 0));
        snprintf(eta, sizeof eta, "ETA %s", t);
    }
    int lab = label && *label;
    snprintf(buf, cap, "%s: %lld/%lld %s%s%s%s%s, %s elapsed, %s", prefix, (long long)done,
             (long long)total, unit, lab ? " (now " : "", lab ? label : "", lab ? ")" : "", rate,
             el, eta);
}

/* With p->mu held. */
static void draw(xent_progress *p) {
    char line[512];
    xent_progress_format(line, sizeof line, p->prefix, p->unit, p->done, p->total,
                         now_s() - p->t0, p->label);
    fprintf(stderr, "\r%s\033[K", line);
    fflush(stderr);
    p->shown = 1;
}

static void clear(xent_progress *p) {
    if (!p->shown) return;
    fprintf(stderr, "\r\033[K");
    fflush(stderr);
    p->shown = 0;
}

static void *ticker(void *arg) {
    xent_progress *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        if (now_s() - p->t0 >= p->after) draw(p);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 500000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&p->cv, &p->mu, &ts);
    }
    clear(p);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

xent_progress *xent_progress_start(const char *prefix, const char *unit, int64_t total,
                                   int enabled) {
    static xent_progress off; /* the disabled one when calloc fails */
    xent_progress *p = calloc(1, sizeof *p);
    if (!p) return &off;
    p->heap = 1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    snprintf(p->prefix, sizeof p->prefix, "%s", prefix);
    snprintf(p->unit, sizeof p->unit, "%s", unit);
    p->total = total;
    p->t0 = now_s();
    p->after = 2.0;
    const char *env = getenv("XENT_PROGRESS_AFTER"); /* the CLI may read the environment */
    if (env && *env) {
        char *end;
        double a = strtod(env, &end);
        if (end != env && !*end && a >= 0) p->after = a;
    }
    p->enabled = enabled;
    if (enabled) p->running = pthread_create(&p->thread, NULL, ticker, p) == 0;
    return p;
}

void xent_progress_update(xent_progress *p, int64_t done, const char *label) {
    if (!p || !p->enabled) return;
    pthread_mutex_lock(&p->mu);
    p->done = done;
    snprintf(p->label, sizeof p->label, "%s", label ? label : "");
    if (p->shown) draw(p);
    pthread_mutex_unlock(&p->mu);
}

void xent_progress_log(xent_progress *p, const char *line) {
    if (!p || !p->enabled) {
        fprintf(stderr, "%s\n", line);
        return;
    }
    pthread_mutex_lock(&p->mu);
    int was = p->shown;
    clear(p);
    fprintf(stderr, "%s\n", line);
    if (was) draw(p);
    pthread_mutex_unlock(&p->mu);
}

void xent_progress_end(xent_progress *p) {
    if (!p || !p->heap) return;
    if (!p->enabled) {
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv);
        free(p);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (p->running) pthread_join(p->thread, NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}
