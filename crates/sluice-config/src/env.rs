//! `${VAR}`, `${VAR:-default}` and `${VAR-default}` substitution in scalar values; `$${` stands
//! for a literal `${`. As in the POSIX shell, `:-` gives the default when the variable is unset
//! or empty, `-` only when it is unset.

pub(crate) fn substitute(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    if !text.contains('$') {
        return Ok(text.to_string());
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i..];
        if let Some(tail) = after.strip_prefix("$${") {
            out.push_str("${");
            rest = tail;
        } else if let Some(body_start) = after.strip_prefix("${") {
            let end = body_start
                .find('}')
                .ok_or_else(|| format!("unterminated `${{` in `{text}` (write `$${{` for a literal `${{`)"))?;
            let body = &body_start[..end];
            // (name, default, whether an empty value takes the default)
            let (name, default, empty_is_unset) = match body.find('-') {
                Some(i) if i > 0 && body.as_bytes()[i - 1] == b':' => (&body[..i - 1], Some(&body[i + 1..]), true),
                Some(i) => (&body[..i], Some(&body[i + 1..]), false),
                None => (body, None, false),
            };
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("`${{{body}}}` is not a valid variable reference (letters, digits and _ only)"));
            }
            match (lookup(name), default) {
                (Some(v), Some(d)) if v.is_empty() && empty_is_unset => out.push_str(d),
                (Some(v), _) => out.push_str(&v),
                (None, Some(d)) => out.push_str(d),
                (None, None) => {
                    return Err(format!(
                        "environment variable `{name}` is not set (write `${{{name}:-default}}` to give a default)"
                    ));
                }
            }
            rest = &body_start[end + 1..];
        } else {
            out.push('$');
            rest = &after[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "HOST" => Some("example".to_string()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn substitutes() {
        assert_eq!(substitute("http://${HOST}:9200", &env).unwrap(), "http://example:9200");
        assert_eq!(substitute("${PORT:-8080}", &env).unwrap(), "8080");
        assert_eq!(substitute("${HOST:-x}", &env).unwrap(), "example");
        assert_eq!(substitute("cost $5 $${HOST}", &env).unwrap(), "cost $5 ${HOST}");
    }

    #[test]
    fn colon_dash_treats_empty_as_unset_and_dash_does_not() {
        assert_eq!(substitute("${EMPTY:-8080}", &env).unwrap(), "8080");
        assert_eq!(substitute("[${EMPTY-8080}]", &env).unwrap(), "[]");
        assert_eq!(substitute("${PORT-8080}", &env).unwrap(), "8080");
        assert_eq!(substitute("${HOST-x}", &env).unwrap(), "example");
        assert_eq!(substitute("${PORT:-a-b}", &env).unwrap(), "a-b");
        assert_eq!(substitute("[${EMPTY}]", &env).unwrap(), "[]");
    }

    #[test]
    fn errors() {
        assert!(substitute("${MISSING}", &env).unwrap_err().contains("`MISSING` is not set"));
        assert!(substitute("${HOST", &env).unwrap_err().contains("unterminated"));
        assert!(substitute("${a b}", &env).unwrap_err().contains("not a valid variable"));
    }
}
