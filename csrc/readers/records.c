/* Turn address-keyed records into trace columns in one pass: build_records(...), the compiled twin of
 * columnar.build_columns.
 *
 * The records are walked in feed order with one map from (device, addr) to the address's current
 * allocation (a keyed hash, so a file cannot make lookups collide). It accepts exactly what
 * build_columns accepts and produces the same columns; anything build_columns hands back (time
 * going back, a broken life cycle, a size mismatch, an absurd size) makes it return None too.
 */
#include "rd_common.h"

#define MAX_SIZE_BYTES ((int64_t)1 << 50)
enum { OP_ALLOC = 1, OP_FREE_REQUESTED = 2, OP_FREE_COMPLETED = 3, OP_FREE = 4, OP_MARKER = 5,
       OP_EMPTY_CACHE = 6, OP_NONE = 7 };
enum { K_ALLOC = 1, K_FREE_REQUESTED = 2, K_FREE_COMPLETED = 3, K_EMPTY_CACHE = 4, K_MARKER = 5 };

typedef struct {
    Py_buffer view;
    int held;
} In;

static int get_column(PyObject *obj, In *in, Py_ssize_t itemsize, Py_ssize_t n, const char *name) {
    if (PyObject_GetBuffer(obj, &in->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    in->held = 1;
    if (in->view.itemsize != itemsize || (n >= 0 && in->view.len / itemsize != n)) {
        PyErr_Format(PyExc_ValueError, "column %s: wrong item size or length", name);
        return -1;
    }
    return 0;
}

typedef struct {
    VEC(int64_t) t, id, size, stream;
    VEC(uint8_t) kind;
    VEC(int16_t) device;
    VEC(int32_t) stack;
} Events;

typedef struct {
    VEC(int64_t) id, size, stream, addr;
    VEC(int16_t) device;
} Orphans;

static int emit(Budget *b, Events *ev, int64_t t, uint8_t kind, int64_t id, int64_t size, int64_t stream,
                int64_t device, int32_t stack) {
    if (vec_push(b, &ev->t, t) < 0 || vec_push(b, &ev->kind, kind) < 0 || vec_push(b, &ev->id, id) < 0
            || vec_push(b, &ev->size, size) < 0 || vec_push(b, &ev->stream, stream) < 0
            || vec_push(b, &ev->device, (int16_t)device) < 0 || vec_push(b, &ev->stack, stack) < 0)
        return -1;
    return 0;
}

typedef struct {
    int8_t last_op;
    int64_t alloc_id;
    int64_t alloc_size;
} Group;

/* build_records(t_ns, op, device, stream, addr, size, stack_id, label, first_alloc_id, memory_bytes)
 * -> ((events...), (orphans...), row_event, row_alloc_id, row_alloc_size, orphan_frees) | None */
PyObject *rd_build_records(PyObject *self, PyObject *args) {
    PyObject *o_t, *o_op, *o_dev, *o_stream, *o_addr, *o_size, *o_stack, *o_label;
    long long first_id, memory_bytes;
    if (!PyArg_ParseTuple(args, "OOOOOOOOLL", &o_t, &o_op, &o_dev, &o_stream, &o_addr, &o_size, &o_stack,
                          &o_label, &first_id, &memory_bytes))
        return NULL;
    In c[8];
    memset(c, 0, sizeof(c));
    PyObject *result = NULL;
    Budget budget = {0, memory_bytes > 0 ? (size_t)memory_bytes : 0};
    Events ev;
    Orphans orph;
    memset(&ev, 0, sizeof(ev));
    memset(&orph, 0, sizeof(orph));
    PairMap groups_by_key = {NULL, 0, 0};
    VEC(Group) groups = {NULL, 0, 0};
    int64_t *row_event = NULL, *row_id = NULL, *row_size = NULL;
    size_t n = 0;
    int ok = 0;

    if (get_column(o_t, &c[0], 8, -1, "t_ns") < 0) goto error;
    n = (size_t)(c[0].view.len / 8);
    if (get_column(o_op, &c[1], 1, (Py_ssize_t)n, "op") < 0 || get_column(o_dev, &c[2], 8, (Py_ssize_t)n, "device") < 0
            || get_column(o_stream, &c[3], 8, (Py_ssize_t)n, "stream") < 0
            || get_column(o_addr, &c[4], 8, (Py_ssize_t)n, "addr") < 0
            || get_column(o_size, &c[5], 8, (Py_ssize_t)n, "size") < 0
            || get_column(o_stack, &c[6], 4, (Py_ssize_t)n, "stack_id") < 0
            || get_column(o_label, &c[7], 8, (Py_ssize_t)n, "label") < 0)
        goto error;
    const int64_t *t = c[0].view.buf, *dev = c[2].view.buf, *stream = c[3].view.buf, *addr = c[4].view.buf;
    const int64_t *size = c[5].view.buf, *label = c[7].view.buf;
    const uint8_t *op = c[1].view.buf;
    const int32_t *stack = c[6].view.buf;
    row_event = budget_realloc(&budget, NULL, 0, (n ? n : 1) * 8);
    row_id = budget_realloc(&budget, NULL, 0, (n ? n : 1) * 8);
    row_size = budget_realloc(&budget, NULL, 0, (n ? n : 1) * 8);
    if (!row_event || !row_id || !row_size) goto hand_back;

    Py_BEGIN_ALLOW_THREADS
    int have_last = 0;
    int64_t last_t = 0, next_id = first_id;
    ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
        uint8_t code = op[i];
        if (code < OP_ALLOC || code > OP_NONE) { ok = 0; break; }
        int n_micro = code == OP_FREE ? 2 : 1;
        int64_t last_id = -1, last_size = 0;
        int last_none = 0;
        for (int k = 0; k < n_micro && ok; k++) {
            uint8_t mop = code == OP_FREE ? (k == 0 ? OP_FREE_REQUESTED : OP_FREE_COMPLETED) : code;
            last_none = mop == OP_NONE;
            last_id = -1;
            last_size = 0;
            if (mop == OP_NONE) {
                if (have_last && t[i] < last_t) ok = 0;
                continue;
            }
            if (have_last && t[i] < last_t) { ok = 0; break; }
            have_last = 1;
            last_t = t[i];
            if (mop == OP_MARKER) {
                ok = emit(&budget, &ev, t[i], K_MARKER, label[i], size[i] > 0 ? size[i] : 0, stream[i], dev[i], -1) == 0;
                continue;
            }
            if (mop == OP_EMPTY_CACHE) {
                ok = emit(&budget, &ev, t[i], K_EMPTY_CACHE, -1, 0, stream[i], dev[i], -1) == 0;
                continue;
            }
            if (mop == OP_ALLOC && (size[i] < 0 || size[i] > MAX_SIZE_BYTES)) { ok = 0; break; }
            int found;
            PairSlot *slot = pairmap_get_or_insert(&budget, &groups_by_key, dev[i], addr[i], (uint32_t)groups.len, &found);
            if (!slot || (!found && groups.len >= UINT32_MAX)) { ok = 0; break; }
            Group *g;
            int orphan = 0;
            if (!found) {
                Group fresh = {0, 0, 0};
                if (vec_push(&budget, &groups, fresh) < 0) { ok = 0; break; }
                g = &groups.data[groups.len - 1];
                if (mop != OP_ALLOC) {
                    if (size[i] < 0 || size[i] > MAX_SIZE_BYTES) { ok = 0; break; }
                    orphan = 1;
                }
            } else {
                g = &groups.data[slot->value];
                int prev = g->last_op;
                int valid = (prev == OP_ALLOC && mop == OP_FREE_REQUESTED)
                            || (prev == OP_FREE_REQUESTED && mop == OP_FREE_COMPLETED)
                            || (prev == OP_FREE_COMPLETED && mop == OP_ALLOC);
                if (!valid) { ok = 0; break; }
                if (prev == OP_ALLOC && size[i] >= 0 && size[i] != g->alloc_size) { ok = 0; break; }
            }
            if (!found || mop == OP_ALLOC) {
                g->alloc_id = next_id++;
                g->alloc_size = size[i];
            }
            g->last_op = (int8_t)mop;
            if (orphan) {
                if (vec_push(&budget, &orph.id, g->alloc_id) < 0 || vec_push(&budget, &orph.size, g->alloc_size) < 0
                        || vec_push(&budget, &orph.stream, stream[i]) < 0
                        || vec_push(&budget, &orph.device, (int16_t)dev[i]) < 0
                        || vec_push(&budget, &orph.addr, addr[i]) < 0) { ok = 0; break; }
                if (mop == OP_FREE_COMPLETED   /* its request fell before the window: emitted first */
                        && emit(&budget, &ev, t[i], K_FREE_REQUESTED, g->alloc_id, g->alloc_size, stream[i], dev[i],
                                stack[i]) < 0) { ok = 0; break; }
            }
            uint8_t kind = mop == OP_ALLOC ? K_ALLOC : (mop == OP_FREE_REQUESTED ? K_FREE_REQUESTED : K_FREE_COMPLETED);
            if (emit(&budget, &ev, t[i], kind, g->alloc_id, g->alloc_size, stream[i], dev[i], stack[i]) < 0) {
                ok = 0;
                break;
            }
            last_id = g->alloc_id;
            last_size = g->alloc_size;
        }
        if (!ok) break;
        row_event[i] = last_none ? (int64_t)ev.t.len : (int64_t)ev.t.len - 1;
        row_id[i] = last_id;
        row_size[i] = last_size;
    }
    Py_END_ALLOW_THREADS
    if (!ok) goto hand_back;

#define BA(vec, item) rd_bytearray_copy((vec).data, (vec).len, (item))
    result = Py_BuildValue("((NNNNNNN)(NNNNN)NNNn)",
                           BA(ev.t, 8), BA(ev.kind, 1), BA(ev.id, 8), BA(ev.size, 8), BA(ev.stream, 8),
                           BA(ev.device, 2), BA(ev.stack, 4),
                           BA(orph.id, 8), BA(orph.size, 8), BA(orph.stream, 8), BA(orph.device, 2), BA(orph.addr, 8),
                           rd_bytearray_copy(row_event, n, 8), rd_bytearray_copy(row_id, n, 8),
                           rd_bytearray_copy(row_size, n, 8), (Py_ssize_t)orph.id.len);
#undef BA
    goto done;
hand_back:
    result = Py_None;
    Py_INCREF(Py_None);
    goto done;
error:
    result = NULL;
done:
    vec_free(&budget, &ev.t); vec_free(&budget, &ev.kind); vec_free(&budget, &ev.id); vec_free(&budget, &ev.size);
    vec_free(&budget, &ev.stream); vec_free(&budget, &ev.device); vec_free(&budget, &ev.stack);
    vec_free(&budget, &orph.id); vec_free(&budget, &orph.size); vec_free(&budget, &orph.stream);
    vec_free(&budget, &orph.device); vec_free(&budget, &orph.addr);
    pairmap_free(&budget, &groups_by_key);
    vec_free(&budget, &groups);
    free(row_event);
    free(row_id);
    free(row_size);
    for (int k = 0; k < 8; k++)
        if (c[k].held) PyBuffer_Release(&c[k].view);
    return result;
}
