/* Read the data lines of a clean RMM log into columns: rmm_scan(body, ...), the compiled twin of
 * rmm_fast.rmm_columns.
 *
 * One pass over the bytes: lines split at '\n' (empty ones skipped), fields at ','; Action, Pointer,
 * Size, Time, Stream and Thread converted as rmm_columns converts them. It takes only plain ASCII
 * logs without tabs, carriage returns or spaces at the ends of fields, and hands back (None)
 * everything rmm_columns would refuse or treat in a way this one does not model (a wrong field
 * count, a sign in Size, an unknown action, a pointer or time it cannot read, time going back, a
 * null pointer in a request, a non-numeric thread...): the Python route then reads the log.
 */
#include "rd_common.h"

#define MAX_SIZE_BYTES ((int64_t)1 << 50)
#define MAX_FIELDS 64

static inline int lower(int c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

static inline int ieq(const uint8_t *s, size_t n, const char *word) {
    size_t wl = strlen(word);
    if (n != wl) return 0;
    for (size_t i = 0; i < n; i++)
        if (lower(s[i]) != word[i]) return 0;
    return 1;
}

static inline int hexdigit(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    c = lower(c);
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* A pointer / stream field: 1-16 hex digits, "0x" optional, or a null spelling (0). 0, or -1. */
static int parse_null(const uint8_t *s, size_t n, int64_t *value, int *had_0x) {
    static const char *NULLS[] = {"", "(nil)", "nil", "nullptr", "null", "(null)"};
    for (int k = 0; k < 6; k++) {
        if (ieq(s, n, NULLS[k])) {
            *value = 0;
            *had_0x = 0;
            return 0;
        }
    }
    return -1;
}

static int parse_hex(const uint8_t *s, size_t n, int64_t *value, int *had_0x) {
    /* (no null spelling is also a hex number, so the order of the two tests does not matter) */
    size_t i = 0;
    *had_0x = 0;
    if (n >= 3 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        i = 2;
        *had_0x = 1;
    }
    if (n - i < 1 || n - i > 16) return parse_null(s, n, value, had_0x);
    uint64_t v = 0;
    for (; i < n; i++) {
        int d = hexdigit(s[i]);
        if (d < 0) return parse_null(s, n, value, had_0x);
        v = (v << 4) | (uint64_t)d;
    }
    *value = (int64_t)v;    /* the same bits in the int64 column */
    return 0;
}

/* HH:MM:SS with an optional [.:] and 0-9 fraction digits -> ns since midnight; -1 when not a time. */
static int parse_time(const uint8_t *s, size_t n, int64_t *ns, int *sep) {
    size_t i = 0;
    int h = 0, digits = 0;
    while (i < n && s[i] >= '0' && s[i] <= '9' && digits < 2) { h = h * 10 + (s[i] - '0'); i++; digits++; }
    if (!digits || i >= n || s[i] != ':') return -1;
    if (n - i < 6 || s[i + 3] != ':') return -1;
    int two[2];
    for (int k = 0; k < 2; k++) {
        const uint8_t *p = s + i + 1 + 3 * k;
        if (p[0] < '0' || p[0] > '9' || p[1] < '0' || p[1] > '9') return -1;
        two[k] = (p[0] - '0') * 10 + (p[1] - '0');
    }
    i += 6;
    int m = two[0], sec = two[1];
    if (h > 23 || m > 59 || sec > 60) return -1;
    int64_t frac = 0;
    *sep = 0;
    if (i < n) {
        if (s[i] != '.' && s[i] != ':') return -1;
        *sep = s[i];
        i++;
        size_t nd = n - i;
        if (nd > 9) return -1;
        for (; i < n; i++) {
            if (s[i] < '0' || s[i] > '9') return -1;
            frac = frac * 10 + (s[i] - '0');
        }
        for (size_t k = nd; k < 9; k++) frac *= 10;
    }
    *ns = (((int64_t)h * 60 + m) * 60 + sec) * 1000000000LL + frac;
    return 0;
}

/* Per byte: 0 plain, 1 the field separator ',', 2 a byte this parser does not take. */
static uint8_t BYTE_KIND[256];

static void init_byte_kinds(void) {
    for (int c = 0; c < 256; c++)
        BYTE_KIND[c] = (c >= 0x80 || c < 0x20 || c == '+') ? 2 : (c == ',' ? 1 : 0);
}

/* rmm_scan(body, n_columns, action, pointer, size, time, stream, thread) -> dict | None
 * (column indices; -1 for a column the header lacks) */
PyObject *rd_rmm_scan(PyObject *self, PyObject *args) {
    Py_buffer buf;
    int n_columns, c_action, c_pointer, c_size, c_time, c_stream, c_thread;
    if (!PyArg_ParseTuple(args, "y*iiiiiii", &buf, &n_columns, &c_action, &c_pointer, &c_size, &c_time, &c_stream,
                          &c_thread))
        return NULL;
    PyObject *result = NULL;
    Budget budget = {0, (size_t)1 << 46};
    VEC(int8_t) action = {NULL, 0, 0};
    VEC(int64_t) pointer = {NULL, 0, 0}, size = {NULL, 0, 0}, stream = {NULL, 0, 0}, t_ns = {NULL, 0, 0};
    VEC(int64_t) threads = {NULL, 0, 0};
    int seps = 0, ptr_0x = 0, stream_0x = 0, ok = 1;   /* bit sets: which styles were seen */
    Py_ssize_t n_threads = 0;
    const uint8_t *s = buf.buf;
    size_t n = (size_t)buf.len;
    if (n_columns < 1 || n_columns > MAX_FIELDS) goto hand_back;
    /* The indices pick fields out of a fixed array: one past the field count would read the stack. */
    if (c_action < 0 || c_action >= n_columns || c_pointer < 0 || c_pointer >= n_columns || c_size < 0
            || c_size >= n_columns || c_time < -1 || c_time >= n_columns || c_stream < -1 || c_stream >= n_columns
            || c_thread < -1 || c_thread >= n_columns) {
        PyErr_SetString(PyExc_ValueError, "rmm_scan: a column index outside the header's fields");
        PyBuffer_Release(&buf);
        return NULL;
    }
    if (!BYTE_KIND[0]) init_byte_kinds();

    Py_BEGIN_ALLOW_THREADS
    size_t rows_hint = 1;
    for (const uint8_t *p = s, *end = s + n; (p = memchr(p, '\n', (size_t)(end - p))) != NULL; p++) rows_hint++;
    /* A row holds its n_columns - 1 commas, an action of 4+ letters, a size digit and its newline:
     * blank lines must not reserve 41 bytes of columns each. */
    size_t rows_most = n / ((size_t)n_columns + 5) + 1;
    if (rows_hint > rows_most) rows_hint = rows_most;
    if (vec_reserve(&budget, &action, rows_hint) < 0 || vec_reserve(&budget, &pointer, rows_hint) < 0
            || vec_reserve(&budget, &size, rows_hint) < 0
            || (c_stream >= 0 && vec_reserve(&budget, &stream, rows_hint) < 0)
            || (c_time >= 0 && vec_reserve(&budget, &t_ns, rows_hint) < 0)
            || (c_thread >= 0 && vec_reserve(&budget, &threads, rows_hint) < 0))
        ok = 0;
    size_t pos = 0;
    int64_t last_t = INT64_MIN;
    while (ok && pos < n) {
        const uint8_t *line = s + pos;
        const uint8_t *nl = memchr(line, '\n', n - pos);
        size_t len = nl ? (size_t)(nl - line) : n - pos;
        pos += len + (nl ? 1 : 0);
        if (!len) continue;                      /* empty lines are skipped */
        const uint8_t *f[MAX_FIELDS];
        size_t fl[MAX_FIELDS];
        int nf = 0;
        size_t start = 0;
        for (size_t i = 0; i <= len; i++) {
            if (i < len) {
                uint8_t kind = BYTE_KIND[line[i]];
                if (!kind) continue;
                if (kind == 2) { ok = 0; break; }      /* non-ASCII, a control character or '+' */
            }
            if (nf >= n_columns) { ok = 0; break; }   /* a wrong field count */
            f[nf] = line + start;
            fl[nf] = i - start;
            if (fl[nf] && (f[nf][0] == ' ' || f[nf][fl[nf] - 1] == ' ')) { ok = 0; break; }
            nf++;
            start = i + 1;
        }
        if (!ok || nf != n_columns) { ok = 0; break; }
        int8_t a;
        const uint8_t *af = f[c_action];
        if (ieq(af, fl[c_action], "allocate")) a = 0;
        else if (ieq(af, fl[c_action], "free")) a = 1;
        else if (ieq(af, fl[c_action], "allocate failure")) a = 2;
        else { ok = 0; break; }
        /* Size: digits (a sign, or past the size cap: the reference decides) */
        const uint8_t *sf = f[c_size];
        size_t sl = fl[c_size];
        if (!sl || sl > 18) { ok = 0; break; }
        int64_t sz = 0;
        for (size_t i = 0; i < sl; i++) {
            if (sf[i] < '0' || sf[i] > '9') { ok = 0; break; }
            sz = sz * 10 + (sf[i] - '0');
        }
        if (!ok || sz > MAX_SIZE_BYTES) { ok = 0; break; }
        int64_t ptr;
        int had;
        if (parse_hex(f[c_pointer], fl[c_pointer], &ptr, &had) < 0) { ok = 0; break; }
        if (ptr == 0 && a != 2 && sz != 0) { ok = 0; break; }   /* a null pointer in a request */
        if (ptr) ptr_0x |= 1 << had;
        if (vec_push(&budget, &action, a) < 0 || vec_push(&budget, &pointer, ptr) < 0
                || vec_push(&budget, &size, sz) < 0) { ok = 0; break; }
        if (c_stream >= 0) {
            int64_t st;
            if (parse_hex(f[c_stream], fl[c_stream], &st, &had) < 0) { ok = 0; break; }
            if (st) stream_0x |= 1 << had;
            if (vec_push(&budget, &stream, st) < 0) { ok = 0; break; }
        }
        if (c_time >= 0) {
            int64_t t;
            int sep;
            if (parse_time(f[c_time], fl[c_time], &t, &sep) < 0 || t < last_t) { ok = 0; break; }
            last_t = t;
            seps |= sep == '.' ? 1 : (sep == ':' ? 2 : 4);
            if (vec_push(&budget, &t_ns, t) < 0) { ok = 0; break; }
        }
        if (c_thread >= 0) {
            const uint8_t *tf = f[c_thread];
            size_t tl = fl[c_thread];
            if (!tl || tl > 18) { ok = 0; break; }
            int64_t th = 0;
            for (size_t i = 0; i < tl; i++) {
                if (tf[i] < '0' || tf[i] > '9') { ok = 0; break; }
                th = th * 10 + (tf[i] - '0');
            }
            if (!ok || vec_push(&budget, &threads, th) < 0) { ok = 0; break; }
        }
    }
    if (ok && !action.len) ok = 0;      /* a header without rows: the reference's own case */
    if (ok && c_thread >= 0) {          /* distinct thread ids (a keyed hash set) */
        PairMap seen = {NULL, 0, 0};
        for (size_t i = 0; i < threads.len && ok; i++) {
            int found;
            if (!pairmap_get_or_insert(&budget, &seen, threads.data[i], 0, 0, &found)) ok = 0;
            else n_threads += !found;
        }
        pairmap_free(&budget, &seen);
    }
    Py_END_ALLOW_THREADS
    if (!ok) goto hand_back;

    PyObject *sep_set = PySet_New(NULL), *ptr_set = PySet_New(NULL), *st_set = PySet_New(NULL);
    if (!sep_set || !ptr_set || !st_set) goto sets_error;
    static const char *SEP_TEXT[3] = {".", ":", ""};
    for (int k = 0; k < 3; k++) {
        if (!(seps & (1 << k))) continue;
        PyObject *t = PyUnicode_FromString(SEP_TEXT[k]);
        if (!t || PySet_Add(sep_set, t) < 0) { Py_XDECREF(t); goto sets_error; }
        Py_DECREF(t);
    }
    for (int k = 0; k < 2; k++) {
        if ((ptr_0x & (1 << k)) && PySet_Add(ptr_set, k ? Py_True : Py_False) < 0) goto sets_error;
        if ((stream_0x & (1 << k)) && PySet_Add(st_set, k ? Py_True : Py_False) < 0) goto sets_error;
    }
#define BA(vec, item) rd_bytearray_copy((vec).data, (vec).len, (item))
    PyObject *thread_count = c_thread >= 0 ? PyLong_FromSsize_t(n_threads) : (Py_INCREF(Py_None), Py_None);
    PyObject *st_col = c_stream >= 0 ? BA(stream, 8) : (Py_INCREF(Py_None), Py_None);
    PyObject *t_col = c_time >= 0 ? BA(t_ns, 8) : (Py_INCREF(Py_None), Py_None);
    result = Py_BuildValue("{s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N}", "action", BA(action, 1), "pointer", BA(pointer, 8),
                           "size", BA(size, 8), "stream", st_col, "t_ns", t_col, "time_separators", sep_set,
                           "pointer_0x", ptr_set, "stream_0x", st_set, "threads", thread_count);
#undef BA
    goto done;
sets_error:
    Py_XDECREF(sep_set);
    Py_XDECREF(ptr_set);
    Py_XDECREF(st_set);
    goto done;
hand_back:
    result = Py_None;
    Py_INCREF(Py_None);
done:
    vec_free(&budget, &action);
    vec_free(&budget, &pointer);
    vec_free(&budget, &size);
    vec_free(&budget, &stream);
    vec_free(&budget, &t_ns);
    vec_free(&budget, &threads);
    PyBuffer_Release(&buf);
    return result;
}
