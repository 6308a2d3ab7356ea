//! The prefix store (`core::store`, `ffi/store.rs`): puts and restores against the reference
//! model in every storage mode and both layouts (`roundtrip`), an agent conversation of 50
//! turns that branches and restarts (`conversation`), damaged and planted folders (`hostile`),
//! a writer killed mid-write and two processes sharing one folder (`processes`). The engine
//! here (`engine`) derives each position's values from the tokens up to it, as a model does,
//! so any restore can be checked against the tokens alone.
#[path = "../common/mod.rs"]
mod common;

mod conversation;
mod engine;
mod hostile;
mod processes;
mod roundtrip;
mod threads;
