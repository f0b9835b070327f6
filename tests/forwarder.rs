//! The test forwarder itself (tests/common/forwarder.rs): bytes pass, stop passing while it
//! is silent (the query neither returns nor fails), and pass again, held bytes and all, once
//! restored.

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use common::forwarder::Forwarder;
use common::*;

#[test]
fn a_silenced_forwarder_holds_a_query_until_restored() {
    let db = fresh_db();
    let fwd = Forwarder::to(&db.params);
    let mut client = postgres::Client::connect(&fwd.conninfo(&db.params), postgres::NoTls)
        .expect("connecting through the forwarder");
    assert_eq!(fwd.accepted(), 1);
    let one: i32 = client.query_one("SELECT 1", &[]).unwrap().get(0);
    assert_eq!(one, 1);

    fwd.silence();
    let (tx, rx) = mpsc::channel();
    let query = thread::spawn(move || {
        let r = client
            .query_one("SELECT 1", &[])
            .map(|row| row.get::<_, i32>(0));
        let _ = tx.send(r);
        client
    });
    match rx.recv_timeout(Duration::from_secs(2)) {
        Err(mpsc::RecvTimeoutError::Timeout) => {}
        other => panic!("the query returned while the forwarder was silent: {other:?}"),
    }

    fwd.restore();
    let r = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the query did not return within 5 s of restore");
    assert_eq!(r.unwrap(), 1);
    // The connection still works afterwards.
    let mut client = query.join().unwrap();
    let two: i32 = client.query_one("SELECT 2", &[]).unwrap().get(0);
    assert_eq!(two, 2);
    assert_eq!(fwd.accepted(), 1);
    drop(client);
    drop(fwd);
}

#[test]
fn dropping_a_silenced_forwarder_closes_its_connections() {
    let db = fresh_db();
    let fwd = Forwarder::to(&db.params);
    let mut client = postgres::Client::connect(&fwd.conninfo(&db.params), postgres::NoTls).unwrap();
    fwd.silence();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(client.query_one("SELECT 1", &[]).is_err());
    });
    thread::sleep(Duration::from_millis(200));
    drop(fwd);
    let failed = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the query still hangs after the forwarder was dropped");
    assert!(failed, "the query succeeded through a dropped forwarder");
}

#[test]
fn a_unix_socket_target_echoes_and_passes_the_end_of_stream_on() {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixListener;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(".s.PGSQL.5432");
    let listener = UnixListener::bind(&path).unwrap();
    let echo = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut all = Vec::new();
        s.read_to_end(&mut all).unwrap();
        s.write_all(&all).unwrap();
    });
    let fwd = Forwarder::start(common::forwarder::Target::Unix(path));
    let mut c = std::net::TcpStream::connect(("127.0.0.1", fwd.port())).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(b"hello").unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let mut back = Vec::new();
    c.read_to_end(&mut back).unwrap();
    assert_eq!(back, b"hello");
    echo.join().unwrap();
    assert_eq!(fwd.accepted(), 1);
}
