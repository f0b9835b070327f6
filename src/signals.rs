//! Stop requests: SIGINT (Ctrl-C), SIGTERM and SIGHUP ask a writing command to stop cleanly.
//!
//! The first signal only records the request: the batch loop, the release's step loop and
//! the watcher of an online statement look at [`requested`] and wind down (the batch in
//! flight commits or rolls back whole, an online build is cancelled and its INVALID index
//! dropped, the guard trigger dropped), each clean-up statement giving up at
//! [`cleanup_deadline`]. Whatever is still under way [`CLEANUP_LIMIT`] after the signal is
//! cut short: pgmend says what may be left and exits 1. A second signal ends pgmend at once
//! with 128 + its number (130, 143, 129) after the same report. Parts of pgmend that leave
//! something behind if the process ends mid-way ([`leave`]) say so here, and say when it is
//! gone ([`cleaned`]), so that the report names exactly what is left.
//!
//! Every line written here goes through [`say!`](crate::say): after SIGHUP from a closed
//! terminal stderr fails, and the stop must go on regardless.
//!
//! Stop requests. `install(resume)` (once per process, from `apply`, `migrate apply` and `repair
//! apply` once they start working) starts a `signal-hook` iterator thread for SIGINT, SIGTERM and
//! SIGHUP; `resume` is the command that continues. The first signal is recorded (`requested()`
//! returns it), announced, and starts a watchdog that exits 1 after `CLEANUP_LIMIT` (20 s);
//! `cleanup_deadline()` (3 s earlier) is when lock retries stop and clean-up statements are
//! cancelled. A second signal exits at once with 128 + its number. Code that leaves something
//! behind if the process ends mid-way says so with `leave(key, text)` and `cleaned(key)` (the guard
//! in `repair::guard`, an online build in `online::index`), so the watchdog, the second signal and
//! `main` report exactly what is left and how the next run removes it. `check(what)` is the
//! `Stopped` error of a loop that must not start its next item.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// From the first signal to pgmend's exit, at most (Kubernetes waits 30 s before SIGKILL).
pub const CLEANUP_LIMIT: Duration = Duration::from_secs(20);
/// Clean-up statements give up this long before [`CLEANUP_LIMIT`], leaving time to report.
const REPORT_MARGIN: Duration = Duration::from_secs(3);

/// What becomes of a transaction in flight when pgmend ends mid-way: not always at once, since
/// a statement still waiting may be waiting on a silent network path.
fn in_flight() -> String {
    format!(
        "A batch in flight is rolled back by the server: at once when it sees the connection close; if the network path to it is silent, when the transaction has idled {} s (idle_in_transaction_session_timeout) or a statement still running there reaches its statement_timeout. pgmend's runner lock is released with its lease, at most {} s after the last heartbeat that reached the server.",
        crate::config::IDLE_IN_TRANSACTION.as_secs(),
        crate::config::LEASE.as_secs()
    )
}

/// Writes one line to stderr, ignoring a closed or failing stderr.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        $crate::output::say(&format!($($arg)*));
    }};
}

/// The signals that ask for a stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Interrupt,
    Terminate,
    Hangup,
}

impl Signal {
    fn from_raw(raw: i32) -> Option<Signal> {
        match raw {
            signal_hook::consts::SIGINT => Some(Signal::Interrupt),
            signal_hook::consts::SIGTERM => Some(Signal::Terminate),
            signal_hook::consts::SIGHUP => Some(Signal::Hangup),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Signal::Interrupt => "SIGINT",
            Signal::Terminate => "SIGTERM",
            Signal::Hangup => "SIGHUP",
        }
    }

    /// The shell's code for a process ended by this signal: 128 + its number.
    pub fn exit_code(self) -> i32 {
        128 + match self {
            Signal::Interrupt => signal_hook::consts::SIGINT,
            Signal::Terminate => signal_hook::consts::SIGTERM,
            Signal::Hangup => signal_hook::consts::SIGHUP,
        }
    }
}

#[derive(Default)]
struct State {
    first: Option<(Signal, Instant)>,
    /// The command that continues the work, for the messages.
    resume: String,
    /// What a process ending now would leave: (key, description), in the order it arose.
    leftovers: Vec<(String, String)>,
}

static STATE: Mutex<State> = Mutex::new(State {
    first: None,
    resume: String::new(),
    leftovers: Vec::new(),
});

fn state() -> MutexGuard<'static, State> {
    STATE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Handles SIGINT, SIGTERM and SIGHUP from now on (once per process; a later call only
/// changes `resume`, the command that continues the work).
pub fn install(resume: &str) {
    state().resume = resume.to_string();
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        let mut signals = match signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) {
            Ok(s) => s,
            Err(e) => {
                say!("pgmend: could not install the signal handler ({e}); a signal ends pgmend at once");
                return;
            }
        };
        std::thread::spawn(move || {
            for raw in signals.forever() {
                if let Some(signal) = Signal::from_raw(raw) {
                    received(signal);
                }
            }
        });
    });
}

fn received(signal: Signal) {
    let first = {
        let mut s = state();
        if s.first.is_none() {
            s.first = Some((signal, Instant::now()));
            true
        } else {
            false
        }
    };
    if !first {
        ended(
            "error",
            &format!(
                "pgmend: {} again: stopping at once; {} {}",
                signal.name(),
                in_flight(),
                left_behind()
            ),
            signal.exit_code(),
        );
    }
    let notice = || {
        say!(
            "pgmend: {}: stopping cleanly: the current batch commits or rolls back whole, an online build is cancelled and its INVALID index dropped, a guard trigger is dropped (at most {} s; a second signal stops at once)",
            signal.name(),
            CLEANUP_LIMIT.as_secs()
        )
    };
    // Written on the bar's own line, the bar's next redraw would draw over the notice.
    match drawing() {
        Some(bar) => bar.suspend(notice),
        None => notice(),
    }
    std::thread::spawn(move || {
        std::thread::sleep(CLEANUP_LIMIT);
        ended(
            "stopped",
            &format!(
                "pgmend: stopped: the clean-up after {} did not end within {} s; stopping now. {} {}",
                signal.name(),
                CLEANUP_LIMIT.as_secs(),
                in_flight(),
                left_behind()
            ),
            1,
        );
    });
}

/// The last line of a process that ends here, outside `main` (an `error` or `stopped` event
/// with its exit code, for `--progress json`), then the exit.
fn ended(event: &str, text: &str, code: i32) -> ! {
    crate::output::event(event, text, serde_json::json!({ "exit_code": code }));
    std::process::exit(code);
}

/// The progress bar on the terminal now, if any: the stop notice is written above it.
static BAR: Mutex<Option<indicatif::ProgressBar>> = Mutex::new(None);

fn drawing() -> Option<indicatif::ProgressBar> {
    BAR.lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone()
}

/// Says which progress bar is on the terminal (None: none any more), so that the stop notice
/// is written above it instead of on its line.
pub fn draws(bar: Option<&indicatif::ProgressBar>) {
    *BAR.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = bar.cloned();
}

/// The signal that asked for a stop, if one did.
pub fn requested() -> Option<Signal> {
    state().first.map(|(signal, _)| signal)
}

/// When clean-up statements give up, once a stop was requested.
pub fn cleanup_deadline() -> Option<Instant> {
    state()
        .first
        .map(|(_, at)| at + CLEANUP_LIMIT - REPORT_MARGIN)
}

impl State {
    /// The command that continues the work (`pgmend apply --yes` before any command
    /// installed the handler).
    fn resume(&self) -> String {
        if self.resume.is_empty() {
            "pgmend apply --yes".to_string()
        } else {
            self.resume.clone()
        }
    }

    fn leftovers(&self) -> Option<String> {
        if self.leftovers.is_empty() {
            return None;
        }
        let list: Vec<&str> = self.leftovers.iter().map(|(_, w)| w.as_str()).collect();
        Some(list.join("; "))
    }
}

/// The command that continues the work.
pub fn resume_command() -> String {
    state().resume()
}

/// A stop error when a stop was requested: "SIGTERM received before {what}".
pub fn check(what: &str) -> anyhow::Result<()> {
    match requested() {
        Some(signal) => Err(crate::error::Stopped::error(format!(
            "{} received; stopped before {what}. Continue with: {}",
            signal.name(),
            resume_command()
        ))),
        None => Ok(()),
    }
}

/// Records that ending the process now would leave `what` behind (under `key`, for
/// [`cleaned`]).
pub fn leave(key: &str, what: String) {
    let mut s = state();
    s.leftovers.retain(|(k, _)| k != key);
    s.leftovers.push((key.to_string(), what));
}

/// `key` no longer needs cleaning.
pub fn cleaned(key: &str) {
    state().leftovers.retain(|(k, _)| k != key);
}

/// What ending the process now leaves and how it is cleaned, and the command that continues.
fn left_behind() -> String {
    let s = state();
    match s.leftovers() {
        Some(list) => format!("Left behind: {list}. Continue with: {}", s.resume()),
        None => format!("Nothing else is left behind. Continue with: {}", s.resume()),
    }
}

/// For a command with nothing to wind down (the demo, whose throwaway server a watchdog
/// removes): on SIGINT, SIGTERM or SIGHUP, says `notice(signal)` and exits at once with
/// 128 + the signal's number.
pub fn exit_on_signal(notice: impl Fn(Signal) -> String + Send + 'static) {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) else {
        return; // the default action then ends pgmend, without a word
    };
    std::thread::spawn(move || {
        if let Some(signal) = signals.forever().next().and_then(Signal::from_raw) {
            ended("error", &notice(signal), signal.exit_code());
        }
    });
}

/// Ends pgmend with exit 2 when it has lost its lease on the runner lock and the run did not
/// stop by itself within the grace the lease gives it (a statement still waits on a server
/// that pgmend can no longer reach): says why, what may still be held, and how to continue.
pub fn exit_lease_lost(why: &str) -> ! {
    ended(
        "error",
        &format!(
            "pgmend: error: stopped: {why}. {} {}",
            in_flight(),
            left_behind()
        ),
        2,
    )
}

/// What is still left behind, for the end of a stop: `None` when nothing is.
pub fn leftovers() -> Option<String> {
    state()
        .leftovers()
        .map(|list| format!("left behind: {list}"))
}

#[cfg(test)]
mod tests {
    use super::Signal;

    #[test]
    fn exit_codes_are_the_shells() {
        assert_eq!(Signal::Interrupt.exit_code(), 130);
        assert_eq!(Signal::Terminate.exit_code(), 143);
        assert_eq!(Signal::Hangup.exit_code(), 129);
    }
}
