// swift-tools-version:6.0
// Package.swift: a package that depends on latent-cache's Swift package by path, as an engine's
// would; `make test-swift` builds and runs it. It declares no run path (a dependency's unsafe
// flags are refused, and an app's own are its choice): the build command gives it
// (-Xlinker -rpath), as docs/packaging.md says.
import PackageDescription

let package = Package(
  name: "Dependent",
  platforms: [.macOS(.v14)],
  dependencies: [.package(name: "LatentCache", path: "../../..")],
  targets: [
    // The names an mlx-swift app has in scope (MLX's and SwiftUI's), imported beside ours.
    .target(name: "MLXNamesStandIn", path: "Sources/MLXNamesStandIn"),
    .executableTarget(
      name: "dependent",
      dependencies: [.product(name: "LatentCacheSwift", package: "LatentCache"), "MLXNamesStandIn"],
      path: "Sources/Dependent"),
  ]
)
