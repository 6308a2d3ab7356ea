#!/usr/bin/env bash
# run.sh: the install test (`make test-install`). Given an installed latent-cache, it checks the
# layout, builds consumers out of tree against it (once through pkg-config, once through CMake's
# find_package), copies the installed tree with the consumers to another folder, deletes the
# original, and runs them there without LD_LIBRARY_PATH: the install is relocatable and the
# programs find the library and MLX through relative run paths only.
#
#   run.sh SOURCE_TREE INSTALLED_PREFIX WORK_DIR
# Environment (from the Makefile): CC, CXX, CMAKE, PKG_CONFIG, VERSION, ABI, SHIP_REAL, SHIP_SONAME.
# Written for bash 3.2 (macOS's /bin/bash): an array that may be empty is expanded as
# ${a[@]+"${a[@]}"}, since 3.2 calls the plain quoted expansion of an empty array unbound under `set -u`.
set -euo pipefail

src=$1 prefix=$2 work=$3
: "${CC:?}" "${CXX:?}" "${CMAKE:?}" "${PKG_CONFIG:?}" "${VERSION:?}" "${ABI:?}" "${SHIP_REAL:?}" "${SHIP_SONAME:?}"
darwin=0
[[ $(uname -s) == Darwin ]] && darwin=1
fail() { echo "install test: $*" >&2; exit 1; }
step() { echo "== $*"; }

step "layout of $prefix"
for f in "lib/$SHIP_REAL" "lib/$SHIP_SONAME" lib/liblatent_cache.a include/latent_cache.h \
  include/latent_cache.hpp include/module.modulemap lib/pkgconfig/latent-cache.pc \
  lib/cmake/LatentCache/LatentCacheConfig.cmake lib/cmake/LatentCache/LatentCacheConfigVersion.cmake; do
  [[ -e $prefix/$f ]] || fail "missing $f"
done
[[ -L $prefix/lib/$SHIP_SONAME ]] || fail "lib/$SHIP_SONAME is not a symbolic link"
if [[ $darwin == 0 ]]; then
  [[ -L $prefix/lib/liblatent_cache.so ]] || fail "lib/liblatent_cache.so is not a symbolic link"
  dynamic=$(readelf -d "$prefix/lib/$SHIP_REAL")
  grep -q "Library soname: \[$SHIP_SONAME\]" <<<"$dynamic" || fail "soname is not $SHIP_SONAME"
  runpath=$(sed -n 's/.*Library runpath: \[\(.*\)\]/\1/p' <<<"$dynamic")
  [[ -z $runpath || $runpath == '$ORIGIN/'* ]] || fail "run path is not relative to the library: $runpath"
  readelf -S "$prefix/lib/$SHIP_REAL" | grep -q '\.debug_info' && fail "the installed library has debug info"
else
  otool -D "$prefix/lib/$SHIP_REAL" | grep -q "@rpath/$SHIP_SONAME" || fail "install name is not @rpath/$SHIP_SONAME"
  [[ -L $prefix/lib/liblatent_cache.dylib ]] || fail "lib/liblatent_cache.dylib is not a symbolic link"
  # MLX is referenced through the run path, and the only run path is relative to the library.
  otool -L "$prefix/lib/$SHIP_REAL" | grep -q '@rpath/libmlx.dylib' || fail "libmlx.dylib is not referenced as @rpath/libmlx.dylib"
  rpaths=$(otool -l "$prefix/lib/$SHIP_REAL" | awk '$1 == "cmd" {cmd = $2} cmd == "LC_RPATH" && $1 == "path" {print $2}')
  [[ -n $rpaths ]] || fail "the library has no LC_RPATH"
  for r in $rpaths; do
    [[ $r == @loader_path/* ]] || fail "run path is not relative to the library: $r"
  done
  for f in lib/latent-cache/mlx/lib/libmlx.dylib lib/latent-cache/mlx/lib/mlx.metallib; do
    [[ -f $prefix/$f ]] || fail "missing $f (MLX loads mlx.metallib from beside libmlx.dylib)"
  done
fi

# The consumers' run path: the installed lib/ seen from their bin/ beside it.
if [[ $darwin == 1 ]]; then run_path='@executable_path/../lib'; else run_path='$ORIGIN/../lib'; fi
rpath_flags=(-Wl,-rpath,"$run_path")
bin=$prefix/bin
mkdir -p "$bin" "$work"

step "pkg-config: build against $prefix/lib/pkgconfig"
export PKG_CONFIG_LIBDIR=$prefix/lib/pkgconfig PKG_CONFIG_PATH=
pc_version=$("$PKG_CONFIG" --modversion latent-cache)
[[ $pc_version == "$VERSION" ]] || fail "pkg-config says version $pc_version, Cargo.toml $VERSION"
read -r -a cflags <<<"$("$PKG_CONFIG" --cflags latent-cache)"
read -r -a libs <<<"$("$PKG_CONFIG" --libs latent-cache)"
"$CC" -std=c11 -O1 ${cflags[@]+"${cflags[@]}"} "$src/examples/engine.c" -o "$bin/engine-pc" ${libs[@]+"${libs[@]}"} -lm ${rpath_flags[@]+"${rpath_flags[@]}"}
"$CXX" -std=c++17 -O1 ${cflags[@]+"${cflags[@]}"} "$src/tests/c/test_cpp.cpp" -o "$bin/test_cpp-pc" ${libs[@]+"${libs[@]}"} ${rpath_flags[@]+"${rpath_flags[@]}"}
"$CC" -std=c11 -O1 ${cflags[@]+"${cflags[@]}"} -DEXPECTED_VERSION="\"$pc_version\"" "$src/tests/install/version.c" \
  -o "$bin/version-pc" ${libs[@]+"${libs[@]}"} ${rpath_flags[@]+"${rpath_flags[@]}"}
# Static: the archive in place of -llatent_cache, then what it needs (Libs.private).
read -r -a static_libs <<<"$("$PKG_CONFIG" --static --libs latent-cache)"
static_libs=(${static_libs[@]+"${static_libs[@]/#-llatent_cache/$prefix/lib/liblatent_cache.a}"})
"$CC" -std=c11 -O1 ${cflags[@]+"${cflags[@]}"} "$src/examples/engine.c" -o "$bin/engine-static-pc" ${static_libs[@]+"${static_libs[@]}"} -lm \
  ${rpath_flags[@]+"${rpath_flags[@]}"} -Wl,-rpath,"$run_path/latent-cache/mlx/lib"

step "CMake: find_package(LatentCache CONFIG) from $prefix"
"$CMAKE" -S "$src/tests/install" -B "$work/cmake-build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_PREFIX_PATH="$prefix" \
  -DLATENT_CACHE_SOURCES="$src" -DLATENT_CACHE_ABI="$ABI" -DOUTPUT_DIR="$bin" -DRUN_PATH="$run_path;$run_path/latent-cache/mlx/lib" >"$work/cmake-configure.log" ||
  { cat "$work/cmake-configure.log"; fail "cmake configure failed"; }
grep 'LatentCache ' "$work/cmake-configure.log"
"$CMAKE" --build "$work/cmake-build" -j 2 >"$work/cmake-build.log" || { cat "$work/cmake-build.log"; fail "cmake build failed"; }
# A request for another ABI must not find this install.
other_abi=$([[ $ABI == 0.* ]] && echo "0.$((${ABI#0.} + 1))" || echo "$((ABI + 1))")
mkdir -p "$work/abi-probe"
printf 'cmake_minimum_required(VERSION 3.16)\nproject(probe NONE)\nfind_package(LatentCache %s CONFIG)\nif(LatentCache_FOUND)\n  message(FATAL_ERROR "found")\nendif()\n' \
  "$other_abi" >"$work/abi-probe/CMakeLists.txt"
"$CMAKE" -S "$work/abi-probe" -B "$work/abi-probe/build" -DCMAKE_PREFIX_PATH="$prefix" >"$work/abi-probe.log" 2>&1 ||
  fail "find_package(LatentCache $other_abi) accepted ABI $ABI"

moved=$work/moved
step "relocate: copy $prefix to $moved, delete the original, run there without LD_LIBRARY_PATH"
rm -rf "$moved"
cp -RP "$prefix" "$moved"
rm -rf "$prefix" "$work/cmake-build"
unset LD_LIBRARY_PATH DYLD_LIBRARY_PATH DYLD_FALLBACK_LIBRARY_PATH

physical=$(cd "$moved" && pwd -P)
# A library's path as the loader reports it, checked to lie in the moved tree.
in_moved() { [[ $1 == "$moved"/* || $1 == "$physical"/* ]]; }
for exe in engine-pc engine-static-pc engine-cmake engine-static-cmake test_cpp-pc test_cpp-cmake version-pc version-cmake; do
  if [[ $darwin == 0 ]]; then
    # Where each library was found: ours and MLX's must come from the moved tree.
    loaded=$(LD_TRACE_LOADED_OBJECTS=1 "$moved/bin/$exe")
    for lib in libmlx.so liblapack; do
      grep "$lib" <<<"$loaded" | grep -q "=> $moved/" || fail "$exe: $lib not loaded from $moved: $(grep "$lib" <<<"$loaded")"
    done
    if [[ $exe != engine-static-* ]]; then
      grep "$SHIP_SONAME" <<<"$loaded" | grep -q "=> $moved/" || fail "$exe: $SHIP_SONAME not loaded from $moved"
    elif grep -q liblatent_cache <<<"$loaded"; then
      fail "$exe: linked statically, yet loads the shared library"
    fi
  fi
  case $exe in
    engine-*) args=(--layers 4 --dsa 1 --prefill 300 --chunk 128 --decode 6) ;;
    *) args=() ;;
  esac
  step "run $exe"
  if [[ $darwin == 0 ]]; then
    "$moved/bin/$exe" ${args[@]+"${args[@]}"} >"$work/$exe.log" 2>&1 || { cat "$work/$exe.log"; fail "$exe failed"; }
  else
    # dyld names every image it loads on stderr: ours and MLX's must come from the moved tree,
    # and mlx.metallib must sit beside the libmlx.dylib loaded (where MLX looks for it).
    DYLD_PRINT_LIBRARIES=1 "$moved/bin/$exe" ${args[@]+"${args[@]}"} >"$work/$exe.log" 2>"$work/$exe.dyld" ||
      { cat "$work/$exe.log" "$work/$exe.dyld"; fail "$exe failed"; }
    mlx=$(sed -n 's/^dyld[^ ]* \(loaded: \)\{0,1\}\(.*libmlx\.dylib\)$/\2/p' "$work/$exe.dyld" | head -n 1)
    in_moved "$mlx" || fail "$exe: libmlx.dylib not loaded from $moved: '$mlx'"
    [[ -f $(dirname "$mlx")/mlx.metallib ]] || fail "$exe: no mlx.metallib beside $mlx"
    ours=$(sed -n 's/^dyld[^ ]* \(loaded: \)\{0,1\}\(.*liblatent_cache[^/]*\.dylib\)$/\2/p' "$work/$exe.dyld" | head -n 1)
    if [[ $exe != engine-static-* ]]; then
      in_moved "$ours" || fail "$exe: $SHIP_SONAME not loaded from $moved: '$ours'"
    elif [[ -n $ours ]]; then
      fail "$exe: linked statically, yet loads $ours"
    fi
  fi
  tail -n 1 "$work/$exe.log"
done
echo "install test: passed (pkg-config and CMake consumers, relocated, no LD_LIBRARY_PATH)"
