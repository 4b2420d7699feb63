# torch_cgx: `make demo` and `make test` do all set-up on a fresh machine (see README.md).
PY ?= python3
export MAX_JOBS ?= 2

.PHONY: all deps build core-test py-test test demo bench lint format clean fuzz-build fuzz-short \
	fuzz-long fuzz-corpus tsan settings-doc

all: build

.stamp-deps: scripts/install-deps.sh requirements-dev.txt constraints.txt
	PY=$(PY) ./scripts/install-deps.sh
	touch $@

deps: .stamp-deps

# Incremental (ninja): an edit to one .cc recompiles that file only.
build: .stamp-deps
	$(PY) setup.py -q build_ext --inplace
	@cd / && $(PY) -c "import torch_cgx, sys; sys.exit(not torch_cgx.__file__.startswith('$(CURDIR)/'))" \
	  2>/dev/null || \
	  CGX_SKIP_EXT=1 $(PY) -m pip install -q --no-build-isolation --no-deps -e $(CURDIR)

core-test: .stamp-deps
	cmake -S . -B build/core -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null
	ninja -C build/core -j $(MAX_JOBS)
	ctest --test-dir build/core --output-on-failure

py-test: build
	$(PY) -m pytest tests -q --timeout=600

test: lint core-test fuzz-short tsan py-test

# Fuzzing (docs/reliability.md): libFuzzer + ASan + UBSan over every decoder of received bytes
# (cgx_fuzz_decode) and the allreduce algorithms as receivers (cgx_fuzz_allreduce), in a clang
# build of its own. Short: 30 s per target, part of `make test`. Long: every case alone for
# FUZZ_RUNS executions (FUZZ_JOBS cases at a time).
FUZZ_RUNS ?= 10000000
FUZZ_ALLREDUCE_RUNS ?= 1000000
fuzz-build: .stamp-deps
	@command -v clang++ >/dev/null || { echo "clang++ missing (it fuzzes the decoders): run make deps" >&2; exit 1; }
	cmake -S . -B build/fuzz -G Ninja -DCGX_FUZZ=ON -DCGX_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
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
tsan: .stamp-deps
	cmake -S . -B build/tsan -G Ninja -DCGX_TSAN=ON -DCGX_CUDA=OFF > /dev/null
	ninja -C build/tsan -j $(MAX_JOBS) cgx_core_tests
	./scripts/tsan.sh

demo: build
	$(PY) -m benchmarks.demo

bench: build
	$(PY) -m benchmarks.codec

lint:
	ruff check torch_cgx cgx_utils benchmarks examples tests setup.py
	ruff format --check torch_cgx cgx_utils benchmarks examples tests setup.py
	clang-format --dry-run --Werror $$(git ls-files 'csrc/*.cc' 'csrc/*.h' 'csrc/*.inc' 'csrc/*.cu')

format:
	ruff format torch_cgx cgx_utils benchmarks tests setup.py
	clang-format -i $$(git ls-files 'csrc/*.cc' 'csrc/*.h' 'csrc/*.inc' 'csrc/*.cu')

# docs/settings.md from the settings table (torch_cgx/settings.py; needs the built extension);
# tests/test_settings.py fails
# until it is regenerated after a change to the table.
settings-doc:
	$(PY) -c "from torch_cgx import settings; print(settings.markdown(), end='')" > docs/settings.md

clean:
	rm -rf build torch_cgx/*.so .stamp-deps

# The GPU checks (docs/gpu.md), on a machine with a CUDA GPU, nvcc and compute-sanitizer: the CUDA
# codec, its tests and the C ABI library the device plane loads (build/gpu/libcgx_cuda_capi.so);
# then the CUDA unit tests, compute-sanitizer's memcheck and racecheck on them, and the device
# tests with CUDA available. GPU_ARCH=90 (say) builds for that GPU only; MAX_JOBS=16 builds faster.
.PHONY: gpu-build gpu-test
GPU_ARCH ?=
gpu-build: .stamp-deps
	cmake -S . -B build/gpu -G Ninja -DCGX_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
	  $(if $(GPU_ARCH),-DCMAKE_CUDA_ARCHITECTURES=$(GPU_ARCH)) > /dev/null
	ninja -C build/gpu -j $(MAX_JOBS) cgx_cuda_tests cgx_cuda_bench cgx_cuda_capi

gpu-test: gpu-build build
	build/gpu/cgx_cuda_tests
	compute-sanitizer --tool memcheck --error-exitcode 1 build/gpu/cgx_cuda_tests
	compute-sanitizer --tool racecheck --error-exitcode 1 build/gpu/cgx_cuda_tests
	CGX_CUDA_LIBRARY=$(CURDIR)/build/gpu/libcgx_cuda_capi.so CGX_TEST_REQUIRE_CUDA=1 \
	  $(PY) -m pytest tests/test_device_*.py -q --timeout=600
	CGX_CUDA_LIBRARY=$(CURDIR)/build/gpu/libcgx_cuda_capi.so CGX_TEST_REQUIRE_CUDA=1 \
	  $(PY) -m pytest tests/test_gpu_two_ranks.py -q --timeout=600
	CGX_CUDA_LIBRARY=$(CURDIR)/build/gpu/libcgx_cuda_capi.so \
	  $(PY) -m benchmarks.device --device cuda --size 64M --json build/gpu/bench-device.json
	CGX_CUDA_LIBRARY=$(CURDIR)/build/gpu/libcgx_cuda_capi.so \
	  $(PY) -m benchmarks.device_allreduce --device cuda -b 1M -e 16M -f 4 --bits 4,8
