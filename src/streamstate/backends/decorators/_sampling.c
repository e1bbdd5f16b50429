/*
 * The unsampled path of the metrics decorators (SPEC §8), compiled (issue 14: metrics overhead).
 *
 * A ``Sampled`` object stands for one operation of one decorated state: a call counts down and
 * goes straight to the decorated state's bound method (``fast``); every ``interval``-th call,
 * starting with the first, goes to ``sampled`` instead (the decorator's Python method that
 * times the call and records sizes). The pure-Python decorator does the same in a generated
 * method (``metrics.py``), whose own frame is most of the overhead this type removes.
 *
 * ``sampled`` is a bound method of the decorator, which holds this object: a reference cycle,
 * so the type supports the cyclic garbage collector.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

typedef struct {
    PyObject_HEAD
    PyObject *fast;
    PyObject *sampled;
    Py_ssize_t interval;
    Py_ssize_t left;
    vectorcallfunc vectorcall;
} Sampled;

static PyObject *
sampled_vectorcall(Sampled *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (--self->left > 0) {
        return PyObject_Vectorcall(self->fast, args, nargsf, kwnames);
    }
    self->left = self->interval;
    return PyObject_Vectorcall(self->sampled, args, nargsf, kwnames);
}

static PyObject *
sampled_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"fast", "sampled", "interval", NULL};
    PyObject *fast, *sampled;
    Py_ssize_t interval;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOn:Sampled", kwlist, &fast, &sampled,
                                     &interval)) {
        return NULL;
    }
    if (interval < 1) {
        PyErr_Format(PyExc_ValueError, "sample_interval must be >= 1, got %zd", interval);
        return NULL;
    }
    if (!PyCallable_Check(fast) || !PyCallable_Check(sampled)) {
        PyErr_SetString(PyExc_TypeError, "Sampled needs two callables");
        return NULL;
    }
    Sampled *self = (Sampled *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    Py_INCREF(fast);
    self->fast = fast;
    Py_INCREF(sampled);
    self->sampled = sampled;
    self->interval = interval;
    self->left = 1; /* the first call is sampled */
    self->vectorcall = (vectorcallfunc)sampled_vectorcall;
    return (PyObject *)self;
}

static int
sampled_traverse(Sampled *self, visitproc visit, void *arg)
{
    Py_VISIT(self->fast);
    Py_VISIT(self->sampled);
    return 0;
}

static int
sampled_clear(Sampled *self)
{
    Py_CLEAR(self->fast);
    Py_CLEAR(self->sampled);
    return 0;
}

static void
sampled_dealloc(Sampled *self)
{
    PyObject_GC_UnTrack(self);
    sampled_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
sampled_get_left(Sampled *self, void *closure)
{
    return PyLong_FromSsize_t(self->left);
}

static PyObject *
sampled_get_interval(Sampled *self, void *closure)
{
    return PyLong_FromSsize_t(self->interval);
}

static PyObject *
sampled_repr(Sampled *self)
{
    return PyUnicode_FromFormat("Sampled(%R, every %zd calls, next in %zd)", self->fast,
                                self->interval, self->left);
}

static PyGetSetDef sampled_getset[] = {
    {"left", (getter)sampled_get_left, NULL, "calls until the next sampled one", NULL},
    {"interval", (getter)sampled_get_interval, NULL, "one call in this many is sampled", NULL},
    {NULL}};

static PyTypeObject SampledType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "streamstate.backends.decorators._sampling.Sampled",
    .tp_doc = PyDoc_STR("Sampled(fast, sampled, interval): calls fast(...), and sampled(...) "
                        "on the 1st, interval+1-th, 2*interval+1-th, ... call."),
    .tp_basicsize = sizeof(Sampled),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = sampled_new,
    .tp_dealloc = (destructor)sampled_dealloc,
    .tp_traverse = (traverseproc)sampled_traverse,
    .tp_clear = (inquiry)sampled_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Sampled, vectorcall),
    .tp_repr = (reprfunc)sampled_repr,
    .tp_getset = sampled_getset,
};

static struct PyModuleDef sampling_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "streamstate.backends.decorators._sampling",
    .m_doc = "The metrics decorators' unsampled path, compiled (see metrics.py).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__sampling(void)
{
    if (PyType_Ready(&SampledType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&sampling_module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&SampledType);
    if (PyModule_AddObject(m, "Sampled", (PyObject *)&SampledType) < 0) {
        Py_DECREF(&SampledType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
