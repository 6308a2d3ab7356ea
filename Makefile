# latent-cache: `make demo` runs the example engine; `make test` runs every test.
# Every install step lives here: a fresh clone needs only Rust, a C/C++ compiler and Python with
# pip. Third-party parts (MLX from PyPI, mlx-c from crates.io) are fetched into ignored folders.

SHELL := /bin/bash
.DEFAULT_GOAL := build
.PHONY: deps build header check-header lint lint-apple test test-rust test-c test-swift test-valgrind test-interop test-host-mlx demo examples bench bench-quick bench-ab bench-deps fuzz clean

UNAME := $(shell uname -s)
DEPS := $(CURDIR)/.deps
PY := $(DEPS)/py
MLX_VERSION := 0.32.2
# MLX 0.32.2's wheels are for CPython 3.10 and newer (the Command Line Tools' python3 is 3.9:
# run `make PYTHON=python3.12 ...` with a newer one).
PYTHON ?= python3
# Linux uses PyPI's CPU build of MLX; macOS the regular wheel (Metal), which pulls `mlx-metal`.
ifeq ($(UNAME),Darwin)
MLX_WHEEL := mlx==$(MLX_VERSION)
SO := dylib
# MLX 0.32.2 needs macOS 14 (its wheels start there; Metal 3.1's bfloat). Everything built here
# (rustc, the cc crate's mlx-c, the ship link) targets it, and pip takes the macOS 14 build of
# mlx-metal, the oldest, whatever macOS builds, so the shipped tree runs on every macOS MLX
# supports (pip would otherwise pick the 15.0 or 26 build on a newer Mac).
export MACOSX_DEPLOYMENT_TARGET := 14.0
PIP_PLATFORM := --platform macosx_14_0_arm64 --only-binary=:all:
else
MLX_WHEEL := mlx-cpu==$(MLX_VERSION)
SO := so
PIP_PLATFORM :=
endif
PIP_STAMP := $(DEPS)/.pip-$(MLX_VERSION)
export MLX_PREFIX := $(PY)
export LIBCLANG_PATH := $(PY)/clang/native

LIB := target/release/liblatent_cache.$(SO)
OUT := target/c
CC ?= cc
CXX ?= c++
CWARN := -Wall -Wextra -Werror
SAN := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
# C and C++ programs link the library as it ships (target/ship, built by packaging/ship.mk).
LINK := -Ltarget/ship/lib -llatent_cache -Wl,-rpath,$(CURDIR)/target/ship/lib
# LeakSanitizer checks the C clients' runs, our library's allocations included (it shares the
# process's malloc). Live handles stay reachable through the handle registry, so leaked handles
# are caught by the soak test's memory accounting instead.
# Apple clang's ASan has no LeakSanitizer (detect_leaks=1 stops every program before main
# there); on macOS the leak check is `leaks`, in test-valgrind.
ifeq ($(UNAME),Darwin)
export ASAN_OPTIONS := abort_on_error=1
else
export ASAN_OPTIONS := detect_leaks=1:abort_on_error=1
endif
export UBSAN_OPTIONS := print_stacktrace=1:halt_on_error=1

$(PIP_STAMP):
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' || { echo "error: MLX $(MLX_VERSION)'s \
	  wheels need Python 3.10 or newer; $(PYTHON) is $$($(PYTHON) -V 2>&1). Install a newer Python \
	  (python.org, Homebrew) and run make PYTHON=python3.12 (or put it first on PATH)." >&2; exit 1; }
	@mkdir -p $(DEPS)
	$(PYTHON) -m pip install --quiet --disable-pip-version-check --target $(PY) $(PIP_PLATFORM) \
	  "$(MLX_WHEEL)" libclang==18.1.1
ifeq ($(UNAME),Darwin)
	@grep -q 'Tag: .*macosx_14_0_arm64' $(PY)/mlx_metal-$(MLX_VERSION).dist-info/WHEEL || \
	  { echo "error: pip did not take mlx-metal's macOS 14.0 build" >&2; exit 1; }
endif
	@touch $@

deps: $(PIP_STAMP)

build: deps
	cargo build --release -p latent-cache

# Regenerates the checked-in header with the pinned cbindgen.
header:
	cargo run --quiet --release -p gen-header -- . include/latent_cache.h

# Fails when the checked-in header differs from a fresh generation by a byte.
check-header:
	@mkdir -p target/header
	cargo run --quiet --release -p gen-header -- . target/header/latent_cache.h
	@cmp include/latent_cache.h target/header/latent_cache.h || \
	  { echo "include/latent_cache.h is stale: run 'make header' and commit it"; exit 1; }
	@# Every macro the header defines is the library's (the include guard and mlx-c's guard aside).
	@! grep -E '^#define ' include/latent_cache.h | grep -vE '^#define (LATENT_CACHE_|MLX_ARRAY_H)' || \
	  { echo "include/latent_cache.h defines unprefixed macros: exclude them in cbindgen.toml"; exit 1; }

# House style: the scripts `make test` runs keep to bash 3.2 (macOS's /bin/bash;
# tools/bash32-lint.py), the floor plan (tools/floor-plan.py: rooms import only the rooms below them, no
# import circles, no file over 400 lines, each file opening with its job), rustfmt (rustfmt.toml)
# and clippy with every warning an error, on every crate and target of the workspace (library,
# tests, benchmark driver, header tool, mlx-sys).
SCRIPTS := Makefile packaging/ship.mk $(wildcard packaging/*.sh packaging/*/*.sh tests/*/*.sh tools/*.sh tools/*/*.sh) .ci/run
lint: deps
	$(PYTHON) tools/bash32-lint.py $(SCRIPTS)
	$(PYTHON) tools/floor-plan.py
	cargo fmt --all --check
	cargo clippy --release --workspace --all-targets -- -D warnings

test: build check-header lint lint-apple test-rust test-c test-valgrind check-symbols test-install test-interop test-host-mlx test-swift

test-rust: deps
	cargo test --release -p latent-cache
	cargo test --release -p latent-cache-bench --bins

# Files exchanged with mlx-lm itself (its save_prompt_cache / load_prompt_cache), on PyPI's
# mlx and mlx-lm of the versions the benchmarks use.
test-interop: bench-deps
	LATENT_CACHE_MLX_LM_PYTHONPATH=$(BENCH_PY) cargo test --release -p latent-cache --test mlx_lm -- --ignored

# The soak test again under a leak checker (fewer operations: the checkers are slow): on Linux
# valgrind memcheck (no definite leaks, no memory errors); on macOS, where valgrind has no
# Apple-silicon port, the system's leaks(1), which inspects the process as it exits.
ifeq ($(UNAME),Darwin)
LEAK_CHECK := leaks --atExit --
LEAK_ENV := MallocStackLogging=1
else
LEAK_CHECK := valgrind --quiet --leak-check=full --show-leak-kinds=definite --errors-for-leak-kinds=definite --error-exitcode=3
LEAK_ENV :=
endif
test-valgrind: deps
	SOAK_OPS=3000 $(LEAK_ENV) cargo test --release -p latent-cache --test soak \
	  --config "target.'cfg(all())'.runner = [$(foreach w,$(LEAK_CHECK),'$(w)',)]"

# Clippy as it runs on Apple silicon (the macOS-only code paths), from this Linux machine:
# rustup's standard library for the target, and mlx-sys in its check-only mode (nothing compiled
# for or linked against macOS; `cargo clippy` needs neither). On a Mac `make lint` does this.
APPLE_TARGET := aarch64-apple-darwin
lint-apple: deps
ifeq ($(UNAME),Darwin)
	@echo "lint-apple: on a Mac, make lint checks the Apple code paths itself"
else
	@if ! rustup target add $(APPLE_TARGET); then \
	  echo "lint-apple: SKIPPED: rustup could not install the $(APPLE_TARGET) standard library" >&2; exit 0; fi; \
	LATENT_CACHE_MLX_C=check cargo clippy --release --workspace --all-targets --target $(APPLE_TARGET) \
	  --target-dir target/lint-apple -- -D warnings
endif

# C and C++ clients against the shipped library, under ASan/UBSan; the header must compile as
# C11 and C++17, included twice.
test-c: ship
	@mkdir -p $(OUT)
	$(CC) -std=c11 $(CWARN) -Iinclude -fsyntax-only tests/c/header_twice.c
	$(CXX) -std=c++17 $(CWARN) -Iinclude -x c++ -fsyntax-only tests/c/header_twice.c
	$(CC) -std=c11 $(CWARN) $(SAN) -g -Iinclude tests/c/test_api.c -o $(OUT)/test_api $(LINK) -lm
	$(CC) -std=c11 $(CWARN) $(SAN) -g -Iinclude tests/c/test_threads.c -o $(OUT)/test_threads $(LINK) -lpthread
	$(CXX) -std=c++17 $(CWARN) $(SAN) -g -Iinclude tests/c/test_cpp.cpp -o $(OUT)/test_cpp $(LINK)
	$(CC) -std=c11 $(CWARN) $(SAN) -g -O1 -Iinclude examples/engine.c -o $(OUT)/engine_asan $(LINK) -lm
	$(PYTHON) tools/readme-examples.py README.md $(OUT)/readme
	$(CC) -std=c11 $(CWARN) $(SAN) -g -Iinclude $(OUT)/readme/readme_decode.c -o $(OUT)/readme_decode $(LINK)
	$(OUT)/readme_decode
	$(CC) -std=c11 $(CWARN) $(SAN) -g -Iinclude $(OUT)/readme/readme_prefill.c -o $(OUT)/readme_prefill $(LINK) -lm
	$(OUT)/readme_prefill
	$(OUT)/test_api
	$(OUT)/test_threads
	$(CC) -std=c11 $(CWARN) $(SAN) -g -Iinclude tests/c/test_persist.c -o $(OUT)/test_persist $(LINK)
	$(OUT)/test_persist save $(OUT)/persisted.safetensors
	$(OUT)/test_persist load $(OUT)/persisted.safetensors
	rm -rf $(OUT)/store && $(OUT)/test_persist store-put $(OUT)/store && $(OUT)/test_persist store-restore $(OUT)/store
	$(CC) -std=c11 $(CWARN) $(SAN) -g -Iinclude tests/c/test_distributed.c -o $(OUT)/test_distributed $(LINK)
	$(OUT)/test_distributed $(OUT)/ring-hosts.json
	$(CXX) -std=c++17 $(CWARN) $(SAN) -g -Iinclude examples/decode.cpp -o $(OUT)/decode_cpp_asan $(LINK)
	$(OUT)/test_cpp
	$(OUT)/engine_asan --layers 6 --dsa 2 --prefill 600 --chunk 256 --decode 12
	$(CC) -std=c11 $(CWARN) $(SAN) -g -O1 -Iinclude examples/attention.c -o $(OUT)/attention_asan $(LINK) -lm
	$(OUT)/attention_asan --context 700 --steps 2 --topk 256
	$(OUT)/decode_cpp_asan --steps 8

# The Swift package against the shipped library (tools/swift/run.sh): a check that the Swift
# layer calls every C function, `swift build` (warnings as errors), `swift test`, the Swift
# engine example and a dependent package. On Linux, Swift 6.0.3 runs in a Debian 13 root folder
# made once under .deps/swift-root (needs root: debootstrap, chroot, mounts); on macOS, the
# system's swift.
test-swift: ship
	PYTHON=$(PYTHON) bash tools/swift/run.sh

# Engines that bring their own MLX (docs/packaging.md, "Bringing your own MLX"): the library
# built with MLX=host (target/ship-host) carries its mlx-c privately and references MLX's C++
# runtime alone (tests/host_mlx/check-symbols.sh). Two C++ engines, each linked once against the
# shared library and once against the archive (with the .pc's Libs.private, which names no MLX),
# link the wheel's libmlx themselves: one compiles its own mlx-c (incrementally, in
# target/host-mlx-test/mlxc) and appends and reads with it, once with the library's mlx-c
# version and once with another (HOST_ENGINE_MLXC); the other has no mlx-c at all (MLX's C++
# API, under ASan and UBSan).
HOST_MLX_OUT := target/host-mlx-test
HOST_SHIP := target/ship-host
HOST_MLXC_FOR_SHARED := $(HOST_MLX_OUT)/mlxc/libmlxc.a
# ASan beside MLX's uninstrumented runtime: leaks of MLX's own process-lifetime state are not ours.
HOST_CORE_ENV := ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
# The other MLX versions the library admits (core/mlx/runtime.rs): the engine without mlx-c is
# also built against each one's headers and run on its runtime (PyPI's wheel, in .deps).
HOST_OTHER_MLX := 0.32.3
HOST_OTHER_STAMPS := $(foreach v,$(HOST_OTHER_MLX),$(DEPS)/.pip-host-$(v))
$(DEPS)/.pip-host-%:
	$(PYTHON) -m pip install --quiet --disable-pip-version-check --target $(DEPS)/py-$* $(PIP_PLATFORM) \
	  "$(subst ==$(MLX_VERSION),==$*,$(MLX_WHEEL))"
	@touch $@
# Another mlx-c an engine may carry (mlx-swift 0.31.6's, Homebrew's): 25 functions changed
# signature between it and the library's 0.7.0 under the same names. It compiles against MLX
# 0.32's headers (C++20); host.cpp built with -DENGINE_MLXC_0_6 uses its io callbacks.
HOST_ENGINE_MLXC := 0.6.0
HOST_CXXFLAGS := -std=c++20 $(CWARN) -g -O1 -isystem $(PY)/mlx/include -include crates/mlx-sys/compat/prelude.h -Iinclude
test-host-mlx: deps $(HOST_OTHER_STAMPS)
	$(MAKE) --no-print-directory ship MLX=host
	bash tests/host_mlx/check-symbols.sh $(HOST_SHIP)/lib/liblatent_cache.$(SO) $(HOST_SHIP)/lib/liblatent_cache.a \
	  target/ship-host-work/latent_cache.o $(HOST_SHIP)/lib/pkgconfig/latent-cache.pc
	@mkdir -p $(HOST_MLX_OUT)
	mlxc=$$(bash tests/host_mlx/mlx-c-src.sh $(CURDIR) $(CURDIR)/$(HOST_MLX_OUT)/locate) && \
	$(MAKE) --no-print-directory -j2 -f tests/host_mlx/mlxc.mk MLX_C_SRC="$$mlxc" MLX_INCLUDE=$(PY)/mlx/include \
	  COMPAT=$(CURDIR)/crates/mlx-sys/compat OBJ=$(CURDIR)/$(HOST_MLX_OUT)/mlxc CXX="$(CXX)" && \
	$(CXX) $(HOST_CXXFLAGS) -isystem "$$mlxc" -c tests/host_mlx/host.cpp -o $(HOST_MLX_OUT)/host.o
	$(CXX) $(HOST_MLX_OUT)/host.o -o $(HOST_MLX_OUT)/host-shared -L$(HOST_SHIP)/lib -llatent_cache \
	  $(HOST_MLXC_FOR_SHARED) -L$(PY)/mlx/lib -lmlx -Wl,-rpath,$(CURDIR)/$(HOST_SHIP)/lib -Wl,-rpath,$(PY)/mlx/lib
	$(CXX) $(HOST_MLX_OUT)/host.o -o $(HOST_MLX_OUT)/host-static $(HOST_SHIP)/lib/liblatent_cache.a \
	  $(HOST_MLX_OUT)/mlxc/libmlxc.a -L$(PY)/mlx/lib -lmlx -Wl,-rpath,$(PY)/mlx/lib \
	  $$(sed -n 's/^Libs.private: *//p' $(HOST_SHIP)/lib/pkgconfig/latent-cache.pc)
	$(HOST_MLX_OUT)/host-shared shared
	$(HOST_MLX_OUT)/host-static static
	mlxc=$$(bash tests/host_mlx/mlx-c-src.sh $(CURDIR) $(CURDIR)/$(HOST_MLX_OUT)/locate-$(HOST_ENGINE_MLXC) $(HOST_ENGINE_MLXC)) && \
	$(MAKE) --no-print-directory -j2 -f tests/host_mlx/mlxc.mk MLX_C_SRC="$$mlxc" MLX_INCLUDE=$(PY)/mlx/include \
	  COMPAT=$(CURDIR)/crates/mlx-sys/compat OBJ=$(CURDIR)/$(HOST_MLX_OUT)/mlxc-$(HOST_ENGINE_MLXC) CXX="$(CXX)" && \
	$(CXX) $(HOST_CXXFLAGS) -DENGINE_MLXC_0_6 -isystem "$$mlxc" -c tests/host_mlx/host.cpp -o $(HOST_MLX_OUT)/host-mlxc.o
	$(CXX) $(HOST_MLX_OUT)/host-mlxc.o -o $(HOST_MLX_OUT)/host-mlxc-shared -L$(HOST_SHIP)/lib -llatent_cache \
	  $(HOST_MLX_OUT)/mlxc-$(HOST_ENGINE_MLXC)/libmlxc.a -L$(PY)/mlx/lib -lmlx -Wl,-rpath,$(CURDIR)/$(HOST_SHIP)/lib \
	  -Wl,-rpath,$(PY)/mlx/lib
	$(CXX) $(HOST_MLX_OUT)/host-mlxc.o -o $(HOST_MLX_OUT)/host-mlxc-static $(HOST_SHIP)/lib/liblatent_cache.a \
	  $(HOST_MLX_OUT)/mlxc-$(HOST_ENGINE_MLXC)/libmlxc.a -L$(PY)/mlx/lib -lmlx -Wl,-rpath,$(PY)/mlx/lib \
	  $$(sed -n 's/^Libs.private: *//p' $(HOST_SHIP)/lib/pkgconfig/latent-cache.pc)
	$(HOST_MLX_OUT)/host-mlxc-shared "mlx-c $(HOST_ENGINE_MLXC), shared"
	$(HOST_MLX_OUT)/host-mlxc-static "mlx-c $(HOST_ENGINE_MLXC), static"
	$(CXX) -std=c++20 $(CWARN) -g -O1 $(SAN) -isystem $(PY)/mlx/include \
	  -Iinclude -c tests/host_mlx/core.cpp -o $(HOST_MLX_OUT)/core.o
	$(CXX) $(SAN) $(HOST_MLX_OUT)/core.o -o $(HOST_MLX_OUT)/core-shared -L$(HOST_SHIP)/lib \
	  -llatent_cache -L$(PY)/mlx/lib -lmlx -Wl,-rpath,$(CURDIR)/$(HOST_SHIP)/lib -Wl,-rpath,$(PY)/mlx/lib
	$(CXX) $(SAN) $(HOST_MLX_OUT)/core.o -o $(HOST_MLX_OUT)/core-static \
	  $(HOST_SHIP)/lib/liblatent_cache.a -L$(PY)/mlx/lib -lmlx -Wl,-rpath,$(PY)/mlx/lib \
	  $$(sed -n 's/^Libs.private: *//p' $(HOST_SHIP)/lib/pkgconfig/latent-cache.pc)
	$(HOST_CORE_ENV) $(HOST_MLX_OUT)/core-shared core-shared
	$(HOST_CORE_ENV) $(HOST_MLX_OUT)/core-static core-static
	for v in $(HOST_OTHER_MLX); do \
	  py=$(DEPS)/py-$$v; \
	  $(CXX) -std=c++20 $(CWARN) -g -O1 $(SAN) -isystem $$py/mlx/include -Iinclude -c tests/host_mlx/core.cpp \
	    -o $(HOST_MLX_OUT)/core-$$v.o && \
	  $(CXX) $(SAN) $(HOST_MLX_OUT)/core-$$v.o -o $(HOST_MLX_OUT)/core-$$v-shared -L$(HOST_SHIP)/lib -llatent_cache \
	    -L$$py/mlx/lib -lmlx -Wl,-rpath,$(CURDIR)/$(HOST_SHIP)/lib -Wl,-rpath,$$py/mlx/lib && \
	  $(CXX) $(SAN) $(HOST_MLX_OUT)/core-$$v.o -o $(HOST_MLX_OUT)/core-$$v-static $(HOST_SHIP)/lib/liblatent_cache.a \
	    -L$$py/mlx/lib -lmlx -Wl,-rpath,$$py/mlx/lib $$(sed -n 's/^Libs.private: *//p' $(HOST_SHIP)/lib/pkgconfig/latent-cache.pc) && \
	  $(HOST_CORE_ENV) $(HOST_MLX_OUT)/core-$$v-shared "MLX $$v, shared" && \
	  $(HOST_CORE_ENV) $(HOST_MLX_OUT)/core-$$v-static "MLX $$v, static" || exit 1; \
	done

examples: ship
	@mkdir -p $(OUT)
	$(CC) -std=c11 $(CWARN) -O2 -Iinclude examples/engine.c -o $(OUT)/engine $(LINK) -lm
	$(CC) -std=c11 $(CWARN) -O2 -Iinclude examples/attention.c -o $(OUT)/attention $(LINK) -lm
	$(CXX) -std=c++17 $(CWARN) -O2 -Iinclude examples/decode.cpp -o $(OUT)/decode_cpp $(LINK)

demo: examples
	$(OUT)/engine
	$(OUT)/attention

# Benchmarks (results: bench/results/cpu.md, h100.md, h200.md; report.md has their sections): this library, the seed's strategy and mlx-lm's caches side by
# side in one run. mlx-lm runs on PyPI's mlx of the same MLX version, in its own folder.
BENCH_PY := $(DEPS)/bench-py
BENCH_STAMP := $(DEPS)/.bench-$(MLX_VERSION)
BENCH_OUT := target/bench

# mlx-cpu has no macOS wheel; there `mlx` brings mlx-metal.
BENCH_MLX := "mlx==$(MLX_VERSION)" $(if $(filter Darwin,$(UNAME)),,"mlx-cpu==$(MLX_VERSION)")
$(BENCH_STAMP):
	$(PYTHON) -m pip install --quiet --disable-pip-version-check --target $(BENCH_PY) \
	  $(BENCH_MLX) "matplotlib==3.10.*"
	$(PYTHON) -m pip install --quiet --disable-pip-version-check --no-deps --target $(BENCH_PY) "mlx-lm==0.32.2"
	@touch $@

bench-deps: deps $(BENCH_STAMP)

# What the benchmarks run on, for the report's title: MLX's GPU on a Mac (Metal), its CPU here.
NCPU := $(shell getconf _NPROCESSORS_ONLN 2>/dev/null || echo '?')
ifeq ($(UNAME),Darwin)
BENCH_DEVICE = $(shell sysctl -n machdep.cpu.brand_string 2>/dev/null) GPU (Metal), $(NCPU)-core host
else
BENCH_DEVICE = $(NCPU)-core CPU
endif

# Both drivers run pinned to one core where taskset exists: on a 2-core machine, MLX's worker
# thread and the caller waking each other across cores made whole runs 1.5-3x slower at random.
PIN := $(shell command -v taskset >/dev/null 2>&1 && echo taskset -c 0)

bench bench-quick: bench-deps
	cargo build --release -p latent-cache-bench
	@mkdir -p $(BENCH_OUT)
	$(PIN) target/release/latent-cache-bench $(if $(filter bench-quick,$@),--quick) --out $(BENCH_OUT)/rust.json
	$(PIN) target/release/latent-cache-bench --modes $(if $(filter bench-quick,$@),--quick) --out $(BENCH_OUT)/modes.json
	$(PIN) target/release/latent-cache-bench --rounds $(if $(filter bench-quick,$@),--quick) --out $(BENCH_OUT)/rounds.json
	$(PIN) target/release/latent-cache-bench --persist $(if $(filter bench-quick,$@),--quick) --out $(BENCH_OUT)/persist.json
	$(PIN) target/release/latent-cache-bench --attention $(if $(filter bench-quick,$@),--quick) --out $(BENCH_OUT)/attention.json
	$(PIN) target/release/latent-cache-bench --model-step $(if $(filter bench-quick,$@),--quick) --out $(BENCH_OUT)/model_step.json
	$(PIN) target/release/latent-cache-bench --shared-prefix $(if $(filter bench-quick,$@),--quick) --out $(BENCH_OUT)/shared_prefix.json
	PYTHONPATH=$(BENCH_PY) $(PIN) $(PYTHON) bench/mlx_lm_bench.py $(if $(filter bench-quick,$@),--quick) --out $(BENCH_OUT)/mlx_lm.json
	PYTHONPATH=$(BENCH_PY) $(PIN) $(PYTHON) bench/mlx_lm_attention_bench.py $(if $(filter bench-quick,$@),--quick) --out $(BENCH_OUT)/mlx_lm_attention.json
	PYTHONPATH=$(BENCH_PY) $(PIN) $(PYTHON) bench/mlx_lm_model_step.py $(if $(filter bench-quick,$@),--quick) --out $(BENCH_OUT)/mlx_lm_model_step.json
	$(if $(filter bench,$@),$(PIN) target/release/latent-cache-bench --prefill --out $(BENCH_OUT)/prefill.json)
	$(if $(filter bench,$@),PYTHONPATH=$(BENCH_PY) $(PIN) $(PYTHON) bench/mlx_lm_prefill.py --out $(BENCH_OUT)/mlx_lm_prefill.json)
	PYTHONPATH=$(BENCH_PY) $(PYTHON) bench/report.py $(BENCH_OUT) $(BENCH_OUT)/rust.json $(BENCH_OUT)/modes.json $(BENCH_OUT)/rounds.json $(BENCH_OUT)/persist.json $(BENCH_OUT)/mlx_lm.json \
	  $(BENCH_OUT)/attention.json $(BENCH_OUT)/mlx_lm_attention.json $(BENCH_OUT)/model_step.json $(BENCH_OUT)/mlx_lm_model_step.json \
	  $(BENCH_OUT)/shared_prefix.json $(if $(filter bench,$@),$(BENCH_OUT)/prefill.json $(BENCH_OUT)/mlx_lm_prefill.json) --ran "make $@" \
	  --title "decode step time, GLM-5.2 shape, $(BENCH_DEVICE)$(if $(PIN), (drivers pinned to one core)), MLX $(MLX_VERSION)"
	@echo "report: $(BENCH_OUT)/report.md, $(BENCH_OUT)/steps.png, $(BENCH_OUT)/model_step.png"

# This tree's benchmark driver against another revision's, side by side in one run (the two
# builds alternate, so a noisy moment lands on both): `make bench-ab BASE=<git revision>`.
# The base is built in its own worktree (target/bench-base) with its own target folder.
BASE ?= HEAD~1
AB_ARGS ?= --no-concat --points 1x1024,1x16384,1x65536,8x1024
AB_ROUNDS ?= 3
bench-ab: deps
	cargo build --release -p latent-cache-bench
	rm -rf target/bench-base && git worktree prune
	git worktree add --detach target/bench-base $(BASE)
	ln -s $(DEPS) target/bench-base/.deps
	cd target/bench-base && cargo build --release -p latent-cache-bench --target-dir $(CURDIR)/target/bench-base-target
	$(PIN) $(PYTHON) bench/ab.py --new target/release/latent-cache-bench \
	  --base target/bench-base-target/release/latent-cache-bench --base-name "$(BASE) ($$(git rev-parse --short $(BASE)))" \
	  --rounds $(AB_ROUNDS) --out $(BENCH_OUT)/ab -- $(AB_ARGS)
	git worktree remove --force target/bench-base
	@echo "report: $(BENCH_OUT)/ab/ab.md"

# Fuzzing (libFuzzer through cargo-fuzz, which needs unstable flags: RUSTC_BOOTSTRAP lets the
# pinned stable toolchain accept them). New inputs go to target/fuzz-corpus; the small seed
# corpus in fuzz/corpus/api is what `make test` replays.
CARGO_FUZZ := $(DEPS)/cargo/bin/cargo-fuzz
FUZZ_SECONDS ?= 60

$(CARGO_FUZZ):
	cargo install cargo-fuzz --version 0.13.2 --locked --root $(DEPS)/cargo

fuzz: deps $(CARGO_FUZZ)
	@mkdir -p target/fuzz-corpus
	RUSTC_BOOTSTRAP=1 $(CARGO_FUZZ) run --fuzz-dir fuzz api target/fuzz-corpus fuzz/corpus/api -- \
	  -max_total_time=$(FUZZ_SECONDS)
	@mkdir -p target/fuzz-corpus-load
	RUSTC_BOOTSTRAP=1 $(CARGO_FUZZ) run --fuzz-dir fuzz load target/fuzz-corpus-load fuzz/corpus/load -- \
	  -max_total_time=$(FUZZ_SECONDS)
	@mkdir -p target/fuzz-corpus-mlxbun
	$(PYTHON) tests/interop/mlxbun_kv.py write-example target/fuzz-corpus-mlxbun/seed-example.mlxkv
	RUSTC_BOOTSTRAP=1 $(CARGO_FUZZ) run --fuzz-dir fuzz load_mlxbun target/fuzz-corpus-mlxbun -- \
	  -max_total_time=$(FUZZ_SECONDS) -max_len=131072

clean:
	cargo clean

# Shipping: the installable library, `make install`, and their tests.
include packaging/ship.mk
