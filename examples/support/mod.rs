//! Shared by the benchmarks: run a child process and watch its peak resident memory.

use std::process::Child;
use std::time::Duration;

/// Waits for `child`, polling its peak resident set (VmHWM) every 20 ms; returns the peak in
/// KiB. The kernel keeps VmHWM as a high-water mark, so polling misses nothing but the last
/// 20 ms of a process's life.
pub fn wait_with_peak_rss(child: &mut Child) -> std::io::Result<u64> {
    let pid = child.id();
    let mut peak_kb: u64 = 0;
    loop {
        if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            for line in status.lines().filter(|l| l.starts_with("VmHWM:")) {
                let kb: u64 = line
                    .split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                peak_kb = peak_kb.max(kb);
            }
        }
        if child.try_wait()?.is_some() {
            return Ok(peak_kb);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
