//! `Families<T>`: one value per state family (latent, rope, and index keys on DSA layers). Every
//! operation that touches the stored state maps over it, so "all families or none" is a matter
//! of types: a `try_map` either yields a value for every family or fails before anything is
//! committed.
use crate::core::model::geometry::{Family, Geometry};

#[derive(Clone, Debug, Default)]
pub struct Families<T> {
    pub latent: T,
    pub rope: T,
    /// Present exactly on DSA layers.
    pub index_keys: Option<T>,
}

impl<T> Families<T> {
    /// One value per family of `geometry`, made by `f(family, width)`.
    pub fn for_geometry(geometry: &Geometry, mut f: impl FnMut(Family, usize) -> T) -> Self {
        Families {
            latent: f(Family::Latent, geometry.kv_lora_rank),
            rope: f(Family::Rope, geometry.rope_head_dim),
            index_keys: geometry.has_index_keys().then(|| f(Family::IndexKeys, geometry.index_head_dim)),
        }
    }

    pub fn get(&self, family: Family) -> Option<&T> {
        match family {
            Family::Latent => Some(&self.latent),
            Family::Rope => Some(&self.rope),
            Family::IndexKeys => self.index_keys.as_ref(),
        }
    }

    pub fn as_ref(&self) -> Families<&T> {
        Families { latent: &self.latent, rope: &self.rope, index_keys: self.index_keys.as_ref() }
    }

    pub fn as_mut(&mut self) -> Families<&mut T> {
        Families { latent: &mut self.latent, rope: &mut self.rope, index_keys: self.index_keys.as_mut() }
    }

    pub fn map<U>(self, mut f: impl FnMut(Family, T) -> U) -> Families<U> {
        Families {
            latent: f(Family::Latent, self.latent),
            rope: f(Family::Rope, self.rope),
            index_keys: self.index_keys.map(|v| f(Family::IndexKeys, v)),
        }
    }

    /// `map` with a fallible `f`: the first failure is returned and no value is kept.
    pub fn try_map<U, E>(self, mut f: impl FnMut(Family, T) -> Result<U, E>) -> Result<Families<U>, E> {
        Ok(Families {
            latent: f(Family::Latent, self.latent)?,
            rope: f(Family::Rope, self.rope)?,
            index_keys: self.index_keys.map(|v| f(Family::IndexKeys, v)).transpose()?,
        })
    }

    /// Pairs two sets of the same layer (index keys present in both or neither).
    pub fn zip<U>(self, other: Families<U>) -> Families<(T, U)> {
        Families {
            latent: (self.latent, other.latent),
            rope: (self.rope, other.rope),
            index_keys: self.index_keys.zip(other.index_keys),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        [Some(&self.latent), Some(&self.rope), self.index_keys.as_ref()].into_iter().flatten()
    }
}
