//! The guard: a trigger that marks duplicates as the old application inserts them, while the
//! release builds the unique index.
//!
//! The unique index is built only once a census finds no duplicate, and the old application
//! keeps inserting them (a double tap is one). When a census after the void step still finds
//! some, the release installs the guard before voiding again: from then on a row inserted
//! into a group that already has a live row ranking before it is marked (and voided unless
//! kept) as it arrives, with its ledger record, so the census reaches zero and the
//! CONCURRENTLY build meets no duplicate. The release drops the guard as soon as the index is
//! valid or the step stops: after that the index refuses duplicates itself, and the new
//! application's upsert (`ON CONFLICT ... WHERE NOT legacy_duplicate`) must meet the index,
//! not a trigger that marks its row. A guard a killed pgmend left behind is dropped by the next
//! `apply`, and `verify` fails while one exists.
//!
//! Inserts into one group are serialised by a transaction-level advisory lock on the group
//! (two-key form, pgmend's class key), so of two concurrent inserts the second sees the
//! first's row once it commits. The function is SECURITY DEFINER with a fixed search_path:
//! the application's role needs no rights on pgmend's ledger.
//!
//! The guard that lets V4 converge while the old application keeps inserting duplicates. `install`
//! generates, from a `VoidSpec`, a PL/pgSQL function `pgmend."pgmend guard: NAME"()` (`SECURITY
//! DEFINER`, `search_path = pg_catalog, pg_temp`, the table named with its schema) and a `BEFORE
//! INSERT` trigger `"pgmend guard: NAME"` (`CREATE OR REPLACE TRIGGER`, PostgreSQL 14+), in one
//! retried transaction under the lock policy. For a row not already marked, the function takes a
//! transaction advisory lock on the group (`pg_advisory_xact_lock(class, hashtext(group))`, so two
//! inserts of one group see each other in turn), ranks the group's live rows and the new one with
//! the definition's `rank_by` (`void::rank_order` over both), and when a live row ranks first marks
//! the new row, voids it unless `keep_when_not_null` is set, and writes an `update` ledger record
//! to the run given. `installed` lists guard triggers (by their name prefix, from `pg_trigger`) for
//! `verify`; `remove_all` drops each trigger and its function under the lock policy. `install`
//! registers the trigger with `signals::leave` and `remove_all` clears it, so a stop cut short
//! names the guard it leaves.

use anyhow::Result;

use super::definition::VoidSpec;
use super::void::rank_order;
use crate::db::retry::{execute_in_a_gap, Asking, LockPolicy};
use crate::db::sql_text::{key_match, Ident, Literal};
use crate::error::PgContext;
use crate::store;

/// Every guard trigger's name starts with this.
pub const PREFIX: &str = "pgmend guard: ";

/// The first key of the guard's advisory locks ("pgmd").
const LOCK_CLASS: i32 = 0x706d_6764;

fn trigger_name(repair: &str) -> String {
    format!("{PREFIX}{repair}")
}

/// The function is named like its trigger, in pgmend's schema.
fn function_name(trigger: &str) -> Ident {
    store::table(trigger)
}

/// Installs (or replaces) the guard of `repair` on its table; ledger records go to `run_id`.
pub fn install(
    client: &mut postgres::Client,
    policy: &LockPolicy,
    repair: &str,
    spec: &VoidSpec,
    run_id: i64,
) -> Result<()> {
    // The function runs with a search_path of pg_catalog only, so the table is named with
    // its schema.
    let found = client
        .query_one(
            "SELECT n.nspname::text, c.relname::text FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE c.oid = to_regclass(quote_ident($1))",
            &[&spec.table.as_str()],
        )
        .doing(format!("finding table {}", spec.table.as_str()))?;
    let table = Ident::qualified(found.get::<_, String>(0), found.get::<_, String>(1));
    let new = |c: &Ident| c.of("NEW");
    let group_text = spec
        .group_by
        .iter()
        .map(|c| format!("{}::text", new(c)))
        .collect::<Vec<_>>()
        .join(", ");
    let same_group = key_match("t", "NEW", &spec.group_by);
    let rank_cols: Vec<&Ident> = spec.rank_by.iter().map(|r| &r.column).collect();
    let live = rank_cols
        .iter()
        .map(|c| format!("t.{}", c))
        .collect::<Vec<_>>()
        .join(", ");
    let incoming = rank_cols
        .iter()
        .map(|c| new(c))
        .collect::<Vec<_>>()
        .join(", ");
    let (keep_test, keep_obj) = match &spec.keep_when_not_null {
        Some(k) => (
            format!("{} IS NULL", new(k)),
            format!(", {}, {}", k.literal(), new(k)),
        ),
        None => ("true".to_string(), String::new()),
    };
    let (mark, void) = (&spec.mark, &spec.void);
    let body = format!(
        "DECLARE
           before_void {table}.{void}%TYPE := NEW.{void};
         BEGIN
           IF NEW.{mark} THEN
             RETURN NEW;
           END IF;
           PERFORM pg_advisory_xact_lock({LOCK_CLASS}, hashtext(concat_ws('/', {group_text})));
           -- Marked only when a live row of the group ranks before it; otherwise (the first
           -- row of its group, or one that ranks first) the void repair decides.
           IF coalesce((SELECT x.is_new FROM (
                          SELECT false AS is_new, {live} FROM {table} t WHERE {same_group} AND NOT t.{mark}
                          UNION ALL SELECT true, {incoming}) x
                        ORDER BY {order} LIMIT 1), true) THEN
             RETURN NEW;
           END IF;
           NEW.{mark} := true;
           IF {keep_test} THEN
             NEW.{void} := coalesce(NEW.{void}, now());
           END IF;
           {ledger_insert}
           VALUES ({run_id}, {table_lit}, jsonb_build_object({key_lit}, NEW.{key}), 'update',
                   jsonb_build_object({mark_lit}, false, {void_lit}, before_void{keep_obj}),
                   jsonb_build_object({mark_lit}, true, {void_lit}, NEW.{void}{keep_obj}),
                   'inserted as a duplicate while the release built the unique index; marked as it arrived (pgmend guard)');
           RETURN NEW;
         END",
        ledger_insert = store::ledger_insert(),
        order = rank_order(spec, "x"),
        table_lit = spec.table.literal(),
        key_lit = spec.row_key.literal(),
        key = &spec.row_key,
        mark_lit = spec.mark.literal(),
        void_lit = spec.void.literal(),
    );
    let sql = format!(
        "CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql
           SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS {body_lit};
         CREATE OR REPLACE TRIGGER {trigger} BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {function}();",
        function = function_name(&trigger_name(repair)),
        body_lit = Literal::new(body),
        trigger = Ident::new(trigger_name(repair)),
    );
    let trigger = trigger_name(repair);
    let table = table.minimal();
    crate::signals::leave(
        &format!("guard {trigger}"),
        format!("the guard trigger {trigger:?} may remain on {table} (it marks new rows as duplicates, and `pgmend verify` fails while it exists); `pgmend apply --yes` drops it"),
    );
    let installing = execute_in_a_gap(
        client,
        policy,
        &format!("installing the guard on {}", spec.table.as_str()),
        &[spec.table.as_str().to_string()],
        Asking::ShareRowExclusive,
        false,
        &sql,
    );
    if installing.is_err()
        && installed(client).is_ok_and(|found| found.iter().all(|(_, t)| *t != trigger))
    {
        // Stopped or refused before its commit: nothing is left behind.
        crate::signals::cleaned(&format!("guard {trigger}"));
    }
    installing
}

/// A guard trigger found in the database: (table, trigger).
pub fn installed(client: &mut impl postgres::GenericClient) -> Result<Vec<(String, String)>> {
    Ok(client
        .query(
            "SELECT tgrelid::regclass::text, tgname::text FROM pg_trigger
              WHERE NOT tgisinternal AND starts_with(tgname, $1) ORDER BY 1, 2",
            &[&PREFIX],
        )
        .doing("looking for pgmend guard triggers")?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

/// Drops every guard trigger and its function; returns the triggers dropped.
pub fn remove_all(client: &mut postgres::Client, policy: &LockPolicy) -> Result<Vec<String>> {
    let found = installed(client)?;
    for (table, trigger) in &found {
        // As pg_locks' tables are matched: schema.name, unquoted (the regclass text quotes).
        let plain: String = client
            .query_one(
                "SELECT n.nspname || '.' || c.relname FROM pg_class c
                   JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1::text::regclass",
                &[table],
            )
            .doing("reading the guarded table's name")?
            .get(0);
        let sql = format!(
            "DROP TRIGGER IF EXISTS {} ON {table}; DROP FUNCTION IF EXISTS {}()",
            Ident::new(trigger.as_str()),
            function_name(trigger)
        );
        execute_in_a_gap(
            client,
            policy,
            &format!("dropping the guard on {table}"),
            &[plain],
            Asking::AccessExclusive,
            true,
            &sql,
        )?;
        crate::signals::cleaned(&format!("guard {trigger}"));
    }
    Ok(found
        .into_iter()
        .map(|(table, trigger)| format!("{trigger:?} on {table}"))
        .collect())
}
