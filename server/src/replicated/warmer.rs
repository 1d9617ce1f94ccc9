//! Costly CEL selectors evaluated ahead of plans, on a dedicated thread.
//!
//! Owns the warmer thread and its bounded queue. A plan runs under its shard's
//! state-machine lock, so a selector that costs seconds over a shard's devices would
//! stall every write and read of that shard. A plan therefore asks [`SelectorWarmer::ready`]
//! first: selectors whose remaining work (estimated cost per evaluation × devices not yet
//! evaluated) is at most [`INLINE_SELECTOR_WORK_MAX`] are evaluated by the plan itself; a
//! costlier one is queued here, and the gangs that need it sit out of plans until its
//! results are cached (`CompiledSelector` keeps them by device content, so warming
//! changes when a gang is planned, never where). Invariants: at most one warming per
//! selector at a time; the queue holds at most [`WARMUP_JOBS_MAX`] jobs; stopping ends
//! the thread after its current device. Created by `Replica::start`, used by the shard
//! state machine's plan queries (`replicated/mod.rs`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use gangway_core::model::cel::CompiledSelector;
use gangway_core::model::Device;

/// Estimated selector work a plan may do itself, in cost units (tens of ms at most).
pub const INLINE_SELECTOR_WORK_MAX: u64 = 200_000;
/// Most warming jobs queued.
pub const WARMUP_JOBS_MAX: usize = 64;

struct Job {
    selector: Arc<CompiledSelector>,
    devices: Vec<(String, Device)>,
}

struct Running {
    queue: Mutex<Option<SyncSender<Job>>>,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// Where costly selectors are evaluated ahead of plans. Cheap to clone.
#[derive(Clone)]
pub struct SelectorWarmer {
    running: Option<Arc<Running>>,
}

impl std::fmt::Debug for SelectorWarmer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = if self.running.is_some() {
            "thread"
        } else {
            "inline"
        };
        f.debug_struct("SelectorWarmer")
            .field("mode", &mode)
            .finish()
    }
}

impl SelectorWarmer {
    /// Starts the warmer thread.
    pub fn start() -> std::io::Result<Self> {
        let (queue, jobs) = sync_channel(WARMUP_JOBS_MAX);
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = stop.clone();
        let thread = std::thread::Builder::new()
            .name("gangway-selector-warmer".into())
            .spawn(move || warm(jobs, &thread_stop))?;
        Ok(Self {
            running: Some(Arc::new(Running {
                queue: Mutex::new(Some(queue)),
                stop,
                thread: Mutex::new(Some(thread)),
            })),
        })
    }

    /// No thread: every selector is evaluated by the plan that needs it (unit tests,
    /// benchmarks of the engine alone).
    pub fn inline() -> Self {
        Self { running: None }
    }

    /// Whether a plan may evaluate `selectors` on `devices` now. Queues the costly ones
    /// (not queued already) and answers false while any is not warm.
    pub fn ready(&self, selectors: &[Arc<CompiledSelector>], devices: &[(&str, &Device)]) -> bool {
        let Some(running) = &self.running else {
            return true;
        };
        let mut ready = true;
        for selector in selectors {
            let cold: Vec<(&str, &Device)> = devices
                .iter()
                .filter(|(driver, device)| !selector.is_cached(driver, device))
                .copied()
                .collect();
            let work = selector.estimated_cost().saturating_mul(cold.len() as u64);
            if work <= INLINE_SELECTOR_WORK_MAX {
                continue;
            }
            ready = false;
            if selector.start_warming() && !running.enqueue(selector, &cold) {
                selector.end_warming();
            }
        }
        ready
    }

    /// Stops the thread after its current device and waits for it.
    pub fn stop(&self) {
        let Some(running) = &self.running else {
            return;
        };
        running.stop.store(true, Ordering::Release);
        if let Ok(mut queue) = running.queue.lock() {
            queue.take();
        }
        let thread = running.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

impl Running {
    /// Queues a job; false when the queue is full or stopped.
    fn enqueue(&self, selector: &Arc<CompiledSelector>, cold: &[(&str, &Device)]) -> bool {
        let job = Job {
            selector: selector.clone(),
            devices: cold
                .iter()
                .map(|(driver, device)| (driver.to_string(), (*device).clone()))
                .collect(),
        };
        let Ok(queue) = self.queue.lock() else {
            return false;
        };
        match queue.as_ref().map(|q| q.try_send(job)) {
            Some(Ok(())) => {
                tracing::info!(
                    selector = %gangway_core::model::clip(selector.source()),
                    estimated_cost = selector.estimated_cost(),
                    "a costly selector is evaluated ahead of plans; gangs that need it wait for it"
                );
                true
            }
            Some(Err(TrySendError::Full(_))) => {
                tracing::warn!(
                    jobs = WARMUP_JOBS_MAX,
                    "selector warmer queue full; the gang waits for a later round"
                );
                false
            }
            Some(Err(TrySendError::Disconnected(_))) | None => false,
        }
    }
}

fn warm(jobs: Receiver<Job>, stop: &AtomicBool) {
    while let Ok(job) = jobs.recv() {
        for (driver, device) in &job.devices {
            if stop.load(Ordering::Acquire) {
                job.selector.end_warming();
                return;
            }
            // The result (or runtime error) is kept by the selector; plans read it there.
            let _ = job.selector.matches(driver, device);
        }
        job.selector.end_warming();
    }
}

#[cfg(test)]
#[path = "warmer_tests.rs"]
mod tests;
