#!/usr/bin/env bash
# build.sh: the library for an app on mlx-swift, as a SwiftPM package of its own: the
# `MLX=host` static archive for arm64 macOS (no MLX inside: the app's mlx-swift brings MLX's
# runtime) wrapped with the header and a module map as `LatentCache.xcframework`, beside the
# Swift layer's sources and a Package.swift (Package.swift.in here) whose `LatentCache` is that
# `.binaryTarget`. An app adds the folder by path (or the zip by URL and checksum) next to
# mlx-swift. macOS only (xcodebuild); run from the repository root:
#
#   bash packaging/xcframework/build.sh [OUT]    (default target/xcframework)
#
# Writes OUT/LatentCache/ (the package), OUT/LatentCache.xcframework.zip and its checksum.
# Read docs/packaging.md ("An XCFramework for apps on mlx-swift") for the version rule the
# engine's MLX must meet.
set -eu

repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$repo/target/xcframework}
case $out in /*) ;; *) out=$repo/$out ;; esac
[ "$(uname -s)" = Darwin ] || { echo "xcframework: needs macOS (xcodebuild)" >&2; exit 1; }
[ "$(uname -m)" = arm64 ] || { echo "xcframework: builds for arm64 (Apple silicon) macOS" >&2; exit 1; }

cd "$repo"
make ship MLX=host
archive=$repo/target/ship-host/lib/liblatent_cache.a
[ -f "$archive" ] || { echo "xcframework: no $archive after make ship MLX=host" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out/headers" "$out/LatentCache/Sources"
cp include/latent_cache.h "$out/headers/"
# The module map of a binary target: the archive is linked by the framework itself, so no
# `link` line (include/module.modulemap's links the installed shared library).
cat > "$out/headers/module.modulemap" <<'MAP'
module LatentCache {
    header "latent_cache.h"
    export *
}
MAP
xcodebuild -create-xcframework -library "$archive" -headers "$out/headers" \
  -output "$out/LatentCache/LatentCache.xcframework"

cp -R Sources/LatentCacheSwift "$out/LatentCache/Sources/"
cp packaging/xcframework/Package.swift.in "$out/LatentCache/Package.swift"

(cd "$out/LatentCache" && zip -qry "$out/LatentCache.xcframework.zip" LatentCache.xcframework)
(cd "$out/LatentCache" && swift package compute-checksum "$out/LatentCache.xcframework.zip") > "$out/checksum.txt"
echo "xcframework: $out/LatentCache (package), $out/LatentCache.xcframework.zip (checksum $(cat "$out/checksum.txt"))"
