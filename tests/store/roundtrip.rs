//! Puts and restores in every storage mode and both layouts, from RAM and from the SSD (after a
//! restart too), attaches that lend the stored blocks, namespaces that never mix, pins, and
//! every refusal leaving the set as it was.
use super::engine::{folder_bytes, geometries, open, scratch, tokens, Engine};
use crate::common::mlx_helpers::geometry_in;
use crate::common::model::Rng;

use latent_cache::{ErrorKind, Geometry, LayoutKind, StorageMode};

const MODES: [StorageMode; 5] = [StorageMode::F32, StorageMode::Bf16, StorageMode::Q8, StorageMode::Q4, StorageMode::Fp8];
const LAYOUTS: [LayoutKind; 2] = [LayoutKind::RightJustified, LayoutKind::Ragged];

#[test]
fn restores_equal_what_was_put_in_every_mode_and_layout() {
    let mut rng = Rng::new(1);
    for mode in MODES {
        for layout in LAYOUTS {
            let what = format!("{mode:?} {layout:?}");
            let gs = geometries(mode, layout);
            let mut a = Engine::new(&gs);
            a.extend(&tokens(&mut rng, 100));
            let mut store = open(None, 16, 1 << 30, 0);
            let put = store.put(&a.shared(), 0, b"model-a", &a.tokens).unwrap();
            assert_eq!((put.blocks, put.stored, put.not_stored), (6, 6, 0), "{what}");
            assert_eq!(store.put(&a.shared(), 0, b"model-a", &a.tokens).unwrap().stored, 0, "{what}: stored once");
            assert_eq!(store.lookup(&gs, b"model-a", &a.tokens).unwrap(), 96, "{what}");
            let mut other = a.tokens.clone();
            other[40] ^= 1;
            assert_eq!(store.lookup(&gs, b"model-a", &other).unwrap(), 32, "{what}: up to the block before a change");
            assert_eq!(store.lookup(&gs, b"model-b", &a.tokens).unwrap(), 0, "{what}: namespaces never mix");

            let mut b = Engine::new(&gs);
            assert_eq!(b.restore(&mut store, b"model-a", &other), 32, "{what}");
            b.check(&format!("{what}: restored"));
            b.extend(&other[32..70]);
            b.check(&format!("{what}: restored, then prefilled on"));

            let mut c = Engine::new(&gs);
            assert_eq!(store.attach(&mut c.refs(), b"model-a", &a.tokens, 2).unwrap(), 96, "{what}");
            c.tokens = a.tokens[..96].to_vec();
            c.check(&format!("{what}: attached"));
            c.extend(&tokens(&mut rng, 5));
            c.check(&format!("{what}: attached, then decoded on"));
        }
    }
}

#[test]
fn blocks_go_to_the_ssd_behind_the_put_and_survive_a_restart() {
    let mut rng = Rng::new(2);
    for mode in [StorageMode::Bf16, StorageMode::Q8] {
        let dir = scratch(&format!("restart-{mode:?}"));
        let gs = geometries(mode, LayoutKind::RightJustified);
        let mut a = Engine::new(&gs);
        a.extend(&tokens(&mut rng, 80));
        {
            // No RAM at all: every block lives on the SSD only.
            let mut store = open(Some(&dir), 16, 0, 1 << 30);
            assert_eq!(store.put(&a.shared(), 0, b"ns", &a.tokens).unwrap().stored, 5);
            store.sync().unwrap();
            let s = store.stats();
            assert_eq!((s.ram_blocks, s.ssd_blocks, s.blocks_written), (0, 5, 5), "{mode:?}: {s:?}");
            let mut b = Engine::new(&gs);
            assert_eq!(b.restore(&mut store, b"ns", &a.tokens), 80);
            b.check(&format!("{mode:?}: restored from the SSD"));
        }
        let mut store = open(Some(&dir), 16, 1 << 30, 1 << 30);
        assert_eq!(store.lookup(&gs, b"ns", &a.tokens).unwrap(), 80, "{mode:?}: the restart indexed the folder");
        let mut b = Engine::new(&gs);
        assert_eq!(b.restore(&mut store, b"ns", &a.tokens), 80);
        b.check(&format!("{mode:?}: restored after a restart"));
        assert_eq!(store.stats().ram_blocks, 5, "{mode:?}: promoted to RAM");
        let mut c = Engine::new(&gs);
        assert_eq!(store.attach(&mut c.refs(), b"ns", &a.tokens, 1).unwrap(), 80);
        c.tokens = a.tokens.clone();
        c.check(&format!("{mode:?}: attached over promoted blocks"));
        drop(store);
        // Reopened under a smaller budget: brought within it at once, newest blocks kept.
        let two = 2 * (folder_bytes(&dir) / 5) + 512;
        let s = open(Some(&dir), 16, 1 << 30, two);
        assert!(folder_bytes(&dir) <= two && s.stats().ssd_evictions >= 3, "{mode:?}: {:?}", s.stats());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn lent_blocks_are_pinned_and_refusals_change_nothing() {
    let mut rng = Rng::new(3);
    let gs = geometries(StorageMode::F32, LayoutKind::RightJustified);
    let mut a = Engine::new(&gs);
    a.extend(&tokens(&mut rng, 64));
    let span: usize = 4 * 16 * a.layers.iter().map(|l| l.bytes_per_token()).sum::<usize>();
    // Room for one put's span only.
    let mut store = open(None, 16, span, 0);
    assert_eq!(store.put(&a.shared(), 0, b"", &a.tokens).unwrap().stored, 4);
    let mut lent = Engine::new(&gs);
    assert_eq!(store.attach(&mut lent.refs(), b"", &a.tokens, 1).unwrap(), 64);
    lent.tokens = a.tokens.clone();
    let mut b = Engine::new(&gs);
    b.extend(&tokens(&mut rng, 64));
    let put = store.put(&b.shared(), 0, b"", &b.tokens).unwrap();
    assert_eq!((put.stored, put.not_stored), (0, 4), "the lent span is pinned: nothing to evict");
    assert_eq!(store.lookup(&gs, b"", &a.tokens).unwrap(), 64);
    lent.check("the attached set after a put that found the store full");
    drop(lent);
    assert_eq!(store.put(&b.shared(), 0, b"", &b.tokens).unwrap().stored, 4, "unpinned: evicted");
    assert_eq!(store.lookup(&gs, b"", &a.tokens).unwrap(), 0);
    assert_eq!(store.stats().ram_evictions, 4);

    // Refusals: a set holding rows, composed storage, a long namespace, a row out of range.
    let mut full = Engine::new(&gs);
    full.extend(&tokens(&mut rng, 20));
    assert_eq!(store.restore(&mut full.refs(), b"", &b.tokens).unwrap_err().kind, ErrorKind::State);
    assert_eq!(store.attach(&mut full.refs(), b"", &b.tokens, 1).unwrap_err().kind, ErrorKind::State);
    full.check("a refused restore");
    let err = store.put(&b.shared(), 0, &[0u8; 1025], &b.tokens).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    assert_eq!(store.put(&b.shared(), 1, b"", &b.tokens).unwrap_err().kind, ErrorKind::OutOfRange);
    let composed = Geometry {
        hot_window: 32,
        hot_storage: StorageMode::Bf16,
        ..geometry_in([128, 64, 0], [StorageMode::Q8; 3], LayoutKind::RightJustified)
    };
    let mut c = Engine::new(&[composed]);
    c.extend(&tokens(&mut rng, 40));
    assert_eq!(store.put(&c.shared(), 0, b"", &c.tokens).unwrap_err().kind, ErrorKind::InvalidArgument);
    assert_eq!(store.stats().blocks_put, 8);
}

#[test]
fn blocks_another_store_wrote_to_the_folder_are_found_without_a_refresh() {
    let mut rng = Rng::new(9);
    let dir = scratch("shared-folder");
    let gs = geometries(StorageMode::Bf16, LayoutKind::RightJustified);
    // Two handles on one folder, as two processes would hold: `reader` opened before any put.
    let mut writer = open(Some(&dir), 16, 1 << 30, 1 << 30);
    let mut reader = open(Some(&dir), 16, 1 << 30, 1 << 30);
    let mut a = Engine::new(&gs);
    a.extend(&tokens(&mut rng, 80));
    assert_eq!(reader.lookup(&gs, b"ns", &a.tokens).unwrap(), 0, "nothing written yet");
    assert_eq!(writer.put(&a.shared(), 0, b"ns", &a.tokens).unwrap().stored, 5);
    assert_eq!(reader.lookup(&gs, b"ns", &a.tokens).unwrap(), 0, "written behind: not on the SSD before a sync");
    writer.sync().unwrap();
    assert_eq!(reader.lookup(&gs, b"ns", &a.tokens).unwrap(), 80, "found once synced, with no refresh");
    let mut b = Engine::new(&gs);
    assert_eq!(b.restore(&mut reader, b"ns", &a.tokens), 80);
    b.check("restored from the other handle's files");
    // The writer's conversation goes on: the reader finds the new blocks after the old ones.
    a.extend(&tokens(&mut rng, 45));
    assert_eq!(writer.put(&a.shared(), 0, b"ns", &a.tokens).unwrap().stored, 2);
    writer.sync().unwrap();
    let mut c = Engine::new(&gs);
    assert_eq!(c.restore(&mut reader, b"ns", &a.tokens), 112, "the RAM blocks, then the new files");
    c.check("restored across both tiers");
    assert_eq!(reader.refresh().unwrap(), 7, "a refresh indexes the same 7 files");
    let _ = std::fs::remove_dir_all(&dir);
}
