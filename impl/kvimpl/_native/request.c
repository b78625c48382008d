/* Request: the request state a scheduler advances in place (vLLM's mutable
 * Request, reduced to what the KV-cache manager reads).
 *
 * Tokens are int64 (ids below 2**63); block hashes are kept as one byte
 * buffer of nhash digests and extended as blocks fill, never recomputed: the
 * hash of block j chains from block j-1's digest, which is at hand. Hashing
 * follows kvspec.hashing.extend_block_hashes call for call (one append is one
 * extension, so the multimodal cursor restarts per call as there). The core
 * reads the fields directly; Python sees tuples built on demand.
 */
#include "native.h"

#include <structmember.h>

static int grow(void **p, Py_ssize_t *cap, Py_ssize_t need, size_t elem) {
    if (need <= *cap)
        return 0;
    Py_ssize_t n = *cap ? *cap : 16;
    while (n < need)
        n *= 2;
    void *q = PyMem_Realloc(*p, (size_t)n * elem);
    if (!q) {
        PyErr_NoMemory();
        return -1;
    }
    *p = q;
    *cap = n;
    return 0;
}

/* Hash every block that became full (kvspec.hashing.extend_block_hashes). */
static int req_hash_new_blocks(ReqObject *r) {
    Py_ssize_t start = r->nhash * r->hbs;
    if (start + r->hbs > r->ntok)
        return 0;
    if (grow((void **)&r->hashes, &r->caphash, r->ntok / r->hbs, (size_t)r->dlen) < 0)
        return -1;
    Py_ssize_t cursor = (start == 0 || r->resume_first) ? 0 : -1;
    while (start + r->hbs <= r->ntok) {
        const uint8_t *parent = r->nhash ? r->hashes + (r->nhash - 1) * r->dlen : r->seed;
        uint8_t *out = r->hashes + r->nhash * r->dlen;
        if (r->pyhash == NULL) {
            sha256_cbor_block(parent, (size_t)r->dlen, r->tok + start, r->hbs, out);
        } else {
            PyObject *toks = PyTuple_New(r->hbs);
            if (!toks)
                return -1;
            for (Py_ssize_t i = 0; i < r->hbs; i++) {
                PyObject *v = PyLong_FromLongLong(r->tok[start + i]);
                if (!v) {
                    Py_DECREF(toks);
                    return -1;
                }
                PyTuple_SET_ITEM(toks, i, v);
            }
            PyObject *res = PyObject_CallFunction(r->pyhash, "y#Onnn", (const char *)parent, (Py_ssize_t)r->dlen,
                                                  toks, start, start + r->hbs, cursor);
            Py_DECREF(toks);
            if (!res)
                return -1;
            PyObject *digest = NULL, *cur = NULL;
            if (!PyArg_ParseTuple(res, "SO", &digest, &cur)) {
                Py_DECREF(res);
                return -1;
            }
            if (PyBytes_GET_SIZE(digest) != r->dlen) {
                Py_DECREF(res);
                PyErr_Format(PyExc_ValueError, "block hasher returned %zd bytes, expected %d",
                             PyBytes_GET_SIZE(digest), r->dlen);
                return -1;
            }
            memcpy(out, PyBytes_AS_STRING(digest), (size_t)r->dlen);
            cursor = PyLong_AsSsize_t(cur);
            Py_DECREF(res);
            if (cursor == -1 && PyErr_Occurred())
                return -1;
        }
        r->nhash++;
        start += r->hbs;
    }
    return 0;
}

int req_append(ReqObject *r, const int64_t *tokens, Py_ssize_t n) {
    if (grow((void **)&r->tok, &r->captok, r->ntok + n, sizeof(int64_t)) < 0)
        return -1;
    memcpy(r->tok + r->ntok, tokens, (size_t)n * sizeof(int64_t));
    r->ntok += n;
    Py_CLEAR(r->tokens_cache);
    Py_ssize_t before = r->nhash;
    if (req_hash_new_blocks(r) < 0)
        return -1;
    if (r->nhash != before)
        Py_CLEAR(r->hashes_cache);
    return 0;
}

/* A token id as int64: a non-negative int, not a bool (kvspec.request.valid_token_ids). */
static int token_value(ReqObject *r, PyObject *t, Py_ssize_t i, int64_t *out) {
    if (!PyLong_Check(t) || PyBool_Check(t)) {
        PyErr_Format(G_.InvalidRequestError, "request %R: token %zd is %R, not a non-negative int", r->request_id, i,
                     t);
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(t, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow < 0 || (overflow == 0 && v < 0)) {
        PyErr_Format(G_.InvalidRequestError, "request %R: token %zd is %R, not a non-negative int", r->request_id, i,
                     t);
        return -1;
    }
    if (overflow > 0) {
        PyErr_Format(G_.InvalidRequestError,
                     "request %R: token %zd is %R; a native request holds token ids below 2**63 "
                     "(use kvimpl.request.Request for larger ones)",
                     r->request_id, i, t);
        return -1;
    }
    *out = v;
    return 0;
}

/* Convert a token or a sequence of tokens; all are checked before any is appended. */
static int tokens_from(ReqObject *r, PyObject *arg, int64_t **buf, Py_ssize_t *n, int64_t *one) {
    if (PyLong_Check(arg) && !PyBool_Check(arg)) {
        if (token_value(r, arg, 0, one) < 0)
            return -1;
        *buf = one;
        *n = 1;
        return 0;
    }
    if (PyUnicode_Check(arg) || PyBytes_Check(arg)) {
        PyErr_Format(G_.InvalidRequestError, "request %R: token ids must be ints, got the string %R", r->request_id,
                     arg);
        return -1;
    }
    PyObject *seq = PySequence_Fast(arg, "token ids must be an int or a sequence of ints");
    if (!seq)
        return -1;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(seq);
    int64_t *b = m ? PyMem_Malloc((size_t)m * sizeof(int64_t)) : one;
    if (!b) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < m; i++) {
        if (token_value(r, items[i], i, &b[i]) < 0) {
            if (b != one)
                PyMem_Free(b);
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    *buf = b;
    *n = m;
    return 0;
}

static int Req_init(ReqObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"request_id", "prompt_token_ids", "hash_block_size", "seed_hash", "block_hasher",
                             "resume_from_first", "extra", "skip_reading_prefix_cache", NULL};
    PyObject *rid, *prompt, *pyhash, *extra;
    Py_buffer seed;
    int hbs, resume, skip;
    if (self->request_id != NULL) {
        PyErr_SetString(PyExc_TypeError, "a Request is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "UOiy*OpOp", kwlist, &rid, &prompt, &hbs, &seed, &pyhash, &resume,
                                     &extra, &skip))
        return -1;
    if (hbs < 1 || seed.len < 1 || seed.len > 32) {
        PyBuffer_Release(&seed);
        PyErr_SetString(PyExc_ValueError, "hash_block_size must be >= 1 and seed_hash 1..32 bytes");
        return -1;
    }
    Py_INCREF(rid);
    self->request_id = rid;
    self->hbs = hbs;
    self->dlen = (int)seed.len;
    memcpy(self->seed, seed.buf, (size_t)seed.len);
    PyBuffer_Release(&seed);
    if (pyhash != Py_None) {
        Py_INCREF(pyhash);
        self->pyhash = pyhash;
    }
    self->resume_first = resume;
    Py_INCREF(extra);
    self->extra = extra;
    self->skip_reading_prefix_cache = skip;
    Py_INCREF(G_.status_waiting);
    self->status = G_.status_waiting;
    int64_t one, *buf;
    Py_ssize_t n;
    if (tokens_from(self, prompt, &buf, &n, &one) < 0)
        return -1;
    int rc = req_append(self, buf, n);
    if (buf != &one)
        PyMem_Free(buf);
    self->num_prompt_tokens = n;
    return rc;
}

static void Req_dealloc(ReqObject *self) {
    Py_XDECREF(self->request_id);
    Py_XDECREF(self->pyhash);
    Py_XDECREF(self->status);
    Py_XDECREF(self->extra);
    Py_XDECREF(self->tokens_cache);
    Py_XDECREF(self->hashes_cache);
    PyMem_Free(self->tok);
    PyMem_Free(self->hashes);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Req_append(ReqObject *self, PyObject *arg) {
    int64_t one, *buf;
    Py_ssize_t n;
    if (tokens_from(self, arg, &buf, &n, &one) < 0)
        return NULL;
    int rc = req_append(self, buf, n);
    if (buf != &one)
        PyMem_Free(buf);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Req_get_tokens(ReqObject *self, void *closure) {
    if (!self->tokens_cache) {
        PyObject *t = PyTuple_New(self->ntok);
        if (!t)
            return NULL;
        for (Py_ssize_t i = 0; i < self->ntok; i++) {
            PyObject *v = PyLong_FromLongLong(self->tok[i]);
            if (!v) {
                Py_DECREF(t);
                return NULL;
            }
            PyTuple_SET_ITEM(t, i, v);
        }
        self->tokens_cache = t;
    }
    Py_INCREF(self->tokens_cache);
    return self->tokens_cache;
}

static PyObject *Req_get_hashes(ReqObject *self, void *closure) {
    if (!self->hashes_cache) {
        PyObject *t = PyTuple_New(self->nhash);
        if (!t)
            return NULL;
        for (Py_ssize_t i = 0; i < self->nhash; i++) {
            PyObject *v = PyBytes_FromStringAndSize((const char *)self->hashes + i * self->dlen, self->dlen);
            if (!v) {
                Py_DECREF(t);
                return NULL;
            }
            PyTuple_SET_ITEM(t, i, v);
        }
        self->hashes_cache = t;
    }
    Py_INCREF(self->hashes_cache);
    return self->hashes_cache;
}

static PyObject *Req_get_num_tokens(ReqObject *self, void *closure) { return PyLong_FromSsize_t(self->ntok); }

static PyObject *Req_get_rid(ReqObject *self, void *closure) {
    Py_INCREF(self->request_id);
    return self->request_id;
}

static PyObject *Req_get_extra(ReqObject *self, void *closure) {
    Py_INCREF(self->extra);
    return self->extra;
}

static PyObject *Req_get_prompt(ReqObject *self, void *closure) { return PyLong_FromSsize_t(self->num_prompt_tokens); }

static PyObject *Req_get_computed(ReqObject *self, void *closure) {
    return PyLong_FromSsize_t(self->num_computed_tokens);
}

/* A count attribute: an int (not a bool) that fits a C ssize_t. */
static int count_value(PyObject *v, const char *name, Py_ssize_t *out) {
    if (v == NULL) {
        PyErr_Format(PyExc_AttributeError, "%s cannot be deleted", name);
        return -1;
    }
    if (!PyLong_Check(v) || PyBool_Check(v)) {
        PyErr_Format(G_.InvalidTokenCountError, "%s must be an int, got %R", name, v);
        return -1;
    }
    Py_ssize_t x = PyLong_AsSsize_t(v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    *out = x;
    return 0;
}

static int Req_set_computed(ReqObject *self, PyObject *v, void *closure) {
    return count_value(v, "num_computed_tokens", &self->num_computed_tokens);
}

static PyObject *Req_get_preempt(ReqObject *self, void *closure) { return PyLong_FromSsize_t(self->num_preemptions); }

static int Req_set_preempt(ReqObject *self, PyObject *v, void *closure) {
    return count_value(v, "num_preemptions", &self->num_preemptions);
}

static PyObject *Req_get_inflight(ReqObject *self, void *closure) {
    return PyLong_FromSsize_t(self->num_in_flight_tokens);
}

static int Req_set_inflight(ReqObject *self, PyObject *v, void *closure) {
    return count_value(v, "num_in_flight_tokens", &self->num_in_flight_tokens);
}

static PyObject *Req_get_status(ReqObject *self, void *closure) {
    Py_INCREF(self->status);
    return self->status;
}

static int Req_set_status(ReqObject *self, PyObject *v, void *closure) {
    if (v == NULL || !PyObject_TypeCheck(v, (PyTypeObject *)G_.status_type)) {
        PyErr_Format(G_.InvalidRequestError, "status must be a kvspec RequestStatus, got %R", v);
        return -1;
    }
    Py_INCREF(v);
    Py_SETREF(self->status, v);
    return 0;
}

static PyObject *Req_get_skip(ReqObject *self, void *closure) { return PyBool_FromLong(self->skip_reading_prefix_cache); }

static int Req_set_skip(ReqObject *self, PyObject *v, void *closure) {
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "skip_reading_prefix_cache cannot be deleted");
        return -1;
    }
    int t = PyObject_IsTrue(v);
    if (t < 0)
        return -1;
    self->skip_reading_prefix_cache = t;
    return 0;
}

static PyObject *Req_repr(ReqObject *self) {
    return PyUnicode_FromFormat("<kvimpl native Request %R: %zd tokens (%zd prompt), %zd computed, %zd block hashes>",
                                self->request_id, self->ntok, self->num_prompt_tokens, self->num_computed_tokens,
                                self->nhash);
}

static PyGetSetDef Req_getset[] = {
    {"request_id", (getter)Req_get_rid, NULL, "The request id (a str).", NULL},
    {"all_token_ids", (getter)Req_get_tokens, NULL, "Prompt and output token ids (a tuple built on demand).", NULL},
    {"num_tokens", (getter)Req_get_num_tokens, NULL, "Prompt plus output tokens.", NULL},
    {"num_prompt_tokens", (getter)Req_get_prompt, NULL, "Prompt tokens.", NULL},
    {"block_hashes", (getter)Req_get_hashes, NULL, "The chained hash of every full block (a tuple of bytes).",
     NULL},
    {"num_computed_tokens", (getter)Req_get_computed, (setter)Req_set_computed, "Tokens computed so far.", NULL},
    {"num_preemptions", (getter)Req_get_preempt, (setter)Req_set_preempt, "Times the request was preempted.", NULL},
    {"num_in_flight_tokens", (getter)Req_get_inflight, (setter)Req_set_inflight,
     "Tokens scheduled in steps whose output is not processed yet.", NULL},
    {"status", (getter)Req_get_status, (setter)Req_set_status, "A kvspec.request.RequestStatus.", NULL},
    {"extra", (getter)Req_get_extra, NULL, "The extra-key sources (kvspec.hashing.ExtraKeySource).", NULL},
    {"skip_reading_prefix_cache", (getter)Req_get_skip, (setter)Req_set_skip, "Skip the prefix lookup.", NULL},
    {NULL},
};

static PyMethodDef Req_methods[] = {
    {"append_output_token_ids", (PyCFunction)Req_append, METH_O,
     "Append one token id or a sequence of them; hash the blocks that became full."},
    {NULL},
};

PyTypeObject Req_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvimpl._kvnative.Request",
    .tp_basicsize = sizeof(ReqObject),
    .tp_dealloc = (destructor)Req_dealloc,
    .tp_repr = (reprfunc)Req_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A mutable request whose block hashes are extended as tokens are appended (see kvimpl.request).",
    .tp_methods = Req_methods,
    .tp_getset = Req_getset,
    .tp_init = (initproc)Req_init,
    .tp_new = PyType_GenericNew,
};
