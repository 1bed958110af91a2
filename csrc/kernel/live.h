/* The compiled live table: a policy's ``live`` dict and ``pending`` set, kept in C for the kernel.
 *
 * ``LiveTable`` maps an allocation id (an int64) to its (addr, requested, allocated, stream) and a
 * pending flag (its free was requested, not completed). From Python it behaves as the reference's
 * ``live`` dict (``in``, ``[]``, ``[]=``, ``del``, ``get``, ``pop``, ``len``, ``keys``/``values``/
 * ``items``, iteration) and ``LiveTable.pending`` as its ``pending`` set (``in``, ``add``,
 * ``discard``, ``remove``, ``len``, iteration, ``<=``); the kernel reads and writes the entries
 * directly, with no Python object per request. Iteration order is not insertion order.
 */
#ifndef ALLOCSIM_LIVE_H
#define ALLOCSIM_LIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef struct {
    int64_t id;
    uint64_t addr;
    int64_t requested;
    uint64_t allocated;
    int64_t stream;
    uint8_t used;
    uint8_t pending;
} LiveEntry;

typedef struct {
    PyObject_HEAD
    LiveEntry *slots;
    size_t capacity;    /* a power of two, or 0 */
    size_t used;
    size_t n_pending;
} LiveTableObject;

typedef struct {
    PyObject_HEAD
    LiveTableObject *table;
} PendingSetObject;

extern PyTypeObject LiveTable_Type;
extern PyTypeObject PendingSet_Type;

#define LiveTable_Check(op) PyObject_TypeCheck(op, &LiveTable_Type)

/* Draw the per-process hash key (at module import); -1 with an exception set. */
int live_key_init(void);
/* The entry of id, or NULL. */
LiveEntry *live_get(LiveTableObject *t, int64_t id);
/* A fresh entry for id (not present before), or NULL with MemoryError set. */
LiveEntry *live_insert(LiveTableObject *t, int64_t id);
/* Remove the entry of id (which must be present). */
void live_delete(LiveTableObject *t, LiveEntry *entry);

#endif
