//! The releases started on this database (`pgmend.releases`, schema version 7): one row per
//! release name, with the digest of its files when last applied, its steps as JSON (so that
//! another release can tell whether it is finished without its files; none for the coupon
//! release adopted from records made before release identities), who started it and when,
//! and when it finished. `release::identity` decides with these; this module only reads and
//! writes them.

use anyhow::Result;
use postgres::GenericClient;

use crate::error::PgContext;

/// A release as recorded.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub name: String,
    pub digest: String,
    /// The release's steps (`release::Step`s as JSON text); none for an adopted release.
    pub steps: Option<String>,
    pub started_by: String,
    /// UTC, `YYYY-MM-DDTHH:MM:SSZ`.
    pub started_at: String,
    pub finished_at: Option<String>,
}

/// Every release recorded, oldest first. A schema from before release identities (a
/// read-only command does not upgrade it) yields the adopted coupon release when it holds
/// any step record or gate, as the upgrade will record it.
pub fn all(client: &mut impl GenericClient) -> Result<Vec<Recorded>> {
    let Some(version) = super::schema::version(client)? else {
        return Ok(Vec::new());
    };
    if version < 7 {
        let any: bool = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pgmend.release_steps) OR EXISTS (SELECT 1 FROM pgmend.gates)",
                &[],
            )
            .doing("reading the release's records")?
            .get(0);
        return Ok(any
            .then(|| Recorded {
                name: super::schema::ADOPTED_RELEASE.into(),
                digest: "adopted: recorded before release identities".into(),
                steps: None,
                started_by: String::new(),
                started_at: String::new(),
                finished_at: None,
            })
            .into_iter()
            .collect());
    }
    const UTC: &str = "'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'";
    Ok(client
        .query(
            &format!(
                "SELECT release, digest, steps::text, started_by, to_char(started_at AT TIME ZONE 'UTC', {UTC}),
                        to_char(finished_at AT TIME ZONE 'UTC', {UTC})
                   FROM pgmend.releases ORDER BY started_at, release"
            ),
            &[],
        )
        .doing("reading the releases recorded on this database")?
        .iter()
        .map(|r| Recorded {
            name: r.get(0),
            digest: r.get(1),
            steps: r.get(2),
            started_by: r.get(3),
            started_at: r.get(4),
            finished_at: r.get(5),
        })
        .collect())
}

/// Records `name` as started (or continued) with files of `digest` and these `steps`; a
/// release continued with other files counts as unfinished again until its walk ends.
pub fn enter(client: &mut impl GenericClient, name: &str, digest: &str, steps: &str) -> Result<()> {
    client
        .execute(
            "INSERT INTO pgmend.releases (release, digest, steps) VALUES ($1, $2, $3::text::jsonb)
             ON CONFLICT (release) DO UPDATE SET digest = excluded.digest, steps = excluded.steps,
                    finished_at = CASE WHEN releases.digest = excluded.digest THEN releases.finished_at END",
            &[&name, &digest, &steps],
        )
        .doing("recording the release")?;
    Ok(())
}

/// Records `name` as finished (every step done), keeping the first time.
pub fn finish(client: &mut impl GenericClient, name: &str) -> Result<()> {
    client
        .execute(
            "UPDATE pgmend.releases SET finished_at = now() WHERE release = $1 AND finished_at IS NULL",
            &[&name],
        )
        .doing("recording the release as finished")?;
    Ok(())
}
