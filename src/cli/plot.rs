//! The demo's SVG plot: admitted requests per second, per node and cluster-wide, against
//! the limit and against what `local_only` nodes would have admitted.

use std::path::Path;

use plotters::prelude::*;

/// What to draw.
pub struct Series {
    /// Seconds of load.
    pub seconds: u64,
    /// The limit per window.
    pub limit: u64,
    /// How many nodes.
    pub nodes: usize,
    /// Admitted per second (one window), per node.
    pub admitted: Vec<Vec<u64>>,
    /// What `local_only` nodes would have admitted per second.
    pub local_only: Vec<u64>,
    /// The phases' names (equal lengths).
    pub phases: Vec<String>,
}

/// Write the plot to `path` as SVG.
pub fn write_svg(path: &Path, series: &Series) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (960, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let top = series
        .local_only
        .iter()
        .copied()
        .chain(series.admitted.iter().map(|r| r.iter().sum()))
        .max()
        .unwrap_or(series.limit)
        .max(series.limit);
    let y_max = (top as f64 * 1.1).ceil() as u64;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "ratemesh: {} nodes, one global limit of {} per 1 s window",
                series.nodes, series.limit
            ),
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0u64..series.seconds, 0u64..y_max)?;
    chart
        .configure_mesh()
        .x_desc("seconds (each point: one 1 s window)")
        .y_desc("requests admitted per window")
        .draw()?;

    let step = |values: Vec<u64>| -> Vec<(u64, u64)> {
        values
            .iter()
            .enumerate()
            .flat_map(|(s, &v)| [(s as u64, v), (s as u64 + 1, v)])
            .collect()
    };
    // Phase boundaries.
    let phase_len = series.seconds / series.phases.len().max(1) as u64;
    for (i, name) in series.phases.iter().enumerate() {
        let x = i as u64 * phase_len;
        chart.draw_series(LineSeries::new(
            [(x, 0), (x, y_max)],
            ShapeStyle::from(&RGBColor(200, 200, 200)).stroke_width(1),
        ))?;
        chart.draw_series(std::iter::once(Text::new(
            name.clone(),
            (x, y_max - y_max / 30),
            ("sans-serif", 13).into_font().color(&RGBColor(90, 90, 90)),
        )))?;
    }
    chart
        .draw_series(LineSeries::new(
            [(0, series.limit), (series.seconds, series.limit)],
            ShapeStyle::from(&RED).stroke_width(2),
        ))?
        .label(format!("limit ({})", series.limit))
        .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], RED.stroke_width(2)));
    chart
        .draw_series(LineSeries::new(
            step(series.local_only.clone()),
            ShapeStyle::from(&RGBColor(150, 150, 150)).stroke_width(2),
        ))?
        .label("local_only would admit")
        .legend(|(x, y)| {
            PathElement::new(
                [(x, y), (x + 18, y)],
                RGBColor(150, 150, 150).stroke_width(2),
            )
        });
    chart
        .draw_series(LineSeries::new(
            step(series.admitted.iter().map(|r| r.iter().sum()).collect()),
            ShapeStyle::from(&BLACK).stroke_width(3),
        ))?
        .label("cluster total (ratemesh)")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], BLACK.stroke_width(3)));
    for node in 0..series.nodes {
        // Not red: red is the limit.
        const COLORS: [(u8, u8, u8); 9] = [
            (31, 119, 180),
            (44, 160, 44),
            (255, 127, 14),
            (148, 103, 189),
            (140, 86, 75),
            (227, 119, 194),
            (23, 190, 207),
            (188, 189, 34),
            (127, 127, 127),
        ];
        let (r, g, b) = COLORS[node % COLORS.len()];
        let color = RGBColor(r, g, b);
        chart
            .draw_series(LineSeries::new(
                step(series.admitted.iter().map(|r| r[node]).collect()),
                ShapeStyle::from(&color).stroke_width(2),
            ))?
            .label(format!("node {}", node + 1))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::MiddleRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
