"""Pickling the user's classes by value, whole: what carries a job's function (and the record
classes it names) to the other Spark processes, and a ``PickleSerializer``'s values.

cloudpickle carries a class by value when the receiving process cannot import it: a class of the
job script (``__main__``) or of a notebook cell, a local class, or one of a module that
:func:`~streamstate.spark.job.pickle_function` registers by value. Two kinds of record classes
(SPEC §2, ``serializers/structs.py``) do not survive that as cloudpickle does it, so
:class:`FunctionPickler` reduces them itself:

* msgspec caches what it learns of a dataclass, an attrs class, a named tuple, a typed dict or an
  enum in the class (``__msgspec_cache__``), and that cache does not pickle ("cannot pickle
  'msgspec._core.DataclassInfo' object"). It is left out: the receiving process fills its own.
* a ``msgspec.Struct`` class gets its fields when the class is created, from the annotations
  and defaults of the class body; cloudpickle creates an empty class and sets the attributes
  afterwards, so the class arrives without fields ("Extra positional arguments provided"). It
  is created here from its fields (resolved types, defaults, encoded names) and configuration,
  then given its other attributes.

Annotations written as strings (``from __future__ import annotations``) are resolved here, where
the class's module is the one that defines it: the receiving process's ``__main__`` is not the
job script, so a name such as another record class would not resolve there.

``detached=True`` makes the classes carried by value new classes when they are loaded, even in
this process (cloudpickle otherwise hands back the original class and sets its attributes
again): the driver opens a copy of the function to check its states
(``spark/driver/plan/checks.py``) and must leave the user's classes as it found them.

Everything here relies on cloudpickle's reduction of a class by value (its
``_make_skeleton_class`` / ``_make_skeleton_enum`` and ``_class_setstate``); the version is
pinned, and ``tests/spark/test_record_classes.py`` fails if their shape changes.
"""

from __future__ import annotations

import inspect
import io
import typing
from typing import Any

import cloudpickle
import msgspec
from cloudpickle import cloudpickle as _cloudpickle

__all__ = ["FunctionPickler", "dumps", "rebuild_struct"]

_MAKE_CLASS = _cloudpickle._make_skeleton_class
#: cloudpickle's constructors of a class carried by value -> the index of the class-tracker id
#: in their arguments
_SKELETONS: dict[Any, int] = {_MAKE_CLASS: 4, _cloudpickle._make_skeleton_enum: 5}
#: the metaclass of ``msgspec.Struct`` classes
_STRUCT_META: type = type(msgspec.Struct)
#: what msgspec keeps in a class it has inspected
_MSGSPEC_CACHE = "__msgspec_cache__"
#: ``Struct`` configuration passed again when the class is created
_STRUCT_OPTIONS = (
    "frozen",
    "eq",
    "order",
    "array_like",
    "gc",
    "weakref",
    "dict",
    "cache_hash",
    "repr_omit_defaults",
    "omit_defaults",
    "forbid_unknown_fields",
)


def dumps(obj: Any, *, detached: bool = False, protocol: int | None = None) -> bytes:
    """``obj`` pickled by a :class:`FunctionPickler`."""
    buffer = io.BytesIO()
    FunctionPickler(buffer, detached=detached, protocol=protocol).dump(obj)
    return buffer.getvalue()


class FunctionPickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle, with the record classes it carries by value reduced whole (see the module
    docstring); ``detached``: those classes are new classes when loaded, in any process."""

    def __init__(self, file: Any, *, detached: bool = False, protocol: int | None = None) -> None:
        super().__init__(file, protocol=protocol)
        self.detached = detached

    def reducer_override(self, obj: Any) -> Any:
        reduced = super().reducer_override(obj)
        if not isinstance(obj, type) or not _by_value(reduced):
            return reduced
        make, args, state, items, dict_items, set_state = reduced
        tracker = args[_SKELETONS[make]]
        if self.detached:
            args = _with(args, _SKELETONS[make], None)
            tracker = None
        class_dict, slots = state
        class_dict = {k: v for k, v in class_dict.items() if k != _MSGSPEC_CACHE}
        annotations = class_dict.get("__annotations__")
        if isinstance(annotations, dict) and any(isinstance(t, str) for t in annotations.values()):
            class_dict["__annotations__"] = _resolved(obj, annotations)
        if isinstance(obj, _STRUCT_META) and make is _MAKE_CLASS:
            return _struct_reduce(obj, class_dict, slots, tracker, set_state)
        return make, args, (class_dict, slots), items, dict_items, set_state


def _by_value(reduced: Any) -> bool:
    """Whether ``reduced`` is cloudpickle's reduction of a class by value."""
    return (
        isinstance(reduced, tuple)
        and len(reduced) == 6
        and reduced[0] in _SKELETONS
        and isinstance(reduced[2], tuple)
        and len(reduced[2]) == 2
        and isinstance(reduced[2][0], dict)
    )


def _with(args: tuple[Any, ...], index: int, value: Any) -> tuple[Any, ...]:
    return (*args[:index], value, *args[index + 1 :])


def _resolved(cls: type, annotations: dict[str, Any]) -> dict[str, Any]:
    """``annotations`` (the class's own) with string annotations resolved in the class's module;
    those that do not resolve are kept as they are."""
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception:  # a name that does not resolve: msgspec reports it where it is used
        return annotations
    return {name: hints.get(name, annotation) for name, annotation in annotations.items()}


def _struct_reduce(
    cls: Any, class_dict: dict[str, Any], slots: dict[str, Any], tracker: Any, set_state: Any
) -> Any:
    """A ``msgspec.Struct`` class: created whole from its own fields and configuration
    (:func:`rebuild_struct`), then given the rest of its attributes.

    What the class is created with must not refer to the class itself (pickle has not
    memoized it yet): a field whose type names the class keeps its annotation as written, and
    a ``__post_init__`` (which msgspec looks up only when the class is created) is given with
    the other attributes and reached through a stand-in."""
    written = inspect.get_annotations(cls)
    fields = {f.name: f for f in msgspec.structs.fields(cls)}
    defined = [name for name in written if name in fields]
    resolved = class_dict.get("__annotations__") or {}

    def annotation(name: str) -> Any:
        if name not in fields:  # a ClassVar
            return resolved.get(name, written[name])
        if _refers_to(fields[name].type, cls):
            return written[name]
        return fields[name].type

    annotations = {name: annotation(name) for name in written}
    namespace: dict[str, Any] = {
        "__annotations__": annotations,
        "__qualname__": cls.__qualname__,
        "__module__": cls.__module__,
    }
    #: field -> (default, factory); msgspec's Field objects do not pickle
    defaults = {
        name: (fields[name].default, fields[name].default_factory)
        for name in defined
        if fields[name].default is not msgspec.NODEFAULT
        or fields[name].default_factory is not msgspec.NODEFAULT
    }
    config = cls.__struct_config__
    options: dict[str, Any] = {o: getattr(config, o) for o in _STRUCT_OPTIONS}
    if config.tag is not None:
        options["tag"] = config.tag
        options["tag_field"] = config.tag_field
    renamed = {f.name: f.encode_name for f in fields.values() if f.encode_name != f.name}
    if renamed:
        options["rename"] = renamed
    if defined and _keyword_only(cls, defined):
        options["kw_only"] = True
    # the rest goes through cloudpickle's setstate once the class exists: not what creating it
    # made (fields, slots) nor what it was given, except the annotations, resolved (those that
    # name the class itself too: msgspec reads them when it first inspects the class)
    made = {"__slots__", "__dict__", "__weakref__", *namespace, *fields} - {"__annotations__"}
    rest = {k: v for k, v in class_dict.items() if k not in made}
    post_init = "__post_init__" in class_dict
    args = (
        type(cls),
        cls.__name__,
        cls.__bases__,
        namespace,
        defaults,
        options,
        tracker,
        post_init,
    )
    return rebuild_struct, args, (rest, slots), None, None, set_state


def _refers_to(tp: Any, cls: type) -> bool:
    """Whether the type ``tp`` names ``cls`` (``list[Node]`` in ``Node``)."""
    if tp is cls:
        return True
    return any(_refers_to(arg, cls) for arg in typing.get_args(tp))


def _keyword_only(cls: Any, names: list[str]) -> bool:
    """Whether the fields ``names`` that ``cls`` defines are keyword-only (``kw_only=True``)."""
    try:
        parameters = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False
    kinds = {parameters[n].kind for n in names if n in parameters}
    return kinds == {inspect.Parameter.KEYWORD_ONLY}


def rebuild_struct(
    metaclass: Any,
    name: str,
    bases: tuple[type, ...],
    namespace: dict[str, Any],
    defaults: dict[str, tuple[Any, Any]],
    options: dict[str, Any],
    tracker: str | None,
    post_init: bool = False,
) -> Any:
    """Create a ``msgspec.Struct`` class carried by value (a pickle's constructor): the same
    class for the same ``tracker`` within one process, as cloudpickle does for other classes.
    ``defaults``: field -> (default, default factory), ``msgspec.NODEFAULT`` for none;
    ``post_init``: the class defines ``__post_init__``, which arrives with its other attributes;
    the class is created with a stand-in that calls it."""
    import types

    namespace = dict(namespace)
    for field, (default, factory) in defaults.items():
        namespace[field] = (
            msgspec.field(default_factory=factory)
            if factory is not msgspec.NODEFAULT
            else msgspec.field(default=default)
        )
    if post_init:

        def __post_init__(self: Any) -> Any:  # noqa: N807 - msgspec's hook
            return created.__dict__["__post_init__"](self)

        namespace["__post_init__"] = __post_init__
    created = types.new_class(
        name, bases, {"metaclass": metaclass, **options}, lambda ns: ns.update(namespace)
    )
    return _cloudpickle._lookup_class_or_track(tracker, created)
