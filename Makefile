# Two commands on a fresh machine: `make demo` and `make test`. Each sets up what it needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
DEVICE ?= npu
# Every pin lives in pyproject.toml: build requirements, dependencies, and the test/bench/docs groups.
DEPS = $(shell $(PYTHON) .ci/pyproject_deps.py test bench docs onnx serve)
SOURCES := $(shell git ls-files 2>/dev/null | grep -E '\.(c|h|cl|cpp|hpp|py|txt|toml|yaml|j2|json|md|npz)$$|CMakeLists')
SELFTEST_DIR := build/selftest
ASAN_DIR := build/selftest-asan

.PHONY: demo test sysdeps install selftest selftest-asan selftest-opencl selftest-cuda pytest conformance-quick docs bench clean

sysdeps:
	@bash .ci/sysdeps.sh

$(VENV)/.deps: pyproject.toml .ci/pyproject_deps.py | sysdeps
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(DEPS)
	$(PIP) install -q --no-deps --upgrade --target $(VENV)/oar-torchvision $(shell $(PYTHON) .ci/pyproject_deps.py --only torchvision)
	touch $@

# Non-editable install into the venv; build/ keeps CMake's objects between runs.
$(VENV)/.installed: $(VENV)/.deps $(SOURCES)
	$(PIP) install -q --no-build-isolation --no-deps .
	touch $@

install: $(VENV)/.installed

# The CPU plugin poses as $(DEVICE), except for a device a bundled plugin provides itself (opencl).
DEMO_ENV := $(if $(filter opencl,$(DEVICE)),,OAR_REFCPU_DEVICE_TYPE=$(DEVICE))

demo: install
	$(DEMO_ENV) $(VENV)/bin/oar info
	$(DEMO_ENV) $(PY) examples/demo.py --device $(DEVICE)
	$(DEMO_ENV) $(PY) examples/onnx_demo.py --device $(DEVICE)
	mkdir -p build/demo
	$(DEMO_ENV) $(PY) examples/train_llama.py --device $(DEVICE) --checkpoint build/demo/llama.safetensors
	$(DEMO_ENV) $(PY) examples/infer_llama.py --device $(DEVICE) --checkpoint build/demo/llama.safetensors
	$(DEMO_ENV) $(PY) examples/compile_llama.py --device $(DEVICE)
	$(DEMO_ENV) $(PY) examples/train_ddp_compare.py --device $(DEVICE)
	$(DEMO_ENV) $(PY) examples/train_llama_tp_demo.py --device $(DEVICE) --steps 10 --quick
	$(DEMO_ENV) $(PY) examples/torch_npu.py --device $(DEVICE)

# The CPU plugin's C self-test, plain and under AddressSanitizer + UBSan.
selftest: $(VENV)/.deps
	cmake -S reference_backends/cpu -B $(SELFTEST_DIR) -DPython_EXECUTABLE=$(abspath $(PY)) -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(SELFTEST_DIR) -j2 >/dev/null
	set -e; for test in $(SELFTEST_DIR)/refcpu_*selftest; do \
	  $$test $(SELFTEST_DIR)/liboar_refcpu.so; \
	  OAR_REFCPU_STRICT=1 $$test $(SELFTEST_DIR)/liboar_refcpu.so; \
	done

selftest-asan: $(VENV)/.deps
	cmake -S reference_backends/cpu -B $(ASAN_DIR) -DPython_EXECUTABLE=$(abspath $(PY)) -DCMAKE_BUILD_TYPE=Debug -DOAR_REFCPU_SANITIZE=ON >/dev/null
	cmake --build $(ASAN_DIR) -j2 >/dev/null
	set -e; export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1; \
	for test in $(ASAN_DIR)/refcpu_*selftest; do \
	  $$test $(ASAN_DIR)/liboar_refcpu.so; \
	  OAR_REFCPU_STRICT=1 $$test $(ASAN_DIR)/liboar_refcpu.so; \
	done

# The OpenCL plugin's C self-test; exit 77 (no OpenCL platform or device) counts as a pass.
selftest-opencl: $(VENV)/.deps
	cmake -S reference_backends/opencl -B build/selftest-opencl -DPython_EXECUTABLE=$(abspath $(PY)) -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build build/selftest-opencl -j2 >/dev/null
	@if [ ! -x build/selftest-opencl/opencl_selftest ]; then \
	  echo "selftest-opencl: skipped: the OpenCL plugin was not built (no OpenCL headers / ICD loader)"; \
	else rc=0; build/selftest-opencl/opencl_selftest build/selftest-opencl/liboar_opencl.so || rc=$$?; \
	  if [ $$rc = 77 ]; then echo "selftest-opencl: passed as skipped (exit 77: no OpenCL device)"; \
	  elif [ $$rc != 0 ]; then exit $$rc; fi; fi

# The CUDA plugin where nvcc is on PATH: built with -Werror (one architecture, sm_75 + its PTX,
# to keep CI fast) and its C self-test run; exit 77 (no CUDA device) counts as a pass.
selftest-cuda: $(VENV)/.deps
	@if ! command -v nvcc >/dev/null 2>&1; then echo "selftest-cuda: skipped: nvcc is not on PATH (no CUDA toolkit)"; exit 0; fi; \
	set -e; \
	cmake -S reference_backends/cuda -B build/selftest-cuda -DPython_EXECUTABLE=$(abspath $(PY)) -DCMAKE_BUILD_TYPE=Release \
	  -DCMAKE_CUDA_ARCHITECTURES=75 >/dev/null; \
	cmake --build build/selftest-cuda -j2 >/dev/null; \
	rc=0; build/selftest-cuda/cuda_selftest build/selftest-cuda/liboar_cuda.so || rc=$$?; \
	if [ $$rc = 77 ]; then echo "selftest-cuda: passed as skipped (exit 77: no CUDA device)"; else exit $$rc; fi

pytest: install
	$(PY) -m pytest -q

# The frozen quick tier of the conformance suite, as a vendor's CI would run it.
conformance-quick: install
	$(VENV)/bin/conformance run --device refcpu --quick --jobs 2 --no-progress --junit build/conformance-quick.xml

# The docs as a reader gets them; --strict fails on a broken link or a failing reference generator.
docs: $(VENV)/.deps
	$(VENV)/bin/mkdocs build --strict --quiet

test: selftest selftest-asan selftest-opencl selftest-cuda pytest conformance-quick docs

bench: install
	$(PY) bench/launch_overhead.py
	$(PY) bench/dispatch_overhead.py
	$(PY) bench/memcpy_bandwidth.py
	$(PY) bench/matmul_gflops.py
	$(PY) bench/train_step.py
	$(PY) bench/compiled.py
	$(PY) bench/pinn.py
	$(PY) bench/profiler_overhead.py
	$(PY) bench/ops.py
	$(PY) bench/conv2d.py
	OAR_REFCPU_DEVICE_TYPE=npu $(PY) bench/torch_bridge.py --device npu --resnet18 --gpt2

clean:
	rm -rf build $(VENV)
