/*
 * Uniform integer draws from a numpy bit generator, in C.
 *
 * Generator.integers(0, n, 32) costs ~8 us on this kind of machine, most of it argument
 * handling around a few nanoseconds of work; a replay sample at B=32 is ~25 us in all. Here
 * the draws come from the same bit generator (numpy's documented BitGenerator capsule) with
 * Lemire's multiply-and-reject method: exactly uniform on [0, n), no modulo bias. The
 * stream differs from Generator.integers' (which draws 32-bit words for small ranges), so a
 * seed gives other, equally uniform, draws. The caller holds the bit generator's lock.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "_native.h"
#include <stdint.h>

/* uniform_ints(capsule, n, out i64[B]): out[i] uniform on [0, n) */
static PyObject *uniform_ints(PyObject *self, PyObject *args) {
    PyObject *capsule, *o_out;
    long long n;
    if (!PyArg_ParseTuple(args, "OLO", &capsule, &n, &o_out)) return NULL;
    if (n < 1) return PyErr_Format(PyExc_ValueError, "n: expected >= 1, got %lld", n);
    bitgen_t *bg = (bitgen_t *)PyCapsule_GetPointer(capsule, "BitGenerator");
    if (bg == NULL) return NULL;
    Py_buffer out;
    if (PyObject_GetBuffer(o_out, &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) != 0) return NULL;
    if (out.itemsize != 8) {
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_TypeError, "out: expected int64");
        return NULL;
    }
    int64_t *o = (int64_t *)out.buf;
    Py_ssize_t B = out.len / 8;
    const uint64_t range = (uint64_t)n;
    const uint64_t threshold = (0 - range) % range;   /* 2^64 mod n: the draws to reject */
    for (Py_ssize_t i = 0; i < B; i++) {
        __uint128_t m = (__uint128_t)bg->next_uint64(bg->state) * range;
        while ((uint64_t)m < threshold) m = (__uint128_t)bg->next_uint64(bg->state) * range;
        o[i] = (int64_t)(m >> 64);
    }
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"uniform_ints", uniform_ints, METH_VARARGS, "uniform_ints(bit_generator.capsule, n, out): exact uniform draws on [0, n)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_draws", "uniform integer draws from a numpy bit generator", -1, methods};

PyMODINIT_FUNC PyInit__draws(void) { return PyModule_Create(&module); }
