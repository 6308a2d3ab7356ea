//! A layer's geometry: the widths of its state families and its position limit, plus the numbers
//! derived from them (bytes per token, signature).
use crate::core::error::{fail, Result};
use crate::core::layout::row_layout::LayoutKind;
use crate::core::model::storage_mode::StorageMode;

/// The three state families an MLA layer stores per position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// The compressed KV latent, `kv_lora_rank` wide.
    Latent,
    /// The decoupled RoPE key, `rope_head_dim` wide.
    Rope,
    /// The DSA index key, `index_head_dim` wide; only on sparse-attention layers.
    IndexKeys,
}

impl Family {
    pub const ALL: [Family; 3] = [Family::Latent, Family::Rope, Family::IndexKeys];

    pub fn name(self) -> &'static str {
        match self {
            Family::Latent => "latent",
            Family::Rope => "rope",
            Family::IndexKeys => "index_keys",
        }
    }
}

/// Which model layer a cache serves: a target-model layer, or GLM-5.2's multi-token-prediction
/// (MTP) layer, which keeps its own MLA cache and never has index keys.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Role {
    #[default]
    Target,
    Mtp,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Geometry {
    pub kv_lora_rank: usize,
    pub rope_head_dim: usize,
    /// 0 for a layer without DSA index keys.
    pub index_head_dim: usize,
    /// 0 for unbounded.
    pub max_tokens: usize,
    /// How each family is stored (`F32`, the default, is exact). The index keys' mode is
    /// ignored on a layer without them.
    pub latent_storage: StorageMode,
    pub rope_storage: StorageMode,
    pub index_storage: StorageMode,
    /// How rows sit in the stored window (right-justified, the default, or ragged).
    pub layout: LayoutKind,
    pub role: Role,
    /// Composed storage (see `composed`): the newest `hot_window` positions of every row are
    /// read in `hot_storage`, older ones in their family's compact mode. 0: not composed.
    pub hot_window: usize,
    /// The float mode of the hot positions (`F32`, `Bf16` or `F16`); ignored when `hot_window`
    /// is 0.
    pub hot_storage: StorageMode,
}

/// The widest family a layer may have: 2^20 values (4 MiB per position of one row). Real MLA
/// widths are hundreds; the bound keeps one position of one row far inside a single
/// allocation, whatever the memory limit.
pub(crate) const MAX_WIDTH: usize = 1 << 20;

/// Position limits beyond this cannot be expressed as MLX's int32 shapes.
pub(crate) const MAX_TOKENS: usize = i32::MAX as usize;

impl Geometry {
    pub fn validate(&self) -> Result<()> {
        if self.kv_lora_rank == 0 || self.rope_head_dim == 0 {
            return fail!(
                InvalidArgument,
                "kv_lora_rank ({}) and rope_head_dim ({}) must be at least 1",
                self.kv_lora_rank,
                self.rope_head_dim
            );
        }
        for (name, value, max) in [
            ("kv_lora_rank", self.kv_lora_rank, MAX_WIDTH),
            ("rope_head_dim", self.rope_head_dim, MAX_WIDTH),
            ("index_head_dim", self.index_head_dim, MAX_WIDTH),
            ("max_tokens", self.max_tokens, MAX_TOKENS),
        ] {
            if value > max {
                return fail!(InvalidArgument, "{name} ({value}) exceeds {max}");
            }
        }
        for family in Family::ALL {
            if let Some(width) = self.width(family) {
                self.storage(family).check_width(family.name(), width)?;
            }
        }
        if self.role == Role::Mtp && self.has_index_keys() {
            return fail!(InvalidArgument, "an MTP layer has no DSA index keys (set index_head_dim to 0)");
        }
        self.validate_composed()
    }

    /// Refuses a composition the library cannot hold: a hot mode that is not a float mode, a
    /// family more precise than its hot positions, or nothing to compose.
    fn validate_composed(&self) -> Result<()> {
        if self.hot_window == 0 {
            return Ok(());
        }
        if self.hot_window > MAX_TOKENS {
            return fail!(InvalidArgument, "hot_window ({}) exceeds {MAX_TOKENS}", self.hot_window);
        }
        if !self.hot_storage.is_float() {
            return fail!(InvalidArgument, "hot_storage must be f32, bf16 or f16, got {}", self.hot_storage.name());
        }
        let hot_bits = self.hot_storage.bits();
        for family in Family::ALL {
            let Some(_) = self.width(family) else { continue };
            let mode = self.storage(family);
            if mode != self.hot_storage && mode.is_float() && mode.bits() >= hot_bits {
                return fail!(
                    InvalidArgument,
                    "{} storage {} is not more compact than hot_storage {}",
                    family.name(),
                    mode.name(),
                    self.hot_storage.name()
                );
            }
        }
        if !Family::ALL.iter().any(|&f| self.is_composed(f)) {
            return fail!(
                InvalidArgument,
                "hot_window is set but every family is stored as hot_storage ({}): nothing to compose",
                self.hot_storage.name()
            );
        }
        Ok(())
    }

    /// Whether `family` is composed: present, `hot_window` set, and stored in a mode other than
    /// the hot one.
    pub fn is_composed(&self, family: Family) -> bool {
        self.hot_window > 0 && self.width(family).is_some() && self.storage(family) != self.hot_storage
    }

    /// Whether any family is composed.
    pub fn composed(&self) -> bool {
        Family::ALL.iter().any(|&f| self.is_composed(f))
    }

    /// How `family` is stored.
    pub fn storage(&self, family: Family) -> StorageMode {
        match family {
            Family::Latent => self.latent_storage,
            Family::Rope => self.rope_storage,
            Family::IndexKeys => self.index_storage,
        }
    }

    pub fn has_index_keys(&self) -> bool {
        self.index_head_dim > 0
    }

    /// The width of a family, or `None` for index keys on a layer without DSA.
    pub fn width(&self, family: Family) -> Option<usize> {
        match family {
            Family::Latent => Some(self.kv_lora_rank),
            Family::Rope => Some(self.rope_head_dim),
            Family::IndexKeys => self.has_index_keys().then_some(self.index_head_dim),
        }
    }

    /// Bytes one position of one row occupies, in every family's storage mode.
    pub fn bytes_per_token(&self) -> usize {
        Family::ALL.iter().filter_map(|&family| Some(self.storage(family).bytes_per_position(self.width(family)?))).sum()
    }

    /// The storage modes of this layer's families, `latent/rope[/index_keys]`.
    pub fn storage_names(&self) -> String {
        let mut names = format!("{}/{}", self.latent_storage.name(), self.rope_storage.name());
        if self.has_index_keys() {
            names = format!("{names}/{}", self.index_storage.name());
        }
        names
    }

    /// The storage kind, in the seed's grammar (`kv:<kind>[:<parameters>]`, a wrapper's kind in
    /// front of the kind it wraps), so string-compare predicates written for the seed's caches
    /// work: `kv:mla:target`, `kv:mla:target:dsa` or `kv:mla:mtp` for float32 storage; compact
    /// storage wraps that as `kv:mla-storage:<latent>-<rope>[-<index>]:<inner>`, and the ragged
    /// layout wraps the result as `kv:ragged:<inner>`; composed storage wraps the compact kind as
    /// `kv:composed:<hot mode>:<hot_window>:<inner>` (inside `kv:ragged:`). Widths and limits are not part of it:
    /// compatibility checks compare the whole geometry (see `describe`).
    pub fn signature(&self) -> String {
        let mut kind = match (self.role, self.has_index_keys()) {
            (Role::Mtp, _) => "kv:mla:mtp".to_string(),
            (Role::Target, true) => "kv:mla:target:dsa".to_string(),
            (Role::Target, false) => "kv:mla:target".to_string(),
        };
        let modes = [self.latent_storage, self.rope_storage, self.index_storage];
        let used = if self.has_index_keys() { &modes[..] } else { &modes[..2] };
        if used.iter().any(|&m| m != StorageMode::F32) {
            let names: Vec<&str> = used.iter().map(|m| m.name()).collect();
            kind = format!("kv:mla-storage:{}:{kind}", names.join("-"));
        }
        if self.composed() {
            kind = format!("kv:composed:{}:{}:{kind}", self.hot_storage.name(), self.hot_window);
        }
        if self.layout == LayoutKind::Ragged {
            kind = format!("kv:ragged:{kind}");
        }
        kind
    }

    /// What a stored position depends on: widths, storage modes and role (not the row layout
    /// nor `max_tokens`, which decide where rows lie, not what a position holds). Two layers of
    /// one stored form hold the same parts for the same positions.
    pub fn stored_form(&self) -> String {
        format!(
            "{};{};{};{};{};{};{:?}",
            self.kv_lora_rank,
            self.rope_head_dim,
            self.index_head_dim,
            self.latent_storage.name(),
            self.rope_storage.name(),
            self.index_storage.name(),
            self.role
        )
    }

    /// Everything two caches must share to exchange rows, for messages.
    pub fn describe(&self) -> String {
        format!(
            "{} (kv_lora_rank {}, rope_head_dim {}, index_head_dim {}, max_tokens {}, storage {})",
            self.signature(),
            self.kv_lora_rank,
            self.rope_head_dim,
            self.index_head_dim,
            self.max_tokens,
            self.storage_names()
        )
    }
}
