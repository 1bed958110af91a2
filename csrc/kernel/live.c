/* The compiled live table and its pending set: see live.h. */
#include "live.h"

#include "u64map.h"
#include "../common/siphash.h"

#define LIVE_MIN_CAPACITY 16

static int as_id(PyObject *obj, int64_t *out) {
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "allocation ids must be ints, not %.100s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow) {
        PyErr_Format(PyExc_ValueError, "allocation id %R does not fit in 64 bits", obj);
        return -1;
    }
    *out = v;
    return 0;
}

/* -1: error; 0: not an int64 (so it cannot be in the table); 1: *out set. */
static int maybe_id(PyObject *obj, int64_t *out) {
    if (!PyLong_Check(obj)) return 0;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow) return 0;
    *out = v;
    return 1;
}

/* ------------------------------------------------------------------------------ the table */
/* Ids come from the trace file (Parquet lets it choose any int64): slots are picked by a keyed
 * hash whose key is drawn once per process (live_key_init), so no file can make ids collide. */
static uint64_t LIVE_KEY0 = 0x0123456789abcdefULL, LIVE_KEY1 = 0xfedcba9876543210ULL;

int live_key_init(void) {
    PyObject *os = PyImport_ImportModule("os");
    if (!os) return -1;
    PyObject *raw = PyObject_CallMethod(os, "urandom", "n", (Py_ssize_t)16);
    Py_DECREF(os);
    if (!raw) return -1;
    if (!PyBytes_Check(raw) || PyBytes_GET_SIZE(raw) != 16) {
        Py_DECREF(raw);
        PyErr_SetString(PyExc_RuntimeError, "os.urandom(16) did not return 16 bytes");
        return -1;
    }
    memcpy(&LIVE_KEY0, PyBytes_AS_STRING(raw), 8);
    memcpy(&LIVE_KEY1, PyBytes_AS_STRING(raw) + 8, 8);
    Py_DECREF(raw);
    return 0;
}

static inline size_t home_of(int64_t id, size_t mask) {
    return (size_t)siphash13_u64((uint64_t)id, LIVE_KEY0, LIVE_KEY1) & mask;
}

LiveEntry *live_get(LiveTableObject *t, int64_t id) {
    if (!t->capacity) return NULL;
    size_t mask = t->capacity - 1;
    for (size_t i = home_of(id, mask);; i = (i + 1) & mask) {
        LiveEntry *e = &t->slots[i];
        if (!e->used) return NULL;
        if (e->id == id) return e;
    }
}

static int live_grow(LiveTableObject *t) {
    size_t capacity = t->capacity ? t->capacity * 2 : LIVE_MIN_CAPACITY;
    if (capacity > ((size_t)-1) / sizeof(LiveEntry)) return -1;
    LiveEntry *slots = (LiveEntry *)PyMem_Calloc(capacity, sizeof(LiveEntry));
    if (!slots) return -1;
    size_t mask = capacity - 1;
    for (size_t j = 0; j < t->capacity; j++) {
        if (!t->slots[j].used) continue;
        size_t i = home_of(t->slots[j].id, mask);
        while (slots[i].used) i = (i + 1) & mask;
        slots[i] = t->slots[j];
    }
    PyMem_Free(t->slots);
    t->slots = slots;
    t->capacity = capacity;
    return 0;
}

LiveEntry *live_insert(LiveTableObject *t, int64_t id) {
    if ((t->used + 1) * 2 > t->capacity && live_grow(t) < 0) {
        PyErr_NoMemory();
        return NULL;
    }
    size_t mask = t->capacity - 1;
    size_t i = home_of(id, mask);
    while (t->slots[i].used) i = (i + 1) & mask;
    LiveEntry *e = &t->slots[i];
    memset(e, 0, sizeof(*e));
    e->used = 1;
    e->id = id;
    t->used++;
    return e;
}

void live_delete(LiveTableObject *t, LiveEntry *entry) {
    size_t mask = t->capacity - 1;
    size_t hole = (size_t)(entry - t->slots);
    if (entry->pending) t->n_pending--;
    /* Backward-shift deletion (no tombstones), as in u64map.h. */
    for (size_t j = (hole + 1) & mask; t->slots[j].used; j = (j + 1) & mask) {
        size_t home = home_of(t->slots[j].id, mask);
        int stays = (hole <= j) ? (hole < home && home <= j) : (hole < home || home <= j);
        if (stays) continue;
        t->slots[hole] = t->slots[j];
        hole = j;
    }
    t->slots[hole].used = 0;
    t->used--;
}

static PyObject *entry_tuple(const LiveEntry *e) {
    return Py_BuildValue("(KLKL)", (unsigned long long)e->addr, (long long)e->requested,
                         (unsigned long long)e->allocated, (long long)e->stream);
}

/* Fill e from a 4-tuple (addr, requested, allocated, stream); -1 with an error set. */
static int entry_from(LiveEntry *e, PyObject *value) {
    if (!PyTuple_Check(value) || PyTuple_GET_SIZE(value) != 4) {
        PyErr_SetString(PyExc_TypeError, "a live entry is a tuple (addr, requested, allocated, stream)");
        return -1;
    }
    long long v[4];
    for (int k = 0; k < 4; k++) {
        PyObject *item = PyTuple_GET_ITEM(value, k);
        int overflow = 0;
        v[k] = PyLong_Check(item) ? PyLong_AsLongLongAndOverflow(item, &overflow) : (overflow = 2, 0);
        if (v[k] == -1 && PyErr_Occurred()) return -1;
        if (overflow || ((k == 0 || k == 2) && v[k] < 0)) {
            PyErr_Format(PyExc_ValueError, "live entry %R is outside the compiled policy kernel's range "
                                           "(run with ALLOCSIM_KERNEL=reference to use the Python policies)", value);
            return -1;
        }
    }
    e->addr = (uint64_t)v[0];
    e->requested = v[1];
    e->allocated = (uint64_t)v[2];
    e->stream = v[3];
    return 0;
}

/* ------------------------------------------------------------------------------ LiveTable: a dict */
static PyObject *LiveTable_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) || (kwds && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "LiveTable() takes no arguments");
        return NULL;
    }
    return type->tp_alloc(type, 0);
}

static void LiveTable_dealloc(LiveTableObject *t) {
    PyMem_Free(t->slots);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static Py_ssize_t LiveTable_len(LiveTableObject *t) { return (Py_ssize_t)t->used; }

static int LiveTable_contains(LiveTableObject *t, PyObject *key) {
    int64_t id;
    int rc = maybe_id(key, &id);
    if (rc <= 0) return rc;
    return live_get(t, id) != NULL;
}

static PyObject *LiveTable_getitem(LiveTableObject *t, PyObject *key) {
    int64_t id;
    int rc = maybe_id(key, &id);
    if (rc < 0) return NULL;
    LiveEntry *e = rc ? live_get(t, id) : NULL;
    if (!e) {
        PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    return entry_tuple(e);
}

static int LiveTable_setitem(LiveTableObject *t, PyObject *key, PyObject *value) {
    int64_t id;
    if (!value) {   /* del live[key] */
        int rc = maybe_id(key, &id);
        if (rc < 0) return -1;
        LiveEntry *e = rc ? live_get(t, id) : NULL;
        if (!e) {
            PyErr_SetObject(PyExc_KeyError, key);
            return -1;
        }
        live_delete(t, e);
        return 0;
    }
    if (as_id(key, &id) < 0) return -1;
    LiveEntry fresh;
    if (entry_from(&fresh, value) < 0) return -1;
    LiveEntry *e = live_get(t, id);
    if (!e && !(e = live_insert(t, id))) return -1;
    e->addr = fresh.addr;
    e->requested = fresh.requested;
    e->allocated = fresh.allocated;
    e->stream = fresh.stream;
    return 0;
}

static PyObject *LiveTable_get(LiveTableObject *t, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get() takes (alloc_id, default=None)");
        return NULL;
    }
    int64_t id;
    int rc = maybe_id(args[0], &id);
    if (rc < 0) return NULL;
    LiveEntry *e = rc ? live_get(t, id) : NULL;
    if (e) return entry_tuple(e);
    PyObject *fallback = nargs == 2 ? args[1] : Py_None;
    Py_INCREF(fallback);
    return fallback;
}

static PyObject *LiveTable_pop(LiveTableObject *t, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "pop() takes (alloc_id[, default])");
        return NULL;
    }
    int64_t id;
    int rc = maybe_id(args[0], &id);
    if (rc < 0) return NULL;
    LiveEntry *e = rc ? live_get(t, id) : NULL;
    if (!e) {
        if (nargs == 2) {
            Py_INCREF(args[1]);
            return args[1];
        }
        PyErr_SetObject(PyExc_KeyError, args[0]);
        return NULL;
    }
    PyObject *value = entry_tuple(e);
    if (value) live_delete(t, e);
    return value;
}

/* mode 0: keys (a set), 1: values, 2: items, 3: keys (a list, for iteration), 4: pending ids */
static PyObject *collect(LiveTableObject *t, int mode) {
    PyObject *out = mode == 0 ? PySet_New(NULL) : PyList_New(0);
    if (!out) return NULL;
    for (size_t j = 0; j < t->capacity; j++) {
        const LiveEntry *e = &t->slots[j];
        if (!e->used || (mode == 4 && !e->pending)) continue;
        PyObject *item = NULL, *id = NULL, *value = NULL;
        if (mode == 1) {
            item = entry_tuple(e);
        } else if (mode == 2) {
            id = PyLong_FromLongLong(e->id);
            value = id ? entry_tuple(e) : NULL;
            item = value ? PyTuple_Pack(2, id, value) : NULL;
            Py_XDECREF(id);
            Py_XDECREF(value);
        } else {
            item = PyLong_FromLongLong(e->id);
        }
        int rc = item ? (mode == 0 ? PySet_Add(out, item) : PyList_Append(out, item)) : -1;
        Py_XDECREF(item);
        if (rc < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

static PyObject *LiveTable_keys(LiveTableObject *t, PyObject *Py_UNUSED(ignored)) { return collect(t, 0); }
static PyObject *LiveTable_values(LiveTableObject *t, PyObject *Py_UNUSED(ignored)) { return collect(t, 1); }
static PyObject *LiveTable_items(LiveTableObject *t, PyObject *Py_UNUSED(ignored)) { return collect(t, 2); }

static PyObject *LiveTable_iter(LiveTableObject *t) {
    PyObject *ids = collect(t, 3);
    if (!ids) return NULL;
    PyObject *it = PyObject_GetIter(ids);
    Py_DECREF(ids);
    return it;
}

static PyObject *LiveTable_pending_set(LiveTableObject *t, PyObject *Py_UNUSED(ignored)) {
    PendingSetObject *p = PyObject_New(PendingSetObject, &PendingSet_Type);
    if (!p) return NULL;
    Py_INCREF(t);
    p->table = t;
    return (PyObject *)p;
}

static PyMappingMethods LiveTable_mapping = {
    .mp_length = (lenfunc)LiveTable_len,
    .mp_subscript = (binaryfunc)LiveTable_getitem,
    .mp_ass_subscript = (objobjargproc)LiveTable_setitem,
};

static PySequenceMethods LiveTable_sequence = {
    .sq_contains = (objobjproc)LiveTable_contains,
};

static PyMethodDef LiveTable_methods[] = {
    {"get", (PyCFunction)(void (*)(void))LiveTable_get, METH_FASTCALL, "get(alloc_id, default=None)"},
    {"pop", (PyCFunction)(void (*)(void))LiveTable_pop, METH_FASTCALL, "pop(alloc_id[, default])"},
    {"keys", (PyCFunction)LiveTable_keys, METH_NOARGS, "keys(): the live ids (a set)"},
    {"values", (PyCFunction)LiveTable_values, METH_NOARGS, "values(): (addr, requested, allocated, stream) of each"},
    {"items", (PyCFunction)LiveTable_items, METH_NOARGS, "items(): (alloc_id, entry) pairs"},
    {"pending_set", (PyCFunction)LiveTable_pending_set, METH_NOARGS, "pending_set(): the set view of pending ids"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject LiveTable_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "allocsim.policies._kernel.LiveTable",
    .tp_doc = "A policy's live allocations (compiled): alloc_id -> (addr, requested, allocated, stream).",
    .tp_basicsize = sizeof(LiveTableObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = LiveTable_new,
    .tp_dealloc = (destructor)LiveTable_dealloc,
    .tp_as_mapping = &LiveTable_mapping,
    .tp_as_sequence = &LiveTable_sequence,
    .tp_iter = (getiterfunc)LiveTable_iter,
    .tp_methods = LiveTable_methods,
};

/* ------------------------------------------------------------------------------ PendingSet: a set */
static void PendingSet_dealloc(PendingSetObject *p) {
    Py_XDECREF(p->table);
    PyObject_Free(p);
}

static Py_ssize_t PendingSet_len(PendingSetObject *p) { return (Py_ssize_t)p->table->n_pending; }

static int PendingSet_contains(PendingSetObject *p, PyObject *key) {
    int64_t id;
    int rc = maybe_id(key, &id);
    if (rc <= 0) return rc;
    LiveEntry *e = live_get(p->table, id);
    return e != NULL && e->pending;
}

/* op 0: add (the id must be live), 1: discard, 2: remove */
static PyObject *pending_change(PendingSetObject *p, PyObject *key, int op) {
    int64_t id;
    int rc = maybe_id(key, &id);
    if (rc < 0) return NULL;
    LiveEntry *e = rc ? live_get(p->table, id) : NULL;
    if (op == 0) {
        if (!e) {
            PyErr_Format(PyExc_KeyError, "pending ids must be live: %R", key);
            return NULL;
        }
        if (!e->pending) {
            e->pending = 1;
            p->table->n_pending++;
        }
    } else if (e && e->pending) {
        e->pending = 0;
        p->table->n_pending--;
    } else if (op == 2) {
        PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *PendingSet_add(PendingSetObject *p, PyObject *key) { return pending_change(p, key, 0); }
static PyObject *PendingSet_discard(PendingSetObject *p, PyObject *key) { return pending_change(p, key, 1); }
static PyObject *PendingSet_remove(PendingSetObject *p, PyObject *key) { return pending_change(p, key, 2); }

static PyObject *PendingSet_iter(PendingSetObject *p) {
    PyObject *ids = collect(p->table, 4);
    if (!ids) return NULL;
    PyObject *it = PyObject_GetIter(ids);
    Py_DECREF(ids);
    return it;
}

/* Comparisons as a set: <= (a subset of any container), ==, != (with any set or set view). */
static PyObject *PendingSet_richcompare(PendingSetObject *p, PyObject *other, int op) {
    PyObject *mine = collect(p->table, 4);
    if (!mine) return NULL;
    PyObject *as_set = PyFrozenSet_New(mine);
    Py_DECREF(mine);
    if (!as_set) return NULL;
    PyObject *result = PyObject_RichCompare(as_set, other, op);
    Py_DECREF(as_set);
    return result;
}

static PySequenceMethods PendingSet_sequence = {
    .sq_length = (lenfunc)PendingSet_len,
    .sq_contains = (objobjproc)PendingSet_contains,
};

static PyMethodDef PendingSet_methods[] = {
    {"add", (PyCFunction)PendingSet_add, METH_O, "add(alloc_id): mark a live allocation's free as requested"},
    {"discard", (PyCFunction)PendingSet_discard, METH_O, "discard(alloc_id)"},
    {"remove", (PyCFunction)PendingSet_remove, METH_O, "remove(alloc_id): KeyError if not pending"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject PendingSet_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "allocsim.policies._kernel.PendingSet",
    .tp_doc = "The ids of a LiveTable whose free was requested and has not completed (a set view).",
    .tp_basicsize = sizeof(PendingSetObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)PendingSet_dealloc,
    .tp_as_sequence = &PendingSet_sequence,
    .tp_iter = (getiterfunc)PendingSet_iter,
    .tp_richcompare = (richcmpfunc)PendingSet_richcompare,
    .tp_methods = PendingSet_methods,
};
