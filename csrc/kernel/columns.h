/* Read the engine's event columns (lists of ints or integer buffers) and write its int64 sample columns.
 *
 * The engine hands replay_run either Python lists or buffers (numpy arrays, memoryviews) of any
 * integer width; reading a buffer needs no Python object per value, which is where most of a
 * replay's time would otherwise go.
 */
#ifndef ALLOCSIM_COLUMNS_H
#define ALLOCSIM_COLUMNS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    PyObject *list;      /* a list of ints, or NULL when view is used */
    Py_buffer view;
    int have_view;
    int itemsize;        /* 1, 2, 4 or 8 */
    int is_signed;
    Py_ssize_t len;
} Column;

typedef struct {
    Py_buffer view;
    int have_view;
    int64_t *data;
    Py_ssize_t len;
} OutColumn;

static int buffer_int_format(const Py_buffer *view, int *itemsize, int *is_signed) {
    const char *fmt = view->format ? view->format : "B";
    if (*fmt == '@' || *fmt == '=' || *fmt == '<' || *fmt == '!' || *fmt == '>') fmt++;
    if (strlen(fmt) != 1 || !strchr("bBhHiIlLqQnN", *fmt)) return -1;
    if (view->itemsize != 1 && view->itemsize != 2 && view->itemsize != 4 && view->itemsize != 8) return -1;
    *itemsize = (int)view->itemsize;
    *is_signed = strchr("bhilqn", *fmt) != NULL;
    return 0;
}

/* Open obj (a list, or a one-dimensional contiguous integer buffer) for reading; -1 with an error set. */
static int column_open(Column *c, PyObject *obj, const char *name) {
    memset(c, 0, sizeof(*c));
    if (PyList_Check(obj)) {
        c->list = obj;
        c->len = PyList_GET_SIZE(obj);
        return 0;
    }
    if (PyObject_GetBuffer(obj, &c->view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) return -1;
    c->have_view = 1;
    if (c->view.ndim != 1 || buffer_int_format(&c->view, &c->itemsize, &c->is_signed) < 0) {
        PyErr_Format(PyExc_TypeError, "replay column %s must be a list or a 1-d integer buffer", name);
        return -1;
    }
    c->len = c->view.len / c->itemsize;
    return 0;
}

static void column_close(Column *c) {
    if (c->have_view) PyBuffer_Release(&c->view);
    c->have_view = 0;
}

/* Value i of the column; -1 with an error set when it is not an int that fits in int64. */
static inline int column_get(const Column *c, Py_ssize_t i, int64_t *out) {
    if (c->list) {
        if (i >= PyList_GET_SIZE(c->list)) {
            PyErr_SetString(PyExc_IndexError, "replay column shrank during a run");
            return -1;
        }
        long long v = PyLong_AsLongLong(PyList_GET_ITEM(c->list, i));
        if (v == -1 && PyErr_Occurred()) return -1;
        *out = (int64_t)v;
        return 0;
    }
    const char *p = (const char *)c->view.buf + i * c->itemsize;
    switch (c->itemsize) {
    case 1:
        *out = c->is_signed ? (int64_t)*(const int8_t *)p : (int64_t)*(const uint8_t *)p;
        return 0;
    case 2:
        *out = c->is_signed ? (int64_t)*(const int16_t *)p : (int64_t)*(const uint16_t *)p;
        return 0;
    case 4:
        *out = c->is_signed ? (int64_t)*(const int32_t *)p : (int64_t)*(const uint32_t *)p;
        return 0;
    default:
        if (!c->is_signed && *(const uint64_t *)p > (uint64_t)INT64_MAX) {
            PyErr_SetString(PyExc_OverflowError, "replay column value does not fit in int64");
            return -1;
        }
        *out = *(const int64_t *)p;
        return 0;
    }
}

/* Value i as a Python int (new reference): the list's own object, or a new int. */
static inline PyObject *column_object(const Column *c, Py_ssize_t i, int64_t value) {
    if (c->list && i < PyList_GET_SIZE(c->list)) {
        PyObject *item = PyList_GET_ITEM(c->list, i);
        Py_INCREF(item);
        return item;
    }
    return PyLong_FromLongLong(value);
}

/* Open a writable contiguous int64 buffer; -1 with an error set. */
static int out_column_open(OutColumn *c, PyObject *obj, const char *name) {
    memset(c, 0, sizeof(*c));
    if (PyObject_GetBuffer(obj, &c->view, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) return -1;
    c->have_view = 1;
    int itemsize, is_signed;
    if (c->view.ndim != 1 || buffer_int_format(&c->view, &itemsize, &is_signed) < 0 || itemsize != 8 || !is_signed) {
        PyErr_Format(PyExc_TypeError, "sample column %s must be a writable 1-d int64 buffer", name);
        return -1;
    }
    c->data = (int64_t *)c->view.buf;
    c->len = c->view.len / 8;
    return 0;
}

static void out_column_close(OutColumn *c) {
    if (c->have_view) PyBuffer_Release(&c->view);
    c->have_view = 0;
}

#endif
