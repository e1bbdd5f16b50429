"""Mutation fuzzing of every checkpoint decoder (SPEC §14.5): a checkpoint is input.

:func:`~streamstate.devtools.fuzzing.corpus.build_corpus` writes real checkpoints of every
kind; :func:`~streamstate.devtools.fuzzing.harness.fuzz` mutates their files (bytes, decoded
values, checksums sealed again: ``mutations.py``) and decodes each input as the runtime does
(``targets.py``: ``_metadata``, keyed snapshot files and incremental deltas on both backends,
RocksDB manifests, operator state, timers, the host channel's messages after authentication),
checking that only documented errors come out, that memory stays bounded by the input's size and
that nothing outside the checkpoint is read or written. ``tests/checkpoint/test_decoder_fuzz.py``
runs a short fixed-seed run in the fast tier; ``bench/fuzz_checkpoints.py`` a long one.
"""

from streamstate.devtools.fuzzing.corpus import build_corpus
from streamstate.devtools.fuzzing.harness import Finding, FuzzReport, fuzz, memory_limit
from streamstate.devtools.fuzzing.seeds import Corpus, Seed
from streamstate.devtools.fuzzing.targets import CHECKPOINT_ERRORS, Target, targets

__all__ = [
    "CHECKPOINT_ERRORS",
    "Corpus",
    "Finding",
    "FuzzReport",
    "Seed",
    "Target",
    "build_corpus",
    "fuzz",
    "memory_limit",
    "targets",
]
