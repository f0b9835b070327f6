//! What the repair engines read from the catalog about the tables a definition names.

use anyhow::Result;
use postgres::GenericClient;

use crate::db::sql_text::Ident;
use crate::error::PgContext;

/// The SQL types of `columns` of `table`, to cast frozen keys (stored as text) back.
pub fn column_types(
    client: &mut impl GenericClient,
    table: &Ident,
    columns: &[Ident],
) -> Result<Vec<String>> {
    let mut types = Vec::new();
    for c in columns {
        let (t, c) = (table.as_str(), c.as_str());
        let row = client
            .query_opt(
                "SELECT format_type(atttypid, atttypmod) FROM pg_attribute
                  WHERE attrelid = to_regclass(quote_ident($1)) AND attname = $2 AND attnum > 0 AND NOT attisdropped",
                &[&t, &c],
            )
            .doing(format!("reading the type of {t}.{c}"))?;
        match row {
            Some(r) => types.push(r.get(0)),
            None => anyhow::bail!("{t}.{c} does not exist; the repair definition does not match this database (has the migration that adds it been applied?)"),
        }
    }
    Ok(types)
}
