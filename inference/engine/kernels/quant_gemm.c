/* Weight-only 4-bit (Q4_1) matrix products for small batches on x86 CPUs.
 *
 * y[r, n] = sum_k x[r, k] * W[n, k], where W is stored in blocks of 32 along k:
 *   Q4_1: W = d * q + m,  q in [0, 15].
 * Activations are quantized per row and block to int8 (a = dx * qx), so each block's dot
 * product is one integer multiply-add chain: d * dx * sum(q * qx) + m * dx * sum(qx).
 * At one to a few rows the step is bound by the weights' bytes, and this format reads
 * 5 bits per weight instead of 16.
 *
 * Q4_1 here is in a kernel layout of its own, made at load from GGUF's (quantized.py).
 * Built once at run time by inference/engine/kernels/__init__.py (gcc -O3 -mavx2 -mfma, and
 * the AVX512/VNNI flags where the CPU lists them).
 */
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define QK 32
#define ROW_TILE 4

static inline float hsum256(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* One row of x into int8 blocks: qx[K], dx[K/32] (scale), sx[K/32] (dx * sum(qx)). */
static void quantize_row(const float *x, int K, int8_t *qx, float *dx, float *sx) {
    for (int b = 0; b < K / QK; b++) {
        const float *xb = x + b * QK;
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(xb[j]));
        float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < QK; j++) {
            int q = (int)lrintf(xb[j] * id);
            qx[b * QK + j] = (int8_t)q;
            sum += q;
        }
        dx[b] = d;
        sx[b] = d * (float)sum;
    }
}

typedef struct {
    int8_t *qx;
    float *dx, *sx;
} QuantizedRows;

static int quantize_rows(const float *x, int rows, int K, QuantizedRows *out) {
    int nb = K / QK;
    out->qx = (int8_t *)aligned_alloc(32, (size_t)rows * K + 32);
    out->dx = (float *)malloc(sizeof(float) * (size_t)rows * nb);
    out->sx = (float *)malloc(sizeof(float) * (size_t)rows * nb);
    if (!out->qx || !out->dx || !out->sx) return -1;
    for (int r = 0; r < rows; r++)
        quantize_row(x + (size_t)r * K, K, out->qx + (size_t)r * K, out->dx + (size_t)r * nb,
                     out->sx + (size_t)r * nb);
    return 0;
}

static void free_rows(QuantizedRows *q) {
    free(q->qx);
    free(q->dx);
    free(q->sx);
}

static inline __m256 dot_u8_s8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    /* One instruction for the two below (and no 16-bit saturation on the way). */
    return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s));
#else
    const __m256i ones = _mm256_set1_epi16(1);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones));
#endif
}

/* sc[b] = d[b] * dx[b] for each block; returns sum(m[b] * sx[b]). Eight blocks at a time:
 * done one by one, this bookkeeping cost as much as the dot products themselves. */
static inline float block_scales(const uint16_t *d, const uint16_t *m, const float *dx,
                                 const float *sx, int nb, float *sc) {
    __m256 macc = _mm256_setzero_ps();
    int b = 0;
    for (; b + 8 <= nb; b += 8) {
        __m256 wd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + b)));
        __m256 wm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(m + b)));
        _mm256_storeu_ps(sc + b, _mm256_mul_ps(wd, _mm256_loadu_ps(dx + b)));
        macc = _mm256_fmadd_ps(wm, _mm256_loadu_ps(sx + b), macc);
    }
    float msum = hsum256(macc);
    for (; b < nb; b++) {
        sc[b] = _cvtsh_ss(d[b]) * dx[b];
        msum += _cvtsh_ss(m[b]) * sx[b];
    }
    return msum;
}

static void q4_1_rows(const uint8_t *qs, const uint16_t *d, const uint16_t *m, int n0, int n1,
                      int K, const QuantizedRows *q, int r0, int nr, float *y, int N) {
    int nb = K / QK;
    float sc[ROW_TILE][nb];
    const __m256i mask = _mm256_set1_epi8(0x0F);
    for (int n = n0; n < n1; n++) {
        const uint8_t *wq = qs + (size_t)n * (K / 2);
        const uint16_t *wd = d + (size_t)n * nb, *wm = m + (size_t)n * nb;
        __m256 acc[ROW_TILE];
        float msum[ROW_TILE];
        for (int r = 0; r < nr; r++) {
            size_t row = (size_t)(r0 + r);
            msum[r] = block_scales(wd, wm, q->dx + row * nb, q->sx + row * nb, nb, sc[r]);
            acc[r] = _mm256_setzero_ps();
        }
        for (int b = 0; b < nb; b += 2) {
            __m256i w = _mm256_loadu_si256((const __m256i *)(wq + b * 16));
            __m256i w0 = _mm256_and_si256(w, mask);
            __m256i w1 = _mm256_and_si256(_mm256_srli_epi16(w, 4), mask);
            for (int r = 0; r < nr; r++) {
                const int8_t *xq = q->qx + (size_t)(r0 + r) * K + b * QK;
                __m256i x0 = _mm256_load_si256((const __m256i *)xq);
                __m256i x1 = _mm256_load_si256((const __m256i *)(xq + QK));
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(sc[r][b]), dot_u8_s8(w0, x0), acc[r]);
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(sc[r][b + 1]), dot_u8_s8(w1, x1),
                                         acc[r]);
            }
        }
        for (int r = 0; r < nr; r++) y[(size_t)(r0 + r) * N + n] = hsum256(acc[r]) + msum[r];
    }
}

/* One row, in the kernel layout (Q4_1.for_kernel in quantized.py): byte j of a pair of
 * blocks holds element j of the first block in its low nibble and element j of the second
 * in its high nibble, so one 32-byte load and two masks give 64 weights; scales are fp16.
 * The per-block scale products and the minimum terms are short loops first, so the inner
 * loop is only integer dot products into two independent accumulators (one chain of FMAs
 * would wait on its own latency). */
static void q4_1_row1(const uint8_t *qs, const uint16_t *d, const uint16_t *m, int n0, int n1,
                      int K, const QuantizedRows *q, float *y) {
    int nb = K / QK;
    float sc[nb];
    const __m256i mask = _mm256_set1_epi8(0x0F);
    for (int n = n0; n < n1; n++) {
        const uint8_t *wq = qs + (size_t)n * (K / 2);
        const uint16_t *wd = d + (size_t)n * nb, *wm = m + (size_t)n * nb;
        float msum = block_scales(wd, wm, q->dx, q->sx, nb, sc);
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
        __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
        int b = 0;
        for (; b + 4 <= nb; b += 4) {
            __m256i w = _mm256_loadu_si256((const __m256i *)(wq + b * 16));
            __m256i v = _mm256_loadu_si256((const __m256i *)(wq + b * 16 + 32));
            const int8_t *xq = q->qx + b * QK;
            acc0 = _mm256_fmadd_ps(_mm256_set1_ps(sc[b]),
                                   dot_u8_s8(_mm256_and_si256(w, mask),
                                             _mm256_load_si256((const __m256i *)xq)), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_set1_ps(sc[b + 1]),
                                   dot_u8_s8(_mm256_and_si256(_mm256_srli_epi16(w, 4), mask),
                                             _mm256_load_si256((const __m256i *)(xq + QK))),
                                   acc1);
            acc2 = _mm256_fmadd_ps(_mm256_set1_ps(sc[b + 2]),
                                   dot_u8_s8(_mm256_and_si256(v, mask),
                                             _mm256_load_si256((const __m256i *)(xq + 2 * QK))),
                                   acc2);
            acc3 = _mm256_fmadd_ps(_mm256_set1_ps(sc[b + 3]),
                                   dot_u8_s8(_mm256_and_si256(_mm256_srli_epi16(v, 4), mask),
                                             _mm256_load_si256((const __m256i *)(xq + 3 * QK))),
                                   acc3);
        }
        for (; b < nb; b += 2) {
            __m256i w = _mm256_loadu_si256((const __m256i *)(wq + b * 16));
            __m256i w0 = _mm256_and_si256(w, mask);
            __m256i w1 = _mm256_and_si256(_mm256_srli_epi16(w, 4), mask);
            __m256i x0 = _mm256_load_si256((const __m256i *)(q->qx + b * QK));
            __m256i x1 = _mm256_load_si256((const __m256i *)(q->qx + (b + 1) * QK));
            acc0 = _mm256_fmadd_ps(_mm256_set1_ps(sc[b]), dot_u8_s8(w0, x0), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_set1_ps(sc[b + 1]), dot_u8_s8(w1, x1), acc1);
        }
        acc0 = _mm256_add_ps(acc0, acc2);
        acc1 = _mm256_add_ps(acc1, acc3);
        y[n] = hsum256(_mm256_add_ps(acc0, acc1)) + msum;
    }
}


/* ---- A small thread pool: the step's other cores ------------------------------------------
 *
 * A decode step calls ~120 matrix products of 20-100 us each. OpenMP's fork and join per
 * product, and a second OpenMP runtime beside torch's (each with its own spinning threads
 * on the same two cores), cost more than a second core gives. Here the workers spin
 * briefly between the tasks of one step (so a product's hand-off costs ~a microsecond),
 * then sleep until the next step wakes them. Tasks run one at a time (the engine steps from
 * one thread; the lock makes a second caller wait rather than mix tasks).
 */

typedef void (*task_fn)(void *arg, int ith, int nth);

#define MAX_THREADS 64
#define SPIN_NS 200000L /* a worker sleeps after this long without a task */

static struct {
    pthread_mutex_t run_lock, sleep_lock;
    pthread_cond_t wake;
    atomic_uint gen;
    atomic_int done, sleepers;
    int workers;
    task_fn fn;
    void *arg;
    int nth;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER};

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

typedef struct {
    int id;
    unsigned gen; /* the generation before the worker's first task */
} WorkerStart;

static void *pool_worker(void *p) {
    WorkerStart start = *(WorkerStart *)p;
    free(p);
    int id = start.id;
    unsigned seen = start.gen;
    for (;;) {
        unsigned g;
        long since = now_ns();
        int spins = 0;
        while ((g = atomic_load(&pool.gen)) == seen) {
            _mm_pause();
            if (++spins % 256 || now_ns() - since < SPIN_NS) continue;
            pthread_mutex_lock(&pool.sleep_lock);
            atomic_fetch_add(&pool.sleepers, 1);
            while (atomic_load(&pool.gen) == seen) pthread_cond_wait(&pool.wake, &pool.sleep_lock);
            atomic_fetch_sub(&pool.sleepers, 1);
            pthread_mutex_unlock(&pool.sleep_lock);
            since = now_ns();
        }
        seen = g;
        if (id < pool.nth) pool.fn(pool.arg, id, pool.nth);
        atomic_fetch_add(&pool.done, 1);
    }
    return NULL;
}

/* A forked child has none of the parent's workers (fork copies only the calling thread):
 * it starts its own pool, rather than wait for threads that do not exist there. */
static void pool_after_fork(void) {
    pthread_mutex_init(&pool.run_lock, NULL);
    pthread_mutex_init(&pool.sleep_lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    atomic_store(&pool.sleepers, 0);
    atomic_store(&pool.done, 0);
    pool.workers = 0;
}

static pthread_once_t pool_once = PTHREAD_ONCE_INIT;

static void pool_init(void) { pthread_atfork(NULL, NULL, pool_after_fork); }

/* fn(arg, i, nth) for i in 0..nth-1, i = 0 on the calling thread; returns when all are done. */
static void pool_run(task_fn fn, void *arg, int nth) {
    if (nth > MAX_THREADS) nth = MAX_THREADS;
    if (nth <= 1) {
        fn(arg, 0, 1);
        return;
    }
    pthread_once(&pool_once, pool_init);
    pthread_mutex_lock(&pool.run_lock);
    while (pool.workers < nth - 1) {
        pthread_t t;
        pthread_attr_t attr;
        WorkerStart *start = malloc(sizeof(WorkerStart));
        if (!start) break;
        /* A thread may first run after the task below was posted: it must count that one. */
        start->id = pool.workers + 1;
        start->gen = atomic_load(&pool.gen);
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
    pool.fn = fn;
    pool.arg = arg;
    pool.nth = nth;
    atomic_store(&pool.done, 0);
    atomic_fetch_add(&pool.gen, 1);
    if (atomic_load(&pool.sleepers) > 0) {
        pthread_mutex_lock(&pool.sleep_lock);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.sleep_lock);
    }
    fn(arg, 0, nth);
    /* A worker the OS took off its core (the web side runs on these cores too) is given the
     * core back rather than spun against. */
    for (int spins = 0; atomic_load(&pool.done) < pool.workers; spins++) {
        if (spins < 4096)
            _mm_pause();
        else
            sched_yield();
    }
    pthread_mutex_unlock(&pool.run_lock);
}

static inline void split(int total, int ith, int nth, int *lo, int *hi) {
    *lo = (int)((long)total * ith / nth);
    *hi = (int)((long)total * (ith + 1) / nth);
}

/* Output columns go to threads in chunks; each thread walks all rows for its columns, so a
 * weight block is read from memory once per tile of rows. */
#define CHUNK 32

typedef struct {
    const uint8_t *qs;
    const uint16_t *d, *m;
    int N, K, rows;
    const QuantizedRows *q;
    float *y;
} Q4Task;

static void q4_1_task(void *arg, int ith, int nth) {
    const Q4Task *t = (const Q4Task *)arg;
    int c0, c1;
    split((t->N + CHUNK - 1) / CHUNK, ith, nth, &c0, &c1);
    for (int c = c0; c < c1; c++) {
        int n0 = c * CHUNK, n1 = n0 + CHUNK < t->N ? n0 + CHUNK : t->N;
        if (t->rows == 1) {
            q4_1_row1(t->qs, t->d, t->m, n0, n1, t->K, t->q, t->y);
            continue;
        }
        for (int r0 = 0; r0 < t->rows; r0 += ROW_TILE) {
            int nr = t->rows - r0 < ROW_TILE ? t->rows - r0 : ROW_TILE;
            q4_1_rows(t->qs, t->d, t->m, n0, n1, t->K, t->q, r0, nr, t->y, t->N);
        }
    }
}

static void q4_1_gemm_rows(const uint8_t *qs, const uint16_t *d, const uint16_t *m, int N, int K,
                           const QuantizedRows *q, int rows, float *y, int nthreads) {
    Q4Task t = {qs, d, m, N, K, rows, q, y};
    pool_run(q4_1_task, &t, nthreads);
}

int q4_1_gemm(const uint8_t *qs, const uint16_t *d, const uint16_t *m, int N, int K,
              const float *x, int rows, float *y, int nthreads) {
    if (K % (2 * QK)) return -2;
    QuantizedRows q;
    if (quantize_rows(x, rows, K, &q)) return -1;
    q4_1_gemm_rows(qs, d, m, N, K, &q, rows, y, nthreads);
    free_rows(&q);
    return 0;
}

/* ---- Q8_0 (W = d * q, q in [-127, 127]) by 16-bit activations: the lm_head -----------
 *
 * The head's input is the final hidden state, which has outliers ~30x its typical value:
 * at 8 bits they cost the rest of their block its precision (it flipped the first token of
 * a short factual answer), at 16 bits the product is as good as float32's. Each block's dot
 * product is still integers: sum(q * qx) in int32 (|q * qx| < 2^22, 32 of them < 2^27).
 */

typedef struct {
    int16_t *qx;
    float *dx;
} Wide;

static int quantize_rows16(const float *x, int rows, int K, Wide *out) {
    int nb = K / QK;
    out->qx = (int16_t *)aligned_alloc(64, sizeof(int16_t) * (size_t)rows * K + 64);
    out->dx = (float *)malloc(sizeof(float) * (size_t)rows * nb);
    if (!out->qx || !out->dx) return -1;
    for (int r = 0; r < rows; r++) {
        for (int b = 0; b < nb; b++) {
            const float *xb = x + (size_t)r * K + b * QK;
            float amax = 0.0f;
            for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(xb[j]));
            float d = amax / 32767.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
            int16_t *q = out->qx + (size_t)r * K + b * QK;
            for (int j = 0; j < QK; j++) q[j] = (int16_t)lrintf(xb[j] * id);
            out->dx[(size_t)r * nb + b] = d;
        }
    }
    return 0;
}

/* One block of 32 int8 weights widened to int16 once, then multiplied by each row's int16
 * activations: pairs summed into int32 lanes (8 with AVX2's two halves, 16 with AVX512). */
#if defined(__AVX512BW__)
typedef __m512i W16;
typedef __m512 F32;
static inline W16 widen_block(const int8_t *w) {
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)w));
}
static inline F32 dot_block(W16 w, const int16_t *x) {
    return _mm512_cvtepi32_ps(_mm512_madd_epi16(w, _mm512_load_si512((const void *)x)));
}
#define F32_ZERO _mm512_setzero_ps
#define F32_FMA(s, v, a) _mm512_fmadd_ps(_mm512_set1_ps(s), (v), (a))
#define F32_ADD _mm512_add_ps
#define F32_SUM _mm512_reduce_add_ps
#else
typedef struct {
    __m256i lo, hi;
} W16;
typedef __m256 F32;
static inline W16 widen_block(const int8_t *w) {
    W16 v = {_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w)),
             _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 16)))};
    return v;
}
static inline F32 dot_block(W16 w, const int16_t *x) {
    __m256i p = _mm256_add_epi32(_mm256_madd_epi16(w.lo, _mm256_load_si256((const __m256i *)x)),
                                 _mm256_madd_epi16(w.hi, _mm256_load_si256((const __m256i *)(x + 16))));
    return _mm256_cvtepi32_ps(p);
}
#define F32_ZERO _mm256_setzero_ps
#define F32_FMA(s, v, a) _mm256_fmadd_ps(_mm256_set1_ps(s), (v), (a))
#define F32_ADD _mm256_add_ps
#define F32_SUM hsum256
#endif

/* Rows r0 .. r0 + nr (nr <= ROW_TILE) of y for columns n0 .. n1: each weight block is
 * widened once for all the rows; two accumulators per row, since one FMA chain would wait
 * on its own latency. */
static void q8_0_rows(const int8_t *qs, const float *d, int n0, int n1, int K, const Wide *q,
                      int r0, int nr, float *y, int N) {
    int nb = K / QK;
    float sc[ROW_TILE][nb];
    for (int n = n0; n < n1; n++) {
        const int8_t *wq = qs + (size_t)n * K;
        const float *wd = d + (size_t)n * nb;
        F32 a0[ROW_TILE], a1[ROW_TILE];
        for (int r = 0; r < nr; r++) {
            const float *dx = q->dx + (size_t)(r0 + r) * nb;
            for (int b = 0; b < nb; b++) sc[r][b] = wd[b] * dx[b];
            a0[r] = F32_ZERO();
            a1[r] = F32_ZERO();
        }
        int b = 0;
        for (; b + 2 <= nb; b += 2) {
            W16 w0 = widen_block(wq + b * QK), w1 = widen_block(wq + (b + 1) * QK);
            for (int r = 0; r < nr; r++) {
                const int16_t *xq = q->qx + (size_t)(r0 + r) * K + b * QK;
                a0[r] = F32_FMA(sc[r][b], dot_block(w0, xq), a0[r]);
                a1[r] = F32_FMA(sc[r][b + 1], dot_block(w1, xq + QK), a1[r]);
            }
        }
        for (; b < nb; b++) {
            W16 w0 = widen_block(wq + b * QK);
            for (int r = 0; r < nr; r++)
                a0[r] = F32_FMA(sc[r][b], dot_block(w0, q->qx + (size_t)(r0 + r) * K + b * QK),
                                a0[r]);
        }
        for (int r = 0; r < nr; r++) y[(size_t)(r0 + r) * N + n] = F32_SUM(F32_ADD(a0[r], a1[r]));
    }
}

typedef struct {
    const int8_t *qs;
    const float *d;
    int N, K, rows;
    const Wide *q;
    float *y;
} Q8Task;

static void q8_0_task(void *arg, int ith, int nth) {
    const Q8Task *t = (const Q8Task *)arg;
    int c0, c1;
    split((t->N + CHUNK - 1) / CHUNK, ith, nth, &c0, &c1);
    for (int c = c0; c < c1; c++) {
        int n0 = c * CHUNK, n1 = n0 + CHUNK < t->N ? n0 + CHUNK : t->N;
        for (int r0 = 0; r0 < t->rows; r0 += ROW_TILE)
            q8_0_rows(t->qs, t->d, n0, n1, t->K, t->q, r0,
                      t->rows - r0 < ROW_TILE ? t->rows - r0 : ROW_TILE, t->y, t->N);
    }
}

/* y [rows, N] = x [rows, K] @ W.T for Q8_0 W (qs int8 [N, K], d float32 [N, K / 32]).
 * Rows walk inside each column chunk, so a chunk of weights is read once for the step
 * (they stay in L1/L2 for the second and later rows). */
int q8_0_gemm(const int8_t *qs, const float *d, int N, int K, const float *x, int rows,
              float *y, int nthreads) {
    if (K % QK) return -2;
    Wide q;
    if (quantize_rows16(x, rows, K, &q)) {
        free(q.qx);
        free(q.dx);
        return -1;
    }
    Q8Task t = {qs, d, N, K, rows, &q, y};
    pool_run(q8_0_task, &t, nthreads);
    free(q.qx);
    free(q.dx);
    return 0;
}

/* ---- A whole decoder layer for a decode step of a few rows ------------------------------
 *
 * The same maths as LlamaModel.forward (model.py) for rows that each decode one token: RMS
 * norm, the fused q/k/v product, rope, the new K/V into the paged pool, attention over each
 * row's blocks, o, residual, norm, gate/up, SiLU, down, residual. In torch this is ~30
 * small ops a layer whose dispatch cost more than the 4-bit matrix products themselves.
 */

typedef struct {
    const uint8_t *qs;
    const uint16_t *d, *m;
    int n, k;
} Q4Matrix;

typedef struct {
    const float *input_norm, *post_norm;
    Q4Matrix qkv, o, gate_up, down;
} LayerWeights;

typedef struct {
    int hidden, heads, kv_heads, head_dim, inter;
    float eps, scale;
    int block_size, num_blocks;  /* pool: [2 * kv_heads, num_blocks * block_size, head_dim] */
} LayerShape;

static void rms_norm(const float *x, const float *w, int n, float eps, float *out) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * inv * w[i];
}

static int q4_matmul(const Q4Matrix *w, const float *x, int rows, float *y, int nthreads) {
    QuantizedRows q;
    if (quantize_rows(x, rows, w->k, &q)) return -1;
    q4_1_gemm_rows(w->qs, w->d, w->m, w->n, w->k, &q, rows, y, nthreads);
    free_rows(&q);
    return 0;
}

/* x * cos + roll(x, d / 2) * sin_rot (sin_rot: sin with its first half negated). */
static void rope(float *x, const float *cos, const float *sin, int d) {
    float tmp[d];
    int half = d / 2;
    for (int i = 0; i < d; i++) tmp[i] = x[i] * cos[i] + x[(i + half) % d] * sin[i];
    memcpy(x, tmp, sizeof(float) * d);
}

/* A float dot product: -O3 alone keeps a reduction scalar (it may not reorder the sum),
 * which made attention over a long context the slowest part of a decode step. */
static inline float dot_f32(const float *a, const float *b, int n) {
    int i = 0;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    float sum = hsum256(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

typedef struct {
    const LayerShape *s;
    const float *qkv;
    float *attn;
    const int64_t *positions, *block_tables;
    int table_width;
    const float *pool;
    int rows, max_ctx;
    atomic_int failed;
} AttnTask;

/* Each row's query heads over the positions up to its own, (row, head) pairs split across
 * the threads. */
static void attention_task(void *arg, int ith, int nth) {
    AttnTask *t = (AttnTask *)arg;
    const LayerShape *s = t->s;
    int d = s->head_dim, hq = s->heads, hkv = s->kv_heads, bs = s->block_size;
    int nqkv = (hq + 2 * hkv) * d;
    size_t head_stride = (size_t)s->num_blocks * bs * d;
    float *scores = malloc(sizeof(float) * t->max_ctx);
    if (!scores) {
        atomic_store(&t->failed, 1);
        return;
    }
    int i0, i1;
    split(t->rows * hq, ith, nth, &i0, &i1);
    for (int item = i0; item < i1; item++) {
        int r = item / hq, head = item % hq;
        const float *q = t->qkv + (size_t)r * nqkv + head * d;
        const int64_t *table = t->block_tables + (size_t)r * t->table_width;
        int ctx = (int)t->positions[r] + 1;
        int g = head / (hq / hkv);
        const float *keys = t->pool + g * head_stride, *vals = t->pool + (hkv + g) * head_stride;
        float mx = -INFINITY;
        for (int p = 0; p < ctx; p++) {
            scores[p] = dot_f32(q, keys + (table[p / bs] * bs + p % bs) * d, d) * s->scale;
            if (scores[p] > mx) mx = scores[p];
        }
        float sum = 0.0f;
        for (int p = 0; p < ctx; p++) {
            scores[p] = expf(scores[p] - mx);
            sum += scores[p];
        }
        float *o = t->attn + ((size_t)r * hq + head) * d, inv = 1.0f / sum;
        for (int i = 0; i < d; i++) o[i] = 0.0f;
        for (int p = 0; p < ctx; p++) {
            const float *v = vals + (table[p / bs] * bs + p % bs) * d;
            float w = scores[p] * inv;
            for (int i = 0; i < d; i++) o[i] += w * v[i];
        }
    }
    free(scores);
}

int decode_layer(const LayerShape *s, const LayerWeights *w, float *x, int rows,
                 const int64_t *positions, const float *cos, const float *sin,
                 const int64_t *block_tables, int table_width, float *pool, int nthreads) {
    int H = s->hidden, d = s->head_dim, hq = s->heads, hkv = s->kv_heads;
    int nqkv = (hq + 2 * hkv) * d, bs = s->block_size;
    size_t head_stride = (size_t)s->num_blocks * bs * d;
    int max_ctx = 0;
    for (int r = 0; r < rows; r++)
        if (positions[r] + 1 > max_ctx) max_ctx = (int)positions[r] + 1;
    float *h = malloc(sizeof(float) * rows * H);
    float *qkv = malloc(sizeof(float) * rows * nqkv);
    float *attn = malloc(sizeof(float) * rows * hq * d);
    float *gu = malloc(sizeof(float) * rows * 2 * s->inter);
    int rc = -1;
    if (!h || !qkv || !attn || !gu) goto out;

    for (int r = 0; r < rows; r++) rms_norm(x + r * H, w->input_norm, H, s->eps, h + r * H);
    if (q4_matmul(&w->qkv, h, rows, qkv, nthreads)) goto out;
    for (int r = 0; r < rows; r++) {
        float *row = qkv + (size_t)r * nqkv;
        const float *c = cos + (size_t)r * d, *sn = sin + (size_t)r * d;
        for (int head = 0; head < hq + hkv; head++) rope(row + head * d, c, sn, d);
        int64_t pos = positions[r];
        const int64_t *table = block_tables + (size_t)r * table_width;
        int64_t slot = table[pos / bs] * bs + pos % bs;
        for (int g = 0; g < 2 * hkv; g++)
            memcpy(pool + g * head_stride + slot * d, row + (hq + g) * d, sizeof(float) * d);
    }
    AttnTask at = {s, qkv, attn, positions, block_tables, table_width, pool, rows, max_ctx, 0};
    pool_run(attention_task, &at, nthreads);
    if (at.failed) goto out;
    if (q4_matmul(&w->o, attn, rows, h, nthreads)) goto out;
    for (int i = 0; i < rows * H; i++) x[i] += h[i];
    for (int r = 0; r < rows; r++) rms_norm(x + r * H, w->post_norm, H, s->eps, h + r * H);
    if (q4_matmul(&w->gate_up, h, rows, gu, nthreads)) goto out;
    int I = s->inter;
    /* SiLU(gate) * up, packed densely in place: row r's I results go to gu + r * I, which
     * never overlaps a value still to be read (those sit at gu + 2 * r * I and later). */
    for (int r = 0; r < rows; r++) {
        const float *g = gu + (size_t)r * 2 * I;
        float *act = gu + (size_t)r * I;
        for (int i = 0; i < I; i++) {
            float a = g[i], u = g[I + i];
            act[i] = a / (1.0f + expf(-a)) * u;
        }
    }
    if (q4_matmul(&w->down, gu, rows, h, nthreads)) goto out;
    for (int i = 0; i < rows * H; i++) x[i] += h[i];
    rc = 0;
out:
    free(h);
    free(qkv);
    free(attn);
    free(gu);
    return rc;
}
