/* What every compiled reader shares: a memory budget, growable arrays charged to it, a keyed hash,
 * and two insert-only hash maps built on that hash.
 *
 * Untrusted input decides how much the readers allocate, so every allocation goes through a
 * Budget: once the bytes it holds would pass its limit, allocation fails and the reader hands the
 * file back to the Python reference route (which has its own caps). Keys that come from a file are
 * hashed with SipHash-1-3 under a key drawn at random when the module loads, so a file cannot
 * choose keys that collide; every map keeps its load at most one half.
 */
#ifndef ALLOCSIM_RD_COMMON_H
#define ALLOCSIM_RD_COMMON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../common/siphash.h"

/* ------------------------------------------------------------------------------------ budget */
typedef struct {
    size_t used;
    size_t limit;
    size_t refused;   /* 0, or the bytes held had the first refused allocation gone through */
} Budget;

static inline void *budget_refuse(Budget *b, size_t more) {
    if (!b->refused) b->refused = b->used + more < b->used ? SIZE_MAX : b->used + more;
    return NULL;
}

/* realloc charged to the budget; NULL (and the old block kept) when over it or out of memory. */
static inline void *budget_realloc(Budget *b, void *ptr, size_t old_bytes, size_t new_bytes) {
    if (new_bytes > old_bytes) {
        size_t more = new_bytes - old_bytes;
        if (b->used + more < b->used || b->used + more > b->limit) return budget_refuse(b, more);
        void *p = realloc(ptr, new_bytes);
        if (!p) return budget_refuse(b, more);
        b->used += more;
        return p;
    }
    b->used -= old_bytes - new_bytes;
    if (new_bytes == 0) {
        free(ptr);
        return NULL;
    }
    void *p = realloc(ptr, new_bytes);
    return p ? p : ptr;
}

static inline void budget_free(Budget *b, void *ptr, size_t bytes) {
    free(ptr);
    b->used -= bytes;
}

/* A growable array of fixed-size items: VEC(T) name; vec_push(&budget, &name, item). */
#define VEC(T) struct { T *data; size_t len; size_t cap; }

/* Make room for `extra` more items; 0 on success, -1 when the budget refuses. */
static inline int vec_reserve_raw(Budget *b, void **data, size_t *cap, size_t len, size_t extra, size_t item) {
    if (len + extra <= *cap) return 0;
    size_t want = *cap ? *cap : 16;
    while (want < len + extra) {
        if (want > SIZE_MAX / 2) return -1;
        want *= 2;
    }
    if (want > SIZE_MAX / item) return -1;
    void *p = budget_realloc(b, *data, *cap * item, want * item);
    if (!p) return -1;
    *data = p;
    *cap = want;
    return 0;
}

#define vec_reserve(b, v, extra) \
    vec_reserve_raw((b), (void **)&(v)->data, &(v)->cap, (v)->len, (extra), sizeof(*(v)->data))
#define vec_push(b, v, item) \
    (vec_reserve((b), (v), 1) < 0 ? -1 : ((v)->data[(v)->len++] = (item), 0))
#define vec_free(b, v) \
    do { budget_free((b), (v)->data, (v)->cap * sizeof(*(v)->data)); (v)->data = NULL; (v)->len = (v)->cap = 0; } while (0)

/* ------------------------------------------------------------------------------------ keyed hash */
extern uint64_t rd_hash_key[2];   /* drawn from os.urandom when the module loads */

/* SipHash-1-3 of `len` bytes under rd_hash_key. */
static inline uint64_t rd_hash(const void *data, size_t len) {
    return siphash13(data, len, rd_hash_key[0], rd_hash_key[1]);
}

static inline uint64_t rd_hash2(int64_t a, int64_t b) {
    int64_t key[2] = {a, b};
    return rd_hash(key, sizeof(key));
}

/* ------------------------------------------------------------------------------------ maps */
/* Insert-only map from a pair of int64 to a uint32 value. */
typedef struct {
    int64_t a, b;
    uint32_t value;
    uint32_t used;
} PairSlot;

typedef struct {
    PairSlot *slots;
    size_t capacity;    /* a power of two, or 0 */
    size_t len;
} PairMap;

static inline void pairmap_free(Budget *bud, PairMap *m) {
    budget_free(bud, m->slots, m->capacity * sizeof(PairSlot));
    memset(m, 0, sizeof(*m));
}

static inline int pairmap_grow(Budget *bud, PairMap *m) {
    size_t cap = m->capacity ? m->capacity * 2 : 64;
    if (cap > SIZE_MAX / sizeof(PairSlot)) return -1;
    PairSlot *slots = budget_realloc(bud, NULL, 0, cap * sizeof(PairSlot));
    if (!slots) return -1;
    memset(slots, 0, cap * sizeof(PairSlot));
    for (size_t i = 0; i < m->capacity; i++) {
        PairSlot *s = &m->slots[i];
        if (!s->used) continue;
        size_t j = rd_hash2(s->a, s->b) & (cap - 1);
        while (slots[j].used) j = (j + 1) & (cap - 1);
        slots[j] = *s;
    }
    budget_free(bud, m->slots, m->capacity * sizeof(PairSlot));
    m->slots = slots;
    m->capacity = cap;
    return 0;
}

/* The slot of (a, b): found (*found = 1) or newly claimed with `value` (*found = 0); NULL: over budget. */
static inline PairSlot *pairmap_get_or_insert(Budget *bud, PairMap *m, int64_t a, int64_t b, uint32_t value,
                                              int *found) {
    if (2 * (m->len + 1) > m->capacity && pairmap_grow(bud, m) < 0) return NULL;
    size_t mask = m->capacity - 1;
    size_t j = rd_hash2(a, b) & mask;
    while (m->slots[j].used) {
        if (m->slots[j].a == a && m->slots[j].b == b) {
            *found = 1;
            return &m->slots[j];
        }
        j = (j + 1) & mask;
    }
    PairSlot *s = &m->slots[j];
    s->a = a;
    s->b = b;
    s->value = value;
    s->used = 1;
    m->len++;
    *found = 0;
    return s;
}

/* Insert-only map from byte strings (kept by the caller, named by id) to their id. */
typedef struct {
    uint64_t hash;
    uint32_t id_plus_one;   /* 0: empty */
} BytesSlot;

typedef struct {
    BytesSlot *slots;
    size_t capacity;
    size_t len;
} BytesMap;

static inline void bytesmap_free(Budget *bud, BytesMap *m) {
    budget_free(bud, m->slots, m->capacity * sizeof(BytesSlot));
    memset(m, 0, sizeof(*m));
}

static inline int bytesmap_grow(Budget *bud, BytesMap *m) {
    size_t cap = m->capacity ? m->capacity * 2 : 64;
    if (cap > SIZE_MAX / sizeof(BytesSlot)) return -1;
    BytesSlot *slots = budget_realloc(bud, NULL, 0, cap * sizeof(BytesSlot));
    if (!slots) return -1;
    memset(slots, 0, cap * sizeof(BytesSlot));
    for (size_t i = 0; i < m->capacity; i++) {
        if (!m->slots[i].id_plus_one) continue;
        size_t j = m->slots[i].hash & (cap - 1);
        while (slots[j].id_plus_one) j = (j + 1) & (cap - 1);
        slots[j] = m->slots[i];
    }
    budget_free(bud, m->slots, m->capacity * sizeof(BytesSlot));
    m->slots = slots;
    m->capacity = cap;
    return 0;
}

/* Look `key` up; `same(ctx, id, key, len)` compares it with entry id. Returns the id found, or
 * claims a slot for `new_id` and returns it (*is_new = 1); -1 when over budget. */
typedef int (*bytes_equal_fn)(void *ctx, uint32_t id, const void *key, size_t len);

static inline int64_t bytesmap_get_or_insert(Budget *bud, BytesMap *m, const void *key, size_t len,
                                             uint32_t new_id, bytes_equal_fn same, void *ctx, int *is_new) {
    if (2 * (m->len + 1) > m->capacity && bytesmap_grow(bud, m) < 0) return -1;
    uint64_t h = rd_hash(key, len);
    size_t mask = m->capacity - 1;
    size_t j = h & mask;
    while (m->slots[j].id_plus_one) {
        if (m->slots[j].hash == h && same(ctx, m->slots[j].id_plus_one - 1, key, len)) {
            *is_new = 0;
            return m->slots[j].id_plus_one - 1;
        }
        j = (j + 1) & mask;
    }
    m->slots[j].hash = h;
    m->slots[j].id_plus_one = new_id + 1;
    m->len++;
    *is_new = 1;
    return new_id;
}

/* ------------------------------------------------------------------------------------ output */
/* A bytearray of n items of `item` bytes (uninitialised); NULL with a Python error set on failure. */
static inline PyObject *rd_bytearray(size_t n, size_t item, void **data) {
    if (n > (size_t)PY_SSIZE_T_MAX / (item ? item : 1)) {
        PyErr_NoMemory();
        return NULL;
    }
    PyObject *out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(n * item));
    if (!out) return NULL;
    *data = PyByteArray_AS_STRING(out);
    return out;
}

/* A bytearray holding a copy of n items. */
static inline PyObject *rd_bytearray_copy(const void *src, size_t n, size_t item) {
    void *data;
    PyObject *out = rd_bytearray(n, item, &data);
    if (out && n) memcpy(data, src, n * item);
    return out;
}

/* ------------------------------------------------------------------------------------ text */
/* Is s[0:n] UTF-8 as CPython decodes it with "surrogatepass" (encoded surrogates allowed)?
 * Sets *chars to the number of code points. */
static inline int rd_utf8_ok(const uint8_t *s, size_t n, size_t *chars) {
    size_t i = 0, count = 0;
    while (i < n) {
        /* ASCII runs eight bytes at a time. */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ULL) break;
            i += 8;
            count += 8;
        }
        if (i >= n) break;
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            count++;
            continue;
        }
        size_t need;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c == 0xE0) { need = 2; lo = 0xA0; }
        else if (c >= 0xE1 && c <= 0xEF) need = 2;     /* 0xED: surrogates pass */
        else if (c == 0xF0) { need = 3; lo = 0x90; }
        else if (c >= 0xF1 && c <= 0xF3) need = 3;
        else if (c == 0xF4) { need = 3; hi = 0x8F; }
        else return 0;
        if (n - i <= need) return 0;
        if (s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (size_t k = 2; k <= need; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF) return 0;
        i += need + 1;
        count++;
    }
    *chars = count;
    return 1;
}

#endif
