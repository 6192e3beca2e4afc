//! The store conformance suite against PostgreSQL: a scratch database per check, created on
//! the server `TRANCHE_TEST_POSTGRES` names and dropped when the check ends.

mod common;

tranche_store::store_conformance!(common::fresh);
