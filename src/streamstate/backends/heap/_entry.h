/*
 * The copy-on-write map's compiled entry (_entry.c), whose fields the compiled value state
 * (_value_state.c) reads and writes directly.
 */
#ifndef STREAMSTATE_ENTRY_H
#define STREAMSTATE_ENTRY_H

#include <Python.h>

typedef struct {
    PyObject_HEAD
    PyObject *entry_version;
    PyObject *key;
    PyObject *namespace_;
    PyObject *next;
    PyObject *state;
    PyObject *state_version;
} Entry;

#endif
