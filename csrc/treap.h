/* Ordered sets of free blocks keyed (size, address): one treap per stream, nodes from one pool.
 *
 * The order is PyTorch's BlockComparatorSize within a stream: size first, then address, so the
 * first key >= (size, 0) is the best fit (the smallest block that fits, ties to the lowest
 * address). A treap is a binary search tree whose node priorities (a hash of the key, hence
 * deterministic) keep it balanced in expectation: insert, erase and lower_bound are O(log n) for
 * any pattern of sizes a trace can produce. Nodes live in one array per free list and are named
 * by index (0 = none), so growing the array never invalidates a tree.
 */
#ifndef ALLOCSIM_TREAP_H
#define ALLOCSIM_TREAP_H

#include <stdint.h>
#include <stdlib.h>

#include "u64map.h"

typedef struct {
    uint64_t size;
    uint64_t addr;
} BlockKey;

typedef struct {
    uint64_t size;
    uint64_t addr;
    uint32_t left, right;
    uint32_t priority;
} TreapNode;

typedef struct {
    TreapNode *nodes;   /* nodes[0] is the empty tree */
    uint32_t capacity;
    uint32_t used;      /* high-water mark of nodes handed out, including node 0 */
    uint32_t free_head; /* chain of recycled nodes through .left */
} NodePool;

static inline int key_less(uint64_t size_a, uint64_t addr_a, uint64_t size_b, uint64_t addr_b) {
    return size_a < size_b || (size_a == size_b && addr_a < addr_b);
}

static inline int node_pool_init(NodePool *p) {
    p->capacity = 64;
    p->nodes = (TreapNode *)calloc(p->capacity, sizeof(TreapNode));
    p->used = 1;
    p->free_head = 0;
    return p->nodes ? 0 : -1;
}

static inline void node_pool_free(NodePool *p) {
    free(p->nodes);
    p->nodes = NULL;
    p->capacity = p->used = p->free_head = 0;
}

/* A fresh node for (size, addr), or 0 when memory runs out. */
static inline uint32_t node_new(NodePool *p, uint64_t size, uint64_t addr) {
    uint32_t x = p->free_head;
    if (x) {
        p->free_head = p->nodes[x].left;
    } else {
        if (p->used == p->capacity) {
            if (p->capacity >= UINT32_MAX / 2) return 0;
            uint32_t capacity = p->capacity * 2;
            TreapNode *nodes = (TreapNode *)realloc(p->nodes, (size_t)capacity * sizeof(TreapNode));
            if (!nodes) return 0;
            p->nodes = nodes;
            p->capacity = capacity;
        }
        x = p->used++;
    }
    TreapNode *n = &p->nodes[x];
    n->size = size;
    n->addr = addr;
    n->left = n->right = 0;
    n->priority = (uint32_t)(u64_mix(addr ^ (size * 0x9e3779b97f4a7c15ULL)) >> 32);
    return x;
}

static inline void node_release(NodePool *p, uint32_t x) {
    p->nodes[x].left = p->free_head;
    p->free_head = x;
}

/* Split tree t into keys < (size, addr) and keys >= it. */
static void treap_split(TreapNode *n, uint32_t t, uint64_t size, uint64_t addr, uint32_t *less, uint32_t *rest) {
    while (t) {
        if (key_less(n[t].size, n[t].addr, size, addr)) {
            *less = t;
            less = &n[t].right;
            t = n[t].right;
        } else {
            *rest = t;
            rest = &n[t].left;
            t = n[t].left;
        }
    }
    *less = 0;
    *rest = 0;
}

/* Join two trees whose keys are all smaller in a than in b. */
static uint32_t treap_join(TreapNode *n, uint32_t a, uint32_t b) {
    uint32_t root = 0;
    uint32_t *link = &root;
    while (a && b) {
        if (n[a].priority > n[b].priority) {
            *link = a;
            link = &n[a].right;
            a = n[a].right;
        } else {
            *link = b;
            link = &n[b].left;
            b = n[b].left;
        }
    }
    *link = a ? a : b;
    return root;
}

/* Insert node x into the tree at *root. */
static inline void treap_insert(TreapNode *n, uint32_t *root, uint32_t x) {
    uint32_t *link = root;
    while (*link && n[*link].priority >= n[x].priority) {
        uint32_t t = *link;
        link = key_less(n[x].size, n[x].addr, n[t].size, n[t].addr) ? &n[t].left : &n[t].right;
    }
    treap_split(n, *link, n[x].size, n[x].addr, &n[x].left, &n[x].right);
    *link = x;
}

/* Unlink the node with key (size, addr) from the tree at *root; return it, or 0 if absent. */
static inline uint32_t treap_erase(TreapNode *n, uint32_t *root, uint64_t size, uint64_t addr) {
    uint32_t *link = root;
    while (*link) {
        uint32_t t = *link;
        if (n[t].size == size && n[t].addr == addr) {
            *link = treap_join(n, n[t].left, n[t].right);
            return t;
        }
        link = key_less(size, addr, n[t].size, n[t].addr) ? &n[t].left : &n[t].right;
    }
    return 0;
}

/* The node with the smallest key >= (size, addr), or 0. */
static inline uint32_t treap_lower_bound(const TreapNode *n, uint32_t t, uint64_t size, uint64_t addr) {
    uint32_t best = 0;
    while (t) {
        if (key_less(n[t].size, n[t].addr, size, addr)) {
            t = n[t].right;
        } else {
            best = t;
            t = n[t].left;
        }
    }
    return best;
}

/* The node with the largest key, or 0. */
static inline uint32_t treap_last(const TreapNode *n, uint32_t t) {
    if (!t) return 0;
    while (n[t].right) t = n[t].right;
    return t;
}

/* In-order walk with an explicit stack: call visit(node, ctx) for every node, smallest key first;
 * stop early when visit returns non-zero (and return that value); -1 if memory runs out. */
typedef int (*TreapVisit)(const TreapNode *node, void *ctx);

static inline int treap_walk(const TreapNode *n, uint32_t root, TreapVisit visit, void *ctx) {
    uint32_t small_stack[64];
    uint32_t *stack = small_stack;
    size_t depth = 0, capacity = 64;
    uint32_t t = root;
    int rc = 0;
    while (t || depth) {
        while (t) {
            if (depth == capacity) {
                size_t grown = capacity * 2;
                uint32_t *bigger = (uint32_t *)malloc(grown * sizeof(uint32_t));
                if (!bigger) {
                    rc = -1;
                    goto done;
                }
                memcpy(bigger, stack, depth * sizeof(uint32_t));
                if (stack != small_stack) free(stack);
                stack = bigger;
                capacity = grown;
            }
            stack[depth++] = t;
            t = n[t].left;
        }
        t = stack[--depth];
        rc = visit(&n[t], ctx);
        if (rc) goto done;
        t = n[t].right;
    }
done:
    if (stack != small_stack) free(stack);
    return rc;
}

#endif
