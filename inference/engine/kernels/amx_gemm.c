/* Q4_1 and Q8_0 products on AMX tiles (CPUs with AMX-TILE and AMX-BF16): the weights
 * unpacked to bf16 in the cache, then multiplied 16 x 16 x 32 an instruction.
 *
 * The 8-bit kernels (q4_1_gemm.c) pay for every row: each block's dot product is a few
 * vector instructions per row (python -m inference.bench.kernels --rows 8 16 32 64
 * --kinds int8 amx onednn compares them). oneDNN's bf16 products on AMX read weights of 16 bits (three
 * times the GGUF's) and carry a large fixed cost at a few dozen rows. Here a chunk of 32
 * output columns is unpacked once, for all of K, into a bf16 buffer in AMX's pair layout
 * (~100 KB at most, it stays in L2), and every 32 rows of x then take one tile product per
 * 32 k for each 16 x 16 of the output: the unpacking is paid once per step, the rows
 * nearly free.
 *
 * The weights are rounded to bf16 once unpacked (d * q + m in float32, then to nearest
 * even), as torch's bf16 products round them, and x is rounded to bf16; sums are float32.
 * The head's Q8_0 blocks (the embedding's) go the same way: d * q rounded to bf16, x in
 * bf16 (its outliers cost nothing there: each value has its own exponent); a Q6_K head's
 * d * sc * (q - 32) likewise.
 *
 * AMX's B operand holds, in row p, the pairs k = 2p, 2p + 1 of each of 16 columns (one
 * 32-bit lane a column). Q8_0's kernel layout already stores those pairs side by side;
 * Q4_1's bytes are picked into that order as they are unpacked (unpack_q4), and Q5_K's
 * fifth bits with them. Linux hands out the tiles' state only on request (arch_prctl),
 * once per process.
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common.h"

/* Writes columns n0 .. n0 + 31 of a weight matrix, unpacked to bf16 tiles (unpack_q4). */
typedef void (*unpack_fn)(const void *w, int n0, uint16_t *out);

#if HAVE_AMX
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define COLS 32 /* output columns a chunk: two tiles */

static int amx_permitted;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void amx_request(void) {
    amx_permitted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

int amx_ready(void) {
    pthread_once(&amx_once, amx_request);
    return amx_permitted;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

/* Every tile 16 rows of 64 bytes. Here tiles 0-3 are the output's 2 x 2 blocks of 16 x 16
 * floats; 4, 5: two 16-row slices of x; 6, 7: the two 16-column halves of the chunk's
 * weights. Loaded by each task and released after it: oneDNN (torch's bf16 products)
 * loads its own and releases the tiles on the same threads, after which a tile instruction
 * is illegal. */
void amx_configure(void) {
    /* In static memory: built on the stack, gcc dropped the stores only ldtilecfg reads. */
    static const TileConfig config = {
        .palette = 1,
        .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
        .rows = {16, 16, 16, 16, 16, 16, 16, 16},
    };
    _tile_loadconfig(&config);
}

static __thread uint16_t *tls_b;
static __thread size_t tls_b_cap;

/* A row of 32 bf16 from two halves of 16 floats (columns 0-7 and 8-15), to nearest even. */
static inline void store_row(uint16_t *row, __m512 lo, __m512 hi) {
    _mm512_store_si512((void *)row, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

/* The unpacking waits on memory: each chunk reads four groups' blocks (and their scales)
 * in short runs, too short for the hardware's prefetchers to get ahead of. So it asks for
 * the block AHEAD blocks on in each run; 2 was the fastest of 1-8 for the layers'
 * products at 64 rows (python -m inference.bench.kernels --rows 64 --kinds amx). */
#define AHEAD 2

/* The cache lines of p .. p + bytes - 1 (bytes 1: p's own line). */
static inline void fetch_ahead(const void *p, int bytes) {
    for (int i = 0; i < bytes; i += 64) _mm_prefetch((const char *)p + i, _MM_HINT_T0);
}

/* 32 bytes as 128-bit lanes [first half, first half, second half, second half]. */
static inline __m512i halves_twice(const uint8_t *p) {
    __m512i v = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_shuffle_i64x2(v, v, 0x50);
}

/* The bytes of pair half o (unpack_q4 below), each in its own 32-bit lane. */
static inline __m512i pick_pairs(__m512i halves, int o) {
    /* lane i = 4L + 2c' + e: column 2L + c', byte 8 (L & 1) + 4c' + 2o + e of its half */
    const int z = (int)0x80808000; /* the lane's upper three bytes zeroed */
    const __m512i idx0 = _mm512_setr_epi32(z | 0, z | 1, z | 4, z | 5, z | 8, z | 9, z | 12,
                                           z | 13, z | 0, z | 1, z | 4, z | 5, z | 8, z | 9,
                                           z | 12, z | 13);
    const __m512i idx = o ? _mm512_add_epi32(idx0, _mm512_set1_epi32(2)) : idx0;
    return _mm512_shuffle_epi8(halves, idx);
}

/* Bit i of each 32-bit lane's low byte (the rest zero: pick_pairs) moved to bit 4. */
static inline __m512i fifth_bits(__m512i h, int i) {
    const __m512i t = i < 4 ? _mm512_slli_epi32(h, 4 - i) : _mm512_srli_epi32(h, i - 4);
    return _mm512_and_si512(t, _mm512_set1_epi32(0x10));
}

/* Columns n0 .. n0 + 31 over all of K, unpacked: for each block of 32 k, two tiles of
 * 16 rows x 32 bf16 (512 values each), the first for columns n0 .. n0 + 15.
 *
 * Byte 4c + 2o + e of a group's vector j holds column c's k = 8j + 2o + e in its low
 * nibble and k = 8j + 4 + 2o + e in its high one, i.e. tile rows 4j + o and 4j + 2 + o.
 * One byte shuffle a (group, o) puts those bytes, one to a 32-bit lane, in the order of the
 * row's float32 lanes (2c + e); the low and the high nibble then each take a mask or a
 * shift, a conversion and d * q + m. Widening the vector to 16 bits, permuting its pairs
 * and widening again took ~3x the shuffles and ~1.1x the layers' products' time at 64
 * rows (python -m inference.bench.kernels --rows 64 --kinds amx). */
static void unpack_q4(const void *w, int n0, uint16_t *out) {
    const Q4Matrix *W = (const Q4Matrix *)w;
    const int nb = W->k / QK;
    const __m512i nib = _mm512_set1_epi32(0x0F);
    for (int b = 0; b < nb; b++) {
        for (int t = 0; t < 2; t++) {
            size_t ba = (size_t)(n0 / GROUP + 2 * t) * nb + b, bb = ba + nb; /* two groups */
            const uint8_t *qa = W->qs + ba * 128, *qb = W->qs + bb * 128;
            __m256 da8, ma8, db8, mb8;
            q4_block_scales(W, (size_t)(n0 / GROUP + 2 * t), b, &da8, &ma8);
            q4_block_scales(W, (size_t)(n0 / GROUP + 2 * t + 1), b, &db8, &mb8);
            __m512 d_lo = pair_scales(da8), d_hi = pair_scales(db8);
            __m512 m_lo = pair_scales(ma8), m_hi = pair_scales(mb8);
            uint16_t *tile = out + ((size_t)b * 2 + t) * 512;
            fetch_ahead(qa + 128 * AHEAD, 128);
            fetch_ahead(qb + 128 * AHEAD, 128);
            fetch_ahead(W->d + (ba + AHEAD) * GROUP, 1);
            fetch_ahead(W->d + (bb + AHEAD) * GROUP, 1);
            fetch_ahead(W->m + (ba + AHEAD) * GROUP, 1);
            fetch_ahead(W->m + (bb + AHEAD) * GROUP, 1);
            /* Q5_K's fifth bits, their bytes in the nibbles' order (common.h) */
            const __m512i ta = W->qh ? halves_twice(W->qh + ba * 32) : _mm512_setzero_si512();
            const __m512i tb = W->qh ? halves_twice(W->qh + bb * 32) : _mm512_setzero_si512();
            for (int j = 0; j < 4; j++) {
                __m512i va = halves_twice(qa + 32 * j), vb = halves_twice(qb + 32 * j);
                for (int o = 0; o < 2; o++) {
                    __m512i pa = pick_pairs(va, o), pb = pick_pairs(vb, o);
                    __m512i ha = ta, hb = tb;
                    if (W->qh) {
                        ha = pick_pairs(ta, o);
                        hb = pick_pairs(tb, o);
                    }
                    for (int h = 0; h < 2; h++) {
                        __m512i qa_h = h ? _mm512_srli_epi32(pa, 4) : _mm512_and_si512(pa, nib);
                        __m512i qb_h = h ? _mm512_srli_epi32(pb, 4) : _mm512_and_si512(pb, nib);
                        if (W->qh) {
                            qa_h = _mm512_or_si512(qa_h, fifth_bits(ha, 2 * j + h));
                            qb_h = _mm512_or_si512(qb_h, fifth_bits(hb, 2 * j + h));
                        }
                        store_row(tile + (4 * j + 2 * h + o) * 32,
                                  _mm512_fmadd_ps(_mm512_cvtepi32_ps(qa_h), d_lo, m_lo),
                                  _mm512_fmadd_ps(_mm512_cvtepi32_ps(qb_h), d_hi, m_hi));
                    }
                }
            }
        }
    }
}

/* 16 int8 weights as floats. */
static inline __m512 q8_floats(const int8_t *q) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q)));
}

/* Bytes 16h .. 16h + 15 of v (q6_pairs4's pair h) less 32, as floats. */
static inline __m512 q6_floats(__m256i v, int h) {
    const __m128i p = h ? _mm256_extracti128_si256(v, 1) : _mm256_castsi256_si128(v);
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_sub_epi8(p, _mm_set1_epi8(32))));
}

/* Q6_K's blocks as unpack_q8's: each weight d * sc * (q - 32), its 16's scale d * sc
 * (q6_block_scales) times q - 32 in float32, then rounded to bf16. Pairs four at a time
 * (q6_pairs4): tile rows 2j, 2j + 1 and 2j + 8, 2j + 9. */
static void unpack_q6(const Q8Matrix *W, int n0, uint16_t *out) {
    const int nb = W->k / QK;
    for (int b = 0; b < nb; b++) {
        for (int t = 0; t < 2; t++) {
            const size_t ga = (size_t)(n0 / GROUP + 2 * t), gb = ga + 1; /* two groups */
            const size_t ba = ga * nb + b, bb = gb * nb + b;
            __m256 la, ha, lb, hb;
            q6_block_scales(W, ga, b, &la, &ha);
            q6_block_scales(W, gb, b, &lb, &hb);
            const __m512 da[2] = {pair_scales(la), pair_scales(ha)};
            const __m512 db[2] = {pair_scales(lb), pair_scales(hb)};
            uint16_t *tile = out + ((size_t)b * 2 + t) * 512;
            fetch_ahead(W->qs + (ba + AHEAD) * 192, 192);
            fetch_ahead(W->qs + (bb + AHEAD) * 192, 192);
            for (int j = 0; j < 4; j++) {
                __m256i qa[2], qb[2]; /* [0]: pairs 2j, 2j + 1; [1]: 2j + 8, 2j + 9 */
                q6_pairs4(W, ba, j, &qa[0], &qa[1]);
                q6_pairs4(W, bb, j, &qb[0], &qb[1]);
                for (int u = 0; u < 2; u++)
                    for (int h = 0; h < 2; h++)
                        store_row(tile + (8 * u + 2 * j + h) * 32,
                                  _mm512_mul_ps(q6_floats(qa[u], h), da[u]),
                                  _mm512_mul_ps(q6_floats(qb[u], h), db[u]));
            }
        }
    }
}

static void unpack_q8(const void *w, int n0, uint16_t *out) {
    const Q8Matrix *W = (const Q8Matrix *)w;
    if (W->sc) {
        unpack_q6(W, n0, out);
        return;
    }
    const int nb = W->k / QK;
    for (int b = 0; b < nb; b++) {
        for (int t = 0; t < 2; t++) {
            size_t ba = (size_t)(n0 / GROUP + 2 * t) * nb + b, bb = ba + nb; /* two groups */
            const int8_t *qa = W->qs + ba * 256, *qb = W->qs + bb * 256;
            __m512 da = pair_scales(_mm256_loadu_ps(W->d + ba * GROUP));
            __m512 db = pair_scales(_mm256_loadu_ps(W->d + bb * GROUP));
            uint16_t *tile = out + ((size_t)b * 2 + t) * 512;
            fetch_ahead(qa + 256 * AHEAD, 256);
            fetch_ahead(qb + 256 * AHEAD, 256);
            fetch_ahead(W->d + (ba + AHEAD) * GROUP, 1);
            fetch_ahead(W->d + (bb + AHEAD) * GROUP, 1);
            for (int p = 0; p < 16; p++)
                store_row(tile + p * 32, _mm512_mul_ps(q8_floats(qa + 16 * p), da),
                          _mm512_mul_ps(q8_floats(qb + 16 * p), db));
        }
    }
}

typedef struct {
    const void *w;
    unpack_fn unpack;
    int n, k;
    const uint16_t *xb; /* [padded rows][K] bf16, the padding zero */
    int rows, padded;
    float *y;
    int group;         /* chunks a task: each 32-row slab of x runs across them in turn */
    atomic_int failed; /* a thread's buffer could not be had: the caller computes it all again */
} AmxTask;

/* Output columns n0 .. n0 + 31 of rows m0 .. m0 + 31 (or 16) from the chunk's unpacked
 * weights wb: two tiles of x's slab against the chunk's two halves, a block of k at a time. */
static void amx_slab(const AmxTask *t, const uint16_t *wb, int n0, int m0) {
    const int K = t->k, N = t->n, nb = K / QK;
    const size_t xs = (size_t)K * sizeof(uint16_t), ys = (size_t)N * sizeof(float);
    float tmp[16 * 16] __attribute__((aligned(64)));
    const int two = t->padded - m0 >= 32;
    const uint16_t *x0 = t->xb + (size_t)m0 * K, *x1 = x0 + (size_t)16 * K;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int b = 0; b < nb; b++) {
        const uint16_t *w = wb + (size_t)b * 1024;
        _tile_loadd(6, w, 64);
        _tile_loadd(7, w + 512, 64);
        _tile_loadd(4, x0 + b * QK, xs);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        if (two) {
            _tile_loadd(5, x1 + b * QK, xs);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    /* Full 16-row slices go straight to y; the last, partial one through tmp. */
    for (int s = 0; s < (two ? 2 : 1); s++) {
        int r0 = m0 + 16 * s, valid = t->rows - r0;
        if (valid <= 0) break;
        float *y = t->y + (size_t)r0 * N + n0;
        if (valid >= 16) {
            if (s == 0) {
                _tile_stored(0, y, ys);
                _tile_stored(1, y + 16, ys);
            } else {
                _tile_stored(2, y, ys);
                _tile_stored(3, y + 16, ys);
            }
            continue;
        }
        for (int h = 0; h < 2; h++) {
            if (s == 0 && h == 0) _tile_stored(0, tmp, 64);
            if (s == 0 && h == 1) _tile_stored(1, tmp, 64);
            if (s == 1 && h == 0) _tile_stored(2, tmp, 64);
            if (s == 1 && h == 1) _tile_stored(3, tmp, 64);
            for (int r = 0; r < valid; r++)
                memcpy(y + (size_t)r * N + 16 * h, tmp + 16 * r, 16 * sizeof(float));
        }
    }
}

/* Task `task`: chunks task * group .. of 32 output columns, each unpacked once for all of
 * K, then every 32-row slab of x across them in turn (the slab stays in the caches for the
 * next chunk). */
static void amx_chunk(void *arg, int task) {
    AmxTask *t = (AmxTask *)arg;
    const int nb = t->k / QK, c0 = task * t->group;
    const int chunks = t->n / COLS - c0 < t->group ? t->n / COLS - c0 : t->group;
    const size_t per = (size_t)nb * 2 * 512, need = per * chunks;
    if (tls_b_cap < need) {
        free(tls_b);
        tls_b = (uint16_t *)aligned_alloc(64, need * sizeof(uint16_t));
        tls_b_cap = tls_b ? need : 0;
        if (!tls_b) {
            atomic_store(&t->failed, 1);
            return;
        }
    }
    amx_configure();
    for (int c = 0; c < chunks; c++) t->unpack(t->w, (c0 + c) * COLS, tls_b + c * per);
    for (int m0 = 0; m0 < t->padded; m0 += 32)
        for (int c = 0; c < chunks; c++) amx_slab(t, tls_b + c * per, (c0 + c) * COLS, m0);
    _tile_release();
}

/* Chunks a task: the most of AMX_GROUP that splits them into at least two tasks a thread.
 * A chunk a task took 1.1-1.2x the time at 32-512 rows (2 threads; one thread alike): each
 * task loads the tiles' configuration and releases it, and streams x again (python -m
 * inference.bench.kernels --rows 32 64 128 256 512 --kinds amx). */
#define AMX_GROUP 8
static int chunk_group(int chunks, int nthreads) {
    for (int g = AMX_GROUP; g > 1; g--)
        if (chunks % g == 0 && chunks / g >= 2 * nthreads) return g;
    return 1;
}

typedef struct {
    const float *x;
    uint16_t *xb;
    int k;
} Bf16Rows;

/* Row r of x rounded to bf16. */
static void bf16_row(void *arg, int r) {
    const Bf16Rows *a = (const Bf16Rows *)arg;
    const size_t at = (size_t)r * a->k;
    for (int k = 0; k < a->k; k += QK)
        _mm512_store_si512((void *)(a->xb + at + k), (__m512i)bf16_of_32(a->x + at + k));
}

/* From this many rows x is rounded over the pool (a prompt's chunk), below it by the
 * caller alone: the bundled model's 30 layers took 0.97x the time at 256 and 512 rows,
 * the same at 64-128 (python -m inference.bench.kernels --rows 64 128 256 512 --kinds amx). */
#define POOLED_CONVERSION_ROWS 128
#endif

/* x rounded to bf16 into [rows rounded up to 16][K], then every chunk of 32 columns. */
static int amx_matmul(const void *w, unpack_fn unpack, int N, int K, const float *x, int rows,
                      float *y, int nthreads) {
#if HAVE_AMX
    if (!amx_ready()) return -3;
    if (K % QK || N % COLS || rows <= 0) return -2;
    const int padded = (rows + 15) / 16 * 16;
    uint16_t *xb = (uint16_t *)aligned_alloc(64, (size_t)padded * K * sizeof(uint16_t));
    if (!xb) return -1;
    Bf16Rows conv = {x, xb, K};
    if (rows >= POOLED_CONVERSION_ROWS)
        pool_rows(bf16_row, &conv, rows, nthreads);
    else
        for (int r = 0; r < rows; r++) bf16_row(&conv, r);
    memset(xb + (size_t)rows * K, 0, (size_t)(padded - rows) * K * sizeof(uint16_t));
    const int group = chunk_group(N / COLS, nthreads);
    AmxTask t = {w, unpack, N, K, xb, rows, padded, y, group, 0};
    pool_run(amx_chunk, &t, (N / COLS + group - 1) / group, nthreads);
    free(xb);
    return atomic_load(&t.failed) ? -1 : 0;
#else
    (void)w, (void)unpack, (void)N, (void)K, (void)x, (void)rows, (void)y, (void)nthreads;
    return -3;
#endif
}

/* Without AMX in the build there are no unpackers, and amx_matmul answers -3. */
#if HAVE_AMX
#define UNPACKER(f) f
#else
#define UNPACKER(f) NULL
#endif

int q4_amx_matmul(const Q4Matrix *w, const float *x, int rows, float *y, int nthreads) {
    return amx_matmul(w, UNPACKER(unpack_q4), w->n, w->k, x, rows, y, nthreads);
}

int q8_amx_matmul(const Q8Matrix *w, const float *x, int rows, float *y, int nthreads) {
    return amx_matmul(w, UNPACKER(unpack_q8), w->n, w->k, x, rows, y, nthreads);
}

/* 1 where q4_1_gemm_amx runs (built with AMX, and the process granted its tiles), else 0. */
int q4_1_amx_available(void) {
#if HAVE_AMX
    return amx_ready();
#else
    return 0;
#endif
}

/* y [rows, N] = x [rows, K] @ W.T for Q4_1 W in the kernel layout, on AMX tiles (weights and
 * x rounded to bf16); -2 unless N is a multiple of 32, -3 where AMX cannot run. */
int q4_1_gemm_amx(const uint8_t *qs, const uint16_t *d, const uint16_t *m, int N, int K,
                  const float *x, int rows, float *y, int nthreads, const uint8_t *sc,
                  const uint8_t *mn, const uint8_t *qh) {
    Q4Matrix w = {qs, d, m, N, K, sc, mn, qh};
    return q4_amx_matmul(&w, x, rows, y, nthreads);
}
