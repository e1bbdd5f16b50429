/*
 * The record loop in C: per record the key set on its subtask's backend, the function's
 * ``process_element`` called and what it yields collected, without the interpreter's loop
 * around it (its bytecode per record was more than half of a keyed function's cost above the
 * floor of any per-record Python API).
 *
 * The pure-Python reference is ``streamstate.runtime.operator``: ``process_records`` (the
 * routed loop), ``KeyedProcessOperator.process_runs`` (batch execution's runs) and
 * ``LocalRunner._routed`` (routing by key). Each function here does what its reference does,
 * record for record: the same calls in the same order, the same outputs, and on an error in
 * the function (or in what it returned) the same exception, after which the failing record's
 * ``(key, value)`` is appended to ``failed`` so that the caller adds the same note. The rare
 * cases (a function that returns something other than a generator or None, a backend whose
 * current key is set by a call) go to the same Python code as the reference.
 *
 * Fields of the key context and the process context are written at the offsets of their
 * ``__slots__`` members (found once by ``configure``); objects of other types get ``setattr``.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "_java_hash.h"

static PyTypeObject *key_context_type = NULL;
static Py_ssize_t key_offset = -1, kg_index_offset = -1;
static PyTypeObject *process_context_type = NULL;
static Py_ssize_t ts_offset = -1;
static PyObject *collect = NULL;          /* operator._collect(out, result, where) */
static PyObject *where_process = NULL;    /* "process_element" */
static PyObject *str_set_current_key = NULL;
static PyObject *str_key = NULL, *str_kg_index = NULL, *str_ts = NULL;

#define SLOT(obj, offset) (*(PyObject **)((char *)(obj) + (offset)))

static void
set_slot(PyObject *obj, Py_ssize_t offset, PyObject *value)
{
    PyObject *old = SLOT(obj, offset);
    if (old == value) {
        return;
    }
    Py_INCREF(value);
    SLOT(obj, offset) = value;
    Py_XDECREF(old);
}

static int
set_timestamp(PyObject *ctx, PyObject *ts)
{
    if (Py_TYPE(ctx) == process_context_type) {
        set_slot(ctx, ts_offset, ts);
        return 0;
    }
    return PyObject_SetAttr(ctx, str_ts, ts);
}

/* what the function returned, collected into out (the reference's generator test first) */
static int
collect_result(PyObject *result, PyObject *out)
{
    if (PyGen_CheckExact(result)) {
        PyObject *item;
        while ((item = PyIter_Next(result)) != NULL) {
            int rc = PyList_Append(out, item);
            Py_DECREF(item);
            if (rc < 0) {
                return -1;
            }
        }
        return PyErr_Occurred() ? -1 : 0;
    }
    if (result == Py_None) {
        return 0;
    }
    PyObject *r = PyObject_CallFunctionObjArgs(collect, out, result, where_process, NULL);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

static int
note_failure(PyObject *failed, PyObject *key, PyObject *value)
{
    /* keep the error; append (key, value) for the caller's note */
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    PyObject *pair = PyTuple_Pack(2, key, value);
    if (pair != NULL) {
        if (PyList_Append(failed, pair) < 0) {
            PyErr_Clear();
        }
        Py_DECREF(pair);
    }
    else {
        PyErr_Clear();
    }
    PyErr_Restore(type, exc, tb);
    return -1;
}

/* call fn(value, ctx) and collect it; on an error note (key, value) */
static int
call_function(PyObject *fn, PyObject *ctx, PyObject *key, PyObject *value, PyObject *out,
              PyObject *failed)
{
    PyObject *args[3] = {NULL, value, ctx};
    PyObject *result = PyObject_Vectorcall(fn, args + 1, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (result == NULL) {
        return note_failure(failed, key, value);
    }
    int rc = collect_result(result, out);
    Py_DECREF(result);
    if (rc < 0) {
        return note_failure(failed, key, value);
    }
    return 0;
}

/* one record through its route (operator.RecordRoute) */
static int
handle(PyObject *key, PyObject *value, PyObject *ts, PyObject *route, PyObject *out,
       PyObject *failed)
{
    if (!PyTuple_CheckExact(route) || PyTuple_GET_SIZE(route) != 7) {
        PyErr_Format(PyExc_TypeError, "a record route is a tuple of 7, got %R", route);
        return -1;
    }
    PyObject *fn = PyTuple_GET_ITEM(route, 0);
    PyObject *ctx = PyTuple_GET_ITEM(route, 1);
    PyObject *key_ctx = PyTuple_GET_ITEM(route, 2);
    PyObject *index = PyTuple_GET_ITEM(route, 3);
    PyObject *backend = PyTuple_GET_ITEM(route, 4);
    PyObject *listeners = PyTuple_GET_ITEM(route, 5);
    PyObject *kg = PyTuple_GET_ITEM(route, 6);
    int listening = PyList_CheckExact(listeners) ? PyList_GET_SIZE(listeners) > 0
                                                 : PyObject_IsTrue(listeners);
    if (listening < 0) {
        return -1;
    }
    if (key_ctx == Py_None || listening) {
        PyObject *r = PyObject_CallMethodObjArgs(backend, str_set_current_key, key, kg, NULL);
        if (r == NULL) {
            return -1;
        }
        Py_DECREF(r);
    }
    else if (Py_TYPE(key_ctx) == key_context_type) {
        set_slot(key_ctx, key_offset, key);
        set_slot(key_ctx, kg_index_offset, index);
    }
    else if (PyObject_SetAttr(key_ctx, str_key, key) < 0 ||
             PyObject_SetAttr(key_ctx, str_kg_index, index) < 0) {
        return -1;
    }
    if (set_timestamp(ctx, ts) < 0) {
        return -1;
    }
    return call_function(fn, ctx, key, value, out, failed);
}

static int
check_configured(void)
{
    if (collect == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_record_loop.configure() was not called");
        return -1;
    }
    return 0;
}

/* run_selected(records, selector, route_of_kg, max_parallelism, route_of_key, out, failed):
   LocalRunner._run_fast's loop: the key of each record selected, its key group computed here
   (``_java_hash.h``; cheaper than a lookup in a cache of routes per key, whose table misses the
   CPU's caches once a job has thousands of keys) and its route taken from ``route_of_kg``, or
   for a key these hashes leave to the reference, made by ``route_of_key(key)``; the record then
   handled with no timestamp */
static PyObject *
run_selected(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "run_selected takes 7 arguments");
        return NULL;
    }
    if (check_configured() < 0) {
        return NULL;
    }
    PyObject *selector = args[1], *route_of_kg = args[2], *route_of_key = args[4],
             *out = args[5], *failed = args[6];
    if (!PyList_CheckExact(route_of_kg) || !PyList_CheckExact(out) ||
        !PyList_CheckExact(failed)) {
        PyErr_SetString(PyExc_TypeError, "run_selected: route_of_kg, out and failed are lists");
        return NULL;
    }
    long max_parallelism = PyLong_AsLong(args[3]);
    if (max_parallelism == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (max_parallelism != PyList_GET_SIZE(route_of_kg)) {
        PyErr_Format(PyExc_ValueError, "run_selected: %zd routes for %ld key groups",
                     PyList_GET_SIZE(route_of_kg), max_parallelism);
        return NULL;
    }
    PyObject *it = PyObject_GetIter(args[0]);
    if (it == NULL) {
        return NULL;
    }
    PyObject *record;
    while ((record = PyIter_Next(it)) != NULL) {
        PyObject *key = PyObject_Vectorcall(selector, &record, 1, NULL);
        if (key == NULL) {
            Py_DECREF(record);
            Py_DECREF(it);
            return NULL;
        }
        PyObject *route;
        uint32_t h;
        if (ss_java_hash(key, &h) == 0) {
            route = PyList_GET_ITEM(route_of_kg, ss_key_group(h, max_parallelism));
            Py_INCREF(route);
        }
        else {
            route = PyObject_Vectorcall(route_of_key, &key, 1, NULL);
        }
        int rc = route == NULL ? -1 : handle(key, record, Py_None, route, out, failed);
        Py_XDECREF(route);
        Py_DECREF(key);
        Py_DECREF(record);
        if (rc < 0) {
            Py_DECREF(it);
            return NULL;
        }
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* run_zipped(keys, values, timestamps, key_groups, routes, out, failed): the operator's
   process_elements: (key, value, timestamp, routes[key_group]) of the zipped iterables, up to
   the shortest */
static PyObject *
run_zipped(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "run_zipped takes 7 arguments");
        return NULL;
    }
    if (check_configured() < 0) {
        return NULL;
    }
    PyObject *routes = args[4], *out = args[5], *failed = args[6];
    if (!PyDict_CheckExact(routes) || !PyList_CheckExact(out) || !PyList_CheckExact(failed)) {
        PyErr_SetString(PyExc_TypeError, "run_zipped: routes is a dict, out and failed lists");
        return NULL;
    }
    PyObject *its[4] = {NULL, NULL, NULL, NULL};
    for (int i = 0; i < 4; i++) {
        its[i] = PyObject_GetIter(args[i]);
        if (its[i] == NULL) {
            goto error;
        }
    }
    for (;;) {
        PyObject *items[4] = {NULL, NULL, NULL, NULL};
        int i;
        for (i = 0; i < 4; i++) {
            items[i] = PyIter_Next(its[i]);
            if (items[i] == NULL) {
                break;
            }
        }
        if (i < 4) { /* the shortest ended (or failed) */
            for (int j = 0; j < i; j++) {
                Py_DECREF(items[j]);
            }
            if (PyErr_Occurred()) {
                goto error;
            }
            break;
        }
        PyObject *route = PyDict_GetItemWithError(routes, items[3]);
        int rc;
        if (route == NULL) {
            if (!PyErr_Occurred()) {
                _PyErr_SetKeyError(items[3]);
            }
            rc = -1;
        }
        else {
            Py_INCREF(route);
            rc = handle(items[0], items[1], items[2], route, out, failed);
            Py_DECREF(route);
        }
        for (int j = 0; j < 4; j++) {
            Py_DECREF(items[j]);
        }
        if (rc < 0) {
            goto error;
        }
    }
    for (int i = 0; i < 4; i++) {
        Py_DECREF(its[i]);
    }
    Py_RETURN_NONE;
error:
    for (int i = 0; i < 4; i++) {
        Py_XDECREF(its[i]);
    }
    return NULL;
}

/* run_runs(keys, key_groups, lengths, values, timestamps, set_key, fn, ctx, out, failed): the
   operator's process_runs: per run set_key(key, key_group) once, then lengths[i] records of
   ``values`` (and ``timestamps``, or None) through fn. As in the reference, any error in the
   loop notes the last key and record seen (None before the first). */
static PyObject *
run_runs(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "run_runs takes 10 arguments");
        return NULL;
    }
    if (check_configured() < 0) {
        return NULL;
    }
    PyObject *set_key = args[5], *fn = args[6], *ctx = args[7], *out = args[8],
             *failed = args[9];
    if (!PyList_CheckExact(out) || !PyList_CheckExact(failed)) {
        PyErr_SetString(PyExc_TypeError, "run_runs: out and failed are lists");
        return NULL;
    }
    PyObject *its[4] = {NULL, NULL, NULL, NULL}; /* keys, key groups, lengths, values */
    PyObject *stamps = NULL;
    PyObject *key = Py_None, *value = Py_None; /* the last seen, for the note */
    PyObject *kg = NULL, *length = NULL;
    Py_INCREF(key);
    Py_INCREF(value);
    for (int i = 0; i < 4; i++) {
        if ((its[i] = PyObject_GetIter(args[i])) == NULL) {
            goto error;
        }
    }
    if (args[4] != Py_None && (stamps = PyObject_GetIter(args[4])) == NULL) {
        goto error;
    }
    for (;;) {
        PyObject *k = PyIter_Next(its[0]);
        if (k == NULL) {
            if (PyErr_Occurred()) {
                goto failed_error;
            }
            break;
        }
        kg = PyIter_Next(its[1]);
        length = kg ? PyIter_Next(its[2]) : NULL;
        if (length == NULL) {
            Py_DECREF(k);
            Py_CLEAR(kg);
            if (PyErr_Occurred()) {
                goto failed_error;
            }
            break;
        }
        Py_SETREF(key, k);
        Py_ssize_t n = PyNumber_AsSsize_t(length, PyExc_OverflowError);
        if (n == -1 && PyErr_Occurred()) {
            goto failed_error;
        }
        PyObject *pair[2] = {key, kg};
        PyObject *r = PyObject_Vectorcall(set_key, pair, 2, NULL);
        if (r == NULL) {
            goto failed_error;
        }
        Py_DECREF(r);
        Py_CLEAR(kg);
        Py_CLEAR(length);
        /* a key's end may have fired timers, which set the context's timestamp */
        if (stamps == NULL && set_timestamp(ctx, Py_None) < 0) {
            goto failed_error;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *v = PyIter_Next(its[3]);
            if (v == NULL) {
                if (PyErr_Occurred()) {
                    goto failed_error;
                }
                break;
            }
            if (stamps != NULL) {
                PyObject *ts = PyIter_Next(stamps);
                if (ts == NULL) {
                    Py_DECREF(v);
                    if (PyErr_Occurred()) {
                        goto failed_error;
                    }
                    break;
                }
                Py_SETREF(value, v);
                int rc = set_timestamp(ctx, ts);
                Py_DECREF(ts);
                if (rc < 0) {
                    goto failed_error;
                }
            }
            else {
                Py_SETREF(value, v);
            }
            PyObject *fargs[3] = {NULL, value, ctx};
            PyObject *result =
                PyObject_Vectorcall(fn, fargs + 1, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            if (result == NULL) {
                goto failed_error;
            }
            int rc = collect_result(result, out);
            Py_DECREF(result);
            if (rc < 0) {
                goto failed_error;
            }
        }
    }
    for (int i = 0; i < 4; i++) {
        Py_DECREF(its[i]);
    }
    Py_XDECREF(stamps);
    Py_DECREF(key);
    Py_DECREF(value);
    Py_RETURN_NONE;
failed_error:
    note_failure(failed, key, value);
error:
    Py_XDECREF(kg);
    Py_XDECREF(length);
    for (int i = 0; i < 4; i++) {
        Py_XDECREF(its[i]);
    }
    Py_XDECREF(stamps);
    Py_DECREF(key);
    Py_DECREF(value);
    return NULL;
}

static Py_ssize_t
slot_offset(PyObject *type, const char *name)
{
    PyObject *descr = PyObject_GetAttrString(type, name);
    if (descr == NULL) {
        return -1;
    }
    if (!Py_IS_TYPE(descr, &PyMemberDescr_Type) ||
        ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX) {
        PyErr_Format(PyExc_TypeError, "%R.%s is not an object slot", type, name);
        Py_DECREF(descr);
        return -1;
    }
    Py_ssize_t offset = ((PyMemberDescrObject *)descr)->d_member->offset;
    Py_DECREF(descr);
    return offset;
}

static PyObject *
configure(PyObject *module, PyObject *args)
{
    PyObject *kc, *pc, *fn;
    if (!PyArg_ParseTuple(args, "O!O!O:configure", &PyType_Type, &kc, &PyType_Type, &pc, &fn)) {
        return NULL;
    }
    Py_ssize_t k = slot_offset(kc, "key"), i = k < 0 ? -1 : slot_offset(kc, "kg_index");
    Py_ssize_t t = i < 0 ? -1 : slot_offset(pc, "_ts");
    if (t < 0) {
        return NULL;
    }
    Py_INCREF(kc);
    Py_INCREF(pc);
    Py_INCREF(fn);
    Py_XSETREF(key_context_type, (PyTypeObject *)kc);
    Py_XSETREF(process_context_type, (PyTypeObject *)pc);
    Py_XSETREF(collect, fn);
    key_offset = k;
    kg_index_offset = i;
    ts_offset = t;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(key_context_type, process_context_type, collect): the types whose slots the "
     "loops write and the Python collector of results other than generators and None."},
    {"run_selected", (PyCFunction)(void (*)(void))run_selected, METH_FASTCALL,
     "run_selected(records, selector, route_of_kg, max_parallelism, route_of_key, out, failed)"},
    {"run_zipped", (PyCFunction)(void (*)(void))run_zipped, METH_FASTCALL,
     "run_zipped(keys, values, timestamps, key_groups, routes, out, failed)"},
    {"run_runs", (PyCFunction)(void (*)(void))run_runs, METH_FASTCALL,
     "run_runs(keys, key_groups, lengths, values, timestamps, set_key, fn, ctx, out, failed)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "streamstate.runtime._record_loop",
    .m_doc = "The record loop in C (see the source's header).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__record_loop(void)
{
    where_process = PyUnicode_InternFromString("process_element");
    str_set_current_key = PyUnicode_InternFromString("set_current_key");
    str_key = PyUnicode_InternFromString("key");
    str_kg_index = PyUnicode_InternFromString("kg_index");
    str_ts = PyUnicode_InternFromString("_ts");
    if (!where_process || !str_set_current_key || !str_key || !str_kg_index || !str_ts) {
        return NULL;
    }
    return PyModule_Create(&module_def);
}
