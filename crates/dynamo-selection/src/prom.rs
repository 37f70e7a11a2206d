//! Prometheus text exposition (format 0.0.4) for the services' `/metrics`: one small
//! writer shared by the service, replica-sync, recovery, HTTP and slot-tracker metrics.

use std::fmt::{Display, Write as _};

/// A metric family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Counter,
    Gauge,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        }
    }
}

/// Prometheus text being written: families (`# HELP` / `# TYPE`) and their samples.
#[derive(Debug, Default)]
pub(crate) struct PromText {
    out: String,
}

impl PromText {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Start the family `name`.
    pub(crate) fn family(&mut self, name: &str, kind: Kind, help: &str) -> &mut Self {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {}", kind.as_str());
        self
    }

    /// One sample of `name` with one label (`name{label="value"} v`).
    pub(crate) fn labeled(
        &mut self,
        name: &str,
        label: &str,
        value: &str,
        v: impl Display,
    ) -> &mut Self {
        let _ = writeln!(self.out, "{name}{{{label}=\"{value}\"}} {v}");
        self
    }

    /// One sample of `name` with several labels.
    pub(crate) fn sample(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        v: impl Display,
    ) -> &mut Self {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, val)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{val}\"");
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {v}");
        self
    }

    /// A family with one unlabelled sample.
    pub(crate) fn single(
        &mut self,
        name: &str,
        kind: Kind,
        help: &str,
        v: impl Display,
    ) -> &mut Self {
        self.family(name, kind, help).sample(name, &[], v)
    }

    /// A family with one sample per `(label value, v)`.
    pub(crate) fn by_label<V: Display>(
        &mut self,
        name: &str,
        kind: Kind,
        help: &str,
        label: &str,
        samples: impl IntoIterator<Item = (impl AsRef<str>, V)>,
    ) -> &mut Self {
        self.family(name, kind, help);
        for (value, v) in samples {
            self.labeled(name, label, value.as_ref(), v);
        }
        self
    }

    /// Append text written elsewhere (another part's metrics).
    pub(crate) fn push_text(&mut self, text: &str) -> &mut Self {
        self.out.push_str(text);
        self
    }

    /// The text.
    pub(crate) fn finish(self) -> String {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_and_samples() {
        let mut p = PromText::new();
        p.single("a_total", Kind::Counter, "A things", 3).by_label(
            "b",
            Kind::Gauge,
            "B by state",
            "state",
            [("up", 1), ("down", 0)],
        );
        p.family("c", Kind::Gauge, "C")
            .sample("c", &[("x", "1"), ("y", "2")], 7);
        assert_eq!(
            p.finish(),
            "# HELP a_total A things\n# TYPE a_total counter\na_total 3\n\
             # HELP b B by state\n# TYPE b gauge\nb{state=\"up\"} 1\nb{state=\"down\"} 0\n\
             # HELP c C\n# TYPE c gauge\nc{x=\"1\",y=\"2\"} 7\n"
        );
    }
}
