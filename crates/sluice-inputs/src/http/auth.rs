//! Who may post to the `http` input: `auth: {basic: {user, password}}` or `auth: {bearer:
//! TOKEN}` (the older `auth_token: TOKEN` is the same as `auth: {bearer: TOKEN}`).
//!
//! The credentials of a request are compared with the expected ones in constant time, so the
//! time an answer takes tells nothing of how much of a guess was right. The scheme name is
//! matched without regard to case, as HTTP wants. Values come through `${VAR}` like any other.

use axum::http::{HeaderMap, HeaderValue, header};
use base64::Engine;
use serde::Deserialize;
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use subtle::ConstantTimeEq;

/// `auth:`: exactly one of `basic` or `bearer`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AuthConfig {
    basic: Option<BasicAuth>,
    bearer: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct BasicAuth {
    user: String,
    password: String,
}

/// What a request's `Authorization` header must carry.
#[derive(Debug)]
pub(crate) struct Authenticator {
    /// `Basic` or `Bearer`.
    scheme: &'static str,
    /// The credentials after the scheme: base64 of `user:password`, or the token.
    credentials: Vec<u8>,
}

impl Authenticator {
    /// From `auth:` or `auth_token:` (not both); `None` when neither is set.
    pub(crate) fn from_config(
        spec: &ComponentSpec,
        auth: Option<&AuthConfig>,
        auth_token: Option<&str>,
    ) -> Result<Option<Authenticator>, ConfigError> {
        let printable = |key: &[&str], value: &str| {
            if value.is_empty() || HeaderValue::from_str(value).is_err() {
                Err(spec.nested_key_error(key, "must be non-empty printable text"))
            } else {
                Ok(())
            }
        };
        match (auth, auth_token) {
            (None, None) => Ok(None),
            (Some(_), Some(_)) => Err(spec.key_error(
                "auth_token",
                "`auth_token` and `auth` are both set; keep one (`auth_token: T` is `auth: {bearer: T}`)",
            )),
            (None, Some(token)) => {
                printable(&["auth_token"], token)?;
                Ok(Some(Authenticator { scheme: "Bearer", credentials: token.as_bytes().to_vec() }))
            }
            (Some(auth), None) => match (&auth.basic, &auth.bearer) {
                (Some(basic), None) => {
                    if basic.user.is_empty() || basic.user.contains(':') {
                        return Err(spec.nested_key_error(
                            &["auth", "basic", "user"],
                            "must be non-empty and hold no `:` (HTTP basic authentication joins user and password with one)",
                        ));
                    }
                    if basic.password.is_empty() {
                        return Err(spec.nested_key_error(&["auth", "basic", "password"], "must not be empty"));
                    }
                    let joined = format!("{}:{}", basic.user, basic.password);
                    let encoded = base64::engine::general_purpose::STANDARD.encode(joined);
                    Ok(Some(Authenticator { scheme: "Basic", credentials: encoded.into_bytes() }))
                }
                (None, Some(token)) => {
                    printable(&["auth", "bearer"], token)?;
                    Ok(Some(Authenticator { scheme: "Bearer", credentials: token.as_bytes().to_vec() }))
                }
                (Some(_), Some(_)) => Err(spec.key_error("auth", "set one of `basic` and `bearer`, not both")),
                (None, None) => {
                    Err(spec.key_error("auth", "needs `basic: {user, password}` or `bearer: TOKEN` (or remove `auth`)"))
                }
            },
        }
    }

    /// Whether `headers` carry the expected credentials.
    pub(crate) fn admits(&self, headers: &HeaderMap) -> bool {
        let given = headers.get(header::AUTHORIZATION).map(HeaderValue::as_bytes).unwrap_or_default();
        let (scheme, credentials) = match given.iter().position(|&b| b == b' ') {
            Some(i) => (&given[..i], given[i + 1..].trim_ascii()),
            None => (given, &[][..]),
        };
        // The scheme is public; only the credentials need a constant-time comparison.
        let scheme_ok = scheme.eq_ignore_ascii_case(self.scheme.as_bytes());
        let credentials_ok = constant_time_eq(&self.credentials, credentials);
        scheme_ok & credentials_ok
    }

    /// The `WWW-Authenticate` header of a 401.
    pub(crate) fn challenge(&self) -> HeaderValue {
        HeaderValue::from_static(match self.scheme {
            "Basic" => "Basic realm=\"sluice\", charset=\"UTF-8\"",
            _ => "Bearer",
        })
    }

    /// `basic` or `bearer`, for messages.
    pub(crate) fn kind(&self) -> &'static str {
        if self.scheme == "Basic" { "basic" } else { "bearer" }
    }
}

/// Equal contents, in a time that depends only on the lengths.
pub(crate) fn constant_time_eq(expected: &[u8], given: &[u8]) -> bool {
    expected.ct_eq(given).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::tests::spec;

    fn authenticator(yaml: &str) -> Result<Option<Authenticator>, ConfigError> {
        let spec = spec(yaml);
        let (_, c) = super::super::config::read(&spec)?;
        Authenticator::from_config(&spec, c.auth.as_ref(), c.auth_token.as_deref())
    }

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn basic_credentials() {
        let a = authenticator("{type: http, address: 'x:0', auth: {basic: {user: ann, password: 'p@ss word'}}}")
            .unwrap()
            .unwrap();
        let good = base64::engine::general_purpose::STANDARD.encode("ann:p@ss word");
        assert!(a.admits(&headers(&format!("Basic {good}"))));
        assert!(a.admits(&headers(&format!("basic {good}"))), "the scheme is case-insensitive");
        let wrong = base64::engine::general_purpose::STANDARD.encode("ann:p@ss wore");
        assert!(!a.admits(&headers(&format!("Basic {wrong}"))));
        assert!(!a.admits(&headers(&format!("Bearer {good}"))), "another scheme");
        assert!(!a.admits(&HeaderMap::new()));
        assert!(!a.admits(&headers("Basic")));
        assert_eq!(a.challenge(), "Basic realm=\"sluice\", charset=\"UTF-8\"");
    }

    #[test]
    fn bearer_token_and_the_older_key() {
        for yaml in
            ["{type: http, address: 'x:0', auth: {bearer: s3cret}}", "{type: http, address: 'x:0', auth_token: s3cret}"]
        {
            let a = authenticator(yaml).unwrap().unwrap();
            assert!(a.admits(&headers("Bearer s3cret")));
            assert!(!a.admits(&headers("Bearer s3cre")));
            assert!(!a.admits(&headers("Bearer s3cret1")));
            assert!(!a.admits(&headers("Basic s3cret")));
            assert_eq!(a.kind(), "bearer");
        }
        assert!(authenticator("{type: http, address: 'x:0'}").unwrap().is_none());
    }

    #[test]
    fn misconfigurations_name_the_key() {
        let e = |yaml: &str| authenticator(yaml).unwrap_err().to_string();
        assert!(e("{type: http, address: 'x:0', auth: {bearer: t}, auth_token: t}").contains("both set"));
        assert!(e("{type: http, address: 'x:0', auth: {}}").contains("needs `basic"));
        assert!(
            e("{type: http, address: 'x:0', auth: {basic: {user: a, password: b}, bearer: t}}").contains("not both")
        );
        let m = e("{type: http, address: 'x:0', auth: {basic: {user: 'a:b', password: c}}}");
        assert!(m.contains("auth.basic.user"), "{m}");
        let m = e("{type: http, address: 'x:0', auth: {basic: {user: a}}}");
        assert!(m.contains("password"), "{m}");
        let m = e("{type: http, address: 'x:0', auth: {token: t}}");
        assert!(m.contains("auth.token"), "{m}");
    }

    #[test]
    fn comparison_is_exact() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(!constant_time_eq(b"abc", b""));
    }
}
