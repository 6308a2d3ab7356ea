//! Saving and loading: round trips and damaged files (`persist`), what loads make of a file's content (`hostile_content`), the safetensors writer
//! (`persist_writer`), segments saved turn by turn and restored as chains (`segments`), chains that branch (`segments_tree`), concurrent saves to one path (`persist_concurrent`), the seed's own cache-file format (`mlxbun`, `mlxbun_hostile`, its block layout `mlxbun_blocks`) and the
//! fuzz corpora's replay (`fuzz_corpus`, which also drives the C API). Grouped in one binary (one
//! link of mlx-c): none of these tests sets or measures process-wide state, and each writes its
//! files in a scratch folder of its own name.
#[path = "../common/mod.rs"]
mod common;

mod fuzz_corpus;
mod hostile_content;
mod hostile_files;
mod mlxbun;
mod mlxbun_blocks;
mod mlxbun_hostile;
mod persist;
mod persist_concurrent;
mod persist_writer;
mod segments;
mod segments_c;
mod segments_composed;
mod segments_tree;
