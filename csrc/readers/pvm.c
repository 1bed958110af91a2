/* The data-only pickle interpreter (see pvm.h). Each opcode does what CPython's C unpickler does
 * with it, with the same stack, mark and memo rules; where the unpickler would accept something
 * this one does not model, this one refuses (the reference route then decides). */
#include "pvm.h"

#define MAX_PROTOCOL 5

typedef struct {
    Tree *t;
    VEC(Val) stack;
    VEC(size_t) marks;
    VEC(Val) memo;
} Vm;

static inline size_t fence(const Vm *vm) {
    return vm->marks.len ? vm->marks.data[vm->marks.len - 1] : 0;
}

static int new_container(Vm *vm, uint8_t type, Val *out) {
    Tree *t = vm->t;
    Cont c = {-1, -1, 0, type};
    if (vec_push(t->budget, &t->conts, c) < 0) return -1;
    out->type = type;
    out->n = 0;
    out->v = (int64_t)t->conts.len - 1;
    return 0;
}

/* Append n values to container ci: one new chunk, or the container's last chunk grown in place when
 * it ends the arena (consecutive APPENDS batches of one list). */
static int cont_append(Tree *t, int64_t ci, const Val *vals, size_t n) {
    if (!n) return 0;
    if (vec_reserve(t->budget, &t->items, n) < 0) return -1;
    Cont *c = &t->conts.data[ci];
    if (c->last >= 0) {
        Chunk *ch = &t->chunks.data[c->last];
        if ((size_t)(ch->start + ch->n) == t->items.len) {
            memcpy(t->items.data + t->items.len, vals, n * sizeof(Val));
            t->items.len += n;
            ch->n += (int64_t)n;
            c->count += (int64_t)n;
            return 0;
        }
    }
    Chunk ch = {(int64_t)t->items.len, (int64_t)n, -1};
    if (vec_push(t->budget, &t->chunks, ch) < 0) return -1;
    c = &t->conts.data[ci];
    int64_t id = (int64_t)t->chunks.len - 1;
    if (c->last >= 0) t->chunks.data[c->last].next = id;
    else c->first = id;
    c->last = id;
    memcpy(t->items.data + t->items.len, vals, n * sizeof(Val));
    t->items.len += n;
    c->count += (int64_t)n;
    return 0;
}

static inline int is_hashable_scalar(const Val *v) {
    /* Keys a snapshot can hold; tuples (whose hash can be made exponential) and containers go to
     * the reference route. */
    return v->type <= V_STR;
}

/* SETITEMS / SETITEM: the dict at stack[x-1] gets the pairs stack[x:]. */
static int set_items(Vm *vm, size_t x) {
    size_t len = vm->stack.len;
    if (x > len || x <= fence(vm)) return -1;     /* stack underflow */
    Val *target = &vm->stack.data[x - 1];
    if (target->type != V_DICT) return -1;
    if ((len - x) % 2) return -1;                 /* odd number of items */
    for (size_t i = x; i < len; i += 2)
        if (!is_hashable_scalar(&vm->stack.data[i])) return -1;
    if (cont_append(vm->t, target->v, vm->stack.data + x, len - x) < 0) return -1;
    vm->stack.len = x;
    return 0;
}

/* APPENDS / APPEND: the list at stack[x-1] gets stack[x:]. */
static int append_items(Vm *vm, size_t x) {
    size_t len = vm->stack.len;
    if (x > len || x <= fence(vm)) return -1;
    Val *target = &vm->stack.data[x - 1];
    if (target->type != V_LIST) return -1;
    if (cont_append(vm->t, target->v, vm->stack.data + x, len - x) < 0) return -1;
    vm->stack.len = x;
    return 0;
}

/* The tuple of stack[start:] replaces those items. */
static int make_tuple(Vm *vm, size_t start) {
    size_t len = vm->stack.len;
    if (start > len || start < fence(vm)) return -1;
    Val tup;
    if (new_container(vm, V_TUPLE, &tup) < 0) return -1;
    if (cont_append(vm->t, tup.v, vm->stack.data + start, len - start) < 0) return -1;
    vm->stack.len = start;
    return vec_push(vm->t->budget, &vm->stack, tup);
}

static int pop_mark(Vm *vm, size_t *x) {
    if (!vm->marks.len) return -1;
    *x = vm->marks.data[--vm->marks.len];
    return 0;
}

static int push_str(Vm *vm, size_t pos, uint64_t n) {
    Tree *t = vm->t;
    if (n > t->size - pos || n > UINT32_MAX) return -1;
    size_t chars;
    if (!rd_utf8_ok(t->data + pos, (size_t)n, &chars)) return -1;
    Val v = {V_STR, {0}, (uint32_t)n, (int64_t)pos};
    return vec_push(t->budget, &vm->stack, v);
}

static int push_long(Vm *vm, size_t pos, uint64_t n) {
    Tree *t = vm->t;
    if (n > t->size - pos || n > UINT32_MAX) return -1;
    const uint8_t *b = t->data + pos;
    Val v = {V_INT, {0}, 0, 0};
    if (n == 0) return vec_push(t->budget, &vm->stack, v);
    uint8_t sign = (b[n - 1] & 0x80) ? 0xFF : 0x00;
    int fits = 1;
    if (n > 8) {
        for (size_t i = 8; i < n; i++)
            if (b[i] != sign) { fits = 0; break; }
        if (fits && ((b[7] & 0x80) ? 0xFF : 0x00) != sign) fits = 0;
    }
    if (!fits) {
        v.type = V_BIGINT;
        v.n = (uint32_t)n;
        v.v = (int64_t)pos;
        return vec_push(t->budget, &vm->stack, v);
    }
    uint64_t u = 0;
    size_t k = n < 8 ? n : 8;
    for (size_t i = 0; i < k; i++) u |= (uint64_t)b[i] << (8 * i);
    if (k < 8 && sign) u |= ~(uint64_t)0 << (8 * k);
    v.v = (int64_t)u;
    return vec_push(t->budget, &vm->stack, v);
}

static inline uint64_t le(const uint8_t *p, int n) {
    uint64_t u = 0;
    for (int i = 0; i < n; i++) u |= (uint64_t)p[i] << (8 * i);
    return u;
}

/* May a read of k bytes start at pos? Python's unpickler refuses a read that starts inside a frame
 * and ends past it (CPython's C unpickler does not look): such files go to the reference route,
 * where both unpicklers are tried. A read that starts at the frame's end leaves the frame. */
static inline int frame_allows(size_t *frame_end, size_t pos, size_t k) {
    if (pos >= *frame_end) {
        *frame_end = 0;
        return 1;
    }
    return k <= *frame_end - pos;
}

int pvm_load(Tree *t, const uint8_t *data, size_t size, Budget *budget) {
    Vm vm;
    memset(&vm, 0, sizeof(vm));
    vm.t = t;
    t->data = data;
    t->size = size;
    t->budget = budget;
    int rc = -1;
    size_t pos = 0, frame_end = 0;     /* frame_end: 0, or where the current frame ends */
#define NEED(k) do { if (size - pos < (size_t)(k) || !frame_allows(&frame_end, pos, (size_t)(k))) goto done; } while (0)
#define PUSH(val) do { if (vec_push(budget, &vm.stack, (val)) < 0) goto done; } while (0)
    while (pos < size) {
        NEED(1);
        uint8_t op = data[pos++];
        Val v = {V_NONE, {0}, 0, 0};
        size_t x;
        switch (op) {
        case 0x80: /* PROTO */
            NEED(1);
            if (data[pos] > MAX_PROTOCOL) goto done;
            pos += 1;
            break;
        case 0x95: { /* FRAME: its length checked, and no new frame before the current one ends */
            NEED(8);
            uint64_t n = le(data + pos, 8);
            pos += 8;
            if (n > size - pos || (frame_end && pos < frame_end)) goto done;
            frame_end = pos + (size_t)n;
            break;
        }
        case '.': /* STOP */
            if (vm.marks.len || vm.stack.len != 1) goto done;
            t->root = vm.stack.data[0];
            rc = 0;
            goto done;
        case '}':
            if (new_container(&vm, V_DICT, &v) < 0) goto done;
            PUSH(v);
            break;
        case ']':
            if (new_container(&vm, V_LIST, &v) < 0) goto done;
            PUSH(v);
            break;
        case ')':
            if (new_container(&vm, V_TUPLE, &v) < 0) goto done;
            PUSH(v);
            break;
        case '(': /* MARK */
            if (vec_push(budget, &vm.marks, vm.stack.len) < 0) goto done;
            break;
        case 's': /* SETITEM */
            if (vm.stack.len < 2 || set_items(&vm, vm.stack.len - 2) < 0) goto done;
            break;
        case 'u': /* SETITEMS */
            if (pop_mark(&vm, &x) < 0 || set_items(&vm, x) < 0) goto done;
            break;
        case 'a': /* APPEND */
            if (vm.stack.len < 1 || append_items(&vm, vm.stack.len - 1) < 0) goto done;
            break;
        case 'e': /* APPENDS */
            if (pop_mark(&vm, &x) < 0 || append_items(&vm, x) < 0) goto done;
            break;
        case 't': /* TUPLE */
            if (pop_mark(&vm, &x) < 0 || make_tuple(&vm, x) < 0) goto done;
            break;
        case 0x85: case 0x86: case 0x87: { /* TUPLE1..3 */
            size_t k = (size_t)(op - 0x84);
            if (vm.stack.len < k || make_tuple(&vm, vm.stack.len - k) < 0) goto done;
            break;
        }
        case 'X': /* BINUNICODE */
            NEED(4);
            x = (size_t)le(data + pos, 4);
            pos += 4;
            NEED(x);
            if (push_str(&vm, pos, x) < 0) goto done;
            pos += x;
            break;
        case 0x8c: /* SHORT_BINUNICODE */
            NEED(1);
            x = data[pos++];
            NEED(x);
            if (push_str(&vm, pos, x) < 0) goto done;
            pos += x;
            break;
        case 0x8d: { /* BINUNICODE8 */
            NEED(8);
            uint64_t n = le(data + pos, 8);
            pos += 8;
            if (n > size - pos) goto done;
            NEED(n);
            if (push_str(&vm, pos, n) < 0) goto done;
            pos += (size_t)n;
            break;
        }
        case 'J': /* BININT */
            NEED(4);
            v.type = V_INT;
            v.v = (int32_t)(uint32_t)le(data + pos, 4);
            pos += 4;
            PUSH(v);
            break;
        case 'K': /* BININT1 */
            NEED(1);
            v.type = V_INT;
            v.v = data[pos++];
            PUSH(v);
            break;
        case 'M': /* BININT2 */
            NEED(2);
            v.type = V_INT;
            v.v = (int64_t)le(data + pos, 2);
            pos += 2;
            PUSH(v);
            break;
        case 0x8a: /* LONG1 */
            NEED(1);
            x = data[pos++];
            NEED(x);
            if (push_long(&vm, pos, x) < 0) goto done;
            pos += x;
            break;
        case 0x8b: { /* LONG4 */
            NEED(4);
            int32_t n = (int32_t)(uint32_t)le(data + pos, 4);
            pos += 4;
            if (n < 0) goto done;
            NEED(n);
            if (push_long(&vm, pos, (uint64_t)n) < 0) goto done;
            pos += (size_t)n;
            break;
        }
        case 'G': { /* BINFLOAT: big-endian IEEE 754 double */
            NEED(8);
            uint64_t u = 0;
            for (int i = 0; i < 8; i++) u = (u << 8) | data[pos + i];
            pos += 8;
            v.type = V_FLOAT;
            v.v = (int64_t)u;
            PUSH(v);
            break;
        }
        case 'N':
            PUSH(v);
            break;
        case 0x88:
            v.type = V_TRUE;
            PUSH(v);
            break;
        case 0x89:
            v.type = V_FALSE;
            PUSH(v);
            break;
        case 0x94: /* MEMOIZE */
            if (vm.stack.len <= fence(&vm)) goto done;
            if (vec_push(budget, &vm.memo, vm.stack.data[vm.stack.len - 1]) < 0) goto done;
            break;
        case 'q': case 'r': { /* BINPUT, LONG_BINPUT: dense indices only (what picklers write) */
            int k = op == 'q' ? 1 : 4;
            NEED(k);
            uint64_t idx = le(data + pos, k);
            pos += (size_t)k;
            if (vm.stack.len <= fence(&vm)) goto done;
            Val top = vm.stack.data[vm.stack.len - 1];
            if (idx < vm.memo.len) vm.memo.data[idx] = top;
            else if (idx == vm.memo.len) {
                if (vec_push(budget, &vm.memo, top) < 0) goto done;
            } else goto done;
            break;
        }
        case 'h': case 'j': { /* BINGET, LONG_BINGET */
            int k = op == 'h' ? 1 : 4;
            NEED(k);
            uint64_t idx = le(data + pos, k);
            pos += (size_t)k;
            if (idx >= vm.memo.len) goto done;
            PUSH(vm.memo.data[idx]);
            break;
        }
        default:
            goto done;   /* anything else: the reference route decides */
        }
    }
done:
#undef NEED
#undef PUSH
    vec_free(budget, &vm.stack);
    vec_free(budget, &vm.marks);
    vec_free(budget, &vm.memo);
    return rc;
}

void pvm_free(Tree *t) {
    vec_free(t->budget, &t->items);
    vec_free(t->budget, &t->chunks);
    vec_free(t->budget, &t->conts);
}
