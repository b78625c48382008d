/* kvimpl's native core: shared declarations of the C extension kvimpl._kvnative.
 *
 * The extension holds two types: Request (a mutable request whose block hashes
 * grow as tokens are appended, see request.c) and Core (the KV-cache manager's
 * whole state in flat C arrays, see pool.c, core.c, hit.c and api.c). The
 * Python class kvimpl.native.NativeKVCacheManager derives from Core and adds
 * what is not on a hot path (views, invariant checks, events, statistics,
 * device tables). Every rule here is kvimpl's Python rule, written again; the
 * lockstep comparison (kvref check --target impl-native --against spec) and
 * tests/impl/test_native*.py keep the two equal.
 */
#ifndef KVNATIVE_H
#define KVNATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ sha256.c */

typedef struct {
    uint32_t h[8];
    uint64_t len;
    uint8_t buf[64];
    size_t n;
} Sha256;

void sha256_init(Sha256 *s);
void sha256_update(Sha256 *s, const uint8_t *data, size_t len);
void sha256_final(Sha256 *s, uint8_t out[32]);

/* SHA-256 of the canonical CBOR of (parent, tuple(tokens), None): the
 * block hash of vLLM's sha256_cbor for a block without extra keys. */
void sha256_cbor_block(const uint8_t *parent, size_t parent_len, const int64_t *tokens, Py_ssize_t n,
                       uint8_t out[32]);

/* ------------------------------------------------------------ module.c */

/* Set once by kvimpl.native (kvnative_setup): the classes the core raises
 * and compares against. */
typedef struct {
    PyObject *InvalidTokenCountError, *GroupCountError, *ExceedsMaxModelLenError, *UnexpectedPrefixHitError;
    PyObject *InvalidBlockIdError, *StaleHitError, *DoubleFreeError, *PoolExhaustedError, *UnknownRequestError;
    PyObject *InvalidRequestError, *CacheBeyondAllocationError, *InvariantViolation, *UnsupportedOperationError;
    PyObject *status_waiting, *status_preempted, *status_running, *status_type;
    PyObject *spec_request_type, *py_request_type; /* kvspec.request.Request, kvimpl.request.Request */
    PyObject *s_request_id, *s_num_computed_tokens, *s_all_token_ids, *s_block_hashes, *s_status;
    PyObject *s_skip_reading_prefix_cache, *s_num_preemptions, *s_num_in_flight_tokens, *s_num_tokens, *s_record;
    int ready;
} Globals;

extern Globals G_;

/* ------------------------------------------------------------ request.c */

typedef struct {
    PyObject_HEAD
    PyObject *request_id;  /* str */
    int64_t *tok;
    Py_ssize_t ntok, captok;
    Py_ssize_t num_prompt_tokens;
    uint8_t *hashes; /* nhash * dlen bytes */
    Py_ssize_t nhash, caphash;
    int dlen, hbs;
    uint8_t seed[32];  /* the parent of the first block */
    PyObject *pyhash;  /* NULL: sha256_cbor without extra keys, hashed here; else a callable */
    int resume_first;
    Py_ssize_t num_computed_tokens;
    PyObject *status;
    PyObject *extra;
    int skip_reading_prefix_cache;
    Py_ssize_t num_preemptions;
    Py_ssize_t num_in_flight_tokens;
    PyObject *tokens_cache, *hashes_cache; /* tuples built on demand, dropped on append */
} ReqObject;

extern PyTypeObject Req_Type;
#define Req_Check(o) (Py_TYPE(o) == &Req_Type)
int req_append(ReqObject *r, const int64_t *tokens, Py_ssize_t n);

/* ------------------------------------------------------------ core */

enum { K_FULL = 0, K_MLA = 1, K_SINK = 2, K_SWA = 3, K_CHUNKED = 4, K_MAMBA = 5 };
enum { M_NONE = 0, M_ALL = 1, M_ALIGN = 2 };
enum { C_NOPREFIX = 0, C_UNITARY = 1, C_HYBRID = 2 };

typedef struct {
    int32_t *v;
    Py_ssize_t n, cap;
} IVec;

int ivec_push(IVec *v, int32_t x);
int ivec_reserve(IVec *v, Py_ssize_t n);

/* Copy or sort n ids where n may be 0: an IVec never reserved has v == NULL, and C11
 * makes a null pointer undefined behaviour in memcpy and qsort even for a count of 0
 * (UBSan's nonnull-attribute check reports it; gcc may drop a later null test on the
 * strength of the call). Here, not in a .c file, so that the C mutants of those files
 * keep their ids. */
static inline void ids_copy(int32_t *dst, const int32_t *src, Py_ssize_t n) {
    if (n > 0)
        memcpy(dst, src, (size_t)n * sizeof(int32_t));
}
static inline void ids_sort(int32_t *v, Py_ssize_t n, int (*cmp)(const void *, const void *)) {
    if (n > 1)
        qsort(v, (size_t)n, sizeof(int32_t), cmp);
}

typedef struct {
    int kind, bs, window, chunk, mode, spec;
    int full_type, skipping, records_new, use_eagle, estimate_capped;
    int retired_mark;      /* Mamba align, mamba_align_retired_mark: removal starts at the table's retired mark */
    int retained;          /* sliding window: extra_retained_tokens kept below the window (not read) */
    Py_ssize_t cap;        /* admission cap, -1 for none */
    Py_ssize_t skip_slack; /* Mamba: tokens remove_skipped_blocks subtracts first */
    Py_ssize_t num_tables; /* requests present in this group's req_to_blocks */
    int32_t *holders;      /* full-type kinds: occurrences of each block in this group's tables */
    IVec new_ids;
    IVec sink;
} Group;

typedef struct {
    int32_t *b;
    int32_t len, cap;
    int32_t ncached;    /* num_cached_block entry, -1 when absent */
    uint8_t present;    /* the request is in req_to_blocks */
    uint8_t allocated;  /* Mamba align: in allocated_block_reqs */
    int32_t last_state; /* Mamba align: last_state_block_idx, -1 when absent */
    int32_t retired;    /* Mamba align (retired_mark): _num_retired_blocks, 0 when absent */
    int32_t hlen;       /* leading entries already written to the host table row */
} Table;

typedef struct {
    int rep;   /* a group with this kind (its parameters) */
    int nids;
    int *gids;
    int use_eagle;
} SpecGroup;

typedef struct {
    uint64_t h;
    int32_t head, tail; /* head == -1: empty */
} MapEntry;

typedef struct {
    uint64_t *h;
    uint8_t *keys;
    uint8_t *used;
    int32_t *list;
    size_t cap, count;
} KeySet;

typedef struct {
    PyObject_HEAD
    int32_t N;
    int G;
    Group *groups;
    int coord;
    int nsg, sg_simple;
    SpecGroup *sgs;
    int hbs, sched, dlen, KL, caching, has_mamba, has_skipping;
    Py_ssize_t max_len, watermark;
    int unhashed_first, pop_trims, common_zero, adopt_hit, mamba_counts, hashed_cap, stats_at_lookup, lagging_hits;
    int inflight_basis; /* skip_on_processed_tokens: skipped blocks freed below computed - in flight */
    Py_ssize_t reprefillable; /* num_prefill_lookahead - 1: trailing tokens caching leaves out (MTP) */
    int cache_hashed_only;    /* caching stops at the request's hashed tokens (vLLM 0.33.0 on) */
    PyObject *skip_check;    /* skip_zeroing_group_ids -> a mask of groups (kvimpl.checks.check_skip_zeroing) */
    unsigned long long skip_mask; /* during one allocation: groups whose external blocks are not listed */
    /* block pool */
    int32_t *nxt, *prv;
    int32_t nfree;
    int32_t *ref;
    uint8_t *haskey;
    uint8_t *keys; /* N * KL: digest then the group id, 4 bytes big-endian (kvspec.hashing.make_key) */
    int32_t *knext, *kprev; /* blocks of one key, oldest first */
    MapEntry *map;
    size_t mapcap, mapcount;
    int32_t *pending;
    KeySet step_keys; /* Mamba: keys cached in this step */
    /* requests */
    PyObject *slot_of; /* dict: request id -> slot */
    PyObject **slot_rid, **slot_req, **slot_num; /* per slot: id (NULL: unused), latest value, slot as int */
    Table *tables;     /* capslots * G */
    Py_ssize_t capslots;
    IVec free_slots;
    PyObject *stats;  /* a PrefixCacheStats or None */
    /* host block tables (hosttab.c): one int32 buffer of G x rows x cols */
    int32_t *host;
    Py_ssize_t host_rows, host_cols;
    int32_t *slot_row;  /* per slot: host row or -1 */
    IVec row_slot;      /* per row in use: its slot, or -1 for a row freed in this step (a hole) */
    IVec host_holes;    /* the holes, in descending order (the lowest is filled first) */
    PyObject *host_owner; /* keeps the buffer alive */
    PyObject *host_grow;  /* called with the rows needed; rebinds a larger buffer */
    PyObject *host_fence; /* called before a write while a copy of the buffer may still read it */
    int host_dirty;
    int host_in_flight; /* a copy of the buffer was started and not fenced yet */
    int32_t *mark;      /* N zeros, scratch counts */
    /* scratch */
    IVec pool_tmp;  /* pool.c only */
    IVec scratch, scratch2;
    /* KV-cache events (events.c): a list of raw records, NULL when events are off */
    PyObject *events;
    int events_lost;
    /* hit.c: the first spec group's hit length (tokens) of the last hybrid search: the prefix hint's
     * longest lookup (kvimpl.native_hint) */
    Py_ssize_t first_lookup_tokens;
    IVec ev_stored_idx; /* events.c scratch: the stored indices of one group_cache */
    PyObject *weakreflist;
} Core;

extern PyTypeObject Core_Type;

/* pool.c */
int pool_init(Core *c);
void pool_free_mem(Core *c);
void fq_remove(Core *c, int32_t b);
void fq_append(Core *c, int32_t b);
void fq_prepend(Core *c, int32_t b);
int pool_get_new_blocks(Core *c, Py_ssize_t n, IVec *out);
void pool_touch(Core *c, const int32_t *blocks, Py_ssize_t n);
int pool_free_blocks(Core *c, const int32_t *blocks, Py_ssize_t n);
MapEntry *map_find(Core *c, const uint8_t *key);
int32_t map_first(Core *c, const uint8_t *digest, int gid);
int pool_cache_block(Core *c, int32_t b, const uint8_t *digest, int gid);
void pool_prefetch_cache(const Core *c, int32_t b, const uint8_t *digest, int gid);
void pool_evict(Core *c, int32_t b);
void pool_reset_cache(Core *c);
int keyset_add(KeySet *s, const uint8_t *key, int KL);
int keyset_has(const KeySet *s, const uint8_t *key, int KL);
void keyset_clear(KeySet *s, int KL);
void keyset_free(KeySet *s);

/* A request as the core reads it: the C Request directly, any other object
 * (a kvspec Request value, kvimpl's Python Request) through its attributes. */
typedef struct {
    PyObject *obj;    /* borrowed */
    ReqObject *nat;   /* obj when it is a C Request */
    PyObject *rid;    /* new reference, or borrowed from nat */
    Py_ssize_t computed, ntok, npreempt;
    PyObject *computed_obj; /* generic: the attribute value (new reference) */
    Py_ssize_t inflight;    /* num_in_flight_tokens; -1 when it is not an int >= 0 (inflight_obj holds it) */
    PyObject *inflight_obj; /* generic, when inflight is -1: the attribute value (new reference) */
    PyObject *status; /* new reference, or borrowed from nat */
    int skip;
    PyObject *hseq;   /* generic: block_hashes as a fast sequence (new reference) */
    Py_ssize_t nhash;
    int borrowed;     /* rid and status are borrowed from nat (alive for the call) */
} ReqView;

int rv_read(ReqView *rv, PyObject *obj, int need_hashes);
void rv_clear(ReqView *rv);
const uint8_t *rv_hash(Core *c, ReqView *rv, Py_ssize_t i); /* NULL with an error set */
int rv_check_digests(Core *c, ReqView *rv); /* -1 with an error set */
int rv_check(PyObject *obj); /* is it a request the core accepts? */
Py_ssize_t rv_num_hashes(ReqView *rv);

/* core.c */
Table *slot_table(Core *c, Py_ssize_t slot, int g);
Py_ssize_t slot_find(Core *c, PyObject *rid);        /* -1 if none; -2 on error */
Py_ssize_t slot_get(Core *c, PyObject *rid);         /* find or create; -2 on error */
void slot_release_if_empty(Core *c, Py_ssize_t slot);
int table_push(Table *t, int32_t b);
int table_reserve(Table *t, Py_ssize_t n);
Py_ssize_t skipped_tokens(const Group *g, Py_ssize_t n);

typedef struct {
    const int32_t *ids;
    Py_ssize_t n;
} Hits;

Py_ssize_t coord_num_blocks(Core *c, Py_ssize_t slot, Py_ssize_t num_tokens, const Hits *hits, Py_ssize_t total,
                            Py_ssize_t main_tokens, int apply_cap, Py_ssize_t num_external);
int coord_remove_skipped(Core *c, Py_ssize_t slot, Py_ssize_t total);
int coord_add_hits(Core *c, Py_ssize_t slot, const Hits *hits, Py_ssize_t local, Py_ssize_t external);
int coord_allocate_new(Core *c, Py_ssize_t slot, Py_ssize_t slots, Py_ssize_t main_tokens, Py_ssize_t *starts);
int coord_cache(Core *c, Py_ssize_t slot, ReqView *rv, Py_ssize_t num_tokens);
int group_cache(Core *c, Py_ssize_t slot, int g, ReqView *rv, Py_ssize_t num_tokens);
int core_forget_group(Core *c, Py_ssize_t slot, int g, IVec *out);
int core_allocate(Core *c, ReqView *rv, Py_ssize_t n_new, Py_ssize_t n_hit, const Hits *hits, int has_hits,
                  Py_ssize_t n_look, Py_ssize_t n_ext, int delay, int fsmf, Py_ssize_t reserved, int has_sched,
                  Py_ssize_t *starts, Py_ssize_t *slot_out);
int core_free(Core *c, PyObject *rid);
Py_ssize_t table_len_pub(Core *c, Py_ssize_t slot, int g);
static inline void tbl_touch(Table *t, Py_ssize_t i) {
    if (i < t->hlen)
        t->hlen = (int32_t)i;
}
int host_row_sync(Core *c, Py_ssize_t slot);
void host_row_drop(Core *c, Py_ssize_t slot);

/* events.c */
int ev_stored(Core *c, ReqView *rv, int g, const IVec *stored, Py_ssize_t num_cached, Py_ssize_t num_full,
              Py_ssize_t bs, Py_ssize_t k);
void ev_removed(Core *c, int32_t b);
int ev_cleared(Core *c);
PyObject *ev_take(Core *c, PyObject *unused);
PyObject *ev_pending(Core *c, PyObject *unused);

/* hit.c */
int coord_find_hit(Core *c, ReqView *rv, Py_ssize_t max_len, IVec *per_group, Py_ssize_t *hit_tokens);

/* Python floor division and ceiling division (ints may be negative). */
static inline Py_ssize_t floordiv(Py_ssize_t a, Py_ssize_t b) {
    /* Block sizes are mostly powers of two: a shift then replaces the
     * division (an arithmetic shift floors negative values too, as gcc and
     * clang define it), which was the largest cost of a quiet decode step. */
    if (b > 0 && (b & (b - 1)) == 0)
        return a >> __builtin_ctzll((unsigned long long)b);
    Py_ssize_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0)))
        q -= 1;
    return q;
}
static inline Py_ssize_t ceildiv(Py_ssize_t a, Py_ssize_t b) { return -floordiv(-a, b); }

#define NULL_BLOCK 0

#endif
