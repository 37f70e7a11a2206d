//! Endpoint naming: `namespace.component.endpoint`, each part restricted to `[a-z0-9-_]`.

use std::fmt;

use crate::error::{Error, Result};

/// The full name of an endpoint. Several processes serving the same name are told apart
/// by their instance id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointId {
    /// Namespace (a deployment or pipeline).
    pub namespace: String,
    /// Component (a load-balanced service).
    pub component: String,
    /// Endpoint (a callable function).
    pub name: String,
}

impl EndpointId {
    /// Build from three validated parts.
    pub fn new(namespace: &str, component: &str, name: &str) -> Result<Self> {
        validate_name("namespace", namespace)?;
        validate_name("component", component)?;
        validate_name("endpoint", name)?;
        Ok(Self {
            namespace: namespace.to_owned(),
            component: component.to_owned(),
            name: name.to_owned(),
        })
    }

    /// Parse `ns.comp.ep` or `dyn://ns.comp.ep`: exactly three non-empty parts.
    pub fn parse(path: &str) -> Result<Self> {
        let bare = path.strip_prefix("dyn://").unwrap_or(path);
        let parts: Vec<&str> = bare.split('.').collect();
        if parts.len() != 3 {
            return Err(Error::InvalidName(format!(
                "invalid endpoint path {path:?}: expected 'namespace.component.endpoint' \
                 (optionally prefixed with 'dyn://'), got {} part(s)",
                parts.len()
            )));
        }
        Self::new(parts[0], parts[1], parts[2])
    }

    /// The `ns/comp/ep` path used as the request-plane routing key.
    pub fn path(&self) -> String {
        format!("{}/{}/{}", self.namespace, self.component, self.name)
    }

    /// Discovery key prefix of this endpoint's instances (ends with `/`).
    pub fn instances_prefix(&self) -> String {
        format!("v1/instances/{}/", self.path())
    }
}

impl fmt::Display for EndpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.namespace, self.component, self.name)
    }
}

/// Longest name part, in bytes. The request frame carries the `ns/comp/ep` path behind a
/// `u16` length, and file discovery stores each part as a path component (at most 255 bytes
/// on common file systems): 255 per part keeps the path (at most 767 bytes) valid for both,
/// so a name that cannot be served is refused when the endpoint is created, not at every call.
pub const MAX_NAME_LEN: usize = 255;

/// Check one name part: non-empty, at most [`MAX_NAME_LEN`] bytes, `[a-z0-9-_]` only.
pub fn validate_name(kind: &str, name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::InvalidName(format!("{kind} name must not be empty")));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(Error::InvalidName(format!(
            "{kind} name is {} bytes long; at most {MAX_NAME_LEN} are allowed",
            name.len()
        )));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || *c == '_'))
    {
        return Err(Error::InvalidName(format!(
            "invalid {kind} name {name:?}: character {c:?} is not allowed (use [a-z0-9-_])"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_three_parts_with_or_without_scheme() {
        let a = EndpointId::parse("dyn://ns.comp.ep").unwrap();
        let b = EndpointId::parse("ns.comp.ep").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.path(), "ns/comp/ep");
        assert_eq!(a.to_string(), "ns.comp.ep");
        assert_eq!(a.instances_prefix(), "v1/instances/ns/comp/ep/");
    }

    #[test]
    fn rejects_bad_paths() {
        for bad in [
            "",
            "a",
            "a.b",
            "a.b.c.d",
            "a..c",
            ".b.c",
            "A.b.c",
            "a.b c.d",
            "a/b.c.d",
            "dyn://a.b",
            "a.b.c!",
        ] {
            assert!(
                EndpointId::parse(bad).is_err(),
                "{bad:?} should be rejected"
            );
        }
        assert!(EndpointId::parse("my-ns.comp_1.gen-2").is_ok());
    }

    #[test]
    fn names_longer_than_the_limit_are_refused() {
        let longest = "a".repeat(MAX_NAME_LEN);
        let id = EndpointId::new(&longest, &longest, &longest).expect("at the limit");
        assert!(u16::try_from(id.path().len()).is_ok());
        let long = "a".repeat(MAX_NAME_LEN + 1);
        let long = long.as_str();
        for (ns, comp, ep) in [(long, "c", "e"), ("n", long, "e"), ("n", "c", long)] {
            let e = EndpointId::new(ns, comp, ep).expect_err("too long");
            assert!(e.to_string().contains("at most 255"), "{e}");
        }
    }
}
