/* The slot mapping of a step on CPU tables: one pass over the step's tokens
 * (kvimpl.device_tables uses it for CPU devices; CUDA has its Triton kernel).
 *
 * step_slots(table, rows, cols, req_rows, starts, counts, positions, out, out_len,
 *            vbs, pbs, world, rank, interleave)
 *   table:     address of an int32 table of `rows` x `cols` (one group, C order)
 *   req_rows, starts, counts: int32 buffers, one entry per request of the step
 *   positions: None (request i computes positions starts[i] .. starts[i] + counts[i] - 1)
 *              or an int64 buffer of sum(counts) positions (vLLM's form)
 *   out:       address of out_len int64 slots; exactly sum(counts) are written
 * A slot is the block's id times the physical block size `pbs` plus the
 * position's offset on context-parallel rank `rank` of `world` (interleaved
 * in chunks of `interleave` tokens), or -1 where another rank holds it; a
 * block spans `vbs` = pbs * world positions. Every row and table index is
 * bounds-checked: a position past its table raises instead of reading
 * memory that is not the table's. */
#include "native.h"

static int get_i32(PyObject *obj, Py_buffer *b, const char *what) {
    if (PyObject_GetBuffer(obj, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    if (b->itemsize != 4) {
        PyBuffer_Release(b);
        PyErr_Format(PyExc_TypeError, "step_slots: %s must be an int32 buffer", what);
        return -1;
    }
    return 0;
}

PyObject *kv_step_slots(PyObject *self, PyObject *args) {
    unsigned long long table_addr, out_addr;
    Py_ssize_t nrows, ncols, out_len, vbs, pbs, world, rank, inter;
    PyObject *rows_o, *starts_o, *counts_o, *pos_o;
    if (!PyArg_ParseTuple(args, "KnnOOOOKnnnnnn", &table_addr, &nrows, &ncols, &rows_o, &starts_o, &counts_o, &pos_o,
                          &out_addr, &out_len, &vbs, &pbs, &world, &rank, &inter))
        return NULL;
    if (vbs < 1 || pbs < 1 || world < 1 || inter < 1 || vbs != pbs * world) {
        PyErr_SetString(PyExc_ValueError, "step_slots: block sizes, world and interleave must be positive, vbs = pbs * world");
        return NULL;
    }
    Py_buffer rb, sb, cb, pb;
    int has_pos = pos_o != Py_None;
    if (get_i32(rows_o, &rb, "rows") < 0)
        return NULL;
    if (get_i32(starts_o, &sb, "starts") < 0) {
        PyBuffer_Release(&rb);
        return NULL;
    }
    if (get_i32(counts_o, &cb, "counts") < 0) {
        PyBuffer_Release(&rb);
        PyBuffer_Release(&sb);
        return NULL;
    }
    if (has_pos && PyObject_GetBuffer(pos_o, &pb, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&rb);
        PyBuffer_Release(&sb);
        PyBuffer_Release(&cb);
        return NULL;
    }
    PyObject *res = NULL;
    Py_ssize_t n = rb.len / 4;
    const int32_t *req_rows = rb.buf, *starts = sb.buf, *counts = cb.buf;
    const int64_t *positions = has_pos ? (const int64_t *)pb.buf : NULL;
    Py_ssize_t npos = has_pos ? pb.len / 8 : 0;
    if (sb.len / 4 != n || cb.len / 4 != n || (has_pos && pb.itemsize != 8)) {
        PyErr_SetString(PyExc_ValueError, "step_slots: rows, starts and counts differ in length, or positions are not int64");
        goto done;
    }
    const int32_t *table = (const int32_t *)(uintptr_t)table_addr;
    int64_t *out = (int64_t *)(uintptr_t)out_addr;
    Py_ssize_t j = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t row = req_rows[i];
        if (row < 0 || row >= nrows || counts[i] < 0) {
            PyErr_Format(G_.InvalidTokenCountError, "step_slots: request %zd: row %zd or count %d out of range", i, row,
                         (int)counts[i]);
            goto done;
        }
        const int32_t *line = table + row * ncols;
        for (int32_t k = 0; k < counts[i]; k++, j++) {
            if (j >= out_len) {
                PyErr_SetString(PyExc_ValueError, "step_slots: the counts add up to more slots than the output holds");
                goto done;
            }
            if (has_pos && j >= npos) {
                PyErr_SetString(PyExc_ValueError, "step_slots: fewer positions than the counts add up to");
                goto done;
            }
            int64_t pos = has_pos ? positions[j] : (int64_t)starts[i] + k;
            int64_t idx = pos / vbs, off = pos - idx * vbs;
            if (pos < 0 || idx >= ncols) {
                PyErr_Format(G_.InvalidTokenCountError,
                             "step_slots: position %lld of row %zd is past its table of %zd blocks", (long long)pos, row,
                             ncols);
                goto done;
            }
            int64_t block = line[idx];
            if (world == 1) {
                out[j] = block * pbs + off;
            } else if ((off / inter) % world != rank) {
                out[j] = -1;
            } else {
                out[j] = block * pbs + off / (world * inter) * inter + off % inter;
            }
        }
    }
    if (j != out_len) {
        PyErr_SetString(PyExc_ValueError, "step_slots: the counts add up to fewer slots than the output holds");
        goto done;
    }
    res = PyLong_FromSsize_t(j);
done:
    PyBuffer_Release(&rb);
    PyBuffer_Release(&sb);
    PyBuffer_Release(&cb);
    if (has_pos)
        PyBuffer_Release(&pb);
    return res;
}
