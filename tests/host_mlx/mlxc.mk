# mlxc.mk: the host test's own mlx-c, compiled from the library's mlx-c source with the host's
# C++ compiler into $(OBJ)/libmlxc.a, as an engine that brings its own MLX would. One object per
# source with its dependency file, so a rerun compiles nothing and an edit recompiles one file.
# Run by the Makefile's test-host-mlx (with -j2):
#   make -f tests/host_mlx/mlxc.mk MLX_C_SRC=... MLX_INCLUDE=... COMPAT=... OBJ=...
MLX_C_SRC ?= $(error MLX_C_SRC: the mlx-c source tree)
MLX_INCLUDE ?= $(error MLX_INCLUDE: MLX's headers)
COMPAT ?= $(error COMPAT: crates/mlx-sys/compat)
OBJ ?= $(error OBJ: the output folder)
CXX ?= c++

SOURCES := $(sort $(wildcard $(MLX_C_SRC)/mlx/c/*.cpp))
OBJECTS := $(patsubst $(MLX_C_SRC)/mlx/c/%.cpp,$(OBJ)/%.o,$(SOURCES))
# The flags build.rs uses for the bundled mlx-c. The prelude declares float16_t/bfloat16_t off
# arm64, where mlx-c's half.h has none: without it mlx-c leaves out the float16/bfloat16
# accessors the library's bindings declare. Our <format> stand-in only where the standard
# library lacks <format> (libstdc++ before GCC 13).
# (A '#' in a function call starts a comment in make before 4.3, as macOS's 3.81.)
HASH := \#
HAS_FORMAT := $(shell printf '$(HASH)include <format>\n' | $(CXX) -std=c++20 -x c++ -fsyntax-only - >/dev/null 2>&1 && echo 1)
MLXC_FLAGS := -std=c++20 -O2 -fPIC -w -I$(MLX_C_SRC) -I$(MLX_INCLUDE) -include $(COMPAT)/prelude.h \
  $(if $(HAS_FORMAT),,-I$(COMPAT))

$(OBJ)/libmlxc.a: $(OBJECTS)
	rm -f $@
	ar rcs $@ $^

$(OBJ)/%.o: $(MLX_C_SRC)/mlx/c/%.cpp
	@mkdir -p $(@D)
	$(CXX) $(MLXC_FLAGS) -MMD -MP -c $< -o $@

-include $(OBJECTS:.o=.d)
