//! The connection layer: connection parameters, the session, the pre-flight and privilege
//! checks, the runner lock, bounded lock waits. Not (yet) the only layer that talks to
//! PostgreSQL: ARCHITECTURE.md lists where SQL lives today.

pub mod connect;
pub mod conninfo;
pub mod retry;
pub mod runner_lock;
pub mod sql_text;

pub use connect::{connect, Session};
