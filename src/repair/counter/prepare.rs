//! What a counter engine reads from the catalog before a run: the key and counter types, the
//! counter table's columns and CHECK constraints (`NOT VALID` ones included), and whether the
//! key is unique on the counter table (a missing row is created with `INSERT ... ON CONFLICT`
//! on it).

use anyhow::Result;

use super::CounterEngine;
use crate::db::sql_text::{CheckBody, Ident};
use crate::error::PgContext;
use crate::repair::catalog::column_types;
use crate::repair::definition::CounterSpec;

impl CounterEngine {
    pub fn prepare(
        client: &mut impl postgres::GenericClient,
        spec: &CounterSpec,
    ) -> Result<CounterEngine> {
        let key_types = column_types(client, &spec.counter_table, &spec.key)?;
        let counter_type = column_types(
            client,
            &spec.counter_table,
            std::slice::from_ref(&spec.counter),
        )?
        .remove(0);
        column_types(client, &spec.source_table, &spec.key)?;
        if let Some(v) = &spec.value {
            column_types(client, &spec.source_table, std::slice::from_ref(v))?;
        }
        check_unique_key(client, spec)?;
        let columns: Vec<Ident> = client
            .query(
                "SELECT attname::text FROM pg_attribute WHERE attrelid = to_regclass(quote_ident($1))
                    AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                &[&spec.counter_table.as_str()],
            )
            .doing("reading the counter table's columns")?
            .iter()
            .map(|r| Ident::new(r.get::<_, String>(0)))
            .collect();
        let checks = CheckBody::of_table(client, &spec.counter_table)
            .doing("reading the counter table's checks")?;
        Ok(CounterEngine {
            spec: spec.clone(),
            key_types,
            counter_type,
            columns,
            checks,
        })
    }
}

/// Missing rows are created with `INSERT ... ON CONFLICT (key) DO UPDATE`, which needs the key
/// to be unique: refuses a counter table without a unique index on exactly its key.
fn check_unique_key(client: &mut impl postgres::GenericClient, spec: &CounterSpec) -> Result<()> {
    let key_names: Vec<&str> = spec.key.iter().map(Ident::as_str).collect();
    let unique: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = to_regclass(quote_ident($1)) AND i.indisunique
                AND i.indpred IS NULL AND i.indexprs IS NULL
                AND (SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_attribute a
                      WHERE a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)) = (SELECT array_agg(x ORDER BY x) FROM unnest($2::text[]) x))",
            &[&spec.counter_table.as_str(), &key_names],
        )
        .doing("looking for the counter table's unique key")?
        .get(0);
    if !unique {
        anyhow::bail!(
            "counter_table {} has no unique index or primary key on exactly its key ({}): a counter table holds one row per key. Add one (for example ALTER TABLE {} ADD PRIMARY KEY ({})), or fix key = [...] in the definition; nothing was changed",
            spec.counter_table.as_str(),
            key_names.join(", "),
            spec.counter_table.as_str(),
            key_names.join(", ")
        );
    }
    Ok(())
}
