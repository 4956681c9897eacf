//! `additionalFormats` of a Secret or ConfigMap target: the bundle again as a JKS and/or PKCS#12 trust store in
//! other keys of the same object, for Java consumers ([`crate::keystore`] encodes them). The names are
//! trust-manager's (`additionalFormats.jks`, `.pkcs12`, `key`, `password`, `profile`), and so are the default
//! passwords: `changeit` for JKS (Java's own convention), none for PKCS#12 (a passwordless store, Java 18's
//! default form). The password can come from a Secret instead (`passwordSecretRef`), read with the same
//! names-only RBAC as a source.

use std::fmt;

use kcp_keeper_runtime::config::FieldError;
use kcp_keeper_runtime::names;
use schemars::JsonSchema;
use serde::Deserialize;

pub use crate::keystore::Format;

use super::field::check;

/// trust-manager's default JKS password, Java's conventional one.
pub const DEFAULT_JKS_PASSWORD: &str = "changeit";
/// trust-manager's default PKCS#12 password: none.
pub const DEFAULT_PKCS12_PASSWORD: &str = "";
/// trust-manager's limit on a password.
pub const MAX_PASSWORD: usize = 128;

/// One trust store written beside the PEM key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdditionalFormat {
    pub format: Format,
    /// The data key it is written to (`binaryData` in a ConfigMap, as trust-manager does).
    pub key: String,
    pub password: PasswordFrom,
}

/// Where a trust store's password comes from.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum PasswordFrom {
    Inline(String),
    /// A key of a Secret, read through a watch by name on every pass.
    Secret {
        namespace: String,
        name: String,
        key: String,
    },
}

impl fmt::Debug for PasswordFrom {
    /// Never the password itself: the configuration is printed in places a password must not be.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PasswordFrom::Inline(_) => f.write_str("Inline(<redacted>)"),
            PasswordFrom::Secret { namespace, name, key } => write!(f, "Secret({namespace}/{name} key {key})"),
        }
    }
}

/// Why a password is refused; never contains it.
pub fn check_password(format: Format, password: &str) -> Result<(), String> {
    if password.chars().count() > MAX_PASSWORD {
        return Err(format!("must be at most {MAX_PASSWORD} characters"));
    }
    if format == Format::Jks && password.is_empty() {
        return Err("must not be empty for JKS (Java's convention is changeit, the default)".into());
    }
    // Java derives a PKCS#12 store's PBES2 key from the password through PBEKeySpec, which refuses any character
    // outside printable ASCII: OpenSSL would read such a store, keytool and JSSE cannot open it.
    if format == Format::Pkcs12 && !password.chars().all(|c| (' '..='~').contains(&c)) {
        return Err("must be printable ASCII (space to ~) for PKCS#12: Java's keytool and JSSE cannot open a \
                    PKCS#12 store under a password with any other character"
            .into());
    }
    Ok(())
}

/// The trust stores a target also holds (trust-manager's `target.additionalFormats`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct RawAdditionalFormats {
    /// A JKS trust store in another key of the object.
    pub jks: Option<RawJks>,
    /// A PKCS#12 trust store in another key of the object.
    pub pkcs12: Option<RawPkcs12>,
}

/// A JKS trust store.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawJks {
    /// The data key (`binaryData` in a ConfigMap), other than the target's `key`.
    pub key: String,
    /// The store password (default `changeit`, as trust-manager's); at most 128 characters, not empty.
    #[serde(default)]
    pub password: Option<String>,
    /// Read the password from a key of a Secret instead.
    #[serde(default)]
    pub password_secret_ref: Option<RawSecretKeyRef>,
}

/// A PKCS#12 trust store.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawPkcs12 {
    /// The data key (`binaryData` in a ConfigMap), other than the target's `key`.
    pub key: String,
    /// The store password (default none, as trust-manager's: no encryption and no MAC); at most 128
    /// characters, printable ASCII only (Java cannot open a PKCS#12 store under any other password).
    #[serde(default)]
    pub password: Option<String>,
    /// Read the password from a key of a Secret instead.
    #[serde(default)]
    pub password_secret_ref: Option<RawSecretKeyRef>,
    /// How a store with a password is protected: `Modern2023` (the default here, and the only one written).
    #[serde(default)]
    pub profile: Option<Profile>,
}

/// trust-manager's PKCS#12 profiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
pub enum Profile {
    /// PBES2 (PBKDF2-HMAC-SHA-256, AES-256-CBC) and an HMAC-SHA-256 MAC.
    Modern2023,
    /// 40-bit RC2 and SHA-1: refused (OpenSSL 3 and Java 20 do not read it by default).
    LegacyRC2,
    /// 3DES and SHA-1: refused.
    #[serde(rename = "LegacyDES")]
    LegacyDes,
}

/// A key of a Secret.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawSecretKeyRef {
    /// The Secret's namespace.
    pub namespace: String,
    /// The Secret's name.
    pub name: String,
    /// The key holding the password (UTF-8, used as it is: no trailing newline is removed).
    pub key: String,
}

/// The validated formats of one target whose PEM goes to `pem_key`.
pub(super) fn formats_from_raw(
    raw: Option<&RawAdditionalFormats>,
    pem_key: &str,
    path: &str,
    errors: &mut Vec<FieldError>,
) -> Vec<AdditionalFormat> {
    let Some(raw) = raw else { return Vec::new() };
    let mut out = Vec::new();
    let jks = raw.jks.as_ref().map(|j| (Format::Jks, "jks", &j.key, &j.password, &j.password_secret_ref, None));
    let pkcs12 =
        raw.pkcs12.as_ref().map(|p| (Format::Pkcs12, "pkcs12", &p.key, &p.password, &p.password_secret_ref, p.profile));
    for (format, field, key, password, secret, profile) in [jks, pkcs12].into_iter().flatten() {
        let path = format!("{path}.{field}");
        check(errors, format!("{path}.key"), names::check_data_key(key));
        if key == pem_key {
            errors.push(FieldError::new(format!("{path}.key"), "must differ from the target's key (the PEM bundle)"));
        }
        if out.iter().any(|f: &AdditionalFormat| &f.key == key) {
            errors.push(FieldError::new(format!("{path}.key"), "must differ from jks.key"));
        }
        if matches!(profile, Some(Profile::LegacyRC2 | Profile::LegacyDes)) {
            errors.push(FieldError::new(
                format!("{path}.profile"),
                "only Modern2023 is written: the legacy profiles' RC2, 3DES and SHA-1 are refused by OpenSSL 3 and \
                 recent Java without legacy options, and Modern2023 is read by Java 8u301, 11.0.12, 17 and later",
            ));
        }
        let password = match (password, secret) {
            (Some(_), Some(_)) => {
                errors.push(FieldError::new(path.clone(), "must set at most one of password, passwordSecretRef"));
                continue;
            }
            (Some(password), None) => {
                check(errors, format!("{path}.password"), check_password(format, password));
                PasswordFrom::Inline(password.clone())
            }
            (None, Some(r)) => {
                let at = format!("{path}.passwordSecretRef");
                check(errors, format!("{at}.namespace"), names::check_dns_label(&r.namespace));
                check(errors, format!("{at}.name"), names::check_dns_subdomain(&r.name));
                check(errors, format!("{at}.key"), names::check_data_key(&r.key));
                PasswordFrom::Secret { namespace: r.namespace.clone(), name: r.name.clone(), key: r.key.clone() }
            }
            (None, None) => PasswordFrom::Inline(
                match format {
                    Format::Jks => DEFAULT_JKS_PASSWORD,
                    Format::Pkcs12 => DEFAULT_PKCS12_PASSWORD,
                }
                .to_string(),
            ),
        };
        out.push(AdditionalFormat { format, key: key.clone(), password });
    }
    out
}
