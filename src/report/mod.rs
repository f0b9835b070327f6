//! `pgmend report overruns`: what the incident already cost, for finance.
//!
//! Every figure comes from one REPEATABLE READ, READ ONLY snapshot, so they all describe the
//! same moment (a hot standby will do). The aggregates are computed by the server; campaigns
//! are few and are held in memory, while the members over the monthly cap (there can be
//! hundreds of thousands) are fetched through a portal in pages and handed to the renderer
//! one at a time, so memory stays flat whatever the table size. Rows are ordered with the
//! "C" collation, so the same data gives the same bytes on any server, apart from `as_of`.
//!
//! The report works in every state of the release. Before V2 the columns it reads do not
//! exist yet; it reads them as the release will first set them (`voided_at` NULL,
//! `legacy_duplicate` false). Duplicates not yet marked are identified with the release's
//! own ranking (redeemed first, then `issued_at`, then `coupon_id`), so money lost to
//! duplicates is reported before the repair too.
//!
//! `generate` reads the state from the catalog (`state`: `legacy` without the V2 columns,
//! `released` with a valid `one_coupon_per_member` and `issued_within_budget`, else `partial`),
//! builds one `coupons` subquery (`coupons_source`) that reads `voided_at`/`legacy_duplicate` as
//! the release would first set them when they do not exist yet and ranks unmarked duplicates with
//! the release's order (skipped once released: the valid unique index leaves one unmarked row per
//! group), sums the campaigns in one grouped query (`campaigns`, held in memory), and streams the
//! member-months past the cap through a portal, `PAGE` (2,000) rows per fetch. Window aggregates on
//! that query (`count(*) OVER ()`, `sum(...) OVER ()`, the widest `member_id`) give the totals and
//! column widths with the first row, so every rendering can put totals first without a second pass.
//! The redeemed duplicates are streamed only to a renderer whose `wants_redeemed_duplicates` is
//! true; past a renderer's member limit (`wants_more_members` false) fetching stops.

mod csv_sections;
mod html;
mod lang;
pub mod legacy_counter;
mod render;
mod xlsx;
mod xlsx_summary;

use anyhow::{bail, Result};
use postgres::Transaction;
use serde::Serialize;

use crate::db::conninfo::ConnParams;
use crate::error::PgContext;

pub use csv_sections::{neutralise, Csv, Section};
pub use html::Html;
pub use lang::Lang;
pub use legacy_counter::Source as LegacyCounterSource;
pub use render::{markdown_text, Json, Render, Text, TextStyle};
pub use xlsx::{Xlsx, EXCEL_ROWS};

/// The report belongs to the coupon release: the tables it reads.
pub const TABLES: &[&str] = &[
    "campaigns",
    "issued_coupons",
    "campaign_budgets",
    "member_monthly_usage",
];

/// Why there is nothing to report on: the connection points at another database.
pub const NO_COUPON_TABLES: &str = "this database has no campaigns and issued_coupons tables; check --database-url (and the search_path) points at the coupon database";

/// How far the release has got, read from the catalog.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// V2 is not applied: no coupon is marked or voided yet.
    Legacy,
    /// V2 is applied, but the unique index or the budget check is not in place yet.
    Partial,
    /// The unique index is valid and `issued_within_budget` exists.
    Released,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Legacy => "legacy",
            State::Partial => "partial",
            State::Released => "released",
        }
    }

    pub fn explain(self) -> &'static str {
        match self {
            State::Legacy => "legacy: nothing is repaired yet; duplicates are counted by the release's ranking rule and still count as issued",
            State::Partial => "partial: the release has started but is not finished; figures are as the data stands now",
            State::Released => "released: duplicates are voided, the unique index and the budget check are in place",
        }
    }
}

/// Where the figures came from. Never the user or the password.
#[derive(Debug, Clone, Serialize)]
pub struct Database {
    pub host: String,
    pub port: u16,
    pub dbname: String,
}

impl Database {
    pub fn from_params(params: &ConnParams) -> Database {
        Database {
            host: params.host.clone(),
            port: params.port,
            dbname: params.dbname.clone(),
        }
    }

    pub fn label(&self) -> String {
        format!(
            "host={} port={} dbname={}",
            self.host, self.port, self.dbname
        )
    }
}

/// One campaign; every campaign is listed, with `overrun_yen` 0 when within budget.
#[derive(Debug, Clone, Serialize)]
pub struct CampaignRow {
    pub campaign_id: String,
    pub budget_yen: i64,
    /// Sum of the coupons that are not voided.
    pub issued_yen: i64,
    pub overrun_yen: i64,
    /// Coupons that are not voided.
    pub coupons: i64,
    /// Every voided coupon: what the repair took back.
    pub voided_coupons: i64,
    pub voided_yen: i64,
    /// Duplicates that were already redeemed when the repair ran, kept as history: money lost.
    pub redeemed_legacy_duplicates: i64,
    pub redeemed_legacy_duplicates_yen: i64,
    /// Voided coupons the old cart redeemed anyway. Part of `voided_*`, not of `issued_yen`.
    pub voided_then_redeemed: i64,
    pub voided_then_redeemed_yen: i64,
    /// What the legacy counter `campaigns.issued_yen` said was issued (at the deploy gate, or
    /// now before it); None for a campaign the record does not hold.
    pub legacy_counter_yen: Option<i64>,
    /// What the old system really issued: every coupon issued before the deploy, voided ones
    /// included.
    pub old_system_issued_yen: Option<i64>,
    /// `old_system_issued_yen - legacy_counter_yen`: the increments the counter lost.
    pub lost_update_yen: Option<i64>,
}

/// The names (the JSON's keys) of [`CampaignRow::numbers`], in order; every rendering shows
/// them in this order, each with its total of the same name in [`Totals`] but `overrun_yen`
/// (`campaign_overrun_yen`).
pub const CAMPAIGN_NUMBERS: [&str; 10] = [
    "budget_yen",
    "issued_yen",
    "overrun_yen",
    "coupons",
    "voided_coupons",
    "voided_yen",
    "redeemed_legacy_duplicates",
    "redeemed_legacy_duplicates_yen",
    "voided_then_redeemed",
    "voided_then_redeemed_yen",
];

/// The names of [`CampaignRow::lost_updates`], in order.
pub const LOST_UPDATE_NUMBERS: [&str; 3] = [
    "legacy_counter_yen",
    "old_system_issued_yen",
    "lost_update_yen",
];

impl CampaignRow {
    /// The lost-update figures, in the order every rendering shows them.
    pub fn lost_updates(&self) -> [Option<i64>; 3] {
        [
            self.legacy_counter_yen,
            self.old_system_issued_yen,
            self.lost_update_yen,
        ]
    }

    /// The amounts and counts after the id, in the order every rendering shows them.
    pub fn numbers(&self) -> [i64; 10] {
        [
            self.budget_yen,
            self.issued_yen,
            self.overrun_yen,
            self.coupons,
            self.voided_coupons,
            self.voided_yen,
            self.redeemed_legacy_duplicates,
            self.redeemed_legacy_duplicates_yen,
            self.voided_then_redeemed,
            self.voided_then_redeemed_yen,
        ]
    }
}

/// A legacy duplicate that was already redeemed when the repair ran: kept as history, money
/// lost (listed in the workbook only).
#[derive(Debug, Clone, Serialize)]
pub struct DuplicateRow {
    pub coupon_id: String,
    pub campaign_id: String,
    pub member_id: String,
    pub month: String,
    pub amount_yen: i64,
    /// `YYYY-MM-DD HH:MM:SS` in Asia/Tokyo.
    pub issued_at: String,
    pub redeemed_at: String,
}

/// One member-month whose coupons (not voided) exceed the monthly cap.
#[derive(Debug, Clone, Serialize)]
pub struct MemberRow {
    pub member_id: String,
    pub month: String,
    pub used_yen: i64,
    pub cap_yen: i64,
    pub overrun_yen: i64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Totals {
    pub campaign_overrun_yen: i64,
    pub member_overrun_yen: i64,
    pub voided_yen: i64,
    pub redeemed_legacy_duplicates_yen: i64,
    pub voided_then_redeemed_yen: i64,
    pub budget_yen: i64,
    pub issued_yen: i64,
    pub coupons: i64,
    pub voided_coupons: i64,
    pub redeemed_legacy_duplicates: i64,
    pub voided_then_redeemed: i64,
    pub members_over_monthly_cap: i64,
    pub member_used_yen: i64,
    /// The lost-update figures summed over the campaigns that have them; None when none has.
    pub legacy_counter_yen: Option<i64>,
    pub old_system_issued_yen: Option<i64>,
    pub lost_update_yen: Option<i64>,
}

impl Totals {
    /// Every total with its JSON key, in the JSON's order.
    pub fn fields(&self) -> [(&'static str, i64); 13] {
        [
            ("campaign_overrun_yen", self.campaign_overrun_yen),
            ("member_overrun_yen", self.member_overrun_yen),
            ("voided_yen", self.voided_yen),
            (
                "redeemed_legacy_duplicates_yen",
                self.redeemed_legacy_duplicates_yen,
            ),
            ("voided_then_redeemed_yen", self.voided_then_redeemed_yen),
            ("budget_yen", self.budget_yen),
            ("issued_yen", self.issued_yen),
            ("coupons", self.coupons),
            ("voided_coupons", self.voided_coupons),
            (
                "redeemed_legacy_duplicates",
                self.redeemed_legacy_duplicates,
            ),
            ("voided_then_redeemed", self.voided_then_redeemed),
            ("members_over_monthly_cap", self.members_over_monthly_cap),
            ("member_used_yen", self.member_used_yen),
        ]
    }

    /// The lost-update totals with their JSON keys.
    pub fn lost_updates(&self) -> [(&'static str, Option<i64>); 3] {
        [
            ("legacy_counter_yen", self.legacy_counter_yen),
            ("old_system_issued_yen", self.old_system_issued_yen),
            ("lost_update_yen", self.lost_update_yen),
        ]
    }
}

/// Everything known before the first member row is rendered.
#[derive(Debug, Clone)]
pub struct Header {
    /// ISO 8601 in Asia/Tokyo (+09:00, no daylight saving), to the second.
    pub as_of: String,
    pub monthly_cap_yen: i64,
    pub database: Database,
    pub state: State,
    /// Where the lost-update figures come from.
    pub legacy_counter: LegacyCounterSource,
    pub campaigns: Vec<CampaignRow>,
    pub totals: Totals,
    /// Upper bounds of the member section's column contents, for aligned text tables.
    pub member_widths: MemberWidths,
    /// The greatest common divisor of the campaigns' coupon amounts (1 without campaigns):
    /// every overrun is the cap's remainder plus multiples of it, which the histogram follows.
    pub coupon_step_yen: i64,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct MemberWidths {
    /// In bytes: never less than the display width of UTF-8 text.
    pub member_id: usize,
    pub month: usize,
    pub max_used_yen: i64,
}

/// What the command tells the user after the report is written.
#[derive(Debug, Clone)]
pub struct Summary {
    pub state: State,
    pub campaigns: usize,
    pub totals: Totals,
}

/// Rows fetched per round trip while streaming the members.
const PAGE: i32 = 2000;

/// Runs the report inside `tx` (which the caller opened REPEATABLE READ, READ ONLY) and
/// streams it into `out`.
pub fn generate(
    tx: &mut Transaction<'_>,
    database: Database,
    monthly_cap_yen: i64,
    out: &mut dyn Render,
) -> Result<Summary> {
    if monthly_cap_yen < 0 {
        bail!("--monthly-cap-yen must be 0 or more, not {monthly_cap_yen}");
    }
    let state = state(tx)?;
    let as_of = as_of(tx)?;
    let coupons = coupons_source(state);
    let mut campaigns = campaigns(tx, &coupons)?;
    let legacy = legacy_counter::read(tx)?;
    for c in &mut campaigns {
        if let Some(f) = legacy.campaigns.get(&c.campaign_id) {
            c.legacy_counter_yen = Some(f.legacy_counter_yen);
            c.old_system_issued_yen = Some(f.old_system_issued_yen);
            c.lost_update_yen = Some(f.old_system_issued_yen - f.legacy_counter_yen);
        }
    }

    let members_sql = format!(
        "WITH coupons AS ({coupons}),
              m AS (SELECT member_id, month, sum(amount_yen)::int8 AS used_yen
                      FROM coupons WHERE voided_at IS NULL
                     GROUP BY member_id, month HAVING sum(amount_yen) > $1)
         SELECT member_id, month, used_yen,
                count(*) OVER ()::int8,
                (sum(used_yen) OVER ())::int8,
                max(octet_length(member_id)) OVER (),
                max(octet_length(month)) OVER (),
                max(used_yen) OVER ()
           FROM m
          ORDER BY member_id COLLATE \"C\", month COLLATE \"C\""
    );
    let portal = tx
        .bind(members_sql.as_str(), &[&monthly_cap_yen])
        .doing("reading the members over the monthly cap")?;
    let mut page = tx
        .query_portal(&portal, PAGE)
        .doing("reading the members over the monthly cap")?;

    let mut totals = campaign_totals(&campaigns)?;
    let mut widths = MemberWidths::default();
    if let Some(first) = page.first() {
        totals.members_over_monthly_cap = first.get(3);
        totals.member_used_yen = first.get(4);
        totals.member_overrun_yen = totals.member_used_yen
            - monthly_cap_yen
                .checked_mul(totals.members_over_monthly_cap)
                .ok_or_else(|| anyhow::anyhow!("member overrun total out of range"))?;
        widths = MemberWidths {
            member_id: first.get::<_, i32>(5) as usize,
            month: first.get::<_, i32>(6) as usize,
            max_used_yen: first.get(7),
        };
    }
    let header = Header {
        as_of,
        monthly_cap_yen,
        database,
        state,
        legacy_counter: legacy.source,
        campaigns,
        totals,
        member_widths: widths,
        coupon_step_yen: coupon_step(tx)?,
    };
    out.begin(&header)?;
    loop {
        for row in &page {
            let used_yen: i64 = row.get(2);
            out.member(&MemberRow {
                member_id: row.get(0),
                month: row.get(1),
                used_yen,
                cap_yen: monthly_cap_yen,
                overrun_yen: used_yen - monthly_cap_yen,
            })?;
        }
        if page.len() < PAGE as usize || !out.wants_more_members() {
            break;
        }
        page = tx
            .query_portal(&portal, PAGE)
            .doing("reading the members over the monthly cap")?;
    }
    if out.wants_redeemed_duplicates() {
        redeemed_duplicates(tx, &coupons, out)?;
    }
    out.end(&header)?;
    Ok(Summary {
        state,
        campaigns: header.campaigns.len(),
        totals: header.totals,
    })
}

/// Streams the redeemed legacy duplicates (the rows behind `redeemed_legacy_duplicates`).
fn redeemed_duplicates(
    tx: &mut Transaction<'_>,
    coupons: &str,
    out: &mut dyn Render,
) -> Result<()> {
    let sql = format!(
        "WITH coupons AS ({coupons})
         SELECT coupon_id, campaign_id, member_id, month, amount_yen::int8,
                to_char(issued_at AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM-DD HH24:MI:SS'),
                to_char(redeemed_at AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM-DD HH24:MI:SS')
           FROM coupons
          WHERE duplicate AND voided_at IS NULL AND redeemed_at IS NOT NULL
          ORDER BY campaign_id COLLATE \"C\", member_id COLLATE \"C\", coupon_id COLLATE \"C\""
    );
    let doing = "reading the redeemed legacy duplicates";
    let portal = tx.bind(sql.as_str(), &[]).doing(doing)?;
    loop {
        let page = tx.query_portal(&portal, PAGE).doing(doing)?;
        for r in &page {
            out.redeemed_duplicate(&DuplicateRow {
                coupon_id: r.get(0),
                campaign_id: r.get(1),
                member_id: r.get(2),
                month: r.get(3),
                amount_yen: r.get(4),
                issued_at: r.get(5),
                redeemed_at: r.get(6),
            })?;
        }
        if page.len() < PAGE as usize {
            return Ok(());
        }
    }
}

fn coupon_step(tx: &mut Transaction<'_>) -> Result<i64> {
    let amounts: Vec<i64> = tx
        .query_one(
            "SELECT coalesce(array_agg(DISTINCT abs(discount_yen)::int8), '{}') FROM campaigns",
            &[],
        )
        .doing("reading the coupon amounts")?
        .get(0);
    let gcd = |mut a: i64, mut b: i64| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    Ok(amounts.into_iter().fold(0, gcd).max(1))
}

fn state(tx: &mut Transaction<'_>) -> Result<State> {
    let row = tx
        .query_one(
            "SELECT to_regclass('issued_coupons') IS NOT NULL AND to_regclass('campaigns') IS NOT NULL,
                    EXISTS (SELECT 1 FROM pg_attribute
                             WHERE attrelid = to_regclass('issued_coupons')
                               AND attname = 'legacy_duplicate' AND NOT attisdropped),
                    EXISTS (SELECT 1 FROM pg_attribute
                             WHERE attrelid = to_regclass('issued_coupons')
                               AND attname = 'voided_at' AND NOT attisdropped),
                    EXISTS (SELECT 1 FROM pg_index
                             WHERE indexrelid = to_regclass('one_coupon_per_member')
                               AND indisunique AND indisvalid),
                    EXISTS (SELECT 1 FROM pg_constraint
                             WHERE conname = 'issued_within_budget'
                               AND conrelid = to_regclass('campaign_budgets'))",
            &[],
        )
        .doing("reading the schema")?;
    let (tables, duplicate, voided, unique, check): (bool, bool, bool, bool, bool) =
        (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
    if !tables {
        bail!(NO_COUPON_TABLES);
    }
    Ok(match (duplicate && voided, unique && check) {
        (false, _) => State::Legacy,
        (true, false) => State::Partial,
        (true, true) => State::Released,
    })
}

fn as_of(tx: &mut Transaction<'_>) -> Result<String> {
    // now() is the start of the transaction, i.e. the moment of the snapshot.
    let micros: i64 = tx
        .query_one("SELECT (extract(epoch FROM now()) * 1000000)::int8", &[])
        .doing("reading the snapshot time")?
        .get(0);
    tokyo(micros)
}

/// A moment from the server (µs since the epoch) in ISO 8601, Asia/Tokyo, to the second.
fn tokyo(micros: i64) -> Result<String> {
    let utc = chrono::DateTime::from_timestamp_micros(micros)
        .ok_or_else(|| anyhow::anyhow!("the server's clock reads {micros} µs, out of range"))?;
    let tokyo = chrono::FixedOffset::east_opt(9 * 3600).expect("a valid offset");
    Ok(utc
        .with_timezone(&tokyo)
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, false))
}

/// The coupons as the report reads them: `voided_at` and a `duplicate` flag, whatever the
/// state. Duplicates not yet marked get the release's ranking.
fn coupons_source(state: State) -> String {
    let rank = "row_number() OVER (PARTITION BY campaign_id, member_id{partition}
                                  ORDER BY redeemed_at IS NULL, issued_at, coupon_id) > 1";
    match state {
        State::Legacy => format!(
            "SELECT coupon_id::text AS coupon_id, issued_at, campaign_id, member_id, month,
                    amount_yen, redeemed_at, NULL::timestamptz AS voided_at, {} AS duplicate
               FROM issued_coupons",
            rank.replace("{partition}", "")
        ),
        State::Partial => format!(
            "SELECT coupon_id::text AS coupon_id, issued_at, campaign_id, member_id, month,
                    amount_yen, redeemed_at, voided_at, legacy_duplicate OR {} AS duplicate
               FROM issued_coupons",
            rank.replace("{partition}", ", legacy_duplicate")
        ),
        // The valid unique index leaves one unmarked coupon per group: no ranking needed.
        State::Released => {
            "SELECT coupon_id::text AS coupon_id, issued_at, campaign_id, member_id, month,
                    amount_yen, redeemed_at, voided_at, legacy_duplicate AS duplicate
               FROM issued_coupons"
                .to_string()
        }
    }
}

fn campaigns(tx: &mut Transaction<'_>, coupons: &str) -> Result<Vec<CampaignRow>> {
    let budgets_exist: bool = tx
        .query_one("SELECT to_regclass('campaign_budgets') IS NOT NULL", &[])
        .doing("reading the schema")?
        .get(0);
    // From the release on, the application reads the budget from campaign_budgets.
    let (budget, join) = if budgets_exist {
        (
            "coalesce(b.budget_yen, c.budget_yen)",
            "LEFT JOIN campaign_budgets b ON b.campaign_id = c.campaign_id",
        )
    } else {
        ("c.budget_yen", "")
    };
    let sql = format!(
        "WITH coupons AS ({coupons}),
              a AS (
                SELECT campaign_id,
                       sum(amount_yen) FILTER (WHERE voided_at IS NULL) AS issued_yen,
                       count(*) FILTER (WHERE voided_at IS NULL) AS coupons,
                       count(*) FILTER (WHERE voided_at IS NOT NULL) AS voided_coupons,
                       sum(amount_yen) FILTER (WHERE voided_at IS NOT NULL) AS voided_yen,
                       count(*) FILTER (WHERE duplicate AND voided_at IS NULL AND redeemed_at IS NOT NULL) AS rld,
                       sum(amount_yen) FILTER (WHERE duplicate AND voided_at IS NULL AND redeemed_at IS NOT NULL) AS rld_yen,
                       count(*) FILTER (WHERE voided_at IS NOT NULL AND redeemed_at IS NOT NULL) AS vtr,
                       sum(amount_yen) FILTER (WHERE voided_at IS NOT NULL AND redeemed_at IS NOT NULL) AS vtr_yen
                  FROM coupons GROUP BY campaign_id)
         SELECT c.campaign_id, ({budget})::int8,
                coalesce(a.issued_yen, 0)::int8, coalesce(a.coupons, 0)::int8,
                coalesce(a.voided_coupons, 0)::int8, coalesce(a.voided_yen, 0)::int8,
                coalesce(a.rld, 0)::int8, coalesce(a.rld_yen, 0)::int8,
                coalesce(a.vtr, 0)::int8, coalesce(a.vtr_yen, 0)::int8
           FROM campaigns c {join}
           LEFT JOIN a ON a.campaign_id = c.campaign_id
          ORDER BY c.campaign_id COLLATE \"C\""
    );
    let rows = tx
        .query(sql.as_str(), &[])
        .doing("summing the coupons per campaign")?;
    Ok(rows
        .iter()
        .map(|r| {
            let budget_yen: i64 = r.get(1);
            let issued_yen: i64 = r.get(2);
            CampaignRow {
                campaign_id: r.get(0),
                budget_yen,
                issued_yen,
                overrun_yen: (issued_yen - budget_yen).max(0),
                coupons: r.get(3),
                voided_coupons: r.get(4),
                voided_yen: r.get(5),
                redeemed_legacy_duplicates: r.get(6),
                redeemed_legacy_duplicates_yen: r.get(7),
                voided_then_redeemed: r.get(8),
                voided_then_redeemed_yen: r.get(9),
                legacy_counter_yen: None,
                old_system_issued_yen: None,
                lost_update_yen: None,
            }
        })
        .collect())
}

fn campaign_totals(campaigns: &[CampaignRow]) -> Result<Totals> {
    let mut t = Totals::default();
    let add = |sum: &mut i64, v: i64| -> Result<()> {
        *sum = sum
            .checked_add(v)
            .ok_or_else(|| anyhow::anyhow!("a campaign total is beyond 64 bits"))?;
        Ok(())
    };
    for c in campaigns {
        add(&mut t.campaign_overrun_yen, c.overrun_yen)?;
        add(&mut t.voided_yen, c.voided_yen)?;
        add(
            &mut t.redeemed_legacy_duplicates_yen,
            c.redeemed_legacy_duplicates_yen,
        )?;
        add(&mut t.voided_then_redeemed_yen, c.voided_then_redeemed_yen)?;
        add(&mut t.budget_yen, c.budget_yen)?;
        add(&mut t.issued_yen, c.issued_yen)?;
        add(&mut t.coupons, c.coupons)?;
        add(&mut t.voided_coupons, c.voided_coupons)?;
        add(
            &mut t.redeemed_legacy_duplicates,
            c.redeemed_legacy_duplicates,
        )?;
        add(&mut t.voided_then_redeemed, c.voided_then_redeemed)?;
        for (sum, v) in [
            (&mut t.legacy_counter_yen, c.legacy_counter_yen),
            (&mut t.old_system_issued_yen, c.old_system_issued_yen),
            (&mut t.lost_update_yen, c.lost_update_yen),
        ] {
            if let Some(v) = v {
                add(sum.get_or_insert(0), v)?;
            }
        }
    }
    Ok(t)
}
