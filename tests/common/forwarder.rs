//! A TCP forwarder for fault tests: it sits on the network path between pgmend and the test
//! server and can go silent (no byte passes in either direction, no socket is closed, as with
//! a hung proxy, a stalled port-forward or NAT) and come back later.
//!
//! Plain std threads and blocking sockets: one thread accepts, two per connection copy bytes
//! (client to server, server to client). A copying thread waits while the forwarder is silent
//! both before it reads (so that the kernel's buffers hold what the peer sends) and after each
//! read (a chunk read by a thread that was already blocked in its read when `silence` was
//! called is held until `restore`). An end of stream is passed on (shutdown of the other
//! side's writing) only when not silent, as a real proxy does.
#![allow(dead_code)]

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use pgmend::db::conninfo::ConnParams;

/// Where the forwarder connects each accepted connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A host name or address and a port.
    Tcp(String, u16),
    /// The path of a unix socket, e.g. `/dir/.s.PGSQL.5432`.
    Unix(PathBuf),
}

impl Target {
    /// The server `params` names: its unix socket when the host is an absolute directory
    /// (`{host}/.s.PGSQL.{port}`), else host and port over TCP.
    pub fn of(params: &ConnParams) -> Target {
        if params.is_unix_socket() {
            Target::Unix(PathBuf::from(&params.host).join(format!(".s.PGSQL.{}", params.port)))
        } else {
            Target::Tcp(params.host.clone(), params.port)
        }
    }
}

impl From<&ConnParams> for Target {
    fn from(params: &ConnParams) -> Target {
        Target::of(params)
    }
}

/// One end of a forwarded connection.
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn connect(target: &Target) -> io::Result<Stream> {
        Ok(match target {
            Target::Tcp(host, port) => {
                let s = TcpStream::connect((host.as_str(), *port))?;
                let _ = s.set_nodelay(true);
                Stream::Tcp(s)
            }
            Target::Unix(path) => Stream::Unix(UnixStream::connect(path)?),
        })
    }

    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    fn shutdown(&self, how: Shutdown) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(how),
            Stream::Unix(s) => s.shutdown(how),
        };
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[derive(Default)]
struct State {
    silent: bool,
    stop: bool,
}

/// What the forwarder's threads share.
#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    accepted: AtomicUsize,
}

impl Shared {
    /// Waits while silent; false once the forwarder is stopping.
    fn pass(&self) -> bool {
        let state = self
            .changed
            .wait_while(self.state.lock().unwrap(), |s| s.silent && !s.stop)
            .unwrap();
        !state.stop
    }

    fn stopping(&self) -> bool {
        self.state.lock().unwrap().stop
    }
}

/// One accepted connection: both ends (to close them on drop) and its two copying threads.
struct Conn {
    client: Stream,
    server: Stream,
    pumps: [JoinHandle<()>; 2],
}

impl Conn {
    fn finished(&self) -> bool {
        self.pumps.iter().all(JoinHandle::is_finished)
    }
}

/// A forwarder listening on 127.0.0.1; see the module's documentation.
pub struct Forwarder {
    port: u16,
    shared: Arc<Shared>,
    conns: Arc<Mutex<Vec<Conn>>>,
    acceptor: Option<JoinHandle<()>>,
}

impl Forwarder {
    /// Listens on 127.0.0.1 (a free port) and forwards every accepted connection to `target`.
    /// A connection the target refuses is closed.
    pub fn start(target: Target) -> Forwarder {
        let listener = TcpListener::bind("127.0.0.1:0").expect("forwarder: bind 127.0.0.1:0");
        let port = listener.local_addr().unwrap().port();
        // Polled, so that drop can stop it without a connection to wake it.
        listener.set_nonblocking(true).unwrap();
        let shared = Arc::new(Shared::default());
        let conns = Arc::new(Mutex::new(Vec::new()));
        let acceptor = {
            let (shared, conns) = (shared.clone(), conns.clone());
            thread::Builder::new()
                .name(format!("forwarder {port}"))
                .spawn(move || accept(listener, target, shared, conns))
                .unwrap()
        };
        Forwarder {
            port,
            shared,
            conns,
            acceptor: Some(acceptor),
        }
    }

    /// A forwarder to the server `params` names.
    pub fn to(params: &ConnParams) -> Forwarder {
        Forwarder::start(Target::of(params))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `params` (user, password, database, sslmode, ...) as a keyword/value connection
    /// string through this forwarder: `host=127.0.0.1 port={self.port()} ...`. (An sslmode
    /// that verifies the host name will not match 127.0.0.1.)
    pub fn conninfo(&self, params: &ConnParams) -> String {
        let mut p = params.clone();
        p.host = "127.0.0.1".to_string();
        p.port = self.port;
        super::keyword_value(&p)
    }

    /// From now on no byte passes in either direction on any connection, existing or new (new
    /// ones are still accepted and connected to the target, but stay silent), and no end of
    /// stream is passed on; no socket is closed. What the peers send stays in the kernel's
    /// buffers, or, for a chunk read at the moment of the call, in the forwarder, until
    /// `restore`. (One write system call already under way when this is called may complete.)
    pub fn silence(&self) {
        self.shared.state.lock().unwrap().silent = true;
    }

    /// Bytes pass again, those held delivered in order.
    pub fn restore(&self) {
        self.shared.state.lock().unwrap().silent = false;
        self.shared.changed.notify_all();
    }

    /// How many connections it has accepted so far.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Forwarder {
    /// Stops accepting and closes every connection (both ends, without passing on anything
    /// held); waits for its threads, which all end promptly.
    fn drop(&mut self) {
        self.shared.state.lock().unwrap().stop = true;
        self.shared.changed.notify_all();
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        // The acceptor has ended: no connection is added from here on.
        let conns = std::mem::take(&mut *self.conns.lock().unwrap());
        for c in &conns {
            // Wakes a read or a write blocked on either end.
            c.client.shutdown(Shutdown::Both);
            c.server.shutdown(Shutdown::Both);
        }
        for c in conns {
            for pump in c.pumps {
                let _ = pump.join();
            }
        }
    }
}

fn accept(
    listener: TcpListener,
    target: Target,
    shared: Arc<Shared>,
    conns: Arc<Mutex<Vec<Conn>>>,
) {
    while !shared.stopping() {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            // Nothing to accept (WouldBlock), or a failed accept: look again shortly.
            Err(_) => {
                thread::sleep(Duration::from_millis(5));
                continue;
            }
        };
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        let _ = client.set_nonblocking(false);
        let _ = client.set_nodelay(true);
        // A target that refuses: the client's socket closes as it is dropped.
        let Ok(server) = Stream::connect(&target) else {
            continue;
        };
        let client = Stream::Tcp(client);
        let Ok(conn) = connect_pumps(client, server, &shared) else {
            continue;
        };
        let mut conns = conns.lock().unwrap();
        conns.retain(|c| !c.finished());
        conns.push(conn);
    }
}

fn connect_pumps(client: Stream, server: Stream, shared: &Arc<Shared>) -> io::Result<Conn> {
    let up = {
        let (from, to, shared) = (client.try_clone()?, server.try_clone()?, shared.clone());
        thread::spawn(move || pump(from, to, &shared))
    };
    let down = {
        let (from, to, shared) = (server.try_clone()?, client.try_clone()?, shared.clone());
        thread::spawn(move || pump(from, to, &shared))
    };
    Ok(Conn {
        client,
        server,
        pumps: [up, down],
    })
}

/// Copies `from` to `to` until an end of stream or an error, waiting while silent before each
/// read and before passing on each chunk (or the end of stream).
fn pump(mut from: Stream, mut to: Stream, shared: &Shared) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if !shared.pass() {
            return;
        }
        let n = from.read(&mut buf).unwrap_or(0);
        // Silenced while blocked in the read: hold the chunk (or the end) until restored.
        if !shared.pass() {
            return;
        }
        if n == 0 {
            to.shutdown(Shutdown::Write);
            return;
        }
        let mut chunk = &buf[..n];
        while !chunk.is_empty() {
            match to.write(chunk) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(0) | Err(_) => {
                    // The other side is gone: close this one too.
                    from.shutdown(Shutdown::Both);
                    to.shutdown(Shutdown::Both);
                    return;
                }
                Ok(w) => chunk = &chunk[w..],
            }
            // A chunk cut into several writes: the rest waits while silent.
            if !chunk.is_empty() && !shared.pass() {
                return;
            }
        }
    }
}
