/* Request slots, per-group tables and the managers' rules
 * (kvimpl.single_type_kv_cache_manager and kvimpl.kv_cache_coordinator,
 * written again over the arrays of pool.c).
 *
 * A request id maps to a slot; a slot holds, per group, the table (block ids),
 * the num_cached_block entry (-1: absent), whether the request is in that
 * group's req_to_blocks at all (a table may exist and be empty, exactly as
 * the Python dicts), and Mamba align's bookkeeping. A slot is released when
 * none of that is left.
 */
#include "native.h"

Table *slot_table(Core *c, Py_ssize_t slot, int g) { return &c->tables[slot * c->G + g]; }

Py_ssize_t slot_find(Core *c, PyObject *rid) {
    PyObject *v = PyDict_GetItemWithError(c->slot_of, rid);
    if (!v)
        return PyErr_Occurred() ? -2 : -1;
    return PyLong_AsSsize_t(v);
}

static int slots_grow(Core *c) {
    Py_ssize_t old = c->capslots, cap = old ? old * 2 : 64;
    PyObject **rid = PyMem_Realloc(c->slot_rid, (size_t)cap * sizeof(PyObject *));
    if (!rid)
        goto nomem;
    c->slot_rid = rid;
    PyObject **req = PyMem_Realloc(c->slot_req, (size_t)cap * sizeof(PyObject *));
    if (!req)
        goto nomem;
    c->slot_req = req;
    PyObject **num = PyMem_Realloc(c->slot_num, (size_t)cap * sizeof(PyObject *));
    if (!num)
        goto nomem;
    c->slot_num = num;
    int32_t *row = PyMem_Realloc(c->slot_row, (size_t)cap * sizeof(int32_t));
    if (!row)
        goto nomem;
    c->slot_row = row;
    Table *t = PyMem_Realloc(c->tables, (size_t)cap * c->G * sizeof(Table));
    if (!t)
        goto nomem;
    c->tables = t;
    for (Py_ssize_t s = old; s < cap; s++) {
        c->slot_rid[s] = c->slot_req[s] = NULL;
        c->slot_num[s] = PyLong_FromSsize_t(s);
        if (!c->slot_num[s])
            return -1;
        c->slot_row[s] = -1;
        for (int g = 0; g < c->G; g++) {
            Table *x = &c->tables[s * c->G + g];
            memset(x, 0, sizeof *x);
            x->ncached = -1;
            x->last_state = -1;
        }
    }
    if (ivec_reserve(&c->free_slots, cap) < 0)
        return -1;
    for (Py_ssize_t s = cap - 1; s >= old; s--)
        c->free_slots.v[c->free_slots.n++] = (int32_t)s;
    c->capslots = cap;
    return 0;
nomem:
    PyErr_NoMemory();
    return -1;
}

Py_ssize_t slot_get(Core *c, PyObject *rid) {
    Py_ssize_t s = slot_find(c, rid);
    if (s != -1)
        return s;
    if (c->free_slots.n == 0 && slots_grow(c) < 0)
        return -2;
    s = c->free_slots.v[--c->free_slots.n];
    if (PyDict_SetItem(c->slot_of, rid, c->slot_num[s]) < 0) {
        c->free_slots.n++;
        return -2;
    }
    Py_INCREF(rid);
    c->slot_rid[s] = rid;
    return s;
}

static int slot_empty(Core *c, Py_ssize_t slot) {
    for (int g = 0; g < c->G; g++) {
        Table *t = slot_table(c, slot, g);
        if (t->present || t->ncached >= 0 || t->allocated || t->last_state >= 0)
            return 0;
    }
    return 1;
}

void slot_release_if_empty(Core *c, Py_ssize_t slot) {
    if (slot < 0 || !slot_empty(c, slot))
        return;
    host_row_drop(c, slot);
    PyObject *rid = c->slot_rid[slot];
    if (PyDict_DelItem(c->slot_of, rid) < 0)
        PyErr_Clear();
    c->slot_rid[slot] = NULL;
    Py_DECREF(rid);
    Py_CLEAR(c->slot_req[slot]);
    c->free_slots.v[c->free_slots.n++] = (int32_t)slot;
}

int table_reserve(Table *t, Py_ssize_t n) {
    if (n <= t->cap)
        return 0;
    Py_ssize_t cap = t->cap ? t->cap : 8;
    while (cap < n)
        cap *= 2;
    if (cap > INT32_MAX) {
        PyErr_NoMemory();
        return -1;
    }
    int32_t *b = PyMem_Realloc(t->b, (size_t)cap * sizeof(int32_t));
    if (!b) {
        PyErr_NoMemory();
        return -1;
    }
    t->b = b;
    t->cap = (int32_t)cap;
    return 0;
}

int table_push(Table *t, int32_t b) {
    if (t->len == t->cap && table_reserve(t, (Py_ssize_t)t->len + 1) < 0)
        return -1;
    t->b[t->len++] = b;
    return 0;
}

/* req_to_blocks.setdefault(rid, []) */
static Table *table_setdefault(Core *c, Py_ssize_t slot, int g) {
    Table *t = slot_table(c, slot, g);
    if (!t->present) {
        t->present = 1;
        t->len = 0;
        c->groups[g].num_tables++;
    }
    return t;
}

Py_ssize_t table_len_pub(Core *c, Py_ssize_t slot, int g) {
    if (slot < 0)
        return 0;
    Table *t = slot_table(c, slot, g);
    return t->present ? t->len : 0;
}

static inline Py_ssize_t table_len(Core *c, Py_ssize_t slot, int g) {
    if (slot < 0)
        return 0;
    Table *t = slot_table(c, slot, g);
    return t->present ? t->len : 0;
}

Py_ssize_t skipped_tokens(const Group *g, Py_ssize_t n) {
    switch (g->kind) {
    case K_SWA: {
        Py_ssize_t s = n - g->window + 1 - g->retained;
        return s > 0 ? s : 0;
    }
    case K_CHUNKED:
        return floordiv(n, g->chunk) * g->chunk;
    case K_MAMBA:
        return n - 1;
    default:
        return 0;
    }
}

/* ------------------------------------------------------------ counting */

static Py_ssize_t num_evictable(Core *c, const int32_t *b, Py_ssize_t n) {
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (b[i] != NULL_BLOCK && c->ref[b[i]] == 0)
            k++;
    return k;
}

/* kvimpl's blocks_to_allocate. */
static Py_ssize_t blocks_to_allocate(Core *c, Py_ssize_t required, Py_ssize_t cap, Py_ssize_t have,
                                     Py_ssize_t skipped, const Hits *h, int tracked) {
    if (cap >= 0 && cap < required)
        required = cap;
    if (tracked)
        return required > have ? required - have : 0;
    Py_ssize_t nh = h ? h->n : 0;
    Py_ssize_t held = nh + have > skipped ? nh + have : skipped;
    Py_ssize_t nw = required > held ? required - held : 0;
    Py_ssize_t start = skipped > have ? skipped - have : 0;
    if (h && start < nh)
        nw += num_evictable(c, h->ids + start, nh - start);
    return nw;
}

static Py_ssize_t base_num_blocks(Core *c, Py_ssize_t slot, int g, Py_ssize_t num_tokens, const Hits *h,
                                  Py_ssize_t total, int apply_cap) {
    Group *gr = &c->groups[g];
    Py_ssize_t cap = apply_cap ? gr->cap : -1;
    Py_ssize_t have = table_len(c, slot, g);
    if (slot >= 0 && slot_table(c, slot, g)->ncached >= 0)
        return blocks_to_allocate(c, ceildiv(num_tokens, gr->bs), cap, have, 0, NULL, 1);
    Py_ssize_t skipped = floordiv(skipped_tokens(gr, total), gr->bs);
    return blocks_to_allocate(c, ceildiv(num_tokens, gr->bs), cap, have, skipped, h, 0);
}

static Py_ssize_t mamba_num_blocks(Core *c, Py_ssize_t slot, int g, Py_ssize_t num_tokens, const Hits *h,
                                   Py_ssize_t total, Py_ssize_t main_tokens, int apply_cap, Py_ssize_t n_ext) {
    Group *gr = &c->groups[g];
    Py_ssize_t nh = h ? h->n : 0;
    if (nh > 0) {
        int32_t last = h->ids[nh - 1];
        if (c->haskey[last] && keyset_has(&c->step_keys, c->keys + (size_t)last * c->KL, c->KL))
            return (Py_ssize_t)c->N + 1;
    }
    Py_ssize_t spec = gr->spec;
    if (gr->mode != M_ALIGN)
        return base_num_blocks(c, slot, g, num_tokens + gr->bs * spec, h, total, apply_cap);
    Py_ssize_t required = ceildiv(main_tokens, gr->bs) + spec;
    Py_ssize_t raw = required - nh - table_len(c, slot, g);
    int allocated = slot >= 0 && slot_table(c, slot, g)->allocated;
    Py_ssize_t nw = raw;
    if (raw > 0) { /* mamba_align_new_blocks */
        Py_ssize_t capn = allocated ? 1 : 1 + spec;
        nw = (!gr->estimate_capped || capn < raw) ? capn : raw;
    }
    Py_ssize_t estimate = nw + (h ? num_evictable(c, h->ids, nh) : 0);
    if (n_ext <= 0)
        return estimate;
    /* _exact_with_external */
    Py_ssize_t skipped = (total - 1 > 0 ? total - 1 : 0) / gr->bs;
    Py_ssize_t have = skipped > nh ? skipped : nh;
    Py_ssize_t ext = ceildiv(total, gr->bs) - have;
    if (ext < 0)
        ext = 0;
    Py_ssize_t lo = have + ext > required - spec - 1 ? have + ext : required - spec - 1;
    Py_ssize_t more = required - lo > 0 ? required - lo : 0;
    Py_ssize_t exact = ext + more + (h && skipped < nh ? num_evictable(c, h->ids + skipped, nh - skipped) : 0);
    return estimate > exact ? estimate : exact;
}

Py_ssize_t coord_num_blocks(Core *c, Py_ssize_t slot, Py_ssize_t num_tokens, const Hits *hits, Py_ssize_t total,
                            Py_ssize_t main_tokens, int apply_cap, Py_ssize_t num_external) {
    Py_ssize_t sum = 0;
    for (int g = 0; g < c->G; g++) {
        const Hits *h = hits ? &hits[g] : NULL;
        if (c->groups[g].kind == K_MAMBA)
            sum += mamba_num_blocks(c, slot, g, num_tokens, h, total, main_tokens, apply_cap, num_external);
        else
            sum += base_num_blocks(c, slot, g, num_tokens, h, total, apply_cap);
    }
    return sum;
}

/* ------------------------------------------------------------ growing */

/* _extend: n fresh blocks appended to the table (holders, new-id record). */
static int group_extend(Core *c, int g, Table *t, Py_ssize_t n) {
    if (n <= 0)
        return 0;
    Group *gr = &c->groups[g];
    if (table_reserve(t, (Py_ssize_t)t->len + n) < 0)
        return -1;
    IVec *tmp = &c->scratch2;
    tmp->n = 0;
    if (pool_get_new_blocks(c, n, tmp) < 0)
        return -1;
    memcpy(t->b + t->len, tmp->v, (size_t)n * sizeof(int32_t));
    t->len += (int32_t)n;
    if (gr->holders)
        for (Py_ssize_t i = 0; i < n; i++)
            gr->holders[tmp->v[i]]++;
    if (gr->records_new) {
        if (ivec_reserve(&gr->new_ids, gr->new_ids.n + n) < 0)
            return -1;
        memcpy(gr->new_ids.v + gr->new_ids.n, tmp->v, (size_t)n * sizeof(int32_t));
        gr->new_ids.n += n;
    }
    return 0;
}

/* Mamba align: _allocate_aligned. */
static int mamba_allocate_aligned(Core *c, Py_ssize_t slot, int g, Py_ssize_t num_tokens) {
    Group *gr = &c->groups[g];
    Py_ssize_t spec = gr->spec;
    Table *t = table_setdefault(c, slot, g);
    Py_ssize_t required = ceildiv(num_tokens, gr->bs) + spec;
    Py_ssize_t prev = t->len;
    if (required <= prev)
        return 0;
    int allocated = t->allocated;
    if (allocated || prev > 0)
        t->last_state = (int32_t)(prev - 1 - (allocated ? spec : 0));
    Py_ssize_t skip = required - spec - 1;
    for (Py_ssize_t i = prev; i < skip; i++)
        if (table_push(t, NULL_BLOCK) < 0)
            return -1;
    if (allocated) {
        for (Py_ssize_t idx = prev - spec; idx < prev; idx++) {
            if (idx >= skip)
                break;
            Py_ssize_t at = idx < 0 ? idx + t->len : idx; /* Python's negative index */
            if (table_push(t, t->b[at]) < 0)
                return -1;
            t->b[at] = NULL_BLOCK;
            tbl_touch(t, at);
        }
    }
    IVec *tmp = &c->scratch2;
    tmp->n = 0;
    if (pool_get_new_blocks(c, required - t->len, tmp) < 0)
        return -1;
    if (table_reserve(t, (Py_ssize_t)t->len + tmp->n) < 0)
        return -1;
    memcpy(t->b + t->len, tmp->v, (size_t)tmp->n * sizeof(int32_t));
    t->len += (int32_t)tmp->n;
    t->allocated = 1;
    return 0;
}

/* allocate_new_blocks of every group; starts[g] = the table length before,
 * so table[starts[g]:] is what the call returns for group g. */
int coord_allocate_new(Core *c, Py_ssize_t slot, Py_ssize_t slots, Py_ssize_t main_tokens, Py_ssize_t *starts) {
    for (int g = 0; g < c->G; g++) {
        Group *gr = &c->groups[g];
        Table *t = table_setdefault(c, slot, g);
        starts[g] = t->len;
        if (gr->kind == K_MAMBA && gr->mode == M_ALIGN) {
            if (mamba_allocate_aligned(c, slot, g, main_tokens) < 0)
                return -1;
            continue;
        }
        Py_ssize_t tokens = gr->kind == K_MAMBA ? slots + gr->bs * gr->spec : slots;
        if (group_extend(c, g, t, ceildiv(tokens, gr->bs) - t->len) < 0)
            return -1;
    }
    return 0;
}

/* allocate_new_computed_blocks: hits of every group touched first, then
 * blocks for external tokens. */
int coord_add_hits(Core *c, Py_ssize_t slot, const Hits *hits, Py_ssize_t local, Py_ssize_t external) {
    for (int g = 0; g < c->G; g++)
        if (slot_table(c, slot, g)->ncached >= 0)
            return 0;
    for (int g = 0; g < c->G; g++) {
        Group *gr = &c->groups[g];
        Table *t = table_setdefault(c, slot, g);
        Py_ssize_t skipped = floordiv(skipped_tokens(gr, local + external), gr->bs);
        Py_ssize_t s0 = skipped > 0 ? skipped : 0;
        const Hits *h = hits ? &hits[g] : NULL;
        Py_ssize_t nh = h ? h->n : 0;
        const int32_t *keep = nh > s0 ? h->ids + s0 : NULL;
        Py_ssize_t nkeep = nh > s0 ? nh - s0 : 0;
        if (c->caching && nkeep)
            pool_touch(c, keep, nkeep);
        if (table_reserve(t, (Py_ssize_t)t->len + s0 + nkeep) < 0)
            return -1;
        for (Py_ssize_t i = 0; i < s0; i++)
            t->b[t->len++] = NULL_BLOCK;
        for (Py_ssize_t i = 0; i < nkeep; i++)
            t->b[t->len++] = keep[i];
        if (gr->holders) {
            gr->holders[NULL_BLOCK] += (int32_t)s0;
            for (Py_ssize_t i = 0; i < nkeep; i++)
                gr->holders[keep[i]]++;
        }
        t->ncached = t->len;
    }
    if (external > 0) {
        for (int g = 0; g < c->G; g++) {
            Group *gr = &c->groups[g];
            Py_ssize_t total = local + external, ext = external;
            Py_ssize_t skipped = skipped_tokens(gr, total);
            if (skipped > 0 && total - skipped < ext)
                ext = total - skipped;
            if (ext <= 0)
                continue;
            Table *t = table_setdefault(c, slot, g);
            int records = gr->records_new; /* skip_zeroing_group_ids: the load fills these */
            if ((c->skip_mask >> g) & 1)
                gr->records_new = 0;
            int rc = group_extend(c, g, t, ceildiv(total, gr->bs) - t->len);
            gr->records_new = records;
            if (rc < 0)
                return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------ freeing */

/* _remove_blocks_in_range(first=0, last): null out backwards up to the first null; free. */
static int remove_range(Core *c, Py_ssize_t slot, int g, Py_ssize_t last) {
    Table *t = slot_table(c, slot, g);
    Group *gr = &c->groups[g];
    IVec *freed = &c->scratch2;
    freed->n = 0;
    Py_ssize_t end = last < t->len ? last : t->len;
    for (Py_ssize_t i = end - 1; i >= 0; i--) {
        int32_t b = t->b[i];
        if (b == NULL_BLOCK)
            break;
        if (ivec_push(freed, b) < 0)
            return -1;
        if (gr->holders) {
            gr->holders[b]--;
            gr->holders[NULL_BLOCK]++;
        }
        t->b[i] = NULL_BLOCK;
        tbl_touch(t, i);
    }
    if (freed->n)
        return pool_free_blocks(c, freed->v, freed->n);
    return 0;
}

/* Mamba align from vLLM 0.30.0 (MambaManager._remove_blocks_in_range with retired_mark): null out
 * [retired, last) walking backwards over null gaps, free what was removed; the mark moves to the end. */
static int retire_range(Core *c, Py_ssize_t slot, int g, Py_ssize_t last) {
    Table *t = slot_table(c, slot, g);
    IVec *freed = &c->scratch2;
    freed->n = 0;
    Py_ssize_t end = last < t->len ? last : t->len;
    if (t->retired >= end)
        return 0;
    for (Py_ssize_t i = end - 1; i >= t->retired; i--) {
        int32_t b = t->b[i];
        if (b == NULL_BLOCK)
            continue;
        if (ivec_push(freed, b) < 0)
            return -1;
        t->b[i] = NULL_BLOCK;
        tbl_touch(t, i);
    }
    t->retired = (int32_t)end;
    if (freed->n)
        return pool_free_blocks(c, freed->v, freed->n);
    return 0;
}

int coord_remove_skipped(Core *c, Py_ssize_t slot, Py_ssize_t total) {
    if (slot < 0)
        return 0;
    for (int g = 0; g < c->G; g++) {
        Group *gr = &c->groups[g];
        if (!gr->skipping)
            continue;
        Py_ssize_t tot = total;
        if (gr->kind == K_MAMBA) {
            tot = total - gr->skip_slack;
            if (tot < 0)
                tot = 0;
        }
        Py_ssize_t skipped = skipped_tokens(gr, tot);
        Table *t = slot_table(c, slot, g);
        if (skipped > 0 && t->present) {
            Py_ssize_t last = floordiv(skipped, gr->bs);
            last = last < t->len ? last : t->len;
            if ((gr->retired_mark ? retire_range(c, slot, g, last) : remove_range(c, slot, g, last)) < 0)
                return -1;
        }
        if (gr->kind == K_MAMBA && gr->mode == M_ALIGN && t->last_state >= 0 &&
            t->last_state < ceildiv(tot, gr->bs) - 1) {
            int32_t idx = t->last_state;
            if (idx < t->len && t->b[idx] != NULL_BLOCK) {
                int32_t b = t->b[idx];
                if (pool_free_blocks(c, &b, 1) < 0)
                    return -1;
                t->b[idx] = NULL_BLOCK;
                tbl_touch(t, idx);
            }
        }
    }
    return 0;
}

/* _forget: drop the request's bookkeeping in group g; its table goes to out. */
int core_forget_group(Core *c, Py_ssize_t slot, int g, IVec *out) {
    out->n = 0;
    if (slot < 0)
        return 0;
    Table *t = slot_table(c, slot, g);
    Group *gr = &c->groups[g];
    t->ncached = -1;
    t->allocated = 0;
    t->last_state = -1;
    t->retired = 0;
    t->hlen = 0;
    if (!t->present)
        return 0;
    t->present = 0;
    gr->num_tables--;
    if (ivec_reserve(out, t->len) < 0)
        return -1;
    memcpy(out->v, t->b, (size_t)t->len * sizeof(int32_t));
    out->n = t->len;
    if (gr->holders)
        for (int32_t i = 0; i < t->len; i++)
            gr->holders[t->b[i]]--;
    t->len = 0;
    return 0;
}

/* free: every group's table released last entry first, in group order. */
int core_free(Core *c, PyObject *rid) {
    Py_ssize_t slot = slot_find(c, rid);
    if (slot == -2)
        return -1;
    if (slot < 0)
        return 0;
    IVec *blocks = &c->scratch;
    for (int g = 0; g < c->G; g++) {
        if (core_forget_group(c, slot, g, blocks) < 0)
            return -1;
        for (Py_ssize_t i = 0, j = blocks->n - 1; i < j; i++, j--) {
            int32_t x = blocks->v[i];
            blocks->v[i] = blocks->v[j];
            blocks->v[j] = x;
        }
        if (blocks->n && pool_free_blocks(c, blocks->v, blocks->n) < 0)
            return -1;
    }
    slot_release_if_empty(c, slot);
    return 0;
}

/* ------------------------------------------------------------ caching */

/* Whether the sliding-window reachability mask drops block i from caching
 * (masked: the mask applies; see group_cache for shift, per and need). */
static inline int mask_skips(int masked, Py_ssize_t i, Py_ssize_t shift, Py_ssize_t per, Py_ssize_t need) {
    return masked && !(i >= shift && (i - shift) % per >= per - need);
}

/* One group's cache_blocks: hash the table's full blocks up to num_tokens. */
int group_cache(Core *c, Py_ssize_t slot, int g, ReqView *rv, Py_ssize_t num_tokens) {
    Group *gr = &c->groups[g];
    Table *t = slot >= 0 ? slot_table(c, slot, g) : NULL;
    Py_ssize_t num_cached = t && t->ncached >= 0 ? t->ncached : 0;
    Py_ssize_t num_full = floordiv(num_tokens, gr->bs);
    if (num_cached >= num_full)
        return 0;
    if (c->cache_hashed_only) {
        /* vLLM 0.33.0 on: never past the request's hashed tokens (look-ahead hashes lag the tokens). */
        Py_ssize_t nh = rv_num_hashes(rv);
        if (nh < 0)
            return -1;
        if (num_full > floordiv(nh * c->hbs, gr->bs))
            num_full = floordiv(nh * c->hbs, gr->bs);
        if (num_cached >= num_full)
            return 0;
    }
    if (!t) {
        PyErr_SetString(PyExc_IndexError, "cache_blocks: the request has no table");
        return -1;
    }
    t = table_setdefault(c, slot, g);
    /* reachable_block_mask: sliding window caches only blocks a hit can end with. */
    int masked = 0, shift = 0;
    Py_ssize_t need = 0, per = 0;
    if (gr->kind == K_SWA) {
        need = ceildiv(gr->window - 1, gr->bs) + (gr->use_eagle ? 1 : 0);
        per = c->sched / gr->bs;
        if (need < per) {
            masked = 1;
            shift = gr->use_eagle ? 1 : 0;
        }
    }
    Py_ssize_t k = gr->bs / c->hbs;
    IVec *stored = &c->ev_stored_idx;
    stored->n = 0;
    /* Prefetch pass (pool_prefetch_cache): same blocks as the loop below,
     * only for a C request, whose hashes are at hand (coord_cache checked
     * their length); it changes nothing and reports nothing (the loop below
     * does the checks and raises). */
    if (rv->nat) {
        Py_ssize_t end = num_full < t->len ? num_full : t->len;
        for (Py_ssize_t i = num_cached; i < end; i++) {
            int32_t b = t->b[i];
            Py_ssize_t hi = (i + 1) * k - 1;
            if (b == NULL_BLOCK || hi >= rv->nat->nhash || mask_skips(masked, i, shift, per, need))
                continue;
            pool_prefetch_cache(c, b, rv->nat->hashes + hi * c->dlen, g);
        }
    }
    for (Py_ssize_t i = num_cached; i < num_full; i++) {
        if (i >= t->len) {
            PyErr_SetString(PyExc_IndexError, "cache_blocks: list index out of range (table shorter than the blocks)");
            return -1;
        }
        int32_t b = t->b[i];
        if (b == NULL_BLOCK)
            continue;
        if (mask_skips(masked, i, shift, per, need))
            continue;
        if (c->haskey[b]) {
            PyErr_Format(PyExc_AssertionError, "block %d is hashed twice", (int)b);
            return -1;
        }
        const uint8_t *d = rv_hash(c, rv, (i + 1) * k - 1);
        if (!d)
            return -1;
        if (pool_cache_block(c, b, d, g) < 0)
            return -1;
        if (c->events && ivec_push(stored, (int32_t)i) < 0)
            return -1;
    }
    if (c->events && ev_stored(c, rv, g, stored, num_cached, num_full, gr->bs, k) < 0)
        return -1;
    Py_ssize_t before = num_cached;
    t->ncached = (int32_t)num_full;
    if (gr->kind == K_MAMBA) {
        for (Py_ssize_t i = before; i < num_full && i < t->len; i++) {
            int32_t b = t->b[i];
            if (b != NULL_BLOCK && c->haskey[b] &&
                keyset_add(&c->step_keys, c->keys + (size_t)b * c->KL, c->KL) < 0)
                return -1;
        }
    }
    return 0;
}

int coord_cache(Core *c, Py_ssize_t slot, ReqView *rv, Py_ssize_t num_tokens) {
    if (rv_check_digests(c, rv) < 0)
        return -1;
    /* Multi-module MTP: the last `reprefillable` computed tokens may be prefilled again; not final, not cached. */
    Py_ssize_t final = num_tokens > c->reprefillable ? num_tokens - c->reprefillable : 0;
    if (c->coord != C_HYBRID) {
        for (int g = 0; g < c->G; g++)
            if (group_cache(c, slot, g, rv, final) < 0)
                return -1;
        return 0;
    }
    Py_ssize_t aligned = floordiv(num_tokens, c->sched) * c->sched;
    Py_ssize_t final_aligned = floordiv(final, c->sched) * c->sched;
    for (int g = 0; g < c->G; g++) {
        Group *gr = &c->groups[g];
        Py_ssize_t n = aligned;
        if (gr->use_eagle && aligned > 0)
            n = final < final_aligned + gr->bs ? final : final_aligned + gr->bs;
        if (group_cache(c, slot, g, rv, n) < 0)
            return -1;
    }
    return 0;
}

/* ------------------------------------------------------------ allocate_slots */

/* Whether a running step (no hits, no external tokens, no reserve, no
 * full-sequence gate, no Mamba) of a request with tables changes nothing:
 * every table already covers the slots, no block fills up, and no block
 * leaves a window. Then allocate_slots only records the request's latest
 * value; the general path below would find the same (need 0, nothing to
 * take, cache or free). Sets starts[g] to the table lengths. */
static int running_step_is_quiet(Core *c, Py_ssize_t slot, Py_ssize_t main_tokens, Py_ssize_t n_look,
                                 Py_ssize_t ntok, int delay, Py_ssize_t basis, Py_ssize_t *starts) {
    Py_ssize_t slots = main_tokens + n_look < c->max_len ? main_tokens + n_look : c->max_len;
    int caching = c->caching && !delay;
    Py_ssize_t upto = main_tokens < ntok ? main_tokens : ntok;
    Table *t = &c->tables[slot * c->G];
    for (int g = 0; g < c->G; g++, t++) {
        Group *gr = &c->groups[g];
        if (!t->present || ceildiv(slots, gr->bs) > t->len)
            return 0;
        if (caching && (t->ncached < 0 || floordiv(upto, gr->bs) > t->ncached))
            return 0;
        if (gr->skipping) {
            Py_ssize_t skipped = skipped_tokens(gr, basis);
            if (skipped > 0) {
                Py_ssize_t last = floordiv(skipped, gr->bs);
                if (last > t->len)
                    last = t->len;
                if (last > 0 && t->b[last - 1] != NULL_BLOCK)
                    return 0;
            }
        }
        starts[g] = t->len;
    }
    return 1;
}

/* The spec's allocation after validation. Returns 1 (allocated; table[starts[g]:]
 * is new), 0 (does not fit) or -1 (error). */
int core_allocate(Core *c, ReqView *rv, Py_ssize_t n_new, Py_ssize_t n_hit, const Hits *hits, int has_hits,
                  Py_ssize_t n_look, Py_ssize_t n_ext, int delay, int fsmf, Py_ssize_t reserved, int has_sched,
                  Py_ssize_t *starts, Py_ssize_t *slot_out) {
    /* *slot_out: the request's slot when the caller knows it, else -1. */
    Py_ssize_t local = rv->computed + n_hit;
    Py_ssize_t total = local + n_ext < c->max_len ? local + n_ext : c->max_len;
    int watermarked = rv->status == G_.status_waiting || rv->status == G_.status_preempted;
    Py_ssize_t wm = has_sched && watermarked ? c->watermark : 0;
    /* the skipped blocks are freed on this count: kvspec.kv_cache_manager.skip_basis */
    Py_ssize_t basis = c->inflight_basis ? (total > rv->inflight ? total - rv->inflight : 0) : total;
    Py_ssize_t slot = *slot_out >= 0 ? *slot_out : slot_find(c, rv->rid);
    if (slot == -2)
        return -1;
    *slot_out = slot;
    if (slot >= 0 && !has_hits && n_hit == 0 && n_ext == 0 && !fsmf && reserved == 0 && !c->has_mamba &&
        wm <= c->nfree && running_step_is_quiet(c, slot, total + n_new, n_look, rv->ntok, delay, basis, starts)) {
        Py_INCREF(rv->obj);
        Py_XSETREF(c->slot_req[slot], rv->obj);
        return 1;
    }
    if (fsmf) {
        Py_ssize_t full = rv->ntok < c->max_len ? rv->ntok : c->max_len;
        Py_ssize_t need = coord_num_blocks(c, slot, full, has_hits ? hits : NULL, total, full, 1, 0);
        if (need + wm > c->nfree)
            return 0;
    }
    Py_ssize_t main_tokens = total + n_new;
    Py_ssize_t slots = main_tokens + n_look < c->max_len ? main_tokens + n_look : c->max_len;
    if (c->has_skipping && coord_remove_skipped(c, slot, basis) < 0)
        return -1;
    Py_ssize_t need = coord_num_blocks(c, slot, slots, has_hits ? hits : NULL, local + n_ext, main_tokens, 0, n_ext);
    if (need + wm > (Py_ssize_t)c->nfree - reserved) {
        if (slot >= 0 && host_row_sync(c, slot) < 0)
            return -1;
        return 0;
    }
    if (slot < 0) {
        slot = slot_get(c, rv->rid);
        if (slot < 0)
            return -1;
        *slot_out = slot;
    }
    if (has_hits || n_ext > 0) {
        if (coord_add_hits(c, slot, has_hits ? hits : NULL, local, n_ext) < 0)
            return -1;
    }
    if (coord_allocate_new(c, slot, slots, main_tokens, starts) < 0)
        return -1;
    Py_INCREF(rv->obj);
    Py_XSETREF(c->slot_req[slot], rv->obj);
    if (c->caching && !delay) {
        Py_ssize_t upto = total + n_new < rv->ntok ? total + n_new : rv->ntok;
        if (coord_cache(c, slot, rv, upto) < 0)
            return -1;
    }
    if (host_row_sync(c, slot) < 0)
        return -1;
    return 1;
}
