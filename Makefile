# The two commands: `make run` (dev server + worker + a softmax run + report) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
ITERATIONS ?= 30
PROBLEM ?= softmax

.PHONY: install run test bench-overhead clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	# CPU torch first where none is installed: a plain `torch` requirement would pull a multi-GB CUDA build.
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install torch==2.13.0
	$(PIP) install -e '.[test]'
	touch $@

run: install
	$(VENV)/bin/marathon demo $(PROBLEM) --iterations $(ITERATIONS)

test: install
	$(PY) -m pytest -q

bench-overhead: install
	$(PY) -m tests.bench_overhead

clean:
	rm -rf $(VENV) *.egg-info
