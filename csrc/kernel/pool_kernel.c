/* The compiled hot path of the pool policies: malloc, free_completed and replay_run.
 *
 * One Kernel object serves one policy (allocsim.policies.kernel.attach builds it). It works on the
 * policy's own state: the compiled FreeLists, the compiled live table (the policy's ``live`` and
 * ``pending``), the counters in the policy's __dict__, so the Python methods (misses, releases,
 * reports, checks) see exactly what the reference route would have made. What it does itself, per
 * request, without a Python object:
 *
 *   pytorch flavour: round_size (with roundup_power2_divisions), small/large pool, best fit in the
 *     request's stream (with expandable segments: preferring the fitting block with the least room
 *     to grow into unmapped pages) and get_free_block's two oversize rules, the garbage-collection
 *     clock, should_split; a miss calls the policy's _alloc_with_retries (growth or page mapping,
 *     release, retry, OOM);
 *   pool flavour: rounding to alignment, small/large pool, stream key, best fit, low- or high-end
 *     split; a miss calls _find_elsewhere (when a subclass has one), then _grow;
 *   both: per-stream free sets, merging on free, the policy's bookkeeping (live, pending, counters).
 *
 * Zero-byte requests, duplicate ids and frees that were not requested go to the reference methods
 * (Policy.malloc / Policy.free_completed), so every error is raised by the same code.
 */
#include "columns.h"
#include "freelist.h"
#include "live.h"

#define K_MIN_BLOCK_SIZE ((uint64_t)512)
#define K_SMALL_SIZE ((uint64_t)1 << 20)
#define K_ROUNDUP_POWER2_INTERVALS 16
#define DIVISION_CLAMP ((uint64_t)1 << 54)   /* 512 * 2**54 = 2**63: no request exceeds it */

enum { FLAVOR_POOL = 0, FLAVOR_PYTORCH = 1 };
enum { EV_ALLOC = 1, EV_FREE_REQUESTED = 2, EV_FREE_COMPLETED = 3 };

typedef struct {
    PyObject_HEAD
    PyObject *policy;
    PyObject *attrs;                 /* policy.__dict__: the counters */
    LiveTableObject *live;           /* the policy's live allocations and pending frees */
    FreeListObject *small, *large;   /* the same object when the policy has one pool */
    PyObject *pool_of;               /* pool flavour with two pools: addr -> FreeList of a live block */
    PyObject *foreign;               /* pool flavour: addr -> owner stream key of a borrowed block */
    PyObject *generic_malloc, *generic_free_completed, *out_of_memory;
    PyObject *miss, *find_elsewhere, *after_free;   /* the policy's Python slow paths (may be NULL) */
    PyObject *unmapped_small, *unmapped_large;      /* expandable segments: start -> size of unmapped pages */
    int flavor;
    int two_pools, stream_bound, carve_high, gc, expandable;
    int serve_requests;              /* replay_run may do free requests (no _on_free_requested hook) */
    uint64_t alignment, small_max, min_split, max_split, non_split_rounding;
    int has_divisions;
    uint64_t divisions[K_ROUNDUP_POWER2_INTERVALS];
} KernelObject;

/* One request after rounding: where it would be served. */
typedef struct {
    uint64_t size;
    FreeListObject *pool;
    int64_t stream_key;
    int small;
} Request;

static PyObject *S_requested_bytes, *S_allocated_bytes, *S_pending_free_bytes, *S_n_mallocs, *S_n_ooms,
    *S_n_pool_hits, *S_n_splits, *S_n_merges, *S_last_stream, *S_stream;
static PyObject *S_kind, *S_alloc_id, *S_size_bytes, *S_pos, *S_row, *S_requested, *S_active, *S_pending, *S_timed,
    *S_index, *S_t_ns, *S_special, *S_due_ns, *S_delay_ns, *S_now_ns, *S_quiet_ns, *S_event_index, *S_sim_t_ns,
    *S_latency_ns;
static PyObject *ZERO;

static int intern_names(void) {
#define INTERN(var, text) if (!(var = PyUnicode_InternFromString(text))) return -1;
    INTERN(S_requested_bytes, "requested_bytes") INTERN(S_allocated_bytes, "allocated_bytes")
    INTERN(S_pending_free_bytes, "pending_free_bytes") INTERN(S_n_mallocs, "n_mallocs") INTERN(S_n_ooms, "n_ooms")
    INTERN(S_n_pool_hits, "n_pool_hits") INTERN(S_n_splits, "n_splits") INTERN(S_n_merges, "n_merges")
    INTERN(S_last_stream, "last_stream") INTERN(S_stream, "stream") INTERN(S_kind, "kind")
    INTERN(S_alloc_id, "alloc_id") INTERN(S_size_bytes, "size_bytes") INTERN(S_pos, "pos") INTERN(S_row, "row")
    INTERN(S_requested, "requested") INTERN(S_active, "active") INTERN(S_pending, "pending")
    INTERN(S_timed, "timed") INTERN(S_index, "index") INTERN(S_t_ns, "t_ns") INTERN(S_special, "special")
    INTERN(S_due_ns, "due_ns") INTERN(S_delay_ns, "delay_ns") INTERN(S_now_ns, "now_ns")
    INTERN(S_quiet_ns, "quiet_ns") INTERN(S_event_index, "event_index") INTERN(S_sim_t_ns, "sim_t_ns")
    INTERN(S_latency_ns, "latency_ns")
#undef INTERN
    ZERO = PyLong_FromLong(0);
    return ZERO ? 0 : -1;
}

/* ------------------------------------------------------------------------------ rules */
static inline int bit_length(uint64_t x) { return x ? 64 - __builtin_clzll(x) : 0; }

/* roundup_power2_next_division (pytorch_rules.py), for divisions >= 2. */
static uint64_t next_division(uint64_t size, uint64_t divisions) {
    if ((size & (size - 1)) == 0) return size;
    uint64_t power2_floor = (uint64_t)1 << (bit_length(size) - 1);
    uint64_t power2_division = power2_floor >> (bit_length(divisions) - 1);
    if (power2_division == 0) return power2_floor << 1;
    uint64_t floor = size & ~(power2_division - 1);
    return floor == size ? size : floor + power2_division;
}

/* PyTorch's round_size for 0 < size_bytes < 2**63 (pytorch_rules.round_size). */
static uint64_t pytorch_round(const KernelObject *k, uint64_t size_bytes) {
    if (size_bytes < K_MIN_BLOCK_SIZE) return K_MIN_BLOCK_SIZE;
    if (k->has_divisions) {
        int log_size = bit_length(size_bytes) - 1;
        int index = log_size > 20 ? log_size - 20 : 0;
        if (index > K_ROUNDUP_POWER2_INTERVALS - 1) index = K_ROUNDUP_POWER2_INTERVALS - 1;
        uint64_t div = k->divisions[index];
        if (div > 1 && size_bytes > K_MIN_BLOCK_SIZE * div) return next_division(size_bytes, div);
    }
    return (size_bytes + K_MIN_BLOCK_SIZE - 1) / K_MIN_BLOCK_SIZE * K_MIN_BLOCK_SIZE;
}

/* Round, pick the pool and the stream key (no state changes); -1 when the size cannot be rounded. */
static int prepare(const KernelObject *k, uint64_t size_bytes, int64_t stream, Request *r) {
    if (k->flavor == FLAVOR_PYTORCH) {
        r->size = pytorch_round(k, size_bytes);
        r->small = r->size <= K_SMALL_SIZE;
        r->pool = r->small ? k->small : k->large;
        r->stream_key = stream;
        return 0;
    }
    uint64_t a = k->alignment;
    if (size_bytes > UINT64_MAX - (a - 1)) return -1;
    r->size = (size_bytes + a - 1) / a * a;
    r->small = k->two_pools && r->size <= k->small_max;
    r->pool = r->small ? k->small : k->large;
    r->stream_key = k->stream_bound ? stream : 0;
    return 0;
}

/* int64 value of a Python int, 0 if obj is no int or does not fit. */
static int small_int(PyObject *obj, int64_t *out) {
    if (!PyLong_Check(obj)) return 0;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (overflow) return 0;
    *out = v;
    return 1;
}

/* Expandable segments: how far the free block key could grow, through the unmapped pages right
 * after it (ExpandableSegments.expandable_size); -1 with an error set. */
static int expandable_room(const KernelObject *k, const Request *r, BlockKey key, uint64_t *room) {
    uint64_t size = key_size(key), end = key_addr(key) + size;
    *room = size;
    if (u64map_contains(&r->pool->segment_size_at, end)) return 0;   /* the segment ends there */
    PyObject *unmapped = r->pool == k->small ? k->unmapped_small : k->unmapped_large;
    PyObject *end_obj = PyLong_FromUnsignedLongLong(end);
    if (!end_obj) return -1;
    PyObject *more = PyDict_GetItemWithError(unmapped, end_obj);
    Py_DECREF(end_obj);
    if (!more) return PyErr_Occurred() ? -1 : 0;
    int64_t extra;
    if (!small_int(more, &extra) || extra < 0) {
        PyErr_SetString(PyExc_ValueError, "an unmapped range's size is not a byte count");
        return -1;
    }
    *room += (uint64_t)extra;
    return 0;
}

/* The best fit a hit would take: 1 and its (size, address), 0 for a miss, -1 on error; changes nothing. */
static int find(const KernelObject *k, const Request *r, uint64_t *block, uint64_t *addr) {
    BlockKey key;
    if (!fl_best_fit(r->pool, r->stream_key, r->size, &key)) return 0;
    if (k->expandable) {
        /* get_free_block with expandable segments: among the blocks from the best fit on, the first
         * whose room is not smaller than the previous choice's ends the search. */
        BTree *tree = fl_stream_tree(r->pool, r->stream_key, 0);
        uint64_t best_room, room;
        BlockKey candidate = key, next;
        if (expandable_room(k, r, key, &best_room) < 0) return -1;
        while (bt_lower_bound(tree, candidate + 1, &next)) {
            if (expandable_room(k, r, next, &room) < 0) return -1;
            if (room >= best_room) break;
            key = candidate = next;
            best_room = room;
        }
    }
    *block = key_size(key);
    *addr = key_addr(key);
    if (k->flavor != FLAVOR_PYTORCH) return 1;
    /* get_free_block's oversize rules: the chosen block is the only candidate tried. */
    if (r->size < k->max_split) return *block < k->max_split;
    uint64_t limit = r->size > UINT64_MAX - k->non_split_rounding ? UINT64_MAX : r->size + k->non_split_rounding;
    return *block < limit;
}

/* How a block (size, addr) serves r, decided by the policy's should_split and changing nothing:
 * what the request gets (addr, size) and the remainder left free (remainder_size 0: no split). */
typedef struct {
    uint64_t addr, size;
    uint64_t remainder_addr, remainder_size;
} Placement;

static Placement plan(const KernelObject *k, const Request *r, uint64_t addr, uint64_t block) {
    Placement p = {addr, block, 0, 0};
    if (block <= r->size) return p;
    uint64_t remaining = block - r->size;
    if (k->flavor == FLAVOR_PYTORCH) {
        if (r->small || k->expandable ? remaining < K_MIN_BLOCK_SIZE
                                      : !(r->size < k->max_split && remaining > K_SMALL_SIZE))
            return p;
        p.remainder_addr = addr + r->size;   /* the low part is handed out */
    } else {
        if (remaining < k->min_split) return p;
        if (k->carve_high) {   /* Paddle: the remainder stays at the low end */
            p.remainder_addr = addr;
            p.addr = addr + remaining;
        } else {
            p.remainder_addr = addr + r->size;
        }
    }
    p.size = r->size;
    p.remainder_size = remaining;
    return p;
}

/* Leave the placement's remainder free in the pool, owned by stream key owner. */
static inline int place(const Request *r, const Placement *p, int64_t owner) {
    return p->remainder_size ? fl_add(r->pool, p->remainder_addr, p->remainder_size, owner) : 0;
}

/* ------------------------------------------------------------------------------ counters */
static int counter_add(KernelObject *k, PyObject *name, PyObject *delta, int subtract) {
    PyObject *current = PyDict_GetItemWithError(k->attrs, name);
    if (!current) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_AttributeError, name);
        return -1;
    }
    PyObject *value = subtract ? PyNumber_Subtract(current, delta) : PyNumber_Add(current, delta);
    if (!value) return -1;
    int rc = PyDict_SetItem(k->attrs, name, value);
    Py_DECREF(value);
    return rc;
}

static int counter_add_value(KernelObject *k, PyObject *name, long long delta) {
    if (!delta) return 0;
    PyObject *d = PyLong_FromLongLong(delta);
    if (!d) return -1;
    int rc = counter_add(k, name, d, 0);
    Py_DECREF(d);
    return rc;
}

static int counter_read(KernelObject *k, PyObject *name, int64_t *out) {
    PyObject *current = PyDict_GetItemWithError(k->attrs, name);
    if (!current) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_AttributeError, name);
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_Check(current) ? PyLong_AsLongLongAndOverflow(current, &overflow) : (overflow = 1, 0);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow) return 1;
    *out = v;
    return 0;
}

static int counter_write(KernelObject *k, PyObject *name, int64_t value) {
    PyObject *v = PyLong_FromLongLong(value);
    if (!v) return -1;
    int rc = PyDict_SetItem(k->attrs, name, v);
    Py_DECREF(v);
    return rc;
}

/* ------------------------------------------------------------------------------ helpers */
static PyObject *call_generic_malloc(KernelObject *k, PyObject *aid, PyObject *size, PyObject *stream) {
    PyObject *args[4] = {k->policy, aid, size, stream};
    return PyObject_Vectorcall(k->generic_malloc, args, 4, NULL);
}

/* Where a completed free goes: the pool and stream key (pool flavour: _pool_of and _foreign). */
static int free_target(KernelObject *k, uint64_t addr, uint64_t allocated, int64_t stream, FreeListObject **pool,
                       int64_t *stream_key) {
    if (k->flavor == FLAVOR_PYTORCH) {
        /* Small-pool blocks are at most 1 MiB and large-pool blocks above it. */
        *pool = allocated <= K_SMALL_SIZE ? k->small : k->large;
        *stream_key = stream;
        return 0;
    }
    *pool = k->large;
    *stream_key = k->stream_bound ? stream : 0;
    PyObject *key = NULL;
    if (k->two_pools || PyDict_GET_SIZE(k->foreign)) {
        key = PyLong_FromUnsignedLongLong(addr);
        if (!key) return -1;
    }
    if (k->two_pools) {
        PyObject *pool_obj = PyDict_GetItemWithError(k->pool_of, key);
        if (!pool_obj || !FreeList_Check(pool_obj)) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
            Py_DECREF(key);
            return -1;
        }
        *pool = (FreeListObject *)pool_obj;   /* borrowed: the pools outlive the call */
        if (PyDict_DelItem(k->pool_of, key) < 0) {
            Py_DECREF(key);
            return -1;
        }
    }
    if (PyDict_GET_SIZE(k->foreign)) {
        PyObject *owner = PyDict_GetItemWithError(k->foreign, key);
        if (owner) {
            int64_t value;
            if (!small_int(owner, &value)) {
                PyErr_SetString(PyExc_ValueError, "a borrowed block's owner is not a stream key");
                Py_DECREF(key);
                return -1;
            }
            *stream_key = value;
            if (PyDict_DelItem(k->foreign, key) < 0) {
                Py_DECREF(key);
                return -1;
            }
        } else if (PyErr_Occurred()) {
            Py_DECREF(key);
            return -1;
        }
    }
    Py_XDECREF(key);
    return 0;
}

/* ------------------------------------------------------------------------------ malloc */
static PyObject *Kernel_malloc(KernelObject *k, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *stream_obj = ZERO;
    if (nargs == 3 && !nkw) {
        stream_obj = args[2];
    } else if (nargs == 2 && nkw == 1 && PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, 0), S_stream) == 0) {
        stream_obj = args[2];
    } else if (nargs != 2 || nkw) {
        PyErr_SetString(PyExc_TypeError, "malloc() takes (alloc_id, size_bytes, stream=0)");
        return NULL;
    }
    PyObject *aid = args[0], *size_obj = args[1];
    int64_t size_bytes, stream, id;
    /* A zero or negative size, a duplicate id (InvalidFree), an id that is no int: the reference's route. */
    if (!small_int(size_obj, &size_bytes) || size_bytes <= 0 || !small_int(stream_obj, &stream)
            || !small_int(aid, &id) || live_get(k->live, id))
        return call_generic_malloc(k, aid, size_obj, stream_obj);
    Request r;
    if (prepare(k, (uint64_t)size_bytes, stream, &r) < 0) return call_generic_malloc(k, aid, size_obj, stream_obj);
    if (PyDict_SetItem(k->attrs, S_last_stream, stream_obj) < 0) return NULL;
    if (k->gc && r.pool != NULL) r.pool->clock++;
    int64_t owner = r.stream_key;
    uint64_t block = 0, addr = 0;
    int hit = 0, found = find(k, &r, &block, &addr);
    if (found < 0) return NULL;
    if (found) {
        fl_take(r.pool, r.stream_key, block, addr);
        hit = 1;
    } else {
        PyObject *key_obj = PyLong_FromLongLong(r.stream_key);
        PyObject *size_py = key_obj ? PyLong_FromUnsignedLongLong(r.size) : NULL;
        PyObject *result = NULL;
        if (!size_py) goto miss_failed;
        if (k->find_elsewhere) {   /* a subclass may serve a miss from other streams' blocks */
            result = PyObject_CallFunctionObjArgs(k->find_elsewhere, (PyObject *)r.pool, key_obj, size_py, NULL);
            if (!result) goto miss_failed;
            if (result != Py_None) {
                PyObject *owner_obj;
                if (!PyTuple_Check(result) || PyTuple_GET_SIZE(result) != 2
                        || kernel_unpack_key(PyTuple_GET_ITEM(result, 0), &block, &addr) < 0) {
                    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "_find_elsewhere must return (key, owner)");
                    goto miss_failed;
                }
                owner_obj = PyTuple_GET_ITEM(result, 1);
                if (!small_int(owner_obj, &owner)) {
                    PyErr_SetString(PyExc_TypeError, "_find_elsewhere's owner must be a stream key");
                    goto miss_failed;
                }
                int rc = fl_take(r.pool, owner, block, addr);
                if (rc) {
                    if (rc > 0) PyErr_SetString(PyExc_ValueError, "_find_elsewhere returned a block that is not free");
                    goto miss_failed;
                }
                hit = 1;
            }
            Py_CLEAR(result);
        }
        if (!hit) {
            result = PyObject_CallFunctionObjArgs(k->miss, (PyObject *)r.pool, key_obj, size_py, size_obj, NULL);
            if (!result) {
                if (PyErr_ExceptionMatches(k->out_of_memory)) {
                    PyObject *type, *value, *tb;
                    PyErr_Fetch(&type, &value, &tb);
                    int rc = counter_add_value(k, S_n_ooms, 1);
                    if (rc < 0) {
                        Py_XDECREF(type);
                        Py_XDECREF(value);
                        Py_XDECREF(tb);
                    } else {
                        PyErr_Restore(type, value, tb);
                    }
                }
                goto miss_failed;
            }
            if (kernel_unpack_key(result, &block, &addr) < 0) goto miss_failed;
            Py_CLEAR(result);
        }
        Py_DECREF(key_obj);
        Py_DECREF(size_py);
        goto placed;
    miss_failed:
        Py_XDECREF(result);
        Py_XDECREF(key_obj);
        Py_XDECREF(size_py);
        return NULL;
    }
placed:;
    Placement p = plan(k, &r, addr, block);
    if (place(&r, &p, owner) < 0) return NULL;
    int split = p.remainder_size != 0;
    addr = p.addr;
    block = p.size;
    PyObject *addr_obj = PyLong_FromUnsignedLongLong(addr);
    if (!addr_obj) return NULL;
    if (k->flavor == FLAVOR_POOL) {
        if (owner != r.stream_key) {
            PyObject *o = PyLong_FromLongLong(owner);
            if (!o || PyDict_SetItem(k->foreign, addr_obj, o) < 0) {
                Py_XDECREF(o);
                Py_DECREF(addr_obj);
                return NULL;
            }
            Py_DECREF(o);
        }
        if (k->two_pools && PyDict_SetItem(k->pool_of, addr_obj, (PyObject *)r.pool) < 0) {
            Py_DECREF(addr_obj);
            return NULL;
        }
    }
    LiveEntry *e = live_insert(k->live, id);
    if (e) {
        e->addr = addr;
        e->requested = size_bytes;
        e->allocated = block;
        e->stream = stream;
    }
    if (!e || counter_add(k, S_requested_bytes, size_obj, 0) < 0 || counter_add_value(k, S_allocated_bytes, (long long)block) < 0
            || counter_add_value(k, S_n_mallocs, 1) < 0 || counter_add_value(k, S_n_pool_hits, hit) < 0
            || counter_add_value(k, S_n_splits, split) < 0) {
        Py_DECREF(addr_obj);
        return NULL;
    }
    return addr_obj;
}

/* ------------------------------------------------------------------------------ free_completed */
static PyObject *Kernel_free_completed(KernelObject *k, PyObject *aid) {
    int64_t id;
    LiveEntry *e = small_int(aid, &id) ? live_get(k->live, id) : NULL;
    if (!e || !e->pending)   /* not requested first, or not allocated: the reference's route */
        return PyObject_CallFunctionObjArgs(k->generic_free_completed, k->policy, aid, NULL);
    uint64_t addr = e->addr, allocated = e->allocated;
    int64_t requested = e->requested, stream = e->stream;
    live_delete(k->live, e);
    if (counter_add_value(k, S_pending_free_bytes, -(long long)allocated) < 0
            || counter_add_value(k, S_requested_bytes, -requested) < 0
            || counter_add_value(k, S_allocated_bytes, -(long long)allocated) < 0)
        return NULL;
    if (!allocated) Py_RETURN_NONE;
    FreeListObject *pool;
    int64_t stream_key;
    if (free_target(k, addr, allocated, stream, &pool, &stream_key) < 0) return NULL;
    int merges = fl_free(pool, addr, allocated, stream_key);
    if (merges < 0 || counter_add_value(k, S_n_merges, merges) < 0) return NULL;
    if (k->after_free) {
        PyObject *key_obj = PyLong_FromLongLong(stream_key);
        PyObject *result = key_obj ? PyObject_CallFunctionObjArgs(k->after_free, (PyObject *)pool, key_obj, NULL) : NULL;
        Py_XDECREF(key_obj);
        if (!result) return NULL;
        Py_DECREF(result);
    }
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------ replay_run */
typedef struct {
    Column kind, alloc_id, size_bytes, stream, index, t_ns;
    OutColumn requested, active, pending, event_index, sim_t_ns, latency_ns;
    PyObject *special;   /* a non-empty set, or NULL */
    int timed;
    int64_t due, delay, now, quiet[4];
    Py_ssize_t pos, row, n;
} Run;

static int get_ssize(PyObject *run, PyObject *name, Py_ssize_t *out) {
    PyObject *v = PyObject_GetAttr(run, name);
    if (!v) return -1;
    *out = PyLong_AsSsize_t(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* 0 and the value, 1 when the attribute is no int64 (the run is then left to the engine), -1 error. */
static int get_int64(PyObject *run, PyObject *name, int64_t *out) {
    PyObject *v = PyObject_GetAttr(run, name);
    if (!v) return -1;
    int ok = small_int(v, out);
    Py_DECREF(v);
    return ok ? 0 : 1;
}

static int open_column(PyObject *run, PyObject *name, Column *c) {
    PyObject *v = PyObject_GetAttr(run, name);
    if (!v) return -1;
    int rc = column_open(c, v, PyUnicode_AsUTF8(name));
    Py_DECREF(v);
    return rc;
}

static int open_out(PyObject *run, PyObject *name, OutColumn *c) {
    PyObject *v = PyObject_GetAttr(run, name);
    if (!v) return -1;
    int rc = out_column_open(c, v, PyUnicode_AsUTF8(name));
    Py_DECREF(v);
    return rc;
}

static void run_close(Run *run) {
    column_close(&run->kind);
    column_close(&run->alloc_id);
    column_close(&run->size_bytes);
    column_close(&run->stream);
    column_close(&run->index);
    column_close(&run->t_ns);
    out_column_close(&run->requested);
    out_column_close(&run->active);
    out_column_close(&run->pending);
    out_column_close(&run->event_index);
    out_column_close(&run->sim_t_ns);
    out_column_close(&run->latency_ns);
    Py_CLEAR(run->special);
}

static int64_t due_from(PyObject *due) {
    if (PyFloat_Check(due)) {
        double d = PyFloat_AS_DOUBLE(due);
        if (d != d || d >= 9.2233720368547758e18) return INT64_MAX;   /* nothing due (inf): no limit */
        if (d <= -9.2233720368547758e18) return INT64_MIN;
        int64_t floor = (int64_t)d;
        return (double)floor < d ? floor + 1 : floor;   /* target >= due  <=>  target >= ceil(due) */
    }
    int overflow = 0;
    long long v = PyLong_Check(due) ? PyLong_AsLongLongAndOverflow(due, &overflow) : 0;
    if (v == -1 && PyErr_Occurred()) PyErr_Clear();
    return overflow > 0 ? INT64_MAX : overflow < 0 ? INT64_MIN : v;
}

/* Open the run's columns; 1 when it cannot be replayed here (left to the engine), -1 on error. */
static int run_open(PyObject *obj, Run *run) {
    memset(run, 0, sizeof(*run));
    if (get_ssize(obj, S_pos, &run->pos) < 0 || get_ssize(obj, S_row, &run->row) < 0) return -1;
    if (open_column(obj, S_kind, &run->kind) < 0 || open_column(obj, S_alloc_id, &run->alloc_id) < 0
            || open_column(obj, S_size_bytes, &run->size_bytes) < 0 || open_column(obj, S_stream, &run->stream) < 0
            || open_out(obj, S_requested, &run->requested) < 0 || open_out(obj, S_active, &run->active) < 0
            || open_out(obj, S_pending, &run->pending) < 0)
        return -1;
    run->n = run->kind.len;
    if (run->alloc_id.len < run->n || run->size_bytes.len < run->n || run->stream.len < run->n) {
        PyErr_SetString(PyExc_ValueError, "replay columns differ in length");
        return -1;
    }
    PyObject *timed = PyObject_GetAttr(obj, S_timed);
    if (!timed) return -1;
    run->timed = PyObject_IsTrue(timed);
    Py_DECREF(timed);
    if (run->timed < 0) return -1;
    if (!run->timed) return 0;
    if (open_column(obj, S_index, &run->index) < 0 || open_column(obj, S_t_ns, &run->t_ns) < 0
            || open_out(obj, S_event_index, &run->event_index) < 0 || open_out(obj, S_sim_t_ns, &run->sim_t_ns) < 0
            || open_out(obj, S_latency_ns, &run->latency_ns) < 0)
        return -1;
    if (run->index.len < run->n || run->t_ns.len < run->n) {
        PyErr_SetString(PyExc_ValueError, "replay columns differ in length");
        return -1;
    }
    PyObject *special = PyObject_GetAttr(obj, S_special);
    if (!special) return -1;
    Py_ssize_t size = PyObject_Length(special);
    if (size < 0) {
        Py_DECREF(special);
        return -1;
    }
    if (size) run->special = special;
    else Py_DECREF(special);
    PyObject *due = PyObject_GetAttr(obj, S_due_ns);
    if (!due) return -1;
    run->due = due_from(due);
    Py_DECREF(due);
    int rc = get_int64(obj, S_delay_ns, &run->delay);
    if (!rc) rc = get_int64(obj, S_now_ns, &run->now);
    if (rc) return rc;
    PyObject *quiet = PyObject_GetAttr(obj, S_quiet_ns);
    if (!quiet) return -1;
    for (int kind = EV_ALLOC; kind <= EV_FREE_COMPLETED && !rc; kind++) {
        PyObject *item = PySequence_GetItem(quiet, kind);
        if (!item) {
            rc = -1;
            break;
        }
        if (!small_int(item, &run->quiet[kind])) rc = 1;
        Py_DECREF(item);
    }
    Py_DECREF(quiet);
    return rc;
}

static int set_attr_int64(PyObject *obj, PyObject *name, int64_t value) {
    PyObject *v = PyLong_FromLongLong(value);
    if (!v) return -1;
    int rc = PyObject_SetAttr(obj, name, v);
    Py_DECREF(v);
    return rc;
}

/* Replay events from run.pos while each is a pool hit, a free request or a completed free. */
static PyObject *Kernel_replay_run(KernelObject *k, PyObject *obj) {
    Run run;
    int rc = run_open(obj, &run);
    if (rc) {
        run_close(&run);
        if (rc < 0) return NULL;
        Py_RETURN_NONE;
    }
    int64_t requested, allocated, pending_bytes;
    rc = counter_read(k, S_requested_bytes, &requested);
    if (!rc) rc = counter_read(k, S_allocated_bytes, &allocated);
    if (!rc) rc = counter_read(k, S_pending_free_bytes, &pending_bytes);
    if (rc) {
        run_close(&run);
        if (rc < 0) return NULL;
        Py_RETURN_NONE;
    }
    int64_t n_hits = 0, n_splits = 0, n_merges = 0, last_stream = 0;
    int any_hit = 0;
    int failed = 0;
    Py_ssize_t pos = run.pos, row = run.row;
    int64_t delay = run.delay, now = run.now;
    for (; pos < run.n; pos++) {
        int64_t kind, aid_value, i = 0, t = 0, target = 0;
        if (column_get(&run.kind, pos, &kind) < 0 || column_get(&run.alloc_id, pos, &aid_value) < 0) {
            failed = 1;
            break;
        }
        if (row >= run.requested.len || row >= run.active.len || row >= run.pending.len) break;
        if (run.timed) {
            if (row >= run.event_index.len || row >= run.sim_t_ns.len || row >= run.latency_ns.len) break;
            if (column_get(&run.index, pos, &i) < 0 || column_get(&run.t_ns, pos, &t) < 0) {
                failed = 1;
                break;
            }
            if (__builtin_add_overflow(t, delay, &target)) break;
            if (run.special) {
                PyObject *index_obj = column_object(&run.index, pos, i);
                int special = index_obj ? PySet_Contains(run.special, index_obj) : -1;
                Py_XDECREF(index_obj);
                if (special < 0) {
                    failed = 1;
                    break;
                }
                if (special) break;   /* a dependency to wait for: the engine's turn */
            }
            if (target > now && target >= run.due) break;   /* another SimPy event is due first */
        }
        if (kind == EV_ALLOC) {
            int64_t size_bytes, stream;
            if (column_get(&run.size_bytes, pos, &size_bytes) < 0 || column_get(&run.stream, pos, &stream) < 0) {
                failed = 1;
                break;
            }
            if (size_bytes <= 0) break;
            Request r;
            if (prepare(k, (uint64_t)size_bytes, stream, &r) < 0) break;
            uint64_t block, addr;
            int found = find(k, &r, &block, &addr);
            if (found < 0) {
                failed = 1;
                break;
            }
            if (!found) break;   /* a miss: growth and retries are the per-event route's */
            Placement p = plan(k, &r, addr, block);
            int64_t new_requested, new_allocated;
            if (__builtin_add_overflow(requested, size_bytes, &new_requested) || p.size > (uint64_t)INT64_MAX
                    || __builtin_add_overflow(allocated, (int64_t)p.size, &new_allocated))
                break;
            if (live_get(k->live, aid_value)) break;   /* a duplicate id: the reference raises InvalidFree */
            if (k->flavor == FLAVOR_POOL && k->two_pools) {
                PyObject *addr_obj = PyLong_FromUnsignedLongLong(p.addr);
                int rc = addr_obj ? PyDict_SetItem(k->pool_of, addr_obj, (PyObject *)r.pool) : -1;
                Py_XDECREF(addr_obj);
                if (rc < 0) {
                    failed = 1;
                    break;
                }
            }
            LiveEntry *e = live_insert(k->live, aid_value);
            if (!e) {
                failed = 1;
                break;
            }
            e->addr = p.addr;
            e->requested = size_bytes;
            e->allocated = p.size;
            e->stream = stream;
            last_stream = stream;
            any_hit = 1;
            if (k->gc) r.pool->clock++;
            fl_take(r.pool, r.stream_key, block, addr);
            if (place(&r, &p, r.stream_key) < 0) {
                failed = 1;
                break;
            }
            n_splits += p.remainder_size != 0;
            n_hits++;
            requested = new_requested;
            allocated = new_allocated;
            run.requested.data[row] = requested;
            run.active.data[row] = allocated;
        } else if (kind == EV_FREE_REQUESTED) {
            if (!k->serve_requests) break;
            LiveEntry *e = live_get(k->live, aid_value);
            int64_t new_pending;
            if (!e || e->pending || e->allocated > (uint64_t)INT64_MAX
                    || __builtin_add_overflow(pending_bytes, (int64_t)e->allocated, &new_pending))
                break;   /* not allocated (or its allocation failed), already pending, or out of range */
            e->pending = 1;
            k->live->n_pending++;
            pending_bytes = new_pending;
            run.pending.data[row] = pending_bytes;
        } else if (kind == EV_FREE_COMPLETED) {
            if (k->after_free) break;   /* the policy releases memory after a free: the engine must see it */
            LiveEntry *e = live_get(k->live, aid_value);
            if (!e || !e->pending || e->allocated > (uint64_t)INT64_MAX) break;   /* not requested first */
            uint64_t addr = e->addr, block = e->allocated;
            int64_t req = e->requested, stream = e->stream, new_pending, new_requested, new_allocated;
            if (__builtin_sub_overflow(pending_bytes, (int64_t)block, &new_pending)
                    || __builtin_sub_overflow(requested, req, &new_requested)
                    || __builtin_sub_overflow(allocated, (int64_t)block, &new_allocated))
                break;   /* counters past int64: the per-event route has Python ints */
            FreeListObject *pool = NULL;
            int64_t stream_key = 0;
            live_delete(k->live, e);
            if (block && free_target(k, addr, block, stream, &pool, &stream_key) < 0) {
                failed = 1;
                break;
            }
            pending_bytes = new_pending;
            requested = new_requested;
            allocated = new_allocated;
            if (block) {
                int merges = fl_free(pool, addr, block, stream_key);
                if (merges < 0) {
                    failed = 1;
                    break;
                }
                n_merges += merges;
            }
            run.requested.data[row] = requested;
            run.active.data[row] = allocated;
            run.pending.data[row] = pending_bytes;
        } else {
            break;
        }
        if (run.timed) {   /* issued when its work is done; a call with no device work costs quiet_ns */
            if (target > now) now = target;
            int64_t latency = run.quiet[kind];
            run.event_index.data[row] = i;
            run.sim_t_ns.data[row] = now;
            run.latency_ns.data[row] = latency;
            delay = now + latency - t;
        }
        row++;
    }
    /* Write back whatever ran, even after an error: the state changed with it. */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    int write_failed = counter_write(k, S_requested_bytes, requested) < 0
                       || counter_write(k, S_allocated_bytes, allocated) < 0
                       || counter_write(k, S_pending_free_bytes, pending_bytes) < 0
                       || counter_add_value(k, S_n_mallocs, n_hits) < 0
                       || counter_add_value(k, S_n_pool_hits, n_hits) < 0
                       || counter_add_value(k, S_n_splits, n_splits) < 0
                       || counter_add_value(k, S_n_merges, n_merges) < 0
                       || (any_hit && counter_write(k, S_last_stream, last_stream) < 0)
                       || set_attr_int64(obj, S_pos, pos) < 0 || set_attr_int64(obj, S_row, row) < 0
                       || (run.timed && (set_attr_int64(obj, S_delay_ns, delay) < 0
                                         || set_attr_int64(obj, S_now_ns, now) < 0));
    run_close(&run);
    if (type) {
        PyErr_Restore(type, value, tb);
        return NULL;
    }
    if (write_failed || failed) return NULL;
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------ the type */
static int clamp_u64(PyObject *obj, uint64_t *out, const char *name) {
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int", name);
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow < 0 || (!overflow && v < 0)) {
        PyErr_Format(PyExc_ValueError, "%s must be >= 0", name);
        return -1;
    }
    /* Values past int64 act as "unlimited" in every rule they enter (comparisons only). */
    *out = overflow ? UINT64_MAX : (uint64_t)v;
    return 0;
}

static PyObject *optional_callable(PyObject *obj) {
    if (obj == NULL || obj == Py_None) return NULL;
    Py_INCREF(obj);
    return obj;
}

static PyObject *Kernel_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"policy", "flavor", "live", "small", "large", "pool_of", "foreign",
                             "generic_malloc", "generic_free_completed", "out_of_memory", "miss",
                             "find_elsewhere", "after_free", "alignment", "small_max", "stream_bound",
                             "carve_from_high_end", "min_split_remainder", "max_split", "max_non_split_rounding",
                             "divisions", "gc", "serve_requests", "unmapped_small", "unmapped_large", NULL};
    PyObject *policy = NULL, *live = NULL, *small = NULL, *large = NULL, *pool_of = Py_None,
        *foreign = Py_None, *generic_malloc = NULL, *generic_free = NULL, *out_of_memory = NULL, *miss = NULL,
        *find_elsewhere = Py_None, *after_free = Py_None, *alignment = NULL, *small_max = Py_None,
        *min_split = NULL, *max_split = NULL, *non_split_rounding = NULL, *divisions = Py_None,
        *unmapped_small = Py_None, *unmapped_large = Py_None;
    const char *flavor = NULL;
    int stream_bound = 0, carve_high = 0, gc = 0, serve_requests = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$sO!O!O!OOOOOOOOOOppOOOOppOO:Kernel", kwlist, &policy, &flavor,
                                     &LiveTable_Type, &live, &FreeList_Type, &small,
                                     &FreeList_Type, &large, &pool_of, &foreign, &generic_malloc, &generic_free,
                                     &out_of_memory, &miss, &find_elsewhere, &after_free, &alignment, &small_max,
                                     &stream_bound, &carve_high, &min_split, &max_split, &non_split_rounding,
                                     &divisions, &gc, &serve_requests, &unmapped_small, &unmapped_large))
        return NULL;
    if (!flavor || !live || !small || !large || !generic_malloc || !generic_free || !out_of_memory
            || !miss || !alignment || !min_split || !max_split || !non_split_rounding) {
        PyErr_SetString(PyExc_TypeError, "Kernel() is missing a required keyword argument");
        return NULL;
    }
    KernelObject *k = (KernelObject *)type->tp_alloc(type, 0);
    if (!k) return NULL;
    if (!strcmp(flavor, "pytorch")) {
        k->flavor = FLAVOR_PYTORCH;
    } else if (!strcmp(flavor, "pool")) {
        k->flavor = FLAVOR_POOL;
    } else {
        PyErr_Format(PyExc_ValueError, "unknown kernel flavour %s", flavor);
        goto error;
    }
    k->attrs = PyObject_GenericGetDict(policy, NULL);
    if (!k->attrs) goto error;
    Py_INCREF(policy);
    k->policy = policy;
    Py_INCREF(live);
    k->live = (LiveTableObject *)live;
    Py_INCREF(small);
    k->small = (FreeListObject *)small;
    Py_INCREF(large);
    k->large = (FreeListObject *)large;
    k->two_pools = small != large;
    if (k->flavor == FLAVOR_POOL) {
        if (!PyDict_Check(pool_of) || !PyDict_Check(foreign)) {
            PyErr_SetString(PyExc_TypeError, "pool_of and foreign must be dicts");
            goto error;
        }
        Py_INCREF(pool_of);
        k->pool_of = pool_of;
        Py_INCREF(foreign);
        k->foreign = foreign;
    }
    Py_INCREF(generic_malloc);
    k->generic_malloc = generic_malloc;
    Py_INCREF(generic_free);
    k->generic_free_completed = generic_free;
    Py_INCREF(out_of_memory);
    k->out_of_memory = out_of_memory;
    Py_INCREF(miss);
    k->miss = miss;
    k->find_elsewhere = optional_callable(find_elsewhere);
    k->after_free = optional_callable(after_free);
    if (unmapped_small != Py_None || unmapped_large != Py_None) {
        if (!PyDict_Check(unmapped_small) || !PyDict_Check(unmapped_large)) {
            PyErr_SetString(PyExc_TypeError, "unmapped_small and unmapped_large must both be dicts");
            goto error;
        }
        Py_INCREF(unmapped_small);
        k->unmapped_small = unmapped_small;
        Py_INCREF(unmapped_large);
        k->unmapped_large = unmapped_large;
        k->expandable = 1;
    }
    k->stream_bound = stream_bound;
    k->carve_high = carve_high;
    k->gc = gc;
    k->serve_requests = serve_requests;
    if (clamp_u64(alignment, &k->alignment, "alignment") < 0 || clamp_u64(min_split, &k->min_split, "min_split") < 0
            || clamp_u64(max_split, &k->max_split, "max_split") < 0
            || clamp_u64(non_split_rounding, &k->non_split_rounding, "max_non_split_rounding") < 0)
        goto error;
    if (!k->alignment || k->alignment >= KERNEL_VALUE_LIMIT) {
        PyErr_SetString(PyExc_ValueError, "alignment must be in [1, 2**63)");
        goto error;
    }
    k->small_max = 0;
    if (small_max != Py_None && clamp_u64(small_max, &k->small_max, "small_max") < 0) goto error;
    if (divisions != Py_None) {
        PyObject *seq = PySequence_Fast(divisions, "divisions must be a sequence");
        if (!seq) goto error;
        if (PySequence_Fast_GET_SIZE(seq) != K_ROUNDUP_POWER2_INTERVALS) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "divisions needs 16 entries");
            goto error;
        }
        for (int j = 0; j < K_ROUNDUP_POWER2_INTERVALS; j++) {
            uint64_t v;
            if (clamp_u64(PySequence_Fast_GET_ITEM(seq, j), &v, "divisions") < 0) {
                Py_DECREF(seq);
                goto error;
            }
            if (v && (v & (v - 1))) {
                Py_DECREF(seq);
                PyErr_SetString(PyExc_ValueError, "divisions must be 0 or powers of 2");
                goto error;
            }
            k->divisions[j] = v > DIVISION_CLAMP ? DIVISION_CLAMP : v;
        }
        Py_DECREF(seq);
        k->has_divisions = 1;
    }
    return (PyObject *)k;
error:
    Py_DECREF(k);
    return NULL;
}

static int Kernel_traverse(KernelObject *k, visitproc visit, void *arg) {
    Py_VISIT(k->policy);
    Py_VISIT(k->attrs);
    Py_VISIT(k->live);
    Py_VISIT(k->small);
    Py_VISIT(k->large);
    Py_VISIT(k->pool_of);
    Py_VISIT(k->foreign);
    Py_VISIT(k->generic_malloc);
    Py_VISIT(k->generic_free_completed);
    Py_VISIT(k->out_of_memory);
    Py_VISIT(k->miss);
    Py_VISIT(k->find_elsewhere);
    Py_VISIT(k->after_free);
    Py_VISIT(k->unmapped_small);
    Py_VISIT(k->unmapped_large);
    return 0;
}

static int Kernel_clear(KernelObject *k) {
    Py_CLEAR(k->policy);
    Py_CLEAR(k->attrs);
    Py_CLEAR(k->live);
    Py_CLEAR(k->small);
    Py_CLEAR(k->large);
    Py_CLEAR(k->pool_of);
    Py_CLEAR(k->foreign);
    Py_CLEAR(k->generic_malloc);
    Py_CLEAR(k->generic_free_completed);
    Py_CLEAR(k->out_of_memory);
    Py_CLEAR(k->miss);
    Py_CLEAR(k->find_elsewhere);
    Py_CLEAR(k->after_free);
    Py_CLEAR(k->unmapped_small);
    Py_CLEAR(k->unmapped_large);
    return 0;
}

static void Kernel_dealloc(KernelObject *k) {
    PyObject_GC_UnTrack(k);
    Kernel_clear(k);
    Py_TYPE(k)->tp_free((PyObject *)k);
}

static PyMethodDef Kernel_methods[] = {
    {"malloc", (PyCFunction)(void (*)(void))Kernel_malloc, METH_FASTCALL | METH_KEYWORDS,
     "malloc(alloc_id, size_bytes, stream=0): Policy.malloc for this policy, compiled."},
    {"free_completed", (PyCFunction)Kernel_free_completed, METH_O,
     "free_completed(alloc_id): Policy.free_completed for this policy, compiled."},
    {"replay_run", (PyCFunction)Kernel_replay_run, METH_O,
     "replay_run(run): replay pool hits, free requests and completed frees from run.pos (Policy.replay_run)."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject Kernel_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "allocsim.policies._kernel.Kernel",
    .tp_doc = "The compiled hot path of one pool policy (built by allocsim.policies.kernel.attach).",
    .tp_basicsize = sizeof(KernelObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = Kernel_new,
    .tp_traverse = (traverseproc)Kernel_traverse,
    .tp_clear = (inquiry)Kernel_clear,
    .tp_dealloc = (destructor)Kernel_dealloc,
    .tp_methods = Kernel_methods,
};

int kernel_type_init(void) {
    return intern_names();
}
