/*
 * The leader's record check in C: the walk of partition_log/records.py's
 * decode_records_section over one v2 batch's (decompressed) records section,
 * without building any record (Kafka's LogValidator iterates every record of
 * an uncompressed batch it appends; DefaultRecord.readFrom's checks).
 *
 * records_fit(data, count, last_offset_delta) -> bool answers whether
 * decode_records_section accepts data: True exactly when it would return,
 * False when it would raise.  It never builds the error message: on False
 * the caller runs the Python decoder, which raises the message naming the
 * record, the field and the position.  records.py is the reference; the
 * tests run both on random and damaged sections and compare the verdicts.
 *
 * Varints are zigzag base-128 as ByteUtils.readVarint/readVarlong read them:
 * at most 5 bytes (10 for the timestamp delta), the value not range-checked
 * beyond that, as the Python decoder does (5 bytes hold 35 bits: kept in an
 * int64 here, never overflowing).
 *
 * The module reads KQ_PURE_PYTHON once at import and exposes it as
 * pure_python_requested: partition_log/speedups.py then leaves this module
 * unused, so the same process runs the Python reference (the package's
 * Python modules do no environment or file access of their own).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

/* Reads the varint at *pos, bounded by end, of at most max_bytes bytes.
 * Returns 0 and advances *pos on success, -1 where decode_varint raises. */
static int
read_varint(const unsigned char *data, Py_ssize_t *pos, Py_ssize_t end, int max_bytes,
            int64_t *value)
{
    Py_ssize_t start = *pos;
    Py_ssize_t i = start;
    uint64_t z = 0;
    int shift = 0;
    for (;;) {
        unsigned char b;
        if (i >= end) {
            return -1; /* runs past the end */
        }
        if (i - start >= max_bytes) {
            return -1; /* longer than max_bytes */
        }
        b = data[i++];
        z |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            break;
        }
        shift += 7;
    }
    *pos = i;
    /* Zigzag: (z >> 1) ^ -(z & 1), as signed.  z < 2**70 may not fit in 64
     * bits for a 10-byte varlong, but only the timestamp delta reads 10
     * bytes and its value is never used. */
    *value = (int64_t)(z >> 1) ^ -(int64_t)(z & 1);
    return 0;
}

/* A key or value (or a header value): a length, -1 for null, then its bytes;
 * _decode_bytes's checks. */
static int
skip_bytes(const unsigned char *data, Py_ssize_t *pos, Py_ssize_t end)
{
    int64_t size;
    if (read_varint(data, pos, end, 5, &size) < 0) {
        return -1;
    }
    if (size == -1) {
        return 0;
    }
    if (size < -1 || size > end - *pos) {
        return -1;
    }
    *pos += (Py_ssize_t)size;
    return 0;
}

/* _decode_headers's checks: a non-negative count, then for each header a key
 * of valid UTF-8 (decoded by CPython's own strict decoder, so the verdict is
 * the Python reference's) and a value.  Returns -1 on a refusal, -2 with a
 * Python exception set (memory). */
static int
skip_headers(const unsigned char *data, Py_ssize_t *pos, Py_ssize_t end)
{
    int64_t count, key_size, i;
    if (read_varint(data, pos, end, 5, &count) < 0 || count < 0) {
        return -1;
    }
    for (i = 0; i < count; i++) {
        PyObject *key;
        if (read_varint(data, pos, end, 5, &key_size) < 0) {
            return -1;
        }
        if (key_size < 0 || key_size > end - *pos) {
            return -1;
        }
        key = PyUnicode_DecodeUTF8((const char *)data + *pos, (Py_ssize_t)key_size, "strict");
        if (key == NULL) {
            if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                PyErr_Clear();
                return -1;
            }
            return -2;
        }
        Py_DECREF(key);
        *pos += (Py_ssize_t)key_size;
        if (skip_bytes(data, pos, end) < 0) {
            return -1;
        }
    }
    return 0;
}

/* 1 if the section is well formed, 0 if not, -1 with an exception set. */
static int
walk(const unsigned char *data, Py_ssize_t end, long long count, long long last_offset_delta)
{
    Py_ssize_t pos = 0;
    int64_t previous_delta = -1;
    long long index;
    for (index = 0; index < count; index++) {
        int64_t length, timestamp_delta, offset_delta;
        Py_ssize_t record_end;
        if (pos >= end) {
            return 0; /* the section ends before count records */
        }
        if (read_varint(data, &pos, end, 5, &length) < 0) {
            return 0;
        }
        if (length < 0 || length > end - pos) {
            return 0;
        }
        record_end = pos + (Py_ssize_t)length;
        if (pos >= record_end) {
            return 0; /* no attributes byte */
        }
        pos += 1; /* attributes: unused */
        if (read_varint(data, &pos, record_end, 10, &timestamp_delta) < 0) {
            return 0;
        }
        if (read_varint(data, &pos, record_end, 5, &offset_delta) < 0) {
            return 0;
        }
        if (offset_delta <= previous_delta || offset_delta > last_offset_delta) {
            return 0;
        }
        previous_delta = offset_delta;
        if (skip_bytes(data, &pos, record_end) < 0 || skip_bytes(data, &pos, record_end) < 0) {
            return 0;
        }
        if (pos < record_end && data[pos] == 0) {
            pos += 1; /* no headers */
        }
        else {
            int headers = skip_headers(data, &pos, record_end);
            if (headers == -2) {
                return -1;
            }
            if (headers < 0) {
                return 0;
            }
        }
        if (pos != record_end) {
            return 0;
        }
    }
    return pos == end;
}

PyDoc_STRVAR(records_fit_doc,
"records_fit(data, count, last_offset_delta, /) -> bool\n"
"\n"
"Whether decode_records_section(data, count, ..., last_offset_delta) accepts\n"
"the records section data (any bytes-like object) without raising.");

static PyObject *
records_fit(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    long long count, last_offset_delta;
    int fit;
    (void)module;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "records_fit expects 3 arguments, got %zd", nargs);
        return NULL;
    }
    count = PyLong_AsLongLong(args[1]);
    if (count == -1 && PyErr_Occurred()) {
        return NULL;
    }
    last_offset_delta = PyLong_AsLongLong(args[2]);
    if (last_offset_delta == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    fit = walk((const unsigned char *)view.buf, view.len, count, last_offset_delta);
    PyBuffer_Release(&view);
    if (fit < 0) {
        return NULL;
    }
    return PyBool_FromLong(fit);
}

static PyMethodDef speedups_methods[] = {
    {"records_fit", (PyCFunction)(void (*)(void))records_fit, METH_FASTCALL, records_fit_doc},
    {NULL, NULL, 0, NULL},
};

static int
speedups_exec(PyObject *module)
{
    const char *pure = getenv("KQ_PURE_PYTHON");
    int requested = pure != NULL && pure[0] != '\0' && !(pure[0] == '0' && pure[1] == '\0');
    return PyModule_AddObjectRef(module, "pure_python_requested", requested ? Py_True : Py_False);
}

static PyModuleDef_Slot speedups_slots[] = {
    {Py_mod_exec, speedups_exec},
    {0, NULL},
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    "partition_log._speedups",
    "Compiled checks of the partition log's hot path; partition_log/records.py is the reference.",
    0,
    speedups_methods,
    speedups_slots,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModuleDef_Init(&speedups_module);
}
