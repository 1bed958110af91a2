/* Turn address-keyed records into trace columns in one pass: build_records(...), the compiled twin of
 * columnar.build_columns.
 *
 * The records are walked in feed order with one table from (device, addr) to the address's current
 * allocation, open addressing under a randomly keyed hash, so a file cannot make lookups collide.
 * It accepts exactly what build_columns accepts (for the record kinds readers make) and produces the
 * same columns; anything build_columns hands back (time going back, a broken life cycle, a size
 * mismatch, an absurd size) makes it return None too. Outputs are written in place into bytearrays
 * sized from a first look at the operation codes.
 */
#include "rd_common.h"

#define MAX_SIZE_BYTES ((int64_t)1 << 50)
#define PREFETCH 16
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

/* One address's current allocation, stored in the table slot itself (one memory access a lookup):
 * 24 bytes, the allocation id kept as its offset from the first id. */
typedef struct {
    int64_t addr;
    int64_t alloc_size;
    uint32_t id_offset;
    int16_t device;
    int8_t last_op;
    uint8_t used;
} Slot;

typedef struct {
    Slot *slots;
    size_t capacity, len;
} Table;

static inline size_t slot_of(int64_t device, int64_t addr, size_t mask) {
    return rd_hash2(device, addr) & mask;
}

static int table_grow(Table *t) {
    size_t cap = t->capacity ? t->capacity * 2 : 1024;
    Slot *slots = calloc(cap, sizeof(Slot));
    if (!slots) return -1;
    for (size_t i = 0; i < t->capacity; i++) {
        if (!t->slots[i].used) continue;
        size_t j = slot_of(t->slots[i].device, t->slots[i].addr, cap - 1);
        while (slots[j].used) j = (j + 1) & (cap - 1);
        slots[j] = t->slots[i];
    }
    free(t->slots);
    t->slots = slots;
    t->capacity = cap;
    return 0;
}

/* The slot of (device, addr) whose hash is h, or the free slot to claim for it; NULL out of memory. */
static inline Slot *table_find(Table *t, int64_t device, int64_t addr, uint64_t h) {
    if (2 * (t->len + 1) > t->capacity && table_grow(t) < 0) return NULL;
    size_t mask = t->capacity - 1, j = h & mask;
    while (t->slots[j].used) {
        if (t->slots[j].addr == addr && t->slots[j].device == device) return &t->slots[j];
        j = (j + 1) & mask;
    }
    return &t->slots[j];
}

typedef struct {
    int64_t *t, *id, *size, *stream;
    uint8_t *kind;
    int16_t *device;
    int32_t *stack;
    size_t len, cap;
} Events;

static inline void emit(Events *ev, int64_t t, uint8_t kind, int64_t id, int64_t size, int64_t stream, int64_t device,
                        int32_t stack) {
    size_t k = ev->len++;
    ev->t[k] = t;
    ev->kind[k] = kind;
    ev->id[k] = id;
    ev->size[k] = size;
    ev->stream[k] = stream;
    ev->device[k] = (int16_t)device;   /* checked to fit int16 before the pass */
    ev->stack[k] = stack;
}

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
    PyObject *out[15] = {NULL};   /* 7 event columns, 5 orphan columns, 3 row columns */
    Table table = {NULL, 0, 0};
    size_t n = 0;
    int ok = 0;

    if (get_column(o_t, &c[0], 8, -1, "t_ns") < 0) goto done;
    n = (size_t)(c[0].view.len / 8);
    if (get_column(o_op, &c[1], 1, (Py_ssize_t)n, "op") < 0 || get_column(o_dev, &c[2], 8, (Py_ssize_t)n, "device") < 0
            || get_column(o_stream, &c[3], 8, (Py_ssize_t)n, "stream") < 0
            || get_column(o_addr, &c[4], 8, (Py_ssize_t)n, "addr") < 0
            || get_column(o_size, &c[5], 8, (Py_ssize_t)n, "size") < 0
            || get_column(o_stack, &c[6], 4, (Py_ssize_t)n, "stack_id") < 0
            || get_column(o_label, &c[7], 8, (Py_ssize_t)n, "label") < 0)
        goto done;
    const int64_t *t = c[0].view.buf, *dev = c[2].view.buf, *stream = c[3].view.buf, *addr = c[4].view.buf;
    const int64_t *size = c[5].view.buf, *label = c[7].view.buf;
    const uint8_t *op = c[1].view.buf;
    const int32_t *stack = c[6].view.buf;

    /* At most one event per micro-op plus one per completion that turns out to be an orphan. */
    size_t n_events_max = 0, n_orphans_max = 0;
    /* Ids run from first_id to at most first_id + n: they must stay within int64. */
    if (first_id > INT64_MAX - (int64_t)n) goto hand_back;
    for (size_t i = 0; i < n; i++) {
        uint8_t code = op[i];
        if (code < OP_ALLOC || code > OP_NONE) goto hand_back;
        /* A slot keeps the device as int16: another device would never match its own slot again. */
        if (dev[i] < INT16_MIN || dev[i] > INT16_MAX) goto hand_back;
        n_events_max += code == OP_FREE ? 3 : (code == OP_FREE_COMPLETED ? 2 : (code == OP_NONE ? 0 : 1));
        n_orphans_max += code == OP_FREE_REQUESTED || code == OP_FREE_COMPLETED || code == OP_FREE;
    }
    if (memory_bytes > 0 && (double)n_events_max * 39 + (double)n * 24 > (double)memory_bytes) goto hand_back;
    static const size_t EV_ITEM[7] = {8, 1, 8, 8, 8, 2, 4}, OR_ITEM[5] = {8, 8, 8, 2, 8};
    void *p[15];
    for (int k = 0; k < 7; k++)
        if (!(out[k] = rd_bytearray(n_events_max, EV_ITEM[k], &p[k]))) goto done;
    for (int k = 0; k < 5; k++)
        if (!(out[7 + k] = rd_bytearray(n_orphans_max, OR_ITEM[k], &p[7 + k]))) goto done;
    for (int k = 0; k < 3; k++)
        if (!(out[12 + k] = rd_bytearray(n, 8, &p[12 + k]))) goto done;
    Events ev = {p[0], p[2], p[3], p[4], p[1], p[5], p[6], 0, n_events_max};
    int64_t *or_id = p[7], *or_size = p[8], *or_stream = p[9], *or_addr = p[11];
    int16_t *or_dev = p[10];
    int64_t *row_event = p[12], *row_id = p[13], *row_size = p[14];
    size_t n_orphans = 0;
    int out_of_memory = 0;

    Py_BEGIN_ALLOW_THREADS
    int have_last = 0;
    int64_t last_t = 0, next_id = first_id;
    uint64_t ring[PREFETCH];
    ok = 1;
    for (size_t k = 0; k < PREFETCH && k < n; k++) ring[k] = rd_hash2(dev[k], addr[k]);
    for (size_t i = 0; i < n && ok; i++) {
        uint8_t code = op[i];
        int64_t ti = t[i];
        /* Table lookups are cache misses: hash PREFETCH rows ahead and fetch their slots early. */
        uint64_t h = ring[i % PREFETCH];
        if (i + PREFETCH < n) {
            uint64_t ahead = rd_hash2(dev[i + PREFETCH], addr[i + PREFETCH]);
            ring[i % PREFETCH] = ahead;
            if (table.capacity) __builtin_prefetch(&table.slots[ahead & (table.capacity - 1)]);
        }
        if (code == OP_NONE) {
            if (have_last && ti < last_t) ok = 0;
            row_event[i] = (int64_t)ev.len;
            row_id[i] = -1;
            row_size[i] = 0;
            continue;
        }
        if (have_last && ti < last_t) { ok = 0; break; }
        have_last = 1;
        last_t = ti;
        if (code == OP_MARKER || code == OP_EMPTY_CACHE) {
            if (code == OP_MARKER) emit(&ev, ti, K_MARKER, label[i], size[i] > 0 ? size[i] : 0, stream[i], dev[i], -1);
            else emit(&ev, ti, K_EMPTY_CACHE, -1, 0, stream[i], dev[i], -1);
            row_event[i] = (int64_t)ev.len - 1;
            row_id[i] = -1;
            row_size[i] = 0;
            continue;
        }
        int64_t sz = size[i];
        if (code == OP_ALLOC && (sz < 0 || sz > MAX_SIZE_BYTES)) { ok = 0; break; }
        Slot *s = table_find(&table, dev[i], addr[i], h);
        if (!s) { ok = 0; out_of_memory = 1; break; }
        /* A free that the source does not split is a request then a completion, at one address. */
        uint8_t first_mop = code == OP_FREE ? OP_FREE_REQUESTED : code;
        int n_micro = code == OP_FREE ? 2 : 1;
        for (int k = 0; k < n_micro; k++) {
            uint8_t mop = k ? OP_FREE_COMPLETED : first_mop;
            int orphan = 0;
            if (!s->used) {
                if (mop != OP_ALLOC) {
                    if (sz < 0 || sz > MAX_SIZE_BYTES) { ok = 0; break; }
                    orphan = 1;
                }
                s->used = 1;
                s->addr = addr[i];
                s->device = (int16_t)dev[i];
                table.len++;
                if (next_id - first_id >= UINT32_MAX) { ok = 0; break; }
                s->id_offset = (uint32_t)(next_id++ - first_id);
                s->alloc_size = sz;
            } else {
                int prev = s->last_op;
                int valid = (prev == OP_ALLOC && mop == OP_FREE_REQUESTED)
                            || (prev == OP_FREE_REQUESTED && mop == OP_FREE_COMPLETED)
                            || (prev == OP_FREE_COMPLETED && mop == OP_ALLOC);
                if (!valid) { ok = 0; break; }
                if (prev == OP_ALLOC && sz >= 0 && sz != s->alloc_size) { ok = 0; break; }
                if (mop == OP_ALLOC) {
                    if (next_id - first_id >= UINT32_MAX) { ok = 0; break; }
                    s->id_offset = (uint32_t)(next_id++ - first_id);
                    s->alloc_size = sz;
                }
            }
            s->last_op = (int8_t)mop;
            int64_t alloc_id = first_id + s->id_offset;
            if (orphan) {
                or_id[n_orphans] = alloc_id;
                or_size[n_orphans] = s->alloc_size;
                or_stream[n_orphans] = stream[i];
                or_dev[n_orphans] = (int16_t)dev[i];
                or_addr[n_orphans] = addr[i];
                n_orphans++;
                if (mop == OP_FREE_COMPLETED)   /* its request fell before the window: emitted first */
                    emit(&ev, ti, K_FREE_REQUESTED, alloc_id, s->alloc_size, stream[i], dev[i], stack[i]);
            }
            uint8_t kind = mop == OP_ALLOC ? K_ALLOC : (mop == OP_FREE_REQUESTED ? K_FREE_REQUESTED : K_FREE_COMPLETED);
            emit(&ev, ti, kind, alloc_id, s->alloc_size, stream[i], dev[i], stack[i]);
        }
        if (!ok) break;
        row_event[i] = (int64_t)ev.len - 1;
        row_id[i] = first_id + s->id_offset;
        row_size[i] = s->alloc_size;
    }
    Py_END_ALLOW_THREADS
    if (out_of_memory) {
        PyErr_NoMemory();
        goto done;
    }
    if (!ok) goto hand_back;
    for (int k = 0; k < 7; k++)
        if (PyByteArray_Resize(out[k], (Py_ssize_t)(ev.len * EV_ITEM[k])) < 0) goto done;
    for (int k = 0; k < 5; k++)
        if (PyByteArray_Resize(out[7 + k], (Py_ssize_t)(n_orphans * OR_ITEM[k])) < 0) goto done;
    result = Py_BuildValue("((OOOOOOO)(OOOOO)OOOn)", out[0], out[1], out[2], out[3], out[4], out[5], out[6],
                           out[7], out[8], out[9], out[10], out[11], out[12], out[13], out[14], (Py_ssize_t)n_orphans);
    goto done;
hand_back:
    result = Py_None;
    Py_INCREF(Py_None);
done:
    for (int k = 0; k < 15; k++) Py_XDECREF(out[k]);
    free(table.slots);
    for (int k = 0; k < 8; k++)
        if (c[k].held) PyBuffer_Release(&c[k].view);
    return result;
}
