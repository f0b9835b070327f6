//! The only layer that talks to PostgreSQL: connecting, the runner lock, bounded lock waits.

pub mod connect;
pub mod conninfo;
pub mod retry;
pub mod runner_lock;

pub use connect::{connect, Session};
