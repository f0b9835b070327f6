//! Standard output that a closed pipe cannot break: `pgmend repair log 1 | head` is not an
//! error.
//!
//! Rust ignores SIGPIPE, so a write to a pipe whose reader has gone fails with EPIPE: the
//! command would end with an error (exit 2) or, where the writer does not expect a failure
//! (`clap_complete`), a panic. Resetting SIGPIPE to its default would kill the process
//! instead, losing its exit code. So every result goes through [`stdout`]: its first EPIPE is
//! recorded and from then on every write succeeds without writing, and the command runs to its
//! own outcome (`verify | head -1` still exits 1 when an invariant fails). A command that
//! streams a long result can ask [`closed`] to stop early.

use std::io::{self, StdoutLock, Write};
use std::sync::atomic::{AtomicBool, Ordering};

static CLOSED: AtomicBool = AtomicBool::new(false);

/// Whether the reader of stdout has gone: nothing written from here on is read.
pub fn closed() -> bool {
    CLOSED.load(Ordering::Relaxed)
}

/// The process's stdout, locked, writing nothing once its reader has gone.
pub fn stdout() -> Stdout {
    Stdout(io::stdout().lock())
}

pub struct Stdout(StdoutLock<'static>);

impl Stdout {
    fn unless_closed(
        &mut self,
        op: impl FnOnce(&mut StdoutLock) -> io::Result<()>,
    ) -> io::Result<()> {
        if closed() {
            return Ok(());
        }
        match op(&mut self.0) {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                CLOSED.store(true, Ordering::Relaxed);
                Ok(())
            }
            other => other,
        }
    }
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.unless_closed(|out| out.write_all(buf))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.unless_closed(|out| out.flush())
    }
}
