// swift-tools-version:6.0
// Package.swift: the Swift layer of latent-cache for SwiftPM. SwiftPM does not build the library:
// install it first (`make install PREFIX=...`) and put its lib/pkgconfig on PKG_CONFIG_PATH;
// docs/packaging.md has the steps and the run-path choices. Module `LatentCache` is the C API
// (include/module.modulemap), `LatentCacheSwift` the Swift layer over it (which re-exports it).
// Tools version 6.0: Swift 6 language mode, so strict concurrency checking is complete.
import PackageDescription

let package = Package(
  name: "LatentCache",
  // MLX 0.32.2, which the library links, needs macOS 14.
  platforms: [.macOS(.v14)],
  products: [
    .library(name: "LatentCacheSwift", targets: ["LatentCacheSwift"]),
    .executable(name: "latent-cache-swift-example", targets: ["LatentCacheExample"]),
  ],
  targets: [
    // The C API as the installed library provides it: the module map links liblatent_cache,
    // pkg-config says where it is. No run path is set here: unsafe flags are refused in a
    // dependency, so the app sets it (docs/packaging.md, "The Swift package").
    .systemLibrary(name: "LatentCache", path: "include", pkgConfig: "latent-cache"),
    .target(name: "LatentCacheSwift", dependencies: ["LatentCache"], path: "Sources/LatentCacheSwift"),
    .executableTarget(
      name: "LatentCacheExample", dependencies: ["LatentCacheSwift"], path: "Sources/LatentCacheExample"),
    .testTarget(
      name: "LatentCacheSwiftTests", dependencies: ["LatentCacheSwift"], path: "Sources/LatentCacheSwiftTests"),
  ]
)
