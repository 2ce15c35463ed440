//! The emitters of stateful processors: a task per stateful processor that concludes its due
//! groups every tick and runs what they emit through the rest of the pipeline.
//!
//! What a stateful processor emits carries the acknowledgements of the events it consumed:
//! they are completed once the emitted events are handled (delivered, dropped on purpose or
//! dead-lettered). At shutdown, after the workers have stopped, every group is concluded.

use std::sync::Arc;
use std::time::Instant;

use sluice_core::ack::AckOutcome;
use sluice_core::{AckSet, Acker, Batch};
use sluice_processors::Emitted;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::worker::Stages;

pub struct Emitters {
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

/// The stateful processors of a pipeline, by index.
fn stateful_indexes(stages: &Stages) -> Vec<usize> {
    stages.processors.iter().enumerate().filter(|(_, p)| p.processor.stateful().is_some()).map(|(i, _)| i).collect()
}

impl Emitters {
    pub fn start(stages: &Arc<Stages>) -> Emitters {
        let stop = CancellationToken::new();
        let tasks = stateful_indexes(stages)
            .into_iter()
            .map(|index| {
                let (stages, stop) = (stages.clone(), stop.clone());
                tokio::spawn(async move {
                    let tick = stages.processors[index].processor.stateful().expect("stateful").tick();
                    let mut timer = tokio::time::interval(tick);
                    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    loop {
                        tokio::select! {
                            _ = timer.tick() => {}
                            _ = stop.cancelled() => return,
                        }
                        conclude(&stages, index, false).await;
                    }
                })
            })
            .collect();
        Emitters { stop, tasks }
    }

    /// Stops the timers, then concludes every group, in processor order (what one emits may
    /// feed the next).
    pub async fn finish(self, stages: &Stages) {
        self.stop.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
        for index in stateful_indexes(stages) {
            conclude(stages, index, true).await;
        }
    }
}

/// Concludes processor `index`'s due groups (all if `all`) and handles what they emit.
async fn conclude(stages: &Stages, index: usize, all: bool) {
    let p = &stages.processors[index];
    let stateful = p.processor.stateful().expect("stateful");
    let Emitted { events, acks } = stateful.conclude(Instant::now(), all);
    if events.is_empty() {
        // Nothing to deliver: what was consumed is handled (a pass-through action's groups
        // expiring, or groups that emit nothing).
        acks.complete();
        return;
    }
    let n = events.len();
    stages.metrics.emitted.add(n as u64);
    p.metrics.events_out.add(n as u64);
    let batch_acks = if acks.is_empty() {
        AckSet::none()
    } else {
        let held = acks;
        AckSet::single(
            Acker::new(n, move |outcome| {
                if outcome == AckOutcome::Handled {
                    held.complete();
                }
            }),
            n,
        )
    };
    stages.handle(Batch::new(events, batch_acks, 0), index + 1, false, usize::MAX).await;
}
