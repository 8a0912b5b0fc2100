/* What the kernels' C files share: the weights' kernel layouts, the thread pool
 * (thread_pool.c), and the products on AMX tiles (amx_gemm.c). */
#ifndef CHATAPP_KERNELS_COMMON_H
#define CHATAPP_KERNELS_COMMON_H
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#define QK 32   /* weights a block, along k */
#define GROUP 8 /* columns side by side in the kernel layout */

#define QK_K 256 /* weights a k-quant super-block, along k: 8 blocks */

/* Q4_1 in the kernel layout (q4_1_gemm.c): per group of 8 columns and block, 128 bytes of
 * nibbles, 4 vectors of 32; vector j holds k 8j..8j+3 in its low nibbles and 8j+4..8j+7 in
 * its high ones, 4 bytes per column (lane c = column c). d and m: fp16 [group][block][8].
 *
 * Q4_K (sc set) has the same nibbles, and a block's scale and offset in two parts: its
 * 6-bit scale sc and minimum mn (uint8 [group][block][8]) times its super-block's d and
 * -dmin (d and m: fp16 [group][k / 256][8]). 4.625 bits a weight against Q4_1's 5, and the
 * file's own values (q4_block_scales).
 *
 * Q5_K (qh set too) is Q4_K with a fifth bit a weight: per group and block 32 bytes of qh,
 * whose byte 4c + t's bit i tops column c's k = 4i + t, the byte of nibble vector i (k 4i..
 * 4i + 3: vector i / 2's low nibbles for even i, its high ones for odd) that holds that
 * weight: q = nibble | bit << 4, 0..31 (q5_top). 5.625 bits a weight, the file's values. */
typedef struct {
    const uint8_t *qs;
    const uint16_t *d, *m;
    int n, k; /* the true column count; the arrays hold whole groups (zero padded) */
    const uint8_t *sc, *mn; /* Q4_K's and Q5_K's; NULL for Q4_1 */
    const uint8_t *qh;      /* Q5_K's; NULL for Q4_1 and Q4_K */
} Q4Matrix;

/* Q5_K's 32 qh bytes of a group and block (h) as the fifth bits of nibble vector i (0..7):
 * bit i of each byte moved to bit 4 (a 16-bit shift, masked within each byte after). */
static inline __attribute__((always_inline)) __m256i q5_top(__m256i h, int i) {
    const __m256i t = i < 4 ? _mm256_slli_epi16(h, 4 - i) : _mm256_srli_epi16(h, i - 4);
    return _mm256_and_si256(t, _mm256_set1_epi8(0x10));
}

/* Group g's block b: its 8 columns' scales (*d8) and offsets (*m8), w = d * q + m. For
 * Q4_K, (d * sc) and (-dmin * mn) in float32, as ggml and gguf's dequantization round
 * them. */
static inline void q4_block_scales(const Q4Matrix *W, size_t g, int b, __m256 *d8, __m256 *m8) {
    const int nb = W->k / QK;
    const size_t gb = g * (size_t)nb + (size_t)b;
    if (!W->sc) {
        *d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(W->d + gb * GROUP)));
        *m8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(W->m + gb * GROUP)));
        return;
    }
    const size_t gs = g * (size_t)(W->k / QK_K) + (size_t)(b / (QK_K / QK));
    const __m256 sc = _mm256_cvtepi32_ps(
        _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(W->sc + gb * GROUP))));
    const __m256 mn = _mm256_cvtepi32_ps(
        _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(W->mn + gb * GROUP))));
    *d8 = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(W->d + gs * GROUP))), sc);
    *m8 = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(W->m + gs * GROUP))), mn);
}

/* Q8_0 in the kernel layout: per group of 8 columns and block, 16 pairs of k, each 16
 * bytes (k, k + 1 of each column); d float32 [group][block][8].
 *
 * Q6_K (sc set) holds the same pairs at 6 bits, 192 bytes a group and block (q6_pairs4):
 * 128 bytes of low nibbles, 8 runs of 16 whose low nibbles are pair i's and high ones pair
 * i + 8's, then 64 bytes of top 2 bits, 4 runs of 16 whose bits 2j, 2j + 1 top pair
 * 4j + i. w = d * sc * (q - 32): sc int8 per 16 k ([group][k / 16][8]), d6 fp16 per 256
 * ([group][k / 256][8]). 6.5625 bits a weight, the file's own values. */
typedef struct {
    const int8_t *qs;
    const float *d; /* Q8_0's; NULL for Q6_K */
    int n, k;
    const int8_t *sc; /* Q6_K's; NULL for Q8_0 */
    const uint16_t *d6;
} Q8Matrix;

/* The matrix the exported products are given: Q6_K where sc is, its fp16 d6 then in d. */
static inline Q8Matrix q8_matrix(const void *qs, const void *d, int n, int k, const int8_t *sc) {
    Q8Matrix w = {(const int8_t *)qs, sc ? NULL : (const float *)d, n, k, sc,
                  sc ? (const uint16_t *)d : NULL};
    return w;
}

/* Four of Q6_K's pairs of group and block gb two to a vector, j in 0..3: *lo pairs 2j,
 * 2j + 1 (k 4j .. 4j + 3), *hi pairs 2j + 8, 2j + 9 (k 16 + 4j ..), each vector's first pair
 * in its low 128 bits; q 0..63 (the file's, before its -32), in Q8_0's byte order. One
 * 32-byte load of low nibbles holds both vectors' (runs 2j, 2j + 1) and one of top bits
 * their runs (p & 3 of each pair): a block's 16 pairs cost half the instructions of
 * unpacking them one at a time. */
static inline __attribute__((always_inline)) void q6_pairs4(const Q8Matrix *W, size_t gb, int j,
                                                            __m256i *lo, __m256i *hi) {
    const uint8_t *b = (const uint8_t *)W->qs + gb * 192;
    const __m256i l = _mm256_loadu_si256((const __m256i *)(b + 32 * j));
    const __m256i h = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * (j & 1)));
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    /* the top bits of pairs 4j' + i at bits 2j', 2j' + 1: j' = j >> 1 for *lo, + 2 for *hi */
    const __m256i tlo = (j >> 1) ? _mm256_slli_epi16(h, 2) : _mm256_slli_epi16(h, 4);
    const __m256i thi = (j >> 1) ? _mm256_srli_epi16(h, 2) : h;
    *lo = _mm256_or_si256(_mm256_and_si256(l, m4), _mm256_and_si256(tlo, m30));
    *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l, 4), m4),
                          _mm256_and_si256(thi, m30));
}

/* A vector of two pairs (q6_pairs4's) as one of each column's 4 k, column c in lane c:
 * quad_of_pairs of its halves. */
static inline __m256i quad_of_pair_vector(__m256i v) {
    const __m256i order = _mm256_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15,
                                           0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15);
    return _mm256_shuffle_epi8(_mm256_permute4x64_epi64(v, _MM_SHUFFLE(3, 1, 2, 0)), order);
}

/* Pairs p and p + 1 of a block (16 bytes each: k, k + 1 of 8 columns) as one vector of each
 * column's 4 k, column c in lane c (the 8-bit products' order: vpdpbusd's quads). */
static inline __m256i quad_of_pairs(__m128i a, __m128i b) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi16(a, b)),
                                   _mm_unpackhi_epi16(a, b), 1);
}

/* Q8_0's 16 bytes at p, offset to unsigned (q + 128, 0..255): the 8-bit products' first
 * operand. */
static inline __m128i q8_pair_u(const int8_t *p) {
    return _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_set1_epi8((char)0x80));
}

/* Q6_K group g's block b: its 8 columns' scales d * sc of k 0..15 (*lo) and 16..31 (*hi)
 * of the block, in float32 (exact: 11 bits times 8). */
static inline void q6_block_scales(const Q8Matrix *W, size_t g, int b, __m256 *lo, __m256 *hi) {
    const size_t gs = g * (size_t)(W->k / 16) + 2 * (size_t)b;
    const size_t gd = g * (size_t)(W->k / QK_K) + (size_t)(b / (QK_K / QK));
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(W->d6 + gd * GROUP)));
    const __m128i s = _mm_loadu_si128((const __m128i *)(W->sc + gs * GROUP));
    *lo = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s)));
    *hi = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(s, 8))));
}

typedef void (*chunk_fn)(void *arg, int chunk);
/* fn(arg, c) for every chunk c in 0..chunks-1, on up to nth threads (the caller one of
 * them); returns when all are done. Not exported from the library. */
__attribute__((visibility("hidden"))) void pool_run(chunk_fn fn, void *arg, int chunks, int nth);

typedef void (*row_fn)(void *arg, int row);
/* fn(arg, r) for every row r in 0..rows-1, 8 rows a chunk over pool_run. */
__attribute__((visibility("hidden"))) void pool_rows(row_fn fn, void *arg, int rows, int nth);

/* row_ops.c: the work between a layer's products, rows spread over the pool. */
void add_rms_norm(float *x, const float *delta, const float *w, int rows, int n, float eps,
                  float *out, int nthreads);
void silu_mul(const float *gu, int rows, int n, float *out, int nthreads);
/* Where rope_put_rows writes each row's K/V after rotating it: heads first..first+count-1
 * of the row, head g to pool element g * head_stride + slots[row] * kv_row(d, type). */
typedef struct {
    const int64_t *slots;
    void *pool;
    int first, count;
    size_t head_stride;
    int type; /* the pool's elements: simd.h's KV_F32, KV_F16 or KV_I8 */
} KvPut;
void rope_put_rows(float *qkv, int rows, int stride, int heads, int d, const float *cos,
                   const float *sin, const KvPut *put, int nthreads);

#if defined(__AVX512F__)
#include <immintrin.h>

/* The mask of a 512-bit vector's first n float lanes (all 16 from n = 16 on): a short
 * tile's or a tail's loads and stores. */
static inline __mmask16 first_lanes(int n) {
    return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
}
#endif

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>

/* 32 floats rounded to bf16 (to nearest even), in order: how the bf16-activation products
 * (q4_1_bf16_gemm.c, amx_gemm.c) take x. */
static inline __m512bh bf16_of_32(const float *x) {
    return _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x));
}

/* 8 float scales, each twice in a row: one per column where a vector's 32-bit lane pairs
 * (2c, 2c + 1) belong to column c. */
static inline __m512 pair_scales(__m256 s8) {
    const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    return _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(s8));
}

/* The same from 8 fp16 scales (Q4_1's d and m in the kernel layout). */
static inline __m512 pair_scales_ph(const uint16_t *s) {
    return pair_scales(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)s)));
}
#endif

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && \
    defined(__AVX512BW__)
#define HAVE_AMX 1
/* amx_gemm.c: whether this process may use AMX's tiles (asked of Linux once), and the
 * tiles' configuration every user of them loads: all eight 16 rows of 64 bytes. */
__attribute__((visibility("hidden"))) int amx_ready(void);
__attribute__((visibility("hidden"))) void amx_configure(void);
#else
#define HAVE_AMX 0
#endif

/* y [rows, N] = x [rows, K] @ W.T on AMX tiles (amx_gemm.c): 0, or -2 for a shape they do
 * not take, -3 where AMX cannot run, -1 out of memory. */
__attribute__((visibility("hidden"))) int q4_amx_matmul(const Q4Matrix *w, const float *x, int rows,
                                                        float *y, int nthreads);
__attribute__((visibility("hidden"))) int q8_amx_matmul(const Q8Matrix *w, const float *x, int rows,
                                                        float *y, int nthreads);

/* y [rows, N] = x @ W.T from x already at 8 bits a block (activations.c's quantize_rows:
 * int8 qx [rows][K], per row and block the scale dx and dx * sum(qx)) on panel_gemm.c's
 * tiles (512-bit with AVX512-VNNI, else AVX2's): 0, or -1 out of memory. */
__attribute__((visibility("hidden"))) int q4_panel8_matmul(const Q4Matrix *w, const int8_t *qx,
                                                           const float *dx, const float *sx,
                                                           int rows, float *y, int nthreads);
/* The same panels for Q8_0 or Q6_K W (s16: x's sum(qx) per 16 k), built for AVX512-VNNI
 * only (gemm_dispatch.c's q8_layers_matmul). */
__attribute__((visibility("hidden"))) int q8_panel8_matmul(const Q8Matrix *w, const int8_t *qx,
                                                           const float *dx, const float *sx,
                                                           const int32_t *s16, int rows, float *y,
                                                           int nthreads);
/* y [rows, N] = x @ W.T for Q8_0 or Q6_K W, x at 16 bits a block (15 for Q6_K, whose
 * weights the panel holds times their scales), on panel_gemm.c's 16-bit tile (512-bit with
 * AVX512-VNNI, else AVX2's): 0, or -1 out of memory. */
__attribute__((visibility("hidden"))) int q8_panel16_matmul(const Q8Matrix *w, const float *x,
                                                            int rows, float *y, int nthreads);

#endif
