//! `pgmend verify`: the invariants of the chosen release (docs/verify.md), checked in one
//! read-only snapshot, and the anomalies worth a human look. Exit 1 names the first offending keys.
//!
//! Nothing here knows a release's tables: every check comes from the release. `run` refuses a
//! database that has none of the tables the release names (exit 2, [`no_tables`]); a database
//! none of whose release migrations after the first is applied, and none of whose other
//! release steps is done, fails the one check `released_schema` (its legacy state). Otherwise, in order:
//!
//! - the invariants the release declares (`[[invariant]]` in `release.toml`: a query whose rows
//!   break it; `anomaly = true` ones are listed apart and do not change the exit code);
//! - what its migrations imply, from their censuses (`online::census`): each unique index
//!   present, unique and valid on its table (`unique_index_NAME`), each CHECK and FOREIGN KEY
//!   present (validated, or NOT VALID with the rows that break it counted: accepted, `check_NAME`,
//!   `foreign_key_NAME`), each constraint a migration validates validated (`validated_NAME`), each
//!   precondition's query still empty (`NAME`); a declared invariant of the same name replaces
//!   the derived one;
//! - what its repairs imply: each repair step's census empty (a counter equal to its source, no
//!   group with more than one unmarked row: `repair_NAME`), unless a declared invariant says it
//!   checks that repair (`repair = "NAME"`);
//! - `no_invalid_index` and `no_guard_trigger` (none left by an interrupted release).
//!
//! Each check is one aggregate query with a sample of the first offending rows, under a
//! savepoint: a check whose table or column does not exist yet fails as "missing" instead of
//! ending the snapshot. The caller (`commands/verify.rs`) gives it one REPEATABLE READ, READ ONLY
//! snapshot, so it runs on a hot standby. Tested in `tests/verify.rs`, `tests/hints.rs` and
//! `tests/releases.rs`.

use anyhow::Result;
use postgres::GenericClient;
use serde::Serialize;

use crate::db::sql_text::names;
use crate::error::PgContext;
use crate::online::catalog;
use crate::online::census::{Census, Guard};
use crate::release::{Release, Step};
use crate::repair::counter::CounterEngine;
use crate::repair::definition::Spec;
use crate::repair::void::VoidEngine;

#[derive(Debug, Serialize)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    /// How many keys (or objects) break it.
    pub violations: i64,
    /// The first offending keys, as JSON rows.
    pub sample: Vec<String>,
    /// The sum of the invariant's `amount` over the offending rows (yen, for the coupon
    /// release's counters), when it declares one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amount: Option<i64>,
    pub detail: String,
}

#[derive(Debug, Serialize)]
pub struct Verification {
    pub ok: bool,
    pub checks: Vec<Check>,
    /// Not invariants, but worth a look (they do not change the exit code).
    pub anomalies: Vec<Check>,
    /// Repair runs not finished (running, or stopped before their end).
    pub unfinished_runs: i64,
}

const SAMPLE: i64 = 5;

/// Why there is nothing to verify: the connection points at another database (exit 2).
pub fn no_tables(release: &str, tables: &[String]) -> String {
    format!(
        "this database has none of the tables release {release} works on ({}); check --database-url (and the search_path, or --schema) points at that release's database, or --release at the release of this one",
        tables.join(", ")
    )
}

/// Checks `release` on the database `client` reads (one snapshot); `applied` is the migration
/// history's versions.
pub fn run(
    client: &mut impl GenericClient,
    release: &Release,
    applied: &[i32],
) -> Result<Verification> {
    let tables = release.tables();
    if !tables.is_empty() && !any_exists(client, &tables)? {
        anyhow::bail!(no_tables(release.name, &tables));
    }
    let migrations: Vec<i32> = release
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Migrate { version, .. } => Some(*version),
            _ => None,
        })
        .collect();
    // Its legacy state: some migration pending, none applied after the first (which may be the
    // adopted legacy schema, as the coupon release's V1 is) and no other step done.
    let progress = crate::release::progress(client, release.name, applied.to_vec())?;
    let other_steps_done = release
        .steps
        .iter()
        .enumerate()
        .any(|(i, s)| !matches!(s, Step::Migrate { .. }) && progress.done(i, s));
    if !migrations.iter().skip(1).any(|v| applied.contains(v))
        && migrations.iter().any(|v| !applied.contains(v))
        && !other_steps_done
    {
        return Ok(Verification {
            ok: false,
            checks: vec![missing(
                "released_schema".into(),
                format!(
                    "the database is still in its legacy state (none of release {}'s migrations after the first is applied); run `pgmend plan`, then `pgmend apply`",
                    release.name
                ),
            )],
            anomalies: Vec::new(),
            unfinished_runs: unfinished_runs(client)?,
        });
    }
    let definition = release.invariants;
    let mut checks = Vec::new();
    let mut anomalies = Vec::new();
    for inv in definition {
        let check = count_with(
            client,
            inv.name.clone(),
            &inv.sql,
            inv.amount.as_deref(),
            if inv.holds.is_empty() {
                "holds"
            } else {
                &inv.holds
            },
            if inv.explain.is_empty() {
                "rows break it"
            } else {
                &inv.explain
            },
        )?;
        if inv.anomaly {
            anomalies.push(check);
        } else {
            checks.push(check);
        }
    }
    let declared = |name: &str| definition.iter().any(|i| i.name == name);
    for m in release
        .files
        .iter()
        .filter(|m| migrations.contains(&m.version))
    {
        for census in m.censuses.iter().filter(|c| !declared(&derived_name(c))) {
            checks.push(from_census(client, census)?);
        }
    }
    let mut seen = Vec::new();
    for step in release.steps {
        let Step::Repair { name } = step else {
            continue;
        };
        if seen.contains(name) || definition.iter().any(|i| i.repair.as_deref() == Some(name)) {
            continue;
        }
        seen.push(name.clone());
        if let Some(repair) = release.repairs.iter().find(|r| &r.name == name) {
            checks.push(from_repair(client, &repair.name, &repair.spec)?);
        }
    }
    checks.push(no_invalid_index(client)?);
    checks.push(no_guard_trigger(client)?);
    Ok(Verification {
        ok: checks.iter().all(|c| c.ok),
        checks,
        anomalies,
        unfinished_runs: unfinished_runs(client)?,
    })
}

/// How many repair runs are unfinished (none without pgmend's tables).
fn unfinished_runs(client: &mut impl GenericClient) -> Result<i64> {
    Ok(crate::store::runs::all(client)?
        .iter()
        .filter(|r| r.state == crate::store::RunState::Running)
        .count() as i64)
}

/// Whether any of `tables` exists on the session's search path.
fn any_exists(client: &mut impl GenericClient, tables: &[String]) -> Result<bool> {
    Ok(client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM unnest($1::text[]) t WHERE to_regclass(quote_ident(t)) IS NOT NULL)",
            &[&tables],
        )
        .doing("checking the schema")?
        .get(0))
}

/// The name of the check a census implies.
fn derived_name(census: &Census) -> String {
    match census.guard {
        Guard::UniqueIndex => format!("unique_index_{}", census.name),
        Guard::Check | Guard::CheckNotValid => format!("check_{}", census.name),
        Guard::ForeignKey | Guard::ForeignKeyNotValid => format!("foreign_key_{}", census.name),
        Guard::Validate => format!("validated_{}", census.name),
        Guard::Precondition => census.name.clone(),
    }
}

/// The check a migration's census implies: the index or constraint in place, the
/// precondition still holding.
fn from_census(client: &mut impl GenericClient, census: &Census) -> Result<Check> {
    let name = derived_name(census);
    let table = census.tables.first().cloned().unwrap_or_default();
    match census.guard {
        Guard::Precondition => count(
            client,
            name,
            &census.violators_sql,
            "holds",
            &format!("{}: {}", census.counts, census.fix),
        ),
        Guard::UniqueIndex => {
            let index = client
                .query_opt(
                    "SELECT i.indisunique, i.indisvalid AND i.indisready, i.indrelid = to_regclass($2),
                            pg_get_indexdef(i.indexrelid)
                       FROM pg_index i WHERE i.indexrelid = to_regclass($1)",
                    &[&census.name, &table],
                )
                .doing("reading the unique index")?;
            Ok(match index {
                None => missing(
                    name,
                    format!(
                        "the index {} does not exist: run `pgmend apply`",
                        census.name
                    ),
                ),
                Some(r) => {
                    let (unique, valid, on_table, definition): (bool, bool, bool, String) =
                        (r.get(0), r.get(1), r.get(2), r.get(3));
                    let right = unique && valid && on_table;
                    Check {
                        name,
                        ok: right,
                        violations: i64::from(!right),
                        sample: Vec::new(),
                        amount: None,
                        detail: if right {
                            format!("unique and valid: {definition}")
                        } else {
                            format!(
                                "{} is {}{}{definition}{}: drop it concurrently and rebuild it (runbooks/failed-concurrent-index-build.md)",
                                census.name,
                                if unique { "" } else { "not unique, " },
                                if valid { "" } else { "INVALID, " },
                                if on_table { "" } else { " (not on the table its migration names)" },
                            )
                        },
                    }
                }
            })
        }
        Guard::Validate => {
            let validated = client
                .query_opt(
                    "SELECT convalidated FROM pg_constraint
                      WHERE conname = $1 AND contype IN ('c', 'f') AND conrelid = to_regclass($2)",
                    &[&crate::online::census::catalog_name(&census.name), &table],
                )
                .doing("reading the constraint")?
                .map(|r| r.get::<_, bool>(0));
            Ok(match validated {
                None => missing(
                    name,
                    format!(
                        "the constraint {} is missing on {table}: run `pgmend apply`",
                        census.name
                    ),
                ),
                Some(valid) => Check {
                    name,
                    ok: valid,
                    violations: i64::from(!valid),
                    sample: Vec::new(),
                    amount: None,
                    detail: if valid {
                        format!("present on {table}, validated")
                    } else {
                        format!("present on {table} but NOT VALID, although the migration that validates it is applied: someone re-added it; `pgmend migrate validate {}`", census.name)
                    },
                },
            })
        }
        Guard::Check | Guard::CheckNotValid | Guard::ForeignKey | Guard::ForeignKeyNotValid => {
            let (contype, noun) = if matches!(census.guard, Guard::Check | Guard::CheckNotValid) {
                ("c", "check")
            } else {
                ("f", "foreign key")
            };
            let check = client
                .query_opt(
                    "SELECT convalidated FROM pg_constraint
                      WHERE conname = $1 AND contype = $3::text::\"char\" AND conrelid = to_regclass($2)",
                    &[&crate::online::census::catalog_name(&census.name), &table, &contype],
                )
                .doing(format!("reading the {noun}"))?;
            let Some(row) = check else {
                return Ok(missing(
                    name,
                    format!(
                        "the {noun} {} is missing on {table}: run `pgmend apply`",
                        census.name
                    ),
                ));
            };
            let validated: bool = row.get(0);
            let detail = if validated {
                format!("present on {table}, validated")
            } else {
                let violators_sql = match crate::online::evaluate::resolve(client, census)? {
                    Ok(resolved) => resolved.violators_sql,
                    Err(why) => return Ok(missing(name, why)),
                };
                let breaking: i64 = client
                    .query_one(&format!("SELECT count(*) FROM ({violators_sql}) v"), &[])
                    .doing(format!("counting the rows that break {}", census.name))?
                    .get(0);
                match breaking {
                    0 => format!("present on {table}, NOT VALID, and no row breaks it: `pgmend migrate validate {}` validates it", census.name),
                    n => format!(
                        "present on {table}, NOT VALID: {} {} it (from before the check, accepted; new ones are refused). Once none is left, `pgmend migrate validate {}`",
                        crate::human::count(n, "row"),
                        if n == 1 { "breaks" } else { "break" },
                        census.name
                    ),
                }
            };
            Ok(Check {
                name,
                ok: true,
                violations: 0,
                sample: Vec::new(),
                amount: None,
                detail,
            })
        }
    }
}

/// The check a repair step implies: its census empty now.
fn from_repair(client: &mut impl GenericClient, repair: &str, spec: &Spec) -> Result<Check> {
    let name = format!("repair_{repair}");
    let fix = format!("run `pgmend repair apply {repair}`");
    match spec {
        Spec::RebuildCounter(c) => count(
            client,
            name,
            &format!(
                "SELECT key, counter, source FROM ({}) d(key, counter, source)",
                CounterEngine::preview_only(c.clone()).preview_sql(true)
            ),
            &format!("every {}.{} equals its source", c.counter_table, c.counter),
            &format!(
                "keys whose {}.{} differs from its source: {fix}",
                c.counter_table, c.counter
            ),
        ),
        Spec::Backfill(b) => {
            let changes =
                crate::repair::backfill::BackfillEngine::prepare(client, b)?.preview_sql();
            count(
                client,
                name,
                &changes,
                &format!(
                    "every row of {} where {} holds has the values its expressions give",
                    b.table.as_str(),
                    b.predicate.trim()
                ),
                &format!(
                    "rows of {} where {} holds that differ from their expressions: {fix}",
                    b.table.as_str(),
                    b.predicate.trim()
                ),
            )
        }
        Spec::Orphans(o) => count(
            client,
            name,
            &crate::repair::orphans::OrphansEngine::preview_only(o).preview_sql(),
            &format!(
                "every row of {} with ({}) set refers to a row of {}",
                o.table.as_str(),
                names(&o.columns, ", "),
                o.references.table.as_str()
            ),
            &format!(
                "rows of {} whose ({}) refers to no row of {}: {fix}",
                o.table.as_str(),
                names(&o.columns, ", "),
                o.references.table.as_str()
            ),
        ),
        Spec::VoidDuplicates(v) => count(
            client,
            name,
            &VoidEngine::preview_only(v.clone()).duplicates_sql(),
            &format!(
                "no group of {} has more than one row not marked {}",
                v.table, v.mark
            ),
            &format!(
                "groups of {} with more than one row not marked {}: {fix}",
                v.table, v.mark
            ),
        ),
    }
}

/// Counts the rows of `violators` and samples the first few, under a savepoint: a table or
/// column that does not exist yet makes the check fail as missing.
fn count(
    client: &mut impl GenericClient,
    name: String,
    violators: &str,
    ok_detail: &str,
    bad_detail: &str,
) -> Result<Check> {
    count_with(client, name, violators, None, ok_detail, bad_detail)
}

/// [`count`], with the sum of `amount` (an expression over the rows) in the same query.
fn count_with(
    client: &mut impl GenericClient,
    name: String,
    violators: &str,
    amount: Option<&str>,
    ok_detail: &str,
    bad_detail: &str,
) -> Result<Check> {
    let mut tx = client.transaction().doing("opening a savepoint")?;
    let sum = amount.map_or("NULL::int8".to_string(), |a| {
        format!("coalesce(sum(({a})::numeric), 0)::int8")
    });
    let (n, amount): (i64, Option<i64>) =
        match tx.query_one(&format!("SELECT count(*), {sum} FROM ({violators}) v"), &[]) {
            Ok(row) => (row.get(0), row.get(1)),
            Err(e)
                if matches!(
                    crate::error::sqlstate(&e),
                    Some("42P01" | "42703" | "42883")
                ) =>
            {
                drop(tx);
                return Ok(missing(
                    name,
                    format!(
                    "its query cannot run here yet ({}): run `pgmend plan`, then `pgmend apply`",
                    e.as_db_error().map(|d| d.message()).unwrap_or("an object is missing")
                ),
                ));
            }
            Err(e) => return Err(e).doing(format!("checking {name}")),
        };
    let sample = if n > 0 {
        tx.query(
            &format!("SELECT row_to_json(v)::text FROM ({violators}) v ORDER BY 1 LIMIT {SAMPLE}"),
            &[],
        )
        .doing(format!("sampling {name}"))?
        .iter()
        .map(|r| r.get(0))
        .collect()
    } else {
        Vec::new()
    };
    tx.commit().doing("releasing the savepoint")?;
    Ok(Check {
        name,
        ok: n == 0,
        violations: n,
        sample,
        amount,
        detail: if n == 0 {
            ok_detail.into()
        } else {
            bad_detail.into()
        },
    })
}

fn missing(name: String, detail: String) -> Check {
    Check {
        name,
        ok: false,
        violations: 1,
        sample: Vec::new(),
        amount: None,
        detail,
    }
}

/// No INVALID index anywhere in the database.
fn no_invalid_index(client: &mut impl GenericClient) -> Result<Check> {
    let invalid = catalog::invalid_indexes(client)?;
    let sample = invalid
        .iter()
        .map(|i| format!("{}.{} on {}", i.schema, i.index, i.table))
        .collect();
    Ok(listed(
        "no_invalid_index",
        sample,
        "no INVALID index in the database",
        || invalid[0].describe(),
    ))
}

/// No guard trigger left behind by an interrupted release.
fn no_guard_trigger(client: &mut impl GenericClient) -> Result<Check> {
    let guards = crate::repair::guard::installed(client)?;
    let sample = guards
        .iter()
        .map(|(table, trigger)| format!("{trigger:?} on {table}"))
        .collect();
    Ok(listed(
        "no_guard_trigger",
        sample,
        "no pgmend guard trigger left on a table",
        || {
            "pgmend guard triggers left by an interrupted release: they mark the new application's rows as duplicates; `pgmend apply --yes` drops them".into()
        },
    ))
}

/// A check that holds when `offenders` is empty; the sample is the first few of them.
fn listed(
    name: &str,
    mut offenders: Vec<String>,
    ok_detail: &str,
    bad_detail: impl FnOnce() -> String,
) -> Check {
    let violations = offenders.len() as i64;
    offenders.truncate(SAMPLE as usize);
    Check {
        name: name.into(),
        ok: violations == 0,
        violations,
        sample: offenders,
        amount: None,
        detail: if violations == 0 {
            ok_detail.into()
        } else {
            bad_detail()
        },
    }
}
