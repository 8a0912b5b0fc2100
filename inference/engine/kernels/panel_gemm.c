/* Products for many rows from weights unpacked once per 16 output columns: prompts' chunks
 * and large steps (Q4_1, x at 16 bits; AVX2, or AVX512-VNNI's tile512), and the native
 * path's steps of many rows too (Q4_1 by 8-bit x, tile512_u8 or AVX2's tile256_u8; the
 * head's Q8_0 on the 16-bit tile; see the last sections).
 *
 * The 8-bit kernels (q4_1_gemm.c) unpack every weight block again for each 4 rows, which
 * is right while reading the weights bounds a step, and their 8-bit activations cost a
 * prompt's first token its precision (native_decode.py). fbgemm's fp16 products (the
 * large steps' format on these CPUs) run at AVX2's float peak, 8 multiply-adds an FMA,
 * on torch's threads. Here a chunk of 16 output columns is unpacked once, for all of K,
 * into a panel that stays in L2: the weights' q (0..15) as 16-bit pairs (k, k + 1), with
 * the blocks' d and m in float32. x goes in at 16 bits per block of 32 (scale
 * max|x| / 32767, as the head's kernel takes it: float32's precision for these products),
 * and every 4 rows of x take one register tile of 4 x 16 sums, vpmaddwd doing 16
 * multiply-adds into 32-bit sums an instruction. Each block's integer sums then take
 * d * dx, and m * dx * sum(qx) adds the offsets: y = sum_b dx (d sum(q qx) + m sum(qx)).
 * The chunks run in the kernels' pool.
 *
 * Built for AVX512-VNNI, the tile is 8 rows of 512-bit sums (tile512). Against fbgemm's
 * products, the same panels in float32 (6 x 16 tiles with FMA; dropped, slower) and
 * oneDNN's bf16 (which round the weights to bf16 and pay no block scales): python -m
 * inference.bench.kernels --rows 64 128 256 --threads 1 --kinds i16 panel fbgemm onednn.
 */
#include <immintrin.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "simd.h"

#define NR 16 /* output columns a chunk: two groups of the kernel layout */
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#define HAVE_I16_VNNI 1 /* the 8-row tile of 512-bit sums (tile512) */
#else
#define HAVE_I16_VNNI 0
#endif
#define MR 4  /* rows a register tile */

/* ---- Panels ------------------------------------------------------------------------------- */

/* Group g's block b: its 8 scales d and offsets m in float32 (Q4_1's, or Q4_K's made). */
static inline void panel_scales(const Q4Matrix *W, int g, int b, float *d, float *m) {
    __m256 d8, m8;
    q4_block_scales(W, (size_t)g, b, &d8, &m8);
    _mm256_store_ps(d, d8);
    _mm256_store_ps(m, m8);
}

/* Q5_K's block (q: its 128 bytes of nibbles, qh: its 32 of fifth bits) as panel_q4's
 * pairs: each vector's bytes made whole (0..31) first, then paired as panel_q4 pairs the
 * nibbles. */
static void panel_q5_block(const uint8_t *q, const uint8_t *qh, int32_t *out) {
    const __m256i nib = _mm256_set1_epi8(0x0F), lo = _mm256_set1_epi32(0xFF),
                  hi = _mm256_set1_epi32(0xFF0000);
    const __m256i top = _mm256_loadu_si256((const __m256i *)qh);
    for (int j = 0; j < 4; j++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 32 * j));
        /* k 8j..8j+3 (vector 2j's bytes), then 8j+4..8j+7 (vector 2j + 1's) */
        const __m256i u[2] = {
            _mm256_or_si256(_mm256_and_si256(v, nib), q5_top(top, 2 * j)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), nib), q5_top(top, 2 * j + 1)),
        };
        for (int e = 0; e < 2; e++) {
            /* pairs (bytes 0, 1) and (2, 3) of each column's 4 */
            const __m256i p0 = _mm256_or_si256(_mm256_and_si256(u[e], lo),
                                               _mm256_and_si256(_mm256_slli_epi32(u[e], 8), hi));
            const __m256i p1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u[e], 16), lo),
                                               _mm256_and_si256(_mm256_srli_epi32(u[e], 8), hi));
            _mm256_store_si256((__m256i *)(out + (4 * j + 2 * e) * NR), p0);
            _mm256_store_si256((__m256i *)(out + (4 * j + 2 * e + 1) * NR), p1);
        }
    }
}

/* int16 pairs [K / 2][16] (lane c: q(k) | q(k + 1) << 16), then float32 d [nb][16] and
 * m [nb][16]. */
static void panel_q4(const void *w, int g, int h, int32_t *panel) {
    const Q4Matrix *W = (const Q4Matrix *)w;
    const int nb = W->k / QK;
    const __m256i lo = _mm256_set1_epi32(0x0F), hi = _mm256_set1_epi32(0x0F0000);
    float *ds = (float *)(panel + (size_t)W->k / 2 * NR), *ms = ds + (size_t)nb * NR;
    for (int b = 0; b < nb; b++) {
        const size_t gb = (size_t)g * nb + b;
        const uint8_t *q = W->qs + gb * 128;
        panel_scales(W, g, b, ds + b * NR + 8 * h, ms + b * NR + 8 * h);
        int32_t *out = panel + (size_t)b * (QK / 2) * NR + 8 * h;
        if (W->qh) {
            panel_q5_block(q, W->qh + gb * 32, out);
            continue;
        }
        for (int j = 0; j < 4; j++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 32 * j));
            /* pairs (8j, 8j + 1), (8j + 2, + 3): bytes 0, 1 and 2, 3's low nibbles; (8j + 4,
             * + 5), (8j + 6, + 7): their high ones */
            __m256i p[4] = {
                _mm256_or_si256(_mm256_and_si256(v, lo),
                                _mm256_and_si256(_mm256_slli_epi32(v, 8), hi)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(v, 16), lo),
                                _mm256_and_si256(_mm256_srli_epi32(v, 8), hi)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(v, 4), lo),
                                _mm256_and_si256(_mm256_slli_epi32(v, 4), hi)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(v, 20), lo),
                                _mm256_and_si256(_mm256_srli_epi32(v, 12), hi)),
            };
            for (int i = 0; i < 4; i++)
                _mm256_store_si256((__m256i *)(out + (4 * j + i) * NR), p[i]);
        }
    }
}

/* ---- x at 16 bits a block --------------------------------------------------------------- */

typedef struct {
    int16_t *qx; /* [rows][K] */
    float *dx;   /* [rows][K / 32]: the block's scale */
    float *sx;   /* [rows][K / 32]: dx * sum(qx) */
} Rows16;

/* Row r's blocks at 16 bits: q in [-top, top]. */
static void row16(const float *x, int r, int K, float top, Rows16 *out) {
    const int nb = K / QK;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (size_t i = (size_t)r * nb; i < (size_t)(r + 1) * nb; i++) {
        const float *xb = x + i * QK;
        __m256 v[4], amax = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(xb + 8 * j);
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
        }
        const float d = hmax256(amax) / top, id = d > 0.0f ? 1.0f / d : 0.0f;
        __m256i q[4];
        for (int j = 0; j < 4; j++)
            q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], _mm256_set1_ps(id)));
        const int sum =
            hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
        /* packs works within 128-bit halves: put the quarters back in order */
        __m256i a = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xD8);
        __m256i b = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xD8);
        _mm256_storeu_si256((__m256i *)(out->qx + i * QK), a);
        _mm256_storeu_si256((__m256i *)(out->qx + i * QK + 16), b);
        out->dx[i] = d;
        out->sx[i] = d * (float)sum;
    }
}

typedef struct {
    const float *x;
    int K;
    float top;
    Rows16 *out;
} Rows16Task;

static void row16_of(void *arg, int r) {
    const Rows16Task *t = (const Rows16Task *)arg;
    row16(t->x, r, t->K, t->top, t->out);
}

/* x at 16 bits a block (q in [-top, top]), rows spread over the pool (a prompt's hundreds
 * of rows took the caller alone while the other thread waited). */
static int rows16(const float *x, int rows, int K, float top, Rows16 *out, int nthreads) {
    const int nb = K / QK;
    out->qx = (int16_t *)aligned_alloc(32, ((size_t)rows * K * 2 + 31) / 32 * 32);
    out->dx = (float *)malloc(sizeof(float) * (size_t)rows * nb);
    out->sx = (float *)malloc(sizeof(float) * (size_t)rows * nb);
    if (!out->qx || !out->dx || !out->sx) return -1;
    Rows16Task t = {x, K, top, out};
    pool_rows(row16_of, &t, rows, nthreads);
    return 0;
}

/* ---- Register tiles ----------------------------------------------------------------------- */

static inline void store_tile_row(float *y, int N, int n0, __m256 a, __m256 b) {
    if (n0 + NR <= N) {
        _mm256_storeu_ps(y + n0, a);
        _mm256_storeu_ps(y + n0 + 8, b);
        return;
    }
    float tmp[NR];
    _mm256_storeu_ps(tmp, a);
    _mm256_storeu_ps(tmp + 8, b);
    memcpy(y + n0, tmp, sizeof(float) * (size_t)(N - n0));
}

typedef struct {
    const Q4Matrix *w; /* Q8_0's head: its shape alone (q8_panel16_matmul) */
    Rows16 q;
    int rows;
    float *y;
    atomic_int failed;  /* a thread's panel could not be had */
    const Q8Matrix *w8; /* the head's Q8_0 weights (no offsets m), or NULL for Q4_1's */
} PanelTask;

/* One row's block of integer sums into its float sums: acc += s * d * dx + m * sx. */
static inline void add_block(float *acc, __m256i s0, __m256i s1, const float *d, const float *m,
                             float dx, float sx) {
    const __m256 vdx = _mm256_set1_ps(dx), vsx = _mm256_set1_ps(sx);
    __m256 a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_mul_ps(_mm256_load_ps(d), vdx),
                                _mm256_load_ps(acc));
    __m256 a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1),
                                _mm256_mul_ps(_mm256_load_ps(d + 8), vdx), _mm256_load_ps(acc + 8));
    _mm256_store_ps(acc, _mm256_fmadd_ps(_mm256_load_ps(m), vsx, a0));
    _mm256_store_ps(acc + 8, _mm256_fmadd_ps(_mm256_load_ps(m + 8), vsx, a1));
}

#define MADD2(S0, S1, X)                                                                      \
    do {                                                                                      \
        int32_t pair_;                                                                        \
        memcpy(&pair_, (X) + 2 * p, 4);                                                       \
        const __m256i a_ = _mm256_set1_epi32(pair_);                                          \
        S0 = add_into(S0, _mm256_madd_epi16(a_, w0));                                         \
        S1 = add_into(S1, _mm256_madd_epi16(a_, w1));                                         \
    } while (0)

/* S0, S1 += the int16 pairs of w0, w1's bytes times the row's 4 int8 of x at quad i */
#define MADDUBS2(S0, S1, X)                                                                   \
    do {                                                                                      \
        int32_t quad_;                                                                        \
        memcpy(&quad_, (X) + 4 * i, 4);                                                       \
        const __m256i a_ = _mm256_set1_epi32(quad_);                                          \
        S0 = add16_into(S0, _mm256_maddubs_epi16(w0, a_));                                    \
        S1 = add16_into(S1, _mm256_maddubs_epi16(w1, a_));                                    \
    } while (0)

#if !HAVE_I16_VNNI
/* y[r, n0 .. n0 + 15] for rows r0 .. r0 + rows - 1 (rows <= MR); a short tile repeats
 * its last row and stores only its own. Written out for 4 rows: 8 sums, 2 weights, 1 x and
 * a product in flight fill AVX2's 16 registers without copies. */
static void tile(const void *task, const int32_t *panel, int r0, int rows, int n0) {
    const PanelTask *t = (const PanelTask *)task;
    const int K = t->w->k, N = t->w->n, nb = K / QK;
    const float *ds = (const float *)(panel + (size_t)K / 2 * NR), *ms = ds + (size_t)nb * NR;
    float acc[MR][NR] __attribute__((aligned(32)));
    memset(acc, 0, sizeof acc);
    const int16_t *x[MR];
    for (int r = 0; r < MR; r++) x[r] = t->q.qx + (size_t)(r0 + (r < rows ? r : rows - 1)) * K;
    for (int b = 0; b < nb; b++) {
        __m256i s00 = _mm256_setzero_si256(), s01 = s00, s10 = s00, s11 = s00;
        __m256i s20 = s00, s21 = s00, s30 = s00, s31 = s00;
        const int16_t *x0 = x[0] + b * QK, *x1 = x[1] + b * QK, *x2 = x[2] + b * QK,
                      *x3 = x[3] + b * QK;
        const int32_t *wb = panel + (size_t)b * (QK / 2) * NR;
        for (int p = 0; p < QK / 2; p++) {
            const __m256i w0 = _mm256_load_si256((const __m256i *)(wb + p * NR));
            const __m256i w1 = _mm256_load_si256((const __m256i *)(wb + p * NR + 8));
            MADD2(s00, s01, x0);
            MADD2(s10, s11, x1);
            MADD2(s20, s21, x2);
            MADD2(s30, s31, x3);
        }
        const __m256i s[MR][2] = {{s00, s01}, {s10, s11}, {s20, s21}, {s30, s31}};
        for (int r = 0; r < rows; r++) {
            const size_t rb = (size_t)(r0 + r) * nb + b;
            add_block(acc[r], s[r][0], s[r][1], ds + b * NR, ms + b * NR, t->q.dx[rb],
                      t->q.sx[rb]);
        }
    }
    for (int r = 0; r < rows; r++)
        store_tile_row(t->y + (size_t)(r0 + r) * N, N, n0, _mm256_load_ps(acc[r]),
                       _mm256_load_ps(acc[r] + 8));
}

#endif

#if HAVE_I16_VNNI
/* The same tile where the kernels are built for AVX512-VNNI: a panel's 16 columns of one
 * pair of k are one 512-bit vector, and vpdpwssd multiplies and adds the pairs into the
 * 32-bit sums in one instruction (32 multiply-adds), so 8 rows' block sums and 8 rows'
 * float sums fit in AVX512's 32 registers. */
#define MR512 8

/* acc += the pairs' products of w and x's pair (k, k + 1), broadcast from memory: in place,
 * as add_into (gcc 12 copied each sum to a fresh register and back, a move per product). */
static inline __m512i dp_into(__m512i acc, __m512i w, const int16_t *pair) {
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)pair));
    return acc;
}

/* The 8 rows of a tile from r0; a short tile repeats its last row (and stores only its own). */
static inline void tile_rows(int r0, int rows, size_t row[MR512]) {
    for (int r = 0; r < MR512; r++) row[r] = (size_t)(r0 + (r < rows ? r : rows - 1));
}

/* Block b's integer sums into the rows' float sums: acc += s * d * dx (+ m * sx where the
 * weights have offsets: sx not NULL). ds, ms: the panel's scales [nb][16]. */
static inline __attribute__((always_inline)) void add_block512(
    __m512 acc[MR512], const __m512i s[MR512], const float *ds, const float *ms,
    const size_t row[MR512], int nb, int b, const float *dx, const float *sx) {
    const __m512 d = _mm512_load_ps(ds + b * NR), m = _mm512_load_ps(ms + b * NR);
    for (int r = 0; r < MR512; r++) {
        const size_t rb = row[r] * nb + b;
        const __m512 a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[r]),
                                         _mm512_mul_ps(d, _mm512_set1_ps(dx[rb])), acc[r]);
        acc[r] = sx ? _mm512_fmadd_ps(m, _mm512_set1_ps(sx[rb]), a) : a;
    }
}

static inline void store_tile512(float *y, int N, int n0, int r0, int rows, const __m512 acc[MR512]) {
    const __mmask16 keep = first_lanes(N - n0);
    for (int r = 0; r < rows; r++) _mm512_mask_storeu_ps(y + (size_t)(r0 + r) * N + n0, keep, acc[r]);
}

static void tile512(const void *task, const int32_t *panel, int r0, int rows, int n0) {
    const PanelTask *t = (const PanelTask *)task;
    const int K = t->w->k, nb = K / QK;
    const float *ds = (const float *)(panel + (size_t)K / 2 * NR), *ms = ds + (size_t)nb * NR;
    size_t row[MR512];
    tile_rows(r0, rows, row);
    __m512 acc[MR512];
    for (int r = 0; r < MR512; r++) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m512i s[MR512];
        for (int r = 0; r < MR512; r++) s[r] = _mm512_setzero_si512();
        const int32_t *wb = panel + (size_t)b * (QK / 2) * NR;
        for (int p = 0; p < QK / 2; p++) {
            const __m512i w = _mm512_load_si512((const void *)(wb + p * NR));
            for (int r = 0; r < MR512; r++)
                s[r] = dp_into(s[r], w, t->q.qx + row[r] * K + b * QK + 2 * p);
        }
        add_block512(acc, s, ds, ms, row, nb, b, t->q.dx, t->w8 ? NULL : t->q.sx);
    }
    store_tile512(t->y, t->w->n, n0, r0, rows, acc);
}
#endif

#if HAVE_I16_VNNI
#define TILE tile512
#define TILE_ROWS MR512
#else
#define TILE tile
#define TILE_ROWS MR
#endif

static __thread void *tls_panel;
static __thread size_t tls_panel_cap;

/* The calling thread's panel of at least `need` bytes (64-byte aligned), NULL out of memory. */
static void *panel_of(size_t need) {
    if (tls_panel_cap < need) {
        free(tls_panel);
        tls_panel = aligned_alloc(64, (need + 63) / 64 * 64);
        tls_panel_cap = tls_panel ? need : 0;
    }
    return tls_panel;
}

/* Fills half h (8 columns) of a panel from group g of the weights `w`. */
typedef void (*fill_fn)(const void *w, int g, int h, int32_t *panel);
/* Rows r0 .. r0 + rows - 1 of the task's output, for the panel's 16 columns from n0. */
typedef void (*tile_fn)(const void *task, const int32_t *panel, int r0, int rows, int n0);

/* Chunk c of a product: its 16 columns (groups 2c and 2c + 1 of the kernel layout)
 * unpacked into this thread's panel of `need` bytes, then every tile of `tile_rows` rows.
 * 0, or -1 out of memory. */
static int panel_pass(const void *task, const void *w, int n, int rows, int c, size_t need,
                      fill_fn fill, tile_fn tile, int tile_rows) {
    const int n0 = c * NR, groups = (n + GROUP - 1) / GROUP;
    int32_t *panel = (int32_t *)panel_of(need);
    if (!panel) return -1;
    /* a second group past the matrix's: zero weights (its outputs are never stored) */
    if (n0 / GROUP + 1 >= groups) memset(panel, 0, need);
    for (int h = 0; h < 2 && n0 / GROUP + h < groups; h++) fill(w, n0 / GROUP + h, h, panel);
    for (int r0 = 0; r0 < rows; r0 += tile_rows)
        tile(task, panel, r0, rows - r0 < tile_rows ? rows - r0 : tile_rows, n0);
    return 0;
}

/* The 16-bit panels' bytes: the pairs, 2 bytes a weight, then d and m: 4 bytes a column
 * and block each. */
static size_t panel16_bytes(int K) { return (size_t)K * NR * 2 + (size_t)K / QK * NR * 8; }

static void panel_chunk(void *arg, int c) {
    PanelTask *t = (PanelTask *)arg;
    if (panel_pass(t, t->w, t->w->n, t->rows, c, panel16_bytes(t->w->k), panel_q4, TILE, TILE_ROWS))
        atomic_store(&t->failed, 1);
}

/* y [rows, N] = x [rows, K] @ W.T for Q4_1 W in the kernel layout, x at 16 bits a block
 * against the weights' integers; -2 for a K that is not whole blocks, -1 out of memory. */
static int q4_panel_matmul(const Q4Matrix *w, const float *x, int rows, float *y, int nthreads) {
    if (w->k % QK || w->n <= 0 || rows <= 0) return -2;
    PanelTask t = {w, {NULL, NULL, NULL}, rows, y, 0, NULL};
    int rc = rows16(x, rows, w->k, 32767.0f, &t.q, nthreads);
    if (!rc) {
        pool_run(panel_chunk, &t, (w->n + NR - 1) / NR, nthreads);
        rc = atomic_load(&t.failed) ? -1 : 0;
    }
    free(t.q.qx);
    free(t.q.dx);
    free(t.q.sx);
    return rc;
}

/* Whether the 16-bit product runs its AVX512-VNNI tile (tile512), which outruns the
 * bf16-activation product (q4_1_bf16_gemm.c) from about 32 rows (python -m
 * inference.bench.kernels --rows 8 16 32 64 --kinds bf16 i16). */
int q4_1_i16_vnni(void) {
#if HAVE_I16_VNNI
    return 1;
#else
    return 0;
#endif
}

int q4_1_gemm_i16(const uint8_t *qs, const uint16_t *d, const uint16_t *m, int N, int K,
                  const float *x, int rows, float *y, int nthreads, const uint8_t *sc,
                  const uint8_t *mn, const uint8_t *qh) {
    Q4Matrix w = {qs, d, m, N, K, sc, mn, qh};
    return q4_panel_matmul(&w, x, rows, y, nthreads);
}

/* ---- 8-bit activations: the native path's products of many rows ---------------------------
 *
 * q4_1_gemm.c's 8-bit kernel unpacks each weight block again for every 4 rows, in 256-bit
 * vectors of 8 columns, and at a decode step of 64 rows that unpacking and the per-row
 * broadcasts of x are most of its instructions. Steps of at least panel_min_rows rows
 * instead unpack 16 columns once into a panel of their q as bytes, 4 consecutive k a 32-bit
 * lane ([K / 4][16], one 512-bit vector per 4 k). Where the kernels are built for
 * AVX512-VNNI, 8 rows take one register tile: vpdpbusd multiplies the weights' bytes (0..15)
 * by x's 4 int8 broadcast from memory and adds into 32-bit sums, 64 multiply-adds an
 * instruction, twice vpdpwssd's; on AVX2 alone, 4 rows (tile256_u8). Same activations
 * (activations.c's per-block int8, scale max|x| / 127) and same integer sums: only the float
 * sums' order differs. */
static void panel_q4_u8(const void *w, int g, int h, int32_t *panel) {
    const Q4Matrix *W = (const Q4Matrix *)w;
    const int nb = W->k / QK;
    const __m256i lo = _mm256_set1_epi8(0x0F);
    float *ds = (float *)(panel + (size_t)W->k / 4 * NR), *ms = ds + (size_t)nb * NR;
    for (int b = 0; b < nb; b++) {
        const size_t gb = (size_t)g * nb + b;
        const uint8_t *q = W->qs + gb * 128;
        panel_scales(W, g, b, ds + b * NR + 8 * h, ms + b * NR + 8 * h);
        int32_t *out = panel + (size_t)b * (QK / 4) * NR + 8 * h;
        /* vector j: k 8j..8j+3 in the low nibbles, 8j+4..8j+7 in the high (common.h);
         * Q5_K's fifth bits ORed in */
        const __m256i top = W->qh ? _mm256_loadu_si256((const __m256i *)(W->qh + gb * 32))
                                  : _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 32 * j));
            _mm256_store_si256((__m256i *)(out + (2 * j) * NR),
                               _mm256_or_si256(_mm256_and_si256(v, lo), q5_top(top, 2 * j)));
            _mm256_store_si256((__m256i *)(out + (2 * j + 1) * NR),
                               _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), lo),
                                               q5_top(top, 2 * j + 1)));
        }
    }
}

typedef struct {
    const Q4Matrix *w;
    const int8_t *qx; /* [rows][K] */
    const float *dx, *sx; /* [rows][K / 32]: the block's scale, and scale * sum(qx) */
    int rows;
    float *y;
    atomic_int failed;
    const Q8Matrix *w8;   /* Q8_0 or Q6_K weights (q8_panel8_matmul); w then their shape */
    const int32_t *s16;   /* [rows][K / 16]: sum(qx) (Q6_K's offsets) */
} Panel8Task;

#if HAVE_I16_VNNI
/* acc += w's bytes times the 4 int8 of x at `quad`, broadcast from memory, in place. */
static inline __m512i dpb_into(__m512i acc, __m512i w, const int8_t *quad) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)quad));
    return acc;
}

static void tile512_u8(const void *task, const int32_t *panel, int r0, int rows, int n0) {
    const Panel8Task *t = (const Panel8Task *)task;
    const int K = t->w->k, nb = K / QK;
    const float *ds = (const float *)(panel + (size_t)K / 4 * NR), *ms = ds + (size_t)nb * NR;
    size_t row[MR512];
    tile_rows(r0, rows, row);
    __m512 acc[MR512];
    for (int r = 0; r < MR512; r++) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m512i s[MR512];
        for (int r = 0; r < MR512; r++) s[r] = _mm512_setzero_si512();
        const int32_t *wb = panel + (size_t)b * (QK / 4) * NR;
        for (int i = 0; i < QK / 4; i++) {
            const __m512i w = _mm512_load_si512((const void *)(wb + i * NR));
            for (int r = 0; r < MR512; r++)
                s[r] = dpb_into(s[r], w, t->qx + row[r] * K + b * QK + 4 * i);
        }
        add_block512(acc, s, ds, ms, row, nb, b, t->dx, t->sx);
    }
    store_tile512(t->y, t->w->n, n0, r0, rows, acc);
}

#endif

#if !HAVE_I16_VNNI
/* The same panels on AVX2 (no vpdpbusd): a tile of 4 rows by the panel's 16 columns, each
 * k quad's two weight vectors loaded once for the 4 rows and each row's x quad broadcast
 * once for the 16 columns (q4_1_gemm.c's grouped tile unpacks each block again for every
 * 4 rows and broadcasts x for every 8 columns). vpmaddubsw multiplies the bytes (0..15) by
 * x's int8 into int16 pairs, summed in int16 over the block (8 x 2 x 15 x 127 < 32767:
 * nothing saturates) and widened once a block (Q5_K's bytes, 0..31, once a half: 4 x 2 x
 * 31 x 127 < 32767); 8 sums, 2 weights, x and a product fill 12 of AVX2's 16 registers,
 * and the rows' float sums stay in memory (add_block). */
static void tile256_u8(const void *task, const int32_t *panel, int r0, int rows, int n0) {
    const Panel8Task *t = (const Panel8Task *)task;
    const int K = t->w->k, N = t->w->n, nb = K / QK;
    const float *ds = (const float *)(panel + (size_t)K / 4 * NR), *ms = ds + (size_t)nb * NR;
    const __m256i ones = _mm256_set1_epi16(1);
    const int q5 = t->w->qh != NULL;
    float acc[MR][NR] __attribute__((aligned(32)));
    memset(acc, 0, sizeof acc);
    const int8_t *x[MR];
    for (int r = 0; r < MR; r++) x[r] = t->qx + (size_t)(r0 + (r < rows ? r : rows - 1)) * K;
    for (int b = 0; b < nb; b++) {
        __m256i s00 = _mm256_setzero_si256(), s01 = s00, s10 = s00, s11 = s00;
        __m256i s20 = s00, s21 = s00, s30 = s00, s31 = s00;
        __m256i half[MR][2]; /* Q5_K's first half, widened */
        const int8_t *x0 = x[0] + b * QK, *x1 = x[1] + b * QK, *x2 = x[2] + b * QK,
                     *x3 = x[3] + b * QK;
        const int32_t *wb = panel + (size_t)b * (QK / 4) * NR;
        for (int i = 0; i < QK / 4; i++) {
            const __m256i w0 = _mm256_load_si256((const __m256i *)(wb + i * NR));
            const __m256i w1 = _mm256_load_si256((const __m256i *)(wb + i * NR + 8));
            MADDUBS2(s00, s01, x0);
            MADDUBS2(s10, s11, x1);
            MADDUBS2(s20, s21, x2);
            MADDUBS2(s30, s31, x3);
            if (q5 && i == QK / 8 - 1) {
                const __m256i f[MR][2] = {{s00, s01}, {s10, s11}, {s20, s21}, {s30, s31}};
                for (int r = 0; r < MR; r++)
                    for (int e = 0; e < 2; e++) half[r][e] = _mm256_madd_epi16(f[r][e], ones);
                s00 = s01 = s10 = s11 = s20 = s21 = s30 = s31 = _mm256_setzero_si256();
            }
        }
        const __m256i s[MR][2] = {{s00, s01}, {s10, s11}, {s20, s21}, {s30, s31}};
        for (int r = 0; r < rows; r++) {
            const size_t rb = (size_t)(r0 + r) * nb + b;
            __m256i w[2] = {_mm256_madd_epi16(s[r][0], ones), _mm256_madd_epi16(s[r][1], ones)};
            if (q5)
                for (int e = 0; e < 2; e++) w[e] = _mm256_add_epi32(w[e], half[r][e]);
            add_block(acc[r], w[0], w[1], ds + b * NR, ms + b * NR, t->dx[rb], t->sx[rb]);
        }
    }
    for (int r = 0; r < rows; r++)
        store_tile_row(t->y + (size_t)(r0 + r) * N, N, n0, _mm256_load_ps(acc[r]),
                       _mm256_load_ps(acc[r] + 8));
}
#define TILE_U8 tile256_u8
#define TILE_U8_ROWS MR
#else
#define TILE_U8 tile512_u8
#define TILE_U8_ROWS MR512
#endif

#if HAVE_I16_VNNI
/* A GGUF's Q8_0 and Q6_K layers on the same 8-bit panels (the native path's products of
 * many rows; fewer: q8_0_gemm.c's q8u_tile_n and q6u_tile_n). The bytes go in
 * unsigned, as there:
 * Q8_0's q + 128, whose offset is an m of -128 d (sx = dx sum(qx): tile512_u8 unchanged);
 * Q6_K's q (0..63), whose two scales a block (one per 16 k) take the panel's d and m slots
 * (lo, hi) and whose -32 comes off each half's integer sums (tile512_u8_q6). */
static void panel_q8_u8(const void *w, int g, int h, int32_t *panel) {
    const Q8Matrix *W = (const Q8Matrix *)w;
    const int nb = W->k / QK;
    float *ds = (float *)(panel + (size_t)W->k / 4 * NR), *ms = ds + (size_t)nb * NR;
    for (int b = 0; b < nb; b++) {
        const size_t gb = (size_t)g * nb + b;
        int32_t *out = panel + (size_t)b * (QK / 4) * NR + 8 * h;
        if (W->sc) {
            __m256 lo, hi;
            q6_block_scales(W, (size_t)g, b, &lo, &hi);
            _mm256_store_ps(ds + b * NR + 8 * h, lo);
            _mm256_store_ps(ms + b * NR + 8 * h, hi);
            for (int j = 0; j < 4; j++) {
                __m256i lo4, hi4;
                q6_pairs4(W, gb, j, &lo4, &hi4);
                _mm256_store_si256((__m256i *)(out + j * NR), quad_of_pair_vector(lo4));
                _mm256_store_si256((__m256i *)(out + (4 + j) * NR), quad_of_pair_vector(hi4));
            }
            continue;
        }
        const __m256 d = _mm256_loadu_ps(W->d + gb * GROUP);
        _mm256_store_ps(ds + b * NR + 8 * h, d);
        _mm256_store_ps(ms + b * NR + 8 * h, _mm256_mul_ps(d, _mm256_set1_ps(-128.0f)));
        const int8_t *q = W->qs + gb * 256;
        for (int i = 0; i < QK / 4; i++)
            _mm256_store_si256((__m256i *)(out + i * NR),
                               quad_of_pairs(q8_pair_u(q + 32 * i), q8_pair_u(q + 32 * i + 16)));
    }
}

/* tile512_u8 for Q6_K's panels: each block's halves summed apart, each from its -32 times
 * the half's sum(qx), then times its scale. */
static void tile512_u8_q6(const void *task, const int32_t *panel, int r0, int rows, int n0) {
    const Panel8Task *t = (const Panel8Task *)task;
    const int K = t->w->k, nb = K / QK;
    const float *ds = (const float *)(panel + (size_t)K / 4 * NR), *ms = ds + (size_t)nb * NR;
    size_t row[MR512];
    tile_rows(r0, rows, row);
    __m512 acc[MR512];
    for (int r = 0; r < MR512; r++) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m512i lo[MR512], hi[MR512];
        for (int r = 0; r < MR512; r++) {
            const int32_t *s16 = t->s16 + row[r] * (K / 16) + 2 * b;
            lo[r] = _mm512_set1_epi32(-32 * s16[0]);
            hi[r] = _mm512_set1_epi32(-32 * s16[1]);
        }
        const int32_t *wb = panel + (size_t)b * (QK / 4) * NR;
        for (int i = 0; i < QK / 8; i++) {
            const __m512i w = _mm512_load_si512((const void *)(wb + i * NR));
            for (int r = 0; r < MR512; r++)
                lo[r] = dpb_into(lo[r], w, t->qx + row[r] * K + b * QK + 4 * i);
        }
        for (int i = QK / 8; i < QK / 4; i++) {
            const __m512i w = _mm512_load_si512((const void *)(wb + i * NR));
            for (int r = 0; r < MR512; r++)
                hi[r] = dpb_into(hi[r], w, t->qx + row[r] * K + b * QK + 4 * i);
        }
        const __m512 dl = _mm512_load_ps(ds + b * NR), dh = _mm512_load_ps(ms + b * NR);
        for (int r = 0; r < MR512; r++) {
            const __m512 part = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi[r]), dh,
                                                _mm512_mul_ps(_mm512_cvtepi32_ps(lo[r]), dl));
            acc[r] = _mm512_fmadd_ps(part, _mm512_set1_ps(t->dx[row[r] * nb + b]), acc[r]);
        }
    }
    store_tile512(t->y, t->w->n, n0, r0, rows, acc);
}

static void panel8_q8_chunk(void *arg, int c) {
    Panel8Task *t = (Panel8Task *)arg;
    const size_t need = (size_t)t->w->k * NR + (size_t)t->w->k / QK * NR * 8;
    if (panel_pass(t, t->w8, t->w->n, t->rows, c, need, panel_q8_u8,
                   t->w8->sc ? tile512_u8_q6 : tile512_u8, MR512))
        atomic_store(&t->failed, 1);
}

int q8_panel8_matmul(const Q8Matrix *w, const int8_t *qx, const float *dx, const float *sx,
                     const int32_t *s16, int rows, float *y, int nthreads) {
    const Q4Matrix shape = {NULL, NULL, NULL, w->n, w->k, NULL, NULL, NULL};
    Panel8Task t = {&shape, qx, dx, sx, rows, y, 0, w, s16};
    pool_run(panel8_q8_chunk, &t, (w->n + NR - 1) / NR, nthreads);
    return atomic_load(&t.failed) ? -1 : 0;
}
#endif

static void panel8_chunk(void *arg, int c) {
    Panel8Task *t = (Panel8Task *)arg;
    /* a byte a weight, then d and m: 4 bytes a column and block each */
    const size_t need = (size_t)t->w->k * NR + (size_t)t->w->k / QK * NR * 8;
    if (panel_pass(t, t->w, t->w->n, t->rows, c, need, panel_q4_u8, TILE_U8, TILE_U8_ROWS))
        atomic_store(&t->failed, 1);
}

/* The head's Q8_0 blocks as the 16-bit tile's panel: the int8 pairs (k, k + 1) widened to
 * int16 pairs, d in float32 and m zero (t->w8 set: the tile adds no offsets).
 *
 * Q6_K's pairs are q - 32 times their int8 scale (|q - 32| * |sc| <= 4096), its d per 256
 * the blocks' d: one scale a block, as the tiles take it. A block's 32 products then reach
 * 4096 * 32 * |qx|, which x at 15 bits (|qx| <= 16383: q8_panel16_matmul) keeps below
 * 2^31. */
static void panel_q8(const void *w, int g, int h, int32_t *panel) {
    const Q8Matrix *W = (const Q8Matrix *)w;
    const int nb = W->k / QK;
    float *ds = (float *)(panel + (size_t)W->k / 2 * NR), *ms = ds + (size_t)nb * NR;
    for (int b = 0; b < nb; b++) {
        const size_t gb = (size_t)g * nb + b;
        int32_t *out = panel + (size_t)b * (QK / 2) * NR + 8 * h;
        _mm256_store_ps(ms + b * NR + 8 * h, _mm256_setzero_ps());
        if (W->sc) {
            const size_t gs = (size_t)g * (W->k / 16) + 2 * (size_t)b;
            const size_t gd = (size_t)g * (W->k / QK_K) + (size_t)(b / (QK_K / QK));
            _mm256_store_ps(ds + b * NR + 8 * h,
                            _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(W->d6 + gd * GROUP))));
            /* each column's scale twice, for its pair's two lanes: k 0..15, then 16..31 */
            const __m128i sc = _mm_loadl_epi64((const __m128i *)(W->sc + gs * GROUP));
            const __m128i sc2 = _mm_loadl_epi64((const __m128i *)(W->sc + gs * GROUP + GROUP));
            const __m256i s[2] = {_mm256_cvtepi8_epi16(_mm_unpacklo_epi8(sc, sc)),
                                  _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(sc2, sc2))};
            for (int j = 0; j < 4; j++) {
                __m256i v[2];
                q6_pairs4(W, gb, j, &v[0], &v[1]);
                for (int h2 = 0; h2 < 2; h2++) { /* pairs 2j, 2j + 1, then 2j + 8, 2j + 9 */
                    const __m256i q = _mm256_sub_epi8(v[h2], _mm256_set1_epi8(32));
                    const __m128i pq[2] = {_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)};
                    for (int e = 0; e < 2; e++)
                        _mm256_store_si256(
                            (__m256i *)(out + (8 * h2 + 2 * j + e) * NR),
                            _mm256_mullo_epi16(_mm256_cvtepi8_epi16(pq[e]), s[h2]));
                }
            }
            continue;
        }
        const int8_t *q = W->qs + gb * 256;
        _mm256_store_ps(ds + b * NR + 8 * h, _mm256_loadu_ps(W->d + gb * GROUP));
        for (int p = 0; p < QK / 2; p++)
            _mm256_store_si256((__m256i *)(out + p * NR),
                               _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + 16 * p))));
    }
}

static void panel16_q8_chunk(void *arg, int c) {
    PanelTask *t = (PanelTask *)arg;
    if (panel_pass(t, t->w8, t->w->n, t->rows, c, panel16_bytes(t->w->k), panel_q8, TILE, TILE_ROWS))
        atomic_store(&t->failed, 1);
}

int q8_panel16_matmul(const Q8Matrix *w, const float *x, int rows, float *y, int nthreads) {
    const Q4Matrix shape = {NULL, NULL, NULL, w->n, w->k, NULL, NULL, NULL};
    PanelTask t = {&shape, {NULL, NULL, NULL}, rows, y, 0, w};
    int rc = rows16(x, rows, w->k, w->sc ? 16383.0f : 32767.0f, &t.q, nthreads);
    if (!rc) {
        pool_run(panel16_q8_chunk, &t, (w->n + NR - 1) / NR, nthreads);
        rc = atomic_load(&t.failed) ? -1 : 0;
    }
    free(t.q.qx);
    free(t.q.dx);
    free(t.q.sx);
    return rc;
}

int q4_panel8_matmul(const Q4Matrix *w, const int8_t *qx, const float *dx, const float *sx,
                     int rows, float *y, int nthreads) {
    Panel8Task t = {w, qx, dx, sx, rows, y, 0};
    pool_run(panel8_chunk, &t, (w->n + NR - 1) / NR, nthreads);
    return atomic_load(&t.failed) ? -1 : 0;
}
