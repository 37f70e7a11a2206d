//! Incremental argument streaming inside a tool-call section.
//!
//! A [`Streamer`] walks a section's text as it grows. A format that supports streaming
//! gives a [`HeadFn`]: it reads the text before one call's arguments (markers, the
//! name, a JSON call object's keys) and says where the arguments object starts. Once the
//! name is complete, allowed (declared, and permitted by `tool_choice` /
//! `parallel_tool_calls`) and the arguments begin with `{`, the call is *committed*: its
//! name goes out at once, then the arguments text as it arrives, up to the `}` that closes
//! the object (a bracket-and-string scan, [`ObjectScan`]). Before a commit nothing of the
//! section is sent, so an undeclared call or text that is not a call falls back to content
//! whole, as with formats that do not stream.
//!
//! The complete section is then parsed as usual ([`super::Format::parse`]) and checked
//! against what was sent: when the parse agrees (same names, arguments beginning with
//! what was sent) the rest of the calls follow; when it does not (the arguments turned
//! out to be invalid JSON, the section never closed, a later call is undeclared), what was
//! sent stays sent and the section's text from the first unsent byte on is content.
//!
//! Every step is linear in the new text: the head of a call is re-read while incomplete,
//! but never past [`MAX_HEAD`] bytes.

/// The most bytes a call's head (markers, name, keys before the arguments) may take;
/// a longer head is not streamed (the section is then parsed whole, as formats without
/// streaming). 512 is far above real heads (`{"name": "get_current_weather",
/// "arguments": ` is 45 bytes) and bounds the re-reading of an incomplete head.
pub(crate) const MAX_HEAD: usize = 512;

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

/// Finds the end of a JSON object by brackets and strings (not a validator: the
/// section's parse validates).
#[derive(Debug, Clone, Default)]
pub(crate) struct ObjectScan {
    depth: u32,
    in_str: bool,
    esc: bool,
}

impl ObjectScan {
    /// Scan `bytes` (the first call starts at the object's `{`); the offset just past
    /// the closing `}` when the object closes within them.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Option<usize> {
        for (i, &b) in bytes.iter().enumerate() {
            if self.in_str {
                if self.esc {
                    self.esc = false;
                } else if b == b'\\' {
                    self.esc = true;
                } else if b == b'"' {
                    self.in_str = false;
                }
                continue;
            }
            match b {
                b'"' => self.in_str = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        return Some(i + 1);
                    }
                }
                _ => {}
            }
        }
        None
    }
}

/// A committed call: its name and the span of the section sent as its arguments.
#[derive(Debug, Clone)]
pub(crate) struct Sent {
    pub(crate) name: String,
    /// Where its arguments start (the `{`).
    pub(crate) from: usize,
    /// The end of what was sent.
    pub(crate) to: usize,
}

#[derive(Debug, Clone)]
enum State {
    Head,
    Args(ObjectScan),
    /// Streaming stopped for this section.
    Off,
}

/// What a streamer emits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Emit {
    /// A call is committed.
    Start { name: String, id: Option<String> },
    /// A piece of its arguments.
    Args(String),
}

/// The streaming state of one section.
#[derive(Debug, Clone)]
pub(crate) struct Streamer {
    head: HeadFn,
    pos: usize,
    state: State,
    pub(crate) sent: Vec<Sent>,
}

impl Streamer {
    /// A streamer whose first head starts at byte `pos` of the section.
    pub(crate) fn new(head: HeadFn, pos: usize) -> Self {
        Self {
            head,
            pos,
            state: State::Head,
            sent: Vec::new(),
        }
    }

    /// Read `section[..limit]` (it only grows between calls); `allowed(name, calls
    /// committed in this section)` says whether a call may be committed.
    pub(crate) fn advance(
        &mut self,
        section: &str,
        limit: usize,
        allowed: &dyn Fn(&str, usize) -> bool,
        out: &mut impl FnMut(Emit),
    ) {
        while self.pos < limit {
            match &mut self.state {
                State::Off => return,
                State::Head => match (self.head)(&section[self.pos..limit]) {
                    Head::Need => {
                        if limit - self.pos > MAX_HEAD {
                            self.state = State::Off;
                        }
                        return;
                    }
                    Head::Bad => {
                        self.state = State::Off;
                        return;
                    }
                    Head::Call { name, id, args_at } => {
                        if !allowed(&name, self.sent.len()) {
                            self.state = State::Off;
                            return;
                        }
                        let from = self.pos + args_at;
                        self.sent.push(Sent {
                            name: name.clone(),
                            from,
                            to: from,
                        });
                        out(Emit::Start { name, id });
                        self.pos = from;
                        self.state = State::Args(ObjectScan::default());
                    }
                },
                State::Args(scan) => {
                    let closed = scan
                        .feed(&section.as_bytes()[self.pos..limit])
                        .map(|k| self.pos + k);
                    let end = closed.unwrap_or(limit);
                    if let Some(last) = self.sent.last_mut() {
                        out(Emit::Args(section[last.to..end].to_owned()));
                        last.to = end;
                    }
                    self.pos = end;
                    if closed.is_some() {
                        self.state = State::Head;
                    }
                }
            }
        }
    }
}

// --- Reading heads -------------------------------------------------------------------

fn ws(b: &[u8], mut i: usize) -> usize {
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

macro_rules! need {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(true) => return Head::Need,
            Err(false) => return Head::Bad,
        }
    };
}

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
fn skip_optional(s: &str, mut i: usize, lits: &[&str]) -> Option<usize> {
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
fn marked(s: &str, i: usize, open: &str, sep: &str) -> Result<(String, usize), bool> {
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

fn object_at(s: &str, i: usize) -> Result<usize, bool> {
    let i = ws(s.as_bytes(), i);
    match s.as_bytes().get(i) {
        None => Err(true),
        Some(b'{') => Ok(i),
        Some(_) => Err(false),
    }
}

/// Mistral: `[TOOL_CALLS]` then JSON call objects (v0.3) or `name[ARGS]{...}`
/// (optionally `name[CALL_ID]id[ARGS]`), v11.
pub(crate) fn mistral_head(s: &str) -> Head {
    let Some(i) = skip_optional(s, 0, &["[TOOL_CALLS]"]) else {
        return Head::Need;
    };
    match s.as_bytes().get(i) {
        None => return Head::Need,
        Some(b'[' | b'{' | b'}' | b']' | b',') => return json_head(&s[i..]).shift(i),
        Some(_) => {}
    }
    let Some(p) = s[i..].find("[ARGS]") else {
        return Head::Need;
    };
    let head = &s[i..i + p];
    let (name, id) = match head.split_once("[CALL_ID]") {
        Some((n, id)) => (n, Some(id.trim().to_owned())),
        None => (head, None),
    };
    let name = name.trim();
    if name.is_empty() || name.contains('[') {
        return Head::Bad;
    }
    let args_at = need!(object_at(s, i + p + "[ARGS]".len()));
    Head::Call {
        name: name.to_owned(),
        id,
        args_at,
    }
}

impl Head {
    fn shift(self, by: usize) -> Self {
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

use super::special::{
    DS_CALL_BEGIN, DS_CALL_END, DS_SEP, KIMI_ARGS, KIMI_CALL_BEGIN, KIMI_CALL_END,
};

/// DeepSeek V3.1 `<｜tool▁call▁begin｜>name<｜tool▁sep｜>{` and V3
/// `<｜tool▁call▁begin｜>function<｜tool▁sep｜>name\n```json\n{`.
pub(crate) fn deepseek_head(s: &str) -> Head {
    let Some(i) = skip_optional(s, 0, &["```", DS_CALL_END]) else {
        return Head::Need;
    };
    let (head, j) = need!(marked(s, i, DS_CALL_BEGIN, DS_SEP));
    let head = head.trim();
    let b = s.as_bytes();
    let k = ws(b, j);
    if k == b.len() {
        return Head::Need;
    }
    if head == "function" && b[k] != b'{' {
        // V3: the name runs to the end of the line, then a fenced JSON block.
        let Some(nl) = s[j..].find('\n') else {
            return Head::Need;
        };
        let name = s[j..j + nl].trim();
        let Some(f) = skip_optional(s, j + nl, &["```json", "```"]) else {
            return Head::Need;
        };
        if name.is_empty() {
            return Head::Bad;
        }
        let args_at = need!(object_at(s, f));
        return Head::Call {
            name: name.to_owned(),
            id: None,
            args_at,
        };
    }
    if head.is_empty() || b[k] != b'{' {
        return Head::Bad;
    }
    Head::Call {
        name: head.to_owned(),
        id: None,
        args_at: k,
    }
}

/// Kimi K2 `<|tool_call_begin|>functions.name:N<|tool_call_argument_begin|>{`.
pub(crate) fn kimi_head(s: &str) -> Head {
    let Some(i) = skip_optional(s, 0, &[KIMI_CALL_END]) else {
        return Head::Need;
    };
    let (id, j) = need!(marked(s, i, KIMI_CALL_BEGIN, KIMI_ARGS));
    let id = id.trim();
    let name = id.strip_prefix("functions.").unwrap_or(id);
    let name = name.rsplit_once(':').map_or(name, |(n, _)| n);
    if name.is_empty() {
        return Head::Bad;
    }
    let args_at = need!(object_at(s, j));
    Head::Call {
        name: name.to_owned(),
        id: Some(id.to_owned()),
        args_at,
    }
}

// --- Leading sections ----------------------------------------------------------------

/// Whether a leading section can still be calls: `None` while unknown, then for good.
pub(crate) type ViableFn = fn(&str, &dyn Fn(&str) -> bool) -> Option<bool>;

/// The longest key or name a leading JSON section may have before it is judged; longer
/// text is not a call of ours (real names are well under 64 bytes).
const MAX_LEAD_NAME: usize = 128;

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

/// A leading `[`: a Python list of calls `[name(`. Viable once the first name and its
/// `(` arrived and the function is allowed.
pub(crate) fn pythonic_viable(s: &str, allowed: &dyn Fn(&str) -> bool) -> Option<bool> {
    let b = s.as_bytes();
    let mut i = ws(b, 0);
    if *b.get(i)? != b'[' {
        return Some(false);
    }
    i = ws(b, i + 1);
    let start = i;
    while i < b.len() && (b[i].is_ascii_alphanumeric() || matches!(b[i], b'_' | b'.' | b'-')) {
        i += 1;
    }
    if i - start > MAX_LEAD_NAME {
        return Some(false);
    }
    let name = &s[start..i];
    let i = ws(b, i);
    match b.get(i)? {
        b'(' if !name.is_empty() => Some(allowed(name)),
        _ => Some(false),
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
    fn object_scan_finds_the_end_across_pieces() {
        let s = br#"{"a": "}\"{", "b": [1, {"c": 2}]} tail"#;
        for cut in 1..s.len() {
            let mut scan = ObjectScan::default();
            let got = scan
                .feed(&s[..cut])
                .or_else(|| scan.feed(&s[cut..]).map(|k| k + cut));
            assert_eq!(got, Some(s.len() - 5), "{cut}");
        }
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
        assert_eq!(pythonic_viable("[1] is", &yes), Some(false));
        assert_eq!(pythonic_viable("[f", &yes), None);
        assert_eq!(pythonic_viable("[f(", &only_f), Some(true));
        assert_eq!(pythonic_viable("[g (", &only_f), Some(false));
    }
}
