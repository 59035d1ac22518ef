# The two commands of the README: `make demo` and `make test`. Both create .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench soak fuzz protos clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/specserve demo --max-tokens 128

test: $(STAMP)
	$(PY) -m pytest -q -rs

# CI (.ci/run) runs `make lint` and then `make test`.
lint: $(STAMP)
	$(VENV)/bin/ruff check specserve specserve_client protos draft_service target_service orchestrator inprocess deploy tests scripts
	$(VENV)/bin/mypy specserve/core specserve/adaptive orchestrator

# Runs write results/*-latest.json (git-ignored), never a committed result file (results/README.md).
bench: $(STAMP)
	$(VENV)/bin/specserve bench latency --num-prompts 10 --max-tokens 128 --json results/bench-humaneval-latest.json

# docs/reliability.md: 32 streaming clients, 1,000 requests on the tiny models (then the same past a limit of 8)
soak: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m specserve.bench.soak --clients 32 --requests 1000 --json results/reliability-load-latest.json
	OMP_NUM_THREADS=1 $(PY) -m specserve.bench.soak --clients 32 --requests 1000 --json results/reliability-overload-latest.json \
		--max-concurrent-requests 8 --max-queued-requests 8

# docs/reliability.md: 1,000 random examples per fuzz test (make test runs 12, derandomized)
fuzz: $(STAMP)
	SPECSERVE_FUZZ_EXAMPLES=1000 SPECSERVE_FUZZ_REPORT=results/reliability-fuzz-latest.json \
		$(PY) -m pytest -q -p no:logging tests/integration/test_fuzz.py

# The generated code is committed; tests/unit/test_protos.py fails when it is stale.
protos: $(STAMP)
	$(PY) -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. protos/specserve.proto

clean:
	rm -rf $(VENV)
