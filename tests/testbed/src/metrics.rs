//! Reading an agent's `/metrics` in tests: a series that is missing is an error, never 0.

use anyhow::Result;

/// The value of the one series whose line starts with `series` (name and labels as exported).
pub fn value(text: &str, series: &str) -> Result<f64> {
    let values: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with(series))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .collect();
    match values[..] {
        [value] => Ok(value),
        [] => anyhow::bail!("no series {series} in\n{text}"),
        _ => anyhow::bail!("{} series match {series}", values.len()),
    }
}

/// Scrapes `<admin_url>/metrics`; empty on a failed scrape (then every [`value`] is an error).
pub async fn scrape(admin_url: &str) -> String {
    crate::http::get(&format!("{admin_url}/metrics")).await.map(|(_, _, body)| body).unwrap_or_default()
}
