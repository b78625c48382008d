/* KV-cache events in the native core: raw records, built into kvspec events by Python.
 *
 * With events enabled (Core.events is a list) the core appends one record per
 * event, at the moment kvimpl's Python block pool appends its event, so the
 * order is the same:
 *   (0, group, stored, digests, parent, token_ids, block_size, extra): a
 *       cache_full_blocks call (kvimpl.block_pool._stored_event): stored is the
 *       tuple of stored block indices, digests their hashes (bytes), parent
 *       the parent's digest or None, token_ids the call's token range;
 *   (1, group, digest): one block's hash left the cache (BlockRemoved);
 *   (2,): reset_prefix_cache succeeded (AllBlocksCleared).
 * kvimpl.native_events turns them into events: external hashes, extra keys
 * per stored block, the group's kind and window. Everything a record needs
 * is copied when it is made (a request's later tokens cannot change it).
 */
#include "native.h"

/* Append rec (stolen) to the event list; on failure the event is lost, which
 * take_events reports (pool_evict cannot fail). */
static void ev_append(Core *c, PyObject *rec) {
    if (!rec || PyList_Append(c->events, rec) < 0) {
        PyErr_Clear();
        c->events_lost = 1;
    }
    Py_XDECREF(rec);
}

static PyObject *digest_bytes(Core *c, const uint8_t *d) {
    return PyBytes_FromStringAndSize((const char *)d, c->dlen);
}

static PyObject *token_range(ReqView *rv, Py_ssize_t a, Py_ssize_t b) {
    if (rv->nat) {
        ReqObject *r = rv->nat;
        Py_ssize_t hi = b < r->ntok ? b : r->ntok, lo = a < hi ? a : hi;
        PyObject *t = PyTuple_New(hi - lo);
        if (!t)
            return NULL;
        for (Py_ssize_t i = lo; i < hi; i++) {
            PyObject *v = PyLong_FromLongLong(r->tok[i]);
            if (!v) {
                Py_DECREF(t);
                return NULL;
            }
            PyTuple_SET_ITEM(t, i - lo, v);
        }
        return t;
    }
    PyObject *all = PyObject_GetAttr(rv->obj, G_.s_all_token_ids);
    if (!all)
        return NULL;
    PyObject *s = PySequence_GetSlice(all, a, b);
    Py_DECREF(all);
    if (!s)
        return NULL;
    PyObject *t = PySequence_Tuple(s);
    Py_DECREF(s);
    return t;
}

int ev_stored(Core *c, ReqView *rv, int g, const IVec *stored, Py_ssize_t num_cached, Py_ssize_t num_full,
              Py_ssize_t bs, Py_ssize_t k) {
    PyObject *idx = PyTuple_New(stored->n), *dig = PyTuple_New(stored->n), *parent = NULL, *toks = NULL,
             *extra = NULL, *rec = NULL;
    if (!idx || !dig)
        goto fail;
    for (Py_ssize_t j = 0; j < stored->n; j++) {
        Py_ssize_t i = stored->v[j];
        const uint8_t *d = rv_hash(c, rv, (i + 1) * k - 1);
        PyObject *pi = PyLong_FromSsize_t(i), *pd = d ? digest_bytes(c, d) : NULL;
        if (!pi || !pd) {
            Py_XDECREF(pi);
            Py_XDECREF(pd);
            goto fail;
        }
        PyTuple_SET_ITEM(idx, j, pi);
        PyTuple_SET_ITEM(dig, j, pd);
    }
    if (num_cached == 0) {
        Py_INCREF(Py_None);
        parent = Py_None;
    } else {
        const uint8_t *d = rv_hash(c, rv, num_cached * k - 1);
        if (!d || !(parent = digest_bytes(c, d)))
            goto fail;
    }
    if (!(toks = token_range(rv, num_cached * bs, num_full * bs)))
        goto fail;
    if (rv->nat) {
        extra = rv->nat->extra;
        Py_INCREF(extra);
    } else if (!(extra = PyObject_GetAttrString(rv->obj, "extra")))
        goto fail;
    rec = Py_BuildValue("(iiOOOOnO)", 0, g, idx, dig, parent, toks, bs, extra);
    if (!rec)
        goto fail;
    int rc = PyList_Append(c->events, rec);
    Py_DECREF(rec);
    Py_DECREF(idx);
    Py_DECREF(dig);
    Py_DECREF(parent);
    Py_DECREF(toks);
    Py_DECREF(extra);
    return rc;
fail:
    Py_XDECREF(idx);
    Py_XDECREF(dig);
    Py_XDECREF(parent);
    Py_XDECREF(toks);
    Py_XDECREF(extra);
    return -1;
}

void ev_removed(Core *c, int32_t b) {
    const uint8_t *key = c->keys + (size_t)b * c->KL;
    int dl = c->dlen;
    uint32_t gid = ((uint32_t)key[dl] << 24) | ((uint32_t)key[dl + 1] << 16) | ((uint32_t)key[dl + 2] << 8) | key[dl + 3];
    ev_append(c, Py_BuildValue("(iiy#)", 1, (int)gid, (const char *)key, (Py_ssize_t)dl));
}

int ev_cleared(Core *c) {
    PyObject *rec = Py_BuildValue("(i)", 2);
    if (!rec)
        return -1;
    int rc = PyList_Append(c->events, rec);
    Py_DECREF(rec);
    return rc;
}

/* _take_raw_events() -> the records since the last call (a list; empty when events are off). */
PyObject *ev_take(Core *c, PyObject *unused) {
    if (c->events_lost) {
        c->events_lost = 0;
        PyErr_SetString(PyExc_MemoryError, "take_events: events were lost (out of memory while recording)");
        return NULL;
    }
    if (!c->events)
        return PyList_New(0);
    PyObject *fresh = PyList_New(0);
    if (!fresh)
        return NULL;
    PyObject *out = c->events;
    c->events = fresh;
    return out;
}

/* _pending_raw_events() -> the records not yet taken (a copy), for the invariant checks. */
PyObject *ev_pending(Core *c, PyObject *unused) {
    return c->events ? PyList_GetSlice(c->events, 0, PyList_GET_SIZE(c->events)) : PyList_New(0);
}
