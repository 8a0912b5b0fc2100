/* A small thread pool: the step's other cores (pool_run, pool_rows: common.h).
 *
 * A decode step calls ~150 tasks (products, attention) of 10-100 us each. Each task is cut
 * into chunks (128 output columns, or one attention head of one row) that the calling thread
 * and the workers claim one at a time from a shared counter. The caller never waits for a
 * worker that has not started: when the web side or another process holds a worker's core,
 * the caller runs that worker's share itself, and waits only for chunks a worker is already
 * running (a fixed split per thread measured ~7x slower than one thread when a neighbour
 * kept one of two cores busy). Workers spin briefly between the tasks of one step (a
 * hand-off costs well under a microsecond), then sleep until the next step wakes them.
 *
 * The counter holds the task's generation in its high 32 bits, and each task's description
 * sits in a ring slot tagged with its generation: a worker that claims late (after its task
 * ended and another began) gets an index of the new task or a void one, never a chunk of a
 * task that is gone. Tasks run one at a time (the lock makes a second caller wait).
 */
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "common.h"

#define MAX_THREADS 64
#define SPIN_NS 200000L /* a worker sleeps after this long without a task */
#define RING 4

typedef struct {
    _Atomic uint64_t head; /* generation << 32 | threads << 24 | chunks */
    chunk_fn fn;
    void *arg;
    atomic_int finished;
} Slot;

static struct {
    pthread_mutex_t run_lock, sleep_lock;
    pthread_cond_t wake;
    _Atomic uint64_t next; /* generation << 32 | the next chunk to claim */
    atomic_int sleepers;
    int workers;
    uint32_t gen;
    Slot slot[RING];
} pool = {.run_lock = PTHREAD_MUTEX_INITIALIZER,
          .sleep_lock = PTHREAD_MUTEX_INITIALIZER,
          .wake = PTHREAD_COND_INITIALIZER};

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

/* Claims and runs chunks of the newest task until none is left (or, for a worker, until
 * the task does not want this many threads). */
static void run_chunks(int id) {
    for (;;) {
        uint64_t v = atomic_fetch_add(&pool.next, 1);
        uint32_t g = (uint32_t)(v >> 32), i = (uint32_t)v;
        Slot *s = &pool.slot[g % RING];
        uint64_t h = atomic_load(&s->head);
        if ((uint32_t)(h >> 32) != g || i >= (uint32_t)(h & 0xFFFFFF)) return;
        s->fn(s->arg, (int)i);
        atomic_fetch_add(&s->finished, 1);
        if (id >= (int)((h >> 24) & 0xFF)) return;
    }
}

typedef struct {
    int id;
    uint32_t gen; /* the generation before the worker's first task */
} WorkerStart;

static void *pool_worker(void *p) {
    WorkerStart start = *(WorkerStart *)p;
    free(p);
    int id = start.id;
    uint32_t seen = start.gen;
    for (;;) {
        uint32_t g;
        long since = now_ns();
        int spins = 0;
        while ((g = (uint32_t)(atomic_load(&pool.next) >> 32)) == seen) {
            _mm_pause();
            if (++spins % 256 || now_ns() - since < SPIN_NS) continue;
            pthread_mutex_lock(&pool.sleep_lock);
            atomic_fetch_add(&pool.sleepers, 1);
            while ((uint32_t)(atomic_load(&pool.next) >> 32) == seen)
                pthread_cond_wait(&pool.wake, &pool.sleep_lock);
            atomic_fetch_sub(&pool.sleepers, 1);
            pthread_mutex_unlock(&pool.sleep_lock);
            since = now_ns();
        }
        seen = g;
        uint64_t h = atomic_load(&pool.slot[g % RING].head);
        if ((uint32_t)(h >> 32) == g && id < (int)((h >> 24) & 0xFF)) run_chunks(id);
    }
    return NULL;
}

/* A forked child has none of the parent's workers (fork copies only the calling thread):
 * it starts its own pool, rather than count on threads that do not exist there. */
static void pool_after_fork(void) {
    pthread_mutex_init(&pool.run_lock, NULL);
    pthread_mutex_init(&pool.sleep_lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    atomic_store(&pool.sleepers, 0);
    pool.workers = 0;
}

static pthread_once_t pool_once = PTHREAD_ONCE_INIT;

static void pool_init(void) { pthread_atfork(NULL, NULL, pool_after_fork); }

void pool_run(chunk_fn fn, void *arg, int chunks, int nth) {
    if (nth > MAX_THREADS) nth = MAX_THREADS;
    if (nth > chunks) nth = chunks;
    if (nth <= 1) {
        for (int c = 0; c < chunks; c++) fn(arg, c);
        return;
    }
    pthread_once(&pool_once, pool_init);
    pthread_mutex_lock(&pool.run_lock);
    while (pool.workers < nth - 1) {
        pthread_t t;
        pthread_attr_t attr;
        WorkerStart *start = malloc(sizeof(WorkerStart));
        if (!start) break;
        start->id = pool.workers + 1;
        start->gen = pool.gen;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int ok = pthread_create(&t, &attr, pool_worker, start) == 0;
        pthread_attr_destroy(&attr);
        if (!ok) {
            free(start);
            break;
        }
        pool.workers++;
    }
    if (nth > pool.workers + 1) nth = pool.workers + 1;
    uint32_t g = ++pool.gen;
    Slot *s = &pool.slot[g % RING];
    s->fn = fn;
    s->arg = arg;
    atomic_store(&s->finished, 0);
    atomic_store(&s->head, (uint64_t)g << 32 | (uint64_t)nth << 24 | (uint64_t)chunks);
    atomic_store(&pool.next, (uint64_t)g << 32);
    if (atomic_load(&pool.sleepers) > 0) {
        pthread_mutex_lock(&pool.sleep_lock);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.sleep_lock);
    }
    run_chunks(0);
    /* Only chunks a worker is running are left: a worker the OS took off its core is given
     * the core back rather than spun against. */
    for (int spins = 0; atomic_load(&s->finished) < chunks; spins++) {
        if (spins < 4096)
            _mm_pause();
        else
            sched_yield();
    }
    pthread_mutex_unlock(&pool.run_lock);
}

#define ROWS_A_CHUNK 8

typedef struct {
    row_fn fn;
    void *arg;
    int rows;
} RowsTask;

static void rows_chunk(void *arg, int c) {
    const RowsTask *t = (const RowsTask *)arg;
    for (int r = c * ROWS_A_CHUNK; r < (c + 1) * ROWS_A_CHUNK && r < t->rows; r++) t->fn(t->arg, r);
}

void pool_rows(row_fn fn, void *arg, int rows, int nth) {
    RowsTask t = {fn, arg, rows};
    pool_run(rows_chunk, &t, (rows + ROWS_A_CHUNK - 1) / ROWS_A_CHUNK, nth);
}
