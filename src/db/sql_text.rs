//! SQL text: the only way a name, a type, a CHECK body or a constant gets into a statement
//! pgmend builds. An [`Ident`] is a quoted identifier (optionally schema-qualified), a
//! [`Literal`] a quoted constant; a [`TypeName`] is a column's type as the catalog's
//! `format_type()` prints it, and a [`CheckBody`] a CHECK constraint's expression as
//! `pg_get_constraintdef()` prints it: both are read here, from the catalog, and have no other
//! constructor. All four print their SQL form with `Display`, so they drop into `format!`. A
//! value a statement needs travels apart from its text: [`Binds`] hands out the `$n`
//! placeholder for each value pushed and keeps the values in order, so no two functions agree
//! on parameter numbers by convention. The fragment builders (column lists, key matches, key
//! ranges) are functions over these types, so a statement is never patched as text afterwards.

use std::fmt;

use postgres::types::ToSql;
use postgres::GenericClient;
use serde::{Deserialize, Serialize};

/// A SQL identifier: a table, column, index, constraint, trigger, function or schema name,
/// with an optional schema. Prints as `"name"` or `"schema"."name"`, quotes doubled.
///
/// An empty name prints as `""`, which PostgreSQL refuses (a zero-length delimited
/// identifier): definitions reject empty names on load, before any SQL is built.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize)]
#[serde(from = "String", into = "String")]
pub struct Ident {
    schema: Option<String>,
    name: String,
}

impl Ident {
    pub fn new(name: impl Into<String>) -> Ident {
        Ident {
            schema: None,
            name: name.into(),
        }
    }

    /// `schema.name`: a dot inside either part stays part of that name.
    pub fn qualified(schema: impl Into<String>, name: impl Into<String>) -> Ident {
        Ident {
            schema: Some(schema.into()),
            name: name.into(),
        }
    }

    /// The name as written, unquoted: for messages and catalog lookups by value.
    pub fn as_str(&self) -> &str {
        &self.name
    }

    /// The name qualified by `alias` (`alias."name"`), for a column of an aliased table.
    pub fn of(&self, alias: &str) -> String {
        format!("{alias}.{self}")
    }

    /// The name as a SQL constant (`'name'`), e.g. for `jsonb_build_object` keys.
    pub fn literal(&self) -> Literal {
        Literal::new(&self.name)
    }

    /// The name as a person would type it in SQL: bare when it is a plain lower-case name
    /// that needs no quotes, quoted otherwise (for suggested commands such as a GRANT).
    pub fn minimal(&self) -> String {
        let part = |p: &str| {
            let plain = p
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
                && p.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if plain {
                p.to_string()
            } else {
                quote_identifier(p)
            }
        };
        match &self.schema {
            Some(s) => format!("{}.{}", part(s), part(&self.name)),
            None => part(&self.name),
        }
    }
}

impl From<String> for Ident {
    fn from(name: String) -> Ident {
        Ident::new(name)
    }
}

impl From<&str> for Ident {
    fn from(name: &str) -> Ident {
        Ident::new(name)
    }
}

impl From<Ident> for String {
    fn from(ident: Ident) -> String {
        ident.name
    }
}

/// Debug is the bare name in quotes (`"mark"`), as messages about definitions show it.
impl fmt::Debug for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.schema {
            Some(s) => fmt::Debug::fmt(&format!("{s}.{}", self.name), f),
            None => fmt::Debug::fmt(&self.name, f),
        }
    }
}

impl fmt::Display for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(schema) = &self.schema {
            write!(f, "{}.", quote_identifier(schema))?;
        }
        f.write_str(&quote_identifier(&self.name))
    }
}

/// A SQL string constant: prints as `'text'`, quotes doubled (and backslashes escaped in an
/// `E'...'` string when there are any).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Literal(String);

impl Literal {
    pub fn new(text: impl Into<String>) -> Literal {
        Literal(text.into())
    }
}

impl fmt::Display for Literal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&postgres_protocol::escape::escape_literal(&self.0))
    }
}

/// A column's SQL type as the server prints it (`format_type(atttypid, atttypmod)`: names
/// that need quotes come quoted), for casts such as `$2::text::integer`. Only
/// [`TypeName::of_column`] reads one, and [`TypeName::text`] names `text`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeName(String);

impl TypeName {
    /// `text`: the type of a key whose column types are not read (a preview's).
    pub fn text() -> TypeName {
        TypeName("text".into())
    }

    /// The type of `table.column` (None: no such column), from the catalog.
    pub fn of_column(
        client: &mut impl GenericClient,
        table: &Ident,
        column: &Ident,
    ) -> Result<Option<TypeName>, postgres::Error> {
        Ok(client
            .query_opt(
                "SELECT format_type(atttypid, atttypmod) FROM pg_attribute
                  WHERE attrelid = to_regclass(quote_ident($1)) AND attname = $2 AND attnum > 0 AND NOT attisdropped",
                &[&table.as_str(), &column.as_str()],
            )?
            .map(|r| TypeName(r.get(0))))
    }

    /// The type a value for `table.column` is cast to before it is compared with the column:
    /// the column's own type with its modifier (`numeric(10,2)` rounds as the column will),
    /// except for the string and bit-string types, whose explicit cast would cut a value the
    /// column refuses (`bpchar`, `"bit"`, `character varying`: no length). None: no such column.
    pub fn compared_of_column(
        client: &mut impl GenericClient,
        table: &Ident,
        column: &Ident,
    ) -> Result<Option<TypeName>, postgres::Error> {
        Ok(client
            .query_opt(
                "SELECT CASE WHEN t.typcategory IN ('S', 'V') THEN format_type(a.atttypid, -1)
                             ELSE format_type(a.atttypid, a.atttypmod) END
                   FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
                  WHERE a.attrelid = to_regclass(quote_ident($1)) AND a.attname = $2 AND a.attnum > 0 AND NOT a.attisdropped",
                &[&table.as_str(), &column.as_str()],
            )?
            .map(|r| TypeName(r.get(0))))
    }

    /// [`Self::compared_of_column`] of a type named in a migration's text, as the server reads
    /// it, without its modifier (None: no such type).
    pub fn compared_of_text(
        client: &mut impl GenericClient,
        type_text: &str,
    ) -> Result<Option<TypeName>, postgres::Error> {
        Ok(client
            .query_one("SELECT format_type(to_regtype($1), -1)", &[&type_text])?
            .get::<_, Option<String>>(0)
            .map(TypeName))
    }

    /// The name as the server printed it, for messages and for matching a type by name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A type name for unit tests of statement builders.
    #[cfg(test)]
    pub fn for_tests(name: &str) -> TypeName {
        TypeName(name.into())
    }
}

impl fmt::Display for TypeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The expression of a CHECK constraint as the server deparses it (`pg_get_constraintdef`
/// without its `CHECK ` and ` NOT VALID`), to evaluate it on a proposed row or count the rows
/// that break it. Only [`CheckBody::of_table`] and [`CheckBody::named`] read them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckBody(String);

impl CheckBody {
    /// Every CHECK constraint of `table` (`NOT VALID` ones too: they check updates), by name.
    pub fn of_table(
        client: &mut impl GenericClient,
        table: &Ident,
    ) -> Result<Vec<(String, CheckBody)>, postgres::Error> {
        Ok(client
            .query(
                "SELECT conname::text, pg_get_constraintdef(oid) FROM pg_constraint
                  WHERE conrelid = to_regclass(quote_ident($1)) AND contype = 'c'",
                &[&table.as_str()],
            )?
            .iter()
            .map(|r| {
                (
                    r.get(0),
                    CheckBody::from_constraintdef(&r.get::<_, String>(1)),
                )
            })
            .collect())
    }

    /// The CHECK constraint `name` of `table` (a relation name as SQL writes it, for
    /// `to_regclass`), `NOT VALID` or not; None when the table has no such check.
    pub fn named(
        client: &mut impl GenericClient,
        table: &str,
        name: &str,
    ) -> Result<Option<CheckBody>, postgres::Error> {
        Ok(client
            .query_opt(
                "SELECT pg_get_constraintdef(oid) FROM pg_constraint
                  WHERE conrelid = to_regclass($1) AND conname = $2 AND contype = 'c'",
                &[&table, &name],
            )?
            .map(|r| CheckBody::from_constraintdef(&r.get::<_, String>(0))))
    }

    fn from_constraintdef(def: &str) -> CheckBody {
        CheckBody(
            def.strip_prefix("CHECK ")
                .unwrap_or(def)
                .trim_end_matches(" NOT VALID")
                .to_string(),
        )
    }

    /// A check for unit tests of statement builders, as `pg_get_constraintdef` prints it.
    #[cfg(test)]
    pub fn for_tests(def: &str) -> CheckBody {
        CheckBody::from_constraintdef(def)
    }
}

impl fmt::Display for CheckBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a cast may name: a [`TypeName`] read from the catalog (and, in unit tests, a plain
/// `str`).
pub trait SqlType: fmt::Display {}

impl SqlType for TypeName {}

#[cfg(test)]
impl SqlType for str {}

/// A value to bind, as a statement's parameter.
pub type BindValue = Box<dyn ToSql + Sync + Send>;

/// The values a statement binds, in order, each with the placeholder that names it:
/// [`Binds::push`] keeps a value and returns its `$n`, to write into the text. Build the text
/// and its values together, so the numbers cannot drift apart.
#[derive(Debug, Default)]
pub struct Binds {
    values: Vec<BindValue>,
}

impl Binds {
    pub fn new() -> Binds {
        Binds::default()
    }

    /// Keeps `value` and returns its placeholder.
    pub fn push(&mut self, value: impl ToSql + Sync + Send + 'static) -> Param {
        self.values.push(Box::new(value));
        Param(self.values.len())
    }

    /// The values, in placeholder order, as `query` takes them.
    pub fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.values
            .iter()
            .map(|v| v.as_ref() as &(dyn ToSql + Sync))
            .collect()
    }

    /// Each value's `Debug` form, in order: what unit tests compare.
    pub fn shown(&self) -> Vec<String> {
        self.values.iter().map(|v| format!("{v:?}")).collect()
    }
}

/// A statement and the values it binds.
#[derive(Debug)]
pub struct BoundSql {
    pub sql: String,
    pub binds: Binds,
}

/// A placeholder [`Binds::push`] handed out: prints as `$n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Param(usize);

impl Param {
    /// `$1` to `$N`, for a statement whose caller binds its `N` values itself, in this order
    /// (a public `*_sql` function documents the order; the runner passes the values).
    pub fn ordered<const N: usize>() -> [Param; N] {
        std::array::from_fn(|i| Param(i + 1))
    }

    /// The parameter's number, for the fragment builders that take one.
    pub fn number(self) -> usize {
        self.0
    }
}

impl fmt::Display for Param {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "${}", self.0)
    }
}

/// The one identifier quoter.
fn quote_identifier(name: &str) -> String {
    postgres_protocol::escape::escape_identifier(name)
}

/// `x, y`: the columns' names as written, unquoted, joined by `sep`, for a message or a
/// reason (never for SQL text: [`column_list`] quotes them).
pub fn names(columns: &[Ident], sep: &str) -> String {
    columns
        .iter()
        .map(Ident::as_str)
        .collect::<Vec<_>>()
        .join(sep)
}

/// `a."x", a."y"` (or `"x", "y"` when `alias` is empty).
pub fn column_list(alias: &str, columns: &[Ident]) -> String {
    columns
        .iter()
        .map(|c| qualify(alias, c))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `a."x" = b."x" AND a."y" = b."y"`: rows of `a` and `b` with the same key.
pub fn key_match(a: &str, b: &str, columns: &[Ident]) -> String {
    columns
        .iter()
        .map(|c| format!("{a}.{c} = {b}.{c}"))
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// `a."x" IS NOT NULL AND a."y" IS NOT NULL`.
pub fn all_not_null(alias: &str, columns: &[Ident]) -> String {
    columns
        .iter()
        .map(|c| format!("{} IS NOT NULL", qualify(alias, c)))
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// The rows a batch reads by one column's value: after the text parameter `after` and up to
/// and including the text parameter `up_to` (parameter numbers; a bound that is None is
/// absent: from the first value, to the last). The bounds are the frozen range targets of a
/// run (`store::runs::range_targets_sql`), stored as text and cast back to the column's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRange {
    pub after: Option<usize>,
    pub up_to: Option<usize>,
}

impl KeyRange {
    pub const ALL: KeyRange = KeyRange {
        after: None,
        up_to: None,
    };

    /// The range from bounds `after` and `up_to` (None: open), their values pushed to
    /// `binds`.
    pub fn push(binds: &mut Binds, after: Option<&str>, up_to: Option<&str>) -> KeyRange {
        KeyRange {
            after: after.map(|v| binds.push(v.to_string()).number()),
            up_to: up_to.map(|v| binds.push(v.to_string()).number()),
        }
    }

    /// The predicate over `column` (qualified as the statement needs it) of type `ty`.
    pub fn predicate<T: SqlType + ?Sized>(&self, column: &str, ty: &T) -> String {
        let mut parts = Vec::new();
        if let Some(p) = self.after {
            parts.push(format!("{column} > ${p}::text::{ty}"));
        }
        if let Some(p) = self.up_to {
            parts.push(format!("{column} <= ${p}::text::{ty}"));
        }
        if parts.is_empty() {
            "true".into()
        } else {
            parts.join(" AND ")
        }
    }
}

/// A keyset range over an integer column: which part of a frozen target list a statement
/// reads. [`SeqRange::Between`] takes its bounds from two parameters, `(lo, hi]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqRange {
    /// Every row.
    All,
    /// `column > $lo AND column <= $hi`, with the parameter numbers given.
    Between { lo: usize, hi: usize },
}

impl SeqRange {
    /// The predicate over `column` (already qualified as the statement needs it).
    pub fn predicate(&self, column: &str) -> String {
        match self {
            SeqRange::All => "true".into(),
            SeqRange::Between { lo, hi } => format!("{column} > ${lo} AND {column} <= ${hi}"),
        }
    }
}

/// `column BETWEEN $lo::text::ty AND $hi::text::ty`: a key range whose bounds are bound as
/// text (as frozen keys are stored) and cast to the column's type.
pub fn between_text_params<T: SqlType + ?Sized>(
    column: &str,
    lo: usize,
    hi: usize,
    ty: &T,
) -> String {
    format!("{column} BETWEEN ${lo}::text::{ty} AND ${hi}::text::{ty}")
}

fn qualify(alias: &str, column: &Ident) -> String {
    if alias.is_empty() {
        column.to_string()
    } else {
        column.of(alias)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_quoted_with_their_quotes_doubled() {
        assert_eq!(
            Ident::new("issued_coupons").to_string(),
            "\"issued_coupons\""
        );
        assert_eq!(Ident::new("a\"b").to_string(), "\"a\"\"b\"");
        assert_eq!(
            Ident::new("x\"; DROP TABLE t; --").to_string(),
            "\"x\"\"; DROP TABLE t; --\""
        );
    }

    #[test]
    fn a_dot_stays_inside_its_name_and_qualified_names_quote_each_part() {
        assert_eq!(Ident::new("a.b").to_string(), "\"a.b\"");
        assert_eq!(
            Ident::qualified("app", "repair_runs").to_string(),
            "\"app\".\"repair_runs\""
        );
        assert_eq!(
            Ident::qualified("my.schema", "t\"x").to_string(),
            "\"my.schema\".\"t\"\"x\""
        );
    }

    #[test]
    fn unicode_names_are_kept_as_they_are() {
        assert_eq!(Ident::new("クーポン").to_string(), "\"クーポン\"");
        assert_eq!(Literal::new("円'").to_string(), "'円'''");
    }

    #[test]
    fn an_empty_name_prints_as_the_empty_quoted_name_postgresql_refuses() {
        assert_eq!(Ident::new("").to_string(), "\"\"");
    }

    #[test]
    fn literals_double_quotes_and_escape_backslashes() {
        assert_eq!(Literal::new("it's").to_string(), "'it''s'");
        assert_eq!(Literal::new("").to_string(), "''");
        assert_eq!(Literal::new("a\\b").to_string(), " E'a\\\\b'");
    }

    #[test]
    fn minimal_leaves_plain_names_bare() {
        assert_eq!(Ident::new("app").minimal(), "app");
        assert_eq!(Ident::new("App").minimal(), "\"App\"");
        assert_eq!(Ident::qualified("app", "gates").minimal(), "app.gates");
        assert_eq!(Ident::new("").minimal(), "\"\"");
    }

    #[test]
    fn grants_quote_what_needs_quoting() {
        assert_eq!(Ident::new("release").minimal(), "release");
        assert_eq!(Ident::new("Release Team").minimal(), "\"Release Team\"");
        assert_eq!(Ident::new("a\"b").minimal(), "\"a\"\"b\"");
    }

    #[test]
    fn binds_hand_out_each_placeholder_with_its_value() {
        let mut binds = Binds::new();
        let run = binds.push(7_i64);
        let range = KeyRange::push(&mut binds, Some("m1"), None);
        let limit = binds.push(10_i64);
        assert_eq!(
            format!("{run} {} {limit}", range.predicate("k", "int")),
            "$1 k > $2::text::int $3"
        );
        assert_eq!(binds.shown(), ["7", "\"m1\"", "10"]);
        assert_eq!(binds.params().len(), 3);
        let range = KeyRange::push(&mut Binds::new(), None, Some("m9"));
        assert_eq!(range.predicate("k", "int"), "k <= $1::text::int");
    }

    #[test]
    fn a_check_body_is_the_expression_without_check_and_not_valid() {
        assert_eq!(
            CheckBody::for_tests("CHECK ((issued <= budget)) NOT VALID").to_string(),
            "((issued <= budget))"
        );
        assert_eq!(
            CheckBody::for_tests("CHECK ((n >= 0))").to_string(),
            "((n >= 0))"
        );
        assert_eq!(TypeName::text().to_string(), "text");
    }

    #[test]
    fn fragments() {
        let k = [Ident::new("a"), Ident::new("b")];
        assert_eq!(column_list("t", &k), "t.\"a\", t.\"b\"");
        assert_eq!(column_list("", &k), "\"a\", \"b\"");
        assert_eq!(
            key_match("t", "g", &k),
            "t.\"a\" = g.\"a\" AND t.\"b\" = g.\"b\""
        );
        assert_eq!(
            all_not_null("t", &k),
            "t.\"a\" IS NOT NULL AND t.\"b\" IS NOT NULL"
        );
        assert_eq!(
            between_text_params("s.\"a\"", 4, 5, "text"),
            "s.\"a\" BETWEEN $4::text::text AND $5::text::text"
        );
        assert_eq!(
            SeqRange::Between { lo: 2, hi: 3 }.predicate("seq"),
            "seq > $2 AND seq <= $3"
        );
        assert_eq!(SeqRange::All.predicate("seq"), "true");
    }

    #[test]
    fn a_key_range_numbers_only_the_bounds_it_has() {
        let mut binds = Binds::new();
        binds.push(7_i64);
        let r = KeyRange::push(&mut binds, Some("m1"), Some("m9"));
        assert_eq!(
            r.predicate("t.k", "text"),
            "t.k > $2::text::text AND t.k <= $3::text::text"
        );
        assert_eq!(binds.shown(), ["7", "\"m1\"", "\"m9\""]);
        let mut binds = Binds::new();
        binds.push(7_i64);
        let r = KeyRange::push(&mut binds, None, Some("m9"));
        assert_eq!(r.predicate("k", "int"), "k <= $2::text::int");
        assert_eq!(binds.shown(), ["7", "\"m9\""]);
        let mut binds = Binds::new();
        let r = KeyRange::push(&mut binds, Some("m1"), None);
        assert_eq!(r.predicate("k", "int"), "k > $1::text::int");
        assert_eq!(binds.shown(), ["\"m1\""]);
        assert_eq!(
            KeyRange::push(&mut Binds::new(), None, None).predicate("k", "int"),
            "true"
        );
    }

    #[test]
    fn serde_keeps_the_bare_name() {
        let i: Ident = serde_json::from_str("\"issued_coupons\"").unwrap();
        assert_eq!(i.as_str(), "issued_coupons");
        assert_eq!(serde_json::to_string(&i).unwrap(), "\"issued_coupons\"");
    }
}
