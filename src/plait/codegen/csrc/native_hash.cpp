/* The native hasher (plait.codegen.native_hash): XXH3-128 digests of byte chunks on POSIX
   threads, without the GIL. Compiled as C++ inside the extern "C" block that
   plait.codegen.build.installed_library wraps it in; the XXH3 functions are the xxhash
   package's own, passed in by address (plait_hash_init).

   One chunk = the pieces [first[c], first[c + 1]); threads take chunks from a shared counter;
   each writes its chunk's canonical (big-endian) XXH3-128 digest at out + 16 * c. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct { uint64_t low64, high64; } h128;
typedef void *(*create_t)(void);
typedef int (*free_t)(void *);
typedef int (*reset_t)(void *);
typedef int (*update_t)(void *, const void *, size_t);
typedef h128 (*digest_t)(const void *);

static create_t f_create; static free_t f_free; static reset_t f_reset;
static update_t f_update; static digest_t f_digest;

void plait_hash_init(void *c, void *f, void *r, void *u, void *d) {
    f_create = (create_t)c; f_free = (free_t)f; f_reset = (reset_t)r;
    f_update = (update_t)u; f_digest = (digest_t)d;
}

typedef struct {
    const uint64_t *ptrs, *lens;   /* the pieces */
    const int64_t *first;          /* n_chunks + 1 offsets into the pieces */
    int64_t n_chunks, next;
    unsigned char *out;
    int n_threads, failed;
    pthread_t tids[64];
} job_t;

static void put_be(unsigned char *p, uint64_t v) {
    for (int i = 7; i >= 0; --i) { p[i] = (unsigned char)(v & 0xff); v >>= 8; }
}

static void *work(void *arg) {
    job_t *j = (job_t *)arg;
    void *state = f_create();
    if (!state) { __atomic_store_n(&j->failed, 1, __ATOMIC_SEQ_CST); return NULL; }
    for (;;) {
        int64_t c = __atomic_fetch_add(&j->next, 1, __ATOMIC_SEQ_CST);
        if (c >= j->n_chunks) break;
        f_reset(state);
        for (int64_t k = j->first[c]; k < j->first[c + 1]; ++k)
            f_update(state, (const void *)(uintptr_t)j->ptrs[k], (size_t)j->lens[k]);
        h128 h = f_digest(state);
        put_be(j->out + 16 * c, h.high64);
        put_be(j->out + 16 * c + 8, h.low64);
    }
    f_free(state);
    return NULL;
}

void *plait_hash_start(const uint64_t *ptrs, const uint64_t *lens, const int64_t *first,
                       int64_t n_chunks, unsigned char *out, int n_threads) {
    job_t *j = (job_t *)calloc(1, sizeof(job_t));
    if (!j) return NULL;
    j->ptrs = ptrs; j->lens = lens; j->first = first; j->n_chunks = n_chunks; j->out = out;
    if (n_threads < 1) n_threads = 1;
    if (n_threads > 64) n_threads = 64;
    for (int t = 0; t < n_threads; ++t) {
        if (pthread_create(&j->tids[t], NULL, work, j) != 0) break;
        j->n_threads = t + 1;
    }
    if (j->n_threads == 0) { work(j); }   /* no thread could start: hash here */
    return j;
}

int plait_hash_join(void *handle) {
    job_t *j = (job_t *)handle;
    for (int t = 0; t < j->n_threads; ++t) pthread_join(j->tids[t], NULL);
    int ok = !j->failed && j->next >= j->n_chunks;
    free(j);
    return ok;
}
