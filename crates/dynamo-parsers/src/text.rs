//! Small string helpers shared by the streaming parsers.

/// Length of the longest suffix of `buf` that is a proper prefix of one of `markers`: the
/// text a streaming parser must hold back because it can still become a marker.
pub(crate) fn partial_suffix_len(buf: &str, markers: &[&str]) -> usize {
    // A held tail starts with a marker's first byte: most tokens have none near the end.
    let longest = markers.iter().map(|m| m.len()).max().unwrap_or(0);
    let tail = &buf.as_bytes()[buf.len().saturating_sub(longest.saturating_sub(1))..];
    if !has_first_byte(tail, markers) {
        return 0;
    }
    let mut best = 0;
    for m in markers {
        // Longest first; `k` ranges over proper prefixes that fit in `buf`.
        let max = (m.len() - 1).min(buf.len());
        for k in (best + 1..=max).rev() {
            if m.is_char_boundary(k) && buf.as_bytes().ends_with(&m.as_bytes()[..k]) {
                best = k;
                break;
            }
        }
    }
    best
}

/// The first occurrence of `marker` in `hay`. Candidates are found by the marker's first
/// char (a `memchr` scan inside `str::find(char)`): parsers call this once per token on a
/// few bytes, where building a substring searcher for a 27-byte marker costs more than
/// the search.
pub(crate) fn find(hay: &str, marker: &str) -> Option<usize> {
    let first = marker.chars().next()?;
    let mut at = 0;
    while let Some(p) = hay[at..].find(first) {
        let p = at + p;
        if hay.as_bytes()[p..].starts_with(marker.as_bytes()) {
            return Some(p);
        }
        at = p + first.len_utf8();
    }
    None
}

/// The earliest occurrence of any of `markers` in `buf`: `(position, marker index)`.
pub(crate) fn find_first(buf: &str, markers: &[&str]) -> Option<(usize, usize)> {
    if !has_first_byte(buf.as_bytes(), markers) {
        // The common case, one token of prose: a few byte compares, no search.
        return None;
    }
    let mut best: Option<(usize, usize)> = None;
    for (i, m) in markers.iter().enumerate() {
        let hay = match best {
            // Only an earlier hit can win: search no further than the best one.
            Some((pos, _)) => &buf[..floor_boundary(buf, pos + m.len())],
            None => buf,
        };
        if let Some(p) = find(hay, m)
            && best.is_none_or(|(b, _)| p < b)
        {
            best = Some((p, i));
        }
    }
    best
}

/// Whether `bytes` holds the first byte of one of `markers`.
fn has_first_byte(bytes: &[u8], markers: &[&str]) -> bool {
    bytes
        .iter()
        .any(|b| markers.iter().any(|m| m.as_bytes().first() == Some(b)))
}

/// A byte offset at or before `i` that is a char boundary of `s`.
pub(crate) fn floor_boundary(s: &str, mut i: usize) -> usize {
    if i >= s.len() {
        return s.len();
    }
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_suffixes() {
        assert_eq!(partial_suffix_len("abc <tool", &["<tool_call>"]), 5);
        assert_eq!(partial_suffix_len("abc <", &["<tool_call>", "<x>"]), 1);
        assert_eq!(partial_suffix_len("abc", &["<tool_call>"]), 0);
        assert_eq!(partial_suffix_len("<tool_call>", &["<tool_call>"]), 0);
        assert_eq!(
            partial_suffix_len("x<｜tool", &["<｜tool▁calls▁begin｜>"]),
            8
        );
    }

    #[test]
    fn first_of_many() {
        assert_eq!(find_first("a <b> <a>", &["<a>", "<b>"]), Some((2, 1)));
        assert_eq!(find_first("none", &["<a>"]), None);
        assert_eq!(find("<<a <ab>", "<ab>"), Some(4));
        assert_eq!(find("x◁thin◁think▷", "◁think▷"), Some(8));
        assert_eq!(find("<a", "<ab>"), None);
    }
}
