/*
 * What Conduit's C helpers share: reading a Python buffer with a checked item size, and numpy's
 * bit generator interface (so draws come from the caller's own numpy Generator stream).
 * Included by the helpers' .c files; static inline, so each module keeps its own copy.
 */
#ifndef CONDUIT_NATIVE_H
#define CONDUIT_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* A C-contiguous buffer of `itemsize`-byte items (writable if asked); -1 with TypeError otherwise. */
static inline int get_items(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, int writable, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) != 0) return -1;
    if (view->itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: expected a contiguous buffer of %zd-byte items, got %zd-byte items",
                     what, itemsize, view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* numpy/random/bitgen.h (stable since numpy 1.17): a Generator's bit_generator.capsule holds one,
 * named "BitGenerator". The caller holds the bit generator's lock while drawing. */
typedef struct {
    void *state;
    uint64_t (*next_uint64)(void *st);
    uint32_t (*next_uint32)(void *st);
    double (*next_double)(void *st);
    uint64_t (*next_raw)(void *st);
} bitgen_t;

#endif
