/*
 * Frame stacks out of a frame pool, in one pass, in C.
 *
 * A frame pool stores each frame once; a stored stack is the id of its last frame. A
 * learner wants the k frames of each stack side by side, in the field's layout
 * (k last, as RLlib's Atari [84, 84, 4]; or k first), and often decoded to float32.
 * In numpy that is a take of B*k frames, a transposing copy and a decode pass, three
 * trips through memory with the transpose writing at a stride of k. Here each output
 * row is written once, in order, reading its k source frames side by side; the decode
 * is a 256-entry table the codec computed with its own decode, so it is exact by
 * construction for any uint8 codec. The GIL is released.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "_native.h"
#include <stdint.h>
#include <string.h>

#define MAX_K 64
#ifndef STREAM_MIN_BYTES
#define STREAM_MIN_BYTES (16 << 20)   /* below, the batch stays in cache for the learner: measured faster there */
#endif

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_KERNEL 1
/* One [P, 4] float32 stack from 4 frames, decoded as q * a + offset, or q / a + offset with
 * ``divide`` (each a float32 operation then an add: two roundings, what the caller checked
 * against the codec's table for all 256 values). 16 pixels a step: the 4 frames' bytes interleaved per pixel, widened to
 * float32, 64 output floats stored. The last P % 16 pixels go through the table. */
__attribute__((target("avx2")))
static void decode4_affine_avx2(const uint8_t *s0, const uint8_t *s1, const uint8_t *s2, const uint8_t *s3,
                                Py_ssize_t P, float a, int divide, float offset, const float *table, float *o,
                                int stream) {
    const __m256 va = _mm256_set1_ps(a), vo = _mm256_set1_ps(offset);
    Py_ssize_t p = 0;
    for (; p + 16 <= P; p += 16) {
        __m128i a0 = _mm_loadu_si128((const __m128i *)(s0 + p)), a1 = _mm_loadu_si128((const __m128i *)(s1 + p));
        __m128i a2 = _mm_loadu_si128((const __m128i *)(s2 + p)), a3 = _mm_loadu_si128((const __m128i *)(s3 + p));
        __m128i l01 = _mm_unpacklo_epi8(a0, a1), h01 = _mm_unpackhi_epi8(a0, a1);
        __m128i l23 = _mm_unpacklo_epi8(a2, a3), h23 = _mm_unpackhi_epi8(a2, a3);
        __m128i c[4] = {_mm_unpacklo_epi16(l01, l23), _mm_unpackhi_epi16(l01, l23),
                        _mm_unpacklo_epi16(h01, h23), _mm_unpackhi_epi16(h01, h23)};
        for (int j = 0; j < 4; j++) {   /* c[j]: pixels p+4j .. p+4j+3, their 4 frames each */
            __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(c[j]));
            __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(c[j], 8)));
            float *d = o + 4 * p + 16 * j;
            lo = divide ? _mm256_div_ps(lo, va) : _mm256_mul_ps(lo, va);
            hi = divide ? _mm256_div_ps(hi, va) : _mm256_mul_ps(hi, va);
            if (stream) {   /* 32-byte aligned: non-temporal, no read of the line before the write */
                _mm256_stream_ps(d, _mm256_add_ps(lo, vo));
                _mm256_stream_ps(d + 8, _mm256_add_ps(hi, vo));
            } else {
                _mm256_storeu_ps(d, _mm256_add_ps(lo, vo));
                _mm256_storeu_ps(d + 8, _mm256_add_ps(hi, vo));
            }
        }
    }
    for (; p < P; p++) {
        o[4 * p] = table[s0[p]]; o[4 * p + 1] = table[s1[p]];
        o[4 * p + 2] = table[s2[p]]; o[4 * p + 3] = table[s3[p]];
    }
}
#endif

/* gather_stacks(frames u8[F, P], last_ids i64[B], k, k_last, lut f32[256] or None, out u8|f32[B, ...]
 *               [, affine (a, divide, offset) or None]). ``affine``: the caller checked that q * a + offset
 * (q / a + offset if divide; float32 operations) equals lut[q] bit for bit for every q; with k = 4
 * in RLlib's layout the decode is then vectorised (AVX2, where the CPU has it). */
static PyObject *gather_stacks(PyObject *self, PyObject *args) {
    PyObject *o_frames, *o_ids, *o_lut, *o_out, *o_affine = Py_None;
    Py_ssize_t k;
    int k_last;
    if (!PyArg_ParseTuple(args, "OOnpOO|O", &o_frames, &o_ids, &k, &k_last, &o_lut, &o_out, &o_affine)) return NULL;
    float a = 0.0f, offset = 0.0f;
    int vectorised = 0, divide = 0;
    if (o_affine != Py_None) {
        double av, of;
        if (!PyArg_ParseTuple(o_affine, "dpd", &av, &divide, &of)) return NULL;
        a = (float)av; offset = (float)of;
#ifdef HAVE_AVX2_KERNEL
        vectorised = __builtin_cpu_supports("avx2");
#endif
    }
    if (k < 1 || k > MAX_K) return PyErr_Format(PyExc_ValueError, "k: expected 1..%d, got %zd", MAX_K, k);
    Py_buffer fr, ids, lut, out;
    int has_lut = o_lut != Py_None;
    if (get_items(o_frames, &fr, 1, 0, "frames") < 0) return NULL;
    if (get_items(o_ids, &ids, 8, 0, "last_ids") < 0) { PyBuffer_Release(&fr); return NULL; }
    if (has_lut && get_items(o_lut, &lut, 4, 0, "lut") < 0) { PyBuffer_Release(&fr); PyBuffer_Release(&ids); return NULL; }
    if (get_items(o_out, &out, has_lut ? 4 : 1, 1, "out") < 0) {
        PyBuffer_Release(&fr); PyBuffer_Release(&ids); if (has_lut) PyBuffer_Release(&lut); return NULL;
    }
    Py_ssize_t F = fr.ndim >= 1 ? fr.shape[0] : 0;
    Py_ssize_t P = F ? fr.len / F : 0;
    Py_ssize_t B = ids.len / 8;
    const char *err = NULL;
    if (F == 0 && B) err = "frames: an empty pool holds no stack";
    else if (has_lut && lut.len != 256 * 4) err = "lut: expected 256 float32 values";
    else if (out.len != B * k * P * (has_lut ? 4 : 1)) err = "out: expected B * k * frame size items";
    if (err) {
        PyErr_SetString(PyExc_ValueError, err);
    } else {
        const uint8_t *frames = (const uint8_t *)fr.buf;
        const int64_t *last = (const int64_t *)ids.buf;
        const float *table = has_lut ? (const float *)lut.buf : NULL;
        int stream = 0;
#ifdef HAVE_AVX2_KERNEL
        /* a batch larger than the caches is written with non-temporal stores (each line written
         * whole: no read for ownership first); every row's [P, 4] float32 block starts 32-byte aligned
         * when the output does and 16 * P bytes is a multiple of 32 */
        stream = vectorised && k_last && k == 4 && STREAM_MIN_BYTES >= 0 && out.len >= STREAM_MIN_BYTES
                 && ((uintptr_t)out.buf & 31) == 0 && (P % 2) == 0;
#endif
        Py_BEGIN_ALLOW_THREADS
        const uint8_t *src[MAX_K];
        for (Py_ssize_t b = 0; b < B; b++) {
            for (Py_ssize_t j = 0; j < k; j++) {
                int64_t id = (last[b] - k + 1 + j) % F;
                if (id < 0) id += F;
                src[j] = frames + id * P;
            }
            if (!k_last) {               /* [k, P]: k row copies (decoded or not) */
                for (Py_ssize_t j = 0; j < k; j++) {
                    if (table) {
                        float *o = (float *)out.buf + (b * k + j) * P;
                        for (Py_ssize_t p = 0; p < P; p++) o[p] = table[src[j][p]];
                    } else {
                        memcpy((uint8_t *)out.buf + (b * k + j) * P, src[j], P);
                    }
                }
            } else if (table && k == 4) { /* [P, 4], decoded: RLlib's Atari layout */
                float *o = (float *)out.buf + b * 4 * P;
                const uint8_t *s0 = src[0], *s1 = src[1], *s2 = src[2], *s3 = src[3];
#ifdef HAVE_AVX2_KERNEL
                if (vectorised) { decode4_affine_avx2(s0, s1, s2, s3, P, a, divide, offset, table, o, stream); continue; }
#endif
                for (Py_ssize_t p = 0; p < P; p++) {
                    o[4 * p] = table[s0[p]]; o[4 * p + 1] = table[s1[p]];
                    o[4 * p + 2] = table[s2[p]]; o[4 * p + 3] = table[s3[p]];
                }
            } else if (table) {
                float *o = (float *)out.buf + b * k * P;
                for (Py_ssize_t p = 0; p < P; p++)
                    for (Py_ssize_t j = 0; j < k; j++) o[k * p + j] = table[src[j][p]];
            } else if (k == 4) {          /* [P, 4] uint8: the bytes a GPU learner decodes itself */
                uint8_t *o = (uint8_t *)out.buf + b * 4 * P;
                const uint8_t *s0 = src[0], *s1 = src[1], *s2 = src[2], *s3 = src[3];
                for (Py_ssize_t p = 0; p < P; p++) {
                    o[4 * p] = s0[p]; o[4 * p + 1] = s1[p]; o[4 * p + 2] = s2[p]; o[4 * p + 3] = s3[p];
                }
            } else {
                uint8_t *o = (uint8_t *)out.buf + b * k * P;
                for (Py_ssize_t p = 0; p < P; p++)
                    for (Py_ssize_t j = 0; j < k; j++) o[k * p + j] = src[j][p];
            }
        }
#ifdef HAVE_AVX2_KERNEL
        if (stream) _mm_sfence();   /* the non-temporal stores visible before the batch is handed out */
#endif
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&fr); PyBuffer_Release(&ids); PyBuffer_Release(&out);
    if (has_lut) PyBuffer_Release(&lut);
    if (err) return NULL;
    Py_RETURN_NONE;
}

/* stack_links(flat u8[m, k*P], prev u8[k*P] or None, k, same bool[m], shift bool[m]):
 * how each stack relates to the one before it (stack i-1, or `prev` for i = 0): equal
 * (no new frame), shifted by one frame (one new frame), or neither. One memcmp each. */
static PyObject *stack_links(PyObject *self, PyObject *args) {
    PyObject *o_flat, *o_prev, *o_same, *o_shift;
    Py_ssize_t k;
    if (!PyArg_ParseTuple(args, "OOnOO", &o_flat, &o_prev, &k, &o_same, &o_shift)) return NULL;
    if (k < 1) return PyErr_Format(PyExc_ValueError, "k: expected >= 1, got %zd", k);
    Py_buffer fl, pv, sa, sh;
    int has_prev = o_prev != Py_None;
    if (get_items(o_flat, &fl, 1, 0, "flat") < 0) return NULL;
    if (has_prev && get_items(o_prev, &pv, 1, 0, "prev") < 0) { PyBuffer_Release(&fl); return NULL; }
    if (get_items(o_same, &sa, 1, 1, "same") < 0) { PyBuffer_Release(&fl); if (has_prev) PyBuffer_Release(&pv); return NULL; }
    if (get_items(o_shift, &sh, 1, 1, "shift") < 0) {
        PyBuffer_Release(&fl); if (has_prev) PyBuffer_Release(&pv); PyBuffer_Release(&sa); return NULL;
    }
    Py_ssize_t m = sa.len;
    Py_ssize_t S = m ? fl.len / m : 0;          /* bytes per stack: k * P */
    Py_ssize_t P = S / k;
    const char *err = NULL;
    if (sh.len != m || (m && (fl.len % m || S % k))) err = "flat must hold m stacks of k equal frames; same and shift m flags";
    else if (has_prev && pv.len != S) err = "prev must be one stack";
    if (err) {
        PyErr_SetString(PyExc_ValueError, err);
    } else {
        const uint8_t *f = (const uint8_t *)fl.buf;
        const uint8_t *prev = has_prev ? (const uint8_t *)pv.buf : NULL;
        uint8_t *same = (uint8_t *)sa.buf, *shift = (uint8_t *)sh.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < m; i++) {
            const uint8_t *before = i ? f + (i - 1) * S : prev;
            if (before == NULL) { same[i] = 0; shift[i] = 0; continue; }
            const uint8_t *cur = f + i * S;
            same[i] = memcmp(cur, before, (size_t)S) == 0;
            shift[i] = k == 1 ? 1 : memcmp(cur, before + P, (size_t)(S - P)) == 0;
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&fl); PyBuffer_Release(&sa); PyBuffer_Release(&sh);
    if (has_prev) PyBuffer_Release(&pv);
    if (err) return NULL;
    Py_RETURN_NONE;
}

/* Stacks in a field's own layout with the k frames last ([n, P, k] per field: RLlib's Atari
 * [84, 84, 4]), several fields interleaved row by row (stack i = field i % F, row i / F), read
 * where they are: no transposing copy into [m, k, P] first. */
typedef struct { Py_buffer col[8]; Py_ssize_t F, n, S; } KLastStacks;

static void klast_release(KLastStacks *st) { for (Py_ssize_t f = 0; f < st->F; f++) PyBuffer_Release(&st->col[f]); }

/* 0 or -1 (error set). Every column must be C-contiguous uint8 with the same byte count. */
static int klast_get(PyObject *o_cols, KLastStacks *st, Py_ssize_t n) {
    if (!PyTuple_Check(o_cols) || PyTuple_GET_SIZE(o_cols) < 1 || PyTuple_GET_SIZE(o_cols) > 8) {
        PyErr_SetString(PyExc_ValueError, "cols: expected a tuple of 1 to 8 arrays");
        return -1;
    }
    st->F = 0;
    for (Py_ssize_t f = 0; f < PyTuple_GET_SIZE(o_cols); f++) {
        if (get_items(PyTuple_GET_ITEM(o_cols, f), &st->col[f], 1, 0, "cols") < 0) { klast_release(st); return -1; }
        st->F = f + 1;
        if (st->col[f].len != st->col[0].len) {
            klast_release(st);
            PyErr_SetString(PyExc_ValueError, "cols: every field must hold the same number of bytes");
            return -1;
        }
    }
    st->n = n;
    st->S = n ? st->col[0].len / n : 0;
    if (n && st->col[0].len % n) {
        klast_release(st);
        PyErr_SetString(PyExc_ValueError, "cols: not n equal stacks");
        return -1;
    }
    return 0;
}

static inline const uint8_t *klast_stack(const KLastStacks *st, Py_ssize_t i) {
    return (const uint8_t *)st->col[i % st->F].buf + (i / st->F) * st->S;
}

/* frame j of stack cur (k last) equals frame j + d of stack before (k last if before_klast,
 * else [k, P]) for every j in [0, k - d) */
static int klast_match(const uint8_t *cur, const uint8_t *before, int before_klast, Py_ssize_t k, Py_ssize_t P,
                       Py_ssize_t d) {
    if (before_klast) {
        if (d == 0) return memcmp(cur, before, (size_t)(k * P)) == 0;
        if (k == 4 && d == 1) {   /* per pixel: bytes 0..2 of cur are bytes 1..3 of before */
            Py_ssize_t p = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
            /* two pixels per 64-bit word: byte j of (b >> 8) is byte j + 1 of b, so the mask keeps
             * cur's bytes 0..2 and 4..6 against before's 1..3 and 5..7; stops at the first
             * 256-pixel block that differs (a stack that is no shift is seldom one late) */
            while (p + 256 <= P) {
                uint64_t diff = 0;
                for (Py_ssize_t e = p + 256; p < e; p += 2) {
                    uint64_t c, b;
                    memcpy(&c, cur + 4 * p, 8);
                    memcpy(&b, before + 4 * p, 8);
                    diff |= (c ^ (b >> 8)) & 0x00FFFFFF00FFFFFFULL;
                }
                if (diff) return 0;
            }
#endif
            uint8_t diff = 0;
            for (; p < P; p++) {
                const uint8_t *c = cur + 4 * p, *b = before + 4 * p;
                diff |= (uint8_t)((c[0] ^ b[1]) | (c[1] ^ b[2]) | (c[2] ^ b[3]));
            }
            return diff == 0;
        }
        for (Py_ssize_t p = 0; p < P; p++)
            for (Py_ssize_t j = 0; j + d < k; j++)
                if (cur[p * k + j] != before[p * k + j + d]) return 0;
        return 1;
    }
    for (Py_ssize_t j = 0; j + d < k; j++) {
        const uint8_t *b = before + (j + d) * P;
        for (Py_ssize_t p = 0; p < P; p++)
            if (cur[p * k + j] != b[p]) return 0;
    }
    return 1;
}

/* stack_links_klast(cols, n, prev u8[k, P] or None, k, same bool[m], shift bool[m]): stack_links for
 * stacks in the k-last layout (see KLastStacks; m = n * len(cols)). */
static PyObject *stack_links_klast(PyObject *self, PyObject *args) {
    PyObject *o_cols, *o_prev, *o_same, *o_shift;
    Py_ssize_t n, k;
    if (!PyArg_ParseTuple(args, "OnOnOO", &o_cols, &n, &o_prev, &k, &o_same, &o_shift)) return NULL;
    if (k < 1 || n < 0) return PyErr_Format(PyExc_ValueError, "k: expected >= 1 (got %zd), n >= 0 (got %zd)", k, n);
    KLastStacks st;
    if (klast_get(o_cols, &st, n) < 0) return NULL;
    Py_buffer pv, sa, sh;
    int has_prev = o_prev != Py_None;
    if (has_prev && get_items(o_prev, &pv, 1, 0, "prev") < 0) { klast_release(&st); return NULL; }
    if (get_items(o_same, &sa, 1, 1, "same") < 0) { klast_release(&st); if (has_prev) PyBuffer_Release(&pv); return NULL; }
    if (get_items(o_shift, &sh, 1, 1, "shift") < 0) {
        klast_release(&st); if (has_prev) PyBuffer_Release(&pv); PyBuffer_Release(&sa); return NULL;
    }
    Py_ssize_t m = n * st.F, P = st.S / k;
    const char *err = NULL;
    if (sa.len != m || sh.len != m) err = "same and shift: one flag per stack";
    else if (st.S % k) err = "cols: a stack must hold k equal frames";
    else if (has_prev && pv.len != st.S) err = "prev must be one stack";
    if (err) {
        PyErr_SetString(PyExc_ValueError, err);
    } else {
        uint8_t *same = (uint8_t *)sa.buf, *shift = (uint8_t *)sh.buf;
        const uint8_t *prev = has_prev ? (const uint8_t *)pv.buf : NULL;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < m; i++) {
            const uint8_t *cur = klast_stack(&st, i);
            const uint8_t *before = i ? klast_stack(&st, i - 1) : prev;
            int before_klast = i > 0;
            if (before == NULL) { same[i] = 0; shift[i] = 0; continue; }
            same[i] = (uint8_t)klast_match(cur, before, before_klast, k, P, 0);
            shift[i] = k == 1 ? 1 : (uint8_t)klast_match(cur, before, before_klast, k, P, 1);
        }
        Py_END_ALLOW_THREADS
    }
    klast_release(&st); PyBuffer_Release(&sa); PyBuffer_Release(&sh);
    if (has_prev) PyBuffer_Release(&pv);
    if (err) return NULL;
    Py_RETURN_NONE;
}

/* copy_frames_klast(cols, n, k, stack i64[c], frame i64[c], pool u8[C, P], first_id): new frame t is
 * frame[t] of stack stack[t] (k last), written at pool row (first_id + t) % C. */
static PyObject *copy_frames_klast(PyObject *self, PyObject *args) {
    PyObject *o_cols, *o_stack, *o_frame, *o_pool;
    Py_ssize_t n, k, first;
    if (!PyArg_ParseTuple(args, "OnnOOOn", &o_cols, &n, &k, &o_stack, &o_frame, &o_pool, &first)) return NULL;
    if (k < 1 || n < 0 || first < 0) return PyErr_Format(PyExc_ValueError, "k, n, first_id: expected k >= 1, n >= 0, first_id >= 0");
    KLastStacks st;
    if (klast_get(o_cols, &st, n) < 0) return NULL;
    Py_buffer bs, bf, bp;
    if (get_items(o_stack, &bs, 8, 0, "stack") < 0) { klast_release(&st); return NULL; }
    if (get_items(o_frame, &bf, 8, 0, "frame") < 0) { klast_release(&st); PyBuffer_Release(&bs); return NULL; }
    if (get_items(o_pool, &bp, 1, 1, "pool") < 0) {
        klast_release(&st); PyBuffer_Release(&bs); PyBuffer_Release(&bf); return NULL;
    }
    Py_ssize_t c = bs.len / 8, m = n * st.F, P = st.S / k;
    Py_ssize_t C = (bp.ndim >= 1 && bp.shape) ? bp.shape[0] : 0;
    const int64_t *stack = (const int64_t *)bs.buf, *frame = (const int64_t *)bf.buf;
    const char *err = NULL;
    if (bf.len != bs.len) err = "stack and frame: one index pair per new frame";
    else if (st.S % k) err = "cols: a stack must hold k equal frames";
    else if (C <= 0 || bp.len != C * P) err = "pool: expected [C, P] frames of the stacks' frame size";
    for (Py_ssize_t t = 0; !err && t < c; t++)
        if (stack[t] < 0 || stack[t] >= m || frame[t] < 0 || frame[t] >= k) err = "stack/frame index out of range";
    if (err) {
        PyErr_SetString(PyExc_ValueError, err);
    } else {
        uint8_t *pool = (uint8_t *)bp.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t t = 0; t < c; t++) {
            const uint8_t *src = klast_stack(&st, stack[t]) + frame[t];
            uint8_t *dst = pool + ((first + t) % C) * P;
            for (Py_ssize_t p = 0; p < P; p++) dst[p] = src[p * k];
        }
        Py_END_ALLOW_THREADS
    }
    klast_release(&st); PyBuffer_Release(&bs); PyBuffer_Release(&bf); PyBuffer_Release(&bp);
    if (err) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"gather_stacks", gather_stacks, METH_VARARGS,
     "gather_stacks(frames, last_ids, k, k_last, lut, out[, affine]): stacks in the field's layout, decoded through "
     "lut if given (vectorised where affine = (scale, offset) reproduces lut)"},
    {"stack_links_klast", stack_links_klast, METH_VARARGS,
     "stack_links_klast(cols, n, prev, k, same, shift): stack_links for fields with the k frames last, in place"},
    {"copy_frames_klast", copy_frames_klast, METH_VARARGS,
     "copy_frames_klast(cols, n, k, stack, frame, pool, first_id): new frames out of k-last stacks into the pool"},
    {"stack_links", stack_links, METH_VARARGS,
     "stack_links(flat, prev, k, same, shift): each stack equal to / shifted by one frame from the one before"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_frames", "frame stacks out of a frame pool", -1, methods};

PyMODINIT_FUNC PyInit__frames(void) { return PyModule_Create(&module); }
