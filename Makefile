# Set-up and the two entry points of the README. Everything lives in ./.venv inside the checkout.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
UV := $(VENV)/bin/uv
UV_SPEC := uv==0.13.9
TORCH_PINS := torch==2.14.1 torchvision==0.29.1
# An index to take torch and torchvision from instead of PyPI, whose torch wheel requires its CUDA libraries (3.2 GB)
# even without a GPU: TORCH_INDEX=https://download.pytorch.org/whl/cpu is PyTorch's CPU-only build of the same versions
TORCH_INDEX ?=
export GRADIO_ANALYTICS_ENABLED := False
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export NO_MKDOCS_2_WARNING := 1

.PHONY: setup quickstart test lint docs demo bench bench-serve bench-aiperf eval-minivista clean

setup: $(VENV)/.installed

# uv installs the same packages as pip (the same resolution from PyPI) in a fraction of pip's time: the torch venv is
# 7.6 GB, which pip unpacks file by file (about 5 minutes here against about 1.5 with uv)
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q $(UV_SPEC)
	$(UV) pip install -q --python $(PY) $(TORCH_PINS) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(UV) pip install -q --python $(PY) -e ".[all,dev]"
	touch $@

# 1) set up and answer a bundled question with the bundled tiny pair (prints the answer and its token provenance),
# then say how to run the command line: it lives in $(VENV)/bin, which a new shell does not have on its PATH
quickstart: setup
	$(VENV)/bin/asymspec-mm quickstart
	@echo "next: source $(VENV)/bin/activate  (then asymspec-mm generate ..., serve, demo; or call $(VENV)/bin/asymspec-mm without activating)"

# 2) set up, lint, build the docs strictly and run the whole test suite (browser tests use Debian's chromium, installed here when missing)
test: setup
	@[ -x /usr/bin/chromium ] || (command -v apt-get >/dev/null && (apt-get install -y -qq chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null))) || echo "chromium not installable: browser tests will be skipped"
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory docs
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=25 --ignore=tests/test_ui_browser.py --ignore=tests/test_ui_browser_new_user.py
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=5 tests/test_ui_browser.py tests/test_ui_browser_new_user.py

# ruff: lint and format check (pyproject.toml's [tool.ruff])
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# the documentation site (docs/ + mkdocs.yml) into site/; strict: a broken link or a missing API object fails it
docs: setup
	$(VENV)/bin/mkdocs build --strict --site-dir site

demo: setup
	$(VENV)/bin/asymspec-mm demo --preset tiny

bench: setup
	$(VENV)/bin/asymspec-mm bench

# the serving benchmark (issue #43): `vllm bench serve` against `serve --preset tiny`, AsymSpec beside Floor at
# concurrency 1, 4 and 16; ~6 min on 2 cores; needs vLLM's venv (bash scripts/vllm_venv.sh, or VLLM_VENV=...)
bench-serve: setup
	VENV=$(VENV) bash scripts/serving_bench.sh

# AIPerf against `serve --preset tiny` (issue #49): AIPerf's Spec Decode table from the answers' per-request
# acceptance, beside the server's counters; ~3 min on 2 cores; needs aiperf (.venv-aiperf/bin/pip install aiperf)
bench-aiperf: setup
	VENV=$(VENV) bash scripts/aiperf_bench.sh

eval-minivista: setup
	$(VENV)/bin/asymspec-mm eval mathvista --dataset minivista --preset tiny --methods floor,drafter,asymspec --out runs/minivista

clean:
	rm -rf $(VENV) runs artifacts site .pytest_cache
