//! What a pass reports beside its API writes: Kubernetes Events on the set, the labels of
//! the set's metrics, and the shortest backoff a step asked for.

use std::time::Duration;

use kube::Resource;
use kube::runtime::events::{Event as KubeEvent, EventType};
use tracing::warn;

use crate::cocoonset::walk::Walk;
use crate::metrics::SetLabels;

impl Walk<'_> {
    pub(super) fn set_labels(&self) -> SetLabels {
        SetLabels {
            namespace: self.ns.clone(),
            cocoonset: self.name.clone(),
        }
    }

    pub(super) fn note_backoff(&mut self, d: Duration) {
        self.min_backoff = Some(self.min_backoff.map_or(d, |m| m.min(d)));
    }

    pub(super) async fn event(&self, warning: bool, reason: &str, message: String) {
        if self.ctx.leadership.may_write("cocoonset event").is_err() {
            // The pass's next write ends it.
            return;
        }
        let event = KubeEvent {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.to_string(),
            action: cocoon_api::contract::events::event_action(reason, &message),
            note: Some(message),
            secondary: None,
        };
        if let Err(e) = self
            .ctx
            .recorder
            .publish(&event, &self.cs.object_ref(&()))
            .await
        {
            warn!(error = %e, reason, "failed to publish event");
        }
    }
}
