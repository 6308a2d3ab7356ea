//! Checksums computed from a tensor's bytes as MLX's loader reads them (`mlx_read`'s reader
//! hands every read it serves to `track`): verifying a read then makes no second pass over the
//! tensor, and none on the host over memory the loader put on a device (MLX's CUDA loader reads
//! into host memory, then copies to the device, where a host read would bring the bytes back).
//! A tensor read out of order, in overlapping pieces or twice is verified the usual way.
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use mlx_rs::{Array, Dtype};

use crate::core::error::Result;
use crate::core::persist::checksum::{evaluated, Hasher};

/// The checksum (format version `STREAMED_VERSION`) of a tensor computed from its bytes as MLX's
/// loader read them, and the dtype and shape it was computed for.
pub(super) struct Streamed {
    pub dtype: Dtype,
    pub shape: Vec<i32>,
    pub sum: String,
}

/// The checksum format version streamed checksums are computed in.
pub(super) const STREAMED_VERSION: u32 = 2;

/// A tensor's bytes `start..end` in the source, and its checksum as far as read.
pub(super) struct Tracked {
    name: String,
    dtype: Dtype,
    shape: Vec<i32>,
    pub(super) start: u64,
    end: u64,
    state: Mutex<Track>,
}

enum Track {
    /// Read in order up to `next`.
    Running {
        next: u64,
        hasher: Hasher,
    },
    Done(String),
    /// Read out of order, in pieces that overlap, or more than once: verified the usual way.
    Broken,
}

impl Tracked {
    pub(super) fn new(name: String, dtype: Dtype, shape: Vec<i32>, start: u64, end: u64) -> Tracked {
        let hasher = Hasher::new(dtype, &shape, STREAMED_VERSION);
        let state = match start == end {
            true => Track::Done(hasher.finish()),
            false => Track::Running { next: start, hasher },
        };
        Tracked { name, dtype, shape, start, end, state: Mutex::new(state) }
    }
}

/// Hashes `bytes`, just read whole from `at`, into the tensor of `tracked` (ordered by start)
/// they belong to.
pub(super) fn track(tracked: &[Tracked], bytes: &[u8], at: u64) {
    let i = tracked.partition_point(|t| t.start <= at);
    let Some(t) = i.checked_sub(1).map(|i| &tracked[i]).filter(|t| at < t.end) else {
        return;
    };
    let mut state = t.state.lock().unwrap_or_else(PoisonError::into_inner);
    let end = at.saturating_add(bytes.len() as u64);
    match &mut *state {
        Track::Running { next, hasher } if *next == at && end <= t.end => {
            hasher.update(bytes);
            *next = end;
            if end == t.end {
                let Track::Running { hasher, .. } = std::mem::replace(&mut *state, Track::Broken) else {
                    unreachable!("matched above")
                };
                *state = Track::Done(hasher.finish());
            }
        }
        _ => *state = Track::Broken,
    }
}

/// The checksums of the tensors of `tracked` read whole and in order, by name.
pub(super) fn streamed(tracked: &[Tracked]) -> HashMap<String, Streamed> {
    tracked
        .iter()
        .filter_map(|t| match &*t.state.lock().unwrap_or_else(PoisonError::into_inner) {
            Track::Done(sum) => Some((t.name.clone(), Streamed { dtype: t.dtype, shape: t.shape.clone(), sum: sum.clone() })),
            _ => None,
        })
        .collect()
}

/// The checksum of a tensor MLX's loader read, as format `version` computes it: the one computed
/// from its bytes as they were read (`streamed`) where that was for this version, dtype and
/// shape, else `evaluated` (a second pass over the tensor on the host).
pub(super) fn of_read(a: &Array, version: u32, streamed: Option<&Streamed>) -> Result<String> {
    match streamed.filter(|s| version == STREAMED_VERSION && s.dtype == a.dtype() && s.shape == a.shape()) {
        Some(s) => Ok(s.sum.clone()),
        None => evaluated(a, a.shape(), version),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::persist::mlx_read::read_safetensors_bytes;

    /// A safetensors file of `tensors` (name, dtype, shape, bytes), in order.
    fn file(tensors: &[(&str, &str, &[usize], Vec<u8>)]) -> Vec<u8> {
        let (mut entries, mut data) = (Vec::new(), Vec::new());
        for (name, dtype, shape, bytes) in tensors {
            let (start, end) = (data.len(), data.len() + bytes.len());
            entries.push(format!("\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":{shape:?},\"data_offsets\":[{start},{end}]}}"));
            data.extend_from_slice(bytes);
        }
        let mut header = format!("{{{}}}", entries.join(",")).into_bytes();
        header.resize(header.len().div_ceil(8) * 8, b' ');
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend(header);
        out.extend(data);
        out
    }

    #[test]
    fn checksums_streamed_as_read_equal_a_second_pass_over_the_tensors() {
        let f32s: Vec<u8> = (0..6).flat_map(|i| (i as f32 * 1.5 - 2.0).to_le_bytes()).collect();
        let bf16s: Vec<u8> = (0..37u16).flat_map(|i| (0x3f80 + i * 3).to_le_bytes()).collect();
        let bytes = file(&[("a", "F32", &[2, 3], f32s), ("b", "BF16", &[1, 37], bf16s), ("empty", "U32", &[0, 4], Vec::new())]);
        let (tensors, _, streamed) = read_safetensors_bytes(&bytes).unwrap();
        assert_eq!(streamed.len(), 3);
        for (name, a) in &tensors {
            let s = &streamed[name];
            assert_eq!((s.dtype, s.shape.as_slice()), (a.dtype(), a.shape()), "{name}");
            assert_eq!(s.sum, evaluated(a, a.shape(), STREAMED_VERSION).unwrap(), "{name}");
        }
        // One byte of `b` flipped: its streamed checksum is the damaged bytes', not the file's.
        let mut damaged = bytes.clone();
        let at = damaged.len() - 5;
        damaged[at] ^= 0x10;
        let (_, _, again) = read_safetensors_bytes(&damaged).unwrap();
        assert_ne!(again["b"].sum, streamed["b"].sum);
        assert_eq!(again["a"].sum, streamed["a"].sum);
    }
}
