//! The `process_*` metrics of the running binary (the names of Prometheus' process collector,
//! which prometheus-client lacks), read from `/proc/self` on every scrape. Both the operator
//! and the node agent register one [`ProcessCollector`].

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::contract::metrics::process as names;
use crate::procfs::Reader;

/// Renders [`crate::procfs::Sample`] at scrape time; a figure that cannot be read is left out.
#[derive(Clone, Debug, Default)]
pub struct ProcessCollector {
    reader: Reader,
}

impl ProcessCollector {
    /// The running process.
    pub fn new() -> Self {
        Self::default()
    }

    /// Another process tree (tests).
    pub fn with_reader(reader: Reader) -> Self {
        ProcessCollector { reader }
    }
}

/// Encodes one metric `name` with `help` (a collector's building block).
pub fn encode_one(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric: &impl EncodeMetric,
) -> fmt::Result {
    let me = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
    metric.encode(me)
}

fn gauge(value: u64) -> ConstGauge<f64> {
    ConstGauge::new(value as f64)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let s = self.reader.sample();
        if let Some(cpu) = s.cpu_seconds {
            // prometheus-client appends `_total` to a counter's name.
            let name = names::CPU_SECONDS_TOTAL.trim_end_matches("_total");
            let help = "Total user and system CPU time spent in seconds";
            encode_one(&mut encoder, name, help, &ConstCounter::new(cpu))?;
        }
        let gauges = [
            (
                names::RESIDENT_MEMORY_BYTES,
                "Resident memory size in bytes",
                s.resident_bytes.map(gauge),
            ),
            (
                names::VIRTUAL_MEMORY_BYTES,
                "Virtual memory size in bytes",
                s.virtual_bytes.map(gauge),
            ),
            (
                names::START_TIME_SECONDS,
                "Start time of the process since unix epoch in seconds",
                s.start_time_seconds.map(ConstGauge::new),
            ),
            (
                names::OPEN_FDS,
                "Number of open file descriptors",
                s.open_fds.map(gauge),
            ),
            (
                names::MAX_FDS,
                "Maximum number of open file descriptors",
                s.max_fds.map(gauge),
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(v) = value {
                encode_one(&mut encoder, name, help, &v)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    #[cfg(target_os = "linux")]
    #[test]
    fn renders_every_process_family_of_this_process() {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(ProcessCollector::new()));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        for (name, kind) in [
            ("process_cpu_seconds", "counter"),
            ("process_resident_memory_bytes", "gauge"),
            ("process_virtual_memory_bytes", "gauge"),
            ("process_start_time_seconds", "gauge"),
            ("process_open_fds", "gauge"),
        ] {
            assert!(
                text.contains(&format!("# TYPE {name} {kind}\n")),
                "{name} in\n{text}"
            );
        }
        assert!(text.contains("\nprocess_cpu_seconds_total "), "{text}");
        assert!(text.contains("\nprocess_open_fds "), "{text}");
    }
}
