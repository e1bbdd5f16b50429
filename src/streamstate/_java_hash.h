/*
 * Java's hashCode of a key and Flink's murmur hash, in C, for the key types that make up nearly
 * every job (int, str, bytes, bool, float and tuples of them): shared by the compiled key group
 * (``_key_groups.c``) and the record loop (``runtime/_record_loop.c``), which routes records by
 * it. The pure-Python reference is ``streamstate.keygroups`` (``java_hash``, ``murmur_hash``);
 * a key these functions do not hash (an int outside a Java long, a subclass, a type with a
 * registered hash, None, a tuple holding any of them) is left to it.
 */
#ifndef STREAMSTATE_JAVA_HASH_H
#define STREAMSTATE_JAVA_HASH_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

/* 0 = hashed into *out; 1 = not a key these functions hash (the reference decides) */
static inline int ss_java_hash(PyObject *key, uint32_t *out);

static inline int
ss_hash_str(PyObject *s, uint32_t *out)
{
    if (PyUnicode_READY(s) < 0) {
        PyErr_Clear();
        return 1;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    uint32_t h = 0;
    switch (PyUnicode_KIND(s)) {
    case PyUnicode_1BYTE_KIND: {
        const Py_UCS1 *p = PyUnicode_1BYTE_DATA(s);
        for (Py_ssize_t i = 0; i < n; i++) {
            h = 31 * h + p[i];
        }
        break;
    }
    case PyUnicode_2BYTE_KIND: {
        /* a UTF-16 code unit each, lone surrogates included (the reference's surrogatepass) */
        const Py_UCS2 *p = PyUnicode_2BYTE_DATA(s);
        for (Py_ssize_t i = 0; i < n; i++) {
            h = 31 * h + p[i];
        }
        break;
    }
    default: {
        const Py_UCS4 *p = PyUnicode_4BYTE_DATA(s);
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_UCS4 c = p[i];
            if (c > 0xFFFF) { /* a surrogate pair, as Java's String holds it */
                c -= 0x10000;
                h = 31 * h + (0xD800 + (c >> 10));
                h = 31 * h + (0xDC00 + (c & 0x3FF));
            }
            else {
                h = 31 * h + c;
            }
        }
        break;
    }
    }
    *out = h;
    return 0;
}

static inline int
ss_hash_tuple(PyObject *t, uint32_t *out)
{
    uint32_t h = 1;
    Py_ssize_t n = PyTuple_GET_SIZE(t);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PyTuple_GET_ITEM(t, i);
        uint32_t eh = 0;
        if (e != Py_None && ss_java_hash(e, &eh) != 0) {
            return 1;
        }
        h = 31 * h + eh;
    }
    *out = h;
    return 0;
}

static inline int
ss_java_hash(PyObject *key, uint32_t *out)
{
    PyTypeObject *tp = Py_TYPE(key);
    if (tp == &PyLong_Type) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(key, &overflow);
        if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 1; /* the reference names the key that does not fit */
        }
        uint64_t u = (uint64_t)v;
        *out = (uint32_t)(u ^ (u >> 32));
        return 0;
    }
    if (tp == &PyUnicode_Type) {
        return ss_hash_str(key, out);
    }
    if (tp == &PyBool_Type) {
        *out = key == Py_True ? 1231 : 1237;
        return 0;
    }
    if (tp == &PyBytes_Type) {
        const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(key);
        Py_ssize_t n = PyBytes_GET_SIZE(key);
        uint32_t h = 1;
        for (Py_ssize_t i = 0; i < n; i++) {
            h = 31 * h + (uint32_t)(int32_t)(signed char)p[i]; /* Java's bytes are signed */
        }
        *out = h;
        return 0;
    }
    if (tp == &PyFloat_Type) {
        double d = PyFloat_AS_DOUBLE(key);
        uint64_t bits;
        if (d != d) {
            bits = 0x7FF8000000000000ULL; /* Double.hashCode's one NaN */
        }
        else {
            memcpy(&bits, &d, sizeof bits);
        }
        *out = (uint32_t)(bits ^ (bits >> 32));
        return 0;
    }
    if (tp == &PyTuple_Type) {
        return ss_hash_tuple(key, out);
    }
    return 1;
}

static inline uint32_t
ss_rotl32(uint32_t x, int r)
{
    return (x << r) | (x >> (32 - r));
}

/* Flink's MathUtils.murmurHash: a non-negative int */
static inline int32_t
ss_murmur_hash(uint32_t code)
{
    code *= 0xCC9E2D51u;
    code = ss_rotl32(code, 15);
    code *= 0x1B873593u;
    code = ss_rotl32(code, 13);
    code = code * 5 + 0xE6546B64u;
    code ^= 4;
    code ^= code >> 16;
    code *= 0x85EBCA6Bu;
    code ^= code >> 13;
    code *= 0xC2B2AE35u;
    code ^= code >> 16;
    int32_t mixed = (int32_t)code;
    if (mixed >= 0) {
        return mixed;
    }
    return mixed == INT32_MIN ? 0 : -mixed;
}

/* the key group of a key whose Java hash is h */
static inline long
ss_key_group(uint32_t h, long max_parallelism)
{
    return (long)ss_murmur_hash(h) % max_parallelism;
}

#endif
