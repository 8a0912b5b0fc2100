/* Q8_0 by int16 activations: the lm_head (the layout: common.h). A pair widened to int16
 * and multiplied by the pair of activations gives each column's two products summed in its
 * lane (|q * qx| < 2^22, 32 of them < 2^27: int32 holds a block). */
#include <immintrin.h>
#include <stdint.h>

#include "gemm.h"
#include "simd.h"

static inline __m256i dot16(__m256i acc, __m256i w, __m256i x) {
#if HAVE_VNNI
    return _mm256_dpwssd_epi32(acc, w, x);
#else
    /* in place: reassociated, the 16 pairs' products of 4 rows spilled */
    return add_into(acc, _mm256_madd_epi16(w, x));
#endif
}

static inline __attribute__((always_inline)) void q8_tile_n(const Q8Matrix *W, int g0, int g1,
                                                            const Wide *q, int r0, const int NR,
                                                            float *y) {
    int K = W->k, N = W->n, nb = K / QK;
    for (int g = g0; g < g1; g++) {
        const int8_t *wq = W->qs + (size_t)g * nb * 256;
        const float *wd = W->d + (size_t)g * nb * GROUP;
        __m256 acc[ROW_TILE];
        for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_ps();
        for (int b = 0; b < nb; b++) {
            const int8_t *wb = wq + (size_t)b * 256;
            __m256i s[ROW_TILE];
            for (int r = 0; r < NR; r++) s[r] = _mm256_setzero_si256();
            for (int p = 0; p < 16; p++) {
                __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wb + 16 * p)));
                for (int r = 0; r < NR; r++)
                    s[r] = dot16(s[r], w, bcast4(q->qx + (size_t)(r0 + r) * K + b * QK + 2 * p));
            }
            __m256 d8 = _mm256_loadu_ps(wd + b * GROUP);
            for (int r = 0; r < NR; r++) {
                __m256 sc = _mm256_mul_ps(d8, _mm256_set1_ps(q->dx[(size_t)(r0 + r) * nb + b]));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[r]), sc, acc[r]);
            }
        }
        for (int r = 0; r < NR; r++) store_group(y + (size_t)(r0 + r) * N, g * GROUP, N, acc[r]);
    }
}

static void q8_tile(const Q8Matrix *W, int g0, int g1, const Wide *q, int r0, int nr, float *y) {
    switch (nr) {
    case 1: q8_tile_n(W, g0, g1, q, r0, 1, y); break;
    case 2: q8_tile_n(W, g0, g1, q, r0, 2, y); break;
    case 3: q8_tile_n(W, g0, g1, q, r0, 3, y); break;
    default: q8_tile_n(W, g0, g1, q, r0, 4, y); break;
    }
}

typedef struct {
    const Q8Matrix *w;
    const Wide *q;
    int rows;
    float *y;
} Q8Task;

static void q8_chunk(void *arg, int c) {
    const Q8Task *t = (const Q8Task *)arg;
    int g0 = c * CHUNK_GROUPS, g1 = chunk_end(t->w->n, c);
    for (int r0 = 0; r0 < t->rows; r0 += ROW_TILE)
        q8_tile(t->w, g0, g1, t->q, r0, t->rows - r0 < ROW_TILE ? t->rows - r0 : ROW_TILE, t->y);
}

void q8_int16_matmul(const Q8Matrix *w, const Wide *q, int rows, float *y, int nthreads) {
    Q8Task t = {w, q, rows, y};
    pool_run(q8_chunk, &t, chunks_of(w->n), nthreads);
}
