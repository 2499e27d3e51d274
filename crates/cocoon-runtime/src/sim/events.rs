//! The VM event stream.

use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::watch;

use super::control::Verb;
use super::{Inner, NO_ARGS, On};
use crate::error::Result;
use crate::events::{EventDiffer, EventStream, VmEvent};

pub(super) async fn watch_events(inner: &Arc<Inner>) -> Result<EventStream> {
    inner.begin(Verb::WatchEvents, On::Nothing, NO_ARGS).await?;
    struct Watch {
        inner: Weak<Inner>,
        changes: watch::Receiver<u64>,
        close: watch::Receiver<u64>,
        differ: EventDiffer,
        queue: VecDeque<VmEvent>,
        first: bool,
        tick: Duration,
    }
    let w = Watch {
        inner: Arc::downgrade(inner),
        changes: inner.change_tx.subscribe(),
        close: inner.close_tx.subscribe(),
        differ: EventDiffer::new(),
        queue: VecDeque::new(),
        first: true,
        tick: inner.tick,
    };
    Ok(Box::pin(futures::stream::unfold(w, |mut w| async move {
        loop {
            if w.close.has_changed().unwrap_or(true) {
                return None;
            }
            if let Some(ev) = w.queue.pop_front() {
                return Some((Ok(ev), w));
            }
            if !w.first {
                tokio::select! {
                    () = tokio::time::sleep(w.tick) => {}
                    r = w.changes.changed() => if r.is_err() { return None; },
                    _ = w.close.changed() => return None,
                }
            }
            w.first = false;
            let inner = w.inner.upgrade()?;
            // Mark the current version seen before listing, so a change that lands during
            // the listing still wakes the next tick.
            w.changes.borrow_and_update();
            let vms = inner.list_reported();
            drop(inner);
            w.queue.extend(w.differ.tick(&vms));
        }
    })))
}
