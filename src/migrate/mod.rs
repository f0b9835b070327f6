//! Versioned migrations: the files, the history table, and status, plan, apply and baseline.

pub mod apply;
pub mod baseline;
pub mod history;
pub mod long_locks;
pub mod plan;
pub mod source;
pub mod status;
