//! wyhash ("final v4", as Zig's `std.hash.Wyhash.hash` computes it): the hash Bun's `Bun.hash`
//! returns, which the seed's implementation (mlx-bun) stores for its cache files' headers and
//! tensors (`mlxbun.rs`). Pure integer code; checked against the published test vectors below.

const SECRET: [u64; 4] = [0xa0761d6478bd642f, 0xe7037ed1a0b428db, 0x8ebc6af09c88c6e3, 0x589965cc75374cc3];

/// The full 128-bit product, as (low, high) 64-bit halves.
fn mum(a: u64, b: u64) -> (u64, u64) {
    let x = (a as u128) * (b as u128);
    (x as u64, (x >> 64) as u64)
}

fn mix(a: u64, b: u64) -> u64 {
    let (lo, hi) = mum(a, b);
    lo ^ hi
}

fn read(data: &[u8], at: usize, n: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes[..n].copy_from_slice(&data[at..at + n]);
    u64::from_le_bytes(bytes)
}

/// wyhash of `data` with `seed` (`Bun.hash(data)` is seed 0).
pub fn wyhash(data: &[u8], seed: u64) -> u64 {
    let n = data.len();
    let mut state = [seed ^ mix(seed ^ SECRET[0], SECRET[1]); 3];
    let (a, b) = if n <= 16 {
        if n >= 4 {
            let end = n - 4;
            let quarter = (n >> 3) << 2;
            ((read(data, 0, 4) << 32) | read(data, quarter, 4), (read(data, end, 4) << 32) | read(data, end - quarter, 4))
        } else if n > 0 {
            (((data[0] as u64) << 16) | ((data[n >> 1] as u64) << 8) | data[n - 1] as u64, 0)
        } else {
            (0, 0)
        }
    } else {
        let mut i = 0;
        if n >= 48 {
            // Three lanes over 48-byte blocks, while more than 48 bytes remain.
            while i + 48 < n {
                for (k, lane) in state.iter_mut().enumerate() {
                    *lane = mix(read(data, i + 16 * k, 8) ^ SECRET[k + 1], read(data, i + 16 * k + 8, 8) ^ *lane);
                }
                i += 48;
            }
            state[0] ^= state[1] ^ state[2];
        }
        while i + 16 < n {
            state[0] = mix(read(data, i, 8) ^ SECRET[1], read(data, i + 8, 8) ^ state[0]);
            i += 16;
        }
        (read(data, n - 16, 8), read(data, n - 8, 8))
    };
    let (a, b) = mum(a ^ SECRET[1], b ^ state[0]);
    mix(a ^ SECRET[0] ^ n as u64, b ^ SECRET[1])
}

/// How mlx-bun writes a tensor's hash: 16 lowercase hex digits of `Bun.hash(bytes)`.
pub fn tensor_hash(bytes: &[u8]) -> String {
    format!("{:016x}", wyhash(bytes, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Zig's std.hash.Wyhash test vectors and Bun's documented `Bun.hash` values: every length
    /// branch (empty, 1-3, 4-16, 17-48, over 48).
    #[test]
    fn published_vectors() {
        let eighty = b"1234567890".repeat(8);
        let vectors: [(&[u8], u64, u64); 7] = [
            (b"", 0, 0x0409638ee2bde459),
            (b"a", 1, 0xa8412d091b5fe0a9),
            (b"abc", 2, 0x32dd92e4b2915153),
            (b"message digest", 3, 0x8619124089a3a16b),
            (b"abcdefghijklmnopqrstuvwxyz", 4, 0x7a43afb61d7f5f40),
            (b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", 5, 0xff42329b90e50d58),
            (&eighty, 6, 0xc39cab13b115aad3),
        ];
        for (data, seed, want) in vectors {
            assert_eq!(wyhash(data, seed), want, "{:?} seed {seed}", String::from_utf8_lossy(data));
        }
        assert_eq!(wyhash(b"some data here", 0), 11562320457524636935);
        assert_eq!(wyhash(b"some data here", 1234), 15724820720172937558);
    }

    /// Tensor hashes from the seed's own cache-file test data (float32 little-endian).
    #[test]
    fn tensor_hashes_of_the_seeds_test_data() {
        let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        assert_eq!(tensor_hash(&f32s(&[1.0, 2.0, 3.0, 4.0])), "4cc5a4823e5c92cf");
        assert_eq!(tensor_hash(&f32s(&[5.0, 6.0])), "1e261d46f45003b8");
        assert_eq!(tensor_hash(b""), "0409638ee2bde459");
    }
}
