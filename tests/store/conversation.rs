//! An agent conversation of 50 turns that branches (each turn continues a random earlier
//! turn, or starts over from the system prompt), with the store restarted from its folder every
//! few turns: each turn finds exactly the longest prefix it stored before (the reference is the
//! set of block prefixes put), restores or attaches it bit for bit, prefills the rest and puts
//! the whole conversation back.
use std::collections::HashSet;

use super::engine::{geometries, open, scratch, tokens, Engine};
use crate::common::model::Rng;

use latent_cache::{LayoutKind, StorageMode};

const BLOCK: usize = 16;

fn longest(stored: &HashSet<Vec<u32>>, t: &[u32]) -> usize {
    (1..=t.len() / BLOCK).rev().find(|&k| stored.contains(&t[..k * BLOCK])).map_or(0, |k| k * BLOCK)
}

#[test]
fn fifty_turns_that_branch_and_restart_restore_their_longest_prefix() {
    let dir = scratch("conversation");
    let gs = geometries(StorageMode::Bf16, LayoutKind::Ragged);
    let mut rng = Rng::new(50);
    let system = tokens(&mut rng, 40);
    let mut nodes: Vec<Vec<u32>> = Vec::new();
    let mut stored: HashSet<Vec<u32>> = HashSet::new();
    let mut store = open(Some(&dir), BLOCK, 1 << 30, 1 << 30);
    let mut reused = 0;
    for turn in 0..50 {
        let parent = match nodes.len() {
            0 => system.clone(),
            n if rng.range(0, 4) == 0 => nodes[rng.range(0, n - 1)][..40].to_vec(),
            n => nodes[rng.range(0, n - 1)].clone(),
        };
        let mut t = parent;
        let n = rng.range(5, 40);
        t.extend(tokens(&mut rng, n));
        let want = longest(&stored, &t);
        assert_eq!(store.lookup(&gs, b"glm", &t).unwrap(), want, "turn {turn}: lookup");
        let mut engine = Engine::new(&gs);
        let got = match turn % 2 {
            0 => engine.restore(&mut store, b"glm", &t),
            _ => {
                let n = store.attach(&mut engine.refs(), b"glm", &t, 1).unwrap();
                engine.tokens = t[..n].to_vec();
                n
            }
        };
        assert_eq!(got, want, "turn {turn}: restored");
        reused += got;
        engine.check(&format!("turn {turn}: restored"));
        engine.extend(&t[got..]);
        let n = rng.range(5, 30);
        engine.extend(&tokens(&mut rng, n));
        engine.check(&format!("turn {turn}: answered"));
        store.put(&engine.shared(), 0, b"glm", &engine.tokens).unwrap();
        for k in 1..=engine.tokens.len() / BLOCK {
            stored.insert(engine.tokens[..k * BLOCK].to_vec());
        }
        nodes.push(engine.tokens.clone());
        if turn % 7 == 6 {
            store.sync().unwrap();
            drop(store);
            store = open(Some(&dir), BLOCK, 1 << 30, 1 << 30);
        }
    }
    let s = store.stats();
    assert!(reused > 50 * 40, "turns reused their history ({reused} positions)");
    assert_eq!((s.write_failures, s.damaged), (0, 0), "{s:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
