// DistributedTests.swift: the distributed calls as a Swift engine reaches them in one process: a
// group of this process alone, refusals of a send to itself and of a row from it, and GLM-5.2's
// stage splits. (Two processes over the ring backend: tests/distributed*.rs, tests/c.)
import LatentCache
import LatentCacheSwift
import XCTest

final class DistributedTests: XCTestCase {
  func testAGroupOfOneAndTheStageSplits() throws {
    let group = try LatentCacheGroup()
    let info = try group.info()
    XCTAssertEqual([info.rank, info.size], [0, 1])
    let x = try LatentCacheArray([Int32(1), 2], shape: [2])
    assertThrows(.invalidArgument, "a send to itself") { try group.send(x, to: 0) }
    assertThrows(.invalidArgument, "a receive from a rank not in the group") { _ = try group.receive(like: x, from: 1) }
    let set = try CacheSet(layers: [smallConfig()])
    assertThrows(.invalidArgument, "a row from itself") { _ = try set.receiveRow(from: 0, via: group) }
    XCTAssertEqual(try CacheConfig.glm52StageStarts(2), [0, 38])
    XCTAssertEqual(try CacheConfig.glm52LocalStarts().count, 21)
    XCTAssertEqual(try CacheConfig.glm52Crossing(4), 2)
    XCTAssertNil(try CacheConfig.glm52Crossing(6))
    assertThrows(.invalidArgument, "a row sent to itself") { _ = try set.sendRow(to: 0, via: group) }
  }
}
