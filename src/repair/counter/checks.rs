//! Whether a value may be written to the counter column, as SQL the server evaluates on the row
//! as it is when the batch writes: the column's range (`smallint`, `integer` or `bigint`) and
//! the counter table's CHECKs, each evaluated on a row with the proposed value in the counter
//! column. `rejected_by_checks_sql` names, before a batch writes, the checks each proposed value
//! would break; `checks_pass` and `checks_pass_on_create` are the conditions the writing
//! statements carry themselves.

use super::{CounterEngine, Proposed};
use crate::db::sql_text::{Binds, BoundSql, Literal};

impl CounterEngine {
    /// The values the counter column can hold.
    pub(super) fn range(&self) -> (i64, i64) {
        match self.counter_type.as_str() {
            "smallint" => (i64::from(i16::MIN), i64::from(i16::MAX)),
            "integer" => (i64::from(i32::MIN), i64::from(i32::MAX)),
            _ => (i64::MIN, i64::MAX),
        }
    }

    /// Why a true value was not written: it does not fit the counter column.
    pub(super) fn does_not_fit(&self, truth: i64) -> String {
        format!(
            "the true value {} does not fit {}.{} ({})",
            truth,
            self.spec.counter_table.as_str(),
            self.spec.counter.as_str(),
            self.counter_type
        )
    }

    /// Which of `rows` a CHECK on the counter table would refuse, evaluated on the counter row
    /// as it is with the true value in the counter column: rows of (index into `rows`, the
    /// names of the checks it breaks, comma-separated).
    pub(super) fn rejected_by_checks_sql(&self, rows: &[Proposed]) -> BoundSql {
        let mut binds = Binds::new();
        let unnest = self.unnest(rows, &mut binds);
        let row_cols: Vec<String> = self
            .columns
            .iter()
            .map(|c| {
                if *c == self.spec.counter {
                    format!("u.after::{} AS {}", self.counter_type, c)
                } else {
                    format!("c.{}", c)
                }
            })
            .collect();
        let tests: Vec<String> = self
            .checks
            .iter()
            .map(|(name, expr)| format!("CASE WHEN EXISTS (SELECT 1 FROM (SELECT {}) x WHERE ({expr}) IS FALSE) THEN {} END", row_cols.join(", "), Literal::new(name)))
            .collect();
        let sql = format!(
            "SELECT u.i - 1, concat_ws(', ', {}) FROM {unnest} JOIN {} c ON {} WHERE concat_ws(', ', {}) <> ''",
            tests.join(", "),
            &self.spec.counter_table,
            self.u_match(),
            tests.join(", ")
        );
        BoundSql { sql, binds }
    }

    /// True when every CHECK holds on the counter row `alias` with `value` (SQL) in the
    /// counter column.
    pub(super) fn checks_pass(&self, alias: &str, value: &str) -> String {
        if self.checks.is_empty() {
            return "true".into();
        }
        let row_cols: Vec<String> = self
            .columns
            .iter()
            .map(|c| {
                if *c == self.spec.counter {
                    self.fitted(value)
                } else {
                    format!("{alias}.{c}", c = c)
                }
            })
            .collect();
        self.no_check_fails(&row_cols)
    }

    /// `value` as the counter column (NULL, not an error, where it does not fit: the range
    /// test beside the checks refuses it).
    fn fitted(&self, value: &str) -> String {
        let (min, max) = self.range();
        format!(
            "(CASE WHEN ({value}) BETWEEN {min} AND {max} THEN ({value}) END)::{} AS {}",
            self.counter_type, &self.spec.counter
        )
    }

    /// True when no CHECK of the counter table is false on the row `columns` make.
    fn no_check_fails(&self, columns: &[String]) -> String {
        let tests = self
            .checks
            .iter()
            .map(|(_, e)| format!("({e}) IS FALSE"))
            .collect::<Vec<_>>()
            .join(" OR ");
        format!(
            "NOT EXISTS (SELECT 1 FROM (SELECT {}) r WHERE {tests})",
            columns.join(", ")
        )
    }

    /// The table's CHECKs on a row about to be created from CTE `w`: its key, the columns
    /// `copy_on_create` fills and the counter (`w.value`); other columns take no part.
    pub(super) fn checks_pass_on_create(&self) -> String {
        if self.checks.is_empty() {
            return "true".into();
        }
        let s = &self.spec;
        let row: Vec<String> = s
            .key
            .iter()
            .chain(s.copy_on_create.keys())
            .map(|c| format!("w.{c}", c = c))
            .chain(std::iter::once(self.fitted("w.value")))
            .collect();
        self.no_check_fails(&row)
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{budgets, monthly, proposed};
    use crate::db::sql_text::TypeName;

    #[test]
    fn the_range_is_the_counter_columns() {
        let mut e = budgets();
        assert_eq!(e.range(), (-2147483648, 2147483647));
        e.counter_type = TypeName::for_tests("smallint");
        assert_eq!(e.range(), (-32768, 32767));
        e.counter_type = TypeName::for_tests("bigint");
        assert_eq!(e.range(), (i64::MIN, i64::MAX));
    }

    #[test]
    fn rejected_by_checks_evaluates_each_check_on_the_row_with_the_true_value() {
        let e = monthly();
        let st = e.rejected_by_checks_sql(&[
            proposed(&["m1", "2026-09"], 5, -3),
            proposed(&["m2", "2026-10"], 1, 2),
        ]);
        assert_eq!(
            st.sql,
            "SELECT u.i - 1, concat_ws(', ', CASE WHEN EXISTS (SELECT 1 FROM (SELECT c.\"member_id\", c.\"month\", u.after::integer AS \"used_yen\") x \
             WHERE (((used_yen >= 0))) IS FALSE) THEN 'member_monthly_usage_used_yen_check' END) \
             FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) WITH ORDINALITY AS u(k0, k1, before, after, i) \
             JOIN \"member_monthly_usage\" c ON c.\"member_id\" = u.k0::text AND c.\"month\" = u.k1::date \
             WHERE concat_ws(', ', CASE WHEN EXISTS (SELECT 1 FROM (SELECT c.\"member_id\", c.\"month\", u.after::integer AS \"used_yen\") x \
             WHERE (((used_yen >= 0))) IS FALSE) THEN 'member_monthly_usage_used_yen_check' END) <> ''"
        );
        assert_eq!(
            st.binds.shown(),
            [
                r#"["m1", "m2"]"#,
                r#"["2026-09", "2026-10"]"#,
                "[5, 1]",
                "[-3, 2]"
            ]
        );
    }

    #[test]
    fn checks_pass_puts_the_fitted_value_in_the_counter_column() {
        let e = budgets();
        assert_eq!(
            e.checks_pass("c", "c.\"issued_yen\" + u.drift"),
            "NOT EXISTS (SELECT 1 FROM (SELECT c.\"campaign_id\", c.\"discount_yen\", c.\"budget_yen\", \
             (CASE WHEN (c.\"issued_yen\" + u.drift) BETWEEN -2147483648 AND 2147483647 THEN (c.\"issued_yen\" + u.drift) END)::integer AS \"issued_yen\") r \
             WHERE ((((issued_yen >= 0) AND (issued_yen <= budget_yen)))) IS FALSE)"
        );
        let mut none = budgets();
        none.checks.clear();
        assert_eq!(none.checks_pass("c", "1"), "true");
        assert_eq!(none.checks_pass_on_create(), "true");
    }

    #[test]
    fn checks_on_create_see_the_key_the_copied_columns_and_the_value() {
        assert_eq!(
            budgets().checks_pass_on_create(),
            "NOT EXISTS (SELECT 1 FROM (SELECT w.\"campaign_id\", w.\"budget_yen\", w.\"discount_yen\", \
             (CASE WHEN (w.value) BETWEEN -2147483648 AND 2147483647 THEN (w.value) END)::integer AS \"issued_yen\") r \
             WHERE ((((issued_yen >= 0) AND (issued_yen <= budget_yen)))) IS FALSE)"
        );
    }

    #[test]
    fn a_value_that_does_not_fit_says_the_column_and_its_type() {
        assert_eq!(
            budgets().does_not_fit(3_000_000_000),
            "the true value 3000000000 does not fit campaign_budgets.issued_yen (integer)"
        );
    }
}
