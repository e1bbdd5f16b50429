"""Every checkpoint decoder fuzzed (SPEC §14.5): a short, seeded run of the mutation fuzzer
(:mod:`streamstate.devtools.fuzzing`) over real checkpoints of both backends and the host
channel's messages. Only the project's errors come out, memory stays bounded by the input's
size, and nothing outside the checkpoint is read or written. ``bench/fuzz_checkpoints.py`` runs
the long one."""

from __future__ import annotations

import pytest

from streamstate.devtools.fuzzing import Corpus, build_corpus, fuzz, targets

#: inputs per decoder: the cheap decoders many, those that open a RocksDB database a few
INPUTS = {
    "metadata": 150,
    "keyed": 150,
    "keyed-rocksdb": 3,
    "operator-state": 300,
    "manifest": 200,
    "manifest-restore": 3,
    "manifest-native": 3,
    "serializer-snapshot": 300,
    "channel": 120,
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return build_corpus(str(tmp_path_factory.mktemp("fuzz")))


def test_the_inputs_cover_every_decoder(corpus: Corpus) -> None:
    assert set(INPUTS) == {t.name for t in targets(corpus)}
    kinds = {s.context.get("kind") for s in corpus.seeds["keyed"]}
    assert kinds == {"full", "delta"}
    labels = {s.context["label"] for s in corpus.seeds["metadata"]}
    assert {"heap-none", "heap-lz4", "heap-zstd", "heap-incremental", "rocksdb"} <= labels


def test_a_short_fuzz_run_finds_nothing(corpus: Corpus) -> None:
    # allocations traced for every third input (tracing triples the cost of decoding)
    report = fuzz(corpus, seed=36, inputs=INPUTS, trace_memory=3)
    if report.findings:
        first = report.findings[0]
        pytest.fail(
            f"{len(report.findings)} finding(s); first: {first.target} {first.problem} from "
            f"{first.origin}:\n{first.detail}\ninput: {first.data[:512].hex()}"
        )
    assert dict(report.inputs) == INPUTS
    for name, outcomes in report.outcomes.items():
        if INPUTS[name] >= 100:
            # the mutations reach past the checksums: some inputs decode, others are refused
            assert outcomes["ok"] or name == "channel", (name, outcomes)
            assert sum(n for kind, n in outcomes.items() if kind != "ok"), (name, outcomes)
    assert report.peak, "no allocation was traced"
