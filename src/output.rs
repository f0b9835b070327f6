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
//!
//! Standard error, too: every line pgmend writes there goes through [`say`] (the `say!` macro)
//! or [`event`]. With `--progress json` (`set_json_lines`) each becomes one JSON object on one
//! line, as docs/progress.schema.json describes: `v` (1), `time` (UTC, RFC 3339, milliseconds),
//! `event` (`message`, `step_started`, `step_done`, `progress`, `stopped`, `error`), `level`
//! (`info`, `warning`, `error`), `message` (the human line, whole), and the event's own fields.

use std::io::{self, StdoutLock, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{json, Value};

static CLOSED: AtomicBool = AtomicBool::new(false);
static JSON_LINES: AtomicBool = AtomicBool::new(false);

/// The version of the JSON-lines schema (docs/progress.schema.json).
pub const JSON_LINES_VERSION: u32 = 1;

/// `--progress json`: every stderr line from here on is a JSON object.
pub fn set_json_lines(on: bool) {
    JSON_LINES.store(on, Ordering::Relaxed);
}

/// Whether stderr carries JSON lines (then no progress bar is drawn).
pub fn json_lines() -> bool {
    JSON_LINES.load(Ordering::Relaxed)
}

/// A line for people on stderr: as it is, or as a `message` event. Its level is read from its
/// start (`warning:`, `pgmend: error:` and the like); a write that fails is ignored (a closed
/// stderr must not end a release halfway).
pub fn say(text: &str) {
    if json_lines() {
        let lower = text.trim_start().to_ascii_lowercase();
        let level = if lower.starts_with("warning")
            || lower.starts_with("server warning")
            || lower.contains(": warning")
        {
            "warning"
        } else if lower.starts_with("pgmend: error") || lower.starts_with("server error") {
            "error"
        } else {
            "info"
        };
        emit("message", level, text, json!({}));
    } else {
        let _ = writeln!(io::stderr(), "{text}");
    }
}

/// An event on stderr with its own fields (`fields`, a JSON object): the human line `text` as
/// it is, or one JSON object.
pub fn event(event: &str, text: &str, fields: Value) {
    if json_lines() {
        let level = match event {
            "error" => "error",
            "stopped" => "warning",
            _ => "info",
        };
        emit(event, level, text, fields);
    } else {
        let _ = writeln!(io::stderr(), "{text}");
    }
}

fn emit(event: &str, level: &str, text: &str, fields: Value) {
    let mut line = json!({
        "v": JSON_LINES_VERSION,
        "time": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "event": event,
        "level": level,
        "message": text.trim_start_matches('\n'),
    });
    if let (Some(line), Value::Object(fields)) = (line.as_object_mut(), fields) {
        line.extend(fields);
    }
    // One write of the whole line: lines from several threads never interleave.
    let _ = io::stderr().write_all(format!("{line}\n").as_bytes());
}

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
