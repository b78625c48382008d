/* Host block tables: the requests' tables written in place into one int32
 * buffer of shape (groups, rows, cols), row r holding the tables of the
 * request in row r (padded with the null block 0). Live requests occupy rows
 * 0 .. live-1; a freed row is filled by moving the last live row into it,
 * as vLLM's input batch condenses. The buffer belongs to
 * kvimpl.device_tables.BlockTable (a pinned torch tensor when CUDA is there),
 * which copies it to the device once per step. Only the entries a call
 * changed are written (Table.hlen: the leading entries already in the row).
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

void host_row_drop(Core *c, Py_ssize_t slot) {
    if (!c->host || slot < 0 || c->slot_row[slot] < 0)
        return;
    Py_ssize_t row = c->slot_row[slot], last = c->row_slot.n - 1;
    size_t bytes = (size_t)c->host_cols * sizeof(int32_t);
    if (row != last) {
        int32_t moved = c->row_slot.v[last];
        for (int g = 0; g < c->G; g++)
            memcpy(host_row(c, g, row), host_row(c, g, last), bytes);
        c->row_slot.v[row] = moved;
        c->slot_row[moved] = (int32_t)row;
    }
    for (int g = 0; g < c->G; g++)
        memset(host_row(c, g, last), 0, bytes);
    c->row_slot.n--;
    c->slot_row[slot] = -1;
    for (int g = 0; g < c->G; g++)
        slot_table(c, slot, g)->hlen = 0;
    c->host_dirty = 1;
}

int host_row_sync(Core *c, Py_ssize_t slot) {
    if (!c->host || slot < 0)
        return 0;
    if (!slot_present(c, slot)) {
        host_row_drop(c, slot);
        return 0;
    }
    if (c->slot_row[slot] < 0) {
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
        if (ivec_push(&c->row_slot, (int32_t)slot) < 0)
            return -1;
        c->slot_row[slot] = (int32_t)(c->row_slot.n - 1);
        for (int g = 0; g < c->G; g++)
            slot_table(c, slot, g)->hlen = 0;
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
        memcpy(host_row(c, g, row) + t->hlen, t->b + t->hlen, (size_t)(len - t->hlen) * sizeof(int32_t));
        t->hlen = (int32_t)len;
        c->host_dirty = 1;
    }
    return 0;
}

/* _bind_host_tables(address, rows, cols, owner, grow): use the int32 buffer
 * at address (groups x rows x cols, its first `live` rows already holding the
 * live rows) from now on; address 0 unbinds. Rebinding keeps the rows. */
PyObject *host_methods_bind(Core *c, PyObject *args) {
    unsigned long long addr;
    Py_ssize_t rows, cols;
    PyObject *owner, *grow;
    if (!PyArg_ParseTuple(args, "KnnOO", &addr, &rows, &cols, &owner, &grow))
        return NULL;
    if (addr && (rows < c->row_slot.n || cols < 1)) {
        PyErr_SetString(PyExc_ValueError, "host block table: too few rows or columns");
        return NULL;
    }
    int fresh = c->host == NULL;
    c->host = (int32_t *)(uintptr_t)addr;
    c->host_rows = rows;
    c->host_cols = cols;
    Py_INCREF(owner);
    Py_XSETREF(c->host_owner, owner);
    Py_INCREF(grow);
    Py_XSETREF(c->host_grow, grow);
    if (!addr) {
        for (Py_ssize_t s = 0; s < c->capslots; s++)
            c->slot_row[s] = -1;
        c->row_slot.n = 0;
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
        for (Py_ssize_t s = 0; s < c->capslots; s++)
            if (c->slot_rid[s] && host_row_sync(c, s) < 0)
                return NULL;
    }
    c->host_dirty = 1;
    Py_RETURN_NONE;
}

/* (request ids by row, dirty flag); reading clears the flag. */
PyObject *host_methods_rows(Core *c, PyObject *unused) {
    PyObject *ids = PyList_New(c->row_slot.n);
    if (!ids)
        return NULL;
    for (Py_ssize_t r = 0; r < c->row_slot.n; r++) {
        PyObject *rid = c->slot_rid[c->row_slot.v[r]];
        Py_INCREF(rid);
        PyList_SET_ITEM(ids, r, rid);
    }
    PyObject *res = Py_BuildValue("(Ni)", ids, c->host_dirty);
    c->host_dirty = 0;
    return res;
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

/* (live rows, dirty) without building the row list; reading clears the flag. */
PyObject *host_methods_state(Core *c, PyObject *unused) {
    PyObject *res = Py_BuildValue("(ni)", c->row_slot.n, c->host_dirty);
    c->host_dirty = 0;
    return res;
}
