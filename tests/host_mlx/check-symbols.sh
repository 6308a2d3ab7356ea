#!/usr/bin/env bash
# check-symbols.sh: the library built with MLX=host brings no MLX of its own. Its shared library,
# static archive and the prelinked object both are made from must define no mlx_* (mlx-c) and no
# mlx::core (MLX, demangled) symbol, local ones included (a local copy of MLX code is still a
# second runtime's code), and must reference mlx-c's functions (undefined) for the engine's link
# to resolve. The shared library must not depend on libmlx nor carry a run path, and the .pc and
# CMake files beside it must say the host provides MLX.
#
#   check-symbols.sh SHARED_LIBRARY ARCHIVE OBJECT PC_FILE
set -euo pipefail
[[ $# -eq 4 ]] || { echo "usage: $0 SHARED_LIBRARY ARCHIVE OBJECT PC_FILE" >&2; exit 2; }
shared=$1 archive=$2 object=$3 pc=$4
status=0
fail() { echo "error: $*" >&2; status=1; }

darwin=0
[[ $(uname -s) == Darwin ]] && darwin=1

# Symbol names (raw, Mach-O's leading underscore dropped), local ones included, one a line:
# defined ones, or undefined ones. ELF goes through readelf: GNU nm hands objects holding LLVM
# bitcode (Rust's .llvmbc sections) to the LLVM plugin, which may abort on them.
names() {
  if [[ $darwin == 1 ]]; then
    if [[ $2 == defined ]]; then nm -U "$1"; else nm -u "$1"; fi | awk 'NF >= 1 && $NF !~ /:$/ {print $NF}' | sed 's/^_//'
  else
    readelf -sW "$1" | awk -v want="$2" '$1 ~ /^[0-9]+:$/ && NF >= 8 && $4 != "FILE" && $4 != "SECTION" && (want == "defined") == ($7 != "UND") {print $8}' |
      sed 's/@.*//'
  fi | sort -u
}

for f in "$shared" "$archive" "$object"; do
  [[ -f $f ]] || { fail "$f: missing"; continue; }
  # mlx-c's names are C names; MLX's are C++ ones, matched demangled (Rust's mlx_rs:: is neither).
  mlx_c=$(names "$f" defined | grep -E '^mlx_' || true)
  mlx_core=$(names "$f" defined | c++filt | grep -F 'mlx::core' || true)
  [[ -z $mlx_c ]] || fail "$f defines mlx-c symbols: $(head -n 5 <<<"$mlx_c" | tr '\n' ' ')"
  [[ -z $mlx_core ]] || fail "$f defines MLX (mlx::core) symbols: $(head -n 5 <<<"$mlx_core" | tr '\n' ' ')"
  refs=$(names "$f" undefined | grep -cE '^mlx_' || true)
  core_refs=$(names "$f" undefined | c++filt | grep -cF 'mlx::core' || true)
  [[ $refs -gt 0 ]] || fail "$f references no mlx_* symbol: not built with MLX=host?"
  echo "$f: defines $(grep -c . <<<"$mlx_c") mlx_* and $(grep -c . <<<"$mlx_core") mlx::core symbols;" \
    "references $refs mlx_* and $core_refs mlx::core (undefined)"
done
# The exports are still the C ABI alone.
if [[ $darwin == 1 ]]; then
  exports=$(nm -gU "$shared" | awk '{print $NF}' | sed 's/^_//')
else
  exports=$(nm -D --defined-only "$shared" | awk '{print $NF}')
fi
foreign=$(grep -v '^latent_cache_' <<<"$exports" || true)
[[ -z $foreign ]] || fail "$shared exports more than latent_cache_*: $(head -n 5 <<<"$foreign" | tr '\n' ' ')"

# No dependency on a libmlx, no run path to one.
if [[ $darwin == 1 ]]; then
  ! otool -L "$shared" | grep -q 'libmlx' || fail "$shared depends on a libmlx"
  ! otool -l "$shared" | grep -q LC_RPATH || fail "$shared has a run path"
else
  dynamic=$(readelf -dW "$shared")
  ! grep -q 'NEEDED.*libmlx' <<<"$dynamic" || fail "$shared depends on a libmlx"
  ! grep -qE '\((RPATH|RUNPATH)\)' <<<"$dynamic" || fail "$shared has a run path"
fi

# pkg-config and CMake: the host provides MLX, so a static link adds none.
grep -qx 'mlx=host' "$pc" || fail "$pc does not say mlx=host"
! grep -E '^Libs' "$pc" | grep -q -- '-lmlx' || fail "$pc links -lmlx"
cmake_config=$(dirname "$pc")/../cmake/LatentCache/LatentCacheConfig.cmake
grep -qF 'set(LatentCache_MLX "host")' "$cmake_config" || fail "$cmake_config does not say LatentCache_MLX host"

[[ $status == 0 ]] && echo "host-MLX symbol check: ok"
exit "$status"
