/* Reading a request: the C Request directly, any other request value (a
 * kvspec Request, kvimpl's Python Request) through its attributes. */
#include "native.h"

int rv_check(PyObject *obj) {
    if (Req_Check(obj))
        return 1;
    int r = PyObject_IsInstance(obj, G_.spec_request_type);
    if (r != 0)
        return r;
    if (G_.py_request_type && G_.py_request_type != Py_None)
        return PyObject_IsInstance(obj, G_.py_request_type);
    return 0;
}

static int get_ssize(PyObject *obj, PyObject *name, Py_ssize_t *out) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (!v)
        return -1;
    Py_ssize_t x = PyLong_AsSsize_t(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    *out = x;
    return 0;
}

/* rv->inflight from a generic value's num_in_flight_tokens: -1 (the value
 * kept in inflight_obj for the caller's validation) unless an int >= 0 that fits. */
static int read_inflight(ReqView *rv, PyObject *obj) {
    PyObject *v = PyObject_GetAttr(obj, G_.s_num_in_flight_tokens);
    if (!v)
        return -1;
    rv->inflight = -1;
    if (PyLong_Check(v) && !PyBool_Check(v)) {
        Py_ssize_t x = PyLong_AsSsize_t(v);
        if (x == -1 && PyErr_Occurred())
            PyErr_Clear();
        else if (x >= 0)
            rv->inflight = x;
    }
    if (rv->inflight < 0)
        rv->inflight_obj = v;
    else
        Py_DECREF(v);
    return 0;
}

/* Fill rv from obj. The caller has checked rv_check(obj). A computed-token
 * count that is not an int (or does not fit) is left in computed_obj with
 * computed = -1, for the caller's validation to report. */
int rv_read(ReqView *rv, PyObject *obj, int need_hashes) {
    if (Req_Check(obj)) {
        ReqObject *r = (ReqObject *)obj;
        /* NOTE: no references are taken: the C Request owns its id and
         * status and outlives the call (the caller holds it), and skipping
         * the reference counts keeps the id string's memory untouched on
         * the hot paths (a cache miss per request in a 256-request step). */
        /* Every field is set here: a memset of the view (a `rep stos`) was
         * most of this function's time on the 256-request array step. */
        rv->obj = obj;
        rv->nat = r;
        rv->borrowed = 1;
        rv->rid = r->request_id;
        rv->computed = r->num_computed_tokens;
        rv->ntok = r->ntok;
        rv->npreempt = r->num_preemptions;
        rv->computed_obj = NULL;
        rv->inflight = r->num_in_flight_tokens < 0 ? -1 : r->num_in_flight_tokens;
        rv->inflight_obj = NULL;
        rv->status = r->status;
        rv->skip = r->skip_reading_prefix_cache;
        rv->hseq = NULL;
        rv->nhash = r->nhash;
        return 0;
    }
    memset(rv, 0, sizeof *rv);
    rv->obj = obj;
    rv->rid = PyObject_GetAttr(obj, G_.s_request_id);
    if (!rv->rid)
        return -1;
    if (!PyUnicode_Check(rv->rid)) {
        PyErr_Format(G_.InvalidRequestError, "expected a kvspec Request with a str request_id, got %R", obj);
        return -1;
    }
    rv->computed_obj = PyObject_GetAttr(obj, G_.s_num_computed_tokens);
    if (!rv->computed_obj)
        return -1;
    rv->computed = -1;
    if (PyLong_Check(rv->computed_obj) && !PyBool_Check(rv->computed_obj)) {
        Py_ssize_t x = PyLong_AsSsize_t(rv->computed_obj);
        if (x == -1 && PyErr_Occurred())
            PyErr_Clear();
        else
            rv->computed = x;
    }
    if (get_ssize(obj, G_.s_num_tokens, &rv->ntok) < 0)
        return -1;
    if (read_inflight(rv, obj) < 0)
        return -1;
    rv->status = PyObject_GetAttr(obj, G_.s_status);
    if (!rv->status)
        return -1;
    PyObject *skip = PyObject_GetAttr(obj, G_.s_skip_reading_prefix_cache);
    if (!skip)
        return -1;
    rv->skip = PyObject_IsTrue(skip);
    Py_DECREF(skip);
    if (rv->skip < 0)
        return -1;
    PyObject *np = PyObject_GetAttr(obj, G_.s_num_preemptions);
    if (!np)
        return -1;
    rv->npreempt = PyLong_Check(np) ? PyLong_AsSsize_t(np) : 0;
    Py_DECREF(np);
    if (rv->npreempt == -1 && PyErr_Occurred())
        PyErr_Clear();
    if (need_hashes) {
        PyObject *hs = PyObject_GetAttr(obj, G_.s_block_hashes);
        if (!hs)
            return -1;
        rv->hseq = PySequence_Fast(hs, "block_hashes must be a sequence of bytes");
        Py_DECREF(hs);
        if (!rv->hseq)
            return -1;
        rv->nhash = PySequence_Fast_GET_SIZE(rv->hseq);
    }
    return 0;
}

/* Make sure the hashes are readable (a generic value read without them). */
static int rv_need_hashes(ReqView *rv) {
    if (rv->nat || rv->hseq)
        return 0;
    PyObject *hs = PyObject_GetAttr(rv->obj, G_.s_block_hashes);
    if (!hs)
        return -1;
    rv->hseq = PySequence_Fast(hs, "block_hashes must be a sequence of bytes");
    Py_DECREF(hs);
    if (!rv->hseq)
        return -1;
    rv->nhash = PySequence_Fast_GET_SIZE(rv->hseq);
    return 0;
}

void rv_clear(ReqView *rv) {
    if (rv->borrowed) {
        rv->rid = rv->status = NULL;
        rv->borrowed = 0;
    }
    Py_CLEAR(rv->rid);
    Py_CLEAR(rv->computed_obj);
    Py_CLEAR(rv->inflight_obj);
    Py_CLEAR(rv->status);
    Py_CLEAR(rv->hseq);
}

const uint8_t *rv_hash(Core *c, ReqView *rv, Py_ssize_t i) {
    if (!rv->nat && !rv->hseq && rv_need_hashes(rv) < 0)
        return NULL;
    if (i < 0 || i >= rv->nhash) {
        PyErr_SetString(PyExc_IndexError, "block hash index out of range (the request has fewer hashes)");
        return NULL;
    }
    if (rv->nat) {
        if (rv->nat->dlen != c->dlen) {
            PyErr_Format(G_.InvalidRequestError, "request %R holds %d-byte hashes; this manager's hash function gives %d",
                         rv->rid, rv->nat->dlen, c->dlen);
            return NULL;
        }
        return rv->nat->hashes + i * c->dlen;
    }
    PyObject *h = PySequence_Fast_GET_ITEM(rv->hseq, i);
    if (!PyBytes_Check(h) || PyBytes_GET_SIZE(h) != c->dlen) {
        PyErr_Format(G_.InvalidRequestError, "block hash %zd of request %R is %R, expected %d bytes", i, rv->rid, h,
                     c->dlen);
        return NULL;
    }
    return (const uint8_t *)PyBytes_AS_STRING(h);
}

/* Whether every hash of the request has the core's digest length; -1 with
 * InvalidRequestError if not. Called before an operation that caches changes
 * anything, so that a request hashed under another hash function is refused
 * whole instead of after its blocks were allocated or partly cached. */
int rv_check_digests(Core *c, ReqView *rv) {
    if (rv->nat) {
        if (rv->nat->dlen == c->dlen)
            return 0;
        PyErr_Format(G_.InvalidRequestError, "request %R holds %d-byte hashes; this manager's hash function gives %d",
                     rv->rid, rv->nat->dlen, c->dlen);
        return -1;
    }
    if (!rv->hseq && rv_need_hashes(rv) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < rv->nhash; i++) {
        PyObject *h = PySequence_Fast_GET_ITEM(rv->hseq, i);
        if (!PyBytes_Check(h) || PyBytes_GET_SIZE(h) != c->dlen) {
            PyErr_Format(G_.InvalidRequestError, "block hash %zd of request %R is %R, expected %d bytes", i, rv->rid,
                         h, c->dlen);
            return -1;
        }
    }
    return 0;
}

/* Number of hashes (reading them for a generic value if needed); -1 on error. */
Py_ssize_t rv_num_hashes(ReqView *rv) {
    if (!rv->nat && !rv->hseq && rv_need_hashes(rv) < 0)
        return -1;
    return rv->nhash;
}
