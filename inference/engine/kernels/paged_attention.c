/* Attention straight over the paged KV pool, for the torch path's steps (more rows than the
 * native small-step path takes).
 *
 * The torch path used to gather each decode group's blocks into one contiguous tensor
 * (index_select) and run SDPA over it with a padding mask: at 64 rows the gather alone cost
 * as much as the attention, and both grew with the longest context of the group. Here each
 * row reads its own blocks where they lie, once for all the query heads that share a KV head.
 *
 * Every row carries its position and the index of its sequence's block table, so decodes,
 * speculative guesses and prefill chunks are the same thing: a row attends over positions
 * 0..positions[r] of its sequence. All rows' K/V are written to the pool before any row
 * attends, so a chunk sees its own earlier tokens.
 *
 * Pool layout (model_runner.py): [2 * kv_heads, num_blocks, block_size, head_dim], keys are
 * heads [0, kv_heads), values the rest. Built once at run time like quant_gemm.c
 * (inference/engine/paged_attention.py: gcc -O3 -mavx2 -mfma).
 */
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

#define MAX_GROUP 16   /* query heads per KV head */
#define MAX_THREADS 64

typedef struct {
    int heads, kv_heads, head_dim, block_size, num_blocks;
    float scale;
    int kv_half; /* the pool's elements: float16, else float32 */
} PagedShape;

typedef struct {
    const PagedShape *s;
    const float *qkv;
    int rows;
    const int64_t *positions;
    const int32_t *row_seq;
    const int64_t *tables;
    int table_width;
    const void *pool;
    float *out;
    int max_ctx;
    int ith, nth;
    int failed;
} Task;

static inline float dot(const float *a, const float *b, int n) {
    int i = 0;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8)
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    float sum = hsum256(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

/* o += w * v over n floats. */
static inline void axpy(float *o, float w, const float *v, int n) {
    int i = 0;
    __m256 wv = _mm256_set1_ps(w);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(o + i, _mm256_fmadd_ps(wv, _mm256_loadu_ps(v + i), _mm256_loadu_ps(o + i)));
    for (; i < n; i++) o[i] += w * v[i];
}

/* One (row, KV head) item: the group's query heads over the row's context, in two passes
 * (scores, then the weighted values), each key and value row read once for the group. */
static void attend(const Task *t, int r, int g, float *scores, float *row) {
    const PagedShape *s = t->s;
    int d = s->head_dim, hq = s->heads, hkv = s->kv_heads, bs = s->block_size;
    int per = hq / hkv, nqkv = (hq + 2 * hkv) * d;
    size_t head_stride = (size_t)s->num_blocks * bs * d;
    const float *q = t->qkv + (size_t)r * nqkv + (size_t)g * per * d;
    const int64_t *table = t->tables + (size_t)t->row_seq[r] * t->table_width;
    int ctx = (int)t->positions[r] + 1;
    const size_t keys = g * head_stride, vals = (hkv + g) * head_stride;
    float mx[MAX_GROUP], sum[MAX_GROUP];
    for (int j = 0; j < per; j++) mx[j] = -INFINITY, sum[j] = 0.0f;
    for (int p0 = 0; p0 < ctx; p0 += bs) {
        const size_t kb = keys + (size_t)table[p0 / bs] * bs * d;
        int n = ctx - p0 < bs ? ctx - p0 : bs;
        for (int i = 0; i < n; i++) {
            const float *k = kv_floats(t->pool, kb + (size_t)i * d, d, s->kv_half, row);
            for (int j = 0; j < per; j++) {
                float v = dot(q + j * d, k, d) * s->scale;
                scores[(size_t)j * t->max_ctx + p0 + i] = v;
                if (v > mx[j]) mx[j] = v;
            }
        }
    }
    for (int j = 0; j < per; j++) {
        float *sc = scores + (size_t)j * t->max_ctx;
        for (int p = 0; p < ctx; p++) {
            sc[p] = expf(sc[p] - mx[j]);
            sum[j] += sc[p];
        }
    }
    float *o = t->out + ((size_t)r * hq + (size_t)g * per) * d;
    memset(o, 0, sizeof(float) * per * d);
    for (int p0 = 0; p0 < ctx; p0 += bs) {
        const size_t vb = vals + (size_t)table[p0 / bs] * bs * d;
        int n = ctx - p0 < bs ? ctx - p0 : bs;
        for (int i = 0; i < n; i++) {
            const float *v = kv_floats(t->pool, vb + (size_t)i * d, d, s->kv_half, row);
            for (int j = 0; j < per; j++)
                axpy(o + j * d, scores[(size_t)j * t->max_ctx + p0 + i], v, d);
        }
    }
    for (int j = 0; j < per; j++) {
        float inv = 1.0f / sum[j];
        for (int i = 0; i < d; i++) o[j * d + i] *= inv;
    }
}

static void *run_task(void *arg) {
    Task *t = (Task *)arg;
    int hkv = t->s->kv_heads, per = t->s->heads / hkv;
    float *scores = malloc(sizeof(float) * ((size_t)per * t->max_ctx + t->s->head_dim));
    if (!scores) {
        t->failed = 1;
        return NULL;
    }
    float *row = scores + (size_t)per * t->max_ctx; /* a half pool's key or value row */
    /* Contiguous ranges of items: a thread's rows of one sequence read the same blocks,
     * which stay in its cache from one row to the next. */
    long total = (long)t->rows * hkv;
    long i0 = total * t->ith / t->nth, i1 = total * (t->ith + 1) / t->nth;
    for (long item = i0; item < i1; item++) attend(t, (int)(item / hkv), (int)(item % hkv), scores, row);
    free(scores);
    return NULL;
}

/* qkv: [rows, (heads + 2 * kv_heads) * head_dim], rope applied; out: [rows, heads * head_dim].
 * Row r belongs to the sequence whose block table is tables[row_seq[r]] (table_width ids
 * each) and sits at positions[r]. Returns 0, or -1 (bad input or out of memory). */
int paged_attention(const PagedShape *s, const float *qkv, int rows, const int64_t *positions,
                    const int32_t *row_seq, const int64_t *tables, int num_tables,
                    int table_width, void *pool, float *out, int nthreads) {
    int d = s->head_dim, hq = s->heads, hkv = s->kv_heads, bs = s->block_size;
    if (rows <= 0) return 0;
    if (hkv <= 0 || hq % hkv || hq / hkv > MAX_GROUP || bs <= 0) return -1;
    int nqkv = (hq + 2 * hkv) * d;
    size_t head_stride = (size_t)s->num_blocks * bs * d;
    int max_ctx = 0;
    for (int r = 0; r < rows; r++) {
        int64_t pos = positions[r];
        int seq = row_seq[r];
        if (pos < 0 || seq < 0 || seq >= num_tables || pos / bs >= table_width) return -1;
        const int64_t *table = tables + (size_t)seq * table_width;
        for (int64_t b = 0; b <= pos / bs; b++)
            if (table[b] < 0 || table[b] >= s->num_blocks) return -1;
        if (pos + 1 > max_ctx) max_ctx = (int)pos + 1;
    }
    /* Checked first, written after: bad input leaves the pool as it was. */
    for (int r = 0; r < rows; r++) {
        int64_t pos = positions[r];
        const int64_t *table = tables + (size_t)row_seq[r] * table_width;
        int64_t slot = table[pos / bs] * bs + pos % bs;
        const float *row = qkv + (size_t)r * nqkv + (size_t)hq * d;
        for (int g = 0; g < 2 * hkv; g++)
            kv_put(pool, g * head_stride + slot * d, row + (size_t)g * d, d, s->kv_half);
    }
    if (nthreads < 1) nthreads = 1;
    if (nthreads > MAX_THREADS) nthreads = MAX_THREADS;
    if (nthreads > rows * hkv) nthreads = rows * hkv;
    Task tasks[MAX_THREADS];
    pthread_t threads[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int i = 0; i < nthreads; i++) {
        tasks[i] = (Task){s, qkv, rows, positions, row_seq, tables, table_width, pool, out,
                          max_ctx, i, nthreads, 0};
    }
    for (int i = 1; i < nthreads; i++)
        started[i] = pthread_create(&threads[i], NULL, run_task, &tasks[i]) == 0;
    run_task(&tasks[0]);
    /* A thread that could not start: its share runs here. */
    for (int i = 1; i < nthreads; i++) {
        if (started[i])
            pthread_join(threads[i], NULL);
        else
            run_task(&tasks[i]);
    }
    for (int i = 0; i < nthreads; i++)
        if (tasks[i].failed) return -1;
    return 0;
}
