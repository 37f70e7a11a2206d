//! Small string helpers shared by the streaming parsers.

/// Length of the longest suffix of `buf` that is a proper prefix of one of `markers`: the
/// text a streaming parser must hold back because it can still become a marker.
pub(crate) fn partial_suffix_len(buf: &str, markers: &[&str]) -> usize {
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

/// The earliest occurrence of any of `markers` in `buf`: `(position, marker index)`.
pub(crate) fn find_first(buf: &str, markers: &[&str]) -> Option<(usize, usize)> {
    let mut best: Option<(usize, usize)> = None;
    for (i, m) in markers.iter().enumerate() {
        let hay = match best {
            // Only an earlier hit can win: search no further than the best one.
            Some((pos, _)) => &buf[..(pos + m.len()).min(buf.len())],
            None => buf,
        };
        if let Some(p) = hay.find(m)
            && best.is_none_or(|(b, _)| p < b)
        {
            best = Some((p, i));
        }
    }
    best
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
    }
}
