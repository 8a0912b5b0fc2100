/* Weight-only block-quantized matrix products for small batches on x86 CPUs.
 *
 * y[r, n] = sum_k x[r, k] * W[n, k], where W is stored in blocks of 32 along k:
 *   Q4_1: W = d * q + m,  q in [0, 15] (the layers of the bundled GGUF);
 *   Q8_0: W = d * q,      q in [-127, 127] (its lm_head).
 * Activations are quantized per row and block (to int8 for Q4_1, as llama.cpp's q8_1; to
 * int16 for the head), so each block's dot product is integer multiply-adds:
 * d * dx * sum(q * qx) + m * dx * sum(qx). At one to a few rows the step is bound by the
 * weights' bytes, and Q4_1 reads 5 bits per weight instead of 16.
 *
 * The weights are in a kernel layout of their own, made at load from GGUF's (quantized.py,
 * `for_kernel`): columns in groups of 8, and within a group and a block, the weights of
 * 4 consecutive k of each column side by side, so a 32-byte vector holds 4 k x 8 columns.
 * A block then reduces over k with vertical adds, each column in its own 32-bit lane, and
 * its scales come as one vector of the group's 8 scales: no horizontal sums per column and
 * one float multiply-add per block for 8 columns: at one row the layers' products read
 * the weights at ~90% of the memory bandwidth, ~60% without (python -m
 * inference.bench.kernels --rows 1 2 4 8 reports the rate).
 *
 * This file: Q4_1 by int8 activations, a few rows a tile. Built per ISA (python -m
 * inference.engine.kernels.build); with AVX512-VNNI one instruction does the 8-bit and
 * 16-bit dot products that take two here.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "gemm.h"
#include "simd.h"

/* Half h of a block (wb: its 64 bytes, 16 k x 8 columns) into 4 vectors of q (0..15), in
 * the order of x's 4-byte groups: w[i] pairs with x[4i .. 4i + 3] of the half. Q5_K's (hb:
 * the block's 32 qh bytes; NULL for Q4_1 and Q4_K) take their fifth bits: 0..31. */
static inline __attribute__((always_inline)) void q4_unpack_half(const uint8_t *wb,
                                                                 const uint8_t *hb, int h,
                                                                 __m256i w[4]) {
    const __m256i mask = _mm256_set1_epi8(0x0F);
    for (int j = 0; j < 2; j++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(wb + 32 * j));
        w[2 * j] = _mm256_and_si256(v, mask);
        w[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
    }
    if (hb) {
        const __m256i top = _mm256_loadu_si256((const __m256i *)hb);
        for (int i = 0; i < 4; i++) w[i] = _mm256_or_si256(w[i], q5_top(top, 4 * h + i));
    }
}

#if HAVE_VNNI
/* Each column's sum(q * qx) over one block, in its lane: two chains of four, where one of
 * eight dependent vpdpbusd held a one-row product to their latency. */
static inline __m256i q4_block_dot(const __m256i w[8], const int8_t *xq) {
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
    for (int i = 0; i < 8; i += 2) {
        s0 = _mm256_dpbusd_epi32(s0, w[i], bcast4(xq + 4 * i));
        s1 = _mm256_dpbusd_epi32(s1, w[i + 1], bcast4(xq + 4 * i + 4));
    }
    return _mm256_add_epi32(s0, s1);
}
#endif

/* Row r0 + r's sums(q * qx) of block b for r < NR, each column in its lane: the block
 * unpacked once for the rows (hb: Q5_K's fifth bits, q4_unpack_half). Without VNNI the
 * pairs' products are summed in int16 first (8 x 2 x 15 x 127 < 32767: nothing saturates;
 * Q5_K's 0..31 are widened each half, 4 x 2 x 31 x 127 < 32767), and a block is unpacked
 * in halves (16 k: 4 vectors), each half's products added into every row's sums before
 * the next half is unpacked. AVX2's 16 registers then hold the tile: the whole block's 8
 * vectors and two accumulators a row spilled to the stack, and the layers' products took
 * 1.13-1.3x as long at 4-64 rows (python -m inference.bench.kernels --rows 4 8 16 32 64
 * --kinds int8, in the AVX2 build). */
static inline __attribute__((always_inline)) void q4_block_sums(const uint8_t *wb,
                                                                const uint8_t *hb,
                                                                const QuantizedRows *q, int K,
                                                                int b, int r0, const int NR,
                                                                __m256i s[ROW_TILE]) {
#if HAVE_VNNI
    __m256i w[8];
    q4_unpack_half(wb, hb, 0, w);
    q4_unpack_half(wb + 64, hb, 1, w + 4);
    for (int r = 0; r < NR; r++) s[r] = q4_block_dot(w, q->qx + (size_t)(r0 + r) * K + b * QK);
#else
    const __m256i ones = _mm256_set1_epi16(1);
    for (int r = 0; r < NR; r++) s[r] = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        __m256i w[4];
        q4_unpack_half(wb + 64 * h, hb, h, w);
        for (int r = 0; r < NR; r++) {
            const int8_t *xq = q->qx + (size_t)(r0 + r) * K + b * QK + 16 * h;
            if (hb) {
                __m256i t = _mm256_setzero_si256();
                for (int i = 0; i < 4; i++)
                    t = add16_into(t, _mm256_maddubs_epi16(w[i], bcast4(xq + 4 * i)));
                s[r] = add_into(s[r], _mm256_madd_epi16(t, ones));
                continue;
            }
            for (int i = 0; i < 4; i++)
                s[r] = add16_into(s[r], _mm256_maddubs_epi16(w[i], bcast4(xq + 4 * i)));
        }
    }
    if (!hb)
        for (int r = 0; r < NR; r++) s[r] = _mm256_madd_epi16(s[r], ones);
#endif
}

/* Rows r0 .. r0 + NR of y for groups g0 .. g1 of Q4_1 W. NR is a constant at each call
 * (q4_tile), so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void q4_tile_n(const Q4Matrix *W, int g0, int g1,
                                                            const QuantizedRows *q, int r0,
                                                            const int NR, float *y) {
    int K = W->k, N = W->n, nb = K / QK;
    for (int g = g0; g < g1; g++) {
        const uint8_t *wq = W->qs + (size_t)g * nb * 128;
        const uint16_t *wd = W->d + (size_t)g * nb * GROUP, *wm = W->m + (size_t)g * nb * GROUP;
        __m256 acc[ROW_TILE];
        for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_ps();
        for (int b = 0; b < nb; b++) {
            __m256i s[ROW_TILE];
            q4_block_sums(wq + (size_t)b * 128, NULL, q, K, b, r0, NR, s);
            __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wd + b * GROUP)));
            for (int r = 0; r < NR; r++) {
                size_t row = (size_t)(r0 + r);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[r]),
                                         _mm256_mul_ps(d8, _mm256_set1_ps(q->dx[row * nb + b])),
                                         acc[r]);
            }
        }
        /* The offsets' terms after the products: summed apart, as they always were (so the
         * results are the same to the bit), and not holding registers in the loop above. */
        __m256 accm[ROW_TILE];
        for (int r = 0; r < NR; r++) accm[r] = _mm256_setzero_ps();
        for (int b = 0; b < nb; b++) {
            __m256 m8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wm + b * GROUP)));
            for (int r = 0; r < NR; r++)
                accm[r] = _mm256_fmadd_ps(m8, _mm256_set1_ps(q->sx[(size_t)(r0 + r) * nb + b]),
                                          accm[r]);
        }
        for (int r = 0; r < NR; r++)
            store_group(y + (size_t)(r0 + r) * N, g * GROUP, N, _mm256_add_ps(acc[r], accm[r]));
    }
}

/* The 6-bit scale (or minimum) of block b's 8 columns as 32-bit integers. */
static inline __m256i k_sixes(const uint8_t *p, int b) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + (size_t)b * GROUP)));
}

/* The same for Q4_K W (Q5_K's where Q5, a constant at each call: its fifth bits too): a
 * block's integer sums times its 6-bit scale in integers, summed in float over the
 * super-block with the rows' dx, and the super-block's d applied once (the offsets
 * likewise with dmin): per block two instructions more than Q4_1's, against six for making
 * each block's float scales first (q4_block_scales, as the panels do). Q5_K's sums stay
 * within int32: 32 x 31 x 127 x 63 < 2^31. */
static inline __attribute__((always_inline)) void q4k_tile_n(const Q4Matrix *W, int g0, int g1,
                                                             const QuantizedRows *q, int r0,
                                                             const int NR, const int Q5,
                                                             float *y) {
    int K = W->k, N = W->n, nb = K / QK, ns = K / QK_K;
    for (int g = g0; g < g1; g++) {
        const uint8_t *wq = W->qs + (size_t)g * nb * 128;
        const uint8_t *wh = Q5 ? W->qh + (size_t)g * nb * 32 : NULL;
        const uint8_t *sc = W->sc + (size_t)g * nb * GROUP, *mn = W->mn + (size_t)g * nb * GROUP;
        const uint16_t *wd = W->d + (size_t)g * ns * GROUP, *wm = W->m + (size_t)g * ns * GROUP;
        __m256 acc[ROW_TILE];
        for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_ps();
        for (int sb = 0; sb < ns; sb++) {
            __m256 part[ROW_TILE];
            for (int r = 0; r < NR; r++) part[r] = _mm256_setzero_ps();
            for (int b = sb * (QK_K / QK); b < (sb + 1) * (QK_K / QK); b++) {
                __m256i s[ROW_TILE];
                q4_block_sums(wq + (size_t)b * 128, Q5 ? wh + (size_t)b * 32 : NULL, q, K, b, r0,
                              NR, s);
                const __m256i sc8 = k_sixes(sc, b);
                for (int r = 0; r < NR; r++)
                    part[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_mullo_epi32(s[r], sc8)),
                                              _mm256_set1_ps(q->dx[(size_t)(r0 + r) * nb + b]),
                                              part[r]);
            }
            const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wd + sb * GROUP)));
            for (int r = 0; r < NR; r++) acc[r] = _mm256_fmadd_ps(part[r], d8, acc[r]);
        }
        for (int sb = 0; sb < ns; sb++) {
            __m256 part[ROW_TILE];
            for (int r = 0; r < NR; r++) part[r] = _mm256_setzero_ps();
            for (int b = sb * (QK_K / QK); b < (sb + 1) * (QK_K / QK); b++) {
                const __m256 mn8 = _mm256_cvtepi32_ps(k_sixes(mn, b));
                for (int r = 0; r < NR; r++)
                    part[r] = _mm256_fmadd_ps(mn8, _mm256_set1_ps(q->sx[(size_t)(r0 + r) * nb + b]),
                                              part[r]);
            }
            const __m256 m8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wm + sb * GROUP)));
            for (int r = 0; r < NR; r++) acc[r] = _mm256_fmadd_ps(part[r], m8, acc[r]);
        }
        for (int r = 0; r < NR; r++) store_group(y + (size_t)(r0 + r) * N, g * GROUP, N, acc[r]);
    }
}

/* Products of at least this many rows take two groups a tile (q4_pair_tile) where built
 * for AVX512-VNNI, Q4_1's and the K-quants' (sc set); 0: never (kernels/__init__.py sets
 * cpu_backend's limits at load). */
static int pair_min_rows, pair_min_rows_k;

void set_pair_min_rows(int rows, int k_rows) {
    pair_min_rows = rows;
    pair_min_rows_k = k_rows;
}

/* Rows that share one unpacking of two groups' block (q4_pair_tile) for Q4_K and Q5_K:
 * Llama-1B's Q4_K layers took 0.94-0.97x of four rows' time at 8-32 rows; Q4_1's keep
 * ROW_TILE (eight took 1.03-1.05x at 16-32 rows). Both by an A/B of the two builds on
 * python -m inference.bench.kernels's shapes (--shapes llama-1b). */
#define PAIR_ROW_TILE 8

#if HAVE_VNNI
/* Two groups side by side (16 columns) in 512-bit vectors: the same sums, lane for lane, as
 * q4_tile_n's and q4k_tile_n's on each group alone (the same integer products, the same
 * float operations in the same order: the results are equal to the bit), in half the
 * instructions. That pays where a step is bound by the products' arithmetic: Q4_1's from
 * ~8 rows (at fewer its small matrices took longer), the K-quants' from one on a CPU whose
 * one-row product is bound by their scales' arithmetic (cpu_backend.PAIR_MIN_ROWS, per CPU). */
static inline __m512i pair256(const uint8_t *a, const uint8_t *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}

/* Both groups' block (wb: the first group's 128 bytes, the second's `next` bytes on) as 8
 * vectors of q (0..15), x's 4-byte groups in order; lanes 0..7 the first group's columns.
 * Q5_K's (hb: the first group's 32 qh bytes, the second's `hnext` on; NULL for Q4_1 and
 * Q4_K) take their fifth bits as q4_unpack_half's do: 0..31. */
static inline __attribute__((always_inline)) void q4_unpack_pair(const uint8_t *wb, size_t next,
                                                                 const uint8_t *hb, size_t hnext,
                                                                 __m512i w[8]) {
    const __m512i mask = _mm512_set1_epi8(0x0F);
    for (int j = 0; j < 4; j++) {
        const __m512i v = pair256(wb + 32 * j, wb + next + 32 * j);
        w[2 * j] = _mm512_and_si512(v, mask);
        w[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
    }
    if (hb) {
        const __m512i h = pair256(hb, hb + hnext), bit = _mm512_set1_epi8(0x10);
        for (int i = 0; i < 8; i++) {
            const __m512i t = i < 4 ? _mm512_slli_epi16(h, 4 - i) : _mm512_srli_epi16(h, i - 4);
            w[i] = _mm512_or_si512(w[i], _mm512_and_si512(t, bit));
        }
    }
}

/* Two chains of four, as q4_block_dot's: integer sums, so the same to the bit. */
static inline __m512i q4_pair_dot(const __m512i w[8], const int8_t *xq) {
    __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
    for (int i = 0; i < 8; i += 2) {
        int32_t v0, v1;
        memcpy(&v0, xq + 4 * i, 4);
        memcpy(&v1, xq + 4 * i + 4, 4);
        s0 = _mm512_dpbusd_epi32(s0, w[i], _mm512_set1_epi32(v0));
        s1 = _mm512_dpbusd_epi32(s1, w[i + 1], _mm512_set1_epi32(v1));
    }
    return _mm512_add_epi32(s0, s1);
}

/* 16 fp16 values, 8 at a and 8 at b, as float32. */
static inline __m512 ph_pair(const uint16_t *a, const uint16_t *b) {
    const __m256i h = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
        _mm_loadu_si128((const __m128i *)b), 1);
    return _mm512_cvtph_ps(h);
}

/* 16 uint8 values, 8 at a and 8 at b, as int32. */
static inline __m512i u8_pair(const uint8_t *a, const uint8_t *b) {
    return _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)a),
                                                   _mm_loadl_epi64((const __m128i *)b)));
}

static inline void store_pair(float *y, int col, int n, __m512 v) {
    store_group(y, col, n, _mm512_castps512_ps256(v));
    store_group(y, col + GROUP, n, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

/* Rows r0 .. r0 + NR of y for groups g and g + 1 of Q4_1 W (K4: Q4_K W, or Q5_K W where it
 * has fifth bits), as q4_tile_n and q4k_tile_n compute each group. */
static inline __attribute__((always_inline)) void q4_pair_tile_n(const Q4Matrix *W, int g,
                                                                 const QuantizedRows *q, int r0,
                                                                 const int NR, const int K4,
                                                                 float *y) {
    const int K = W->k, N = W->n, nb = K / QK, ns = K / QK_K;
    const size_t next = (size_t)nb * 128;
    const uint8_t *wq = W->qs + (size_t)g * next;
    __m512 acc[PAIR_ROW_TILE], accm[PAIR_ROW_TILE];
    for (int r = 0; r < NR; r++) acc[r] = accm[r] = _mm512_setzero_ps();
    if (K4) {
        const size_t bn = (size_t)nb * GROUP, sn = (size_t)ns * GROUP;
        const uint8_t *sc = W->sc + (size_t)g * bn, *mn = W->mn + (size_t)g * bn;
        const uint16_t *wd = W->d + (size_t)g * sn, *wm = W->m + (size_t)g * sn;
        const size_t hnext = (size_t)nb * 32;
        const uint8_t *wh = W->qh ? W->qh + (size_t)g * hnext : NULL;
        for (int sb = 0; sb < ns; sb++) {
            __m512 part[PAIR_ROW_TILE];
            for (int r = 0; r < NR; r++) part[r] = _mm512_setzero_ps();
            for (int b = sb * (QK_K / QK); b < (sb + 1) * (QK_K / QK); b++) {
                __m512i w[8];
                q4_unpack_pair(wq + (size_t)b * 128, next, wh ? wh + (size_t)b * 32 : NULL, hnext,
                               w);
                const __m512i sc16 = u8_pair(sc + b * GROUP, sc + bn + b * GROUP);
                for (int r = 0; r < NR; r++) {
                    const size_t row = (size_t)(r0 + r);
                    const __m512i s = q4_pair_dot(w, q->qx + row * K + b * QK);
                    part[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_mullo_epi32(s, sc16)),
                                              _mm512_set1_ps(q->dx[row * nb + b]), part[r]);
                }
            }
            const __m512 d16 = ph_pair(wd + sb * GROUP, wd + sn + sb * GROUP);
            for (int r = 0; r < NR; r++) acc[r] = _mm512_fmadd_ps(part[r], d16, acc[r]);
        }
        for (int sb = 0; sb < ns; sb++) {
            __m512 part[PAIR_ROW_TILE];
            for (int r = 0; r < NR; r++) part[r] = _mm512_setzero_ps();
            for (int b = sb * (QK_K / QK); b < (sb + 1) * (QK_K / QK); b++) {
                const __m512 mn16 = _mm512_cvtepi32_ps(u8_pair(mn + b * GROUP, mn + bn + b * GROUP));
                for (int r = 0; r < NR; r++)
                    part[r] = _mm512_fmadd_ps(
                        mn16, _mm512_set1_ps(q->sx[(size_t)(r0 + r) * nb + b]), part[r]);
            }
            const __m512 m16 = ph_pair(wm + sb * GROUP, wm + sn + sb * GROUP);
            for (int r = 0; r < NR; r++) acc[r] = _mm512_fmadd_ps(part[r], m16, acc[r]);
        }
    } else {
        const size_t bn = (size_t)nb * GROUP;
        const uint16_t *wd = W->d + (size_t)g * bn, *wm = W->m + (size_t)g * bn;
        for (int b = 0; b < nb; b++) {
            __m512i w[8];
            q4_unpack_pair(wq + (size_t)b * 128, next, NULL, 0, w);
            const __m512 d16 = ph_pair(wd + b * GROUP, wd + bn + b * GROUP);
            for (int r = 0; r < NR; r++) {
                const size_t row = (size_t)(r0 + r);
                const __m512i s = q4_pair_dot(w, q->qx + row * K + b * QK);
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s),
                                         _mm512_mul_ps(d16, _mm512_set1_ps(q->dx[row * nb + b])),
                                         acc[r]);
            }
        }
        for (int b = 0; b < nb; b++) {
            const __m512 m16 = ph_pair(wm + b * GROUP, wm + bn + b * GROUP);
            for (int r = 0; r < NR; r++)
                accm[r] = _mm512_fmadd_ps(m16, _mm512_set1_ps(q->sx[(size_t)(r0 + r) * nb + b]),
                                          accm[r]);
        }
        for (int r = 0; r < NR; r++) acc[r] = _mm512_add_ps(acc[r], accm[r]);
    }
    for (int r = 0; r < NR; r++) store_pair(y + (size_t)(r0 + r) * N, g * GROUP, N, acc[r]);
}

static void q4_pair_tile(const Q4Matrix *W, int g, const QuantizedRows *q, int r0, int nr,
                         const int K4, float *y) {
    switch (nr) {
    case 1: q4_pair_tile_n(W, g, q, r0, 1, K4, y); break;
    case 2: q4_pair_tile_n(W, g, q, r0, 2, K4, y); break;
    case 3: q4_pair_tile_n(W, g, q, r0, 3, K4, y); break;
    case 4: q4_pair_tile_n(W, g, q, r0, 4, K4, y); break;
    case PAIR_ROW_TILE: q4_pair_tile_n(W, g, q, r0, PAIR_ROW_TILE, K4, y); break;
    default:
        q4_pair_tile_n(W, g, q, r0, 4, K4, y);
        q4_pair_tile(W, g, q, r0 + 4, nr - 4, K4, y);
        break;
    }
}
#endif

/* q4k_tile_n for nr rows, each row count (and Q5, a constant at each call) compiled apart. */
static inline __attribute__((always_inline)) void q4k_tile(const Q4Matrix *W, int g0, int g1,
                                                           const QuantizedRows *q, int r0,
                                                           int nr, const int Q5, float *y) {
    switch (nr) {
    case 1: q4k_tile_n(W, g0, g1, q, r0, 1, Q5, y); break;
    case 2: q4k_tile_n(W, g0, g1, q, r0, 2, Q5, y); break;
    case 3: q4k_tile_n(W, g0, g1, q, r0, 3, Q5, y); break;
    default: q4k_tile_n(W, g0, g1, q, r0, 4, Q5, y); break;
    }
}

static void q4_tile(const Q4Matrix *W, int g0, int g1, const QuantizedRows *q, int r0, int nr,
                    float *y) {
    if (W->qh) {
        q4k_tile(W, g0, g1, q, r0, nr, 1, y);
        return;
    }
    if (W->sc) {
        q4k_tile(W, g0, g1, q, r0, nr, 0, y);
        return;
    }
    switch (nr) {
    case 1: q4_tile_n(W, g0, g1, q, r0, 1, y); break;
    case 2: q4_tile_n(W, g0, g1, q, r0, 2, y); break;
    case 3: q4_tile_n(W, g0, g1, q, r0, 3, y); break;
    default: q4_tile_n(W, g0, g1, q, r0, 4, y); break;
    }
}

typedef struct {
    const Q4Matrix *w;
    const QuantizedRows *q;
    int rows;
    float *y;
} Q4Task;

/* A chunk's columns for every row: its weights are read from memory once and stay in cache
 * for the later tiles of rows. */
static void q4_chunk(void *arg, int c) {
    const Q4Task *t = (const Q4Task *)arg;
    int g0 = c * CHUNK_GROUPS, g1 = chunk_end(t->w->n, c);
#if HAVE_VNNI
    const int k4 = t->w->sc != NULL, pair_rows = k4 ? pair_min_rows_k : pair_min_rows;
    if (pair_rows > 0 && t->rows >= pair_rows) {
        const int gp = g0 + ((g1 - g0) & ~1);
        const int tile = k4 ? PAIR_ROW_TILE : ROW_TILE;
        for (int r0 = 0; r0 < t->rows; r0 += tile) {
            const int nr = t->rows - r0 < tile ? t->rows - r0 : tile;
            for (int g = g0; g < gp; g += 2) q4_pair_tile(t->w, g, t->q, r0, nr, k4, t->y);
        }
        g0 = gp;
    }
#endif
    if (g0 == g1) return;
    for (int r0 = 0; r0 < t->rows; r0 += ROW_TILE)
        q4_tile(t->w, g0, g1, t->q, r0, t->rows - r0 < ROW_TILE ? t->rows - r0 : ROW_TILE, t->y);
}

void q4_int8_matmul(const Q4Matrix *w, const QuantizedRows *q, int rows, float *y,
                    int nthreads) {
    Q4Task t = {w, q, rows, y};
    pool_run(q4_chunk, &t, chunks_of(w->n), nthreads);
}
