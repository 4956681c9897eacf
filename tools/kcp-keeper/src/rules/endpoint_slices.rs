//! "The addresses APIExportEndpointSlices advertise must be reachable from where the providers run" (seed 001:
//! "not a name inside the KDP cluster such as https://kcp:6443/..."). A slice, written by kcp, is parsed into its
//! name and its endpoints' URLs only; each URL's probe (resolved, TLS verified with the configured CA bundle) is
//! judged here.

use crate::verdict::Verdict;

pub const CHECK: &str = "endpoint-slices";

/// What the check reads of an APIExportEndpointSlice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slice {
    pub name: String,
    pub urls: Vec<String>,
}

/// `metadata.name` and `status.endpoints[].url`; a slice of another shape is an error naming the field.
pub fn parse(object: &serde_json::Value) -> Result<Slice, String> {
    let name = object["metadata"]["name"].as_str().ok_or("an APIExportEndpointSlice without metadata.name")?;
    let mut urls = Vec::new();
    match &object["status"]["endpoints"] {
        serde_json::Value::Null => {}
        serde_json::Value::Array(endpoints) => {
            for (i, e) in endpoints.iter().enumerate() {
                let url =
                    e["url"].as_str().ok_or_else(|| format!("{name}: status.endpoints[{i}].url is not a string"))?;
                urls.push(url.to_string());
            }
        }
        _ => return Err(format!("{name}: status.endpoints is not a list")),
    }
    Ok(Slice { name: name.to_string(), urls })
}

pub fn subject(slice: &str, url: &str) -> String {
    format!("apiexportendpointslice/{slice} {}", kcp_keeper_runtime::redact::url(url))
}

/// One line per advertised URL: ok when the probe resolved it and verified its certificate, else FAIL with what
/// went wrong. A slice advertising nothing is a warning (kcp has no shard serving the export for it yet).
pub fn judge(slice: &Slice, probes: &[Result<String, String>]) -> Vec<Verdict> {
    if slice.urls.is_empty() {
        return vec![Verdict::warn(
            CHECK,
            format!("apiexportendpointslice/{}", slice.name),
            "advertises no endpoint yet",
            "check that the APIExport exists and is bound on a shard (an endpoint appears per shard serving it)",
        )];
    }
    slice
        .urls
        .iter()
        .zip(probes)
        .map(|(url, probe)| match probe {
            Ok(saw) => Verdict::ok(CHECK, subject(&slice.name, url), saw.clone()),
            Err(e) => Verdict::fail(
                CHECK,
                subject(&slice.name, url),
                e.clone(),
                "advertise a URL the providers can reach, on a name the CA bundle's certificate covers: set the \
                 shards' virtual-workspace URL (--shard-virtual-workspace-url) to the public name",
            ),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::Level;
    use serde_json::json;

    #[test]
    fn a_slice_is_its_name_and_urls_and_another_shape_is_an_error_naming_the_field() {
        let s = parse(&json!({"metadata": {"name": "widgets"}, "spec": {"export": {"name": "w"}},
                              "status": {"endpoints": [{"url": "https://kcp.example.com/services/apiexport/x/w"}]}}))
        .unwrap();
        assert_eq!(
            s,
            Slice { name: "widgets".into(), urls: vec!["https://kcp.example.com/services/apiexport/x/w".into()] }
        );
        assert_eq!(parse(&json!({"metadata": {"name": "w"}})).unwrap().urls, Vec::<String>::new());
        assert!(
            parse(&json!({"metadata": {"name": "w"}, "status": {"endpoints": "x"}}))
                .unwrap_err()
                .contains("not a list")
        );
        assert!(
            parse(&json!({"metadata": {"name": "w"}, "status": {"endpoints": [{"url": 1}]}}))
                .unwrap_err()
                .contains("status.endpoints[0].url")
        );
    }

    #[test]
    fn each_url_is_ok_or_fail_by_its_probe_and_a_slice_without_endpoints_warns() {
        let s = Slice { name: "w".into(), urls: vec!["https://a/x".into(), "https://kcp:6443/x".into()] };
        let lines = judge(&s, &[Ok("verified".into()), Err("kcp does not resolve".into())]);
        assert_eq!(lines.iter().map(|v| v.result).collect::<Vec<_>>(), vec![Level::Ok, Level::Fail]);
        assert_eq!(lines[1].subject, "apiexportendpointslice/w https://kcp:6443/x");
        assert!(lines[1].runbook.ends_with("#doctor-endpoint-slices"));
        let empty = judge(&Slice { name: "w".into(), urls: vec![] }, &[]);
        assert_eq!(empty[0].result, Level::Warn);
    }
}
