//! Errors of the simulator as a library (spawning, serving, configuring). Wire errors live with
//! their provider module, in that provider's JSON shape.

use std::net::SocketAddr;

/// What can go wrong starting or running a simulator.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// The listening socket could not be bound.
    #[error("cannot bind the simulator to {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The HTTP server stopped with an IO error.
    #[error("the simulator's HTTP server failed: {0}")]
    Serve(#[source] std::io::Error),
    /// The server task ended abnormally.
    #[error("the simulator's server task ended abnormally: {0}")]
    Task(String),
    /// A configuration value is out of range.
    #[error("invalid simulator config: {0}")]
    InvalidConfig(String),
    /// The spool folder (where the simulator keeps file contents) could not be created.
    #[error("cannot create the simulator's spool folder: {0}")]
    Spool(#[source] std::io::Error),
}
