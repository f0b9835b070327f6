//! Steering a running run from another session: `pgmend repair pause|resume|throttle` record a
//! request on the run's row (`store::runs::steer`), and the running pgmend reads it before each
//! batch, on the main session and on every worker's ([`before_batch`]).
//!
//! While the run is paused a stream waits between batches, with no transaction open and no row
//! or table lock held (the runner lock stays its own), says so once, and goes on when resumed; a
//! stop request (a signal) ends the wait, and the stream then stops as it would between
//! batches. A throttle replaces the command's `--pause` and `--duty-cycle` for the batches
//! after it. A paused run stays paused when its pgmend stops: the next command that would walk
//! it refuses (exit 1), saying how to resume (`runner`).

use std::time::Duration;

use anyhow::Result;

use super::options::RunOptions;
use crate::store;

/// How often a paused stream looks at its run's row again.
const POLL: Duration = Duration::from_millis(500);

/// The options the next batch of run `run_id` runs under (`who` names the stream in the
/// lines it says), after waiting out a pause; `stop` ends the wait (a signal, or another
/// worker's failure), and the caller then stops as it would between batches.
pub(super) fn before_batch(
    client: &mut postgres::Client,
    run_id: i64,
    who: &str,
    options: &RunOptions,
    stop: &dyn Fn() -> bool,
    say: &mut dyn FnMut(&str),
) -> Result<RunOptions> {
    let mut steering = store::runs::steering(client, run_id)?;
    if let Some((by, at)) = &steering.paused {
        let guards: Vec<String> = super::guard::installed(client)?
            .into_iter()
            .map(|(table, trigger)| format!("{trigger:?} on {table}"))
            .collect();
        say(&format!(
            "{who}: paused by {by} at {at}, between batches: no transaction open, no lock held{}. Resume it with: pgmend repair resume {run_id}",
            if guards.is_empty() {
                String::new()
            } else {
                format!(
                    "; the guard trigger {} stays installed while paused, marking what the old application writes",
                    guards.join(", ")
                )
            }
        ));
        while steering.paused.is_some() {
            if stop() {
                return Ok(options.clone());
            }
            std::thread::sleep(POLL);
            steering = store::runs::steering(client, run_id)?;
        }
        say(&format!("{who}: resumed"));
    }
    let mut options = options.clone();
    if let Some(ms) = steering.pause_ms {
        options.neighbour.pause = Duration::from_millis(ms.max(0) as u64);
    }
    if let Some(percent) = steering.duty_cycle {
        options.neighbour.duty_cycle = percent.clamp(1, 100) as u8;
    }
    Ok(options)
}
