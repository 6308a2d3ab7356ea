#[path = "common/mod.rs"]
mod common;

#[test]
fn stub() {}
