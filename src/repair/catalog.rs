//! What the repair engines read from the catalog about the tables a definition names.

use anyhow::Result;
use postgres::GenericClient;

use crate::db::sql_text::{Ident, TypeName};
use crate::error::PgContext;

/// The SQL types of `columns` of `table`, to cast frozen keys (stored as text) back.
pub fn column_types(
    client: &mut impl GenericClient,
    table: &Ident,
    columns: &[Ident],
) -> Result<Vec<TypeName>> {
    let mut types = Vec::new();
    for c in columns {
        let (t, c) = (table.as_str(), c.as_str());
        match TypeName::of_column(client, table, &Ident::new(c))
            .doing(format!("reading the type of {t}.{c}"))?
        {
            Some(ty) => types.push(ty),
            None => anyhow::bail!("{t}.{c} does not exist; the repair definition does not match this database (has the migration that adds it been applied?)"),
        }
    }
    Ok(types)
}

/// The SQL type of `table.column` ([`column_types`] of one column).
pub fn column_type(
    client: &mut impl GenericClient,
    table: &Ident,
    column: &Ident,
) -> Result<TypeName> {
    Ok(column_types(client, table, std::slice::from_ref(column))?.remove(0))
}
