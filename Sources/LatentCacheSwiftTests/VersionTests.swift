// VersionTests.swift: the linked library is the one the header describes.
import LatentCacheSwift
import XCTest

final class VersionTests: XCTestCase {
  func testLinkedLibraryMatchesHeader() {
    XCTAssertEqual(LatentCacheLibrary.version, LATENT_CACHE_VERSION)
  }
}
