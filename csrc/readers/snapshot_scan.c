/* Read a PyTorch snapshot's value tree (pvm.h) into columns: snapshot_scan(data, limits...).
 *
 * This is the compiled twin of the Python fast path (snapshot.py's _parse_segments and
 * snapshot_fast.entry_columns with frames.FrameTable): the same fields with the same checks, frames
 * interned in the same first-seen order. It returns None for anything that path would not take as
 * clean (a missing key, a value of another type or range, time going back, a bad frame, a cap
 * exceeded, more work than the file's size warrants): the Python reference route then reads the
 * file and names the problem, so both routes give the same Trace or the same error.
 */
#include "pvm.h"

#define MAX_SIZE_BYTES ((int64_t)1 << 50)
#define K_SMALL_BUFFER ((int64_t)2 * 1024 * 1024)
#define INT64_MAX_ ((int64_t)0x7fffffffffffffffLL)

/* ------------------------------------------------------------------------------------ keys */
enum {
    K_ACTION, K_SIZE, K_STREAM, K_ADDR, K_TIME_US, K_FRAMES, K_DEVICE_FREE, K_USER_METADATA,
    K_COMPILE_CONTEXT, K_ADDRESS, K_TOTAL_SIZE, K_BLOCKS, K_DEVICE, K_SEGMENT_TYPE, K_IS_EXPANDABLE,
    K_SEGMENT_POOL_ID, K_STATE, K_REQUESTED_SIZE, K_FILENAME, K_LINE, K_NAME, K_SEGMENTS,
    K_DEVICE_TRACES, K_ALLOCATOR_SETTINGS, K_EXTERNAL_ANNOTATIONS, K_HISTORY, K_COUNT
};

static const char *KEY_NAMES[K_COUNT] = {
    "action", "size", "stream", "addr", "time_us", "frames", "device_free", "user_metadata",
    "compile_context", "address", "total_size", "blocks", "device", "segment_type", "is_expandable",
    "segment_pool_id", "state", "requested_size", "filename", "line", "name", "segments",
    "device_traces", "allocator_settings", "external_annotations", "history",
};

#define BIT(k) ((uint32_t)1 << (k))
#define ENTRY_KEYS (BIT(K_ACTION) | BIT(K_SIZE) | BIT(K_STREAM) | BIT(K_ADDR) | BIT(K_TIME_US) | BIT(K_FRAMES) \
                    | BIT(K_DEVICE_FREE) | BIT(K_USER_METADATA) | BIT(K_COMPILE_CONTEXT))
#define SEGMENT_KEYS (BIT(K_ADDRESS) | BIT(K_TOTAL_SIZE) | BIT(K_BLOCKS) | BIT(K_DEVICE) | BIT(K_STREAM) \
                      | BIT(K_SEGMENT_TYPE) | BIT(K_IS_EXPANDABLE) | BIT(K_SEGMENT_POOL_ID))
#define BLOCK_KEYS (BIT(K_SIZE) | BIT(K_STATE) | BIT(K_ADDRESS) | BIT(K_REQUESTED_SIZE) | BIT(K_FRAMES) \
                    | BIT(K_HISTORY))
#define FRAME_KEYS (BIT(K_FILENAME) | BIT(K_LINE) | BIT(K_NAME))
#define TOP_KEYS (BIT(K_SEGMENTS) | BIT(K_DEVICE_TRACES) | BIT(K_ALLOCATOR_SETTINGS) | BIT(K_EXTERNAL_ANNOTATIONS))

static const char *ACTIONS[] = {"alloc", "free_requested", "free_completed", "snapshot", "segment_alloc",
                                "segment_free", "segment_map", "segment_unmap", "oom"};
#define N_ACTIONS 9
#define ACTION_SNAPSHOT 3
#define ACTION_OOM 8
static const char *STATES[] = {"active_allocated", "active_pending_free", "active_awaiting_free", "inactive"};
#define N_STATES 4

typedef struct {
    const Tree *t;
    uint32_t present;
    Val v[K_COUNT];
} Fields;

static inline int str_is(const Tree *t, const Val *v, const char *s) {
    size_t n = strlen(s);
    return v->type == V_STR && v->n == n && memcmp(t->data + v->v, s, n) == 0;
}

static int str_index(const Tree *t, const Val *v, const char **names, int count) {
    if (v->type != V_STR) return -1;
    for (int i = 0; i < count; i++)
        if (str_is(t, v, names[i])) return i;
    return -1;
}

typedef struct {
    const Tree *t;
    Budget *budget;
    /* limits */
    int64_t max_frames, max_string_chars;
    int64_t max_frame_text, frame_text;  /* bytes of text of distinct frames (FrameTable.text_chars) */
    /* pairs scanned so far and the most the file's size allows before the reference route takes it */
    int64_t work, work_limit;
    int keep_frames;               /* 0: stack frames are not read (every stack id -1) */
    /* which key a string at an input offset is (pickles share key strings through the memo) */
    int64_t key_cache_off[256];
    int8_t key_cache_id[256];
} Ctx;

static uint8_t KEY_LEN[K_COUNT];

static int key_id(Ctx *cx, const Val *key) {
    if (key->type != V_STR || key->n < 4 || key->n > 20) return -1;
    size_t slot = ((uint64_t)key->v * 0x9E3779B97F4A7C15ULL) >> 56;
    if (cx->key_cache_off[slot] == key->v) return cx->key_cache_id[slot];
    const char *text = (const char *)cx->t->data + key->v;
    int found = -1;
    for (int k = 0; k < K_COUNT; k++) {
        if (KEY_LEN[k] == key->n && memcmp(KEY_NAMES[k], text, key->n) == 0) {
            found = k;
            break;
        }
    }
    cx->key_cache_off[slot] = key->v;
    cx->key_cache_id[slot] = (int8_t)found;
    return found;
}

/* Scan dict container ci once: the last value of each wanted key (Python's d[k]), and which are present. */
static int scan_dict(Ctx *cx, const Val *d, uint32_t want, Fields *f) {
    const Tree *t = cx->t;
    f->t = t;
    f->present = 0;
    cx->work += pvm_len(t, d);
    if (cx->work > cx->work_limit) return -1;
    PvmIter it = pvm_iter(t, d->v);
    while (pvm_next(t, &it)) {
        int k = key_id(cx, it.item);
        if (!pvm_next(t, &it)) return -1;
        if (k >= 0 && (want & BIT(k))) {
            f->v[k] = *it.item;
            f->present |= BIT(k);
        }
    }
    return 0;
}

static inline int has(const Fields *f, int k) { return (f->present & BIT(k)) != 0; }

/* An int (not a bool) within [lo, hi]. */
static inline int int_in(const Val *v, int64_t lo, int64_t hi, int64_t *out) {
    if (v->type != V_INT || v->v < lo || v->v > hi) return 0;
    *out = v->v;
    return 1;
}

/* ------------------------------------------------------------------------------------ frames */
typedef struct {
    Ctx *cx;
    /* strings: by input offset, then by content */
    PairMap str_by_pos;
    BytesMap str_by_text;
    VEC(int64_t) str_off;
    VEC(uint32_t) str_len;
    /* frames: (filename id, name id, line) -> frame id; also by dict container */
    PairMap frame_by_key;
    VEC(uint32_t) frame_file;
    VEC(uint32_t) frame_name;
    VEC(int64_t) frame_line;
    int32_t *frame_of_cont;        /* per container: frame id, -1 unknown */
    int32_t *stack_of_cont;        /* per container: stack id, -2 unknown */
    size_t n_conts;
    /* stacks: frame-id sequence -> stack id */
    BytesMap stack_by_ids;
    VEC(int32_t) stack_frames;
    VEC(int64_t) stack_starts;
    VEC(int32_t) ids;              /* the list being interned */
} Frames;

static int same_text(void *ctx, uint32_t id, const void *key, size_t len) {
    Frames *fr = ctx;
    return fr->str_len.data[id] == len && memcmp(fr->cx->t->data + fr->str_off.data[id], key, len) == 0;
}

static int same_ids(void *ctx, uint32_t id, const void *key, size_t len) {
    Frames *fr = ctx;
    int64_t a = fr->stack_starts.data[id], b = fr->stack_starts.data[id + 1];
    return (size_t)(b - a) * sizeof(int32_t) == len && memcmp(fr->stack_frames.data + a, key, len) == 0;
}

/* Code points of a (validated) UTF-8 string: bytes that do not continue a sequence. */
static int64_t chars_of(const uint8_t *s, size_t n) {
    int64_t count = 0;
    for (size_t i = 0; i < n; i++) count += (s[i] & 0xC0) != 0x80;
    return count;
}

/* The id of string value v, interned by content; -1 to hand the file back. */
static int64_t string_id(Frames *fr, const Val *v) {
    Budget *b = fr->cx->budget;
    int found;
    PairSlot *slot = pairmap_get_or_insert(b, &fr->str_by_pos, v->v, v->n, (uint32_t)fr->str_off.len, &found);
    if (!slot) return -1;
    if (found) return slot->value;
    const uint8_t *text = fr->cx->t->data + v->v;
    if (chars_of(text, v->n) > fr->cx->max_string_chars) return -1;     /* LimitExceeded: reference */
    int is_new;
    int64_t id = bytesmap_get_or_insert(b, &fr->str_by_text, text, v->n, (uint32_t)fr->str_off.len,
                                        same_text, fr, &is_new);
    if (id < 0) return -1;
    if (is_new) {
        if (vec_push(b, &fr->str_off, v->v) < 0 || vec_push(b, &fr->str_len, v->n) < 0) return -1;
    }
    slot->value = (uint32_t)id;
    return id;
}

/* The frame id of one frame dict (FrameTable._frame_id); -1 to hand back. */
static int64_t frame_id(Frames *fr, const Val *frame) {
    if (frame->type != V_DICT) return -1;
    if (fr->frame_of_cont[frame->v] >= 0) return fr->frame_of_cont[frame->v];
    Fields f;
    if (scan_dict(fr->cx, frame, FRAME_KEYS, &f) < 0) return -1;
    int64_t file_id = -1, name_id = -1, line = 0;
    static const Val EMPTY = {V_STR, {0}, 0, 0};
    const Val *file = has(&f, K_FILENAME) ? &f.v[K_FILENAME] : &EMPTY;
    const Val *name = has(&f, K_NAME) ? &f.v[K_NAME] : &EMPTY;
    if (file->type != V_STR || name->type != V_STR) return -1;
    if (has(&f, K_LINE) && !int_in(&f.v[K_LINE], INT64_MIN, INT64_MAX_, &line)) return -1;
    file_id = string_id(fr, file);
    name_id = string_id(fr, name);
    if (file_id < 0 || name_id < 0) return -1;
    Budget *b = fr->cx->budget;
    int found;
    PairSlot *slot = pairmap_get_or_insert(b, &fr->frame_by_key, (file_id << 32) | name_id, line,
                                           (uint32_t)fr->frame_line.len, &found);
    if (!slot) return -1;
    if (!found) {
        if ((int64_t)fr->frame_line.len >= fr->cx->max_frames) return -1;
        /* shared strings count once per distinct frame: bytes >= characters, so past the cap here
         * the reference route decides (and names the limit) */
        fr->cx->frame_text += (int64_t)fr->str_len.data[file_id] + (int64_t)fr->str_len.data[name_id];
        if (fr->cx->frame_text > fr->cx->max_frame_text) return -1;
        if (vec_push(b, &fr->frame_file, (uint32_t)file_id) < 0 || vec_push(b, &fr->frame_name, (uint32_t)name_id) < 0
                || vec_push(b, &fr->frame_line, line) < 0)
            return -1;
    }
    fr->frame_of_cont[frame->v] = (int32_t)slot->value;
    return slot->value;
}

/* The stack id of an entry's or block's 'frames' value (FrameTable.stack_id); -3 to hand back. */
static int64_t stack_id(Frames *fr, const Val *frames) {
    if (frames->type == V_NONE || !fr->cx->keep_frames) return -1;
    if (frames->type != V_LIST) return -3;
    int64_t known = fr->stack_of_cont[frames->v];
    if (known != -2) return known;
    int64_t n = pvm_len(fr->cx->t, frames);
    if (n == 0) {
        fr->stack_of_cont[frames->v] = -1;
        return -1;
    }
    if (n > fr->cx->max_frames) return -3;
    Budget *b = fr->cx->budget;
    fr->ids.len = 0;
    fr->cx->work += n;
    if (fr->cx->work > fr->cx->work_limit || vec_reserve(b, &fr->ids, (size_t)n) < 0) return -3;
    PvmIter it = pvm_iter(fr->cx->t, frames->v);
    while (pvm_next(fr->cx->t, &it)) {
        const Val *item = it.item;
        /* most frame dicts are shared through the memo and met before: one array lookup */
        int64_t fid = item->type == V_DICT ? fr->frame_of_cont[item->v] : -1;
        if (fid < 0) fid = frame_id(fr, item);
        if (fid < 0) return -3;
        fr->ids.data[fr->ids.len++] = (int32_t)fid;
    }
    int is_new;
    int64_t sid = bytesmap_get_or_insert(b, &fr->stack_by_ids, fr->ids.data, fr->ids.len * sizeof(int32_t),
                                         (uint32_t)(fr->stack_starts.len - 1), same_ids, fr, &is_new);
    if (sid < 0) return -3;
    if (is_new) {
        if (vec_reserve(b, &fr->stack_frames, fr->ids.len) < 0) return -3;
        memcpy(fr->stack_frames.data + fr->stack_frames.len, fr->ids.data, fr->ids.len * sizeof(int32_t));
        fr->stack_frames.len += fr->ids.len;
        if (vec_push(b, &fr->stack_starts, (int64_t)fr->stack_frames.len) < 0) return -3;
        if ((int64_t)fr->stack_frames.len > fr->cx->max_frames * 8) return -3;
    }
    fr->stack_of_cont[frames->v] = (int32_t)sid;
    return sid;
}

static int frames_init(Frames *fr, Ctx *cx) {
    memset(fr, 0, sizeof(*fr));
    fr->cx = cx;
    fr->n_conts = cx->t->conts.len;
    size_t bytes = (fr->n_conts ? fr->n_conts : 1) * sizeof(int32_t);
    fr->frame_of_cont = budget_realloc(cx->budget, NULL, 0, bytes);
    fr->stack_of_cont = budget_realloc(cx->budget, NULL, 0, bytes);
    if (!fr->frame_of_cont || !fr->stack_of_cont) return -1;
    memset(fr->frame_of_cont, 0xFF, bytes);                          /* -1 */
    for (size_t i = 0; i < fr->n_conts; i++) fr->stack_of_cont[i] = -2;
    return vec_push(cx->budget, &fr->stack_starts, (int64_t)0);
}

static void frames_free(Frames *fr) {
    Budget *b = fr->cx->budget;
    size_t bytes = (fr->n_conts ? fr->n_conts : 1) * sizeof(int32_t);
    if (fr->frame_of_cont) budget_free(b, fr->frame_of_cont, bytes);
    if (fr->stack_of_cont) budget_free(b, fr->stack_of_cont, bytes);
    pairmap_free(b, &fr->str_by_pos);
    bytesmap_free(b, &fr->str_by_text);
    vec_free(b, &fr->str_off);
    vec_free(b, &fr->str_len);
    pairmap_free(b, &fr->frame_by_key);
    vec_free(b, &fr->frame_file);
    vec_free(b, &fr->frame_name);
    vec_free(b, &fr->frame_line);
    bytesmap_free(b, &fr->stack_by_ids);
    vec_free(b, &fr->stack_frames);
    vec_free(b, &fr->stack_starts);
    vec_free(b, &fr->ids);
}

static PyObject *py_str(const Tree *t, int64_t off, size_t len) {
    return PyUnicode_DecodeUTF8((const char *)t->data + off, (Py_ssize_t)len, "surrogatepass");
}

/* (filenames, lines, names, stack_frames, stack_starts) as FrameTable.tables() holds them. */
static PyObject *frames_tables(Frames *fr) {
    const Tree *t = fr->cx->t;
    size_t n = fr->frame_line.len;
    PyObject *files = PyList_New((Py_ssize_t)n), *names = PyList_New((Py_ssize_t)n);
    PyObject *strs = PyList_New((Py_ssize_t)fr->str_off.len);
    if (!files || !names || !strs) goto fail;
    for (size_t i = 0; i < fr->str_off.len; i++) {
        PyObject *s = py_str(t, fr->str_off.data[i], fr->str_len.data[i]);
        if (!s) goto fail;
        PyList_SET_ITEM(strs, (Py_ssize_t)i, s);
    }
    for (size_t i = 0; i < n; i++) {
        PyObject *f = PyList_GET_ITEM(strs, fr->frame_file.data[i]);
        PyObject *m = PyList_GET_ITEM(strs, fr->frame_name.data[i]);
        Py_INCREF(f);
        Py_INCREF(m);
        PyList_SET_ITEM(files, (Py_ssize_t)i, f);
        PyList_SET_ITEM(names, (Py_ssize_t)i, m);
    }
    Py_DECREF(strs);
    return Py_BuildValue("(NNNNN)", files, rd_bytearray_copy(fr->frame_line.data, n, 8), names,
                         rd_bytearray_copy(fr->stack_frames.data, fr->stack_frames.len, 4),
                         rd_bytearray_copy(fr->stack_starts.data, fr->stack_starts.len, 8));
fail:
    Py_XDECREF(files);
    Py_XDECREF(names);
    Py_XDECREF(strs);
    return NULL;
}

/* ------------------------------------------------------------------------------------ settings */
/* The Python object a value stands for, as the unpickler builds it (shared containers shared);
 * NULL without an error set: hand back (too big, too deep, a cycle through a tuple). */
typedef struct {
    const Tree *t;
    PyObject *made;       /* container index -> object */
    PyObject *busy;       /* tuples being built */
    int64_t nodes_left;
} Maker;

static PyObject *make_value(Maker *mk, const Val *v, int depth);

static PyObject *make_container(Maker *mk, const Val *v, int depth) {
    const Tree *t = mk->t;
    PyObject *key = PyLong_FromLongLong(v->v);
    if (!key) return NULL;
    PyObject *known = PyDict_GetItemWithError(mk->made, key);
    if (known || PyErr_Occurred()) {
        Py_XINCREF(known);
        Py_DECREF(key);
        return known;
    }
    if (v->type == V_TUPLE) {
        int busy = PySet_Contains(mk->busy, key);
        if (busy != 0 || PySet_Add(mk->busy, key) < 0) { Py_DECREF(key); return NULL; }
        PyObject *tup = PyTuple_New((Py_ssize_t)pvm_len(t, v));
        Py_ssize_t i = 0;
        PvmIter it = pvm_iter(t, v->v);
        while (tup && pvm_next(t, &it)) {
            PyObject *item = make_value(mk, it.item, depth + 1);
            if (!item) Py_CLEAR(tup);
            else PyTuple_SET_ITEM(tup, i++, item);
        }
        if (tup && (PySet_Discard(mk->busy, key) < 0 || PyDict_SetItem(mk->made, key, tup) < 0)) Py_CLEAR(tup);
        Py_DECREF(key);
        return tup;
    }
    PyObject *obj = v->type == V_LIST ? PyList_New(0) : PyDict_New();
    /* Registered before its items: a list or dict may hold itself. */
    if (!obj || PyDict_SetItem(mk->made, key, obj) < 0) { Py_XDECREF(obj); Py_DECREF(key); return NULL; }
    Py_DECREF(key);
    PvmIter it = pvm_iter(t, v->v);
    while (pvm_next(t, &it)) {
        PyObject *a = make_value(mk, it.item, depth + 1), *b = NULL;
        int rc = -1;
        if (a && v->type == V_LIST) rc = PyList_Append(obj, a);
        else if (a && pvm_next(t, &it) && (b = make_value(mk, it.item, depth + 1)) != NULL)
            rc = PyDict_SetItem(obj, a, b);
        Py_XDECREF(a);
        Py_XDECREF(b);
        if (rc < 0) { Py_DECREF(obj); return NULL; }
    }
    return obj;
}

static PyObject *make_value(Maker *mk, const Val *v, int depth) {
    if (--mk->nodes_left < 0 || depth > 256) return NULL;
    const Tree *t = mk->t;
    switch (v->type) {
    case V_NONE: Py_RETURN_NONE;
    case V_TRUE: Py_RETURN_TRUE;
    case V_FALSE: Py_RETURN_FALSE;
    case V_INT: return PyLong_FromLongLong(v->v);
    case V_FLOAT: {
        double d;
        uint64_t u = (uint64_t)v->v;
        memcpy(&d, &u, 8);
        return PyFloat_FromDouble(d);
    }
    case V_STR: return py_str(t, v->v, v->n);
    case V_BIGINT: {
        /* int.from_bytes(raw, "little", signed=True), as the unpickler reads LONG1 / LONG4 */
        PyObject *raw = PyBytes_FromStringAndSize((const char *)t->data + v->v, v->n);
        PyObject *method = PyObject_GetAttrString((PyObject *)&PyLong_Type, "from_bytes");
        PyObject *call_args = raw ? Py_BuildValue("(Os)", raw, "little") : NULL;
        PyObject *kwargs = Py_BuildValue("{s:O}", "signed", Py_True);
        PyObject *out = method && call_args && kwargs ? PyObject_Call(method, call_args, kwargs) : NULL;
        Py_XDECREF(raw);
        Py_XDECREF(method);
        Py_XDECREF(call_args);
        Py_XDECREF(kwargs);
        return out;
    }
    default:
        return make_container(mk, v, depth);
    }
}

/* The settings object; NULL with an error set on failure, NULL without one to hand back. */
static PyObject *make_settings(Ctx *cx, const Val *v) {
    Maker mk = {cx->t, PyDict_New(), PySet_New(NULL), 100000};
    PyObject *out = NULL;
    if (mk.made && mk.busy) out = make_value(&mk, v, 0);
    if (mk.made) PyDict_Clear(mk.made);    /* break the cycles of self-holding containers */
    Py_XDECREF(mk.made);
    Py_XDECREF(mk.busy);
    return out;
}

/* ------------------------------------------------------------------------------------ columns */
typedef struct {
    VEC(int64_t) device, addr, size, stream, n_blocks;
    VEC(int8_t) pool, expandable;
    VEC(int64_t) b_seg, b_addr, b_size, b_requested;
    VEC(int8_t) b_state;
    VEC(int32_t) b_stack;
    int hint_expandable, hint_pool_id;
} SegCols;

typedef struct {
    VEC(int8_t) action;
    VEC(int64_t) size, stream, addr, t_ns, extra;
    VEC(int32_t) stack;
} DevCols;

/* One segment (snapshot.py _parse_segment); 0, or -1 to hand back. */
static int read_segment(Ctx *cx, Frames *fr, SegCols *sc, const Val *seg, int64_t index, int64_t *spend) {
    Budget *b = cx->budget;
    const Tree *t = cx->t;
    if (seg->type != V_DICT) return -1;
    Fields f;
    if (scan_dict(cx, seg, SEGMENT_KEYS, &f) < 0) return -1;
    sc->hint_expandable |= has(&f, K_IS_EXPANDABLE);
    sc->hint_pool_id |= has(&f, K_SEGMENT_POOL_ID);
    int64_t addr, size, device = 0, stream = 0;
    if (!has(&f, K_ADDRESS) || !has(&f, K_TOTAL_SIZE) || !has(&f, K_BLOCKS)) return -1;
    if (!int_in(&f.v[K_ADDRESS], 0, INT64_MAX_, &addr)) return -1;
    if (!int_in(&f.v[K_TOTAL_SIZE], 0, MAX_SIZE_BYTES, &size)) return -1;
    if (has(&f, K_DEVICE) && !int_in(&f.v[K_DEVICE], 0, 32767, &device)) return -1;
    if (has(&f, K_STREAM) && !int_in(&f.v[K_STREAM], INT64_MIN, INT64_MAX_, &stream)) return -1;
    int8_t pool;
    if (has(&f, K_SEGMENT_TYPE) && f.v[K_SEGMENT_TYPE].type != V_NONE) {
        if (str_is(t, &f.v[K_SEGMENT_TYPE], "small")) pool = 0;
        else if (str_is(t, &f.v[K_SEGMENT_TYPE], "large")) pool = 1;
        else return -1;
    } else {
        pool = size == K_SMALL_BUFFER ? 0 : 1;
    }
    int8_t expandable = 0;
    if (has(&f, K_IS_EXPANDABLE)) {
        uint8_t ty = f.v[K_IS_EXPANDABLE].type;
        if (ty != V_TRUE && ty != V_FALSE) return -1;
        expandable = ty == V_TRUE;
    }
    const Val blocks = f.v[K_BLOCKS];
    if (blocks.type != V_LIST) return -1;
    int64_t n_blocks = pvm_len(t, &blocks);
    *spend += n_blocks;
    int64_t offset = addr;
    PvmIter it = pvm_iter(t, blocks.v);
    while (pvm_next(t, &it)) {
        const Val *blk = it.item;
        if (blk->type != V_DICT) return -1;
        Fields g;
        if (scan_dict(cx, blk, BLOCK_KEYS, &g) < 0) return -1;
        int64_t bsize, baddr, requested;
        if (!has(&g, K_SIZE) || !has(&g, K_STATE)) return -1;
        /* A PyTorch 2.0 block keeps its stack in 'history', not 'frames': the reader takes it. */
        if (has(&g, K_HISTORY) && !has(&g, K_FRAMES)) return -1;
        if (!int_in(&g.v[K_SIZE], 0, MAX_SIZE_BYTES, &bsize)) return -1;
        if (has(&g, K_ADDRESS)) {
            if (!int_in(&g.v[K_ADDRESS], 0, INT64_MAX_, &baddr)) return -1;
        } else {
            baddr = offset;     /* older files: blocks are contiguous from the segment base */
        }
        int state = str_index(t, &g.v[K_STATE], STATES, N_STATES);
        if (state < 0) return -1;
        if (has(&g, K_REQUESTED_SIZE)) {
            if (!int_in(&g.v[K_REQUESTED_SIZE], 0, MAX_SIZE_BYTES, &requested)) return -1;
        } else {
            requested = bsize;
        }
        static const Val NONE = {V_NONE, {0}, 0, 0};
        int64_t sid = stack_id(fr, has(&g, K_FRAMES) ? &g.v[K_FRAMES] : &NONE);
        if (sid < -1) return -1;
        if (baddr > INT64_MAX_ - bsize) return -1;    /* the next implied address would not fit */
        offset = baddr + bsize;
        if (vec_push(b, &sc->b_seg, index) < 0 || vec_push(b, &sc->b_addr, baddr) < 0
                || vec_push(b, &sc->b_size, bsize) < 0 || vec_push(b, &sc->b_requested, requested) < 0
                || vec_push(b, &sc->b_state, (int8_t)state) < 0 || vec_push(b, &sc->b_stack, (int32_t)sid) < 0)
            return -1;
    }
    if (vec_push(b, &sc->device, device) < 0 || vec_push(b, &sc->addr, addr) < 0 || vec_push(b, &sc->size, size) < 0
            || vec_push(b, &sc->stream, stream) < 0 || vec_push(b, &sc->pool, pool) < 0
            || vec_push(b, &sc->expandable, expandable) < 0 || vec_push(b, &sc->n_blocks, n_blocks) < 0)
        return -1;
    return 0;
}

typedef struct {
    int has_time, hint_user_metadata, hint_compile_context;
    int time_missing, time_bad;     /* an entry without time_us / with one out of type or range */
    int64_t max_time_us, step_ns;
} EntryState;

/* One device's entries (snapshot_fast._device_columns); 0, or -1 to hand back. */
static int read_device(Ctx *cx, Frames *fr, const Val *raw, DevCols *dc, EntryState *es) {
    Budget *b = cx->budget;
    const Tree *t = cx->t;
    PvmIter it = pvm_iter(t, raw->v);
    while (pvm_next(t, &it)) {
        const Val *e = it.item;
        if (e->type != V_DICT) return -1;
        Fields f;
        if (scan_dict(cx, e, ENTRY_KEYS, &f) < 0) return -1;
        if (!has(&f, K_ACTION) || !has(&f, K_SIZE) || !has(&f, K_STREAM)) return -1;
        int action = str_index(t, &f.v[K_ACTION], ACTIONS, N_ACTIONS);
        if (action < 0) return -1;
        int64_t size, stream, addr = -1, t_ns = 0, extra = -1;
        if (!int_in(&f.v[K_SIZE], 0, MAX_SIZE_BYTES, &size)) return -1;
        if (!int_in(&f.v[K_STREAM], INT64_MIN, INT64_MAX_, &stream)) return -1;
        if (has(&f, K_ADDR) && !int_in(&f.v[K_ADDR], INT64_MIN, INT64_MAX_, &addr)) return -1;
        int needs_addr = action != ACTION_OOM && action != ACTION_SNAPSHOT;
        if (needs_addr && addr < 0) return -1;
        if (!needs_addr) addr = -1;
        /* time_us is kept raw: whether the file has times at all is known after every device. */
        es->hint_user_metadata |= has(&f, K_USER_METADATA);
        es->hint_compile_context |= has(&f, K_COMPILE_CONTEXT);
        if (has(&f, K_TIME_US)) {
            es->has_time = 1;
            if (!int_in(&f.v[K_TIME_US], 0, es->max_time_us, &t_ns)) es->time_bad = 1;
        } else {
            es->time_missing = 1;
            t_ns = 0;
        }
        if (action == ACTION_OOM) {
            int key = has(&f, K_DEVICE_FREE) ? K_DEVICE_FREE : (has(&f, K_ADDR) ? K_ADDR : -1);
            if (key >= 0 && !int_in(&f.v[key], 0, INT64_MAX_, &extra)) return -1;
        }
        static const Val NONE = {V_NONE, {0}, 0, 0};
        int64_t sid = stack_id(fr, has(&f, K_FRAMES) ? &f.v[K_FRAMES] : &NONE);
        if (sid < -1) return -1;
        if (vec_push(b, &dc->action, (int8_t)action) < 0 || vec_push(b, &dc->size, size) < 0
                || vec_push(b, &dc->stream, stream) < 0 || vec_push(b, &dc->addr, addr) < 0
                || vec_push(b, &dc->t_ns, t_ns) < 0 || vec_push(b, &dc->extra, extra) < 0
                || vec_push(b, &dc->stack, (int32_t)sid) < 0)
            return -1;
    }
    return 0;
}

/* Times in ns: recorded ones (all present, in range, never going back within a device) or made up
 * from the entry's position; -1 to hand back. */
static int finish_times(DevCols *dc, const EntryState *es) {
    int64_t last = INT64_MIN;
    for (size_t i = 0; i < dc->t_ns.len; i++) {
        int64_t t;
        /* max_time_us and step_ns come from the caller: a product past int64 hands the file back */
        if (es->has_time) {
            if (__builtin_mul_overflow(dc->t_ns.data[i], (int64_t)1000, &t) || t < last) return -1;
            dc->t_ns.data[i] = last = t;
        } else {
            if (__builtin_mul_overflow((int64_t)i, es->step_ns, &t)) return -1;
            dc->t_ns.data[i] = t;
        }
    }
    return 0;
}

#define BA(vec, item) rd_bytearray_copy((vec).data, (vec).len, (item))

static PyObject *seg_tuple(SegCols *sc) {
    return Py_BuildValue("(NNNNNNN)(NNNNNN)", BA(sc->device, 8), BA(sc->addr, 8), BA(sc->size, 8),
                         BA(sc->stream, 8), BA(sc->pool, 1), BA(sc->expandable, 1), BA(sc->n_blocks, 8),
                         BA(sc->b_seg, 8), BA(sc->b_addr, 8), BA(sc->b_size, 8), BA(sc->b_requested, 8),
                         BA(sc->b_state, 1), BA(sc->b_stack, 4));
}

static void seg_free(Budget *b, SegCols *sc) {
    vec_free(b, &sc->device); vec_free(b, &sc->addr); vec_free(b, &sc->size); vec_free(b, &sc->stream);
    vec_free(b, &sc->n_blocks); vec_free(b, &sc->pool); vec_free(b, &sc->expandable);
    vec_free(b, &sc->b_seg); vec_free(b, &sc->b_addr); vec_free(b, &sc->b_size);
    vec_free(b, &sc->b_requested); vec_free(b, &sc->b_state); vec_free(b, &sc->b_stack);
}

static void dev_free(Budget *b, DevCols *dc) {
    vec_free(b, &dc->action); vec_free(b, &dc->size); vec_free(b, &dc->stream); vec_free(b, &dc->addr);
    vec_free(b, &dc->t_ns); vec_free(b, &dc->extra); vec_free(b, &dc->stack);
}

/* The first entry dict that is the same container as an earlier entry (a pickle memo reference):
 * 1 with (device, entry, first device, first entry) in out, 0 when every entry dict is its own,
 * -1 over budget. PyTorch writes each entry once; a 20 MB file referencing one dict 10^7 times
 * would otherwise be read as 10^7 entries (minutes on the reference route). */
static int first_shared_entry(const Tree *t, const Val *traces, Budget *b, int64_t out[4]) {
    size_t n = t->conts.len ? t->conts.len : 1, bytes = n * sizeof(int64_t);
    int64_t *first = budget_realloc(b, NULL, 0, bytes);      /* per container: its first entry's ordinal */
    if (!first) return -1;
    memset(first, 0xFF, bytes);                              /* -1: not an entry yet */
    int64_t ordinal = 0, device = 0, found = -1, found_first = -1;
    PvmIter dev = pvm_iter(t, traces->v);
    while (found < 0 && pvm_next(t, &dev)) {
        int64_t index = 0;
        PvmIter it = pvm_iter(t, dev.item->v);
        while (pvm_next(t, &it)) {
            const Val *e = it.item;
            if (e->type == V_DICT) {
                if (first[e->v] >= 0) {
                    out[0] = device;
                    out[1] = index;
                    found = ordinal;
                    found_first = first[e->v];
                    break;
                }
                first[e->v] = ordinal;
            }
            index++;
            ordinal++;
        }
        device++;
    }
    budget_free(b, first, bytes);
    if (found < 0) return 0;
    /* the first one's device and entry, from the ordinal */
    int64_t before = 0;
    device = 0;
    dev = pvm_iter(t, traces->v);
    while (pvm_next(t, &dev)) {
        int64_t len = pvm_len(t, dev.item);
        if (found_first < before + len) break;
        before += len;
        device++;
    }
    out[2] = device;
    out[3] = found_first - before;
    return 1;
}

/* snapshot_scan(data, memory_bytes, max_frames, max_string_chars, max_segments, max_devices,
 *               max_events, max_time_us, step_ns, keep_frames[, max_frame_text])
 *   -> dict (see read_scanned) | int (over memory_bytes or out of memory: the bytes it needed at least)
 *      | ("shared entry", device, entry, first device, first entry) (refused, as the reader refuses it)
 *      | None (the reference route must read the file). */
PyObject *rd_snapshot_scan(PyObject *self, PyObject *args) {
    Py_buffer buf;
    long long memory_bytes, max_frames, max_chars, max_segments, max_devices, max_events, max_time_us, step_ns;
    long long max_frame_text = LLONG_MAX;   /* optional: no cap */
    int keep_frames;
    if (!PyArg_ParseTuple(args, "y*LLLLLLLLp|L", &buf, &memory_bytes, &max_frames, &max_chars, &max_segments,
                          &max_devices, &max_events, &max_time_us, &step_ns, &keep_frames, &max_frame_text))
        return NULL;
    Budget budget = {0, memory_bytes > 0 ? (size_t)memory_bytes : 0};
    Tree tree;
    memset(&tree, 0, sizeof(tree));
    PyObject *result = NULL;
    int loaded = 0, frames_ready = 0;
    Frames fr;
    SegCols sc;
    memset(&sc, 0, sizeof(sc));
    VEC(DevCols) devs = {NULL, 0, 0};
    Ctx cx;
    size_t n_bytes = (size_t)buf.len;

    Py_BEGIN_ALLOW_THREADS
    loaded = pvm_load(&tree, buf.buf, n_bytes, &budget) == 0;
    Py_END_ALLOW_THREADS
    if (!loaded) goto hand_back;
    cx.t = &tree;
    cx.budget = &budget;
    cx.max_frames = max_frames;
    cx.max_string_chars = max_chars;
    cx.max_frame_text = max_frame_text;
    cx.frame_text = 0;
    cx.keep_frames = keep_frames;
    cx.work = 0;
    cx.work_limit = 2 * (int64_t)tree.items.len + 1024;
    for (int k = 0; k < K_COUNT; k++) KEY_LEN[k] = (uint8_t)strlen(KEY_NAMES[k]);
    for (int k = 0; k < 256; k++) cx.key_cache_off[k] = -1;
    if (frames_init(&fr, &cx) < 0) goto hand_back;
    frames_ready = 1;

    const Val *root = &tree.root;
    Val segments = {V_NONE, {0}, 0, 0}, traces = {V_NONE, {0}, 0, 0}, settings = {V_NONE, {0}, 0, 0};
    int top_is_list = 0, has_settings = 0, has_external = 0;
    int64_t n_traces = 0;
    if (root->type == V_LIST) {
        top_is_list = 1;
        segments = *root;
        traces.type = V_NONE;
    } else if (root->type == V_DICT) {
        Fields f;
        if (scan_dict(&cx, root, TOP_KEYS, &f) < 0) goto hand_back;
        if (!has(&f, K_SEGMENTS) || f.v[K_SEGMENTS].type != V_LIST) goto hand_back;
        if (!has(&f, K_DEVICE_TRACES) || f.v[K_DEVICE_TRACES].type != V_LIST) goto hand_back;
        segments = f.v[K_SEGMENTS];
        traces = f.v[K_DEVICE_TRACES];
        has_settings = has(&f, K_ALLOCATOR_SETTINGS);
        if (has_settings) settings = f.v[K_ALLOCATOR_SETTINGS];
        has_external = has(&f, K_EXTERNAL_ANNOTATIONS);
    } else {
        goto hand_back;
    }

    /* Counts first, as the reader checks them (budget of list elements, caps). */
    int64_t n_segments = pvm_len(&tree, &segments), n_entries = 0;
    if (traces.type == V_LIST) {
        n_traces = pvm_len(&tree, &traces);
        PvmIter it = pvm_iter(&tree, traces.v);
        while (pvm_next(&tree, &it)) {
            if (it.item->type != V_LIST) goto hand_back;
            n_entries += pvm_len(&tree, it.item);
        }
    }
    if (n_segments > max_segments || n_traces > max_devices || n_entries > max_events) goto hand_back;
    int64_t spend = n_traces + n_entries + n_segments;
    if (traces.type == V_LIST) {
        /* as the reader checks them: more list elements than bytes first, then shared entries */
        if (n_traces + n_entries > (int64_t)n_bytes) goto hand_back;
        int64_t shared[4];
        int rc = first_shared_entry(&tree, &traces, &budget, shared);
        if (rc < 0) goto hand_back;
        if (rc > 0) {
            result = Py_BuildValue("(sLLLL)", "shared entry", (long long)shared[0], (long long)shared[1],
                                   (long long)shared[2], (long long)shared[3]);
            goto done;
        }
    }

    /* Segments and their blocks: frames interned first, as the reader does. */
    PvmIter it = pvm_iter(&tree, segments.v);
    int64_t index = 0;
    while (pvm_next(&tree, &it))
        if (read_segment(&cx, &fr, &sc, it.item, index++, &spend) < 0) goto hand_back;
    if (spend > (int64_t)n_bytes) goto hand_back;

    EntryState es = {0, 0, 0, 0, 0, max_time_us, step_ns};
    if (traces.type == V_LIST) {
        if (vec_reserve(&budget, &devs, (size_t)n_traces) < 0) goto hand_back;
        it = pvm_iter(&tree, traces.v);
        while (pvm_next(&tree, &it)) {
            memset(&devs.data[devs.len], 0, sizeof(DevCols));
            devs.len++;
            if (read_device(&cx, &fr, it.item, &devs.data[devs.len - 1], &es) < 0) goto hand_back;
        }
        if (es.has_time && (es.time_missing || es.time_bad)) goto hand_back;
        for (size_t d = 0; d < devs.len; d++)
            if (finish_times(&devs.data[d], &es) < 0) goto hand_back;
    }

    PyObject *settings_obj = Py_None;
    Py_INCREF(Py_None);
    if (has_settings) {
        Py_DECREF(settings_obj);
        settings_obj = make_settings(&cx, &settings);
        if (!settings_obj) {
            if (PyErr_Occurred()) goto error;
            goto hand_back;
        }
    }
    PyObject *dev_list = PyList_New((Py_ssize_t)devs.len);
    if (!dev_list) { Py_DECREF(settings_obj); goto error; }
    for (size_t d = 0; d < devs.len; d++) {
        DevCols *dc = &devs.data[d];
        PyObject *cols = Py_BuildValue("(NNNNNNN)", BA(dc->action, 1), BA(dc->size, 8), BA(dc->stream, 8),
                                       BA(dc->addr, 8), BA(dc->t_ns, 8), BA(dc->extra, 8), BA(dc->stack, 4));
        if (!cols) { Py_DECREF(dev_list); Py_DECREF(settings_obj); goto error; }
        PyList_SET_ITEM(dev_list, (Py_ssize_t)d, cols);
    }
    PyObject *segs = seg_tuple(&sc);
    PyObject *tables = segs ? frames_tables(&fr) : NULL;
    if (!segs || !tables) {
        Py_XDECREF(segs);
        Py_DECREF(dev_list);
        Py_DECREF(settings_obj);
        goto error;
    }
    result = Py_BuildValue("{s:O,s:O,s:N,s:O,s:O,s:(OO),s:(OOO),s:O,s:N,s:N,s:N,s:L}",
                           "top_is_list", top_is_list ? Py_True : Py_False,
                           "has_settings", has_settings ? Py_True : Py_False,
                           "settings", settings_obj,
                           "has_external_annotations", has_external ? Py_True : Py_False,
                           "has_time", es.has_time ? Py_True : Py_False,
                           "segment_hints", sc.hint_expandable ? Py_True : Py_False,
                           sc.hint_pool_id ? Py_True : Py_False,
                           "entry_hints", es.has_time ? Py_True : Py_False,
                           es.hint_user_metadata ? Py_True : Py_False,
                           es.hint_compile_context ? Py_True : Py_False,
                           "has_traces", traces.type == V_LIST ? Py_True : Py_False,
                           "segments", segs, "devices", dev_list, "frames", tables,
                           "arena_bytes", (long long)budget.used);
    goto done;

hand_back:
    /* Out of budget: the bytes it wanted, so the caller can refuse at once (the reference route needs
     * more than this); any other reason: None, and the reference route names the problem. */
    if (budget.refused) {
        result = PyLong_FromSize_t(budget.refused);
    } else {
        result = Py_None;
        Py_INCREF(Py_None);
    }
    goto done;
error:
    result = NULL;
done:
    for (size_t d = 0; d < devs.len; d++) dev_free(&budget, &devs.data[d]);
    vec_free(&budget, &devs);
    seg_free(&budget, &sc);
    if (frames_ready) frames_free(&fr);
    pvm_free(&tree);
    PyBuffer_Release(&buf);
    return result;
}
