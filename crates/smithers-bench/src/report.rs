//! Report output: Markdown sections in `bench/RESULTS.md` (each scenario replaces its own
//! section, so scenarios can be re-run one at a time) and one SVG bar chart per scenario.

use std::fmt::Write as _;
use std::path::Path;

/// A Markdown table.
#[derive(Debug, Default)]
pub struct Table {
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Self {
        Table {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn to_markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "| {} |", self.header.join(" | "));
        let _ = writeln!(out, "|{}", "---|".repeat(self.header.len()));
        for row in &self.rows {
            let _ = writeln!(out, "| {} |", row.join(" | "));
        }
        out
    }
}

/// The machine line every report carries (cores, kernel, CPU model).
pub fn machine_line() -> String {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".to_string());
    format!("{cores} cores, Linux {}, {cpu}", kernel.trim())
}

/// Replaces (or appends) the section `## <title>` of the results file with `body`.
pub fn write_section(results: &Path, title: &str, body: &str) -> anyhow::Result<()> {
    let existing = std::fs::read_to_string(results).unwrap_or_else(|_| {
        "# Benchmark results\n\nMade by `cargo run --release -p smithers-bench -- <scenario>`; \
         every ratio is the median of per-round ratios measured side by side in one run \
         (see ../shared/design/performance.md).\n"
            .to_string()
    });
    let heading = format!("## {title}\n");
    let mut out = String::new();
    let mut replaced = false;
    let mut skipping = false;
    for line in existing.split_inclusive('\n') {
        if line == heading {
            out.push_str(&heading);
            out.push('\n');
            out.push_str(body.trim_end());
            out.push_str("\n\n");
            replaced = true;
            skipping = true;
            continue;
        }
        // The generated part ends at the next section, or at a subsection of notes written
        // by hand (experiments, history), which a new run keeps.
        if skipping && (line.starts_with("## ") || line.starts_with("### ")) {
            skipping = false;
        }
        if !skipping {
            out.push_str(line);
        }
    }
    if !replaced {
        if !out.ends_with("\n\n") {
            out.push('\n');
        }
        out.push_str(&heading);
        out.push('\n');
        out.push_str(body.trim_end());
        out.push('\n');
    }
    if let Some(dir) = results.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(results, out.trim_end().to_string() + "\n")?;
    Ok(())
}

/// A horizontal bar chart (log scale when values span more than two decades), plain SVG with
/// no dependencies. `bars` are (label, value in ms, highlight).
pub fn bar_chart_svg(title: &str, unit: &str, bars: &[(String, f64, bool)]) -> String {
    let width = 820.0;
    let label_w = 300.0;
    let bar_h = 22.0;
    let gap = 8.0;
    let top = 40.0;
    let height = top + bars.len() as f64 * (bar_h + gap) + 30.0;
    let max = bars.iter().map(|b| b.1).fold(0.0_f64, f64::max).max(1e-9);
    let min = bars
        .iter()
        .map(|b| b.1)
        .filter(|v| *v > 0.0)
        .fold(f64::INFINITY, f64::min);
    let log = min.is_finite() && max / min > 100.0;
    let scale = |v: f64| -> f64 {
        let plot = width - label_w - 120.0;
        if log {
            let lo = (min / 2.0).log10();
            ((v.max(min / 2.0).log10() - lo) / (max.log10() - lo)).max(0.02) * plot
        } else {
            (v / max).max(0.005) * plot
        }
    };
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="13">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="10" y="24" font-size="16" font-weight="bold">{}</text>"#,
        escape(&format!("{title}{}", if log { " (log scale)" } else { "" }))
    );
    for (i, (label, value, highlight)) in bars.iter().enumerate() {
        let y = top + i as f64 * (bar_h + gap);
        let w = scale(*value);
        let color = if *highlight { "#2b7bb9" } else { "#9aa5b1" };
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            label_w - 8.0,
            y + bar_h * 0.7,
            escape(label)
        );
        let _ = writeln!(
            svg,
            r#"<rect x="{label_w}" y="{y}" width="{w:.1}" height="{bar_h}" fill="{color}"/>"#
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{}">{value:.2} {unit}</text>"#,
            label_w + w + 6.0,
            y + bar_h * 0.7
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_are_replaced_in_place() {
        let dir = std::env::temp_dir().join(format!("smithers-bench-test-{}", std::process::id()));
        let file = dir.join("RESULTS.md");
        let _ = std::fs::remove_file(&file);
        write_section(&file, "A", "one").unwrap();
        write_section(&file, "B", "two").unwrap();
        write_section(&file, "A", "uno").unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.contains("## A\n\nuno\n"), "{text}");
        assert!(text.contains("## B\n\ntwo"), "{text}");
        assert!(!text.contains("\none\n"), "{text}");
        assert!(text.find("## A").unwrap() < text.find("## B").unwrap());
        // Notes written by hand under a section's `###` heading outlive a new run.
        let with_notes = text.replace("## B\n\ntwo\n", "## B\n\ntwo\n\n### Notes\n\nkept\n");
        std::fs::write(&file, with_notes).unwrap();
        write_section(&file, "B", "dos").unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(
            text.contains("## B\n\ndos\n\n### Notes\n\nkept\n"),
            "{text}"
        );
        assert!(!text.contains("two"), "{text}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn svg_has_a_bar_per_value() {
        let svg = bar_chart_svg(
            "t",
            "ms",
            &[("a".into(), 1.0, true), ("b<".into(), 1000.0, false)],
        );
        assert_eq!(svg.matches("<rect x=").count(), 2);
        assert!(svg.contains("b&lt;"));
        assert!(svg.contains("log scale"));
    }
}
