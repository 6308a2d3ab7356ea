//! Segment chains that branch, through the C ABI as an engine drives them: a prompt saved once,
//! forked into 8 continuations that each save only their own positions (linked to the
//! prompt's segments), a continuation forked again and its continuations saved after it; every
//! branch restored in a shuffled order from its parent's segments plus its own, and two
//! continuations extending one restored parent attached over a shared prefix. Every value is
//! checked against a reference of plain vectors (what each row was given); refusals (a chain
//! missing a link, a branch extended with another branch's segment) change nothing. Also the
//! defect where a fork of another row left the set reporting a chain its rows no longer held.
use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};

use crate::common::model::Rng;

use latent_cache::ffi::cache::{latent_cache_append_host, latent_cache_append_host_padded, latent_cache_read_row_host};
use latent_cache::ffi::config::latent_cache_config_default;
use latent_cache::ffi::prefix::{
    latent_cache_prefix_free, latent_cache_set_attach_prefix, latent_cache_set_fork_row, latent_cache_set_share_prefix,
};
use latent_cache::ffi::segment::*;
use latent_cache::ffi::set::{latent_cache_set, latent_cache_set_free, latent_cache_set_layer, latent_cache_set_new};
use latent_cache::ffi::{latent_cache as Cache, latent_cache_status as Status};

const LAYERS: usize = 2;
const WIDTHS: [usize; 2] = [64, 16];
/// Bytes a position takes in a segment (every layer's float32 latent and rope key).
const PER_POSITION: usize = LAYERS * (WIDTHS[0] + WIDTHS[1]) * 4;

/// What a row holds, per layer and family (`[layer * 2 + family]`), as plain values.
type RowRef = Vec<Vec<f32>>;

fn layer(set: *mut latent_cache_set, i: usize) -> *mut Cache {
    let mut cache = std::ptr::null_mut();
    assert_eq!(unsafe { latent_cache_set_layer(set, i, &mut cache) }, Status::Ok);
    cache
}

fn new_set() -> *mut latent_cache_set {
    let configs = [latent_cache_config_default(); LAYERS].map(|mut c| {
        (c.kv_lora_rank, c.rope_head_dim, c.index_head_dim) = (WIDTHS[0], WIDTHS[1], 0);
        c
    });
    let mut set = std::ptr::null_mut();
    assert_eq!(unsafe { latent_cache_set_new(configs.as_ptr(), LAYERS, &mut set) }, Status::Ok);
    set
}

/// Row `row` of every layer, read on the host.
fn read(set: *mut latent_cache_set, row: usize) -> RowRef {
    let mut out = Vec::new();
    for l in 0..LAYERS {
        for (family, width) in WIDTHS.into_iter().enumerate() {
            let mut buf = vec![0f32; 1 << 16];
            let mut written = 0;
            let rc = unsafe {
                latent_cache_read_row_host(layer(set, l), family as u32, row, buf.as_mut_ptr(), buf.len(), &mut written)
            };
            assert_eq!(rc, Status::Ok);
            assert_eq!(written % width, 0);
            buf.truncate(written);
            out.push(buf);
        }
    }
    out
}

/// Appends `tokens` new positions to each of `rows.len()` rows (random values, different per
/// row and layer), recording them in the reference.
fn append(set: *mut latent_cache_set, rows: &mut [RowRef], tokens: usize, rng: &mut Rng) {
    append_padded(set, rows, tokens, &vec![0; rows.len()], rng);
}

/// `append` where row `b`'s first `pads[b]` positions are padding (a padded first append, or
/// `pads` all 0); the reference holds each row's valid positions.
fn append_padded(set: *mut latent_cache_set, rows: &mut [RowRef], tokens: usize, pads: &[usize], rng: &mut Rng) {
    let batch = rows.len();
    for l in 0..LAYERS {
        let data = [rng.uniform(batch * tokens * WIDTHS[0], 1.0), rng.uniform(batch * tokens * WIDTHS[1], 1.0)];
        for (b, row) in rows.iter_mut().enumerate() {
            for (f, w) in WIDTHS.into_iter().enumerate() {
                row[l * 2 + f].extend_from_slice(&data[f][(b * tokens + pads[b]) * w..(b + 1) * tokens * w]);
            }
        }
        let (latent, rope) = (&data[0], &data[1]);
        let rc = unsafe {
            match pads.iter().any(|&p| p > 0) {
                true => latent_cache_append_host_padded(
                    layer(set, l),
                    batch,
                    tokens,
                    pads.as_ptr(),
                    batch,
                    latent.as_ptr(),
                    latent.len(),
                    rope.as_ptr(),
                    rope.len(),
                    std::ptr::null(),
                    0,
                ),
                false => latent_cache_append_host(
                    layer(set, l),
                    batch,
                    tokens,
                    latent.as_ptr(),
                    latent.len(),
                    rope.as_ptr(),
                    rope.len(),
                    std::ptr::null(),
                    0,
                ),
            }
        };
        assert_eq!(rc, Status::Ok);
    }
}

/// Saves row `row`'s `[from, to)` to `dir/name` and returns its path, checking the file holds
/// those positions only (plus a bounded header).
fn save(set: *mut latent_cache_set, row: usize, from: usize, to: usize, dir: &Path, name: &str) -> CString {
    let path = CString::new(dir.join(name).to_str().unwrap()).unwrap();
    let mut digest = 0;
    let rc = unsafe { latent_cache_set_save_segment(set, row, from, to, name.as_ptr(), name.len(), path.as_ptr(), &mut digest) };
    assert_eq!(rc, Status::Ok, "saving {name}");
    let size = std::fs::metadata(dir.join(name)).unwrap().len() as usize;
    let body = (to - from) * PER_POSITION;
    assert!(size >= body && size - body <= 4096, "{name}: {size} bytes for {} positions", to - from);
    assert_eq!(row_chain(set, row), Some((to, digest)), "{name}: the row's chain after its save");
    path
}

/// Row `row`'s known chain (positions, digest), or `None` (INVALID_STATE).
fn row_chain(set: *mut latent_cache_set, row: usize) -> Option<(usize, u64)> {
    let (mut positions, mut digest) = (0, 0);
    match unsafe { latent_cache_set_row_segment_chain(set, row, &mut positions, &mut digest) } {
        Status::Ok => Some((positions, digest)),
        Status::InvalidState => None,
        other => panic!("row_segment_chain: {other:?}"),
    }
}

fn load(paths: &[&CString]) -> Result<*mut latent_cache_set, Status> {
    let list: Vec<*const c_char> = paths.iter().map(|p| p.as_ptr()).collect();
    let mut out = std::ptr::null_mut();
    match unsafe { latent_cache_set_load_segments(list.as_ptr(), list.len(), &mut out) } {
        Status::Ok => Ok(out),
        other => Err(other),
    }
}

fn extend(set: *mut latent_cache_set, paths: &[&CString]) -> Status {
    let list: Vec<*const c_char> = paths.iter().map(|p| p.as_ptr()).collect();
    unsafe { latent_cache_set_extend_segments(set, list.as_ptr(), list.len(), std::ptr::null_mut()) }
}

/// Restores `chain` into a new set and checks its one row against `want`.
fn restores(chain: &[&CString], want: &RowRef, what: &str) {
    let set = load(chain).unwrap_or_else(|rc| panic!("{what}: {rc:?}"));
    assert!(read(set, 0) == *want, "{what}: restored values differ from what the row was given");
    unsafe { latent_cache_set_free(set) };
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("latent-cache-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn continuations_persist_as_the_prompt_once_plus_their_tails() {
    let dir = scratch("segments-tree");
    let mut rng = Rng::new(4242);
    let set = new_set();
    // The prompt, saved once as two segments.
    let mut prompt: Vec<RowRef> = vec![vec![Vec::new(); LAYERS * 2]];
    append(set, &mut prompt, 200, &mut rng);
    let p0 = save(set, 0, 0, 200, &dir, "prompt-0");
    append(set, &mut prompt, 100, &mut rng);
    let p1 = save(set, 0, 200, 300, &dir, "prompt-1");
    let prompt_chain = row_chain(set, 0).unwrap();
    // Eight continuations: each holds the prompt's chain, then its own positions.
    assert_eq!(unsafe { latent_cache_set_fork_row(set, 0, 8) }, Status::Ok);
    for r in 0..8 {
        assert_eq!(row_chain(set, r), Some(prompt_chain), "continuation {r} inherits the prompt's chain");
    }
    let mut rows = vec![prompt[0].clone(); 8];
    append(set, &mut rows, 11, &mut rng);
    append(set, &mut rows, 6, &mut rng);
    let mut tails = Vec::new();
    for (r, row) in rows.iter().enumerate() {
        assert!(read(set, r) == *row, "continuation {r} before its save");
        tails.push(save(set, r, 300, 317, &dir, &format!("tail-{r}")));
    }
    // Saving row 2 again from 300 is off its chain now (it ends at 317); the others keep theirs.
    let (mut bytes, mut len) = (std::ptr::null_mut(), 0);
    let rc = unsafe {
        latent_cache_set_save_segment_to_buffer(set, 2, 300, 317, std::ptr::null(), 0, &mut bytes, &mut len, std::ptr::null_mut())
    };
    assert_eq!(rc, Status::InvalidState, "a save off row 2's chain");
    // Every continuation restores from the prompt's segments and its own tail, in any order.
    let mut order: Vec<usize> = (0..8).collect();
    for k in (1..order.len()).rev() {
        order.swap(k, rng.range(0, k + 1));
    }
    for &r in &order {
        restores(&[&p0, &p1, &tails[r]], &rows[r], &format!("continuation {r}"));
    }
    // A continuation of a continuation: row 3 forked into 3, each saving after row 3's tail.
    assert_eq!(unsafe { latent_cache_set_fork_row(set, 3, 3) }, Status::Ok);
    let mut nested = vec![rows[3].clone(); 3];
    append(set, &mut nested, 5, &mut rng);
    let nested_tails: Vec<CString> = (0..3).map(|j| save(set, j, 317, 322, &dir, &format!("tail-3-{j}"))).collect();
    for j in [2, 0, 1] {
        restores(&[&p0, &p1, &tails[3], &nested_tails[j]], &nested[j], &format!("continuation 3.{j}"));
    }
    // Refusals per branch: a link missing, a branch's tail after another branch.
    assert_eq!(load(&[&p0, &p1, &nested_tails[0]]).err(), Some(Status::InvalidArgument), "a gap");
    assert_eq!(load(&[&p0, &p1, &tails[4], &nested_tails[0]]).err(), Some(Status::InvalidArgument), "a broken link");
    // A prompt saved after its fork (from any row) is every continuation's chain: it lies in
    // the shared prefix, which every row holds.
    let late = new_set();
    let mut late_rows: Vec<RowRef> = vec![vec![Vec::new(); LAYERS * 2]];
    append(late, &mut late_rows, 40, &mut rng);
    assert_eq!(unsafe { latent_cache_set_fork_row(late, 0, 3) }, Status::Ok);
    assert_eq!(row_chain(late, 2), None, "no chain saved yet");
    let late_prompt = save(late, 1, 0, 40, &dir, "late-prompt");
    let mut late_rows = vec![late_rows[0].clone(); 3];
    append(late, &mut late_rows, 4, &mut rng);
    for r in [2, 0] {
        let tail = save(late, r, 40, 44, &dir, &format!("late-tail-{r}"));
        restores(&[&late_prompt, &tail], &late_rows[r], &format!("late continuation {r}"));
    }
    unsafe { latent_cache_set_free(late) };
    // Two continuations extend one restored parent, attached over it without a copy.
    let parent = load(&[&p0, &p1]).unwrap();
    let mut prefix = std::ptr::null_mut();
    assert_eq!(unsafe { latent_cache_set_share_prefix(parent, 0, 300, &mut prefix) }, Status::Ok);
    for r in [5, 0] {
        let child = new_set();
        assert_eq!(unsafe { latent_cache_set_attach_prefix(child, prefix, 1) }, Status::Ok);
        assert_eq!(row_chain(child, 0), Some(prompt_chain), "an attached row inherits the prefix's chain");
        assert_eq!(extend(child, &[&tails[(r + 1) % 8]]), Status::Ok);
        assert!(read(child, 0) == rows[(r + 1) % 8], "continuation {} extended over the parent", (r + 1) % 8);
        // Another branch's segment after it is a broken link; the set is unchanged.
        assert_eq!(extend(child, &[&nested_tails[1]]), Status::InvalidArgument);
        assert!(read(child, 0) == rows[(r + 1) % 8], "a refused extension changed the set");
        unsafe { latent_cache_set_free(child) };
    }
    unsafe {
        latent_cache_prefix_free(prefix);
        latent_cache_set_free(parent);
        latent_cache_set_free(set);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_fork_of_another_row_forgets_the_chain() {
    let dir = scratch("segments-fork-other");
    let mut rng = Rng::new(7);
    let set = new_set();
    // Rows padded 5 / 0 of 30: row 0 holds 25 positions, row 1 holds 30.
    let mut rows: Vec<RowRef> = vec![vec![Vec::new(); LAYERS * 2]; 2];
    append_padded(set, &mut rows, 30, &[5, 0], &mut rng);
    assert!(read(set, 0) == rows[0] && read(set, 1) == rows[1], "the padded rows");
    save(set, 1, 0, 20, &dir, "row-1");
    assert_eq!(row_chain(set, 0), None, "row 0 holds no chain");
    // Row 0 forked into 2: neither new row holds row 1's chain, and the set knows none.
    assert_eq!(unsafe { latent_cache_set_fork_row(set, 0, 2) }, Status::Ok);
    let (mut row, mut positions, mut digest) = (0, 0, 0);
    assert_eq!(unsafe { latent_cache_set_segment_chain(set, &mut row, &mut positions, &mut digest) }, Status::InvalidState);
    assert_eq!((row_chain(set, 0), row_chain(set, 1)), (None, None));
    let next = CString::new(dir.join("next").to_str().unwrap()).unwrap();
    let rc = unsafe { latent_cache_set_save_segment(set, 1, 20, 25, std::ptr::null(), 0, next.as_ptr(), std::ptr::null_mut()) };
    assert_eq!(rc, Status::InvalidState, "a segment after a chain the row does not hold");
    assert!(!dir.join("next").exists());
    let mut out = (0, 0);
    assert_eq!(unsafe { latent_cache_set_row_segment_chain(set, 2, &mut out.0, &mut out.1) }, Status::OutOfRange);
    unsafe { latent_cache_set_free(set) };
    std::fs::remove_dir_all(&dir).unwrap();
}
