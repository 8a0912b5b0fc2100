/* Small vector helpers shared by the kernels' C files (AVX2 / FMA / F16C). */
#ifndef CHATAPP_KERNELS_SIMD_H
#define CHATAPP_KERNELS_SIMD_H
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* acc += v in place, 32-bit lanes (add_into) and 16-bit ones (add16_into): adds gcc can
 * neither copy around (gcc 12 added into v's register and copied the sum back, a third more
 * instructions in panel_gemm.c's tile) nor reassociate (a tile's products of a block were
 * all computed before any sum, and spilled to the stack: q4_1_gemm.c). */
static inline __m256i add_into(__m256i acc, __m256i v) {
    __asm__("vpaddd %1, %0, %0" : "+x"(acc) : "x"(v));
    return acc;
}

static inline __m256i add16_into(__m256i acc, __m256i v) {
    __asm__("vpaddw %1, %0, %0" : "+x"(acc) : "x"(v));
    return acc;
}

/* The largest of v's eight floats. */
static inline float hmax256(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* The sum of v's eight 32-bit integers. */
static inline int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* The sum of v's eight floats. */
static inline float hsum256(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* exp(x), a vector at a time (Cephes' polynomial, relative error ~1e-7), for x up to 88;
 * exactly 0 below -87 (where float32's exp underflows anyway), so masked logits stay
 * masked. Written once over the width: DEFINE_EXP(256) is exp256, DEFINE_EXP(512) exp512;
 * each width gives its floor and its zeroing below -87. */
#define DEFINE_EXP(W)                                                                          \
    static inline __m##W exp##W(__m##W x) {                                                    \
        const __m##W lo = _mm##W##_set1_ps(-87.0f), x0 = x;                                    \
        x = _mm##W##_min_ps(_mm##W##_max_ps(x, lo), _mm##W##_set1_ps(88.0f));                  \
        const __m##W fx = floor##W(                                                            \
            _mm##W##_fmadd_ps(x, _mm##W##_set1_ps(1.44269504088896341f),                    \
                              _mm##W##_set1_ps(0.5f)));                                        \
        x = _mm##W##_fnmadd_ps(fx, _mm##W##_set1_ps(0.693359375f), x);                         \
        x = _mm##W##_fnmadd_ps(fx, _mm##W##_set1_ps(-2.12194440e-4f), x);                      \
        __m##W y = _mm##W##_set1_ps(1.9875691500e-4f);                                         \
        y = _mm##W##_fmadd_ps(y, x, _mm##W##_set1_ps(1.3981999507e-3f));                       \
        y = _mm##W##_fmadd_ps(y, x, _mm##W##_set1_ps(8.3334519073e-3f));                       \
        y = _mm##W##_fmadd_ps(y, x, _mm##W##_set1_ps(4.1665795894e-2f));                       \
        y = _mm##W##_fmadd_ps(y, x, _mm##W##_set1_ps(1.6666665459e-1f));                       \
        y = _mm##W##_fmadd_ps(y, x, _mm##W##_set1_ps(5.0000001201e-1f));                       \
        y = _mm##W##_fmadd_ps(y, _mm##W##_mul_ps(x, x),                                      \
                              _mm##W##_add_ps(x, _mm##W##_set1_ps(1.0f)));                     \
        const __m##W##i n = _mm##W##_slli_epi32(                                              \
            _mm##W##_add_epi32(_mm##W##_cvtps_epi32(fx), _mm##W##_set1_epi32(127)), 23);       \
        return zero_below##W(_mm##W##_mul_ps(y, _mm##W##_castsi##W##_ps(n)), x0, lo);          \
    }

static inline __m256 floor256(__m256 x) { return _mm256_floor_ps(x); }
/* r, with 0 in the lanes where x < lo. */
static inline __m256 zero_below256(__m256 r, __m256 x, __m256 lo) {
    return _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LT_OQ), r);
}
DEFINE_EXP(256)

/* The KV pool's elements (a shape's kv_type): float32, float16 (half the bytes for
 * attention to read, which waits on memory over chats' scattered blocks), or int8 rows: a
 * position's head_dim values as int8 and then their float32 scale (value = q * scale), 68
 * bytes for a head of 64 where float16 takes 128. Element indexes count the pool's own
 * elements (bytes for int8), a position's row kv_row of them. The type is a constant in the
 * kernels' inlined bodies, one build of each per format. */
enum { KV_F32 = 0, KV_F16 = 1, KV_I8 = 2 };

/* Elements of a position's row of one head. */
static inline size_t kv_row(int d, const int type) {
    return type == KV_I8 ? (size_t)d + sizeof(float) : (size_t)d;
}

/* Bytes of one element. */
static inline size_t kv_elem(const int type) { return type == KV_F32 ? 4 : type == KV_F16 ? 2 : 1; }

/* An int8 row's scale: its head_dim values start at element i. */
static inline float kv_scale(const void *base, size_t i, int d) {
    float sc;
    memcpy(&sc, (const int8_t *)base + i + d, sizeof sc);
    return sc;
}

/* Eight from element i, as floats (an int8 pool's without its row's scale): */
static inline __m256 kv_load8(const void *base, size_t i, const int type) {
    if (type == KV_I8)
        return _mm256_cvtepi32_ps(
            _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)base + i))));
    if (type == KV_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i)));
    return _mm256_loadu_ps((const float *)base + i);
}

/* A position's d floats of x into the pool at element i (its row's start): rounded to
 * nearest even where float16; where int8, scaled by their largest magnitude / 127 and
 * rounded to nearest, the scale after them. */
static inline void kv_put(void *base, size_t i, const float *x, int d, const int type) {
    if (type == KV_F32) {
        memcpy((float *)base + i, x, sizeof(float) * (size_t)d);
        return;
    }
    if (type == KV_I8) {
        float amax = 0.0f;
        for (int j = 0; j < d; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float sc = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        int8_t *q = (int8_t *)base + i;
        for (int j = 0; j < d; j++) q[j] = (int8_t)lrintf(x[j] * inv);
        memcpy(q + d, &sc, sizeof sc);
        return;
    }
    uint16_t *h = (uint16_t *)base + i;
    int j = 0;
    for (; j + 8 <= d; j += 8)
        _mm_storeu_si128((__m128i *)(h + j),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + j), _MM_FROUND_TO_NEAREST_INT));
    for (; j < d; j++) h[j] = _cvtss_sh(x[j], _MM_FROUND_TO_NEAREST_INT);
}

/* n consecutive positions' rows of d from element i (a row's start) as float32 [n, d]: the
 * pool itself where it is float32, else converted into buf. */
static inline const float *kv_floats(const void *base, size_t i, int n, int d, const int type,
                                     float *buf) {
    if (type == KV_F32) return (const float *)base + i;
    if (type == KV_I8) {
        const size_t row = kv_row(d, KV_I8);
        for (int p = 0; p < n; p++) {
            const int8_t *q = (const int8_t *)base + i + (size_t)p * row;
            const float sc = kv_scale(base, i + (size_t)p * row, d);
            for (int j = 0; j < d; j++) buf[(size_t)p * d + j] = (float)q[j] * sc;
        }
        return buf;
    }
    const uint16_t *h = (const uint16_t *)base + i;
    const size_t m = (size_t)n * d;
    size_t j = 0;
    for (; j + 8 <= m; j += 8)
        _mm256_storeu_ps(buf + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + j))));
    for (; j < m; j++) buf[j] = _cvtsh_ss(h[j]);
    return buf;
}

#ifdef __AVX512F__
/* kv_load8's sixteen. */
static inline __m512 kv_load16(const void *base, size_t i, const int type) {
    if (type == KV_I8)
        return _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((const int8_t *)base + i))));
    if (type == KV_F16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i)));
    return _mm512_loadu_ps((const float *)base + i);
}

static inline __m512 floor512(__m512 x) {
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
}
static inline __m512 zero_below512(__m512 r, __m512 x, __m512 lo) {
    return _mm512_maskz_mov_ps((__mmask16)~_mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), r);
}
DEFINE_EXP(512)
#endif

#endif
