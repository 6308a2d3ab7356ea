//! Segments: one row's positions `[from, to)` of every layer of a set, saved apart so that a
//! long conversation is persisted turn by turn (each save writes its turn's positions and a
//! small header, whatever came before) and restored from its ordered chain of segments.
//!
//! | file | its job |
//! |---|---|
//! | `header.rs` | a segment's metadata (format, geometry, range, key, links, checksums) and the chain digest |
//! | `save.rs` | saving a range of a set's row to a file or to bytes, marking the set with its chain |
//! | `restore.rs` | reading a header alone; restoring a set from a chain; extending a set along its chain |
//!
//! A segment is a safetensors file written by `safetensors.rs` through `file.rs` and read by
//! `mlx_read.rs` (so every frame check of whole-set files applies before MLX reads anything):
//! for each layer, each family's parts for the row's positions, exactly as stored
//! (`segment.<layer>.<family>.<part>`, `[1, to - from, part_width]`), and metadata under
//! `0.latent_cache.`: `format` = `segment-1` (which whole-set loads refuse), the layers'
//! geometry (and composition), `segment.from`, `segment.to`, `segment.previous` (the chain's digest before the
//! segment; zeros for a first one), `segment.key` (the caller's key, hex), `segment.digest`,
//! each tensor's checksum and the metadata's. The digest is wyhash over the header's fields and
//! the tensors' checksums after the previous digest: an integrity link, not a cryptographic one.
//!
//! A cache remembers which chain each row holds (`ChainMark`): a segment save or a restore sets
//! it, a fork or an attach hands the parent row's to every new row (chains form a tree: each
//! continuation's next segment links to its parent's, so the parent is written once), a change
//! that leaves the chain's positions where they are keeps it, any other forgets it. A segment
//! not starting at 0 continues its row's chain; an extension appends the segments after it.
//! A composed layer's segment also holds its hot row as it stands at `to` (`layer.<i>.hot`:
//! window, mode, boundary, base, length; tensors `segment.<layer>.hot.<family>`, about twice a hot
//! window, whatever the history), so only a one-row set's newest positions can be saved; a
//! restore or an extension takes the hot side of the chain's last segment.
mod header;
mod restore;
mod save;

pub use header::SegmentHeader;
pub use restore::{extend_segments, load_segments, read_segment, read_segment_header, SegmentSource};
pub use save::{save_segment, save_segment_to_bytes, segment_of_parts, SegmentRange};
