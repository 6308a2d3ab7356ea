//! Writing safetensors ourselves (reading stays with MLX's loader): the header, then every
//! tensor's bytes streamed from where the evaluated arrays hold them (`tensor_bytes`), so a save
//! copies the state once, into the file, instead of laying each tensor out again first (a
//! tensor may be written under a reshape of its shape, as mlx-lm's head axis, at no cost).
use std::io::Write;

use mlx_rs::{Array, Dtype};

use crate::core::error::{error, fail, Result};
use crate::core::persist::json::string as json;
use crate::core::persist::tensor_bytes::for_each_run;

/// The safetensors name of an MLX dtype (those MLX's loader reads back).
fn dtype_name(d: Dtype) -> Result<&'static str> {
    Ok(match d {
        Dtype::Bool => "BOOL",
        Dtype::Uint8 => "U8",
        Dtype::Uint16 => "U16",
        Dtype::Uint32 => "U32",
        Dtype::Uint64 => "U64",
        Dtype::Int8 => "I8",
        Dtype::Int16 => "I16",
        Dtype::Int32 => "I32",
        Dtype::Int64 => "I64",
        Dtype::Float16 => "F16",
        Dtype::Bfloat16 => "BF16",
        Dtype::Float32 => "F32",
        Dtype::Float64 => "F64",
        other => return fail!(Backend, "no safetensors dtype for {other:?}"),
    })
}

/// Bytes per element of a safetensors dtype MLX reads.
pub(super) fn dtype_size(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" => 1,
        "U16" | "I16" | "F16" | "BF16" => 2,
        "U32" | "I32" | "F32" => 4,
        "U64" | "I64" | "F64" | "C64" => 8,
        _ => return None,
    })
}

/// The MLX dtype of a safetensors dtype name (those `dtype_name` gives).
pub(super) fn dtype_of_name(name: &str) -> Option<Dtype> {
    use Dtype::*;
    [Bool, Uint8, Uint16, Uint32, Uint64, Int8, Int16, Int32, Int64, Float16, Bfloat16, Float32, Float64]
        .into_iter()
        .find(|&d| dtype_name(d).is_ok_and(|n| n == name))
}

/// A tensor to write: its values, and the shape the file gives them (the array's own, or a
/// reshape of it that keeps its row-major order, written without laying the values out again).
pub struct Tensor {
    pub name: String,
    pub array: Array,
    pub shape: Vec<i32>,
}

/// The JSON header for `tensors` and `metadata`, padded with spaces to a multiple of 8.
pub fn header(tensors: &[Tensor], metadata: &[(String, String)]) -> Result<String> {
    let meta: Vec<String> = metadata.iter().map(|(k, v)| format!("{}:{}", json(k), json(v))).collect();
    let mut entries = vec![format!("\"__metadata__\":{{{}}}", meta.join(","))];
    let mut at = 0usize;
    for Tensor { name, array: a, shape } in tensors {
        let bytes = a.size() * a.item_size();
        if shape.iter().map(|&d| d as usize).product::<usize>() != a.size() {
            return fail!(Backend, "tensor {name}: shape {shape:?} does not hold its {} values", a.size());
        }
        let shape: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        entries.push(format!(
            "{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{at},{}]}}",
            json(name),
            dtype_name(a.dtype())?,
            shape.join(","),
            at + bytes
        ));
        at += bytes;
    }
    let mut header = format!("{{{}}}", entries.join(","));
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    Ok(header)
}

/// Writes `tensors` (evaluated, innermost axis contiguous) and `metadata` as one safetensors
/// file to `out`: an 8-byte little-endian header length, the JSON header padded with spaces to a
/// multiple of 8, then the tensors' bytes in order.
pub fn write(out: &mut impl Write, tensors: &[Tensor], metadata: &[(String, String)]) -> Result<()> {
    write_with(out, tensors, metadata, |_, _| {}).map(|_| ())
}

/// `write`, handing every run of tensor `i`'s bytes to `on_run(i, run)` as it is written (while
/// it is still in the cache). Returns the length of the JSON header it wrote.
pub fn write_with(
    out: &mut impl Write,
    tensors: &[Tensor],
    metadata: &[(String, String)],
    mut on_run: impl FnMut(usize, &[u8]),
) -> Result<usize> {
    let header = header(tensors, metadata)?;
    let io = |e: std::io::Error| error!(Backend, "writing the file: {e}");
    out.write_all(&(header.len() as u64).to_le_bytes()).map_err(io)?;
    out.write_all(header.as_bytes()).map_err(io)?;
    for (i, t) in tensors.iter().enumerate() {
        for_each_run(&t.array, |run| {
            on_run(i, run);
            out.write_all(run).map_err(io)
        })?;
    }
    Ok(header.len())
}
