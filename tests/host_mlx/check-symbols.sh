#!/usr/bin/env bash
# check-symbols.sh: the library built with MLX=host brings no MLX runtime of its own and meets no
# engine's mlx-c. It carries the mlx-c it was written against inside itself, private: its shared
# library and static archive define no global or weak mlx_* (mlx-c) or mlx::core (MLX, demangled)
# symbol (local ones are that private copy: mlx-c and the template and inline code of MLX's
# headers it instantiates), and none of the three files (the prelinked object both are made from
# included) references an mlx_* symbol, so an engine's own mlx-c of any version, or none, never
# meets ours. No file may hold a guard variable of MLX's (a function-local static of an inline
# function of MLX's headers would be state apart from the engine's runtime), and each must
# reference MLX's C++ runtime (undefined mlx::core symbols) for the engine's link to resolve.
# The shared library must not depend on libmlx nor carry a run path, and the .pc and CMake
# files beside it must say the host provides MLX.
#
#   check-symbols.sh SHARED_LIBRARY ARCHIVE OBJECT PC_FILE
set -euo pipefail
[[ $# -eq 4 ]] || { echo "usage: $0 SHARED_LIBRARY ARCHIVE OBJECT PC_FILE" >&2; exit 2; }
shared=$1 archive=$2 object=$3 pc=$4
status=0
fail() { echo "error: $*" >&2; status=1; }

darwin=0
[[ $(uname -s) == Darwin ]] && darwin=1

# Symbol names (raw, Mach-O's leading underscore dropped), one a line: defined ones (local ones
# included), defined global or weak ones, or undefined ones. ELF goes through readelf: GNU nm
# hands objects holding LLVM bitcode (Rust's .llvmbc sections) to the LLVM plugin, which may
# abort on them.
names() {
  if [[ $darwin == 1 ]]; then
    case $2 in
      defined) nm -U "$1" ;;
      global) nm -gU "$1" ;;
      *) nm -u "$1" ;;
    esac | awk 'NF >= 1 && $NF !~ /:$/ {print $NF}' | sed 's/^_//'
  else
    readelf -sW "$1" | awk -v want="$2" '$1 ~ /^[0-9]+:$/ && NF >= 8 && $4 != "FILE" && $4 != "SECTION" {
        defined = ($7 != "UND")
        if ((want == "defined" && defined) || (want == "undefined" && !defined) ||
            (want == "global" && defined && ($5 == "GLOBAL" || $5 == "WEAK"))) print $8
      }' | sed 's/@.*//'
  fi | sort -u
}

for f in "$shared" "$archive" "$object"; do
  [[ -f $f ]] || { fail "$f: missing"; continue; }
  # mlx-c's names are C names; MLX's are C++ ones, matched demangled (Rust's mlx_rs:: is neither).
  private_c=$(names "$f" defined | grep -cE '^mlx_' || true)
  guards=$(names "$f" defined | c++filt | grep -E '^guard variable for .*mlx::core' || true)
  [[ -z $guards ]] || fail "$f holds MLX state of its own: $(head -n 3 <<<"$guards" | tr '\n' ' ')"
  if [[ $f != "$object" ]]; then
    # The prelinked object is the step before the private copy is made local.
    global_c=$(names "$f" global | grep -E '^mlx_' || true)
    global_core=$(names "$f" global | c++filt | grep -F 'mlx::core' || true)
    [[ -z $global_c ]] || fail "$f defines global mlx-c symbols: $(head -n 5 <<<"$global_c" | tr '\n' ' ')"
    [[ -z $global_core ]] || fail "$f defines global MLX symbols: $(head -n 5 <<<"$global_core" | tr '\n' ' ')"
  fi
  refs=$(names "$f" undefined | grep -E '^mlx_' || true)
  core_refs=$(names "$f" undefined | c++filt | grep -cF 'mlx::core' || true)
  [[ -z $refs ]] || fail "$f references mlx-c symbols (an engine's mlx-c would meet them): $(head -n 5 <<<"$refs" | tr '\n' ' ')"
  [[ $core_refs -gt 0 ]] || fail "$f references no mlx::core symbol: not built with MLX=host?"
  echo "$f: $private_c mlx_* symbols of its own (local where shipped); references $core_refs mlx::core symbols, no mlx_*"
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
