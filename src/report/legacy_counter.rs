//! The lost updates: per campaign, what the legacy counter `campaigns.issued_yen` recorded
//! against what the old system really issued (every coupon it issued, voided ones included,
//! since it counted them), and the difference.
//!
//! The old application is the only one that moves the counter, and it stops at the deploy; the
//! rollback repair (`restore-legacy-campaign-counters`) overwrites it later. So both inputs are
//! recorded once, when the release passes the gate `deploy-new-application`
//! ([`record_at_gate`], into a table of `crate::store`'s, whose figures this module computes),
//! and
//! the report reads that record from then on. Before the gate the report computes the figure
//! live: every coupon there is was issued by the old system.
//!
//! `record_at_gate` is called by the release's gate step (`release::engine`) for
//! `deploy-new-application` only (once; a rerun keeps the first record); `read` gives the report,
//! and the demo, the recorded lost-update inputs after the gate and the live ones before it.

use anyhow::Result;
use postgres::GenericClient;
use serde::Serialize;

use super::Lang;
use crate::error::PgContext;

/// The gate at which the new application replaces the old one.
pub const DEPLOY_GATE: &str = "deploy-new-application";

/// Where the figures come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum Source {
    /// Before the gate: the counter and the coupons as they are now.
    Live,
    /// Recorded when the release passed the gate (ISO 8601, Asia/Tokyo).
    DeployGate { recorded_at: String },
    /// The gate was passed by a pgmend that did not record them: unknown.
    NotRecorded,
}

impl Source {
    pub fn explain(&self, lang: Lang) -> String {
        match self {
            Source::Live => lang.tr("live: the release has not passed the deploy gate; the counter and the coupons as they are now").into(),
            Source::DeployGate { recorded_at } => format!(
                "{}, {recorded_at} {}",
                lang.tr("recorded when the release passed the deploy gate"),
                lang.tr("(Asia/Tokyo)")
            ),
            Source::NotRecorded => lang.tr("not recorded: the deploy gate was passed by a pgmend that did not record the legacy counter").into(),
        }
    }
}

/// One campaign's figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Figures {
    pub legacy_counter_yen: i64,
    pub old_system_issued_yen: i64,
}

/// Per campaign id, in the report's order; campaigns absent from a record (created after the
/// deploy) have none.
pub struct LegacyCounter {
    pub source: Source,
    pub campaigns: std::collections::HashMap<String, Figures>,
}

/// Records both inputs when `gate` is the deploy gate, unless they are recorded already (a
/// rerun keeps the first record). Called by the gate step just before it records the gate,
/// in the release's session, so the tables are the released schema's.
pub fn record_at_gate(client: &mut impl GenericClient, gate: &str) -> Result<()> {
    if gate != DEPLOY_GATE {
        return Ok(());
    }
    let recorded = crate::store::records::record_legacy_counter(
        client,
        "SELECT c.campaign_id, c.issued_yen, coalesce(i.yen, 0), coalesce(i.coupons, 0)
           FROM campaigns c
           LEFT JOIN (SELECT campaign_id, sum(amount_yen)::int8 AS yen, count(*) AS coupons
                        FROM issued_coupons GROUP BY campaign_id) i USING (campaign_id)",
    )?;
    if recorded > 0 {
        crate::say!(
            "recorded the legacy counter (campaigns.issued_yen) and what the old system issued, for {}: the finance report's lost updates",
            crate::human::count(recorded, "campaign")
        );
    }
    Ok(())
}

/// Reads the figures inside the report's snapshot.
pub fn read(client: &mut impl GenericClient) -> Result<LegacyCounter> {
    let rows = crate::store::records::legacy_counter(client)?;
    if let Some(first) = rows.first() {
        return Ok(LegacyCounter {
            source: Source::DeployGate {
                recorded_at: super::tokyo(first.get(3))?,
            },
            campaigns: figures(&rows),
        });
    }
    let passed = crate::store::records::gate_confirmed(
        client,
        crate::store::schema::ADOPTED_RELEASE,
        DEPLOY_GATE,
    )?;
    if passed {
        return Ok(LegacyCounter {
            source: Source::NotRecorded,
            campaigns: Default::default(),
        });
    }
    let rows = client
        .query(
            "SELECT c.campaign_id, c.issued_yen::int8, coalesce(i.yen, 0)::int8
               FROM campaigns c
               LEFT JOIN (SELECT campaign_id, sum(amount_yen)::int8 AS yen
                            FROM issued_coupons GROUP BY campaign_id) i USING (campaign_id)",
            &[],
        )
        .doing("reading the legacy counter")?;
    Ok(LegacyCounter {
        source: Source::Live,
        campaigns: figures(&rows),
    })
}

fn figures(rows: &[postgres::Row]) -> std::collections::HashMap<String, Figures> {
    rows.iter()
        .map(|r| {
            (
                r.get(0),
                Figures {
                    legacy_counter_yen: r.get(1),
                    old_system_issued_yen: r.get(2),
                },
            )
        })
        .collect()
}
