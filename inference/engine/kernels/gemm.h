/* What the products' C files share (activations.c, q4_1_gemm.c, q4_1_bf16_gemm.c,
 * q8_0_gemm.c, gemm_dispatch.c, decode_layer.c): the activations each weight format takes,
 * the column chunks the pool hands out, and each format's product over the pool. */
#ifndef CHATAPP_KERNELS_GEMM_H
#define CHATAPP_KERNELS_GEMM_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "common.h"

#define HIDDEN __attribute__((visibility("hidden")))

#define ROW_TILE 4  /* rows that share one unpacking of a weight block */

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define HAVE_VNNI 1
#else
#define HAVE_VNNI 0
#endif

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#define HAVE_BF16_GEMM 1
#else
#define HAVE_BF16_GEMM 0
#endif

static inline __m256i bcast4(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

static inline void store_group(float *y, int col, int n, __m256 v) {
    if (col + GROUP <= n) {
        _mm256_storeu_ps(y + col, v);
        return;
    }
    float tmp[GROUP];
    _mm256_storeu_ps(tmp, v);
    for (int c = 0; col + c < n; c++) y[col + c] = tmp[c];
}

/* ---- Activations (activations.c) ---------------------------------------------------------- */

typedef struct {
    int8_t *qx;
    float *dx, *sx; /* per row and block: the scale, and scale * sum(qx) */
    int32_t *s16;   /* per row and 16 k: sum(qx), where asked (the 8-bit Q8_0 and Q6_K
                     * products' offsets); else NULL */
} QuantizedRows;

/* x [rows, K] per block of 32 to int8 (Q4_1's products; `halves`: each 16's sum(qx) too,
 * s16), over the pool; -1 out of memory (free_rows then frees what was taken). */
HIDDEN int quantize_rows(const float *x, int rows, int K, QuantizedRows *out, int nthreads,
                         int halves);
HIDDEN void free_rows(QuantizedRows *q);

/* The head's input is the final hidden state, which has outliers ~30x its typical value:
 * at 8 bits they cost the rest of their block its precision (it flipped the first token of
 * a short factual answer), at 16 bits the product is as good as float32's. */
typedef struct {
    int16_t *qx;
    float *dx;
} Wide;

/* x [rows, K] per block of 32 to int16 (Q8_0's products); -1 out of memory. */
HIDDEN int quantize_rows16(const float *x, int rows, int K, Wide *out);

#if HAVE_BF16_GEMM
#define BF16_ROWS 8 /* rows that share one unpacking of a weight block */

typedef struct {
    uint16_t *xb; /* [rows][K] bf16 */
    float *sx;    /* [rows][K / 32]: each block's sum of x, in float32 */
} Bf16Rows;

/* x [rows, K] rounded to bf16, with each block's sum of the rounded x; -1 out of memory. */
HIDDEN int round_rows_bf16(const float *x, int rows, int K, Bf16Rows *out);
#endif

/* ---- The products, chunked for the pool ------------------------------------------------- */

#define CHUNK_GROUPS 16 /* 128 output columns a chunk */

static inline int chunks_of(int n) {
    return ((n + GROUP - 1) / GROUP + CHUNK_GROUPS - 1) / CHUNK_GROUPS;
}

/* The group after chunk c's last, for n columns. */
static inline int chunk_end(int n, int c) {
    int groups = (n + GROUP - 1) / GROUP, end = (c + 1) * CHUNK_GROUPS;
    return end < groups ? end : groups;
}

/* y [rows, N] = x @ W.T on the pool, from x already in each product's activations: Q4_1 by
 * int8 (q4_1_gemm.c), Q8_0 by int16 (q8_0_gemm.c), Q4_1 by bf16 (q4_1_bf16_gemm.c). */
HIDDEN void q4_int8_matmul(const Q4Matrix *w, const QuantizedRows *q, int rows, float *y,
                           int nthreads);
HIDDEN void q8_int16_matmul(const Q8Matrix *w, const Wide *q, int rows, float *y, int nthreads);
#if HAVE_VNNI
/* Q8_0 W by int8 x (quantized with its halves' sums), a few rows a tile (q8_0_gemm.c; the
 * panels', Q6_K's too: common.h). */
HIDDEN void q8_int8_matmul(const Q8Matrix *w, const QuantizedRows *q, int rows, float *y,
                           int nthreads);
#endif
#if HAVE_BF16_GEMM
HIDDEN void q4_bf16_matmul(const Q4Matrix *w, const Bf16Rows *q, int rows, float *y,
                           int nthreads);
#endif

/* y [rows, N] = x @ W.T for Q4_1 W, by the product a step of `as_rows` rows takes
 * (gemm_dispatch.c): AMX's tiles, the panels' or the grouped int8 tiles. as_rows is rows,
 * or fewer where rows must come out as a smaller step's would (a sequence's speculative
 * guesses: each product gives a row the same bits at any rows). 0, or -1 out of memory. */
HIDDEN int q4_matmul(const Q4Matrix *w, const float *x, int rows, int as_rows, float *y,
                     int nthreads);

/* y [rows, N] = x @ W.T for Q8_0 or Q6_K W by their 16-bit products, the panels from
 * panel_min_rows rows (q8_0_layers_gemm.c): the head past AMX's rows, and the 8-bit and
 * Q6_K layers. 0, or -1 out of memory. */
HIDDEN int q8_i16_matmul(const Q8Matrix *w, const float *x, int rows, float *y, int nthreads,
                         int panel_min_rows);

/* The same for a Q8_0 or Q6_K layer matrix on the native path (gemm_dispatch.c): with
 * AVX512-VNNI by 8-bit x (Q6_K below the head's panel rows by 16-bit), else as the torch
 * path's take them; the panels from the head's panel rows. 0, or -1 out of memory. */
HIDDEN int q8_layers_matmul(const Q8Matrix *w, const float *x, int rows, int as_rows, float *y,
                            int nthreads);

#endif
