/* Recurrent layers (SN_RECURRENT): a layer whose own spikes arrive at its neurons too,
   through recurrent weights and delays of at least one step. Appended to the skeleton
   (event_skeleton.c), whose pieces it runs: a neuron's moves, spikes and arrivals in the
   forward (by the closed-form flow, or by RK4 steps on the RK4 path), its adjoint sweep
   in the backward (on the RK4 path: back through its replayed forward's trace).

   A sample's neurons run in step, a step of dt at a time: in CUDA one block a sample (a
   thread a neuron, or several neurons a thread) with a barrier between steps; in C one
   thread a sample, its neurons in turn each step. That is exact because every recurrent
   delay is at least one step: the arrivals of a step's spikes fall in later steps.

   * Forward: each neuron takes its step's arrivals in time order from two queues (its
     feedforward arrivals, as a feedforward layer's row reads them, and its queue of
     recurrent ones; at one time feedforward first, then by source and slot, as the
     reference orders them). The step's new spikes go to the sample's log; after the
     barrier each neuron queues their arrivals (time t_k + D_rec[j, k], weight
     W_rec[j, k], source m + k * k_out + slot), sorted in.
   * Backward: each neuron's recurrent arrivals (every spike now known) sorted into a
     list of their own beside its feedforward ones (SN_DIRECT, where the arrivals between
     two spikes are independent), or with them into one (else: the states between events
     are replayed in time order; on the RK4 path the neuron's whole forward, each
     sub-step traced), its adjoint swept back a step at a time
     (sn_neuron_backward's `down_to`): a recurrent arrival adds its Q into its source spike's B, which is
     complete once every later step has run, when the source's own sweep reaches the
     spike. Recurrent weights and delays get their gradients as feedforward ones do. */

#if SN_CUDA
#define SN_BARRIER() __syncthreads()
#define SN_LANE ((long long)threadIdx.x)
#define SN_LANES ((long long)blockDim.x)
#define SN_RESERVE(count) ((long long)atomicAdd((count), 1ULL))
#define SN_MARK(word, bits) atomicOr((word), (bits))
#else
#define SN_BARRIER()
#define SN_LANE 0LL
#define SN_LANES 1LL
#define SN_RESERVE(count) ((long long)(*(count))++)
#define SN_MARK(word, bits) (*(word) |= (bits))
#endif

/* Row state lives at the start of a row's slab: SN_LOOP_STATE bytes (printed by
   codegen/events.py), checked here to hold either pass's. */
typedef struct {
    sn_arrivals arr;         /* the feedforward arrivals */
    real x[NS], t;
    long long ptr;           /* the next feedforward arrival */
    long long taken, queued; /* the recurrent queue: [0, queued), applied [0, taken) */
    long long seen;          /* the sample log's entries queued so far */
    real quiet;              /* (SN_WHOLE) no arrival and no crossing before it */
    long long count, status;
    real p[NP + NK + 1];
} sn_loop_row;

typedef struct {
    sn_sweep sweep;
    sn_arrivals arr; /* its arrivals */
    real p[NP + NK + 1];
} sn_loop_back;

typedef char sn_loop_fits[(sizeof(sn_loop_row) <= SN_LOOP_STATE &&
                           sizeof(sn_loop_back) <= SN_LOOP_STATE) ? 1 : -1];

/* The (target j, source k) entry of a recurrent [N, N] tensor, or of its [N, N]
   transpose (CUDA: a warp's neurons then read one line for one source). */
SN_INLINE long long sn_loop_at(long long j, long long k, long long N, long long transposed) {
    return transposed ? k * N + j : j * N + k;
}

/* Arrival a queued into the live part q[*low, *n) of a queue of `room` (sorted by time,
   then source: the reference's order); where the queue is full, its applied part
   [0, *low) is dropped first. 0 where the live arrivals fill it: the caller's run is
   then run again with more room. */
SN_INLINE int sn_enqueue(sn_arrival* q, long long* low, long long* n, long long room,
                         sn_arrival a) {
    if (*n == room) {
        if (*low == 0) return 0;
        for (long long i = *low; i < *n; ++i) q[i - *low] = q[i];
        *n -= *low;
        *low = 0;
    }
    long long i = *n;
    while (i > *low && (q[i - 1].t > a.t || (q[i - 1].t == a.t && q[i - 1].src > a.src))) {
        q[i] = q[i - 1];
        --i;
    }
    q[i] = a;
    ++*n;
    return 1;
}

/* Row r's forward at t = 0 into its state s: its feedforward arrivals, no spikes.
   `slab`: its scratch (the state's own place, the feedforward list, the queue). A row's
   functions take its state apart from its slab, so that a thread of one neuron keeps it
   in registers across steps (sn_loop_forward_rows). */
SN_INLINE void sn_loop_start(long long r, sn_loop_row* s, unsigned char* slab,
                             SN_LOOP_FORWARD_PARAMS) {
    s->arr = SN_ROW_INPUTS(r, slab + SN_LOOP_STATE, (real)until, s->p);
    sn_init(s->x, s->x, 0, 0, 0, s->p, s->x);
    s->t = s->quiet = 0;
    s->ptr = s->taken = s->queued = s->seen = s->count = s->status = 0;
    for (long long k = 0; k < k_out; ++k) times[r * k_out + k] = SN_INF;
}

/* Row r (neuron j) moved through its arrivals to `end`, its new spikes (those with a slot)
   put in the sample's log. */
SN_INLINE void sn_loop_advance(long long r, long long j, sn_loop_row* s, unsigned char* slab,
                               real end, sn_arrival* log, unsigned long long* logged,
                               SN_LOOP_FORWARD_PARAMS) {
    if (s->status || end <= s->quiet) return; /* (nothing happens in the step) */
    const sn_arrival* queue = (const sn_arrival*)(slab + SN_LOOP_STATE + list_bytes);
    const sn_arrival none = {SN_INF, 0, 0};
    sn_spikes out = {times + r * k_out, store + r * k_out * NSTORE, rate + r * k_out, k_out,
                     s->count};
    real x[NS], t = s->t, p[NP + NK + 1];
    long long ptr = s->ptr, taken = s->taken;
    sn_copy(x, s->x);
    for (int q = 0; q < NP + NK + 1; ++q) p[q] = s->p[q];
    for (;;) {
        sn_arrival ff = sn_arrival_or_none(&s->arr, ptr);
        sn_arrival loop = taken < s->queued ? queue[taken] : none;
        int first = ff.t <= loop.t; /* at one time: feedforward first */
        real due = first ? ff.t : loop.t;
        if (SN_ADVANCE(x, &t, fmin(due, end), p, &out)) {
            s->status = 1;
            break;
        }
        if (!(due < end)) break;
        sn_synapse(x, x, first ? ff.w : loop.w, 0, 0, p, x);
        if (first) ++ptr;
        else ++taken;
    }
#if SN_WHOLE
    /* how long the neuron stays quiet: to its next arrival, or its next crossing (a move
       along the flow finds the first, SN_WHOLE); steps before it are skipped */
    if (!s->status) {
        sn_arrival ff = sn_arrival_or_none(&s->arr, ptr);
        sn_arrival loop = taken < s->queued ? queue[taken] : none;
        real due = fmin(fmin(ff.t, loop.t), (real)until), where = 0, moved[NS];
        s->quiet = sn_first_crossing(x, due - t, p, &where, moved) ? t + where : due;
    }
#endif
    for (long long k = s->count; k < out.count && k < k_out; ++k) {
        long long at = SN_RESERVE(logged);
        log[at].t = out.times[k];
        log[at].w = 0;
        log[at].src = j * k_out + k;
    }
    sn_copy(s->x, x);
    s->t = t;
    s->ptr = ptr;
    s->taken = taken;
    s->count = out.count;
}

/* Row r (neuron j) queues the arrivals of the log's entries [seen, known): spikes of
   steps before `end`, whose arrivals come at `end` or later (else status 2: a delay
   under one step; 3 where its queue has too little room). */
SN_INLINE void sn_loop_queue(long long j, sn_loop_row* s, unsigned char* slab, real end,
                             const sn_arrival* log, long long known, SN_LOOP_FORWARD_PARAMS) {
    sn_arrival* queue = (sn_arrival*)(slab + SN_LOOP_STATE + list_bytes);
    const long long m = n_in * k_in;
    for (long long e = s->seen; e < known; ++e) {
        long long at = sn_loop_at(j, sn_input(log[e].src, k_out), N, transposed);
        sn_arrival a = {log[e].t + SN_LOAD(rec_delay + at), SN_LOAD(rec_weight + at),
                        m + log[e].src};
        if (!(a.t < (real)until)) continue;
        if (a.t < end) s->status = 2;
        else if (!sn_enqueue(queue, &s->taken, &s->queued, queue_slots, a)) s->status = 3;
        if (a.t < s->quiet) s->quiet = a.t;
    }
    s->seen = known;
}

/* Row j's state: a thread's own (`alone`: one neuron a thread, kept in registers), else
   at the start of its slab. */
#define SN_LOOP_STATE_OF(type, j) (alone ? &own : (type*)(rows_at + (j) * row_bytes))

/* Sample b's forward: its neurons a step at a time. `sample`: its scratch (the log, then
   each row's slab of row_bytes); `logged`: the log's length, shared by its threads;
   `alone`: one neuron a thread. */
SN_INLINE void sn_loop_forward_rows(long long b, unsigned char* sample,
                                    unsigned long long* logged, int alone,
                                    SN_LOOP_FORWARD_PARAMS) {
    sn_arrival* log = (sn_arrival*)sample;
    unsigned char* rows_at = sample + head_bytes;
    sn_loop_row own;
    if (SN_LANE == 0) *logged = 0;
    for (long long j = SN_LANE; j < N; j += SN_LANES)
        sn_loop_start(b * N + j, SN_LOOP_STATE_OF(sn_loop_row, j), rows_at + j * row_bytes,
                      SN_LOOP_FORWARD_NAMES);
    SN_BARRIER();
    for (long long step_k = 0; step_k < n_steps; ++step_k) {
        real end = fmin((real)(step_k + 1) * (real)step, (real)until);
        for (long long j = SN_LANE; j < N; j += SN_LANES)
            sn_loop_advance(b * N + j, j, SN_LOOP_STATE_OF(sn_loop_row, j),
                            rows_at + j * row_bytes, end, log, logged, SN_LOOP_FORWARD_NAMES);
        SN_BARRIER();
        const long long known = (long long)*logged;
        for (long long j = SN_LANE; j < N; j += SN_LANES)
            sn_loop_queue(j, SN_LOOP_STATE_OF(sn_loop_row, j), rows_at + j * row_bytes, end, log,
                          known, SN_LOOP_FORWARD_NAMES);
        SN_BARRIER();
    }
    for (long long j = SN_LANE; j < N; j += SN_LANES) {
        const sn_loop_row* s = SN_LOOP_STATE_OF(sn_loop_row, j);
        counts[b * N + j] = s->count;
        status[b * N + j] = s->status;
    }
}

SN_FN void sn_loop_forward_sample(long long b, unsigned char* sample,
                                  unsigned long long* logged, SN_LOOP_FORWARD_PARAMS) {
    if (N <= SN_LANES) sn_loop_forward_rows(b, sample, logged, 1, SN_LOOP_FORWARD_NAMES);
    else sn_loop_forward_rows(b, sample, logged, 0, SN_LOOP_FORWARD_NAMES);
}

/* Row r's (sample b, neuron j) adjoint: what it reads and adds into (its group's rows,
   the sample's recurrent B in `loop_b`), with params p. */
SN_FN sn_adjoint sn_loop_adjoint(long long b, long long j, const real* p, real* loop_b,
                                 SN_LOOP_BACKWARD_PARAMS) {
    const long long m = n_in * k_in, r = b * N + j, g = b % groups;
    const long long at = transposed ? j : j * n_in, stride = transposed ? N : 1;
    const long long r_at = transposed ? j : j * N;
    sn_adjoint a = {p, times + r * k_out, store + r * k_out * NSTORE, grad_t + r * k_out,
                    counts[r] < k_out ? counts[r] : k_out, (real)until, (real)step, n_steps,
                    grad_w + g * N * n_in + at, grad_d ? grad_d + g * N * n_in + at : grad_d,
                    stride, grad_p + g * NP * N + j, N, source_b ? source_b + b * m : source_b,
                    k_in, (real)until, 0, 0, 0, m, k_out, stride,
                    grad_rw + g * N * N + r_at, grad_rd ? grad_rd + g * N * N + r_at : grad_rd,
                    loop_b, loop_b + j * k_out};
    return a;
}

/* Where row j's pieces lie in its slab after its state (codegen/events.py's loop_bytes
   counts them): SN_DIRECT, its feedforward list (where no order is given) and its
   recurrent list after list_bytes; else one list of both, then the replay's states and
   the integral's pieces after list_bytes. */
#define SN_LOOP_LIST(slab) ((sn_arrival*)((slab) + SN_LOOP_STATE))
#define SN_LOOP_BEFORE(slab) ((real*)((slab) + SN_LOOP_STATE + list_bytes))

/* The recurrent arrivals at row j (sample b) of the layer's spikes, unsorted, appended to
   list[n, ...); the new n. */
SN_FN long long sn_loop_listed(long long b, long long j, sn_arrival* list, long long n,
                               SN_LOOP_BACKWARD_PARAMS) {
    const long long m = n_in * k_in;
    const real t_end = (real)until;
    for (long long k = 0; k < N; ++k) {
        const long long r = b * N + k, most = counts[r] < k_out ? counts[r] : k_out;
        const long long w_at = sn_loop_at(j, k, N, transposed);
        for (long long slot = 0; slot < most; ++slot) {
            real t = times[r * k_out + slot] + rec_delay[w_at];
            if (!(t < t_end)) continue;
            list[n].t = t;
            list[n].w = rec_weight[w_at];
            list[n].src = m + k * k_out + slot;
            ++n;
        }
    }
    return n;
}

/* Row j's backward set up: its arrivals (SN_DIRECT: the feedforward ones as a layer's
   row reads them and the recurrent ones sorted beside them; else both sorted into one
   list), its sweep at t_end, its spikes' recurrent B zeroed. */
SN_INLINE void sn_loop_back_start(long long b, long long j, sn_loop_back* s,
                                  unsigned char* slab, real* loop_b, SN_LOOP_BACKWARD_PARAMS) {
#if SN_DIRECT
    s->arr = SN_ROW_INPUTS(b * N + j, slab + SN_LOOP_STATE, (real)until, s->p);
    sn_arrival* own = (sn_arrival*)(slab + SN_LOOP_STATE + list_bytes);
    s->arr.n_loop = sn_loop_listed(b, j, own, 0, SN_LOOP_BACKWARD_NAMES);
    sn_sort(own, own + loop_slots + 1, s->arr.n_loop);
    s->arr.loop = own;
#else
    sn_arrival* list = SN_LOOP_LIST(slab);
    const long long m = n_in * k_in;
    const long long at = transposed ? j : j * n_in, stride = transposed ? N : 1;
    sn_params_of(params, N, j, s->p);
    long long n = sn_listed(list, pre + b * m, weight + at, delay + at, stride, n_in, k_in,
                            (real)until);
    n = sn_loop_listed(b, j, list, n, SN_LOOP_BACKWARD_NAMES);
    sn_sort(list, list + m + loop_slots + 1, n);
    sn_arrivals merged = {list, 0, 0, 0, 0, 0, 0, n, 0, 0};
    s->arr = merged;
#endif
    for (long long k = 0; k < k_out; ++k) loop_b[j * k_out + k] = 0;
    sn_adjoint a = sn_loop_adjoint(b, j, s->p, loop_b, SN_LOOP_BACKWARD_NAMES);
    real* before = SN_LOOP_BEFORE(slab);
    sn_sweep_start(&a, &s->arr, before, before + events * NS, &s->sweep);
}

/* Row j's sweep back to `down_to` (every event from there on), or to 0 and its last
   stretch (`finish`). */
SN_INLINE void sn_loop_back_to(long long b, long long j, sn_loop_back* s, unsigned char* slab,
                               real* loop_b, real down_to, int finish,
                               SN_LOOP_BACKWARD_PARAMS) {
    const sn_sweep* w = &s->sweep;
    real latest = w->ks >= 0 ? times[(b * N + j) * k_out + w->ks] : -SN_INF;
    if (w->ia >= 0) latest = fmax(latest, sn_arrival_time(&s->arr, w->ia));
    if (w->il >= 0) latest = fmax(latest, s->arr.loop[w->il].t);
    if (!finish && latest < down_to) return; /* (no event in the step) */
    real p[NP + NK + 1];
    for (int q = 0; q < NP + NK + 1; ++q) p[q] = s->p[q];
    sn_arrivals arr = s->arr;
    sn_adjoint a = sn_loop_adjoint(b, j, p, loop_b, SN_LOOP_BACKWARD_NAMES);
    real* before = SN_LOOP_BEFORE(slab);
    real* after = before + events * NS;
    real* cuts = after + events * NS;
    sn_neuron_backward(&a, &arr, before, after, cuts, &s->sweep, down_to);
    if (finish) sn_sweep_finish(&a, &s->sweep, after, cuts);
}

/* The step of time t, s·dt ≤ t < (s + 1)·dt as the forward's step ends place it. */
SN_INLINE long long sn_step_of(real t, real dt) {
    long long s = (long long)floor(t / dt);
    if ((real)s * dt > t) --s;
    else if ((real)(s + 1) * dt <= t) ++s;
    return s;
}

/* Row j's spikes marked in the bit words `spiked` by their steps. */
SN_INLINE void sn_loop_mark(long long r, unsigned int* spiked, SN_LOOP_BACKWARD_PARAMS) {
    const long long most = counts[r] < k_out ? counts[r] : k_out;
    for (long long k = 0; k < most; ++k) {
        long long at = sn_step_of(times[r * k_out + k], (real)step);
        SN_MARK(spiked + at / 32, 1u << (at % 32));
    }
}

/* Sample b's neurons' sweeps back to `down_to` (`finish`: to 0), then a barrier. */
#define SN_LOOP_BACK_TO(down_to, finish)                                                  \
    do {                                                                                  \
        for (long long j = SN_LANE; j < N; j += SN_LANES)                                 \
            sn_loop_back_to(b, j, SN_LOOP_STATE_OF(sn_loop_back, j),                      \
                            rows_at + j * row_bytes, loop_b, down_to, finish,             \
                            SN_LOOP_BACKWARD_NAMES);                                      \
        SN_BARRIER();                                                                     \
    } while (0)

/* Sample b's backward: its neurons' sweeps back from t_end, in step only where the layer
   spiked. A spike's B is complete once every event after its step is taken (its arrivals
   lie there), so for each step that holds a spike, from the last back, the sweeps run to
   the step's end, then through the step, a barrier after each; between such steps no
   B is read and the sweeps run on without one. `sample`: its scratch (a bit a step, set
   where the layer spiked; the layer's recurrent B [N, k_out]; then each row's slab);
   `alone`: one neuron a thread. */
SN_INLINE void sn_loop_backward_rows(long long b, unsigned char* sample, int alone,
                                     SN_LOOP_BACKWARD_PARAMS) {
    unsigned int* spiked = (unsigned int*)sample;
    const long long words = (n_steps + 31) / 32;
    real* loop_b = (real*)(sample + (words * 4 + 15) / 16 * 16);
    unsigned char* rows_at = sample + head_bytes;
    sn_loop_back own;
    for (long long w = SN_LANE; w < words; w += SN_LANES) spiked[w] = 0;
    SN_BARRIER();
    for (long long j = SN_LANE; j < N; j += SN_LANES) {
        sn_loop_back_start(b, j, SN_LOOP_STATE_OF(sn_loop_back, j), rows_at + j * row_bytes,
                           loop_b, SN_LOOP_BACKWARD_NAMES);
        sn_loop_mark(b * N + j, spiked, SN_LOOP_BACKWARD_NAMES);
    }
    SN_BARRIER();
    for (long long step_k = n_steps - 1; step_k >= 0; --step_k) {
        if (!((SN_FRESH(spiked + step_k / 32) >> (step_k % 32)) & 1u)) continue;
        SN_LOOP_BACK_TO((real)(step_k + 1) * (real)step, 0);
        SN_LOOP_BACK_TO((real)step_k * (real)step, 0);
    }
    SN_LOOP_BACK_TO(-SN_INF, 1);
}

SN_FN void sn_loop_backward_sample(long long b, unsigned char* sample,
                                   unsigned long long* logged, SN_LOOP_BACKWARD_PARAMS) {
    (void)logged;
    if (N <= SN_LANES) sn_loop_backward_rows(b, sample, 1, SN_LOOP_BACKWARD_NAMES);
    else sn_loop_backward_rows(b, sample, 0, SN_LOOP_BACKWARD_NAMES);
}

/* The entry points: in CUDA one block a sample of the launch ([row0, row0 + rows) of the
   B samples), its scratch `slab_bytes` of the launch's buffer; in C an OpenMP loop over
   the samples, each thread with its own scratch, the backward's over groups of samples
   (each group's in order on one thread: its gradient rows are its own). */
#if SN_CUDA
#define SN_SAMPLES_ENTRY(name, sample, PARAMS, NAMES)                                    \
    extern "C" __global__ void name(PARAMS) {                                            \
        __shared__ unsigned long long logged;                                            \
        const long long b = row0 + blockIdx.x;                                           \
        sample(b, scratch + (long long)blockIdx.x * slab_bytes, &logged, NAMES);         \
    }
#define SN_SAMPLE_GROUPS_ENTRY SN_SAMPLES_ENTRY
#else
#define SN_SAMPLES_ENTRY(name, sample, PARAMS, NAMES)                                    \
    void name(PARAMS) {                                                                  \
        SN_OMP_SAMPLES {                                                                 \
            unsigned char* own = (unsigned char*)calloc((size_t)slab_bytes + 1, 1);      \
            unsigned long long logged = 0;                                               \
            _Pragma("omp for schedule(dynamic, 1)")                                      \
            for (long long b = row0; b < row0 + rows; ++b) sample(b, own, &logged, NAMES); \
            free(own);                                                                   \
        }                                                                                \
    }
#define SN_SAMPLE_GROUPS_ENTRY(name, sample, PARAMS, NAMES)                              \
    void name(PARAMS) {                                                                  \
        SN_OMP_SAMPLES {                                                                 \
            unsigned char* own = (unsigned char*)calloc((size_t)slab_bytes + 1, 1);      \
            unsigned long long logged = 0;                                               \
            _Pragma("omp for schedule(static)")                                          \
            for (long long g = 0; g < groups; ++g)                                       \
                for (long long b = g; b < B; b += groups)                                \
                    if (b >= row0 && b < row0 + rows) sample(b, own, &logged, NAMES);    \
            free(own);                                                                   \
        }                                                                                \
    }
#endif

SN_SAMPLES_ENTRY(sn_events_loop_forward, sn_loop_forward_sample, SN_LOOP_FORWARD_PARAMS,
                 SN_LOOP_FORWARD_NAMES)
SN_SAMPLE_GROUPS_ENTRY(sn_events_loop_backward, sn_loop_backward_sample,
                       SN_LOOP_BACKWARD_PARAMS, SN_LOOP_BACKWARD_NAMES)
