"""What a name given by a checkpoint may be (SPEC §14.5): the one place that decides.

A checkpoint is input. Whoever can write its storage chooses every byte of it, and so every name
it gives: the file paths of ``_metadata``, the file names and shared paths of a RocksDB
manifest, the staged outputs a commit records, the directory a reference names. A reader uses
such a name only after it passed one of the functions below, which accept a *plain relative
name*: parts of 1 to :data:`MAX_PART_BYTES` bytes joined by ``/``, none of them ``..`` or ``.``
(and none empty, so the name is not absolute), no NUL or other control character, no
backslash, at most :data:`MAX_NAME_BYTES` bytes (UTF-8) in all. Where a name must lie below a
given directory of the checkpoint (``shared/`` for a manifest's SST files, ``outputs/`` for
staged outputs) the reader says so, and a file a checkpoint lists in the job's shared area is
named ``../shared/<plain name>`` from its checkpoint's directory: nothing else climbs.

A refused name raises :class:`~streamstate.errors.CorruptCheckpointError` naming the checkpoint,
the file that gave the name and the field:

>>> plain_name("op/0-0.state", checkpoint="chk-3", file="_metadata", field="path")
'op/0-0.state'
>>> try:
...     plain_name("../../etc/passwd", checkpoint="chk-3", file="_metadata", field="path")
... except CorruptCheckpointError as exc:
...     print(exc)
checkpoint chk-3: path in _metadata is '../../etc/passwd', not a plain relative name
inside the checkpoint (it has a '..' part); refused

Files a restore creates on local disk from what a checkpoint holds are created by
:func:`create_exclusive`: ``O_CREAT | O_EXCL | O_NOFOLLOW``, so a name that exists already (a
checkpoint naming one file twice, or a link planted in the directory) fails instead of being
written through.
"""

from __future__ import annotations

import os
from typing import IO, Any

from streamstate.errors import CorruptCheckpointError

__all__ = [
    "MAX_NAME_BYTES",
    "MAX_PART_BYTES",
    "SHARED_DIRECTORY",
    "SHARED_PREFIX",
    "create_exclusive",
    "create_restored_file",
    "file_name",
    "handle_path",
    "name_below",
    "plain_name",
]

#: longest name a checkpoint may give, in UTF-8 bytes (the longest written is far shorter)
MAX_NAME_BYTES = 1024
#: longest part of a name (a file or directory name on every filesystem streamstate writes to)
MAX_PART_BYTES = 255
#: the job's directory of files that several checkpoints share (SPEC §6.1)
SHARED_DIRECTORY = "shared"
#: how a checkpoint's ``_metadata`` names a file of the shared directory
SHARED_PREFIX = f"../{SHARED_DIRECTORY}/"

_CONTROL = frozenset(chr(c) for c in (*range(0x20), 0x7F))


def _problem(name: object) -> str | None:
    """Why ``name`` is not a plain relative name (None: it is one)."""
    if not isinstance(name, str):
        return f"a {type(name).__name__}, not a string"
    if not name:
        return "it is empty"
    try:
        size = len(name.encode())
    except UnicodeEncodeError:
        return "it is not valid UTF-8"
    if size > MAX_NAME_BYTES:
        return f"{size} bytes, over the limit of {MAX_NAME_BYTES}"
    if "\x00" in name:
        return "it has a NUL byte"
    if not _CONTROL.isdisjoint(name):
        return "it has a control character"
    if "\\" in name:
        return "it has a backslash"
    if name.startswith("/"):
        return "it is absolute"
    for part in name.split("/"):
        if part == "..":
            return "it has a '..' part"
        if part in ("", "."):
            return "it has an empty or '.' part"
        if len(part.encode()) > MAX_PART_BYTES:
            return f"a part of it is over {MAX_PART_BYTES} bytes"
    return None


def _refuse(name: object, reason: str, checkpoint: str, file: str, field: str) -> None:
    shown = name if not isinstance(name, str) or len(name) <= 200 else name[:200] + "..."
    raise CorruptCheckpointError(
        f"checkpoint {checkpoint}: {field} in {file} is {shown!r}, not a plain relative name "
        f"inside the checkpoint ({reason}); refused"
    )


def plain_name(name: Any, *, checkpoint: str, file: str, field: str) -> str:
    """``name`` if it is a plain relative name (the module docstring), else
    :class:`CorruptCheckpointError` naming ``checkpoint``, ``file`` (what gave the name) and
    ``field`` (where in it)."""
    reason = _problem(name)
    if reason is not None:
        _refuse(name, reason, checkpoint, file, field)
    return name  # type: ignore[no-any-return]


def file_name(name: Any, *, checkpoint: str, file: str, field: str) -> str:
    """``name`` if it is a plain name of one part (a file directly in a directory)."""
    plain_name(name, checkpoint=checkpoint, file=file, field=field)
    if "/" in name:
        _refuse(name, "a file name has no '/'", checkpoint, file, field)
    return name  # type: ignore[no-any-return]


def name_below(name: Any, directory: str, *, checkpoint: str, file: str, field: str) -> str:
    """``name`` if it is a plain name below ``directory`` (a plain name itself)."""
    plain_name(name, checkpoint=checkpoint, file=file, field=field)
    if not name.startswith(directory + "/"):
        _refuse(name, f"it is not below {directory}/", checkpoint, file, field)
    return name  # type: ignore[no-any-return]


def handle_path(name: Any, *, shared: bool, checkpoint: str, file: str, field: str) -> str:
    """``name`` if it names a file of a checkpoint from the checkpoint's directory: a plain
    name (a file inside the directory) or, with ``shared`` (a checkpoint, not a
    self-contained savepoint), ``../shared/<plain name>`` (a file of the job's shared
    directory)."""
    if shared and isinstance(name, str) and name.startswith(SHARED_PREFIX):
        plain_name(name[len(SHARED_PREFIX) :], checkpoint=checkpoint, file=file, field=field)
        if len(name.encode()) > MAX_NAME_BYTES:
            _refuse(name, f"over {MAX_NAME_BYTES} bytes", checkpoint, file, field)
        return name
    return plain_name(name, checkpoint=checkpoint, file=file, field=field)


def create_exclusive(path: str) -> IO[bytes]:
    """A new local file for writing, mode 0600: ``FileExistsError`` if anything exists at
    ``path`` (a file, or a symlink, which is never followed)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.fdopen(os.open(path, flags, 0o600), "wb")


def create_restored_file(
    directory: str, name: Any, *, checkpoint: str, file: str, field: str
) -> IO[bytes]:
    """A new file ``name`` (a checkpoint's file name, checked by :func:`file_name`) in the local
    ``directory``, created by :func:`create_exclusive`; a name that exists there already is a
    :class:`CorruptCheckpointError` (the checkpoint names it twice)."""
    file_name(name, checkpoint=checkpoint, file=file, field=field)
    try:
        return create_exclusive(os.path.join(directory, name))
    except FileExistsError:
        raise CorruptCheckpointError(
            f"checkpoint {checkpoint}: {field} in {file} names {name!r}, which exists already in "
            f"{directory} (a name given twice, or a planted file); refused"
        ) from None
