//! Online DDL: censuses before constraints, watched CONCURRENTLY builds with INVALID-index
//! hygiene, and VALIDATE CONSTRAINT once a NOT VALID check's census is zero.

pub mod catalog;
pub mod census;
pub mod evaluate;
pub mod index;
pub mod parallel;
pub mod validate;
