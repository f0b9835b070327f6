//! Dry runs of a repair: what would change, streamed from a READ ONLY transaction, with a
//! bounded sample rendered as unified diffs (similar). Nothing is held per row beyond the
//! sample, so memory does not grow with the table.
//!
//! `preview` runs inside the caller's `READ ONLY` transaction, in a savepoint it rolls back,
//! streams the engine's preview query with `query_raw` (a `FallibleIterator`), counts every change
//! into a `Preview` (changes, voided or created, amounts per `report_by` value, or per key for the
//! first 1,000 keys) and hands each of the first `sample` changes (all with `None`) to a sink as a
//! `Change` (table, key, before and after as text maps, reason). Shadows (columns pending
//! migrations add) apply only to tables that exist and lack the column (`missing_shadows`), through
//! `census::with_shadows`. Every query goes through `PgContext::doing`, so a server error names the
//! repair being previewed and its SQLSTATE (a view that writes fails with 25006 in the read-only
//! transaction); one that fails with 42P01 or 42703 becomes `not_yet` instead of an error.
//! `render_diff` renders a change as a unified diff with `similar`, coloured when asked;
//! `render_summary` the counts.

use std::collections::BTreeMap;
use std::io::Write;

use anyhow::Result;
use fallible_iterator::FallibleIterator;
use serde::Serialize;

use super::backfill::BackfillEngine;
use super::counter::CounterEngine;
use super::definition::{BackfillSpec, Kind, OrphansSpec, Repair, Spec};
use super::orphans::OrphansEngine;
use super::void::VoidEngine;
use crate::db::sql_text::{names, Ident, TypeName};
use crate::error::{DbFailure, PgContext};
use crate::human;
use crate::online::census::{with_predicted, AddedColumn, Predicted};

/// One row that would change.
#[derive(Debug, Clone, Serialize)]
pub struct Change {
    pub table: String,
    pub key: String,
    pub before: BTreeMap<String, String>,
    pub after: BTreeMap<String, String>,
    pub reason: String,
}

#[derive(Debug, Default, Serialize)]
pub struct Preview {
    pub repair: String,
    pub kind: Kind,
    pub description: String,
    /// Rows (or counter rows) that would change.
    pub changes: i64,
    /// Void: rows that would be voided (the rest are only marked). Counters: rows created.
    /// Orphans: rows quarantined (none when their references are set to NULL).
    pub voided_or_created: i64,
    /// Void: the report_sum of changed rows per report_by value. Counters: new minus old per key
    /// (only the first 1,000 keys are listed).
    pub amounts: BTreeMap<String, i64>,
    /// Why nothing could be computed yet, if so.
    pub not_yet: Option<String>,
}

/// Computes the preview of `repair` inside `tx` (READ ONLY), calling `sink` for each of
/// the first `sample` changes (all with None). `shadows` are columns pending migrations add.
pub fn preview(
    tx: &mut postgres::Transaction<'_>,
    repair: &Repair,
    shadows: &[AddedColumn],
    sample: Option<usize>,
    sink: &mut dyn FnMut(&Change) -> Result<()>,
) -> Result<Preview> {
    preview_predicted(tx, repair, shadows, &[], sample, sink)
}

/// [`preview`] on `predicted`, the tables as earlier pending repairs leave them.
pub fn preview_predicted(
    tx: &mut postgres::Transaction<'_>,
    repair: &Repair,
    shadows: &[AddedColumn],
    predicted: &[Predicted],
    sample: Option<usize>,
    sink: &mut dyn FnMut(&Change) -> Result<()>,
) -> Result<Preview> {
    let mut p = Preview {
        repair: repair.name.clone(),
        kind: repair.kind(),
        description: repair.description().into(),
        ..Preview::default()
    };
    let mut savepoint = tx
        .transaction()
        .doing("opening a savepoint for the preview")?;
    let basis = Basis { shadows, predicted };
    let result = match &repair.spec {
        Spec::VoidDuplicates(spec) => {
            preview_void(&mut savepoint, spec, repair, &basis, sample, sink, &mut p)
        }
        Spec::RebuildCounter(spec) => {
            preview_counter(&mut savepoint, spec, repair, &basis, sample, sink, &mut p)
        }
        Spec::Backfill(spec) => {
            preview_backfill(&mut savepoint, spec, repair, &basis, sample, sink, &mut p)
        }
        Spec::Orphans(spec) => {
            preview_orphans(&mut savepoint, spec, repair, &basis, sample, sink, &mut p)
        }
    };
    match result {
        Ok(()) => {}
        Err(e) => {
            // Every query of the preview goes through `doing`, so a server error is a DbFailure.
            let missing = e
                .chain()
                .filter_map(|c| c.downcast_ref::<DbFailure>())
                .find(|f| matches!(f.sqlstate.as_deref(), Some("42P01") | Some("42703")))
                .map(DbFailure::to_string);
            match missing {
                Some(text) => {
                    p.not_yet = Some(format!(
                        "not computable before the earlier pending steps run ({text})"
                    ))
                }
                None => return Err(e),
            }
        }
    }
    savepoint
        .rollback()
        .doing("closing the preview savepoint")?;
    Ok(p)
}

fn table_exists(tx: &mut postgres::Transaction<'_>, table: &str) -> Result<bool> {
    Ok(tx
        .query_one("SELECT to_regclass(quote_ident($1)) IS NOT NULL", &[&table])
        .doing("checking a table")?
        .get(0))
}

/// Whether one of `tables` does not exist yet (an earlier pending migration creates it): says
/// so in `p`, and the preview has nothing more to show.
fn not_yet(tx: &mut postgres::Transaction<'_>, tables: &[&Ident], p: &mut Preview) -> Result<bool> {
    for t in tables {
        if !table_exists(tx, t.as_str())? {
            p.not_yet = Some(format!("{} does not exist yet", t.as_str()));
            return Ok(true);
        }
    }
    Ok(false)
}

/// Runs a preview's query, calling `each` on its rows in order.
fn each_row(
    tx: &mut postgres::Transaction<'_>,
    sql: &str,
    repair: &Repair,
    mut each: impl FnMut(&postgres::Row) -> Result<()>,
) -> Result<()> {
    let params: Vec<&(dyn postgres::types::ToSql + Sync)> = Vec::new();
    let doing = previewing(repair);
    let mut rows = tx.query_raw(sql, params).doing(&doing)?;
    while let Some(row) = rows.next().doing(&doing)? {
        each(&row)?;
    }
    Ok(())
}

fn preview_void(
    tx: &mut postgres::Transaction<'_>,
    spec: &super::definition::VoidSpec,
    repair: &Repair,
    basis: &Basis,
    sample: Option<usize>,
    sink: &mut dyn FnMut(&Change) -> Result<()>,
    p: &mut Preview,
) -> Result<()> {
    if not_yet(tx, &[&spec.table], p)? {
        return Ok(());
    }
    let engine = VoidEngine::preview_only(spec.clone());
    let active = missing_shadows(tx, basis.shadows)?;
    let sql = with_predicted(&engine.preview_sql(), &active, basis.predicted);
    each_row(tx, &sql, repair, |row| {
        let (key, grp): (String, String) = (row.get(0), row.get(1));
        let (before_mark, before_void, voids): (bool, Option<String>, bool) =
            (row.get(2), row.get(3), row.get(4));
        let (kept, rank): (String, i64) = (row.get(5), row.get(6));
        let (by, amount): (Option<String>, i64) = (row.get(7), row.get(8));
        p.changes += 1;
        let will_void = voids && before_void.is_none();
        if will_void {
            p.voided_or_created += 1;
            *p.amounts
                .entry(by.unwrap_or_else(|| "-".into()))
                .or_default() += amount;
        }
        if sample.is_none_or(|n| (p.changes as usize) <= n) {
            let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "NULL".into());
            let change = Change {
                table: spec.table.as_str().to_string(),
                key: format!("{} = {key}", spec.row_key.as_str()),
                before: BTreeMap::from([
                    (spec.mark.as_str().to_string(), before_mark.to_string()),
                    (spec.void.as_str().to_string(), show(&before_void)),
                ]),
                after: BTreeMap::from([
                    (spec.mark.as_str().to_string(), "true".to_string()),
                    (
                        spec.void.as_str().to_string(),
                        if will_void {
                            "now() at its batch".into()
                        } else {
                            show(&before_void)
                        },
                    ),
                ]),
                reason: format!(
                    "rank {rank} in group {grp}; {} = {kept} is kept{}",
                    spec.row_key.as_str(),
                    if voids {
                        ""
                    } else {
                        "; redeemed, so only marked"
                    }
                ),
            };
            sink(&change)?;
        }
        Ok(())
    })
}

fn preview_counter(
    tx: &mut postgres::Transaction<'_>,
    spec: &super::definition::CounterSpec,
    repair: &Repair,
    basis: &Basis,
    sample: Option<usize>,
    sink: &mut dyn FnMut(&Change) -> Result<()>,
    p: &mut Preview,
) -> Result<()> {
    let counter_exists = table_exists(tx, spec.counter_table.as_str())?;
    let engine = CounterEngine::preview_only(spec.clone());
    let active = missing_shadows(tx, basis.shadows)?;
    let sql = with_predicted(
        &engine.preview_sql(counter_exists),
        &active,
        basis.predicted,
    );
    each_row(tx, &sql, repair, |row| {
        let (key, now, truth): (String, Option<i64>, i64) = (row.get(0), row.get(1), row.get(2));
        p.changes += 1;
        if now.is_none() {
            p.voided_or_created += 1;
        }
        if p.amounts.len() < 1000 {
            p.amounts.insert(key.clone(), truth - now.unwrap_or(0));
        }
        if sample.is_none_or(|n| (p.changes as usize) <= n) {
            sink(&Change {
                table: spec.counter_table.as_str().to_string(),
                key: format!("{} = {key}", names(&spec.key, "/")),
                before: match now {
                    Some(v) => BTreeMap::from([(spec.counter.as_str().to_string(), v.to_string())]),
                    None => BTreeMap::new(),
                },
                after: BTreeMap::from([(spec.counter.as_str().to_string(), truth.to_string())]),
                reason: if now.is_none() {
                    "no counter row yet: created".into()
                } else {
                    "the counter differs from the source".into()
                },
            })?;
        }
        Ok(())
    })
}

/// A backfill engine for a preview: each `set` column's type from the catalog, or from the
/// pending migration that adds it (`active`: the shadows the table lacks today).
fn backfill_for_preview(
    tx: &mut postgres::Transaction<'_>,
    spec: &BackfillSpec,
    active: &[crate::online::census::AddedColumn],
) -> Result<BackfillEngine> {
    let mut types = Vec::new();
    for column in spec.set.keys() {
        let ty = match TypeName::compared_of_column(tx, &spec.table, column)
            .doing("reading a column's type")?
        {
            Some(ty) => Some(ty),
            None => match active.iter().find(|s| {
                s.table.trim_matches('"') == spec.table.as_str()
                    && s.column.trim_matches('"') == column.as_str()
            }) {
                Some(shadow) => TypeName::compared_of_text(tx, &shadow.type_sql)
                    .doing("reading a pending column's type")?,
                None => None,
            },
        };
        types.push(ty.ok_or_else(|| {
            anyhow::anyhow!(
                "{}.{} does not exist, and no pending migration adds it",
                spec.table.as_str(),
                column.as_str()
            )
        })?);
    }
    Ok(BackfillEngine::with_types(spec, TypeName::text(), types))
}

fn preview_backfill(
    tx: &mut postgres::Transaction<'_>,
    spec: &BackfillSpec,
    repair: &Repair,
    basis: &Basis,
    sample: Option<usize>,
    sink: &mut dyn FnMut(&Change) -> Result<()>,
    p: &mut Preview,
) -> Result<()> {
    if not_yet(tx, &[&spec.table], p)? {
        return Ok(());
    }
    let active = missing_shadows(tx, basis.shadows)?;
    let engine = backfill_for_preview(tx, spec, &active)?;
    let sql = with_predicted(&engine.preview_sql(), &active, basis.predicted);
    let columns: Vec<&Ident> = spec.set.keys().collect();
    let n = columns.len();
    each_row(tx, &sql, repair, |row| {
        p.changes += 1;
        if sample.is_none_or(|s| (p.changes as usize) <= s) {
            let value = |i: usize| {
                row.get::<_, Option<String>>(i)
                    .unwrap_or_else(|| "NULL".into())
            };
            let mut before = BTreeMap::new();
            let mut after = BTreeMap::new();
            for (i, c) in columns.iter().enumerate() {
                before.insert(c.as_str().to_string(), value(1 + i));
                after.insert(c.as_str().to_string(), value(1 + n + i));
            }
            sink(&Change {
                table: spec.table.as_str().to_string(),
                key: format!("{} = {}", spec.row_key.as_str(), value(0)),
                before,
                after,
                reason: format!(
                    "where {} holds; set from its expressions",
                    spec.predicate.trim()
                ),
            })?;
        }
        Ok(())
    })
}

fn preview_orphans(
    tx: &mut postgres::Transaction<'_>,
    spec: &OrphansSpec,
    repair: &Repair,
    basis: &Basis,
    sample: Option<usize>,
    sink: &mut dyn FnMut(&Change) -> Result<()>,
    p: &mut Preview,
) -> Result<()> {
    if not_yet(tx, &[&spec.table, &spec.references.table], p)? {
        return Ok(());
    }
    let active = missing_shadows(tx, basis.shadows)?;
    let engine = OrphansEngine::preview_only(spec);
    let sql = with_predicted(&engine.preview_sql(), &active, basis.predicted);
    let quarantine = spec.quarantine();
    each_row(tx, &sql, repair, |row| {
        p.changes += 1;
        if quarantine.is_some() {
            p.voided_or_created += 1;
        }
        if sample.is_none_or(|s| (p.changes as usize) <= s) {
            let value = |i: usize| {
                row.get::<_, Option<String>>(i)
                    .unwrap_or_else(|| "NULL".into())
            };
            let before: BTreeMap<String, String> = spec
                .columns
                .iter()
                .enumerate()
                .map(|(i, c)| (c.as_str().to_string(), value(1 + i)))
                .collect();
            let refers = before.values().cloned().collect::<Vec<_>>().join(", ");
            let (after, what) = match &quarantine {
                Some(q) => (
                    BTreeMap::new(),
                    format!("the row is moved to {}", q.as_str()),
                ),
                None => (
                    before
                        .keys()
                        .map(|c| (c.clone(), "NULL".to_string()))
                        .collect(),
                    "set to NULL".to_string(),
                ),
            };
            sink(&Change {
                table: spec.table.as_str().to_string(),
                key: format!("{} = {}", spec.row_key.as_str(), value(0)),
                before,
                after,
                reason: format!(
                    "no row of {} has ({}) = ({refers}): {what}",
                    spec.references.table.as_str(),
                    names(&spec.references.columns, ", ")
                ),
            })?;
        }
        Ok(())
    })
}

/// What a preview reads instead of the tables as they are now.
struct Basis<'a> {
    shadows: &'a [AddedColumn],
    predicted: &'a [Predicted],
}

/// The table a void, backfill or orphans repair changes, as its run would leave it on a quiet
/// database (None for a counter repair, or a table not there yet): what later previews read in
/// its place.
pub fn predict(
    tx: &mut postgres::Transaction<'_>,
    repair: &Repair,
    shadows: &[AddedColumn],
    predicted: &[Predicted],
) -> Result<Option<Predicted>> {
    let (table, changed): (&Ident, Vec<&Ident>) = match &repair.spec {
        Spec::VoidDuplicates(v) => (&v.table, vec![&v.mark, &v.void]),
        Spec::Backfill(b) => (&b.table, b.set.keys().collect()),
        Spec::Orphans(o) => (&o.table, o.columns.iter().collect()),
        Spec::RebuildCounter(_) => return Ok(None),
    };
    if !table_exists(tx, table.as_str())? {
        return Ok(None);
    }
    let active = missing_shadows(tx, shadows)?;
    let mut columns: Vec<String> = tx
        .query(
            "SELECT attname::text FROM pg_attribute WHERE attrelid = to_regclass(quote_ident($1)) AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            &[&table.as_str()],
        )
        .doing("reading the columns of the table a repair changes")?
        .iter()
        .map(|r| r.get(0))
        .collect();
    columns.extend(
        active
            .iter()
            .filter(|s| s.table.trim_matches('"') == table.as_str())
            .map(|s| s.column.trim_matches('"').to_string()),
    );
    let others: Vec<Ident> = columns
        .into_iter()
        .filter(|c| !changed.iter().any(|x| x.as_str() == c))
        .map(Ident::new)
        .collect();
    let base = with_predicted(&format!("SELECT * FROM {table}"), &active, predicted);
    let body = match &repair.spec {
        Spec::VoidDuplicates(spec) => {
            let engine = VoidEngine::preview_only(spec.clone());
            let changes = with_predicted(&engine.preview_sql(), &active, predicted);
            engine.predicted_sql(&others, &base, &changes)
        }
        Spec::Backfill(spec) => {
            backfill_for_preview(tx, spec, &active)?.predicted_sql(&others, &base)
        }
        Spec::Orphans(spec) => OrphansEngine::preview_only(spec).predicted_sql(&others, &base),
        Spec::RebuildCounter(_) => unreachable!("returned above"),
    };
    Ok(Some(Predicted {
        table: table.as_str().to_string(),
        body,
    }))
}

/// The shadows whose column the table lacks today.
fn missing_shadows(
    tx: &mut postgres::Transaction<'_>,
    shadows: &[AddedColumn],
) -> Result<Vec<AddedColumn>> {
    let mut out = Vec::new();
    for s in shadows {
        let present: bool = tx
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = $2 AND NOT attisdropped)",
                &[&s.table, &s.column.trim_matches('"')],
            )
            .doing("checking a column")?
            .get(0);
        let table_exists: bool = tx
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&s.table])
            .doing("checking a table")?
            .get(0);
        if table_exists && !present {
            out.push(s.clone());
        }
    }
    Ok(out)
}

/// The step a preview's server error names: the repair, and that it is a read-only dry run.
fn previewing(repair: &Repair) -> String {
    format!(
        "previewing repair {} (a dry run, in a read-only transaction)",
        repair.name
    )
}

/// A change as a unified diff, coloured on a terminal.
pub fn render_diff(change: &Change, colour: bool, out: &mut impl Write) -> std::io::Result<()> {
    let text = |m: &BTreeMap<String, String>| {
        m.iter()
            .map(|(k, v)| format!("{k} = {v}\n"))
            .collect::<String>()
    };
    let (before, after) = (text(&change.before), text(&change.after));
    let diff = similar::TextDiff::from_lines(&before, &after);
    let header_a = format!("{} {} (now)", change.table, change.key);
    let header_b = format!("{} {} (after)", change.table, change.key);
    writeln!(out, "# {}", change.reason)?;
    for line in diff
        .unified_diff()
        .context_radius(3)
        .header(&header_a, &header_b)
        .to_string()
        .lines()
    {
        let painted = match line.chars().next() {
            Some('+') if colour && !line.starts_with("+++") => format!("\x1b[32m{line}\x1b[0m"),
            Some('-') if colour && !line.starts_with("---") => format!("\x1b[31m{line}\x1b[0m"),
            _ => line.to_string(),
        };
        writeln!(out, "{painted}")?;
    }
    Ok(())
}

/// Renders a preview's header and summary for people.
pub fn render_summary(p: &Preview, out: &mut impl Write) -> std::io::Result<()> {
    if let Some(why) = &p.not_yet {
        return writeln!(out, "{}: {why}", p.repair);
    }
    match p.kind {
        Kind::VoidDuplicates => writeln!(
            out,
            "{}: {} would change, {} of them voided (the rest are redeemed: marked only)",
            p.repair,
            human::count(p.changes, "row"),
            human::int(p.voided_or_created)
        )?,
        Kind::RebuildCounter => writeln!(
            out,
            "{}: {} would change, {} of them created",
            p.repair,
            human::count(p.changes, "counter"),
            human::int(p.voided_or_created)
        )?,
        Kind::Backfill => writeln!(
            out,
            "{}: {} would change",
            p.repair,
            human::count(p.changes, "row")
        )?,
        Kind::Orphans if p.voided_or_created > 0 => writeln!(
            out,
            "{}: {} would be quarantined",
            p.repair,
            human::count(p.changes, "orphan")
        )?,
        Kind::Orphans => writeln!(
            out,
            "{}: {} would have their reference set to NULL",
            p.repair,
            human::count(p.changes, "orphan")
        )?,
    }
    if p.kind == Kind::VoidDuplicates && !p.amounts.is_empty() {
        for (by, yen) in &p.amounts {
            writeln!(out, "  voided per {by}: {yen} yen")?;
        }
    }
    Ok(())
}
