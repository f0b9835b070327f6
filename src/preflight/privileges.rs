//! The preflight privilege check: before a command that changes the database changes
//! anything, it asks the server whether the connected role may do every kind of change the
//! pending work will make (own the tables it alters or indexes, create tables in the schema,
//! create pgmend's schema, write the tables a repair changes), and refuses with the whole
//! list of what is missing (exit 2). Without it a release could apply V2, then fail at the
//! first repair's `CREATE SCHEMA pgmend` and leave the release half-done.
//!
//! The check is about privileges only. A table that does not exist yet is skipped: an
//! earlier step creates it, and its creator owns it.
//!
//! Run by `migrate apply`, `migrate baseline`, `apply` and `repair apply` right after the runner
//! lock and before any change. `for_migrations`, `for_history` (the history table alone, for
//! `migrate baseline`), `for_release` and `for_repair` derive what the pending work needs from the
//! statements and definitions (own the tables it alters or indexes, CREATE on the schema for
//! new tables, CREATE on the database for schema `pgmend` or USAGE and table privileges on it when
//! it exists, REFERENCES, SELECT/INSERT/UPDATE on a repair's tables); `check` asks the server
//! (`pg_has_role(relowner, 'USAGE')`, `has_*_privilege`) and refuses with every missing item, its
//! source (`V2__expand_for_repair, line 4: ALTER TABLE issued_coupons`) and the GRANT to run (exit
//! 2, nothing changed); `missing` returns the same list for `plan`'s blockers.

use anyhow::{bail, Result};
use postgres::Client;

use crate::db::sql_text::Ident;
use crate::migrate::source::Migration;
use crate::release::{Progress, Step};
use crate::repair::definition::{Repair, Spec};
use crate::statements::{LockMode, Statement};

/// One privilege the pending work needs, and why (for the message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    pub kind: Kind,
    pub why: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// Create table `.0` in the current schema, unless it already exists.
    CreateTable(String),
    /// Create schema `.0` (CREATE on the database), unless it already exists.
    CreateSchema(String),
    /// USAGE on schema `.0`, when it exists.
    SchemaUsage(String),
    /// Be the owner (or a member of the owning role) of table `.0`, when it exists.
    Owner(String),
    /// A table privilege (`SELECT`, `INSERT`, `UPDATE`, `REFERENCES`) on table `.0`, when it
    /// exists.
    Table(String, &'static str),
}

fn need(kind: Kind, why: impl Into<String>) -> Need {
    Need {
        kind,
        why: why.into(),
    }
}

/// What applying these migrations needs, with the history table refinery's format keeps.
pub fn for_migrations<'a>(migrations: impl IntoIterator<Item = &'a Migration>) -> Vec<Need> {
    let mut needs = Vec::new();
    let mut any = false;
    for m in migrations {
        any = true;
        needs.extend(for_statements(&m.label(), &m.statements));
    }
    if any {
        needs.extend(for_history("recording applied migrations"));
    }
    needs
}

/// What recording migrations in the history needs: creating refinery's history table in the
/// current schema unless it exists, and inserting into it. `migrate baseline` needs this alone.
pub fn for_history(why: &str) -> Vec<Need> {
    let table = crate::migrate::history::TABLE;
    vec![
        need(Kind::CreateTable(table.into()), why),
        need(Kind::Table(table.into(), "INSERT"), why),
    ]
}

/// What a migration's statements need, read from their analysis: `ALTER TABLE` and
/// `CREATE INDEX` need the table's owner, `CREATE TABLE` CREATE on the schema, a
/// `REFERENCES` (its SHARE ROW EXCLUSIVE) the REFERENCES privilege on the referenced table, and
/// a partition's parent (`CREATE TABLE ... PARTITION OF`) or the partition attached (their ACCESS
/// EXCLUSIVE) its owner; the partition detached, nothing (the table's owner detaches it). Other statements are left to the server (they run in the
/// migration's transaction).
pub fn for_statements(label: &str, statements: &[Statement]) -> Vec<Need> {
    let mut needs = Vec::new();
    for s in statements {
        let why = format!("{label}, line {}: {}", s.line, s.summary);
        let mut locks = s.locks.iter();
        if s.summary.starts_with("ALTER TABLE") {
            if let Some(first) = locks.next() {
                needs.push(need(Kind::Owner(first.relation.clone()), why.clone()));
            }
        } else if s.summary.starts_with("CREATE TABLE") {
            for t in &s.creates_tables {
                needs.push(need(Kind::CreateTable(t.clone()), why.clone()));
            }
        } else if s.summary.starts_with("CREATE INDEX")
            || s.summary.starts_with("CREATE UNIQUE INDEX")
        {
            if let Some(first) = locks.next() {
                needs.push(need(Kind::Owner(first.relation.clone()), why.clone()));
            }
            continue;
        } else {
            continue;
        }
        for other in locks {
            let kind = if other.mode == LockMode::ShareRowExclusive {
                Kind::Table(other.relation.clone(), "REFERENCES")
            } else if crate::statements::detaches_partition(s) {
                continue;
            } else {
                Kind::Owner(other.relation.clone())
            };
            needs.push(need(kind, why.clone()));
        }
    }
    needs
}

/// pgmend's own schema and tables, which every repair run and confirmed gate writes.
pub fn for_pgmend_schema(why: &str) -> Vec<Need> {
    let mut needs = vec![
        need(Kind::CreateSchema("pgmend".into()), why),
        need(Kind::SchemaUsage("pgmend".into()), why),
    ];
    for (table, privileges) in crate::store::TABLE_PRIVILEGES {
        let table = crate::store::table(table).minimal();
        for p in privileges {
            needs.push(need(Kind::Table(table.clone(), p), why));
        }
    }
    needs
}

/// What running a repair needs: pgmend's schema, and the rows it reads and writes.
pub fn for_repair(repair: &Repair) -> Vec<Need> {
    let why = format!("repair {}", repair.name);
    let mut needs = for_pgmend_schema(&why);
    let mut table = |t: &str, privileges: &[&'static str]| {
        for p in privileges {
            needs.push(need(Kind::Table(Ident::new(t).minimal(), p), why.clone()));
        }
    };
    match &repair.spec {
        Spec::VoidDuplicates(v) => table(v.table.as_str(), &["SELECT", "UPDATE"]),
        Spec::Backfill(b) => table(b.table.as_str(), &["SELECT", "UPDATE"]),
        Spec::Orphans(o) => {
            table(o.references.table.as_str(), &["SELECT"]);
            match o.quarantine() {
                None => table(o.table.as_str(), &["SELECT", "UPDATE"]),
                Some(q) => {
                    table(o.table.as_str(), &["SELECT", "DELETE"]);
                    // Created by the run when missing; when it exists, written and read back by undo.
                    table(q.as_str(), &["SELECT", "INSERT", "DELETE"]);
                }
            }
        }
        Spec::RebuildCounter(c) => {
            table(c.counter_table.as_str(), &["SELECT", "INSERT", "UPDATE"]);
            table(c.source_table.as_str(), &["SELECT"]);
            if c.keys_from.as_str() != "source" {
                table(c.keys_from.as_str(), &["SELECT"]);
            }
        }
    }
    if let Spec::Orphans(o) = &repair.spec {
        if let Some(q) = o.quarantine() {
            needs.push(need(Kind::CreateTable(q.as_str().to_string()), why));
        }
    }
    needs
}

/// What `pgmend apply` will need for the steps it runs now: every step not done yet, up to
/// the first gate not named by `--confirm`.
pub fn for_release(
    steps: &[Step],
    progress: &Progress,
    migrations: &[Migration],
    repairs: &[Repair],
    confirmed: &[String],
) -> Vec<Need> {
    let mut needs = Vec::new();
    let mut up_to: Option<i32> = None;
    let repair = |name: &str, needs: &mut Vec<Need>| {
        if let Some(r) = repairs.iter().find(|r| r.name == name) {
            needs.extend(for_repair(r));
        }
    };
    for (i, step) in steps.iter().enumerate() {
        if progress.done(i, step) {
            continue;
        }
        match step {
            Step::Migrate {
                version,
                retry_with,
            } => {
                up_to = up_to.max(Some(*version));
                if let Some(name) = retry_with {
                    repair(name, &mut needs);
                }
            }
            Step::Repair { name } => {
                repair(name, &mut needs);
                needs.extend(for_pgmend_schema(&format!("recording step {}", i + 1)));
            }
            Step::Gate { name, .. } => {
                if !confirmed.contains(name) {
                    break;
                }
                needs.extend(for_pgmend_schema(&format!("confirming gate {name}")));
            }
        }
    }
    // The walk records the release itself first (`release::identity::enter`); listed last, so
    // that a privilege a step needs too is named with that step.
    if steps.iter().enumerate().any(|(i, s)| !progress.done(i, s)) {
        needs.extend(for_pgmend_schema("recording the release"));
    }
    if let Some(up_to) = up_to {
        let pending = migrations
            .iter()
            .filter(|m| m.version <= up_to && !progress.applied_versions.contains(&m.version));
        let mut first = for_migrations(pending);
        first.append(&mut needs);
        needs = first;
    }
    needs
}

/// Asks the server about every need and refuses, listing everything missing and how to
/// grant it, before anything is changed. `what` names the work (`this release`).
pub fn check(client: &mut Client, what: &str, needs: &[Need]) -> Result<()> {
    let (me, missing) = missing(client, needs)?;
    if !missing.is_empty() {
        bail!(
            "role {me} lacks privileges that {what} needs; nothing was changed:\n  - {}\nGrant them (or run pgmend as a role that has them), then rerun",
            missing.join("\n  - ")
        );
    }
    Ok(())
}

/// The connected role, and each of `needs` it lacks, said with what it is needed for and
/// (where one exists) the GRANT that gives it.
pub fn missing(client: &mut Client, needs: &[Need]) -> Result<(String, Vec<String>)> {
    let row = client
        .query_one(
            "SELECT current_user::text, current_database()::text, current_schema()::text",
            &[],
        )
        .map_err(|e| anyhow::anyhow!("checking privileges: {}", crate::error::describe(&e)))?;
    let (me, database, schema): (String, String, Option<String>) =
        (row.get(0), row.get(1), row.get(2));
    let mut missing: Vec<String> = Vec::new();
    let mut seen: Vec<&Kind> = Vec::new();
    for n in needs {
        if seen.contains(&&n.kind) {
            continue;
        }
        seen.push(&n.kind);
        if let Some(problem) = check_one(client, n, &me, &database, schema.as_deref()) {
            missing.push(format!("{problem} (needed for {})", n.why));
        }
    }
    Ok((me, missing))
}

/// One need: `None` when it is met (or cannot apply yet), else what is missing and the fix.
fn check_one(
    client: &mut Client,
    n: &Need,
    me: &str,
    database: &str,
    schema: Option<&str>,
) -> Option<String> {
    let me_q = Ident::new(me).minimal();
    match &n.kind {
        Kind::CreateTable(table) => {
            let row = ask(
                client,
                "SELECT to_regclass($1) IS NOT NULL, has_schema_privilege(current_schema(), 'CREATE')",
                &[table],
            )?;
            let (exists, may_create): (bool, Option<bool>) = (row.get(0), row.get(1));
            if exists || may_create == Some(true) {
                return None;
            }
            Some(match schema {
                Some(s) => format!(
                    "CREATE on schema {s}, to create table {table}: GRANT CREATE ON SCHEMA {} TO {me_q}",
                    Ident::new(s).minimal()
                ),
                None => format!(
                    "a schema to create table {table} in: no schema on the search_path exists; set search_path (PGOPTIONS='-c search_path=...') or create the schema"
                ),
            })
        }
        Kind::CreateSchema(name) => {
            let row = ask(
                client,
                "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1), has_database_privilege(current_database(), 'CREATE')",
                &[name],
            )?;
            let (exists, may_create): (bool, bool) = (row.get(0), row.get(1));
            if exists || may_create {
                return None;
            }
            Some(format!(
                "CREATE on database {database}, to create pgmend's schema {name}: GRANT CREATE ON DATABASE {} TO {me_q} (or have the database owner run CREATE SCHEMA {name} AUTHORIZATION {me_q})",
                Ident::new(database).minimal()
            ))
        }
        Kind::SchemaUsage(name) => {
            let row = ask(
                client,
                "SELECT has_schema_privilege(oid, 'USAGE') FROM pg_namespace WHERE nspname = $1",
                &[name],
            )?;
            if row.get::<_, bool>(0) {
                return None;
            }
            Some(format!(
                "USAGE on schema {name}: GRANT USAGE ON SCHEMA {} TO {me_q}",
                Ident::new(name).minimal()
            ))
        }
        Kind::Owner(table) => {
            let row = ask(
                client,
                "SELECT pg_has_role(relowner, 'USAGE'), pg_get_userbyid(relowner)::text FROM pg_class WHERE oid = to_regclass($1)",
                &[table],
            )?;
            let (owns, owner): (bool, String) = (row.get(0), row.get(1));
            if owns {
                return None;
            }
            Some(format!(
                "ownership of table {table} (owned by {owner}; ALTER TABLE and CREATE INDEX need the owner): run pgmend as {owner}, or GRANT {} TO {me_q}",
                Ident::new(&owner).minimal()
            ))
        }
        Kind::Table(table, privilege) => {
            let row = ask(
                client,
                "SELECT has_table_privilege(c, $2) FROM to_regclass($1) c WHERE c IS NOT NULL",
                &[table, privilege],
            )?;
            if row.get::<_, bool>(0) {
                return None;
            }
            Some(format!(
                "{privilege} on table {table}: GRANT {privilege} ON {table} TO {me_q}"
            ))
        }
    }
}

/// One row of a catalog question, or `None`. A failing lookup (a name the server cannot
/// parse, say) is left to the step itself, which runs in its own transaction.
fn ask(
    client: &mut Client,
    sql: &str,
    params: &[&(dyn postgres::types::ToSql + Sync)],
) -> Option<postgres::Row> {
    client.query_opt(sql, params).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_give_their_needs() {
        let statements = crate::statements::split(
            "ALTER TABLE issued_coupons ADD COLUMN x int;
             CREATE TABLE b (id text PRIMARY KEY REFERENCES campaigns);
             CREATE INDEX CONCURRENTLY i ON issued_coupons (x);
             SELECT 1;
             CREATE TABLE e27 PARTITION OF events FOR VALUES IN (2027);
             ALTER TABLE events ATTACH PARTITION e28 FOR VALUES IN (2028);
             ALTER TABLE events DETACH PARTITION e20;",
        );
        let kinds: Vec<Kind> = for_statements("V9__x", &statements)
            .into_iter()
            .map(|n| n.kind)
            .collect();
        assert_eq!(
            kinds,
            [
                Kind::Owner("issued_coupons".into()),
                Kind::CreateTable("b".into()),
                Kind::Table("campaigns".into(), "REFERENCES"),
                Kind::Owner("issued_coupons".into()),
                // A partition's parent and the partition attached: their owner.
                Kind::CreateTable("e27".into()),
                Kind::Owner("events".into()),
                Kind::Owner("events".into()),
                Kind::Owner("e28".into()),
                Kind::Owner("events".into()),
            ]
        );
    }
}
