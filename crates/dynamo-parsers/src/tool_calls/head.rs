//! Reading the front of a tool-call section: one call's head (the text before its
//! arguments object) and, for a section that opens the output, whether it can be calls.
//!
//! Each format names its own readers in its [`Format`](super::Format) entry; they are
//! built from the small JSON-aware scanners here. These pieces sit below both the formats
//! and the streaming engine (`stream.rs`), so the engine can call a format's reader and a
//! format can share the JSON ones without either file importing the other.

/// What a head reader found at the front of the unread text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Head {
    /// The text may still become a head: wait for more.
    Need,
    /// Not a streamable head (the section is then parsed whole).
    Bad,
    /// A call: its name, its id when the format writes one, and the offset of the `{`
    /// that opens its arguments.
    Call {
        name: String,
        id: Option<String>,
        args_at: usize,
    },
}

/// Reads one call's head from the front of the text.
pub(crate) type HeadFn = fn(&str) -> Head;

impl Head {
    /// The same head read from `by` bytes further into the text.
    pub(crate) fn shift(self, by: usize) -> Self {
        match self {
            Head::Call { name, id, args_at } => Head::Call {
                name,
                id,
                args_at: args_at + by,
            },
            other => other,
        }
    }
}

/// The offset of the first non-blank byte at or after `i`.
pub(crate) fn ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// `s[i..]` starts with `lit`: `Some(true)`; is a proper prefix of it: `None` (wait);
/// else `Some(false)`.
fn lit(s: &str, i: usize, lit: &str) -> Option<bool> {
    let rest = &s.as_bytes()[i..];
    if rest.starts_with(lit.as_bytes()) {
        Some(true)
    } else if lit.as_bytes().starts_with(rest) {
        None
    } else {
        Some(false)
    }
}

/// A JSON string starting at `s[i]` (a `"`): its value and the offset past it;
/// `Err(true)` while incomplete, `Err(false)` when it is not a valid string.
fn json_string(s: &str, i: usize) -> Result<(String, usize), bool> {
    let b = s.as_bytes();
    let mut j = i + 1;
    let mut esc = false;
    while j < b.len() {
        match b[j] {
            _ if esc => esc = false,
            b'\\' => esc = true,
            b'"' => {
                let v = serde_json::from_str::<String>(&s[i..=j]).map_err(|_| false)?;
                return Ok((v, j + 1));
            }
            _ => {}
        }
        j += 1;
    }
    Err(true)
}

/// Skip a scalar JSON value (string, number, literal) at `s[i]`: the offset past it;
/// `Err(true)` while it may still be incomplete, `Err(false)` when it is not a scalar.
fn skip_scalar(s: &str, i: usize) -> Result<usize, bool> {
    let b = s.as_bytes();
    match b[i] {
        b'"' => json_string(s, i).map(|(_, j)| j),
        b'{' | b'[' => Err(false),
        _ => {
            let mut j = i;
            while j < b.len() && !matches!(b[j], b',' | b'}' | b']') && !b[j].is_ascii_whitespace()
            {
                j += 1;
            }
            if j == b.len() { Err(true) } else { Ok(j) }
        }
    }
}

/// Unwraps a scanner's `Result<_, bool>` inside a head reader: `Err(true)` (incomplete)
/// returns [`Head::Need`], `Err(false)` returns [`Head::Bad`].
macro_rules! need {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(true) => return Head::Need,
            Err(false) => return Head::Bad,
        }
    };
}
// The format files' head readers use it too.
pub(crate) use need;

/// A JSON call object `{"name": "f", "arguments": {` (keys `name`, `arguments` /
/// `parameters`, and scalar others, name first), after blanks and list punctuation.
pub(crate) fn json_head(s: &str) -> Head {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len()
        && (b[i].is_ascii_whitespace() || matches!(b[i], b'[' | b']' | b'}' | b',' | b';'))
    {
        i += 1;
    }
    if i == b.len() {
        return Head::Need;
    }
    if b[i] != b'{' {
        return Head::Bad;
    }
    i += 1;
    let mut name = None;
    let mut id = None;
    loop {
        i = ws(b, i);
        if i == b.len() {
            return Head::Need;
        }
        if b[i] != b'"' {
            return Head::Bad;
        }
        let (key, j) = need!(json_string(s, i));
        i = ws(b, j);
        if i == b.len() {
            return Head::Need;
        }
        if b[i] != b':' {
            return Head::Bad;
        }
        i = ws(b, i + 1);
        if i == b.len() {
            return Head::Need;
        }
        match key.as_str() {
            "name" | "id" if b[i] == b'"' => {
                let (v, j) = need!(json_string(s, i));
                if key == "name" {
                    name = Some(v);
                } else {
                    id = Some(v);
                }
                i = j;
            }
            "arguments" | "parameters" => {
                return match (name, b[i]) {
                    (Some(name), b'{') => Head::Call {
                        name,
                        id,
                        args_at: i,
                    },
                    _ => Head::Bad,
                };
            }
            "name" => return Head::Bad,
            _ => i = need!(skip_scalar(s, i)),
        }
        i = ws(b, i);
        if i == b.len() {
            return Head::Need;
        }
        if b[i] != b',' {
            return Head::Bad;
        }
        i += 1;
    }
}

/// Skip blanks, then optional `lits` in order (each after blanks): the offset, or
/// `None` while one of them may still be arriving.
pub(crate) fn skip_optional(s: &str, mut i: usize, lits: &[&str]) -> Option<usize> {
    let b = s.as_bytes();
    for l in lits {
        i = ws(b, i);
        match lit(s, i, l) {
            Some(true) => i += l.len(),
            Some(false) => {}
            None => return None,
        }
    }
    Some(ws(b, i))
}

/// `<open>HEAD<sep>` then blanks and `{`: `HEAD` and the offset of the `{`.
pub(crate) fn marked(s: &str, i: usize, open: &str, sep: &str) -> Result<(String, usize), bool> {
    match lit(s, i, open) {
        Some(true) => {}
        Some(false) => return Err(false),
        None => return Err(true),
    }
    let from = i + open.len();
    let p = s[from..].find(sep).ok_or(true)?;
    let head = s[from..from + p].to_owned();
    Ok((head, from + p + sep.len()))
}

/// Blanks, then the `{` that opens a call's arguments: its offset.
pub(crate) fn object_at(s: &str, i: usize) -> Result<usize, bool> {
    let i = ws(s.as_bytes(), i);
    match s.as_bytes().get(i) {
        None => Err(true),
        Some(b'{') => Ok(i),
        Some(_) => Err(false),
    }
}

// --- Leading sections ----------------------------------------------------------------

/// Whether a leading section can still be calls: `None` while unknown, then for good.
pub(crate) type ViableFn = fn(&str, &dyn Fn(&str) -> bool) -> Option<bool>;

/// The longest key or name a leading JSON section may have before it is judged; longer
/// text is not a call of ours (real names are well under 64 bytes).
pub(crate) const MAX_LEAD_NAME: usize = 128;

/// A leading `{` / `[`: JSON call objects, a list of them. Viable once the first key is
/// one a call object has and, when it is `name`, the function is allowed.
pub(crate) fn json_viable(s: &str, allowed: &dyn Fn(&str) -> bool) -> Option<bool> {
    let b = s.as_bytes();
    let mut i = ws(b, 0);
    if b.get(i) == Some(&b'[') {
        i = ws(b, i + 1);
    }
    match b.get(i)? {
        b'{' => {}
        _ => return Some(false),
    }
    i = ws(b, i + 1);
    if *b.get(i)? != b'"' {
        return Some(false);
    }
    let (key, j) = match json_string(s, i) {
        Ok(v) => v,
        Err(true) => return (s.len() - i > MAX_LEAD_NAME).then_some(false),
        Err(false) => return Some(false),
    };
    match key.as_str() {
        "name" => {}
        "arguments" | "parameters" | "id" | "type" => return Some(true),
        _ => return Some(false),
    }
    let i = ws(b, j);
    if *b.get(i)? != b':' {
        return Some(false);
    }
    let i = ws(b, i + 1);
    if *b.get(i)? != b'"' {
        return Some(false);
    }
    match json_string(s, i) {
        Ok((name, _)) => Some(allowed(&name)),
        Err(true) => (s.len() - i > MAX_LEAD_NAME).then_some(false),
        Err(false) => Some(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_heads() {
        let s = "{\"name\": \"f\", \"arguments\": {\"a\": 1}}";
        assert_eq!(
            json_head(s),
            Head::Call {
                name: "f".into(),
                id: None,
                args_at: 27
            }
        );
        for cut in 0..27 {
            assert_eq!(json_head(&s[..cut]), Head::Need, "{cut}");
        }
        assert_eq!(json_head("{\"arguments\": {}, \"name\": \"f\"}"), Head::Bad);
        assert_eq!(
            json_head("{\"name\": \"f\", \"arguments\": \"{}\"}"),
            Head::Bad
        );
        let s = " [ {\"type\": \"function\", \"id\": \"c1\", \"name\": \"f\", \"parameters\":{";
        assert_eq!(
            json_head(s),
            Head::Call {
                name: "f".into(),
                id: Some("c1".into()),
                args_at: s.len() - 1
            }
        );
    }

    #[test]
    fn leading_viability() {
        let yes = |_: &str| true;
        let only_f = |n: &str| n == "f";
        assert_eq!(json_viable("[1] is", &yes), Some(false));
        assert_eq!(json_viable("{", &yes), None);
        assert_eq!(json_viable("{\"na", &yes), None);
        assert_eq!(json_viable("{\"answer\"", &yes), Some(false));
        assert_eq!(json_viable("{\"name\": \"g\"", &only_f), Some(false));
        assert_eq!(json_viable("[{\"name\": \"f\"", &only_f), Some(true));
    }
}
