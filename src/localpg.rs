//! A throwaway PostgreSQL cluster from the machine's server binaries, for `pgmend demo`
//! and the test suite. Works as root too: the server refuses to run as root, so then it
//! runs as the `postgres` user through `runuser`.
//!
//! A detached watchdog stops the server and deletes its files when the process that
//! started it exits, however it exits (a panic, Ctrl-C, kill -9).
//!
//! A throwaway PostgreSQL cluster for `demo`, the test harness and the benchmarks. Finds the server
//! binaries (`PGBIN`, then `pg_config --bindir`, then the newest `/usr/lib/postgresql/*/bin`), runs
//! `initdb` into a temporary directory with a random password (scram for TCP, trust on its private
//! socket), starts the server on a free local port (up to five tries) with durability off, and, as
//! root, runs the server programs as `postgres` through `runuser`. A detached watchdog (`setsid
//! sh`) stops the server and deletes its files when the starting process exits, however it exits;
//! `Drop` does the same early. `keep` (for `demo --keep`) skips both; `stop_command` is the shell
//! command that stops a kept server (its own `pg_ctl`, through `runuser` as root), which `demo
//! --keep` prints with the directory to remove. `start_with` writes files into the data directory
//! and settings into `postgresql.conf` before the first start (the TLS tests' certificates, `ssl =
//! on` and a `pg_hba.conf` with a `hostssl`-only role).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

pub struct LocalPg {
    pub bin_dir: PathBuf,
    pub root: PathBuf,
    pub port: u16,
    pub socket_dir: PathBuf,
    pub superuser: String,
    pub password: String,
    run_as: Option<String>,
    keep: bool,
}

/// Finds `initdb` and `postgres`: `PGBIN`, then `pg_config --bindir`, then the newest
/// `/usr/lib/postgresql/*/bin`.
pub fn find_bin_dir() -> Result<PathBuf> {
    let has_server = |dir: &Path| dir.join("initdb").is_file() && dir.join("postgres").is_file();
    if let Some(dir) = std::env::var_os("PGBIN").map(PathBuf::from) {
        if has_server(&dir) {
            return Ok(dir);
        }
        bail!("PGBIN={} holds no initdb and postgres; point it at a PostgreSQL server's bin directory", dir.display());
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && has_server(&dir) {
            return Ok(dir);
        }
    }
    let mut candidates: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter_map(|e| {
                    let version = e.file_name().to_str()?.parse::<u32>().ok()?;
                    Some((version, e.path().join("bin")))
                })
                .filter(|(_, dir)| has_server(dir))
                .collect()
        })
        .unwrap_or_default();
    candidates.sort();
    candidates.pop().map(|(_, dir)| dir).context(
        "no PostgreSQL server binaries found (looked at PGBIN, pg_config --bindir and /usr/lib/postgresql/*/bin). Install them (Debian/Ubuntu: apt-get install postgresql) or set PGBIN to the directory holding initdb and postgres",
    )
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

impl LocalPg {
    /// Creates and starts a cluster in a new temporary directory. With `keep`, it outlives
    /// this process and [`LocalPg::stop`] is never called on drop.
    pub fn start(keep: bool) -> Result<LocalPg> {
        LocalPg::start_with(keep, &[], &[])
    }

    /// [`LocalPg::start`], with `files` written into the data directory (owned by the
    /// server's user, mode 0600; `pg_hba.conf` replaces the generated one) and `settings`
    /// appended to `postgresql.conf` before the first start: e.g. `server.crt`, `server.key`
    /// and `("ssl", "on")` for a server that speaks TLS. Settings that [`LocalPg`] passes on
    /// the command line (port, listen_addresses, unix_socket_directories, ...) win over these.
    pub fn start_with(
        keep: bool,
        files: &[(&str, &[u8])],
        settings: &[(&str, &str)],
    ) -> Result<LocalPg> {
        let bin_dir = find_bin_dir()?;
        let run_as = is_root().then(|| "postgres".to_string());
        let root = tempfile::Builder::new()
            .prefix("pgmend-pg-")
            .tempdir()
            .context("creating a directory for the throwaway PostgreSQL")?
            .keep();
        let socket_dir = root.join("socket");
        std::fs::create_dir(&socket_dir)?;
        let password = format!("pw{:016x}", rand::random::<u64>());
        let pwfile = root.join("pwfile");
        std::fs::write(&pwfile, &password)?;
        if let Some(user) = &run_as {
            let status = Command::new("chown")
                .args(["-R", &format!("{user}:"), &root.display().to_string()])
                .status()?;
            if !status.success() {
                bail!("as root, the server must run as the {user:?} user, and `chown -R {user}: {}` failed; create that user (the postgresql package does)", root.display());
            }
        }
        let mut pg = LocalPg {
            bin_dir,
            port: 0,
            socket_dir,
            superuser: "postgres".into(),
            password,
            run_as,
            keep,
            root,
        };
        let data = pg.root.join("data");
        pg.run(
            "initdb",
            &[
                "-D",
                &data.display().to_string(),
                "-U",
                &pg.superuser.clone(),
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                &format!("--pwfile={}", pwfile.display()),
                "-E",
                "UTF8",
                "--no-locale",
                "-N",
            ],
        )?;
        if !keep {
            pg.spawn_watchdog()?;
        }
        for (name, contents) in files {
            pg.write_data_file(name, contents)?;
        }
        // A throwaway cluster trades durability for speed; these go into postgresql.conf
        // rather than on the command line so that `settings`, appended after them, can
        // ask for durable commits where a test needs them (a crash test, say).
        pg.append_settings(&[
            ("fsync", "off"),
            ("synchronous_commit", "off"),
            ("full_page_writes", "off"),
        ])?;
        pg.append_settings(settings)?;
        let mut last_error = None;
        for _ in 0..5 {
            pg.port = free_port()?;
            match pg.start_server() {
                Ok(()) => return Ok(pg),
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap())
    }

    fn start_server(&self) -> Result<()> {
        let options = format!(
            "-c port={} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} -c max_connections=300 -c log_min_messages=warning",
            self.port,
            self.socket_dir.display()
        );
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.root.join("data").display().to_string(),
                "-l",
                &self.root.join("server.log").display().to_string(),
                "-w",
                "-t",
                "60",
                "-o",
                &options,
                "start",
            ],
        )
    }

    /// The cluster's data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.root.join("data")
    }

    /// Writes `contents` to `name` in the data directory, readable only by the server's user
    /// (mode 0600, as PostgreSQL demands of `server.key`).
    pub fn write_data_file(&self, name: &str, contents: &[u8]) -> Result<PathBuf> {
        use std::io::Write;
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};

        if name.contains('/') || name.starts_with('.') {
            bail!("{name:?} is not a plain file name; LocalPg writes files only directly into the data directory");
        }
        let path = self.data_dir().join(name);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("writing {}", path.display()))?;
        file.write_all(contents)
            .with_context(|| format!("writing {}", path.display()))?;
        // An existing file keeps its mode through open(); set it either way.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        self.chown_to_server_user(&path)?;
        Ok(path)
    }

    /// Appends `key = 'value'` lines to `postgresql.conf` (the last occurrence of a key wins).
    /// They take effect on the next start, or on [`LocalPg::reload`] for settings that
    /// reload.
    pub fn append_settings(&self, settings: &[(&str, &str)]) -> Result<()> {
        use std::io::Write;

        let path = self.data_dir().join("postgresql.conf");
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {} to add settings", path.display()))?;
        let mut lines = String::from("\n# added by pgmend's LocalPg\n");
        for (key, value) in settings {
            lines.push_str(&format!("{key} = '{}'\n", value.replace('\'', "''")));
        }
        file.write_all(lines.as_bytes())
            .with_context(|| format!("adding settings to {}", path.display()))
    }

    /// Makes the running server reread its configuration files (`pg_ctl reload`).
    pub fn reload(&self) -> Result<()> {
        self.run(
            "pg_ctl",
            &["-D", &self.data_dir().display().to_string(), "reload"],
        )
    }

    fn chown_to_server_user(&self, path: &Path) -> Result<()> {
        if let Some(user) = &self.run_as {
            let status = Command::new("chown")
                .arg(format!("{user}:"))
                .arg(path)
                .status()
                .context("running chown")?;
            if !status.success() {
                bail!(
                    "`chown {user}: {}` failed; the server runs as {user:?} and must own its files",
                    path.display()
                );
            }
        }
        Ok(())
    }

    /// Runs one of the server's programs, as the `postgres` user when we are root.
    fn run(&self, program: &str, args: &[&str]) -> Result<()> {
        let path = self.bin_dir.join(program);
        let mut command = match &self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(&path);
                c
            }
            None => Command::new(&path),
        };
        let output = command
            .args(args)
            .current_dir(&self.root)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {}", path.display()))?;
        if !output.status.success() {
            let log = std::fs::read_to_string(self.root.join("server.log")).unwrap_or_default();
            bail!(
                "{program} failed: {}{}\n{}",
                String::from_utf8_lossy(&output.stderr),
                String::from_utf8_lossy(&output.stdout),
                log.lines()
                    .rev()
                    .take(10)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
        Ok(())
    }

    /// The shell command that stops this server: its own `pg_ctl` (often not on PATH), as
    /// the user the server runs as (`pg_ctl` refuses to run as root).
    pub fn stop_command(&self) -> String {
        format!(
            "{}{} -D {} stop",
            self.run_as
                .as_ref()
                .map(|u| format!("runuser -u {u} -- "))
                .unwrap_or_default(),
            self.bin_dir.join("pg_ctl").display(),
            self.root.join("data").display()
        )
    }

    fn spawn_watchdog(&self) -> Result<()> {
        let stop = format!("{} -m immediate", self.stop_command());
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; {stop} >/dev/null 2>&1; rm -rf {root}",
            pid = std::process::id(),
            root = self.root.display()
        );
        Command::new("setsid")
            .args(["sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the cleanup watchdog (setsid sh)")?;
        Ok(())
    }

    /// What `pg_basebackup -R -X stream` makes, for server builds that ship without it (the
    /// server-only builds the version matrix uses): a copy of the data directory taken
    /// between `pg_backup_start` and `pg_backup_stop`, its `backup_label`, `standby.signal`
    /// and a `primary_conninfo` over this cluster's socket. The standby streams the WAL from
    /// the backup's start on, which the primary still holds (no checkpoint comes between).
    fn copy_base_backup(&self, dest: &Path) -> Result<()> {
        let mut c = postgres::Client::connect(&self.conninfo("postgres"), postgres::NoTls)
            .context("connecting to the primary for a base backup")?;
        let version: i32 = c
            .query_one("SELECT current_setting('server_version_num')::int", &[])?
            .get(0);
        let (start, stop) = if version >= 150000 {
            (
                "SELECT pg_backup_start('pgmend standby', true)",
                "SELECT labelfile, spcmapfile FROM pg_backup_stop(true)",
            )
        } else {
            (
                "SELECT pg_start_backup('pgmend standby', true, false)",
                "SELECT labelfile, spcmapfile FROM pg_stop_backup(false, true)",
            )
        };
        c.batch_execute(start).context("starting a base backup")?;
        // cp -a keeps the owner (the server's user) and the data directory's mode 0700.
        let status = Command::new("cp")
            .arg("-a")
            .arg(self.data_dir())
            .arg(dest)
            .status()
            .context("running cp -a")?;
        let row = c.query_one(stop, &[]).context("ending the base backup")?;
        if !status.success() {
            bail!(
                "copying {} to {} failed",
                self.data_dir().display(),
                dest.display()
            );
        }
        let label: String = row.get(0);
        // What pg_basebackup leaves out: the running server's files, its WAL (the standby
        // streams it) and its replication slots.
        for file in ["postmaster.pid", "postmaster.opts"] {
            let _ = std::fs::remove_file(dest.join(file));
        }
        for dir in ["pg_wal", "pg_replslot"] {
            for entry in std::fs::read_dir(dest.join(dir))? {
                let path = entry?.path();
                if path.is_dir() {
                    std::fs::remove_dir_all(&path)?;
                } else {
                    std::fs::remove_file(&path)?;
                }
            }
        }
        std::fs::create_dir(dest.join("pg_wal/archive_status"))?;
        self.chown_to_server_user(&dest.join("pg_wal/archive_status"))?;
        let conninfo = format!(
            "host={} port={} user={}",
            self.socket_dir.display(),
            self.port,
            self.superuser
        );
        let files = [
            ("backup_label", label),
            ("standby.signal", String::new()),
            (
                "postgresql.auto.conf",
                format!(
                    "{}primary_conninfo = '{}'\n",
                    std::fs::read_to_string(dest.join("postgresql.auto.conf")).unwrap_or_default(),
                    conninfo.replace('\'', "''")
                ),
            ),
        ];
        for (name, contents) in files {
            let path = dest.join(name);
            std::fs::write(&path, contents)?;
            self.chown_to_server_user(&path)?;
        }
        Ok(())
    }

    /// A streaming standby of this cluster (pg_basebackup -R), started on its own port, once
    /// the primary sees it streaming.
    pub fn start_standby(&self) -> Result<LocalPg> {
        let root = tempfile::Builder::new()
            .prefix("pgmend-standby-")
            .tempdir()?
            .keep();
        let socket_dir = root.join("socket");
        std::fs::create_dir(&socket_dir)?;
        if let Some(user) = &self.run_as {
            let status = Command::new("chown")
                .args(["-R", &format!("{user}:"), &root.display().to_string()])
                .status()?;
            if !status.success() {
                bail!("chown of {} to {user} failed", root.display());
            }
        }
        let mut standby = LocalPg {
            bin_dir: self.bin_dir.clone(),
            root,
            port: 0,
            socket_dir,
            superuser: self.superuser.clone(),
            password: self.password.clone(),
            run_as: self.run_as.clone(),
            keep: self.keep,
        };
        if self.bin_dir.join("pg_basebackup").is_file() {
            standby.run(
                "pg_basebackup",
                &[
                    "-h",
                    &self.socket_dir.display().to_string(),
                    "-p",
                    &self.port.to_string(),
                    "-U",
                    &self.superuser,
                    "-D",
                    &standby.data_dir().display().to_string(),
                    "-R",
                    "-X",
                    "stream",
                    // An immediate checkpoint: the default spread one waits up to 4.5 min
                    // on a primary just written to (checkpoint_completion_target of 5 min).
                    "--checkpoint=fast",
                ],
            )?;
        } else {
            self.copy_base_backup(&standby.data_dir())?;
        }
        if !self.keep {
            standby.spawn_watchdog()?;
        }
        let mut last_error = None;
        for _ in 0..5 {
            standby.port = free_port()?;
            match standby.start_server() {
                Ok(()) => {
                    self.wait_until_streaming()?;
                    return Ok(standby);
                }
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap())
    }

    /// Waits (up to a minute) until this primary has a standby streaming from it.
    fn wait_until_streaming(&self) -> Result<()> {
        let mut c = postgres::Client::connect(&self.conninfo("postgres"), postgres::NoTls)?;
        let started = std::time::Instant::now();
        while c
            .query_one(
                "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'",
                &[],
            )?
            .get::<_, i64>(0)
            == 0
        {
            if started.elapsed() > std::time::Duration::from_secs(60) {
                bail!("the standby did not stream from the primary within a minute");
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Ok(())
    }

    /// A keyword/value connection string over TCP, with the password.
    pub fn conninfo(&self, dbname: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={} password={} dbname={dbname} sslmode=disable",
            self.port, self.superuser, self.password
        )
    }

    /// The same as a URL.
    pub fn url(&self, dbname: &str) -> String {
        format!(
            "postgresql://{}:{}@127.0.0.1:{}/{dbname}?sslmode=disable",
            self.superuser, self.password, self.port
        )
    }

    /// Stops the server at once and deletes its files.
    pub fn stop(&self) {
        let _ = self.run(
            "pg_ctl",
            &[
                "-D",
                &self.root.join("data").display().to_string(),
                "stop",
                "-m",
                "immediate",
            ],
        );
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

impl Drop for LocalPg {
    fn drop(&mut self) {
        if !self.keep {
            self.stop();
        }
    }
}

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free local port")?;
    Ok(listener.local_addr()?.port())
}
