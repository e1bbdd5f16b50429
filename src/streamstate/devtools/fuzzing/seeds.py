"""What the fuzzer mutates: a :class:`Seed` (one real file or message and what its decoder
needs) and the :class:`Corpus` of every decoder's seeds (``corpus.py`` builds it)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Corpus", "Seed"]


@dataclass
class Seed:
    """One real file (or message) and what its decoder needs to read it."""

    data: bytes
    #: where it came from (a path relative to the corpus directory, or a message name)
    origin: str
    #: the decoder's context: the key serializer, the files of the chain before it, ...
    context: dict[str, Any] = field(default_factory=dict)


@dataclass
class Corpus:
    """The seeds of every decoder, by target name, and the directory the checkpoints are in."""

    directory: str
    seeds: dict[str, list[Seed]] = field(default_factory=dict)
    _scratch: dict[str, str] = field(default_factory=dict)

    @property
    def work_directory(self) -> str:
        """Where decoders keep local files (a RocksDB backend's working directory)."""
        return os.path.join(self.directory, "work")

    def fresh_work_directory(self) -> str:
        """An empty working directory for one decoder run (the previous one is removed)."""
        import shutil

        shutil.rmtree(self.work_directory, ignore_errors=True)
        return self.work_directory

    def scratch(self, job: str) -> str:
        """A copy of the job directory ``job`` that a decoder may change (made once)."""
        import shutil

        copy = self._scratch.get(job)
        if copy is None:
            copy = os.path.join(self.directory, "scratch", os.path.relpath(job, self.directory))
            shutil.copytree(job, copy)
            self._scratch[job] = copy
        return copy
