//! Undo: put back the before-images a run recorded, in batches, after checking that none of
//! its rows changed since and that the restored rows would not break a unique index.

use anyhow::{bail, Result};
use serde::Serialize;

use super::definition::{Repair, Spec};
use super::runner::ensure_schema;
use super::store::{column_types, q, Run};
use super::void::lit;
use crate::db::retry::{with_lock_retry, LockPolicy};
use crate::error::{PgContext, Stopped};

#[derive(Debug, Serialize)]
pub struct UndoReport {
    pub undone_run: i64,
    pub undo_run: i64,
    pub restored: i64,
    pub deleted: i64,
}

/// The table, its key columns and types, and the columns a run changed (with types).
struct Shape {
    table: String,
    keys: Vec<(String, String)>,
    restore: Vec<(String, String)>,
    /// Columns recorded in `after` that must still hold those values.
    compare: Vec<(String, String)>,
    /// For void runs: the group columns and whether a unique index covers them.
    unique_group: Option<Vec<String>>,
    mark: Option<String>,
}

fn shape(client: &mut postgres::Client, repair: &Repair) -> Result<Shape> {
    match &repair.spec {
        Spec::VoidDuplicates(v) => {
            let typed =
                |c: &mut postgres::Client, cols: &[String]| -> Result<Vec<(String, String)>> {
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
            let group_cols: Vec<String> = v.group_by.clone();
            let unique: bool = client
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = to_regclass(quote_ident($1)) AND i.indisunique
                        AND (SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_attribute a
                              WHERE a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)) = (SELECT array_agg(x ORDER BY x) FROM unnest($2::text[]) x))",
                    &[&v.table, &group_cols],
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
            })
        }
        Spec::RebuildCounter(c) => {
            let keys = c
                .key
                .iter()
                .cloned()
                .zip(column_types(client, &c.counter_table, &c.key)?)
                .collect();
            let restore: Vec<(String, String)> = vec![(
                c.counter.clone(),
                column_types(client, &c.counter_table, std::slice::from_ref(&c.counter))?.remove(0),
            )];
            Ok(Shape {
                table: c.counter_table.clone(),
                keys,
                compare: restore.clone(),
                restore,
                unique_group: None,
                mark: None,
            })
        }
    }
}

impl Shape {
    fn join(&self) -> String {
        self.keys
            .iter()
            .map(|(k, ty)| format!("t.{} = (l.row_key->>{})::{ty}", q(k), lit(k)))
            .collect::<Vec<_>>()
            .join(" AND ")
    }

    fn changed_since(&self) -> String {
        let diffs: Vec<String> = self
            .compare
            .iter()
            .map(|(c, ty)| format!("(l.after->>{})::{ty} IS DISTINCT FROM t.{}", lit(c), q(c)))
            .collect();
        format!(
            "(t.{k} IS NULL OR {})",
            diffs.join(" OR "),
            k = q(&self.keys[0].0)
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
           FROM pgmend.repair_ledger l LEFT JOIN {table} t ON {join}
          WHERE l.run_id = $1 AND l.ledger_id > $2 AND l.action IN ('update', 'insert') AND {changed}",
        table = q(&shape.table),
        join = shape.join(),
        changed = shape.changed_since(),
    );
    if let (Some(groups), Some(mark)) = (&shape.unique_group, &shape.mark) {
        let same = |a: &str, b: &str| {
            groups
                .iter()
                .map(|g| format!("{a}.{g} = {b}.{g}", g = q(g)))
                .collect::<Vec<_>>()
                .join(" AND ")
        };
        sql.push_str(&format!(
            " UNION ALL
             SELECT l.row_key::text, 'restoring it would give its group a second live row, which the unique index rejects'
               FROM pgmend.repair_ledger l JOIN {table} t ON {join}
              WHERE l.run_id = $1 AND l.ledger_id > $2 AND (l.before->>{ml})::boolean = false
                AND (SELECT count(*) FROM {table} o WHERE {same_o} AND NOT o.{m})
                  + (SELECT count(*) FROM pgmend.repair_ledger l2 JOIN {table} t2 ON {join2}
                      WHERE l2.run_id = $1 AND l2.ledger_id > $2 AND (l2.before->>{ml})::boolean = false AND {same_t2}) > 1",
            table = q(&shape.table),
            join = shape.join(),
            join2 = shape.join().replace("t.", "t2.").replace("l.", "l2."),
            ml = lit(mark),
            m = q(mark),
            same_o = same("o", "t"),
            same_t2 = same("t2", "t"),
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

pub fn undo(
    client: &mut postgres::Client,
    repair: &Repair,
    run: &Run,
    policy: &LockPolicy,
    progress: &mut dyn FnMut(&str),
) -> Result<UndoReport> {
    if run.state == "running" {
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
    ensure_schema(client, policy)?;
    let shape = shape(client, repair)?;
    // An undo that stopped part-way (a kill, a lock budget, a lost connection) is resumed:
    // its checkpoint is the last ledger record of the undone run it restored, and every
    // batch restored its records and advanced the checkpoint in one transaction.
    let unfinished: Option<(i64, i64)> = client
        .query_opt(
            "SELECT run_id, checkpoint FROM pgmend.repair_runs WHERE undoes_run = $1 AND state = 'running'",
            &[&run.run_id],
        )
        .doing("looking for an unfinished undo of this run")?
        .map(|r| (r.get(0), r.get(1)));
    let checkpoint_at_start = unfinished.map_or(0, |(_, checkpoint)| checkpoint);
    let (count, sample) = conflicts(client, &shape, run.run_id, checkpoint_at_start)?;
    if count > 0 {
        return Err(Stopped::error(format!(
            "undo of run {} refused; nothing was changed{}. {} cannot be restored:\n  - {}{}",
            run.run_id,
            if unfinished.is_some() {
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
        )));
    }
    let undo_run: i64 = match unfinished {
        Some((undo_run, checkpoint)) => {
            progress(&format!(
                "resuming undo run {undo_run} of run {} after ledger record {checkpoint}",
                run.run_id
            ));
            undo_run
        }
        None => client
            .query_one(
                "INSERT INTO pgmend.repair_runs (repair, kind, definition_checksum, state, undoes_run, targets)
                 SELECT 'undo:' || repair, 'undo', definition_checksum, 'running', run_id,
                        (SELECT count(*) FROM pgmend.repair_ledger WHERE run_id = $1)
                   FROM pgmend.repair_runs WHERE run_id = $1 RETURNING run_id",
                &[&run.run_id],
            )
            .doing("recording the undo run")?
            .get(0),
    };
    let sets = shape
        .restore
        .iter()
        .map(|(c, ty)| format!("{c} = (l.before->>{})::{ty}", lit(c), c = q(c)))
        .collect::<Vec<_>>()
        .join(", ");
    let compare_obj = shape
        .compare
        .iter()
        .map(|(c, _)| format!("{}, t.{}", lit(c), q(c)))
        .collect::<Vec<_>>()
        .join(", ");
    let (mut restored, mut deleted, mut checkpoint): (i64, i64, i64) = client
        .query_one(
            "SELECT count(*) FILTER (WHERE action = 'restore'), count(*) FILTER (WHERE action = 'delete')
               FROM pgmend.repair_ledger WHERE run_id = $1",
            &[&undo_run],
        )
        .map(|r| (r.get(0), r.get(1), checkpoint_at_start))
        .doing("reading the undo's progress")?;
    loop {
        let batch = with_lock_retry(
            client,
            policy,
            &format!("undoing run {}", run.run_id),
            &[],
            |c| {
                let mut tx = c.transaction()?;
                tx.batch_execute(&policy.set_local_sql())?;
                let ids: Vec<i64> = tx
                .query(
                    "SELECT ledger_id FROM pgmend.repair_ledger WHERE run_id = $1 AND ledger_id > $2 ORDER BY ledger_id LIMIT 1000",
                    &[&run.run_id, &checkpoint],
                )?
                .iter()
                .map(|r| r.get(0))
                .collect();
                let Some(&last) = ids.last() else {
                    return Ok(None);
                };
                let r = tx.execute(
                &format!(
                    "WITH l AS (SELECT * FROM pgmend.repair_ledger WHERE run_id = $3 AND ledger_id = ANY ($2) AND action = 'update'),
                     upd AS (UPDATE {table} t SET {sets} FROM l WHERE {join} RETURNING l.row_key, l.after, {cmp} AS now)
                     INSERT INTO pgmend.repair_ledger (run_id, target_table, row_key, action, before, after, reason)
                     SELECT $1, {tl}, row_key, 'restore', after, now, 'undo of run ' || $3::bigint FROM upd",
                    table = q(&shape.table),
                    join = shape.join(),
                    cmp = ["jsonb_build_object(", &compare_obj, ")"].concat(),
                    tl = lit(&shape.table),
                ),
                &[&undo_run, &ids, &run.run_id],
            )?;
                let d = tx.execute(
                &format!(
                    "WITH l AS (SELECT * FROM pgmend.repair_ledger WHERE run_id = $3 AND ledger_id = ANY ($2) AND action = 'insert'),
                     del AS (DELETE FROM {table} t USING l WHERE {join} RETURNING l.row_key, l.after)
                     INSERT INTO pgmend.repair_ledger (run_id, target_table, row_key, action, before, after, reason)
                     SELECT $1, {tl}, row_key, 'delete', after, NULL, 'undo of run ' || $3::bigint || ': the run created this row' FROM del",
                    table = q(&shape.table),
                    join = shape.join(),
                    tl = lit(&shape.table),
                ),
                &[&undo_run, &ids, &run.run_id],
            )?;
                tx.execute("UPDATE pgmend.repair_runs SET checkpoint = $2, processed = processed + $3, changed = changed + $4 WHERE run_id = $1",
                &[&undo_run, &last, &(ids.len() as i64), &((r + d) as i64)])?;
                tx.commit()?;
                Ok(Some((last, r as i64, d as i64)))
            },
        )?;
        let Some((last, r, d)) = batch else { break };
        checkpoint = last;
        restored += r;
        deleted += d;
        progress(&format!(
            "undo of run {}: {} restored, {} deleted",
            run.run_id,
            crate::human::count(restored, "row"),
            crate::human::count(deleted, "created row")
        ));
    }
    client
        .batch_execute(&format!(
            "UPDATE pgmend.repair_runs SET state = 'finished', finished_at = now() WHERE run_id = {undo_run};
             UPDATE pgmend.repair_runs SET undone_by_run = {undo_run} WHERE run_id = {}",
            run.run_id
        ))
        .doing("recording the undo")?;
    Ok(UndoReport {
        undone_run: run.run_id,
        undo_run,
        restored,
        deleted,
    })
}
