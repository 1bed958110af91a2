/* Is an events table clean? events_check(...): the compiled fast answer of validate.validate_events.
 *
 * One pass over the columns says whether every kind is known, every size is in range, time never
 * goes back, every marker names a label and every allocation id goes ALLOC -> FREE_REQUESTED ->
 * FREE_COMPLETED (ids of the initial allocations start allocated), and counts the distinct devices
 * and finds the time range. Ids are tracked in one byte each, which needs them dense (0 .. about
 * the number of events, as every reader numbers them); other ids, like any problem, make it answer
 * "not clean" and the reader runs the reference checks, which name the row.
 */
#include "rd_common.h"

#define MAX_SIZE_BYTES ((int64_t)1 << 50)
enum { K_ALLOC = 1, K_FREE_REQUESTED = 2, K_FREE_COMPLETED = 3, K_EMPTY_CACHE = 4, K_MARKER = 5 };

typedef struct {
    Py_buffer view;
    int held;
} Col;

static int open_col(PyObject *obj, Col *c, Py_ssize_t itemsize, Py_ssize_t n) {
    if (PyObject_GetBuffer(obj, &c->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    c->held = 1;
    if (c->view.itemsize != itemsize || (n >= 0 && c->view.len / itemsize != n)) {
        PyErr_SetString(PyExc_ValueError, "events_check: a column of the wrong width or length");
        return -1;
    }
    return 0;
}

/* events_check(t_ns, kind, alloc_id, size_bytes, device, initial_ids, n_labels)
 * -> (clean, n_devices, t_min, t_max) */
PyObject *rd_events_check(PyObject *self, PyObject *args) {
    PyObject *o[6];
    long long n_labels;
    if (!PyArg_ParseTuple(args, "OOOOOOL", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &n_labels)) return NULL;
    Col c[6];
    memset(c, 0, sizeof(c));
    PyObject *result = NULL;
    uint8_t *state = NULL, *seen_device = NULL;
    if (open_col(o[0], &c[0], 8, -1) < 0) goto done;
    Py_ssize_t n = c[0].view.len / 8;
    if (open_col(o[1], &c[1], 1, n) < 0 || open_col(o[2], &c[2], 8, n) < 0 || open_col(o[3], &c[3], 8, n) < 0
            || open_col(o[4], &c[4], 2, n) < 0 || open_col(o[5], &c[5], 8, -1) < 0)
        goto done;
    const int64_t *t = c[0].view.buf, *ids = c[2].view.buf, *size = c[3].view.buf, *initial = c[5].view.buf;
    const uint8_t *kind = c[1].view.buf;
    const int16_t *device = c[4].view.buf;
    Py_ssize_t n_initial = c[5].view.len / 8;
    /* Ids are dense when they fit 0 .. 4 * (events + initial) + 1024: one state byte each. */
    int64_t id_cap = 4 * ((int64_t)n + n_initial) + 1024;
    state = calloc((size_t)id_cap, 1);
    seen_device = calloc(65536, 1);
    if (!state || !seen_device) {
        PyErr_NoMemory();
        goto done;
    }
    int clean = 1;
    int64_t n_devices = 0, t_min = n ? t[0] : 0, t_max = n ? t[0] : 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n_initial && clean; i++) {
        int64_t id = initial[i];
        if (id < 0 || id >= id_cap || state[id]) clean = 0;
        else state[id] = K_ALLOC;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t ti = t[i];
        if (ti < t_min) t_min = ti;
        if (ti > t_max) t_max = ti;
        uint16_t d = (uint16_t)device[i];
        n_devices += !seen_device[d];
        seen_device[d] = 1;
        if (!clean) continue;     /* keep counting devices and the time range */
        uint8_t k = kind[i];
        int64_t sz = size[i], id = ids[i];
        if (k < K_ALLOC || k > K_MARKER || sz < 0 || sz > MAX_SIZE_BYTES || (i && ti < t[i - 1])) {
            clean = 0;
            continue;
        }
        if (k == K_MARKER) {
            if (id < 0 || id >= n_labels) clean = 0;
            continue;
        }
        if (k == K_EMPTY_CACHE) continue;
        if (id < 0 || id >= id_cap || state[id] != k - 1) {   /* each id: ALLOC, then a request, then done */
            clean = 0;
            continue;
        }
        state[id] = k;
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(OLLL)", clean ? Py_True : Py_False, (long long)n_devices, (long long)t_min,
                           (long long)t_max);
done:
    free(state);
    free(seen_device);
    for (int k = 0; k < 6; k++)
        if (c[k].held) PyBuffer_Release(&c[k].view);
    return result;
}

/* Live bytes after each event: live_bytes(kind, size, alloc_id, initial_ids, baseline_total), the
 * compiled twin of stats.live_bytes_series (an allocation holds its bytes from ALLOC until its free
 * completes; frees of initial allocations lower the baseline). Returns (window, total) as int64
 * bytearrays, or None when a sum would pass int64 or the initial ids are not dense (the numpy
 * reference then sums in Python integers). */
PyObject *rd_live_bytes(PyObject *self, PyObject *args) {
    PyObject *o[4];
    long long baseline_total;
    if (!PyArg_ParseTuple(args, "OOOOL", &o[0], &o[1], &o[2], &o[3], &baseline_total)) return NULL;
    Col c[4];
    memset(c, 0, sizeof(c));
    PyObject *result = NULL, *w_obj = NULL, *t_obj = NULL;
    uint8_t *is_initial = NULL;
    if (open_col(o[0], &c[0], 1, -1) < 0) goto done;
    Py_ssize_t n = c[0].view.len;
    if (open_col(o[1], &c[1], 8, n) < 0 || open_col(o[2], &c[2], 8, n) < 0 || open_col(o[3], &c[3], 8, -1) < 0)
        goto done;
    const uint8_t *kind = c[0].view.buf;
    const int64_t *size = c[1].view.buf, *ids = c[2].view.buf, *initial = c[3].view.buf;
    Py_ssize_t n_initial = c[3].view.len / 8;
    int64_t id_cap = 4 * ((int64_t)n + n_initial) + 1024;
    for (Py_ssize_t i = 0; i < n_initial; i++)
        if (initial[i] < 0 || initial[i] >= id_cap) goto hand_back;
    is_initial = calloc((size_t)id_cap, 1);
    if (!is_initial) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n_initial; i++) is_initial[initial[i]] = 1;
    void *wd, *td;
    w_obj = rd_bytearray((size_t)n, 8, &wd);
    t_obj = rd_bytearray((size_t)n, 8, &td);
    if (!w_obj || !t_obj) goto done;
    int64_t *window = wd, *total = td;
    int overflow = 0;
    Py_BEGIN_ALLOW_THREADS
    int64_t w = 0, gone = 0;     /* window bytes; baseline bytes freed so far */
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t sz = size[i], id = ids[i];
        if (kind[i] == K_ALLOC) {
            if (__builtin_add_overflow(w, sz, &w)) { overflow = 1; break; }
        } else if (kind[i] == K_FREE_COMPLETED) {
            int base = id >= 0 && id < id_cap && is_initial[id];
            if (base ? __builtin_add_overflow(gone, sz, &gone) : __builtin_sub_overflow(w, sz, &w)) {
                overflow = 1;
                break;
            }
        }
        int64_t t;
        if (__builtin_add_overflow(w, baseline_total, &t) || __builtin_sub_overflow(t, gone, &t)) {
            overflow = 1;
            break;
        }
        window[i] = w;
        total[i] = t;
    }
    Py_END_ALLOW_THREADS
    if (overflow) goto hand_back;
    result = PyTuple_Pack(2, w_obj, t_obj);
    goto done;
hand_back:
    result = Py_None;
    Py_INCREF(Py_None);
done:
    Py_XDECREF(w_obj);
    Py_XDECREF(t_obj);
    free(is_initial);
    for (int k = 0; k < 4; k++)
        if (c[k].held) PyBuffer_Release(&c[k].view);
    return result;
}
