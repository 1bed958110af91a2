/* Which CPU ops enclose each [memory] event: op_sweep(...), the compiled sweep of kineto._op_stacks.
 *
 * Per thread, ops sorted by (start, -end, name) and the thread's [memory] events in time order go
 * through one stack of open ops, exactly as the Python sweep does: before an event at t every op
 * starting at or before t is pushed (after popping the ops that ended before it starts), then ops
 * that ended before t are popped. It returns, per op, the op under it when it was pushed (-1: none;
 * -2: never pushed) and, per event, the innermost open op (-1: none). The reader then interns one
 * stack per pushed op, in push order, so stack ids come out as the Python sweep makes them.
 */
#include "rd_common.h"

typedef struct {
    Py_buffer view;
    int held;
} Arr;

static int open_i64(PyObject *obj, Arr *a) {
    if (PyObject_GetBuffer(obj, &a->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    a->held = 1;
    if (a->view.itemsize != 8) {
        PyErr_SetString(PyExc_ValueError, "op_sweep: int64 columns expected");
        return -1;
    }
    return 0;
}

/* op_sweep(op_start, op_end, op_groups, mem_t, mem_groups) -> (op_parent, mem_top) as int64 bytearrays */
PyObject *rd_op_sweep(PyObject *self, PyObject *args) {
    PyObject *objs[5];
    if (!PyArg_ParseTuple(args, "OOOOO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4])) return NULL;
    Arr a[5];
    memset(a, 0, sizeof(a));
    PyObject *result = NULL, *parent_obj = NULL, *top_obj = NULL;
    int64_t *stack = NULL;
    for (int k = 0; k < 5; k++)
        if (open_i64(objs[k], &a[k]) < 0) goto done;
    const int64_t *start = a[0].view.buf, *end = a[1].view.buf, *og = a[2].view.buf;
    const int64_t *mem_t = a[3].view.buf, *mg = a[4].view.buf;
    Py_ssize_t n_ops = a[0].view.len / 8, n_mem = a[3].view.len / 8, n_groups = a[2].view.len / 8 - 1;
    if (a[1].view.len / 8 != n_ops || n_groups < 0 || a[4].view.len / 8 != n_groups + 1) {
        PyErr_SetString(PyExc_ValueError, "op_sweep: inconsistent lengths");
        goto done;
    }
    void *pdata = NULL, *tdata = NULL;
    parent_obj = rd_bytearray((size_t)n_ops, 8, &pdata);
    top_obj = rd_bytearray((size_t)n_mem, 8, &tdata);
    stack = malloc((size_t)(n_ops ? n_ops : 1) * 8);
    if (!parent_obj || !top_obj || !stack) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    int64_t *parent = pdata, *top = tdata;
    /* Rows outside every group (groups that do not cover 0 .. n) stay never pushed / without an op,
     * never uninitialised memory. */
    for (Py_ssize_t k = 0; k < n_ops; k++) parent[k] = -2;
    for (Py_ssize_t r = 0; r < n_mem; r++) top[r] = -1;
    for (Py_ssize_t g = 0; g < n_groups; g++) {
        int64_t k = og[g], b = og[g + 1], c = mg[g], d = mg[g + 1];
        if (k < 0 || b < k || b > n_ops || c < 0 || d < c || d > n_mem) {
            PyErr_SetString(PyExc_ValueError, "op_sweep: bad group bounds");
            goto done;
        }
        Py_ssize_t depth = 0;
        for (int64_t r = c; r < d; r++) {
            int64_t t = mem_t[r];
            while (k < b && start[k] <= t) {
                while (depth && end[stack[depth - 1]] < start[k]) depth--;
                parent[k] = depth ? stack[depth - 1] : -1;
                stack[depth++] = k;
                k++;
            }
            while (depth && end[stack[depth - 1]] < t) depth--;
            top[r] = depth ? stack[depth - 1] : -1;
        }
        for (; k < b; k++) parent[k] = -2;
    }
    result = PyTuple_Pack(2, parent_obj, top_obj);
done:
    Py_XDECREF(parent_obj);
    Py_XDECREF(top_obj);
    free(stack);
    for (int k = 0; k < 5; k++)
        if (a[k].held) PyBuffer_Release(&a[k].view);
    return result;
}

/* Intern the stacks of pushed ops, in push order: intern_stacks(parent, frame_id, max_depth, max_total).
 *
 * Op i's stack is its frame on top of its parent's stack (parent[i] < i, or -1), so a stack is
 * named by (parent's stack id, frame id); ids go to new stacks in push order, as FrameTable's
 * child_stack numbers them. Returns (stack id per op, the stacks' frame ids innermost first, each
 * stack's first row then the end), or None when a stack would be deeper than max_depth or all
 * stacks would hold more than max_total frames (the Python route then raises the limit error).
 */
PyObject *rd_intern_stacks(PyObject *self, PyObject *args) {
    PyObject *o_parent, *o_fid;
    long long max_depth, max_total;
    if (!PyArg_ParseTuple(args, "OOLL", &o_parent, &o_fid, &max_depth, &max_total)) return NULL;
    Arr a[2];
    memset(a, 0, sizeof(a));
    PyObject *result = NULL;
    Budget budget = {0, (size_t)1 << 46};
    PairMap map = {NULL, 0, 0};
    VEC(int64_t) starts = {NULL, 0, 0};
    VEC(int64_t) depth = {NULL, 0, 0};
    VEC(int32_t) frames = {NULL, 0, 0};
    int64_t *sid = NULL;
    if (open_i64(o_parent, &a[0]) < 0 || open_i64(o_fid, &a[1]) < 0) goto done;
    Py_ssize_t n = a[0].view.len / 8;
    if (a[1].view.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "intern_stacks: inconsistent lengths");
        goto done;
    }
    const int64_t *parent = a[0].view.buf, *fid = a[1].view.buf;
    sid = malloc((size_t)(n ? n : 1) * 8);
    if (!sid || vec_push(&budget, &starts, (int64_t)0) < 0) goto no_memory;
    int over = 0;
    for (Py_ssize_t i = 0; i < n && !over; i++) {
        if (parent[i] >= i || parent[i] < -1 || fid[i] < 0 || fid[i] > INT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "intern_stacks: bad parent or frame id");
            goto done;
        }
        int64_t up = parent[i] >= 0 ? sid[parent[i]] : -1;
        int found;
        PairSlot *slot = pairmap_get_or_insert(&budget, &map, up, fid[i], (uint32_t)(starts.len - 1), &found);
        if (!slot) goto no_memory;
        if (!found) {
            int64_t d = (up >= 0 ? depth.data[up] : 0) + 1;
            int64_t up_len = up >= 0 ? starts.data[up + 1] - starts.data[up] : 0;
            if (d > max_depth || (int64_t)frames.len + 1 + up_len > max_total) {
                over = 1;
                break;
            }
            if (vec_reserve(&budget, &frames, (size_t)(1 + up_len)) < 0 || vec_push(&budget, &depth, d) < 0)
                goto no_memory;
            frames.data[frames.len++] = (int32_t)fid[i];
            if (up_len) {
                memcpy(frames.data + frames.len, frames.data + starts.data[up], (size_t)up_len * 4);
                frames.len += (size_t)up_len;
            }
            if (vec_push(&budget, &starts, (int64_t)frames.len) < 0) goto no_memory;
        }
        sid[i] = slot->value;
    }
    if (over) {
        result = Py_None;
        Py_INCREF(Py_None);
        goto done;
    }
    result = Py_BuildValue("(NNN)", rd_bytearray_copy(sid, (size_t)n, 8), rd_bytearray_copy(frames.data, frames.len, 4),
                           rd_bytearray_copy(starts.data, starts.len, 8));
    goto done;
no_memory:
    PyErr_NoMemory();
done:
    free(sid);
    pairmap_free(&budget, &map);
    vec_free(&budget, &starts);
    vec_free(&budget, &depth);
    vec_free(&budget, &frames);
    for (int k = 0; k < 2; k++)
        if (a[k].held) PyBuffer_Release(&a[k].view);
    return result;
}
