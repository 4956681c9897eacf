//! A wrapper for keys, tokens and certificate bodies: it cannot be printed by accident.

use std::fmt;

/// Holds secret material. `Debug` and `Display` print `<redacted>`; the value is reachable only through
/// [`Sensitive::expose`], which makes every use visible in review.
#[derive(Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct Sensitive<T>(T);

impl<T> Sensitive<T> {
    pub fn new(value: T) -> Self {
        Self(value)
    }

    pub fn expose(&self) -> &T {
        &self.0
    }

    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> From<T> for Sensitive<T> {
    fn from(value: T) -> Self {
        Self(value)
    }
}

impl<T> fmt::Debug for Sensitive<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl<T> fmt::Display for Sensitive<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_display_and_nested_debug_print_nothing_of_the_value() {
        let key = Sensitive::new("-----BEGIN PRIVATE KEY-----abc".to_string());
        assert_eq!(format!("{key:?}"), "<redacted>");
        assert_eq!(key.to_string(), "<redacted>");
        #[derive(Debug)]
        #[allow(dead_code)]
        struct Holder {
            key: Sensitive<String>,
        }
        assert!(!format!("{:?}", Holder { key: key.clone() }).contains("PRIVATE"));
        assert!(key.expose().contains("PRIVATE"));
    }

    #[test]
    fn deserializes_transparently() {
        let key: Sensitive<String> = serde_json::from_str("\"token\"").unwrap();
        assert_eq!(key.expose(), "token");
    }
}
