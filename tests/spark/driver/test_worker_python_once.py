"""The workers' Python setting is asked of a running SparkContext once (``environment.py``): a
context's settings are fixed when it starts, so each keyed job no longer pays a round trip to
the JVM for it; another context is asked again. No Spark: a context is anything with ``_conf``."""

from __future__ import annotations

from typing import Any

from streamstate.spark.driver.environment import _configured_python


class FakeConf:
    def __init__(self, value: str | None) -> None:
        self.value = value
        self.asked = 0

    def get(self, key: str, default: Any = None) -> Any:
        assert key == "spark.pyspark.python"
        self.asked += 1
        return self.value if self.value is not None else default


class FakeContext:
    def __init__(self, value: str | None) -> None:
        self._conf = FakeConf(value)


def test_a_context_is_asked_once_and_another_context_again() -> None:
    first, second, unset = (
        FakeContext("/opt/a/python"),
        FakeContext("/opt/b/python"),
        FakeContext(None),
    )
    assert [_configured_python(first) for _ in range(3)] == ["/opt/a/python"] * 3
    assert first._conf.asked == 1
    assert _configured_python(second) == "/opt/b/python" and second._conf.asked == 1
    # not set is an answer too: asked once
    assert [_configured_python(unset) for _ in range(2)] == [None, None]
    assert unset._conf.asked == 1
