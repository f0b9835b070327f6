//! Connecting: bad URLs, wrong passwords, unreachable hosts, the libpq variables. Every
//! failure exits 2, says what to do, and never shows the password.

mod common;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::*;

#[test]
fn a_malformed_url_exits_2_without_echoing_it() {
    let r = run(
        pgmend_command().args([
            "migrate",
            "status",
            "--database-url",
            "postgresql://rel:Sup3rSecret@db:notaport/x",
        ]),
        "Sup3rSecret",
    );
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(r.stderr.contains("port \"notaport\""), "{}", r.stderr);
    let r = run(
        pgmend_command().args([
            "migrate",
            "status",
            "--database-url",
            "host=db passwort=Sup3rSecret",
        ]),
        "Sup3rSecret",
    );
    assert_eq!(r.code, 2);
    assert!(
        r.stderr
            .contains("unknown connection parameter \"passwort\""),
        "{}",
        r.stderr
    );
}

/// Every way the parser refuses a string, through the binary: exit 2, a message that says
/// what is wrong and how to write it, and no piece of the password (`Sup3r` + `Secret`),
/// wherever the mistake put it.
#[test]
fn every_string_the_parser_refuses_exits_2_saying_why_without_the_password() {
    let pw = "Sup3rSecret";
    for (conninfo, expect) in [
        // URLs.
        ("postgresql//u:Sup3rSecret@h/x", "does not start with postgresql://"),
        ("postgresql:/u:Sup3rSecret@h/x", "does not start with postgresql://"),
        ("postgres:u:Sup3rSecret@h/x", "does not start with postgresql://"),
        ("jdbc:postgresql://h/x?password=Sup3rSecret", "does not start with postgresql://"),
        ("postgresql://u:Sup3rSecret/x", "an '@' and the host must follow it"),
        ("postgresql://u:Sup3r%zzSecret@h/x", "the password has a '%' that does not start a %XX escape"),
        ("postgresql://u:Sup3r%ffSecret@h/x", "the password decodes to bytes that are not valid UTF-8"),
        ("postgresql://u%e9:Sup3rSecret@h/x", "the user name decodes to bytes"),
        ("postgresql://u:Sup3rSecret@h%/x", "the host has a '%'"),
        ("postgresql://u:Sup3rSecret@h/x%4", "the database name has a '%'"),
        ("postgresql://u:Sup3r/Secret@h/x", "percent-encode them"),
        ("postgresql://u:Sup3r?Secret@h/x", "percent-encode them"),
        ("postgresql://u:Sup3rSecret@h:5432,,h2:5432/x", "host number 2 of the 3 in the URL is empty"),
        ("postgresql://u:Sup3rSecret@h:5432,h2:Sup3rSecret/x", "the port in the connection string (number 2 of the 2 in the port list) is not a number"),
        ("postgresql://u:Sup3rSecret@h/x?target_session_attrs=master", "target_session_attrs \"master\" is not one of any, read-write, read-only, primary, standby, prefer-standby"),
        ("postgresql://u:Sup3rSecret@h/x?keepalives_idle=soon", "keepalives_idle \"soon\" is not a whole number of seconds"),
        ("postgresql://u:Sup3rSecret@[::1/x", "missing its closing ']'"),
        ("postgresql://u:Sup3rSecret@h:notaport/x", "port \"notaport\" is not a number between 1 and 65535"),
        ("postgresql://u:Sup3rSecret@h:0/x", "port \"0\" is not a number"),
        ("postgresql://u:Sup3rSecret@h:65536/x", "port \"65536\" is not a number"),
        ("postgresql://u:Sup3rSecret@h/x?sslmode=verify", "sslmode \"verify\" is not one of disable, allow, prefer, require, verify-ca, verify-full"),
        ("postgresql://u:Sup3rSecret@h/x?sslmode=Sup3rSecret", "the sslmode in the connection string is not one of"),
        ("postgresql://u:Sup3rSecret@h/x?connect_timeout=soon", "connect_timeout \"soon\" is not a whole number"),
        ("postgresql://u:Sup3rSecret@h/x?sslmod=require", "unknown connection parameter \"sslmod\" (did you mean sslmode?)"),
        ("postgresql://u:Sup3rSecret@h/x?sslmode", "URL parameter number 1 has no '='"),
        ("postgresql://u@h/x?password=Sup3r&Secret", "has no '='"),
        ("postgresql://u@h/x?password=Sup3r&Secret=1", "the parameter after password is not a known key"),
        ("postgresql://u:Sup3rSecret@h/x%00", "the value of dbname contains a NUL character"),
        // key=value strings.
        ("host=h user=u password=Sup3rSecret dbnme=x", "the parameter after password is not a known key (did you mean dbname?)"),
        ("host=h user=u passwort=Sup3rSecret", "unknown connection parameter \"passwort\" (did you mean password?)"),
        ("host=h user=u Sup3rSecret=x", "parameter number 3 is not a known key"),
        ("host=h user=u password=Sup3r Secret", "quote that value: password='...'"),
        ("host=h user=u password=Sup3r Secret=x", "quote that value (password='...'"),
        ("host=h user=u password='Sup3rSecret", "the quoted value of password has no closing quote"),
        ("host=h user=u password='Sup3r'Secret' dbname=x", "quote that value"),
        ("host=h user=u password=Sup3rSecret\\", "a backslash ends the string"),
        ("host=h user=u password=Sup3rSecret dbname", "dbname is missing its '='"),
        ("host=h user=u password=Sup3rSecret port=65536", "port \"65536\" is not a number between 1 and 65535"),
        ("host=h user=u password=Sup3rSecret port=Sup3rSecret", "the port in the connection string is not a number"),
        ("host=h user=u password=Sup3rSecret sslmode=on", "sslmode \"on\" is not one of"),
        ("host=h user=u password=Sup3rSecret connect_timeout=-1", "connect_timeout \"-1\" is not a whole number"),
        ("host=h,,h2 user=u password=Sup3rSecret", "host number 2 of the 3 in the host list is empty"),
        ("host=h,h2 port=5432,5433,5434 user=u password=Sup3rSecret", "2 hosts but 3 ports: give one port per host"),
        ("host=h user=u password=Sup3rSecret target_session_attrs=Sup3rSecret", "the target_session_attrs in the connection string is not one of"),
        ("host=h user=u password=Sup3rSecret keepalives=on", "keepalives \"on\" is not 1 (on) or 0 (off)"),
    ] {
        let r = run(
            pgmend_command()
                .env("PGCONNECT_TIMEOUT", "2")
                .args(["migrate", "status", "--database-url", conninfo]),
            pw,
        );
        assert_eq!(r.code, 2, "{conninfo}: {}", r.both());
        assert!(r.stderr.contains(expect), "{conninfo}: expected {expect:?} in {}", r.stderr);
        for piece in ["Sup3r", "Secret", pw] {
            assert!(!r.both().contains(piece), "{conninfo}: {piece} shows in {}", r.both());
        }
        assert!(!r.stderr.contains("could not connect"), "{conninfo}: {}", r.stderr);
    }
}

/// The strings most deployments hand pgmend: `DATABASE_URL` (as the harness does), or a
/// URL whose password the user meant to take from `PGPASSWORD`. Malformed in several ways,
/// given to commands that change the database and to ones that read, in both output
/// formats: exit 2, and no piece of the password (`Sup3r` + `Secret`, or PGPASSWORD's
/// `Env` + `Passw0rd`) anywhere in stdout or stderr.
#[test]
fn a_malformed_database_url_never_shows_a_password_whatever_the_command_or_format() {
    let shapes = [
        "postgresql://u:Sup3rSecret@h:notaport/x",
        "postgresql://u:Sup3r/Secret@h/x",
        "postgresql://u:Sup3r%zzSecret@h/x",
        "postgresql://u:Sup3rSecret@h/x?sslmode=Sup3rSecret",
        "postgresql://u@h/x?password=Sup3r&Secret",
        "postgres:/u:Sup3rSecret@h/x",
        "host=h user=u password=Sup3r Secret dbname=x",
        "host=h user=u password='Sup3rSecret dbname=x",
        "host=h user=u password=Sup3rSecret port=Sup3rSecret",
        "host=h user=u passwort=Sup3rSecret",
        // The password from PGPASSWORD, the URL itself broken.
        "postgresql://u@h:65536/x",
        "host=h user=u dbname=x sslmode=maybe",
    ];
    let commands: [&[&str]; 5] = [
        &["apply", "--yes"],
        &["repair", "apply", "void-duplicate-coupons", "--yes"],
        &["plan", "--format", "json"],
        &["report", "overruns", "--format", "csv"],
        &["verify", "--format", "json"],
    ];
    for conninfo in shapes {
        for args in commands {
            for via_flag in [false, true] {
                let mut c = pgmend_command();
                c.env("PGPASSWORD", "EnvPassw0rd")
                    .env("PGCONNECT_TIMEOUT", "2");
                if via_flag {
                    c.args(args).args(["--database-url", conninfo]);
                } else {
                    c.env("DATABASE_URL", conninfo).args(args);
                }
                let r = run(&mut c, "Sup3rSecret");
                let what = format!("{args:?} with {conninfo:?} (flag: {via_flag})");
                assert_eq!(r.code, 2, "{what}: {}", r.both());
                assert!(
                    r.stderr.contains("pgmend: error: ") && !r.stderr.contains("could not connect"),
                    "{what}: refused before connecting: {}",
                    r.stderr
                );
                for piece in ["Sup3r", "Secret", "EnvPassw0rd", "Passw0rd"] {
                    assert!(
                        !r.both().contains(piece),
                        "{what}: {piece} shows in {}",
                        r.both()
                    );
                }
            }
        }
    }
}

/// clap repeats an argument it does not expect: a connection string given without
/// `--database-url` must not come back with its password, nor may an argument that is not
/// UTF-8 make pgmend panic (the panic printed it whole).
#[test]
fn a_connection_string_clap_refuses_is_not_repeated() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    for args in [
        &["verify", "postgresql://rel:Sup3rSecret@db/x"][..],
        &["migrate", "status", "host=db password=Sup3rSecret"][..],
        &["repair", "log", "postgresql://rel:Sup3rSecret@db/x"][..],
    ] {
        let r = run(pgmend_command().args(args), "Sup3rSecret");
        assert_eq!(r.code, 2, "{args:?}: {}", r.both());
        assert!(
            r.stderr.contains("not repeated: it may hold a password"),
            "{args:?}: {}",
            r.stderr
        );
    }
    let r = run(
        pgmend_command().args(["verify", "postgresql://rel:Sup3rSecret@db/x"]),
        "Sup3rSecret",
    );
    assert!(
        r.stderr.contains("goes after --database-url"),
        "{}",
        r.stderr
    );
    let r = run(
        pgmend_command().arg("verify").arg(OsStr::from_bytes(
            b"--database-url=postgresql://rel:Sup3rSecret\xff@db/x",
        )),
        "Sup3rSecret",
    );
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    assert!(r.stderr.contains("invalid UTF-8"), "{}", r.stderr);
}

#[test]
fn a_wrong_password_exits_2_and_says_what_to_check() {
    let db = fresh_db();
    let mut params = db.params.clone();
    params.password = Some("WrongHorseBattery".into());
    let url = format!(
        "host={} port={} user={} password=WrongHorseBattery dbname={} sslmode=disable",
        params.host, params.port, params.user, params.dbname
    );
    let r = run(
        pgmend_command().args(["migrate", "status", "--database-url", &url]),
        "WrongHorseBattery",
    );
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("password authentication failed"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("PGPASSWORD"), "{}", r.stderr);
    assert!(!r.stderr.contains(&db.password()));
}

/// The server asks for a password and none was given: say where one goes, not that the
/// network may be down.
#[test]
fn without_a_password_the_advice_says_where_to_give_one() {
    let db = fresh_db();
    let p = &db.params;
    let url = format!(
        "postgresql://{}@{}:{}/{}?sslmode=disable",
        p.user, p.host, p.port, p.dbname
    );
    let r = run(
        pgmend_command().env("HOME", "/nonexistent").args([
            "migrate",
            "status",
            "--database-url",
            &url,
        ]),
        &db.password(),
    );
    assert_eq!(r.code, 2, "{}", r.both());
    for says in [
        "no password was given",
        "postgresql://user:PASSWORD@host",
        "PGPASSWORD",
        "~/.pgpass",
    ] {
        assert!(r.stderr.contains(says), "expected {says:?} in {}", r.stderr);
    }
    assert!(
        !r.stderr.contains("check that the server is running"),
        "{}",
        r.stderr
    );
}

#[test]
fn the_pg_variables_are_honoured_and_application_name_defaults_to_pgmend() {
    let db = fresh_db();
    let p = &db.params;
    let status = |appname: Option<&str>| {
        let mut c = pgmend_command();
        c.env("PGHOST", &p.host)
            .env("PGPORT", p.port.to_string())
            .env("PGUSER", &p.user)
            .env("PGPASSWORD", p.password.clone().unwrap())
            .env("PGDATABASE", &p.dbname)
            .env("PGSSLMODE", "disable")
            .args(["migrate", "apply", "--yes", "--format", "json"]);
        if let Some(a) = appname {
            c.env("PGAPPNAME", a);
        }
        run(&mut c, &db.password())
    };
    let r = status(None);
    assert_eq!(r.code, 0, "{}", r.both());
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(doc["database"]["dbname"], db.name.as_str());
    assert!(db.exists("campaigns"));
    // The runner lock's holder is named by application_name; hold it and look.
    let mut blocker = db.client();
    blocker
        .batch_execute("SET application_name = 'pgmend'")
        .unwrap();
    blocker
        .query_one("SELECT pg_try_advisory_lock(123589519306340)", &[])
        .unwrap();
    let r = status(Some("nightly-release"));
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(
        r.stderr.contains("application_name \"pgmend\""),
        "{}",
        r.stderr
    );
}

#[test]
fn without_a_password_the_password_file_is_read_as_libpq_reads_it() {
    use std::os::unix::fs::PermissionsExt;
    let db = fresh_db();
    let p = &db.params;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pgpass");
    std::fs::write(
        &file,
        format!(
            "# for cron\nother-host:*:*:*:wrong\n*:{}:{}:{}:{}\n",
            p.port,
            p.dbname,
            p.user,
            db.password()
        ),
    )
    .unwrap();
    let url = format!(
        "host={} port={} user={} dbname={} sslmode=disable",
        p.host, p.port, p.user, p.dbname
    );
    let status = |mode: u32| {
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
        run(
            pgmend_command()
                .args(["migrate", "status", "--format", "json"])
                .env("DATABASE_URL", &url)
                .env("PGPASSFILE", &file),
            &db.password(),
        )
    };
    let r = status(0o600);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(r.stdout.contains("\"migrations\""), "{}", r.stdout);
    // Readable by others: ignored with a warning, as libpq does; the server then refuses.
    let r = status(0o644);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("has group or world access"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("password"), "{}", r.stderr);
}

#[test]
fn an_unreachable_host_is_bounded_by_the_connect_timeout() {
    // A listener that accepts TCP and never answers: the startup packet goes unanswered.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let started = Instant::now();
    let r = run(
        pgmend_command().env("PGCONNECT_TIMEOUT", "2").args([
            "migrate",
            "status",
            "--database-url",
            &format!("postgresql://u:Pw0rdX@127.0.0.1:{port}/d?sslmode=disable"),
        ]),
        "Pw0rdX",
    );
    let took = started.elapsed();
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(took < Duration::from_secs(15), "took {took:?}");
    assert!(
        r.stderr.contains("could not connect to host=127.0.0.1"),
        "{}",
        r.stderr
    );
    drop(silent);

    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let r = run(
        pgmend_command().args([
            "migrate",
            "status",
            "--database-url",
            &format!("host=127.0.0.1 port={closed} user=u password=Pw0rdX sslmode=disable"),
        ]),
        "Pw0rdX",
    );
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("check that the server is running"),
        "{}",
        r.stderr
    );
}

#[test]
fn verify_full_without_a_root_certificate_refuses_before_connecting() {
    let r = run(
        pgmend_command().env("HOME", "/nonexistent").args([
            "migrate",
            "status",
            "--database-url",
            "postgresql://u:Pw0rdX@127.0.0.1:1/d?sslmode=verify-full",
        ]),
        "Pw0rdX",
    );
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("PGSSLROOTCERT"), "{}", r.stderr);
}

#[test]
fn usage_errors_exit_2() {
    let r =
        run_without_password(pgmend_command().args(["migrate", "apply", "--lock-timeout", "5"]));
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("500ms"), "{}", r.stderr);
    let r = run_without_password(pgmend_command().args(["migrate", "frobnicate"]));
    assert_eq!(r.code, 2);
    let r = run_without_password(pgmend_command().args(["--help"]));
    assert_eq!(r.code, 0);
}
