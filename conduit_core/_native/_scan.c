/*
 * Whether a float array holds only finite values, in C.
 *
 * Every float column of every insert is checked (NaN and inf are refused with the row named).
 * numpy's route is a sum under np.errstate (a context manager per column, ~3 us) or an
 * isfinite pass that allocates a bool array; here one read of the bits: a value is non-finite
 * exactly when its exponent bits are all ones. Vectorises (integer ops), GIL released.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define SCAN(TYPE, MASK)                                                    \
    {                                                                       \
        const TYPE *v = (const TYPE *)view.buf;                             \
        Py_ssize_t n = view.len / (Py_ssize_t)sizeof(TYPE);                 \
        TYPE acc = 0;                                                       \
        for (Py_ssize_t i = 0; i < n; i++) acc |= (TYPE)((v[i] & MASK) == MASK); \
        bad = acc != 0;                                                     \
    }

/* all_finite(array of float16/float32/float64, C-contiguous) -> bool */
static PyObject *all_finite(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) return NULL;
    const char *f = view.format ? view.format : "B";
    if (f[0] == '<' || f[0] == '=' || f[0] == '@') f++;
    int bad = 0, ok_format = 1;
    Py_BEGIN_ALLOW_THREADS
    if (f[0] == 'f' && view.itemsize == 4) SCAN(uint32_t, 0x7f800000u)
    else if (f[0] == 'd' && view.itemsize == 8) SCAN(uint64_t, 0x7ff0000000000000ull)
    else if (f[0] == 'e' && view.itemsize == 2) SCAN(uint16_t, 0x7c00u)
    else ok_format = 0;
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (!ok_format) {
        PyErr_Format(PyExc_TypeError, "all_finite: expected float16, float32 or float64, got format '%s'", f);
        return NULL;
    }
    return PyBool_FromLong(!bad);
}

static PyMethodDef methods[] = {
    {"all_finite", all_finite, METH_O, "all_finite(float array): True when no value is NaN or infinite"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", "finite-value scans of float arrays", -1, methods};

PyMODINIT_FUNC PyInit__scan(void) { return PyModule_Create(&module); }
