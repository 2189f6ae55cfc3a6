# grove — the two Quickstart commands are `make demo` and `make test`; both run `make install` first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.grove-installed
# Harbor (grove[harbor], its provider's tests) needs Python >= 3.12, a venv of its own: pyenv's 3.12 on these machines.
HARBOR_VENV := .venv-harbor
HARBOR_STAMP := $(HARBOR_VENV)/.grove-installed
PYTHON312 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python $(shell pyenv root 2>/dev/null)/versions/3.12*/bin/python) $(shell command -v python3.12 2>/dev/null))
# Test files run on this many workers (more than the 2 CPUs: most of a test's time is waiting on sandboxes, routers
# and servers, not computing).
TEST_WORKERS ?= 3
# python3-pytest: task checks in the default image (the host's /usr) run pytest, as most repositories' tests do.
DEB_PACKAGES := xvfb xdotool matchbox-window-manager fonts-dejavu-core scrot busybox-static iproute2 nftables zstd e2fsprogs xfsprogs chromium chromium-driver skopeo docker-registry apache2-utils mmdebstrap linux-libc-dev python3-pytest

.PHONY: install harbor-venv demo demo-mini test test-fast test-slow lint typecheck bench bench-burst clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

harbor-venv: $(HARBOR_STAMP)

$(HARBOR_STAMP): pyproject.toml
	@test -n "$(PYTHON312)" || { echo "Harbor needs Python 3.12: pyenv install 3.12, or make PYTHON312=/path/to/python3.12"; exit 1; }
	test -x $(HARBOR_VENV)/bin/python || $(PYTHON312) -m venv $(HARBOR_VENV)
	$(HARBOR_VENV)/bin/pip install -q --disable-pip-version-check -e '.[harbor]'
	touch $(HARBOR_STAMP)

# The demo's state is this checkout's own (.state/ is ignored by git): two checkouts never share a router's state.
demo: install
	$(BIN)/python -m grove.demo --state-dir "$(CURDIR)/.state/demo"

demo-mini: install
	$(BIN)/python -m grove.demo --harness mini-swe-agent

# Everything, the slow tests too (a real `build-debian --preset desktop` from Debian's mirror, ~2 min on a worker).
test: install harbor-venv lint typecheck
	$(BIN)/pytest -q --durations=25 -n $(TEST_WORKERS) --dist loadfile --run-slow tests

# The fast tier for quick edits: pure logic only (schemas, egress parsing, layouts, export), well under a minute.
test-fast: install
	$(BIN)/pytest -q -m fast tests

# Only the slow tests: real builds from Debian's mirror (`build-debian --preset desktop` and a click in the image),
# two minutes or more and the network. A bare `pytest` skips them; `make test` runs them.
test-slow: install
	$(BIN)/pytest -q --run-slow -m slow tests

lint: install
	$(BIN)/ruff check grove executor router artifacts sandbox_image tests perf

typecheck: install
	$(BIN)/mypy

bench: install
	$(BIN)/python -m perf.run_all

# Issue 38's figures alone (~15 min on a quiet 2-CPU machine): perf/results/step.json and perf/README.md.
bench-burst: install
	$(BIN)/python -m perf.bench_step

clean:
	rm -rf $(VENV) $(HARBOR_VENV) .state build *.egg-info
