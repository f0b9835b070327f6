//! No wait on the server without a deadline that pgmend enforces itself.
//!
//! A network path can go silent without closing (a hung proxy, a stalled port-forward or NAT
//! entry, a database proxy that stops answering): the bytes stop, neither socket closes, and a
//! read would wait forever. TCP keepalives and `tcp_user_timeout` (set in `connect`) catch a
//! peer that stops acknowledging, not a proxy that still does. So every pgmend connection runs
//! over [`Watched`], a wrapper of its socket that fails the connection, as if the network had
//! dropped it, once the server has sent nothing for longer than the wait allows while pgmend
//! waits for it. The synchronous `postgres` client drives its connection on the calling thread,
//! so the wrapper reads the bound from that thread: [`SESSION_BOUND`] by default (the session's
//! `statement_timeout` of 10 minutes plus [`MARGIN`]: with a live path the server always answers
//! by then), tighter while a guard from [`within`] lives (a transaction under `--statement-timeout`
//! is bounded by it plus the margin), none while a guard from [`unbounded`] lives (an online
//! build, whose watcher bounds it by its progress instead).
//!
//! Why a wrapper of the socket and not a watchdog per call: the `postgres` client has no
//! per-call timeout and pgmend calls it in hundreds of places; a thread that abandons a call
//! would leave the connection mid-protocol. The wrapper sees every byte in both directions and
//! needs no change to any call. It costs one clock read per read or write. The `postgres` crate
//! has no way to open a client over a socket of one's own, so pgmend builds on a vendored copy
//! with that one function added (vendor/README.md).
//!
//! When the deadline passes the connection fails with [`SilentPath`] inside an `io::Error` of
//! kind `TimedOut`, which says what may still be held on the server and until when; every later
//! read or write of that connection fails the same way at once, and a session's close waits
//! [`CLOSE_BOUND`] at most.

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What a bound adds to the server-side timeout it is derived from: time for the server to
/// notice the timeout, cancel, and send its error over a slow link.
pub const MARGIN: Duration = Duration::from_secs(30);

/// The bound outside any guard: the session's `statement_timeout` (10 minutes, see
/// `SESSION_SETTINGS`) plus [`MARGIN`].
pub const SESSION_BOUND: Duration = Duration::from_secs(600 + 30);

thread_local! {
    /// `None`: unbounded. Read by [`Watched`] on the thread that drives the connection.
    static BOUND: Cell<Option<Duration>> = const { Cell::new(Some(SESSION_BOUND)) };
}

/// How long closing a connection waits for the server to hang up after pgmend's goodbye.
pub const CLOSE_BOUND: Duration = Duration::from_secs(2);

/// A session's last field: [`Closing::begin`], called from the session's `Drop`, bounds the
/// thread's waits by [`CLOSE_BOUND`] while the fields before it drop (the client's close waits
/// for the server to hang up, which on a silent path it never does), and this restores the
/// thread's bound when it drops in turn.
#[derive(Default)]
pub struct Closing {
    previous: Option<Option<Duration>>,
}

impl Closing {
    pub fn begin(&mut self) {
        self.previous = Some(BOUND.with(|b| b.replace(Some(CLOSE_BOUND))));
    }
}

impl Drop for Closing {
    fn drop(&mut self) {
        if let Some(previous) = self.previous.take() {
            BOUND.with(|b| b.set(previous));
        }
    }
}

/// Restores the thread's previous bound when dropped.
#[must_use = "the bound holds only while the guard lives"]
pub struct Guard {
    previous: Option<Duration>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        BOUND.with(|b| b.set(self.previous));
    }
}

fn set(bound: Option<Duration>) -> Guard {
    Guard {
        previous: BOUND.with(|b| b.replace(bound)),
    }
}

/// While the guard lives, a wait on the server on this thread lasts at most `timeout` (the
/// server-side timeout of what is waited for) plus [`MARGIN`].
pub fn within(timeout: Duration) -> Guard {
    set(Some(timeout + MARGIN))
}

/// While the guard lives, a wait on the server on this thread lasts at most `bound`: for a
/// statement pgmend knows to be instant (a heartbeat).
pub fn at_most(bound: Duration) -> Guard {
    set(Some(bound))
}

/// While the guard lives, waits on this thread have no client-side bound: for a statement
/// that runs with no server-side timeout and is watched from elsewhere.
pub fn unbounded() -> Guard {
    set(None)
}

/// The bound in force on this thread (`None`: unbounded).
pub fn current() -> Option<Duration> {
    BOUND.with(Cell::get)
}

/// The error a silent path ends a connection with. It says what may still be held on the
/// server and until when, since nothing else in the error's chain can.
#[derive(Debug, thiserror::Error)]
#[error(
    "the server sent nothing for {} while pgmend waited for it (the bound of this wait: {}): the network path to the server went silent (a hung proxy, port-forward or NAT entry), so pgmend gave this connection up. What may still be held on the server: a transaction of this connection and its row and table locks until the server ends it, {} s after its last statement (idle_in_transaction_session_timeout), or when a statement still running there reaches its statement_timeout; pgmend's runner lock until its lease runs out, {} s after the last heartbeat that reached the server. Each committed batch and step is complete; a rerun continues from there once the path is back (`--runner-wait 2m` waits for the old lease)",
    crate::config::format_duration(*.waited),
    crate::config::format_duration(*.bound),
    crate::config::IDLE_IN_TRANSACTION.as_secs(),
    crate::config::LEASE.as_secs()
)]
pub struct SilentPath {
    pub waited: Duration,
    pub bound: Duration,
}

/// Whether `error` (anywhere in its chain) is a connection given up by [`Watched`].
pub fn is_silent_path(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(c) = cause {
        if c.downcast_ref::<SilentPath>().is_some() {
            return true;
        }
        if let Some(io) = c.downcast_ref::<io::Error>() {
            if io.get_ref().is_some_and(|inner| inner.is::<SilentPath>()) {
                return true;
            }
        }
        cause = c.source();
    }
    false
}

/// Wakes the connection's task and records that the deadline's timer fired. A timer armed at
/// the end of one call can only fire while the runtime runs, that is during a later call: so
/// a deadline found past without the timer having fired means the client was not waiting in
/// between (a person at a prompt, client-side work), and the wait starts afresh.
#[derive(Default)]
struct TimerWake {
    fired: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Wake for TimerWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.fired.store(true, Ordering::SeqCst);
        if let Some(w) = self.waker.lock().unwrap_or_else(|e| e.into_inner()).take() {
            w.wake();
        }
    }
}

/// A socket whose reads fail once the server has been silent past the thread's bound while
/// the client waited for it.
pub struct Watched<S> {
    inner: S,
    /// When the server was last heard from or written to (or the current wait began, when
    /// that was later): the start of the silence a wait measures.
    since: Option<Instant>,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    wake: Arc<TimerWake>,
    /// Set once the deadline has passed: the connection is given up for good, and every later
    /// read or write fails at once (the client's close would otherwise wait on it again).
    gave_up: Option<(Duration, Duration)>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for Watched<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watched")
            .field("inner", &self.inner)
            .field("since", &self.since)
            .finish_non_exhaustive()
    }
}

impl<S> Watched<S> {
    pub fn new(inner: S) -> Watched<S> {
        Watched {
            inner,
            since: None,
            timer: None,
            wake: Arc::default(),
            gave_up: None,
        }
    }

    /// The error of a connection given up, for every read and write after the first.
    fn given_up(&self) -> Option<io::Error> {
        self.gave_up.map(|(waited, bound)| {
            io::Error::new(io::ErrorKind::TimedOut, SilentPath { waited, bound })
        })
    }

    /// Arms the timer for `deadline`, with a fresh fired flag.
    fn arm(&mut self, deadline: Instant) {
        self.wake.fired.store(false, Ordering::SeqCst);
        let deadline = tokio::time::Instant::from_std(deadline);
        match &mut self.timer {
            Some(timer) => timer.as_mut().reset(deadline),
            None => self.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
        }
    }

    /// On a read that would wait: the error once the bound has passed in a real wait,
    /// otherwise `Pending` with the timer set for the deadline.
    fn waiting(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Some(bound) = current() else {
            self.since = None;
            return Poll::Pending;
        };
        let now = Instant::now();
        let since = match self.since {
            Some(since) if now < since + bound => since,
            Some(since) if self.wake.fired.load(Ordering::SeqCst) => {
                self.gave_up = Some((now - since, bound));
                return Poll::Ready(Err(self.given_up().expect("just set")));
            }
            // Past the deadline without the timer firing: nobody was waiting; start afresh.
            _ => {
                self.since = Some(now);
                now
            }
        };
        if self
            .timer
            .as_ref()
            .is_none_or(|t| t.deadline().into_std() != since + bound)
        {
            self.arm(since + bound);
        }
        *self.wake.waker.lock().unwrap_or_else(|e| e.into_inner()) = Some(cx.waker().clone());
        let flagged = Waker::from(self.wake.clone());
        let mut timer_cx = Context::from_waker(&flagged);
        if let Some(timer) = &mut self.timer {
            if timer.as_mut().poll(&mut timer_cx).is_ready() {
                self.wake.fired.store(true, Ordering::SeqCst);
                cx.waker().wake_by_ref();
            }
        }
        Poll::Pending
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(e) = this.given_up() {
            return Poll::Ready(Err(e));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.since = Some(Instant::now());
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.waiting(cx),
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(e) = this.given_up() {
            return Poll::Ready(Err(e));
        }
        let written = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = written {
            if n > 0 {
                this.since = Some(Instant::now());
            }
        }
        written
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_nest_and_restore_the_bound() {
        assert_eq!(current(), Some(SESSION_BOUND));
        {
            let _tight = within(Duration::from_secs(60));
            assert_eq!(current(), Some(Duration::from_secs(90)));
            {
                let _none = unbounded();
                assert_eq!(current(), None);
            }
            assert_eq!(current(), Some(Duration::from_secs(90)));
        }
        assert_eq!(current(), Some(SESSION_BOUND));
    }

    /// A socket pair where the far end never answers: a read through `Watched` fails with
    /// `SilentPath` once the bound has passed, and not before.
    #[test]
    fn a_silent_peer_fails_the_read_after_the_bound() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _bound = set(Some(Duration::from_millis(300)));
        runtime.block_on(async {
            let (near, mut far) = tokio::net::UnixStream::pair().unwrap();
            let mut watched = Watched::new(near);
            watched.write_all(b"ping").await.unwrap();
            let started = Instant::now();
            let mut byte = [0u8; 1];
            let error = watched.read(&mut byte).await.unwrap_err();
            let waited = started.elapsed();
            assert_eq!(error.kind(), io::ErrorKind::TimedOut);
            assert!(is_silent_path(&error), "{error}");
            assert!(waited >= Duration::from_millis(290), "{waited:?}");
            assert!(waited < Duration::from_secs(3), "{waited:?}");
            // A peer that answers within the bound is read normally.
            let (near, mut far2) = tokio::net::UnixStream::pair().unwrap();
            let mut watched = Watched::new(near);
            far2.write_all(b"x").await.unwrap();
            assert_eq!(watched.read(&mut byte).await.unwrap(), 1);
            let mut sink = [0u8; 4];
            far.read_exact(&mut sink).await.unwrap();
        });
    }
}
