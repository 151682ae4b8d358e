/*
 * Array-backed binary sum and min trees for prioritized replay, in C.
 *
 * The trees are numpy float64 arrays owned by Python (so state dicts and tests see
 * them); this module only walks them. Layout: node 1 is the root, node i has children
 * 2i and 2i+1, leaves live at [size, 2*size). A vectorized numpy descent needs ~20
 * rounds of numpy calls per batch for 1M items; here a batch of B samples or updates
 * costs B * log2(size) pointer steps, with the GIL released.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "_native.h"
#include <math.h>
#include <string.h>
#include <stdint.h>

/* A C-contiguous buffer whose format is one of `fmts` (ignoring a byte-order prefix), 8-byte items. */
static int get_buf(PyObject *obj, Py_buffer *view, const char *fmts, int writable) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) != 0) return -1;
    const char *f = view->format ? view->format : "B";
    if (f[0] == '<' || f[0] == '=' || f[0] == '@') f++;
    if (view->itemsize != 8 || f[0] == '\0' || f[1] != '\0' || strchr(fmts, f[0]) == NULL) {
        PyErr_Format(PyExc_TypeError, "expected a contiguous 8-byte buffer of format '%s', got '%s'",
                     fmts, view->format ? view->format : "?");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* The smaller of a and b ignoring zeros (the min tree keeps the smallest positive priority;
 * 0 means no item below, so a fresh tree of zero pages needs no initialisation). */
static inline double min_positive(double a, double b) {
    if (a == 0.0) return b;
    if (b == 0.0) return a;
    return a < b ? a : b;
}

/* Set leaf i to v (0 = not sampleable) and fix the sums and minimums of its ancestors. */
static void set_leaf(double *sum, double *mn, Py_ssize_t size, long long i, double v) {
    Py_ssize_t node = (Py_ssize_t)(i + size);
    sum[node] = v;
    mn[node] = v > 0.0 ? v : 0.0;
    for (node >>= 1; node >= 1; node >>= 1) {
        sum[node] = sum[2 * node] + sum[2 * node + 1];
        mn[node] = min_positive(mn[2 * node], mn[2 * node + 1]);
    }
}

/* The leaf node holding prefix sum v: go left when v falls inside the left subtree, or
 * when the right subtree is empty (rounding), so a zero-priority leaf is never returned.
 * Every search runs batched now (descend_many, which finds these leaves bit for bit); this
 * one-walk form is its definition, and the Python reference's. */
__attribute__((unused))
static Py_ssize_t descend(const double *sum, Py_ssize_t size, double v) {
    Py_ssize_t node = 1;
    while (node < size) {
        double left = sum[2 * node], right = sum[2 * node + 1];
        if ((v < left && left > 0.0) || right <= 0.0) node = 2 * node;
        else { v -= left; node = 2 * node + 1; }
    }
    return node;
}

/* Batched walks. A walk down (or up) a tree of 1M leaves is ~20 dependent loads, most of them
 * cache misses at the lower levels, so B walks one after another wait B * 20 times for memory.
 * These take B walks one level at a time: the B loads of a level are independent, so the memory
 * system serves them together (and the next level's are prefetched). The values are the one-walk
 * functions' (the same comparisons and sums, in the same order per walk). */
#define UNIFORMS_ON_STACK 1024   /* sample_windows' uniforms drawn here: a batch of 256 with redraws */
#define WALKS 64   /* walks in flight at once: enough to cover the memory latency, on the stack */

/* One level of descend(): which child of a node whose children hold left and right (0 = left,
 * 1 = right), v made the remainder. The same comparison and subtraction as descend(). */
static inline int choose(double *v, double left, double right) {
    if ((*v < left && left > 0.0) || right <= 0.0) return 0;
    *v -= left;
    return 1;
}

/* descend() for v[0..n), into node[0..n); v is changed (the remainders).
 *
 * Below the top levels a walk takes three levels per memory load: a node's 8 descendants three
 * levels down sit side by side (nodes 8a .. 8a+7, one 64-byte line), and the two levels between
 * are their pairwise sums, which is exactly what the tree stores there (every write path sets a
 * node to left + right, so recomputing them in the same order gives the same doubles). The
 * comparisons are descend()'s, so the leaves found are bit for bit the same; the dependent
 * cache misses per walk drop from one per level to one per three. */
static void descend_many(const double *sum, Py_ssize_t size, double *v, Py_ssize_t *node, Py_ssize_t n) {
    int levels = 0;   /* size is a power of two: every leaf at depth `levels` */
    for (Py_ssize_t s = size; s > 1; s >>= 1) levels++;
    int single = levels % 3;
    for (Py_ssize_t k = 0; k < n; k++) node[k] = 1;
    for (int d = 0; d < single; d++) {   /* the top one or two levels, one at a time */
        for (Py_ssize_t k = 0; k < n; k++) {
            Py_ssize_t at = node[k];
            at = 2 * at + choose(&v[k], sum[2 * at], sum[2 * at + 1]);
            node[k] = at;
            if (d + 1 < single) __builtin_prefetch(&sum[2 * at]);
            else if (single < levels) __builtin_prefetch(&sum[8 * at]);
        }
    }
    for (int d = single; d < levels; d += 3) {
        int last = d + 3 >= levels;
        for (Py_ssize_t k = 0; k < n; k++) {
            Py_ssize_t at = node[k];
            const double *c = &sum[8 * at];
            double s2[4] = {c[0] + c[1], c[2] + c[3], c[4] + c[5], c[6] + c[7]};
            int b1 = choose(&v[k], s2[0] + s2[1], s2[2] + s2[3]);
            int i2 = 2 * b1 + choose(&v[k], s2[2 * b1], s2[2 * b1 + 1]);
            at = 8 * at + 2 * i2 + choose(&v[k], c[2 * i2], c[2 * i2 + 1]);
            node[k] = at;
            if (!last) __builtin_prefetch(&sum[8 * at]);
        }
    }
}

/* set_leaf() for leaves i[0..n) (in order: a later duplicate wins), then their ancestors one level
 * at a time. Each ancestor ends as the sum (and positive minimum) of its children's final values,
 * which is what the one-by-one walks leave too. */
static void set_leaves_many(double *sum, double *mn, Py_ssize_t size, const long long *i, const double *v,
                            Py_ssize_t n, Py_ssize_t *node) {
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t leaf = (Py_ssize_t)(i[k] + size);
        sum[leaf] = v[k];
        mn[leaf] = v[k] > 0.0 ? v[k] : 0.0;
        node[k] = leaf >> 1;
        __builtin_prefetch(&sum[node[k] & ~(Py_ssize_t)1]);
        __builtin_prefetch(&mn[node[k] & ~(Py_ssize_t)1]);
    }
    for (Py_ssize_t level = size >> 1; level >= 1; level >>= 1) {
        for (Py_ssize_t k = 0; k < n; k++) {
            Py_ssize_t at = node[k];
            sum[at] = sum[2 * at] + sum[2 * at + 1];
            mn[at] = min_positive(mn[2 * at], mn[2 * at + 1]);
            node[k] = at >> 1;
            __builtin_prefetch(&sum[node[k] & ~(Py_ssize_t)1]);
            __builtin_prefetch(&mn[node[k] & ~(Py_ssize_t)1]);
        }
    }}

/* update(sums, mins, size, idx:int64[n], values:float64[n]) */
static PyObject *update(PyObject *self, PyObject *args) {
    PyObject *o_sum, *o_min, *o_idx, *o_val;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "OOnOO", &o_sum, &o_min, &size, &o_idx, &o_val)) return NULL;
    Py_buffer bs, bm, bi, bv;
    if (get_buf(o_sum, &bs, "d", 1)) return NULL;
    if (get_buf(o_min, &bm, "d", 1)) { PyBuffer_Release(&bs); return NULL; }
    if (get_buf(o_idx, &bi, "ql", 0)) {
        PyBuffer_Release(&bs); PyBuffer_Release(&bm); return NULL;
    }
    if (get_buf(o_val, &bv, "d", 0)) { PyBuffer_Release(&bs); PyBuffer_Release(&bm); PyBuffer_Release(&bi); return NULL; }
    double *sum = (double *)bs.buf, *mn = (double *)bm.buf;
    const long long *idx = (const long long *)bi.buf;
    const double *val = (const double *)bv.buf;
    Py_ssize_t n = bi.len / (Py_ssize_t)sizeof(long long);
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < n; k++) {
        long long i = idx[k];
        if (i < 0 || i >= size) { bad = 1; break; }
        set_leaf(sum, mn, size, i, val[k]);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&bs); PyBuffer_Release(&bm); PyBuffer_Release(&bi); PyBuffer_Release(&bv);
    if (bad) { PyErr_SetString(PyExc_IndexError, "priority index out of range"); return NULL; }
    Py_RETURN_NONE;
}

/* Leaves [lo, hi) set to v, then their ancestors one level at a time (each once, not once per leaf):
 * every ancestor ends as the sum (and positive minimum) of its children's final values, as
 * set_leaf() one by one leaves it. */
static void set_leaf_run(double *sum, double *mn, Py_ssize_t size, Py_ssize_t lo, Py_ssize_t hi, double v) {
    if (hi <= lo) return;
    double m = v > 0.0 ? v : 0.0;
    lo += size; hi += size - 1;          /* nodes, inclusive */
    for (Py_ssize_t at = lo; at <= hi; at++) { sum[at] = v; mn[at] = m; }
    for (lo >>= 1, hi >>= 1; lo >= 1; lo >>= 1, hi >>= 1) {
        for (Py_ssize_t at = lo; at <= hi; at++) {
            sum[at] = sum[2 * at] + sum[2 * at + 1];
            mn[at] = min_positive(mn[2 * at], mn[2 * at + 1]);
        }
    }
}

/* update_run(sums, mins, size, start, n, capacity, value): slots start .. start+n (mod capacity)
 * set to value (an insert at max priority), one native call instead of index and value arrays. */
static PyObject *update_run(PyObject *self, PyObject *args) {
    PyObject *o_sum, *o_min;
    Py_ssize_t size, start, n, capacity;
    double v;
    if (!PyArg_ParseTuple(args, "OOnnnnd", &o_sum, &o_min, &size, &start, &n, &capacity, &v)) return NULL;
    if (capacity <= 0 || capacity > size || start < 0 || start >= capacity || n < 0 || n > capacity) {
        PyErr_Format(PyExc_IndexError, "priority run out of range: start %zd, n %zd, capacity %zd, leaves %zd",
                     start, n, capacity, size);
        return NULL;
    }
    Py_buffer bs, bm;
    if (get_buf(o_sum, &bs, "d", 1)) return NULL;
    if (get_buf(o_min, &bm, "d", 1)) { PyBuffer_Release(&bs); return NULL; }
    if (bs.len < (Py_ssize_t)(2 * size * sizeof(double)) || bm.len < (Py_ssize_t)(2 * size * sizeof(double))) {
        PyBuffer_Release(&bs); PyBuffer_Release(&bm);
        PyErr_SetString(PyExc_ValueError, "priority trees shorter than 2 * leaves");
        return NULL;
    }
    double *sum = (double *)bs.buf, *mn = (double *)bm.buf;
    Py_ssize_t first = n < capacity - start ? n : capacity - start;
    set_leaf_run(sum, mn, size, start, start + first, v);
    set_leaf_run(sum, mn, size, 0, n - first, v);     /* the wrapped part, if any */
    PyBuffer_Release(&bs); PyBuffer_Release(&bm);
    Py_RETURN_NONE;
}

/* find(sums, size, values:float64[n], out:int64[n]) -- prefix-sum search, never a zero leaf */
static PyObject *find(PyObject *self, PyObject *args) {
    PyObject *o_sum, *o_val, *o_out;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "OnOO", &o_sum, &size, &o_val, &o_out)) return NULL;
    Py_buffer bs, bv, bo;
    if (get_buf(o_sum, &bs, "d", 0)) return NULL;
    if (get_buf(o_val, &bv, "d", 0)) { PyBuffer_Release(&bs); return NULL; }
    if (get_buf(o_out, &bo, "ql", 1)) { PyBuffer_Release(&bs); PyBuffer_Release(&bv); return NULL; }
    const double *sum = (const double *)bs.buf;
    const double *val = (const double *)bv.buf;
    long long *out = (long long *)bo.buf;
    Py_ssize_t n = bv.len / (Py_ssize_t)sizeof(double);
    Py_BEGIN_ALLOW_THREADS
    double v[WALKS];
    Py_ssize_t node[WALKS];
    for (Py_ssize_t k0 = 0; k0 < n; k0 += WALKS) {
        Py_ssize_t c = n - k0 < WALKS ? n - k0 : WALKS;
        memcpy(v, val + k0, (size_t)c * sizeof(double));
        descend_many(sum, size, v, node, c);
        for (Py_ssize_t j = 0; j < c; j++) out[k0 + j] = (long long)(node[j] - size);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&bs); PyBuffer_Release(&bv); PyBuffer_Release(&bo);
    Py_RETURN_NONE;
}

/* A C-contiguous buffer with 1-byte (bool/uint8) or 4-byte float items. */
static int get_any(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, int writable) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) != 0) return -1;
    if (view->itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "expected %zd-byte items, got %zd", itemsize, view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* The n-step walk from slot `start`, up to n steps: follow the episode links, stopping at a
 * done step, a missing successor, or one overwritten since (seq[next] != next_seq[cur]), and
 * sum gamma^k * r. Writes the last slot and the steps taken; returns the discounted return.
 * The one definition both nstep() and sample_windows() use. */
static double walk(const long long *seq, const long long *next, const float *rew, const unsigned char *term,
                   const unsigned char *trunc, long long cap, long long start, long long n, double gamma,
                   long long *last, long long *steps) {
    long long cur = start, k = 1;
    double r = rew[cur];
    while (k < n && !term[cur] && !trunc[cur]) {
        long long ns = next[cur];
        if (ns < 0) break;
        long long nslot = ns % cap;
        if (seq[nslot] != ns) break;
        r += pow(gamma, (double)k) * (double)rew[nslot];
        cur = nslot;
        k++;
    }
    *last = cur;
    *steps = k;
    return r;
}

/*
 * nstep(seq, next_seq, reward:f32, term:u8, trunc:u8, capacity, slots, n, gamma,
 *       out_return:f64, out_last:i64, out_steps:i64)
 * For each start slot, follow the episode links up to n steps (stopping at a done step,
 * a missing successor, or one overwritten since: seq[next] != next_seq[cur]) and sum
 * gamma^k * r. Mirrors ExperienceBuffer._n_step_numpy exactly.
 */
static PyObject *nstep(PyObject *self, PyObject *args) {
    PyObject *o_seq, *o_next, *o_rew, *o_term, *o_trunc, *o_slots, *o_n, *o_ret, *o_last, *o_steps;
    Py_ssize_t cap;
    double gamma;
    if (!PyArg_ParseTuple(args, "OOOOOnOOdOOO", &o_seq, &o_next, &o_rew, &o_term, &o_trunc, &cap, &o_slots,
                          &o_n, &gamma, &o_ret, &o_last, &o_steps)) return NULL;
    Py_buffer bseq, bnext, brew, bterm, btrunc, bslots, bn, bret, blast, bsteps;
    Py_buffer *all[10] = {&bseq, &bnext, &brew, &bterm, &btrunc, &bslots, &bn, &bret, &blast, &bsteps};
    int got = 0;
    if (get_buf(o_seq, &bseq, "ql", 0)) goto fail; got++;
    if (get_buf(o_next, &bnext, "ql", 0)) goto fail; got++;
    if (get_any(o_rew, &brew, 4, 0)) goto fail; got++;
    if (get_any(o_term, &bterm, 1, 0)) goto fail; got++;
    if (get_any(o_trunc, &btrunc, 1, 0)) goto fail; got++;
    if (get_buf(o_slots, &bslots, "ql", 0)) goto fail; got++;
    if (get_buf(o_n, &bn, "ql", 0)) goto fail; got++;
    if (get_buf(o_ret, &bret, "d", 1)) goto fail; got++;
    if (get_buf(o_last, &blast, "ql", 1)) goto fail; got++;
    if (get_buf(o_steps, &bsteps, "ql", 1)) goto fail; got++;
    {
        const long long *seq = bseq.buf, *next = bnext.buf, *slots = bslots.buf, *nn = bn.buf;
        const float *rew = brew.buf;
        const unsigned char *term = bterm.buf, *trunc = btrunc.buf;
        double *ret = bret.buf;
        long long *last = blast.buf, *steps = bsteps.buf;
        Py_ssize_t b = bslots.len / 8;
        int bad = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < b; i++) {
            if (slots[i] < 0 || slots[i] >= cap) { bad = 1; break; }
            ret[i] = walk(seq, next, rew, term, trunc, cap, slots[i], nn[i], gamma, &last[i], &steps[i]);
        }
        Py_END_ALLOW_THREADS
        for (int j = 0; j < got; j++) PyBuffer_Release(all[j]);
        if (bad) { PyErr_SetString(PyExc_IndexError, "slot out of range"); return NULL; }
        Py_RETURN_NONE;
    }
fail:
    for (int j = 0; j < got; j++) PyBuffer_Release(all[j]);
    return NULL;
}

/*
 * sample_windows(prioritized, sums, mins, tree_size, lo, count, cap, seq, next_seq, reward:f32, term:u8, trunc:u8,
 *                u:f64[m], n_lo, n_hi, gamma, beta, redraw, out_slot:i64[b], out_w:f32[b], out_ret:f64[b],
 *                out_last:i64[b], out_steps:i64[b], first) -> (next item, uniforms used)
 *
 * u may also be (bit_generator capsule, m): the m uniforms are then drawn here from that bit
 * generator, each its next_double, which is what Generator.random(m) fills its array with (the
 * same values, the generator left in the same state; the caller holds the bit generator's
 * lock, as Generator.random does). Drawn before anything else is read, as the caller's
 * rng.random(m) was. The array form serves the reference routes and the tests.
 *
 * Selection and the n-step walk in one pass, for items first.. of the output. Each attempt
 * takes one uniform for the item (prioritized: the prefix-sum search over the tree; else
 * slot (lo + floor(u * count)) % cap, drawn again if that row was removed) and, when
 * n_hi - n_lo > 1, one for its n in
 * [n_lo, n_hi). The walk follows the episode links as nstep() does. With `redraw`, an
 * attempt whose window is cut short (the episode ends, or its next step is not stored yet)
 * is dropped and the item drawn again, n included: RLlib's PrioritizedEpisodeReplayBuffer
 * rule, so no shortened window and no episode's last step under n >= 2 is ever delivered.
 * Stops when the output is full or fewer uniforms remain than one attempt needs; the caller
 * tops the uniforms up and calls again from the returned item.
 * Weights (prioritized): (p_i / p_min)^-beta, as select_weighted.
 */
static PyObject *sample_windows(PyObject *self, PyObject *args) {
    int prioritized, redraw;
    PyObject *o_sum, *o_min, *o_seq, *o_next, *o_rew, *o_term, *o_trunc, *o_u;
    PyObject *o_slot, *o_w, *o_ret, *o_last, *o_steps;
    Py_ssize_t tsize, cap, first;
    long long lo, count, n_lo, n_hi;
    double gamma, beta;
    if (!PyArg_ParseTuple(args, "pOOnLLnOOOOOOLLddpOOOOOn", &prioritized, &o_sum, &o_min, &tsize, &lo, &count,
                          &cap, &o_seq, &o_next, &o_rew, &o_term, &o_trunc, &o_u, &n_lo, &n_hi, &gamma, &beta,
                          &redraw, &o_slot, &o_w, &o_ret, &o_last, &o_steps, &first)) return NULL;
    Py_buffer bsum, bmin, bseq, bnext, brew, bterm, btrunc, bu, bslot, bw, bret, blast, bsteps;
    Py_buffer *all[13] = {&bsum, &bmin, &bseq, &bnext, &brew, &bterm, &btrunc, &bu, &bslot, &bw, &bret, &blast,
                          &bsteps};
    int got = 0;
    double u_drawn[UNIFORMS_ON_STACK], *u_heap = NULL;
    const double *u_from_bits = NULL;
    Py_ssize_t m_from_bits = 0;
    if (PyTuple_Check(o_u)) {   /* (capsule, m): the uniforms drawn here (see above) */
        PyObject *o_capsule;
        if (!PyArg_ParseTuple(o_u, "On", &o_capsule, &m_from_bits)) return NULL;
        bitgen_t *bg = (bitgen_t *)PyCapsule_GetPointer(o_capsule, "BitGenerator");
        if (bg == NULL) return NULL;
        if (m_from_bits < 0 || m_from_bits > PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(double)) {
            PyErr_SetString(PyExc_ValueError, "sample_windows: uniforms to draw out of range");
            return NULL;
        }
        double *to = u_drawn;
        if (m_from_bits > UNIFORMS_ON_STACK) {
            to = u_heap = PyMem_Malloc((size_t)m_from_bits * sizeof(double));
            if (u_heap == NULL) return PyErr_NoMemory();
        }
        for (Py_ssize_t k = 0; k < m_from_bits; k++) to[k] = bg->next_double(bg->state);
        u_from_bits = to;
    }
    if (get_buf(o_sum, &bsum, "d", 0)) goto fail; got++;
    if (get_buf(o_min, &bmin, "d", 0)) goto fail; got++;
    if (get_buf(o_seq, &bseq, "ql", 0)) goto fail; got++;
    if (get_buf(o_next, &bnext, "ql", 0)) goto fail; got++;
    if (get_any(o_rew, &brew, 4, 0)) goto fail; got++;
    if (get_any(o_term, &bterm, 1, 0)) goto fail; got++;
    if (get_any(o_trunc, &btrunc, 1, 0)) goto fail; got++;
    if (u_from_bits != NULL) {   /* (an empty view in its place: released like the others) */
        if (PyBuffer_FillInfo(&bu, NULL, (void *)u_from_bits, m_from_bits * (Py_ssize_t)sizeof(double), 1, PyBUF_SIMPLE))
            goto fail;
    } else if (get_buf(o_u, &bu, "d", 0)) goto fail;
    got++;
    if (get_buf(o_slot, &bslot, "ql", 1)) goto fail; got++;
    if (get_any(o_w, &bw, 4, 1)) goto fail; got++;
    if (get_buf(o_ret, &bret, "d", 1)) goto fail; got++;
    if (get_buf(o_last, &blast, "ql", 1)) goto fail; got++;
    if (get_buf(o_steps, &bsteps, "ql", 1)) goto fail; got++;
    {
        const double *sum = bsum.buf, *mn = bmin.buf, *u = bu.buf;
        const long long *seq = bseq.buf, *next = bnext.buf;
        const float *rew = brew.buf;
        const unsigned char *term = bterm.buf, *trunc = btrunc.buf;
        long long *oslot = bslot.buf, *olast = blast.buf, *osteps = bsteps.buf;
        float *ow = bw.buf;
        double *oret = bret.buf;
        Py_ssize_t b = bslot.len / 8, m = bu.len / 8, i = first, j = 0;
        Py_ssize_t need = (n_hi - n_lo > 1) ? 2 : 1;
        int bad = 0;
        if (cap <= 0 || count <= 0 || n_lo < 1 || n_hi <= n_lo || (prioritized && !(sum[1] > 0.0))
                || bseq.len / 8 < cap || bnext.len / 8 < cap || brew.len / 4 < cap || bterm.len < cap
                || btrunc.len < cap || bw.len / 4 < b || bret.len / 8 < b || blast.len / 8 < b
                || bsteps.len / 8 < b || first < 0 || first > b) {
            for (int k = 0; k < got; k++) PyBuffer_Release(all[k]);
            PyMem_Free(u_heap);
            PyErr_SetString(PyExc_ValueError, "sample_windows: inconsistent arguments");
            return NULL;
        }
        Py_BEGIN_ALLOW_THREADS
        double total = sum[1], pmin = mn[1];
        /* Prioritized attempts take `need` uniforms each whatever their outcome, so the tree
         * searches of the next attempts can run ahead, a chunk at a time, level by level
         * (descend_many: the same leaves as descend(), the loads of a level in flight together);
         * the attempts are then judged in order as before, and a search never judged is dropped
         * (a search changes nothing). */
        Py_ssize_t ahead[WALKS], chunk = 0, used = 0;
        double rem[WALKS];
        while (i < b && j + need <= m) {
            long long start;
            float w = 1.0f;
            if (prioritized) {
                if (used == chunk) {
                    Py_ssize_t want = (b - i) + ((b - i) >> 3) + 1;   /* the items left, and a few redraws */
                    chunk = want < WALKS ? want : WALKS;
                    if (chunk > (m - j) / need) chunk = (m - j) / need;
                    for (Py_ssize_t a = 0; a < chunk; a++) rem[a] = u[j + a * need] * total;
                    descend_many(sum, tsize, rem, ahead, chunk);
                    for (Py_ssize_t a = 0; a < chunk; a++) {   /* the windows' first steps, fetched together */
                        Py_ssize_t at = ahead[a] - tsize;
                        if (at >= 0 && at < cap) {
                            __builtin_prefetch(&seq[at]); __builtin_prefetch(&next[at]); __builtin_prefetch(&rew[at]);
                            __builtin_prefetch(&term[at]); __builtin_prefetch(&trunc[at]);
                        }
                    }
                    used = 0;
                }
                Py_ssize_t node = ahead[used++];
                j++;
                start = (long long)(node - tsize);
                w = beta == 0.0 ? 1.0f : (float)pow(sum[node] / pmin, -beta);
            } else {
                long long off = (long long)(u[j++] * (double)count);
                if (off >= count) off = count - 1;
                start = (lo + off) % cap;
                if (seq[start] != lo + off) {  /* a removed row (ExperienceBuffer.evict): draw again */
                    if (need == 2) j++;
                    continue;
                }
            }
            long long n = n_lo;
            if (need == 2) {
                n = n_lo + (long long)(u[j++] * (double)(n_hi - n_lo));
                if (n >= n_hi) n = n_hi - 1;
            }
            if (start < 0 || start >= cap) { bad = 1; break; }
            long long cur, k;
            double r = walk(seq, next, rew, term, trunc, cap, start, n, gamma, &cur, &k);
            if (redraw && k < n) continue;
            oslot[i] = start; ow[i] = w; oret[i] = r; olast[i] = cur; osteps[i] = k;
            i++;
        }
        Py_END_ALLOW_THREADS
        for (int k = 0; k < got; k++) PyBuffer_Release(all[k]);
        PyMem_Free(u_heap);
        if (bad) { PyErr_SetString(PyExc_IndexError, "sample_windows: slot out of range"); return NULL; }
        return Py_BuildValue("nn", i, j);
    }
fail:
    for (int k = 0; k < got; k++) PyBuffer_Release(all[k]);
    PyMem_Free(u_heap);
    return NULL;
}

/* select(sums, mins, size, values:f64[n], beta, out_idx:i64[n], out_w:f32[n])
 * Prefix-sum search plus importance weights w = (p_i / p_min)^-beta in one pass
 * (RLlib's (N P(i))^-beta / max_j (N P(j))^-beta, with P = p / total). */
static PyObject *select_weighted(PyObject *self, PyObject *args) {
    PyObject *o_sum, *o_min, *o_val, *o_idx, *o_w;
    Py_ssize_t size;
    double beta;
    if (!PyArg_ParseTuple(args, "OOnOdOO", &o_sum, &o_min, &size, &o_val, &beta, &o_idx, &o_w)) return NULL;
    Py_buffer bs, bm, bv, bi, bw;
    if (get_buf(o_sum, &bs, "d", 0)) return NULL;
    if (get_buf(o_min, &bm, "d", 0)) { PyBuffer_Release(&bs); return NULL; }
    if (get_buf(o_val, &bv, "d", 0)) { PyBuffer_Release(&bs); PyBuffer_Release(&bm); return NULL; }
    if (get_buf(o_idx, &bi, "ql", 1)) { PyBuffer_Release(&bs); PyBuffer_Release(&bm); PyBuffer_Release(&bv); return NULL; }
    if (get_any(o_w, &bw, 4, 1)) {
        PyBuffer_Release(&bs); PyBuffer_Release(&bm); PyBuffer_Release(&bv); PyBuffer_Release(&bi); return NULL;
    }
    const double *sum = bs.buf, *mn = bm.buf, *val = bv.buf;
    long long *out = bi.buf;
    float *w = bw.buf;
    Py_ssize_t n = bv.len / (Py_ssize_t)sizeof(double);
    Py_BEGIN_ALLOW_THREADS
    double pmin = mn[1], v[WALKS];
    Py_ssize_t node[WALKS];
    for (Py_ssize_t k0 = 0; k0 < n; k0 += WALKS) {
        Py_ssize_t c = n - k0 < WALKS ? n - k0 : WALKS;
        memcpy(v, val + k0, (size_t)c * sizeof(double));
        descend_many(sum, size, v, node, c);
        for (Py_ssize_t j = 0; j < c; j++) {
            out[k0 + j] = (long long)(node[j] - size);
            w[k0 + j] = beta == 0.0 ? 1.0f : (float)pow(sum[node[j]] / pmin, -beta);
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&bs); PyBuffer_Release(&bm); PyBuffer_Release(&bv); PyBuffer_Release(&bi); PyBuffer_Release(&bw);
    Py_RETURN_NONE;
}

/* draw_weighted(sums, mins, size, bit_generator capsule, total, stratified, beta, idx:i64[B], w:f32[B])
 * select_weighted with its prefix-sum targets drawn here, from the generator's own stream: the
 * values Generator.random(B) would give, turned into targets with numpy's operations (u * total, or
 * (u + k) * (total / B) stratified, capped below total), so the draws equal the numpy route's. The
 * caller holds the bit generator's lock. */
static PyObject *draw_weighted(PyObject *self, PyObject *args) {
    PyObject *o_sum, *o_min, *capsule, *o_idx, *o_w;
    Py_ssize_t size;
    double total, beta;
    int stratified;
    if (!PyArg_ParseTuple(args, "OOnOdpdOO", &o_sum, &o_min, &size, &capsule, &total, &stratified, &beta,
                          &o_idx, &o_w)) return NULL;
    bitgen_t *bg = (bitgen_t *)PyCapsule_GetPointer(capsule, "BitGenerator");
    if (bg == NULL) return NULL;
    Py_buffer bs, bm, bi, bw;
    if (get_buf(o_sum, &bs, "d", 0)) return NULL;
    if (get_buf(o_min, &bm, "d", 0)) { PyBuffer_Release(&bs); return NULL; }
    if (get_buf(o_idx, &bi, "ql", 1)) { PyBuffer_Release(&bs); PyBuffer_Release(&bm); return NULL; }
    if (get_any(o_w, &bw, 4, 1)) { PyBuffer_Release(&bs); PyBuffer_Release(&bm); PyBuffer_Release(&bi); return NULL; }
    const double *sum = bs.buf, *mn = bm.buf;
    long long *out = bi.buf;
    float *w = bw.buf;
    Py_ssize_t n = bi.len / 8;
    if (bw.len != n * 4 || bs.len < 2 * size * 8) {
        PyBuffer_Release(&bs); PyBuffer_Release(&bm); PyBuffer_Release(&bi); PyBuffer_Release(&bw);
        PyErr_SetString(PyExc_ValueError, "draw_weighted: idx and w must hold one value per draw, sums 2 * size");
        return NULL;
    }
    const double cap = nextafter(total, 0.0), step = n ? total / (double)n : 0.0, pmin = mn[1];
    double m[WALKS];
    Py_ssize_t node[WALKS];
    for (Py_ssize_t k0 = 0; k0 < n; k0 += WALKS) {
        Py_ssize_t c = n - k0 < WALKS ? n - k0 : WALKS;
        for (Py_ssize_t j = 0; j < c; j++) {   /* the generator's values in draw order */
            double u = bg->next_double(bg->state);
            m[j] = stratified ? (u + (double)(k0 + j)) * step : u * total;
            if (m[j] > cap) m[j] = cap;
        }
        descend_many(sum, size, m, node, c);
        for (Py_ssize_t j = 0; j < c; j++) {
            out[k0 + j] = (long long)(node[j] - size);
            w[k0 + j] = beta == 0.0 ? 1.0f : (float)pow(sum[node[j]] / pmin, -beta);
        }
    }
    PyBuffer_Release(&bs); PyBuffer_Release(&bm); PyBuffer_Release(&bi); PyBuffer_Release(&bw);
    Py_RETURN_NONE;
}

/* set_priorities(sums, mins, size, idx:i64[n], prios:f64[n], alpha, eps) -> max(p + eps)
 * Validates (finite, >= 0), applies (p + eps)^alpha and updates both trees; -1.0 when a
 * priority is invalid (nothing is changed then). */
static PyObject *set_priorities(PyObject *self, PyObject *args) {
    PyObject *o_sum, *o_min, *o_idx, *o_p;
    Py_ssize_t size;
    double alpha, eps;
    if (!PyArg_ParseTuple(args, "OOnOOdd", &o_sum, &o_min, &size, &o_idx, &o_p, &alpha, &eps)) return NULL;
    Py_buffer bs, bm, bi, bp;
    if (get_buf(o_sum, &bs, "d", 1)) return NULL;
    if (get_buf(o_min, &bm, "d", 1)) { PyBuffer_Release(&bs); return NULL; }
    if (get_buf(o_idx, &bi, "ql", 0)) { PyBuffer_Release(&bs); PyBuffer_Release(&bm); return NULL; }
    if (get_buf(o_p, &bp, "d", 0)) { PyBuffer_Release(&bs); PyBuffer_Release(&bm); PyBuffer_Release(&bi); return NULL; }
    double *sum = bs.buf, *mn = bm.buf;
    const long long *idx = bi.buf;
    const double *pr = bp.buf;
    Py_ssize_t n = bi.len / 8;
    double mx = 0.0;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < n; k++) {
        double p = pr[k];
        if (!(p >= 0.0) || !isfinite(p) || idx[k] < 0 || idx[k] >= size) { bad = 1; break; }
        if (p + eps > mx) mx = p + eps;
    }
    if (!bad) {
        double v[WALKS];
        Py_ssize_t node[WALKS];
        for (Py_ssize_t k0 = 0; k0 < n; k0 += WALKS) {
            Py_ssize_t c = n - k0 < WALKS ? n - k0 : WALKS;
            for (Py_ssize_t j = 0; j < c; j++)
                v[j] = alpha == 1.0 ? pr[k0 + j] + eps : pow(pr[k0 + j] + eps, alpha);
            set_leaves_many(sum, mn, size, idx + k0, v, c, node);
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&bs); PyBuffer_Release(&bm); PyBuffer_Release(&bi); PyBuffer_Release(&bp);
    return PyFloat_FromDouble(bad ? -1.0 : mx);
}

/* The priorities set_delivered reads: contiguous float64 or float32 ('d' or 'f'); else -1. */
static int get_floats(PyObject *obj, Py_buffer *view, int *f32) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) return -1;
    const char *f = view->format ? view->format : "B";
    if (f[0] == '<' || f[0] == '=' || f[0] == '@') f++;
    if (f[0] != '\0' && f[1] == '\0' && ((f[0] == 'd' && view->itemsize == 8) || (f[0] == 'f' && view->itemsize == 4))) {
        *f32 = f[0] == 'f';
        return 0;
    }
    PyBuffer_Release(view);
    PyErr_SetString(PyExc_TypeError, "expected contiguous float64 or float32 priorities");
    return -1;
}

/* Priority k as set_delivered uses it: with floor >= 0, |p| raised to at least floor (RLlib's
 * |TD error| floored at 1e-12; NaN stays NaN and is refused). */
static inline double priority_at(const void *pr, int f32, Py_ssize_t k, double floor) {
    double p = f32 ? (double)((const float *)pr)[k] : ((const double *)pr)[k];
    if (floor >= 0.0) {
        p = fabs(p);
        if (p < floor) p = floor;
    }
    return p;
}

/* set_delivered(sums, mins, size, seq_col, slots:i64[n], seqs:i64[n], prios:f64|f32[n], alpha, eps[, floor])
 *   -> (count, max) or None
 * A delivered batch's priority update in one call: rows whose slot no longer holds the seq they
 * were delivered with (overwritten since) are skipped; the others get (p + eps)^alpha, as
 * set_priorities gives them (with floor >= 0, p is max(|p|, floor) first). Returns how many were
 * set and the largest p + eps among them (0.0 if none); None, with nothing changed, when a slot
 * is out of range or a kept priority is not finite and >= 0 (or is 0 with eps = 0): the caller's
 * Python route then names the error. */
static PyObject *set_delivered(PyObject *self, PyObject *args) {
    PyObject *o_sum, *o_min, *o_col, *o_slots, *o_seqs, *o_p;
    Py_ssize_t size;
    double alpha, eps, floor = -1.0;
    int f32 = 0;
    if (!PyArg_ParseTuple(args, "OOnOOOOdd|d", &o_sum, &o_min, &size, &o_col, &o_slots, &o_seqs, &o_p, &alpha, &eps,
                          &floor))
        return NULL;
    Py_buffer b[6];
    int got = 0;
    PyObject *result = NULL;
    if (get_buf(o_sum, &b[0], "d", 1)) goto out; got++;
    if (get_buf(o_min, &b[1], "d", 1)) goto out; got++;
    if (get_buf(o_col, &b[2], "ql", 0)) goto out; got++;
    /* the caller's arrays: one that is not contiguous int64/float64 is declined, not an error */
    if (get_buf(o_slots, &b[3], "ql", 0)) goto decline; got++;
    if (get_buf(o_seqs, &b[4], "ql", 0)) goto decline; got++;
    if (get_floats(o_p, &b[5], &f32)) goto decline; got++;
    double *sum = b[0].buf, *mn = b[1].buf;
    const long long *col = b[2].buf, *slots = b[3].buf, *seqs = b[4].buf;
    const void *pr = b[5].buf;
    Py_ssize_t n = b[3].len / 8, cap = b[2].len / 8;
    if (b[4].len / 8 != n || b[5].len / b[5].itemsize != n || cap > size || b[0].len < 2 * size * 8) { result = Py_None; Py_INCREF(result); goto out; }
    long long idx[WALKS];
    double v[WALKS], mx = 0.0;
    Py_ssize_t node[WALKS], count = 0;
    for (Py_ssize_t k = 0; k < n; k++) {   /* every check before the first write */
        if (slots[k] < 0 || slots[k] >= cap) { result = Py_None; Py_INCREF(result); goto out; }
        if (col[slots[k]] != seqs[k]) continue;
        double p = priority_at(pr, f32, k, floor);
        if (!(p >= 0.0) || !isfinite(p) || (eps == 0.0 && p == 0.0)) { result = Py_None; Py_INCREF(result); goto out; }
        if (p + eps > mx) mx = p + eps;
    }
    Py_ssize_t c = 0;
    for (Py_ssize_t k = 0; k <= n; k++) {   /* the kept rows, in order, a chunk of walks at a time */
        if (k < n && col[slots[k]] == seqs[k]) {
            idx[c] = slots[k];
            double p = priority_at(pr, f32, k, floor);
            v[c++] = alpha == 1.0 ? p + eps : pow(p + eps, alpha);
        }
        if (c == WALKS || (k == n && c > 0)) {
            set_leaves_many(sum, mn, size, idx, v, c, node);
            count += c;
            c = 0;
        }
    }
    result = Py_BuildValue("(nd)", count, mx);
    goto out;
decline:
    PyErr_Clear();
    result = Py_None;
    Py_INCREF(result);
out:
    for (int k = 0; k < got; k++) PyBuffer_Release(&b[k]);
    return result;
}

static PyMethodDef methods[] = {
    {"set_delivered", set_delivered, METH_VARARGS, "a delivered batch's priority update: skip overwritten rows, check, set"},
    {"select_weighted", select_weighted, METH_VARARGS, "prefix-sum search and importance weights"},
    {"draw_weighted", draw_weighted, METH_VARARGS, "draw targets from a bit generator, then select_weighted"},
    {"set_priorities", set_priorities, METH_VARARGS, "validate, exponentiate and set priorities"},
    {"nstep", nstep, METH_VARARGS, "n-step returns following episode links"},
    {"sample_windows", sample_windows, METH_VARARGS, "select items and walk their n-step windows (redraw rule)"},
    {"update_run", update_run, METH_VARARGS, "update_run(sums, mins, size, start, n, capacity, value): a run of slots"},
    {"update", update, METH_VARARGS, "update(sums, mins, size, idx, values): set leaves and fix ancestors"},
    {"find", find, METH_VARARGS, "find(sums, size, values, out): prefix-sum search"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sumtree", "C sum/min tree walks", -1, methods};

PyMODINIT_FUNC PyInit__sumtree(void) { return PyModule_Create(&module); }
