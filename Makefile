# The two commands of the README: `make demo` and `make test`. Both create .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench protos clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/specserve demo --max-tokens 128

test: $(STAMP)
	$(PY) -m pytest -q -rs

lint: $(STAMP)
	$(VENV)/bin/ruff check specserve draft_service target_service tests
	$(VENV)/bin/mypy specserve/core

bench: $(STAMP)
	$(VENV)/bin/specserve bench --num-prompts 10 --max-tokens 128 --json docs/bench-humaneval.json

# The generated code is committed; tests/unit/test_protos.py fails when it is stale.
protos: $(STAMP)
	$(PY) -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. protos/specserve.proto

clean:
	rm -rf $(VENV)
