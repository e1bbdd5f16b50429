/*
 * The heap value state's ``value()`` and ``update()`` in C: the hottest calls of a keyed
 * function (a read-modify-write per record), without the two Python frames of each (the
 * state's method, then the copy-on-write map's ``get`` or ``put``).
 *
 * The pure-Python reference is ``HeapValueState.value`` / ``update`` with
 * ``CopyOnWriteStateMap.get`` / ``put`` (``states.py``, ``copy_on_write.py``): these methods
 * take the common path of those in C and hand everything else to them, so that there is one
 * definition of every rare case:
 *
 *  - value(): the current key's entry found and not shared with an open snapshot: its state is
 *    returned, and the entry is remembered as the map's last hit (as ``get`` does, so that
 *    ``update`` writes to it without a lookup). A miss returns the descriptor's default when it
 *    needs no copy.
 *  - update(v): ``v`` of the serializer's class, written to the map's last hit when it is this
 *    key's and namespace's entry (the very objects, as ``put`` checks), no rehash is running and
 *    the entry is not shared with a snapshot; else the entry is looked up and written, or, for
 *    a key the map does not hold, a new entry is inserted at the head of its bucket exactly as
 *    ``_add_entry`` does, unless the insert would double the table or grow the next one (its
 *    threshold or spare mark reached) or the bucket arrays are shared with a snapshot.
 *  - while an incremental rehash runs, both first move a step of buckets as
 *    ``_incremental_rehash`` does (whole buckets, at least four entries), then look in the
 *    table the rehash index selects; only when no snapshot is open (nothing to copy) and the
 *    step does not finish the rehash (swapping the tables is Python's).
 *  - Everything else (a shared entry, a copied default, no current key, a map of another type,
 *    the cases above) calls the Python method, decided before anything is changed.
 *  - a change-tracking map (an incremental heap backend's, ``incremental.py``): the same, with
 *    the change recorded as ``TrackingStateMap.put`` records it (before the write) and, for a
 *    map that tracks reads, a value read recorded as its ``get`` does; only for the void
 *    namespace (other namespaces' records are the Python methods').
 *
 * The objects are ordinary Python instances with ``__slots__``: their fields are read and
 * written at the offsets of their member descriptors, found once by ``bind``. ``bind`` also
 * checks this build's tuple hash against Python's (the map hashes ``(key, namespace)``), and
 * refuses to bind when anything does not match, so that the Python methods stay in place.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "_entry.h"

/* what a method is: the heap value state's value()/update(), or the single-key value state's
   (batch execution, backends/batch/states.py: the value of the current key in a slot) */
enum { HEAP_VALUE, HEAP_UPDATE, SINGLE_VALUE, SINGLE_UPDATE };

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int is_update;
    int kind;
    PyObject *name;        /* "value" or "update" */
    PyObject *fallback;    /* the Python method (a function) */
    PyObject *doc;
    PyTypeObject *state_type;
    PyTypeObject *map_type;
    /* the map's change-tracking subclasses (incremental checkpoints), without and with read
       tracking, or NULL; both record VOID_NAMESPACE changes in two lists */
    PyTypeObject *tracking_type;
    PyTypeObject *read_tracking_type;
    PyObject *void_namespace;
    PyTypeObject *context_type;
    PyTypeObject *entry_type;
    PyObject *empty_table;
    PyObject *no_hit;          /* the map's last-hit key when it has none */
    Py_ssize_t min_transferred; /* entries a rehash step moves at least */
    /* the last namespace hashed, and its hash: the void namespace is a msgspec Struct whose
       hash is computed anew on every call (a namespace's hash never changes: it is a dict key) */
    PyObject *last_ns;
    Py_hash_t last_ns_hash;
    /* offsets: the state's fields */
    Py_ssize_t s_ctx, s_maps, s_ns, s_default, s_copy_default, s_value_class, s_value;
    /* the key context's */
    Py_ssize_t c_key, c_kg_index;
    /* the map's */
    Py_ssize_t m_rehash_table, m_primary, m_mask, m_required, m_hit, m_hit_key, m_hit_namespace,
        m_state_map_version;
    /* the map's, for inserts and rehash steps */
    Py_ssize_t m_shared, m_threshold, m_spare_mark, m_mod_count, m_primary_size, m_rehash_size,
        m_rehash_index, m_last_namespace;
    /* the tracking maps': the records of VOID_NAMESPACE changes and their limit */
    Py_ssize_t t_void_keys, t_void_states, t_limit;
} FastMethod;

/* what kind of map the current key's is */
enum { PLAIN_MAP, TRACKING_MAP, READ_TRACKING_MAP };

#define SLOT(obj, offset) (*(PyObject **)((char *)(obj) + (offset)))

/* The helpers of the per-call path are forced inline (Py_ALWAYS_INLINE): called from both
   methods, the compiler would otherwise keep them as calls, a few ns on every value() and
   update() of a key the map holds. */

/* the fallback: the Python method called as it would have been */
static PyObject *
call_fallback(FastMethod *m, PyObject *const *args, size_t nargs)
{
    return PyObject_Vectorcall(m->fallback, args, nargs, NULL);
}

/* CPython's tuple hash of (a, b) without building the tuple (Objects/tupleobject.c, xxHash
   since 3.8; bind checks it against hash() before these methods are used) */
#if SIZEOF_PY_UHASH_T > 4
#define XXPRIME_1 ((Py_uhash_t)11400714785074694791ULL)
#define XXPRIME_2 ((Py_uhash_t)14029467366897019727ULL)
#define XXPRIME_5 ((Py_uhash_t)2870177450012600261ULL)
#define XXROTATE(x) ((x << 31) | (x >> 33))
#else
#define XXPRIME_1 ((Py_uhash_t)2654435761UL)
#define XXPRIME_2 ((Py_uhash_t)2246822519UL)
#define XXPRIME_5 ((Py_uhash_t)374761393UL)
#define XXROTATE(x) ((x << 13) | (x >> 19))
#endif

static Py_hash_t
combine(Py_uhash_t lane_a, Py_uhash_t lane_b)
{
    Py_uhash_t acc = XXPRIME_5;
    acc += lane_a * XXPRIME_2;
    acc = XXROTATE(acc);
    acc *= XXPRIME_1;
    acc += lane_b * XXPRIME_2;
    acc = XXROTATE(acc);
    acc *= XXPRIME_1;
    acc += 2 ^ (XXPRIME_5 ^ 3527539UL);
    if (acc == (Py_uhash_t)-1) {
        return 1546275796;
    }
    return (Py_hash_t)acc;
}

static Py_hash_t
pair_hash(PyObject *a, PyObject *b)
{
    Py_hash_t ha = PyObject_Hash(a);
    if (ha == -1) {
        return -1;
    }
    Py_hash_t hb = PyObject_Hash(b);
    if (hb == -1) {
        return -1;
    }
    return combine((Py_uhash_t)ha, (Py_uhash_t)hb);
}

/* the value of an exact int of at most one digit (versions, indices: the common case), else
   the flag is 0 */
static inline Py_ssize_t
small_int(PyObject *obj, int *ok)
{
    if (PyLong_CheckExact(obj)) {
        Py_ssize_t size = Py_SIZE(obj);
        if (size == 0) {
            *ok = 1;
            return 0;
        }
        if (size == 1) {
            *ok = 1;
            return (Py_ssize_t)((PyLongObject *)obj)->ob_digit[0];
        }
    }
    *ok = 0;
    return 0;
}

/* a < b for two ints (versions); -1 on anything that is not a machine-sized int */
static inline Py_ALWAYS_INLINE int
version_less(PyObject *a, PyObject *b)
{
    int ok_a, ok_b;
    Py_ssize_t sa = small_int(a, &ok_a), sb = small_int(b, &ok_b);
    if (ok_a && ok_b) {
        return sa < sb;
    }
    if (!PyLong_CheckExact(a) || !PyLong_CheckExact(b)) {
        return -1;
    }
    long long x = PyLong_AsLongLong(a);
    long long y = PyLong_AsLongLong(b);
    if ((x == -1 || y == -1) && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return x < y;
}

/* The current key's map, key and namespace, or 0 when the fast path does not apply; *tracking
   says whether the map records changes (PLAIN_MAP, TRACKING_MAP, READ_TRACKING_MAP),
   *rehashing whether an incremental rehash is in progress. */
static inline Py_ALWAYS_INLINE int
locate(FastMethod *m, PyObject *self, PyObject **map, PyObject **key, PyObject **ns,
       int *tracking, int *rehashing)
{
    PyObject *ctx = SLOT(self, m->s_ctx);
    if (ctx == NULL || Py_TYPE(ctx) != m->context_type) {
        return 0;
    }
    PyObject *k = SLOT(ctx, m->c_key);
    PyObject *kgi = SLOT(ctx, m->c_kg_index);
    PyObject *maps = SLOT(self, m->s_maps);
    PyObject *n = SLOT(self, m->s_ns);
    if (k == NULL || k == Py_None || kgi == NULL || maps == NULL || n == NULL || n == Py_None ||
        !PyList_CheckExact(maps)) {
        return 0;
    }
    int ok;
    Py_ssize_t index = small_int(kgi, &ok);
    if (!ok || index >= PyList_GET_SIZE(maps)) {
        return 0;
    }
    PyObject *mp = PyList_GET_ITEM(maps, index);
    PyTypeObject *tp = Py_TYPE(mp);
    if (tp == m->map_type) {
        *tracking = PLAIN_MAP;
    }
    else if (tp != NULL && (tp == m->tracking_type || tp == m->read_tracking_type)) {
        /* records of other namespaces (pairs) are the Python methods' */
        if (n != m->void_namespace || !PyList_CheckExact(SLOT(mp, m->t_void_keys)) ||
            !PyList_CheckExact(SLOT(mp, m->t_void_states)) ||
            !PyLong_CheckExact(SLOT(mp, m->t_limit))) {
            return 0;
        }
        *tracking = tp == m->tracking_type ? TRACKING_MAP : READ_TRACKING_MAP;
    }
    else {
        return 0;
    }
    PyObject *rehash_table = SLOT(mp, m->m_rehash_table);
    PyObject *primary = SLOT(mp, m->m_primary);
    if (rehash_table == NULL || primary == NULL || !PyList_CheckExact(primary)) {
        return 0;
    }
    *rehashing = rehash_table != m->empty_table;
    *map = mp;
    *key = k;
    *ns = n;
    return 1;
}

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

/* store a new reference (stolen) in a slot; the old value is returned, to be released once the
   map is consistent again */
static PyObject *
swap_slot(PyObject *obj, Py_ssize_t offset, PyObject *value)
{
    PyObject *old = SLOT(obj, offset);
    SLOT(obj, offset) = value;
    return old;
}

/* the value of an int slot that fits a Py_ssize_t; 0 when it holds anything else */
static inline Py_ALWAYS_INLINE int
ssize_slot(PyObject *obj, Py_ssize_t offset, Py_ssize_t *out)
{
    PyObject *v = SLOT(obj, offset);
    if (v == NULL) {
        return 0;
    }
    int ok;
    *out = small_int(v, &ok);
    if (ok) {
        return 1;
    }
    if (!PyLong_CheckExact(v)) {
        return 0;
    }
    *out = PyLong_AsSsize_t(v);
    if (*out == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* the hash of a namespace: the last one's is kept (the void namespace is a msgspec Struct whose
   hash is computed anew on every call; a namespace's hash never changes: it is a dict key) */
static inline Py_ALWAYS_INLINE int
namespace_hash(FastMethod *m, PyObject *ns, Py_hash_t *out)
{
    if (ns != m->last_ns) {
        Py_hash_t hn = PyObject_Hash(ns);
        if (hn == -1) {
            return -1;
        }
        Py_INCREF(ns);
        Py_XSETREF(m->last_ns, ns);
        m->last_ns_hash = hn;
    }
    *out = m->last_ns_hash;
    return 0;
}

/* hash((key, ns)), the map's hash */
static inline Py_ALWAYS_INLINE int
map_hash(FastMethod *m, PyObject *key, PyObject *ns, Py_hash_t *out)
{
    Py_hash_t hk = PyObject_Hash(key);
    if (hk == -1) {
        return -1;
    }
    Py_hash_t hn;
    if (namespace_hash(m, ns, &hn) < 0) {
        return -1;
    }
    *out = combine((Py_uhash_t)hk, (Py_uhash_t)hn);
    return 0;
}

/* No snapshot is open (no entry or state is shared with one: nothing to copy) and the bucket
   arrays are the map's own (nothing to unshare). */
static int
unshared(FastMethod *m, PyObject *map)
{
    PyObject *required = SLOT(map, m->m_required);
    int ok;
    return SLOT(map, m->m_shared) == Py_False && required != NULL &&
           small_int(required, &ok) == 0 && ok;
}

/* An insert into this map is _add_entry's plain case: it neither doubles the table (the size
   reached the threshold) nor grows the next one (the spare mark), and the bucket arrays are the
   map's own. */
static int
can_insert(FastMethod *m, PyObject *map)
{
    Py_ssize_t primary_size, rehash_size, threshold, spare_mark;
    if (SLOT(map, m->m_shared) != Py_False || !ssize_slot(map, m->m_primary_size, &primary_size) ||
        !ssize_slot(map, m->m_rehash_size, &rehash_size) ||
        !ssize_slot(map, m->m_threshold, &threshold) ||
        !ssize_slot(map, m->m_spare_mark, &spare_mark)) {
        return 0;
    }
    Py_ssize_t size = primary_size + rehash_size;
    return size <= threshold && size < spare_mark;
}

/* the most entries one compiled rehash step moves (a longer run of colliding entries is
   Python's) */
#define MAX_STEP_ENTRIES 64

/* One step of the incremental rehash (CopyOnWriteStateMap._incremental_rehash): the primary
   buckets from the rehash index on, whole, until at least min_transferred entries moved, each
   entry relinked at the head of its bucket of the rehash table; the last hit forgotten. Only
   when nothing is shared with a snapshot (no entry to copy, no array to unshare) and the step
   does not finish the rehash (the table swap is Python's). Everything is checked and every
   hash computed before anything moves: 1 = moved, 0 = take the fallback, -1 = error (nothing
   changed either way). */
static int
rehash_step(FastMethod *m, PyObject *map)
{
    if (!unshared(m, map)) {
        return 0;
    }
    PyObject *old = SLOT(map, m->m_primary);
    PyObject *new = SLOT(map, m->m_rehash_table);
    PyObject *mod_count = SLOT(map, m->m_mod_count);
    PyObject *index_obj = SLOT(map, m->m_rehash_index);
    Py_ssize_t r, primary_size, rehash_size;
    if (old == NULL || new == NULL || mod_count == NULL || !PyList_CheckExact(old) ||
        !PyList_CheckExact(new) || PyList_GET_SIZE(new) != 2 * PyList_GET_SIZE(old) ||
        !ssize_slot(map, m->m_rehash_index, &r) ||
        !ssize_slot(map, m->m_primary_size, &primary_size) ||
        !ssize_slot(map, m->m_rehash_size, &rehash_size) || r < 0 ||
        r >= PyList_GET_SIZE(old)) {
        return 0;
    }
    Py_ssize_t old_capacity = PyList_GET_SIZE(old);
    Py_uhash_t mask = (Py_uhash_t)PyList_GET_SIZE(new) - 1;
    Py_hash_t hashes[MAX_STEP_ENTRIES];
    Py_ssize_t moved = 0, stop = r;
    int result = 0;
    /* a key's __hash__ may run Python code: hold what is looked at, check it unchanged after */
    Py_INCREF(old);
    Py_INCREF(new);
    Py_INCREF(mod_count);
    Py_INCREF(index_obj);
    while (moved < m->min_transferred) {
        PyObject *e = PyList_GET_ITEM(old, stop);
        Py_INCREF(e);
        while (e != Py_None) {
            PyObject *next = Py_TYPE(e) == m->entry_type ? ((Entry *)e)->next : NULL;
            if (next == NULL || moved == MAX_STEP_ENTRIES) {
                Py_DECREF(e);
                goto done;
            }
            if (map_hash(m, ((Entry *)e)->key, ((Entry *)e)->namespace_, &hashes[moved]) < 0) {
                Py_DECREF(e);
                result = -1;
                goto done;
            }
            moved++;
            next = ((Entry *)e)->next;
            Py_INCREF(next);
            Py_DECREF(e);
            e = next;
        }
        Py_DECREF(e);
        stop++;
        if (stop == old_capacity) {
            goto done; /* this step finishes the rehash */
        }
    }
    if (SLOT(map, m->m_primary) != old || SLOT(map, m->m_rehash_table) != new ||
        SLOT(map, m->m_mod_count) != mod_count || SLOT(map, m->m_rehash_index) != index_obj ||
        !unshared(m, map)) {
        goto done;
    }
    PyObject *new_index = PyLong_FromSsize_t(stop);
    PyObject *new_primary_size = PyLong_FromSsize_t(primary_size - moved);
    PyObject *new_rehash_size = PyLong_FromSsize_t(rehash_size + moved);
    if (new_index == NULL || new_primary_size == NULL || new_rehash_size == NULL) {
        Py_XDECREF(new_index);
        Py_XDECREF(new_primary_size);
        Py_XDECREF(new_rehash_size);
        result = -1;
        goto done;
    }
    /* from here on nothing fails and no Python code runs until the map is consistent */
    Py_INCREF(Py_None);
    PyObject *old_hit = swap_slot(map, m->m_hit, Py_None);
    Py_INCREF(m->no_hit);
    PyObject *old_hit_key = swap_slot(map, m->m_hit_key, m->no_hit);
    PyObject **from = ((PyListObject *)old)->ob_item;
    PyObject **to = ((PyListObject *)new)->ob_item;
    Py_ssize_t i = 0;
    for (Py_ssize_t b = r; b < stop; b++) {
        PyObject *e = from[b]; /* the bucket's reference: ours */
        Py_INCREF(Py_None);
        from[b] = Py_None;
        while (e != Py_None) {
            Entry *entry = (Entry *)e;
            PyObject *next = entry->next; /* the entry's reference: ours */
            Py_ssize_t pos = (Py_ssize_t)((Py_uhash_t)hashes[i++] & mask);
            entry->next = to[pos]; /* the slot's reference: the entry's */
            to[pos] = e;           /* ours: the slot's */
            e = next;
        }
        Py_DECREF(e); /* None */
    }
    PyObject *olds[5] = {old_hit, old_hit_key, swap_slot(map, m->m_rehash_index, new_index),
                         swap_slot(map, m->m_primary_size, new_primary_size),
                         swap_slot(map, m->m_rehash_size, new_rehash_size)};
    for (int j = 0; j < 5; j++) {
        Py_XDECREF(olds[j]);
    }
    result = 1;
done:
    Py_DECREF(old);
    Py_DECREF(new);
    Py_DECREF(mod_count);
    Py_DECREF(index_obj);
    return result;
}

/* The table and bucket of hash h: the primary table's unless a rehash has moved that bucket
   (CopyOnWriteStateMap._select_active_table, after its step). 0 when the map does not look
   as expected. */
static inline Py_ALWAYS_INLINE int
select_bucket(FastMethod *m, PyObject *map, Py_hash_t h, int rehashing, PyObject **tab,
              Py_ssize_t *index)
{
    PyObject *primary = SLOT(map, m->m_primary);
    if (primary == NULL || !PyList_CheckExact(primary)) {
        return 0;
    }
    Py_ssize_t mask;
    if (!rehashing) {
        if (!ssize_slot(map, m->m_mask, &mask) || mask < 0 || mask >= PyList_GET_SIZE(primary)) {
            return 0;
        }
        *tab = primary;
        *index = (Py_ssize_t)((Py_uhash_t)h & (Py_uhash_t)mask);
        return 1;
    }
    PyObject *rehash_table = SLOT(map, m->m_rehash_table);
    Py_ssize_t rehash_index;
    if (rehash_table == NULL || !PyList_CheckExact(rehash_table) ||
        !ssize_slot(map, m->m_rehash_index, &rehash_index)) {
        return 0;
    }
    mask = PyList_GET_SIZE(primary) - 1;
    Py_ssize_t i = (Py_ssize_t)((Py_uhash_t)h & (Py_uhash_t)mask);
    if (i < rehash_index) {
        *tab = rehash_table;
        *index = (Py_ssize_t)((Py_uhash_t)h & (Py_uhash_t)(PyList_GET_SIZE(rehash_table) - 1));
    }
    else {
        *tab = primary;
        *index = i;
    }
    return 1;
}

/* The entry of (key, ns) in bucket `index` of `tab` into *found (a new reference), or NULL:
   0, or 1 when the chain holds an object that is not a compiled entry (the fallback), or -1 on
   an error (a key's __eq__). */
static inline Py_ALWAYS_INLINE int
find_entry(FastMethod *m, PyObject *tab, Py_ssize_t index, PyObject *key, PyObject *ns,
           PyObject **found)
{
    *found = NULL;
    PyObject *e = PyList_GET_ITEM(tab, index);
    Py_INCREF(e);
    while (e != Py_None) {
        if (Py_TYPE(e) != m->entry_type) {
            Py_DECREF(e);
            return 1;
        }
        Entry *entry = (Entry *)e;
        int eq = entry->key == key ? 1 : PyObject_RichCompareBool(entry->key, key, Py_EQ);
        if (eq > 0) {
            eq = entry->namespace_ == ns ? 1
                                         : PyObject_RichCompareBool(entry->namespace_, ns, Py_EQ);
        }
        if (eq < 0) {
            Py_DECREF(e);
            return -1;
        }
        if (eq) {
            *found = e;
            return 0;
        }
        PyObject *next = entry->next;
        Py_INCREF(next);
        Py_DECREF(e);
        e = next;
    }
    Py_DECREF(e);
    return 0;
}

/* get's and put's lookup: while a rehash runs its step first (rehash_step), then the entry of
   (key, ns) in the bucket of hash h. 1 = looked up (*tab and *found, if not NULL, are new
   references), 0 = take the fallback, -1 = error. */
static inline Py_ALWAYS_INLINE int
lookup(FastMethod *m, PyObject *map, Py_hash_t h, int rehashing, PyObject *key, PyObject *ns,
       PyObject **tab, Py_ssize_t *index, PyObject **found)
{
    *tab = NULL;
    *found = NULL;
    if (rehashing) {
        int stepped = rehash_step(m, map);
        if (stepped <= 0) {
            return stepped;
        }
    }
    PyObject *t;
    if (!select_bucket(m, map, h, rehashing, &t, index)) {
        return 0;
    }
    Py_INCREF(t);
    *tab = t;
    int rc = find_entry(m, t, *index, key, ns, found);
    return rc == 0 ? 1 : rc < 0 ? -1 : 0;
}

/* CopyOnWriteStateMap._add_entry's plain case (can_insert holds): a new entry at the head of
   tab[index], in the map's current version, the namespace object canonicalised as
   _add_entry does, the modification count and the size of tab's side incremented. 1, or 0 when
   the map's fields are not as expected, or -1 on an error (the map unchanged either way). */
static int
insert_entry(FastMethod *m, PyObject *map, PyObject *tab, Py_ssize_t index, PyObject *key,
             PyObject *ns, PyObject *state)
{
    int in_primary = tab == SLOT(map, m->m_primary);
    Py_ssize_t size_offset = in_primary ? m->m_primary_size : m->m_rehash_size;
    Py_ssize_t mod_count, size;
    PyObject *version = SLOT(map, m->m_state_map_version);
    PyObject *last = SLOT(map, m->m_last_namespace);
    if (version == NULL || last == NULL || !ssize_slot(map, m->m_mod_count, &mod_count) ||
        !ssize_slot(map, size_offset, &size)) {
        return 0;
    }
    /* one namespace object per run of equal ones (windows are made per record) */
    int same_namespace = 1;
    if (ns != last) {
        same_namespace = PyObject_RichCompareBool(ns, last, Py_EQ);
        if (same_namespace < 0) {
            return -1;
        }
    }
    if (same_namespace) {
        ns = last;
    }
    PyObject *new_mod_count = PyLong_FromSsize_t(mod_count + 1);
    PyObject *new_size = PyLong_FromSsize_t(size + 1);
    Entry *e = (Entry *)m->entry_type->tp_alloc(m->entry_type, 0);
    if (new_mod_count == NULL || new_size == NULL || e == NULL) {
        Py_XDECREF(new_mod_count);
        Py_XDECREF(new_size);
        Py_XDECREF(e);
        return -1;
    }
    if (!same_namespace) {
        set_slot(map, m->m_last_namespace, ns);
    }
    Py_INCREF(key);
    e->key = key;
    Py_INCREF(ns);
    e->namespace_ = ns;
    Py_INCREF(state);
    e->state = state;
    Py_INCREF(version);
    e->entry_version = version;
    Py_INCREF(version);
    e->state_version = version;
    PyObject **slot = &((PyListObject *)tab)->ob_item[index];
    e->next = *slot; /* the bucket's reference: the entry's */
    *slot = (PyObject *)e;
    Py_DECREF(swap_slot(map, m->m_mod_count, new_mod_count));
    Py_DECREF(swap_slot(map, size_offset, new_size));
    return 1;
}

/* A tracking map's record of a VOID_NAMESPACE change (TrackingStateMap.put's, and a read
   tracking map's get of a value the caller may mutate): (key, state) appended, the lists
   compacted by the map's Python method once they outgrow their limit. -1 on an error. */
static int
record_change(FastMethod *m, PyObject *map, PyObject *key, PyObject *state)
{
    PyObject *keys = SLOT(map, m->t_void_keys);
    if (PyList_Append(keys, key) < 0 || PyList_Append(SLOT(map, m->t_void_states), state) < 0) {
        return -1;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(SLOT(map, m->t_limit));
    if (limit == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (PyList_GET_SIZE(keys) > limit) {
        PyObject *r = PyObject_CallMethod(map, "_compact", NULL);
        if (r == NULL) {
            return -1;
        }
        Py_DECREF(r);
    }
    return 0;
}

/* the map's last hit: the entry found for these very key and namespace objects */
static inline Py_ALWAYS_INLINE void
remember_hit(FastMethod *m, PyObject *map, PyObject *entry, PyObject *key, PyObject *ns)
{
    set_slot(map, m->m_hit, entry);
    set_slot(map, m->m_hit_key, key);
    set_slot(map, m->m_hit_namespace, ns);
}

/* value(): 1 = found (*out is a new reference), 0 = take the fallback, -1 = error */
static int
fast_value(FastMethod *m, PyObject *self, PyObject **out)
{
    PyObject *map, *key, *ns;
    int tracking, rehashing;
    if (!locate(m, self, &map, &key, &ns, &tracking, &rehashing)) {
        return 0;
    }
    PyObject *copy_default = SLOT(self, m->s_copy_default);
    if (rehashing && copy_default != Py_False) {
        return 0; /* a miss after the step would need the copy: all of it is Python's */
    }
    Py_hash_t h;
    if (map_hash(m, key, ns, &h) < 0) {
        return -1;
    }
    /* the walk may run a key's __eq__: hold what it looks at */
    Py_INCREF(key);
    Py_INCREF(ns);
    PyObject *e, *tab;
    Py_ssize_t index;
    int result = lookup(m, map, h, rehashing, key, ns, &tab, &index, &e);
    if (result <= 0) {
        goto done;
    }
    result = 0;
    if (e != NULL) {
        Entry *entry = (Entry *)e;
        PyObject *required = SLOT(map, m->m_required);
        if (required == NULL || version_less(entry->state_version, required) != 0) {
            goto done; /* a copy is the Python method's */
        }
        remember_hit(m, map, e, key, ns);
        PyObject *state = entry->state;
        if (state != Py_None) {
            Py_INCREF(state);
            if (tracking == READ_TRACKING_MAP && record_change(m, map, key, state) < 0) {
                Py_DECREF(state);
                result = -1;
                goto done;
            }
            *out = state;
            result = 1;
            goto done;
        }
        /* a None state reads as a miss */
    }
    /* a miss: the default, unless it must be copied */
    PyObject *dflt = SLOT(self, m->s_default);
    if (copy_default == Py_False && dflt != NULL) {
        Py_INCREF(dflt);
        *out = dflt;
        result = 1;
    }
done:
    Py_XDECREF(e);
    Py_XDECREF(tab);
    Py_DECREF(key);
    Py_DECREF(ns);
    return result;
}

/* state and version written to an entry (put's write) */
static void
write_entry(Entry *entry, PyObject *value, PyObject *version)
{
    PyObject *old_state = entry->state;
    PyObject *old_version = entry->state_version;
    Py_INCREF(value);
    Py_INCREF(version);
    entry->state = value;
    entry->state_version = version;
    Py_XDECREF(old_state);
    Py_XDECREF(old_version);
}

/* update(v) through the map's last hit (get's entry for these very key and namespace objects,
   no rehash running): 1 = written, 0 = take the fallback, -1 = error */
static inline Py_ALWAYS_INLINE int
update_hit(FastMethod *m, PyObject *map, PyObject *key, PyObject *value, int tracking)
{
    PyObject *hit = SLOT(map, m->m_hit);
    PyObject *required = SLOT(map, m->m_required);
    PyObject *version = SLOT(map, m->m_state_map_version);
    if (hit == NULL || Py_TYPE(hit) != m->entry_type || required == NULL || version == NULL) {
        return 0;
    }
    Entry *entry = (Entry *)hit;
    if (version_less(entry->entry_version, required) != 0) {
        return 0;
    }
    if (tracking != PLAIN_MAP) {
        /* recorded before the write, as TrackingStateMap.put does; the record may run the
           map's Python _compact, which touches neither the entries nor the last hit */
        Py_INCREF(hit);
        Py_INCREF(version);
        int rc = record_change(m, map, key, value);
        int same = rc == 0 && SLOT(map, m->m_hit) == hit &&
                   SLOT(map, m->m_state_map_version) == version;
        Py_DECREF(hit);
        Py_DECREF(version);
        if (rc < 0) {
            return -1;
        }
        if (!same) {
            return 0; /* put records the same change again (the last record wins) and writes */
        }
    }
    write_entry(entry, value, version);
    return 1;
}

/* update(v): 1 = written, 0 = take the fallback, -1 = error */
static int
fast_update(FastMethod *m, PyObject *self, PyObject *value)
{
    PyObject *cls = SLOT(self, m->s_value_class);
    if (value == Py_None || cls == NULL || (PyObject *)Py_TYPE(value) != cls) {
        return 0;
    }
    PyObject *map, *key, *ns;
    int tracking, rehashing;
    if (!locate(m, self, &map, &key, &ns, &tracking, &rehashing)) {
        return 0;
    }
    if (!rehashing && SLOT(map, m->m_hit_key) == key && SLOT(map, m->m_hit_namespace) == ns) {
        return update_hit(m, map, key, value, tracking);
    }
    /* put's lookup; while rehashing, only where nothing after the step can need Python */
    if (rehashing && (!unshared(m, map) || !can_insert(m, map))) {
        return 0;
    }
    Py_hash_t h;
    if (map_hash(m, key, ns, &h) < 0) {
        return -1;
    }
    Py_INCREF(key);
    Py_INCREF(ns);
    PyObject *e, *tab, *mod_count = NULL;
    Py_ssize_t index;
    int result = lookup(m, map, h, rehashing, key, ns, &tab, &index, &e);
    if (result <= 0) {
        goto done;
    }
    result = 0;
    PyObject *required = SLOT(map, m->m_required);
    mod_count = SLOT(map, m->m_mod_count);
    if (required == NULL || mod_count == NULL) {
        goto done;
    }
    Py_INCREF(mod_count);
    if (e != NULL ? version_less(((Entry *)e)->entry_version, required) != 0
                  : !can_insert(m, map)) {
        goto done; /* a chain copy, a doubling, a growth or an unshare: put's */
    }
    if (tracking != PLAIN_MAP) {
        /* recorded before the write, as TrackingStateMap.put does; its _compact touches no
           entry and no table (checked: else put records the same change again and writes) */
        if (record_change(m, map, key, value) < 0) {
            result = -1;
            goto done;
        }
        PyObject *current = SLOT(map, m->m_rehash_table);
        if (SLOT(map, m->m_mod_count) != mod_count ||
            (tab != SLOT(map, m->m_primary) && tab != current) ||
            (current != m->empty_table) != rehashing) {
            goto done;
        }
    }
    PyObject *version = SLOT(map, m->m_state_map_version);
    if (version == NULL) {
        goto done;
    }
    if (e != NULL) {
        write_entry((Entry *)e, value, version);
        result = 1;
    }
    else {
        result = insert_entry(m, map, tab, index, key, ns, value);
    }
done:
    Py_XDECREF(e);
    Py_XDECREF(tab);
    Py_XDECREF(mod_count);
    Py_DECREF(key);
    Py_DECREF(ns);
    return result;
}

/* the single-key state: value() is its slot, or the default when it needs no copy */
static PyObject *
single_value(FastMethod *m, PyObject *self)
{
    PyObject *v = SLOT(self, m->s_value);
    if (v != NULL && v != Py_None) {
        Py_INCREF(v);
        return v;
    }
    PyObject *dflt = SLOT(self, m->s_default);
    if (v != NULL && SLOT(self, m->s_copy_default) == Py_False && dflt != NULL) {
        Py_INCREF(dflt);
        return dflt;
    }
    return NULL; /* the fallback */
}

/* update(v): None or a value of the serializer's class goes into the slot */
static int
single_update(FastMethod *m, PyObject *self, PyObject *value)
{
    PyObject *cls = SLOT(self, m->s_value_class);
    if (value != Py_None && (cls == NULL || (PyObject *)Py_TYPE(value) != cls)) {
        return 0;
    }
    PyObject *old = SLOT(self, m->s_value);
    Py_INCREF(value);
    SLOT(self, m->s_value) = value;
    Py_XDECREF(old);
    return 1;
}

static PyObject *
fast_method_vectorcall(FastMethod *m, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    size_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || nargs != (size_t)(m->is_update ? 2 : 1) ||
        !PyObject_TypeCheck(args[0], m->state_type)) {
        return PyObject_Vectorcall(m->fallback, args, nargsf, kwnames);
    }
    if (m->kind == SINGLE_VALUE) {
        PyObject *v = single_value(m, args[0]);
        return v != NULL ? v : call_fallback(m, args, nargs);
    }
    if (m->kind == SINGLE_UPDATE) {
        if (single_update(m, args[0], args[1])) {
            Py_RETURN_NONE;
        }
        return call_fallback(m, args, nargs);
    }
    if (m->is_update) {
        int written = fast_update(m, args[0], args[1]);
        if (written > 0) {
            Py_RETURN_NONE;
        }
        if (written < 0) {
            return NULL;
        }
        return call_fallback(m, args, nargs);
    }
    PyObject *out = NULL;
    int found = fast_value(m, args[0], &out);
    if (found > 0) {
        return out;
    }
    if (found < 0) {
        return NULL;
    }
    return call_fallback(m, args, nargs);
}

/* a method: bound like a function when read from an instance */
static PyObject *
fast_method_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

static void
fast_method_dealloc(FastMethod *m)
{
    PyObject_GC_UnTrack(m);
    Py_CLEAR(m->name);
    Py_CLEAR(m->fallback);
    Py_CLEAR(m->doc);
    Py_CLEAR(m->state_type);
    Py_CLEAR(m->map_type);
    Py_CLEAR(m->tracking_type);
    Py_CLEAR(m->read_tracking_type);
    Py_CLEAR(m->void_namespace);
    Py_CLEAR(m->context_type);
    Py_CLEAR(m->entry_type);
    Py_CLEAR(m->empty_table);
    Py_CLEAR(m->no_hit);
    Py_CLEAR(m->last_ns);
    PyObject_GC_Del(m);
}

static int
fast_method_traverse(FastMethod *m, visitproc visit, void *arg)
{
    Py_VISIT(m->fallback);
    Py_VISIT(m->state_type);
    Py_VISIT(m->map_type);
    Py_VISIT(m->tracking_type);
    Py_VISIT(m->read_tracking_type);
    Py_VISIT(m->void_namespace);
    Py_VISIT(m->context_type);
    Py_VISIT(m->entry_type);
    Py_VISIT(m->empty_table);
    Py_VISIT(m->no_hit);
    Py_VISIT(m->last_ns);
    return 0;
}

static PyObject *
fast_method_repr(FastMethod *m)
{
    return PyUnicode_FromFormat("<compiled method %U of %s>", m->name, m->state_type->tp_name);
}

static PyMemberDef fast_method_members[] = {
    {"__name__", T_OBJECT, offsetof(FastMethod, name), READONLY, NULL},
    {"__doc__", T_OBJECT, offsetof(FastMethod, doc), READONLY, NULL},
    {"__wrapped__", T_OBJECT, offsetof(FastMethod, fallback), READONLY,
     "the pure-Python method this one takes the common path of"},
    {NULL},
};

static PyTypeObject FastMethodType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "streamstate.backends.heap._value_state.CompiledMethod",
    .tp_basicsize = sizeof(FastMethod),
    .tp_dealloc = (destructor)fast_method_dealloc,
    .tp_vectorcall_offset = offsetof(FastMethod, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_repr = (reprfunc)fast_method_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_traverse = (traverseproc)fast_method_traverse,
    .tp_descr_get = fast_method_get,
    .tp_members = fast_method_members,
    .tp_doc = "A state method's common path in C; anything else goes to ``__wrapped__``.",
};

/* the offset of a __slots__ member of type ``type`` (-1 with an error set if it is none) */
static Py_ssize_t
slot_offset(PyObject *type, const char *name)
{
    PyObject *descr = PyObject_GetAttrString(type, name);
    if (descr == NULL) {
        return -1;
    }
    if (!Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        PyErr_Format(PyExc_TypeError, "%R.%s is not a __slots__ member", type, name);
        Py_DECREF(descr);
        return -1;
    }
    PyMemberDef *def = ((PyMemberDescrObject *)descr)->d_member;
    Py_ssize_t offset = def->type == T_OBJECT_EX ? def->offset : -1;
    Py_DECREF(descr);
    if (offset < 0) {
        PyErr_Format(PyExc_TypeError, "%R.%s is not an object slot", type, name);
    }
    return offset;
}

static int
check_pair_hash(void)
{
    /* the tuple hash of a few pairs, against hash() */
    PyObject *samples = Py_BuildValue("((si)(ii)(s(si))(yd))", "user-1", 0, -1, 7, "k", "a", 3,
                                      "b", 0.5);
    if (samples == NULL) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(samples); i++) {
        PyObject *pair = PyTuple_GET_ITEM(samples, i);
        Py_hash_t expected = PyObject_Hash(pair);
        Py_hash_t got = pair_hash(PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1));
        if (expected == -1 || got == -1 || expected != got) {
            Py_DECREF(samples);
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_RuntimeError,
                                "this interpreter's tuple hash is not the one compiled in");
            }
            return -1;
        }
    }
    Py_DECREF(samples);
    return 0;
}

static FastMethod *
new_method(PyObject *name, PyObject *fallback, int is_update)
{
    FastMethod *m = PyObject_GC_New(FastMethod, &FastMethodType);
    if (m == NULL) {
        return NULL;
    }
    m->vectorcall = (vectorcallfunc)fast_method_vectorcall;
    m->is_update = is_update;
    m->kind = is_update ? HEAP_UPDATE : HEAP_VALUE;
    m->name = name;
    Py_INCREF(name);
    m->fallback = fallback;
    Py_INCREF(fallback);
    m->doc = PyObject_GetAttrString(fallback, "__doc__");
    if (m->doc == NULL) {
        PyErr_Clear();
        m->doc = Py_None;
        Py_INCREF(Py_None);
    }
    m->state_type = NULL;
    m->map_type = NULL;
    m->tracking_type = NULL;
    m->read_tracking_type = NULL;
    m->void_namespace = NULL;
    m->context_type = NULL;
    m->entry_type = NULL;
    m->empty_table = NULL;
    m->no_hit = NULL;
    m->min_transferred = 0;
    m->last_ns = NULL;
    m->last_ns_hash = 0;
    PyObject_GC_Track(m);
    return m;
}

static int
fill(FastMethod *m, PyObject *state_type, PyObject *map_type, PyObject *context_type,
     PyObject *entry_type, PyObject *empty_table, PyObject *no_hit, Py_ssize_t min_transferred,
     PyObject *tracking_type, PyObject *read_tracking_type, PyObject *void_namespace)
{
    m->state_type = (PyTypeObject *)state_type;
    m->map_type = (PyTypeObject *)map_type;
    m->context_type = (PyTypeObject *)context_type;
    m->entry_type = (PyTypeObject *)entry_type;
    m->empty_table = empty_table;
    m->no_hit = no_hit;
    m->min_transferred = min_transferred;
    Py_INCREF(state_type);
    Py_INCREF(map_type);
    Py_INCREF(context_type);
    Py_INCREF(entry_type);
    Py_INCREF(empty_table);
    Py_INCREF(no_hit);
#define OFF(field, type, name)                                                                    \
    if ((m->field = slot_offset(type, name)) < 0) {                                              \
        return -1;                                                                               \
    }
    OFF(s_ctx, state_type, "_ctx");
    OFF(s_maps, state_type, "_maps");
    OFF(s_ns, state_type, "_ns");
    OFF(s_default, state_type, "_default");
    OFF(s_copy_default, state_type, "_copy_default");
    OFF(s_value_class, state_type, "_value_class");
    OFF(c_key, context_type, "key");
    OFF(c_kg_index, context_type, "kg_index");
    OFF(m_rehash_table, map_type, "_rehash_table");
    OFF(m_primary, map_type, "_primary");
    OFF(m_mask, map_type, "_mask");
    OFF(m_required, map_type, "_required");
    OFF(m_hit, map_type, "_hit");
    OFF(m_hit_key, map_type, "_hit_key");
    OFF(m_hit_namespace, map_type, "_hit_namespace");
    OFF(m_state_map_version, map_type, "_state_map_version");
    OFF(m_shared, map_type, "_shared");
    OFF(m_threshold, map_type, "_threshold");
    OFF(m_spare_mark, map_type, "_spare_mark");
    OFF(m_mod_count, map_type, "_mod_count");
    OFF(m_primary_size, map_type, "_primary_size");
    OFF(m_rehash_size, map_type, "_rehash_size");
    OFF(m_rehash_index, map_type, "_rehash_index");
    OFF(m_last_namespace, map_type, "_last_namespace");
    if (tracking_type != NULL) {
        /* both tracking classes add the same slots to the map: the same offsets */
        OFF(t_void_keys, tracking_type, "void_keys");
        OFF(t_void_states, tracking_type, "void_states");
        OFF(t_limit, tracking_type, "_limit");
        if (slot_offset(read_tracking_type, "void_keys") != m->t_void_keys ||
            slot_offset(read_tracking_type, "void_states") != m->t_void_states ||
            slot_offset(read_tracking_type, "_limit") != m->t_limit) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_TypeError, "the tracking maps' slots differ");
            }
            return -1;
        }
        Py_INCREF(tracking_type);
        Py_INCREF(read_tracking_type);
        Py_INCREF(void_namespace);
        m->tracking_type = (PyTypeObject *)tracking_type;
        m->read_tracking_type = (PyTypeObject *)read_tracking_type;
        m->void_namespace = void_namespace;
    }
#undef OFF
    return 0;
}

/* the two methods value() and update() over the given Python methods */
static int
new_pair(PyObject *value, PyObject *update, FastMethod **v, FastMethod **u)
{
    PyObject *value_name = PyUnicode_InternFromString("value");
    PyObject *update_name = PyUnicode_InternFromString("update");
    if (value_name != NULL && update_name != NULL) {
        *v = new_method(value_name, value, 0);
        *u = new_method(update_name, update, 1);
    }
    Py_XDECREF(value_name);
    Py_XDECREF(update_name);
    if (*v == NULL || *u == NULL) {
        Py_CLEAR(*v);
        Py_CLEAR(*u);
        return -1;
    }
    return 0;
}

static PyObject *
bind(PyObject *module, PyObject *args)
{
    PyObject *state_type, *map_type, *context_type, *entry_type, *empty_table, *no_hit, *value,
        *update;
    PyObject *tracking_type = NULL, *read_tracking_type = NULL, *void_namespace = NULL;
    Py_ssize_t min_transferred;
    if (!PyArg_ParseTuple(args, "O!O!O!O!OOnOO|O!O!O:bind", &PyType_Type, &state_type,
                          &PyType_Type, &map_type, &PyType_Type, &context_type, &PyType_Type,
                          &entry_type, &empty_table, &no_hit, &min_transferred, &value, &update,
                          &PyType_Type, &tracking_type, &PyType_Type, &read_tracking_type,
                          &void_namespace)) {
        return NULL;
    }
    if (min_transferred < 1) {
        PyErr_SetString(PyExc_ValueError, "bind: a rehash step moves at least one entry");
        return NULL;
    }
    if (tracking_type != NULL && (read_tracking_type == NULL || void_namespace == NULL ||
                                  !PyType_IsSubtype((PyTypeObject *)tracking_type,
                                                    (PyTypeObject *)map_type) ||
                                  !PyType_IsSubtype((PyTypeObject *)read_tracking_type,
                                                    (PyTypeObject *)map_type))) {
        PyErr_SetString(PyExc_TypeError,
                        "bind: the tracking maps (both) subclass the map, with the void namespace");
        return NULL;
    }
    if (((PyTypeObject *)entry_type)->tp_basicsize != sizeof(Entry) ||
        strcmp(((PyTypeObject *)entry_type)->tp_name,
               "streamstate.backends.heap._entry.StateMapEntry") != 0) {
        PyErr_SetString(PyExc_TypeError, "the entry type is not the compiled map entry");
        return NULL;
    }
    if (check_pair_hash() < 0) {
        return NULL;
    }
    FastMethod *v = NULL, *u = NULL;
    if (new_pair(value, update, &v, &u) < 0) {
        return NULL;
    }
    if (fill(v, state_type, map_type, context_type, entry_type, empty_table, no_hit,
             min_transferred, tracking_type, read_tracking_type, void_namespace) < 0 ||
        fill(u, state_type, map_type, context_type, entry_type, empty_table, no_hit,
             min_transferred, tracking_type, read_tracking_type, void_namespace) < 0) {
        Py_DECREF(v);
        Py_DECREF(u);
        return NULL;
    }
    return Py_BuildValue("(NN)", v, u);
}

static PyObject *
bind_single(PyObject *module, PyObject *args)
{
    PyObject *state_type, *value, *update;
    if (!PyArg_ParseTuple(args, "O!OO:bind_single", &PyType_Type, &state_type, &value, &update)) {
        return NULL;
    }
    FastMethod *v = NULL, *u = NULL;
    if (new_pair(value, update, &v, &u) < 0) {
        return NULL;
    }
    FastMethod *both[2] = {v, u};
    for (int i = 0; i < 2; i++) {
        FastMethod *m = both[i];
        m->kind = i ? SINGLE_UPDATE : SINGLE_VALUE;
        Py_INCREF(state_type);
        m->state_type = (PyTypeObject *)state_type;
        if ((m->s_value = slot_offset(state_type, "_value")) < 0 ||
            (m->s_default = slot_offset(state_type, "_default")) < 0 ||
            (m->s_copy_default = slot_offset(state_type, "_copy_default")) < 0 ||
            (m->s_value_class = slot_offset(state_type, "_value_class")) < 0) {
            Py_DECREF(v);
            Py_DECREF(u);
            return NULL;
        }
    }
    return Py_BuildValue("(NN)", v, u);
}

static PyMethodDef module_methods[] = {
    {"bind_single", bind_single, METH_VARARGS,
     "bind_single(state_type, value, update) -> (value, update): the compiled methods of a "
     "single-key value state (its value in the slot ``_value``), each falling back to the given "
     "Python method."},
    {"bind", bind, METH_VARARGS,
     "bind(state_type, map_type, key_context_type, entry_type, empty_table, no_hit, "
     "min_transferred, value, update"
     "[, tracking_type, read_tracking_type, void_namespace]) -> (value, update): the compiled "
     "methods of the heap value state, each falling back to the given Python method; with the "
     "map's change-tracking subclasses, also over those (their VOID_NAMESPACE records)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "streamstate.backends.heap._value_state",
    .m_doc = "The heap value state's value() and update() in C (see the source's header).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__value_state(void)
{
    if (PyType_Ready(&FastMethodType) < 0) {
        return NULL;
    }
    return PyModule_Create(&module_def);
}
