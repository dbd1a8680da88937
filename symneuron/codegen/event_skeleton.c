/* The EventProp kernels' skeleton: the same for every neuron and for both languages.
   Everything that depends on the model is one of the sn_<name> functions printed before
   it from SymPy's derivation (symneuron/codegen/event_functions.py); NS, NP, NK, NSTORE,
   PARTS, SN_REPLAY, SN_INTEGRALS, SN_RK4, real, the store's indices and the language's
   words (SN_CUDA, SN_FN, SN_INLINE, SN_CONST, SN_INF, SN_ADD, SN_LOAD) are defined above
   it (symneuron/codegen/events.py). Only the two entry points at the end differ between
   C (an OpenMP loop over rows, scratch from malloc) and CUDA (one thread per row, scratch
   from the launch's buffer, gradient rows added to atomically).

   Two ways to move a neuron between events, chosen when the source is generated: a
   linear neuron's closed-form flow (sn_flow, SN_RK4 0), or, for a spec without one
   (QIF, EIF, AdEx: SN_RK4 1), RK4 steps with crossings on each step's cubic Hermite
   interpolant and the adjoint integrated back by RK4 (sn_rhs, sn_adjoint_rhs), step for
   step as the float64 reference does (symneuron/reference/event_rk4.py). Everything
   else (arrivals, the step loop, spikes, the arrival and jump terms) is shared. */

/* What sn_eval evaluates along the flow: g, its rate, the rate's rate, g(h(x)); V, its
   rate and the rate's rate (a readout's maximum). A rate follows its function. */
#define SN_G 0
#define SN_G_DOT 1
#define SN_G_DDOT 2
#define SN_MARGIN 3
#define SN_V 4
#define SN_V_DOT 5
#define SN_V_DDOT 6

SN_INLINE real sn_eval(int which, const real* x, const real* p) {
    real out;
    if (which == SN_G) sn_g(x, x, 0, 0, 0, p, &out);
    else if (which == SN_G_DOT) sn_g_dot(x, x, 0, 0, 0, p, &out);
    else if (which == SN_G_DDOT) sn_g_ddot(x, x, 0, 0, 0, p, &out);
    else if (which == SN_MARGIN) sn_margin(x, x, 0, 0, 0, p, &out);
    else if (which == SN_V) sn_v(x, x, 0, 0, 0, p, &out);
    else if (which == SN_V_DOT) sn_v_dot(x, x, 0, 0, 0, p, &out);
    else sn_v_ddot(x, x, 0, 0, 0, p, &out);
    return out;
}

#if !SN_RK4
SN_INLINE void sn_move(const real* x, real s, const real* p, real* out) {
    sn_flow(x, x, 0, 0, s, p, out);
}
#endif

SN_INLINE void sn_copy(real* to, const real* from) {
    for (int q = 0; q < NS; ++q) to[q] = from[q];
}

/* One arrival at a neuron: its time, weight, and its source as i * K_in + slot. */
typedef struct {
    real t;
    real w;
    long long src;
} sn_arrival;

/* A neuron's arrivals before t_end in time order: its own sorted `list`, or, where the
   runtime found every delay of the neuron's row equal (`lag`), read through its sample's
   presynaptic spikes in time order (`order`, a stable sort: no list, no sorting; their
   times in that order `ordered`, so an arrival's time is one read, not two in a row).
   Input i's weight and delay are w_row[i * stride], d_row[i * stride] (stride 1:
   [N, n_in] rows; N: the [n_in, N] copy CUDA reads, where a warp's neurons read one
   line). A recurrent layer's backward (SN_DIRECT) also reads its recurrent arrivals
   from their own sorted list `loop` (n_loop of them; null elsewhere). */
typedef struct {
    const sn_arrival* list;
    const long long* order;
    const real* ordered;
    real lag;
    const real* w_row;
    long long stride;
    long long k_in;
    long long n;
    const sn_arrival* loop;
    long long n_loop;
} sn_arrivals;

/* The input of source slot `src` (i * k_in + slot; the runtime keeps n_in * k_in below
   2^31, so a 32-bit division: a 64-bit one is a long software routine on a GPU). */
SN_INLINE long long sn_input(long long src, long long k_in) {
    return k_in == 1 ? src : (long long)((unsigned)src / (unsigned)k_in);
}

/* Arrival e's time alone. */
SN_INLINE real sn_arrival_time(const sn_arrivals* a, long long e) {
    return a->list ? a->list[e].t : SN_LOAD(a->ordered + e) + a->lag;
}

/* How many of the first n arrivals come at or before t (a binary search: their times
   rise). */
SN_INLINE long long sn_arrivals_upto(const sn_arrivals* a, real t, long long n) {
    long long lo = 0;
    while (lo < n) {
        long long mid = lo + (n - lo) / 2;
        if (sn_arrival_time(a, mid) <= t) lo = mid + 1;
        else n = mid;
    }
    return lo;
}

SN_INLINE sn_arrival sn_arrival_at(const sn_arrivals* a, long long e) {
    if (a->list) return a->list[e];
    sn_arrival out;
    long long src = SN_LOAD(a->order + e);
    out.t = SN_LOAD(a->ordered + e) + a->lag;
    out.w = SN_LOAD(a->w_row + sn_input(src, a->k_in) * a->stride);
    out.src = src;
    return out;
}

/* Arrival e, or none (+inf) past either end. The loops over a neuron's arrivals read the
   one after the next ahead of its use, so that a global read's latency overlaps the work
   on the next (on a GPU the reads, not the arithmetic, were a thread's critical path). */
SN_INLINE sn_arrival sn_arrival_or_none(const sn_arrivals* a, long long e) {
    sn_arrival none = {SN_INF, 0, 0};
    return (e >= 0 && e < a->n) ? sn_arrival_at(a, e) : none;
}

/* Stable bottom-up merge sort by time (ties keep the source, then slot, order). */
SN_FN void sn_sort(sn_arrival* a, sn_arrival* tmp, long long n) {
    for (long long width = 1; width < n; width *= 2) {
        for (long long lo = 0; lo < n; lo += 2 * width) {
            long long mid = lo + width < n ? lo + width : n;
            long long hi = lo + 2 * width < n ? lo + 2 * width : n;
            long long i = lo, j = mid, k = lo;
            while (i < mid && j < hi) tmp[k++] = (a[j].t < a[i].t) ? a[j++] : a[i++];
            while (i < mid) tmp[k++] = a[i++];
            while (j < hi) tmp[k++] = a[j++];
        }
        for (long long k = 0; k < n; ++k) a[k] = tmp[k];
    }
}

/* The arrivals before t_end of spikes `pre` ([n_in, k_in]) through one neuron's weights
   and delays (input i's at i * stride), unsorted, into `list` (source i * k_in + slot);
   how many. */
SN_FN long long sn_listed(sn_arrival* list, const real* pre, const real* w_row,
                          const real* d_row, long long stride, long long n_in, long long k_in,
                          real t_end) {
    long long n = 0;
    for (long long i = 0; i < n_in; ++i) {
        for (long long k = 0; k < k_in; ++k) {
            real t = pre[i * k_in + k] + d_row[i * stride];
            if (t < t_end) {
                list[n].t = t;
                list[n].w = w_row[i * stride];
                list[n].src = i * k_in + k;
                ++n;
            }
        }
    }
    return n;
}

/* The arrivals of one neuron before t_end (source times + its delays), in time order:
   through `order` where it is given (their times then rise along it: a binary search
   finds how many come before t_end), else sorted into `list` (2 (n_in k_in + 1) slots). */
SN_FN sn_arrivals sn_arrivals_of(const real* pre, const long long* order, const real* ordered,
                                 const real* w_row, const real* d_row, long long stride,
                                 long long n_in, long long k_in, real t_end,
                                 sn_arrival* list) {
    sn_arrivals a = {order ? (const sn_arrival*)0 : list, order, ordered, 0, w_row, stride,
                     k_in, 0};
    if (order) {
        long long hi = n_in * k_in;
        a.lag = hi ? d_row[0] : 0;
        while (a.n < hi) {
            long long mid = a.n + (hi - a.n) / 2;
            if (SN_LOAD(ordered + mid) + a.lag < t_end) a.n = mid + 1;
            else hi = mid;
        }
        return a;
    }
    a.n = sn_listed(list, pre, w_row, d_row, stride, n_in, k_in, t_end);
    sn_sort(list, list + n_in * k_in + 1, a.n);
    return a;
}

#if !SN_RK4
/* The zero of sn_eval's `fn` (its slope the next one) along the flow from x within
   [lo, hi], where it changes sign once (from negative if `rising`): Newton's method kept
   in the bracket, bisection where it leaves it, to rounding. */
SN_FN real sn_root(int fn, const real* x, real lo, real hi, int rising, const real* p) {
    real s = (real)0.5 * (lo + hi), at[NS];
    for (int it = 0; it < SN_ITERATIONS; ++it) {
        sn_move(x, s, p, at);
        real v = sn_eval(fn, at, p);
        if ((v < 0) == rising) lo = s;
        else hi = s;
        real newton = s - v / sn_eval(fn + 1, at, p);
        real next = (newton > lo && newton < hi) ? newton : (real)0.5 * (lo + hi);
        if (v == 0) next = s;
        int done = fabs(next - s) <= 2 * SN_EPS * fmax(fabs(s), SN_TINY);
        s = next;
        if (done) break;
    }
    return s;
}

/* Whether g, rising at x and falling at `end` (`length` later), stays below 0 between
   them, told without searching its peak: where g's second rate is <= 0 at both ends it is
   so between them (with SN_WHOLE it is a sum of two real modes, which changes sign at
   most once), so g is concave there and lies below both end tangents, whose meeting
   point bounds its peak. 0 where that bound is not below 0 (by a margin over rounding)
   or g is not concave: the caller then searches the peak. */
SN_INLINE int sn_stays_below(const real* x, const real* end, real length, real g_end,
                             real rate_0, real rate_end, const real* p) {
    if (!SN_WHOLE) return 0;
    if (sn_eval(SN_G_DDOT, x, p) > 0 || sn_eval(SN_G_DDOT, end, p) > 0) return 0;
    real g_0 = sn_eval(SN_G, x, p);
    real meet = (g_end - g_0 - rate_end * length) / (rate_0 - rate_end);
    real bound = g_0 + rate_0 * meet;
    return bound < -4 * SN_EPS * (fabs(g_0) + fabs(rate_0 * meet));
}

/* Whether g reaches 0 within (0, length] of the flow from x (g(x) < 0), and where, given
   at most one zero of its rate there: the piece is split at that zero, which is searched
   only where g might reach 0 (falling then rising: where g_end >= 0; rising then
   falling: where sn_stays_below cannot rule it out). `end`: the state flowed by
   `length` (the caller's next state when there is no crossing). */
SN_FN int sn_crossing_in(const real* x, real length, const real* p, real* where, real* end) {
    real at[NS];
    sn_move(x, length, p, end);
    real g_end = sn_eval(SN_G, end, p);
    real rate_0 = sn_eval(SN_G_DOT, x, p), rate_end = sn_eval(SN_G_DOT, end, p);
    int turns = (rate_0 * rate_end < 0) && (length > 0);
    if (turns && (rate_0 < 0 ? g_end < 0
                             : sn_stays_below(x, end, length, g_end, rate_0, rate_end, p)))
        return 0;
    real peak = length, g_peak = g_end;
    if (turns) {
        peak = sn_root(SN_G_DOT, x, 0, length, rate_0 < 0, p);
        sn_move(x, peak, p, at);
        g_peak = sn_eval(SN_G, at, p);
    }
    int first = (g_peak >= 0) && (length > 0);
    int second = !first && turns && (g_end >= 0);
    if (!first && !second) return 0;
    *where = sn_root(SN_G, x, first ? 0 : peak, first ? peak : length, 1, p);
    return 1;
}

/* The first crossing within (0, length]: PARTS equal parts each searched in turn (more
   than two states: each part is taken to hold at most one zero of g's rate). With one
   part, `end` is the state flowed by `length` (else the caller flows it). */
SN_FN int sn_first_crossing(const real* x, real length, const real* p, real* where,
                            real* end) {
    if (PARTS == 1) return sn_crossing_in(x, length, p, where, end);
    real piece = length / PARTS, y[NS], s;
    sn_copy(y, x);
    for (int k = 0; k < PARTS; ++k) {
        if (sn_crossing_in(y, piece, p, &s, end)) {
            *where = k * piece + s;
            return 1;
        }
        sn_copy(y, end);
    }
    return 0;
}
#endif

/* Where one neuron's spikes go: times, stored states and g's rate, up to `capacity`;
   `count` goes on counting past it (the runtime then runs again with more slots). */
typedef struct {
    real* times;
    real* store;
    real* rate;
    long long capacity;
    long long count;
} sn_spikes;

SN_FN void sn_record(sn_spikes* out, real time, const real* before, const real* p) {
    if (out->count < out->capacity) {
        long long k = out->count;
        out->times[k] = time;
        out->rate[k] = sn_eval(SN_G_DOT, before, p);
        for (int q = 0; q < NSTORE; ++q) out->store[k * NSTORE + q] = before[sn_store[q]];
    }
    ++out->count;
}

/* What the RK4 path's backward replays of a neuron's forward: entries of SN_ENTRY values
   in forward order: its kind, length (a sub-step's; 0 for an event) and time (where it
   starts: a recurrent layer's backward sweeps back to a time), then each a sub-step's
   states at its start, middle and end (SN_SEGMENT) or the state just before a spike or
   an arrival (SN_SPIKE, SN_ARRIVAL), up to `capacity` (`count` goes on counting past
   it). */
#define SN_SEGMENT 0
#define SN_SPIKE 1
#define SN_ARRIVAL 2
#define SN_ENTRY (3 + 3 * NS)
typedef struct {
    real* at;
    long long capacity;
    long long count;
} sn_trace;

#if SN_RK4
/* The next entry of `trace` (null past its capacity), its kind, length and time set and
   its first state `x` copied. */
SN_FN real* sn_traced(sn_trace* trace, int kind, real length, real time, const real* x) {
    real* entry = trace->count < trace->capacity ? trace->at + trace->count * SN_ENTRY : 0;
    ++trace->count;
    if (entry) {
        entry[0] = (real)kind;
        entry[1] = length;
        entry[2] = time;
        sn_copy(entry + 3, x);
    }
    return entry;
}

SN_INLINE void sn_f(const real* x, const real* p, real* out) {
    sn_rhs(x, x, 0, 0, 0, p, out);
}

/* One classical Runge-Kutta step of dx/dt = f(x) from x over h, into `out`. */
SN_FN void sn_rk4(const real* x, real h, const real* p, real* out) {
    real k1[NS], k2[NS], k3[NS], k4[NS], y[NS];
    sn_f(x, p, k1);
    for (int q = 0; q < NS; ++q) y[q] = x[q] + (real)0.5 * h * k1[q];
    sn_f(y, p, k2);
    for (int q = 0; q < NS; ++q) y[q] = x[q] + (real)0.5 * h * k2[q];
    sn_f(y, p, k3);
    for (int q = 0; q < NS; ++q) y[q] = x[q] + h * k3[q];
    sn_f(y, p, k4);
    for (int q = 0; q < NS; ++q) out[q] = x[q] + h / 6 * (k1[q] + 2 * k2[q] + 2 * k3[q] + k4[q]);
}

/* The cubic Hermite interpolant at u in [0, 1] of the values xa, xb and the time
   derivatives fa, fb at the ends of a sub-step of `length`. */
SN_FN void sn_hermite(const real* xa, const real* xb, const real* fa, const real* fb,
                      real length, real u, real* out) {
    real u2 = u * u, u3 = u * u * u;
    real h00 = 2 * u3 - 3 * u2 + 1, h10 = u3 - 2 * u2 + u;
    real h01 = -2 * u3 + 3 * u2, h11 = u3 - u2;
    for (int q = 0; q < NS; ++q)
        out[q] = h00 * xa[q] + h10 * length * fa[q] + h01 * xb[q] + h11 * length * fb[q];
}

SN_INLINE real sn_cubic(const real* c, real u) {
    return c[0] + u * (c[1] + u * (c[2] + u * c[3]));
}

SN_INLINE real sn_cubic_slope(const real* c, real u) {
    return c[1] + u * (2 * c[2] + u * 3 * c[3]);
}

/* A zero of the cubic's derivative c1 + 2 c2 u + 3 c3 u^2, or 1 where it is not one in
   (0, 1) (NaN or infinite where c3 or q is 0). */
SN_INLINE real sn_inside(real r, real disc) {
    return (disc >= 0 && isfinite(r) && r > 0 && r < 1) ? r : (real)1;
}

/* The zero of the cubic `c` in [lo, hi], where it is < 0 at lo, >= 0 at hi and monotone
   between: Newton's method kept in the bracket, bisection where it leaves it. */
SN_FN real sn_cubic_root(const real* c, real lo, real hi) {
    real s = (real)0.5 * (lo + hi);
    for (int it = 0; it < SN_ITERATIONS; ++it) {
        real v = sn_cubic(c, s);
        if (v < 0) lo = s;
        else hi = s;
        real newton = s - v / sn_cubic_slope(c, s);
        real next = (newton > lo && newton < hi) ? newton : (real)0.5 * (lo + hi);
        if (v == 0) next = s;
        int done = fabs(next - s) <= 2 * SN_EPS * fmax(fabs(s), SN_TINY);
        s = next;
        if (done) break;
    }
    return s;
}

/* Whether the cubic Hermite interpolant of g (g_a < 0 at the start, g_b at the end,
   rates r_a, r_b, over `length`) reaches 0 in (0, 1], and the first u where it does (*u
   is 1 where not). The interpolant's turns (the zeros of its derivative, a quadratic)
   cut [0, 1] into monotone pieces; the first piece that ends at a value >= 0 holds the
   first crossing, even where the interpolant comes back below 0 before u = 1. */
SN_FN int sn_hermite_root(real g_a, real g_b, real r_a, real r_b, real length, real* u) {
    real c[4] = {g_a, length * r_a, -3 * g_a - 2 * length * r_a + 3 * g_b - length * r_b,
                 2 * g_a + length * r_a - 2 * g_b + length * r_b};
    /* the Hermite basis: h00 + h01 = 1, |h10|, |h11| <= 4/27 on [0, 1] */
    real bound = fmax(g_a, g_b) + (real)(4.0 / 27.0) * length * (fabs(r_a) + fabs(r_b));
    *u = 1;
    if (!(length > 0 && bound >= 0)) return 0;
    real disc = c[2] * c[2] - 3 * c[1] * c[3];
    real root = sqrt(fmax(disc, (real)0));
    real q = -(c[2] + (c[2] >= 0 ? root : -root));
    real first = sn_inside(q / (3 * c[3]), disc), second = sn_inside(c[1] / q, disc);
    real bounds[4] = {0, fmin(first, second), fmax(first, second), 1};
    for (int k = 1; k < 4; ++k) {
        if (sn_cubic(c, bounds[k]) >= 0) {
            *u = sn_cubic_root(c, bounds[k - 1], bounds[k]);
            return 1;
        }
    }
    return 0;
}

/* x and *t moved to `to` by an RK4 step, cut at each crossing on the way: the spike there
   (the state just before it the step's Hermite interpolant there), the reset, and a new
   RK4 step over the rest; 1 if a reset did not leave the threshold. With a `trace`, each
   sub-step and spike is recorded in it. */
SN_FN int sn_advance(real* x, real* t, real to, const real* p, sn_spikes* out,
                     sn_trace* trace) {
    for (;;) {
        real length = to - *t, end[NS], fa[NS], fb[NS], before[NS], u;
        sn_rk4(x, length, p, end);
        real g_a = sn_eval(SN_G, x, p), g_b = sn_eval(SN_G, end, p);
        real r_a = sn_eval(SN_G_DOT, x, p), r_b = sn_eval(SN_G_DOT, end, p);
        int crossing = sn_hermite_root(g_a, g_b, r_a, r_b, length, &u);
        if (crossing || trace) {
            sn_f(x, p, fa);
            sn_f(end, p, fb);
        }
        if (crossing) sn_hermite(x, end, fa, fb, length, u, before);
        if (trace) {
            real* entry = sn_traced(trace, SN_SEGMENT, u * length, *t, x);
            if (entry) { /* elementwise: a select between arrays would put both in local memory */
                sn_hermite(x, end, fa, fb, length, (real)0.5 * u, entry + 3 + NS);
                for (int q = 0; q < NS; ++q) entry[3 + 2 * NS + q] = crossing ? before[q] : end[q];
            }
        }
        if (!crossing) {
            sn_copy(x, end);
            *t = to;
            return 0;
        }
        sn_record(out, *t + u * length, before, p);
        if (trace) sn_traced(trace, SN_SPIKE, 0, *t + u * length, before);
        if (sn_eval(SN_MARGIN, before, p) >= 0) return 1;
        sn_reset(before, before, 0, 0, 0, p, x);
        *t = *t + u * length;
    }
}
#else
/* x and *t moved to `to`, spiking and resetting at each crossing on the way; 1 if a reset
   did not leave the threshold. */
SN_FN int sn_advance(real* x, real* t, real to, const real* p, sn_spikes* out) {
    for (;;) {
        real s = 0, moved[NS];
        int crossing = sn_first_crossing(x, to - *t, p, &s, moved);
        if (crossing || PARTS != 1) sn_move(x, crossing ? s : to - *t, p, moved);
        if (!crossing) {
            sn_copy(x, moved);
            *t = to;
            return 0;
        }
        sn_record(out, *t + s, moved, p);
        if (sn_eval(SN_MARGIN, moved, p) >= 0) return 1;
        sn_reset(moved, moved, 0, 0, 0, p, x);
        *t = *t + s;
    }
}
#endif

/* A move of the forward that records no trace, on either path. */
#if SN_RK4
#define SN_ADVANCE(x, t, to, p, out) sn_advance(x, t, to, p, out, (sn_trace*)0)
#else
#define SN_ADVANCE(x, t, to, p, out) sn_advance(x, t, to, p, out)
#endif

/* One neuron's forward: steps of dt, arrivals at their times inside a step (on the RK4
   path, recorded in `trace` where one is given: the backward's replay). With SN_WHOLE
   (g's rate vanishes at most once along any stretch of the flow) the steps bound
   nothing: one step to t_end, each piece running from arrival to arrival. */
SN_FN int sn_neuron_forward(const sn_arrivals* arr, real t_end, real dt, long long n_steps,
                            const real* p, sn_spikes* out, sn_trace* trace) {
    real x[NS], t = 0;
    long long ptr = 0; /* the next arrival's index; each is read once, one ahead */
    sn_arrival next = sn_arrival_or_none(arr, 0), ahead = sn_arrival_or_none(arr, 1);
    const long long steps = SN_WHOLE ? 1 : n_steps;
    sn_init(x, x, 0, 0, 0, p, x);
    for (long long step = 0; step < steps; ++step) {
        real end = SN_WHOLE ? t_end : fmin((real)(step + 1) * dt, t_end);
        for (;;) {
            real due = next.t;
#if SN_RK4
            if (sn_advance(x, &t, fmin(due, end), p, out, trace)) return 1;
            if (!(due < end)) break;
            if (trace) sn_traced(trace, SN_ARRIVAL, 0, t, x);
#else
            (void)trace;
            if (sn_advance(x, &t, fmin(due, end), p, out)) return 1;
            if (!(due < end)) break;
#endif
            sn_synapse(x, x, next.w, 0, 0, p, x);
            ++ptr;
            next = ahead;
            ahead = sn_arrival_or_none(arr, ptr + 1);
        }
    }
    return 0;
}

/* Neuron j's params (column j of `params`, [NP, N]) into p, then the constants of them
   that the functions read after them (p[NP + m], printed as sn_constants). */
SN_INLINE void sn_params_of(const real* params, long long N, long long j, real* p) {
    for (int q = 0; q < NP; ++q) p[q] = params[q * N + j];
    sn_constants(p, p, 0, 0, 0, p, p + NP);
}

/* Row r's params into p and its arrivals before t_end (sample r / N, neuron r % N);
   `slab`: its scratch, whose start holds the list to sort them into when no `order` is
   given. Input i's weight and delay are at (weight, delay) + at + i * stride. */
SN_FN sn_arrivals sn_row_inputs(long long r, unsigned char* slab, const real* pre,
                                const real* weight, const real* delay, const real* params,
                                real t_end, long long N, long long n_in, long long k_in,
                                const long long* order, const real* ordered,
                                long long transposed, real* p) {
    const long long m = n_in * k_in, b = r / N, j = r % N;
    const long long at = transposed ? j : j * n_in, stride = transposed ? N : 1;
    sn_params_of(params, N, j, p);
    return sn_arrivals_of(pre + b * m, order ? order + b * m : order,
                          order ? ordered + b * m : ordered, weight + at, delay + at, stride,
                          n_in, k_in, t_end, (sn_arrival*)slab);
}

#define SN_ROW_INPUTS(r, slab, t_end, p)                                                    \
    sn_row_inputs(r, slab, pre, weight, delay, params, t_end, N, n_in, k_in, order, ordered, \
                  transposed, p)

/* Row r's forward (sample r / N, neuron r % N); `slab`: its scratch (a list to sort its
   arrivals into when no `order` is given). */
SN_FN void sn_forward_row(long long r, unsigned char* slab, SN_FORWARD_PARAMS) {
    const real t_end = (real)until, dt = (real)step;
    real p[NP + NK + 1];
    sn_arrivals arr = SN_ROW_INPUTS(r, slab, t_end, p);
    sn_spikes out = {times + r * k_out, store + r * k_out * NSTORE, rate + r * k_out, k_out, 0};
    for (long long k = 0; k < k_out; ++k) out.times[k] = SN_INF;
    status[r] = sn_neuron_forward(&arr, t_end, dt, n_steps, p, &out, (sn_trace*)0);
    counts[r] = out.count;
}

/* The entry points: in CUDA one thread per row of the launch, with its slab of the
   launch's scratch; in C an OpenMP loop, each thread with its own slab, over the rows
   (SN_ROWS_ENTRY), or over groups of samples (SN_GROUPS_ENTRY), each group's rows in
   order on one thread: its gradient rows are its own, so the sums do not depend on the
   thread count. */
#if SN_CUDA
#define SN_ROWS_ENTRY(name, row, PARAMS, NAMES)                                       \
    extern "C" __global__ void name(PARAMS) {                                         \
        const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;         \
        if (t < rows) row(row0 + t, scratch + t * slab_bytes, NAMES);                 \
    }
#define SN_GROUPS_ENTRY SN_ROWS_ENTRY
#else
#define SN_ROWS_ENTRY(name, row, PARAMS, NAMES)                                       \
    void name(PARAMS) {                                                               \
        SN_OMP_PARALLEL {                                                             \
            unsigned char* own = (unsigned char*)calloc((size_t)slab_bytes + 1, 1);   \
            _Pragma("omp for schedule(dynamic, 8)")                                   \
            for (long long r = row0; r < row0 + rows; ++r) row(r, own, NAMES);        \
            free(own);                                                                \
        }                                                                             \
    }
#define SN_GROUPS_ENTRY(name, row, PARAMS, NAMES)                                     \
    void name(PARAMS) {                                                               \
        SN_OMP_PARALLEL {                                                             \
            unsigned char* own = (unsigned char*)calloc((size_t)slab_bytes + 1, 1);   \
            _Pragma("omp for schedule(static)")                                       \
            for (long long g = 0; g < groups; ++g)                                    \
                for (long long b = g; b < B; b += groups)                             \
                    for (long long r = b * N; r < (b + 1) * N; ++r)                   \
                        if (r >= row0 && r < row0 + rows) row(r, own, NAMES);        \
            free(own);                                                                \
        }                                                                             \
    }
#endif

#if !SN_RECURRENT /* (a recurrent layer's source holds its own two kernels only) */
SN_ROWS_ENTRY(sn_events_forward, sn_forward_row, SN_FORWARD_PARAMS, SN_FORWARD_NAMES)
#endif

/* What one neuron's backward reads and adds into. */
typedef struct {
    const real* p;
    const real* times;  /* its spikes' times, [count] */
    const real* store;  /* their stored states, [count, NSTORE] */
    const real* grad_t; /* their dL/dt_k (the loss's and every later layer's): B = -dL/dt_k */
    long long count;
    real t_end, dt;
    long long n_steps;
    real* grad_w;       /* this neuron's row of dL/dW (its group's), input i at i * g_stride */
    real* grad_d;       /* the same for dL/dD; null where the delays' gradient is not wanted */
    long long g_stride;
    real* grad_p;       /* dL/dθ, [NP] with stride `p_stride` */
    long long p_stride;
    real* source_b;     /* the row's ΣQ per presynaptic spike, [n_in * k_in]; or null */
    long long k_in;
    real start;         /* where the adjoint starts back from: t_end, or a readout's peak */
    real kick;          /* λ_V there (0 for a layer, dL/dy for a readout's maximum) */
    real source;        /* a continuous source source·κ(t) in dλ_V/dt (a mean readout's */
    real tau_w;         /* dL/dy / t_end; κ = 1, or e^(-t/tau_w) where tau_w > 0); 0: none */
    /* a recurrent layer's (SN_RECURRENT; null and 0 elsewhere): an arrival whose source
       is m + k * k_own + slot came from the layer's own neuron k, its terms into the
       rows of dL/dW_rec, dL/dD_rec (source k at k * r_stride) and the spike's B in
       `loop_b` (the layer's [N, k_own]); `own_b`: this neuron's row of it */
    long long m, k_own, r_stride;
    real* grad_rw;
    real* grad_rd;
    real* loop_b;
    const real* own_b;
} sn_adjoint;

/* The coupling B of spike k: -dL/dt_k, and in a recurrent layer ΣQ of its arrivals at
   the layer's own neurons (complete when the adjoint reaches the spike; read past the
   GPU's L1, which the other threads' atomic adds bypass). */
SN_INLINE real sn_coupling(const sn_adjoint* a, long long k) {
#if SN_RECURRENT
    if (a->own_b) return SN_FRESH(a->own_b + k) - a->grad_t[k];
#endif
    return -a->grad_t[k];
}

#if (SN_INTEGRALS || SN_READOUTS) && !SN_RK4
SN_CONST double sn_gauss_nodes[8] = SN_GAUSS_NODES;
SN_CONST double sn_gauss_weights[8] = SN_GAUSS_WEIGHTS;
#endif

/* λ before an arrival from λ after it: dL/dw += λ·∂m/∂w, dL/dd -= Q, the source's B += Q
   (x: the state just before it, when the arrival's terms need it). */
SN_FN void sn_arrival_back(const sn_adjoint* a, const sn_arrival* e, const real* x,
                            real* lam) {
    real partial, q;
    sn_weight_partial(x, lam, e->w, 0, 0, a->p, &partial);
    sn_target_term(x, lam, e->w, 0, 0, a->p, &q);
#if SN_RECURRENT
    if (a->grad_rw && e->src >= a->m) {
        long long k = sn_input(e->src - a->m, a->k_own) * a->r_stride;
        SN_ADD(a->grad_rw[k], partial);
        if (a->grad_rd) SN_ADD(a->grad_rd[k], -q);
        SN_ADD(a->loop_b[e->src - a->m], q);
        sn_synapse_t(x, lam, e->w, 0, 0, a->p, lam);
        return;
    }
#endif
    long long i = sn_input(e->src, a->k_in) * a->g_stride;
    SN_ADD(a->grad_w[i], partial);
    if (a->grad_d) SN_ADD(a->grad_d[i], -q);
    if (a->source_b) SN_ADD(a->source_b[e->src], q);
    sn_synapse_t(x, lam, e->w, 0, 0, a->p, lam);
}

/* Where a neuron's adjoint stands: λ, the time it has come back to, the events not yet
   taken (arrivals [0, ia], spikes [0, ks]) and e, an index into the replay's buffers (on
   the RK4 path: the trace's entries not yet taken, [0, e), and dL/dθ summed so far). A
   layer's backward takes a neuron's events at once (sn_backward_all); a recurrent
   layer's a step at a time (sn_neuron_backward's `down_to`), its neurons in step. */
typedef struct {
    real lam[NS];
    real upper;
    long long ia, ks, e;
    long long il; /* (SN_DIRECT) the recurrent arrivals not yet taken: [0, il] */
#if SN_RK4
    real acc[NP + 1];
#endif
} sn_sweep;

#if SN_RK4
/* dλ/ds = Jᵀλ (s: time run backward) at x into k, and with SN_INTEGRALS the integrands
   λ·∂f/∂θ into `terms`. */
SN_INLINE void sn_adjoint_rates(const real* x, const real* lam, const real* p, real* k,
                                real* terms) {
    sn_adjoint_rhs(x, lam, 0, 0, 0, p, k);
    for (int q = 0; q < NS; ++q) k[q] = -k[q];
#if SN_INTEGRALS
    sn_integrands(x, lam, 0, 0, 0, p, terms);
#else
    (void)terms;
#endif
}

/* λ from a traced sub-step's end to its start by one RK4 step (x at its end, middle and
   start), adding ∫λ·∂f/∂θ over it to `acc` (with SN_INTEGRALS). */
SN_FN void sn_segment_back(const real* entry, const real* p, real* lam, real* acc) {
    const real h = entry[1], *start = entry + 3, *middle = start + NS, *end = middle + NS;
    real k1[NS], k2[NS], k3[NS], k4[NS], y[NS];
    real i1[NP + 1], i2[NP + 1], i3[NP + 1], i4[NP + 1];
    sn_adjoint_rates(end, lam, p, k1, i1);
    for (int q = 0; q < NS; ++q) y[q] = lam[q] + (real)0.5 * h * k1[q];
    sn_adjoint_rates(middle, y, p, k2, i2);
    for (int q = 0; q < NS; ++q) y[q] = lam[q] + (real)0.5 * h * k2[q];
    sn_adjoint_rates(middle, y, p, k3, i3);
    for (int q = 0; q < NS; ++q) y[q] = lam[q] + h * k3[q];
    sn_adjoint_rates(start, y, p, k4, i4);
    for (int q = 0; q < NS; ++q) lam[q] = lam[q] + h / 6 * (k1[q] + 2 * k2[q] + 2 * k3[q] + k4[q]);
#if SN_INTEGRALS
    for (int q = 0; q < NP; ++q) acc[q] += h / 6 * (i1[q] + 2 * i2[q] + 2 * i3[q] + i4[q]);
#else
    (void)acc;
#endif
}

/* The derived jump λ⁺ -> λ⁻ at spike k (x: the state just before it), its terms of dL/dθ
   added to `acc`. */
SN_FN void sn_spike_jump(const sn_adjoint* a, long long k, const real* x, real* lam,
                         real* acc) {
    real terms[NP + 1], b = sn_coupling(a, k);
    sn_spike_partials(x, lam, 0, b, 0, a->p, terms);
    for (int q = 0; q < NP; ++q) acc[q] += terms[q];
    sn_jump(x, lam, 0, b, 0, a->p, lam);
}

/* A sweep from t_end: the neuron's forward replayed into the trace `before` (room for
   every sub-step and event it can record: a sub-step per step, two entries per arrival
   and per spike, one spare), λ and its dL/dθ at 0. Where the replay spiked otherwise than
   the forward (it cannot in C: the same code on the same values; a compiler's
   contractions might differ between CUDA's two kernels at a grazing spike), NaN into
   dL/dθ and no entry to take, not a gradient of other spikes. */
SN_FN void sn_sweep_start(const sn_adjoint* a, const sn_arrivals* arr, real* before,
                          real* after, sn_sweep* s) {
    const long long capacity = a->n_steps + 2 * (arr->n + a->count) + 1;
    sn_spikes counted = {0, 0, 0, 0, 0};
    sn_trace trace = {before, capacity, 0};
    (void)after;
    sn_neuron_forward(arr, a->t_end, a->dt, a->n_steps, a->p, &counted, &trace);
    for (int q = 0; q < NS; ++q) s->lam[q] = 0;
    for (int q = 0; q < NP; ++q) s->acc[q] = 0;
    s->upper = a->start;
    s->ia = arr->n - 1;
    s->ks = a->count - 1;
    s->il = -1;
    s->e = trace.count < capacity ? trace.count : capacity;
    if (counted.count != a->count) {
        for (int q = 0; q < NP; ++q) SN_ADD(a->grad_p[q * a->p_stride], SN_INF - SN_INF);
        s->e = 0;
    }
}

/* The sweep run back entry by entry through the trace, as the reference runs its record,
   to `down_to` (every entry from there on: a recurrent layer's step; -inf: all). */
SN_FN void sn_neuron_backward(const sn_adjoint* a, const sn_arrivals* arr, real* before,
                              real* after, real* cuts, sn_sweep* s, real down_to) {
    real lam[NS], acc[NP + 1];
    long long ia = s->ia, ks = s->ks, e = s->e;
    (void)after;
    (void)cuts;
    sn_copy(lam, s->lam);
    for (int q = 0; q < NP; ++q) acc[q] = s->acc[q];
    for (; e > 0; --e) {
        const real* entry = before + (e - 1) * SN_ENTRY;
        if (entry[2] < down_to) break; /* a later call takes it (a recurrent layer's step) */
        if (entry[0] == SN_SEGMENT) {
            sn_segment_back(entry, a->p, lam, acc);
        } else if (entry[0] == SN_SPIKE) {
            sn_spike_jump(a, ks, entry + 3, lam, acc);
            --ks;
        } else {
            sn_arrival next = sn_arrival_at(arr, ia);
            sn_arrival_back(a, &next, entry + 3, lam);
            --ia;
        }
    }
    sn_copy(s->lam, lam);
    for (int q = 0; q < NP; ++q) s->acc[q] = acc[q];
    s->ia = ia;
    s->ks = ks;
    s->e = e;
}

/* A sweep's end, once every entry is taken: dL/dθ summed over the neuron added to its
   gradient row. */
SN_FN void sn_sweep_finish(const sn_adjoint* a, sn_sweep* s, real* after, real* cuts) {
    (void)after;
    (void)cuts;
    for (int q = 0; q < NP; ++q) SN_ADD(a->grad_p[q * a->p_stride], s->acc[q]);
}
#else
#if SN_READOUTS
/* The source's share of λ at t from [t, upper] (no event between):
   ∫_t^upper Φ(u − t)ᵀ e_V source·κ(u) du by 8-point Gauss-Legendre, added to lam. */
SN_FN void sn_pushed(const sn_adjoint* a, real t, real upper, real* lam) {
    real length = upper - t;
    for (int node = 0; node < 8; ++node) {
        real s = (real)(0.5 * (double)length * (sn_gauss_nodes[node] + 1.0)), e[NS], out[NS];
        real kappa = a->tau_w > 0 ? exp(-(t + s) / a->tau_w) : 1;
        real weight = (real)(0.5 * (double)length * sn_gauss_weights[node]);
        for (int q = 0; q < NS; ++q) e[q] = q == 0 ? a->source * kappa : 0;
        sn_adjoint_flow(e, e, 0, 0, s, a->p, out);
        for (int q = 0; q < NS; ++q) lam[q] += weight * out[q];
    }
}
#define SN_PUSHED(a, t, upper, lam) \
    if ((a)->source != 0) sn_pushed(a, t, upper, lam)
#else
#define SN_PUSHED(a, t, upper, lam)
#endif

/* λ at `start` from λ at `upper` (no event between), on pieces of at most dt where
   SN_INTEGRALS adds ∫λ·∂f/∂θ dt over [start, upper] (8-point Gauss-Legendre on each, the
   state along it flowed from x_start, its value at `start`) or a source adds its share
   (sn_pushed); `cuts` holds each piece's start time and state (NS + 1 values a piece). */
SN_FN void sn_integrate(const sn_adjoint* a, real start, real upper, const real* x_start,
                         real* lam, real* cuts) {
#if SN_INTEGRALS || SN_READOUTS
    if (!SN_INTEGRALS && a->source == 0) {
        sn_adjoint_flow(lam, lam, 0, 0, upper - start, a->p, lam);
        return;
    }
    long long last = 0;
    cuts[0] = start;
    if (SN_INTEGRALS) sn_copy(cuts + 1, x_start);
    while (cuts[last * (NS + 1)] + a->dt < upper) {
        real* here = cuts + last * (NS + 1);
        real* next = here + NS + 1;
        next[0] = here[0] + a->dt;
        if (SN_INTEGRALS) sn_move(here + 1, next[0] - here[0], a->p, next + 1);
        ++last;
    }
    for (long long k = last; k >= 0; --k) {
        const real* piece = cuts + k * (NS + 1);
        real lo = piece[0], length = upper - lo;
        if (length > 0) {
            for (int node = 0; SN_INTEGRALS && node < 8; ++node) {
                real s = (real)(0.5 * (double)length * (sn_gauss_nodes[node] + 1.0));
                real xs[NS], ls[NS], terms[NP + 1];
                sn_move(piece + 1, s, a->p, xs);
                sn_adjoint_flow(xs, lam, 0, 0, upper - (lo + s), a->p, ls);
                SN_PUSHED(a, lo + s, upper, ls);
                sn_integrands(xs, ls, 0, 0, 0, a->p, terms);
                real weight = (real)(0.5 * (double)length * sn_gauss_weights[node]);
                for (int q = 0; q < NP; ++q) SN_ADD(a->grad_p[q * a->p_stride], weight * terms[q]);
            }
            real pushed[NS];
            for (int q = 0; q < NS; ++q) pushed[q] = 0;
            SN_PUSHED(a, lo, upper, pushed);
            sn_adjoint_flow(lam, lam, 0, 0, length, a->p, lam);
            for (int q = 0; q < NS; ++q) lam[q] += pushed[q];
        }
        upper = lo;
    }
#else
    (void)x_start;
    (void)cuts;
    sn_adjoint_flow(lam, lam, 0, 0, upper - start, a->p, lam);
#endif
}

/* λ before a spike (derived jump) from λ after it; the spike's share of dL/dθ. */
SN_FN void sn_spike_back(const sn_adjoint* a, long long k, real* lam) {
    real x[NS + 1], terms[NP + 1];
    for (int q = 0; q < NS; ++q) x[q] = 0;
    for (int q = 0; q < NSTORE; ++q) x[sn_store[q]] = a->store[k * NSTORE + q];
    real b = sn_coupling(a, k);
    sn_spike_partials(x, lam, 0, b, 0, a->p, terms);
    for (int q = 0; q < NP; ++q) SN_ADD(a->grad_p[q * a->p_stride], terms[q]);
    sn_jump(x, lam, 0, b, 0, a->p, lam);
}

/* The states just before and just after each event, replayed from the forward's spike
   times (events in forward order: at one time an arrival before a spike). */
SN_FN void sn_replay(const sn_adjoint* a, const sn_arrivals* arr, real* before, real* after) {
    long long ia = 0, ks = 0, e = 0;
    real t = 0;
    sn_init(after, after, 0, 0, 0, a->p, after);
    while (ia < arr->n || ks < a->count) {
        sn_arrival next = {SN_INF, 0, 0};
        if (ia < arr->n) next = sn_arrival_at(arr, ia);
        int spike = ks < a->count && (ia >= arr->n || a->times[ks] < next.t);
        real time = spike ? a->times[ks] : next.t;
        real* x = before + e * NS;
        sn_move(after + e * NS, time - t, a->p, x);
        if (spike) {
            for (int q = 0; q < NSTORE; ++q) x[sn_store[q]] = a->store[ks * NSTORE + q];
            sn_reset(x, x, 0, 0, 0, a->p, after + (e + 1) * NS);
            ++ks;
        } else {
            sn_synapse(x, x, next.w, 0, 0, a->p, after + (e + 1) * NS);
            ++ia;
        }
        t = time;
        ++e;
    }
}

SN_INLINE int sn_vanishes(const real* lam) {
    for (int q = 0; q < NS; ++q)
        if (lam[q] != 0) return 0;
    return 1;
}

/* The state of event e in a replay's buffer (the one slot without a replay). */
#define SN_AT(buffer, e) (SN_REPLAY ? (buffer) + (e) * NS : (buffer))

/* A sweep from the adjoint's start (t_end, or a readout's maximum, with its kick), the
   states at its events replayed where the backward reads them. */
SN_FN void sn_sweep_start(const sn_adjoint* a, const sn_arrivals* arr, real* before,
                          real* after, sn_sweep* s) {
    for (int q = 0; q < NS; ++q) s->lam[q] = q == 0 ? a->kick : 0;
    s->upper = a->start;
    s->ia = arr->n - 1;
    s->ks = a->count - 1;
    s->e = arr->n + a->count;
    s->il = arr->n_loop - 1;
    if (SN_REPLAY) sn_replay(a, arr, before, after);
}

#if SN_DIRECT
/* One neuron's adjoint from t_end back to 0, spike to spike. An arrival leaves λ as it
   is (SN_DIRECT: a synapse that adds to a state, and no term needs the states), so λ at
   each arrival between two spikes is the flow's transpose from the later spike alone,
   λ(t_a) = Φ(upper − t_a)ᵀ λ(upper): the arrivals are independent of each other (a
   thread overlaps their loads and exponentials) and skipped where λ(upper) = 0. At one
   time an arrival comes before a spike, as in the forward. */
/* The arrivals of `arr` in (low, upper] from down_to on (all of them, but for a
   recurrent layer's step), [stop, *last), taken back from λ at upper; whether some
   before down_to remain. All of them: a binary search finds where they start. A step's:
   a scan back from *last (a step holds a few; two binary searches a step cost more). */
SN_FN int sn_take(const sn_adjoint* a, const sn_arrivals* arr, long long* last, real low,
                  real upper, real down_to, const real* lam, real* before) {
    long long stop = *last;
    int left = 0;
    if (down_to == -SN_INF) {
        stop = sn_arrivals_upto(arr, low, *last);
    } else {
        for (; stop > 0; --stop) {
            real t = sn_arrival_time(arr, stop - 1);
            if (t <= low) break;
            if (t < down_to) {
                left = 1;
                break;
            }
        }
    }
    if (!sn_vanishes(lam)) {
        SN_UNROLL
        for (long long e = *last - 1; e >= stop; --e) {
            sn_arrival next = sn_arrival_at(arr, e);
            real at[NS];
            sn_adjoint_flow(lam, lam, 0, 0, upper - next.t, a->p, at);
            sn_arrival_back(a, &next, before, at);
        }
    }
    *last = stop;
    return left;
}

SN_FN void sn_neuron_backward(const sn_adjoint* a, const sn_arrivals* arr, real* before,
                              real* after, real* cuts, sn_sweep* s, real down_to) {
    real lam[NS], upper = s->upper;
    long long last = s->ia + 1, ks = s->ks; /* the arrivals not yet taken are [0, last) */
    (void)after;
    (void)cuts;
    sn_copy(lam, s->lam);
#if SN_RECURRENT
    long long last_loop = s->il + 1;
    sn_arrivals loop = {arr->loop, 0, 0, 0, 0, 0, 0, arr->n_loop, 0, 0};
#endif
    for (;; --ks) {
        real low = ks >= 0 ? a->times[ks] : -SN_INF;
        int left = sn_take(a, arr, &last, low, upper, down_to, lam, before);
#if SN_RECURRENT
        left |= sn_take(a, &loop, &last_loop, low, upper, down_to, lam, before);
        s->il = last_loop - 1;
#endif
        if (left || ks < 0 || low < down_to) break;
        sn_adjoint_flow(lam, lam, 0, 0, upper - low, a->p, lam);
        sn_spike_back(a, ks, lam);
        upper = low;
    }
    sn_copy(s->lam, lam);
    s->upper = upper;
    s->ia = last - 1;
    s->ks = ks;
}
#else
/* One neuron's adjoint from t_end back to 0 through its events. */
SN_FN void sn_neuron_backward(const sn_adjoint* a, const sn_arrivals* arr, real* before,
                              real* after, real* cuts, sn_sweep* s, real down_to) {
    real lam[NS], upper = s->upper;
    long long ia = s->ia, ks = s->ks, e = s->e;
    sn_copy(lam, s->lam);
    sn_arrival next = sn_arrival_or_none(arr, ia), ahead = sn_arrival_or_none(arr, ia - 1);
    while (ia >= 0 || ks >= 0) {
        if (sn_vanishes(lam)) {
            /* λ = 0: no part of the loss has reached the neuron yet, back in time. It stays
               0 to the next spike back, and every arrival's terms and ∫λ·∂f/∂θ vanish
               until then (they are linear in λ): those arrivals are skipped. */
            if (ks < 0) {
                ia = -1;
                break;
            }
            long long kept = sn_arrivals_upto(arr, a->times[ks], ia + 1);
            if (kept <= ia) {
                ia = kept - 1;
                e = ia + ks + 2;
                next = sn_arrival_or_none(arr, ia);
                ahead = sn_arrival_or_none(arr, ia - 1);
            }
            upper = a->times[ks];
        }
        int spike = ks >= 0 && (ia < 0 || a->times[ks] >= next.t);
        real time = spike ? a->times[ks] : next.t;
        if (time < down_to) break; /* a later call takes it (a recurrent layer's step) */
        sn_integrate(a, time, upper, SN_AT(after, e), lam, cuts);
        --e;
        if (spike) {
            sn_spike_back(a, ks, lam);
            --ks;
        } else {
            sn_arrival_back(a, &next, SN_AT(before, e), lam);
            --ia;
            next = ahead;
            ahead = sn_arrival_or_none(arr, ia - 1);
        }
        upper = time;
    }
    sn_copy(s->lam, lam);
    s->upper = upper;
    s->ia = ia;
    s->ks = ks;
    s->e = e;
}
#endif

/* A sweep's last stretch, from its last event back to 0 (∫λ·∂f/∂θ over it, a source's
   share), once every event is taken. */
SN_FN void sn_sweep_finish(const sn_adjoint* a, sn_sweep* s, real* after, real* cuts) {
#if SN_DIRECT
    (void)a, (void)s, (void)after, (void)cuts;
#else
    if (!sn_vanishes(s->lam)) sn_integrate(a, 0, s->upper, after, s->lam, cuts);
#endif
}

#endif

/* One neuron's adjoint from its start back to 0 through all its events. */
SN_FN void sn_backward_all(const sn_adjoint* a, const sn_arrivals* arr, real* before,
                           real* after, real* cuts) {
    sn_sweep s;
    sn_sweep_start(a, arr, before, after, &s);
    sn_neuron_backward(a, arr, before, after, cuts, &s, -SN_INF);
    sn_sweep_finish(a, &s, after, cuts);
}

/* Row r's backward (sample b = r / N, neuron j = r % N), adding into its group's gradient
   rows (group b mod `groups`); `slab`: its scratch, laid out as
   codegen/events.py's scratch_bytes counts it: the list to sort its arrivals into (when no
   `order` is given), the states before and after each event, the integral's pieces. */
SN_FN void sn_backward_row(long long r, unsigned char* slab, SN_BACKWARD_PARAMS) {
    const real t_end = (real)until, dt = (real)step;
    const long long m = n_in * k_in, b = r / N, j = r % N, g = b % groups;
    const long long at = transposed ? j : j * n_in, stride = transposed ? N : 1;
    const long long listed = order ? 0 : 2 * (m + 1) * (long long)sizeof(sn_arrival);
    real p[NP + NK + 1];
    sn_arrivals arr = SN_ROW_INPUTS(r, slab, t_end, p);
    sn_adjoint a = {p, times + r * k_out, store + r * k_out * NSTORE, grad_t + r * k_out,
                    counts[r], t_end, dt, n_steps, grad_w + g * N * n_in + at,
                    grad_d ? grad_d + g * N * n_in + at : grad_d, stride,
                    grad_p + g * NP * N + j, N, source_b ? source_b + b * m : source_b, k_in,
                    t_end, 0, 0, 0};
#if SN_RK4
    /* the replay's entries (room for as many as codegen/events.py's trace_entries counts) */
    sn_backward_all(&a, &arr, (real*)(slab + listed), 0, 0);
#else
    const long long n_events = SN_REPLAY ? m + k_out + 1 : 1;
    real* before = (real*)(slab + listed);
    real* after = before + n_events * NS;
    real* cuts = after + n_events * NS;
    sn_backward_all(&a, &arr, before, after, cuts);
#endif
}

#if !SN_RECURRENT
SN_GROUPS_ENTRY(sn_events_backward, sn_backward_row, SN_BACKWARD_PARAMS, SN_BACKWARD_NAMES)
#endif

#if SN_READOUTS
/* A readout row's adjoint (sample r / N, neuron r % N, no spikes) adding into its group's
   gradient rows, from t_end with λ = 0 and no source (the caller sets its start, kick or
   source); *before: its scratch's states before each event, after the arrivals' list. */
SN_FN sn_adjoint sn_readout_adjoint(long long r, unsigned char* slab, const real* p,
                                    double until, double step, long long n_steps, long long N,
                                    long long n_in, long long k_in, const long long* order,
                                    long long transposed, long long groups, real* grad_w,
                                    real* grad_d, real* grad_p, real* source_b,
                                    real** before) {
    const long long m = n_in * k_in, b = r / N, j = r % N, g = b % groups;
    const long long at = transposed ? j : j * n_in, stride = transposed ? N : 1;
    const long long listed = order ? 0 : 2 * (m + 1) * (long long)sizeof(sn_arrival);
    sn_adjoint a = {p, 0, 0, 0, 0, (real)until, (real)step, n_steps,
                    grad_w + g * N * n_in + at, grad_d ? grad_d + g * N * n_in + at : grad_d,
                    stride, grad_p + g * NP * N + j, N,
                    source_b ? source_b + b * m : source_b, k_in, (real)until, 0, 0, 0};
    *before = (real*)(slab + listed);
    return a;
}

#define SN_READOUT_ADJOINT(r, slab, p, before)                                            \
    sn_readout_adjoint(r, slab, p, until, step, n_steps, N, n_in, k_in, order, transposed, \
                       groups, grad_w, grad_d, grad_p, source_b, before)

/* A readout's maximum of V over [0, t_end]: a neuron run without its threshold or reset,
   its value and time, and where it sits on an arrival (V after it the greatest: V rising
   into an inhibitory input, or a jump of V), that arrival's source slot and V's rate
   just before it (else src -1). The candidates, as the reference takes them: V at 0 and
   just after each arrival, each piece's interior maximum (V's rate from + to -, at most
   one zero for two states), V at t_end; the earliest of equal ones. */
typedef struct {
    real value, time, rate;
    long long src;
} sn_peak;

SN_INLINE void sn_better(sn_peak* best, real value, real time, long long src, real rate) {
    if (value > best->value) {
        best->value = value;
        best->time = time;
        best->src = src;
        best->rate = rate;
    }
}

SN_FN sn_peak sn_neuron_peak(const sn_arrivals* arr, real t_end, const real* p) {
    real x[NS], end[NS], at[NS], t = 0;
    sn_peak best;
    sn_init(x, x, 0, 0, 0, p, x);
    best.value = sn_eval(SN_V, x, p);
    best.time = 0;
    best.rate = 0;
    best.src = -1;
    for (long long e = 0; e <= arr->n; ++e) {
        sn_arrival next = sn_arrival_or_none(arr, e);
        real due = e < arr->n ? next.t : t_end, length = due - t;
        sn_move(x, length, p, end);
        real rate_0 = sn_eval(SN_V_DOT, x, p), rate_end = sn_eval(SN_V_DOT, end, p);
        if (rate_0 > 0 && rate_end < 0 && length > 0) {
            real s = sn_root(SN_V_DOT, x, 0, length, 0, p);
            sn_move(x, s, p, at);
            sn_better(&best, sn_eval(SN_V, at, p), t + s, -1, 0);
        }
        if (e == arr->n) {
            sn_better(&best, sn_eval(SN_V, end, p), t_end, -1, 0);
            break;
        }
        sn_synapse(end, end, next.w, 0, 0, p, x);
        sn_better(&best, sn_eval(SN_V, x, p), due, next.src, rate_end);
        t = due;
    }
    return best;
}

/* Row r's maximum of V (sample r / N, readout neuron r % N). */
SN_FN void sn_peak_row(long long r, unsigned char* slab, SN_PEAK_PARAMS) {
    real p[NP + NK + 1];
    sn_arrivals arr = SN_ROW_INPUTS(r, slab, (real)until, p);
    sn_peak best = sn_neuron_peak(&arr, (real)until, p);
    value[r] = best.value;
    when[r] = best.time;
    rate[r] = best.rate;
    src[r] = best.src;
}

/* Row r's adjoint from its maximum back to 0: λ_V = dL/dy there, the arrivals before it
   as in a layer's backward (no spikes); where the maximum sits on an arrival, y moves with
   its time: dL/dt_a = dL/dy·V̇⁻(t_a) joins its delay's gradient and its source's B, and
   the arrival's own terms see λ = 0. */
SN_FN void sn_peak_backward_row(long long r, unsigned char* slab, SN_PEAK_BACKWARD_PARAMS) {
    real p[NP + NK + 1], *before;
    if (grad_y[r] == 0) return;
    sn_arrivals arr = SN_ROW_INPUTS(r, slab, (real)until, p);
    /* the arrivals before the maximum: one at its time takes λ = 0, the kick coming
       after it back in time (as in the reference; y moves with it by the term below) */
    arr.n = sn_arrivals_upto(&arr, when[r], arr.n);
    while (arr.n > 0 && sn_arrival_time(&arr, arr.n - 1) >= when[r]) --arr.n;
    sn_adjoint a = SN_READOUT_ADJOINT(r, slab, p, &before);
    a.start = when[r];
    a.kick = grad_y[r];
    if (src[r] >= 0) {
        real term = a.kick * rate[r];
        if (a.grad_d) SN_ADD(a.grad_d[sn_input(src[r], k_in) * a.g_stride], term);
        if (a.source_b) SN_ADD(a.source_b[src[r]], -term);
    }
    const long long n_events = SN_REPLAY ? n_in * k_in + 1 : 1;
    real* after = before + n_events * NS;
    sn_backward_all(&a, &arr, before, after, after + n_events * NS);
}

SN_ROWS_ENTRY(sn_events_peak, sn_peak_row, SN_PEAK_PARAMS, SN_PEAK_NAMES)
SN_GROUPS_ENTRY(sn_events_peak_backward, sn_peak_backward_row, SN_PEAK_BACKWARD_PARAMS,
                SN_PEAK_BACKWARD_NAMES)

/* A readout's mean of V: (1/t_end)∫ κ(t) V dt over [0, t_end] (κ = 1, or e^(-t/tau_w)
   where tau_w > 0), by 8-point Gauss-Legendre on the pieces between arrivals cut to at
   most dt, as the reference takes it. */
SN_FN real sn_neuron_mean(const sn_arrivals* arr, real t_end, real dt, real tau_w,
                          const real* p) {
    real x[NS], xs[NS], t = 0, total = 0;
    sn_init(x, x, 0, 0, 0, p, x);
    for (long long e = 0; e <= arr->n; ++e) {
        sn_arrival next = sn_arrival_or_none(arr, e);
        real due = e < arr->n ? next.t : t_end;
        while (t < due) {
            real end = t + dt < due ? t + dt : due, length = end - t;
            for (int node = 0; node < 8; ++node) {
                real s = (real)(0.5 * (double)length * (sn_gauss_nodes[node] + 1.0));
                real kappa = tau_w > 0 ? exp(-(t + s) / tau_w) : 1;
                sn_move(x, s, p, xs);
                total += (real)(0.5 * (double)length * sn_gauss_weights[node]) * kappa *
                         sn_eval(SN_V, xs, p);
            }
            sn_move(x, length, p, x);
            t = end;
        }
        if (e == arr->n) break;
        sn_synapse(x, x, next.w, 0, 0, p, x);
    }
    return total / t_end;
}

/* Row r's mean of V (sample r / N, readout neuron r % N). */
SN_FN void sn_mean_row(long long r, unsigned char* slab, SN_MEAN_PARAMS) {
    real p[NP + NK + 1];
    sn_arrivals arr = SN_ROW_INPUTS(r, slab, (real)until, p);
    value[r] = sn_neuron_mean(&arr, (real)until, (real)step, (real)tau_weight, p);
}

/* A mean readout's adjoint from t_end back to 0 through its arrivals, the loss a
   continuous source in dλ_V/dt (no jump). */
SN_FN void sn_mean_backward(const sn_adjoint* a, const sn_arrivals* arr, real* before,
                            real* after, real* cuts) {
    real lam[NS], upper = a->t_end;
    for (int q = 0; q < NS; ++q) lam[q] = 0;
    if (SN_REPLAY) sn_replay(a, arr, before, after);
    for (long long e = arr->n - 1; e >= -1; --e) {
        sn_arrival next = sn_arrival_or_none(arr, e);
        real time = e >= 0 ? next.t : 0;
        sn_integrate(a, time, upper, SN_AT(after, e + 1), lam, cuts);
        if (e < 0) break;
        sn_arrival_back(a, &next, SN_AT(before, e), lam);
        upper = time;
    }
}

/* Row r's backward of its mean, with dL/dy / t_end as the source's size. */
SN_FN void sn_mean_backward_row(long long r, unsigned char* slab, SN_MEAN_BACKWARD_PARAMS) {
    real p[NP + NK + 1], *before;
    if (grad_y[r] == 0) return;
    sn_arrivals arr = SN_ROW_INPUTS(r, slab, (real)until, p);
    sn_adjoint a = SN_READOUT_ADJOINT(r, slab, p, &before);
    a.source = grad_y[r] / a.t_end;
    a.tau_w = (real)tau_weight;
    const long long n_events = SN_REPLAY ? n_in * k_in + 1 : 1;
    real* after = before + n_events * NS;
    sn_mean_backward(&a, &arr, before, after, after + n_events * NS);
}

SN_ROWS_ENTRY(sn_events_mean, sn_mean_row, SN_MEAN_PARAMS, SN_MEAN_NAMES)
SN_GROUPS_ENTRY(sn_events_mean_backward, sn_mean_backward_row, SN_MEAN_BACKWARD_PARAMS,
                SN_MEAN_BACKWARD_NAMES)
#endif
