/* Q4_1 by bf16 activations: prompts' chunks (AVX512-BF16).
 *
 * A prompt's rows keep float precision (8-bit activations cost its first token's, see
 * native_decode.py), yet up to ~64 rows their products are bound by reading the weights:
 * bf16 weights are 16 bits each, these blocks 5. Each block's q in [0, 15] (Q5_K's in
 * [0, 31]) is exact in bf16, so sum(x * q) takes the activations rounded to bf16 (as
 * torch's bf16 products do) and exact weights, in vdpbf16ps pairs with float32 sums:
 * d * sum(x * q) + m * sum(x).
 *
 * One 32-byte vector of the kernel layout holds, per column c, k 8j..8j+3 (low nibbles)
 * and 8j+4..8j+7 (high); widened to 16 bits, word 4c + i is column c's k 8j + i, so
 * 32-bit lane 2c + h holds the pair k = 8j + 2h, +1 (the low nibbles) or 8j + 4 + 2h, +1
 * (the high): lane pairs (2c, 2c + 1) both belong to column c and are summed at the end.
 * The activations' operand is the row's 4 bf16 at those k, broadcast as 64 bits. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "gemm.h"

#if HAVE_BF16_GEMM
static inline __attribute__((always_inline)) void q4bf_tile_n(const Q4Matrix *W, int g0, int g1,
                                                              const Bf16Rows *q, int r0,
                                                              const int NR, float *y) {
    int K = W->k, N = W->n, nb = K / QK;
    /* bf16 of 0..31 (the float's high 16 bits), looked up by each 16-bit value: Q4_1's
     * and Q4_K's nibbles, Q5_K's with their fifth bits */
    const __m512i table = _mm512_setr_epi32(
        0x3F800000, 0x40404000, 0x40A04080, 0x40E040C0, 0x41104100, 0x41304120, 0x41504140,
        0x41704160, 0x41884180, 0x41984190, 0x41A841A0, 0x41B841B0, 0x41C841C0, 0x41D841D0,
        0x41E841E0, 0x41F841F0);
    const __m512i fifth = _mm512_set1_epi16(0x10);
    const __m512i nib = _mm512_set1_epi16(0x0F);
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14);
    for (int g = g0; g < g1; g++) {
        const uint8_t *wq = W->qs + (size_t)g * nb * 128;
        const uint8_t *wh = W->qh ? W->qh + (size_t)g * nb * 32 : NULL;
        __m512 acc[BF16_ROWS];
        for (int r = 0; r < NR; r++) acc[r] = _mm512_setzero_ps();
        for (int b = 0; b < nb; b++) {
            __m512 s[BF16_ROWS];
            for (int r = 0; r < NR; r++) s[r] = _mm512_setzero_ps();
            /* Q5_K's fifth bits: vector j's low nibbles take bit 2j, its high ones 2j + 1 */
            const __m512i hz = wh ? _mm512_cvtepu8_epi16(
                                        _mm256_loadu_si256((const __m256i *)(wh + (size_t)b * 32)))
                                  : _mm512_setzero_si512();
            for (int j = 0; j < 4; j++) {
                __m512i wz = _mm512_cvtepu8_epi16(
                    _mm256_loadu_si256((const __m256i *)(wq + (size_t)b * 128 + 32 * j)));
                __m512i ql = _mm512_and_si512(wz, nib), qu = _mm512_srli_epi16(wz, 4);
                if (wh) {
                    const __m512i tl = j < 2 ? _mm512_slli_epi16(hz, 4 - 2 * j)
                                             : _mm512_srli_epi16(hz, 2 * j - 4);
                    const __m512i tu = j < 2 ? _mm512_slli_epi16(hz, 3 - 2 * j)
                                             : _mm512_srli_epi16(hz, 2 * j - 3);
                    ql = _mm512_or_si512(ql, _mm512_and_si512(tl, fifth));
                    qu = _mm512_or_si512(qu, _mm512_and_si512(tu, fifth));
                }
                __m512bh lo = (__m512bh)_mm512_permutexvar_epi16(ql, table);
                __m512bh hi = (__m512bh)_mm512_permutexvar_epi16(qu, table);
                for (int r = 0; r < NR; r++) {
                    const uint16_t *xr = q->xb + (size_t)(r0 + r) * K + b * QK + 8 * j;
                    long long x0, x1;
                    memcpy(&x0, xr, 8);
                    memcpy(&x1, xr + 4, 8);
                    s[r] = _mm512_dpbf16_ps(s[r], lo, (__m512bh)_mm512_set1_epi64(x0));
                    s[r] = _mm512_dpbf16_ps(s[r], hi, (__m512bh)_mm512_set1_epi64(x1));
                }
            }
            __m256 d8, m8;
            q4_block_scales(W, (size_t)g, b, &d8, &m8);
            __m512 d16 = pair_scales(d8), m16 = pair_scales(m8);
            for (int r = 0; r < NR; r++) {
                acc[r] = _mm512_fmadd_ps(s[r], d16, acc[r]);
                /* m * sum(x) lands on both lanes of a column: half on each */
                acc[r] = _mm512_fmadd_ps(
                    m16, _mm512_set1_ps(0.5f * q->sx[(size_t)(r0 + r) * nb + b]), acc[r]);
            }
        }
        for (int r = 0; r < NR; r++) {
            __m512 both = _mm512_add_ps(acc[r], _mm512_permute_ps(acc[r], 0xB1));
            __m256 cols = _mm512_castps512_ps256(_mm512_permutexvar_ps(even, both));
            store_group(y + (size_t)(r0 + r) * N, g * GROUP, N, cols);
        }
    }
}

static void q4bf_tile(const Q4Matrix *W, int g0, int g1, const Bf16Rows *q, int r0, int nr,
                      float *y) {
    switch (nr) {
    case 1: q4bf_tile_n(W, g0, g1, q, r0, 1, y); break;
    case 2: q4bf_tile_n(W, g0, g1, q, r0, 2, y); break;
    case 3: q4bf_tile_n(W, g0, g1, q, r0, 3, y); break;
    case 4: q4bf_tile_n(W, g0, g1, q, r0, 4, y); break;
    case 5: q4bf_tile_n(W, g0, g1, q, r0, 5, y); break;
    case 6: q4bf_tile_n(W, g0, g1, q, r0, 6, y); break;
    case 7: q4bf_tile_n(W, g0, g1, q, r0, 7, y); break;
    default: q4bf_tile_n(W, g0, g1, q, r0, 8, y); break;
    }
}

typedef struct {
    const Q4Matrix *w;
    const Bf16Rows *q;
    int rows;
    float *y;
} Q4BfTask;

static void q4bf_chunk(void *arg, int c) {
    const Q4BfTask *t = (const Q4BfTask *)arg;
    int g0 = c * CHUNK_GROUPS, g1 = chunk_end(t->w->n, c);
    for (int r0 = 0; r0 < t->rows; r0 += BF16_ROWS)
        q4bf_tile(t->w, g0, g1, t->q, r0,
                  t->rows - r0 < BF16_ROWS ? t->rows - r0 : BF16_ROWS, t->y);
}

void q4_bf16_matmul(const Q4Matrix *w, const Bf16Rows *q, int rows, float *y, int nthreads) {
    Q4BfTask t = {w, q, rows, y};
    pool_run(q4bf_chunk, &t, chunks_of(w->n), nthreads);
}
#endif
