//! What every backend's kernels share: a kernel's source (`Source`) and launch (`Launch`)
//! descriptions, the table of kernel objects made once per process (`made_once`), and the
//! `Switch` each kernel keeps to be turned off and to count its launches. Making and applying a
//! kernel is each backend's own (`cuda::launch`, `metal::launch`).
use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use mlx_rs::Dtype;

use crate::core::error::{fail, Result};

/// Kernels made so far: name, shared memory, the kernel.
pub(crate) type Made<K> = Mutex<Vec<(&'static str, usize, &'static K)>>;

pub(crate) fn cstr(s: &str) -> CString {
    CString::new(s).expect("kernel names and sources hold no NUL")
}

/// A kernel source as MLX is given it: comments, indentation and blank lines dropped. MLX's
/// work over a source recurs at every launch (its CUDA backend copies the whole source into each
/// operation built and hashes it at each evaluation to find the compiled module), so it runs over
/// the code alone. Lines stay lines (the preprocessor's directives and continued macros need them).
fn minified(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    for line in source.lines() {
        let code = without_comment(line).trim();
        // A line emptied after a continued one still ends that macro where the original did.
        if code.is_empty() && !out.trim_end_matches('\n').ends_with('\\') {
            continue;
        }
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// `line` up to a `//` comment outside string literals.
fn without_comment(line: &str) -> &str {
    let bytes = line.as_bytes();
    let (mut quoted, mut i) = (false, 0);
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if quoted => i += 1,
            b'"' => quoted = !quoted,
            b'/' if !quoted && bytes.get(i + 1) == Some(&b'/') => return &line[..i],
            _ => {}
        }
        i += 1;
    }
    line
}

/// A kernel's source: its name, the names its body gives its inputs and outputs, a header (before
/// MLX's signature) and the body.
///
/// MLX looks for `<input>_shape`, `<input>_strides` (and on Metal the thread attributes' names)
/// in the body to decide what the signature passes, so the sources' comments name none of them.
pub(crate) struct Source {
    pub name: &'static str,
    pub inputs: &'static [&'static str],
    pub outputs: &'static [&'static str],
    pub header: &'static str,
    pub body: &'static str,
    /// MLX copies inputs that are not row-contiguous first, and the body indexes them as such;
    /// otherwise the body reads `<input>_strides` (MLX passes them where the body names them).
    pub contiguous: bool,
}

/// What MLX's kernel constructors take of a `Source`: its name, its body and header as MLX is
/// given them (`minified`), mlx-c vectors of its input and output names, and whether inputs are
/// made row-contiguous first.
pub(crate) struct Texts {
    pub name: CString,
    pub body: CString,
    pub header: CString,
    pub inputs: mlx_sys::mlx_vector_string,
    pub outputs: mlx_sys::mlx_vector_string,
    pub contiguous: bool,
}

/// The kernel object of `source` with `shared` bytes of dynamic shared memory from `made`, or
/// made by `make` (given the source's `Texts`; `None` where MLX made no kernel) and kept for the
/// process: making one copies its source, and MLX compiles each source once however many
/// objects name it.
pub(crate) fn made_once<K: Sync>(
    made: &Made<K>,
    source: &'static Source,
    shared: usize,
    make: impl FnOnce(&Texts) -> Option<K>,
) -> Result<&'static K> {
    let mut kernels = made.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((_, _, k)) = kernels.iter().find(|(n, s, _)| *n == source.name && *s == shared) {
        return Ok(k);
    }
    // SAFETY: the vectors are made, filled with copies of the names, and freed once `make`,
    // whose constructor copies them, returns.
    let k = unsafe {
        let [inputs, outputs] = [source.inputs, source.outputs].map(|list| {
            let v = mlx_sys::mlx_vector_string_new();
            for n in list {
                mlx_sys::mlx_vector_string_append_value(v, cstr(n).as_ptr());
            }
            v
        });
        let texts = Texts {
            name: cstr(source.name),
            body: cstr(&minified(source.body)),
            header: cstr(&minified(source.header)),
            inputs,
            outputs,
            contiguous: source.contiguous,
        };
        let k = make(&texts);
        for v in [inputs, outputs] {
            mlx_sys::mlx_vector_string_free(v);
        }
        k
    };
    let Some(k) = k else { return fail!(Backend, "MLX could not make the kernel {}", source.name) };
    let k: &'static K = Box::leak(Box::new(k));
    kernels.push((source.name, shared, k));
    Ok(k)
}

/// One launch: output shapes and dtypes, grid and block in threads, template arguments.
pub(crate) struct Launch<'a> {
    pub outputs: &'a [(&'a [i32], Dtype)],
    pub grid: [i32; 3],
    pub block: [i32; 3],
    pub ints: &'a [(&'a str, i32)],
    pub bools: &'a [(&'a str, bool)],
}

/// A kernel's process-wide switch (on by default; benchmarks turn it off to compare with MLX's
/// ops side by side) and how many times it has been chosen (tests check that it ran). Each
/// kernel of each backend has its own, so a launch counts for the kernel that ran and no other.
pub struct Switch {
    enabled: AtomicBool,
    launches: AtomicUsize,
}

impl Switch {
    pub(crate) const fn new() -> Self {
        Switch { enabled: AtomicBool::new(true), launches: AtomicUsize::new(0) }
    }

    /// A switch that is off until turned on (a form not yet the default).
    pub(crate) const fn off() -> Self {
        Switch { enabled: AtomicBool::new(false), launches: AtomicUsize::new(0) }
    }

    #[doc(hidden)]
    pub fn set_enabled(&self, enabled: bool) {
        self.enabled.store(enabled, Ordering::SeqCst);
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    #[doc(hidden)]
    pub fn launches(&self) -> usize {
        self.launches.load(Ordering::SeqCst)
    }

    pub(crate) fn launched(&self) {
        self.launches.fetch_add(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::minified;

    /// `minified` reads `//` comments and string literals alone: every kernel source keeps to
    /// what it handles (no block comments, no character literals, no comment continued by a
    /// trailing backslash), so minifying never changes a source's meaning.
    #[test]
    fn every_kernel_source_keeps_to_what_minified_handles() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/core/kernels");
        let mut checked = 0;
        for backend in ["cuda/src", "metal/src"] {
            for entry in std::fs::read_dir(root.join(backend)).unwrap() {
                let path = entry.unwrap().path();
                let text = std::fs::read_to_string(&path).unwrap();
                let name = path.display();
                assert!(!text.contains("/*"), "{name}: a block comment");
                for (i, line) in text.lines().enumerate() {
                    let code = super::without_comment(line);
                    assert!(!code.contains('\''), "{name}:{}: a character literal", i + 1);
                    let comment = line.len() != code.len();
                    assert!(!(comment && line.trim_end().ends_with('\\')), "{name}:{}: a comment continued", i + 1);
                }
                checked += 1;
            }
        }
        assert!(checked >= 20, "the kernel sources were found ({checked})");
    }

    #[test]
    fn minified_keeps_code_and_drops_comments_indentation_and_blank_lines() {
        let source = "//! A kernel.\n\n  #define A(x) \"a//b\" \\\n    x // the value\n\n  const int y = 1;  // one\n    asm(\"{%0}\\n\" :: \"r\"(y)); // \"quoted\"\n";
        assert_eq!(minified(source), "#define A(x) \"a//b\" \\\nx\nconst int y = 1;\nasm(\"{%0}\\n\" :: \"r\"(y));\n");
    }
}
