//! Pythonic calls (Llama 3.2 / 4): `[get_weather(city="Paris", days=2), now()]`.
//!
//! A small recursive-descent reader of Python literals (strings, numbers, `True`,
//! `False`, `None`, lists, tuples, dicts) that writes them as JSON.

use super::format::{End, Format, ObjectText, RawCall, ToolSet};
use super::head::{MAX_LEAD_NAME, ws};

struct Reader<'a> {
    s: &'a str,
    i: usize,
}

impl Reader<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s.as_bytes()[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.as_bytes().get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        if self.peek() == Some(c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn ident(&mut self) -> Option<&str> {
        self.ws();
        let start = self.i;
        while let Some(c) = self.peek() {
            if c.is_ascii_alphanumeric() || c == b'_' || c == b'.' || c == b'-' {
                self.i += 1;
            } else {
                break;
            }
        }
        (self.i > start).then(|| &self.s[start..self.i])
    }

    fn string(&mut self) -> Option<String> {
        let q = self.peek()?;
        self.i += 1;
        let mut out = String::new();
        loop {
            let c = self.s[self.i..].chars().next()?;
            self.i += c.len_utf8();
            match c {
                '\\' => {
                    let e = self.s[self.i..].chars().next()?;
                    self.i += e.len_utf8();
                    out.push(match e {
                        'n' => '\n',
                        't' => '\t',
                        'r' => '\r',
                        '0' => '\0',
                        other => other,
                    });
                }
                c if c as u32 == u32::from(q) => return Some(out),
                c => out.push(c),
            }
        }
    }

    /// One literal, as JSON text.
    fn value(&mut self) -> Option<String> {
        self.ws();
        match self.peek()? {
            b'"' | b'\'' => serde_json::to_string(&self.string()?).ok(),
            b'[' | b'(' => {
                let close = if self.peek() == Some(b'[') {
                    b']'
                } else {
                    b')'
                };
                self.i += 1;
                let mut items = Vec::new();
                loop {
                    if self.eat(close) {
                        break;
                    }
                    items.push(self.value()?);
                    if !self.eat(b',') {
                        if !self.eat(close) {
                            return None;
                        }
                        break;
                    }
                }
                Some(format!("[{}]", items.join(", ")))
            }
            b'{' => {
                self.i += 1;
                let mut obj = ObjectText::new();
                loop {
                    if self.eat(b'}') {
                        break;
                    }
                    self.ws();
                    let key = match self.peek()? {
                        b'"' | b'\'' => self.string()?,
                        _ => {
                            let v = self.value()?;
                            v.trim_matches('"').to_owned()
                        }
                    };
                    if !self.eat(b':') {
                        return None;
                    }
                    obj.push(&key, &self.value()?);
                    if !self.eat(b',') {
                        if !self.eat(b'}') {
                            return None;
                        }
                        break;
                    }
                }
                Some(obj.finish())
            }
            _ => {
                let word = self.ident()?;
                match word {
                    "True" | "true" => Some("true".to_owned()),
                    "False" | "false" => Some("false".to_owned()),
                    "None" | "null" => Some("null".to_owned()),
                    w => {
                        // Numbers (`-` is an identifier char above, so `-1` lands here).
                        let n: serde_json::Number = w.parse().ok()?;
                        Some(n.to_string())
                    }
                }
            }
        }
    }

    fn call(&mut self) -> Option<RawCall> {
        let name = self.ident()?.to_owned();
        if !self.eat(b'(') {
            return None;
        }
        let mut args = ObjectText::new();
        loop {
            if self.eat(b')') {
                break;
            }
            let key = self.ident()?.to_owned();
            if !self.eat(b'=') {
                return None;
            }
            args.push(&key, &self.value()?);
            if !self.eat(b',') {
                if !self.eat(b')') {
                    return None;
                }
                break;
            }
        }
        Some(RawCall {
            name,
            arguments: args.finish(),
            id: None,
        })
    }
}

fn pythonic(section: &str, _: &ToolSet) -> Option<Vec<RawCall>> {
    let s = section.trim();
    let s = s.strip_prefix("<|python_start|>").unwrap_or(s);
    let s = s.strip_suffix("<|python_end|>").unwrap_or(s).trim();
    let mut r = Reader { s, i: 0 };
    if !r.eat(b'[') {
        return None;
    }
    let mut calls = Vec::new();
    loop {
        if r.eat(b']') {
            break;
        }
        calls.push(r.call()?);
        if !r.eat(b',') {
            if !r.eat(b']') {
                return None;
            }
            break;
        }
    }
    r.ws();
    (r.i == s.len()).then_some(calls)
}

/// A leading `[`: a Python list of calls `[name(`. Viable once the first name and its
/// `(` arrived and the function is allowed.
fn pythonic_viable(s: &str, allowed: &dyn Fn(&str) -> bool) -> Option<bool> {
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

/// Pythonic: an output that is a Python list of calls.
pub(crate) const PYTHONIC: Format = Format {
    name: "pythonic",
    starts: &[("<|python_start|>", End::Marker("<|python_end|>"))],
    leading: &["["],
    parse: pythonic,
    special_tokens: false,
    head: None,
    viable: Some(pythonic_viable),
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_viability() {
        let yes = |_: &str| true;
        let only_f = |n: &str| n == "f";
        assert_eq!(pythonic_viable("[1] is", &yes), Some(false));
        assert_eq!(pythonic_viable("[f", &yes), None);
        assert_eq!(pythonic_viable("[f(", &only_f), Some(true));
        assert_eq!(pythonic_viable("[g (", &only_f), Some(false));
    }
}
