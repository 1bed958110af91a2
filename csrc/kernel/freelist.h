/* The compiled FreeList: the free blocks of one pool, indexed as allocsim.policies.freelist.FreeList.
 *
 * Same contents and methods as the Python reference class: address maps of the free blocks
 * (start -> size, end -> start), the segments (start -> size, start -> stream key), optional ages
 * (start -> clock) and, per stream key, the free blocks ordered (size, address). The C functions
 * below are what the pool kernel calls on its hot path; the Python methods wrap them.
 */
#ifndef ALLOCSIM_FREELIST_H
#define ALLOCSIM_FREELIST_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "btree.h"
#include "u64map.h"

/* Addresses and sizes must stay below 2**63, so that an end address never wraps. */
#define KERNEL_VALUE_LIMIT ((uint64_t)1 << 63)

typedef struct {
    PyObject_HEAD
    U64Map size_at;            /* free block start -> size */
    U64Map start_ending_at;    /* free block end -> start */
    U64Map segment_size_at;    /* segment start -> size */
    U64Map segment_stream_at;  /* segment start -> stream key (an int64 stored as uint64) */
    U64Map inserted_at;        /* free block start -> clock when it entered (track_age only) */
    U64Map stream_slot;        /* stream key -> index in stream_keys / stream_roots */
    int64_t *stream_keys;      /* every stream key that ever held a free block, in first-use order */
    BTree *stream_trees;       /* the free blocks of each stream key, best-fit order */
    Py_ssize_t n_streams;
    Py_ssize_t stream_capacity;
    int64_t last_stream_key;   /* the stream key looked up last, and its slot (most calls repeat it) */
    Py_ssize_t last_stream_slot;
    int track_age;
    int64_t clock;             /* PyTorch's get_free_block call count (garbage collection ages) */
    uint64_t segment_bytes;
    /* Every free block of every stream, (size, address) order: largest() (asked at every new peak)
     * is its last key, never a walk over every stream (a recompute after each take of the largest
     * block was quadratic in streams once takes and new peaks alternate). */
    BTree all_blocks;
} FreeListObject;

extern PyTypeObject FreeList_Type;

#define FreeList_Check(op) PyObject_TypeCheck(op, &FreeList_Type)

/* The tree of stream_key (NULL when it has none); with create, make the stream's entry. */
BTree *fl_stream_tree(FreeListObject *fl, int64_t stream_key, int create);

/* The best fit: the smallest free block of stream_key with size >= size; 1 and *key, else 0. */
static inline int fl_best_fit(FreeListObject *fl, int64_t stream_key, uint64_t size, BlockKey *key) {
    BTree *tree = fl_stream_tree(fl, stream_key, 0);
    return tree ? bt_lower_bound(tree, block_key(size, 0), key) : 0;
}

/* Remove the free block (size, addr) of stream_key: 0 done, 1 no such block, -1 error set. */
int fl_take(FreeListObject *fl, int64_t stream_key, uint64_t size, uint64_t addr);
/* Insert a free block whose neighbours are not free: 0 or -1 (MemoryError set). */
int fl_add(FreeListObject *fl, uint64_t addr, uint64_t size, int64_t stream_key);
/* Return a block, merging it with its free neighbours inside its segment: merge count or -1. */
int fl_free(FreeListObject *fl, uint64_t addr, uint64_t size, int64_t stream_key);

/* Convert a Python int to an address or size in [0, 2**63); -1 with ValueError/TypeError set. */
int kernel_as_value(PyObject *obj, uint64_t *out, const char *what);
/* Pack (size, addr) into the Python int size << 64 | addr (the reference's sort key). */
PyObject *kernel_pack_key(uint64_t size, uint64_t addr);
/* Unpack a sort key; -1 with an error set when it is not one. */
int kernel_unpack_key(PyObject *key, uint64_t *size, uint64_t *addr);
int kernel_constants_init(void);

#endif
