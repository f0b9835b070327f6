//! What a role needs to read for `verify` and `report overruns`: USAGE on pgmend's schema and
//! SELECT on its tables and the coupon tables (each only when it exists). Checked before the
//! snapshot, so that a reporting role without grants is told every GRANT it lacks instead of
//! a raw `permission denied` for the first table the command reads (exit 2, nothing read).

use anyhow::{bail, Result};
use postgres::Client;

use super::privileges::{self, Kind, Need};

/// The coupon tables `verify` and the report read, besides pgmend's own.
const READ_TABLES: &[&str] = &[
    "campaigns",
    "issued_coupons",
    "campaign_budgets",
    "member_monthly_usage",
];

/// What reading for `command` needs.
fn needs(command: &str) -> Vec<Need> {
    let why = format!("`pgmend {command}`");
    let mut needs = vec![Need {
        kind: Kind::SchemaUsage(crate::store::SCHEMA.into()),
        why: why.clone(),
    }];
    let pgmend = crate::store::TABLE_PRIVILEGES
        .iter()
        .map(|(table, _)| crate::store::table(table).minimal());
    let coupons = READ_TABLES
        .iter()
        .map(|t| crate::db::sql_text::Ident::new(*t).minimal());
    needs.extend(pgmend.chain(coupons).map(|table| Need {
        kind: Kind::Table(table, "SELECT"),
        why: why.clone(),
    }));
    needs
}

/// Refuses (exit 2), listing every GRANT, when the connected role may not read what `command`
/// (`verify`, `report overruns`) reads.
pub fn check(client: &mut Client, command: &str) -> Result<()> {
    let (me, missing) = privileges::missing(client, &needs(command))?;
    if !missing.is_empty() {
        bail!(
            "role {me} may not read what `pgmend {command}` reads; nothing was read:\n  - {}\nGrant them (docs/connecting.md, \"A role for verify and the report\"), or run pgmend as a role that has them, then rerun",
            missing.join("\n  - ")
        );
    }
    Ok(())
}
