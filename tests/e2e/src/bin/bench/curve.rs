//! Scale curves: a benchmark measured at several sizes in one invocation, each size with its baseline beside it,
//! and an SVG plot (log-log) of time, requests and peak memory against size, each series labelled with its growth
//! exponent: the slope of a least-squares fit of ln(value) on ln(size) (1 is linear, 0 flat, 2 quadratic).

use std::path::{Path, PathBuf};

use anyhow::Result;
use plotters::prelude::*;

/// One line of a panel: `(size, value)` points; a value of 0 or less (not measured) is left out.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

impl Series {
    pub fn new(label: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        let points = points.into_iter().filter(|(x, y)| *x > 0.0 && *y > 0.0 && y.is_finite()).collect();
        Self { label: label.into(), points }
    }
}

/// One chart of the plot: a measure (its unit on the y axis) and its series.
pub struct Panel {
    pub title: String,
    pub unit: String,
    pub series: Vec<Series>,
}

/// The slope of the least-squares line through `(ln size, ln value)`; None with fewer than two sizes.
pub fn exponent(points: &[(f64, f64)]) -> Option<f64> {
    let logs: Vec<(f64, f64)> =
        points.iter().filter(|(x, y)| *x > 0.0 && *y > 0.0).map(|(x, y)| (x.ln(), y.ln())).collect();
    if logs.len() < 2 {
        return None;
    }
    let n = logs.len() as f64;
    let (mx, my) = (logs.iter().map(|p| p.0).sum::<f64>() / n, logs.iter().map(|p| p.1).sum::<f64>() / n);
    let sxx: f64 = logs.iter().map(|(x, _)| (x - mx).powi(2)).sum();
    let sxy: f64 = logs.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
}

/// A curve's three measures against size, each a set of series (one per program measured).
pub struct Measures {
    pub time: Vec<Series>,
    pub requests: Vec<Series>,
    pub memory: Vec<Series>,
}

/// What every curve ends with: a row per measure giving each series' growth exponent against `size_label`, the
/// exponents as JSON, and the plot (`name`, `title`, the panels' titles for time and requests; memory is VmHWM).
pub fn finish(
    rows: &mut Vec<crate::common::Row>,
    (name, title, size_label): (&str, &str, &str),
    (time_title, requests_title): (&str, &str),
    measures: Measures,
) -> Result<(serde_json::Value, PathBuf)> {
    let Measures { time, requests, memory } = measures;
    let exponents = |all: &[Series]| -> serde_json::Value {
        all.iter().map(|s| (s.label.clone(), serde_json::json!(exponent(&s.points)))).collect()
    };
    let json = serde_json::json!({
        "time": exponents(&time), "requests": exponents(&requests), "peak_memory": exponents(&memory),
    });
    for (what, all) in [("time", &time), ("requests", &requests), ("peak memory", &memory)] {
        let text: Vec<String> =
            all.iter().filter_map(|s| exponent(&s.points).map(|k| format!("{} {k:.2}", s.label))).collect();
        rows.push(crate::common::Row::new(
            format!("growth exponent of {what} against {size_label} (log-log fit)"),
            text.join("; "),
        ));
    }
    let svg = plot(
        name,
        title,
        size_label,
        &[
            Panel { title: time_title.into(), unit: "seconds".into(), series: time },
            Panel { title: requests_title.into(), unit: "requests".into(), series: requests },
            Panel { title: "peak memory (VmHWM)".into(), unit: "MiB".into(), series: memory },
        ],
    )?;
    Ok((json, svg))
}

/// `target/bench/<name>.svg`, and the copy the docs embed, `docs/benchmarks/<name>.svg`.
pub fn svg_paths(name: &str) -> (PathBuf, PathBuf) {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/benchmarks");
    (crate::bench_dir().join(format!("{name}.svg")), docs.join(format!("{name}.svg")))
}

/// Draws the panels side by side, log-log, to `target/bench/<name>.svg` and copies it to `docs/benchmarks/`.
pub fn plot(name: &str, title: &str, size_label: &str, panels: &[Panel]) -> Result<PathBuf> {
    let (path, docs) = svg_paths(name);
    draw(&path, title, size_label, panels)?;
    std::fs::create_dir_all(docs.parent().expect("a file in a directory"))?;
    std::fs::copy(&path, &docs)?;
    Ok(docs)
}

const COLORS: [RGBColor; 4] =
    [RGBColor(31, 119, 180), RGBColor(214, 39, 40), RGBColor(44, 160, 44), RGBColor(148, 103, 189)];

fn draw(path: &Path, title: &str, size_label: &str, panels: &[Panel]) -> Result<()> {
    let root = SVGBackend::new(path, (440 * panels.len().max(1) as u32, 440)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 18))?;
    for (area, panel) in root.split_evenly((1, panels.len().max(1))).iter().zip(panels) {
        let points: Vec<(f64, f64)> = panel.series.iter().flat_map(|s| s.points.iter().copied()).collect();
        if points.is_empty() {
            continue;
        }
        let bounds = |values: &mut dyn Iterator<Item = f64>| {
            let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
            (lo / 1.6)..(hi * 1.6)
        };
        let xs = bounds(&mut points.iter().map(|p| p.0));
        // Room above the highest point for the legend.
        let ys = bounds(&mut points.iter().map(|p| p.1));
        let ys = ys.start..ys.end * 8.0;
        let mut chart = ChartBuilder::on(area)
            .caption(&panel.title, ("sans-serif", 15))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(xs.log_scale(), ys.log_scale())?;
        chart
            .configure_mesh()
            .x_desc(size_label)
            .y_desc(panel.unit.as_str())
            .x_label_formatter(&|v| tick(*v))
            .y_label_formatter(&|v| tick(*v))
            .draw()?;
        for (i, series) in panel.series.iter().enumerate().filter(|(_, s)| !s.points.is_empty()) {
            let color = COLORS[i % COLORS.len()];
            let label = match exponent(&series.points) {
                Some(k) => format!("{} (exponent {k:.2})", series.label),
                None => series.label.clone(),
            };
            chart
                .draw_series(LineSeries::new(series.points.clone(), color.stroke_width(2)))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
            chart.draw_series(series.points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .label_font(("sans-serif", 12))
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// An axis label: whole numbers above 10, else up to three decimals without trailing zeros.
fn tick(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.0}")
    } else {
        let text = format!("{v:.3}");
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_exponent_is_the_slope_of_the_log_log_fit() {
        let linear = [(100.0, 1.0), (1000.0, 10.0), (5000.0, 50.0)];
        assert!((super::exponent(&linear).unwrap() - 1.0).abs() < 1e-9);
        let square = [(10.0, 100.0), (100.0, 10_000.0)];
        assert!((super::exponent(&square).unwrap() - 2.0).abs() < 1e-9);
        assert_eq!(super::exponent(&[(10.0, 1.0)]), None);
    }
}
