/* The prefix-cache hit search (kvimpl.single_type_kv_cache_manager's
 * find_longest_cache_hit and its per-kind rules, kvimpl.kv_cache_coordinator's
 * unitary and hybrid searches), written again over the cache map of pool.c.
 */
#include "native.h"

static Py_ssize_t align_down(Py_ssize_t n, Py_ssize_t bs, Py_ssize_t alignment) {
    while (bs != alignment && (n * bs) % alignment)
        n -= 1;
    return n;
}

/* The digest of block i at stride k (the last fine hash inside it). */
static inline const uint8_t *coarse_hash(Core *c, ReqView *rv, Py_ssize_t i, Py_ssize_t k) {
    return rv_hash(c, rv, (i + 1) * k - 1);
}

/* find_longest_cache_hit for the groups gids (one kind, parameters of group
 * rep), hashes at stride k. Writes one list per gid to out[0..nids). */
static int kind_hit(Core *c, ReqView *rv, int rep, Py_ssize_t k, Py_ssize_t max_length, const int *gids, int nids,
                    int drop, Py_ssize_t alignment, IVec *out) {
    Group *gr = &c->groups[rep];
    Py_ssize_t bs = gr->bs;
    Py_ssize_t max_blocks = (max_length > 0 ? max_length : 0) / bs;
    Py_ssize_t avail = rv->nhash / k;
    Py_ssize_t nlook = max_blocks < avail ? max_blocks : avail;
    for (int j = 0; j < nids; j++)
        out[j].n = 0;
    if (gr->full_type) {
        Py_ssize_t n = 0;
        for (Py_ssize_t i = 0; i < nlook; i++) {
            const uint8_t *d = coarse_hash(c, rv, i, k);
            if (!d)
                return -1;
            int ok = 1;
            for (int j = 0; j < nids; j++) {
                int32_t b = map_first(c, d, gids[j]);
                if (b < 0) {
                    ok = 0;
                    break;
                }
                if (ivec_reserve(&out[j], i + 1) < 0)
                    return -1;
                out[j].v[i] = b;
            }
            if (!ok)
                break;
            n++;
        }
        if (drop && n > 0)
            n--;
        n = align_down(n, bs, alignment);
        for (int j = 0; j < nids; j++)
            out[j].n = n;
        return 0;
    }
    /* Every block is looked up: present[i] and found[i][j] (-1: absent). */
    IVec *found = &c->scratch;
    found->n = 0;
    if (ivec_reserve(found, nlook * nids + 1) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < nlook; i++) {
        const uint8_t *d = coarse_hash(c, rv, i, k);
        if (!d)
            return -1;
        int ok = 1;
        for (int j = 0; j < nids && ok; j++) {
            int32_t b = map_first(c, d, gids[j]);
            found->v[i * nids + j] = b;
            if (b < 0)
                ok = 0;
        }
        if (!ok)
            for (int j = 0; j < nids; j++)
                found->v[i * nids + j] = -1;
    }
#define PRESENT(i) (found->v[(i) * nids] >= 0)
    Py_ssize_t first = 0, length = 0;
    if (gr->kind == K_SWA) {
        Py_ssize_t contiguous = ceildiv(gr->window - 1, bs) + (drop ? 1 : 0);
        Py_ssize_t run = 0;
        int done = 0;
        for (Py_ssize_t i = nlook - 1; i >= 0; i--) {
            if (!PRESENT(i)) {
                run = 0;
                continue;
            }
            Py_ssize_t end = drop ? i : i + 1;
            if (run == 0 && bs != alignment && (end * bs) % alignment)
                continue;
            run += 1;
            if (run >= contiguous) {
                first = i;
                length = align_down(i + run - (drop ? 1 : 0), bs, alignment);
                done = 1;
                break;
            }
        }
        if (!done) {
            first = 0;
            length = align_down(run - (drop && run > 0 ? 1 : 0), bs, alignment);
        }
    } else if (gr->kind == K_CHUNKED) {
        first = (max_length > 0 ? floordiv(max_length, gr->chunk) * gr->chunk : 0) / bs;
        Py_ssize_t n = first;
        while (n < nlook && PRESENT(n))
            n++;
        length = n;
    } else if (gr->kind == K_MAMBA) {
        for (Py_ssize_t i = nlook - 1; i >= 0; i--) {
            if (PRESENT(i) && (bs == alignment || ((i + 1) * bs) % alignment == 0)) {
                first = i;
                length = i + 1;
                break;
            }
        }
    } else {
        PyErr_SetString(PyExc_AssertionError, "unhandled attention kind in the native hit search");
        return -1;
    }
#undef PRESENT
    for (int j = 0; j < nids; j++) {
        if (ivec_reserve(&out[j], length) < 0)
            return -1;
        for (Py_ssize_t i = 0; i < length; i++)
            out[j].v[i] = i < first ? NULL_BLOCK : found->v[i * nids + j];
        out[j].n = length;
    }
    return 0;
}

/* hybrid_hit_search and the trimming of full-attention groups. */
static int hybrid_hit(Core *c, ReqView *rv, Py_ssize_t max_len, IVec *per_group, Py_ssize_t *hit_out) {
    int nsg = c->nsg;
    c->first_lookup_tokens = 0;
    uint8_t looked_up[64], verified[64];
    memset(looked_up, 0, sizeof looked_up);
    memset(verified, 0, sizeof verified);
    Py_ssize_t hashed = rv->nhash * c->hbs;
    Py_ssize_t hit = max_len;
    IVec tmp[64];
    memset(tmp, 0, sizeof tmp);
    for (int g = 0; g < c->G; g++)
        per_group[g].n = 0;
    int rc = -1, first = 1;
    for (;;) {
        Py_ssize_t cur = hit;
        for (int idx = 0; idx < nsg; idx++) {
            SpecGroup *sg = &c->sgs[idx];
            Group *gr = &c->groups[sg->rep];
            Py_ssize_t bs = gr->bs;
            if (gr->full_type && looked_up[idx]) {
                cur = floordiv(cur, bs) * bs;
                continue;
            }
            int mamba = gr->kind == K_MAMBA;
            int drop = sg->use_eagle && !verified[idx] && (c->mamba_counts || !mamba);
            Py_ssize_t limit = cur;
            if (drop && !mamba) { /* eagle_search_limit */
                Py_ssize_t cap = c->hashed_cap ? hashed : max_len;
                limit = cur + bs < cap ? cur + bs : cap;
            }
            Py_ssize_t k = bs == c->hbs ? 1 : bs / c->hbs;
            if (kind_hit(c, rv, sg->rep, k, limit, sg->gids, sg->nids, drop, c->sched, tmp) < 0)
                goto done;
            Py_ssize_t nw = tmp[0].n * bs;
            if (first) { /* every later search is bounded by this one's candidate (kvimpl.native_hint) */
                c->first_lookup_tokens = nw;
                first = 0;
            }
            if (drop)
                verified[idx] = 1;
            else if (nw < cur)
                memset(verified, 0, sizeof verified);
            cur = nw;
            looked_up[idx] = 1;
            for (int j = 0; j < sg->nids; j++) {
                IVec *dst = &per_group[sg->gids[j]];
                if (ivec_reserve(dst, tmp[j].n) < 0)
                    goto done;
                ids_copy(dst->v, tmp[j].v, tmp[j].n);
                dst->n = tmp[j].n;
            }
        }
        if (cur >= hit)
            break;
        hit = cur;
        if (c->sg_simple)
            break;
    }
    for (int idx = 0; idx < nsg; idx++) {
        SpecGroup *sg = &c->sgs[idx];
        Group *gr = &c->groups[sg->rep];
        if (!gr->full_type)
            continue;
        Py_ssize_t keep = floordiv(hit, gr->bs);
        for (int j = 0; j < sg->nids; j++) {
            IVec *dst = &per_group[sg->gids[j]];
            if (dst->n > keep)
                dst->n = keep < 0 ? 0 : keep;
        }
    }
    *hit_out = hit;
    rc = 0;
done:
    for (int j = 0; j < 64; j++)
        PyMem_Free(tmp[j].v);
    return rc;
}

/* The coordinator's find_longest_cache_hit (caching on): hit blocks per group
 * into per_group[0..G), the hit length in tokens. */
int coord_find_hit(Core *c, ReqView *rv, Py_ssize_t max_len, IVec *per_group, Py_ssize_t *hit_tokens) {
    if (c->coord == C_UNITARY) {
        int gid = 0;
        Group *gr = &c->groups[0];
        if (kind_hit(c, rv, 0, 1, max_len, &gid, 1, gr->use_eagle, gr->bs, per_group) < 0)
            return -1;
        *hit_tokens = per_group[0].n * gr->bs;
        return 0;
    }
    return hybrid_hit(c, rv, max_len, per_group, hit_tokens);
}
