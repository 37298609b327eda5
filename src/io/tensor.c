/* src/io/tensor.c: the public tensor I/O entry points; file opening, the
 * "FILE:NAME" spec, format detection and the checked-read source. */
#include "io_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/stat.h>

int64_t xent_tensor_numel(const xent_tensor *t) {
    if (!t || t->ndim < 0 || t->ndim > XENT_MAX_DIMS) return 0;
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] < 0 || !xent__mul_i64(n, t->shape[d], &n)) return -1;
    return n;
}

void xent_tensor_free(xent_tensor *t) {
    if (!t) return;
    free(t->data);
    memset(t, 0, sizeof *t);
}

int xent__mul_i64(int64_t a, int64_t b, int64_t *out) {
    if (a < 0 || b < 0) return 0;
    if (a != 0 && b > INT64_MAX / a) return 0;
    *out = a * b;
    return 1;
}

xent_status xent__shape_numel(const xent__src *s, const char *what,
                              const int64_t *shape, int ndim, int64_t *numel) {
    int64_t n = 1;
    const char *q = what[0] ? "'" : "";
    const char *t = what[0] ? "tensor " : "";
    const char *sep = what[0] ? ": " : "";
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0 || shape[d] > XENT__MAX_DIM)
            return xent_set_error(XENT_ERR_FORMAT, "%s: %s%s%s%s%sshape[%d] = %lld is out of range", s->path,
                              t, q, what, q, sep, d, (long long)shape[d]);
        if (!xent__mul_i64(n, shape[d], &n))
            return xent_set_error(XENT_ERR_FORMAT,
                              "%s: %s%s%s%s%sthe product of the shape overflows at shape[%d] = %lld",
                              s->path, t, q, what, q, sep, d, (long long)shape[d]);
    }
    *numel = n;
    return XENT_OK;
}

xent_status xent__src_read(const xent__src *s, uint64_t off, void *buf,
                           uint64_t n) {
    if (off > s->size || n > s->size - off)
        return xent_set_error(XENT_ERR_FORMAT,
                          "%s: truncated: needs bytes [%llu, %llu) but the file has %llu",
                          s->path, (unsigned long long)off, (unsigned long long)(off + n),
                          (unsigned long long)s->size);
    if (n == 0) return XENT_OK;
    if (!s->f) {
        memcpy(buf, s->mem + off, (size_t)n);
        return XENT_OK;
    }
    if (off > (uint64_t)INT64_MAX || fseeko(s->f, (off_t)off, SEEK_SET) != 0)
        return xent_set_error(XENT_ERR_IO, "%s: cannot seek to byte %llu: %s", s->path,
                          (unsigned long long)off, strerror(errno));
    if (fread(buf, 1, (size_t)n, s->f) != (size_t)n)
        return xent_set_error(XENT_ERR_IO, "%s: cannot read %llu bytes at %llu%s", s->path,
                          (unsigned long long)n, (unsigned long long)off,
                          ferror(s->f) ? "" : " (file shrank while reading)");
    return XENT_OK;
}

/* The kind of a file that is not a regular one, for messages. */
static const char *file_kind(mode_t m) {
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISSOCK(m)) return "a socket";
    return "not a plain file";
}

FILE *xent_file_open(const char *path, uint64_t *size) {
    if (!path) {
        xent_set_error(XENT_ERR_NULL, "xent_file_open: NULL path");
        return NULL;
    }
    struct stat st;
    /* stat first, then open without blocking (a FIFO's open waits for a
     * writer), then fstat the descriptor itself (the path may have been
     * swapped in between) */
    if (stat(path, &st) != 0) {
        xent_set_error(XENT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        xent_set_error(XENT_ERR_IO, "%s: not a regular file (%s): refused", path, file_kind(st.st_mode));
        return NULL;
    }
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        xent_set_error(XENT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        xent_set_error(XENT_ERR_IO, "%s: not a regular file (%s): refused", path, file_kind(st.st_mode));
        return NULL;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int err = errno;
        close(fd);
        xent_set_error(XENT_ERR_IO, "%s: cannot open: %s", path, strerror(err));
        return NULL;
    }
    if (size) *size = (uint64_t)st.st_size;
    return f;
}

/* Opens path as a file source. */
static xent_status src_open(const char *path, xent__src *s) {
    memset(s, 0, sizeof *s);
    s->path = path;
    uint64_t size = 0;
    FILE *f = xent_file_open(path, &size);
    if (!f) return XENT_ERR_IO;
    s->f = f;
    s->size = size;
    return XENT_OK;
}

static int is_regular(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* 1 = npy, 0 = safetensors: by extension, else by magic bytes. */
static int looks_npy(const xent__src *s) {
    if (ends_with(s->path, ".npy")) return 1;
    if (ends_with(s->path, ".safetensors")) return 0;
    unsigned char m[6];
    if (s->size >= 6 && xent__src_read(s, 0, m, 6) == XENT_OK)
        return memcmp(m, "\x93NUMPY", 6) == 0;
    return 0;
}

/* "out.npy" + "nll" -> "out.nll.npy" (the naming of xent_tensors_save). */
static char *npy_member_path(const char *path, const char *name) {
    size_t n = strlen(path), k = strlen(name);
    char *p = malloc(n + k + 2);
    if (!p) return NULL;
    size_t stem = ends_with(path, ".npy") ? n - 4 : n;
    memcpy(p, path, stem);
    p[stem] = '.';
    memcpy(p + stem + 1, name, k);
    memcpy(p + stem + 1 + k, ".npy", 5);
    return p;
}

static xent_status load_from(const char *path, const char *name,
                             xent_tensor *out) {
    xent__src s;
    xent_status st = src_open(path, &s);
    if (st) return st;
    if (looks_npy(&s))
        st = name ? xent_set_error(XENT_ERR_NOT_FOUND, "%s: a .npy file holds one unnamed array; "
                               "there is no tensor '%s' in it", path, name)
                  : xent__npy_load(&s, out);
    else
        st = xent__st_load(&s, name, out);
    fclose(s.f);
    return st;
}

xent_status xent_tensor_load(const char *spec, xent_tensor *out) {
    if (!spec || !out) return xent_set_error(XENT_ERR_NULL, "xent_tensor_load: NULL argument");
    if (is_regular(spec) || !strchr(spec, ':')) return load_from(spec, NULL, out);
    /* FILE:NAME: the first ':' whose prefix is an existing file */
    size_t n = strlen(spec);
    char *buf = malloc(n + 1);
    if (!buf) return xent_set_error(XENT_ERR_ALLOC, "out of memory");
    memcpy(buf, spec, n + 1);
    xent_status st = XENT_ERR_IO;
    int done = 0;
    for (char *c = strchr(buf, ':'); c && !done; c = strchr(c + 1, ':')) {
        *c = '\0';
        if (is_regular(buf)) {
            const char *name = c + 1;
            if (ends_with(buf, ".npy")) {
                /* out.npy:nll -> out.nll.npy, as written by xent_tensors_save */
                char *member = npy_member_path(buf, name);
                if (!member) { free(buf); return xent_set_error(XENT_ERR_ALLOC, "out of memory"); }
                st = is_regular(member) ? load_from(member, NULL, out) : load_from(buf, name, out);
                if (st == XENT_OK && strlen(name) < XENT_MAX_NAME) strcpy(out->name, name);
                free(member);
            } else {
                st = load_from(buf, name, out);
            }
            done = 1;
        }
        *c = ':';
    }
    if (!done) {
        /* maybe the member file of a multi-tensor .npy save exists alone */
        char *c = strrchr(buf, ':');
        *c = '\0';
        char *member = ends_with(buf, ".npy") ? npy_member_path(buf, c + 1) : NULL;
        if (member && is_regular(member)) {
            st = load_from(member, NULL, out);
            if (st == XENT_OK && strlen(c + 1) < XENT_MAX_NAME) strcpy(out->name, c + 1);
        } else {
            st = xent_set_error(XENT_ERR_IO, "%s: cannot open: no such file", buf);
        }
        free(member);
    }
    free(buf);
    return st;
}

xent_status xent_safetensors_list(const char *path, xent_tensor **out, int *n) {
    if (!path || !out || !n) return xent_set_error(XENT_ERR_NULL, "xent_safetensors_list: NULL argument");
    xent__src s;
    xent_status st = src_open(path, &s);
    if (st) return st;
    st = xent__st_list(&s, out, n);
    fclose(s.f);
    return st;
}

xent_status xent_safetensors_read(const char *path, const char *const *names, int n,
                                  xent_tensor_fn fn, void *ctx) {
    if (!path || (!names && n > 0) || !fn)
        return xent_set_error(XENT_ERR_NULL, "xent_safetensors_read: NULL argument");
    for (int i = 0; i < n; i++)
        if (!names[i]) return xent_set_error(XENT_ERR_NULL, "xent_safetensors_read: names[%d] is NULL", i);
    xent__src s;
    xent_status st = src_open(path, &s);
    if (st) return st;
    st = xent__st_read_each(&s, names, n, fn, ctx);
    fclose(s.f);
    return st;
}

/* Checks one tensor before writing it. */
static xent_status check_tensor(const xent_tensor *t, int i) {
    if (xent_dtype_size(t->dtype) == 0)
        return xent_set_error(XENT_ERR_DTYPE, "tensors[%d] ('%s'): invalid dtype %d", i, t->name, (int)t->dtype);
    if (t->ndim < 0 || t->ndim > XENT_MAX_DIMS)
        return xent_set_error(XENT_ERR_SHAPE, "tensors[%d] ('%s'): ndim = %d is outside [0, %d]", i,
                          t->name, t->ndim, XENT_MAX_DIMS);
    int64_t numel = xent_tensor_numel(t), nbytes;
    if (numel < 0 || !xent__mul_i64(numel, (int64_t)xent_dtype_size(t->dtype), &nbytes))
        return xent_set_error(XENT_ERR_SHAPE, "tensors[%d] ('%s'): negative or overflowing shape", i, t->name);
    if ((uint64_t)nbytes != (uint64_t)t->nbytes)
        return xent_set_error(XENT_ERR_SHAPE, "tensors[%d] ('%s'): nbytes = %zu but the shape needs %lld",
                          i, t->name, t->nbytes, (long long)nbytes);
    if (nbytes > 0 && !t->data)
        return xent_set_error(XENT_ERR_NULL, "tensors[%d] ('%s'): data is NULL", i, t->name);
    if (memchr(t->name, '\0', XENT_MAX_NAME) == NULL)
        return xent_set_error(XENT_ERR_VALUE, "tensors[%d]: name is not NUL-terminated", i);
    return XENT_OK;
}

/* n > 1 tensors to PATH.NAME.npy each, all or nothing: every file is
 * written to its temporary and flushed to disk first; only when all of them
 * are complete are they renamed into place, so a failure (disk full, a
 * directory that is not writable, ...) leaves every old file as it was. */
static xent_status save_npy_set(const char *path, const xent_tensor *ts, int n) {
    char **dst = calloc((size_t)n, sizeof *dst), **tmp = calloc((size_t)n, sizeof *tmp);
    FILE **fs = calloc((size_t)n, sizeof *fs);
    xent_status st = XENT_OK;
    if (!dst || !tmp || !fs) st = xent_set_error(XENT_ERR_ALLOC, "out of memory");
    for (int i = 0; !st && i < n; i++) {
        dst[i] = npy_member_path(path, ts[i].name);
        if (!dst[i]) { st = xent_set_error(XENT_ERR_ALLOC, "out of memory"); break; }
        fs[i] = xent_file_create(dst[i], &tmp[i]);
        if (!fs[i]) { st = XENT_ERR_IO; break; }
        if (!xent__npy_write(fs[i], &ts[i]) || fflush(fs[i]) != 0 || ferror(fs[i]) ||
            fsync(fileno(fs[i])) != 0)
            st = xent_set_error(XENT_ERR_IO, "%s: write failed: %s", dst[i], strerror(errno));
    }
    /* all complete: rename each into place; else remove every temporary */
    int failed = st != XENT_OK;
    for (int i = 0; fs && i < n; i++) {
        if (!fs[i]) continue;
        if (failed) { fclose(fs[i]); remove(tmp[i]); free(tmp[i]); continue; }
        xent_status c = xent_file_commit(fs[i], tmp[i], dst[i], 1);
        if (!st && c) st = c;
    }
    for (int i = 0; dst && i < n; i++) free(dst[i]);
    free(dst), free(tmp), free(fs);
    return st;
}

xent_status xent_tensors_save(const char *path, const xent_tensor *ts, int n) {
    if (!path || (!ts && n > 0)) return xent_set_error(XENT_ERR_NULL, "xent_tensors_save: NULL argument");
    if (n < 1) return xent_set_error(XENT_ERR_VALUE, "xent_tensors_save: n = %d, need at least 1", n);
    for (int i = 0; i < n; i++) {
        xent_status st = check_tensor(&ts[i], i);
        if (st) return st;
        for (int k = 0; k < i; k++)
            if (!strcmp(ts[k].name, ts[i].name))
                return xent_set_error(XENT_ERR_VALUE, "tensors[%d]: duplicate name '%s'", i, ts[i].name);
    }
    if (ends_with(path, ".safetensors")) return xent__st_save(path, ts, n);
    if (!ends_with(path, ".npy"))
        return xent_set_error(XENT_ERR_VALUE, "%s: unknown extension (use .safetensors or .npy)", path);
    if (n == 1) return xent__npy_save(path, &ts[0]);
    for (int i = 0; i < n; i++) {
        if (!ts[i].name[0] || strchr(ts[i].name, '/'))
            return xent_set_error(XENT_ERR_VALUE, "tensors[%d]: name '%s' cannot form a file name", i,
                              ts[i].name);
    }
    return save_npy_set(path, ts, n);
}

FILE *xent_file_create(const char *path, char **tmp) {
    size_t n = strlen(path);
    char *t = malloc(n + 12);
    if (!t) {
        xent_set_error(XENT_ERR_ALLOC, "%s: out of memory", path);
        return NULL;
    }
    memcpy(t, path, n);
    memcpy(t + n, ".tmp.XXXXXX", 12);
    int fd = mkstemp(t);
    if (fd >= 0) fchmod(fd, 0644); /* mkstemp's 0600 would hide the output */
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f) {
        int err = errno;
        if (fd >= 0) { close(fd); remove(t); }
        free(t);
        xent_set_error(XENT_ERR_IO, "%s: cannot create: %s", path, strerror(err));
        return NULL;
    }
    *tmp = t;
    return f;
}

xent_status xent_file_commit(FILE *f, char *tmp, const char *path, int ok) {
    int err = ok ? 0 : errno;
    /* flushed to the disk before the rename, so that a crash cannot leave
     * PATH renamed but empty */
    if (ok && (fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0)) { ok = 0; err = errno; }
    if (fclose(f) != 0 && ok) { ok = 0; err = errno; }
    if (ok && rename(tmp, path) != 0) { ok = 0; err = errno; }
    if (!ok) remove(tmp);
    free(tmp);
    if (!ok) return xent_set_error(XENT_ERR_IO, "%s: write failed: %s", path, strerror(err));
    return XENT_OK;
}
