//! Replays the fuzz corpus (fuzz/corpus/api, kept small in the repository; `make fuzz` grows it
//! locally) and a fixed set of generated inputs through the C-API driver, which checks every
//! call against the reference model.
mod common;

use common::api_driver::run_bytes;
use common::model::Rng;

#[test]
fn the_corpus_replays_cleanly() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/corpus/api");
    let mut files: Vec<_> = std::fs::read_dir(dir).expect("fuzz/corpus/api").map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(!files.is_empty(), "the seed corpus is checked in");
    for file in files {
        let data = std::fs::read(&file).unwrap();
        let result = std::panic::catch_unwind(|| run_bytes(&data));
        assert!(result.is_ok(), "corpus input {} failed", file.display());
    }
}

#[test]
fn generated_call_sequences_match_the_model() {
    let mut rng = Rng::new(2026);
    for _ in 0..150 {
        let len = rng.range(8, 400);
        let data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        run_bytes(&data);
    }
}
