/* The activations each product takes, quantized per row and block of 32: int8 for Q4_1's
 * (as llama.cpp's q8_1), int16 for the head's Q8_0, bf16 for Q4_1's prompts' product. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gemm.h"
#include "simd.h"

/* Per block of 32: d = max|x| / 127, q = round(x / d) (to nearest even, as lrintf). */
static void quantize_row(const float *x, int K, int8_t *qx, float *dx, float *sx, int32_t *s16) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int b = 0; b < K / QK; b++) {
        const float *xb = x + b * QK;
        __m256 v[4], amax = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(xb + 8 * j);
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
        }
        float d = hmax256(amax) / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int j = 0; j < 4; j++) q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], vid));
        int sum;
        if (s16) {
            s16[2 * b] = hsum_epi32(_mm256_add_epi32(q[0], q[1]));
            s16[2 * b + 1] = hsum_epi32(_mm256_add_epi32(q[2], q[3]));
            sum = s16[2 * b] + s16[2 * b + 1];
        } else {
            sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]),
                                              _mm256_add_epi32(q[2], q[3])));
        }
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                       _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)(qx + b * QK), _mm256_permutevar8x32_epi32(p, order));
        dx[b] = d;
        sx[b] = d * (float)sum;
    }
}

typedef struct {
    const float *x;
    int K;
    QuantizedRows *out;
} QuantTask;

static void quantize_one(void *arg, int r) {
    const QuantTask *t = (const QuantTask *)arg;
    const int nb = t->K / QK;
    quantize_row(t->x + (size_t)r * t->K, t->K, t->out->qx + (size_t)r * t->K,
                 t->out->dx + (size_t)r * nb, t->out->sx + (size_t)r * nb,
                 t->out->s16 ? t->out->s16 + (size_t)r * 2 * nb : NULL);
}

/* Over the pool: at a step of 64 rows, quantizing a product's input on the caller alone
 * left the other thread waiting for ~4% of the step. */
int quantize_rows(const float *x, int rows, int K, QuantizedRows *out, int nthreads,
                  int halves) {
    int nb = K / QK;
    out->qx = (int8_t *)aligned_alloc(32, ((size_t)rows * K + 31) / 32 * 32);
    out->dx = (float *)malloc(sizeof(float) * (size_t)rows * nb);
    out->sx = (float *)malloc(sizeof(float) * (size_t)rows * nb);
    out->s16 = halves ? (int32_t *)malloc(sizeof(int32_t) * (size_t)rows * 2 * nb) : NULL;
    if (!out->qx || !out->dx || !out->sx || (halves && !out->s16)) return -1;
    QuantTask t = {x, K, out};
    pool_rows(quantize_one, &t, rows, nthreads);
    return 0;
}

void free_rows(QuantizedRows *q) {
    free(q->qx);
    free(q->dx);
    free(q->sx);
    free(q->s16);
}

int quantize_rows16(const float *x, int rows, int K, Wide *out) {
    int nb = K / QK;
    out->qx = (int16_t *)aligned_alloc(32, (sizeof(int16_t) * (size_t)rows * K + 31) / 32 * 32);
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

#if HAVE_BF16_GEMM
int round_rows_bf16(const float *x, int rows, int K, Bf16Rows *out) {
    int nb = K / QK;
    out->xb = (uint16_t *)aligned_alloc(64, (sizeof(uint16_t) * (size_t)rows * K + 63) / 64 * 64);
    out->sx = (float *)malloc(sizeof(float) * (size_t)rows * nb);
    if (!out->xb || !out->sx) return -1;
    for (size_t r = 0; r < (size_t)rows; r++) {
        for (int b = 0; b < nb; b++) {
            __m512bh pair = bf16_of_32(x + r * K + b * QK);
            _mm512_storeu_si512((void *)(out->xb + r * K + b * QK), (__m512i)pair);
            /* The sum of the rounded x: m * sum(x) nearly cancels d * sum(x * q) (m ~ -8d),
             * so both must see the same x, or the rounding's difference shows ~0.5%. */
            __m256bh lo16 = (__m256bh)_mm512_castsi512_si256((__m512i)pair);
            __m256bh hi16 = (__m256bh)_mm512_extracti64x4_epi64((__m512i)pair, 1);
            out->sx[r * nb + b] =
                _mm512_reduce_add_ps(_mm512_add_ps(_mm512_cvtpbh_ps(lo16), _mm512_cvtpbh_ps(hi16)));
        }
    }
    return 0;
}
#endif
