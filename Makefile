# Every target creates .venv/ on first use and reuses it; downloads land in .cache/ (git-ignored).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PORT   ?= 8080

.PHONY: run test test-vllm lint format proto assets bench dictionaries clean

# setup.py and the C source too: `pip install -e .` builds the native steady path in place.
$(STAMP): pyproject.toml setup.py proxy/core/steady/_steady.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q -e '.[dev]'
	touch $(STAMP)

assets: $(STAMP)
	$(PY) -m proxy.assets

## Start a real llama.cpp server with SmolLM2-135M and codec-proxy in front of it on :$(PORT).
run: $(STAMP)
	$(VENV)/bin/codec-proxy embedded --port $(PORT)

## Exactly what CI runs after lint, then test-vllm: the whole suite with the native steady path,
## then the tests that serve streams through the data plane again on the Python path alone
## (the core's tests do not depend on the switch: proxy/core/steady is the only native code).
PYTHON_PATH_TESTS := tests/server/test_data_plane.py tests/server/test_passthrough.py \
  tests/server/test_codec_stream.py tests/server/test_token_ids.py tests/server/test_delta.py \
  tests/server/test_chat.py tests/server/test_native_paths.py
test: $(STAMP)
	$(PY) -m proxy.assets --tests
	$(PY) -m deploy.tools
	$(PY) -m pytest -m "not vllm"
	CODEC_PROXY_NO_EXTENSIONS=1 $(PY) -m pytest -m "not vllm" $(PYTHON_PATH_TESTS)

## The tests against a real vLLM (tests/vllm/): its CPU build in a virtualenv of its own and
## SmolLM2 converted for it, both built once into .cache/vllm/ (about 3.5 GB).
test-vllm: $(STAMP)
	$(PY) -m tests.vllm.backend
	$(PY) -m pytest -m vllm tests/vllm

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

## Regenerate the protobuf classes from proxy/codec.proto (never edit the output by hand).
proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -Iproxy --python_out=proxy/core/wire --pyi_out=proxy/core/wire proxy/codec.proto

bench: $(STAMP)
	$(PY) -m proxy.assets
	$(PY) bench/wire.py
	$(PY) bench/throughput.py
	$(PY) bench/compression.py
	$(PY) bench/load.py
	$(PY) bench/paced.py
	$(PY) bench/short.py --runs 3

## Retrain the shipped zstd dictionaries (docs/COMPRESSION.md). The corpus is SmolLM2's own
## output, committed in dictionaries/corpus/; delete it to regenerate it (about an hour of CPU).
DICT_CORPUS := dictionaries/corpus/smollm2-generated.txt
DICT_SUMMARY := 90 completions written by SmolLM2-135M-Instruct (Apache-2.0) in llama.cpp \
  for fixed prompts and seeds (python -m proxy.dictionaries.generate); redistributable
dictionaries: $(STAMP)
	$(PY) -m proxy.assets
	test -f $(DICT_CORPUS) || $(PY) -m proxy.dictionaries.generate --out $(DICT_CORPUS)
	for fmt in msgpack protobuf; do \
	  $(VENV)/bin/codec-proxy dict train --tokenizer "$$($(PY) -c 'from proxy import assets; print(assets.SMOLLM2_GGUF.ensure())')" \
	    --format $$fmt --corpus $(DICT_CORPUS) --out dictionaries/smollm2-$$fmt-v1.zstd \
	    --corpus-summary "$(DICT_SUMMARY)" || exit 1; \
	done

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
