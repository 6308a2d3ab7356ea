#!/usr/bin/env bash
# build-and-test.sh: the Swift steps of `make test-swift`, the same on macOS and inside the
# Linux root: build the package (warnings are errors; Swift 6 language mode, so strict
# concurrency), run its tests and the engine example, then build and run a package that
# depends on this one by path. The library is found through the run path given on the command
# line (unsafe flags are refused in a dependency's manifest, and the .pc has no run path).
#
#   build-and-test.sh PACKAGE_DIR LIB_DIR SCRATCH_DIR
set -eu
pkg=$1 lib=$2 scratch=$3
flags="-Xswiftc -warnings-as-errors -Xlinker -rpath -Xlinker $lib"

cd "$pkg"
echo "== swift build (package, tests, example)"
swift build --build-tests --scratch-path "$scratch" $flags
echo "== swift test"
swift test --skip-build --scratch-path "$scratch" $flags
echo "== the Swift engine example"
"$scratch/debug/latent-cache-swift-example"

echo "== a dependent package (tests/swift/dependent)"
cd "$pkg/tests/swift/dependent"
swift build --scratch-path "$scratch-dependent" $flags
"$scratch-dependent/debug/dependent"
