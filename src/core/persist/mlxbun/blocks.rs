//! The seed's block layout (mlx-bun's format version 5): the file at the given path is a
//! manifest (the same frame and JSON header as version 3, each tensor listing its blocks and no
//! tensor bytes after the header), and each block is a file `blocks/<sha256>` beside it holding
//! some of a tensor's bytes. A tensor's bytes are cut per batch row, in blocks of a fixed size
//! from the row's start (the last one of a row shorter): a conversation saved again after it
//! grows keeps every full block of its earlier positions byte for byte, under the same name, so
//! the save writes its new positions' blocks (and each row's last, partial one) and reuses the
//! rest. Several manifests share one blocks folder; a block no manifest names is left for the
//! seed's collector (`collectBlocks`) to remove.
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::core::error::{error, fail, Result};
use crate::core::persist::file::{open_regular, write_atomically, Access};
use crate::core::persist::sha256::sha256_hex;

/// mlx-bun's default block size (its `blockBytes`).
pub const DEFAULT_BLOCK_BYTES: usize = 1 << 20;
/// The largest block size a save takes.
pub const MAX_BLOCK_BYTES: usize = 1 << 30;
/// The most blocks a manifest may name (a header cannot make a load open files without end).
pub(super) const MAX_BLOCKS: u64 = 1 << 20;

/// The blocks folder of the manifest at `path`.
pub(super) fn folder(path: &Path) -> PathBuf {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.join("blocks"),
        _ => PathBuf::from("blocks"),
    }
}

/// A block name as mlx-bun writes it: 64 lowercase hex digits (so it names a file in the folder
/// and nothing else).
pub(super) fn is_block_name(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

/// Cuts a tensor's bytes as mlx-bun does for float32 values: each batch row of `row_bytes`
/// apart, in blocks of `block_bytes` rounded down to whole values (at least one value).
pub(super) fn cut(bytes: &[u8], row_bytes: usize, block_bytes: usize) -> impl Iterator<Item = &[u8]> {
    let block = (block_bytes / 4).max(1) * 4;
    bytes.chunks(row_bytes.max(1)).flat_map(move |row| row.chunks(block))
}

/// Writes the blocks of one tensor into `folder` (those not there already, each through the
/// atomic writer, owner-only) and returns the slot's JSON tail: an empty `hash` and the blocks.
pub(super) fn write_tensor(folder: &Path, bytes: &[u8], row_bytes: usize, block_bytes: usize) -> Result<String> {
    let mut listed = Vec::new();
    for block in cut(bytes, row_bytes, block_bytes) {
        let name = sha256_hex(block);
        let path = folder.join(&name);
        // An existing block of this name holds these bytes (a load checks every block against its
        // name, so one that does not is refused there).
        if !path.is_file() {
            write_atomically(&path, Access::Private, |file| {
                file.write_all(block).map_err(|e| error!(Backend, "writing block {}: {e}", path.display()))
            })?;
        }
        listed.push(format!("{{\"hash\":\"{name}\",\"bytes\":{}}}", block.len()));
    }
    Ok(format!("\"hash\":\"\",\"blocks\":[{}]", listed.join(",")))
}

/// Makes the blocks folder of the manifest at `path` (owner-only where folders have modes).
pub(super) fn make_folder(path: &Path) -> Result<PathBuf> {
    let folder = folder(path);
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(&folder).map_err(|e| error!(Backend, "making {}: {e}", folder.display()))?;
    Ok(folder)
}

/// Reads one tensor's bytes from its blocks (`len` bytes in all, checked by the plan): each
/// block a regular file of exactly its listed length whose SHA-256 is its name. `into` receives
/// the bytes (allocated by the caller, fallibly).
pub(super) fn read_tensor(folder: &Path, blocks: &[(String, u64)], into: &mut [u8]) -> Result<()> {
    let mut at = 0usize;
    for (name, len) in blocks {
        let path = folder.join(name);
        let (mut file, on_disk) =
            open_regular(&path).map_err(|e| error!(InvalidArgument, "a block is missing or unreadable: {}", e.message))?;
        if on_disk != *len {
            return fail!(InvalidArgument, "block {name} holds {on_disk} bytes where the manifest lists {len}");
        }
        let end = at + *len as usize;
        let target = &mut into[at..end];
        file.read_exact(target).map_err(|e| error!(InvalidArgument, "reading block {name}: {e}"))?;
        if sha256_hex(target) != *name {
            return fail!(InvalidArgument, "block {name} does not match its name (it is damaged)");
        }
        at = end;
    }
    Ok(())
}
