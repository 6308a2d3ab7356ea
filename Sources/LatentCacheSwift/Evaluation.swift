// Evaluation.swift: where and under which lock the library evaluates MLX work
// (latent_cache_set_eval_lock, latent_cache_set_evaluation_thread, the device), with Swift
// closures as the lock. The closures live in a box the C callbacks reach through their context
// pointer.
import LatentCache

#if canImport(Darwin)
  import Darwin
#else
  import Glibc
#endif

/// Process-wide evaluation settings.
public enum Evaluation {
  /// Makes every evaluation the library performs run between `lock()` and `unlock()`, instead
  /// of under the library's own lock: give it the lock your engine holds around its own
  /// evaluations. Both run on the evaluating thread, must not call back into this library, and
  /// must be safe from any thread. Install before other threads use the library.
  ///
  /// An app on mlx-swift: mlx-swift's own evaluation lock is internal to it, so there is no lock
  /// of its to hand over. Serialize instead: evaluate the library's arrays and your own through
  /// one lock of yours (an `NSLock` or a `Mutex` given here, and held around your `eval` calls),
  /// or evaluate everything from one actor or thread. The library's own lock alone does not
  /// keep its evaluations apart from mlx-swift's.
  public static func setLock(lock: @escaping @Sendable () -> Void, unlock: @escaping @Sendable () -> Void) throws {
    let box = LockBox(lock: lock, unlock: unlock)
    try setLock(
      lock: { LockBox.from($0).lock() }, unlock: { LockBox.from($0).unlock() },
      context: Unmanaged.passUnretained(box).toOpaque())
    LockBox.keep(box)
  }

  /// Back to the library's own process-wide lock.
  public static func resetLock() throws { try setLock(lock: nil, unlock: nil, context: nil) }

  /// The C call itself, for C callbacks of the engine's own (both nil: the library's lock).
  public static func setLock(
    lock: latent_cache_lock_fn?, unlock: latent_cache_lock_fn?, context: UnsafeMutableRawPointer?
  ) throws {
    try check(latent_cache_set_eval_lock(lock, unlock, context))
  }

  /// `true` (the default): evaluations run on one thread the library owns, so caller threads
  /// (Swift's cooperative pool included) never hold MLX state. `false`: on the calling thread.
  public static func setEvaluationThread(_ enabled: Bool) { latent_cache_set_evaluation_thread(enabled) }

  /// Chooses the device every graph of the library runs on (one per process). Call it before
  /// the first call that uses MLX; later, only the device already in use is accepted.
  public static func setDevice(_ device: LatentCacheDevice) throws { try check(latent_cache_set_device(device.cValue)) }

  /// The device the library runs on, `.cpu` or `.gpu` (asking makes the choice).
  public static var device: LatentCacheDevice {
    get throws {
      var out: UInt32 = 0
      try check(latent_cache_get_device(&out))
      return LatentCacheDevice(cValue: out) ?? .default
    }
  }
}

/// The closures of a lock given to `Evaluation.setLock`.
final class LockBox: @unchecked Sendable {
  // @unchecked: the closures are immutable and @Sendable; `kept` is guarded by `keptLock`.
  let lock: @Sendable () -> Void
  let unlock: @Sendable () -> Void

  init(lock: @escaping @Sendable () -> Void, unlock: @escaping @Sendable () -> Void) {
    self.lock = lock
    self.unlock = unlock
  }

  static func from(_ context: UnsafeMutableRawPointer?) -> LockBox {
    Unmanaged<LockBox>.fromOpaque(context!).takeUnretainedValue()
  }

  // Every box ever installed stays alive for the process: the library may still call a
  // replaced lock's `unlock` for an evaluation that began before the replacement, so freeing
  // a box on replacement could leave it a dangling context. A few bytes per install.
  nonisolated(unsafe) private static var kept: [LockBox] = []
  nonisolated(unsafe) private static var keptLock = pthread_mutex_t()
  private static let keptLockReady: Bool = {
    pthread_mutex_init(&keptLock, nil)
    return true
  }()

  static func keep(_ box: LockBox) {
    _ = keptLockReady
    pthread_mutex_lock(&keptLock)
    kept.append(box)
    pthread_mutex_unlock(&keptLock)
  }
}
