//! Censuses: before a constraint, count the rows (or groups) that would break it.
//!
//! Censuses come from the migration itself: a `CREATE UNIQUE INDEX` gives a duplicate-group
//! count under its predicate, an `ADD CONSTRAINT ... CHECK` a count of rows that break the
//! check, and a `/* pgmend:precondition ... */` block in the file a query of its own.
//! They are facts about the data, never records of which tool ran.
//!
//! Censuses, without a server. `Census` (guard, name, counts, fix, violators_sql, tables, and
//! what is left to `resolve` against the catalog) and `Guard` (`unique_index`, `check_not_valid`,
//! `check`, `foreign_key_not_valid`, `foreign_key`, `validate`, `precondition`; all but the two
//! `NOT VALID` ones block). `for_migration` reads a migration's text with `regex`: each `/* pgmend:precondition ...
//! */` block (keys `name`, `explain`, `fix`, `tables`, then `query:` to the end of the block; an
//! unknown or missing key is an error), each `CREATE UNIQUE INDEX` (a `GROUP BY ... HAVING count(*) >
//! 1` over the columns, under the predicate, with NULLs left out) and each `ALTER TABLE ... ADD
//! CONSTRAINT ... CHECK (...) [NOT VALID]` (`WHERE NOT (expression)`). Foreign keys and
//! validations:
//!
//! - `ALTER TABLE child ADD CONSTRAINT name FOREIGN KEY (columns) REFERENCES parent [(keys)]
//!   [MATCH FULL] ... [NOT VALID]` counts the orphans, the rows the key would refuse
//!   ([`orphans_sql`]): under MATCH SIMPLE (the default) a row with every column set and no parent
//!   row with those keys; under MATCH FULL also a row with some but not all of them NULL. Without
//!   `(keys)` the parent's primary key is read from the catalog when the census is taken
//!   ([`Resolve::PrimaryKey`]).
//! - `ALTER TABLE t VALIDATE CONSTRAINT name` counts what VALIDATE would refuse; which constraint
//!   that is, is known only when the census is taken ([`Resolve::Constraint`], resolved by
//!   `evaluate`): the catalog's (a CHECK's body as `sql_text::CheckBody`, a foreign key's columns
//!   as `Ident`s), else the `ADD CONSTRAINT ... NOT VALID` of an earlier statement or pending
//!   migration of the set ([`link_declared`], called by `migrate::source` in version order). The
//!   census blocks: violators stop the step before the VALIDATE (exit 1).
//!
//! `added_column` reads `ALTER
//! TABLE ... ADD [COLUMN]` statements (type and default), and `with_shadows` wraps a census query
//! in a CTE named like the table, `WITH issued_coupons AS (SELECT *, (false)::boolean AS
//! legacy_duplicate, ... FROM issued_coupons)`, so that a column a pending migration adds reads as
//! the value it gives existing rows.

use std::sync::LazyLock;

use anyhow::{bail, Result};
use regex::Regex;
use serde::Serialize;

use crate::statements::Statement;

/// What a census guards, which decides whether violators stop the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Guard {
    /// A unique index: any violating group makes the build fail, so it is not attempted.
    UniqueIndex,
    /// A CHECK added NOT VALID: existing violators are allowed (and reported).
    CheckNotValid,
    /// A CHECK added and validated at once: violators make it fail, so it is not attempted.
    Check,
    /// A FOREIGN KEY added NOT VALID: existing orphans are allowed (and reported).
    ForeignKeyNotValid,
    /// A FOREIGN KEY added and validated at once: orphans make it fail, so it is not attempted.
    ForeignKey,
    /// `VALIDATE CONSTRAINT` of a NOT VALID check or foreign key: violators make it fail.
    Validate,
    /// A precondition written in the migration file.
    Precondition,
}

impl Guard {
    pub fn blocks(self) -> bool {
        !self.not_valid()
    }

    /// A constraint added NOT VALID: its census only reports.
    pub fn not_valid(self) -> bool {
        matches!(self, Guard::CheckNotValid | Guard::ForeignKeyNotValid)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Census {
    pub guard: Guard,
    /// The constraint, index or precondition name.
    pub name: String,
    /// What a violator is, in words.
    pub counts: String,
    /// What to do when there are violators.
    pub fix: String,
    /// A query whose rows are the violators (one row per violating group or row).
    pub violators_sql: String,
    /// Tables the query reads, for shadowing columns a pending migration adds.
    pub tables: Vec<String>,
    /// What only the catalog can tell, read when the census is taken (`evaluate`); until then
    /// `violators_sql` is empty.
    #[serde(skip)]
    pub resolve: Option<Resolve>,
}

/// The part of a census the migration's text leaves to the catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolve {
    /// `VALIDATE CONSTRAINT name` on `table` (both as written): the constraint in the catalog,
    /// else `declared`, the census of the `ADD CONSTRAINT ... NOT VALID` of an earlier statement
    /// or pending migration.
    Constraint {
        table: String,
        name: String,
        declared: Option<Box<Census>>,
    },
    /// A foreign key that names no referenced columns: they are `parent`'s primary key.
    PrimaryKey {
        child: String,
        columns: Vec<String>,
        parent: String,
        match_full: bool,
    },
}

static UNIQUE_INDEX: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"(?is)^\s*create\s+unique\s+index\s+(?:concurrently\s+)?(?:if\s+not\s+exists\s+)?("?[\w$]+"?)\s+on\s+(?:only\s+)?([\w$."]+)\s*(?:using\s+\w+\s*)?\((.+?)\)\s*(?:include\s*\([^)]*\)\s*)?(?:where\s+(.+?))?\s*$"#,
    )
    .unwrap()
});

static ADD_CHECK: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"(?is)^\s*alter\s+table\s+(?:if\s+exists\s+)?(?:only\s+)?([\w$."]+)\s+add\s+constraint\s+("?[\w$]+"?)\s+check\s*\((.+)\)\s*(not\s+valid)?\s*$"#,
    )
    .unwrap()
});

static ADD_FOREIGN_KEY: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"(?is)^\s*alter\s+table\s+(?:if\s+exists\s+)?(?:only\s+)?([\w$."]+)\s+add\s+constraint\s+("?[\w$]+"?)\s+foreign\s+key\s*\(([^)]+)\)\s*references\s+([\w$."]+)\s*(?:\(([^)]+)\))?(.*)$"#,
    )
    .unwrap()
});

static VALIDATE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"(?is)^\s*alter\s+table\s+(?:if\s+exists\s+)?(?:only\s+)?([\w$."]+)\s+validate\s+constraint\s+("?[\w$]+"?)\s*$"#,
    )
    .unwrap()
});

static NOT_VALID_AT_END: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?is)\bnot\s+valid\s*$").unwrap());

static MATCH_FULL: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?is)\bmatch\s+full\b").unwrap());

static PRECONDITION: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?s)/\*\s*pgmend:precondition\b(.*?)\*/").unwrap());

/// The censuses a migration's statements and precondition blocks call for.
pub fn for_migration(sql: &str, statements: &[Statement], origin: &str) -> Result<Vec<Census>> {
    let mut out = Vec::new();
    for block in PRECONDITION.captures_iter(sql) {
        out.push(parse_precondition(&block[1]).map_err(|e| anyhow::anyhow!("{origin}: {e}"))?);
    }
    for s in statements {
        if let Some(c) = UNIQUE_INDEX.captures(&s.sql) {
            let (name, table, columns) = (c[1].to_string(), c[2].to_string(), &c[3]);
            let predicate = c.get(4).map(|m| m.as_str().to_string());
            let cols: Vec<&str> = columns.split(',').map(str::trim).collect();
            let not_null = cols
                .iter()
                .map(|c| format!("{c} IS NOT NULL"))
                .collect::<Vec<_>>()
                .join(" AND ");
            let filter = match &predicate {
                Some(p) => format!("({p}) AND {not_null}"),
                None => not_null,
            };
            out.push(Census {
                guard: Guard::UniqueIndex,
                name: name.clone(),
                counts: format!(
                    "groups of ({}) with more than one row{}",
                    cols.join(", "),
                    predicate.as_ref().map(|p| format!(" where {p}")).unwrap_or_default()
                ),
                fix: "void the duplicates first (with the release's void_duplicates repair: pgmend repair apply NAME --yes, or by hand), then rerun".into(),
                violators_sql: format!(
                    "SELECT {cols}, count(*) AS rows FROM {table} WHERE {filter} GROUP BY {cols} HAVING count(*) > 1 ORDER BY count(*) DESC, {cols}",
                    cols = cols.join(", ")
                ),
                tables: vec![table],
                resolve: None,
            });
        } else if let Some(c) = ADD_CHECK.captures(&s.sql) {
            let (table, name, expression) = (c[1].to_string(), c[2].to_string(), c[3].to_string());
            let not_valid = c.get(4).is_some();
            out.push(Census {
                guard: if not_valid { Guard::CheckNotValid } else { Guard::Check },
                name: name.clone(),
                counts: format!("rows of {table} that break CHECK ({expression})"),
                fix: if not_valid {
                    format!("existing rows break it, so VALIDATE CONSTRAINT would fail; the check still refuses new violations. Fix the rows, or accept them: leave the check NOT VALID, which needs nothing more. Once no row breaks it, `pgmend migrate validate {name}` validates it")
                } else {
                    "fix the rows first, or add the constraint NOT VALID".into()
                },
                violators_sql: format!("SELECT * FROM {table} WHERE NOT ({expression})"),
                tables: vec![table],
                resolve: None,
            });
        } else if let Some(c) = ADD_FOREIGN_KEY.captures(&s.sql) {
            out.push(foreign_key(&c));
        } else if let Some(c) = VALIDATE.captures(&s.sql) {
            let (table, name) = (c[1].to_string(), c[2].to_string());
            let declared = out
                .iter()
                .rev()
                .find(|e| e.guard.not_valid() && same_name(&e.name, &name))
                .map(|e| Box::new(e.clone()));
            out.push(validate(table, name, declared));
        }
    }
    Ok(out)
}

/// A constraint name as the catalog holds it: a quoted one as written, any other folded to
/// lower case.
pub fn catalog_name(name: &str) -> String {
    match name.strip_prefix('"').and_then(|n| n.strip_suffix('"')) {
        Some(quoted) => quoted.replace("\"\"", "\""),
        None => name.to_lowercase(),
    }
}

fn same_name(a: &str, b: &str) -> bool {
    catalog_name(a) == catalog_name(b)
}

/// The census of `ADD CONSTRAINT name FOREIGN KEY (columns) REFERENCES parent [(keys)] ...`.
fn foreign_key(c: &regex::Captures) -> Census {
    let (table, name, parent) = (c[1].to_string(), c[2].to_string(), c[4].to_string());
    let list = |s: &str| -> Vec<String> { s.split(',').map(|x| x.trim().to_string()).collect() };
    let columns = list(&c[3]);
    let rest = c.get(6).map_or("", |m| m.as_str());
    let not_valid = NOT_VALID_AT_END.is_match(rest);
    let match_full = MATCH_FULL.is_match(rest);
    let (violators_sql, resolve) = match c.get(5) {
        Some(keys) => (
            orphans_sql(&table, &columns, &parent, &list(keys.as_str()), match_full),
            None,
        ),
        None => (
            String::new(),
            Some(Resolve::PrimaryKey {
                child: table.clone(),
                columns: columns.clone(),
                parent: parent.clone(),
                match_full,
            }),
        ),
    };
    let mut tables = vec![table.clone()];
    if parent != table {
        tables.push(parent.clone());
    }
    Census {
        guard: if not_valid {
            Guard::ForeignKeyNotValid
        } else {
            Guard::ForeignKey
        },
        counts: orphans_counts(&table, &columns, &parent, match_full),
        fix: if not_valid {
            format!("existing orphans are kept, so VALIDATE CONSTRAINT {name} would fail; the key still refuses new ones. Give each a parent, set its reference to NULL or remove it (an `orphans` repair), then validate it in a later migration (`ALTER TABLE {table} VALIDATE CONSTRAINT {name}`)")
        } else {
            "give the orphans a parent, set their reference to NULL or remove them (an `orphans` repair) first, or add the key NOT VALID and validate it in a later migration".into()
        },
        name,
        violators_sql,
        tables,
        resolve,
    }
}

/// What one orphan is, in words.
pub fn orphans_counts(child: &str, columns: &[String], parent: &str, match_full: bool) -> String {
    format!(
        "rows of {child} whose ({}) has no row in {parent}{}",
        columns.join(", "),
        if match_full && columns.len() > 1 {
            " (MATCH FULL: or is NULL only in part)"
        } else {
            ""
        }
    )
}

/// The rows of `child` that a foreign key from `columns` to `parent`'s `keys` refuses (names as
/// SQL text: as written in a migration, or `Ident`s from the catalog). MATCH SIMPLE: every
/// column set and no parent row with those keys; MATCH FULL: also some, but not all, NULL.
pub fn orphans_sql(
    child: &str,
    columns: &[String],
    parent: &str,
    keys: &[String],
    match_full: bool,
) -> String {
    let each = |f: &dyn Fn(&String) -> String, by: &str| -> String {
        columns.iter().map(f).collect::<Vec<_>>().join(by)
    };
    let matched = columns
        .iter()
        .zip(keys)
        .map(|(c, k)| format!("parent_row.{k} = child_row.{c}"))
        .collect::<Vec<_>>()
        .join(" AND ");
    let missing = format!("NOT EXISTS (SELECT 1 FROM {parent} parent_row WHERE {matched})");
    let condition = if match_full && columns.len() > 1 {
        format!(
            "NOT ({}) AND ({} OR {missing})",
            each(&|c| format!("child_row.{c} IS NULL"), " AND "),
            each(&|c| format!("child_row.{c} IS NULL"), " OR ")
        )
    } else {
        format!(
            "{} AND {missing}",
            each(&|c| format!("child_row.{c} IS NOT NULL"), " AND ")
        )
    };
    format!("SELECT child_row.* FROM {child} child_row WHERE {condition}")
}

/// The census of `ALTER TABLE table VALIDATE CONSTRAINT name` (both as SQL writes them),
/// resolved when it is taken; `declared`: the census of the `ADD CONSTRAINT` that adds it.
pub fn validate(table: String, name: String, declared: Option<Box<Census>>) -> Census {
    Census {
        guard: Guard::Validate,
        counts: format!("rows of {table} that VALIDATE CONSTRAINT {name} would refuse"),
        fix: format!("fix those rows (a check's: update them; a foreign key's orphans: give each a parent, set its reference to NULL or remove it, an `orphans` repair), then rerun; {name} stays NOT VALID meanwhile and still refuses new violations"),
        tables: vec![table.clone()],
        violators_sql: String::new(),
        resolve: Some(Resolve::Constraint {
            table,
            name: name.clone(),
            declared,
        }),
        name,
    }
}

/// Gives each `VALIDATE` census of `censuses` that found no `ADD CONSTRAINT ... NOT VALID` in
/// its own file the latest one of `earlier` (the censuses of the migrations before it, in
/// version order).
pub fn link_declared(censuses: &mut [Census], earlier: &[Census]) {
    for c in censuses.iter_mut() {
        if let Some(Resolve::Constraint { name, declared, .. }) = &mut c.resolve {
            if declared.is_none() {
                *declared = earlier
                    .iter()
                    .rev()
                    .find(|e| e.guard.not_valid() && same_name(&e.name, name))
                    .map(|e| Box::new(e.clone()));
            }
        }
    }
}

/// `name:`, `explain:`, `fix:`, `tables:` lines, then `query:` and the SQL to the end.
fn parse_precondition(body: &str) -> Result<Census> {
    let mut fields = std::collections::BTreeMap::new();
    let mut lines = body.lines();
    let mut query = String::new();
    for line in lines.by_ref() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let Some((key, value)) = line.split_once(':') else {
            bail!("precondition line {line:?} is not `key: value`");
        };
        let key = key.trim();
        if key == "query" {
            query = value.trim().to_string();
            break;
        }
        if !["name", "explain", "fix", "tables"].contains(&key) {
            bail!("precondition key {key:?} is unknown; use name, explain, fix, tables, query");
        }
        fields.insert(key.to_string(), value.trim().to_string());
    }
    for line in lines {
        query.push('\n');
        query.push_str(line);
    }
    let query = query.trim().trim_end_matches(';').to_string();
    let get = |k: &str| {
        fields
            .get(k)
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("precondition is missing `{k}:`"))
    };
    if query.is_empty() {
        bail!("precondition is missing `query:` (a SELECT whose rows are the violators)");
    }
    Ok(Census {
        guard: Guard::Precondition,
        name: get("name")?,
        counts: get("explain")?,
        fix: get("fix")?,
        violators_sql: query,
        tables: get("tables")?
            .split(',')
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
            .collect(),
        resolve: None,
    })
}

/// A column a pending migration adds, with the value it gives existing rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddedColumn {
    pub table: String,
    pub column: String,
    pub type_sql: String,
    pub default_sql: Option<String>,
}

static ADD_COLUMN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"(?is)^\s*alter\s+table\s+(?:if\s+exists\s+)?(?:only\s+)?([\w$."]+)\s+add\s+(?:column\s+)?(?:if\s+not\s+exists\s+)?("?[\w$]+"?)\s+(.+?)\s*$"#,
    )
    .unwrap()
});

/// The columns a statement adds (`ALTER TABLE t ADD COLUMN c type [NOT NULL] [DEFAULT x]`).
pub fn added_column(statement: &Statement) -> Option<AddedColumn> {
    let c = ADD_COLUMN.captures(&statement.sql)?;
    if c[2].eq_ignore_ascii_case("constraint") {
        return None;
    }
    let rest = c[3].to_string();
    let lower = rest.to_lowercase();
    let type_end = [
        " not ",
        " null",
        " default ",
        " references ",
        " check",
        " constraint ",
        " primary ",
        " unique",
        " collate ",
    ]
    .iter()
    .filter_map(|k| lower.find(k))
    .min()
    .unwrap_or(rest.len());
    let default_sql = lower.find(" default ").map(|at| {
        let after = &rest[at + " default ".len()..];
        let after_lower = after.to_lowercase();
        let end = [" not ", " null", " references ", " check", " constraint "]
            .iter()
            .filter_map(|k| after_lower.find(k))
            .min()
            .unwrap_or(after.len());
        after[..end].trim().to_string()
    });
    Some(AddedColumn {
        table: c[1].to_string(),
        column: c[2].to_string(),
        type_sql: rest[..type_end].trim().to_string(),
        default_sql,
    })
}

/// A table as an earlier pending step will leave it: the body of a CTE named like the table,
/// which reads the real one (the coupons as a pending void leaves them). It carries the
/// shadows of its table, so [`with_predicted`] gives that table no shadow CTE of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Predicted {
    pub table: String,
    pub body: String,
}

/// Wraps `sql` so that each of `shadows` (columns a pending step will add, which the table
/// lacks today) reads as the value that step gives existing rows.
pub fn with_shadows(sql: &str, shadows: &[AddedColumn]) -> String {
    with_predicted(sql, shadows, &[])
}

/// [`with_shadows`], and each table of `predicted` read as that prediction's body.
pub fn with_predicted(sql: &str, shadows: &[AddedColumn], predicted: &[Predicted]) -> String {
    let mut by_table: Vec<(String, Vec<&AddedColumn>)> = Vec::new();
    for s in shadows
        .iter()
        .filter(|s| !predicted.iter().any(|p| p.table == s.table))
    {
        match by_table.iter_mut().find(|(t, _)| *t == s.table) {
            Some((_, cols)) => cols.push(s),
            None => by_table.push((s.table.clone(), vec![s])),
        }
    }
    if by_table.is_empty() && predicted.is_empty() {
        return sql.to_string();
    }
    let mut ctes: Vec<String> = by_table
        .iter()
        .map(|(table, cols)| {
            let extra: Vec<String> = cols
                .iter()
                .map(|c| {
                    format!(
                        "({})::{} AS {}",
                        c.default_sql.as_deref().unwrap_or("NULL"),
                        c.type_sql,
                        c.column
                    )
                })
                .collect();
            format!("{table} AS (SELECT *, {} FROM {table})", extra.join(", "))
        })
        .collect();
    ctes.extend(
        predicted
            .iter()
            .map(|p| format!("{} AS ({})", p.table, p.body)),
    );
    format!("WITH {} {sql}", ctes.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::statements::split;

    #[test]
    fn unique_index_census_keeps_the_predicate() {
        let sql = "CREATE UNIQUE INDEX CONCURRENTLY one_coupon_per_member ON issued_coupons (campaign_id, member_id) WHERE NOT legacy_duplicate;";
        let c = &for_migration(sql, &split(sql), "V3").unwrap()[0];
        assert_eq!(c.guard, Guard::UniqueIndex);
        assert_eq!(c.name, "one_coupon_per_member");
        assert_eq!(
            c.violators_sql,
            "SELECT campaign_id, member_id, count(*) AS rows FROM issued_coupons WHERE (NOT legacy_duplicate) AND campaign_id IS NOT NULL AND member_id IS NOT NULL GROUP BY campaign_id, member_id HAVING count(*) > 1 ORDER BY count(*) DESC, campaign_id, member_id"
        );
    }

    #[test]
    fn check_census_and_precondition_block() {
        let sql = "/* pgmend:precondition
name: counters_match
explain: campaigns whose counter differs
fix: run the rebuild
tables: campaigns, campaign_budgets
query:
SELECT 1 FROM campaigns;
*/
ALTER TABLE campaign_budgets ADD CONSTRAINT issued_within_budget CHECK (issued_yen BETWEEN 0 AND budget_yen) NOT VALID;";
        let cs = for_migration(sql, &split(sql), "V4").unwrap();
        assert_eq!(cs[0].guard, Guard::Precondition);
        assert_eq!(cs[0].tables, ["campaigns", "campaign_budgets"]);
        assert_eq!(cs[0].violators_sql, "SELECT 1 FROM campaigns");
        assert_eq!(cs[1].guard, Guard::CheckNotValid);
        assert_eq!(
            cs[1].violators_sql,
            "SELECT * FROM campaign_budgets WHERE NOT (issued_yen BETWEEN 0 AND budget_yen)"
        );
        let bad = "/* pgmend:precondition\nname: x\nbogus: y\n*/ SELECT 1;";
        assert!(for_migration(bad, &split(bad), "V9")
            .unwrap_err()
            .to_string()
            .contains("bogus"));
    }

    #[test]
    fn foreign_key_census_counts_orphans_under_its_match_rule() {
        let sql = "ALTER TABLE orders ADD CONSTRAINT orders_customer_fk FOREIGN KEY (customer_id) REFERENCES customers (id) NOT VALID;
ALTER TABLE lines ADD CONSTRAINT lines_order_fk FOREIGN KEY (shop, order_no) REFERENCES orders (shop, no) MATCH FULL ON DELETE CASCADE;
ALTER TABLE orders ADD CONSTRAINT orders_shop_fk FOREIGN KEY (shop) REFERENCES shops;";
        let cs = for_migration(sql, &split(sql), "V2").unwrap();
        assert_eq!(cs[0].guard, Guard::ForeignKeyNotValid);
        assert!(!cs[0].guard.blocks());
        assert_eq!(cs[0].tables, ["orders", "customers"]);
        assert_eq!(
            cs[0].violators_sql,
            "SELECT child_row.* FROM orders child_row WHERE child_row.customer_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM customers parent_row WHERE parent_row.id = child_row.customer_id)"
        );
        assert_eq!(cs[1].guard, Guard::ForeignKey);
        assert!(cs[1].guard.blocks());
        assert_eq!(
            cs[1].violators_sql,
            "SELECT child_row.* FROM lines child_row WHERE NOT (child_row.shop IS NULL AND child_row.order_no IS NULL) AND (child_row.shop IS NULL OR child_row.order_no IS NULL OR NOT EXISTS (SELECT 1 FROM orders parent_row WHERE parent_row.shop = child_row.shop AND parent_row.no = child_row.order_no))"
        );
        assert!(cs[1].counts.contains("MATCH FULL"), "{}", cs[1].counts);
        // No referenced columns: the parent's primary key, read when the census is taken.
        assert_eq!(cs[2].violators_sql, "");
        assert_eq!(
            cs[2].resolve,
            Some(Resolve::PrimaryKey {
                child: "orders".into(),
                columns: vec!["shop".into()],
                parent: "shops".into(),
                match_full: false
            })
        );
    }

    #[test]
    fn a_validate_census_finds_its_declaration_in_the_file_or_an_earlier_one() {
        let v2 = "ALTER TABLE t ADD CONSTRAINT \"T_c_set\" CHECK (c IS NOT NULL) NOT VALID; ALTER TABLE t ADD CONSTRAINT fk FOREIGN KEY (p) REFERENCES parent (id) NOT VALID; ALTER TABLE t VALIDATE CONSTRAINT FK;";
        let v3 = "ALTER TABLE t VALIDATE CONSTRAINT \"T_c_set\";";
        let v2s = for_migration(v2, &split(v2), "V2").unwrap();
        let mut v3s = for_migration(v3, &split(v3), "V3").unwrap();
        // In its own file: `FK` folds to the `fk` added two statements before.
        let Some(Resolve::Constraint { declared, .. }) = &v2s[2].resolve else {
            panic!("{:?}", v2s[2]);
        };
        assert_eq!(declared.as_ref().unwrap().name, "fk");
        assert_eq!(v2s[2].guard, Guard::Validate);
        assert!(v2s[2].guard.blocks());
        let Some(Resolve::Constraint { declared: None, .. }) = &v3s[0].resolve else {
            panic!("{:?}", v3s[0]);
        };
        link_declared(&mut v3s, &v2s);
        let Some(Resolve::Constraint {
            table,
            name,
            declared: Some(d),
        }) = &v3s[0].resolve
        else {
            panic!("{:?}", v3s[0]);
        };
        assert_eq!((table.as_str(), name.as_str()), ("t", "\"T_c_set\""));
        assert_eq!(d.violators_sql, "SELECT * FROM t WHERE NOT (c IS NOT NULL)");
        assert_eq!(catalog_name("\"T_c_set\""), "T_c_set");
        assert_eq!(catalog_name("Fk"), "fk");
    }

    #[test]
    fn added_columns_shadow_the_table() {
        let s = split("ALTER TABLE issued_coupons ADD COLUMN legacy_duplicate boolean NOT NULL DEFAULT false; ALTER TABLE issued_coupons ADD COLUMN voided_at timestamptz;");
        let cols: Vec<AddedColumn> = s.iter().filter_map(added_column).collect();
        assert_eq!(cols[0].type_sql, "boolean");
        assert_eq!(cols[0].default_sql.as_deref(), Some("false"));
        assert_eq!(cols[1].default_sql, None);
        assert_eq!(
            with_shadows("SELECT 1 FROM issued_coupons", &cols),
            "WITH issued_coupons AS (SELECT *, (false)::boolean AS legacy_duplicate, (NULL)::timestamptz AS voided_at FROM issued_coupons) SELECT 1 FROM issued_coupons"
        );
        // A predicted table carries its own shadows: it takes the table's place alone.
        let voided = Predicted {
            table: "issued_coupons".into(),
            body: "SELECT 2".into(),
        };
        assert_eq!(
            with_predicted("SELECT 1 FROM issued_coupons", &cols, &[voided]),
            "WITH issued_coupons AS (SELECT 2) SELECT 1 FROM issued_coupons"
        );
    }
}
