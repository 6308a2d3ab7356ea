# ship.mk: the library as it ships (only latent_cache_* exported, debug info split off, MLX
# installed beside it and found through a relative run path), `make install`, and the checks
# `make test` runs on it. `MLX=host` builds the same for an engine that brings its own MLX
# (`make ship MLX=host` -> target/ship-host; every target here honours it). Included by the Makefile, whose UNAME, PY, DEPS, PIP_STAMP, CC and CXX
# it uses. docs/packaging.md describes the layout and the versioning rules.

.PHONY: ship install uninstall check-symbols symbols test-install tools staticlib-cargo

# Versions. The ABI version names what a program linked against the library depends on: the
# major version, or for 0.x the minor (0.1 and 0.2 may differ incompatibly). It keeps the
# leading 0 for 0.x, so a 0.1 library and a later 1.x one never share a soname.
VERSION := $(shell sed -n 's/^version *= *"\([^"]*\)".*/\1/p' Cargo.toml | head -n 1)
VERSION_MAJOR := $(word 1,$(subst ., ,$(VERSION)))
VERSION_MINOR := $(word 2,$(subst ., ,$(VERSION)))
ABI := $(if $(filter 0,$(VERSION_MAJOR)),0.$(VERSION_MINOR),$(VERSION_MAJOR))

comma := ,
PREFIX ?= /usr/local
DESTDIR ?=
# 1: also install the split-off debug info (lib/.debug/ on Linux, a .dSYM on macOS).
INSTALL_DEBUG ?= 0
# 1: install MLX's runtime under lib/latent-cache/ and point the library's run path at it.
# 0: install the library alone; the engine provides libmlx (same MLX version) itself.
BUNDLE_MLX ?= 1
# Where MLX comes from. bundled: mlx-c compiled into the library, libmlx linked (and by default
# installed beside it). host: mlx-c compiled into the library and private, MLX's C++ runtime
# referenced, for an engine that links MLX itself (mlx-swift's Cmlx, or a C++ engine's own
# libmlx, with any mlx-c or none): one MLX runtime in the process, so the engine's arrays are
# ours. The MLX versions it admits: src/core/mlx/runtime.rs.
MLX ?= bundled
# The mlx-c inside the library (the pin of crates/mlx-sys/build.rs; mlx-c 0.7.0 is built against
# MLX 0.32.2, the Makefile's).
MLX_C_VERSION := $(shell sed -n 's/^const UPSTREAM_VERSION: &str = "\(.*\)";/\1/p' crates/mlx-sys/build.rs)

ifeq ($(MLX),host)
# Its own cargo target folder (the build script's switch would otherwise rebuild mlx-sys and all
# above it in target/release, back and forth with the normal build) and its own ship tree.
HOST_TARGET := target/host-mlx
SHIP := target/ship-host
SHIP_WORK := target/ship-host-work
SHIP_DEBUG := target/ship-host-debug
STATICLIB := $(HOST_TARGET)/release/liblatent_cache.a
CARGO_STATICLIB := LATENT_CACHE_MLX_C=host cargo rustc --target-dir $(HOST_TARGET)
override BUNDLE_MLX := 0
else ifeq ($(MLX),bundled)
SHIP := target/ship
SHIP_WORK := target/ship-work
SHIP_DEBUG := target/ship-debug
STATICLIB := target/release/liblatent_cache.a
CARGO_STATICLIB := cargo rustc
else
$(error MLX=$(MLX): expected bundled (the default) or host)
endif
# Where MLX's runtime goes, relative to lib/: the wheel's own layout (mlx/lib/libmlx.* next to
# mlx_cpu.libs/), because libmlx.so finds its BLAS/LAPACK at $ORIGIN/../../mlx_cpu.libs.
MLX_PRIVATE := latent-cache

ifeq ($(UNAME),Darwin)
SHIP_REAL := liblatent_cache.$(VERSION).dylib
SHIP_SONAME := liblatent_cache.$(ABI).dylib
SHIP_DEV := liblatent_cache.dylib
# Every name of the library, also of earlier versions (removed before a new one is linked).
SHIP_GLOB := liblatent_cache*.dylib
# The system libraries rustc lists for a staticlib (--print native-static-libs), plus libc++.
NATIVE_LIBS := -lc++ -liconv -lSystem -lc -lm
SHIP_RPATH := $(if $(filter 1,$(BUNDLE_MLX)),-Wl$(comma)-rpath$(comma)@loader_path/$(MLX_PRIVATE)/mlx/lib)
SHIP_LDFLAGS := -dynamiclib -mmacosx-version-min=$(MACOSX_DEPLOYMENT_TARGET) -Wl,-install_name,@rpath/$(SHIP_SONAME) \
  -Wl,-current_version,$(VERSION) -Wl,-compatibility_version,$(ABI).0 \
  -Wl,-exported_symbols_list,$(SHIP_WORK)/exports.txt -Wl,-dead_strip
# MLX=host: ld64 refuses undefined symbols in a dylib unless told; dynamic_lookup leaves the
# mlx::core references to be bound at load time to whatever image defines them (the app, with
# mlx-swift's Cmlx compiled in, or the engine's libmlx). Apps should prefer the archive, which
# their own link resolves and checks.
SHIP_HOST_LDFLAGS := -Wl,-undefined,dynamic_lookup
else
SHIP_REAL := liblatent_cache.so.$(VERSION)
SHIP_SONAME := liblatent_cache.so.$(ABI)
SHIP_DEV := liblatent_cache.so
SHIP_GLOB := liblatent_cache.so*
NATIVE_LIBS := -lstdc++ -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc
SHIP_RPATH := $(if $(filter 1,$(BUNDLE_MLX)),-Wl$(comma)-rpath$(comma)'$$ORIGIN/$(MLX_PRIVATE)/mlx/lib')
SHIP_LDFLAGS := -shared -Wl,-soname,$(SHIP_SONAME) -Wl,--version-script=packaging/latent_cache.map \
  -Wl,--gc-sections -Wl,--as-needed -Wl,-z,relro,-z,now -Wl,-z,noexecstack
# MLX=host: a shared library may keep undefined symbols on ELF (we never pass -z defs); the
# mlx::core references bind at load time to the engine's MLX, and an executable's link against
# the library fails if the engine provides none (or another MLX's, which lacks some).
SHIP_HOST_LDFLAGS :=
endif
ifeq ($(MLX),host)
SHIP_MLX_LINK := $(SHIP_HOST_LDFLAGS)
# The .pc's Libs.private adds nothing for MLX: the engine links its own MLX and mlx-c.
MLX_LIBS_PRIVATE :=
else
SHIP_MLX_LINK := -L$(PY)/mlx/lib -lmlx
MLX_LIBS_PRIVATE := -L$${mlxlibdir} -lmlx
endif
# What a static link needs besides the archive (the .pc's Libs.private).
LIBS_PRIVATE := $(MLX_LIBS_PRIVATE) $(filter-out -lc -lSystem,$(NATIVE_LIBS))

SHIP_FILES := $(SHIP)/lib/$(SHIP_REAL) $(SHIP)/lib/liblatent_cache.a \
  $(SHIP)/include/latent_cache.h $(SHIP)/include/latent_cache.hpp $(SHIP)/include/module.modulemap \
  $(SHIP)/lib/pkgconfig/latent-cache.pc \
  $(SHIP)/lib/cmake/LatentCache/LatentCacheConfig.cmake \
  $(SHIP)/lib/cmake/LatentCache/LatentCacheConfigVersion.cmake \
  $(SHIP_WORK)/mlx-$(BUNDLE_MLX).stamp

# A complete, relocatable install tree in target/ship (what `make install` copies, and what the
# C and C++ tests link against).
ship: $(SHIP_FILES)

# Cargo's staticlib of the crate (crate type chosen on the command line, so the manifest keeps
# building only the cdylib and rlib). Always asked for; cargo leaves it alone when up to date,
# and then nothing downstream is redone.
staticlib-cargo: deps
	$(CARGO_STATICLIB) --release -p latent-cache --lib --crate-type staticlib
$(STATICLIB): staticlib-cargo ;

# One relocatable object holding the library and all it is built from, with unused code
# dropped. Its latent_cache_* functions are the exports.
$(SHIP_WORK)/latent_cache.o: $(STATICLIB)
	@mkdir -p $(SHIP_WORK)
ifeq ($(UNAME),Darwin)
	nm -gU $(STATICLIB) | awk '$$2 == "T" && $$3 ~ /^_latent_cache_/ {print $$3}' | sort -u >$(SHIP_WORK)/exports.txt
	# The prelink keeps Rust's unwinding personality global as well: every Rust function's
	# unwind info names it, and once `ld -r` hides it Apple's linker reports it undefined in the
	# next link (rust-lang/rust#104707; Ruby's YJIT keeps it exported for the same reason). The
	# dylib's own link hides it again (exports.txt); the archive keeps it (docs/packaging.md).
	{ cat $(SHIP_WORK)/exports.txt; echo _rust_eh_personality; } >$(SHIP_WORK)/prelink-exports.txt
	ld -r -all_load -exported_symbols_list $(SHIP_WORK)/prelink-exports.txt $(STATICLIB) -o $@
else
	readelf -sW $(STATICLIB) | awk '$$4 == "FUNC" && $$5 == "GLOBAL" && $$7 != "UND" && $$8 ~ /^latent_cache_/ {print $$8}' \
	  | sort -u >$(SHIP_WORK)/exports.txt
	ld -r --gc-sections --force-group-allocation $$(sed 's/^/-u /' $(SHIP_WORK)/exports.txt) --whole-archive $(STATICLIB) -o $@
endif

# The shared library: linked here from that object (not by cargo, whose cdylib also exports
# symbols of mlx-rs and of our mlx-sys), with its debug info split into target/ship-debug
# (compressed; gdb finds it through the library's debug link when it sits in lib/.debug/).
$(SHIP)/lib/$(SHIP_REAL): $(SHIP_WORK)/latent_cache.o packaging/latent_cache.map $(SHIP_WORK)/mlx-$(BUNDLE_MLX).stamp
	@mkdir -p $(@D) $(SHIP_DEBUG)
	rm -f $(SHIP)/lib/$(SHIP_GLOB)
	$(CC) $(SHIP_LDFLAGS) -o $(SHIP_WORK)/$(SHIP_REAL) $< $(SHIP_MLX_LINK) $(NATIVE_LIBS) $(SHIP_RPATH)
ifeq ($(UNAME),Darwin)
	rm -rf $(SHIP_DEBUG)/$(SHIP_REAL).dSYM
	dsymutil $(SHIP_WORK)/$(SHIP_REAL) -o $(SHIP_DEBUG)/$(SHIP_REAL).dSYM
	strip -x -o $@ $(SHIP_WORK)/$(SHIP_REAL)
else
	objcopy --only-keep-debug --compress-debug-sections=zlib $(SHIP_WORK)/$(SHIP_REAL) $(SHIP_DEBUG)/$(SHIP_REAL).debug
	objcopy --strip-debug --strip-unneeded --add-gnu-debuglink=$(SHIP_DEBUG)/$(SHIP_REAL).debug \
	  $(SHIP_WORK)/$(SHIP_REAL) $@
endif
	ln -sf $(SHIP_REAL) $(SHIP)/lib/$(SHIP_SONAME)
	ln -sf $(SHIP_SONAME) $(SHIP)/lib/$(SHIP_DEV)

# The static archive: the same object without debug info, embedded LLVM bitcode, or any global
# symbol but the exports (so it cannot clash with another Rust or mlx-c library in an engine).
# Its template and inline C++ code (mlx-c's, and what it instantiates of MLX's and the standard
# library's headers) is in no COMDAT group any more (the prelink's --force-group-allocation), so
# an engine's own copies never displace ours; the unique (STB_GNU_UNIQUE) ones, the standard
# library's inline statics, are made weak, to merge with an engine's twins as a group would.
$(SHIP)/lib/liblatent_cache.a: $(SHIP_WORK)/latent_cache.o
	@mkdir -p $(@D) $(SHIP_WORK)/static
ifeq ($(UNAME),Darwin)
	strip -S -o $(SHIP_WORK)/static/latent_cache.o $<
else
	readelf -sW $< | awk '$$5 == "UNIQUE" && $$7 != "UND" {print $$8}' | sort -u >$(SHIP_WORK)/unique.txt
	objcopy --strip-debug --remove-section=.llvmbc --remove-section=.llvmcmd --remove-section=.llvm_addrsig \
	  --keep-global-symbols=$(SHIP_WORK)/exports.txt --weaken-symbols=$(SHIP_WORK)/unique.txt \
	  $< $(SHIP_WORK)/static/latent_cache.o
endif
	rm -f $@
	ar rcs $@ $(SHIP_WORK)/static/latent_cache.o

$(SHIP)/include/%: include/%
	@mkdir -p $(@D)
	cp $< $@

$(SHIP)/lib/pkgconfig/latent-cache.pc: packaging/latent-cache.pc.in Cargo.toml
	@mkdir -p $(@D)
	sed -e 's|@VERSION@|$(VERSION)|' -e 's|@LIBS_PRIVATE@|$(LIBS_PRIVATE)|' -e 's|@MLX@|$(MLX)|' \
	  -e 's|@MLX_VERSION@|$(MLX_VERSION)|' -e 's|@MLX_C_VERSION@|$(MLX_C_VERSION)|' $< >$@

$(SHIP)/lib/cmake/LatentCache/%.cmake: packaging/%.cmake.in Cargo.toml
	@mkdir -p $(@D)
	sed -e 's|@VERSION@|$(VERSION)|' -e 's|@ABI@|$(ABI)|' -e 's|@SHIP_REAL@|$(SHIP_REAL)|' -e 's|@MLX@|$(MLX)|' \
	  -e 's|@MLX_VERSION@|$(MLX_VERSION)|' -e 's|@MLX_C_VERSION@|$(MLX_C_VERSION)|' \
	  -e 's|@SHIP_SONAME@|$(if $(filter Darwin,$(UNAME)),@rpath/)$(SHIP_SONAME)|' $< >$@

# MLX's runtime from the wheel (libmlx, and on Linux the BLAS/LAPACK it loads), with the
# wheel's license and bill of materials.
$(SHIP_WORK)/mlx-$(BUNDLE_MLX).stamp: $(PIP_STAMP)
	rm -rf $(SHIP)/lib/$(MLX_PRIVATE) $(SHIP_WORK)/mlx-*.stamp
ifeq ($(BUNDLE_MLX),1)
	mkdir -p $(SHIP)/lib/$(MLX_PRIVATE)/mlx $(SHIP)/lib/$(MLX_PRIVATE)/licenses
	cp -R $(PY)/mlx/lib $(SHIP)/lib/$(MLX_PRIVATE)/mlx/lib
	if [ -d $(PY)/mlx_cpu.libs ]; then cp -R $(PY)/mlx_cpu.libs $(SHIP)/lib/$(MLX_PRIVATE)/; fi
	for d in $(PY)/mlx*.dist-info; do \
	  for f in $$d/licenses/* $$d/sboms/*; do [ -f $$f ] && cp $$f $(SHIP)/lib/$(MLX_PRIVATE)/licenses/; done; \
	done; true
endif
	@mkdir -p $(SHIP_WORK)
	@touch $@

# Copies the install tree into $(DESTDIR)$(PREFIX), symbolic links kept as links.
install: ship
	mkdir -p "$(DESTDIR)$(PREFIX)"
	tar -C $(SHIP) -cf - . | tar -C "$(DESTDIR)$(PREFIX)" --no-same-owner -xf -
ifeq ($(INSTALL_DEBUG),1)
ifeq ($(UNAME),Darwin)
	cp -R $(SHIP_DEBUG)/$(SHIP_REAL).dSYM "$(DESTDIR)$(PREFIX)/lib/"
else
	mkdir -p "$(DESTDIR)$(PREFIX)/lib/.debug"
	cp $(SHIP_DEBUG)/$(SHIP_REAL).debug "$(DESTDIR)$(PREFIX)/lib/.debug/"
endif
endif
	@echo "installed latent-cache $(VERSION) (ABI $(ABI)) into $(DESTDIR)$(PREFIX)"

# Removes what `make install` put there (as the current tree would install it).
uninstall:
	cd $(SHIP) && find . ! -type d | while read -r f; do rm -f "$(DESTDIR)$(PREFIX)/$$f"; done
	rm -rf "$(DESTDIR)$(PREFIX)/lib/$(MLX_PRIVATE)" "$(DESTDIR)$(PREFIX)/lib/cmake/LatentCache" \
	  "$(DESTDIR)$(PREFIX)/lib/.debug/$(SHIP_REAL).debug" "$(DESTDIR)$(PREFIX)/lib/$(SHIP_REAL).dSYM"

# The exports against packaging/symbols.txt and the header (see packaging/check-symbols.sh).
check-symbols: ship
	ARCHIVE=$(SHIP)/lib/liblatent_cache.a bash packaging/check-symbols.sh $(SHIP)/lib/$(SHIP_REAL) packaging/symbols.txt include/latent_cache.h $(ABI)

# Records the current exports as the ABI's symbol list (after adding functions, or with a new
# ABI version).
symbols: ship
	bash packaging/check-symbols.sh --write $(SHIP)/lib/$(SHIP_REAL) packaging/symbols.txt include/latent_cache.h $(ABI)

# Build tools for the install test, from PyPI into .deps/tools: cmake, and pkgconf (a
# pkg-config), so the test does not depend on what the machine has.
TOOLS := $(DEPS)/tools
CMAKE_PIN := 3.31.6
PKGCONF_PIN := 2.4.3.post1
TOOLS_STAMP := $(DEPS)/.tools-cmake-$(CMAKE_PIN)-pkgconf-$(PKGCONF_PIN)
# The wheels' own binaries, called directly: their Python launchers would fall back to another
# pkg-config on the machine when ours fails.
CMAKE := $(TOOLS)/cmake/data/bin/cmake
PKG_CONFIG := $(TOOLS)/pkgconf/.bin/pkgconf

$(TOOLS_STAMP):
	@mkdir -p $(DEPS)
	$(PYTHON) -m pip install --quiet --disable-pip-version-check --upgrade --target $(TOOLS) \
	  "cmake==$(CMAKE_PIN)" "pkgconf==$(PKGCONF_PIN)"
	@touch $@

tools: $(TOOLS_STAMP)

# Installs into a temporary prefix (through DESTDIR), builds the demo engine, the C++ test client
# and a version check out of tree against it (through pkg-config, then through CMake's
# find_package), moves the installed tree elsewhere and runs them there without LD_LIBRARY_PATH.
INSTALL_TEST := target/install-test
test-install: ship tools
	rm -rf $(INSTALL_TEST)
	$(MAKE) --no-print-directory install DESTDIR=$(CURDIR)/$(INSTALL_TEST)/destdir PREFIX=/opt/latent-cache
	CC="$(CC)" CXX="$(CXX)" CMAKE="$(CMAKE)" PKG_CONFIG="$(PKG_CONFIG)" VERSION=$(VERSION) ABI=$(ABI) \
	  SHIP_REAL=$(SHIP_REAL) SHIP_SONAME=$(SHIP_SONAME) \
	  bash tests/install/run.sh $(CURDIR) $(CURDIR)/$(INSTALL_TEST)/destdir/opt/latent-cache $(CURDIR)/$(INSTALL_TEST)
