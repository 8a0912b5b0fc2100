/* One draw per row of logits, with temperature, top-k, top-p and min-p: the distribution
 * sampler.filter_logits + softmax gives, in one pass over the vocabulary and a sort of the
 * few tokens that matter, instead of ~20 torch ops (~0.5-1 ms a row over 49k tokens).
 *
 * Per row: e_i = exp(l_i / T - max / T) over the whole vocabulary (Z their sum); the
 * candidates are the tokens with e_i >= CAND_MIN (relative to the most likely one), sorted
 * by e_i. Whatever the filters keep is decided among them when top-k cuts inside them, or
 * top-p's mass is reached among them, or min-p drops everything below CAND_MIN; any other row
 * (a nearly flat distribution, say) gets -1 and the caller draws it over the whole
 * vocabulary the slow way. Rows without filters draw over the whole vocabulary, by inverse
 * CDF in token order. The uniform numbers come from the caller (torch's generator), so the
 * draws consume random numbers as before.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "simd.h"

#define CAND_MIN 1e-5f
#define MAX_CAND 4096

typedef struct {
    float e;
    int i;
} Cand;

static int by_weight(const void *a, const void *b) {
    const Cand *x = (const Cand *)a, *y = (const Cand *)b;
    if (x->e != y->e) return x->e < y->e ? 1 : -1;
    return x->i - y->i;
}

static __thread float *tls_e;
static __thread int tls_cap;
static __thread Cand *tls_cand;

/* The largest of l[0 .. V), NaNs passed over. In four vectors: the scalar loop is a chain of
 * dependent maxss, half of a row's weighing over 49k logits. vmaxps(a, b) gives b where a is NaN or the two are equal, as the scalar
 * `a > b ? a : b` did, so the maximum is the same value. */
static float max_of(const float *l, int V) {
    __m256 a[4];
    for (int j = 0; j < 4; j++) a[j] = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 32 <= V; i += 32)
        for (int j = 0; j < 4; j++) a[j] = _mm256_max_ps(_mm256_loadu_ps(l + i + 8 * j), a[j]);
    for (; i + 8 <= V; i += 8) a[0] = _mm256_max_ps(_mm256_loadu_ps(l + i), a[0]);
    float mx = hmax256(_mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3])));
    for (; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    return mx;
}

/* The row's weights e (relative to its best token, e = 1) into tls_e and their sum *z. */
static int weigh(const float *l, int V, float T, double *z) {
    if (V > tls_cap) {
        float *grown = realloc(tls_e, sizeof(float) * ((size_t)V + 8));
        if (!grown) return -2;
        tls_e = grown;
        tls_cap = V;
    }
    if (!tls_cand && !(tls_cand = malloc(sizeof(Cand) * MAX_CAND))) return -2;
    float *e = tls_e;
    const float m = max_of(l, V) / T;
    const __m256 vt = _mm256_set1_ps(T), vm = _mm256_set1_ps(m);
    __m256 vz = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= V; i += 8) {
        __m256 v = exp256(_mm256_sub_ps(_mm256_div_ps(_mm256_loadu_ps(l + i), vt), vm));
        _mm256_storeu_ps(e + i, v);
        vz = _mm256_add_ps(vz, v);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, vz);
    double sum = 0;
    for (int j = 0; j < 8; j++) sum += lanes[j];
    for (; i < V; i++) {
        e[i] = _mm256_cvtss_f32(exp256(_mm256_set1_ps(l[i] / T - m)));
        sum += e[i];
    }
    *z = sum;
    return 0;
}

/* What the filters keep, as tls_cand[0 .. *kept), most likely first: 0, or -1 where the
 * candidates do not decide it. Only for rows with a filter. */
static int filter_kept(int V, double z, int top_k, float top_p, float min_p, int *kept_out) {
    const float *e = tls_e;
    int n = 0, i = 0;
    const __m256 vmin = _mm256_set1_ps(CAND_MIN);
    for (; i + 8 <= V; i += 8) {
        int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(e + i), vmin, _CMP_GE_OQ));
        while (mask) {
            int j = i + __builtin_ctz(mask);
            mask &= mask - 1;
            if (n == MAX_CAND) return -1;
            tls_cand[n++] = (Cand){e[j], j};
        }
    }
    for (; i < V; i++)
        if (e[i] >= CAND_MIN) {
            if (n == MAX_CAND) return -1;
            tls_cand[n++] = (Cand){e[i], i};
        }
    qsort(tls_cand, (size_t)n, sizeof(Cand), by_weight);
    /* top-k, then top-p of what top-k kept, then min-p against the most likely token (the
     * first candidate, e = 1). A token outside the candidates has e < CAND_MIN: min-p drops
     * every such token when min_p >= CAND_MIN. */
    int k_active = 0 < top_k && top_k < V, k_inside = k_active && top_k <= n;
    int rest_dropped_by_min_p = min_p >= CAND_MIN;
    if (k_active && !k_inside && top_p < 1.0f) return -1; /* its mass needs their order */
    int kept = k_inside ? top_k : n;
    double kept_mass = z;
    if (k_inside) {
        kept_mass = 0;
        for (int j = 0; j < kept; j++) kept_mass += tls_cand[j].e;
    }
    int cut = k_inside;
    if (top_p < 1.0f) {
        /* A token stays while the mass before it is under top_p (the first always stays). */
        double before = 0, bound = (double)top_p * kept_mass;
        int j = 0;
        while (j < kept && (j == 0 || before < bound)) before += tls_cand[j++].e;
        if (j < kept || before >= bound) cut = 1;
        kept = j;
    }
    if (!cut && !rest_dropped_by_min_p) return -1;
    if (min_p > 0.0f) {
        float floor_e = min_p * tls_cand[0].e;
        while (kept > 1 && tls_cand[kept - 1].e < floor_e) kept--;
    }
    *kept_out = kept;
    return 0;
}

/* A draw by inverse CDF with uniform u: among the kept candidates (kept >= 0) or, for an
 * unfiltered row (kept < 0), over the whole vocabulary in token order; `skip` (>= 0) is
 * left out, as if its weight were 0. */
static int64_t draw_kept(int V, int kept, double total, double u, int64_t skip) {
    double target = u * total, acc = 0;
    int64_t last = -1;
    if (kept < 0) {
        for (int j = 0; j < V; j++) {
            if (j == skip || tls_e[j] <= 0) continue;
            acc += tls_e[j];
            last = j;
            if (acc > target) return j;
        }
        return last >= 0 ? last : 0;
    }
    for (int j = 0; j < kept; j++) {
        if (tls_cand[j].i == skip) continue;
        acc += tls_cand[j].e;
        last = tls_cand[j].i;
        if (acc > target) return last;
    }
    return last >= 0 ? last : tls_cand[0].i;
}

static int is_filtered(int V, int top_k, float top_p, float min_p) {
    return (0 < top_k && top_k < V) || top_p < 1.0f || min_p > 0.0f;
}

static int64_t sample_row(const float *l, int V, float T, int top_k, float top_p, float min_p,
                          float u) {
    double z;
    if (weigh(l, V, T, &z)) return -2;
    if (!is_filtered(V, top_k, top_p, min_p)) return draw_kept(V, -1, z, u, -1);
    int kept;
    if (filter_kept(V, z, top_k, top_p, min_p, &kept)) return -1;
    double total = 0;
    for (int j = 0; j < kept; j++) total += tls_cand[j].e;
    return draw_kept(V, kept, total, u, -1);
}

/* One step of rejection sampling for a deterministic guess (prompt lookup): the guess stands
 * with probability p(guess) under the filtered distribution (u_accept < p); else the token
 * is drawn from p without the guess, renormalized (u_draw). Returns the guess when it
 * stands, the drawn token otherwise, -1 where the candidates do not decide the filters,
 * -2 when out of memory. */
int64_t spec_sample(const float *l, int V, float T, int top_k, float top_p, float min_p,
                    int64_t guess, float u_accept, float u_draw) {
    double z;
    if (weigh(l, V, T, &z)) return -2;
    int kept = -1;
    double total = z;
    if (is_filtered(V, top_k, top_p, min_p)) {
        if (filter_kept(V, z, top_k, top_p, min_p, &kept)) return -1;
        total = 0;
        for (int j = 0; j < kept; j++) total += tls_cand[j].e;
    }
    double p_guess = 0;
    if (kept < 0) {
        p_guess = (guess >= 0 && guess < V) ? tls_e[guess] / total : 0;
    } else {
        for (int j = 0; j < kept; j++)
            if (tls_cand[j].i == guess) p_guess = tls_cand[j].e / total;
    }
    if ((double)u_accept < p_guess) return guess;
    double rest = total - p_guess * total;
    if (rest <= 0) return guess; /* p is all on the guess: any draw from p is the guess */
    return draw_kept(V, kept, rest, u_draw, guess);
}

typedef struct {
    const float *logits;
    int V;
    const float *temps, *top_p, *min_p, *u;
    const int32_t *top_k;
    int64_t *out;
} SampleTask;

static void sample_chunk(void *arg, int r) {
    const SampleTask *t = (const SampleTask *)arg;
    t->out[r] = sample_row(t->logits + (size_t)r * t->V, t->V, t->temps[r], t->top_k[r],
                           t->top_p[r], t->min_p[r], t->u[r]);
}

/* out[r]: row r's token, or -1 where the whole vocabulary must decide (see above), -2 when
 * out of memory. Rows are spread over nthreads (the kernels' pool). */
void sample_rows(const float *logits, int rows, int V, const float *temps, const int32_t *top_k,
                 const float *top_p, const float *min_p, const float *u, int64_t *out,
                 int nthreads) {
    SampleTask t = {logits, V, temps, top_p, min_p, u, top_k, out};
    pool_run(sample_chunk, &t, rows, nthreads);
}
