//! TLS against a real server: a throwaway PostgreSQL with `ssl = on` and a certificate signed
//! by a certificate authority this test makes, plus a second, unrelated authority. The real
//! binary connects with each `sslmode` and the outcome is checked on both sides: the exit
//! code and message, and what the server saw (its connection log, and a role that pg_hba.conf
//! admits only over TLS). No run may show the password.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use common::{pgmend_command, run, Run};
use openssl::asn1::{Asn1Integer, Asn1Time};
use openssl::bn::BigNum;
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::x509::extension::{
    AuthorityKeyIdentifier, BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectAlternativeName,
    SubjectKeyIdentifier,
};
use openssl::x509::{X509Builder, X509Name, X509NameBuilder, X509};
use pgmend::localpg::LocalPg;

/// The only role the tests connect as; pg_hba.conf rejects it on any connection without TLS,
/// so a run that gets in as this role proves the session was encrypted.
const TLS_ROLE: &str = "tls_only";

/// The host name the server's certificate is issued for. Its only subjectAltName is
/// `DNS:localhost`, so connecting to `127.0.0.1` is a host name mismatch.
const CERT_HOST: &str = "localhost";

struct TlsServer {
    pg: LocalPg,
    /// Holds the authorities' PEM files (and serves as pgmend's HOME).
    dir: PathBuf,
    /// The authority that signed the server's certificate.
    ca: PathBuf,
    /// A self-signed authority that has nothing to do with the server.
    other_ca: PathBuf,
    password: String,
}

fn server() -> &'static TlsServer {
    static SERVER: OnceLock<TlsServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let (ca_cert, ca_key) = authority("pgmend test CA");
        let (other_cert, _) = authority("pgmend unrelated CA");
        let (server_cert, server_key) = server_certificate(&ca_cert, &ca_key, CERT_HOST);

        let hba = format!(
            "local all all trust\n\
             hostnossl all {TLS_ROLE} 0.0.0.0/0 reject\n\
             hostnossl all {TLS_ROLE} ::/0 reject\n\
             host all all 127.0.0.1/32 scram-sha-256\n\
             host all all ::1/128 scram-sha-256\n"
        );
        let pg = LocalPg::start_with(
            false,
            &[
                ("server.crt", &server_cert.to_pem().unwrap()),
                (
                    "server.key",
                    &server_key.private_key_to_pem_pkcs8().unwrap(),
                ),
                ("pg_hba.conf", hba.as_bytes()),
            ],
            &[
                ("ssl", "on"),
                ("ssl_cert_file", "server.crt"),
                ("ssl_key_file", "server.key"),
                ("log_connections", "on"),
            ],
        )
        .expect("starting a throwaway PostgreSQL with ssl = on");
        // Beside the cluster, so its watchdog deletes them with it when the tests end.
        let dir = pg.root.join("client");
        std::fs::create_dir(&dir).unwrap();
        let ca = dir.join("ca.crt");
        let other_ca = dir.join("other-ca.crt");
        std::fs::write(&ca, ca_cert.to_pem().unwrap()).unwrap();
        std::fs::write(&other_ca, other_cert.to_pem().unwrap()).unwrap();

        let password = format!("Tls{:016x}", rand::random::<u64>());
        admin(&pg)
            .batch_execute(&format!(
                "CREATE ROLE {TLS_ROLE} LOGIN SUPERUSER PASSWORD '{password}'"
            ))
            .unwrap();
        TlsServer {
            pg,
            dir,
            ca,
            other_ca,
            password,
        }
    })
}

/// The superuser over the unix socket (trusted, never TLS).
fn admin(pg: &LocalPg) -> postgres::Client {
    postgres::Config::new()
        .host_path(&pg.socket_dir)
        .port(pg.port)
        .user(&pg.superuser)
        .dbname("postgres")
        .connect(postgres::NoTls)
        .expect("admin connection over the unix socket")
}

/// A fresh, empty database owned by the TLS-only role.
fn fresh_db() -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let s = server();
    let name = format!(
        "tls{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    );
    admin(&s.pg)
        .batch_execute(&format!("CREATE DATABASE {name} OWNER {TLS_ROLE}"))
        .unwrap();
    name
}

fn db_client(db: &str) -> postgres::Client {
    let pg = &server().pg;
    postgres::Config::new()
        .host_path(&pg.socket_dir)
        .port(pg.port)
        .user(&pg.superuser)
        .dbname(db)
        .connect(postgres::NoTls)
        .unwrap()
}

/// Tables outside the system schemas: what a run that changed nothing leaves at 0.
fn user_tables(db: &str) -> i64 {
    db_client(db)
        .query_one(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE c.relkind IN ('r', 'p', 'i', 'S')
                AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')",
            &[],
        )
        .unwrap()
        .get(0)
}

/// `postgresql://tls_only:PASSWORD@HOST:PORT/DB?sslmode=MODE&...` (no sslrootcert unless
/// `extra` adds it).
fn url(host: &str, db: &str, sslmode: &str, extra: &str) -> String {
    let s = server();
    format!(
        "postgresql://{TLS_ROLE}:{}@{host}:{}/{db}?sslmode={sslmode}{extra}",
        s.password, s.pg.port
    )
}

/// pgmend with no PG* variables from the outside and a HOME without `~/.postgresql/root.crt`,
/// so the only root certificate is the one a test gives.
fn pgmend(database_url: &str) -> Command {
    let mut c = pgmend_command();
    c.env("HOME", server().dir.as_path())
        .env("DATABASE_URL", database_url);
    c
}

fn run_pgmend(command: &mut Command) -> Run {
    run(command, &server().password)
}

/// The server's log line for the connection made under `application_name`, if any.
fn connection_log(application_name: &str) -> Option<String> {
    let log = std::fs::read_to_string(server().pg.root.join("server.log")).unwrap();
    let needle = format!("application_name={application_name}");
    log.lines()
        .find(|line| {
            line.contains("connection authorized")
                && line.split_whitespace().any(|word| word == needle)
        })
        .map(str::to_string)
}

#[test]
fn verify_full_with_the_right_authority_connects_over_tls() {
    let db = fresh_db();
    let r = run_pgmend(
        pgmend(&url(CERT_HOST, &db, "verify-full", ""))
            .env("PGSSLROOTCERT", &server().ca)
            .env("PGAPPNAME", "tls-verify-full-apply")
            .args(["migrate", "apply", "--yes"]),
    );
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(user_tables(&db) > 0, "apply created nothing:\n{}", r.both());
    let log = connection_log("tls-verify-full-apply")
        .expect("the server logged no connection for application_name tls-verify-full-apply");
    assert!(log.contains("SSL enabled (protocol=TLS"), "{log}");

    // The same with sslrootcert in the URL instead of PGSSLROOTCERT.
    let extra = format!(
        "&sslrootcert={}&application_name=tls-verify-full-status",
        server().ca.display()
    );
    let r = run_pgmend(
        pgmend(&url(CERT_HOST, &db, "verify-full", &extra))
            .args(["migrate", "status", "--format", "json"]),
    );
    assert_eq!(r.code, 0, "{}", r.both());
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(doc["database"]["dbname"], db.as_str(), "{}", r.stdout);
    let log = connection_log("tls-verify-full-status").expect("no connection log line");
    assert!(log.contains("SSL enabled"), "{log}");
}

#[test]
fn verify_full_with_the_wrong_authority_exits_2_and_changes_nothing() {
    let db = fresh_db();
    let r = run_pgmend(
        pgmend(&url(CERT_HOST, &db, "verify-full", ""))
            .env("PGSSLROOTCERT", &server().other_ca)
            .args(["migrate", "apply", "--yes"]),
    );
    assert_eq!(r.code, 2, "{}", r.both());
    let err = &r.stderr;
    assert!(err.contains("could not connect to host=localhost"), "{err}");
    assert!(err.contains("certificate verify failed"), "{err}");
    assert!(
        err.contains("unable to get local issuer certificate"),
        "{err}"
    );
    assert!(
        err.contains("could not be verified with the root certificate"),
        "{err}"
    );
    assert!(
        err.contains(&server().other_ca.display().to_string()),
        "{err}"
    );
    assert!(err.contains("set PGSSLROOTCERT"), "{err}");
    assert_eq!(user_tables(&db), 0);

    // A root certificate file that is not there is refused before connecting.
    let missing = server().dir.as_path().join("no-such-ca.crt");
    let r = run_pgmend(
        pgmend(&url(CERT_HOST, &db, "verify-full", ""))
            .env("PGSSLROOTCERT", &missing)
            .args(["migrate", "status"]),
    );
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("cannot load the root certificate")
            && r.stderr.contains(&missing.display().to_string()),
        "{}",
        r.stderr
    );
}

#[test]
fn verify_full_refuses_a_host_the_certificate_does_not_name() {
    let db = fresh_db();
    let r = run_pgmend(
        pgmend(&url("127.0.0.1", &db, "verify-full", ""))
            .env("PGSSLROOTCERT", &server().ca)
            .args(["migrate", "apply", "--yes"]),
    );
    assert_eq!(r.code, 2, "{}", r.both());
    let err = &r.stderr;
    assert!(err.contains("could not connect to host=127.0.0.1"), "{err}");
    assert!(err.contains("certificate verify failed"), "{err}");
    assert!(err.contains("IP address mismatch"), "{err}");
    assert!(
        err.contains("the server's certificate does not name the host \"127.0.0.1\""),
        "{err}"
    );
    assert!(err.contains("use sslmode=verify-ca"), "{err}");
    assert_eq!(user_tables(&db), 0);
}

#[test]
fn verify_ca_checks_the_chain_but_not_the_host_name() {
    let db = fresh_db();
    let r = run_pgmend(
        pgmend(&url("127.0.0.1", &db, "verify-ca", ""))
            .env("PGSSLROOTCERT", &server().ca)
            .env("PGAPPNAME", "tls-verify-ca")
            .args(["migrate", "status"]),
    );
    assert_eq!(r.code, 0, "{}", r.both());
    let log = connection_log("tls-verify-ca").expect("no connection log line");
    assert!(log.contains("SSL enabled"), "{log}");

    let r = run_pgmend(
        pgmend(&url("127.0.0.1", &db, "verify-ca", ""))
            .env("PGSSLROOTCERT", &server().other_ca)
            .args(["migrate", "status"]),
    );
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("unable to get local issuer certificate"),
        "{}",
        r.stderr
    );
}

#[test]
fn require_and_prefer_encrypt_without_a_root_certificate() {
    let db = fresh_db();
    for mode in ["require", "prefer"] {
        let appname = format!("tls-{mode}");
        let r = run_pgmend(
            pgmend(&url("127.0.0.1", &db, mode, ""))
                .env("PGAPPNAME", &appname)
                .args(["migrate", "status"]),
        );
        assert_eq!(r.code, 0, "sslmode={mode}: {}", r.both());
        let log = connection_log(&appname).expect("no connection log line");
        assert!(log.contains("SSL enabled"), "{log}");
    }
    // As libpq does: given a root certificate, require checks the chain against it.
    let r = run_pgmend(
        pgmend(&url("127.0.0.1", &db, "require", ""))
            .env("PGSSLROOTCERT", &server().other_ca)
            .args(["migrate", "status"]),
    );
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("certificate verify failed"),
        "{}",
        r.stderr
    );
}

#[test]
fn disable_goes_in_the_clear_and_a_tls_only_entry_refuses_it() {
    let db = fresh_db();
    // The superuser may connect without TLS: sslmode=disable works.
    let s = server();
    let plain = format!(
        "postgresql://{}:{}@127.0.0.1:{}/{db}?sslmode=disable&application_name=tls-disable",
        s.pg.superuser, s.pg.password, s.pg.port
    );
    let r = run(pgmend(&plain).args(["migrate", "status"]), &s.pg.password);
    assert_eq!(r.code, 0, "{}", r.both());
    let log = connection_log("tls-disable").expect("no connection log line");
    assert!(!log.contains("SSL enabled"), "{log}");

    // The TLS-only role without TLS: pg_hba.conf rejects it, and pgmend says where to look.
    let r = run_pgmend(
        pgmend(&url("127.0.0.1", &db, "disable", "")).args(["migrate", "apply", "--yes"]),
    );
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("pg_hba.conf rejects connection"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("no encryption"), "{}", r.stderr);
    assert!(
        r.stderr.contains("admits this connection only over TLS"),
        "{}",
        r.stderr
    );
    assert_eq!(user_tables(&db), 0);
}

#[test]
fn a_unix_socket_ignores_sslmode_as_libpq_does() {
    // PostgreSQL never speaks TLS over a unix socket; libpq then connects without it whatever
    // sslmode says, so a PGSSLMODE meant for the network does not break local runs.
    let db = fresh_db();
    let s = server();
    for mode in ["require", "verify-full"] {
        let socket = format!(
            "host={} port={} user={} dbname={db} sslmode={mode}",
            s.pg.socket_dir.display(),
            s.pg.port,
            s.pg.superuser
        );
        let r = run_pgmend(pgmend(&socket).args(["migrate", "status"]));
        assert_eq!(r.code, 0, "sslmode={mode}: {}", r.both());
    }
}

#[test]
fn require_against_a_server_without_tls_exits_2_and_says_so() {
    // The suite's ordinary server runs with ssl = off.
    let db = common::fresh_db();
    let p = &db.params;
    let url = format!(
        "host={} port={} user={} password={} dbname={} sslmode=require",
        p.host,
        p.port,
        p.user,
        db.password(),
        p.dbname
    );
    let r = run(
        pgmend(&url).args(["migrate", "apply", "--yes"]),
        &db.password(),
    );
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("server does not support TLS"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("turn ssl on"), "{}", r.stderr);
    assert!(!db.exists("campaigns"));
}

/// A self-signed certificate authority.
fn authority(common_name: &str) -> (X509, PKey<Private>) {
    let key = new_key();
    let name = name(common_name);
    let mut b = builder(&name, &name, &key);
    b.append_extension(BasicConstraints::new().critical().ca().build().unwrap())
        .unwrap();
    b.append_extension(
        KeyUsage::new()
            .critical()
            .key_cert_sign()
            .crl_sign()
            .build()
            .unwrap(),
    )
    .unwrap();
    let ski = SubjectKeyIdentifier::new()
        .build(&b.x509v3_context(None, None))
        .unwrap();
    b.append_extension(ski).unwrap();
    b.sign(&key, MessageDigest::sha256()).unwrap();
    (b.build(), key)
}

/// A server certificate for `host` (CN and the only subjectAltName), signed by the authority.
fn server_certificate(ca: &X509, ca_key: &PKey<Private>, host: &str) -> (X509, PKey<Private>) {
    let key = new_key();
    let mut b = builder(&name(host), ca.subject_name(), &key);
    b.append_extension(BasicConstraints::new().build().unwrap())
        .unwrap();
    b.append_extension(
        KeyUsage::new()
            .critical()
            .digital_signature()
            .key_encipherment()
            .build()
            .unwrap(),
    )
    .unwrap();
    b.append_extension(ExtendedKeyUsage::new().server_auth().build().unwrap())
        .unwrap();
    let san = SubjectAlternativeName::new()
        .dns(host)
        .build(&b.x509v3_context(Some(ca), None))
        .unwrap();
    b.append_extension(san).unwrap();
    let aki = AuthorityKeyIdentifier::new()
        .keyid(true)
        .build(&b.x509v3_context(Some(ca), None))
        .unwrap();
    b.append_extension(aki).unwrap();
    b.sign(ca_key, MessageDigest::sha256()).unwrap();
    (b.build(), key)
}

fn new_key() -> PKey<Private> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
    PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap()
}

fn name(common_name: &str) -> X509Name {
    let mut n = X509NameBuilder::new().unwrap();
    n.append_entry_by_nid(Nid::COMMONNAME, common_name).unwrap();
    n.build()
}

/// A v3 certificate valid from an hour ago for a day, with a random serial.
fn builder(
    subject: &openssl::x509::X509NameRef,
    issuer: &openssl::x509::X509NameRef,
    key: &PKey<Private>,
) -> X509Builder {
    let mut b = X509Builder::new().unwrap();
    b.set_version(2).unwrap();
    let serial: Asn1Integer = BigNum::from_u32(rand::random::<u32>() >> 1)
        .unwrap()
        .to_asn1_integer()
        .unwrap();
    b.set_serial_number(&serial).unwrap();
    b.set_subject_name(subject).unwrap();
    b.set_issuer_name(issuer).unwrap();
    b.set_pubkey(key).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    b.set_not_before(&Asn1Time::from_unix(now - 3600).unwrap())
        .unwrap();
    b.set_not_after(&Asn1Time::from_unix(now + 86_400).unwrap())
        .unwrap();
    b
}
