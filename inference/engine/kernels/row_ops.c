/* The torch path's work between its products, for steps whose products run in the kernels'
 * pool (prompts' chunks, mixed steps; model.py's PoolRowOps): the residual add with the
 * next RMS norm, rope on q and k, SiLU(gate) * up. As torch ops they ran one after another
 * on the one thread torch keeps during such steps (~15% of a 384-token prompt's step:
 * python -m inference.bench.step_profile), each op a pass over memory: here each is one pass, fused, its rows spread over
 * the pool. Every row is computed alone, the same way whatever the step's other rows. The
 * native path's layers (decode_layer.c) use them too. */
#include <math.h>

#include "common.h"
#include "simd.h"
#include "simd_mappings.h"

#define ROWS_PER_CHUNK 8

static int row_chunks(int rows) { return (rows + ROWS_PER_CHUNK - 1) / ROWS_PER_CHUNK; }

/* ---- x += delta; out = RMSNorm(x) * w --------------------------------------------------- */

typedef struct {
    float *x;
    const float *delta; /* NULL: no residual to add */
    const float *w;
    float *out;
    int rows, n;
    float eps;
} NormTask;

static void norm_chunk(void *arg, int c) {
    const NormTask *t = arg;
    int n = t->n, r1 = (c + 1) * ROWS_PER_CHUNK;
    if (r1 > t->rows) r1 = t->rows;
    for (int r = c * ROWS_PER_CHUNK; r < r1; r++) {
        float *x = t->x + (size_t)r * n, *out = t->out + (size_t)r * n;
        const float *dl = t->delta ? t->delta + (size_t)r * n : NULL;
        __m256 acc = _mm256_setzero_ps();
        float tail = 0.0f;
        int i = 0;
        for (; i + 8 <= n; i += 8) {
            __m256 v = _mm256_loadu_ps(x + i);
            if (dl) {
                v = _mm256_add_ps(v, _mm256_loadu_ps(dl + i));
                _mm256_storeu_ps(x + i, v);
            }
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        for (; i < n; i++) {
            if (dl) x[i] += dl[i];
            tail += x[i] * x[i];
        }
        float inv = 1.0f / sqrtf((hsum256(acc) + tail) / (float)n + t->eps);
        __m256 s = _mm256_set1_ps(inv);
        for (i = 0; i + 8 <= n; i += 8)
            _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), s),
                                                    _mm256_loadu_ps(t->w + i)));
        for (; i < n; i++) out[i] = x[i] * inv * t->w[i];
    }
}

/* x [rows, n] += delta (unless NULL), then out [rows, n] = x / sqrt(mean(x^2) + eps) * w.
 * out may be delta itself: a row's delta is read whole before its out is written. */
void add_rms_norm(float *x, const float *delta, const float *w, int rows, int n, float eps,
                  float *out, int nthreads) {
    NormTask t = {x, delta, w, out, rows, n, eps};
    pool_run(norm_chunk, &t, row_chunks(rows), nthreads);
}

/* ---- rope on each row's first `heads` heads, in place (and its K/V into the pool) ---------- */

typedef struct {
    float *qkv;
    const float *cos, *sin; /* [rows, d]; sin with its first half negated */
    int rows, stride, heads, d;
    const KvPut *put; /* NULL: rotate only */
} RopeTask;

static void rope_chunk(void *arg, int c) {
    const RopeTask *t = arg;
    int d = t->d, half = d / 2, r1 = (c + 1) * ROWS_PER_CHUNK;
    if (r1 > t->rows) r1 = t->rows;
    float tmp[d];
    for (int r = c * ROWS_PER_CHUNK; r < r1; r++) {
        const float *cs = t->cos + (size_t)r * d, *sn = t->sin + (size_t)r * d;
        float *row = t->qkv + (size_t)r * t->stride;
        for (int h = 0; h < t->heads; h++) {
            float *x = row + (size_t)h * d;
            if (half % 8 == 0) {
                /* out[i] = x[i] cos[i] + x[i +- half] sin[i]: both halves whole vectors. */
                for (int i = 0; i < d; i += 8) {
                    int j = i < half ? i + half : i - half;
                    __m256 a = _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(cs + i));
                    __m256 b = _mm256_mul_ps(_mm256_loadu_ps(x + j), _mm256_loadu_ps(sn + i));
                    _mm256_storeu_ps(tmp + i, _mm256_add_ps(a, b));
                }
            } else {
                for (int i = 0; i < d; i++) tmp[i] = x[i] * cs[i] + x[(i + half) % d] * sn[i];
            }
            memcpy(x, tmp, sizeof(float) * (size_t)d);
        }
        const KvPut *p = t->put;
        if (p)
            for (int g = 0; g < p->count; g++)
                kv_put(p->pool, g * p->head_stride + (size_t)p->slots[r] * kv_row(d, p->type),
                       row + (size_t)(p->first + g) * d, d, p->type);
    }
}

void rope_put_rows(float *qkv, int rows, int stride, int heads, int d, const float *cos,
                   const float *sin, const KvPut *put, int nthreads) {
    RopeTask t = {qkv, cos, sin, rows, stride, heads, d, put};
    pool_run(rope_chunk, &t, row_chunks(rows), nthreads);
}

/* Rotates the first `heads` heads (of d floats each) of every row of qkv [rows, stride]. */
void rope_rows(float *qkv, int rows, int stride, int heads, int d, const float *cos,
               const float *sin, int nthreads) {
    rope_put_rows(qkv, rows, stride, heads, d, cos, sin, NULL, nthreads);
}

/* ---- SiLU(gate) * up ------------------------------------------------------------------------ */

typedef struct {
    const float *gu; /* [rows, 2 * n]: gate, then up */
    float *out;      /* [rows, n] */
    int rows, n;
} ActTask;

/* Over the build's vector width (simd_mappings.h): 512-bit where built, 0.8-0.9x the time
 * of 256-bit vectors from 16 to 512 rows of 1536; each lane's arithmetic (exp, the exact
 * division) is the same at either width, so are the results. */
static inline vec silu_times(vec g, vec u) {
    return vmul(vdiv(g, vadd(vset1(1.0f), vexp(vsub(vzero(), g)))), u);
}

static void act_chunk(void *arg, int c) {
    const ActTask *t = arg;
    int n = t->n, r1 = (c + 1) * ROWS_PER_CHUNK;
    if (r1 > t->rows) r1 = t->rows;
    for (int r = c * ROWS_PER_CHUNK; r < r1; r++) {
        const float *g = t->gu + (size_t)r * 2 * n, *u = g + n;
        float *out = t->out + (size_t)r * n;
        int i = 0;
        for (; i + VL <= n; i += VL) vstore(out + i, silu_times(vload(g + i), vload(u + i)));
        if (i < n) {
            const vmask m = vfirst(n - i);
            vstore_first(out + i, m, silu_times(vload_first(g + i, m), vload_first(u + i, m)));
        }
    }
}

/* out [rows, n] = SiLU(gu[:, :n]) * gu[:, n:]. */
void silu_mul(const float *gu, int rows, int n, float *out, int nthreads) {
    ActTask t = {gu, out, rows, n};
    pool_run(act_chunk, &t, row_chunks(rows), nthreads);
}
