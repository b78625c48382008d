/* Host block tables: the requests' tables written in place into one int32
 * buffer of shape (groups, rows, cols), row r holding the tables of the
 * request in row r (padded with the null block 0). The buffer belongs to
 * kvimpl.device_tables.BlockTable (a pinned torch tensor when CUDA is there),
 * which copies it to the device once per step. Only the entries a call
 * changed are written (Table.hlen: the leading entries already in the row).
 *
 * Rows follow vLLM's worker input batch (vllm/v1/worker/gpu_input_batch.py):
 * a freed row becomes a hole, a new request takes the lowest hole (else the
 * next row), and the step's commit (_host_commit) condenses: while the lowest
 * hole is below the last row in use, the last row moves into it.
 *
 * A copy of the buffer to the device may still be reading it when the next
 * step's calls write it (the copy is asynchronous on a GPU): after
 * _host_copy_started, the first write calls the fence first (the owner waits
 * for the copy there).
 */
#include "native.h"

static inline int32_t *host_row(Core *c, int g, Py_ssize_t row) {
    return c->host + ((Py_ssize_t)g * c->host_rows + row) * c->host_cols;
}

static int slot_present(Core *c, Py_ssize_t slot) {
    for (int g = 0; g < c->G; g++)
        if (slot_table(c, slot, g)->present)
            return 1;
    return 0;
}

/* Wait for an in-flight copy before the buffer is written. The fence is the
 * owner's and never raises (it keeps its own error for its next call); an
 * exception it still leaks is reported as unraisable rather than lost in a
 * caller that cannot fail. */
static void host_fence(Core *c) {
    if (!c->host_in_flight)
        return;
    c->host_in_flight = 0;
    if (!c->host_fence || c->host_fence == Py_None)
        return;
    PyObject *r = PyObject_CallNoArgs(c->host_fence);
    if (!r)
        PyErr_WriteUnraisable(c->host_fence);
    else
        Py_DECREF(r);
}

/* Insert a hole, keeping host_holes in descending order. Never allocates:
 * host_new_row reserves room for a hole per row in use. */
static void hole_add(Core *c, int32_t row) {
    IVec *h = &c->host_holes;
    Py_ssize_t i = h->n++;
    while (i > 0 && h->v[i - 1] < row) {
        h->v[i] = h->v[i - 1];
        i--;
    }
    h->v[i] = row;
}

static void move_row(Core *c, Py_ssize_t src, Py_ssize_t tgt) {
    size_t bytes = (size_t)c->host_cols * sizeof(int32_t);
    int32_t slot = c->row_slot.v[src];
    for (int g = 0; g < c->G; g++) {
        memcpy(host_row(c, g, tgt), host_row(c, g, src), bytes);
        memset(host_row(c, g, src), 0, bytes);
    }
    c->row_slot.v[tgt] = slot;
    c->row_slot.v[src] = -1;
    c->slot_row[slot] = (int32_t)tgt;
}

void host_row_drop(Core *c, Py_ssize_t slot) {
    if (!c->host || slot < 0 || c->slot_row[slot] < 0)
        return;
    host_fence(c);
    Py_ssize_t row = c->slot_row[slot];
    size_t bytes = (size_t)c->host_cols * sizeof(int32_t);
    for (int g = 0; g < c->G; g++) {
        memset(host_row(c, g, row), 0, bytes);
        slot_table(c, slot, g)->hlen = 0;
    }
    c->row_slot.v[row] = -1;
    c->slot_row[slot] = -1;
    hole_add(c, (int32_t)row);
    c->host_dirty = 1;
}

static int host_new_row(Core *c, Py_ssize_t slot) {
    if (c->host_holes.n > 0) {
        int32_t row = c->host_holes.v[--c->host_holes.n];
        c->row_slot.v[row] = (int32_t)slot;
        c->slot_row[slot] = row;
        return 0;
    }
    if (c->row_slot.n >= c->host_rows) {
        PyObject *r = PyObject_CallFunction(c->host_grow, "n", c->row_slot.n + 1);
        if (!r)
            return -1;
        Py_DECREF(r);
        if (c->row_slot.n >= c->host_rows) {
            PyErr_SetString(PyExc_RuntimeError, "host block table: the grow callback bound no larger buffer");
            return -1;
        }
    }
    if (ivec_reserve(&c->host_holes, c->row_slot.n + 1) < 0 || ivec_push(&c->row_slot, (int32_t)slot) < 0)
        return -1;
    c->slot_row[slot] = (int32_t)(c->row_slot.n - 1);
    return 0;
}

int host_row_sync(Core *c, Py_ssize_t slot) {
    if (!c->host || slot < 0)
        return 0;
    if (!slot_present(c, slot)) {
        host_row_drop(c, slot);
        return 0;
    }
    if (c->slot_row[slot] < 0) {
        host_fence(c);
        if (host_new_row(c, slot) < 0)
            return -1;
        for (int g = 0; g < c->G; g++)
            slot_table(c, slot, g)->hlen = 0;
        c->host_dirty = 1; /* a row newly in use is copied even when its tables are empty */
    }
    Py_ssize_t row = c->slot_row[slot];
    for (int g = 0; g < c->G; g++) {
        Table *t = slot_table(c, slot, g);
        Py_ssize_t len = t->present ? t->len : 0;
        if (t->hlen >= len)
            continue;
        if (len > c->host_cols) {
            PyErr_Format(PyExc_RuntimeError, "host block table: group %d table of %zd blocks > %zd columns", g, len,
                         c->host_cols);
            return -1;
        }
        host_fence(c);
        memcpy(host_row(c, g, row) + t->hlen, t->b + t->hlen, (size_t)(len - t->hlen) * sizeof(int32_t));
        t->hlen = (int32_t)len;
        c->host_dirty = 1;
    }
    return 0;
}

/* Condense as vLLM's input batch does at the end of a step's updates: drop
 * the holes at the end, then move the last row into the lowest hole, until
 * no hole is left. */
static void host_condense(Core *c) {
    IVec *h = &c->host_holes;
    while (h->n > 0) {
        while (h->n > 0 && h->v[0] == c->row_slot.n - 1) { /* the largest hole ends the rows in use */
            memmove(h->v, h->v + 1, (size_t)(h->n - 1) * sizeof(int32_t));
            h->n--;
            c->row_slot.n--;
        }
        if (h->n == 0)
            break;
        move_row(c, c->row_slot.n - 1, h->v[--h->n]);
        c->row_slot.n--;
        c->host_dirty = 1;
    }
}

/* _bind_host_tables(address, rows, cols, owner, grow, fence): use the int32
 * buffer at address (groups x rows x cols, its rows in use already holding
 * what they held) from now on; address 0 unbinds. Rebinding keeps the rows. */
PyObject *host_methods_bind(Core *c, PyObject *args) {
    unsigned long long addr;
    Py_ssize_t rows, cols;
    PyObject *owner, *grow, *fence;
    if (!PyArg_ParseTuple(args, "KnnOOO", &addr, &rows, &cols, &owner, &grow, &fence))
        return NULL;
    if (addr && (rows < c->row_slot.n || cols < 1)) {
        PyErr_SetString(PyExc_ValueError, "host block table: too few rows or columns");
        return NULL;
    }
    int fresh = c->host == NULL;
    c->host = (int32_t *)(uintptr_t)addr;
    c->host_rows = rows;
    c->host_cols = cols;
    c->host_in_flight = 0;
    Py_INCREF(owner);
    Py_XSETREF(c->host_owner, owner);
    Py_INCREF(grow);
    Py_XSETREF(c->host_grow, grow);
    Py_INCREF(fence);
    Py_XSETREF(c->host_fence, fence);
    if (!addr) {
        for (Py_ssize_t s = 0; s < c->capslots; s++)
            c->slot_row[s] = -1;
        c->row_slot.n = 0;
        c->host_holes.n = 0;
        Py_RETURN_NONE;
    }
    if (fresh) {
        /* First binding: every request holding a table gets a row, in slot order. */
        for (Py_ssize_t s = 0; s < c->capslots; s++) {
            c->slot_row[s] = -1;
            for (int g = 0; g < c->G; g++)
                slot_table(c, s, g)->hlen = 0;
        }
        c->row_slot.n = 0;
        c->host_holes.n = 0;
        for (Py_ssize_t s = 0; s < c->capslots; s++)
            if (c->slot_rid[s] && host_row_sync(c, s) < 0)
                return NULL;
    }
    c->host_dirty = 1;
    Py_RETURN_NONE;
}

/* (request id or None per row in use, dirty flag); reading changes nothing. */
PyObject *host_methods_rows(Core *c, PyObject *unused) {
    PyObject *ids = PyList_New(c->row_slot.n);
    if (!ids)
        return NULL;
    for (Py_ssize_t r = 0; r < c->row_slot.n; r++) {
        int32_t slot = c->row_slot.v[r];
        PyObject *rid = slot >= 0 ? c->slot_rid[slot] : Py_None;
        Py_INCREF(rid);
        PyList_SET_ITEM(ids, r, rid);
    }
    return Py_BuildValue("(Ni)", ids, c->host_dirty);
}

/* The host rows of the requests with the given handles, as array('i'). */
PyObject *host_methods_rows_of(Core *c, PyObject *arg) {
    Py_buffer hb;
    if (PyObject_GetBuffer(arg, &hb, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (hb.itemsize != 4) {
        PyBuffer_Release(&hb);
        PyErr_SetString(PyExc_TypeError, "handles must be an int32 buffer");
        return NULL;
    }
    Py_ssize_t n = hb.len / 4;
    const int32_t *hs = hb.buf;
    PyObject *bytes = PyBytes_FromStringAndSize(NULL, n * 4);
    if (!bytes) {
        PyBuffer_Release(&hb);
        return NULL;
    }
    int32_t *out = (int32_t *)PyBytes_AS_STRING(bytes);
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t h = hs[i];
        if (h < 0 || h >= c->capslots || !c->slot_rid[h] || c->slot_row[h] < 0) {
            PyBuffer_Release(&hb);
            Py_DECREF(bytes);
            PyErr_Format(G_.UnknownRequestError, "host_rows_of: handle %d has no host-table row", (int)h);
            return NULL;
        }
        out[i] = c->slot_row[h];
    }
    PyBuffer_Release(&hb);
    PyObject *arr = PyImport_ImportModule("array");
    PyObject *res = NULL;
    if (arr) {
        res = PyObject_CallMethod(arr, "array", "sO", "i", bytes);
        Py_DECREF(arr);
    }
    Py_DECREF(bytes);
    return res;
}

/* (rows in use, requests with a row, dirty) without building the row list; reading changes nothing. */
PyObject *host_methods_state(Core *c, PyObject *unused) {
    return Py_BuildValue("(nni)", c->row_slot.n, c->row_slot.n - c->host_holes.n, c->host_dirty);
}

/* The step's commit: condense the rows, then (rows in use, dirty); clears the flag. */
PyObject *host_methods_commit(Core *c, PyObject *unused) {
    host_fence(c);
    host_condense(c);
    PyObject *res = Py_BuildValue("(ni)", c->row_slot.n, c->host_dirty);
    c->host_dirty = 0;
    return res;
}

/* The owner started a copy of the buffer: fence the next write. */
PyObject *host_methods_in_flight(Core *c, PyObject *unused) {
    c->host_in_flight = 1;
    Py_RETURN_NONE;
}
