//! The connection layer: connection parameters, the session, the runner lock, bounded lock
//! waits, the SQL text types every statement pgmend builds goes through (`sql_text`), and
//! whether the application is at work and pgmend crowds it out of the CPUs (`crowding`), and
//! whole-table sums read apart so that the server may run them in parallel (`staged`). The
//! pre-flight and the privilege check sit above it, in `crate::preflight`. Not the only layer
//! that talks to PostgreSQL: ARCHITECTURE.md lists the modules that hold SQL.

pub mod connect;
pub mod conninfo;
pub mod crowding;
pub mod deadline;
pub mod retry;
pub mod runner_lock;
pub mod sql_text;
pub mod staged;

pub use connect::{connect, Session};
