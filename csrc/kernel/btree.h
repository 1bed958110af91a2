/* Ordered sets of free blocks keyed (size, address): a B+ tree per stream.
 *
 * The order is PyTorch's BlockComparatorSize within a stream: size first, then address, so the
 * first key >= (size, 0) is the best fit (the smallest block that fits, ties to the lowest
 * address). Keys are one 128-bit integer (size high, address low). All keys live in leaves of up
 * to BT_LEAF_KEYS, linked in order; inner nodes hold separators (separator i is at most every key
 * of child i + 1 and above every key of child i) and are searched with branch-free counts, so an
 * insert, erase or lower_bound touches a handful of cache lines whatever the pool holds:
 * O(log n) for any pattern of sizes a trace can produce.
 *
 * Deletion is lazy: a leaf is freed only when it empties (its parent drops it, recursively), and
 * the root collapses while it has a single child. Nodes are never merged, so a tree may hold
 * sparse leaves after many frees, but never more nodes than it needed at its largest.
 */
#ifndef ALLOCSIM_BTREE_H
#define ALLOCSIM_BTREE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BT_LEAF_KEYS 16
#define BT_INNER_KEYS 15      /* an inner node has up to 16 children */
#define BT_MAX_HEIGHT 40

/* The sort key of a free block: size in the high 64 bits, address in the low (one comparison). */
typedef unsigned __int128 BlockKey;

static inline BlockKey block_key(uint64_t size, uint64_t addr) { return (BlockKey)size << 64 | addr; }
static inline uint64_t key_size(BlockKey key) { return (uint64_t)(key >> 64); }
static inline uint64_t key_addr(BlockKey key) { return (uint64_t)key; }

typedef struct BtLeaf {
    BlockKey keys[BT_LEAF_KEYS];
    struct BtLeaf *prev, *next;
    int n;
} BtLeaf;

typedef struct BtInner {
    BlockKey keys[BT_INNER_KEYS];
    void *child[BT_INNER_KEYS + 1];
    int n;   /* separators; n + 1 children */
} BtInner;

typedef struct {
    void *root;      /* NULL when empty */
    int height;      /* inner levels above the leaves (0: the root is a leaf) */
    BtLeaf *first, *last;
    size_t count;
} BTree;

/* Which child of an inner node may hold key: the number of separators <= key. */
static inline int bt_inner_slot(const BtInner *x, BlockKey key) {
    int slot = 0;
    for (int j = 0; j < x->n; j++) slot += x->keys[j] <= key;
    return slot;
}

/* Position of the first key >= key in a leaf (the number of keys < key). */
static inline int bt_leaf_lower(const BtLeaf *l, BlockKey key) {
    int pos = 0;
    for (int j = 0; j < l->n; j++) pos += l->keys[j] < key;
    return pos;
}

/* The smallest key >= key: 1 and *out, or 0 when there is none. */
static inline int bt_lower_bound(const BTree *t, BlockKey key, BlockKey *out) {
    const void *x = t->root;
    if (!x) return 0;
    for (int h = t->height; h > 0; h--) x = ((const BtInner *)x)->child[bt_inner_slot((const BtInner *)x, key)];
    const BtLeaf *l = (const BtLeaf *)x;
    int pos = bt_leaf_lower(l, key);
    if (pos < l->n) {
        *out = l->keys[pos];
        return 1;
    }
    if (!l->next) return 0;   /* every key of the next leaf is above key (and leaves are never empty) */
    *out = l->next->keys[0];
    return 1;
}

/* The largest key: 1 and *out, or 0 when empty. */
static inline int bt_last(const BTree *t, BlockKey *out) {
    if (!t->last) return 0;
    *out = t->last->keys[t->last->n - 1];
    return 1;
}

static inline void bt_insert_at(BlockKey *keys, int n, int pos, BlockKey key) {
    memmove(&keys[pos + 1], &keys[pos], (size_t)(n - pos) * sizeof(BlockKey));
    keys[pos] = key;
}

/* Insert key (duplicates are kept); 0, or -1 when memory runs out. */
static inline int bt_insert(BTree *t, BlockKey key) {
    if (!t->root) {
        BtLeaf *l = (BtLeaf *)calloc(1, sizeof(BtLeaf));
        if (!l) return -1;
        l->keys[0] = key;
        l->n = 1;
        t->root = t->first = t->last = l;
        t->height = 0;
        t->count = 1;
        return 0;
    }
    BtInner *path[BT_MAX_HEIGHT];
    int slot[BT_MAX_HEIGHT];
    void *x = t->root;
    for (int h = 0; h < t->height; h++) {
        path[h] = (BtInner *)x;
        slot[h] = bt_inner_slot(path[h], key);
        x = path[h]->child[slot[h]];
    }
    BtLeaf *l = (BtLeaf *)x;
    int pos = bt_leaf_lower(l, key);
    if (l->n < BT_LEAF_KEYS) {
        bt_insert_at(l->keys, l->n, pos, key);
        l->n++;
        t->count++;
        return 0;
    }
    /* Split the full leaf in halves, put the key in its half, and hand the right half up. */
    BtLeaf *r = (BtLeaf *)calloc(1, sizeof(BtLeaf));
    if (!r) return -1;
    int half = BT_LEAF_KEYS / 2;
    memcpy(r->keys, &l->keys[half], (size_t)(BT_LEAF_KEYS - half) * sizeof(BlockKey));
    r->n = BT_LEAF_KEYS - half;
    l->n = half;
    if (pos <= half) {
        bt_insert_at(l->keys, l->n, pos, key);
        l->n++;
    } else {
        bt_insert_at(r->keys, r->n, pos - half, key);
        r->n++;
    }
    r->prev = l;
    r->next = l->next;
    if (l->next) l->next->prev = r;
    else t->last = r;
    l->next = r;
    t->count++;
    BlockKey separator = r->keys[0];
    void *right = r;
    for (int h = t->height - 1; h >= 0; h--) {
        BtInner *p = path[h];
        int s = slot[h];   /* the new child goes right of child s, its separator at s */
        if (p->n < BT_INNER_KEYS) {
            bt_insert_at(p->keys, p->n, s, separator);
            memmove(&p->child[s + 2], &p->child[s + 1], (size_t)(p->n - s) * sizeof(void *));
            p->child[s + 1] = right;
            p->n++;
            return 0;
        }
        /* Split the full inner node: all n + 1 separators and n + 2 children in order, then halves. */
        BlockKey keys[BT_INNER_KEYS + 1];
        void *child[BT_INNER_KEYS + 2];
        memcpy(keys, p->keys, (size_t)p->n * sizeof(BlockKey));
        memcpy(child, p->child, (size_t)(p->n + 1) * sizeof(void *));
        bt_insert_at(keys, p->n, s, separator);
        memmove(&child[s + 2], &child[s + 1], (size_t)(p->n - s) * sizeof(void *));
        child[s + 1] = right;
        int total = p->n + 1;            /* separators now */
        int left_n = total / 2;          /* keys[left_n] moves up */
        BtInner *q = (BtInner *)calloc(1, sizeof(BtInner));
        if (!q) return -1;
        p->n = left_n;
        memcpy(p->keys, keys, (size_t)left_n * sizeof(BlockKey));
        memcpy(p->child, child, (size_t)(left_n + 1) * sizeof(void *));
        q->n = total - left_n - 1;
        memcpy(q->keys, &keys[left_n + 1], (size_t)q->n * sizeof(BlockKey));
        memcpy(q->child, &child[left_n + 1], (size_t)(q->n + 1) * sizeof(void *));
        separator = keys[left_n];
        right = q;
    }
    if (t->height + 1 >= BT_MAX_HEIGHT) return -1;
    BtInner *root = (BtInner *)calloc(1, sizeof(BtInner));
    if (!root) return -1;
    root->n = 1;
    root->keys[0] = separator;
    root->child[0] = t->root;
    root->child[1] = right;
    t->root = root;
    t->height++;
    return 0;
}

/* Remove one copy of key; 1 when it was there, else 0. */
static inline int bt_erase(BTree *t, BlockKey key) {
    if (!t->root) return 0;
    BtInner *path[BT_MAX_HEIGHT];
    int slot[BT_MAX_HEIGHT];
    void *x = t->root;
    for (int h = 0; h < t->height; h++) {
        path[h] = (BtInner *)x;
        slot[h] = bt_inner_slot(path[h], key);
        x = path[h]->child[slot[h]];
    }
    BtLeaf *l = (BtLeaf *)x;
    int pos = bt_leaf_lower(l, key);
    if (pos == l->n || l->keys[pos] != key) return 0;
    memmove(&l->keys[pos], &l->keys[pos + 1], (size_t)(l->n - pos - 1) * sizeof(BlockKey));
    l->n--;
    t->count--;
    if (l->n) return 1;
    /* The leaf emptied: unlink it, and drop it from its parent (parents that empty go too). */
    if (l->prev) l->prev->next = l->next;
    else t->first = l->next;
    if (l->next) l->next->prev = l->prev;
    else t->last = l->prev;
    free(l);
    for (int h = t->height - 1; h >= 0; h--) {
        BtInner *p = path[h];
        int s = slot[h];
        if (p->n == 0) {   /* its only child is gone */
            free(p);
            continue;
        }
        int k = s > 0 ? s - 1 : 0;   /* the separator beside the removed child */
        memmove(&p->keys[k], &p->keys[k + 1], (size_t)(p->n - k - 1) * sizeof(BlockKey));
        memmove(&p->child[s], &p->child[s + 1], (size_t)(p->n - s) * sizeof(void *));
        p->n--;
        while (t->height > 0 && ((BtInner *)t->root)->n == 0) {   /* a root with one child steps down */
            BtInner *root = (BtInner *)t->root;
            t->root = root->child[0];
            free(root);
            t->height--;
        }
        return 1;
    }
    t->root = NULL;   /* the tree is empty */
    t->height = 0;
    return 1;
}

static void bt_free_node(void *x, int height) {
    if (height > 0) {
        BtInner *p = (BtInner *)x;
        for (int j = 0; j <= p->n; j++) bt_free_node(p->child[j], height - 1);
    }
    free(x);
}

static inline void bt_free(BTree *t) {
    if (t->root) bt_free_node(t->root, t->height);
    memset(t, 0, sizeof(*t));
}

/* Call visit(key, ctx) for every key, smallest first; stop early when it returns non-zero (and return that). */
typedef int (*BtVisit)(BlockKey key, void *ctx);

static inline int bt_walk(const BTree *t, BtVisit visit, void *ctx) {
    for (const BtLeaf *l = t->first; l; l = l->next) {
        for (int j = 0; j < l->n; j++) {
            int rc = visit(l->keys[j], ctx);
            if (rc) return rc;
        }
    }
    return 0;
}

#endif
