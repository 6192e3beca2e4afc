//! The steps of a tranche's life, one module each, every one run under the tranche's lease.

pub(crate) mod clean;
pub(crate) mod collect;
pub(crate) mod create;
pub(crate) mod ingest;
pub(crate) mod input;
pub(crate) mod plan;
pub(crate) mod poll;
pub(crate) mod upload;
