/*
 * A plain host ring's rows in and out, in C. In: an insert (check a batch against the spec, copy
 * its columns into the ring's columns, write the rows' metadata), in three calls or in one
 * (insert_rows, where the buffer has nothing to wait for or evict). Out: a batch's
 * rows gathered from every column into reused outputs in one call.
 *
 * Why: a CartPole rollout of 200 steps is ~9 KB; copying it takes well under a microsecond, but
 * checking and storing it field by field in Python took ~45 us (a dozen numpy calls per field,
 * each with its argument handling), 0.16x the insert rate of a plain numpy ring that checks
 * nothing (docs/benchmarks.md section 1). Each function here either does the whole job or
 * declines (check_columns returns None, copy_rows False) and the caller takes the Python route,
 * which gives the precise errors; so this file decides nothing the Python route does not, and
 * tests compare the two on the same inputs. numpy's C API reads an array's type, shape and data in
 * a few loads (the buffer protocol cost ~0.15 us per array, a dozen arrays per insert).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <stdint.h>
#include <string.h>

/* Copies of at least this many bytes release the GIL (below it, releasing costs more than it frees). */
#define RELEASE_GIL_FROM (256 << 10)

/* A non-finite value has every exponent bit set: one read of the bits. */
#define SCAN(TYPE, MASK)                                                    \
    {                                                                       \
        const TYPE *v = (const TYPE *)buf;                                  \
        TYPE acc = 0;                                                       \
        for (npy_intp i = 0; i < count; i++) acc |= (TYPE)((v[i] & MASK) == MASK); \
        bad = acc != 0;                                                     \
    }

static int all_finite_bits(const void *buf, npy_intp count, int itemsize) {
    int bad = 0;
    if (itemsize == 4) SCAN(uint32_t, 0x7f800000u)
    else if (itemsize == 8) SCAN(uint64_t, 0x7ff0000000000000ull)
    else if (itemsize == 2) SCAN(uint16_t, 0x7c00u)
    return !bad;
}

/* An exact ndarray, C-contiguous, aligned and in native byte order (writable if asked): what the
 * fast route reads. A byte-swapped array has the same type number, so it must be refused here:
 * copied as raw bytes its values would change. */
static inline PyArrayObject *plain_array(PyObject *obj, int writable) {
    if (obj == NULL || !PyArray_CheckExact(obj)) return NULL;
    PyArrayObject *a = (PyArrayObject *)obj;
    if (!PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISALIGNED(a) || !PyArray_ISNOTSWAPPED(a)) return NULL;
    if (writable && !PyArray_ISWRITEABLE(a)) return NULL;
    return a;
}

/* The batch's rows n, if ``batch`` (an exact dict) holds exactly the fields of ``fields`` as the
 * fast route reads them (see check_columns); -1: it does not (declined); -2: a Python error.
 * ``out`` (or NULL): a dict that gets each field's array. */
static npy_intp check_batch(PyObject *batch, PyObject *fields, PyObject *out) {
    Py_ssize_t nf = PyTuple_GET_SIZE(fields);
    if (!PyDict_CheckExact(batch) || PyDict_GET_SIZE(batch) != nf) return -1;
    npy_intp n = -1;
    for (Py_ssize_t i = 0; i < nf; i++) {
        PyObject *f = PyTuple_GET_ITEM(fields, i);
        PyObject *name = PyTuple_GET_ITEM(f, 0), *dtype = PyTuple_GET_ITEM(f, 1);
        PyObject *trailing = PyTuple_GET_ITEM(f, 2);
        int finite = (int)PyLong_AsLong(PyTuple_GET_ITEM(f, 3));
        PyArrayObject *a = plain_array(PyDict_GetItemWithError(batch, name), 0);
        if (a == NULL) goto decline;
        if ((PyObject *)PyArray_DESCR(a) != dtype      /* an unpickled array (Ray's transfer) carries a copy */
            && (!PyArray_DescrCheck(dtype) || !PyArray_EquivTypes(PyArray_DESCR(a), (PyArray_Descr *)dtype)))
            goto decline;
        Py_ssize_t nt = PyTuple_GET_SIZE(trailing);
        if (PyArray_NDIM(a) != nt + 1) goto decline;
        npy_intp *dims = PyArray_DIMS(a);
        for (Py_ssize_t d = 0; d < nt; d++)
            if (dims[d + 1] != PyLong_AsSsize_t(PyTuple_GET_ITEM(trailing, d))) goto decline;
        if (n < 0) n = dims[0];
        else if (dims[0] != n) goto decline;
        if (finite && PyArray_SIZE(a) && !all_finite_bits(PyArray_DATA(a), PyArray_SIZE(a), finite)) goto decline;
        if (out != NULL && PyDict_SetItem(out, name, (PyObject *)a) != 0) goto decline;
    }
    return n < 0 ? 0 : n;
decline:
    return PyErr_Occurred() ? -2 : -1;
}

/* check_columns(batch, fields) -> (n, columns) or None
 *
 * fields: tuple of (name, dtype, trailing shape tuple, finite itemsize or 0). The batch must be
 * an exact dict holding exactly those names, each an exact ndarray, C-contiguous, of that dtype
 * (numpy's builtin dtypes are singletons, compared first; an equal copy, as an array that came
 * through pickle carries, is accepted too), of shape [n, *trailing], one n
 * for all, and a field with a finite itemsize must hold finite values only. Anything else gives
 * None: the Python route then accepts it (a torch tensor, a strided view) or names the error. */
static PyObject *check_columns(PyObject *self, PyObject *args) {
    PyObject *batch, *fields;
    if (!PyArg_ParseTuple(args, "O!O!", &PyDict_Type, &batch, &PyTuple_Type, &fields)) return NULL;
    PyObject *out = PyDict_New();
    if (out == NULL) return NULL;
    npy_intp n = check_batch(batch, fields, out);
    if (n < 0) {
        Py_DECREF(out);
        if (n == -2) return NULL;
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(nN)", (Py_ssize_t)n, out);
}

/* Whether every column of ``columns`` (a dict) can be copied to rows slot, slot+1, ... (wrapping)
 * of its ring column in ``targets`` (tuple of (name, ring column)): a C-contiguous array of the
 * target's item type and row size with n rows, and n fits. 1: yes, with the arrays in src and dst
 * (room for 64); 0: no (declined); -1: a Python error. Reads only: nothing is copied. */
static int copy_plan(PyObject *columns, PyObject *targets, Py_ssize_t slot, Py_ssize_t n,
                     PyArrayObject **src, PyArrayObject **dst) {
    Py_ssize_t nt = PyTuple_GET_SIZE(targets);
    if (PyDict_GET_SIZE(columns) != nt || nt > 64 || n < 0) return 0;
    for (Py_ssize_t i = 0; i < nt; i++) {
        PyObject *t = PyTuple_GET_ITEM(targets, i);
        src[i] = plain_array(PyDict_GetItemWithError(columns, PyTuple_GET_ITEM(t, 0)), 0);
        dst[i] = plain_array(PyTuple_GET_ITEM(t, 1), 1);
        if (src[i] == NULL || dst[i] == NULL) goto decline;
        npy_intp cap = PyArray_NDIM(dst[i]) ? PyArray_DIM(dst[i], 0) : 0;
        if (cap <= 0 || n > cap || slot < 0 || slot >= cap || PyArray_NDIM(src[i]) < 1 || PyArray_DIM(src[i], 0) != n
            || PyArray_TYPE(src[i]) != PyArray_TYPE(dst[i]) || PyArray_ITEMSIZE(src[i]) != PyArray_ITEMSIZE(dst[i])
            || PyArray_NBYTES(src[i]) != n * (PyArray_NBYTES(dst[i]) / cap))
            goto decline;
    }
    return 1;
decline:
    return PyErr_Occurred() ? -1 : 0;
}

/* The copies copy_plan accepted. */
static void copy_planned(Py_ssize_t nt, PyArrayObject **src, PyArrayObject **dst, Py_ssize_t slot, Py_ssize_t n) {
    /* a large copy (Atari rollouts: megabytes) lets other threads run, as numpy's own copy does.
     * The sources are held here meanwhile: they came from a dict another thread may change while
     * the GIL is released (the ring's columns are held by the caller's targets tuple). */
    npy_intp total = 0;
    for (Py_ssize_t i = 0; i < nt; i++) total += PyArray_NBYTES(src[i]);
    int release = total >= RELEASE_GIL_FROM;
    if (release)
        for (Py_ssize_t i = 0; i < nt; i++) Py_INCREF(src[i]);
    PyThreadState *ts = release ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t i = 0; i < nt; i++) {
        npy_intp cap = PyArray_DIM(dst[i], 0), row = PyArray_NBYTES(dst[i]) / cap;
        npy_intp head = n < cap - slot ? n : cap - slot;
        char *d = PyArray_BYTES(dst[i]);
        const char *s = PyArray_BYTES(src[i]);
        /* memmove: a source may be a view of the ring's own column (overlapping rows) */
        memmove(d + slot * row, s, (size_t)(head * row));
        if (head < n) memmove(d, s + head * row, (size_t)((n - head) * row));
    }
    if (ts != NULL) PyEval_RestoreThread(ts);
    if (release)
        for (Py_ssize_t i = 0; i < nt; i++) Py_DECREF(src[i]);
}

/* copy_rows(columns, targets, slot, n) -> bool
 *
 * targets: tuple of (name, ring column); every column of ``columns`` (a dict) is copied to rows
 * slot, slot+1, ... of its ring column, wrapping at the column's length. False (nothing copied)
 * unless every source is a C-contiguous array of the target's item type and row size with n
 * rows, and n fits. */
static PyObject *copy_rows(PyObject *self, PyObject *args) {
    PyObject *columns, *targets;
    Py_ssize_t slot, n;
    if (!PyArg_ParseTuple(args, "O!O!nn", &PyDict_Type, &columns, &PyTuple_Type, &targets, &slot, &n)) return NULL;
    PyArrayObject *src[64], *dst[64];
    int ok = copy_plan(columns, targets, slot, n, src, dst);
    if (ok < 0) return NULL;
    if (!ok) Py_RETURN_FALSE;
    copy_planned(PyTuple_GET_SIZE(targets), src, dst, slot, n);
    Py_RETURN_TRUE;
}

/* The ring's metadata columns and a batch's done fields as write_meta reads them. */
typedef struct {
    int64_t *seq, *nxt, *ver, *src;
    npy_intp cap;
    Py_ssize_t nd;
    const unsigned char *last_step[8];   /* the last byte of row 0 of each done field */
    npy_intp per[8];
} meta_plan;

/* Fill ``plan`` from the 4 metadata arrays and the done arrays (``done``: nd of them). 1: ready;
 * 0: a done field is not n rows of 1-byte items (declined: Python's route); -1: a Python error
 * (the metadata arrays are not 4 writable int64 arrays of one length, or n does not fit). */
static int meta_plan_for(PyObject **objs, PyObject **done, Py_ssize_t nd, long long first, long long n, meta_plan *plan) {
    int64_t *m[4];
    npy_intp cap = -1;
    for (int i = 0; i < 4; i++) {
        PyArrayObject *a = plain_array(objs[i], 1);
        if (a == NULL || PyArray_TYPE(a) != NPY_INT64 || PyArray_NDIM(a) != 1 || (cap >= 0 && PyArray_DIM(a, 0) != cap)) {
            PyErr_SetString(PyExc_TypeError, "write_meta: ring metadata must be 4 writable int64 arrays of one length");
            return -1;
        }
        cap = PyArray_DIM(a, 0);
        m[i] = (int64_t *)PyArray_DATA(a);
    }
    if (n <= 0 || n > cap || first < 0) { PyErr_SetString(PyExc_ValueError, "write_meta: n out of range"); return -1; }
    if (nd > 8) return 0;
    for (Py_ssize_t k = 0; k < nd; k++) {   /* a done field that is not n rows of 1-byte items: Python's route */
        PyArrayObject *a = plain_array(done[k], 0);
        if (a == NULL || PyArray_ITEMSIZE(a) != 1 || PyArray_NDIM(a) < 1 || PyArray_DIM(a, 0) != n) return 0;
        plan->per[k] = PyArray_SIZE(a) / n;
        if (plan->per[k] < 1) return 0;
        plan->last_step[k] = (const unsigned char *)PyArray_DATA(a) + plan->per[k] - 1;
    }
    plan->seq = m[0]; plan->nxt = m[1]; plan->ver = m[2]; plan->src = m[3];
    plan->cap = cap;
    plan->nd = nd;
    return 1;
}

/* Write the metadata ``plan`` was made for; returns whether the last row is done. */
static int meta_write(const meta_plan *plan, long long first, long long n, long long source_id, long long version_id,
                      long long prev_tail) {
    int64_t *seq = plan->seq, *nxt = plan->nxt, *ver = plan->ver, *src = plan->src;
    npy_intp cap = plan->cap;
    npy_intp start = (npy_intp)(first % cap), head = n < cap - start ? (npy_intp)n : cap - start;
    for (int run = 0; run < 2; run++) {   /* the run up to the ring's end, then the one from slot 0 */
        npy_intp count = run ? (npy_intp)n - head : head;
        int64_t base = run ? first + head : first;
        int64_t *sq = seq + (run ? 0 : start), *nx = nxt + (run ? 0 : start);
        int64_t *vr = ver + (run ? 0 : start), *sr = src + (run ? 0 : start);
        for (npy_intp i = 0; i < count; i++) {
            sq[i] = base + i;
            nx[i] = base + i + 1;
            vr[i] = version_id;
            sr[i] = source_id;
        }
    }
    int last_done = 0;
    for (Py_ssize_t k = 0; k < plan->nd; k++) {   /* done rows end their episode: no successor */
        const unsigned char *step = plan->last_step[k];
        npy_intp per = plan->per[k];
        for (npy_intp i = 0; i < n; i++) {
            if (step[i * per]) {
                npy_intp s = start + i;
                nxt[s >= cap ? s - cap : s] = -1;
                if (i == n - 1) last_done = 1;
            }
        }
    }
    npy_intp last = start + (npy_intp)n - 1;
    nxt[last >= cap ? last - cap : last] = -1;   /* the successor of the last row is not known yet */
    if (prev_tail >= 0 && seq[prev_tail % cap] == prev_tail) nxt[prev_tail % cap] = first;
    return last_done;
}

/* write_meta(seq, next_seq, version, source, first, n, done, source_id, version_id, prev_tail) -> bool or None
 *
 * The ring's metadata of seqs first .. first+n (ring.write_meta_rows, same values): seq, the
 * next row in the episode (-1 after a done row and after the last row), the version and the
 * source; the source's previous open row prev_tail (-1: none) links to ``first`` if its slot
 * still holds it. done: tuple of bool arrays of n rows (one item may be a chunk of steps: its
 * last byte is its last step). Returns whether the last row is done; None (nothing written) when
 * a done field is not a contiguous array of 1-byte items (a torch tensor, an int column). */
static PyObject *write_meta(PyObject *self, PyObject *args) {
    PyObject *objs[4], *done;
    long long first, n, source_id, version_id, prev_tail;
    if (!PyArg_ParseTuple(args, "OOOOLLO!LLL", &objs[0], &objs[1], &objs[2], &objs[3], &first, &n, &PyTuple_Type,
                          &done, &source_id, &version_id, &prev_tail)) return NULL;
    meta_plan plan;
    int ok = meta_plan_for(objs, &PyTuple_GET_ITEM(done, 0), PyTuple_GET_SIZE(done), first, n, &plan);
    if (ok < 0) return NULL;
    if (!ok) Py_RETURN_NONE;
    return PyBool_FromLong(meta_write(&plan, first, n, source_id, version_id, prev_tail));
}

/* insert_rows(batch, fields, targets, meta, first, done_names, source_id, version_id, prev_tail)
 *     -> (n, last row done) or None
 *
 * An insert in one call: check_columns(batch, fields), copy_rows(batch, targets, first % capacity,
 * n) and write_meta(*meta, first, n, done, ...) with done the batch's fields named in done_names
 * (a tuple of str), each checked before anything is written. None (nothing written) where any of
 * the three would decline, where the batch has no rows and where it has more than the ring: the
 * caller takes the route of three calls or the Python one, which name every error. An error
 * (the metadata columns are not the ring's, a negative ``first``) is raised before any write.
 * meta: the ring's (seq, next_seq, version, source) columns. Why one call: an insert of a CartPole
 * rollout is ~1 us of work; three calls and the Python frames around them were ~6 us
 * (docs/benchmarks.md section 1). */
static PyObject *insert_rows(PyObject *self, PyObject *args) {
    PyObject *batch, *fields, *targets, *meta, *done_names;
    long long first, source_id, version_id, prev_tail;
    if (!PyArg_ParseTuple(args, "OO!O!O!LO!LLL", &batch, &PyTuple_Type, &fields, &PyTuple_Type, &targets,
                          &PyTuple_Type, &meta, &first, &PyTuple_Type, &done_names, &source_id, &version_id,
                          &prev_tail)) return NULL;
    if (PyTuple_GET_SIZE(meta) != 4) {
        PyErr_SetString(PyExc_TypeError, "insert_rows: meta must be the ring's 4 metadata columns");
        return NULL;
    }
    npy_intp n = check_batch(batch, fields, NULL);
    if (n == -2) return NULL;
    if (n <= 0) Py_RETURN_NONE;
    Py_ssize_t nd = PyTuple_GET_SIZE(done_names);
    if (nd > 8) Py_RETURN_NONE;
    PyObject *done[8];
    for (Py_ssize_t k = 0; k < nd; k++) {
        done[k] = PyDict_GetItemWithError(batch, PyTuple_GET_ITEM(done_names, k));
        if (done[k] == NULL) {
            if (PyErr_Occurred()) return NULL;
            Py_RETURN_NONE;
        }
    }
    PyArrayObject *seq = plain_array(PyTuple_GET_ITEM(meta, 0), 1);
    if (seq != NULL && PyArray_NDIM(seq) == 1 && n > PyArray_DIM(seq, 0)) Py_RETURN_NONE;   /* the caller names it */
    meta_plan plan;
    int ok = meta_plan_for(&PyTuple_GET_ITEM(meta, 0), done, nd, first, n, &plan);
    if (ok < 0) return NULL;
    if (!ok) Py_RETURN_NONE;
    PyArrayObject *src[64], *dst[64];
    ok = copy_plan(batch, targets, (Py_ssize_t)(first % plan.cap), n, src, dst);
    if (ok < 0) return NULL;
    if (!ok) Py_RETURN_NONE;
    /* the answer is made before the first write: nothing can fail once a byte is written */
    PyObject *answer = PyTuple_New(2), *rows = PyLong_FromSsize_t((Py_ssize_t)n);
    if (answer == NULL || rows == NULL) {
        Py_XDECREF(answer);
        Py_XDECREF(rows);
        return NULL;
    }
    for (Py_ssize_t k = 0; k < nd; k++) Py_INCREF(done[k]);   /* read after the copy, which may release the GIL */
    copy_planned(PyTuple_GET_SIZE(targets), src, dst, (Py_ssize_t)(first % plan.cap), n);
    int last_done = meta_write(&plan, first, n, source_id, version_id, prev_tail);
    for (Py_ssize_t k = 0; k < nd; k++) Py_DECREF(done[k]);
    PyTuple_SET_ITEM(answer, 0, rows);
    PyTuple_SET_ITEM(answer, 1, Py_NewRef(last_done ? Py_True : Py_False));
    return answer;
}

/* One row of `row` bytes: a load and a store for the usual small sizes, else memcpy. */
static inline void copy_row(char *dst, const char *src, npy_intp row) {
    switch (row) {
    case 1: *dst = *src; break;
    case 4: memcpy(dst, src, 4); break;
    case 8: memcpy(dst, src, 8); break;
    case 16: memcpy(dst, src, 16); break;
    default: memcpy(dst, src, (size_t)row);
    }
}

/* The rows of a gather, checked: `targets` (name, column) pairs whose rows go to out[name], each
 * a writable C-contiguous array of n rows of its column's type and row size. Fills col/dst/row
 * from index `at` on and lowers *cap to the shortest column; 0 (an error set or not) declines. */
static int gather_targets(PyObject *targets, PyObject *out, npy_intp n, Py_ssize_t at,
                          const char **col, char **dst, npy_intp *row, npy_intp *cap) {
    Py_ssize_t nt = PyTuple_GET_SIZE(targets);
    for (Py_ssize_t i = 0; i < nt; i++) {
        PyObject *t = PyTuple_GET_ITEM(targets, i);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 2) return 0;
        PyArrayObject *c = plain_array(PyTuple_GET_ITEM(t, 1), 0);
        PyArrayObject *d = plain_array(PyDict_GetItemWithError(out, PyTuple_GET_ITEM(t, 0)), 1);
        if (c == NULL || d == NULL || PyArray_NDIM(c) < 1 || PyArray_NDIM(d) < 1
            || PyDataType_REFCHK(PyArray_DESCR(c))
            || PyArray_DIM(d, 0) != n || PyArray_TYPE(c) != PyArray_TYPE(d)
            || PyArray_ITEMSIZE(c) != PyArray_ITEMSIZE(d)) return 0;
        npy_intp len = PyArray_DIM(c, 0), r = len ? PyArray_NBYTES(c) / len : 0;
        if (n && PyArray_NBYTES(d) / n != r) return 0;
        col[at + i] = PyArray_BYTES(c); dst[at + i] = PyArray_BYTES(d); row[at + i] = r;
        *cap = *cap < 0 || len < *cap ? len : *cap;
    }
    return 1;
}

/* The columns of a take, checked (plain arrays of raw bytes: no object references): fills col/row
 * from index `at` on and lowers *cap; 0 declines. */
static int take_columns(PyObject *columns, Py_ssize_t at, PyArrayObject **arr, const char **col, npy_intp *row,
                        npy_intp *cap) {
    Py_ssize_t nc = PyTuple_GET_SIZE(columns);
    for (Py_ssize_t i = 0; i < nc; i++) {
        PyArrayObject *c = plain_array(PyTuple_GET_ITEM(columns, i), 0);
        if (c == NULL || PyArray_NDIM(c) < 1 || PyDataType_REFCHK(PyArray_DESCR(c))) return 0;
        npy_intp len = PyArray_DIM(c, 0);
        arr[i] = c; col[at + i] = PyArray_BYTES(c); row[at + i] = len ? PyArray_NBYTES(c) / len : 0;
        *cap = *cap < 0 || len < *cap ? len : *cap;
    }
    return 1;
}

/* A tuple of fresh arrays, one per column of `arr`, shaped [n, *row shape]; their data pointers
 * go to dst from index `at` on. NULL (an error set) if memory runs out. */
static PyObject *new_takes(PyArrayObject **arr, Py_ssize_t nc, npy_intp n, Py_ssize_t at, char **dst) {
    PyObject *result = PyTuple_New(nc);
    if (result == NULL) return NULL;
    for (Py_ssize_t i = 0; i < nc; i++) {
        npy_intp dims[NPY_MAXDIMS];
        int nd = PyArray_NDIM(arr[i]);
        dims[0] = n;
        for (int d = 1; d < nd; d++) dims[d] = PyArray_DIM(arr[i], d);
        PyArray_Descr *descr = PyArray_DESCR(arr[i]);
        Py_INCREF(descr);   /* stolen by NewFromDescr */
        PyObject *a = PyArray_NewFromDescr(&PyArray_Type, descr, nd, dims, NULL, NULL, 0, NULL);
        if (a == NULL) { Py_DECREF(result); return NULL; }
        PyTuple_SET_ITEM(result, i, a);
        dst[at + i] = PyArray_BYTES((PyArrayObject *)a);
    }
    return result;
}

static int slots_inside(const int64_t *slots, npy_intp n, npy_intp cap) {
    for (npy_intp k = 0; k < n; k++)
        if (slots[k] < 0 || slots[k] >= cap) return 0;
    return 1;
}

/* Rows whose lines are prefetched ahead of the one being copied: enough misses in flight to cover
 * the memory latency (9 columns x 8 rows: 72 lines). Prefetching every row of the batch first, as
 * before, was slower on a full CartPole ring (a probe that set this distance through set_rows_ahead
 * to compare; 0 = the whole batch first; its figures: docs/benchmarks-history.md, "the gather alone"). */
static int rows_ahead = 8;

/* set_rows_ahead(n) -> the previous distance (for benchmarks: the gathers read it). */
static PyObject *set_rows_ahead(PyObject *self, PyObject *args) {
    int n, before = rows_ahead;
    if (!PyArg_ParseTuple(args, "i", &n)) return NULL;
    if (n < 0) { PyErr_SetString(PyExc_ValueError, "set_rows_ahead: n must be >= 0 (0: the whole batch first)"); return NULL; }
    rows_ahead = n;
    return PyLong_FromLong(before);
}

/* dst[i][k] = col[i][slots[k]] for every column i, row by row, with the lines of the row
 * rows_ahead further prefetched, so that the cache misses of a random batch overlap instead of
 * coming one after another (rows_ahead 0: every row prefetched first, then copied column by column). */
static void copy_gathered(const int64_t *slots, npy_intp n, Py_ssize_t nc, const char **col, char **dst,
                          const npy_intp *row) {
    npy_intp ahead = rows_ahead > 0 ? rows_ahead : n;
    npy_intp first = n < ahead ? n : ahead;
    for (npy_intp k = 0; k < first; k++)
        for (Py_ssize_t i = 0; i < nc; i++) __builtin_prefetch(col[i] + slots[k] * row[i]);
    if (rows_ahead <= 0) {
        for (Py_ssize_t i = 0; i < nc; i++)
            for (npy_intp k = 0; k < n; k++) copy_row(dst[i] + k * row[i], col[i] + slots[k] * row[i], row[i]);
        return;
    }
    for (npy_intp k = 0; k < n; k++) {
        if (k + ahead < n)
            for (Py_ssize_t i = 0; i < nc; i++) __builtin_prefetch(col[i] + slots[k + ahead] * row[i]);
        for (Py_ssize_t i = 0; i < nc; i++) copy_row(dst[i] + k * row[i], col[i] + slots[k] * row[i], row[i]);
    }
}

static const int64_t *plain_slots(PyObject *o_slots, npy_intp *n) {
    PyArrayObject *sl = plain_array(o_slots, 0);
    if (sl == NULL || PyArray_TYPE(sl) != NPY_INT64 || PyArray_NDIM(sl) != 1) return NULL;
    *n = PyArray_DIM(sl, 0);
    return (const int64_t *)PyArray_DATA(sl);
}

/* gather_rows(slots, targets, out) -> bool
 *
 * out[name][i] = column[slots[i]] for every (name, column) of targets (out: a dict of arrays),
 * prefetched ahead (copy_gathered). False (nothing written) unless slots is a C-contiguous int64
 * array of n slots inside every column and each out is a writable C-contiguous array of n rows of
 * its column's type and row size. */
static PyObject *gather_rows(PyObject *self, PyObject *args) {
    PyObject *o_slots, *targets, *out;
    if (!PyArg_ParseTuple(args, "OO!O!", &o_slots, &PyTuple_Type, &targets, &PyDict_Type, &out)) return NULL;
    npy_intp n, cap = -1, row[64];
    const int64_t *slots = plain_slots(o_slots, &n);
    Py_ssize_t nt = PyTuple_GET_SIZE(targets);
    const char *col[64];
    char *dst[64];
    if (slots == NULL || nt > 64 || !gather_targets(targets, out, n, 0, col, dst, row, &cap)
        || !slots_inside(slots, n, cap)) goto decline;
    npy_intp total = 0;
    for (Py_ssize_t i = 0; i < nt; i++) total += n * row[i];
    PyThreadState *ts = total >= RELEASE_GIL_FROM ? PyEval_SaveThread() : NULL;   /* as in copy_rows */
    copy_gathered(slots, n, nt, col, dst, row);
    if (ts != NULL) PyEval_RestoreThread(ts);
    Py_RETURN_TRUE;
decline:
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_FALSE;
}

/* take_rows(slots, columns) -> tuple of new arrays, or None
 *
 * (column[slots] for column in columns): each result a fresh C-contiguous array of the column's
 * type, shaped [n, *row shape], prefetched ahead (copy_gathered). For a batch's provenance (its
 * rows' seq and version), where the results are the batch's own. None (nothing allocated) unless
 * slots is a C-contiguous int64 array of 1-D slots inside every column and every column is a plain
 * array; the caller then indexes with numpy. */
static PyObject *take_rows(PyObject *self, PyObject *args) {
    PyObject *o_slots, *columns;
    if (!PyArg_ParseTuple(args, "OO!", &o_slots, &PyTuple_Type, &columns)) return NULL;
    npy_intp n, cap = -1, row[16];
    const int64_t *slots = plain_slots(o_slots, &n);
    Py_ssize_t nc = PyTuple_GET_SIZE(columns);
    PyArrayObject *arr[16];
    const char *col[16];
    char *dst[16];
    if (slots == NULL || nc > 16 || !take_columns(columns, 0, arr, col, row, &cap) || !slots_inside(slots, n, cap))
        Py_RETURN_NONE;
    PyObject *result = new_takes(arr, nc, n, 0, dst);
    if (result != NULL) copy_gathered(slots, n, nc, col, dst, row);
    return result;
}

/* gather_batch(slots, targets, out, columns) -> tuple of new arrays, or None
 *
 * gather_rows(slots, targets, out) and take_rows(slots, columns) in one pass: a 1-step batch's
 * rows into its reused outputs and its provenance into fresh arrays, with the rows of both
 * prefetched together, so that the provenance's cache misses overlap the rows' instead of
 * following them. None (nothing written, nothing allocated) where either would decline. */
static PyObject *gather_batch(PyObject *self, PyObject *args) {
    PyObject *o_slots, *targets, *out, *columns;
    if (!PyArg_ParseTuple(args, "OO!O!O!", &o_slots, &PyTuple_Type, &targets, &PyDict_Type, &out,
                          &PyTuple_Type, &columns)) return NULL;
    npy_intp n, cap = -1, row[80];
    const int64_t *slots = plain_slots(o_slots, &n);
    Py_ssize_t nt = PyTuple_GET_SIZE(targets), nc = PyTuple_GET_SIZE(columns);
    PyArrayObject *arr[16];
    const char *col[80];
    char *dst[80];
    if (slots == NULL || nt > 64 || nc > 16 || !gather_targets(targets, out, n, 0, col, dst, row, &cap)
        || !take_columns(columns, nt, arr, col, row, &cap) || !slots_inside(slots, n, cap)) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    PyObject *result = new_takes(arr, nc, n, nt, dst);
    if (result == NULL) return NULL;
    npy_intp total = 0;
    for (Py_ssize_t i = 0; i < nt; i++) total += n * row[i];
    PyThreadState *ts = total >= RELEASE_GIL_FROM ? PyEval_SaveThread() : NULL;   /* as in gather_rows */
    copy_gathered(slots, n, nt + nc, col, dst, row);
    if (ts != NULL) PyEval_RestoreThread(ts);
    return result;
}

/* shifted_union(a, b) -> view or None
 *
 * When b's rows are a's shifted by one row in memory (b[i] is a[i + 1], as a framework's obs[:-1]
 * and obs[1:] of one array): a read-only view of their n + 1 rows, a's first to b's last, over the
 * array both are views of. None otherwise: plain arrays (see plain_array) of one shape (two rows
 * at least) and an equal dtype, views of the same base, b starting one row after a. numpy's
 * as_strided made the same view at ~30 us with cold caches (a Python function over a dict). */
static PyObject *shifted_union(PyObject *self, PyObject *args) {
    PyObject *o_a, *o_b;
    if (!PyArg_ParseTuple(args, "OO", &o_a, &o_b)) return NULL;
    PyArrayObject *a = plain_array(o_a, 0), *b = plain_array(o_b, 0);
    if (a == NULL || b == NULL || a == b) Py_RETURN_NONE;
    int nd = PyArray_NDIM(a);
    PyObject *base = PyArray_BASE(a);
    if (nd < 1 || nd != PyArray_NDIM(b) || base == NULL || base != PyArray_BASE(b)) Py_RETURN_NONE;
    for (int d = 0; d < nd; d++)
        if (PyArray_DIM(a, d) != PyArray_DIM(b, d)) Py_RETURN_NONE;
    if (PyArray_DIM(a, 0) < 2 || PyArray_BYTES(b) != PyArray_BYTES(a) + PyArray_STRIDE(a, 0)) Py_RETURN_NONE;
    PyArray_Descr *descr = PyArray_DESCR(a);
    if (descr != PyArray_DESCR(b) && !PyArray_EquivTypes(descr, PyArray_DESCR(b))) Py_RETURN_NONE;
    npy_intp dims[NPY_MAXDIMS];
    for (int d = 0; d < nd; d++) dims[d] = PyArray_DIM(a, d);
    dims[0] += 1;
    Py_INCREF(descr);   /* stolen by NewFromDescr */
    PyObject *view = PyArray_NewFromDescr(&PyArray_Type, descr, nd, dims, PyArray_STRIDES(a), PyArray_DATA(a),
                                          NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED, NULL);
    if (view == NULL) return NULL;
    Py_INCREF(base);    /* stolen by SetBaseObject: the view keeps the memory alive */
    if (PyArray_SetBaseObject((PyArrayObject *)view, base) < 0) { Py_DECREF(view); return NULL; }
    return view;
}

/* Distinct values among n int64s: sorted in place (a copy), then runs counted. */
static int cmp_int64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static npy_intp distinct_in(const int64_t *v, npy_intp n, int64_t *scratch) {
    if (n == 0) return 0;
    if (n <= 64) {   /* a replay batch: insertion sort (qsort's calls through a pointer cost more) */
        for (npy_intp i = 0; i < n; i++) {
            int64_t x = v[i];
            npy_intp j = i;
            while (j > 0 && scratch[j - 1] > x) { scratch[j] = scratch[j - 1]; j--; }
            scratch[j] = x;
        }
    } else {
        memcpy(scratch, v, (size_t)n * sizeof(int64_t));
        qsort(scratch, (size_t)n, sizeof(int64_t), cmp_int64);
    }
    npy_intp d = 1;
    for (npy_intp i = 1; i < n; i++) d += scratch[i] != scratch[i - 1];
    return d;
}

static const int64_t *int64_column(PyObject *obj, npy_intp n) {
    PyArrayObject *a = plain_array(obj, 0);
    if (a == NULL || PyArray_TYPE(a) != NPY_INT64 || PyArray_NDIM(a) != 1 || PyArray_DIM(a, 0) != n) return NULL;
    return (const int64_t *)PyArray_DATA(a);
}

/* draw_counts(seqs, sources, n_steps) -> (distinct seqs, distinct sources, sum of n_steps), or None
 *
 * How varied a delivered batch is, as RLlib's buffers log it per sample: its distinct rows, its
 * distinct sources (episodes), and the sum of its rows' n-steps for their mean. sources and n_steps
 * may be None (their answer is then -1). Every array a plain 1-D int64 array of the same length, else
 * None (nothing computed; the caller takes numpy's route). */
static PyObject *draw_counts(PyObject *self, PyObject *args) {
    PyObject *o_seqs, *o_src, *o_n;
    if (!PyArg_ParseTuple(args, "OOO", &o_seqs, &o_src, &o_n)) return NULL;
    PyArrayObject *sa = plain_array(o_seqs, 0);
    if (sa == NULL || PyArray_NDIM(sa) != 1) Py_RETURN_NONE;
    npy_intp n = PyArray_DIM(sa, 0);
    const int64_t *seqs = int64_column(o_seqs, n);
    const int64_t *src = o_src == Py_None ? NULL : int64_column(o_src, n);
    const int64_t *steps = o_n == Py_None ? NULL : int64_column(o_n, n);
    if (seqs == NULL || (o_src != Py_None && src == NULL) || (o_n != Py_None && steps == NULL)) Py_RETURN_NONE;
    int64_t small[256];
    int64_t *scratch = n <= 256 ? small : (int64_t *)PyMem_Malloc((size_t)n * sizeof(int64_t));
    if (scratch == NULL) return PyErr_NoMemory();
    npy_intp d_seqs = distinct_in(seqs, n, scratch);
    npy_intp d_src = src == NULL ? -1 : distinct_in(src, n, scratch);
    if (scratch != small) PyMem_Free(scratch);
    long long total = -1;
    if (steps != NULL) {
        total = 0;
        for (npy_intp i = 0; i < n; i++) total += steps[i];
    }
    return Py_BuildValue("(nnL)", d_seqs, d_src, total);
}

static PyMethodDef methods[] = {
    {"draw_counts", draw_counts, METH_VARARGS, "draw_counts(seqs, sources, n_steps) -> (distinct, distinct, sum), or None"},
    {"shifted_union", shifted_union, METH_VARARGS, "shifted_union(a, b) -> read-only view of a's rows and b's last, or None"},
    {"take_rows", take_rows, METH_VARARGS, "take_rows(slots, columns) -> tuple of new arrays, or None"},
    {"gather_rows", gather_rows, METH_VARARGS, "gather_rows(slots, targets, out) -> bool"},
    {"set_rows_ahead", set_rows_ahead, METH_VARARGS, "set_rows_ahead(n) -> previous: rows a gather prefetches ahead (0: all first)"},
    {"gather_batch", gather_batch, METH_VARARGS, "gather_batch(slots, targets, out, columns) -> tuple of new arrays, or None"},
    {"check_columns", check_columns, METH_VARARGS, "check_columns(batch, fields) -> (n, columns) or None"},
    {"copy_rows", copy_rows, METH_VARARGS, "copy_rows(columns, targets, slot, n) -> bool"},
    {"insert_rows", insert_rows, METH_VARARGS, "insert_rows(batch, fields, targets, meta, first, done_names, source, version, prev_tail) -> (n, last done) or None"},
    {"write_meta", write_meta, METH_VARARGS, "write_meta(seq, next_seq, version, source, first, n, done, source, version, prev_tail) -> last row done, or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rows", "a plain host ring's rows in and out, in C", -1, methods};

PyMODINIT_FUNC PyInit__rows(void) {
    import_array();   /* numpy's C API; an ImportError here sends Conduit to the Python route */
    return PyModule_Create(&module);
}
