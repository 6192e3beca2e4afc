//! One module per subcommand.

pub mod cancel;
pub mod cost;
pub mod demo;
pub mod files;
pub mod migrate;
pub mod prune;
pub mod reparse;
pub mod results;
pub mod review;
pub mod run;
pub mod serve;
pub mod sim;
pub mod status;
pub mod tenants;
pub mod worker;
