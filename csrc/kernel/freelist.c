/* The compiled FreeList type: see freelist.h and allocsim/policies/freelist.py (the reference). */
#include "freelist.h"

static PyObject *SIXTY_FOUR;   /* the int 64 */
static PyObject *LOW_MASK;     /* the int 2**64 - 1 */

int kernel_constants_init(void) {
    SIXTY_FOUR = PyLong_FromLong(64);
    LOW_MASK = PyLong_FromUnsignedLongLong(UINT64_MAX);
    return (SIXTY_FOUR && LOW_MASK) ? 0 : -1;
}

int kernel_as_value(PyObject *obj, uint64_t *out, const char *what) {
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow || v < 0) {
        PyErr_Format(PyExc_ValueError,
                     "%s %R is outside the compiled policy kernel's range [0, 2**63); "
                     "run with ALLOCSIM_KERNEL=reference to use the Python policies", what, obj);
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

static int as_stream_key(PyObject *obj, int64_t *out) {
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "stream key must be an int, not %.100s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow) {
        PyErr_Format(PyExc_ValueError, "stream key %R does not fit in 64 bits", obj);
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

PyObject *kernel_pack_key(uint64_t size, uint64_t addr) {
    PyObject *high = PyLong_FromUnsignedLongLong(size);
    if (!high) return NULL;
    PyObject *shifted = PyNumber_Lshift(high, SIXTY_FOUR);
    Py_DECREF(high);
    if (!shifted) return NULL;
    PyObject *low = PyLong_FromUnsignedLongLong(addr);
    if (!low) {
        Py_DECREF(shifted);
        return NULL;
    }
    PyObject *key = PyNumber_Or(shifted, low);
    Py_DECREF(shifted);
    Py_DECREF(low);
    return key;
}

int kernel_unpack_key(PyObject *key, uint64_t *size, uint64_t *addr) {
    if (!PyLong_Check(key)) {
        PyErr_Format(PyExc_TypeError, "a block key must be an int, not %.100s", Py_TYPE(key)->tp_name);
        return -1;
    }
    PyObject *high = PyNumber_Rshift(key, SIXTY_FOUR);
    if (!high) return -1;
    PyObject *low = PyNumber_And(key, LOW_MASK);
    if (!low) {
        Py_DECREF(high);
        return -1;
    }
    int rc = (kernel_as_value(high, size, "block size") < 0 || kernel_as_value(low, addr, "block address") < 0)
                 ? -1 : 0;
    Py_DECREF(high);
    Py_DECREF(low);
    return rc;
}

static PyObject *value_or_none(int found, uint64_t value) {
    if (!found) Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(value);
}

/* ------------------------------------------------------------------------------ core operations */
BTree *fl_stream_tree(FreeListObject *fl, int64_t stream_key, int create) {
    uint64_t slot;
    if (fl->last_stream_slot >= 0 && fl->last_stream_key == stream_key) return &fl->stream_trees[fl->last_stream_slot];
    if (u64map_get(&fl->stream_slot, (uint64_t)stream_key, &slot)) {
        fl->last_stream_key = stream_key;
        fl->last_stream_slot = (Py_ssize_t)slot;
        return &fl->stream_trees[slot];
    }
    if (!create) return NULL;
    if (fl->n_streams == fl->stream_capacity) {
        Py_ssize_t capacity = fl->stream_capacity ? fl->stream_capacity * 2 : 4;
        int64_t *keys = (int64_t *)PyMem_Realloc(fl->stream_keys, (size_t)capacity * sizeof(int64_t));
        if (!keys) {
            PyErr_NoMemory();
            return NULL;
        }
        fl->stream_keys = keys;
        BTree *trees = (BTree *)PyMem_Realloc(fl->stream_trees, (size_t)capacity * sizeof(BTree));
        if (!trees) {
            PyErr_NoMemory();
            return NULL;
        }
        fl->stream_trees = trees;
        fl->stream_capacity = capacity;
    }
    if (u64map_put(&fl->stream_slot, (uint64_t)stream_key, (uint64_t)fl->n_streams) < 0) {
        PyErr_NoMemory();
        return NULL;
    }
    fl->stream_keys[fl->n_streams] = stream_key;
    memset(&fl->stream_trees[fl->n_streams], 0, sizeof(BTree));
    fl->last_stream_key = stream_key;
    fl->last_stream_slot = fl->n_streams;
    return &fl->stream_trees[fl->n_streams++];
}

static void forget_block(FreeListObject *fl, uint64_t size, uint64_t addr) {
    u64map_del(&fl->size_at, addr, NULL);
    u64map_del(&fl->start_ending_at, addr + size, NULL);
    if (fl->track_age) u64map_del(&fl->inserted_at, addr, NULL);
}

static inline void note_erased(FreeListObject *fl, uint64_t size, uint64_t addr) {
    bt_erase(&fl->all_blocks, block_key(size, addr));
}

int fl_take(FreeListObject *fl, int64_t stream_key, uint64_t size, uint64_t addr) {
    BTree *tree = fl_stream_tree(fl, stream_key, 0);
    if (!tree) return 2;
    if (!bt_erase(tree, block_key(size, addr))) return 1;
    note_erased(fl, size, addr);
    forget_block(fl, size, addr);
    return 0;
}

static int index_block(FreeListObject *fl, BTree *tree, uint64_t addr, uint64_t size) {
    if (bt_insert(tree, block_key(size, addr)) < 0 || bt_insert(&fl->all_blocks, block_key(size, addr)) < 0
            || u64map_put(&fl->size_at, addr, size) < 0
            || u64map_put(&fl->start_ending_at, addr + size, addr) < 0
            || (fl->track_age && u64map_put(&fl->inserted_at, addr, (uint64_t)fl->clock) < 0)) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

int fl_add(FreeListObject *fl, uint64_t addr, uint64_t size, int64_t stream_key) {
    BTree *tree = fl_stream_tree(fl, stream_key, 1);
    if (!tree) return -1;
    return index_block(fl, tree, addr, size);
}

static int corrupt(const char *what, uint64_t addr) {
    PyErr_Format(PyExc_RuntimeError, "free list corrupted: %s block at %#llx is not indexed in its stream",
                 what, (unsigned long long)addr);
    return -1;
}

int fl_free(FreeListObject *fl, uint64_t addr, uint64_t size, int64_t stream_key) {
    BTree *tree = fl_stream_tree(fl, stream_key, 1);
    if (!tree) return -1;
    int merges = 0;
    uint64_t other = 0, other_size = 0;
    if (!u64map_contains(&fl->segment_size_at, addr) && u64map_del(&fl->start_ending_at, addr, &other)) {
        u64map_del(&fl->size_at, other, &other_size);   /* a segment's start is a hard boundary */
        if (!bt_erase(tree, block_key(other_size, other))) return corrupt("previous", other);
        note_erased(fl, other_size, other);
        addr = other;
        size += other_size;
        merges = 1;
    }
    uint64_t end = addr + size;
    if (!u64map_contains(&fl->segment_size_at, end) && u64map_del(&fl->size_at, end, &other_size)) {
        u64map_del(&fl->start_ending_at, end + other_size, NULL);
        if (!bt_erase(tree, block_key(other_size, end))) return corrupt("next", end);
        note_erased(fl, other_size, end);
        if (fl->track_age) u64map_del(&fl->inserted_at, end, NULL);
        size += other_size;
        merges++;
    }
    /* The merged block is new to the set: its age restarts (index_block stamps the clock). */
    if (index_block(fl, tree, addr, size) < 0) return -1;
    return merges;
}

/* ------------------------------------------------------------------------------ walking trees */
typedef struct {
    PyObject *out;
    int64_t stream_key;
    const FreeListObject *fl;
    int mode;   /* 0: keys, 1: (addr, size, stream key), 2: whole free segments, 3: sum of sizes */
    uint64_t total;
} WalkCtx;

static int collect(BlockKey key, void *arg) {
    WalkCtx *ctx = (WalkCtx *)arg;
    PyObject *item;
    uint64_t segment_size, size = key_size(key), addr = key_addr(key);
    switch (ctx->mode) {
    case 0:
        item = kernel_pack_key(size, addr);
        break;
    case 2:
        if (!u64map_get(&ctx->fl->segment_size_at, addr, &segment_size) || segment_size != size)
            return 0;
        /* fall through */
    case 1:
        item = Py_BuildValue("(KKL)", (unsigned long long)addr, (unsigned long long)size, (long long)ctx->stream_key);
        break;
    default:
        ctx->total += size;
        return 0;
    }
    if (!item) return 1;
    int rc = PyList_Append(ctx->out, item);
    Py_DECREF(item);
    return rc < 0 ? 1 : 0;
}

static int walk_stream(FreeListObject *fl, int64_t stream_key, WalkCtx *ctx) {
    BTree *tree = fl_stream_tree(fl, stream_key, 0);
    if (!tree) return 0;
    ctx->stream_key = stream_key;
    return bt_walk(tree, collect, ctx) ? -1 : 0;
}

static int cmp_int64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* ------------------------------------------------------------------------------ Python methods */
static PyObject *FreeList_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    FreeListObject *fl = (FreeListObject *)type->tp_alloc(type, 0);
    if (!fl) return NULL;
    u64map_init(&fl->size_at);
    u64map_init(&fl->start_ending_at);
    u64map_init(&fl->segment_size_at);
    u64map_init(&fl->segment_stream_at);
    u64map_init(&fl->inserted_at);
    u64map_init(&fl->stream_slot);
    fl->last_stream_slot = -1;
    return (PyObject *)fl;
}

static int FreeList_init(FreeListObject *fl, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"track_age", NULL};
    int track_age = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$p:FreeList", kwlist, &track_age)) return -1;
    fl->track_age = track_age;
    return 0;
}

static void FreeList_dealloc(FreeListObject *fl) {
    u64map_free(&fl->size_at);
    u64map_free(&fl->start_ending_at);
    u64map_free(&fl->segment_size_at);
    u64map_free(&fl->segment_stream_at);
    u64map_free(&fl->inserted_at);
    u64map_free(&fl->stream_slot);
    for (Py_ssize_t k = 0; k < fl->n_streams; k++) bt_free(&fl->stream_trees[k]);
    bt_free(&fl->all_blocks);
    PyMem_Free(fl->stream_keys);
    PyMem_Free(fl->stream_trees);
    Py_TYPE(fl)->tp_free((PyObject *)fl);
}

static int parse_block(PyObject *const *args, Py_ssize_t nargs, const char *name, uint64_t *addr, uint64_t *size,
                       int64_t *stream_key) {
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "%s() takes (addr, size_bytes, stream_key)", name);
        return -1;
    }
    if (kernel_as_value(args[0], addr, "address") < 0 || kernel_as_value(args[1], size, "size") < 0
            || as_stream_key(args[2], stream_key) < 0)
        return -1;
    return 0;
}

static PyObject *FreeList_add_segment(FreeListObject *fl, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t addr, size;
    int64_t stream_key;
    if (parse_block(args, nargs, "add_segment", &addr, &size, &stream_key) < 0) return NULL;
    if (fl->segment_bytes + size >= KERNEL_VALUE_LIMIT) {
        PyErr_SetString(PyExc_ValueError, "segments of one pool add up to 2**63 bytes or more: outside the "
                                          "compiled policy kernel's range (use ALLOCSIM_KERNEL=reference)");
        return NULL;
    }
    if (u64map_put(&fl->segment_size_at, addr, size) < 0
            || u64map_put(&fl->segment_stream_at, addr, (uint64_t)stream_key) < 0)
        return PyErr_NoMemory();
    fl->segment_bytes += size;
    Py_RETURN_NONE;
}

static int segment_size_or_keyerror(FreeListObject *fl, PyObject *arg, uint64_t *addr, uint64_t *size) {
    if (kernel_as_value(arg, addr, "address") < 0) return -1;
    if (!u64map_get(&fl->segment_size_at, *addr, size)) {
        PyErr_SetObject(PyExc_KeyError, arg);
        return -1;
    }
    return 0;
}

static PyObject *FreeList_is_whole_free(FreeListObject *fl, PyObject *arg) {
    uint64_t addr, segment_size, size;
    if (kernel_as_value(arg, &addr, "address") < 0) return NULL;
    /* Any address that does not start a segment (a free piece of a split one) is simply not whole. */
    return PyBool_FromLong(u64map_get(&fl->segment_size_at, addr, &segment_size)
                           && u64map_get(&fl->size_at, addr, &size) && size == segment_size);
}

static PyObject *take_result(int rc, int64_t stream_key, uint64_t size, uint64_t addr) {
    if (rc == 0) Py_RETURN_NONE;
    if (rc == 2) {
        PyObject *key = PyLong_FromLongLong(stream_key);
        if (key) {
            PyErr_SetObject(PyExc_KeyError, key);
            Py_DECREF(key);
        }
        return NULL;
    }
    if (rc == 1) {
        PyObject *key = kernel_pack_key(size, addr);
        PyObject *hex = key ? PyNumber_ToBase(key, 16) : NULL;
        if (hex) PyErr_Format(PyExc_ValueError, "no free block with key %U in stream %lld", hex, (long long)stream_key);
        Py_XDECREF(hex);
        Py_XDECREF(key);
    }
    return NULL;
}

static PyObject *FreeList_remove_segment(FreeListObject *fl, PyObject *arg) {
    uint64_t addr, size, stream = 0;
    if (segment_size_or_keyerror(fl, arg, &addr, &size) < 0) return NULL;
    u64map_del(&fl->segment_size_at, addr, NULL);
    u64map_del(&fl->segment_stream_at, addr, &stream);
    int rc = fl_take(fl, (int64_t)stream, size, addr);
    if (rc) return take_result(rc, (int64_t)stream, size, addr);
    fl->segment_bytes -= size;
    return PyLong_FromUnsignedLongLong(size);
}

static PyObject *FreeList_forget_segment(FreeListObject *fl, PyObject *arg) {
    uint64_t addr, size;
    if (segment_size_or_keyerror(fl, arg, &addr, &size) < 0) return NULL;
    u64map_del(&fl->segment_size_at, addr, NULL);
    u64map_del(&fl->segment_stream_at, addr, NULL);
    fl->segment_bytes -= size;
    return PyLong_FromUnsignedLongLong(size);
}

static PyObject *FreeList_whole_free_segments(FreeListObject *fl, PyObject *args) {
    PyObject *stream_obj = Py_None;
    if (!PyArg_ParseTuple(args, "|O:whole_free_segments", &stream_obj)) return NULL;
    WalkCtx ctx = {PyList_New(0), 0, fl, 2, 0};
    if (!ctx.out) return NULL;
    if (stream_obj != Py_None) {
        int64_t stream_key;
        if (as_stream_key(stream_obj, &stream_key) < 0 || walk_stream(fl, stream_key, &ctx) < 0) goto error;
        return ctx.out;
    }
    int64_t *keys = (int64_t *)PyMem_Malloc((size_t)(fl->n_streams ? fl->n_streams : 1) * sizeof(int64_t));
    if (!keys) {
        PyErr_NoMemory();
        goto error;
    }
    if (fl->n_streams)    /* no streams yet: stream_keys may be NULL, which memcpy must never get */
        memcpy(keys, fl->stream_keys, (size_t)fl->n_streams * sizeof(int64_t));
    qsort(keys, (size_t)fl->n_streams, sizeof(int64_t), cmp_int64);
    for (Py_ssize_t k = 0; k < fl->n_streams; k++) {
        if (walk_stream(fl, keys[k], &ctx) < 0) {
            PyMem_Free(keys);
            goto error;
        }
    }
    PyMem_Free(keys);
    return ctx.out;
error:
    Py_DECREF(ctx.out);
    return NULL;
}

static int parse_stream_and_size(PyObject *const *args, Py_ssize_t nargs, const char *name, int64_t *stream_key,
                                 uint64_t *size) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "%s() takes (stream_key, size_bytes)", name);
        return -1;
    }
    if (as_stream_key(args[0], stream_key) < 0) return -1;
    /* A size at or past 2**63 fits no block; clamp it so the answer is simply "none". */
    if (PyLong_Check(args[1])) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(args[1], &overflow);
        if (v == -1 && PyErr_Occurred()) return -1;
        *size = overflow > 0 ? KERNEL_VALUE_LIMIT : (overflow < 0 || v < 0) ? 0 : (uint64_t)v;
        return 0;
    }
    return kernel_as_value(args[1], size, "size");
}

static PyObject *FreeList_best_fit(FreeListObject *fl, PyObject *const *args, Py_ssize_t nargs) {
    int64_t stream_key;
    uint64_t size;
    if (parse_stream_and_size(args, nargs, "best_fit", &stream_key, &size) < 0) return NULL;
    BlockKey key;
    if (!fl_best_fit(fl, stream_key, size, &key)) return PyLong_FromLong(-1);
    return kernel_pack_key(key_size(key), key_addr(key));
}

static PyObject *FreeList_pop_best_fit(FreeListObject *fl, PyObject *const *args, Py_ssize_t nargs) {
    int64_t stream_key;
    uint64_t size;
    if (parse_stream_and_size(args, nargs, "pop_best_fit", &stream_key, &size) < 0) return NULL;
    BlockKey key;
    if (!fl_best_fit(fl, stream_key, size, &key)) return PyLong_FromLong(-1);
    uint64_t block_size = key_size(key), addr = key_addr(key);
    fl_take(fl, stream_key, block_size, addr);
    return kernel_pack_key(block_size, addr);
}

static PyObject *FreeList_keys(FreeListObject *fl, PyObject *arg) {
    int64_t stream_key;
    if (as_stream_key(arg, &stream_key) < 0) return NULL;
    WalkCtx ctx = {PyList_New(0), 0, fl, 0, 0};
    if (!ctx.out) return NULL;
    if (walk_stream(fl, stream_key, &ctx) < 0) {
        Py_DECREF(ctx.out);
        return NULL;
    }
    return ctx.out;
}

static PyObject *FreeList_next_key(FreeListObject *fl, PyObject *const *args, Py_ssize_t nargs) {
    int64_t stream_key;
    uint64_t size, addr;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "next_key() takes (stream_key, key)");
        return NULL;
    }
    if (as_stream_key(args[0], &stream_key) < 0 || kernel_unpack_key(args[1], &size, &addr) < 0) return NULL;
    BTree *tree = fl_stream_tree(fl, stream_key, 0);
    BlockKey key;
    if (!tree || !bt_lower_bound(tree, block_key(size, addr) + 1, &key)) return PyLong_FromLong(-1);
    return kernel_pack_key(key_size(key), key_addr(key));
}

static PyObject *FreeList_take(FreeListObject *fl, PyObject *const *args, Py_ssize_t nargs) {
    int64_t stream_key;
    uint64_t size, addr;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "take() takes (stream_key, key)");
        return NULL;
    }
    if (as_stream_key(args[0], &stream_key) < 0 || kernel_unpack_key(args[1], &size, &addr) < 0) return NULL;
    return take_result(fl_take(fl, stream_key, size, addr), stream_key, size, addr);
}

static PyObject *FreeList_add(FreeListObject *fl, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t addr, size;
    int64_t stream_key;
    if (parse_block(args, nargs, "add", &addr, &size, &stream_key) < 0) return NULL;
    if (fl_add(fl, addr, size, stream_key) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *FreeList_free(FreeListObject *fl, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t addr, size;
    int64_t stream_key;
    if (parse_block(args, nargs, "free", &addr, &size, &stream_key) < 0) return NULL;
    int merges = fl_free(fl, addr, size, stream_key);
    if (merges < 0) return NULL;
    return PyLong_FromLong(merges);
}

static PyObject *FreeList_largest(FreeListObject *fl, PyObject *Py_UNUSED(ignored)) {
    BlockKey key;
    return PyLong_FromUnsignedLongLong(bt_last(&fl->all_blocks, &key) ? key_size(key) : 0);
}

static PyObject *FreeList_blocks(FreeListObject *fl, PyObject *Py_UNUSED(ignored)) {
    WalkCtx ctx = {PyList_New(0), 0, fl, 1, 0};
    if (!ctx.out) return NULL;
    for (Py_ssize_t k = 0; k < fl->n_streams; k++) {
        if (walk_stream(fl, fl->stream_keys[k], &ctx) < 0) {
            Py_DECREF(ctx.out);
            return NULL;
        }
    }
    return ctx.out;
}

static PyObject *FreeList_stream_bytes(FreeListObject *fl, PyObject *arg) {
    int64_t stream_key;
    if (as_stream_key(arg, &stream_key) < 0) return NULL;
    WalkCtx ctx = {NULL, 0, fl, 3, 0};
    if (walk_stream(fl, stream_key, &ctx) < 0) return NULL;
    return PyLong_FromUnsignedLongLong(ctx.total);
}

static PyObject *FreeList_stream_keys(FreeListObject *fl, PyObject *Py_UNUSED(ignored)) {
    PyObject *out = PyList_New(fl->n_streams);
    if (!out) return NULL;
    for (Py_ssize_t k = 0; k < fl->n_streams; k++) {
        PyObject *key = PyLong_FromLongLong(fl->stream_keys[k]);
        if (!key) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, k, key);
    }
    return out;
}

static PyObject *FreeList_segment_of(FreeListObject *fl, PyObject *arg) {
    uint64_t addr, start, size;
    if (kernel_as_value(arg, &addr, "address") < 0) return NULL;
    size_t cursor = 0;
    while (u64map_next(&fl->segment_size_at, &cursor, &start, &size)) {
        if (start <= addr && addr < start + size) return PyLong_FromUnsignedLongLong(start);
    }
    PyErr_Format(PyExc_KeyError, "no segment holds %#llx", (unsigned long long)addr);
    return NULL;
}

/* One-address lookups, each None when absent (the reference's dict.get). */
static PyObject *lookup(U64Map *map, PyObject *arg, int as_stream) {
    uint64_t addr, value;
    if (kernel_as_value(arg, &addr, "address") < 0) return NULL;
    int found = u64map_get(map, addr, &value);
    if (found && as_stream) return PyLong_FromLongLong((int64_t)value);
    return value_or_none(found, value);
}

static PyObject *FreeList_block_size(FreeListObject *fl, PyObject *arg) { return lookup(&fl->size_at, arg, 0); }
static PyObject *FreeList_block_ending_at(FreeListObject *fl, PyObject *arg) {
    return lookup(&fl->start_ending_at, arg, 0);
}
static PyObject *FreeList_segment_size(FreeListObject *fl, PyObject *arg) {
    return lookup(&fl->segment_size_at, arg, 0);
}
static PyObject *FreeList_segment_stream(FreeListObject *fl, PyObject *arg) {
    return lookup(&fl->segment_stream_at, arg, 1);
}
static PyObject *FreeList_inserted_clock(FreeListObject *fl, PyObject *arg) {
    uint64_t addr, value;
    if (kernel_as_value(arg, &addr, "address") < 0) return NULL;
    if (!fl->track_age || !u64map_get(&fl->inserted_at, addr, &value)) Py_RETURN_NONE;
    return PyLong_FromLongLong((int64_t)value);
}

static PyObject *FreeList_items(FreeListObject *fl, PyObject *arg) {
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    U64Map *map = NULL;
    int signed_values = 0;
    if (!strcmp(name, "size_at")) map = &fl->size_at;
    else if (!strcmp(name, "start_ending_at")) map = &fl->start_ending_at;
    else if (!strcmp(name, "segment_size_at")) map = &fl->segment_size_at;
    else if (!strcmp(name, "segment_stream_at")) map = &fl->segment_stream_at, signed_values = 1;
    else if (!strcmp(name, "inserted_at")) map = &fl->inserted_at, signed_values = 1;
    if (!map) {
        PyErr_Format(PyExc_ValueError, "no index called %R", arg);
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    size_t cursor = 0;
    uint64_t key, value;
    while (u64map_next(map, &cursor, &key, &value)) {
        PyObject *item = signed_values ? Py_BuildValue("(KL)", (unsigned long long)key, (long long)value)
                                       : Py_BuildValue("(KK)", (unsigned long long)key, (unsigned long long)value);
        if (!item || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(item);
    }
    return out;
}

static PyObject *FreeList_get_segment_bytes(FreeListObject *fl, void *Py_UNUSED(closure)) {
    return PyLong_FromUnsignedLongLong(fl->segment_bytes);
}

static PyObject *FreeList_get_clock(FreeListObject *fl, void *Py_UNUSED(closure)) {
    return PyLong_FromLongLong(fl->clock);
}

static int FreeList_set_clock(FreeListObject *fl, PyObject *value, void *Py_UNUSED(closure)) {
    if (!value) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete clock");
        return -1;
    }
    long long clock = PyLong_AsLongLong(value);
    if (clock == -1 && PyErr_Occurred()) return -1;
    fl->clock = clock;
    return 0;
}

static PyObject *FreeList_get_track_age(FreeListObject *fl, void *Py_UNUSED(closure)) {
    return PyBool_FromLong(fl->track_age);
}

static PyObject *FreeList_get_free_bytes(FreeListObject *fl, void *Py_UNUSED(closure)) {
    size_t cursor = 0;
    uint64_t key, value, total = 0;
    while (u64map_next(&fl->size_at, &cursor, &key, &value)) total += value;
    return PyLong_FromUnsignedLongLong(total);
}

static PyMethodDef FreeList_methods[] = {
    {"add_segment", (PyCFunction)(void (*)(void))FreeList_add_segment, METH_FASTCALL,
     "add_segment(addr, size_bytes, stream_key): register a new segment (no free block yet)."},
    {"is_whole_free", (PyCFunction)FreeList_is_whole_free, METH_O,
     "is_whole_free(addr): does addr start a segment that is one free block?"},
    {"remove_segment", (PyCFunction)FreeList_remove_segment, METH_O,
     "remove_segment(addr): forget a wholly free segment and its free block; return its size."},
    {"forget_segment", (PyCFunction)FreeList_forget_segment, METH_O,
     "forget_segment(addr): drop the record of a segment that holds no free block; return its size."},
    {"whole_free_segments", (PyCFunction)FreeList_whole_free_segments, METH_VARARGS,
     "whole_free_segments(stream_key=None): (addr, size, stream_key) of wholly free segments, in order."},
    {"best_fit", (PyCFunction)(void (*)(void))FreeList_best_fit, METH_FASTCALL,
     "best_fit(stream_key, size_bytes): key of the smallest free block that fits, or -1."},
    {"pop_best_fit", (PyCFunction)(void (*)(void))FreeList_pop_best_fit, METH_FASTCALL,
     "pop_best_fit(stream_key, size_bytes): remove and return the best fit's key, or -1."},
    {"keys", (PyCFunction)FreeList_keys, METH_O, "keys(stream_key): the sorted keys of one stream's free blocks."},
    {"next_key", (PyCFunction)(void (*)(void))FreeList_next_key, METH_FASTCALL,
     "next_key(stream_key, key): the smallest key of the stream above key, or -1."},
    {"take", (PyCFunction)(void (*)(void))FreeList_take, METH_FASTCALL,
     "take(stream_key, key): remove the free block with this key."},
    {"add", (PyCFunction)(void (*)(void))FreeList_add, METH_FASTCALL,
     "add(addr, size_bytes, stream_key): insert a free block whose neighbours are not free."},
    {"free", (PyCFunction)(void (*)(void))FreeList_free, METH_FASTCALL,
     "free(addr, size_bytes, stream_key): return a block, merging free neighbours; return the merge count."},
    {"largest", (PyCFunction)FreeList_largest, METH_NOARGS, "largest(): size of the largest free block (0 if none)."},
    {"blocks", (PyCFunction)FreeList_blocks, METH_NOARGS, "blocks(): (addr, size, stream_key) of every free block."},
    {"stream_bytes", (PyCFunction)FreeList_stream_bytes, METH_O, "stream_bytes(stream_key): bytes in its free blocks."},
    {"stream_keys", (PyCFunction)FreeList_stream_keys, METH_NOARGS,
     "stream_keys(): every stream key that ever held a free block, in first-use order."},
    {"segment_of", (PyCFunction)FreeList_segment_of, METH_O, "segment_of(addr): start of the segment holding addr."},
    {"block_size", (PyCFunction)FreeList_block_size, METH_O,
     "block_size(addr): size of the free block starting at addr, or None."},
    {"block_ending_at", (PyCFunction)FreeList_block_ending_at, METH_O,
     "block_ending_at(end): start of the free block ending at end, or None."},
    {"segment_size", (PyCFunction)FreeList_segment_size, METH_O,
     "segment_size(addr): size of the segment starting at addr, or None."},
    {"segment_stream", (PyCFunction)FreeList_segment_stream, METH_O,
     "segment_stream(addr): stream key of the segment starting at addr, or None."},
    {"inserted_clock", (PyCFunction)FreeList_inserted_clock, METH_O,
     "inserted_clock(addr): clock when the free block at addr entered the set, or None."},
    {"_items", (PyCFunction)FreeList_items, METH_O, "_items(name): (key, value) pairs of one index, for views."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef FreeList_getset[] = {
    {"segment_bytes", (getter)FreeList_get_segment_bytes, NULL, "bytes of the pool's segments", NULL},
    {"clock", (getter)FreeList_get_clock, (setter)FreeList_set_clock, "get_free_block call count", NULL},
    {"track_age", (getter)FreeList_get_track_age, NULL, "whether free blocks carry ages", NULL},
    {"free_bytes", (getter)FreeList_get_free_bytes, NULL, "bytes in free blocks", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject FreeList_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "allocsim.policies._kernel.FreeList",
    .tp_doc = "Free blocks of one pool (compiled): the same contents and methods as the reference FreeList.",
    .tp_basicsize = sizeof(FreeListObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = FreeList_new,
    .tp_init = (initproc)FreeList_init,
    .tp_dealloc = (destructor)FreeList_dealloc,
    .tp_methods = FreeList_methods,
    .tp_getset = FreeList_getset,
};
