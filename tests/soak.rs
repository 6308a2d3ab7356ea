//! Soak: 100,000 mixed operations (SOAK_OPS overrides) over 78 layer handles through the C API,
//! then everything freed: MLX's active memory returns exactly to where it started and the
//! process's resident memory to within a small margin (allocator slack), and every layer's rows
//! still equal the reference model at the end. (Its own test binary: MLX's active memory and
//! the resident memory are process-wide; `make test-valgrind` runs it alone under memcheck.)
mod common;

use common::check::append_host;
use common::model::{Model, Rng};
use latent_cache::ffi::cache::*;
use latent_cache::ffi::rows::*;
use latent_cache::ffi::spec::*;
use latent_cache::ffi::{latent_cache as Handle, latent_cache_status as Status};

const LAYERS: usize = 78;
const WIDTHS: [usize; 3] = [16, 8, 4];

/// The process's resident memory. Read from the kernel on Linux and macOS; anywhere else the
/// test fails rather than compare zeros (a check that cannot fail is no check).
#[cfg(target_os = "linux")]
fn resident_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: usize = statm.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("statm's resident pages");
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize
}

#[cfg(target_os = "macos")]
fn resident_bytes() -> usize {
    let mut info: libc::proc_taskinfo = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::proc_taskinfo>() as libc::c_int;
    let pid = unsafe { libc::getpid() };
    let got = unsafe { libc::proc_pidinfo(pid, libc::PROC_PIDTASKINFO, 0, (&mut info as *mut libc::proc_taskinfo).cast(), size) };
    assert_eq!(got, size, "proc_pidinfo(PROC_PIDTASKINFO)");
    info.pti_resident_size as usize
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn resident_bytes() -> usize {
    panic!("no resident-memory reading on this platform")
}

fn new_cache(dsa: bool) -> *mut Handle {
    common::check::new_cache([WIDTHS[0], WIDTHS[1], if dsa { WIDTHS[2] } else { 0 }], 0)
}

fn ok(status: Status) {
    assert_eq!(status, Status::Ok);
}

struct Layer {
    cache: *mut Handle,
    model: Model,
    dsa: bool,
}

fn check(layer: &Layer) {
    for row in 0..layer.model.rows.len() {
        for f in 0..if layer.dsa { 3 } else { 2 } {
            let want = &layer.model.rows[row].families[f];
            let mut got = vec![0f32; want.len()];
            let mut written = 0;
            ok(unsafe { latent_cache_read_row_host(layer.cache, f as u32, row, got.as_mut_ptr(), got.len(), &mut written) });
            assert_eq!(&got[..written], &want[..]);
        }
    }
}

fn run(ops: usize) {
    let mut rng = Rng::new(42);
    let mut layers: Vec<Layer> = (0..LAYERS)
        .map(|l| {
            let dsa = l % 4 == 3;
            let widths = [WIDTHS[0], WIDTHS[1], if dsa { WIDTHS[2] } else { 0 }];
            Layer { cache: new_cache(dsa), model: Model::new(widths), dsa }
        })
        .collect();
    for _ in 0..ops {
        let layer = &mut layers[rng.range(0, LAYERS - 1)];
        let rows = layer.model.rows.len().max(1);
        match rng.range(0, 11) {
            0..=4 => {
                let tokens = rng.range(1, 6);
                let data: [Vec<f32>; 3] = std::array::from_fn(|f| rng.floats(rows * tokens * layer.model.widths[f]));
                ok(append_host(layer.cache, rows, tokens, &data));
                layer.model.append(rows, tokens, &data);
            }
            5 if layer.model.round.is_none() => {
                let shortest = layer.model.row_offsets().into_iter().min().unwrap_or(0);
                let n = rng.range(0, shortest.min(4));
                ok(unsafe { latent_cache_trim(layer.cache, n, false) });
                layer.model.trim(n);
            }
            6 if layer.model.round.is_none() => {
                ok(unsafe { latent_cache_spec_round_begin(layer.cache) });
                layer.model.begin();
            }
            7 | 8 if layer.model.round.is_some() => {
                let keep: Vec<usize> =
                    (0..layer.model.rows.len()).map(|r| rng.range(0, layer.model.appended_in_round(r))).collect();
                ok(unsafe { latent_cache_spec_round_rollback_rows(layer.cache, keep.as_ptr(), keep.len()) });
                layer.model.rollback(&keep);
            }
            9 if layer.model.round.is_none() && !layer.model.rows.is_empty() => {
                // A request finishes and a new one joins: extract the survivor, merge a joiner.
                let survivor = rng.range(0, layer.model.rows.len() - 1);
                let mut single = std::ptr::null_mut();
                ok(unsafe { latent_cache_extract_row(layer.cache, survivor, &mut single) });
                let joiner = new_cache(layer.dsa);
                let merged = new_cache(layer.dsa);
                let sources = [single.cast_const(), joiner.cast_const()];
                ok(unsafe { latent_cache_merge_rows(merged, sources.as_ptr(), 2) });
                unsafe {
                    latent_cache_free(single);
                    latent_cache_free(joiner);
                    latent_cache_free(layer.cache);
                }
                layer.cache = merged;
                let empty = Model::new(layer.model.widths);
                layer.model = Model::merge(&[&layer.model.extract(survivor), &empty]);
            }
            10 => {
                if rng.range(0, 20) == 0 {
                    ok(unsafe { latent_cache_reset(layer.cache) });
                    layer.model = Model::new(layer.model.widths);
                }
            }
            _ => check(layer),
        }
    }
    for layer in &layers {
        check(layer);
        unsafe { latent_cache_free(layer.cache) };
    }
}

#[test]
fn mixed_operations_return_memory_when_freed() {
    let ops = std::env::var("SOAK_OPS").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    // Warm MLX up (allocator, thread pool, error handler) so start-up costs are not counted.
    run(200);
    mlx_rs::memory::clear_cache().unwrap();
    let (active_before, rss_before) = (mlx_rs::memory::active_memory().unwrap(), resident_bytes());
    assert!(rss_before > 0, "the resident memory reads as 0: the measurement is broken");
    run(ops);
    mlx_rs::memory::clear_cache().unwrap();
    let (active_after, rss_after) = (mlx_rs::memory::active_memory().unwrap(), resident_bytes());
    assert_eq!(active_after, active_before, "MLX active memory after freeing every handle");
    let slack = 64 << 20;
    assert!(rss_after <= rss_before + slack, "resident memory grew from {rss_before} to {rss_after}");
    eprintln!("soak: {ops} operations; MLX active {active_before} -> {active_after}; RSS {rss_before} -> {rss_after}");
}
