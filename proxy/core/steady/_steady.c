/* The native steady path: one call per upstream read (proxy/core/steady/__init__.py).
 *
 * A `Step` owns one chunked response body's framing once its head is parsed: it undoes the
 * upstream's chunk framing (RFC 9112 §7.1) and, armed for a client, either re-frames the body
 * for pass-through or turns it into Codec frames, with the client's chunk framing added. It
 * never decides anything the Python path would decide differently: whatever is not plainly
 * steady is *declined*, having changed nothing, and goes to the Python body whole.
 *
 * Every network byte is read through a cursor bounded by its buffer's end; nothing here raises
 * but MemoryError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#ifndef STEADY_SOURCE_HASH
#define STEADY_SOURCE_HASH "unknown"
#endif

/* JSON nesting the scanner follows before it declines (orjson's own limit is 1024). */
#define MAX_DEPTH 64
/* Hex digits of a chunk size the de-chunker reads itself (4 GiB - 1); longer goes to llhttp. */
#define MAX_SIZE_DIGITS 8
/* Bytes an event or a held partial event stays below the SSE decoder's limit by. */
#define EVENT_MARGIN 16

/* --- a growable byte buffer -------------------------------------------------------------- */

typedef struct {
    uint8_t *data;
    size_t len, cap;
} Buf;

static int buf_reserve(Buf *b, size_t extra) {
    if (b->len + extra <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 512;
    while (cap < b->len + extra)
        cap *= 2;
    uint8_t *grown = PyMem_Realloc(b->data, cap);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = grown;
    b->cap = cap;
    return 0;
}

static int buf_put(Buf *b, const void *p, size_t n) {
    if (n == 0)
        return 0;
    if (buf_reserve(b, n) < 0)
        return -1;
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

static int buf_byte(Buf *b, uint8_t c) { return buf_put(b, &c, 1); }

static void buf_free(Buf *b) {
    PyMem_Free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

/* --- the vocabulary's token bytes in one array -------------------------------------------- */

typedef struct {
    PyObject_HEAD
    uint32_t size;
    uint32_t *offsets; /* size + 1 */
    uint8_t *blob;
    uint8_t unspellable[256];
} VocabObject;

static void Vocab_dealloc(VocabObject *self) {
    PyMem_Free(self->offsets);
    PyMem_Free(self->blob);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Vocab_init(VocabObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"table", "unspellable", NULL};
    PyObject *table;
    Py_buffer mask;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Oy*", kwlist, &table, &mask))
        return -1;
    PyObject *seq = PySequence_Fast(table, "table must be a sequence of bytes");
    if (seq == NULL) {
        PyBuffer_Release(&mask);
        return -1;
    }
    int status = -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (mask.len != 256 || n >= (Py_ssize_t)UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "unspellable must be 256 bytes");
        goto done;
    }
    size_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyBytes_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "table entries must be bytes");
            goto done;
        }
        total += (size_t)PyBytes_GET_SIZE(item);
    }
    if (total >= UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "vocabulary too large");
        goto done;
    }
    PyMem_Free(self->offsets);
    PyMem_Free(self->blob);
    self->offsets = PyMem_Malloc(sizeof(uint32_t) * ((size_t)n + 1));
    self->blob = PyMem_Malloc(total ? total : 1);
    if (self->offsets == NULL || self->blob == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    uint32_t at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        Py_ssize_t len = PyBytes_GET_SIZE(item);
        self->offsets[i] = at;
        memcpy(self->blob + at, PyBytes_AS_STRING(item), (size_t)len);
        at += (uint32_t)len;
    }
    self->offsets[n] = at;
    self->size = (uint32_t)n;
    memcpy(self->unspellable, mask.buf, 256);
    status = 0;
done:
    Py_DECREF(seq);
    PyBuffer_Release(&mask);
    return status;
}

static PyObject *Vocab_len(VocabObject *self, void *closure) {
    return PyLong_FromUnsignedLong(self->size);
}

static PyGetSetDef Vocab_getset[] = {
    {"size", (getter)Vocab_len, NULL, "how many IDs the table has", NULL},
    {NULL},
};

static PyTypeObject VocabType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "proxy.core.steady._steady.Vocab",
    .tp_basicsize = sizeof(VocabObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Vocab_init,
    .tp_dealloc = (destructor)Vocab_dealloc,
    .tp_getset = Vocab_getset,
    .tp_doc = "Each token ID's bytes, and which bytes start characters no ID can spell.",
};

/* --- the step ----------------------------------------------------------------------------- */

/* OUT_IDS: the read's IDs as a tuple, for a Python writer that compresses them on its schedule.
 * OUT_TEXT: the read's text as a str, for the Python retokenizer (the IDs are not the backend's). */
enum { OUT_OFF = 0, OUT_RELAY = 1, OUT_CODEC = 2, OUT_IDS = 3, OUT_TEXT = 4 };
enum { CH_SIZE = 0, CH_DATA = 1, CH_CR = 2, CH_LF = 3 };
enum { FMT_MSGPACK = 0, FMT_MSGPACK_DELTA = 1, FMT_PROTOBUF = 2, FMT_PREFIXED_MSGPACK = 3 };

typedef struct {
    PyObject_HEAD
    /* de-chunking */
    int chunk_state;
    uint64_t remaining;
    uint8_t size_line[MAX_SIZE_DIGITS + 2];
    int size_len;
    /* output */
    int output;
    VocabObject *vocab;
    int format, chat;
    Py_ssize_t max_event;
    uint32_t base;
    Buf held; /* a partial SSE event */
    int held_has_body; /* codec_step appended the read's body to it */
    Buf body, out, text;
    uint32_t *ids;
    size_t ids_len, ids_cap;
    /* counters, folded into the Python objects */
    long long tokens, text_bytes, bytes_out;
    long long received, steady_reads;
    PyObject *clock;
    double *bounds;
    long long *counts;
    Py_ssize_t nbounds;
    double gap_sum, last_write;
    int have_last;
    /* a declined read */
    PyObject *declined_body, *declined_rest;
    int malformed;
} StepObject;

static void Step_dealloc(StepObject *self) {
    buf_free(&self->held);
    buf_free(&self->body);
    buf_free(&self->out);
    buf_free(&self->text);
    PyMem_Free(self->ids);
    PyMem_Free(self->bounds);
    PyMem_Free(self->counts);
    Py_XDECREF(self->vocab);
    Py_XDECREF(self->clock);
    Py_XDECREF(self->declined_body);
    Py_XDECREF(self->declined_rest);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Step_init(StepObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "", kwlist))
        return -1;
    self->chunk_state = CH_SIZE;
    return 0;
}

/* Where writes are timed: the loop's clock, and the gap histogram's bucket bounds. */
static int set_clock(StepObject *self, PyObject *clock, PyObject *bounds, double last) {
    PyObject *seq = PySequence_Fast(bounds, "bounds must be a sequence of floats");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n != self->nbounds) {
        PyMem_Free(self->bounds);
        PyMem_Free(self->counts);
        self->nbounds = 0;
        self->bounds = PyMem_Malloc(sizeof(double) * (size_t)(n ? n : 1));
        self->counts = PyMem_Calloc((size_t)(n ? n : 1), sizeof(long long));
        if (self->bounds == NULL || self->counts == NULL) {
            Py_DECREF(seq);
            PyErr_NoMemory();
            return -1;
        }
        self->nbounds = n;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        double v = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
        if (v == -1.0 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
        self->bounds[i] = v;
    }
    Py_DECREF(seq);
    Py_INCREF(clock);
    Py_XSETREF(self->clock, clock);
    self->last_write = last;
    self->have_last = 1;
    return 0;
}

/* --- UTF-8 and JSON ----------------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence starting at p (lead byte >= 0x80), 0 if invalid: no
 * overlong forms, no surrogates, nothing past U+10FFFF (RFC 3629 §4). */
static int utf8_sequence(const uint8_t *p, const uint8_t *end) {
    uint8_t c = p[0];
    int n;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else
        return 0;
    if (end - p < n)
        return 0;
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (int i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xBF)
            return 0;
    return n;
}

typedef struct {
    const uint8_t *p, *end;
} Cur;

static void skip_ws(Cur *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static int hex_value(uint8_t c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* A string at c->p (its opening quote). Validated whole; with `out`, its decoded UTF-8 bytes
 * are appended there. `escaped` says whether it held an escape. 0: ok; 1: decline; -1: error. */
static int scan_string(Cur *c, Buf *out, int *escaped) {
    const uint8_t *p = c->p + 1, *end = c->end;
    *escaped = 0;
    const uint8_t *run = p;
    while (p < end) {
        uint8_t ch = *p;
        if (ch == '"') {
            if (out && buf_put(out, run, (size_t)(p - run)) < 0)
                return -1;
            c->p = p + 1;
            return 0;
        }
        if (ch < 0x20)
            return 1;
        if (ch < 0x80 && ch != '\\') {
            p++;
            continue;
        }
        if (ch >= 0x80) {
            int n = utf8_sequence(p, end);
            if (n == 0)
                return 1;
            p += n;
            continue;
        }
        /* an escape (RFC 8259 §7) */
        *escaped = 1;
        if (out && buf_put(out, run, (size_t)(p - run)) < 0)
            return -1;
        if (end - p < 2)
            return 1;
        uint8_t e = p[1];
        uint8_t plain = 0;
        switch (e) {
        case '"': plain = '"'; break;
        case '\\': plain = '\\'; break;
        case '/': plain = '/'; break;
        case 'b': plain = '\b'; break;
        case 'f': plain = '\f'; break;
        case 'n': plain = '\n'; break;
        case 'r': plain = '\r'; break;
        case 't': plain = '\t'; break;
        case 'u': {
            if (end - p < 6)
                return 1;
            uint32_t cp = 0;
            for (int i = 2; i < 6; i++) {
                int h = hex_value(p[i]);
                if (h < 0)
                    return 1;
                cp = (cp << 4) | (uint32_t)h;
            }
            /* Surrogates, paired or lone, are declined: the Python path rejoins or refuses
             * them (proxy/core/stream/surrogates.py). */
            if (cp >= 0xD800 && cp <= 0xDFFF)
                return 1;
            if (out) {
                uint8_t u[3];
                size_t n;
                if (cp < 0x80) {
                    u[0] = (uint8_t)cp;
                    n = 1;
                } else if (cp < 0x800) {
                    u[0] = (uint8_t)(0xC0 | (cp >> 6));
                    u[1] = (uint8_t)(0x80 | (cp & 0x3F));
                    n = 2;
                } else {
                    u[0] = (uint8_t)(0xE0 | (cp >> 12));
                    u[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
                    u[2] = (uint8_t)(0x80 | (cp & 0x3F));
                    n = 3;
                }
                if (buf_put(out, u, n) < 0)
                    return -1;
            }
            p += 6;
            run = p;
            continue;
        }
        default:
            return 1;
        }
        if (out && buf_byte(out, plain) < 0)
            return -1;
        p += 2;
        run = p;
    }
    return 1;
}

/* A number (RFC 8259 §6). With `value`, it must be an integer 0..2^32-1 (a token ID, an
 * index), written there. 0: ok; 1: decline. */
static int scan_number(Cur *c, uint32_t *value) {
    const uint8_t *p = c->p, *end = c->end;
    int negative = 0, integral = 1;
    uint64_t v = 0;
    if (p < end && *p == '-') {
        negative = 1;
        p++;
    }
    if (p >= end)
        return 1;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        int digits = 0;
        while (p < end && *p >= '0' && *p <= '9') {
            if (digits < 11)
                v = v * 10 + (uint64_t)(*p - '0');
            digits++;
            p++;
        }
        if (digits > 10)
            v = UINT64_MAX;
    } else
        return 1;
    if (p < end && *p == '.') {
        integral = 0;
        p++;
        if (p >= end || *p < '0' || *p > '9')
            return 1;
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        integral = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        if (p >= end || *p < '0' || *p > '9')
            return 1;
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    }
    c->p = p;
    if (value != NULL) {
        if (negative || !integral || v > UINT32_MAX)
            return 1;
        *value = (uint32_t)v;
    }
    return 0;
}

static int scan_literal(Cur *c, const char *word, size_t n) {
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, word, n) != 0)
        return 1;
    c->p += n;
    return 0;
}

static int is_null(Cur *c) {
    return c->end - c->p >= 4 && memcmp(c->p, "null", 4) == 0;
}

/* Any value, validated and skipped. 0: ok; 1: decline; -1: error. */
static int skip_value(Cur *c, int depth) {
    skip_ws(c);
    if (c->p >= c->end)
        return 1;
    int escaped, r;
    switch (*c->p) {
    case '"':
        return scan_string(c, NULL, &escaped);
    case '{':
    case '[': {
        if (depth >= MAX_DEPTH)
            return 1;
        uint8_t close = *c->p == '{' ? '}' : ']';
        int object = close == '}';
        c->p++;
        skip_ws(c);
        if (c->p < c->end && *c->p == close) {
            c->p++;
            return 0;
        }
        for (;;) {
            if (object) {
                skip_ws(c);
                if (c->p >= c->end || *c->p != '"')
                    return 1;
                if ((r = scan_string(c, NULL, &escaped)) != 0)
                    return r;
                skip_ws(c);
                if (c->p >= c->end || *c->p != ':')
                    return 1;
                c->p++;
            }
            if ((r = skip_value(c, depth + 1)) != 0)
                return r;
            skip_ws(c);
            if (c->p >= c->end)
                return 1;
            if (*c->p == ',') {
                c->p++;
                continue;
            }
            if (*c->p == close) {
                c->p++;
                return 0;
            }
            return 1;
        }
    }
    case 't':
        return scan_literal(c, "true", 4);
    case 'f':
        return scan_literal(c, "false", 5);
    case 'n':
        return scan_literal(c, "null", 4);
    default:
        return scan_number(c, NULL);
    }
}

/* Iterating an object's members: the next key (its bytes between the quotes), or 0 at `}`.
 * Keys written with an escape are declined: `"te\u0078t"` is a second `text`. Returns 1 for
 * a member, 0 at the end, 2 to decline, -1 on error. */
static int next_member(Cur *c, int *first, const uint8_t **key, size_t *key_len) {
    skip_ws(c);
    if (c->p >= c->end)
        return 2;
    if (*first) {
        *first = 0;
        if (*c->p == '}') {
            c->p++;
            return 0;
        }
    } else {
        if (*c->p == '}') {
            c->p++;
            return 0;
        }
        if (*c->p != ',')
            return 2;
        c->p++;
        skip_ws(c);
    }
    if (c->p >= c->end || *c->p != '"')
        return 2;
    const uint8_t *start = c->p + 1;
    int escaped, r = scan_string(c, NULL, &escaped);
    if (r != 0)
        return r < 0 ? -1 : 2;
    if (escaped)
        return 2;
    *key = start;
    *key_len = (size_t)(c->p - 1 - start);
    skip_ws(c);
    if (c->p >= c->end || *c->p != ':')
        return 2;
    c->p++;
    skip_ws(c);
    return c->p < c->end ? 1 : 2; /* a value follows: handlers may look at its first byte */
}

#define KEY_IS(name) (key_len == sizeof(name) - 1 && memcmp(key, name, sizeof(name) - 1) == 0)

/* Each key read once at most: a repeated one is declined (the Python parser keeps the last). */
#define ONCE(bit)                                                                             \
    do {                                                                                      \
        if (seen & (bit))                                                                     \
            return 1;                                                                         \
        seen |= (bit);                                                                        \
    } while (0)

/* One event's fields, as proxy/core/stream/chunks.py reads them. */
typedef struct {
    int has_token_ids; /* `token_ids` is a list */
    size_t token_ids_start, token_ids_count;
    int logprob_ids; /* `logprobs.content` is a list of objects that all have `id` */
    size_t logprob_ids_start, logprob_ids_count;
} Fields;

static int push_id(StepObject *s, uint32_t id) {
    if (s->ids_len == s->ids_cap) {
        size_t cap = s->ids_cap ? s->ids_cap * 2 : 64;
        uint32_t *grown = PyMem_Realloc(s->ids, cap * sizeof(uint32_t));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->ids = grown;
        s->ids_cap = cap;
    }
    s->ids[s->ids_len++] = id;
    return 0;
}

/* A list of token IDs (`token_ids`): each an integer 0..2^32-1. 0 ok, 1 decline, -1 error. */
static int scan_id_list(StepObject *s, Cur *c) {
    c->p++; /* [ */
    skip_ws(c);
    if (c->p < c->end && *c->p == ']') {
        c->p++;
        return 0;
    }
    for (;;) {
        skip_ws(c);
        uint32_t id;
        if (scan_number(c, &id) != 0)
            return 1;
        if (push_id(s, id) < 0)
            return -1;
        skip_ws(c);
        if (c->p >= c->end)
            return 1;
        if (*c->p == ',') {
            c->p++;
            continue;
        }
        if (*c->p == ']') {
            c->p++;
            return 0;
        }
        return 1;
    }
}

/* `logprobs`: llama.cpp's `{"content": [{"id": ...}, ...]}`; anything else means no IDs. */
static int scan_logprobs(StepObject *s, Cur *c, Fields *f) {
    if (*c->p != '{')
        return skip_value(c, 2);
    c->p++;
    int first = 1, r, seen = 0;
    const uint8_t *key;
    size_t key_len;
    while ((r = next_member(c, &first, &key, &key_len)) == 1) {
        if (!KEY_IS("content")) {
            if ((r = skip_value(c, 3)) != 0)
                return r;
            continue;
        }
        ONCE(1);
        if (c->p >= c->end || *c->p != '[') {
            if ((r = skip_value(c, 3)) != 0)
                return r;
            continue;
        }
        c->p++;
        size_t start = s->ids_len;
        int all = 1, item_first = 1;
        for (;;) {
            skip_ws(c);
            if (c->p >= c->end)
                return 1;
            if (item_first) {
                item_first = 0;
                if (*c->p == ']') {
                    c->p++;
                    break;
                }
            } else {
                if (*c->p == ']') {
                    c->p++;
                    break;
                }
                if (*c->p != ',')
                    return 1;
                c->p++;
                skip_ws(c);
            }
            if (c->p >= c->end)
                return 1;
            if (*c->p != '{') {
                all = 0;
                if ((r = skip_value(c, 4)) != 0)
                    return r;
                continue;
            }
            c->p++;
            int efirst = 1, eseen = 0, er;
            const uint8_t *ekey;
            size_t ekey_len;
            while ((er = next_member(c, &efirst, &ekey, &ekey_len)) == 1) {
                if (ekey_len == 2 && memcmp(ekey, "id", 2) == 0) {
                    if (eseen)
                        return 1;
                    eseen = 1;
                    uint32_t id;
                    if (scan_number(c, &id) != 0)
                        return 1;
                    if (push_id(s, id) < 0)
                        return -1;
                } else if ((er = skip_value(c, 5)) != 0) {
                    return er;
                }
            }
            if (er != 0)
                return er == 2 ? 1 : er;
            if (!eseen)
                all = 0;
        }
        f->logprob_ids = all;
        f->logprob_ids_start = start;
        f->logprob_ids_count = s->ids_len - start;
    }
    return r == 2 ? 1 : r;
}

/* The chat `delta`: `content` only; reasoning text and tool calls are declined. */
static int scan_delta(StepObject *s, Cur *c, int *has_text) {
    if (is_null(c)) {
        c->p += 4;
        return 0;
    }
    if (*c->p != '{')
        return 1;
    c->p++;
    int first = 1, r, seen = 0, escaped;
    const uint8_t *key;
    size_t key_len;
    while ((r = next_member(c, &first, &key, &key_len)) == 1) {
        if (KEY_IS("content")) {
            ONCE(1);
            if (is_null(c)) {
                c->p += 4;
            } else if (*c->p == '"') {
                if ((r = scan_string(c, &s->text, &escaped)) != 0)
                    return r;
                *has_text = 1;
            } else
                return 1;
        } else if (KEY_IS("reasoning_content") || KEY_IS("reasoning") || KEY_IS("tool_calls")) {
            if (!is_null(c))
                return 1;
            c->p += 4;
        } else if ((r = skip_value(c, 3)) != 0) {
            return r;
        }
    }
    return r == 2 ? 1 : r;
}

/* choices[0]. */
static int scan_choice(StepObject *s, Cur *c, Fields *f, int *has_text) {
    if (c->p >= c->end || *c->p != '{')
        return 1;
    c->p++;
    int first = 1, r, seen = 0, escaped;
    const uint8_t *key;
    size_t key_len;
    while ((r = next_member(c, &first, &key, &key_len)) == 1) {
        if (KEY_IS("index")) {
            ONCE(1);
            uint32_t index;
            if (scan_number(c, &index) != 0 || index != 0)
                return 1;
        } else if (KEY_IS("text")) {
            ONCE(2);
            if (s->chat) {
                if ((r = skip_value(c, 2)) != 0)
                    return r;
            } else {
                if (*c->p != '"')
                    return 1;
                if ((r = scan_string(c, &s->text, &escaped)) != 0)
                    return r;
                *has_text = 1;
            }
        } else if (KEY_IS("delta")) {
            ONCE(4);
            if (s->chat) {
                if ((r = scan_delta(s, c, has_text)) != 0)
                    return r;
            } else if ((r = skip_value(c, 2)) != 0) {
                return r;
            }
        } else if (KEY_IS("finish_reason") || KEY_IS("stop_reason")) {
            /* A finish is the stream's end: the Python path's. */
            if (!is_null(c))
                return 1;
            c->p += 4;
        } else if (KEY_IS("token_ids")) {
            ONCE(8);
            if (is_null(c)) {
                c->p += 4;
            } else if (*c->p == '[') {
                f->has_token_ids = 1;
                f->token_ids_start = s->ids_len;
                if ((r = scan_id_list(s, c)) != 0)
                    return r;
                f->token_ids_count = s->ids_len - f->token_ids_start;
            } else
                return 1;
        } else if (KEY_IS("logprobs")) {
            ONCE(16);
            if ((r = scan_logprobs(s, c, f)) != 0)
                return r;
        } else if ((r = skip_value(c, 2)) != 0) {
            return r;
        }
    }
    if (r != 0)
        return r == 2 ? 1 : r;
    if (!s->chat && !*has_text)
        return 1; /* a completion chunk without `text` is the upstream's error */
    return 0;
}

/* One event's JSON: the text (appended to s->text) and the IDs (appended to s->ids) of a
 * steady chunk. 0 ok, 1 decline, -1 error. */
static int scan_event(StepObject *s, const uint8_t *p, const uint8_t *end) {
    Cur c = {p, end};
    skip_ws(&c);
    if (c.p >= c.end || *c.p != '{')
        return 1;
    c.p++;
    Fields f = {0};
    int first = 1, r, seen = 0, has_text = 0;
    size_t ids_before = s->ids_len;
    const uint8_t *key;
    size_t key_len;
    while ((r = next_member(&c, &first, &key, &key_len)) == 1) {
        if (KEY_IS("choices")) {
            ONCE(1);
            if (c.p >= c.end || *c.p != '[')
                return 1;
            c.p++;
            skip_ws(&c);
            if ((r = scan_choice(s, &c, &f, &has_text)) != 0)
                return r;
            /* the other choices: validated, not read (only choice 0 exists, n > 1 refused) */
            for (;;) {
                skip_ws(&c);
                if (c.p >= c.end)
                    return 1;
                if (*c.p == ']') {
                    c.p++;
                    break;
                }
                if (*c.p != ',')
                    return 1;
                c.p++;
                if ((r = skip_value(&c, 2)) != 0)
                    return r;
            }
        } else if (KEY_IS("error") || KEY_IS("usage")) {
            ONCE(KEY_IS("error") ? 2 : 4);
            if (!is_null(&c))
                return 1;
            c.p += 4;
        } else if ((r = skip_value(&c, 1)) != 0) {
            return r;
        }
    }
    if (r != 0)
        return r == 2 ? 1 : r;
    skip_ws(&c);
    if (c.p != c.end || !(seen & 1))
        return 1;
    /* chunks.py `_token_ids`: `token_ids` when it is a list, else llama.cpp's logprobs IDs when
     * every entry has one, else none. Keep only the chosen IDs. */
    size_t from = 0, count = 0;
    if (f.has_token_ids) {
        from = f.token_ids_start;
        count = f.token_ids_count;
    } else if (f.logprob_ids) {
        from = f.logprob_ids_start;
        count = f.logprob_ids_count;
    }
    if (count)
        memmove(s->ids + ids_before, s->ids + from, count * sizeof(uint32_t));
    s->ids_len = ids_before + count;
    return 0;
}

/* The usual chunk of BackendIds.feed: nothing waits and this event's IDs render exactly its
 * text; and the text has no character the vocabulary cannot spell. */
static int ids_render_text(StepObject *s, size_t ids_from, size_t text_from) {
    VocabObject *v = s->vocab;
    const uint8_t *t = s->text.data + text_from, *tend = s->text.data + s->text.len;
    for (const uint8_t *q = t; q < tend; q++)
        if (v->unspellable[*q])
            return 1;
    for (size_t i = ids_from; i < s->ids_len; i++) {
        uint32_t id = s->ids[i];
        if (id >= v->size)
            return 1;
        uint32_t a = v->offsets[id], b = v->offsets[id + 1];
        size_t n = b - a;
        if ((size_t)(tend - t) < n || memcmp(t, v->blob + a, n) != 0)
            return 1;
        t += n;
    }
    return t == tend ? 0 : 1;
}

/* --- frames ------------------------------------------------------------------------------- */

static int mp_uint(Buf *b, uint64_t v) {
    uint8_t u[9];
    size_t n;
    if (v < 128) {
        u[0] = (uint8_t)v;
        n = 1;
    } else if (v < 256) {
        u[0] = 0xcc;
        u[1] = (uint8_t)v;
        n = 2;
    } else if (v < 65536) {
        u[0] = 0xcd;
        u[1] = (uint8_t)(v >> 8);
        u[2] = (uint8_t)v;
        n = 3;
    } else if (v <= UINT32_MAX) {
        u[0] = 0xce;
        for (int i = 0; i < 4; i++)
            u[1 + i] = (uint8_t)(v >> (24 - 8 * i));
        n = 5;
    } else {
        u[0] = 0xcf;
        for (int i = 0; i < 8; i++)
            u[1 + i] = (uint8_t)(v >> (56 - 8 * i));
        n = 9;
    }
    return buf_put(b, u, n);
}

static int mp_array(Buf *b, size_t n) {
    uint8_t u[5];
    if (n < 16) {
        u[0] = (uint8_t)(0x90 | n);
        return buf_put(b, u, 1);
    }
    if (n < 65536) {
        u[0] = 0xdc;
        u[1] = (uint8_t)(n >> 8);
        u[2] = (uint8_t)n;
        return buf_put(b, u, 3);
    }
    u[0] = 0xdd;
    for (int i = 0; i < 4; i++)
        u[1 + i] = (uint8_t)(n >> (24 - 8 * i));
    return buf_put(b, u, 5);
}

static int put_varint(Buf *b, uint64_t v) {
    uint8_t u[10];
    size_t n = 0;
    do {
        uint8_t byte = v & 0x7f;
        v >>= 7;
        u[n++] = v ? (byte | 0x80) : byte;
    } while (v);
    return buf_put(b, u, n);
}

static size_t varint_size(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static void put_be32_at(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* One non-terminal frame of the IDs, as proxy/core/wire/frames.py's encoders write it. */
static int encode_frame(StepObject *s, Buf *b) {
    const uint32_t *ids = s->ids;
    size_t n = s->ids_len;
    static const uint8_t done_false[] = {0xa4, 'd', 'o', 'n', 'e', 0xc2};
    switch (s->format) {
    case FMT_MSGPACK:
    case FMT_PREFIXED_MSGPACK: {
        size_t at = b->len;
        static const uint8_t head[] = {0x82, 0xa3, 'i', 'd', 's'};
        if (s->format == FMT_PREFIXED_MSGPACK && buf_put(b, "\0\0\0\0", 4) < 0)
            return -1;
        if (buf_put(b, head, sizeof head) < 0 || mp_array(b, n) < 0)
            return -1;
        for (size_t i = 0; i < n; i++)
            if (mp_uint(b, ids[i]) < 0)
                return -1;
        if (buf_put(b, done_false, sizeof done_false) < 0)
            return -1;
        if (s->format == FMT_PREFIXED_MSGPACK)
            put_be32_at(b->data + at, (uint32_t)(b->len - at - 4));
        return 0;
    }
    case FMT_MSGPACK_DELTA: {
        static const uint8_t base_key[] = {0x83, 0xa7, 'b', 'a', 's', 'e', '_', 'i', 'd'};
        static const uint8_t delta_key[] = {0xa9, 'i', 'd', 's', '_', 'd', 'e', 'l', 't', 'a'};
        if (buf_put(b, base_key, sizeof base_key) < 0 || mp_uint(b, s->base) < 0)
            return -1;
        if (buf_put(b, delta_key, sizeof delta_key) < 0 || mp_array(b, n) < 0)
            return -1;
        int64_t previous = s->base;
        for (size_t i = 0; i < n; i++) {
            int64_t d = (int64_t)ids[i] - previous;
            uint64_t z = d >= 0 ? (uint64_t)d * 2 : (uint64_t)(-d) * 2 - 1;
            if (mp_uint(b, z) < 0)
                return -1;
            previous = ids[i];
        }
        if (buf_put(b, done_false, sizeof done_false) < 0)
            return -1;
        s->base = ids[n - 1];
        return 0;
    }
    case FMT_PROTOBUF: {
        /* codec-spec.md §1.2: ids packed (field 1); done false is left out. */
        size_t packed = 0;
        for (size_t i = 0; i < n; i++)
            packed += varint_size(ids[i]);
        size_t payload = 1 + varint_size(packed) + packed;
        uint8_t prefix[5];
        put_be32_at(prefix, (uint32_t)payload);
        prefix[4] = 0x0a;
        if (buf_put(b, prefix, 5) < 0 || put_varint(b, packed) < 0)
            return -1;
        for (size_t i = 0; i < n; i++)
            if (put_varint(b, ids[i]) < 0)
                return -1;
        return 0;
    }
    }
    return -1;
}

/* --- the step's work per read ------------------------------------------------------------- */

/* `v` in lowercase hexadecimal, no leading zeros, into `out` (at least 16 bytes): its length.
 * Once or twice per read; snprintf's format parsing cost more than the rest of the framing. */
static int put_hex(char *out, unsigned long long v) {
    static const char digits[] = "0123456789abcdef";
    char tmp[16];
    int n = 0;
    do {
        tmp[n++] = digits[v & 0xf];
        v >>= 4;
    } while (v != 0);
    for (int i = 0; i < n; i++)
        out[i] = tmp[n - 1 - i];
    return n;
}

/* The client's chunk around `len` bytes at `p`, as a new bytes object (RFC 9112 §7.1). */
static PyObject *client_chunk(const uint8_t *p, size_t len) {
    char head[24];
    int h = put_hex(head, (unsigned long long)len);
    head[h++] = '\r';
    head[h++] = '\n';
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(h + len + 2));
    if (out == NULL)
        return NULL;
    char *o = PyBytes_AS_STRING(out);
    memcpy(o, head, (size_t)h);
    memcpy(o + h, p, len);
    memcpy(o + h + len, "\r\n", 2);
    return out;
}

static void account_write(StepObject *s, size_t body_len) {
    s->bytes_out += (long long)body_len;
    PyObject *now_obj = PyObject_CallNoArgs(s->clock);
    if (now_obj == NULL) {
        PyErr_Clear();
        return;
    }
    double now = PyFloat_AsDouble(now_obj);
    Py_DECREF(now_obj);
    if (now == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return;
    }
    if (s->have_last) {
        /* LocalHistogram.observe: the first bucket whose upper bound is >= the gap. */
        double gap = now - s->last_write;
        Py_ssize_t lo = 0, hi = s->nbounds;
        while (lo < hi) {
            Py_ssize_t mid = (lo + hi) / 2;
            if (s->bounds[mid] < gap)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < s->nbounds)
            s->counts[lo]++;
        s->gap_sum += gap;
    }
    s->last_write = now;
    s->have_last = 1;
}

/* The Codec step over held + this read's body. Returns the client's bytes, NULL on error, or
 * Py_None (borrowed, not increfed) to decline. */
static PyObject *codec_step(StepObject *s, const uint8_t *body, size_t body_len) {
    const uint8_t *p, *end;
    if (s->held.len) {
        if (buf_put(&s->held, body, body_len) < 0)
            return NULL;
        s->held_has_body = 1;
        p = s->held.data;
        end = p + s->held.len;
    } else {
        p = body;
        end = body + body_len;
    }
    s->ids_len = 0;
    s->text.len = 0;
    while (end - p >= 6 && memcmp(p, "data: ", 6) == 0) {
        const uint8_t *payload = p + 6, *q = payload;
        while (q < end && *q != '\n' && *q != '\r')
            q++;
        if (q == end)
            break; /* a partial event */
        const uint8_t *next;
        if (end - q >= 2 && q[0] == '\n' && q[1] == '\n')
            next = q + 2;
        else if (end - q >= 4 && memcmp(q, "\r\n\r\n", 4) == 0)
            next = q + 4;
        else
            return Py_None;
        if (q == payload || (Py_ssize_t)(q - p) + EVENT_MARGIN > s->max_event)
            return Py_None;
        size_t ids_from = s->ids_len, text_from = s->text.len;
        int r = scan_event(s, payload, q);
        if (r < 0)
            return NULL;
        if (r > 0)
            return Py_None;
        if (s->output == OUT_TEXT) {
            /* The transcoder's own check before its ID source sees the text. */
            for (size_t i = text_from; i < s->text.len; i++)
                if (s->vocab->unspellable[s->text.data[i]])
                    return Py_None;
        } else if (ids_render_text(s, ids_from, text_from) != 0) {
            return Py_None;
        }
        p = next;
    }
    /* What is left is one partial event with no line end yet, or the read is declined. */
    size_t tail = (size_t)(end - p);
    if (memchr(p, '\n', tail) != NULL || memchr(p, '\r', tail) != NULL)
        return Py_None;
    if ((Py_ssize_t)tail + EVENT_MARGIN > s->max_event)
        return Py_None;
    if (s->held.len) {
        memmove(s->held.data, p, tail);
        s->held.len = tail;
        s->held_has_body = 0;
    } else if (buf_put(&s->held, p, tail) < 0) {
        return NULL;
    }
    s->steady_reads++;
    if (s->output == OUT_TEXT) /* the retokenizer counts what it makes */
        return PyUnicode_DecodeUTF8((const char *)s->text.data, (Py_ssize_t)s->text.len, "strict");
    s->tokens += (long long)s->ids_len;
    s->text_bytes += (long long)s->text.len;
    if (s->output == OUT_IDS) {
        PyObject *ids = PyTuple_New((Py_ssize_t)s->ids_len);
        if (ids == NULL)
            return NULL;
        for (size_t i = 0; i < s->ids_len; i++) {
            PyObject *id = PyLong_FromUnsignedLong(s->ids[i]);
            if (id == NULL) {
                Py_DECREF(ids);
                return NULL;
            }
            PyTuple_SET_ITEM(ids, (Py_ssize_t)i, id);
        }
        return ids;
    }
    if (s->ids_len == 0)
        return PyBytes_FromStringAndSize(NULL, 0);
    s->out.len = 0;
    if (encode_frame(s, &s->out) < 0)
        return NULL;
    account_write(s, s->out.len);
    return client_chunk(s->out.data, s->out.len);
}

/* Hand the read back: the body bytes for the Python path (held partial event first), the
 * rest of the read for llhttp from a chunk boundary on. */
static PyObject *decline(StepObject *s, const uint8_t *body, size_t body_len, PyObject *rest) {
    PyObject *declined;
    if (s->held.len) {
        /* codec_step put this read's body behind the held event already */
        if (!s->held_has_body && buf_put(&s->held, body, body_len) < 0) {
            Py_XDECREF(rest);
            return NULL;
        }
        declined = PyBytes_FromStringAndSize((char *)s->held.data, (Py_ssize_t)s->held.len);
        s->held.len = 0;
        s->held_has_body = 0;
    } else {
        declined = PyBytes_FromStringAndSize((const char *)body, (Py_ssize_t)body_len);
    }
    if (declined == NULL) {
        Py_XDECREF(rest);
        return NULL;
    }
    Py_XSETREF(s->declined_body, declined);
    if (rest == NULL) {
        rest = PyBytes_FromStringAndSize(NULL, 0);
        if (rest == NULL)
            return NULL;
    }
    Py_XSETREF(s->declined_rest, rest);
    if (s->output >= OUT_CODEC)
        s->output = OUT_OFF; /* until the Python objects are steady again (arm) */
    Py_RETURN_NONE;
}

static PyObject *Step_feed(StepObject *s, PyObject *arg) {
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "feed takes bytes");
        return NULL;
    }
    const uint8_t *data = (const uint8_t *)PyBytes_AS_STRING(arg);
    size_t n = (size_t)PyBytes_GET_SIZE(arg);
    const uint8_t *p = data, *end = data + n;
    /* One body segment is used in place; a second one copies both into `body`. */
    const uint8_t *seg = NULL;
    size_t seg_len = 0;
    int segments = 0;
    s->body.len = 0;
    s->malformed = 0;
    int canonical = s->chunk_state == CH_SIZE && s->size_len == 0;
    PyObject *rest = NULL;
    while (p < end) {
        if (s->chunk_state == CH_SIZE) {
            /* `<hex>\r\n`, perhaps begun in the previous read (held in size_line). */
            const uint8_t *line = p;
            int held_before = s->size_len, complete = 0, handover = 0;
            while (p < end) {
                uint8_t ch = *p;
                if (s->size_len > 0 && s->size_line[s->size_len - 1] == '\r') {
                    if (ch == '\n') {
                        p++;
                        complete = 1;
                    } else
                        handover = 1;
                    break;
                }
                if (hex_value(ch) >= 0 && s->size_len < MAX_SIZE_DIGITS)
                    s->size_line[s->size_len++] = ch;
                else if (ch == '\r' && s->size_len > 0)
                    s->size_line[s->size_len++] = ch;
                else {
                    handover = 1; /* an extension, a long size, odd framing */
                    break;
                }
                p++;
            }
            if (!complete && !handover)
                break; /* the size line goes on in the next read */
            int digits = s->size_len - 1;
            uint64_t size = 0;
            for (int i = 0; complete && i < digits; i++)
                size = size * 16 + (uint64_t)hex_value(s->size_line[i]);
            if (handover || size == 0) {
                /* llhttp's from the start of this size line: it is at a chunk boundary, as
                 * after the head. The last chunk (and its trailers) end the message there. */
                PyObject *r = PyBytes_FromStringAndSize(
                    NULL, (Py_ssize_t)((size_t)held_before + (size_t)(end - line)));
                if (r == NULL)
                    return NULL;
                memcpy(PyBytes_AS_STRING(r), s->size_line, (size_t)held_before);
                memcpy(PyBytes_AS_STRING(r) + held_before, line, (size_t)(end - line));
                rest = r;
                s->size_len = 0;
                break;
            }
            if (canonical) {
                char expect[24];
                int h = put_hex(expect, (unsigned long long)size);
                canonical = h == digits && memcmp(expect, s->size_line, (size_t)h) == 0;
            }
            s->size_len = 0;
            s->remaining = size;
            s->chunk_state = CH_DATA;
        } else if (s->chunk_state == CH_DATA) {
            size_t take = (size_t)(end - p) < s->remaining ? (size_t)(end - p) : (size_t)s->remaining;
            if (segments == 0) {
                seg = p;
                seg_len = take;
            } else {
                if (segments == 1 && buf_put(&s->body, seg, seg_len) < 0)
                    return NULL;
                if (buf_put(&s->body, p, take) < 0)
                    return NULL;
            }
            segments++;
            p += take;
            s->remaining -= take;
            if (s->remaining == 0)
                s->chunk_state = CH_CR;
        } else {
            uint8_t want = s->chunk_state == CH_CR ? '\r' : '\n';
            if (*p != want) {
                /* A chunk's data not followed by CRLF: llhttp's error, reproduced in Python. */
                int cr = s->chunk_state == CH_LF;
                s->malformed = 1;
                rest = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(cr + (end - p)));
                if (rest == NULL)
                    return NULL;
                if (cr)
                    PyBytes_AS_STRING(rest)[0] = '\r';
                memcpy(PyBytes_AS_STRING(rest) + cr, p, (size_t)(end - p));
                break;
            }
            p++;
            s->chunk_state = s->chunk_state == CH_CR ? CH_LF : CH_SIZE;
        }
    }
    const uint8_t *body;
    size_t body_len;
    if (segments <= 1) {
        body = seg;
        body_len = seg_len;
    } else {
        body = s->body.data;
        body_len = s->body.len;
    }
    s->received += (long long)body_len;
    if (rest != NULL || s->output == OUT_OFF)
        return decline(s, body, body_len, rest);
    if (s->output == OUT_RELAY) {
        s->steady_reads++;
        if (body_len == 0)
            return PyBytes_FromStringAndSize(NULL, 0);
        account_write(s, body_len);
        if (canonical && segments == 1 && s->chunk_state == CH_SIZE && s->size_len == 0) {
            /* exactly one chunk, framed as we would frame it: the read as it came */
            Py_INCREF(arg);
            return arg;
        }
        return client_chunk(body, body_len);
    }
    PyObject *out = codec_step(s, body ? body : (const uint8_t *)"", body_len);
    if (out == Py_None)
        return decline(s, body ? body : (const uint8_t *)"", body_len, NULL);
    return out;
}

static PyObject *Step_relay(StepObject *s, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"last_write", "clock", "bounds", NULL};
    double last;
    PyObject *clock, *bounds;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "dOO", kwlist, &last, &clock, &bounds))
        return NULL;
    if (set_clock(s, clock, bounds, last) < 0)
        return NULL;
    s->output = OUT_RELAY;
    Py_RETURN_NONE;
}

static PyObject *Step_codec(StepObject *s, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"vocab", "format",     "chat",  "max_event", "base",
                             "last_write", "clock", "bounds", "ids_only",  "text_only", NULL};
    PyObject *vocab, *clock, *bounds;
    int format, chat, ids_only = 0, text_only = 0;
    Py_ssize_t max_event;
    unsigned long base;
    double last;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!ipnkdOO|pp", kwlist, &VocabType, &vocab,
                                     &format, &chat, &max_event, &base, &last, &clock, &bounds,
                                     &ids_only, &text_only))
        return NULL;
    if (format < FMT_MSGPACK || format > FMT_PREFIXED_MSGPACK || base > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "unknown format or base");
        return NULL;
    }
    if (set_clock(s, clock, bounds, last) < 0)
        return NULL;
    Py_INCREF(vocab);
    Py_XSETREF(s->vocab, (VocabObject *)vocab);
    s->format = format;
    s->chat = chat;
    s->max_event = max_event;
    s->base = (uint32_t)base;
    s->output = text_only ? OUT_TEXT : ids_only ? OUT_IDS : OUT_CODEC;
    Py_RETURN_NONE;
}

static PyObject *Step_stop(StepObject *s, PyObject *unused) {
    s->output = OUT_OFF;
    Py_RETURN_NONE;
}

/* The counters since the last fold, reset: (tokens, text bytes, delta base, body bytes out,
 * gap bucket counts, gap sum, the last write's time or None). */
static PyObject *Step_fold(StepObject *s, PyObject *unused) {
    PyObject *counts = PyList_New(s->nbounds);
    if (counts == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < s->nbounds; i++) {
        PyObject *v = PyLong_FromLongLong(s->counts[i]);
        if (v == NULL) {
            Py_DECREF(counts);
            return NULL;
        }
        PyList_SET_ITEM(counts, i, v);
    }
    PyObject *last = s->have_last ? PyFloat_FromDouble(s->last_write) : Py_NewRef(Py_None);
    if (last == NULL) {
        Py_DECREF(counts);
        return NULL;
    }
    PyObject *result = Py_BuildValue("(LLkLNdN)", s->tokens, s->text_bytes,
                                     (unsigned long)s->base, s->bytes_out, counts, s->gap_sum, last);
    if (result == NULL)
        return NULL;
    s->tokens = s->text_bytes = s->bytes_out = 0;
    memset(s->counts, 0, sizeof(long long) * (size_t)(s->nbounds ? s->nbounds : 1));
    s->gap_sum = 0.0;
    return result;
}

static PyObject *Step_get_body(StepObject *s, void *c) {
    return Py_NewRef(s->declined_body ? s->declined_body : Py_None);
}
static PyObject *Step_get_rest(StepObject *s, void *c) {
    return Py_NewRef(s->declined_rest ? s->declined_rest : Py_None);
}
static PyObject *Step_get_received(StepObject *s, void *c) {
    return PyLong_FromLongLong(s->received);
}
static PyObject *Step_get_steady(StepObject *s, void *c) {
    return PyLong_FromLongLong(s->steady_reads);
}
static PyObject *Step_get_malformed(StepObject *s, void *c) {
    return PyBool_FromLong(s->malformed);
}
static PyObject *Step_get_held(StepObject *s, void *c) {
    return PyLong_FromSize_t(s->held.len);
}
static PyObject *Step_get_output(StepObject *s, void *c) {
    return PyLong_FromLong(s->output);
}

static PyGetSetDef Step_getset[] = {
    {"body", (getter)Step_get_body, NULL, "a declined read's body bytes", NULL},
    {"rest", (getter)Step_get_rest, NULL, "a declined read's bytes for llhttp", NULL},
    {"received", (getter)Step_get_received, NULL, "body bytes de-chunked so far", NULL},
    {"steady_reads", (getter)Step_get_steady, NULL, "reads handled natively", NULL},
    {"malformed", (getter)Step_get_malformed, NULL, "the rest starts where CRLF was due", NULL},
    {"held", (getter)Step_get_held, NULL, "bytes of a partial event held", NULL},
    {"output", (getter)Step_get_output, NULL, "0 off, 1 relay, 2 codec, 3 IDs, 4 text", NULL},
    {NULL},
};

static PyMethodDef Step_methods[] = {
    {"feed", (PyCFunction)Step_feed, METH_O, "One upstream read: bytes to write, or None."},
    {"relay", (PyCFunction)(void (*)(void))Step_relay, METH_VARARGS | METH_KEYWORDS,
     "Arm for pass-through."},
    {"codec", (PyCFunction)(void (*)(void))Step_codec, METH_VARARGS | METH_KEYWORDS,
     "Arm for Codec frames."},
    {"stop", (PyCFunction)Step_stop, METH_NOARGS, "Decline every read from now on."},
    {"fold", (PyCFunction)Step_fold, METH_NOARGS, "The counters since the last fold."},
    {NULL},
};

static PyTypeObject StepType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "proxy.core.steady._steady.Step",
    .tp_basicsize = sizeof(StepObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Step_init,
    .tp_dealloc = (destructor)Step_dealloc,
    .tp_methods = Step_methods,
    .tp_getset = Step_getset,
    .tp_doc = "One chunked response body's reads, from a chunk boundary on.",
};

static struct PyModuleDef steady_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_steady",
    .m_doc = "The native steady path (proxy/core/steady).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__steady(void) {
    if (PyType_Ready(&VocabType) < 0 || PyType_Ready(&StepType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&steady_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Vocab", (PyObject *)&VocabType) < 0 ||
        PyModule_AddObjectRef(m, "Step", (PyObject *)&StepType) < 0 ||
        PyModule_AddStringConstant(m, "SOURCE_HASH", STEADY_SOURCE_HASH) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
