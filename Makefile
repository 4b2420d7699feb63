# torch_cgx: `make demo` and `make test` do all set-up on a fresh machine (see README.md).
PY ?= python3
export MAX_JOBS ?= 2

# An externally managed PY (PEP 668: Debian 12's /usr/bin/python3) gets a virtual environment,
# .venv, that install-deps.sh creates from it: every target below then runs .venv/bin/python, and
# .venv/bin (ruff, clang-format, torchrun) comes first on PATH. Any other PY is used as it is.
PY_BASE := $(PY)
override PY := $(or $(shell scripts/pick-python.sh '$(PY_BASE)'),$(PY_BASE))
ifneq ($(PY),$(PY_BASE))
export PATH := $(CURDIR)/.venv/bin:$(PATH)
DEPS_STAMP := .venv/.stamp-deps
else
DEPS_STAMP := .stamp-deps
endif

.PHONY: all deps build core-test py-test test demo bench lint format clean fuzz-build fuzz-short \
	fuzz-long fuzz-corpus tsan settings-doc gpu-check gpu-check-cpu

all: build

$(DEPS_STAMP): scripts/install-deps.sh scripts/pick-python.sh requirements-dev.txt constraints.txt
	PY=$(PY_BASE) ./scripts/install-deps.sh
	touch $@

deps: $(DEPS_STAMP)

# Incremental (ninja): an edit to one .cc recompiles that file only.
build: $(DEPS_STAMP)
	$(PY) setup.py -q build_ext --inplace
	@cd / && $(PY) -c "import torch_cgx, sys; sys.exit(not torch_cgx.__file__.startswith('$(CURDIR)/'))" \
	  2>/dev/null || \
	  CGX_SKIP_EXT=1 $(PY) -m pip install -q --no-build-isolation --no-deps -e $(CURDIR)

core-test: $(DEPS_STAMP)
	cmake -S . -B build/core -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null
	ninja -C build/core -j $(MAX_JOBS)
	ctest --test-dir build/core --output-on-failure

py-test: build
	CGX_TEST_EXPECTED_SKIPS=tests/expected_skips.txt $(PY) -m pytest tests -q -rs --timeout=600 --durations=15

test: lint core-test fuzz-short tsan py-test gpu-check-cpu

# Fuzzing (docs/reliability.md): libFuzzer + ASan + UBSan over every decoder of received bytes
# (cgx_fuzz_decode) and the allreduce algorithms as receivers (cgx_fuzz_allreduce), in a clang
# build of its own. Short: 30 s per target (side by side), part of `make test`. Long: every
# case alone for FUZZ_RUNS executions (FUZZ_JOBS cases at a time).
FUZZ_RUNS ?= 10000000
FUZZ_ALLREDUCE_RUNS ?= 1000000
fuzz-build: $(DEPS_STAMP)
	@command -v clang++ >/dev/null || { echo "clang++ missing (it fuzzes the decoders): run make deps" >&2; exit 1; }
	cmake -S . -B build/fuzz -G Ninja -DCGX_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang > /dev/null
	ninja -C build/fuzz -j $(MAX_JOBS) cgx_fuzz_decode cgx_fuzz_allreduce cgx_fuzz_corpus

fuzz-short: fuzz-build
	./scripts/fuzz.sh 30

fuzz-long: fuzz-build
	./scripts/fuzz.sh --each $(FUZZ_RUNS) decode
	./scripts/fuzz.sh --each $(FUZZ_ALLREDUCE_RUNS) allreduce

# The seed corpus, regenerated (after a change to a payload format or to csrc/fuzz/fuzz_cases.h).
fuzz-corpus: fuzz-build
	rm -rf csrc/fuzz/corpus
	build/fuzz/cgx_fuzz_corpus csrc/fuzz/corpus

# ThreadSanitizer over the C++ tests that run ranks and workers as threads (about 65 s with its
# build on 2 cores: part of `make test`).
tsan: $(DEPS_STAMP)
	cmake -S . -B build/tsan -G Ninja -DCGX_TSAN=ON > /dev/null
	ninja -C build/tsan -j $(MAX_JOBS) cgx_tsan_tests
	./scripts/tsan.sh

demo: build
	$(PY) -m benchmarks.demo

bench: build
	$(PY) -m benchmarks.codec

lint: $(DEPS_STAMP)
	ruff check torch_cgx cgx_utils benchmarks examples tests scripts setup.py
	ruff format --check torch_cgx cgx_utils benchmarks examples tests scripts setup.py
	clang-format --dry-run --Werror $$(git ls-files 'csrc/*.cc' 'csrc/*.h' 'csrc/*.inc')

format: $(DEPS_STAMP)
	ruff format torch_cgx cgx_utils benchmarks examples tests scripts setup.py
	clang-format -i $$(git ls-files 'csrc/*.cc' 'csrc/*.h' 'csrc/*.inc')

# docs/settings.md and csrc/torch/settings_rules.h from the settings table (torch_cgx/settings.py;
# the doc needs the built extension, the header not: build again after it changes);
# tests/test_settings.py and tests/test_settings_rules.py fail until they are regenerated after a
# change to the table.
settings-doc:
	$(PY) scripts/settings_rules.py
	$(PY) -c "from torch_cgx import settings_doc; print(settings_doc.markdown(), end='')" > docs/settings.md

clean:
	rm -rf build torch_cgx/*.so .stamp-deps .venv/.stamp-deps

# The GPU check (docs/gpu-check.md): on a machine with a CUDA GPU, with only what is
# there (no installer, no network): builds with every core, runs each step with its own timeout and
# writes report.md / report.json / logs.txt into GPU_CHECK_OUT. The device tool's call is
# `scripts/gpu_check.sh $OUT`. gpu-check-cpu: the same steps on CPU tensors (part of `make test`),
# offline (scripts/offline.sh: no network namespace, installers refused, packages unchanged).
GPU_CHECK_OUT ?= build/gpu-check
# (gpu-check installs nothing: without a .venv it runs PY itself.)
gpu-check:
	PY=$(if $(wildcard $(PY)),$(PY),$(PY_BASE)) scripts/gpu_check.sh $(GPU_CHECK_OUT)

gpu-check-cpu: build
	PY=$(PY) scripts/offline.sh scripts/gpu_check.sh --cpu build/gpu-check-cpu
