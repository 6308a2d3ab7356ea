// swift-tools-version:5.9
// Package.swift: the Swift layer of latent-cache for SwiftPM. SwiftPM does not build the library:
// install it first (`make install PREFIX=...`) and put its lib/pkgconfig on PKG_CONFIG_PATH;
// docs/packaging.md has the steps. Module `LatentCache` is the C API (include/module.modulemap),
// `LatentCacheSwift` the Swift layer over it.
import PackageDescription

let package = Package(
  name: "LatentCache",
  platforms: [.macOS(.v13)],
  products: [
    .library(name: "LatentCacheSwift", targets: ["LatentCacheSwift"]),
    .executable(name: "latent-cache-swift-example", targets: ["LatentCacheExample"]),
  ],
  targets: [
    // The C API as the installed library provides it: the module map links liblatent_cache,
    // pkg-config says where it is.
    .systemLibrary(name: "LatentCache", path: "include", pkgConfig: "latent-cache"),
    .target(name: "LatentCacheSwift", dependencies: ["LatentCache"], path: "Sources/LatentCacheSwift"),
    .executableTarget(
      name: "LatentCacheExample", dependencies: ["LatentCacheSwift"], path: "Sources/LatentCacheExample"),
    .testTarget(
      name: "LatentCacheSwiftTests", dependencies: ["LatentCache", "LatentCacheSwift"], path: "Sources/LatentCacheSwiftTests"),
  ]
)
