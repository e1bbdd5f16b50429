/*
 * The copy-on-write state map's entry as a compiled type (issue 14: memory per entry).
 *
 * Same fields, attribute names, constructor, ``hash`` property and repr as the pure-Python
 * reference ``streamstate.backends.heap.copy_on_write.PyStateMapEntry``; the map's code is the
 * same for both (it creates entries with ``object.__new__`` and sets the six attributes).
 *
 * Why compiled: every instance of a Python class carries the cyclic garbage collector's
 * 16-byte header, 80 of the ~170 bytes an int-state entry costs. An entry can never be part of
 * a reference cycle (chains are acyclic, versions are ints, and nothing the map hands out
 * refers back to an entry), so this type opts out of the collector: 64 bytes per entry, and
 * creating one no longer counts towards the young collections that walk every new container.
 * State objects inside entries stay tracked by the collector on their own; an untracked
 * holder only keeps them reachable, as any reference from C does.
 *
 * Deallocation is iterative along ``next``: a chain of entries whose hashes collide (an
 * adversarial input) can be arbitrarily long, and freeing it recursively would overflow the C
 * stack (CPython's trashcan, which guards recursive deallocation, works only for tracked types).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "_entry.h"

static PyTypeObject EntryType;

/* entries alive in this process (tests check that released snapshots free their copies;
   untracked objects are invisible to gc.get_objects) */
static Py_ssize_t live = 0;

static PyObject *
entry_alloc(PyTypeObject *type, Py_ssize_t nitems)
{
    PyObject *obj = PyType_GenericAlloc(type, nitems);
    if (obj != NULL) {
        live++;
    }
    return obj;
}

static void
entry_dealloc(Entry *self)
{
    Entry *e = self;
    while (e != NULL) {
        PyObject *next = e->next;
        e->next = NULL;
        Py_CLEAR(e->entry_version);
        Py_CLEAR(e->key);
        Py_CLEAR(e->namespace_);
        Py_CLEAR(e->state);
        Py_CLEAR(e->state_version);
        PyObject_Free(e);
        live--;
        /* the next entry dies with this one only if this one held its last reference: free it
           here instead of through Py_DECREF, which would recurse into this function */
        if (next != NULL && Py_IS_TYPE(next, &EntryType) && Py_REFCNT(next) == 1) {
            e = (Entry *)next;
        }
        else {
            Py_XDECREF(next);
            e = NULL;
        }
    }
}

static int
entry_init(Entry *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {
        "key", "namespace", "state", "next_", "entry_version", "state_version", NULL};
    PyObject *key, *namespace_, *state, *next, *entry_version, *state_version;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOO:StateMapEntry", kwlist, &key,
                                     &namespace_, &state, &next, &entry_version,
                                     &state_version)) {
        return -1;
    }
    Py_INCREF(key);
    Py_XSETREF(self->key, key);
    Py_INCREF(namespace_);
    Py_XSETREF(self->namespace_, namespace_);
    Py_INCREF(state);
    Py_XSETREF(self->state, state);
    Py_INCREF(next);
    Py_XSETREF(self->next, next);
    Py_INCREF(entry_version);
    Py_XSETREF(self->entry_version, entry_version);
    Py_INCREF(state_version);
    Py_XSETREF(self->state_version, state_version);
    return 0;
}

static PyObject *
entry_get_hash(Entry *self, void *closure)
{
    if (self->key == NULL || self->namespace_ == NULL) {
        PyErr_SetString(PyExc_AttributeError, "key");
        return NULL;
    }
    PyObject *pair = PyTuple_Pack(2, self->key, self->namespace_);
    if (pair == NULL) {
        return NULL;
    }
    Py_hash_t h = PyObject_Hash(pair);
    Py_DECREF(pair);
    if (h == -1 && PyErr_Occurred()) {
        return NULL;
    }
    return PyLong_FromSsize_t(h);
}

static PyObject *
entry_repr(Entry *self)
{
    PyObject *fields[5] = {self->key, self->namespace_, self->state, self->entry_version,
                           self->state_version};
    for (int i = 0; i < 5; i++) {
        if (fields[i] == NULL) {
            return PyUnicode_FromString("StateMapEntry(<unset>)");
        }
    }
    return PyUnicode_FromFormat("StateMapEntry(%R, %R, %R, entry_version=%S, state_version=%S)",
                                self->key, self->namespace_, self->state, self->entry_version,
                                self->state_version);
}

static PyObject *
entry_reduce(Entry *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *fields[6] = {self->key,   self->namespace_,     self->state,
                           self->next,  self->entry_version, self->state_version};
    for (int i = 0; i < 6; i++) {
        if (fields[i] == NULL) {
            PyErr_SetString(PyExc_TypeError, "cannot pickle a StateMapEntry with unset fields");
            return NULL;
        }
    }
    return Py_BuildValue("(O(OOOOOO))", (PyObject *)Py_TYPE(self), self->key, self->namespace_,
                         self->state, self->next, self->entry_version, self->state_version);
}

static PyMemberDef entry_members[] = {
    {"entry_version", T_OBJECT_EX, offsetof(Entry, entry_version), 0,
     "map version that owns the entry's structure (its next link)"},
    {"key", T_OBJECT_EX, offsetof(Entry, key), 0, "the key"},
    {"namespace", T_OBJECT_EX, offsetof(Entry, namespace_), 0, "the namespace"},
    {"next", T_OBJECT_EX, offsetof(Entry, next), 0, "the next entry of the chain, or None"},
    {"state", T_OBJECT_EX, offsetof(Entry, state), 0, "the state object"},
    {"state_version", T_OBJECT_EX, offsetof(Entry, state_version), 0,
     "map version that owns the state object"},
    {NULL}};

static PyGetSetDef entry_getset[] = {
    {"hash", (getter)entry_get_hash, NULL,
     "The hash that places the entry in its bucket (``hash((key, namespace))``).", NULL},
    {NULL}};

static PyMethodDef entry_methods[] = {
    {"__reduce__", (PyCFunction)entry_reduce, METH_NOARGS, NULL},
    {NULL}};

static PyTypeObject EntryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "streamstate.backends.heap._entry.StateMapEntry",
    .tp_doc = PyDoc_STR("One mapping of the copy-on-write state map: key, namespace, state, "
                        "chain link and two versions (compiled, not tracked by the cyclic GC)."),
    .tp_basicsize = sizeof(Entry),
    .tp_itemsize = 0,
    /* final and untracked: no Py_TPFLAGS_BASETYPE, no Py_TPFLAGS_HAVE_GC */
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_alloc = entry_alloc,
    .tp_dealloc = (destructor)entry_dealloc,
    .tp_init = (initproc)entry_init,
    .tp_repr = (reprfunc)entry_repr,
    .tp_members = entry_members,
    .tp_getset = entry_getset,
    .tp_methods = entry_methods,
};

static PyObject *
live_entries(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromSsize_t(live);
}

static PyMethodDef module_methods[] = {
    {"live_entries", live_entries, METH_NOARGS,
     "The number of compiled entries alive in this process."},
    {NULL}};

static struct PyModuleDef entry_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "streamstate.backends.heap._entry",
    .m_doc = "The copy-on-write state map's entry, compiled (see copy_on_write.py).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__entry(void)
{
    /* object.__new__ must accept this type, as it does the pure-Python entry: the map creates
       entries with object.__new__ (no __init__ frame), and object.__new__ refuses a static
       type whose tp_new differs from its own */
    EntryType.tp_new = PyBaseObject_Type.tp_new;
    if (PyType_Ready(&EntryType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&entry_module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&EntryType);
    if (PyModule_AddObject(m, "StateMapEntry", (PyObject *)&EntryType) < 0) {
        Py_DECREF(&EntryType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
