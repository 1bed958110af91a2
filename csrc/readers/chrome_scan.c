/* Read a Kineto / Chrome trace's events into columns: chrome_scan(data, limits...).
 *
 * The compiled twin of kineto_fast.decode_events + kineto._selected_events on the msgspec path: one
 * pass of a strict JSON parser (RFC 8259, UTF-8, nesting at most `max_depth`) that keeps, per event
 * of traceEvents, only what the reader uses: [memory] events as typed columns, the CPU ops that can
 * frame them (their thread, times and name), and where the few other events it needs lie in the
 * text (OOM and step events, which the reader decodes itself). It returns None whenever the Python
 * path would see anything this one does not model (a document msgspec would not decode, a [memory]
 * event that needs the checked path, NaN, escapes that make lone surrogates, numbers past 40
 * characters, duplicate traceEvents...): that path then reads the file, so both give the same Trace.
 */
#include "rd_common.h"
#include <math.h>

#define MAX_SIZE_BYTES ((int64_t)1 << 50)

typedef struct {
    const uint8_t *s;
    size_t n;
    size_t pos;
    int depth, max_depth;
    Budget *budget;
    VEC(uint8_t) text;     /* a decoded string */
    VEC(uint8_t) closers;  /* the closing bracket of each container skip_value is inside */
} Json;

enum { T_NONE = 0, T_STR, T_NUM, T_TRUE, T_FALSE, T_NULL, T_OBJ, T_ARR };

typedef struct {
    int type;
    size_t start, end;     /* the token's text: s[start:end] (strings with their quotes) */
    int escaped;           /* a string with backslash escapes */
    int is_int;            /* a number without fraction or exponent */
} Tok;

static inline void skip_ws(Json *j) {
    while (j->pos < j->n) {
        uint8_t c = j->s[j->pos];
        if (c != ' ' && c != '\n' && c != '\r' && c != '\t') break;
        j->pos++;
    }
}

static inline int hexval(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A string token at pos (on its opening quote); strict UTF-8, no lone-surrogate escapes. */
static int scan_string(Json *j, Tok *t) {
    const uint8_t *s = j->s;
    size_t i = j->pos + 1, n = j->n;
    t->type = T_STR;
    t->start = j->pos;
    t->escaped = 0;
    for (;;) {
        /* plain ASCII runs, eight bytes at a time: stop at a byte that is '"', '\\', < 0x20 or >= 0x80 */
        const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            uint64_t q = w ^ (ones * '"'), b = w ^ (ones * '\\');
            uint64_t special = ((q - ones) & ~q) | ((b - ones) & ~b) | (w - ones * 0x20) | w;
            if (special & highs) break;
            i += 8;
        }
        while (i < n) {
            uint8_t c = s[i];
            if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) break;
            i++;
        }
        if (i >= n) return -1;
        uint8_t c = s[i];
        if (c == '"') {
            t->end = i + 1;
            j->pos = i + 1;
            return 0;
        }
        if (c < 0x20) return -1;
        if (c == '\\') {
            t->escaped = 1;
            if (i + 1 >= n) return -1;
            uint8_t e = s[i + 1];
            if (e == 'u') {
                if (i + 6 > n) return -1;
                int cp = 0;
                for (int k = 2; k < 6; k++) {
                    int h = hexval(s[i + k]);
                    if (h < 0) return -1;
                    cp = cp * 16 + h;
                }
                i += 6;
                if (cp >= 0xDC00 && cp <= 0xDFFF) return -1;          /* a lone low surrogate */
                if (cp >= 0xD800 && cp <= 0xDBFF) {                   /* must pair with a low one */
                    if (i + 6 > n || s[i] != '\\' || s[i + 1] != 'u') return -1;
                    int lo = 0;
                    for (int k = 2; k < 6; k++) {
                        int h = hexval(s[i + k]);
                        if (h < 0) return -1;
                        lo = lo * 16 + h;
                    }
                    if (lo < 0xDC00 || lo > 0xDFFF) return -1;
                    i += 6;
                }
                continue;
            }
            if (e != '"' && e != '\\' && e != '/' && e != 'b' && e != 'f' && e != 'n' && e != 'r' && e != 't')
                return -1;
            i += 2;
            continue;
        }
        /* non-ASCII: one strictly valid UTF-8 sequence (no encoded surrogates) */
        size_t need;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c == 0xE0) { need = 2; lo = 0xA0; }
        else if (c == 0xED) { need = 2; hi = 0x9F; }
        else if (c >= 0xE1 && c <= 0xEF) need = 2;
        else if (c == 0xF0) { need = 3; lo = 0x90; }
        else if (c >= 0xF1 && c <= 0xF3) need = 3;
        else if (c == 0xF4) { need = 3; hi = 0x8F; }
        else return -1;
        if (n - i <= need) return -1;
        if (s[i + 1] < lo || s[i + 1] > hi) return -1;
        for (size_t k = 2; k <= need; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF) return -1;
        i += need + 1;
    }
}

/* A number token at pos: -?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?, at most 40 characters. */
static int scan_number(Json *j, Tok *t) {
    const uint8_t *s = j->s;
    size_t i = j->pos, n = j->n;
    t->type = T_NUM;
    t->start = i;
    t->is_int = 1;
    if (i < n && s[i] == '-') i++;
    if (i >= n) return -1;
    if (s[i] == '0') i++;
    else if (s[i] >= '1' && s[i] <= '9') while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    else return -1;
    if (i < n && s[i] == '.') {
        t->is_int = 0;
        i++;
        size_t d = i;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
        if (i == d) return -1;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        t->is_int = 0;
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        size_t d = i;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
        if (i == d) return -1;
    }
    if (i - t->start > 40) return -1;
    t->end = i;
    j->pos = i;
    return 0;
}

static int skip_value(Json *j);

/* One value: scalars are read into t; objects and arrays are validated and skipped (t spans them). */
static int scan_value(Json *j, Tok *t) {
    skip_ws(j);
    if (j->pos >= j->n) return -1;
    uint8_t c = j->s[j->pos];
    t->escaped = 0;
    t->is_int = 0;
    if (c == '"') return scan_string(j, t);
    if (c == '-' || (c >= '0' && c <= '9')) return scan_number(j, t);
    t->start = j->pos;
    if (c == '{' || c == '[') {
        t->type = c == '{' ? T_OBJ : T_ARR;
        if (skip_value(j) < 0) return -1;
        t->end = j->pos;
        return 0;
    }
    static const char *words[] = {"true", "false", "null"};
    static const int types[] = {T_TRUE, T_FALSE, T_NULL};
    for (int k = 0; k < 3; k++) {
        size_t len = strlen(words[k]);
        if (j->n - j->pos >= len && memcmp(j->s + j->pos, words[k], len) == 0) {
            t->type = types[k];
            j->pos += len;
            t->end = j->pos;
            return 0;
        }
    }
    return -1;
}

/* Skip an object or array at pos (validated, nesting counted). A loop with its own stack of open
 * containers, not recursion: however deep the file nests (and whatever max_depth the caller
 * allows) the C stack stays the same. */
static int skip_value(Json *j) {
    size_t floor = j->closers.len;
    enum { OPEN, MEMBER, AFTER } state = OPEN;
    for (;;) {
        if (state == OPEN) {            /* on a '{' or '[' */
            uint8_t close = j->s[j->pos] == '{' ? '}' : ']';
            if (++j->depth > j->max_depth || vec_push(j->budget, &j->closers, close) < 0) return -1;
            j->pos++;
            skip_ws(j);
            if (j->pos < j->n && j->s[j->pos] == close) {
                j->pos++;
                j->closers.len--;
                j->depth--;
                state = AFTER;
            } else {
                state = MEMBER;
            }
        } else if (state == MEMBER) {   /* a key and its value, or an item */
            Tok t;
            if (j->closers.data[j->closers.len - 1] == '}') {
                skip_ws(j);
                if (j->pos >= j->n || j->s[j->pos] != '"' || scan_string(j, &t) < 0) return -1;
                skip_ws(j);
                if (j->pos >= j->n || j->s[j->pos] != ':') return -1;
                j->pos++;
            }
            skip_ws(j);
            if (j->pos >= j->n) return -1;
            if (j->s[j->pos] == '{' || j->s[j->pos] == '[') {
                state = OPEN;
            } else {
                if (scan_value(j, &t) < 0) return -1;      /* a scalar: no recursion */
                state = AFTER;
            }
        } else {                        /* after a value: a comma, or the innermost container closes */
            if (j->closers.len == floor) return 0;
            skip_ws(j);
            if (j->pos >= j->n) return -1;
            uint8_t c = j->s[j->pos++];
            if (c == ',') {
                state = MEMBER;
            } else if (c == j->closers.data[j->closers.len - 1]) {
                j->closers.len--;
                j->depth--;
            } else {
                return -1;
            }
        }
    }
}

/* The text of a string token, escapes decoded, into j->text (UTF-8); -1 over budget. */
static int decode_string(Json *j, const Tok *t, const uint8_t **out, size_t *len) {
    const uint8_t *s = j->s + t->start + 1;
    size_t n = t->end - t->start - 2;
    if (!t->escaped) {
        *out = s;
        *len = n;
        return 0;
    }
    j->text.len = 0;
    if (vec_reserve(j->budget, &j->text, n) < 0) return -1;
    uint8_t *d = j->text.data;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        if (s[i] != '\\') {
            d[k++] = s[i++];
            continue;
        }
        uint8_t e = s[i + 1];
        i += 2;
        if (e != 'u') {
            d[k++] = e == 'b' ? '\b' : e == 'f' ? '\f' : e == 'n' ? '\n' : e == 'r' ? '\r' : e == 't' ? '\t' : e;
            continue;
        }
        uint32_t cp = 0;
        for (int q = 0; q < 4; q++) cp = cp * 16 + (uint32_t)hexval(s[i + q]);
        i += 4;
        if (cp >= 0xD800 && cp <= 0xDBFF) {     /* validated: a low surrogate follows */
            uint32_t lo = 0;
            for (int q = 2; q < 6; q++) lo = lo * 16 + (uint32_t)hexval(s[i + q]);
            i += 6;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        /* UTF-8 is never longer than the escape it came from */
        if (cp < 0x80) d[k++] = (uint8_t)cp;
        else if (cp < 0x800) { d[k++] = 0xC0 | (cp >> 6); d[k++] = 0x80 | (cp & 0x3F); }
        else if (cp < 0x10000) { d[k++] = 0xE0 | (cp >> 12); d[k++] = 0x80 | ((cp >> 6) & 0x3F); d[k++] = 0x80 | (cp & 0x3F); }
        else { d[k++] = 0xF0 | (cp >> 18); d[k++] = 0x80 | ((cp >> 12) & 0x3F); d[k++] = 0x80 | ((cp >> 6) & 0x3F); d[k++] = 0x80 | (cp & 0x3F); }
    }
    *out = d;
    *len = k;
    return 0;
}

static inline int tok_is(Json *j, const Tok *t, const char *word, int *eq) {
    const uint8_t *text;
    size_t len;
    if (t->type != T_STR) { *eq = 0; return 0; }
    if (decode_string(j, t, &text, &len) < 0) return -1;
    size_t wl = strlen(word);
    *eq = len == wl && memcmp(text, word, wl) == 0;
    return 0;
}

/* An integer literal as a value in [-2^127, 2^127); *big when it has more digits than that holds. */
static __int128 int_literal(const uint8_t *s, size_t n, int *big) {
    int neg = n && s[0] == '-';
    size_t i = neg;
    *big = n - i > 38;
    if (*big) return 0;
    if (n - i <= 18) {
        int64_t v = 0;
        for (; i < n; i++) v = v * 10 + (s[i] - '0');
        return neg ? -v : v;
    }
    __int128 v = 0;
    for (; i < n; i++) v = v * 10 + (s[i] - '0');
    return neg ? -v : v;
}

/* kineto_fast.ns_list of one raw ts / dur text: 1 and *ns, 0 for None, -1 when outside int64. */
static int ns_of(const uint8_t *s, size_t n, int64_t *ns) {
    size_t dot = n;
    for (size_t i = 0; i < n; i++)
        if (s[i] == '.') { dot = i; break; }
    if (!n || n > 40 || s[0] == '"' || s[0] == 'n' || s[0] == '[' || s[0] == '{' || s[0] == 't' || s[0] == 'f')
        return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] == 'e' || s[i] == 'E') return 0;
    size_t w0 = 0;
    while (w0 < dot && s[w0] == '-') w0++;
    if (w0 == dot) return 0;
    for (size_t i = w0; i < dot; i++)
        if (s[i] < '0' || s[i] > '9') return 0;
    if (dot - w0 > 18) return -1;      /* past int64 once in ns: the reference's big ints decide */
    int big;
    __int128 whole = int_literal(s + w0, dot - w0, &big);
    if (w0) whole = -whole;       /* "-5": Python's int(b"-5"); JSON allows one minus only */
    __int128 v = whole * 1000;
    if (dot < n) {
        const uint8_t *f = s + dot + 1;
        size_t fl = n - dot - 1;
        if (!fl) return 0;
        for (size_t i = 0; i < fl; i++)
            if (f[i] < '0' || f[i] > '9') return 0;
        int extra = 0;
        for (size_t i = 0; i < 3; i++) extra = extra * 10 + (i < fl ? f[i] - '0' : 0);
        v = w0 ? v - extra : v + extra;
        for (size_t i = 3; i < fl; i++)
            if (f[i] != '0') return 0;     /* digits below 1 ns: the exact reference rounds them */
    }
    if (v < INT64_MIN || v > INT64_MAX) return -1;
    *ns = (int64_t)v;
    return 1;
}

/* ------------------------------------------------------------------------------------ tables */
typedef struct {
    Budget *budget;
    BytesMap map;
    VEC(uint8_t) bytes;       /* every distinct text, one after another */
    VEC(int64_t) offsets;     /* start of each, then the end */
} Texts;

static int texts_same(void *ctx, uint32_t id, const void *key, size_t len) {
    Texts *tx = ctx;
    int64_t a = tx->offsets.data[id], b = tx->offsets.data[id + 1];
    return (size_t)(b - a) == len && memcmp(tx->bytes.data + a, key, len) == 0;
}

/* The id of a text (interned by content); -1 over budget. */
static int64_t texts_id(Texts *tx, const uint8_t *s, size_t n) {
    if (!tx->offsets.len && vec_push(tx->budget, &tx->offsets, (int64_t)0) < 0) return -1;
    int is_new;
    int64_t id = bytesmap_get_or_insert(tx->budget, &tx->map, s, n, (uint32_t)(tx->offsets.len - 1), texts_same,
                                        tx, &is_new);
    if (id < 0 || !is_new) return id;
    if (vec_reserve(tx->budget, &tx->bytes, n) < 0) return -1;
    if (n) memcpy(tx->bytes.data + tx->bytes.len, s, n);   /* an empty first text: data is still NULL */
    tx->bytes.len += n;
    if (vec_push(tx->budget, &tx->offsets, (int64_t)tx->bytes.len) < 0) return -1;
    return id;
}

static void texts_free(Texts *tx) {
    bytesmap_free(tx->budget, &tx->map);
    vec_free(tx->budget, &tx->bytes);
    vec_free(tx->budget, &tx->offsets);
}

static PyObject *texts_list(Texts *tx) {
    size_t n = tx->offsets.len ? tx->offsets.len - 1 : 0;
    PyObject *out = PyList_New((Py_ssize_t)n);
    if (!out) return NULL;
    for (size_t i = 0; i < n; i++) {
        int64_t a = tx->offsets.data[i], b = tx->offsets.data[i + 1];
        PyObject *s = PyUnicode_DecodeUTF8((const char *)tx->bytes.data + a, b - a, "strict");
        if (!s) { Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, (Py_ssize_t)i, s);
    }
    return out;
}

/* ------------------------------------------------------------------------------------ events */
enum { F_NAME, F_PH, F_CAT, F_TS, F_DUR, F_PID, F_TID, F_ARGS, F_COUNT };
static const char *OP_CATS[] = {"cpu_op", "python_function", "user_annotation", "operator", "Operator", "CPU_OP",
                                "Python_Function"};
#define N_OP_CATS 7

typedef struct {
    Json j;
    Texts threads, names;
    VEC(uint8_t) key;                  /* a thread key being built */
    /* [memory] events */
    VEC(int64_t) m_pos, m_t, m_addr, m_bytes, m_total, m_reserved;
    VEC(int32_t) m_type, m_index, m_thread;
    /* other selected events: position, text span, thread */
    VEC(int64_t) o_pos, o_start, o_end;
    VEC(int32_t) o_thread;
    /* ops: thread, name, float ts/dur, exact ns ts/dur (ok flags) */
    VEC(int32_t) p_thread, p_name;
    VEC(double) p_ts, p_dur;
    VEC(int64_t) p_ts_ns, p_dur_ns;
    VEC(int8_t) p_ts_ok, p_dur_ok;
    int64_t n_events;
    int64_t last_thread;
    size_t last_pid[2], last_tid[2];
    int last_pid_p, last_tid_p;
} Scan;

/* str(value)[:40] of a pid / tid scalar, as the reader's thread key has it; -1 to hand back. */
static int key_part(Scan *sc, const Tok *t, int present) {
    Json *j = &sc->j;
    Budget *b = j->budget;
    const char *word = NULL;
    char buf[32];
    if (!present || t->type == T_NULL) word = "None";
    else if (t->type == T_TRUE) word = "True";
    else if (t->type == T_FALSE) word = "False";
    else if (t->type == T_NUM) {
        if (!t->is_int) return -1;             /* a float's repr: the reference decides */
        int big;
        __int128 v = int_literal(j->s + t->start, t->end - t->start, &big);
        if (big || v < -(__int128)999999999999999999LL || v > 999999999999999999LL) return -1;
        snprintf(buf, sizeof(buf), "%lld", (long long)v);
        word = buf;
    } else if (t->type == T_STR) {
        const uint8_t *text;
        size_t len;
        if (decode_string(j, t, &text, &len) < 0) return -1;
        size_t k = 0, chars = 0;
        while (k < len && chars < 40) {      /* 40 code points */
            k++;
            while (k < len && (text[k] & 0xC0) == 0x80) k++;
            chars++;
        }
        if (vec_reserve(b, &sc->key, k) < 0) return -1;
        if (k) memcpy(sc->key.data + sc->key.len, text, k);    /* "" as the first key part: data is NULL */
        sc->key.len += k;
        return 0;
    } else {
        return -1;
    }
    size_t wl = strlen(word);
    if (vec_reserve(b, &sc->key, wl) < 0) return -1;
    memcpy(sc->key.data + sc->key.len, word, wl);
    sc->key.len += wl;
    return 0;
}

/* The raw pid / tid text of the last event whose thread was looked up, and its id: events of one
 * thread follow each other, so most lookups compare two short texts. */
static inline int same_raw(const Json *j, const Tok *t, int present, size_t start, size_t end, int was_present) {
    if (present != was_present) return 0;
    if (!present) return 1;
    return t->end - t->start == end - start && memcmp(j->s + t->start, j->s + start, end - start) == 0;
}

static int64_t thread_id_uncached(Scan *sc, const Tok *f, const uint32_t present);

static int64_t thread_id(Scan *sc, const Tok *f, const uint32_t present) {
    int pid_p = (present >> F_PID) & 1, tid_p = (present >> F_TID) & 1;
    if (sc->last_thread >= 0 && same_raw(&sc->j, &f[F_PID], pid_p, sc->last_pid[0], sc->last_pid[1], sc->last_pid_p)
            && same_raw(&sc->j, &f[F_TID], tid_p, sc->last_tid[0], sc->last_tid[1], sc->last_tid_p))
        return sc->last_thread;
    int64_t id = thread_id_uncached(sc, f, present);
    sc->last_thread = id;
    sc->last_pid_p = pid_p;
    sc->last_tid_p = tid_p;
    if (pid_p) { sc->last_pid[0] = f[F_PID].start; sc->last_pid[1] = f[F_PID].end; }
    if (tid_p) { sc->last_tid[0] = f[F_TID].start; sc->last_tid[1] = f[F_TID].end; }
    return id;
}

static int64_t thread_id_uncached(Scan *sc, const Tok *f, const uint32_t present) {
    sc->key.len = 0;
    if (key_part(sc, &f[F_PID], present & (1u << F_PID)) < 0) return -1;
    if (vec_push(sc->j.budget, &sc->key, (uint8_t)0) < 0) return -1;
    if (key_part(sc, &f[F_TID], present & (1u << F_TID)) < 0) return -1;
    return texts_id(&sc->threads, sc->key.data, sc->key.len);
}

/* What a [memory] event's args give (kineto_fast.MemoryArgs, checked as kineto._typed_memory_rec). */
typedef struct {
    int64_t addr, nbytes, dtype, dindex, total, reserved;
} MemArgs;

/* Parse the args object at pos (validated, nesting counted) and check its typed fields; -1 to hand back. */
/* Which MemoryArgs key a (decoded) key is: their lengths differ, so one comparison decides. */
static inline int arg_key(const uint8_t *t, size_t n) {
    switch (n) {
    case 4: return memcmp(t, "Addr", 4) == 0 ? 0 : -1;
    case 5: return memcmp(t, "Bytes", 5) == 0 ? 1 : -1;
    case 11: return memcmp(t, "Device Type", 11) == 0 ? 2 : -1;
    case 9: return memcmp(t, "Device Id", 9) == 0 ? 3 : -1;
    case 15: return memcmp(t, "Total Allocated", 15) == 0 ? 4 : -1;
    case 14: return memcmp(t, "Total Reserved", 14) == 0 ? 5 : -1;
    default: return -1;
    }
}

static int memory_args_at(Json *j, MemArgs *out) {
    skip_ws(j);
    if (j->pos >= j->n || j->s[j->pos] != '{') return -1;
    if (++j->depth > j->max_depth) return -1;
    j->pos++;
    Tok vals[6];
    int have[6] = {0};
    skip_ws(j);
    if (j->pos < j->n && j->s[j->pos] == '}') {
        j->pos++;
    } else {
        for (;;) {
            Tok k, v;
            const uint8_t *text;
            size_t len;
            skip_ws(j);
            if (j->pos >= j->n || j->s[j->pos] != '"' || scan_string(j, &k) < 0) return -1;
            skip_ws(j);
            if (j->pos >= j->n || j->s[j->pos] != ':') return -1;
            j->pos++;
            if (scan_value(j, &v) < 0 || decode_string(j, &k, &text, &len) < 0) return -1;
            int q = arg_key(text, len);
            if (q >= 0) { vals[q] = v; have[q] = 1; }      /* the last of a repeated key wins, as in msgspec */
            skip_ws(j);
            if (j->pos >= j->n) return -1;
            uint8_t c = j->s[j->pos++];
            if (c == ',') continue;
            if (c == '}') break;
            return -1;
        }
    }
    j->depth--;
    __int128 v[6];
    for (int q = 0; q < 6; q++) {
        if (q < 4 && !have[q]) return -1;
        if (!have[q]) continue;
        if (q >= 4 && vals[q].type == T_NULL) { have[q] = 0; continue; }
        if (vals[q].type != T_NUM || !vals[q].is_int) return -1;      /* msgspec wants an int */
        int big;
        v[q] = int_literal(j->s + vals[q].start, vals[q].end - vals[q].start, &big);
        if (big) {
            if (q < 4) return -1;
            have[q] = 0;        /* a total far out of range: None, as the reader keeps it */
        }
    }
    __int128 a = v[0], nb = v[1], ty = v[2], ix = v[3];
    if (nb > MAX_SIZE_BYTES || nb < -MAX_SIZE_BYTES) return -1;
    if (a < INT64_MIN || a > (__int128)UINT64_MAX) return -1;
    if (ty < 0 || ty > 100) return -1;
    if (ty == 0) ix = -1;
    else if (ix < -1 || ix > 254 || ((ty == 1 || ty == 6) && ix < 0)) return -1;
    if (a > INT64_MAX) a -= (__int128)1 << 64;
    out->addr = (int64_t)a;
    out->nbytes = (int64_t)nb;
    out->dtype = (int64_t)ty;
    out->dindex = (int64_t)ix;
    out->total = have[4] && v[4] >= 0 && v[4] <= INT64_MAX ? (int64_t)v[4] : -1;
    out->reserved = have[5] && v[5] >= 0 && v[5] <= INT64_MAX ? (int64_t)v[5] : -1;
    return 0;
}

static double float_of(Json *j, const Tok *t) {
    if (t->type != T_NUM) return NAN;
    char buf[48];
    size_t n = t->end - t->start;
    memcpy(buf, j->s + t->start, n);
    buf[n] = 0;
    return strtod(buf, NULL);
}

/* May a value stand where msgspec decodes a scalar (an event's name, ph, cat, pid, tid; the
 * document's schemaVersion...)? It decodes every occurrence of a repeated key, and refuses the whole
 * document for an object, an array or a number past the double range in any of them. */
static int scalar_ok(Json *j, const Tok *v) {
    if (v->type == T_OBJ || v->type == T_ARR) return 0;
    return v->type != T_NUM || v->is_int || isfinite(float_of(j, v));
}

/* Which Event field a (decoded) key is, or -1. */
static inline int event_key(const uint8_t *t, size_t n) {
    switch (n) {
    case 2:
        if (memcmp(t, "ph", 2) == 0) return F_PH;
        if (memcmp(t, "ts", 2) == 0) return F_TS;
        return -1;
    case 3:
        if (memcmp(t, "cat", 3) == 0) return F_CAT;
        if (memcmp(t, "dur", 3) == 0) return F_DUR;
        if (memcmp(t, "pid", 3) == 0) return F_PID;
        if (memcmp(t, "tid", 3) == 0) return F_TID;
        return -1;
    case 4:
        if (memcmp(t, "name", 4) == 0) return F_NAME;
        if (memcmp(t, "args", 4) == 0) return F_ARGS;
        return -1;
    default:
        return -1;
    }
}

/* One element of traceEvents (at pos): 0, or -1 to hand back. */
static int scan_event(Scan *sc, int64_t index) {
    Json *j = &sc->j;
    Budget *b = j->budget;
    skip_ws(j);
    if (j->pos >= j->n || j->s[j->pos] != '{') return -1;     /* msgspec wants an object */
    size_t ev_start = j->pos;
    Tok f[F_COUNT];
    uint32_t present = 0;
    int name_is_memory = 0, args_ok = 0;
    MemArgs margs = {0, 0, 0, 0, -1, -1};
    j->pos++;
    if (++j->depth > j->max_depth) return -1;
    skip_ws(j);
    if (j->pos < j->n && j->s[j->pos] == '}') {
        j->pos++;
    } else {
        for (;;) {
            Tok k, v;
            skip_ws(j);
            if (j->pos >= j->n || j->s[j->pos] != '"' || scan_string(j, &k) < 0) return -1;
            skip_ws(j);
            if (j->pos >= j->n || j->s[j->pos] != ':') return -1;
            j->pos++;
            const uint8_t *text;
            size_t len;
            if (decode_string(j, &k, &text, &len) < 0) return -1;
            int field = event_key(text, len);
            if (field == F_ARGS && name_is_memory) {
                /* [memory] args (the name comes first in Kineto's files): typed while they are read */
                skip_ws(j);
                v.type = T_OBJ;
                v.start = j->pos;
                args_ok = memory_args_at(j, &margs) == 0;
                if (!args_ok) return -1;
                v.end = j->pos;
            } else {
                args_ok = field == F_ARGS ? 0 : args_ok;
                if (scan_value(j, &v) < 0) return -1;
            }
            if (field >= 0) {
                if (field != F_TS && field != F_DUR && field != F_ARGS && !scalar_ok(j, &v)) return -1;
                f[field] = v;
                present |= 1u << field;
                if (field == F_NAME) {
                    int eq;
                    if (tok_is(j, &v, "[memory]", &eq) < 0) return -1;
                    name_is_memory = eq;
                }
            }
            skip_ws(j);
            if (j->pos >= j->n) return -1;
            uint8_t c = j->s[j->pos++];
            if (c == ',') continue;
            if (c == '}') break;
            return -1;
        }
    }
    j->depth--;
    size_t ev_end = j->pos;
    if (!(present & (1u << F_NAME)) || f[F_NAME].type != T_STR) return 0;   /* no name: nothing kept */
    const uint8_t *name;
    size_t name_len;
    if (decode_string(j, &f[F_NAME], &name, &name_len) < 0) return -1;
    int is_memory = name_len == 8 && memcmp(name, "[memory]", 8) == 0;
    int is_oom = name_len == 13 && memcmp(name, "[OutOfMemory]", 13) == 0;
    int is_step = name_len >= 13 && memcmp(name, "ProfilerStep#", 13) == 0;
    if (is_memory) {
        int64_t t_ns = 0;
        if (!(present & (1u << F_TS)) || ns_of(j->s + f[F_TS].start, f[F_TS].end - f[F_TS].start, &t_ns) != 1)
            return -1;
        if (!(present & (1u << F_ARGS))) return -1;
        if (!args_ok) {     /* args came before the name: read them again, typed */
            size_t saved = j->pos;
            int saved_depth = j->depth;
            j->pos = f[F_ARGS].start;
            int rc = memory_args_at(j, &margs);
            j->pos = saved;
            j->depth = saved_depth;
            if (rc < 0) return -1;
        }
        int64_t addr = margs.addr, nbytes = margs.nbytes, dtype = margs.dtype, dindex = margs.dindex;
        int64_t total = margs.total, reserved = margs.reserved;
        int64_t thread = thread_id(sc, f, present);
        if (thread < 0) return -1;
        if (vec_push(b, &sc->m_pos, index) < 0 || vec_push(b, &sc->m_t, t_ns) < 0 || vec_push(b, &sc->m_addr, addr) < 0
                || vec_push(b, &sc->m_bytes, nbytes) < 0 || vec_push(b, &sc->m_total, total) < 0
                || vec_push(b, &sc->m_reserved, reserved) < 0 || vec_push(b, &sc->m_type, (int32_t)dtype) < 0
                || vec_push(b, &sc->m_index, (int32_t)dindex) < 0 || vec_push(b, &sc->m_thread, (int32_t)thread) < 0)
            return -1;
    }
    if (is_oom || is_step) {
        int64_t thread = thread_id(sc, f, present);
        if (thread < 0) return -1;
        if (vec_push(b, &sc->o_pos, index) < 0 || vec_push(b, &sc->o_start, (int64_t)ev_start) < 0
                || vec_push(b, &sc->o_end, (int64_t)ev_end) < 0 || vec_push(b, &sc->o_thread, (int32_t)thread) < 0)
            return -1;
    }
    /* a CPU op that may frame [memory] events (any event): ph "X", a known category, a string name */
    int eq = 0;
    if (!(present & (1u << F_PH)) || !(present & (1u << F_CAT)) || f[F_CAT].type != T_STR) return 0;
    if (tok_is(j, &f[F_PH], "X", &eq) < 0) return -1;
    if (!eq) return 0;
    int is_op = 0;
    for (int q = 0; q < N_OP_CATS && !is_op; q++) {
        if (tok_is(j, &f[F_CAT], OP_CATS[q], &eq) < 0) return -1;
        is_op = eq;
    }
    if (!is_op) return 0;
    if (decode_string(j, &f[F_NAME], &name, &name_len) < 0) return -1;
    int64_t name_id = texts_id(&sc->names, name, name_len);
    int64_t thread = thread_id(sc, f, present);
    if (name_id < 0 || thread < 0) return -1;
    static const Tok NUL = {T_NULL, 0, 0, 0, 0};
    const Tok *ts = (present & (1u << F_TS)) ? &f[F_TS] : &NUL;
    const Tok *dur = (present & (1u << F_DUR)) ? &f[F_DUR] : &NUL;
    int64_t ts_ns = 0, dur_ns = 0;
    int ts_ok = ts->type == T_NULL ? 0 : ns_of(j->s + ts->start, ts->end - ts->start, &ts_ns);
    int dur_ok = dur->type == T_NULL ? 0 : ns_of(j->s + dur->start, dur->end - dur->start, &dur_ns);
    if (ts_ok < 0 || dur_ok < 0) return -1;
    if (vec_push(b, &sc->p_thread, (int32_t)thread) < 0 || vec_push(b, &sc->p_name, (int32_t)name_id) < 0
            || vec_push(b, &sc->p_ts, float_of(j, ts)) < 0 || vec_push(b, &sc->p_dur, float_of(j, dur)) < 0
            || vec_push(b, &sc->p_ts_ns, ts_ns) < 0 || vec_push(b, &sc->p_dur_ns, dur_ns) < 0
            || vec_push(b, &sc->p_ts_ok, (int8_t)ts_ok) < 0 || vec_push(b, &sc->p_dur_ok, (int8_t)dur_ok) < 0)
        return -1;
    return 0;
}

/* The traceEvents array at pos. */
static int scan_events(Scan *sc, int64_t max_events) {
    Json *j = &sc->j;
    if (j->s[j->pos] != '[') return -1;
    j->pos++;
    if (++j->depth > j->max_depth) return -1;
    skip_ws(j);
    if (j->pos < j->n && j->s[j->pos] == ']') {
        j->pos++;
        j->depth--;
        return 0;
    }
    for (;;) {
        if (sc->n_events >= max_events) return -1;
        if (scan_event(sc, sc->n_events) < 0) return -1;
        sc->n_events++;
        skip_ws(j);
        if (j->pos >= j->n) return -1;
        uint8_t c = j->s[j->pos++];
        if (c == ',') continue;
        if (c == ']') break;
        return -1;
    }
    j->depth--;
    return 0;
}

/* A Document scalar (schemaVersion...) as msgspec decodes it; NULL with no error: hand back. */
static PyObject *scalar_object(Json *j, const Tok *t) {
    if (t->type == T_NULL) Py_RETURN_NONE;
    if (t->type == T_TRUE) Py_RETURN_TRUE;
    if (t->type == T_FALSE) Py_RETURN_FALSE;
    if (t->type == T_STR) {
        const uint8_t *text;
        size_t len;
        if (decode_string(j, t, &text, &len) < 0) return NULL;
        return PyUnicode_DecodeUTF8((const char *)text, (Py_ssize_t)len, "strict");
    }
    if (t->type == T_NUM && t->is_int) {
        int big;
        __int128 v = int_literal(j->s + t->start, t->end - t->start, &big);
        if (big || v < INT64_MIN || v > INT64_MAX) return NULL;
        return PyLong_FromLongLong((long long)v);
    }
    if (t->type == T_NUM) return PyFloat_FromDouble(float_of(j, t));
    return NULL;
}

#define BA(vec, item) rd_bytearray_copy((vec).data, (vec).len, (item))

static void scan_free(Scan *sc) {
    Budget *b = sc->j.budget;
    vec_free(b, &sc->j.text);
    vec_free(b, &sc->j.closers);
    texts_free(&sc->threads);
    texts_free(&sc->names);
    vec_free(b, &sc->key);
    vec_free(b, &sc->m_pos); vec_free(b, &sc->m_t); vec_free(b, &sc->m_addr); vec_free(b, &sc->m_bytes);
    vec_free(b, &sc->m_total); vec_free(b, &sc->m_reserved); vec_free(b, &sc->m_type); vec_free(b, &sc->m_index);
    vec_free(b, &sc->m_thread);
    vec_free(b, &sc->o_pos); vec_free(b, &sc->o_start); vec_free(b, &sc->o_end); vec_free(b, &sc->o_thread);
    vec_free(b, &sc->p_thread); vec_free(b, &sc->p_name); vec_free(b, &sc->p_ts); vec_free(b, &sc->p_dur);
    vec_free(b, &sc->p_ts_ns); vec_free(b, &sc->p_dur_ns); vec_free(b, &sc->p_ts_ok); vec_free(b, &sc->p_dur_ok);
}

/* chrome_scan(data, memory_bytes, max_depth, max_events)
 *   -> dict | int (over memory_bytes or out of memory: the bytes it needed at least)
 *      | None (the reference route must read the file). */
PyObject *rd_chrome_scan(PyObject *self, PyObject *args) {
    Py_buffer buf;
    long long memory_bytes, max_depth, max_events;
    if (!PyArg_ParseTuple(args, "y*LLL", &buf, &memory_bytes, &max_depth, &max_events)) return NULL;
    Budget budget = {0, memory_bytes > 0 ? (size_t)memory_bytes : 0};
    Scan sc;
    memset(&sc, 0, sizeof(sc));
    sc.j.s = buf.buf;
    sc.j.n = (size_t)buf.len;
    sc.j.max_depth = (int)(max_depth < 1 ? 1 : (max_depth > 100000 ? 100000 : max_depth));
    sc.j.budget = &budget;
    sc.threads.budget = sc.names.budget = &budget;
    sc.last_thread = -1;
    PyObject *result = NULL;
    Json *j = &sc.j;
    Tok doc_vals[4];
    int doc_have[4] = {0};
    Tok props;             /* deviceProperties: its text goes back whole, for the reader to decode */
    int have_props = 0;
    static const char *DOC_KEYS[] = {"schemaVersion", "profile_memory", "displayTimeUnit", "baseTimeNanoseconds"};
    int is_object = 0, have_events = 0, ok = 0;

    Py_BEGIN_ALLOW_THREADS
    skip_ws(j);
    if (j->pos < j->n && j->s[j->pos] == '[') {
        ok = scan_events(&sc, max_events) == 0;
    } else if (j->pos < j->n && j->s[j->pos] == '{') {
        is_object = 1;
        ok = 1;
        j->pos++;
        j->depth = 1;
        skip_ws(j);
        if (j->pos < j->n && j->s[j->pos] == '}') {
            j->pos++;
        } else {
            for (;;) {
                Tok k, v;
                skip_ws(j);
                if (j->pos >= j->n || j->s[j->pos] != '"' || scan_string(j, &k) < 0) { ok = 0; break; }
                skip_ws(j);
                if (j->pos >= j->n || j->s[j->pos] != ':') { ok = 0; break; }
                j->pos++;
                skip_ws(j);
                int eq;
                if (tok_is(j, &k, "traceEvents", &eq) < 0) { ok = 0; break; }
                if (eq) {
                    if (have_events || j->pos >= j->n || j->s[j->pos] != '[' || scan_events(&sc, max_events) < 0) {
                        ok = 0;     /* null, not an array, or twice: the reference decides */
                        break;
                    }
                    have_events = 1;
                } else {
                    if (scan_value(j, &v) < 0) { ok = 0; break; }
                    for (int q = 0; q < 4; q++) {
                        if (tok_is(j, &k, DOC_KEYS[q], &eq) < 0) { ok = 0; break; }
                        if (eq && !scalar_ok(j, &v)) ok = 0;
                        if (eq) { doc_vals[q] = v; doc_have[q] = 1; }
                    }
                    if (!ok) break;
                    if (tok_is(j, &k, "deviceProperties", &eq) < 0) { ok = 0; break; }
                    if (eq) { props = v; have_props = 1; }     /* the last one, as the standard parser */
                }
                skip_ws(j);
                if (j->pos >= j->n) { ok = 0; break; }
                uint8_t c = j->s[j->pos++];
                if (c == ',') continue;
                if (c == '}') break;
                ok = 0;
                break;
            }
        }
        if (ok && !have_events) ok = 0;
    }
    if (ok) {
        skip_ws(j);
        if (j->pos != j->n) ok = 0;     /* trailing text */
    }
    Py_END_ALLOW_THREADS
    if (!ok) goto hand_back;

    PyObject *top = PyDict_New();
    if (!top) goto error;
    for (int q = 0; q < 4; q++) {
        if (!doc_have[q]) continue;
        PyObject *v = scalar_object(j, &doc_vals[q]);
        if (!v) {
            Py_DECREF(top);
            if (PyErr_Occurred()) goto error;
            goto hand_back;
        }
        int rc = v == Py_None ? 0 : PyDict_SetItemString(top, DOC_KEYS[q], v);
        Py_DECREF(v);
        if (rc < 0) { Py_DECREF(top); goto error; }
    }
    PyObject *props_text = have_props
        ? PyBytes_FromStringAndSize((const char *)j->s + props.start, (Py_ssize_t)(props.end - props.start))
        : (Py_INCREF(Py_None), Py_None);
    if (!props_text) { Py_DECREF(top); goto error; }
    result = Py_BuildValue(
        "{s:O,s:N,s:L,s:(NNNNNNNNN),s:(NNNN),s:(NNNNNNNN),s:N,s:N,s:N,s:L}",
        "is_object", is_object ? Py_True : Py_False, "top", top, "n_events", (long long)sc.n_events,
        "memory", BA(sc.m_pos, 8), BA(sc.m_t, 8), BA(sc.m_addr, 8), BA(sc.m_bytes, 8), BA(sc.m_total, 8),
        BA(sc.m_reserved, 8), BA(sc.m_type, 4), BA(sc.m_index, 4), BA(sc.m_thread, 4),
        "other", BA(sc.o_pos, 8), BA(sc.o_start, 8), BA(sc.o_end, 8), BA(sc.o_thread, 4),
        "ops", BA(sc.p_thread, 4), BA(sc.p_name, 4), BA(sc.p_ts, 8), BA(sc.p_dur, 8), BA(sc.p_ts_ns, 8),
        BA(sc.p_dur_ns, 8), BA(sc.p_ts_ok, 1), BA(sc.p_dur_ok, 1),
        "threads", texts_list(&sc.threads), "names", texts_list(&sc.names), "device_properties", props_text,
        "arena_bytes", (long long)budget.used);
    goto done;
hand_back:
    /* Out of budget: the bytes it wanted, so the caller can refuse at once under a process limit
     * (the reference route needs more than this); any other reason: None, the reference decides. */
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
    scan_free(&sc);
    PyBuffer_Release(&buf);
    return result;
}
