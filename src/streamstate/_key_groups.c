/*
 * A key's key group in C: Java's hashCode of the key and Flink's murmur hash, for the key types
 * that make up nearly every job (int, str, bytes, bool, float and tuples of them). In Python
 * each key's group took about 2 µs (a loop over the string's code units), paid once per distinct
 * key of a run: in a job whose keys each see tens of records, a sixth of its per-record cost.
 *
 * The hashes are ``_java_hash.h``'s. The pure-Python reference is ``streamstate.keygroups``:
 * ``java_hash``, ``murmur_hash`` and ``assign_to_key_group``. Every key this code does not hash
 * (an int outside a Java long, a subclass, a type with a registered hash, None, a tuple holding
 * any of them) and an invalid ``max_parallelism`` go to the reference, so that its errors and
 * its registry stay the one definition.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_java_hash.h"

static PyObject *reference = NULL; /* keygroups.assign_to_key_group, Python */

static PyObject *
assign_to_key_group(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "assign_to_key_group takes 2 arguments");
        return NULL;
    }
    if (reference == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_key_groups.configure() was not called");
        return NULL;
    }
    uint32_t h;
    if (Py_TYPE(args[1]) == &PyLong_Type && ss_java_hash(args[0], &h) == 0) {
        int overflow = 0;
        long long max_parallelism = PyLong_AsLongLongAndOverflow(args[1], &overflow);
        if (overflow == 0 && max_parallelism > 0) {
            return PyLong_FromLong(ss_key_group(h, (long)max_parallelism));
        }
        PyErr_Clear();
    }
    return PyObject_Vectorcall(reference, args, 2, NULL);
}

static PyObject *
configure(PyObject *module, PyObject *fn)
{
    Py_INCREF(fn);
    Py_XSETREF(reference, fn);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"configure", configure, METH_O,
     "configure(reference): the Python assign_to_key_group, for every key this module does "
     "not hash."},
    {"assign_to_key_group", (PyCFunction)(void (*)(void))assign_to_key_group, METH_FASTCALL,
     "assign_to_key_group(key, max_parallelism, /)\n--\n\n"
     "The key group (``0 <= kg < max_parallelism``) that ``key`` belongs to: Flink's murmur "
     "hash of the key's Java ``hashCode`` (see :func:`java_hash`), bit for bit.\n\n"
     "Compiled for ``int``, ``str``, ``bytes``, ``bool``, ``float`` and tuples of them; any "
     "other key (and an invalid ``max_parallelism``) goes to the pure-Python definition, which "
     "raises the errors."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "streamstate._key_groups",
    .m_doc = "A key's key group in C (see the source's header).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__key_groups(void)
{
    return PyModule_Create(&module_def);
}
