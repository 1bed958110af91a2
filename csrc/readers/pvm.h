/* A data-only pickle interpreter: the opcodes CPython's pickler writes for dicts, lists, tuples,
 * str, int, float, bool and None, turned into a value tree held in budgeted arrays.
 *
 * Nothing is ever called and no Python object is made: a value is 16 bytes (a tag and either the
 * number itself or where its text lies in the input), containers are runs of values in one shared
 * arena, and the memo shares containers by index, exactly as the unpickler shares objects. Any
 * opcode outside that set (globals, REDUCE, persistent ids, sets, bytes, protocol-0 text opcodes,
 * memo indices beyond the next free slot...), any malformed stream and anything over the budget make
 * pvm_load fail; the caller then hands the file to the Python reference route, which names the
 * problem. The memory the tree takes is a fixed multiple of the input size.
 */
#ifndef ALLOCSIM_PVM_H
#define ALLOCSIM_PVM_H

#include "rd_common.h"

enum {
    V_NONE = 0,
    V_FALSE,
    V_TRUE,
    V_INT,      /* v: the value */
    V_BIGINT,   /* an int outside int64: v = offset of its little-endian bytes, n = their count */
    V_FLOAT,    /* v: the bits of the double */
    V_STR,      /* v = offset of its UTF-8 bytes in the input, n = their count (validated) */
    V_LIST,     /* v = container index */
    V_DICT,
    V_TUPLE,
};

typedef struct {
    uint8_t type;
    uint8_t pad[3];
    uint32_t n;
    int64_t v;
} Val;

typedef struct {
    int64_t start;   /* first item in Tree.items */
    int64_t n;
    int64_t next;    /* next chunk of the same container, -1 at the end */
} Chunk;

typedef struct {
    int64_t first;   /* first chunk, -1 when empty */
    int64_t last;
    int64_t count;   /* items (a dict holds key, value, key, value...) */
    uint8_t type;    /* V_LIST, V_DICT or V_TUPLE */
} Cont;

typedef struct {
    const uint8_t *data;
    size_t size;
    Budget *budget;
    VEC(Val) items;
    VEC(Chunk) chunks;
    VEC(Cont) conts;
    Val root;
} Tree;

/* Interpret data[0:size] into t (which the caller zeroes); 0 on success, -1 when the file must go
 * to the reference route. t keeps pointers into data. */
int pvm_load(Tree *t, const uint8_t *data, size_t size, Budget *budget);
void pvm_free(Tree *t);

/* Iterate a container's items: for (PvmIter it = pvm_iter(t, ci); pvm_next(t, &it);) use it.item. */
typedef struct {
    int64_t chunk;
    int64_t pos;
    int64_t end;
    const Val *item;
} PvmIter;

static inline PvmIter pvm_iter(const Tree *t, int64_t ci) {
    PvmIter it = {t->conts.data[ci].first, 0, 0, NULL};
    if (it.chunk >= 0) {
        it.pos = t->chunks.data[it.chunk].start;
        it.end = it.pos + t->chunks.data[it.chunk].n;
    }
    return it;
}

static inline int pvm_next(const Tree *t, PvmIter *it) {
    while (it->chunk >= 0 && it->pos >= it->end) {
        it->chunk = t->chunks.data[it->chunk].next;
        if (it->chunk < 0) return 0;
        it->pos = t->chunks.data[it->chunk].start;
        it->end = it->pos + t->chunks.data[it->chunk].n;
    }
    if (it->chunk < 0) return 0;
    it->item = &t->items.data[it->pos++];
    return 1;
}

static inline int64_t pvm_len(const Tree *t, const Val *v) {
    return t->conts.data[v->v].count;
}

#endif
