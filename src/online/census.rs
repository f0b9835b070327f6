//! Censuses: before a constraint, count the rows (or groups) that would break it.
//!
//! Censuses come from the migration itself: a `CREATE UNIQUE INDEX` gives a duplicate-group
//! count under its predicate, an `ADD CONSTRAINT ... CHECK` a count of rows that break the
//! check, and a `/* pgmend:precondition ... */` block in the file a query of its own.
//! They are facts about the data, never records of which tool ran.
//!
//! Censuses, without a server. `Census` (guard, name, counts, fix, violators_sql, tables) and
//! `Guard` (`unique_index`, `check_not_valid`, `check`, `precondition`; all but `check_not_valid`
//! block). `for_migration` reads a migration's text with `regex`: each `/* pgmend:precondition ...
//! */` block (keys `name`, `explain`, `fix`, `tables`, then `query:` to the end of the block; an
//! unknown or missing key is an error), each `CREATE UNIQUE INDEX` (a `GROUP BY ... HAVING count(*) >
//! 1` over the columns, under the predicate, with NULLs left out) and each `ALTER TABLE ... ADD
//! CONSTRAINT ... CHECK (...) [NOT VALID]` (`WHERE NOT (expression)`). `added_column` reads `ALTER
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
    /// A precondition written in the migration file.
    Precondition,
}

impl Guard {
    pub fn blocks(self) -> bool {
        !matches!(self, Guard::CheckNotValid)
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
            });
        }
    }
    Ok(out)
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
