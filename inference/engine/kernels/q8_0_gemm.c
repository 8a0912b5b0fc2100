/* Q8_0 by int16 activations: the lm_head and a GGUF's 8-bit layers, and Q6_K the same way
 * (the layouts: common.h). A pair widened to int16 and multiplied by the pair of
 * activations gives each column's two products summed in its lane (|q * qx| < 2^22, 32 of
 * them < 2^27: int32 holds a block). */
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

/* Each row's sums of a Q8_0 block (its bytes at wb) with x's, each column in its lane. */
static inline __attribute__((always_inline)) void q8_pair_sums(const Q8Matrix *W, const int8_t *wb,
                                                               const Wide *q, size_t x0, int r0,
                                                               const int NR, __m256i s[ROW_TILE]) {
    for (int r = 0; r < NR; r++) s[r] = _mm256_setzero_si256();
    for (int p = 0; p < 16; p++) {
        __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wb + 16 * p)));
        for (int r = 0; r < NR; r++)
            s[r] = dot16(s[r], w, bcast4(q->qx + (size_t)(r0 + r) * W->k + x0 + 2 * p));
    }
}

/* Each row's sums of Q6_K block gb's k 0..15 (s) and 16..31 (h), its pairs unpacked two to a
 * vector (q6_pairs4). */
static inline __attribute__((always_inline)) void q6_half_sums(const Q8Matrix *W, size_t gb,
                                                               const Wide *q, size_t x0, int r0,
                                                               const int NR, __m256i s[ROW_TILE],
                                                               __m256i h[ROW_TILE]) {
    const __m256i off = _mm256_set1_epi8(32);
    for (int r = 0; r < NR; r++) s[r] = h[r] = _mm256_setzero_si256();
    for (int j = 0; j < 4; j++) {
        __m256i a, c;
        q6_pairs4(W, gb, j, &a, &c);
        a = _mm256_sub_epi8(a, off);
        c = _mm256_sub_epi8(c, off);
        const __m256i w[4] = {
            _mm256_cvtepi8_epi16(_mm256_castsi256_si128(a)),
            _mm256_cvtepi8_epi16(_mm256_extracti128_si256(a, 1)),
            _mm256_cvtepi8_epi16(_mm256_castsi256_si128(c)),
            _mm256_cvtepi8_epi16(_mm256_extracti128_si256(c, 1)),
        };
        for (int r = 0; r < NR; r++) {
            const int16_t *x = q->qx + (size_t)(r0 + r) * W->k + x0 + 4 * j;
            s[r] = dot16(dot16(s[r], w[0], bcast4(x)), w[1], bcast4(x + 2));
            h[r] = dot16(dot16(h[r], w[2], bcast4(x + 16)), w[3], bcast4(x + 18));
        }
    }
}

/* Q6_K's blocks split their sums at 16 k, where its scales change: each half's sums
 * (|q - 32| <= 32: < 2^24, exact in float32) times d * sc in float, a conversion and a
 * multiply-add a row more than Q8_0's one scale a block. */
static inline __attribute__((always_inline)) void q8_tile_n(const Q8Matrix *W, int g0, int g1,
                                                            const Wide *q, int r0, const int NR,
                                                            const int Q6, float *y) {
    int K = W->k, N = W->n, nb = K / QK;
    for (int g = g0; g < g1; g++) {
        const int8_t *wq = Q6 ? NULL : W->qs + (size_t)g * nb * 256;
        const float *wd = Q6 ? NULL : W->d + (size_t)g * nb * GROUP;
        __m256 acc[ROW_TILE];
        for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_ps();
        for (int b = 0; b < nb; b++) {
            const size_t gb = (size_t)g * nb + b, x0 = (size_t)b * QK;
            __m256i s[ROW_TILE];
            if (Q6) {
                __m256i h[ROW_TILE];
                __m256 lo, hi;
                q6_block_scales(W, (size_t)g, b, &lo, &hi);
                q6_half_sums(W, gb, q, x0, r0, NR, s, h);
                for (int r = 0; r < NR; r++) {
                    __m256 t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h[r]), hi,
                                               _mm256_mul_ps(_mm256_cvtepi32_ps(s[r]), lo));
                    acc[r] = _mm256_fmadd_ps(
                        t, _mm256_set1_ps(q->dx[(size_t)(r0 + r) * nb + b]), acc[r]);
                }
                continue;
            }
            q8_pair_sums(W, wq + (size_t)b * 256, q, x0, r0, NR, s);
            __m256 d8 = _mm256_loadu_ps(wd + b * GROUP);
            for (int r = 0; r < NR; r++) {
                __m256 sc = _mm256_mul_ps(d8, _mm256_set1_ps(q->dx[(size_t)(r0 + r) * nb + b]));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[r]), sc, acc[r]);
            }
        }
        for (int r = 0; r < NR; r++) store_group(y + (size_t)(r0 + r) * N, g * GROUP, N, acc[r]);
    }
}

/* A tile's call by its rows (nr, 1 to ROW_TILE), each a constant there. */
#define Q8_TILES(TILE, Q6)                                                                    \
    switch (nr) {                                                                             \
    case 1: TILE(W, g0, g1, q, r0, 1, Q6, y); break;                                          \
    case 2: TILE(W, g0, g1, q, r0, 2, Q6, y); break;                                          \
    case 3: TILE(W, g0, g1, q, r0, 3, Q6, y); break;                                          \
    default: TILE(W, g0, g1, q, r0, 4, Q6, y); break;                                         \
    }

/* A tile of nr rows for groups g0 .. g1, x in the activations its product takes (qv). */
typedef void (*q8_tile_fn)(const Q8Matrix *W, int g0, int g1, const void *qv, int r0, int nr,
                           float *y);

static void q8_tile(const Q8Matrix *W, int g0, int g1, const void *qv, int r0, int nr, float *y) {
    const Wide *q = (const Wide *)qv;
    if (W->sc) {
        Q8_TILES(q8_tile_n, 1)
    } else {
        Q8_TILES(q8_tile_n, 0)
    }
}

typedef struct {
    const Q8Matrix *w;
    const void *q;
    int rows;
    float *y;
    q8_tile_fn tile;
} Q8Task;

static void q8_chunk(void *arg, int c) {
    const Q8Task *t = (const Q8Task *)arg;
    int g0 = c * CHUNK_GROUPS, g1 = chunk_end(t->w->n, c);
    for (int r0 = 0; r0 < t->rows; r0 += ROW_TILE)
        t->tile(t->w, g0, g1, t->q, r0, t->rows - r0 < ROW_TILE ? t->rows - r0 : ROW_TILE, t->y);
}

void q8_int16_matmul(const Q8Matrix *w, const Wide *q, int rows, float *y, int nthreads) {
    Q8Task t = {w, q, rows, y, q8_tile};
    pool_run(q8_chunk, &t, chunks_of(w->n), nthreads);
}

#if HAVE_VNNI
/* Q8_0 by int8 activations (a GGUF's 8-bit layers, as llama.cpp takes them: q8_0
 * activations): vpdpbusd does 4 k of a column an instruction where the 16-bit product's
 * vpdpwssd does 2. Its first operand is unsigned, so the weights go in offset, q + 128
 * (0..255), and 128 times the block's sum(qx) (QuantizedRows.s16) comes off the integer sums
 * (32 x 255 x 127 < 2^31). Q6_K's q go in as they are (0..63), its pairs unpacked two to a
 * vector (q6_pairs4): a 2048 x 8192 Q6_K matrix's product took 0.75-0.83x the 16-bit one's
 * time at 1-8 rows; unpacked a pair at a time the 16-bit one had been faster. */

/* Rows r0 .. r0 + NR of y for groups g0 .. g1 of Q8_0 W by int8 x; of Q6_K W (Q6, a
 * constant at each call) its q (0..63) unsigned as they are, each half block's sums (its
 * scale's 16 k) from -32 times the half's sum(qx) (|sum| <= 16 x 63 x 127 + 32 x 16 x 127). */
static inline __attribute__((always_inline)) void q8u_tile_n(const Q8Matrix *W, int g0, int g1,
                                                             const QuantizedRows *q, int r0,
                                                             const int NR, const int Q6,
                                                             float *y) {
    const int K = W->k, N = W->n, nb = K / QK;
    for (int g = g0; g < g1; g++) {
        const int8_t *wq = Q6 ? NULL : W->qs + (size_t)g * nb * 256;
        const float *wd = Q6 ? NULL : W->d + (size_t)g * nb * GROUP;
        __m256 acc[ROW_TILE];
        for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_ps();
        for (int b = 0; b < nb; b++) {
            __m256i w[8];
            __m256 d8 = _mm256_setzero_ps(), lo = d8, hi = d8;
            if (Q6) {
                for (int j = 0; j < 4; j++) {
                    __m256i a, c;
                    q6_pairs4(W, (size_t)g * nb + b, j, &a, &c);
                    w[j] = quad_of_pair_vector(a);
                    w[4 + j] = quad_of_pair_vector(c);
                }
                q6_block_scales(W, (size_t)g, b, &lo, &hi);
            } else {
                for (int i = 0; i < 8; i++) {
                    const int8_t *wb = wq + (size_t)b * 256 + 32 * i;
                    w[i] = quad_of_pairs(q8_pair_u(wb), q8_pair_u(wb + 16));
                }
                d8 = _mm256_loadu_ps(wd + b * GROUP);
            }
            for (int r = 0; r < NR; r++) {
                const size_t row = (size_t)(r0 + r);
                const int8_t *xq = q->qx + row * K + b * QK;
                const int32_t *s16 = q->s16 + row * 2 * nb + 2 * b;
                const __m256 dx = _mm256_set1_ps(q->dx[row * nb + b]);
                if (Q6) {
                    __m256i sl = _mm256_set1_epi32(-32 * s16[0]);
                    __m256i sh = _mm256_set1_epi32(-32 * s16[1]);
                    for (int i = 0; i < 4; i++) {
                        sl = _mm256_dpbusd_epi32(sl, w[i], bcast4(xq + 4 * i));
                        sh = _mm256_dpbusd_epi32(sh, w[4 + i], bcast4(xq + 16 + 4 * i));
                    }
                    const __m256 t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sh), hi,
                                                     _mm256_mul_ps(_mm256_cvtepi32_ps(sl), lo));
                    acc[r] = _mm256_fmadd_ps(t, dx, acc[r]);
                    continue;
                }
                __m256i s = _mm256_set1_epi32(-128 * (s16[0] + s16[1]));
                for (int i = 0; i < 8; i++) s = _mm256_dpbusd_epi32(s, w[i], bcast4(xq + 4 * i));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d8, dx), acc[r]);
            }
        }
        for (int r = 0; r < NR; r++) store_group(y + (size_t)(r0 + r) * N, g * GROUP, N, acc[r]);
    }
}

static void q8u_tile(const Q8Matrix *W, int g0, int g1, const void *qv, int r0, int nr,
                     float *y) {
    const QuantizedRows *q = (const QuantizedRows *)qv;
    if (W->sc) {
        Q8_TILES(q8u_tile_n, 1)
    } else {
        Q8_TILES(q8u_tile_n, 0)
    }
}

void q8_int8_matmul(const Q8Matrix *w, const QuantizedRows *q, int rows, float *y,
                    int nthreads) {
    Q8Task t = {w, q, rows, y, q8u_tile};
    pool_run(q8_chunk, &t, chunks_of(w->n), nthreads);
}
#endif
