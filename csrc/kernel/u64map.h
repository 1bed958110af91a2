/* An open-addressing hash map from uint64 to uint64: the address indexes of a free list.
 *
 * Linear probing over a power-of-two table kept at most half full; deletion shifts the following
 * entries back (no tombstones), so lookups stay short however many blocks come and go. Every
 * uint64 is a valid key: the value that marks an empty slot (U64MAP_EMPTY) is stored beside the
 * table. Keys are addresses (multiples of 512 with the high bits varying), so they are mixed with
 * the splitmix64 finaliser before picking a slot.
 */
#ifndef ALLOCSIM_U64MAP_H
#define ALLOCSIM_U64MAP_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define U64MAP_EMPTY UINT64_MAX
#define U64MAP_MIN_CAPACITY 16

typedef struct {
    uint64_t key;
    uint64_t value;
} U64Slot;

typedef struct {
    U64Slot *slots;     /* capacity slots; key U64MAP_EMPTY = free */
    size_t capacity;    /* a power of two (0 before the first insert) */
    size_t used;        /* occupied slots (not counting the side entry) */
    int has_empty_key;  /* the key U64MAP_EMPTY itself is present ... */
    uint64_t empty_key_value;   /* ... with this value */
} U64Map;

static inline uint64_t u64_mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

static inline void u64map_init(U64Map *m) {
    memset(m, 0, sizeof(*m));
}

static inline void u64map_free(U64Map *m) {
    free(m->slots);
    memset(m, 0, sizeof(*m));
}

static inline size_t u64map_len(const U64Map *m) {
    return m->used + (m->has_empty_key ? 1 : 0);
}

/* Return 1 and set *value when key is present, else 0. */
static inline int u64map_get(const U64Map *m, uint64_t key, uint64_t *value) {
    if (key == U64MAP_EMPTY) {
        if (m->has_empty_key && value) *value = m->empty_key_value;
        return m->has_empty_key;
    }
    if (!m->capacity) return 0;
    size_t mask = m->capacity - 1;
    size_t i = (size_t)u64_mix(key) & mask;
    for (;;) {
        uint64_t k = m->slots[i].key;
        if (k == key) {
            if (value) *value = m->slots[i].value;
            return 1;
        }
        if (k == U64MAP_EMPTY) return 0;
        i = (i + 1) & mask;
    }
}

static inline int u64map_contains(const U64Map *m, uint64_t key) {
    return u64map_get(m, key, NULL);
}

static int u64map_grow(U64Map *m) {
    size_t capacity = m->capacity ? m->capacity * 2 : U64MAP_MIN_CAPACITY;
    if (capacity > ((size_t)-1) / sizeof(U64Slot)) return -1;
    U64Slot *slots = (U64Slot *)malloc(capacity * sizeof(U64Slot));
    if (!slots) return -1;
    for (size_t i = 0; i < capacity; i++) slots[i].key = U64MAP_EMPTY;
    size_t mask = capacity - 1;
    for (size_t j = 0; j < m->capacity; j++) {
        uint64_t k = m->slots[j].key;
        if (k == U64MAP_EMPTY) continue;
        size_t i = (size_t)u64_mix(k) & mask;
        while (slots[i].key != U64MAP_EMPTY) i = (i + 1) & mask;
        slots[i] = m->slots[j];
    }
    free(m->slots);
    m->slots = slots;
    m->capacity = capacity;
    return 0;
}

/* Insert or overwrite; return 0, or -1 when memory runs out (the map is unchanged). */
static inline int u64map_put(U64Map *m, uint64_t key, uint64_t value) {
    if (key == U64MAP_EMPTY) {
        m->has_empty_key = 1;
        m->empty_key_value = value;
        return 0;
    }
    if ((m->used + 1) * 2 > m->capacity && u64map_grow(m) < 0) return -1;
    size_t mask = m->capacity - 1;
    size_t i = (size_t)u64_mix(key) & mask;
    for (;;) {
        uint64_t k = m->slots[i].key;
        if (k == key) {
            m->slots[i].value = value;
            return 0;
        }
        if (k == U64MAP_EMPTY) {
            m->slots[i].key = key;
            m->slots[i].value = value;
            m->used++;
            return 0;
        }
        i = (i + 1) & mask;
    }
}

/* Remove key; return 1 and set *value when it was present, else 0. */
static inline int u64map_del(U64Map *m, uint64_t key, uint64_t *value) {
    if (key == U64MAP_EMPTY) {
        if (!m->has_empty_key) return 0;
        if (value) *value = m->empty_key_value;
        m->has_empty_key = 0;
        return 1;
    }
    if (!m->capacity) return 0;
    size_t mask = m->capacity - 1;
    size_t i = (size_t)u64_mix(key) & mask;
    for (;;) {
        uint64_t k = m->slots[i].key;
        if (k == U64MAP_EMPTY) return 0;
        if (k == key) break;
        i = (i + 1) & mask;
    }
    if (value) *value = m->slots[i].value;
    /* Backward-shift deletion: move later entries of the probe run into the hole when their home
     * slot does not lie (cyclically) between the hole and their current slot. */
    size_t hole = i;
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        uint64_t k = m->slots[j].key;
        if (k == U64MAP_EMPTY) break;
        size_t home = (size_t)u64_mix(k) & mask;
        int stays = (hole <= j) ? (hole < home && home <= j) : (hole < home || home <= j);
        if (stays) continue;
        m->slots[hole] = m->slots[j];
        hole = j;
    }
    m->slots[hole].key = U64MAP_EMPTY;
    m->used--;
    return 1;
}

/* Iterate: start with *cursor = 0; returns 0 when done. The side entry comes last. */
static inline int u64map_next(const U64Map *m, size_t *cursor, uint64_t *key, uint64_t *value) {
    while (*cursor < m->capacity) {
        size_t i = (*cursor)++;
        if (m->slots[i].key != U64MAP_EMPTY) {
            *key = m->slots[i].key;
            *value = m->slots[i].value;
            return 1;
        }
    }
    if (*cursor == m->capacity && m->has_empty_key) {
        (*cursor)++;
        *key = U64MAP_EMPTY;
        *value = m->empty_key_value;
        return 1;
    }
    return 0;
}

#endif
