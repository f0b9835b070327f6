//! A good neighbour to the application: what a batch stream (the runner's, or each worker's)
//! gives up between batches so that the application keeps its share of the server.
//!
//! - `--pause D` sleeps D after each batch; `--duty-cycle P` sleeps T × (100 − P) / P after a
//!   batch that took T, so that the stream spends at most P % of its time in batches. The
//!   longer of the two is slept ([`Neighbour::pause_after`]), in steps that a stop request
//!   cuts short.
//! - Before each commit the batch asks who waits for a lock it holds
//!   ([`sessions_waiting_on_me`], `pg_blocking_pids`): a batch that made an application session
//!   wait is followed by one half its size and by a pause as long as it took, so the waiting
//!   sessions go first ([`Neighbour::after_batch`]). Each such batch is counted in the run's
//!   report (`batches_blocking`).

use std::time::{Duration, Instant};

/// What each batch stream leaves to the application.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Neighbour {
    /// Slept after every batch.
    pub pause: Duration,
    /// The most of its time, in percent (1 to 100), a stream spends in batches.
    pub duty_cycle: u8,
}

impl Default for Neighbour {
    fn default() -> Self {
        Neighbour {
            pause: Duration::ZERO,
            duty_cycle: 100,
        }
    }
}

impl Neighbour {
    /// The pause after a batch that took `took`: `--pause`, or the duty cycle's share of
    /// `took`, whichever is longer.
    pub fn pause_after(&self, took: Duration) -> Duration {
        let share = u32::from(self.duty_cycle.clamp(1, 100));
        let idle = took * (100 - share) / share;
        self.pause.max(idle)
    }

    /// The next batch size and the pause after a batch of `size` targets that took `took`,
    /// given the size the batch target asks for next (`planned`) and how many sessions were
    /// waiting for the batch's locks before it committed.
    pub fn after_batch(
        &self,
        size: i64,
        planned: i64,
        took: Duration,
        waiting: i64,
    ) -> (i64, Duration) {
        if waiting > 0 {
            ((size / 2).max(1), self.pause_after(took).max(took))
        } else {
            (planned, self.pause_after(took))
        }
    }
}

/// Sleeps `d`, in steps of at most 100 ms, returning early once a stop is requested.
pub fn sleep(d: Duration) {
    let until = Instant::now() + d;
    loop {
        let now = Instant::now();
        if now >= until || crate::signals::requested().is_some() {
            return;
        }
        std::thread::sleep((until - now).min(Duration::from_millis(100)));
    }
}

/// The sessions other than `ours` (pgmend's other workers, which wait for each other on the
/// run's row) waiting now for a lock this session holds (`pg_blocking_pids`; it takes the
/// lock manager's locks briefly, once per batch). `pg_stat_activity` hides another role's
/// `wait_event_type` (NULL) from a role without `pg_read_all_stats`, so those sessions are
/// asked about too. Its error is the server's, as the batch's own statements' are, so that the lock retry
/// around the batch sees it.
pub fn sessions_waiting_on_me(
    tx: &mut impl postgres::GenericClient,
    ours: &[i32],
) -> Result<i64, postgres::Error> {
    let row = tx.query_one(
        "SELECT count(*) FROM pg_stat_activity
          WHERE coalesce(wait_event_type, 'Lock') = 'Lock' AND pid <> pg_backend_pid()
            AND pid <> ALL ($1) AND pg_backend_pid() = ANY (pg_blocking_pids(pid))",
        &[&ours],
    )?;
    Ok(row.get(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn by_default_no_pause_and_the_planned_size() {
        let n = Neighbour::default();
        assert_eq!(n.pause_after(ms(200)), Duration::ZERO);
        assert_eq!(n.after_batch(40, 80, ms(100), 0), (80, Duration::ZERO));
    }

    #[test]
    fn a_duty_cycle_of_half_pauses_as_long_as_the_batch_took() {
        let n = Neighbour {
            duty_cycle: 50,
            ..Neighbour::default()
        };
        assert_eq!(n.pause_after(ms(200)), ms(200));
        let quarter = Neighbour {
            duty_cycle: 25,
            ..Neighbour::default()
        };
        assert_eq!(quarter.pause_after(ms(200)), ms(600));
    }

    #[test]
    fn the_longer_of_pause_and_duty_cycle_is_slept() {
        let n = Neighbour {
            pause: ms(500),
            duty_cycle: 50,
        };
        assert_eq!(n.pause_after(ms(100)), ms(500));
        assert_eq!(n.pause_after(ms(900)), ms(900));
    }

    #[test]
    fn a_batch_that_made_a_session_wait_halves_the_next_and_pauses_as_long_as_it_took() {
        let n = Neighbour::default();
        assert_eq!(n.after_batch(40, 80, ms(150), 2), (20, ms(150)));
        assert_eq!(n.after_batch(1, 2, ms(150), 1), (1, ms(150)));
        let paused = Neighbour {
            pause: ms(400),
            duty_cycle: 100,
        };
        assert_eq!(paused.after_batch(40, 80, ms(150), 1), (20, ms(400)));
    }
}
