/* Core: the Python type over the native state (the facade methods of
 * kvimpl.kv_cache_manager.KVCacheManager, the batched step API and the array
 * API). Arguments are checked here in the spec's order and raise the
 * kvspec.errors class kvimpl raises, before anything changes.
 *
 * NOTE: one file of about 1,500 lines because it is one CPython type: every
 * method shares the static argument parsers, the interned names and the
 * result builders below, which a split would have to export through
 * native.h for no reader's benefit; the rules themselves live in core.c,
 * hit.c and pool.c.
 */
#include "native.h"

/* ------------------------------------------------------------ arguments */

static PyObject *S_alloc[12];
static const char *ALLOC_NAMES[12] = {
    "request", "num_new_tokens", "num_new_computed_tokens", "new_computed_blocks", "num_lookahead_tokens",
    "num_external_computed_tokens", "delay_cache_blocks", "num_encoder_tokens", "full_sequence_must_fit",
    "reserved_blocks", "has_scheduled_reqs", "skip_zeroing_group_ids"};

static int parse_args(const char *fname, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                      PyObject **names, int nparams, int nrequired, PyObject **out) {
    for (int i = 0; i < nparams; i++)
        out[i] = NULL;
    if (nargs > nparams) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d arguments (%zd given)", fname, nparams, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        out[i] = args[i];
    if (kwnames) {
        Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t j = 0; j < nk; j++) {
            PyObject *kw = PyTuple_GET_ITEM(kwnames, j);
            int idx = -1;
            for (int i = 0; i < nparams; i++)
                if (kw == names[i]) {
                    idx = i;
                    break;
                }
            if (idx < 0)
                for (int i = 0; i < nparams; i++)
                    if (PyUnicode_Compare(kw, names[i]) == 0) {
                        idx = i;
                        break;
                    }
            if (idx < 0) {
                PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument %R", fname, kw);
                return -1;
            }
            if (out[idx]) {
                PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument %R", fname, kw);
                return -1;
            }
            out[idx] = args[nargs + j];
        }
    }
    for (int i = 0; i < nrequired; i++)
        if (!out[i]) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument %R", fname, names[i]);
            return -1;
        }
    return 0;
}

/* A count: an int, not a bool; *ok = 0 when it is not one or is negative. */
static Py_ssize_t count_arg(PyObject *v, int *ok) {
    if (!v)
        return 0;
    if (!PyLong_Check(v) || PyBool_Check(v)) {
        *ok = 0;
        return -1;
    }
    Py_ssize_t x = PyLong_AsSsize_t(v);
    if (x == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        *ok = 0;
        return -1;
    }
    if (x < 0)
        *ok = 0;
    return x;
}

static int truth(PyObject *v, int dflt) { return v ? PyObject_IsTrue(v) : dflt; }

static int check_rid(const char *op, PyObject *rid) {
    if (!PyUnicode_Check(rid)) {
        PyErr_Format(G_.InvalidRequestError, "%s: request_id must be a str, got %R", op, rid);
        return -1;
    }
    return 0;
}

static int check_request(PyObject *obj) {
    int r = rv_check(obj);
    if (r < 0)
        return -1;
    if (!r) {
        PyErr_Format(G_.InvalidRequestError, "expected a kvspec or kvimpl Request with a str request_id, got %R", obj);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------ results */

static PyObject *ids_tuple(const int32_t *v, Py_ssize_t n) {
    PyObject *t = PyTuple_New(n);
    if (!t)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyLong_FromLong(v[i]);
        if (!x) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, x);
    }
    return t;
}

static PyObject *no_hits(Core *c) {
    static PyObject *cache[65];
    if (!cache[c->G]) {
        PyObject *t = PyTuple_New(c->G);
        if (!t)
            return NULL;
        for (int g = 0; g < c->G; g++) {
            PyObject *e = PyTuple_New(0);
            if (!e) {
                Py_DECREF(t);
                return NULL;
            }
            PyTuple_SET_ITEM(t, g, e);
        }
        cache[c->G] = t;
    }
    Py_INCREF(cache[c->G]);
    return cache[c->G];
}

/* The ids newly added to each group's table: table[starts[g]:]. */
static PyObject *new_ids_result(Core *c, Py_ssize_t slot, const Py_ssize_t *starts) {
    int any = 0;
    for (int g = 0; g < c->G; g++)
        if (slot_table(c, slot, g)->len > starts[g])
            any = 1;
    if (!any)
        return no_hits(c);
    PyObject *t = PyTuple_New(c->G);
    if (!t)
        return NULL;
    for (int g = 0; g < c->G; g++) {
        Table *tb = slot_table(c, slot, g);
        PyObject *e = ids_tuple(tb->b + starts[g], tb->len - starts[g]);
        if (!e) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, g, e);
    }
    return t;
}

static PyObject *groups_result(Core *c, IVec *per_group) {
    PyObject *t = PyTuple_New(c->G);
    if (!t)
        return NULL;
    for (int g = 0; g < c->G; g++) {
        PyObject *e = ids_tuple(per_group[g].v, per_group[g].n);
        if (!e) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, g, e);
    }
    return t;
}

/* ------------------------------------------------------------ hits */

typedef struct {
    Hits h[64];
    int32_t *buf;
} HitArgs;

static void hits_clear(HitArgs *ha) {
    PyMem_Free(ha->buf);
    ha->buf = NULL;
}

/* new_computed_blocks as int arrays; *any = some group is not empty. */
static int hits_parse(Core *c, PyObject *obj, HitArgs *ha, int *any) {
    ha->buf = NULL;
    *any = 0;
    PyObject *seq = PySequence_Fast(obj, "new_computed_blocks must be a sequence of block id sequences");
    if (!seq)
        return -1;
    Py_ssize_t ng = PySequence_Fast_GET_SIZE(seq);
    if (ng != c->G) {
        PyErr_Format(G_.GroupCountError, "allocate_slots: new_computed_blocks has %zd groups, config has %d", ng,
                     c->G);
        Py_DECREF(seq);
        return -1;
    }
    PyObject *groups[64];
    Py_ssize_t total = 0;
    for (int g = 0; g < c->G; g++) {
        groups[g] = PySequence_Fast(PySequence_Fast_GET_ITEM(seq, g), "a group's hits must be a sequence");
        if (!groups[g]) {
            for (int j = 0; j < g; j++)
                Py_DECREF(groups[j]);
            Py_DECREF(seq);
            return -1;
        }
        total += PySequence_Fast_GET_SIZE(groups[g]);
    }
    int rc = 0;
    ha->buf = PyMem_Malloc((size_t)(total + 1) * sizeof(int32_t));
    if (!ha->buf) {
        PyErr_NoMemory();
        rc = -1;
    }
    Py_ssize_t off = 0;
    for (int g = 0; g < c->G && rc == 0; g++) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(groups[g]);
        ha->h[g].ids = ha->buf + off;
        ha->h[g].n = n;
        if (n)
            *any = 1;
        PyObject **items = PySequence_Fast_ITEMS(groups[g]);
        for (Py_ssize_t i = 0; i < n; i++) {
            long v = PyLong_Check(items[i]) ? PyLong_AsLong(items[i]) : -1;
            if (v == -1 && PyErr_Occurred())
                PyErr_Clear();
            if (!PyLong_Check(items[i]) || v < 0 || v >= c->N) {
                PyErr_Format(G_.InvalidBlockIdError, "allocate_slots: hit block id %R is outside the pool", items[i]);
                rc = -1;
                break;
            }
            ha->buf[off + i] = (int32_t)v;
        }
        off += n;
    }
    for (int g = 0; g < c->G; g++)
        Py_DECREF(groups[g]);
    Py_DECREF(seq);
    if (rc < 0)
        hits_clear(ha);
    return rc;
}

static int slot_holds(Core *c, Py_ssize_t slot) {
    if (slot < 0)
        return 0;
    for (int g = 0; g < c->G; g++) {
        Table *t = slot_table(c, slot, g);
        if (t->ncached >= 0 || (t->present && t->len > 0))
            return 1;
    }
    return 0;
}

static int validate_hits(Core *c, ReqView *rv, HitArgs *ha, Py_ssize_t n_hit) {
    if (!c->caching) {
        PyErr_Format(G_.StaleHitError, "allocate_slots: prefix caching is off, so request %R can have no hit",
                     rv->rid);
        return -1;
    }
    for (int g = 0; g < c->G; g++) {
        if (!c->groups[g].full_type)
            continue;
        for (Py_ssize_t i = 0; i < ha->h[g].n; i++)
            if (ha->h[g].ids[i] == NULL_BLOCK) {
                PyErr_Format(G_.StaleHitError,
                             "allocate_slots: the null block in group %d's hit: a full-attention hit never contains "
                             "it",
                             g);
                return -1;
            }
    }
    for (int g = 0; g < c->G; g++) {
        Py_ssize_t bs = c->groups[g].bs, need = (n_hit + bs - 1) / bs;
        if (ha->h[g].n != need && !(c->lagging_hits && !c->groups[g].full_type && ha->h[g].n < need)) {
            PyErr_Format(G_.StaleHitError,
                         "allocate_slots: group %d's hit has %zd blocks, but %zd hit tokens take %zd (block size %zd): "
                         "get_computed_blocks never returns such a hit",
                         g, ha->h[g].n, n_hit, need, bs);
            return -1;
        }
    }
    Py_ssize_t nfine = rv_num_hashes(rv);
    if (nfine < 0)
        return -1;
    for (int g = 0; g < c->G; g++) {
        Group *gr = &c->groups[g];
        Py_ssize_t k = gr->bs % c->hbs == 0 ? gr->bs / c->hbs : 0;
        Py_ssize_t num_hashes = k ? nfine / k : 0;
        uint8_t gid[4] = {(uint8_t)(g >> 24), (uint8_t)(g >> 16), (uint8_t)(g >> 8), (uint8_t)g};
        for (Py_ssize_t i = 0; i < ha->h[g].n; i++) {
            int32_t b = ha->h[g].ids[i];
            if (b == NULL_BLOCK)
                continue;
            int stale = i >= num_hashes || !c->haskey[b];
            if (!stale) {
                const uint8_t *d = rv_hash(c, rv, (i + 1) * k - 1);
                if (!d)
                    return -1;
                const uint8_t *key = c->keys + (size_t)b * c->KL;
                stale = memcmp(key, d, (size_t)c->dlen) != 0 || memcmp(key + c->dlen, gid, 4) != 0;
            }
            if (stale) {
                PyErr_Format(G_.StaleHitError,
                             "allocate_slots: hit block %d (group %d, index %zd) is no longer cached for request %R; "
                             "it was evicted after get_computed_blocks",
                             (int)b, g, i, rv->rid);
                return -1;
            }
        }
    }
    return 0;
}

/* ------------------------------------------------------------ allocate_slots */

typedef struct {
    Py_ssize_t n_new, n_hit, n_look, n_ext, n_enc, reserved;
    int delay, fsmf, has_sched, has_hits;
    unsigned long long skip; /* skip_zeroing_group_ids as a mask */
} AllocArgs;

/* kvimpl's _validate_allocation, in its order; on success fills a and ha. ha->buf is
 * NULL on every failure (set first: a caller may hits_clear(ha) whatever the result). */
static int validate_allocation(Core *c, ReqView *rv, PyObject **v, AllocArgs *a, HitArgs *ha) {
    int ok = 1;
    ha->buf = NULL;
    a->skip = 0;
    if (v[11]) { /* checked (and refused) in Python, first, as kvimpl's manager does */
        PyObject *mask = PyObject_CallOneArg(c->skip_check, v[11]);
        if (!mask)
            return -1;
        a->skip = PyLong_AsUnsignedLongLongMask(mask);
        Py_DECREF(mask);
        if (PyErr_Occurred())
            return -1;
    }
    PyObject *vals[7] = {v[1], v[2], v[4], v[5], v[7], v[9], NULL};
    static const char *names[7] = {"num_new_tokens", "num_new_computed_tokens", "num_lookahead_tokens",
                                   "num_external_computed_tokens", "num_encoder_tokens", "reserved_blocks",
                                   "request.num_computed_tokens"};
    Py_ssize_t x[7];
    for (int i = 0; i < 6; i++) {
        int one = 1;
        x[i] = count_arg(vals[i], &one);
        if (!one) {
            PyErr_Format(G_.InvalidTokenCountError, "allocate_slots: %s is %R, not a non-negative int", names[i],
                         vals[i]);
            return -1;
        }
    }
    (void)ok;
    if (rv->computed < 0) {
        PyObject *shown = rv->computed_obj;
        if (shown)
            PyErr_Format(G_.InvalidTokenCountError, "allocate_slots: %s is %R, not a non-negative int", names[6],
                         shown);
        else
            PyErr_Format(G_.InvalidTokenCountError, "allocate_slots: %s is %zd, not a non-negative int", names[6],
                         rv->computed);
        return -1;
    }
    if (rv->inflight < 0) {
        if (rv->inflight_obj)
            PyErr_Format(G_.InvalidTokenCountError,
                         "allocate_slots: request.num_in_flight_tokens is %R, not a non-negative int", rv->inflight_obj);
        else
            PyErr_Format(G_.InvalidTokenCountError,
                         "allocate_slots: request.num_in_flight_tokens is %zd, not a non-negative int",
                         rv->nat ? rv->nat->num_in_flight_tokens : rv->inflight);
        return -1;
    }
    a->n_new = x[0];
    a->n_hit = x[1];
    a->n_look = x[2];
    a->n_ext = x[3];
    a->n_enc = x[4];
    a->reserved = x[5];
    if (!(a->n_new > 0 || a->n_ext > 0 || (c->adopt_hit && a->n_hit > 0))) {
        PyErr_SetString(G_.InvalidTokenCountError,
                        "num_new_tokens must be greater than 0 when there are no external computed tokens");
        return -1;
    }
    a->has_hits = 0;
    PyObject *hits = v[3];
    if (hits && hits != Py_None && hits_parse(c, hits, ha, &a->has_hits) < 0)
        return -1;
    Py_ssize_t total = rv->computed + a->n_hit + a->n_ext + a->n_new;
    if (total > c->max_len) {
        PyErr_Format(G_.ExceedsMaxModelLenError, "allocate_slots: request %R would reach %zd tokens > max_model_len %zd",
                     rv->rid, total, c->max_len);
        goto fail;
    }
    if (!a->has_hits && a->n_ext <= 0)
        goto done;
    Py_ssize_t slot = slot_find(c, rv->rid);
    if (slot == -2)
        goto fail;
    if (slot_holds(c, slot)) {
        PyErr_Format(G_.UnexpectedPrefixHitError,
                     "allocate_slots: request %R already holds blocks; prefix hits and external tokens are only "
                     "accepted on a request's first allocation",
                     rv->rid);
        goto fail;
    }
    if (a->has_hits && validate_hits(c, rv, ha, a->n_hit) < 0)
        goto fail;
done:
    a->delay = truth(v[6], 0);
    a->fsmf = truth(v[8], 0);
    a->has_sched = truth(v[10], 1);
    if (a->delay < 0 || a->fsmf < 0 || a->has_sched < 0)
        goto fail;
    /* the hashes caching will read, before anything changes (a batch too) */
    if (c->caching && !a->delay && rv_check_digests(c, rv) < 0)
        goto fail;
    return 0;
fail:
    hits_clear(ha);
    return -1;
}

static PyObject *do_allocate(Core *c, PyObject **v) {
    if (check_request(v[0]) < 0)
        return NULL;
    ReqView rv;
    if (rv_read(&rv, v[0], 0) < 0) {
        rv_clear(&rv);
        return NULL;
    }
    AllocArgs a;
    HitArgs ha;
    if (validate_allocation(c, &rv, v, &a, &ha) < 0) {
        rv_clear(&rv);
        return NULL;
    }
    Py_ssize_t starts[64], slot = -1;
    c->skip_mask = a.skip;
    int r = core_allocate(c, &rv, a.n_new, a.n_hit, a.has_hits ? ha.h : NULL, a.has_hits, a.n_look, a.n_ext, a.delay,
                          a.fsmf, a.reserved, a.has_sched, starts, &slot);
    c->skip_mask = 0;
    hits_clear(&ha);
    rv_clear(&rv);
    if (r < 0)
        return NULL;
    if (r == 0) {
        slot_release_if_empty(c, slot);
        Py_RETURN_NONE;
    }
    return new_ids_result(c, slot, starts);
}

static PyObject *Core_allocate_slots(Core *c, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *v[12];
    if (parse_args("allocate_slots", args, nargs, kwnames, S_alloc, 12, 2, v) < 0)
        return NULL;
    return do_allocate(c, v);
}

static PyObject *Core_allocate_slots_batch(Core *c, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static PyObject *names[3];
    if (!names[0]) {
        names[0] = PyUnicode_InternFromString("requests");
        names[1] = PyUnicode_InternFromString("num_new_tokens");
        names[2] = PyUnicode_InternFromString("num_lookahead_tokens");
    }
    PyObject *v[3];
    if (parse_args("allocate_slots_batch", args, nargs, kwnames, names, 3, 2, v) < 0)
        return NULL;
    PyObject *reqs = PySequence_Fast(v[0], "requests must be a sequence");
    if (!reqs)
        return NULL;
    PyObject *news = PySequence_Fast(v[1], "num_new_tokens must be a sequence");
    if (!news) {
        Py_DECREF(reqs);
        return NULL;
    }
    PyObject *ks = NULL, *out = NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(reqs);
    PyObject *one_k = v[2];
    if (one_k && !PyLong_Check(one_k) && PySequence_Check(one_k)) {
        ks = PySequence_Fast(one_k, "num_lookahead_tokens must be an int or a sequence of ints");
        if (!ks)
            goto end;
        one_k = NULL;
    }
    Py_ssize_t nk = ks ? PySequence_Fast_GET_SIZE(ks) : n;
    if (PySequence_Fast_GET_SIZE(news) != n || nk != n) {
        PyErr_Format(G_.InvalidTokenCountError,
                     "allocate_slots_batch: %zd requests but %zd num_new_tokens and %zd num_lookahead_tokens; pass "
                     "one count per request",
                     n, PySequence_Fast_GET_SIZE(news), nk);
        goto end;
    }
    /* Validate everything before changing anything (the checks allocate_slots makes). */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PySequence_Fast_GET_ITEM(reqs, i);
        if (check_request(r) < 0)
            goto end;
        ReqView rv;
        if (rv_read(&rv, r, 0) < 0) {
            rv_clear(&rv);
            goto end;
        }
        PyObject *args12[12] = {r, PySequence_Fast_GET_ITEM(news, i), NULL, NULL,
                                ks ? PySequence_Fast_GET_ITEM(ks, i) : one_k};
        AllocArgs a;
        HitArgs ha;
        int bad = validate_allocation(c, &rv, args12, &a, &ha);
        hits_clear(&ha);
        rv_clear(&rv);
        if (bad < 0)
            goto end;
    }
    out = PyList_New(n);
    if (!out)
        goto end;
    /* The sequential calls; their arguments passed the checks above. */
    for (Py_ssize_t i = 0; i < n; i++) {
        ReqView rv;
        PyObject *kobj = ks ? PySequence_Fast_GET_ITEM(ks, i) : one_k;
        Py_ssize_t nt = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(news, i));
        Py_ssize_t k = kobj ? PyLong_AsSsize_t(kobj) : 0;
        Py_ssize_t starts[64], slot = -1;
        PyObject *res = NULL;
        if (rv_read(&rv, PySequence_Fast_GET_ITEM(reqs, i), 0) == 0) {
            int r = core_allocate(c, &rv, nt, 0, NULL, 0, k, 0, 0, 0, 0, 1, starts, &slot);
            if (r == 0) {
                slot_release_if_empty(c, slot);
                res = Py_None;
                Py_INCREF(res);
            } else if (r > 0) {
                res = new_ids_result(c, slot, starts);
            }
        }
        rv_clear(&rv);
        if (!res) {
            Py_CLEAR(out);
            goto end;
        }
        PyList_SET_ITEM(out, i, res);
    }
end:
    Py_DECREF(reqs);
    Py_DECREF(news);
    Py_XDECREF(ks);
    return out;
}

/* ------------------------------------------------------------ lookups */

/* The longest hit of at most max_len tokens (-1: num_tokens - 1, the usual lookup). */
static PyObject *lookup(Core *c, PyObject *request, Py_ssize_t max_len) {
    if (check_request(request) < 0)
        return NULL;
    ReqView rv;
    if (rv_read(&rv, request, 1) < 0) {
        rv_clear(&rv);
        return NULL;
    }
    PyObject *res = NULL, *blocks = NULL;
    Py_ssize_t hit = 0;
    if (!c->caching || rv.skip) {
        blocks = no_hits(c);
    } else {
        IVec per[64];
        memset(per, 0, sizeof per);
        if (coord_find_hit(c, &rv, max_len < 0 ? rv.ntok - 1 : max_len, per, &hit) == 0)
            blocks = groups_result(c, per);
        for (int g = 0; g < c->G; g++)
            PyMem_Free(per[g].v);
        if (blocks && c->stats && c->stats != Py_None && c->stats_at_lookup) {
            PyObject *nt = PyLong_FromSsize_t(rv.ntok), *nh = PyLong_FromSsize_t(hit);
            PyObject *r = nt && nh ? PyObject_CallMethodObjArgs(c->stats, G_.s_record, nt, nh,
                                                                rv.npreempt > 0 ? Py_True : Py_False, NULL)
                                   : NULL;
            Py_XDECREF(nt);
            Py_XDECREF(nh);
            if (!r)
                Py_CLEAR(blocks);
            Py_XDECREF(r);
        }
    }
    if (blocks)
        res = Py_BuildValue("(Nn)", blocks, hit);
    rv_clear(&rv);
    return res;
}

static PyObject *Core_get_computed_blocks(Core *c, PyObject *request) { return lookup(c, request, -1); }

/* A lookup of a length the caller computed (a hit-length bound, a prompt-logprob limit). */
static PyObject *Core_lookup_bounded(Core *c, PyObject *args) {
    PyObject *request;
    Py_ssize_t max_len;
    if (!PyArg_ParseTuple(args, "On:lookup_bounded", &request, &max_len))
        return NULL;
    if (max_len < 0) {
        PyErr_Format(PyExc_ValueError, "lookup_bounded: a lookup of %zd tokens", max_len);
        return NULL;
    }
    return lookup(c, request, max_len);
}

/* ------------------------------------------------------------ freeing */

static PyObject *Core_free(Core *c, PyObject *rid) {
    if (check_rid("free", rid) < 0 || core_free(c, rid) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Core_free_batch(Core *c, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "request_ids must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++)
        if (check_rid("free_batch", PySequence_Fast_GET_ITEM(seq, i)) < 0) {
            Py_DECREF(seq);
            return NULL;
        }
    for (Py_ssize_t i = 0; i < n; i++)
        if (core_free(c, PySequence_Fast_GET_ITEM(seq, i)) < 0) {
            Py_DECREF(seq);
            return NULL;
        }
    Py_DECREF(seq);
    Py_RETURN_NONE;
}

static PyObject *Core_pop_blocks_for_free(Core *c, PyObject *rid) {
    if (check_rid("pop_blocks_for_free", rid) < 0)
        return NULL;
    Py_ssize_t slot = slot_find(c, rid);
    if (slot == -2)
        return NULL;
    IVec all = {0};
    IVec *one = &c->scratch;
    for (int g = 0; g < c->G && slot >= 0; g++) {
        if (core_forget_group(c, slot, g, one) < 0) {
            PyMem_Free(all.v);
            return NULL;
        }
        Py_ssize_t first = 0;
        if (c->pop_trims)
            while (first < one->n && one->v[first] == NULL_BLOCK)
                first++;
        for (Py_ssize_t i = first; i < one->n; i++)
            if (ivec_push(&all, one->v[i]) < 0) {
                PyMem_Free(all.v);
                return NULL;
            }
    }
    for (Py_ssize_t i = 0; i < all.n; i++)
        if (all.v[i] != NULL_BLOCK)
            c->pending[all.v[i]]++;
    if (slot >= 0)
        slot_release_if_empty(c, slot);
    PyObject *res = ids_tuple(all.v, all.n);
    PyMem_Free(all.v);
    return res;
}

/* Block ids from a sequence: ints inside the pool, else InvalidBlockIdError. */
static int block_ids(Core *c, const char *op, PyObject *arg, IVec *out) {
    out->n = 0;
    PyObject *seq = PySequence_Fast(arg, "block ids must be a sequence of ints");
    if (!seq)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (ivec_reserve(out, n) < 0) {
        Py_DECREF(seq);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PySequence_Fast_GET_ITEM(seq, i);
        long v = -1;
        if (PyLong_Check(x) && !PyBool_Check(x)) {
            v = PyLong_AsLong(x);
            if (v == -1 && PyErr_Occurred())
                PyErr_Clear();
        }
        if (!PyLong_Check(x) || PyBool_Check(x) || v < 0 || v >= c->N) {
            PyErr_Format(G_.InvalidBlockIdError, "%s: block id %R is outside 0..%d", op, x, (int)c->N - 1);
            Py_DECREF(seq);
            return -1;
        }
        out->v[out->n++] = (int32_t)v;
    }
    Py_DECREF(seq);
    return 0;
}

static PyObject *Core_free_blocks(Core *c, PyObject *arg) {
    IVec *ids = &c->scratch;
    if (block_ids(c, "free_blocks", arg, ids) < 0)
        return NULL;
    /* Each distinct block, first seen first, must be pending as often as given. */
    int32_t *mark = c->mark;
    for (Py_ssize_t i = 0; i < ids->n; i++)
        if (ids->v[i] != NULL_BLOCK)
            mark[ids->v[i]]++;
    int32_t bad = -1, badk = 0;
    for (Py_ssize_t i = 0; i < ids->n; i++) {
        int32_t b = ids->v[i];
        if (b == NULL_BLOCK || mark[b] == 0)
            continue;
        if (bad < 0 && c->pending[b] < mark[b]) {
            bad = b;
            badk = mark[b];
        }
        mark[b] = 0;
    }
    if (bad >= 0) {
        PyErr_Format(G_.DoubleFreeError,
                     "free_blocks: block %d is freed %d time(s) but pending %d time(s); it was freed more often "
                     "than popped",
                     (int)bad, (int)badk, (int)c->pending[bad]);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < ids->n; i++)
        if (ids->v[i] != NULL_BLOCK)
            c->pending[ids->v[i]]--;
    IVec copy = {0};
    if (ivec_reserve(&copy, ids->n) < 0)
        return NULL;
    memcpy(copy.v, ids->v, (size_t)ids->n * sizeof(int32_t));
    int rc = pool_free_blocks(c, copy.v, ids->n);
    PyMem_Free(copy.v);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Core_remove_skipped_blocks(Core *c, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static PyObject *names[3];
    if (!names[0]) {
        names[0] = PyUnicode_InternFromString("request_id");
        names[1] = PyUnicode_InternFromString("total_computed_tokens");
        names[2] = PyUnicode_InternFromString("num_prompt_tokens");
    }
    PyObject *v[3];
    if (parse_args("remove_skipped_blocks", args, nargs, kwnames, names, 3, 2, v) < 0)
        return NULL;
    if (check_rid("remove_skipped_blocks", v[0]) < 0)
        return NULL;
    int ok = 1;
    Py_ssize_t total = count_arg(v[1], &ok);
    if (!ok) {
        PyErr_Format(G_.InvalidTokenCountError, "remove_skipped_blocks: total_computed_tokens %R < 0", v[1]);
        return NULL;
    }
    Py_ssize_t slot = slot_find(c, v[0]);
    if (slot == -2)
        return NULL;
    if (slot >= 0) {
        if (coord_remove_skipped(c, slot, total) < 0 || host_row_sync(c, slot) < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static PyObject *Core_evict_blocks(Core *c, PyObject *arg) {
    PyObject *seq = PySequence_List(arg); /* any iterable, read once */
    if (!seq)
        return NULL;
    IVec *ids = &c->scratch;
    int rc = block_ids(c, "evict_blocks", seq, ids);
    Py_DECREF(seq);
    if (rc < 0)
        return NULL;
    ids_sort(ids->v, ids->n, cmp_i32);
    for (Py_ssize_t i = 0; i < ids->n; i++) {
        if (i > 0 && ids->v[i] == ids->v[i - 1])
            continue;
        if (c->haskey[ids->v[i]])
            pool_evict(c, ids->v[i]);
    }
    Py_RETURN_NONE;
}

static PyObject *Core_reset_prefix_cache(Core *c, PyObject *unused) {
    if (c->N - c->nfree != 1)
        Py_RETURN_FALSE;
    pool_reset_cache(c);
    if (c->events && ev_cleared(c) < 0)
        return NULL;
    if (c->stats && c->stats != Py_None && PyObject_SetAttrString(c->stats, "reset", Py_True) < 0)
        return NULL;
    Py_RETURN_TRUE;
}

/* ------------------------------------------------------------ queries */

static PyObject *Core_get_num_common_prefix_blocks(Core *c, PyObject *rid) {
    if (check_rid("get_num_common_prefix_blocks", rid) < 0)
        return NULL;
    Py_ssize_t slot = slot_find(c, rid);
    if (slot == -2)
        return NULL;
    int any = 0;
    for (int g = 0; g < c->G && slot >= 0; g++)
        if (table_len_pub(c, slot, g) > 0)
            any = 1;
    if (!any) {
        PyErr_Format(G_.UnknownRequestError, "get_num_common_prefix_blocks: request %R holds no blocks", rid);
        return NULL;
    }
    PyObject *t = PyTuple_New(c->G);
    if (!t)
        return NULL;
    for (int g = 0; g < c->G; g++) {
        Group *gr = &c->groups[g];
        Py_ssize_t n = 0;
        if (!c->common_zero && c->caching && gr->holders) {
            Table *tb = slot_table(c, slot, g);
            for (int32_t i = 0; tb->present && i < tb->len; i++) {
                int32_t b = tb->b[i];
                if (b == NULL_BLOCK) {
                    int all = 1;
                    for (Py_ssize_t s = 0; s < c->capslots && all; s++) {
                        if (!c->slot_rid[s])
                            continue;
                        Table *o = slot_table(c, s, g);
                        if (!o->present)
                            continue;
                        int has = 0;
                        for (int32_t j = 0; j < o->len && !has; j++)
                            has = o->b[j] == NULL_BLOCK;
                        all = has;
                    }
                    if (!all)
                        break;
                } else if (gr->holders[b] != gr->num_tables) {
                    break;
                }
                n++;
            }
        }
        PyTuple_SET_ITEM(t, g, PyLong_FromSsize_t(n));
    }
    return t;
}

static PyObject *Core_get_blocks(Core *c, PyObject *rid) {
    if (check_rid("get_blocks", rid) < 0)
        return NULL;
    Py_ssize_t slot = slot_find(c, rid);
    if (slot == -2)
        return NULL;
    PyObject *t = PyTuple_New(c->G);
    if (!t)
        return NULL;
    for (int g = 0; g < c->G; g++) {
        Table *tb = slot >= 0 ? slot_table(c, slot, g) : NULL;
        PyObject *e = tb && tb->present ? ids_tuple(tb->b, tb->len) : PyTuple_New(0);
        if (!e) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, g, e);
    }
    return t;
}

static PyObject *Core_cache_blocks(Core *c, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static PyObject *names[2];
    if (!names[0]) {
        names[0] = PyUnicode_InternFromString("request");
        names[1] = PyUnicode_InternFromString("num_computed_tokens");
    }
    PyObject *v[2];
    if (parse_args("cache_blocks", args, nargs, kwnames, names, 2, 2, v) < 0)
        return NULL;
    if (!c->caching)
        Py_RETURN_NONE;
    if (check_request(v[0]) < 0)
        return NULL;
    int ok = 1;
    Py_ssize_t n = count_arg(v[1], &ok);
    if (!ok) {
        PyErr_Format(G_.InvalidTokenCountError, "cache_blocks: num_computed_tokens %R, not an int >= 0", v[1]);
        return NULL;
    }
    ReqView rv;
    if (rv_read(&rv, v[0], 0) < 0) {
        rv_clear(&rv);
        return NULL;
    }
    PyObject *res = NULL;
    Py_ssize_t slot = slot_find(c, rv.rid);
    if (slot == -2)
        goto end;
    if (n > rv.ntok) {
        PyErr_Format(G_.CacheBeyondAllocationError, "cache_blocks: %zd tokens > the request's %zd", n, rv.ntok);
        goto end;
    }
    for (int g = 0; g < c->G; g++) {
        /* a Mamba group's speculative blocks hold no tokens (kvspec.config.speculative_blocks) */
        Py_ssize_t have = table_len_pub(c, slot, g) - (c->groups[g].kind == K_MAMBA ? c->groups[g].spec : 0);
        if (n / c->groups[g].bs > have) {
            PyErr_Format(G_.CacheBeyondAllocationError,
                         "cache_blocks: group %d holds %zd blocks for tokens, fewer than %zd full blocks to cache", g,
                         have, n / c->groups[g].bs);
            goto end;
        }
    }
    if (coord_cache(c, slot, &rv, n) < 0)
        goto end;
    if (slot >= 0) {
        Py_INCREF(v[0]);
        Py_XSETREF(c->slot_req[slot], v[0]);
    }
    res = Py_None;
    Py_INCREF(res);
end:
    rv_clear(&rv);
    return res;
}

static PyObject *Core_take_new_block_ids(Core *c, PyObject *unused) {
    PyObject *out = PyList_New(0);
    if (!out)
        return NULL;
    for (int g = 0; g < c->G; g++) {
        IVec *v = &c->groups[g].new_ids;
        for (Py_ssize_t i = 0; i < v->n; i++) {
            PyObject *x = PyLong_FromLong(v->v[i]);
            if (!x || PyList_Append(out, x) < 0) {
                Py_XDECREF(x);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(x);
        }
        v->n = 0;
    }
    return out;
}

/* list_new_block_ids(group, ids): append ids (block ids of the core's own
 * tables) to the group's fresh-block list, all or nothing: the native manager's
 * record_blocks_for_zeroing, whose rules run in Python. */
static PyObject *Core_list_new_block_ids(Core *c, PyObject *args) {
    int g;
    PyObject *ids;
    if (!PyArg_ParseTuple(args, "iO!:list_new_block_ids", &g, &PyList_Type, &ids))
        return NULL;
    if (g < 0 || g >= c->G) {
        PyErr_Format(PyExc_ValueError, "list_new_block_ids: no group %d", g);
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(ids);
    IVec *v = &c->groups[g].new_ids;
    for (Py_ssize_t i = 0; i < n; i++) {
        long b = PyLong_AsLong(PyList_GET_ITEM(ids, i));
        if (b == -1 && PyErr_Occurred())
            return NULL;
        if (b < 0 || b >= c->N) {
            PyErr_Format(PyExc_ValueError, "list_new_block_ids: no block %ld", b);
            return NULL;
        }
    }
    if (n == 0)
        Py_RETURN_NONE;
    if (ivec_reserve(v, v->n + n) < 0)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        v->v[v->n++] = (int32_t)PyLong_AsLong(PyList_GET_ITEM(ids, i));
    Py_RETURN_NONE;
}

static PyObject *Core_new_step_starts(Core *c, PyObject *unused) {
    keyset_clear(&c->step_keys, c->KL);
    Py_RETURN_NONE;
}

static PyObject *Core_get_num_free_blocks(Core *c, PyObject *unused) { return PyLong_FromLong(c->nfree); }

static PyObject *Core_get_usage(Core *c, void *closure) {
    if (c->N == 1)
        return PyFloat_FromDouble(0.0);
    return PyFloat_FromDouble(1.0 - (double)c->nfree / (double)(c->N - 1));
}

/* ------------------------------------------------------------ array API */

static int int32_buffer(PyObject *obj, Py_buffer *view, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    const char *f = view->format ? view->format : "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    int ok = view->itemsize == 4 && (strcmp(f, "i") == 0 || (strcmp(f, "l") == 0 && sizeof(long) == 4));
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s must be a contiguous int32 buffer (array('i'), numpy int32), got format %s",
                     what, view->format ? view->format : "B");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *Core_handle(Core *c, PyObject *rid) {
    if (check_rid("handle", rid) < 0)
        return NULL;
    Py_ssize_t slot = slot_find(c, rid);
    if (slot == -2)
        return NULL;
    if (slot < 0 || !c->slot_req[slot]) {
        PyErr_Format(G_.UnknownRequestError, "handle: request %R holds no blocks; allocate it first", rid);
        return NULL;
    }
    return PyLong_FromSsize_t(slot);
}

static int handle_slot(Core *c, int32_t h, Py_ssize_t i) {
    if (h < 0 || h >= c->capslots || !c->slot_rid[h] || !c->slot_req[h]) {
        PyErr_Format(G_.UnknownRequestError, "handle %d (position %zd) names no live request", (int)h, i);
        return -1;
    }
    return 0;
}

static PyObject *array_type;

static PyObject *int32_array(const int32_t *v, Py_ssize_t n) {
    PyObject *b = PyBytes_FromStringAndSize((const char *)v, n * (Py_ssize_t)sizeof(int32_t));
    if (!b)
        return NULL;
    PyObject *a = PyObject_CallFunction(array_type, "sO", "i", b);
    Py_DECREF(b);
    return a;
}

/* allocate_slots_array(handles, num_new_tokens, num_lookahead_tokens=0) ->
 * (counts, ids, first_unfitted): the sequential allocate_slots calls of a
 * running step; first_unfitted is the position of the first request that did
 * not fit (its counts are -1), or -1 when every request got its slots, so
 * that a scheduler's check of the step is one comparison. */
static PyObject *Core_allocate_slots_array(Core *c, PyObject *args) {
    PyObject *ho, *no;
    Py_ssize_t look = 0;
    if (!PyArg_ParseTuple(args, "OO|n", &ho, &no, &look))
        return NULL;
    Py_buffer hb, nb;
    if (int32_buffer(ho, &hb, "handles") < 0)
        return NULL;
    if (int32_buffer(no, &nb, "num_new_tokens") < 0) {
        PyBuffer_Release(&hb);
        return NULL;
    }
    PyObject *res = NULL;
    Py_ssize_t n = hb.len / 4;
    const int32_t *hs = hb.buf, *ns = nb.buf;
    IVec counts = {0}, ids = {0};
    if (nb.len / 4 != n) {
        PyErr_Format(G_.InvalidTokenCountError, "allocate_slots_array: %zd handles but %zd counts", n, nb.len / 4);
        goto end;
    }
    if (look < 0) {
        PyErr_Format(G_.InvalidTokenCountError, "allocate_slots_array: num_lookahead_tokens %zd < 0", look);
        goto end;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (handle_slot(c, hs[i], i) < 0)
            goto end;
        Py_ssize_t cpt, inflight;
        PyObject *req = c->slot_req[hs[i]];
        if (Req_Check(req)) {
            cpt = ((ReqObject *)req)->num_computed_tokens;
            inflight = ((ReqObject *)req)->num_in_flight_tokens;
        } else {
            ReqView rv;
            if (rv_read(&rv, req, 0) < 0) {
                rv_clear(&rv);
                goto end;
            }
            cpt = rv.computed;
            inflight = rv.inflight;
            rv_clear(&rv);
        }
        if (inflight < 0) {
            PyErr_Format(G_.InvalidTokenCountError,
                         "allocate_slots_array: position %zd: the request's num_in_flight_tokens is not an int >= 0", i);
            goto end;
        }
        if (ns[i] <= 0 || cpt < 0 || cpt + ns[i] > c->max_len) {
            PyErr_Format(G_.InvalidTokenCountError,
                         "allocate_slots_array: position %zd: %d new tokens after %zd computed (max_model_len %zd)", i,
                         (int)ns[i], cpt, c->max_len);
            goto end;
        }
    }
    if (ivec_reserve(&counts, n * c->G + 1) < 0)
        goto end;
    Py_ssize_t first_unfitted = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        ReqView rv;
        if (rv_read(&rv, c->slot_req[hs[i]], 0) < 0) {
            rv_clear(&rv);
            goto end;
        }
        Py_ssize_t starts[64], slot = hs[i];
        int r = core_allocate(c, &rv, ns[i], 0, NULL, 0, look, 0, 0, 0, 0, 1, starts, &slot);
        rv_clear(&rv);
        if (r < 0)
            goto end;
        if (r == 0 && first_unfitted < 0)
            first_unfitted = i;
        for (int g = 0; g < c->G; g++) {
            if (r == 0) {
                counts.v[counts.n++] = -1;
                continue;
            }
            Table *t = slot_table(c, slot, g);
            Py_ssize_t k = t->len - starts[g];
            counts.v[counts.n++] = (int32_t)k;
            if (k && ivec_reserve(&ids, ids.n + k) < 0)
                goto end;
            ids_copy(ids.v + ids.n, t->b + starts[g], k);
            ids.n += k;
        }
    }
    {
        PyObject *a = int32_array(counts.v, counts.n);
        PyObject *b = a ? int32_array(ids.v, ids.n) : NULL;
        PyObject *f = b ? PyLong_FromSsize_t(first_unfitted) : NULL;
        if (a && b && f)
            res = PyTuple_Pack(3, a, b, f);
        Py_XDECREF(a);
        Py_XDECREF(b);
        Py_XDECREF(f);
    }
end:
    PyMem_Free(counts.v);
    PyMem_Free(ids.v);
    PyBuffer_Release(&hb);
    PyBuffer_Release(&nb);
    return res;
}

/* advance_array(handles, num_new_tokens, tokens): per handle, computed tokens
 * += num_new_tokens[i] and, when tokens[i] >= 0, that token appended. */
static PyObject *Core_advance_array(Core *c, PyObject *args) {
    PyObject *ho, *no, *to;
    if (!PyArg_ParseTuple(args, "OOO", &ho, &no, &to))
        return NULL;
    Py_buffer hb, nb, tb;
    if (int32_buffer(ho, &hb, "handles") < 0)
        return NULL;
    if (int32_buffer(no, &nb, "num_new_tokens") < 0) {
        PyBuffer_Release(&hb);
        return NULL;
    }
    if (int32_buffer(to, &tb, "tokens") < 0) {
        PyBuffer_Release(&hb);
        PyBuffer_Release(&nb);
        return NULL;
    }
    PyObject *res = NULL;
    Py_ssize_t n = hb.len / 4;
    const int32_t *hs = hb.buf, *ns = nb.buf, *ts = tb.buf;
    if (nb.len / 4 != n || tb.len / 4 != n) {
        PyErr_Format(G_.InvalidTokenCountError, "advance_array: %zd handles, %zd counts, %zd tokens", n, nb.len / 4,
                     tb.len / 4);
        goto end;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (handle_slot(c, hs[i], i) < 0)
            goto end;
        if (!Req_Check(c->slot_req[hs[i]])) {
            PyErr_Format(PyExc_TypeError, "advance_array: handle %d holds a %s, not a native Request", (int)hs[i],
                         Py_TYPE(c->slot_req[hs[i]])->tp_name);
            goto end;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        ReqObject *r = (ReqObject *)c->slot_req[hs[i]];
        r->num_computed_tokens += ns[i];
        if (ts[i] >= 0) {
            int64_t t = ts[i];
            if (req_append(r, &t, 1) < 0)
                goto end;
        }
    }
    res = Py_None;
    Py_INCREF(res);
end:
    PyBuffer_Release(&hb);
    PyBuffer_Release(&nb);
    PyBuffer_Release(&tb);
    return res;
}

/* ------------------------------------------------------------ raw state (views, invariants) */

static PyObject *Core_free_order(Core *c, PyObject *unused) {
    PyObject *out = PyList_New(0);
    if (!out)
        return NULL;
    int32_t S = c->N, guard = 0;
    for (int32_t b = c->nxt[S]; b != S && guard <= c->N; b = c->nxt[b], guard++) {
        PyObject *x = PyLong_FromLong(b);
        if (!x || PyList_Append(out, x) < 0) {
            Py_XDECREF(x);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(x);
    }
    return out;
}

static PyObject *Core_free_links(Core *c, PyObject *unused) {
    /* (nxt, prv) as int32 arrays, for the ring check. */
    PyObject *a = int32_array(c->nxt, (Py_ssize_t)c->N + 1);
    PyObject *b = a ? int32_array(c->prv, (Py_ssize_t)c->N + 1) : NULL;
    PyObject *r = a && b ? Py_BuildValue("(OOi)", a, b, c->nfree) : NULL;
    Py_XDECREF(a);
    Py_XDECREF(b);
    return r;
}

static PyObject *Core_ref_counts(Core *c, PyObject *unused) { return int32_array(c->ref, c->N); }

static PyObject *Core_pending_counts(Core *c, PyObject *unused) { return int32_array(c->pending, c->N); }

static PyObject *Core_block_keys(Core *c, PyObject *unused) {
    /* Per block its key (bytes) or None. */
    PyObject *out = PyList_New(c->N);
    if (!out)
        return NULL;
    for (int32_t b = 0; b < c->N; b++) {
        PyObject *k = c->haskey[b] ? PyBytes_FromStringAndSize((const char *)c->keys + (size_t)b * c->KL, c->KL)
                                   : (Py_INCREF(Py_None), Py_None);
        if (!k) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, b, k);
    }
    return out;
}

static PyObject *Core_cached(Core *c, PyObject *unused) {
    /* The cache map: [(key, (ids oldest first)), ...] in map order. */
    PyObject *out = PyList_New(0);
    if (!out)
        return NULL;
    for (size_t i = 0; i < c->mapcap; i++) {
        MapEntry *e = &c->map[i];
        if (e->head < 0)
            continue;
        IVec ids = {0};
        for (int32_t b = e->head; b >= 0; b = c->knext[b])
            if (ivec_push(&ids, b) < 0) {
                Py_DECREF(out);
                return NULL;
            }
        PyObject *key = PyBytes_FromStringAndSize((const char *)c->keys + (size_t)e->head * c->KL, c->KL);
        PyObject *t = ids_tuple(ids.v, ids.n);
        PyMem_Free(ids.v);
        PyObject *pair = key && t ? PyTuple_Pack(2, key, t) : NULL;
        Py_XDECREF(key);
        Py_XDECREF(t);
        if (!pair || PyList_Append(out, pair) < 0) {
            Py_XDECREF(pair);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(pair);
    }
    return out;
}

static PyObject *Core_tables(Core *c, PyObject *unused) {
    /* Per live slot: (request id, latest value or None, [(present, ids, num_cached or -1,
     * allocated, last_state) per group]). */
    PyObject *out = PyList_New(0);
    if (!out)
        return NULL;
    for (Py_ssize_t s = 0; s < c->capslots; s++) {
        if (!c->slot_rid[s])
            continue;
        PyObject *groups = PyList_New(c->G);
        if (!groups) {
            Py_DECREF(out);
            return NULL;
        }
        for (int g = 0; g < c->G; g++) {
            Table *t = slot_table(c, s, g);
            PyObject *ids = ids_tuple(t->b, t->present ? t->len : 0);
            PyObject *e = ids ? Py_BuildValue("(ONiii)", t->present ? Py_True : Py_False, ids, (int)t->ncached,
                                              (int)t->allocated, (int)t->last_state)
                              : NULL;
            if (!e) {
                Py_DECREF(groups);
                Py_DECREF(out);
                return NULL;
            }
            PyList_SET_ITEM(groups, g, e);
        }
        PyObject *req = c->slot_req[s] ? c->slot_req[s] : Py_None;
        PyObject *row = Py_BuildValue("(OON)", c->slot_rid[s], req, groups);
        if (!row || PyList_Append(out, row) < 0) {
            Py_XDECREF(row);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(row);
    }
    return out;
}

static PyObject *Core_group_state(Core *c, PyObject *arg) {
    /* (num_tables, holders array or None, sink blocks) of a group. */
    long g = PyLong_AsLong(arg);
    if (g == -1 && PyErr_Occurred())
        return NULL;
    if (g < 0 || g >= c->G) {
        PyErr_SetString(PyExc_IndexError, "no such group");
        return NULL;
    }
    Group *gr = &c->groups[g];
    PyObject *h = gr->holders ? int32_array(gr->holders, c->N) : (Py_INCREF(Py_None), Py_None);
    PyObject *sink = h ? ids_tuple(gr->sink.v, gr->sink.n) : NULL;
    PyObject *r = h && sink ? Py_BuildValue("(nOO)", gr->num_tables, h, sink) : NULL;
    Py_XDECREF(h);
    Py_XDECREF(sink);
    return r;
}

static PyObject *Core_step_keys(Core *c, PyObject *unused) {
    PyObject *out = PySet_New(NULL);
    if (!out)
        return NULL;
    for (size_t j = 0; j < c->step_keys.count; j++) {
        size_t i = (size_t)c->step_keys.list[j];
        PyObject *k = PyBytes_FromStringAndSize((const char *)c->step_keys.keys + i * c->KL, c->KL);
        if (!k || PySet_Add(out, k) < 0) {
            Py_XDECREF(k);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(k);
    }
    return out;
}

static PyObject *Core_get_stats(Core *c, void *closure) {
    PyObject *s = c->stats ? c->stats : Py_None;
    Py_INCREF(s);
    return s;
}

static int Core_set_stats(Core *c, PyObject *v, void *closure) {
    Py_XINCREF(v);
    Py_XSETREF(c->stats, v);
    return 0;
}

static PyObject *Core_num_groups(Core *c, void *closure) { return PyLong_FromLong(c->G); }
static PyObject *Core_first_lookup_tokens(Core *c, void *closure) {
    return PyLong_FromSsize_t(c->first_lookup_tokens);
}

/* ------------------------------------------------------------ type */

static int group_from(Core *c, int g, PyObject *t) {
    Group *gr = &c->groups[g];
    int kind, bs, window, chunk, mode, spec, records_new, use_eagle, estimate_capped, sink, retired_mark, retained;
    Py_ssize_t cap, skip_slack;
    if (!PyArg_ParseTuple(t, "iiiiiiiinniiii", &kind, &bs, &window, &chunk, &mode, &spec, &records_new, &use_eagle,
                          &cap, &skip_slack, &estimate_capped, &sink, &retired_mark, &retained))
        return -1;
    if (kind < K_FULL || kind > K_MAMBA || bs < 1 || retained < 0) {
        PyErr_SetString(PyExc_ValueError, "bad group parameters");
        return -1;
    }
    gr->kind = kind;
    gr->bs = bs;
    gr->window = window;
    gr->retained = retained;
    gr->chunk = chunk;
    gr->mode = mode;
    gr->spec = spec;
    gr->records_new = records_new;
    gr->use_eagle = use_eagle;
    gr->cap = cap;
    gr->skip_slack = skip_slack;
    gr->estimate_capped = estimate_capped;
    gr->retired_mark = kind == K_MAMBA && mode == M_ALIGN && retired_mark;
    gr->full_type = kind == K_FULL || kind == K_MLA || kind == K_SINK;
    gr->skipping = kind == K_SWA || kind == K_CHUNKED || kind == K_MAMBA;
    if (gr->full_type) {
        gr->holders = PyMem_Calloc((size_t)c->N, sizeof(int32_t));
        if (!gr->holders) {
            PyErr_NoMemory();
            return -1;
        }
    }
    /* take_sink_blocks: permanently off the head of the free queue. */
    Py_ssize_t take = sink < c->nfree ? sink : c->nfree;
    for (Py_ssize_t i = 0; i < take; i++) {
        int32_t b = c->nxt[c->N];
        fq_remove(c, b);
        if (ivec_push(&gr->sink, b) < 0)
            return -1;
    }
    return 0;
}

static long dict_int(PyObject *d, const char *key, int *err) {
    PyObject *v = PyDict_GetItemString(d, key);
    if (!v) {
        PyErr_Format(PyExc_KeyError, "native core parameter %s is missing", key);
        *err = 1;
        return 0;
    }
    long x = PyLong_AsLong(v);
    if (x == -1 && PyErr_Occurred())
        *err = 1;
    return x;
}

static int Core_init(Core *c, PyObject *args, PyObject *kwds) {
    PyObject *p;
    if (!PyArg_ParseTuple(args, "O!", &PyDict_Type, &p))
        return -1;
    if (c->groups) {
        PyErr_SetString(PyExc_TypeError, "a native core is initialised once");
        return -1;
    }
    if (!G_.ready) {
        PyErr_SetString(PyExc_RuntimeError, "kvimpl._kvnative.setup() was not called (import kvimpl.native)");
        return -1;
    }
    int err = 0;
    c->N = (int32_t)dict_int(p, "num_blocks", &err);
    c->max_len = dict_int(p, "max_model_len", &err);
    c->watermark = dict_int(p, "watermark_blocks", &err);
    c->hbs = (int)dict_int(p, "hash_block_size", &err);
    c->sched = (int)dict_int(p, "scheduler_block_size", &err);
    c->dlen = (int)dict_int(p, "digest_len", &err);
    c->caching = (int)dict_int(p, "enable_caching", &err);
    c->coord = (int)dict_int(p, "coordinator", &err);
    c->unhashed_first = (int)dict_int(p, "unhashed_first", &err);
    c->pop_trims = (int)dict_int(p, "pop_trims_nulls", &err);
    c->common_zero = (int)dict_int(p, "common_prefix_zero", &err);
    c->adopt_hit = (int)dict_int(p, "adopt_hit_without_new_tokens", &err);
    c->mamba_counts = (int)dict_int(p, "mamba_eagle_counts_verified", &err);
    c->hashed_cap = (int)dict_int(p, "eagle_margin_hashed_cap", &err);
    c->lagging_hits = (int)dict_int(p, "lagging_hits", &err); /* lists a connector's lookup returns */
    c->skip_check = PyDict_GetItemString(p, "skip_zeroing_check");
    if (!c->skip_check || !PyCallable_Check(c->skip_check)) {
        PyErr_SetString(PyExc_ValueError, "native core parameters: skip_zeroing_check is not callable");
        return -1;
    }
    Py_INCREF(c->skip_check);
    c->stats_at_lookup = (int)dict_int(p, "stats_at_lookup", &err);
    c->inflight_basis = (int)dict_int(p, "skip_on_processed_tokens", &err);
    c->reprefillable = dict_int(p, "num_reprefillable_tokens", &err);
    c->cache_hashed_only = (int)dict_int(p, "cache_hashed_only", &err);
    int events = (int)dict_int(p, "enable_kv_cache_events", &err);
    if (err)
        return -1;
    if (c->N < 1 || c->dlen < 1 || c->dlen > 32 || c->hbs < 1 || c->sched < 1) {
        PyErr_SetString(PyExc_ValueError, "bad native core parameters");
        return -1;
    }
    c->KL = c->dlen + 4;
    c->slot_of = PyDict_New();
    if (events && !(c->events = PyList_New(0)))
        return -1;
    if (!c->slot_of || pool_init(c) < 0)
        return -1;
    PyObject *groups = PyDict_GetItemString(p, "groups");
    PyObject *sgs = PyDict_GetItemString(p, "spec_groups");
    if (!groups || !PyList_Check(groups) || !sgs || !PyList_Check(sgs)) {
        PyErr_SetString(PyExc_ValueError, "groups and spec_groups must be lists");
        return -1;
    }
    c->G = (int)PyList_GET_SIZE(groups);
    if (c->G < 1 || c->G > 64) {
        PyErr_SetString(PyExc_ValueError, "the native core takes 1 to 64 groups");
        return -1;
    }
    c->groups = PyMem_Calloc((size_t)c->G, sizeof(Group));
    if (!c->groups) {
        PyErr_NoMemory();
        return -1;
    }
    for (int g = 0; g < c->G; g++) {
        if (group_from(c, g, PyList_GET_ITEM(groups, g)) < 0)
            return -1;
        if (c->groups[g].kind == K_MAMBA)
            c->has_mamba = 1;
        if (c->groups[g].skipping)
            c->has_skipping = 1;
    }
    c->nsg = (int)PyList_GET_SIZE(sgs);
    if (c->nsg > 64) {
        PyErr_SetString(PyExc_ValueError, "too many spec groups");
        return -1;
    }
    c->sgs = PyMem_Calloc((size_t)c->nsg + 1, sizeof(SpecGroup));
    if (!c->sgs) {
        PyErr_NoMemory();
        return -1;
    }
    for (int i = 0; i < c->nsg; i++) {
        PyObject *gids;
        SpecGroup *sg = &c->sgs[i];
        if (!PyArg_ParseTuple(PyList_GET_ITEM(sgs, i), "iOi", &sg->rep, &gids, &sg->use_eagle))
            return -1;
        PyObject *seq = PySequence_Fast(gids, "spec group ids");
        if (!seq)
            return -1;
        sg->nids = (int)PySequence_Fast_GET_SIZE(seq);
        sg->gids = PyMem_Calloc((size_t)sg->nids + 1, sizeof(int));
        if (!sg->gids) {
            Py_DECREF(seq);
            PyErr_NoMemory();
            return -1;
        }
        for (int j = 0; j < sg->nids; j++)
            sg->gids[j] = (int)PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, j));
        Py_DECREF(seq);
        if (sg->rep < 0 || sg->rep >= c->G || sg->nids < 1) {
            PyErr_SetString(PyExc_ValueError, "bad spec group");
            return -1;
        }
    }
    c->sg_simple = c->nsg == 2 && c->groups[c->sgs[0].rep].full_type;
    c->mark = PyMem_Calloc((size_t)c->N, sizeof(int32_t));
    if (!c->mark) {
        PyErr_NoMemory();
        return -1;
    }
    Py_INCREF(Py_None);
    c->stats = Py_None;
    return 0;
}

static void Core_dealloc(Core *c) {
    if (c->weakreflist)
        PyObject_ClearWeakRefs((PyObject *)c);
    for (Py_ssize_t s = 0; s < c->capslots; s++) {
        Py_XDECREF(c->slot_rid[s]);
        Py_XDECREF(c->slot_req[s]);
        Py_XDECREF(c->slot_num[s]);
        for (int g = 0; g < c->G; g++)
            PyMem_Free(c->tables[s * c->G + g].b);
    }
    PyMem_Free(c->slot_rid);
    PyMem_Free(c->slot_req);
    PyMem_Free(c->slot_num);
    PyMem_Free(c->slot_row);
    PyMem_Free(c->tables);
    PyMem_Free(c->free_slots.v);
    for (int g = 0; c->groups && g < c->G; g++) {
        PyMem_Free(c->groups[g].holders);
        PyMem_Free(c->groups[g].new_ids.v);
        PyMem_Free(c->groups[g].sink.v);
    }
    PyMem_Free(c->groups);
    for (int i = 0; c->sgs && i < c->nsg; i++)
        PyMem_Free(c->sgs[i].gids);
    PyMem_Free(c->sgs);
    pool_free_mem(c);
    keyset_free(&c->step_keys);
    PyMem_Free(c->mark);
    Py_XDECREF(c->host_grow);
    Py_XDECREF(c->host_fence);
    PyMem_Free(c->row_slot.v);
    PyMem_Free(c->host_holes.v);
    PyMem_Free(c->scratch.v);
    PyMem_Free(c->scratch2.v);
    PyMem_Free(c->pool_tmp.v);
    Py_XDECREF(c->host_owner);
    Py_XDECREF(c->stats);
    Py_XDECREF(c->slot_of);
    Py_XDECREF(c->events);
    Py_XDECREF(c->skip_check);
    PyMem_Free(c->ev_stored_idx.v);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

PyObject *host_methods_bind(Core *c, PyObject *args); /* hosttab.c */
PyObject *host_methods_rows(Core *c, PyObject *unused);
PyObject *host_methods_rows_of(Core *c, PyObject *arg);
PyObject *host_methods_state(Core *c, PyObject *unused);
PyObject *host_methods_commit(Core *c, PyObject *unused);
PyObject *host_methods_in_flight(Core *c, PyObject *unused);

static PyMethodDef Core_methods[] = {
    {"get_computed_blocks", (PyCFunction)Core_get_computed_blocks, METH_O, "The longest prefix-cache hit."},
    {"lookup_bounded", (PyCFunction)Core_lookup_bounded, METH_VARARGS,
     "The longest prefix-cache hit of at most the given number of tokens."},
    {"allocate_slots", (PyCFunction)(void (*)(void))Core_allocate_slots, METH_FASTCALL | METH_KEYWORDS,
     "Slots for the request's new tokens; the new blocks per group, or None."},
    {"allocate_slots_batch", (PyCFunction)(void (*)(void))Core_allocate_slots_batch, METH_FASTCALL | METH_KEYWORDS,
     "One scheduler step for running requests: the sequential allocate_slots calls, validated first."},
    {"free", (PyCFunction)Core_free, METH_O, "Free the request's blocks."},
    {"free_batch", (PyCFunction)Core_free_batch, METH_O, "free for each id, in order (all ids checked first)."},
    {"pop_blocks_for_free", (PyCFunction)Core_pop_blocks_for_free, METH_O, "Forget the request; its blocks pend."},
    {"free_blocks", (PyCFunction)Core_free_blocks, METH_O, "The deferred free of popped blocks."},
    {"remove_skipped_blocks", (PyCFunction)(void (*)(void))Core_remove_skipped_blocks, METH_FASTCALL | METH_KEYWORDS,
     "Free the blocks attention no longer reads."},
    {"evict_blocks", (PyCFunction)Core_evict_blocks, METH_O, "Drop blocks from the prefix cache."},
    {"reset_prefix_cache", (PyCFunction)Core_reset_prefix_cache, METH_NOARGS, "Forget every hash if nothing is used."},
    {"get_num_common_prefix_blocks", (PyCFunction)Core_get_num_common_prefix_blocks, METH_O,
     "Per group, leading blocks every table holds."},
    {"get_blocks", (PyCFunction)Core_get_blocks, METH_O, "The request's tables per group."},
    {"get_block_ids", (PyCFunction)Core_get_blocks, METH_O, "Same as get_blocks."},
    {"cache_blocks", (PyCFunction)(void (*)(void))Core_cache_blocks, METH_FASTCALL | METH_KEYWORDS,
     "Hash full blocks up to num_computed_tokens."},
    {"take_new_block_ids", (PyCFunction)Core_take_new_block_ids, METH_NOARGS, "Drain the fresh block ids."},
    {"list_new_block_ids", (PyCFunction)Core_list_new_block_ids, METH_VARARGS,
     "Append block ids to a group's fresh-block list."},
    {"new_step_starts", (PyCFunction)Core_new_step_starts, METH_NOARGS, "A scheduler step begins."},
    {"get_num_free_blocks", (PyCFunction)Core_get_num_free_blocks, METH_NOARGS, "Free blocks."},
    {"handle", (PyCFunction)Core_handle, METH_O, "The array-API handle of a request holding blocks."},
    {"allocate_slots_array", (PyCFunction)Core_allocate_slots_array, METH_VARARGS,
     "allocate_slots_array(handles, num_new_tokens, num_lookahead_tokens=0) -> (counts, ids, first_unfitted): "
     "counts and ids as array('i'); first_unfitted the position of the first request that did not fit, or -1."},
    {"advance_array", (PyCFunction)Core_advance_array, METH_VARARGS,
     "advance_array(handles, num_new_tokens, tokens): advance native requests (token -1: none)."},
    {"_take_raw_events", (PyCFunction)ev_take, METH_NOARGS, "Drain the raw event records (kvimpl.native_events)."},
    {"_pending_raw_events", (PyCFunction)ev_pending, METH_NOARGS, NULL},
    {"_free_order", (PyCFunction)Core_free_order, METH_NOARGS, NULL},
    {"_free_links", (PyCFunction)Core_free_links, METH_NOARGS, NULL},
    {"_ref_counts", (PyCFunction)Core_ref_counts, METH_NOARGS, NULL},
    {"_pending_counts", (PyCFunction)Core_pending_counts, METH_NOARGS, NULL},
    {"_block_keys", (PyCFunction)Core_block_keys, METH_NOARGS, NULL},
    {"_cached", (PyCFunction)Core_cached, METH_NOARGS, NULL},
    {"_tables", (PyCFunction)Core_tables, METH_NOARGS, NULL},
    {"_group_state", (PyCFunction)Core_group_state, METH_O, NULL},
    {"_step_keys", (PyCFunction)Core_step_keys, METH_NOARGS, NULL},
    {"_bind_host_tables", (PyCFunction)host_methods_bind, METH_VARARGS, NULL},
    {"_host_rows", (PyCFunction)host_methods_rows, METH_NOARGS, NULL},
    {"_host_state", (PyCFunction)host_methods_state, METH_NOARGS, NULL},
    {"_host_commit", (PyCFunction)host_methods_commit, METH_NOARGS, NULL},
    {"_host_copy_started", (PyCFunction)host_methods_in_flight, METH_NOARGS, NULL},
    {"host_rows_of", (PyCFunction)host_methods_rows_of, METH_O,
     "Host-table rows of the given handles (int32 buffer) as array('i')."},
    {NULL},
};

static PyGetSetDef Core_getset[] = {
    {"usage", (getter)Core_get_usage, NULL, "Fraction of non-null blocks in use.", NULL},
    {"_stats", (getter)Core_get_stats, (setter)Core_set_stats, NULL, NULL},
    {"_num_groups", (getter)Core_num_groups, NULL, NULL, NULL},
    {"_first_lookup_tokens", (getter)Core_first_lookup_tokens, NULL,
     "Tokens the first spec group's search hit in the last hybrid lookup (the prefix hint's longest).", NULL},
    {NULL},
};

PyTypeObject Core_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvimpl._kvnative.Core",
    .tp_basicsize = sizeof(Core),
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The native KV-cache manager state (the base of kvimpl.native.NativeKVCacheManager).",
    .tp_methods = Core_methods,
    .tp_getset = Core_getset,
    .tp_init = (initproc)Core_init,
    .tp_new = PyType_GenericNew,
    .tp_weaklistoffset = offsetof(Core, weakreflist),
};

int api_init(PyObject *module) {
    for (int i = 0; i < 12; i++) {
        S_alloc[i] = PyUnicode_InternFromString(ALLOC_NAMES[i]);
        if (!S_alloc[i])
            return -1;
    }
    PyObject *arr = PyImport_ImportModule("array");
    if (!arr)
        return -1;
    array_type = PyObject_GetAttrString(arr, "array");
    Py_DECREF(arr);
    return array_type ? 0 : -1;
}
