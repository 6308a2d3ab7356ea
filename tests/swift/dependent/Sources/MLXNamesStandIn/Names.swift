// Names.swift: a module exporting the names an app on mlx-swift already has in scope: MLX's
// `MLXArray`, `DType`, `Device` and `Memory`, SwiftUI's `Layout`, and a global `check` and
// `lastErrorMessage`. The dependent program imports it beside LatentCacheSwift and uses every
// one of them unqualified: it compiles only if the Swift layer exports none of these names.

public final class MLXArray: Sendable {
  public let values: [Float]
  public let shape: [Int]
  public init(_ values: [Float], _ shape: [Int]) {
    self.values = values
    self.shape = shape
  }
}

public enum DType: Sendable { case float32, bfloat16 }

public enum Device: Sendable { case cpu, gpu }

public enum Memory {
  public static var activeMemory: Int { 0 }
}

public protocol Layout {}

public func check(_ condition: Bool) -> Bool { condition }

public func lastErrorMessage() -> String { "" }
