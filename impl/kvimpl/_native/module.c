/* The module kvimpl._kvnative: the Request and Core types, the block hash
 * function, and setup(), which kvimpl.native calls once with the kvspec
 * classes the core raises and compares against. */
#include "native.h"

Globals G_;

int api_init(PyObject *module);

static int grab(PyObject *mod, const char *name, PyObject **out) {
    *out = PyObject_GetAttrString(mod, name);
    return *out ? 0 : -1;
}

/* setup(errors, RequestStatus, spec_request_type, py_request_type, InvariantViolation) */
static PyObject *kv_setup(PyObject *self, PyObject *args) {
    PyObject *errors, *status, *spec_req, *py_req, *inv;
    if (!PyArg_ParseTuple(args, "OOOOO", &errors, &status, &spec_req, &py_req, &inv))
        return NULL;
    if (G_.ready)
        Py_RETURN_NONE;
    if (grab(errors, "InvalidTokenCountError", &G_.InvalidTokenCountError) < 0 ||
        grab(errors, "GroupCountError", &G_.GroupCountError) < 0 ||
        grab(errors, "ExceedsMaxModelLenError", &G_.ExceedsMaxModelLenError) < 0 ||
        grab(errors, "UnexpectedPrefixHitError", &G_.UnexpectedPrefixHitError) < 0 ||
        grab(errors, "InvalidBlockIdError", &G_.InvalidBlockIdError) < 0 ||
        grab(errors, "StaleHitError", &G_.StaleHitError) < 0 || grab(errors, "DoubleFreeError", &G_.DoubleFreeError) < 0 ||
        grab(errors, "PoolExhaustedError", &G_.PoolExhaustedError) < 0 ||
        grab(errors, "UnknownRequestError", &G_.UnknownRequestError) < 0 ||
        grab(errors, "InvalidRequestError", &G_.InvalidRequestError) < 0 ||
        grab(errors, "CacheBeyondAllocationError", &G_.CacheBeyondAllocationError) < 0 ||
        grab(errors, "UnsupportedOperationError", &G_.UnsupportedOperationError) < 0 ||
        grab(status, "WAITING", &G_.status_waiting) < 0 || grab(status, "PREEMPTED", &G_.status_preempted) < 0 ||
        grab(status, "RUNNING", &G_.status_running) < 0)
        return NULL;
    Py_INCREF(status);
    G_.status_type = status;
    Py_INCREF(spec_req);
    G_.spec_request_type = spec_req;
    Py_INCREF(py_req);
    G_.py_request_type = py_req;
    Py_INCREF(inv);
    G_.InvariantViolation = inv;
#define INTERN(field, text)                                                                                           \
    if (!(G_.field = PyUnicode_InternFromString(text)))                                                               \
        return NULL;
    INTERN(s_request_id, "request_id");
    INTERN(s_num_computed_tokens, "num_computed_tokens");
    INTERN(s_all_token_ids, "all_token_ids");
    INTERN(s_block_hashes, "block_hashes");
    INTERN(s_status, "status");
    INTERN(s_skip_reading_prefix_cache, "skip_reading_prefix_cache");
    INTERN(s_num_preemptions, "num_preemptions");
    INTERN(s_num_in_flight_tokens, "num_in_flight_tokens");
    INTERN(s_num_tokens, "num_tokens");
    INTERN(s_record, "record");
#undef INTERN
    G_.ready = 1;
    Py_RETURN_NONE;
}

/* sha256_cbor_block(parent, tokens) -> digest: the block hash of sha256_cbor without extra keys. */
static PyObject *kv_sha256_cbor_block(PyObject *self, PyObject *args) {
    Py_buffer parent;
    PyObject *tokens;
    if (!PyArg_ParseTuple(args, "y*O", &parent, &tokens))
        return NULL;
    PyObject *seq = PySequence_Fast(tokens, "tokens must be a sequence of ints");
    if (!seq) {
        PyBuffer_Release(&parent);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int64_t *buf = PyMem_Malloc((size_t)(n + 1) * sizeof(int64_t));
    PyObject *res = NULL;
    if (!buf) {
        PyErr_NoMemory();
        goto end;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (v == -1 && PyErr_Occurred())
            goto end;
        if (v < 0) {
            PyErr_SetString(PyExc_ValueError, "token ids must be non-negative");
            goto end;
        }
        buf[i] = v;
    }
    uint8_t out[32];
    sha256_cbor_block(parent.buf, (size_t)parent.len, buf, n, out);
    res = PyBytes_FromStringAndSize((const char *)out, 32);
end:
    PyMem_Free(buf);
    Py_DECREF(seq);
    PyBuffer_Release(&parent);
    return res;
}

PyObject *kv_step_slots(PyObject *self, PyObject *args); /* slots.c */

static PyMethodDef kv_methods[] = {
    {"setup", kv_setup, METH_VARARGS, "Bind the kvspec classes (called once by kvimpl.native)."},
    {"sha256_cbor_block", kv_sha256_cbor_block, METH_VARARGS,
     "sha256_cbor_block(parent, tokens) -> the sha256_cbor hash of a block without extra keys."},
    {"step_slots", kv_step_slots, METH_VARARGS, "The slot mapping of a step on a CPU table (see slots.c)."},
    {NULL},
};

static struct PyModuleDef kv_module = {
    PyModuleDef_HEAD_INIT, "kvimpl._kvnative",
    "kvimpl's native core (C): the KV-cache manager state and a mutable request; see kvimpl.native.", -1,
    kv_methods,
};

PyMODINIT_FUNC PyInit__kvnative(void) {
    if (PyType_Ready(&Req_Type) < 0 || PyType_Ready(&Core_Type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&kv_module);
    if (!m)
        return NULL;
    Py_INCREF(&Req_Type);
    Py_INCREF(&Core_Type);
    if (PyModule_AddObject(m, "Request", (PyObject *)&Req_Type) < 0 ||
        PyModule_AddObject(m, "Core", (PyObject *)&Core_Type) < 0 || api_init(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "ABI", 1);
    return m;
}
