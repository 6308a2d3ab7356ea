#!/usr/bin/env bash
# run.sh: `make test-swift`. Checks that the Swift layer calls every C function (coverage.py),
# then builds the Swift package against the shipped library (target/ship, `make ship`), runs
# its tests, the engine example and a dependent package (tools/swift/build-and-test.sh).
# On macOS with the system's swift; on Linux inside a Debian 13 root folder kept under
# .deps/swift-root (tools/swift/root.sh), with /proc and /dev mounted only for the run.
# Runs in macOS's bash 3.2: no arrays, no associative arrays, no mapfile.
set -eu

repo=$(cd "$(dirname "$0")/../.." && pwd)
ship=$repo/target/ship
[ -f "$ship/lib/pkgconfig/latent-cache.pc" ] || { echo "test-swift: no $ship (run make ship)" >&2; exit 1; }

echo "== coverage: every header function called from Sources/LatentCacheSwift"
"${PYTHON:-python3}" "$repo/tools/swift/coverage.py" "$repo/include/latent_cache.h" "$repo/Sources/LatentCacheSwift" \
  "$repo/tools/swift/coverage-allow.txt"

if [ "$(uname -s)" = Darwin ]; then
  # The package builds in place; SwiftPM reads latent-cache.pc itself.
  PKG_CONFIG_PATH=$ship/lib/pkgconfig bash "$repo/tools/swift/build-and-test.sh" "$repo" "$ship/lib" "$repo/target/swift"
  exit 0
fi

# The root's real path (.deps may be a symbolic link): /proc/mounts names mounts by it.
mkdir -p "$repo/.deps"
SWIFT_ROOT=$(cd "$repo/.deps" && pwd -P)/swift-root
SWIFT_STAMP=$SWIFT_ROOT.stamp
. "$repo/tools/swift/root.sh"

# One run at a time per root (the folder is shared between worktrees through .deps): mounts
# and the copied trees belong to the run holding the lock.
exec 9>"$SWIFT_ROOT.lock"
flock 9

# On every exit (success, failure, Ctrl-C): end the running step, then unmount.
cleanup() {
  swift_root_stop_step
  swift_root_unmount
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

started=$(date +%s)
swift_root_setup
swift_root_mount
echo "== toolchain ready ($(($(date +%s) - started)) s): $(swift_root_exec 'swift --version 2>&1 | head -n 1')"

# The shipped tree, as an engine would install it, at /opt/latent-cache in the root.
rm -rf "$SWIFT_ROOT/opt/latent-cache"
mkdir -p "$SWIFT_ROOT/opt"
cp -a "$ship" "$SWIFT_ROOT/opt/latent-cache"

# The package's sources (with their times, so SwiftPM's .build kept there rebuilds only what
# changed).
pkg=$SWIFT_ROOT/work/latent-cache
mkdir -p "$pkg/tests/swift" "$pkg/tools"
rm -rf "$pkg/Package.swift" "$pkg/Sources" "$pkg/include" "$pkg/tools/swift"
cp -p "$repo/Package.swift" "$pkg/"
cp -pR "$repo/Sources" "$repo/include" "$pkg/"
cp -pR "$repo/tools/swift" "$pkg/tools/"
mkdir -p "$pkg/tests/swift/dependent"
rm -rf "$pkg/tests/swift/dependent/Package.swift" "$pkg/tests/swift/dependent/Sources"
cp -pR "$repo/tests/swift/dependent/Package.swift" "$repo/tests/swift/dependent/Sources" "$pkg/tests/swift/dependent/"

swift_root_step swift_root_exec "PKG_CONFIG_PATH=/opt/latent-cache/lib/pkgconfig bash /work/latent-cache/tools/swift/build-and-test.sh /work/latent-cache /opt/latent-cache/lib /work/latent-cache/.build"
echo "== test-swift passed ($(($(date +%s) - started)) s)"
