/* The block pool over int32 arrays (kvimpl.block_pool, written again).
 *
 * Free queue: a circular doubly linked list through nxt/prv with the
 * sentinel at index N. Cache map: open addressing (linear probing, backward
 * shift deletion) from a key (digest + group id, as kvspec.hashing.make_key)
 * to the blocks holding it, oldest first, linked through knext/kprev; the
 * map holds at most one entry per hashed block, so a table of at least 2N
 * slots never fills past half. Block 0 is the null block.
 */
#include "native.h"

int ivec_reserve(IVec *v, Py_ssize_t n) {
    if (n <= v->cap)
        return 0;
    Py_ssize_t cap = v->cap ? v->cap : 16;
    while (cap < n)
        cap *= 2;
    int32_t *p = PyMem_Realloc(v->v, (size_t)cap * sizeof(int32_t));
    if (!p) {
        PyErr_NoMemory();
        return -1;
    }
    v->v = p;
    v->cap = cap;
    return 0;
}

int ivec_push(IVec *v, int32_t x) {
    if (v->n == v->cap && ivec_reserve(v, v->n + 1) < 0)
        return -1;
    v->v[v->n++] = x;
    return 0;
}

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

/* Digests are uniform, so 8 of their bytes and the group id make the hash. */
/* The map hash of a key given as its digest (dl bytes) and group id. */
static inline uint64_t digest_hash(const uint8_t *digest, int dl, uint32_t gid) {
    uint64_t a = 0, b = 0;
    memcpy(&a, digest, dl < 8 ? (size_t)dl : 8);
    if (dl > 8)
        memcpy(&b, digest + dl - 8, 8);
    return mix64(a ^ (b * 0x9e3779b97f4a7c15ULL) ^ ((uint64_t)gid + 1) * 0xc2b2ae3d27d4eb4fULL);
}

static inline uint64_t key_hash(const uint8_t *key, int KL) {
    int dl = KL - 4;
    uint32_t gid = (uint32_t)key[dl] << 24 | (uint32_t)key[dl + 1] << 16 | (uint32_t)key[dl + 2] << 8 | key[dl + 3];
    return digest_hash(key, dl, gid);
}

/* Start loading what pool_cache_block(c, b, digest, gid) will touch: the
 * map slot of the key (a random place in a table larger than the caches)
 * and block b's key. NOTE: caching a prefill chunk's blocks one after the
 * other waited on one cache miss per block in the map (85% of
 * pool_cache_block's time, `perf annotate`); issuing the loads for the
 * whole chunk first lets them overlap. Nothing is changed. */
void pool_prefetch_cache(const Core *c, int32_t b, const uint8_t *digest, int gid) {
    uint64_t h = digest_hash(digest, c->dlen, (uint32_t)gid);
    __builtin_prefetch(&c->map[h & (c->mapcap - 1)], 1);
    __builtin_prefetch(c->keys + (size_t)b * c->KL, 1);
}

int pool_init(Core *c) {
    int32_t N = c->N;
    size_t n1 = (size_t)N + 1;
    c->nxt = PyMem_Malloc(n1 * sizeof(int32_t));
    c->prv = PyMem_Malloc(n1 * sizeof(int32_t));
    c->ref = PyMem_Calloc((size_t)N, sizeof(int32_t));
    c->haskey = PyMem_Calloc((size_t)N, 1);
    c->keys = PyMem_Calloc((size_t)N, (size_t)c->KL);
    c->knext = PyMem_Malloc((size_t)N * sizeof(int32_t));
    c->kprev = PyMem_Malloc((size_t)N * sizeof(int32_t));
    c->pending = PyMem_Calloc((size_t)N, sizeof(int32_t));
    size_t cap = 16;
    while (cap < 2 * (size_t)N)
        cap *= 2;
    c->map = PyMem_Malloc(cap * sizeof(MapEntry));
    if (!c->nxt || !c->prv || !c->ref || !c->haskey || !c->keys || !c->knext || !c->kprev || !c->pending ||
        !c->map) {
        PyErr_NoMemory();
        return -1;
    }
    c->mapcap = cap;
    c->mapcount = 0;
    for (size_t i = 0; i < cap; i++)
        c->map[i].head = -1;
    /* Block 0 stays unlinked; the ring is S -> 1 -> ... -> N-1 -> S. */
    int32_t S = N;
    for (int32_t i = 0; i <= N; i++) {
        c->nxt[i] = i + 1;
        c->prv[i] = i - 1;
    }
    if (N > 1) {
        c->nxt[S] = 1;
        c->prv[1] = S;
        c->nxt[N - 1] = S;
        c->prv[S] = N - 1;
    } else {
        c->nxt[S] = S;
        c->prv[S] = S;
    }
    c->nxt[0] = c->prv[0] = 0;
    c->nfree = N - 1;
    return 0;
}

void pool_free_mem(Core *c) {
    PyMem_Free(c->nxt);
    PyMem_Free(c->prv);
    PyMem_Free(c->ref);
    PyMem_Free(c->haskey);
    PyMem_Free(c->keys);
    PyMem_Free(c->knext);
    PyMem_Free(c->kprev);
    PyMem_Free(c->pending);
    PyMem_Free(c->map);
    c->nxt = c->prv = c->ref = c->knext = c->kprev = c->pending = NULL;
    c->haskey = c->keys = NULL;
    c->map = NULL;
}

void fq_remove(Core *c, int32_t b) {
    int32_t p = c->prv[b], n = c->nxt[b];
    c->nxt[p] = n;
    c->prv[n] = p;
    c->nfree--;
}

void fq_append(Core *c, int32_t b) {
    int32_t S = c->N, t = c->prv[S];
    c->nxt[t] = b;
    c->prv[b] = t;
    c->nxt[b] = S;
    c->prv[S] = b;
    c->nfree++;
}

void fq_prepend(Core *c, int32_t b) {
    int32_t S = c->N, h = c->nxt[S];
    c->prv[h] = b;
    c->nxt[b] = h;
    c->prv[b] = S;
    c->nxt[S] = b;
    c->nfree++;
}

/* ---------------------------------------------------------------- cache map */

MapEntry *map_find(Core *c, const uint8_t *key) {
    int KL = c->KL;
    uint64_t h = key_hash(key, KL);
    size_t mask = c->mapcap - 1, i = h & mask;
    for (;;) {
        MapEntry *e = &c->map[i];
        if (e->head < 0)
            return NULL;
        if (e->h == h && memcmp(c->keys + (size_t)e->head * KL, key, (size_t)KL) == 0)
            return e;
        i = (i + 1) & mask;
    }
}

/* The oldest block cached under (digest, gid), or -1. */
int32_t map_first(Core *c, const uint8_t *digest, int gid) {
    uint8_t key[40];
    int dl = c->dlen;
    memcpy(key, digest, (size_t)dl);
    key[dl] = (uint8_t)((uint32_t)gid >> 24);
    key[dl + 1] = (uint8_t)((uint32_t)gid >> 16);
    key[dl + 2] = (uint8_t)((uint32_t)gid >> 8);
    key[dl + 3] = (uint8_t)gid;
    MapEntry *e = map_find(c, key);
    return e ? e->head : -1;
}

static void map_delete(Core *c, MapEntry *e) {
    size_t mask = c->mapcap - 1;
    size_t i = (size_t)(e - c->map), j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (c->map[j].head < 0)
            break;
        size_t k = c->map[j].h & mask;
        /* Move j back to i unless its home k lies cyclically in (i, j]. */
        int keep = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
        if (!keep) {
            c->map[i] = c->map[j];
            i = j;
        }
    }
    c->map[i].head = -1;
    c->mapcount--;
}

int pool_cache_block(Core *c, int32_t b, const uint8_t *digest, int gid) {
    int KL = c->KL, dl = c->dlen;
    uint8_t *key = c->keys + (size_t)b * KL;
    memcpy(key, digest, (size_t)dl);
    key[dl] = (uint8_t)((uint32_t)gid >> 24);
    key[dl + 1] = (uint8_t)((uint32_t)gid >> 16);
    key[dl + 2] = (uint8_t)((uint32_t)gid >> 8);
    key[dl + 3] = (uint8_t)gid;
    c->haskey[b] = 1;
    uint64_t h = key_hash(key, KL);
    size_t mask = c->mapcap - 1, i = h & mask;
    for (;;) {
        MapEntry *e = &c->map[i];
        if (e->head < 0) {
            e->h = h;
            e->head = e->tail = b;
            c->knext[b] = c->kprev[b] = -1;
            c->mapcount++;
            return 0;
        }
        if (e->h == h && memcmp(c->keys + (size_t)e->head * KL, key, (size_t)KL) == 0) {
            c->knext[e->tail] = b;
            c->kprev[b] = e->tail;
            c->knext[b] = -1;
            e->tail = b;
            return 0;
        }
        i = (i + 1) & mask;
    }
}

/* Drop block b's hash (it must have one): kvimpl.block_pool.BlockPool._evict. */
void pool_evict(Core *c, int32_t b) {
    MapEntry *e = map_find(c, c->keys + (size_t)b * c->KL);
    if (c->events)
        ev_removed(c, b);
    c->haskey[b] = 0;
    if (!e)
        return; /* unreachable: a hashed block is always in the map */
    int32_t p = c->kprev[b], n = c->knext[b];
    if (p >= 0)
        c->knext[p] = n;
    if (n >= 0)
        c->kprev[n] = p;
    if (e->head == b && e->tail == b) {
        map_delete(c, e);
        return;
    }
    if (e->head == b) {
        /* The entry is found by its head's key: the new head holds the same key. */
        e->head = n;
    }
    if (e->tail == b)
        e->tail = p;
}

void pool_reset_cache(Core *c) {
    for (size_t i = 0; i < c->mapcap; i++)
        c->map[i].head = -1;
    c->mapcount = 0;
    memset(c->haskey, 0, (size_t)c->N);
}

/* ---------------------------------------------------------------- blocks */

/* get_new_blocks: the first n free blocks (their hashes evicted), each with
 * ref_cnt 1, appended to out. */
int pool_get_new_blocks(Core *c, Py_ssize_t n, IVec *out) {
    if (n < 0) {
        PyErr_Format(G_.InvalidTokenCountError, "get_new_blocks: num_blocks %zd < 0", n);
        return -1;
    }
    if (n > c->nfree) {
        PyErr_Format(G_.PoolExhaustedError, "Cannot get %zd free blocks from the pool", n);
        return -1;
    }
    if (ivec_reserve(out, out->n + n) < 0)
        return -1;
    int32_t S = c->N, b = c->nxt[S];
    int evict = c->caching;
    for (Py_ssize_t i = 0; i < n; i++) {
        out->v[out->n++] = b;
        if (evict && c->haskey[b])
            pool_evict(c, b);
        c->ref[b] = 1;
        b = c->nxt[b];
    }
    c->nxt[S] = b;
    c->prv[b] = S;
    c->nfree -= (int32_t)n;
    return 0;
}

void pool_touch(Core *c, const int32_t *blocks, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t b = blocks[i];
        if (b == NULL_BLOCK)
            continue;
        if (c->ref[b] == 0)
            fq_remove(c, b);
        c->ref[b]++;
    }
}

/* free_blocks: one reference less per element; blocks reaching 0 are free:
 * unhashed ones to the front in the given order (with unhashed_first),
 * the others to the tail. Ids are checked first; nothing changes on error. */
int pool_free_blocks(Core *c, const int32_t *blocks, Py_ssize_t n) {
    int32_t *ref = c->ref;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (blocks[i] < 0 || blocks[i] >= c->N) {
            PyErr_Format(G_.InvalidBlockIdError, "free_blocks: block id %d is outside 0..%d", (int)blocks[i],
                         (int)c->N - 1);
            return -1;
        }
    }
    /* Fast test: every block's count covers this call when no block repeats
     * and each has a reference; otherwise count exactly (kvimpl's _check_double_free). */
    int ok = 1;
    for (Py_ssize_t i = 0; i < n && ok; i++)
        if (blocks[i] != NULL_BLOCK && ref[blocks[i]] < 1)
            ok = 0;
    if (ok) {
        for (Py_ssize_t i = 0; i < n; i++) {
            int32_t b = blocks[i];
            if (b == NULL_BLOCK)
                continue;
            if (--ref[b] < 0)
                ok = 0;
        }
        for (Py_ssize_t i = 0; i < n; i++)
            if (blocks[i] != NULL_BLOCK)
                ref[blocks[i]]++;
    }
    if (!ok) {
        /* Count each block's occurrences; report the first over-freed one in first-seen order. */
        IVec *cnt = &c->pool_tmp;
        cnt->n = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            int32_t b = blocks[i];
            if (b == NULL_BLOCK)
                continue;
            Py_ssize_t j = 0;
            while (j < cnt->n && cnt->v[j] != b)
                j += 2;
            if (j < cnt->n) {
                cnt->v[j + 1]++;
            } else if (ivec_push(cnt, b) < 0 || ivec_push(cnt, 1) < 0) {
                return -1;
            }
        }
        for (Py_ssize_t j = 0; j < cnt->n; j += 2) {
            int32_t b = cnt->v[j], k = cnt->v[j + 1];
            if (ref[b] < k) {
                PyErr_Format(G_.DoubleFreeError,
                             "free_blocks: block %d has ref_cnt %d but is freed %d time(s); it was freed more "
                             "often than allocated",
                             (int)b, (int)ref[b], (int)k);
                return -1;
            }
        }
    }
    IVec *unhashed = &c->pool_tmp;
    unhashed->n = 0;
    int front = c->unhashed_first;
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t b = blocks[i];
        if (b == NULL_BLOCK)
            continue;
        if (--ref[b] == 0) {
            if (front && !c->haskey[b]) {
                if (ivec_push(unhashed, b) < 0)
                    return -1;
            } else {
                fq_append(c, b);
            }
        }
    }
    for (Py_ssize_t i = unhashed->n - 1; i >= 0; i--)
        fq_prepend(c, unhashed->v[i]);
    return 0;
}

/* ---------------------------------------------------------------- key set */

int keyset_add(KeySet *s, const uint8_t *key, int KL) {
    if ((s->count + 1) * 2 > s->cap) {
        size_t ncap = s->cap ? s->cap * 2 : 64;
        KeySet t = {0};
        t.h = PyMem_Malloc(ncap * sizeof(uint64_t));
        t.keys = PyMem_Malloc(ncap * (size_t)KL);
        t.used = PyMem_Calloc(ncap, 1);
        t.list = PyMem_Malloc(ncap * sizeof(int32_t));
        if (!t.h || !t.keys || !t.used || !t.list) {
            PyMem_Free(t.h);
            PyMem_Free(t.keys);
            PyMem_Free(t.used);
            PyMem_Free(t.list);
            PyErr_NoMemory();
            return -1;
        }
        t.cap = ncap;
        for (size_t j = 0; j < s->count; j++) {
            size_t i = (size_t)s->list[j];
            if (keyset_add(&t, s->keys + i * KL, KL) < 0)
                return -1;
        }
        keyset_free(s);
        *s = t;
    }
    uint64_t h = key_hash(key, KL);
    size_t mask = s->cap - 1, i = h & mask;
    while (s->used[i]) {
        if (s->h[i] == h && memcmp(s->keys + i * KL, key, (size_t)KL) == 0)
            return 0;
        i = (i + 1) & mask;
    }
    s->used[i] = 1;
    s->h[i] = h;
    memcpy(s->keys + i * KL, key, (size_t)KL);
    s->list[s->count++] = (int32_t)i;
    return 0;
}

int keyset_has(const KeySet *s, const uint8_t *key, int KL) {
    if (!s->count)
        return 0;
    uint64_t h = key_hash(key, KL);
    size_t mask = s->cap - 1, i = h & mask;
    while (s->used[i]) {
        if (s->h[i] == h && memcmp(s->keys + i * KL, key, (size_t)KL) == 0)
            return 1;
        i = (i + 1) & mask;
    }
    return 0;
}

void keyset_clear(KeySet *s, int KL) {
    (void)KL;
    for (size_t j = 0; j < s->count; j++)
        s->used[s->list[j]] = 0;
    s->count = 0;
}

void keyset_free(KeySet *s) {
    PyMem_Free(s->h);
    PyMem_Free(s->keys);
    PyMem_Free(s->used);
    PyMem_Free(s->list);
    memset(s, 0, sizeof *s);
}
