//! The emitters of stateful processors: a task per stateful processor that concludes its due
//! groups every tick and runs what they emit through the rest of the pipeline.
//!
//! What a stateful processor emits carries the acknowledgements of the events it consumed:
//! they are completed once the emitted events are handled (delivered, dropped on purpose or
//! dead-lettered). At shutdown, after the workers have stopped, every group is concluded.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use sluice_core::ack::AckOutcome;
use sluice_core::{AckSet, Acker, Batch};
use sluice_processors::Emitted;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::worker::Stages;

/// A stateful processor's figures for `/metrics` and `/stats`.
pub struct StatefulFigures(pub Arc<dyn sluice_processors::Processor>);

impl sluice_core::figures::Publish for StatefulFigures {
    fn figures(&self) -> Vec<sluice_core::figures::Figure> {
        use sluice_core::figures::Spec;
        let Some(s) = self.0.stateful() else { return Vec::new() };
        let st = s.stats();
        let f = |name, help, counter: bool, value| {
            if counter { Spec::counter(name, help) } else { Spec::gauge(name, help) }.value(value)
        };
        vec![
            f("groups_open", "Groups a stateful processor holds open now.", false, st.groups_open),
            f(
                "groups_concluded_total",
                "Groups a stateful processor concluded (their time was up, or at shutdown).",
                true,
                st.groups_concluded,
            ),
            f(
                "groups_evicted_total",
                "Groups concluded early because max_groups was reached.",
                true,
                st.groups_evicted,
            ),
            f("events_consumed_total", "Events a stateful processor took into its groups.", true, st.events_consumed),
            f("events_emitted_total", "Events a stateful processor emitted.", true, st.events_emitted),
            f("events_missing_keys_total", "Events lacking some identification key.", true, st.events_missing_keys),
        ]
    }
}

pub struct Emitters {
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    /// Set once a delivery of emitted events was cut short (a drain timeout): a stateful
    /// processor's held acknowledgements may belong to groups emitted earlier, so from then on
    /// none is completed — their inputs hear "abandoned" and send again.
    cut_short: Arc<AtomicBool>,
}

/// The stateful processors of a pipeline, by index.
fn stateful_indexes(stages: &Stages) -> Vec<usize> {
    stages.processors.iter().enumerate().filter(|(_, p)| p.processor.stateful().is_some()).map(|(i, _)| i).collect()
}

impl Emitters {
    pub fn start(stages: &Arc<Stages>) -> Emitters {
        let stop = CancellationToken::new();
        let cut_short = Arc::new(AtomicBool::new(false));
        let tasks = stateful_indexes(stages)
            .into_iter()
            .map(|index| {
                let (stages, stop, cut_short) = (stages.clone(), stop.clone(), cut_short.clone());
                tokio::spawn(async move {
                    let tick = stages.processors[index].processor.stateful().expect("stateful").tick();
                    let mut timer = tokio::time::interval(tick);
                    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    loop {
                        tokio::select! {
                            _ = timer.tick() => {}
                            _ = stop.cancelled() => return,
                        }
                        conclude(&stages, index, false, &cut_short).await;
                    }
                })
            })
            .collect();
        Emitters { stop, tasks, cut_short }
    }

    /// Stops the timers, then concludes every group, in processor order (what one emits may
    /// feed the next).
    pub async fn finish(self, stages: &Stages) {
        self.stop.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
        for index in stateful_indexes(stages) {
            conclude(stages, index, true, &self.cut_short).await;
        }
    }
}

/// Concludes processor `index`'s due groups (all if `all`) and handles what they emit.
async fn conclude(stages: &Stages, index: usize, all: bool, cut_short: &Arc<AtomicBool>) {
    let p = &stages.processors[index];
    let stateful = p.processor.stateful().expect("stateful");
    let Emitted { events, acks } = stateful.conclude(Instant::now(), all);
    if events.is_empty() {
        // Nothing to deliver: what was consumed is handled (a pass-through action's groups
        // expiring, groups that emit nothing, or groups emitted by an earlier conclusion).
        if !cut_short.load(Ordering::SeqCst) {
            acks.complete();
        }
        return;
    }
    let n = events.len();
    stages.metrics.emitted.add(n as u64);
    p.metrics.events_out.add(n as u64);
    let batch_acks = if acks.is_empty() {
        AckSet::none()
    } else {
        let held = acks;
        let cut = cut_short.clone();
        AckSet::single(
            Acker::new(n, move |outcome| {
                if outcome == AckOutcome::Handled && !cut.load(Ordering::SeqCst) {
                    held.complete();
                }
            }),
            n,
        )
    };
    if !stages.handle(Batch::new(events, batch_acks, 0), index + 1, false, usize::MAX).await {
        cut_short.store(true, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use async_trait::async_trait;
    use parking_lot::Mutex;
    use sluice_core::metrics::{ComponentKind, ComponentMetrics, PipelineMetrics};
    use sluice_core::{Event, Value};
    use sluice_outputs::{Aborted, Delivery, Output};

    use super::*;
    use crate::built::{BuiltOutput, BuiltProcessor};
    use crate::dead_letter::DeadLetterSink;

    /// Keeps what it is sent.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<Event>>);

    #[async_trait]
    impl Output for Recorder {
        async fn send(&self, events: &[&Event]) -> Result<Delivery, Aborted> {
            self.0.lock().extend(events.iter().map(|e| (*e).clone()));
            Ok(Delivery { rejected: Vec::new() })
        }
    }

    fn stages(recorder: Arc<Recorder>) -> Arc<Stages> {
        let metrics = Arc::new(PipelineMetrics::new("p", 1));
        let spec = sluice_processors::spec_from_yaml(
            "type: aggregate\nidentification_keys: [/user]\ngroup_duration: 1h\naction: count\n",
        )
        .unwrap();
        let processor = BuiltProcessor {
            id: "agg".to_string(),
            processor: sluice_processors::build(&spec).unwrap(),
            condition: None,
            metrics: Arc::new(ComponentMetrics::new("agg", ComponentKind::Processor, "aggregate")),
        };
        let output = BuiltOutput {
            id: "out".to_string(),
            output: recorder,
            condition: None,
            metrics: Arc::new(ComponentMetrics::new("out", ComponentKind::Output, "recorder")),
        };
        Arc::new(Stages {
            pipeline: "p".to_string(),
            processors: Arc::new(vec![processor]),
            outputs: Arc::new(vec![output]),
            metrics: metrics.clone(),
            dead_letters: Arc::new(DeadLetterSink::new("p", None, metrics, Default::default())),
            router: None,
            abort: CancellationToken::new(),
        })
    }

    fn event(user: &str) -> Event {
        let mut e = Event::from_message("x");
        e.fields.insert("user", Value::from(user));
        e
    }

    /// The inputs of consumed events hear of them only once what their group emitted is
    /// delivered; every group is concluded at the end.
    #[tokio::test]
    async fn consumed_events_are_acknowledged_when_their_aggregate_is_delivered() {
        let recorder = Arc::new(Recorder::default());
        let stages = stages(recorder.clone());
        let emitters = Emitters::start(&stages);
        let (acker, mut acked) = Acker::with_notify(5);
        let events = vec![event("a"), event("b"), event("a"), event("a"), event("b")];
        stages.handle(Batch::new(events, AckSet::single(acker, 5), 5), 0, true, 0).await;
        assert!(recorder.0.lock().is_empty(), "a one-hour group emitted at once");
        assert!(acked.try_recv().is_err(), "the batch was acknowledged before its groups concluded");
        emitters.finish(&stages).await;
        assert_eq!(acked.try_recv().unwrap(), AckOutcome::Handled);
        let mut counts: Vec<(String, i64)> = recorder
            .0
            .lock()
            .iter()
            .map(|e| {
                let user = e.fields.get("user").and_then(Value::as_str).unwrap().to_string();
                let Some(Value::Int(n)) = e.fields.get("count") else { panic!("no count in {e:?}") };
                (user, *n)
            })
            .collect();
        counts.sort();
        assert_eq!(counts, [("a".to_string(), 3), ("b".to_string(), 2)]);
        assert_eq!((stages.metrics.consumed.get(), stages.metrics.emitted.get()), (5, 2));
        assert_eq!(stages.metrics.events_out.get(), 2);
    }

    /// Emitted events that are never delivered leave the consumed events' inputs hearing
    /// "abandoned", not nothing.
    #[tokio::test]
    async fn held_acknowledgements_are_abandoned_when_their_aggregate_is_not_delivered() {
        let recorder = Arc::new(Recorder::default());
        let stages = stages(recorder);
        let (acker, acked) = Acker::with_notify(2);
        stages.handle(Batch::new(vec![event("a"), event("a")], AckSet::single(acker, 2), 2), 0, true, 0).await;
        let p = &stages.processors[0];
        let emitted = p.processor.stateful().unwrap().conclude(Instant::now(), true);
        assert_eq!(emitted.events.len(), 1);
        drop(emitted);
        assert_eq!(acked.await.unwrap(), AckOutcome::Abandoned);
    }
}
