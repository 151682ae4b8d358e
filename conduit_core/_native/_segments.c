/*
 * Byte segments gathered into one output, in C.
 *
 * Variable-length rows (token sequences, log-probs) live back to back in one flat arena
 * per field; a batch is a list of (start, length) segments to copy out in order. numpy
 * can only do this through a per-byte index (repeat + arange: 8 bytes of index per byte
 * moved); here it is one memcpy per row, with the GIL released.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "_native.h"
#include <stdint.h>
#include <string.h>

/* gather_segments(src u8[], starts i64[n], lengths i64[n], out u8[sum lengths]) */
static PyObject *gather_segments(PyObject *self, PyObject *args) {
    PyObject *o_src, *o_starts, *o_lens, *o_out;
    if (!PyArg_ParseTuple(args, "OOOO", &o_src, &o_starts, &o_lens, &o_out)) return NULL;
    Py_buffer src, st, ln, out;
    if (get_items(o_src, &src, 1, 0, "src") < 0) return NULL;
    if (get_items(o_starts, &st, 8, 0, "starts") < 0) { PyBuffer_Release(&src); return NULL; }
    if (get_items(o_lens, &ln, 8, 0, "lengths") < 0) { PyBuffer_Release(&src); PyBuffer_Release(&st); return NULL; }
    if (get_items(o_out, &out, 1, 1, "out") < 0) {
        PyBuffer_Release(&src); PyBuffer_Release(&st); PyBuffer_Release(&ln); return NULL;
    }
    Py_ssize_t n = st.len / 8;
    const int64_t *starts = (const int64_t *)st.buf, *lens = (const int64_t *)ln.buf;
    const char *err = NULL;
    int64_t total = 0;
    if (ln.len != st.len) err = "starts and lengths differ in length";
    for (Py_ssize_t i = 0; !err && i < n; i++) {
        if (starts[i] < 0 || lens[i] < 0 || starts[i] > src.len || lens[i] > src.len - starts[i]) {
            err = "a segment lies outside src";   /* written so that no sum can overflow */
            break;
        }
        if (lens[i] > out.len - total) { err = "out must hold exactly the sum of the lengths"; break; }
        total += lens[i];
    }
    if (!err && total != out.len) err = "out must hold exactly the sum of the lengths";
    if (err) {
        PyErr_SetString(PyExc_ValueError, err);
    } else {
        Py_BEGIN_ALLOW_THREADS
        char *o = (char *)out.buf;
        const char *s = (const char *)src.buf;
        for (Py_ssize_t i = 0; i < n; i++) {
            memcpy(o, s + starts[i], (size_t)lens[i]);
            o += lens[i];
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&src); PyBuffer_Release(&st); PyBuffer_Release(&ln); PyBuffer_Release(&out);
    if (err) return NULL;
    Py_RETURN_NONE;
}

/* copy_segments(src u8[], src_starts i64[n], lengths i64[n], dst u8[], dst_starts i64[n]):
 * segment i of src copied to dst at dst_starts[i] (a gather and a scatter in one pass: rows of
 * one source, e.g. one storage unit's shared arena, put at their places in a batch's output). */
static PyObject *copy_segments(PyObject *self, PyObject *args) {
    PyObject *o_src, *o_ss, *o_ln, *o_dst, *o_ds;
    if (!PyArg_ParseTuple(args, "OOOOO", &o_src, &o_ss, &o_ln, &o_dst, &o_ds)) return NULL;
    Py_buffer src, ss, ln, dst, ds;
    if (get_items(o_src, &src, 1, 0, "src") < 0) return NULL;
    if (get_items(o_ss, &ss, 8, 0, "src_starts") < 0) { PyBuffer_Release(&src); return NULL; }
    if (get_items(o_ln, &ln, 8, 0, "lengths") < 0) { PyBuffer_Release(&src); PyBuffer_Release(&ss); return NULL; }
    if (get_items(o_dst, &dst, 1, 1, "dst") < 0) {
        PyBuffer_Release(&src); PyBuffer_Release(&ss); PyBuffer_Release(&ln); return NULL;
    }
    if (get_items(o_ds, &ds, 8, 0, "dst_starts") < 0) {
        PyBuffer_Release(&src); PyBuffer_Release(&ss); PyBuffer_Release(&ln); PyBuffer_Release(&dst); return NULL;
    }
    Py_ssize_t n = ss.len / 8;
    const int64_t *a = (const int64_t *)ss.buf, *l = (const int64_t *)ln.buf, *b = (const int64_t *)ds.buf;
    const char *err = NULL;
    if (ln.len != ss.len || ds.len != ss.len) err = "src_starts, lengths and dst_starts differ in length";
    for (Py_ssize_t i = 0; !err && i < n; i++) {
        if (a[i] < 0 || l[i] < 0 || a[i] > src.len || l[i] > src.len - a[i]) err = "a segment lies outside src";
        else if (b[i] < 0 || b[i] > dst.len || l[i] > dst.len - b[i]) err = "a segment lies outside dst";
    }
    if (err) {
        PyErr_SetString(PyExc_ValueError, err);
    } else {
        Py_BEGIN_ALLOW_THREADS
        char *d = (char *)dst.buf;
        const char *s = (const char *)src.buf;
        for (Py_ssize_t i = 0; i < n; i++) memcpy(d + b[i], s + a[i], (size_t)l[i]);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&src); PyBuffer_Release(&ss); PyBuffer_Release(&ln); PyBuffer_Release(&dst); PyBuffer_Release(&ds);
    if (err) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"gather_segments", gather_segments, METH_VARARGS,
     "gather_segments(src, starts, lengths, out): copy byte segments of src, in order, into out"},
    {"copy_segments", copy_segments, METH_VARARGS,
     "copy_segments(src, src_starts, lengths, dst, dst_starts): copy segment i of src to dst at dst_starts[i]"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_segments", "byte segments gathered into one output", -1, methods};

PyMODINIT_FUNC PyInit__segments(void) { return PyModule_Create(&module); }
