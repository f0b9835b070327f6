//! What one statement is and the strongest lock it takes, read from its tokens: one function
//! per kind of statement, each filling in the summary and the locks.
//!
//! From a statement's tokens: its summary, the table-level locks it takes on existing relations
//! (from PostgreSQL's documented lock levels: `ALTER TABLE` ACCESS EXCLUSIVE unless it only
//! validates or only adds a foreign key, `CREATE INDEX` SHARE, `CONCURRENTLY` SHARE UPDATE
//! EXCLUSIVE, `REFERENCES` SHARE ROW EXCLUSIVE on the referenced table, `PARTITION OF` ACCESS
//! EXCLUSIVE on the parent, `ATTACH` and `DETACH PARTITION` on the partition, `CREATE TRIGGER`
//! SHARE ROW EXCLUSIVE and `DROP` or `ALTER TRIGGER`, policies and rules ACCESS EXCLUSIVE on
//! their table, `REFRESH MATERIALIZED VIEW` ACCESS EXCLUSIVE (EXCLUSIVE concurrently), DML ROW
//! EXCLUSIVE, ...),
//! whether it must run outside a transaction, whether it is transaction control, and the tables it
//! creates. An unrecognised statement, and a `DROP` of an object that may take tables with it
//! (a schema, a function, a type), is assumed to take ACCESS EXCLUSIVE and is flagged
//! `lock_assumed`.

use super::tokens::{is_word, named_after, read_name, skip_words, top_level_actions, Token};
use super::{LockMode, LockTaken, Statement};

/// Reads `sql` (starting at `line`) from its `tokens`.
pub(super) fn analyze(sql: String, line: usize, tokens: &[Token]) -> Statement {
    let words: Vec<&str> = tokens
        .iter()
        .take(8)
        .filter_map(|t| match t {
            Token::Word(w) => Some(w.as_str()),
            _ => None,
        })
        .collect();
    let mut statement = Statement {
        line,
        summary: String::new(),
        sql,
        locks: Vec::new(),
        online: false,
        transaction_control: false,
        lock_assumed: false,
        creates_tables: Vec::new(),
        creates_if_missing: false,
        unsupported: None,
        long_lock_accepted: None,
    };
    let first = words.first().copied().unwrap_or("");
    let s = &mut statement;
    match first {
        "begin" | "commit" | "rollback" | "end" | "savepoint" | "release" | "abort" | "start"
        | "prepare" => {
            s.transaction_control = true;
            s.summary = first.to_uppercase();
        }
        "create" => create(s, tokens, &words),
        "alter" if is_word(tokens.get(1), "table") => alter_table(s, tokens),
        // `ALTER TRIGGER` / `ALTER POLICY name ON table`: ACCESS EXCLUSIVE on the table.
        "alter" if is_word(tokens.get(1), "trigger") || is_word(tokens.get(1), "policy") => {
            on_table(s, tokens, 1, LockMode::AccessExclusive)
        }
        "drop" if is_word(tokens.get(1), "index") => drop_index(s, tokens),
        "drop" => drop(s, tokens, &words),
        "reindex" => reindex(s, tokens, &words),
        "refresh" => {
            // `REFRESH MATERIALIZED VIEW [CONCURRENTLY] name`: ACCESS EXCLUSIVE, or EXCLUSIVE
            // (reads go on) when concurrently; either runs inside a transaction.
            let i = skip_words(tokens, 1, &["materialized", "view", "concurrently"]);
            let name = read_name(tokens, i).map(|(n, _)| n).unwrap_or_default();
            let concurrently = has(tokens, "concurrently");
            s.summary = format!(
                "REFRESH MATERIALIZED VIEW {}{name}",
                if concurrently { "CONCURRENTLY " } else { "" }
            );
            let mode = if concurrently {
                LockMode::Exclusive
            } else {
                LockMode::AccessExclusive
            };
            s.locks.push(lock(name, mode));
        }
        "vacuum" => {
            s.online = true;
            s.summary = "VACUUM".into();
        }
        "truncate" | "lock" | "cluster" => {
            let i = skip_words(tokens, 1, &["table", "if", "exists", "only"]);
            let name = read_name(tokens, i).map(|(n, _)| n).unwrap_or_default();
            s.summary = format!("{} {name}", upper(&words, 2));
            s.locks.push(lock(name, LockMode::AccessExclusive));
        }
        "insert" | "update" | "delete" | "merge" => {
            let i = skip_words(tokens, 1, &["into", "from", "only"]);
            let name = read_name(tokens, i).map(|(n, _)| n).unwrap_or_default();
            s.summary = format!("{} {name}", first.to_uppercase());
            s.locks.push(lock(name, LockMode::RowExclusive));
        }
        "select" | "with" | "set" | "reset" | "comment" | "analyze" | "grant" | "revoke" => {
            s.summary = first.to_uppercase();
        }
        _ => {
            // Not recognised: assume the strongest lock, and say it is assumed.
            s.summary = upper(&words, 3);
            s.lock_assumed = true;
            s.locks
                .push(lock("(not recognised)".into(), LockMode::AccessExclusive));
        }
    }
    statement
}

fn lock(relation: String, mode: LockMode) -> LockTaken {
    LockTaken {
        lookup: relation.clone(),
        relation,
        mode,
    }
}

/// The first `n` words, upper-cased, for a summary.
fn upper(words: &[&str], n: usize) -> String {
    words
        .iter()
        .take(n)
        .map(|w| w.to_uppercase())
        .collect::<Vec<_>>()
        .join(" ")
}

/// A CONCURRENTLY form takes SHARE UPDATE EXCLUSIVE; the plain form takes `plain`.
fn concurrent_or(concurrently: bool, plain: LockMode) -> LockMode {
    if concurrently {
        LockMode::ShareUpdateExclusive
    } else {
        plain
    }
}

fn has(tokens: &[Token], word: &str) -> bool {
    tokens
        .iter()
        .any(|t| matches!(t, Token::Word(x) if x == word))
}

/// Why a migration may not hold `DETACH PARTITION ... CONCURRENTLY`.
const DETACH_CONCURRENTLY: &str = "DETACH PARTITION ... CONCURRENTLY commits a first transaction before it waits for the partition's readers; stopped there, it leaves the partition pending detach, and running the migration again fails. pgmend does not run it: detach without CONCURRENTLY (ACCESS EXCLUSIVE on both tables for a moment, asked for with pgmend's lock retries), or run it by hand and finish an interrupted one with DETACH PARTITION ... FINALIZE";

/// `CREATE TABLE` (SHARE ROW EXCLUSIVE on each table it references), `CREATE [UNIQUE] INDEX
/// [CONCURRENTLY]`, or another catalog entry.
fn create(s: &mut Statement, tokens: &[Token], words: &[&str]) {
    let i = skip_words(
        tokens,
        1,
        &[
            "or",
            "replace",
            "global",
            "local",
            "temporary",
            "temp",
            "unlogged",
        ],
    );
    if is_word(tokens.get(i), "table") {
        s.creates_if_missing = is_word(tokens.get(i + 1), "if");
        let i = skip_words(tokens, i + 1, &["if", "not", "exists"]);
        let name = read_name(tokens, i).map(|(n, _)| n).unwrap_or_default();
        s.summary = format!("CREATE TABLE {name}");
        s.creates_tables.push(name);
        // A new partition changes its parent's partition descriptor: ACCESS EXCLUSIVE on the
        // parent (the partitioning chapter of PostgreSQL's documentation).
        for parent in named_after(tokens, &["partition", "of"]) {
            s.locks.push(lock(parent, LockMode::AccessExclusive));
        }
        for target in named_after(tokens, &["references"]) {
            s.locks.push(lock(target, LockMode::ShareRowExclusive));
        }
    } else if is_word(tokens.get(i), "unique") || is_word(tokens.get(i), "index") {
        create_index(s, tokens, is_word(tokens.get(i), "unique"));
    } else if let Some(mode) = on_table_mode(tokens, i) {
        on_table(s, tokens, i, mode);
    } else {
        // Schemas, types, functions, sequences, views: catalog entries, no table lock on
        // existing data (a view's query takes ACCESS SHARE at most).
        s.summary = upper(words, 3);
    }
}

/// The lock that creating or dropping the object named at `tokens[i]` (`TRIGGER`, `POLICY`,
/// `RULE`: each `... ON table`) takes on its table: SHARE ROW EXCLUSIVE to create a trigger,
/// ACCESS EXCLUSIVE otherwise (the server's `CreateTrigger`, `RemoveTriggerById`, policies and
/// rules).
fn on_table_mode(tokens: &[Token], i: usize) -> Option<LockMode> {
    let i = skip_words(tokens, i, &["constraint"]);
    let creates = is_word(tokens.first(), "create");
    if is_word(tokens.get(i), "trigger") {
        Some(if creates {
            LockMode::ShareRowExclusive
        } else {
            LockMode::AccessExclusive
        })
    } else if is_word(tokens.get(i), "policy") || is_word(tokens.get(i), "rule") {
        Some(LockMode::AccessExclusive)
    } else {
        None
    }
}

/// A statement on a trigger, policy or rule (its kind's word at `tokens[i]`, after an optional
/// `CONSTRAINT`): its summary (`DROP TRIGGER audit ON issued_coupons`) and `mode` on its table,
/// the name after the first `ON`, but after `TO` for `CREATE RULE name AS ON event TO table`.
fn on_table(s: &mut Statement, tokens: &[Token], i: usize, mode: LockMode) {
    let kind = skip_words(tokens, i, &["constraint"]);
    let verb: Vec<String> = tokens[..=kind.min(tokens.len().saturating_sub(1))]
        .iter()
        .filter_map(|t| match t {
            Token::Word(w) => Some(w.to_uppercase()),
            _ => None,
        })
        .collect();
    let name = read_name(tokens, skip_words(tokens, kind + 1, &["if", "exists"]))
        .map(|(n, _)| n)
        .unwrap_or_default();
    let rule_created = is_word(tokens.first(), "create") && is_word(tokens.get(kind), "rule");
    let after = if rule_created { "to" } else { "on" };
    let table = named_after(tokens, &[after]).into_iter().next();
    s.summary = format!(
        "{} {name} ON {}",
        verb.join(" "),
        table.as_deref().unwrap_or("?")
    );
    s.locks.extend(table.map(|table| lock(table, mode)));
}

/// `DROP TABLE`, `VIEW`, `MATERIALIZED VIEW`, `SEQUENCE`, `FOREIGN TABLE`: ACCESS EXCLUSIVE on
/// each relation named; `DROP TRIGGER`, `POLICY`, `RULE ... ON table`: ACCESS EXCLUSIVE on the
/// table. Any other object (a function, a type, a schema) may take tables with it (`CASCADE`,
/// a schema's tables): the strongest lock is assumed, as for a statement not recognised.
fn drop(s: &mut Statement, tokens: &[Token], words: &[&str]) {
    const RELATIONS: [&str; 5] = ["table", "view", "materialized", "sequence", "foreign"];
    if let Some(mode) = on_table_mode(tokens, 1) {
        on_table(s, tokens, 1, mode);
        return;
    }
    let relation = RELATIONS.iter().any(|w| is_word(tokens.get(1), w))
        && (!is_word(tokens.get(1), "foreign") || is_word(tokens.get(2), "table"));
    if !relation {
        let name = read_name(tokens, skip_words(tokens, 2, &["if", "exists"]));
        s.summary = format!("{} {}", upper(words, 2), name.unwrap_or_default().0);
        s.lock_assumed = true;
        s.locks
            .push(lock("(not recognised)".into(), LockMode::AccessExclusive));
        return;
    }
    let kind_end = skip_words(tokens, 1, &RELATIONS);
    let kind_end = skip_words(tokens, kind_end, &["view", "table"]);
    let mut i = skip_words(tokens, kind_end, &["if", "exists"]);
    let mut names = Vec::new();
    while let Some((name, next)) = read_name(tokens, i) {
        names.push(name);
        if tokens.get(next) != Some(&Token::Punct(',')) {
            break;
        }
        i = next + 1;
    }
    s.summary = format!("{} {}", upper(words, kind_end), names.join(", "));
    for name in names {
        s.locks.push(lock(name, LockMode::AccessExclusive));
    }
}

fn create_index(s: &mut Statement, tokens: &[Token], unique: bool) {
    let on = tokens
        .iter()
        .position(|t| matches!(t, Token::Word(w) if w == "on"));
    let table = on
        .map(|p| skip_words(tokens, p + 1, &["only"]))
        .and_then(|p| read_name(tokens, p))
        .map(|(n, _)| n)
        .unwrap_or_default();
    let concurrently = has(tokens, "concurrently");
    s.online = concurrently;
    s.summary = format!(
        "CREATE {}INDEX {}ON {table}",
        if unique { "UNIQUE " } else { "" },
        if concurrently { "CONCURRENTLY " } else { "" }
    );
    let mode = concurrent_or(concurrently, LockMode::Share);
    s.locks.push(lock(table, mode));
}

/// `ALTER TABLE`: ACCESS EXCLUSIVE, except a lone VALIDATE (SHARE UPDATE EXCLUSIVE) and a
/// lone foreign key (SHARE ROW EXCLUSIVE, also on the table it references); a partition
/// attached or detached is locked too.
fn alter_table(s: &mut Statement, tokens: &[Token]) {
    let i = skip_words(tokens, 2, &["if", "exists", "only"]);
    let (table, after) = read_name(tokens, i).unwrap_or_default();
    s.summary = format!("ALTER TABLE {table}");
    let rest = &tokens[after.min(tokens.len())..];
    let only_validate =
        has(rest, "validate") && !has(rest, "add") && !has(rest, "drop") && !has(rest, "alter");
    let foreign_key_only = has(rest, "foreign") && !has(rest, "column") && !has(rest, "check");
    // Only `ENABLE` / `DISABLE [ALWAYS | REPLICA] TRIGGER` actions: SHARE ROW EXCLUSIVE, as
    // creating a trigger (`ENABLE RULE`, `ROW LEVEL SECURITY` and the rest take ACCESS EXCLUSIVE).
    let actions = top_level_actions(rest);
    let trigger_switch_only = !actions.is_empty()
        && actions.iter().all(|action| {
            (is_word(action.first(), "enable") || is_word(action.first(), "disable"))
                && is_word(
                    action.get(skip_words(action, 1, &["always", "replica"])),
                    "trigger",
                )
        });
    // The partition attached or detached takes ACCESS EXCLUSIVE; the table, SHARE UPDATE
    // EXCLUSIVE for `ATTACH` and `DETACH ... CONCURRENTLY`, ACCESS EXCLUSIVE for `DETACH`.
    let attach = has(rest, "attach") && has(rest, "partition");
    if has(rest, "detach") && has(rest, "concurrently") {
        s.unsupported = Some(DETACH_CONCURRENTLY);
    }
    let mode = if only_validate || attach || s.unsupported.is_some() {
        LockMode::ShareUpdateExclusive
    } else if foreign_key_only || trigger_switch_only {
        LockMode::ShareRowExclusive
    } else {
        LockMode::AccessExclusive
    };
    s.locks.push(lock(table, mode));
    for verb in ["attach", "detach"] {
        for partition in named_after(rest, &[verb, "partition"]) {
            s.locks.push(lock(partition, LockMode::AccessExclusive));
        }
    }
    for target in named_after(rest, &["references"]) {
        s.locks.push(lock(target, LockMode::ShareRowExclusive));
    }
}

fn drop_index(s: &mut Statement, tokens: &[Token]) {
    let concurrently = is_word(tokens.get(2), "concurrently");
    let i = skip_words(tokens, 2, &["concurrently", "if", "exists"]);
    let name = read_name(tokens, i).map(|(n, _)| n).unwrap_or_default();
    s.online = concurrently;
    s.summary = format!(
        "DROP INDEX {}{name}",
        if concurrently { "CONCURRENTLY " } else { "" }
    );
    let mode = concurrent_or(concurrently, LockMode::AccessExclusive);
    s.locks.push(LockTaken {
        relation: format!("{name} and its table"),
        mode,
        lookup: name,
    });
}

fn reindex(s: &mut Statement, tokens: &[Token], words: &[&str]) {
    let concurrently = has(tokens, "concurrently");
    s.online = concurrently;
    s.summary = upper(words, words.len());
    let name = tokens.iter().rev().find_map(|t| match t {
        Token::Word(w) | Token::Quoted(w) => Some(w.clone()),
        _ => None,
    });
    let mode = concurrent_or(concurrently, LockMode::AccessExclusive);
    s.locks.push(lock(name.unwrap_or_default(), mode));
}

#[cfg(test)]
mod tests {
    use crate::statements::{split, LockMode};

    fn locks(sql: &str) -> Vec<(String, LockMode)> {
        split(sql)[0]
            .locks
            .iter()
            .map(|l| (l.relation.clone(), l.mode))
            .collect()
    }

    #[test]
    fn validate_constraint_takes_share_update_exclusive_only() {
        for sql in [
            "ALTER TABLE child VALIDATE CONSTRAINT child_parent_fk",
            "ALTER TABLE ONLY \"Child\" VALIDATE CONSTRAINT \"Not Null\"",
            "alter table if exists child validate constraint c",
        ] {
            let l = locks(sql);
            assert_eq!(l.len(), 1, "{sql}: {l:?}");
            assert_eq!(l[0].1, LockMode::ShareUpdateExclusive, "{sql}");
        }
        assert_eq!(
            locks("ALTER TABLE ONLY \"Child\" VALIDATE CONSTRAINT x")[0].0,
            "Child"
        );
    }

    #[test]
    fn partitions_lock_their_parent_and_the_partition() {
        let ae = LockMode::AccessExclusive;
        assert_eq!(
            locks("CREATE TABLE events_2027 PARTITION OF \"App\".events FOR VALUES FROM ('2027-01-01') TO ('2028-01-01')"),
            [("App.events".to_string(), ae)]
        );
        let sue = LockMode::ShareUpdateExclusive;
        assert_eq!(
            locks("ALTER TABLE events ATTACH PARTITION events_2028 FOR VALUES FROM ('2028-01-01') TO ('2029-01-01')"),
            [("events".to_string(), sue), ("events_2028".to_string(), ae)]
        );
        assert_eq!(
            locks("ALTER TABLE events DETACH PARTITION events_2020"),
            [("events".to_string(), ae), ("events_2020".to_string(), ae)]
        );
        let concurrently =
            &split("ALTER TABLE events DETACH PARTITION events_2020 CONCURRENTLY")[0];
        assert!(!concurrently.online && concurrently.unsupported.is_some());
        assert_eq!(
            locks(&concurrently.sql),
            [("events".to_string(), sue), ("events_2020".to_string(), ae)]
        );
        // A partitioned table, with a column called partition: no lock on an existing table.
        assert_eq!(
            locks("CREATE TABLE audit (partition text, \"of\" int) PARTITION BY LIST (partition)"),
            []
        );
    }

    #[test]
    fn triggers_policies_rules_views_and_other_objects() {
        let (ae, sre) = (LockMode::AccessExclusive, LockMode::ShareRowExclusive);
        let t = |name: &str, mode| vec![(name.to_string(), mode)];
        for (sql, expected) in [
            (
                "CREATE TRIGGER audit AFTER UPDATE ON issued_coupons FOR EACH ROW EXECUTE FUNCTION f()",
                t("issued_coupons", sre),
            ),
            (
                "CREATE OR REPLACE CONSTRAINT TRIGGER c AFTER INSERT ON \"App\".t FOR EACH ROW EXECUTE FUNCTION f()",
                t("App.t", sre),
            ),
            ("DROP TRIGGER IF EXISTS audit ON issued_coupons", t("issued_coupons", ae)),
            ("CREATE POLICY mine ON issued_coupons USING (true)", t("issued_coupons", ae)),
            ("DROP RULE r ON campaigns", t("campaigns", ae)),
            (
                "CREATE OR REPLACE RULE r AS ON INSERT TO campaigns DO INSTEAD NOTHING",
                t("campaigns", ae),
            ),
            (
                "CREATE TRIGGER t AFTER UPDATE OF amount_yen ON issued_coupons FOR EACH ROW EXECUTE FUNCTION f()",
                t("issued_coupons", sre),
            ),
            ("ALTER TABLE issued_coupons DISABLE TRIGGER audit", t("issued_coupons", sre)),
            ("ALTER TABLE issued_coupons ENABLE ALWAYS TRIGGER audit", t("issued_coupons", sre)),
            (
                "ALTER TABLE issued_coupons DISABLE TRIGGER audit, ENABLE TRIGGER ALL",
                t("issued_coupons", sre),
            ),
            // Another action beside it: ACCESS EXCLUSIVE.
            (
                "ALTER TABLE issued_coupons DISABLE TRIGGER audit, ENABLE RULE r",
                t("issued_coupons", ae),
            ),
            (
                "ALTER TABLE issued_coupons ENABLE ROW LEVEL SECURITY",
                t("issued_coupons", ae),
            ),
            ("DROP VIEW IF EXISTS v1, s.v2 CASCADE", vec![("v1".to_string(), ae), ("s.v2".to_string(), ae)]),
            ("DROP MATERIALIZED VIEW mv", t("mv", ae)),
            ("DROP FOREIGN TABLE remote_t", t("remote_t", ae)),
            ("ALTER TRIGGER audit ON issued_coupons RENAME TO audit2", t("issued_coupons", ae)),
            ("ALTER POLICY mine ON issued_coupons USING (false)", t("issued_coupons", ae)),
            ("DROP TABLE IF EXISTS old_t", t("old_t", ae)),
            ("REFRESH MATERIALIZED VIEW mv", t("mv", ae)),
            ("REFRESH MATERIALIZED VIEW CONCURRENTLY mv", t("mv", LockMode::Exclusive)),
            // A trigger's function: a catalog entry, no table lock.
            ("CREATE FUNCTION f() RETURNS trigger AS $$ BEGIN RETURN NEW; END $$ LANGUAGE plpgsql", vec![]),
        ] {
            assert_eq!(locks(sql), expected, "{sql}");
        }
        let s = split(
            "DROP MATERIALIZED VIEW IF EXISTS mv; DROP SCHEMA old CASCADE; DROP FUNCTION f();
             DROP FOREIGN DATA WRAPPER w;",
        );
        assert_eq!(s[0].summary, "DROP MATERIALIZED VIEW mv");
        // A schema, a function or a wrapper may take tables with it: assumed, and said.
        assert!(s[1].lock_assumed && s[2].lock_assumed && s[3].lock_assumed);
        assert_eq!(s[1].summary, "DROP SCHEMA old");
        let s = split(
            "DROP TRIGGER IF EXISTS audit ON issued_coupons;
             CREATE OR REPLACE TRIGGER \"Audit\" AFTER UPDATE ON t FOR EACH ROW EXECUTE FUNCTION f();
             CREATE RULE r AS ON INSERT TO campaigns DO INSTEAD NOTHING;
             ALTER POLICY mine ON issued_coupons USING (false);",
        );
        let summaries: Vec<&str> = s.iter().map(|st| st.summary.as_str()).collect();
        assert_eq!(
            summaries,
            [
                "DROP TRIGGER audit ON issued_coupons",
                "CREATE OR REPLACE TRIGGER Audit ON t",
                "CREATE RULE r ON campaigns",
                "ALTER POLICY mine ON issued_coupons",
            ]
        );
    }

    #[test]
    fn a_foreign_key_takes_share_row_exclusive_on_both_tables() {
        for sql in [
            "ALTER TABLE child ADD CONSTRAINT child_parent_fk FOREIGN KEY (parent_id) REFERENCES parent (id) NOT VALID",
            "ALTER TABLE child ADD CONSTRAINT child_parent_fk FOREIGN KEY (a, b) REFERENCES parent (x, y) MATCH FULL ON DELETE SET NULL",
            "ALTER TABLE child ADD FOREIGN KEY (parent_id) REFERENCES parent",
        ] {
            assert_eq!(
                locks(sql),
                [
                    ("child".to_string(), LockMode::ShareRowExclusive),
                    ("parent".to_string(), LockMode::ShareRowExclusive)
                ],
                "{sql}"
            );
        }
    }

    #[test]
    fn the_not_null_pattern_is_brief_exclusive_then_a_scan_then_brief_exclusive() {
        // Adding the check (NOT VALID: no scan) and SET NOT NULL (no scan once the check is
        // valid) take ACCESS EXCLUSIVE for a moment; the scan in between does not.
        let s = split(
            "ALTER TABLE t ADD CONSTRAINT t_c_set CHECK (c IS NOT NULL) NOT VALID;
             ALTER TABLE t VALIDATE CONSTRAINT t_c_set;
             ALTER TABLE t ALTER COLUMN c SET NOT NULL;",
        );
        let strongest: Vec<_> = s.iter().map(|st| st.strongest_lock().unwrap()).collect();
        assert_eq!(
            strongest,
            [
                LockMode::AccessExclusive,
                LockMode::ShareUpdateExclusive,
                LockMode::AccessExclusive
            ]
        );
        // A VALIDATE together with another action is not a lone VALIDATE.
        assert_eq!(
            split("ALTER TABLE t VALIDATE CONSTRAINT a, ALTER COLUMN c SET NOT NULL")[0]
                .strongest_lock(),
            Some(LockMode::AccessExclusive)
        );
    }
}
