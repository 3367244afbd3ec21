/* malloc interposer for tracing what LiteRT / XNNPACK allocate (dev-only, see README.md).
 *
 * Build:  gcc -shared -fPIC -O2 -o /tmp/mlog.so scripts/memdiag/mlog.c -ldl
 * Use:    MLOG=/tmp/model.log LD_PRELOAD=/tmp/mlog.so python scripts/memdiag/trace.py MODEL
 *
 * Every malloc / calloc / realloc / memalign / aligned_alloc / posix_memalign of at least
 * MLOG_MIN bytes (default 256) writes one line to the file MLOG names:
 *     KIND PTR BYTES OLD_PTR LIB+OFFSET SYMBOL [@OFFSET ...]
 * KIND: m malloc, c calloc, r realloc (OLD_PTR is freed), a aligned. LIB+OFFSET is the
 * immediate caller (dladdr); for requests of 16 KiB or more (every request with MLOG_BT set)
 * up to 5 further return addresses inside the LiteRT library follow as @OFFSET, so that
 * addr2line can name the XNNPACK / TFLite function behind a generic allocator. Every free
 * writes "f PTR", so a reader can tell which allocations are still live. `mlog_mark(name)`
 * writes "MARK name" (the driver marks read / interp / alloc / invoke1 / invoke2).
 * Only this wrapper's own allocations (dladdr, backtrace, snprintf) are skipped, by a
 * thread-local guard.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

static int fd = -1;
static __thread int busy = 0;
static long min_bytes = 256;

static void open_log(void) {
  const char *path = getenv("MLOG");
  if (!path) return;
  fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const char *min = getenv("MLOG_MIN");
  if (min) min_bytes = atol(min);
}

static const char *base_name(const char *path) {
  const char *slash = path ? strrchr(path, '/') : NULL;
  return slash ? slash + 1 : (path ? path : "?");
}

static void log_alloc(const char *kind, void *p, size_t n, void *old, void *caller) {
  if (busy) return;
  busy = 1;
  if (fd < 0) open_log();
  if (fd >= 0 && n >= (size_t)min_bytes) {
    Dl_info di;
    const char *lib = "?", *sym = "?";
    uintptr_t off = 0;
    if (caller && dladdr(caller, &di)) {
      lib = base_name(di.dli_fname);
      sym = di.dli_sname ? di.dli_sname : "?";
      off = (uintptr_t)caller - (uintptr_t)di.dli_fbase;
    }
    char b[1024];
    int m = snprintf(b, sizeof b, "%s %p %zu %p %s+%lx %s", kind, p, n, old, lib,
                     (unsigned long)off, sym);
    if (n >= 16384 || getenv("MLOG_BT")) {
      void *bt[7];
      int depth = backtrace(bt, 7);
      for (int i = 2; i < depth && m < 900; i++) {
        Dl_info d2;
        if (dladdr(bt[i], &d2) && d2.dli_fname && strstr(d2.dli_fname, "litert"))
          m += snprintf(b + m, sizeof b - m, " @%lx",
                        (unsigned long)((uintptr_t)bt[i] - (uintptr_t)d2.dli_fbase));
      }
    }
    b[m++] = '\n';
    if (write(fd, b, m) < 0) { /* nothing useful to do */ }
  }
  busy = 0;
}

void mlog_mark(const char *name) {
  if (fd < 0) open_log();
  if (fd < 0) return;
  char b[256];
  int m = snprintf(b, sizeof b, "MARK %s\n", name);
  if (write(fd, b, m) < 0) { /* ignore */ }
}

void *malloc(size_t n) {
  void *p = __libc_malloc(n);
  log_alloc("m", p, n, 0, __builtin_return_address(0));
  return p;
}

void *calloc(size_t a, size_t b) {
  void *p = __libc_calloc(a, b);
  log_alloc("c", p, a * b, 0, __builtin_return_address(0));
  return p;
}

static void log_free(void *p) {
  if (p && !busy && fd >= 0) {
    char b[64];
    int m = snprintf(b, sizeof b, "f %p\n", p);
    if (write(fd, b, m) < 0) { /* ignore */ }
  }
}

void *realloc(void *old, size_t n) {
  void *p = __libc_realloc(old, n);
  if (n < (size_t)min_bytes) log_free(old);   /* a logged block shrunk below the threshold */
  log_alloc("r", p, n, old, __builtin_return_address(0));
  return p;
}

void free(void *p) {
  log_free(p);
  __libc_free(p);
}

void *memalign(size_t a, size_t n) {
  void *p = __libc_memalign(a, n);
  log_alloc("a", p, n, 0, __builtin_return_address(0));
  return p;
}

void *aligned_alloc(size_t a, size_t n) {
  void *p = __libc_memalign(a, n);
  log_alloc("a", p, n, 0, __builtin_return_address(0));
  return p;
}

int posix_memalign(void **out, size_t a, size_t n) {
  void *p = __libc_memalign(a, n);
  if (!p) return ENOMEM;
  *out = p;
  log_alloc("a", p, n, 0, __builtin_return_address(0));
  return 0;
}
