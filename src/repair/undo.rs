//! Undo: put back the before-images a run recorded, in batches, after checking that none of
//! its rows changed since and that the restored rows would not break a unique index.
//!
//! `undo` refuses an unfinished run or an undo run (exit 2) and an already undone run (`Stopped`),
//! creates pgmend's schema if needed, then derives the run's `Shape` from the repair's current
//! definition (table, key columns with types, columns to restore and to compare, and for void runs
//! whether a unique index covers exactly the group columns). `conflicts` lists the ledger rows
//! whose table row no longer holds the recorded `after` (or is gone) and, with such a unique index,
//! the rows whose restore would leave a group with a second live row (its live rows now plus the
//! rows the undo makes live, counted once per group by a window); any conflict is `Stopped`
//! with up to 20 of them. Then an undo run (`undo:NAME`, kind `undo`) works through the ledger in
//! pages of 1,000 records (`store::runs::ledger_page`, keyset on `ledger_id`), each one transaction
//! under the lock policy: `update` records get their `before` values back (ledger `restore`),
//! `insert` records' rows are deleted (ledger `delete`), and the undo run's checkpoint advances.
//! Finally both runs are linked (`undoes_run`, `undone_by_run`). An undo run of the same run still
//! `running` (the last attempt stopped) is resumed instead of creating a new one: `conflicts` and
//! the batches only consider ledger records after its checkpoint, and the report's counts are read
//! back from its ledger.

use anyhow::{bail, Result};
use serde::Serialize;

use super::catalog::{column_type, column_types};
use super::definition::{Repair, Spec};
use crate::db::retry::{with_lock_retry, LockPolicy};
use crate::db::sql_text::{column_list, key_match, CheckBody, Ident, Literal, TypeName};
use crate::error::{PgContext, Stopped};
use crate::store::{self, Run, RunState};

#[derive(Debug, Serialize)]
pub struct UndoReport {
    pub undone_run: i64,
    pub undo_run: i64,
    pub restored: i64,
    pub deleted: i64,
}

/// The table, its key columns and types, and the columns a run changed (with types).
struct Shape {
    table: Ident,
    keys: Vec<(Ident, TypeName)>,
    restore: Vec<(Ident, TypeName)>,
    /// Columns recorded in `after` that must still hold those values.
    compare: Vec<(Ident, TypeName)>,
    /// For void runs: the group columns and whether a unique index covers them.
    unique_group: Option<Vec<Ident>>,
    mark: Option<Ident>,
    /// For orphans runs whose table has a foreign key on the repaired columns (validated or
    /// `NOT VALID`: both check what is written): the referenced table, the table's columns and
    /// the referenced ones, typed. A restored reference must find its row.
    references: Option<References>,
    /// For a quarantine run: the quarantine table its rows are in (and are taken back from),
    /// and the table's columns a row is put back with (a generated column computes itself).
    quarantine: Option<(Ident, Vec<Ident>)>,
}

/// A foreign key a restore must keep: the referenced table, the table's columns with their
/// types, the referenced columns.
type References = (Ident, Vec<(Ident, TypeName)>, Vec<Ident>);

fn shape(client: &mut postgres::Client, repair: &Repair) -> Result<Shape> {
    match &repair.spec {
        Spec::VoidDuplicates(v) => {
            let typed =
                |c: &mut postgres::Client, cols: &[Ident]| -> Result<Vec<(Ident, TypeName)>> {
                    Ok(cols
                        .iter()
                        .cloned()
                        .zip(column_types(c, &v.table, cols)?)
                        .collect())
                };
            let restore = typed(client, &[v.mark.clone(), v.void.clone()])?;
            let mut compare = restore.clone();
            if let Some(k) = &v.keep_when_not_null {
                compare.extend(typed(client, std::slice::from_ref(k))?);
            }
            let group_cols: Vec<Ident> = v.group_by.clone();
            let group_names: Vec<&str> = group_cols.iter().map(Ident::as_str).collect();
            let unique: bool = client
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = to_regclass(quote_ident($1)) AND i.indisunique
                        AND (SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_attribute a
                              WHERE a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)) = (SELECT array_agg(x ORDER BY x) FROM unnest($2::text[]) x))",
                    &[&v.table.as_str(), &group_names],
                )
                .doing("looking for a unique index on the groups")?
                .get(0);
            Ok(Shape {
                table: v.table.clone(),
                keys: typed(client, std::slice::from_ref(&v.row_key))?,
                restore,
                compare,
                unique_group: unique.then_some(group_cols),
                mark: Some(v.mark.clone()),
                references: None,
                quarantine: None,
            })
        }
        Spec::Backfill(b) => {
            let columns: Vec<Ident> = b.set.keys().cloned().collect();
            let restore: Vec<(Ident, TypeName)> = columns
                .iter()
                .cloned()
                .zip(column_types(client, &b.table, &columns)?)
                .collect();
            Ok(Shape {
                table: b.table.clone(),
                keys: vec![(
                    b.row_key.clone(),
                    column_type(client, &b.table, &b.row_key)?,
                )],
                compare: restore.clone(),
                restore,
                unique_group: None,
                mark: None,
                references: None,
                quarantine: None,
            })
        }
        Spec::Orphans(o) => {
            let engine = super::orphans::OrphansEngine::prepare(client, o)?;
            let typed_columns: Vec<(Ident, TypeName)> = o
                .columns
                .iter()
                .cloned()
                .zip(column_types(client, &o.table, &o.columns)?)
                .collect();
            let names: Vec<&str> = o.columns.iter().map(Ident::as_str).collect();
            let has_key: bool = client
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.contype = 'f' AND c.conrelid = to_regclass(quote_ident($1))
                        AND (SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_attribute a
                              WHERE a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)) = (SELECT array_agg(x ORDER BY x) FROM unnest($2::text[]) x))",
                    &[&o.table.as_str(), &names],
                )
                .doing("looking for a foreign key on the repaired columns")?
                .get(0);
            let quarantine = match engine.quarantine {
                Some((table, _)) => {
                    let columns: Vec<String> = client
                        .query_one(
                            "SELECT array(SELECT attname::text FROM pg_attribute
                                           WHERE attrelid = to_regclass(quote_ident($1)) AND attnum > 0 AND NOT attisdropped
                                             AND attgenerated = '' ORDER BY attnum)",
                            &[&o.table.as_str()],
                        )
                        .doing("reading the columns a quarantined row is put back with")?
                        .get(0);
                    Some((table, columns.into_iter().map(Ident::new).collect()))
                }
                None => None,
            };
            Ok(Shape {
                table: o.table.clone(),
                keys: vec![(o.row_key.clone(), engine.key_type)],
                restore: if quarantine.is_some() {
                    Vec::new()
                } else {
                    typed_columns.clone()
                },
                compare: if quarantine.is_some() {
                    Vec::new()
                } else {
                    typed_columns.clone()
                },
                unique_group: None,
                mark: None,
                references: has_key.then(|| {
                    (
                        o.references.table.clone(),
                        typed_columns,
                        o.references.columns.clone(),
                    )
                }),
                quarantine,
            })
        }
        Spec::RebuildCounter(c) => {
            let keys = c
                .key
                .iter()
                .cloned()
                .zip(column_types(client, &c.counter_table, &c.key)?)
                .collect();
            let restore: Vec<(Ident, TypeName)> = vec![(
                c.counter.clone(),
                column_type(client, &c.counter_table, &c.counter)?,
            )];
            Ok(Shape {
                table: c.counter_table.clone(),
                keys,
                compare: restore.clone(),
                restore,
                unique_group: None,
                mark: None,
                references: None,
                quarantine: None,
            })
        }
    }
}

impl Shape {
    /// Row `t` of the table is the row of ledger record `l`.
    fn join(&self) -> String {
        self.keys
            .iter()
            .map(|(k, ty)| format!("t.{k} = (l.row_key->>{})::{ty}", k.literal()))
            .collect::<Vec<_>>()
            .join(" AND ")
    }

    fn changed_since(&self) -> String {
        let diffs: Vec<String> = self
            .compare
            .iter()
            .map(|(c, ty)| {
                format!(
                    "(l.after->>{})::{ty}::text IS DISTINCT FROM t.{}::text",
                    c.literal(),
                    c
                )
            })
            .collect();
        if diffs.is_empty() {
            return format!("t.{} IS NULL", &self.keys[0].0);
        }
        format!(
            "(t.{k} IS NULL OR {})",
            diffs.join(" OR "),
            k = &self.keys[0].0
        )
    }
}

/// Rows of `run` that undo cannot restore, in words (at most 20), and how many in all.
fn conflicts(
    client: &mut impl postgres::GenericClient,
    shape: &Shape,
    run_id: i64,
    after_ledger_id: i64,
) -> Result<(i64, Vec<String>)> {
    let mut sql = format!(
        "SELECT l.row_key::text, 'changed since the run: now ' || coalesce(to_jsonb(t)::text, 'deleted')
           FROM {ledger} l LEFT JOIN {table} t ON {join}
          WHERE l.run_id = $1 AND l.ledger_id > $2 AND l.action IN ('update', 'insert') AND {changed}",
        ledger = store::ledger(),
        table = shape.table,
        join = shape.join(),
        changed = shape.changed_since(),
    );
    if let (Some(groups), Some(mark)) = (&shape.unique_group, &shape.mark) {
        // Per row to restore: the live rows its group has now, plus the rows of its group the
        // undo makes live again (a window over them all, so that each group is counted once
        // rather than the whole ledger read again per row: 10 minutes at 10,000 records).
        sql.push_str(&format!(
            " UNION ALL
             SELECT r.pgmend_row_key::text, 'restoring it would give its group a second live row, which the unique index rejects'
               FROM (SELECT l.row_key AS pgmend_row_key, {group_of_t},
                            count(*) OVER (PARTITION BY {group_of_t}) AS pgmend_restoring
                       FROM {ledger} l JOIN {table} t ON {join}
                      WHERE l.run_id = $1 AND l.ledger_id > $2 AND (l.before->>{ml})::boolean = false) r
              WHERE r.pgmend_restoring + (SELECT count(*) FROM {table} o WHERE {same_group} AND NOT o.{m}) > 1",
            ledger = store::ledger(),
            table = shape.table,
            join = shape.join(),
            ml = mark.literal(),
            m = mark,
            group_of_t = column_list("t", groups),
            same_group = key_match("o", "r", groups),
        ));
    }
    if shape.quarantine.is_some() {
        // A row put back must not meet a row of the same key the application wrote since.
        sql.push_str(&format!(
            " UNION ALL
             SELECT l.row_key::text, 'a row with its key exists again: ' || to_jsonb(t)::text
               FROM {ledger} l JOIN {table} t ON {join}
              WHERE l.run_id = $1 AND l.ledger_id > $2 AND l.action = 'delete'",
            ledger = store::ledger(),
            table = shape.table,
            join = shape.join(),
        ));
    }
    if let Some((parent, columns, parent_columns)) = &shape.references {
        let restored: Vec<String> = columns
            .iter()
            .map(|(c, ty)| format!("(l.before->>{})::{ty}", c.literal()))
            .collect();
        let on = parent_columns
            .iter()
            .zip(&restored)
            .map(|(p, v)| format!("p.{p} = {v}"))
            .collect::<Vec<_>>()
            .join(" AND ");
        sql.push_str(&format!(
            " UNION ALL
             SELECT l.row_key::text, 'restoring it would break the foreign key on ({cols}): no row of {parent_name} has ' || concat_ws(', ', {restored_list}) || ' now'
               FROM {ledger} l
              WHERE l.run_id = $1 AND l.ledger_id > $2 AND l.action IN ('update', 'delete')
                AND {not_null} AND NOT EXISTS (SELECT 1 FROM {parent} p WHERE {on})",
            cols = columns.iter().map(|(c, _)| c.as_str()).collect::<Vec<_>>().join(", "),
            parent_name = parent.as_str(),
            restored_list = restored.join(", "),
            ledger = store::ledger(),
            not_null = restored
                .iter()
                .map(|v| format!("{v} IS NOT NULL"))
                .collect::<Vec<_>>()
                .join(" AND "),
        ));
    }
    // A restored row must pass the table's CHECK constraints (NOT VALID ones too: they check
    // what is written), as its before-image over the row as it is now (or alone, for a row put
    // back from a quarantine).
    for (name, body) in
        CheckBody::of_table(client, &shape.table).doing("reading the table's checks")?
    {
        sql.push_str(&format!(
            " UNION ALL
             SELECT l.row_key::text, {says}
               FROM {ledger} l LEFT JOIN {table} t ON {join}
              WHERE l.run_id = $1 AND l.ledger_id > $2 AND l.action IN ('update', 'delete')
                AND EXISTS (SELECT 1 FROM (SELECT (jsonb_populate_record(CASE WHEN l.action = 'delete' THEN NULL::{table} ELSE t END, l.before)).*) pgmend_restored
                             WHERE NOT ({body}))",
            says = Literal::new(format!("restoring it would break CHECK {name}")),
            ledger = store::ledger(),
            table = shape.table,
            join = shape.join(),
        ));
    }
    let rows = client
        .query(
            &format!("SELECT count(*) OVER (), * FROM ({sql}) c LIMIT 20"),
            &[&run_id, &after_ledger_id],
        )
        .doing("checking what undo would restore")?;
    let total = rows.first().map(|r| r.get::<_, i64>(0)).unwrap_or(0);
    Ok((
        total,
        rows.iter()
            .map(|r| format!("{}: {}", r.get::<_, String>(1), r.get::<_, String>(2)))
            .collect(),
    ))
}

/// Undoes `run`: refuses what cannot be undone, checks that every row can be restored, then
/// restores the ledger's before-images in batches of 1,000 records (each batch one
/// transaction with the undo run's checkpoint), resuming an undo that stopped part-way.
pub fn undo(
    client: &mut postgres::Client,
    repair: &Repair,
    run: &Run,
    policy: &LockPolicy,
    progress: &mut dyn FnMut(&str),
) -> Result<UndoReport> {
    refuse_unless_undoable(run)?;
    store::ensure(client, policy)?;
    let shape = shape(client, repair)?;
    // An undo that stopped part-way (a kill, a lock budget, a lost connection) is resumed:
    // its checkpoint is the last ledger record of the undone run it restored, and every
    // batch restored its records and advanced the checkpoint in one transaction.
    let unfinished = store::runs::unfinished_undo(client, run.run_id)?;
    let checkpoint_at_start = unfinished.map_or(0, |(_, checkpoint)| checkpoint);
    refuse_conflicts(
        client,
        &shape,
        run,
        unfinished.is_some(),
        checkpoint_at_start,
    )?;
    let undo_run = match unfinished {
        Some((undo_run, checkpoint)) => {
            progress(&format!(
                "resuming undo run {undo_run} of run {} after ledger record {checkpoint}",
                run.run_id
            ));
            undo_run
        }
        None => store::runs::create_undo(client, run.run_id)?,
    };
    let statements = RestoreSql::new(&shape);
    let (mut restored, mut deleted) = store::runs::undo_counts(client, undo_run)?;
    let mut checkpoint = checkpoint_at_start;
    // The progress apply shows: a bar on a terminal, elsewhere a line at most every 2 s.
    let name = format!("undo of run {}", run.run_id);
    let mut shown = super::batch::Progress::new(&name, run.changed, restored + deleted, None);
    loop {
        let batch = with_lock_retry(
            client,
            policy,
            &format!("undoing run {}", run.run_id),
            &[],
            |c| {
                Ok(restore_batch(
                    c,
                    policy,
                    &statements,
                    (run.run_id, undo_run),
                    checkpoint,
                )?)
            },
        )?;
        let Some((last, r, d)) = batch else { break };
        checkpoint = last;
        restored += r;
        deleted += d;
        shown.show((restored + deleted, run.changed), restored, None, progress);
    }
    shown.finish((restored + deleted, run.changed), restored, progress);
    store::runs::finish_undo(client, undo_run, run.run_id)?;
    Ok(UndoReport {
        undone_run: run.run_id,
        undo_run,
        restored,
        deleted,
    })
}

/// The rules: an unfinished run, a run already undone and an undo run are not undone.
fn refuse_unless_undoable(run: &Run) -> Result<()> {
    if run.state == RunState::Running {
        bail!("run {} of {} is unfinished; resume it (pgmend repair apply {} --yes) or abandon it (pgmend repair abandon {} --yes) before undoing it", run.run_id, run.repair, run.repair, run.run_id);
    }
    if let Some(by) = run.undone_by_run {
        return Err(Stopped::error(format!(
            "run {} was already undone by run {by}; nothing to do",
            run.run_id
        )));
    }
    if run.undoes_run.is_some() {
        bail!(
            "run {} is itself an undo; to put its changes back, run the repair again",
            run.run_id
        );
    }
    Ok(())
}

/// Refuses the whole undo (exit 1, nothing changed by this attempt) when any row left to
/// restore changed since the run or would break the unique index.
fn refuse_conflicts(
    client: &mut postgres::Client,
    shape: &Shape,
    run: &Run,
    resuming: bool,
    after_ledger_id: i64,
) -> Result<()> {
    let (count, sample) = conflicts(client, shape, run.run_id, after_ledger_id)?;
    if count == 0 {
        return Ok(());
    }
    Err(Stopped::error(format!(
        "undo of run {} refused; nothing was changed{}. {} cannot be restored:\n  - {}{}",
        run.run_id,
        if resuming {
            " by this attempt (the rows its earlier attempt restored stay restored)"
        } else {
            ""
        },
        crate::human::count(count, "row"),
        sample.join("\n  - "),
        if count > sample.len() as i64 {
            format!(
                "\n  - ... and {} more",
                crate::human::int(count - sample.len() as i64)
            )
        } else {
            String::new()
        }
    )))
}

/// The two statements of an undo batch, over ledger records `$2` of undone run `$3`,
/// recording into undo run `$1`: restore updated rows, delete created ones.
struct RestoreSql {
    /// None when the run changed no column (a quarantine deletes rows).
    restore: Option<String>,
    delete: String,
    /// A quarantine's: put the deleted rows back from their before-image, and take them out of
    /// the quarantine table.
    reinsert: Option<String>,
}

impl RestoreSql {
    fn new(shape: &Shape) -> RestoreSql {
        let sets = shape
            .restore
            .iter()
            .map(|(c, ty)| format!("{c} = (l.before->>{})::{ty}", c.literal()))
            .collect::<Vec<_>>()
            .join(", ");
        let compare_obj = shape
            .compare
            .iter()
            .map(|(c, _)| format!("{}, t.{c}", c.literal()))
            .collect::<Vec<_>>()
            .join(", ");
        let records = |action: &str| {
            format!(
                "SELECT * FROM {} WHERE run_id = $3 AND ledger_id = ANY ($2) AND action = '{action}'",
                store::ledger()
            )
        };
        let key = &shape.keys[0];
        RestoreSql {
            reinsert: shape.quarantine.as_ref().map(|(quarantine, columns)| {
                format!(
                    "WITH l AS ({records}),
                     back AS (INSERT INTO {table} ({cols}) OVERRIDING SYSTEM VALUE
                              SELECT {r_cols} FROM l CROSS JOIN LATERAL jsonb_populate_record(NULL::{table}, l.before) r RETURNING *),
                     out AS (DELETE FROM {quarantine} q USING l
                              WHERE q.pgmend_run_id = $3 AND q.{k} = (l.row_key->>{kl})::{kt})
                     {ledger_insert}
                     SELECT $1, {tl}, jsonb_build_object({kl}, b.{k}), 'insert', NULL, to_jsonb(b),
                            'undo of run ' || $3::bigint || ': put back from ' || {ql} FROM back b",
                    records = records("delete"),
                    table = shape.table,
                    cols = column_list("", columns),
                    r_cols = column_list("r", columns),
                    k = key.0,
                    kl = key.0.literal(),
                    kt = key.1,
                    ledger_insert = store::ledger_insert(),
                    tl = shape.table.literal(),
                    ql = quarantine.literal(),
                )
            }),
            restore: (!shape.restore.is_empty()).then(|| format!(
                "WITH l AS ({records}),
                 upd AS (UPDATE {table} t SET {sets} FROM l WHERE {join} RETURNING l.row_key, l.after, jsonb_build_object({compare_obj}) AS now)
                 {ledger_insert}
                 SELECT $1, {tl}, row_key, 'restore', after, now, 'undo of run ' || $3::bigint FROM upd",
                records = records("update"),
                table = shape.table,
                join = shape.join(),
                ledger_insert = store::ledger_insert(),
                tl = shape.table.literal(),
            )),
            delete: format!(
                "WITH l AS ({records}),
                 del AS (DELETE FROM {table} t USING l WHERE {join} RETURNING l.row_key, l.after)
                 {ledger_insert}
                 SELECT $1, {tl}, row_key, 'delete', after, NULL, 'undo of run ' || $3::bigint || ': the run created this row' FROM del",
                records = records("insert"),
                table = shape.table,
                join = shape.join(),
                ledger_insert = store::ledger_insert(),
                tl = shape.table.literal(),
            ),
        }
    }
}

/// One undo batch in one transaction: the next ledger records of the undone run after
/// `checkpoint`, restored and recorded, and the undo run's checkpoint. None when none are
/// left; else (last ledger id, rows restored, rows deleted).
fn restore_batch(
    c: &mut postgres::Client,
    policy: &LockPolicy,
    sql: &RestoreSql,
    (run_id, undo_run): (i64, i64),
    checkpoint: i64,
) -> Result<Option<(i64, i64, i64)>, postgres::Error> {
    let mut tx = c.transaction()?;
    tx.batch_execute(&policy.set_local_sql())?;
    let ids = store::runs::ledger_page(&mut tx, run_id, checkpoint)?;
    let Some(&last) = ids.last() else {
        return Ok(None);
    };
    let mut r = match &sql.restore {
        Some(restore) => tx.execute(restore, &[&undo_run, &ids, &run_id])? as i64,
        None => 0,
    };
    if let Some(reinsert) = &sql.reinsert {
        r += tx.execute(reinsert, &[&undo_run, &ids, &run_id])? as i64;
    }
    let d = tx.execute(&sql.delete, &[&undo_run, &ids, &run_id])? as i64;
    store::runs::advance_undo(&mut tx, undo_run, last, ids.len() as i64, r + d)?;
    tx.commit()?;
    Ok(Some((last, r, d)))
}
