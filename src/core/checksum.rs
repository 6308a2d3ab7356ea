//! The tensor checksums of saved state: FNV-1a's multiply-xor (with an xor-shift) over the
//! row-major bytes of a tensor, after its dtype and shape, read where the evaluated array holds
//! them (`tensor_bytes`), in runs of any length. Format version 1 runs one chain over 8-byte
//! words; version 2 runs four chains over 32-byte blocks (word `i` of a block on chain `i`) and
//! folds them, so the hash is not one multiply's latency per word: a save hashes every byte.
use mlx_rs::Array;

use super::error::Result;
use super::tensor_bytes;

const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

fn word(hash: u64, w: u64) -> u64 {
    let h = (hash ^ w).wrapping_mul(PRIME);
    h ^ (h >> 29)
}

fn byte(hash: u64, b: u8) -> u64 {
    (hash ^ b as u64).wrapping_mul(PRIME)
}

fn le(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// The checksum of an evaluated array (innermost axis contiguous) under `shape`, as `version`
/// (1 or 2) of the saved format computes it: 16 hex digits.
pub fn checksum(a: &Array, shape: &[i32], version: u32) -> Result<String> {
    let lanes = if version >= 2 { 4 } else { 1 };
    let block = 8 * lanes;
    let mut hash = [OFFSET; 4];
    for &b in format!("{:?}{shape:?}", a.dtype()).as_bytes() {
        hash[0] = byte(hash[0], b);
    }
    // A block split between runs waits here.
    let (mut pending, mut held) = ([0u8; 32], 0usize);
    let blocks = |hash: &mut [u64; 4], data: &[u8]| {
        for chunk in data.chunks_exact(block) {
            for (lane, h) in hash.iter_mut().take(lanes).enumerate() {
                *h = word(*h, le(chunk, 8 * lane));
            }
        }
    };
    tensor_bytes::for_each_run(a, |mut run| {
        if held > 0 {
            let take = (block - held).min(run.len());
            pending[held..held + take].copy_from_slice(&run[..take]);
            held += take;
            run = &run[take..];
            if held < block {
                return Ok(());
            }
            blocks(&mut hash, &pending[..block]);
            held = 0;
        }
        let whole = run.len() / block * block;
        blocks(&mut hash, &run[..whole]);
        pending[..run.len() - whole].copy_from_slice(&run[whole..]);
        held = run.len() - whole;
        Ok(())
    })?;
    // Fold the lanes, then the tail: whole words on the folded chain, then bytes.
    let mut h = hash[0];
    for &lane in &hash[1..lanes] {
        h = word(h, lane);
    }
    let tail = &pending[..held];
    let words = tail.len() / 8 * 8;
    for at in (0..words).step_by(8) {
        h = word(h, le(tail, at));
    }
    for &b in &tail[words..] {
        h = byte(h, b);
    }
    Ok(format!("{h:016x}"))
}
