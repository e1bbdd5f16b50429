"""A checkpoint directory on local disk, reached without following a link below its root.

Whoever can write the checkpoint storage can plant a symbolic link in it: ``chk-3 -> /home/me``
would make a commit write ``_metadata`` there, a symlinked state file would make a restore read
any file the job's user can, and retention walking into a linked directory would delete what it
finds there. :class:`LocalTree` is how :class:`~streamstate.checkpoint.storage.
FileSystemCheckpointStorage` touches a local checkpoint directory instead of ``os.path`` and
fsspec: every path is walked part by part from the root with ``openat`` and ``O_NOFOLLOW``, so

* a read or a write through a link (or of a link) raises
  :class:`~streamstate.errors.CorruptCheckpointError` naming it;
* a listing reports a link as a file, never as a directory, so nothing walks into one;
* a delete removes a link itself, never what it points to, and removes nothing below one;
* a read opens regular files only (a planted FIFO would block a reader forever).

The root itself (the directory the user named) is opened as usual: a link there is the user's
choice. Paths are relative to the root, ``/``-separated, without ``..``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterator
from typing import IO

from streamstate.errors import CorruptCheckpointError

__all__ = ["LocalTree"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: modes of what a local checkpoint creates (the umask can only take bits away): a checkpoint
#: holds the state and the pickled function
PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


class _Missing(Exception):
    """A directory on the way does not exist."""


class LocalTree:
    """Files below the local directory ``root`` (see the module docstring)."""

    def __init__(self, root: str) -> None:
        self.root = root

    # ---- walking -------------------------------------------------------------------------------

    def _parts(self, path: str) -> list[str]:
        parts = [p for p in path.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise CorruptCheckpointError(
                f"{os.path.join(self.root, path)} leaves the checkpoint directory {self.root}; "
                "refused"
            )
        return parts

    def _link(self, parts: list[str]) -> CorruptCheckpointError:
        return CorruptCheckpointError(
            f"{os.path.join(self.root, *parts)} is a symbolic link; a checkpoint holds no links "
            "and streamstate follows none (refused: was it planted?)"
        )

    def _open_root(self, create: bool) -> int:
        if create:
            _makedirs_private(self.root)
        try:
            return os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            raise _Missing from None

    def _directory(self, parts: list[str], *, create: bool = False) -> int:
        """An open descriptor of the directory ``parts`` (created, mode 0700, with ``create``);
        :class:`_Missing` if a part does not exist, CorruptCheckpointError if one is a link."""
        fd = self._open_root(create)
        try:
            for i, part in enumerate(parts):
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, PRIVATE_DIR, dir_fd=fd)
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    raise _Missing from None
                except OSError as exc:
                    # a link fails O_NOFOLLOW | O_DIRECTORY with ELOOP or ENOTDIR
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    if stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode):
                        raise self._link(parts[: i + 1]) from None
                    if create:
                        raise
                    raise _Missing from None
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd

    @contextlib.contextmanager
    def _parent(self, path: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
        parts = self._parts(path)
        if not parts:
            raise IsADirectoryError(f"{self.root} is the checkpoint directory, not a file")
        fd = self._directory(parts[:-1], create=create)
        try:
            yield fd, parts[-1]
        finally:
            os.close(fd)

    # ---- reading -------------------------------------------------------------------------------

    def open_read(self, path: str) -> IO[bytes]:
        """A regular file, open for reading; ``FileNotFoundError`` if it does not exist."""
        try:
            with self._parent(path) as (fd, name):
                try:
                    f = os.open(
                        name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd
                    )
                except OSError as exc:
                    if exc.errno == errno.ELOOP:
                        raise self._link(self._parts(path)) from None
                    raise
        except _Missing:
            raise FileNotFoundError(os.path.join(self.root, path)) from None
        try:
            mode = os.fstat(f).st_mode
            if stat.S_ISDIR(mode):
                raise FileNotFoundError(f"{os.path.join(self.root, path)} is a directory")
            if not stat.S_ISREG(mode):
                raise CorruptCheckpointError(
                    f"{os.path.join(self.root, path)} is not a regular file (a FIFO, socket or "
                    "device in a checkpoint); refused"
                )
            os.set_blocking(f, True)
            return os.fdopen(f, "rb")
        except BaseException:
            os.close(f)
            raise

    def size(self, path: str) -> int | None:
        """Size of a regular file; None if nothing (or a directory) is there."""
        try:
            with self._parent(path) as (fd, name):
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except (FileNotFoundError, NotADirectoryError):
                    return None
        except _Missing:
            return None
        if stat.S_ISLNK(st.st_mode):
            raise self._link(self._parts(path))
        if stat.S_ISDIR(st.st_mode):
            return None
        return st.st_size

    def list_dir(self, path: str) -> list[tuple[str, bool]]:
        """``(name, is_directory)`` of a directory's entries ([] if it does not exist); a link
        is never a directory here."""
        try:
            fd = self._directory(self._parts(path))
        except _Missing:
            return []
        try:
            with os.scandir(fd) as entries:
                return [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
        finally:
            os.close(fd)

    # ---- writing -------------------------------------------------------------------------------

    def create(self, path: str, *, exclusive: bool = False) -> IO[bytes]:
        """A file open for writing, created (0600) with its directories (0700); truncated if it
        exists, or ``FileExistsError`` with ``exclusive``. Never through or onto a link."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        flags |= os.O_EXCL if exclusive else os.O_TRUNC
        with self._parent(path, create=True) as (fd, name):
            try:
                return os.fdopen(os.open(name, flags, PRIVATE_FILE, dir_fd=fd), "wb")
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise self._link(self._parts(path)) from None
                raise

    def replace(self, source: str, target: str) -> None:
        """Rename ``source`` to ``target`` (same directory), replacing what is there."""
        with self._parent(target) as (fd, name):
            os.rename(self._name_in(source, target), name, src_dir_fd=fd, dst_dir_fd=fd)

    def link_if_absent(self, source: str, target: str) -> bool:
        """Hard-link ``source`` to ``target`` (same directory); False if ``target`` exists."""
        with self._parent(target) as (fd, name):
            try:
                os.link(
                    self._name_in(source, target),
                    name,
                    src_dir_fd=fd,
                    dst_dir_fd=fd,
                    follow_symlinks=False,
                )
            except FileExistsError:
                return False
        return True

    def _name_in(self, source: str, target: str) -> str:
        src, dst = self._parts(source), self._parts(target)
        if src[:-1] != dst[:-1]:
            raise ValueError(f"{source} and {target} are not in one directory")
        return src[-1]

    def delete(self, path: str) -> None:
        """Delete a file, a link (not what it points to) or a directory tree; nothing if it does
        not exist or lies below a link."""
        try:
            with self._parent(path) as (fd, name):
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    return
                if stat.S_ISDIR(st.st_mode):
                    # shutil.rmtree with dir_fd walks with file descriptors: it removes links
                    # it meets and never follows them
                    shutil.rmtree(name, dir_fd=fd)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=fd)
        except (_Missing, CorruptCheckpointError):
            return
        except IsADirectoryError:
            shutil.rmtree(self.root, ignore_errors=True)


def _makedirs_private(path: str) -> None:
    """``os.makedirs`` giving every directory it creates (not only the last) mode 0700 less
    the umask; existing ones are left as they are."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    if parent and parent != path:
        _makedirs_private(parent)
    try:
        os.mkdir(path, PRIVATE_DIR)
    except FileExistsError:
        if not os.path.isdir(path):
            raise
