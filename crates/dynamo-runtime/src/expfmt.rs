//! Merging Prometheus text expositions (ours plus what metrics callbacks return) into one
//! valid exposition.
//!
//! Callbacks return whole expositions of their own (e.g. an engine's `prometheus_client`
//! registry). Concatenated as is (what the reference does), a family that appears in two
//! parts gets two `# HELP`/`# TYPE` lines and its samples are split in two groups, which the
//! Prometheus text format forbids (Prometheus rejects the scrape). [`merge`] instead keeps
//! one block per family, in order of first appearance: the first `# HELP` and `# TYPE` win,
//! later samples of the family join its block, and an exact repeat of a series (same name
//! and labels) is dropped. Other comments (`# EOF`, `# UNIT`, free text) are dropped.

use std::collections::{HashMap, HashSet};

/// Suffixes of sample names that belong to a family of the base name.
const SUFFIXES: [&str; 8] = [
    "_bucket", "_count", "_sum", "_total", "_created", "_info", "_gsum", "_gcount",
];

#[derive(Default)]
struct Block {
    help: Option<String>,
    kind: Option<String>,
    samples: Vec<String>,
    seen: HashSet<String>,
}

/// The name of a sample line.
fn sample_name(line: &str) -> &str {
    let end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .unwrap_or(line.len());
    &line[..end]
}

/// The series of a sample line (name and labels, without value and timestamp).
fn series(line: &str) -> &str {
    match (line.find('{'), line.rfind('}')) {
        (Some(_), Some(close)) => &line[..=close],
        _ => sample_name(line),
    }
}

fn belongs(sample: &str, family: &str) -> bool {
    sample == family
        || sample
            .strip_prefix(family)
            .is_some_and(|rest| SUFFIXES.contains(&rest))
}

/// Merge expositions into one (see the module docs).
pub fn merge(parts: &[&str]) -> String {
    let mut order: Vec<String> = Vec::new();
    let mut blocks: HashMap<String, Block> = HashMap::new();
    for part in parts {
        let mut current: Option<String> = None;
        for line in part.lines() {
            let line = line.trim_end();
            if line.is_empty() {
                continue;
            }
            if let Some(rest) = line
                .strip_prefix("# HELP ")
                .map(|r| (r, true))
                .or_else(|| line.strip_prefix("# TYPE ").map(|r| (r, false)))
            {
                let (rest, is_help) = rest;
                let name = rest.split_whitespace().next().unwrap_or("").to_owned();
                if name.is_empty() {
                    continue;
                }
                let block = blocks.entry(name.clone()).or_insert_with(|| {
                    order.push(name.clone());
                    Block::default()
                });
                let slot = if is_help {
                    &mut block.help
                } else {
                    &mut block.kind
                };
                if slot.is_none() {
                    *slot = Some(line.to_owned());
                }
                current = Some(name);
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let name = sample_name(line);
            let family = match &current {
                Some(f) if belongs(name, f) => f.clone(),
                _ => {
                    let known = if blocks.contains_key(name) {
                        Some(name.to_owned())
                    } else {
                        SUFFIXES.iter().find_map(|s| {
                            name.strip_suffix(s)
                                .filter(|base| blocks.get(*base).is_some_and(|b| b.kind.is_some()))
                                .map(str::to_owned)
                        })
                    };
                    let f = known.unwrap_or_else(|| name.to_owned());
                    current = Some(f.clone());
                    f
                }
            };
            let block = blocks.entry(family.clone()).or_insert_with(|| {
                order.push(family);
                Block::default()
            });
            if block.seen.insert(series(line).to_owned()) {
                block.samples.push(line.to_owned());
            }
        }
    }
    let mut out = String::new();
    for name in order {
        let Some(b) = blocks.get(&name) else { continue };
        for l in b.help.iter().chain(b.kind.iter()).chain(b.samples.iter()) {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_families_keep_one_header_and_one_block() {
        let ours = "# HELP req Requests.\n# TYPE req counter\nreq{a=\"1\"} 2\n\
                    # HELP up Up.\n# TYPE up gauge\nup 1\n";
        let cb1 = "# HELP req dup\n# TYPE req counter\nreq{src=\"cb\"} 7\nreq{a=\"1\"} 9\n";
        let cb2 = "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_count 1\nh_sum 0.5\n\
                   # EOF\nloose 3\nreq{src=\"cb2\"} 1";
        let merged = merge(&[ours, cb1, cb2]);
        assert_eq!(
            merged,
            "# HELP req Requests.\n# TYPE req counter\nreq{a=\"1\"} 2\nreq{src=\"cb\"} 7\n\
             req{src=\"cb2\"} 1\n# HELP up Up.\n# TYPE up gauge\nup 1\n\
             # TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_count 1\nh_sum 0.5\nloose 3\n"
        );
    }
}
