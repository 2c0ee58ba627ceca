# One command each for what a developer does. Everything installs into .venv (created with uv).
VENV ?= .venv
PY := $(VENV)/bin/python
UV ?= $(shell command -v uv 2>/dev/null || echo "$(VENV)/bin/uv")
VENDORS := nvidia ascend cambricon hygon iluvatar mthreads metax amd kunlun vastai enflame awsneuron biren
EDITABLES := -e ./core $(foreach v,$(VENDORS),-e ./vendors/$(v))

.PHONY: install demo test e2e lint independence ci clean image image-ci

$(PY):
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check uv

# The editable install compiles each vendor's isolation library, so it runs again only when something it reads
# changed: a pyproject, a build hook, a C source or header (the stamp is .venv/.installed; `make clean` drops it).
INSTALL_INPUTS := $(wildcard pyproject.toml */pyproject.toml vendors/*/pyproject.toml vendors/*/hatch_build.py \
	examples/third-party-vendor/pyproject.toml core/src/hami/isolation/*.[ch] core/src/hami/isolation/*/*.[ch] \
	core/src/hami/isolation/build.py vendors/*/isolation/*.[ch] vendors/*/isolation/*.map)

install: $(VENV)/.installed

$(VENV)/.installed: $(PY) $(INSTALL_INPUTS)
	@echo "installing hami-core and the vendor plugins into $(VENV) (compiles each isolation library: about 40 s; again only when a source changes) ..."
	$(VENV)/bin/uv pip install --quiet --python $(PY) $(EDITABLES) -e ./examples/third-party-vendor --group dev
	@touch $@

demo: install
	$(VENV)/bin/hami demo

test: install
	$(PY) -m pytest

# The end-to-end suite alone (also part of `make test`), after building or reusing its control plane.
e2e: install
	bash tests/e2e/build_control_plane.sh
	$(PY) -m pytest -m e2e

lint: install
	$(VENV)/bin/ruff check core vendors tests benchmarks examples packaging
	$(VENV)/bin/ruff format --check core vendors tests benchmarks examples packaging
	$(VENV)/bin/mypy core/src $(foreach v,$(VENDORS),vendors/$(v)/src) examples/third-party-vendor/src
	$(VENV)/bin/lint-imports --no-cache

independence: install
	$(PY) tests/independence.py $(VENDORS)

ci: test lint independence

# The image both components run (Containerfile), built with buildah and smoke-run inside (images/build.sh).
# `image` starts FROM python:3.12-slim (needs a registry); `image-ci` makes its bases from Debian packages.
image:
	bash images/build.sh

image-ci:
	bash images/build.sh --debian-base

clean:
	rm -rf $(VENV) dist build .pytest_cache .mypy_cache .ruff_cache
