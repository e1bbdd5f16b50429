# Two entry points for a fresh machine (Python 3.11, Java 17, gcc):
#   make demo   - create .venv, install, run the main job (again: resume it; DEMO_ARGS=--fresh)
#   make test   - create .venv, install, run the test suite
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
# the install builds the C extensions (setup.py): a change to them re-runs the install too
EXTENSIONS := src/streamstate/backends/heap/_entry.c src/streamstate/backends/heap/_entry.h src/streamstate/backends/heap/_value_state.c \
	src/streamstate/runtime/_record_loop.c src/streamstate/backends/decorators/_sampling.c \
	src/streamstate/_key_groups.c src/streamstate/_java_hash.h
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml setup.py $(EXTENSIONS) | cksum | cut -d' ' -f1)

export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))
# where the environment sets PYTHONDONTWRITEBYTECODE, every process compiles the source tree
# again (a state host, a driver, a Spark Python worker: ~0.2 s each) and every pytest process
# rewrites the tests' asserts again (~7 s of a fast-tier worker's collection)
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test check lint bench docs install clean

$(STAMP): pyproject.toml setup.py $(EXTENSIONS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m streamstate demo $(DEMO_ARGS)

# the fast tier: no Spark, no other process, nothing slow, on two pytest workers (goal: <= 90 s
# on a quiet 2-core machine)
CHECK_MARKERS := not spark and not cluster and not subprocess and not slow
# pytest exits 5 when it collects no test; that is reported, not hidden.
PYTEST_RC = rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; \
	[ $$rc -eq 0 ] || exit $$rc

# The fast tier's temporary files (tmp_path, tempfile: they follow TMPDIR) on a tmpfs where there
# is one with 2 GB free: RocksDB syncs its MANIFEST and directories on every open, flush and
# checkpoint, which on a busy disk more than doubled the wall time of the RocksDB tests. The tests
# check behaviour, not durability (tests/checkpoint/test_fault_injection.py injects the faults).
CHECK_TMPDIR := $(shell [ -d /dev/shm ] && [ -w /dev/shm ] && \
	[ "$$(df -Pk /dev/shm | awk 'NR==2 {print $$4}')" -gt 2000000 ] && echo /dev/shm)
CHECK_ENV := $(if $(CHECK_TMPDIR),TMPDIR=$(CHECK_TMPDIR))

check: $(STAMP)
	@$(CHECK_ENV) $(PY) -m pytest -q -n 2 -m "$(CHECK_MARKERS)" --durations=10; $(PYTEST_RC)

# Everything: the fast tier, then the rest in pytest processes of their own (the fast tier's
# garbage-collector tests count live and frozen objects: in a worker where Spark tests ran before
# them, the heap's GC policy was left installed and other threads allocate), the fast tier on two
# pytest workers, the rest on three (its tests wait on JVMs, drivers, nodes and timeouts: on a
# loaded 2-core machine three workers took 684 s where two took 1031 s): the tests of the
# standalone clusters, and those of the Spark Connect server, each run in one worker (xdist_scope
# in tests/conftest.py), dealt out in the workers' order, the longest first; the worker of the
# clusters then takes the tests that need no local SparkSession first, so that it starts none.
# Before them, the JVMs' class-data archive is written once per virtualenv (about 90 s of CPU;
# every Spark JVM of the tests then starts on about half the CPU: tests/support/jvm.py).
test: $(STAMP)
	@$(CHECK_ENV) $(PY) -m pytest -q -n 2 -m "$(CHECK_MARKERS)" --durations=5; $(PYTEST_RC)
	@$(PY) tests/support/jvm.py
	@$(PY) -m pytest -q -n 3 -m "not ($(CHECK_MARKERS))" --dist loadgroup \
		--no-loadscope-reorder --durations=20; $(PYTEST_RC)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench tools
	$(VENV)/bin/ruff format --check src tests bench tools
	$(VENV)/bin/mypy src
	$(PY) tools/check_imports.py

# the documentation site (docs/: the guide in MyST Markdown and the API reference from the
# docstrings, Sphinx) into build/docs; a warning (a broken link or reference) fails it.
# tests/docs/test_site.py builds it too, so `make test` (CI) checks it.
docs: $(STAMP)
	$(PY) -m sphinx -E -W --keep-going -n -q -b html docs build/docs
	@echo "documentation: build/docs/index.html"

bench: $(STAMP)
	$(PY) bench/state_access.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis .streamstate-demo
