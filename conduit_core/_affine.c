/*
 * The affine codec's encode for float32 -> uint8, quantise and verify in one pass, in C.
 *
 * numpy needs six passes for q = clip(rint((x - offset) * divisor)) and the check that
 * decoding q gives x back exactly (subtract, multiply, round, clip, cast, table lookup,
 * compare). Here each value is read once: the same float32 operations in the same order
 * (so the same q as numpy's), then the decode of q, the same operations as the codec's own
 * (the codec checks decode_u8 against its lookup table for all 256 values before it uses
 * this), must give x back exactly. Returns the index of the first value that does not
 * survive the round trip, or -1. Built with -ffp-contract=off (no fused multiply-add may
 * change a result) and -fno-trapping-math (so the clamps vectorise; no value changes).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "_native.h"
#include <stdint.h>

/* decode_u8(q u8[n], offset, df, dmul, out f32[n]): y = (dmul ? q * df : q / df) + offset, in float32:
 * the decode quantize_u8 checks with. The codec compares it with its own lookup table for all
 * 256 values, bit for bit, before it uses quantize_u8 (and so may pick df = 1/divisor, a
 * multiply, where that gives the same 256 values as the division). */
static PyObject *decode_u8(PyObject *self, PyObject *args) {
    PyObject *o_q, *o_out;
    float offset, df;
    int dmul;
    if (!PyArg_ParseTuple(args, "OfpfO", &o_q, &offset, &dmul, &df, &o_out)) return NULL;
    Py_buffer q, out;
    if (get_items(o_q, &q, 1, 0, "q") < 0) return NULL;
    if (get_items(o_out, &out, 4, 1, "out") < 0) { PyBuffer_Release(&q); return NULL; }
    if (out.len != q.len * 4) {
        PyBuffer_Release(&q); PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "out: expected one float32 per byte");
        return NULL;
    }
    const uint8_t *qv = (const uint8_t *)q.buf;
    float *o = (float *)out.buf;
    for (Py_ssize_t i = 0; i < q.len; i++) o[i] = (dmul ? (float)qv[i] * df : (float)qv[i] / df) + offset;
    PyBuffer_Release(&q); PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* The quantise-and-check loop: one branch-free loop per pair of formulas, so each vectorises
 * (x / s is not x * (1/s)); built for AVX2 and for the baseline, picked at load time.
 * Returns whether any value failed the round trip. */
__attribute__((target_clones("avx2", "default")))
static int quantise(const float *xv, uint8_t *o, Py_ssize_t n, float offset, int qmul, float qf, int dmul, float df) {
    const float magic = 12582912.0f;             /* 1.5 * 2^23: t + magic - magic = rint(t) for |t| < 2^22 */
    int any = 0;
#define QUANTISE(SCALED, DEC)                                                                   \
    for (Py_ssize_t i = 0; i < n; i++) {                                                       \
        float t = xv[i] - offset;                                                              \
        t = SCALED;                                                                            \
        t = t < -1.0f ? -1.0f : t;             /* clamping first changes no final q */         \
        t = t > 256.0f ? 256.0f : t;                                                           \
        float r = (t + magic) - magic;         /* round half to even, as rintf / np.rint */     \
        r = r >= 0.0f ? r : 0.0f;              /* NaN too: it cannot survive the check */       \
        r = r > 255.0f ? 255.0f : r;                                                           \
        any |= !((DEC) + offset == xv[i]);                                                     \
        o[i] = (uint8_t)(int32_t)r;                                                            \
    }
    if (qmul && dmul) { QUANTISE(t * qf, r * df) }
    else if (qmul) { QUANTISE(t * qf, r / df) }
    else if (dmul) { QUANTISE(t / qf, r * df) }
    else { QUANTISE(t / qf, r / df) }
#undef QUANTISE
    return any;
}

/* quantize_u8(x f32[n], offset, qmul, qf, dmul, df, out u8[n]) -> first inexact index or -1.
 * q = clip(rint(qmul ? (x - offset) * qf : (x - offset) / qf), 0, 255): numpy's operations, in
 * its order (the codec's divisor multiplies, its scale divides); then q must decode back to x
 * exactly, with decode_u8's arithmetic. */
static PyObject *quantize_u8(PyObject *self, PyObject *args) {
    PyObject *o_x, *o_out;
    float offset, qf, df;
    int qmul, dmul;
    if (!PyArg_ParseTuple(args, "OfpfpfO", &o_x, &offset, &qmul, &qf, &dmul, &df, &o_out)) return NULL;
    Py_buffer x, out;
    if (get_items(o_x, &x, 4, 0, "x") < 0) return NULL;
    if (get_items(o_out, &out, 1, 1, "out") < 0) { PyBuffer_Release(&x); return NULL; }
    Py_ssize_t n = x.len / 4;
    long long bad = -1;
    if (out.len != n) {
        PyBuffer_Release(&x); PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "out: expected one byte per value");
        return NULL;
    }
    const float *xv = (const float *)x.buf;
    uint8_t *o = (uint8_t *)out.buf;
    int any;
    Py_BEGIN_ALLOW_THREADS
    any = quantise(xv, o, n, offset, qmul, qf, dmul, df);
    if (any)
        for (Py_ssize_t i = 0; i < n; i++) {
            float y = (dmul ? (float)o[i] * df : (float)o[i] / df) + offset;
            if (!(y == xv[i])) { bad = (long long)i; break; }
        }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&x); PyBuffer_Release(&out);
    return PyLong_FromLongLong(bad);
}

static PyMethodDef methods[] = {
    {"quantize_u8", quantize_u8, METH_VARARGS,
     "quantize_u8(x, offset, qmul, qf, dmul, df, out): affine float32 -> uint8, first inexact index or -1"},
    {"decode_u8", decode_u8, METH_VARARGS, "decode_u8(q, offset, dmul, df, out): the decode quantize_u8 checks with"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_affine", "the affine codec's encode in one pass", -1, methods};

PyMODINIT_FUNC PyInit__affine(void) { return PyModule_Create(&module); }
