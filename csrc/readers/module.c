/* allocsim.trace._readers: the compiled halves of the trace readers (allocsim.trace.compiled loads it).
 *
 * Each function takes what the Python reader has at that point (the file's bytes, or columns) and
 * returns columns as bytearrays, or None when the input needs the Python reference route.
 */
#include "rd_common.h"

uint64_t rd_hash_key[2];

PyObject *rd_snapshot_scan(PyObject *self, PyObject *args);
PyObject *rd_build_records(PyObject *self, PyObject *args);
PyObject *rd_chrome_scan(PyObject *self, PyObject *args);
PyObject *rd_op_sweep(PyObject *self, PyObject *args);
PyObject *rd_intern_stacks(PyObject *self, PyObject *args);
PyObject *rd_rmm_scan(PyObject *self, PyObject *args);
PyObject *rd_events_check(PyObject *self, PyObject *args);
PyObject *rd_live_bytes(PyObject *self, PyObject *args);

static PyMethodDef methods[] = {
    {"snapshot_scan", rd_snapshot_scan, METH_VARARGS,
     "snapshot_scan(data, memory_bytes, max_frames, max_string_chars, max_segments, max_devices, max_events, "
     "max_time_us, step_ns, keep_frames) -> dict | None: a PyTorch snapshot pickle read into columns without "
     "unpickling."},
    {"build_records", rd_build_records, METH_VARARGS,
     "build_records(t_ns, op, device, stream, addr, size, stack_id, label, first_alloc_id, memory_bytes) -> "
     "tuple | None: columnar.build_columns in one pass."},
    {"chrome_scan", rd_chrome_scan, METH_VARARGS,
     "chrome_scan(data, memory_bytes, max_depth, max_events) -> dict | None: a Kineto / Chrome trace's [memory] "
     "events, ops and other kept events as columns."},
    {"op_sweep", rd_op_sweep, METH_VARARGS,
     "op_sweep(op_start, op_end, op_groups, mem_t, mem_groups) -> (op_parent, mem_top): kineto._op_stacks' sweep."},
    {"intern_stacks", rd_intern_stacks, METH_VARARGS,
     "intern_stacks(parent, frame_id, max_depth, max_total) -> (stack_id, stack_frames, stack_starts) | None."},
    {"rmm_scan", rd_rmm_scan, METH_VARARGS,
     "rmm_scan(body, n_columns, action, pointer, size, time, stream, thread) -> dict | None: rmm_fast.rmm_columns "
     "in one pass."},
    {"events_check", rd_events_check, METH_VARARGS,
     "events_check(t_ns, kind, alloc_id, size_bytes, device, initial_ids, n_labels) -> (clean, n_devices, t_min, "
     "t_max): validate.validate_events' answer for a clean table, in one pass."},
    {"live_bytes", rd_live_bytes, METH_VARARGS,
     "live_bytes(kind, size_bytes, alloc_id, initial_ids, baseline_total) -> (window, total) | None: "
     "stats.live_bytes_series in one pass."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef readers_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "allocsim.trace._readers",
    .m_doc = "Compiled halves of allocsim's trace readers; allocsim.trace.compiled loads it.",
    .m_size = -1,
    .m_methods = methods,
};

/* The hash key comes from os.urandom, so no file can know which keys collide. */
static int seed_hash(void) {
    PyObject *os = PyImport_ImportModule("os");
    if (!os) return -1;
    PyObject *raw = PyObject_CallMethod(os, "urandom", "i", 16);
    Py_DECREF(os);
    if (!raw) return -1;
    if (!PyBytes_Check(raw) || PyBytes_GET_SIZE(raw) != 16) {
        Py_DECREF(raw);
        PyErr_SetString(PyExc_RuntimeError, "os.urandom(16) did not give 16 bytes");
        return -1;
    }
    memcpy(rd_hash_key, PyBytes_AS_STRING(raw), 16);
    Py_DECREF(raw);
    return 0;
}

PyMODINIT_FUNC PyInit__readers(void) {
    if (seed_hash() < 0) return NULL;
    PyObject *m = PyModule_Create(&readers_module);
    if (!m) return NULL;
    /* Bumped whenever the Python side must be rebuilt with the C side (checked by the loader). */
    if (PyModule_AddIntConstant(m, "ABI_VERSION", 1) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
