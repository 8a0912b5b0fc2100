/* One draw per row of logits, with temperature, top-k, top-p and min-p: the distribution
 * sampler.filter_logits + softmax gives, without a sort of the vocabulary (torch's ops cost
 * ~0.5-1 ms a row over 49k tokens, and their sort ~5 ms on a nearly flat row).
 *
 * Per row: e_i = exp(l_i / T - max / T), the best token's weight 1; NaN and -inf logits
 * weigh 0. Each filter keeps a prefix of the tokens ordered by (e desc, index asc), so what
 * is kept is a cut: the tokens with e > w, and those with e == w at an index below `end`.
 *   top-k: its k-th weight, every token tied with it kept (filter_logits keeps the ties of
 *     its k-th logit);
 *   top-p: over what top-k kept, the first token whose mass before it reaches top_p of
 *     theirs is dropped, and all after it; tied tokens go by index (filter_logits' sort is
 *     stable);
 *   min-p: min_p of the best weight.
 * The cuts are found by selection over the weights (quickselect, by count for top-k and by
 * mass for top-p: expected O(V)): first among the candidates within CAND_MIN of the best,
 * which decide a peaked row; over every weight where those cannot (a nearly flat row).
 * The draw is by inverse CDF over the kept tokens in token order, with the caller's uniform
 * (torch's generator), so the draws consume random numbers as before. Sums are in double;
 * a boundary can differ from filter_logits' float32 cumsum only within its rounding.
 */
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "simd.h"

#define CAND_MIN 1e-5f
#define MAX_CAND 4096
#define BLOCK 256 /* tokens a partial sum of the draw covers */

typedef struct {
    float w;
    int end; /* the tokens with e == w kept are those at indices below end */
} Cut;

static inline int is_kept(float e, int i, Cut c) { return e > c.w || (e == c.w && i < c.end); }

/* A thread's scratch, grown to the largest vocabulary it has seen. */
typedef struct {
    float *e;    /* the row's weights [V + 8] */
    float *a[3]; /* weights being selected among, and the two sides of a split [V + 8] */
    int *idx;    /* the candidates' tokens, in token order [MAX_CAND] */
    double *bs;  /* the kept mass of each BLOCK of tokens */
    int cap;
} Scratch;

static __thread Scratch tls;

/* compress(x, m): x's lanes set in the 8-bit mask m moved to the front, in order (AVX2 has
 * no vcompressps); lane_orders[m]: their permutation, a byte a lane. */
static uint64_t lane_orders[256];
static pthread_once_t lane_orders_once = PTHREAD_ONCE_INIT;

static void fill_lane_orders(void) {
    for (int m = 0; m < 256; m++) {
        uint64_t v = 0;
        for (int j = 0, k = 0; j < 8; j++)
            if (m >> j & 1) v |= (uint64_t)j << (8 * k++);
        lane_orders[m] = v;
    }
}

static inline __m256 compress(__m256 x, int m) {
    const __m256i order = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)lane_orders[m]));
    return _mm256_permutevar8x32_ps(x, order);
}

static void release(void) {
    free(tls.e), free(tls.a[0]), free(tls.a[1]), free(tls.a[2]), free(tls.idx), free(tls.bs);
    memset(&tls, 0, sizeof tls);
}

static int reserve(int V) {
    pthread_once(&lane_orders_once, fill_lane_orders);
    if (V <= tls.cap) return 0;
    release();
    tls.e = malloc(sizeof(float) * ((size_t)V + 8));
    for (int j = 0; j < 3; j++) tls.a[j] = malloc(sizeof(float) * ((size_t)V + 8));
    tls.idx = malloc(sizeof(int) * MAX_CAND);
    tls.bs = malloc(sizeof(double) * ((size_t)V / BLOCK + 1));
    if (!tls.e || !tls.a[0] || !tls.a[1] || !tls.a[2] || !tls.idx || !tls.bs) {
        release();
        return -2;
    }
    tls.cap = V;
    return 0;
}

/* The largest of l[0 .. V), NaNs passed over; where find_nan (a constant at each call, so
 * the other callers' loop carries no check), *nan says whether l holds a NaN. In four
 * vectors: the scalar loop is a chain of dependent maxss. vmaxps(a, b) gives b where a is
 * NaN or the two are equal, as the scalar `a > b ? a : b` does, so the maximum is the same
 * value. */
static inline __attribute__((always_inline)) float max_scan(const float *l, int V,
                                                           const int find_nan, int *nan) {
    __m256 a[4], unordered = _mm256_setzero_ps();
    for (int j = 0; j < 4; j++) a[j] = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 32 <= V; i += 32)
        for (int j = 0; j < 4; j++) {
            const __m256 x = _mm256_loadu_ps(l + i + 8 * j);
            a[j] = _mm256_max_ps(x, a[j]);
            if (find_nan) unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        }
    for (; i + 8 <= V; i += 8) {
        const __m256 x = _mm256_loadu_ps(l + i);
        a[0] = _mm256_max_ps(x, a[0]);
        if (find_nan) unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    }
    float mx = hmax256(_mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3])));
    int seen = find_nan && _mm256_movemask_ps(unordered) != 0;
    for (; i < V; i++) {
        if (find_nan) seen |= isnan(l[i]);
        mx = l[i] > mx ? l[i] : mx;
    }
    if (find_nan) *nan = seen;
    return mx;
}

static float max_of(const float *l, int V) { return max_scan(l, V, 0, NULL); }

/* A row nothing weighs (every logit -inf or NaN, or +inf ones): its first largest logit. */
static int64_t first_max(const float *l, int V) {
    const float mx = max_of(l, V);
    for (int i = 0; i < V; i++)
        if (l[i] == mx) return i;
    return 0;
}

/* torch.argmax's pick in a row: its first largest logit, or its first NaN where it has one
 * (torch orders NaN above every number). One pass for the largest value and whether a NaN
 * is there, a second to the first index holding it: ~20x faster than torch's single-
 * threaded argmax over 49k logits. */
static int64_t argmax_row(const float *l, int V) {
    int nan;
    const float mx = max_scan(l, V, 1, &nan);
    for (int i = 0; i < V; i++)
        if (nan ? isnan(l[i]) : l[i] == mx) return i;
    return 0;
}

static inline __m256 weight8(__m256 x, __m256 vt, __m256 vm) {
    const __m256 d = _mm256_sub_ps(_mm256_div_ps(x, vt), vm);
    /* exp256 takes NaN for its floor: a NaN logit (or inf - inf) must weigh 0 instead */
    return _mm256_and_ps(exp256(d), _mm256_cmp_ps(d, d, _CMP_ORD_Q));
}

/* The row's weights into tls.e; their sum. */
static double weigh(const float *l, int V, float T) {
    float *e = tls.e;
    const __m256 vt = _mm256_set1_ps(T), vm = _mm256_set1_ps(max_of(l, V) / T);
    __m256 vz = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= V; i += 8) {
        __m256 v = weight8(_mm256_loadu_ps(l + i), vt, vm);
        _mm256_storeu_ps(e + i, v);
        vz = _mm256_add_ps(vz, v);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, vz);
    double sum = 0;
    for (int j = 0; j < 8; j++) sum += lanes[j];
    for (; i < V; i++) {
        e[i] = _mm256_cvtss_f32(weight8(_mm256_set1_ps(l[i]), vt, vm));
        sum += e[i];
    }
    return sum;
}

static double sum_of(const float *a, int n) {
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(a + i);
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(x)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)));
    }
    double d[4];
    _mm256_storeu_pd(d, _mm256_add_pd(s0, s1));
    double s = (d[0] + d[1]) + (d[2] + d[3]);
    for (; i < n; i++) s += a[i];
    return s;
}

/* The candidates of a peaked row: the weights >= CAND_MIN into tls.a[0], their tokens into
 * tls.idx; how many, or -1 past MAX_CAND. */
static int collect_candidates(int V) {
    const float *e = tls.e;
    int n = 0, i = 0;
    const __m256 vmin = _mm256_set1_ps(CAND_MIN);
    for (; i + 8 <= V; i += 8) {
        int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(e + i), vmin, _CMP_GE_OQ));
        while (mask) {
            int j = i + __builtin_ctz(mask);
            mask &= mask - 1;
            if (n == MAX_CAND) return -1;
            tls.a[0][n] = e[j];
            tls.idx[n++] = j;
        }
    }
    for (; i < V; i++)
        if (e[i] >= CAND_MIN) {
            if (n == MAX_CAND) return -1;
            tls.a[0][n] = e[i];
            tls.idx[n++] = i;
        }
    return n;
}

/* The weights >= w (w > 0) into tls.a[0], from the listed tokens (idx, n) or, with idx
 * NULL, the whole row (n = V); how many. */
static int collect_at_least(const int *idx, int n, float w) {
    const float *e = tls.e;
    float *a = tls.a[0];
    int m = 0, i = 0;
    if (idx) {
        for (int j = 0; j < n; j++) {
            a[m] = e[idx[j]];
            m += a[m] >= w;
        }
        return m;
    }
    const __m256 vw = _mm256_set1_ps(w);
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(e + i);
        const int up = _mm256_movemask_ps(_mm256_cmp_ps(x, vw, _CMP_GE_OQ));
        _mm256_storeu_ps(a + m, compress(x, up));
        m += __builtin_popcount(up);
    }
    for (; i < n; i++) {
        a[m] = e[i];
        m += e[i] >= w;
    }
    return m;
}

/* src[0 .. n) split three ways: the values above p into gt, those below into lt (each with
 * 8 floats of room past n); returns how many are above, *eq how many equal p. */
static int split(const float *src, int n, float p, float *gt, float *lt, int *eq) {
    int s = 0, t = 0, ne = 0, i = 0;
    const __m256 vp = _mm256_set1_ps(p);
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(src + i);
        const int up = _mm256_movemask_ps(_mm256_cmp_ps(x, vp, _CMP_GT_OQ));
        const int down = _mm256_movemask_ps(_mm256_cmp_ps(x, vp, _CMP_LT_OQ));
        _mm256_storeu_ps(gt + s, compress(x, up));
        _mm256_storeu_ps(lt + t, compress(x, down));
        s += __builtin_popcount(up);
        t += __builtin_popcount(down);
        ne += 8 - __builtin_popcount(up | down);
    }
    for (; i < n; i++) {
        const float x = src[i];
        gt[s] = x;
        lt[t] = x;
        s += x > p;
        t += x < p;
        ne += x == p;
    }
    *eq = ne;
    return s;
}

static inline uint32_t next_rand(uint32_t *r) {
    *r ^= *r << 13, *r ^= *r >> 17, *r ^= *r << 5;
    return *r;
}

/* The median of three values at pseudo-random places (seeded per row, so a row's sums do
 * not depend on which thread drew it). */
static float pivot(const float *a, int n, uint32_t *rng) {
    if (n < 3) return a[0];
    const float x = a[next_rand(rng) % n], y = a[next_rand(rng) % n], z = a[next_rand(rng) % n];
    return fmaxf(fminf(x, y), fminf(fmaxf(x, y), z));
}

/* The k-th largest of tls.a[0][0 .. n) (1 <= k <= n); the three buffers' contents are lost.
 * Each round splits the values around a pivot into the other two buffers and goes on in
 * the side that holds the k-th. */
static float kth_largest(int n, int k) {
    int cur = 0, ne;
    uint32_t rng = 0x9e3779b9u ^ (uint32_t)n;
    for (;;) {
        const int up = (cur + 1) % 3, down = (cur + 2) % 3;
        const float p = pivot(tls.a[cur], n, &rng);
        const int s = split(tls.a[cur], n, p, tls.a[up], tls.a[down], &ne);
        if (s >= k) {
            cur = up, n = s;
        } else if (s + ne >= k) {
            return p;
        } else {
            cur = down, n -= s + ne, k -= s + ne;
        }
    }
}

/* Top-p's cut among tls.a[0][0 .. n) (positive weights; the buffers' contents are lost):
 * the smallest value w whose larger values hold less than bound (> 0), so that the first
 * token of weight w stays; *above: their mass, *ties: the count of values == w. */
static float mass_cut(int n, double bound, double *above, int *ties) {
    int cur = 0, ne;
    double acc = 0; /* the mass above the values left, under bound */
    uint32_t rng = 0x85ebca6bu ^ (uint32_t)n;
    for (;;) {
        const int up = (cur + 1) % 3, down = (cur + 2) % 3;
        const float p = pivot(tls.a[cur], n, &rng);
        const int s = split(tls.a[cur], n, p, tls.a[up], tls.a[down], &ne);
        const double gt = sum_of(tls.a[up], s), ge = gt + (double)ne * p;
        if (acc + gt >= bound) { /* p's tokens are dropped: w is above p (so s > 0) */
            cur = up, n = s;
        } else if (acc + ge < bound && n > s + ne) { /* the next smaller value stays too */
            acc += ge;
            cur = down, n -= s + ne;
        } else {
            *above = acc + gt;
            *ties = ne;
            return p;
        }
    }
}

/* One past the index of the t-th token (in token order) of weight w, among the listed
 * tokens (idx, n) or, with idx NULL, the whole row (n = V). */
static int tie_end(const int *idx, int n, float w, int t) {
    for (int j = 0; j < n; j++) {
        const int i = idx ? idx[j] : j;
        if (tls.e[i] == w && --t == 0) return i + 1;
    }
    return idx ? idx[n - 1] + 1 : n;
}

/* The cut of a row whose top-k or top-p is on, from the candidates in tls.a[0][0 .. n):
 * the listed tokens' weights (idx: every weight >= c), or, with idx NULL, every positive
 * weight (c the smallest positive float). 0, or -1 where weights below c decide it. */
static int find_cut(int V, double z, const int *idx, int n, float c, int top_k, float top_p,
                    float min_p, Cut *cut) {
    const int n_listed = idx ? n : V;
    double kept_mass = z;
    int whole = !idx; /* the candidates hold every token top-k keeps */
    *cut = (Cut){0.0f, V};
    if (0 < top_k && top_k < V) {
        if (top_k <= n) {
            cut->w = kth_largest(n, top_k);
            n = collect_at_least(idx, n_listed, cut->w);
            kept_mass = sum_of(tls.a[0], n);
            whole = 1;
        } else if (idx && (top_p < 1.0f || min_p < c)) {
            return -1; /* the k-th weight is below the candidates, and it matters */
        }
    }
    if (top_p < 1.0f) {
        const double bound = fmax((double)top_p * kept_mass, DBL_MIN);
        if (!whole && sum_of(tls.a[0], n) < bound) {
            if (min_p < c) return -1; /* top-p's cut is below the candidates */
            /* else min-p's cut, above the candidates' floor, is the row's */
        } else {
            double above;
            int ties, t = 1;
            const float w = mass_cut(n, bound, &above, &ties);
            for (double before = above + w; t < ties && before < bound; before += w) t++;
            *cut = (Cut){w, t < ties ? tie_end(idx, n_listed, w, t) : V};
        }
    }
    if (min_p > cut->w) *cut = (Cut){min_p, V}; /* min_p times the best weight, 1 */
    return 0;
}

/* The row's weights (tls.e) and cut; *listed: how many of tls.idx hold every kept token, or
 * -1 for the whole row. 0, 1 where nothing weighs, -2 when out of memory. */
static int row_cut(const float *l, int V, float T, int top_k, float top_p, float min_p,
                   Cut *cut, int *listed) {
    if (reserve(V)) return -2;
    const double z = weigh(l, V, T);
    if (!(z > 0)) return 1;
    *listed = -1;
    *cut = (Cut){min_p > 0.0f ? min_p : 0.0f, V};
    if (!((0 < top_k && top_k < V) || top_p < 1.0f)) return 0; /* min-p alone, or nothing */
    const int n = collect_candidates(V);
    if (n > 0 && !find_cut(V, z, tls.idx, n, CAND_MIN, top_k, top_p, min_p, cut)) {
        if (cut->w >= CAND_MIN) *listed = n;
        return 0;
    }
    find_cut(V, z, NULL, collect_at_least(NULL, V, FLT_TRUE_MIN), FLT_TRUE_MIN, top_k, top_p,
             min_p, cut);
    return 0;
}

/* The kept mass. Over the whole row it is summed per BLOCK into tls.bs, which draw_at
 * walks. */
static double kept_total(int V, Cut cut, int listed) {
    const float *e = tls.e;
    if (listed >= 0) {
        double s = 0;
        for (int j = 0; j < listed; j++) {
            const int i = tls.idx[j];
            if (is_kept(e[i], i, cut)) s += e[i];
        }
        return s;
    }
    const __m256 w = _mm256_set1_ps(cut.w);
    const __m256i end = _mm256_set1_epi32(cut.end);
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    double total = 0;
    for (int b = 0; b * BLOCK < V; b++) {
        const int i1 = (b + 1) * BLOCK < V ? (b + 1) * BLOCK : V;
        __m256 acc = _mm256_setzero_ps();
        int i = b * BLOCK;
        for (; i + 8 <= i1; i += 8) {
            const __m256 x = _mm256_loadu_ps(e + i);
            const __m256i at = _mm256_add_epi32(_mm256_set1_epi32(i), iota);
            const __m256 early = _mm256_castsi256_ps(_mm256_cmpgt_epi32(end, at));
            const __m256 tied = _mm256_and_ps(_mm256_cmp_ps(x, w, _CMP_EQ_OQ), early);
            const __m256 keep = _mm256_or_ps(_mm256_cmp_ps(x, w, _CMP_GT_OQ), tied);
            acc = _mm256_add_ps(acc, _mm256_and_ps(keep, x));
        }
        double s = hsum256(acc);
        for (; i < i1; i++)
            if (is_kept(e[i], i, cut)) s += e[i];
        tls.bs[b] = s;
        total += s;
    }
    return total;
}

/* kept_total's mass without token i (kept): its block's sum for draw_at too. */
static double leave_out(int listed, int64_t i, double total) {
    if (listed < 0) tls.bs[i / BLOCK] -= tls.e[i];
    return total - tls.e[i];
}

/* The first kept token (token order, `skip` left out) whose kept mass up to and with it
 * exceeds target (0 <= target < kept_total's, which must have run for this cut, with
 * skip's weight taken out of its block's sum: leave_out). */
static int64_t draw_at(int V, Cut cut, int listed, int64_t skip, double target) {
    const float *e = tls.e;
    double acc = 0;
    int64_t last = -1;
    if (listed >= 0) {
        for (int j = 0; j < listed; j++) {
            const int i = tls.idx[j];
            if (i == skip || !is_kept(e[i], i, cut) || !(e[i] > 0)) continue;
            acc += e[i];
            last = i;
            if (acc > target) return i;
        }
        return last;
    }
    for (int b = 0; b * BLOCK < V; b++) {
        if (!(acc + tls.bs[b] > target)) {
            acc += tls.bs[b];
            continue;
        }
        const int i1 = (b + 1) * BLOCK < V ? (b + 1) * BLOCK : V;
        for (int i = b * BLOCK; i < i1; i++) {
            if (i == skip || !is_kept(e[i], i, cut) || !(e[i] > 0)) continue;
            acc += e[i];
            last = i;
            if (acc > target) return i;
        }
        if (last >= 0) return last; /* the block's sum and this one differ by rounding */
    }
    for (int i = V - 1; i >= 0; i--) /* target rounded up to the total */
        if (i != skip && e[i] > 0 && is_kept(e[i], i, cut)) return i;
    return 0;
}

static int64_t sample_row(const float *l, int V, float T, int top_k, float top_p, float min_p,
                          float u) {
    Cut cut;
    int listed;
    const int rc = row_cut(l, V, T, top_k, top_p, min_p, &cut, &listed);
    if (rc) return rc == 1 ? first_max(l, V) : -2;
    return draw_at(V, cut, listed, -1, (double)u * kept_total(V, cut, listed));
}

/* How many tokens the row keeps (of positive weight), each marked 1 in kept[V], else 0; -2
 * when out of memory. For tests: what sample_rows draws among. */
int sample_kept(const float *l, int V, float T, int top_k, float top_p, float min_p,
                uint8_t *kept) {
    Cut cut;
    int listed;
    const int rc = row_cut(l, V, T, top_k, top_p, min_p, &cut, &listed);
    if (rc == -2) return -2;
    if (rc == 1) {
        memset(kept, 0, (size_t)V);
        kept[first_max(l, V)] = 1;
        return 1;
    }
    int n = 0;
    for (int i = 0; i < V; i++) {
        kept[i] = tls.e[i] > 0 && is_kept(tls.e[i], i, cut);
        n += kept[i];
    }
    return n;
}

/* One step of rejection sampling for a deterministic guess (prompt lookup): the guess stands
 * with probability p(guess) under the filtered distribution (u_accept < p); else the token
 * is drawn from p without the guess, renormalized (u_draw). Returns the guess when it
 * stands, the drawn token otherwise, -2 when out of memory. */
int64_t spec_sample(const float *l, int V, float T, int top_k, float top_p, float min_p,
                    int64_t guess, float u_accept, float u_draw) {
    Cut cut;
    int listed;
    const int rc = row_cut(l, V, T, top_k, top_p, min_p, &cut, &listed);
    if (rc) return rc == 1 ? first_max(l, V) : -2;
    const double total = kept_total(V, cut, listed);
    const int in = guess >= 0 && guess < V && is_kept(tls.e[guess], (int)guess, cut);
    const double p_guess = in ? tls.e[guess] / total : 0;
    if ((double)u_accept < p_guess) return guess;
    const double rest = in ? leave_out(listed, guess, total) : total;
    if (!(rest > 0)) return guess; /* p is all on the guess: any draw from p is the guess */
    return draw_at(V, cut, listed, in ? guess : -1, (double)u_draw * rest);
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

/* out[r]: row r's token, or -2 when out of memory. Rows are spread over nthreads (the
 * kernels' pool). */
void sample_rows(const float *logits, int rows, int V, const float *temps, const int32_t *top_k,
                 const float *top_p, const float *min_p, const float *u, int64_t *out,
                 int nthreads) {
    SampleTask t = {logits, V, temps, top_p, min_p, u, top_k, out};
    pool_run(sample_chunk, &t, rows, nthreads);
}

typedef struct {
    const float *logits;
    int V;
    int64_t *out;
} ArgmaxTask;

static void argmax_chunk(void *arg, int r) {
    const ArgmaxTask *t = (const ArgmaxTask *)arg;
    t->out[r] = argmax_row(t->logits + (size_t)r * t->V, t->V);
}

/* out[r]: torch.argmax of row r (greedy rows' tokens), rows spread over nthreads. */
void argmax_rows(const float *logits, int rows, int V, int64_t *out, int nthreads) {
    ArgmaxTask t = {logits, V, out};
    pool_run(argmax_chunk, &t, rows, nthreads);
}
