//! Small SVG charts written by hand (no fonts, no scripts, no network):
//! line charts on linear or log axes, and stacked horizontal bars. Each
//! chart is one `<svg>` element with an `id`, ready to inline in HTML.

use std::fmt::Write;

/// Chart size in CSS pixels, without a line chart's legend (which goes
/// below, growing the chart).
const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 340.0;
const LEFT: f64 = 72.0;
const RIGHT: f64 = 28.0;
const TOP: f64 = 34.0;
const BOTTOM: f64 = 48.0;
/// Height of one row of legend entries.
const LEGEND_ROW: f64 = 16.0;
/// Width allowed per character of legend text: more than an 11 px
/// sans-serif glyph needs, so entries never run into each other.
const LEGEND_CHAR: f64 = 7.0;

/// Colours for series, in order; they repeat after eight.
pub const PALETTE: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// An axis scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// Linear from the data's lowest value (or 0) to its highest.
    Linear,
    /// Base-10 logarithmic; values <= 0 are left out.
    Log,
}

/// One line of a line chart.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// (x, y) points in data units, in drawing order.
    pub points: Vec<(f64, f64)>,
    /// Dashed instead of solid.
    pub dashed: bool,
    /// Index into [`PALETTE`].
    pub colour: usize,
    /// Error bars: (x, low, high) in data units, drawn with a dot at each
    /// point.
    pub intervals: Vec<(f64, f64, f64)>,
}

/// A labelled span of the x axis, `[from, to)` in data units, drawn
/// under the lines (a fault window, a load step, a marked value).
#[derive(Clone, Debug, PartialEq)]
pub struct Band {
    pub from: f64,
    pub to: f64,
    /// Written at the top of the span (a step's: at the bottom).
    pub label: String,
    pub kind: BandKind,
}

/// How a band is drawn. Labels never cover each other: one that would
/// overlap a label already placed goes a row further in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BandKind {
    /// Shaded, labelled at the top (a fault window): where windows overlap
    /// the shading adds up.
    Window,
    /// Tinted every other one, with a line where it starts, labelled at
    /// the bottom (a load step: steps tile the axis, so shading them all
    /// alike would show nothing).
    Step,
    /// A dashed line at `from` (`to` is not used), labelled at the top (a
    /// value to point out, as a knee).
    Mark,
}

/// A chart's axes: their labels, scales and how their ticks are written.
#[derive(Clone, Copy, Debug)]
pub struct Frame<'a> {
    /// X axis label.
    pub x_label: &'a str,
    /// Y axis label.
    pub y_label: &'a str,
    /// X scale.
    pub x_scale: Scale,
    /// Y scale.
    pub y_scale: Scale,
    /// How x tick values are written (e.g. "99.9%" for 1000).
    pub x_format: fn(f64) -> String,
    /// How y tick values are written.
    pub y_format: fn(f64) -> String,
}

/// A line chart.
#[derive(Clone, Debug)]
pub struct LineChart<'a> {
    /// The `id` attribute of the `<svg>`.
    pub id: &'a str,
    /// Title above the plot.
    pub title: &'a str,
    pub frame: Frame<'a>,
    /// The x axis's bounds in data units, exactly (points outside them are
    /// the caller's to leave out); `None`: the data's range, a linear axis
    /// rounded up to a nice value.
    pub x_range: Option<(f64, f64)>,
    pub series: Vec<Series>,
    /// Spans shaded under the lines, clipped to the plot.
    pub bands: Vec<Band>,
}

/// Escapes text for XML content and attributes.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Maps data values to pixels along one axis.
struct Axis {
    scale: Scale,
    lo: f64,
    hi: f64,
    from: f64,
    to: f64,
}

impl Axis {
    fn new(scale: Scale, values: impl Iterator<Item = f64>, from: f64, to: f64) -> Axis {
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for v in values.filter(|v| v.is_finite() && (scale == Scale::Linear || *v > 0.0)) {
            lo = lo.min(v);
            hi = hi.max(v);
        }
        if !lo.is_finite() {
            (lo, hi) = (1.0, 10.0);
        }
        match scale {
            Scale::Linear => {
                lo = lo.min(0.0);
                hi = nice_ceiling(hi.max(lo + 1e-9));
            }
            Scale::Log => {
                lo = 10f64.powf(lo.log10().floor());
                hi = 10f64.powf(hi.log10().ceil().max(lo.log10() + 1.0));
            }
        }
        Axis {
            scale,
            lo,
            hi,
            from,
            to,
        }
    }

    /// An axis from `lo` to `hi` exactly (when they make a range on
    /// `scale`; otherwise the one [`Axis::new`] finds for them).
    fn fixed(scale: Scale, (lo, hi): (f64, f64), from: f64, to: f64) -> Axis {
        let usable =
            lo.is_finite() && hi.is_finite() && lo < hi && (scale == Scale::Linear || lo > 0.0);
        if usable {
            Axis {
                scale,
                lo,
                hi,
                from,
                to,
            }
        } else {
            Axis::new(scale, [lo, hi].into_iter(), from, to)
        }
    }

    fn pos(&self, v: f64) -> Option<f64> {
        let t = match self.scale {
            Scale::Linear => (v - self.lo) / (self.hi - self.lo),
            Scale::Log if v > 0.0 => {
                (v.log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10())
            }
            Scale::Log => return None,
        };
        t.is_finite()
            .then_some(self.from + t * (self.to - self.from))
    }

    fn ticks(&self) -> Vec<f64> {
        match self.scale {
            Scale::Log => {
                let (a, b) = (
                    self.lo.log10().round() as i32,
                    self.hi.log10().round() as i32,
                );
                (a..=b).map(|e| 10f64.powi(e)).collect()
            }
            Scale::Linear => {
                let step = nice_step((self.hi - self.lo) / 5.0);
                let mut ticks = Vec::new();
                let mut v = (self.lo / step).ceil() * step;
                while v <= self.hi + step * 1e-9 && ticks.len() < 20 {
                    ticks.push(v);
                    v += step;
                }
                ticks
            }
        }
    }
}

/// The smallest 1, 2 or 5 times a power of ten that is >= `v`.
fn nice_step(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|s| *s >= v)
        .unwrap_or(10.0 * p)
}

/// `v` rounded up to a multiple of a nice step.
fn nice_ceiling(v: f64) -> f64 {
    let step = nice_step(v / 5.0);
    (v / step).ceil() * step
}

fn open(out: &mut String, id: &str, title: &str, height: f64) {
    let _ = write!(
        out,
        r##"<svg id="{}" class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img" aria-label="{}"><rect width="100%" height="100%" fill="#fff"/><text x="{}" y="20" class="title">{}</text>"##,
        escape(id),
        escape(title),
        LEFT,
        escape(title)
    );
}

/// Where each legend entry goes: rows from `top` down (below the x axis
/// label, outside the plot), left to right from the plot's left edge and
/// wrapping at its right edge. Returns each entry's (x, y) (the sample
/// line's left end) and the chart's height with the legend.
fn legend_layout(names: &[&str], top: f64) -> (Vec<(f64, f64)>, f64) {
    let first_row = top + LEGEND_ROW / 2.0;
    let (mut x, mut y) = (LEFT, first_row);
    let mut at = Vec::with_capacity(names.len());
    for name in names {
        let width = legend_width(name);
        if x > LEFT && x + width > WIDTH - RIGHT {
            (x, y) = (LEFT, y + LEGEND_ROW);
        }
        at.push((x, y));
        x += width + 18.0;
    }
    let height = at.last().map_or(top, |(_, y)| y + LEGEND_ROW / 2.0 + 4.0);
    (at, height)
}

/// The width of a legend entry: sample line, gap, text.
fn legend_width(name: &str) -> f64 {
    22.0 + LEGEND_CHAR * name.chars().count() as f64
}

fn legend(out: &mut String, entries: &[(String, usize, bool)], at: &[(f64, f64)]) {
    out.push_str(r#"<g class="legend">"#);
    for ((name, colour, dashed), &(x, y)) in entries.iter().zip(at) {
        let dash = if *dashed {
            r#" stroke-dasharray="5 3""#
        } else {
            ""
        };
        let _ = write!(
            out,
            r#"<line x1="{x}" y1="{y}" x2="{}" y2="{y}" stroke="{}" stroke-width="2"{dash}/><text x="{}" y="{}" class="legend">{}</text>"#,
            x + 18.0,
            PALETTE[colour % PALETTE.len()],
            x + 22.0,
            y + 4.0,
            escape(name)
        );
    }
    out.push_str("</g>");
}

/// Renders a line chart.
pub fn line_chart(chart: &LineChart<'_>) -> String {
    let points = || chart.series.iter().flat_map(|s| s.points.iter());
    let bars = || chart.series.iter().flat_map(|s| s.intervals.iter());
    let x = match chart.x_range {
        Some(range) => Axis::fixed(chart.frame.x_scale, range, LEFT, WIDTH - RIGHT),
        None => Axis::new(
            chart.frame.x_scale,
            points().map(|p| p.0),
            LEFT,
            WIDTH - RIGHT,
        ),
    };
    let y = Axis::new(
        chart.frame.y_scale,
        points().map(|p| p.1).chain(bars().flat_map(|b| [b.1, b.2])),
        HEIGHT - BOTTOM,
        TOP,
    );
    let names: Vec<&str> = chart.series.iter().map(|s| s.name.as_str()).collect();
    let (legend_at, height) = legend_layout(&names, HEIGHT);
    let mut out = String::new();
    open(&mut out, chart.id, chart.title, height);
    grid(&mut out, &x, &y, chart.frame.x_format, chart.frame.y_format);
    axes(&mut out, chart.frame.x_label, chart.frame.y_label);
    let labels = bands(&mut out, &chart.bands, &x);
    for s in &chart.series {
        polyline(&mut out, s, &x, &y, 2.0);
    }
    for s in &chart.series {
        let colour = PALETTE[s.colour % PALETTE.len()];
        for &(bx, lo, hi) in &s.intervals {
            if let (Some(px), Some(py0), Some(py1)) = (x.pos(bx), y.pos(lo), y.pos(hi)) {
                let _ = write!(
                    out,
                    r#"<path class="interval" d="M{px:.1} {py0:.1}V{py1:.1}M{:.1} {py0:.1}h8M{:.1} {py1:.1}h8" stroke="{colour}" stroke-width="1.5" fill="none"/>"#,
                    px - 4.0,
                    px - 4.0
                );
            }
        }
        if !s.intervals.is_empty() {
            for &(px, py) in &s.points {
                if let (Some(px), Some(py)) = (x.pos(px), y.pos(py)) {
                    let _ = write!(
                        out,
                        r#"<circle cx="{px:.1}" cy="{py:.1}" r="3" fill="{colour}"/>"#
                    );
                }
            }
        }
    }
    band_labels(&mut out, &labels);
    let entries: Vec<_> = chart
        .series
        .iter()
        .map(|s| (s.name.clone(), s.colour, s.dashed))
        .collect();
    legend(&mut out, &entries, &legend_at);
    out.push_str("</svg>");
    out
}

/// The plot's grid lines and tick labels, over the pixels `x` and `y` span
/// (x from its `from` to its `to`, y from its `from`, the bottom, to its
/// `to`, the top).
fn grid(
    out: &mut String,
    x: &Axis,
    y: &Axis,
    x_format: fn(f64) -> String,
    y_format: fn(f64) -> String,
) {
    let (left, right, bottom, top) = (x.from, x.to, y.from, y.to);
    for t in x.ticks() {
        if let Some(px) = x.pos(t) {
            let _ = write!(
                out,
                r#"<line x1="{px:.1}" y1="{top}" x2="{px:.1}" y2="{bottom}" class="grid"/><text x="{px:.1}" y="{}" class="tick" text-anchor="middle">{}</text>"#,
                bottom + 16.0,
                escape(&x_format(t))
            );
        }
    }
    for t in y.ticks() {
        if let Some(py) = y.pos(t) {
            let _ = write!(
                out,
                r#"<line x1="{left}" y1="{py:.1}" x2="{right}" y2="{py:.1}" class="grid"/><text x="{}" y="{:.1}" class="tick" text-anchor="end">{}</text>"#,
                left - 6.0,
                py + 4.0,
                escape(&y_format(t))
            );
        }
    }
}

/// One series as a polyline `width` pixels wide (nothing when none of its
/// points can be placed).
fn polyline(out: &mut String, s: &Series, x: &Axis, y: &Axis, width: f64) {
    let path: Vec<String> = s
        .points
        .iter()
        .filter_map(|&(a, b)| Some(format!("{:.1},{:.1}", x.pos(a)?, y.pos(b)?)))
        .collect();
    if path.is_empty() {
        return;
    }
    let dash = if s.dashed {
        r#" stroke-dasharray="5 3""#
    } else {
        ""
    };
    let _ = write!(
        out,
        r#"<polyline class="series" data-series="{}" points="{}" fill="none" stroke="{}" stroke-width="{width}"{dash}/>"#,
        escape(&s.name),
        path.join(" "),
        PALETTE[s.colour % PALETTE.len()]
    );
}

/// Height of one row of band labels.
const BAND_ROW: f64 = 13.0;

/// A band's label, placed: its left end, baseline and text.
struct BandLabel {
    x: f64,
    y: f64,
    text: String,
}

/// Draws each band over the plot's height (clipped to it) and returns
/// where their labels go, to be written over the lines.
fn bands(out: &mut String, bands: &[Band], x: &Axis) -> Vec<BandLabel> {
    let (left, right) = (LEFT, WIDTH - RIGHT);
    let (top, bottom) = (TOP, HEIGHT - BOTTOM);
    let mut top_rows = LabelRows::default();
    let mut bottom_rows = LabelRows::default();
    let mut labels = Vec::new();
    let mut steps = 0;
    for b in bands {
        let label = escape(&b.label);
        let at = match b.kind {
            BandKind::Mark => {
                let Some(a) = x.pos(b.from).filter(|a| (left..=right).contains(a)) else {
                    continue;
                };
                let _ = write!(
                    out,
                    r##"<line class="band-mark" x1="{a:.1}" y1="{top}" x2="{a:.1}" y2="{bottom}" stroke="#555" stroke-width="1.5" stroke-dasharray="4 3"><title>{label}</title></line>"##,
                );
                a
            }
            BandKind::Window | BandKind::Step => {
                let (Some(a), Some(z)) = (x.pos(b.from), x.pos(b.to)) else {
                    continue;
                };
                let (a, z) = (a.clamp(left, right), z.clamp(left, right));
                if z <= a {
                    continue;
                }
                let (fill, opacity) = match b.kind {
                    BandKind::Step => {
                        steps += 1;
                        ("#1f77b4", if steps % 2 == 1 { 0.08 } else { 0.02 })
                    }
                    _ => ("#888", 0.15),
                };
                let _ = write!(
                    out,
                    r#"<rect class="band" x="{a:.1}" y="{top}" width="{:.1}" height="{}" fill="{fill}" fill-opacity="{opacity}"><title>{label}</title></rect>"#,
                    z - a,
                    bottom - top,
                );
                if b.kind == BandKind::Step && a > left {
                    let _ = write!(
                        out,
                        r##"<line class="band-edge" x1="{a:.1}" y1="{top}" x2="{a:.1}" y2="{bottom}" stroke="#1f77b4" stroke-opacity="0.4"/>"##,
                    );
                }
                a
            }
        };
        let width = LEGEND_CHAR * b.label.chars().count() as f64;
        let from = (at + 3.0).min(right - width).max(left);
        let (x, y) = if b.kind == BandKind::Step {
            let row = bottom_rows.place(from, from + width);
            (from, bottom - 5.0 - row as f64 * BAND_ROW)
        } else {
            let row = top_rows.place(from, from + width);
            (from, top + 12.0 + row as f64 * BAND_ROW)
        };
        labels.push(BandLabel { x, y, text: label });
    }
    labels
}

/// Writes the bands' labels, with a white halo so that they read over
/// the lines.
fn band_labels(out: &mut String, labels: &[BandLabel]) {
    for l in labels {
        let _ = write!(
            out,
            r##"<text class="tick band-label" x="{:.1}" y="{:.1}" stroke="#fff" stroke-width="3" paint-order="stroke">{}</text>"##,
            l.x, l.y, l.text
        );
    }
}

/// Rows of labels, each holding the x extents placed in it.
#[derive(Default)]
struct LabelRows {
    rows: Vec<Vec<(f64, f64)>>,
}

impl LabelRows {
    /// The most rows: past them, labels share the last one (a dozen
    /// overlapping windows cannot all be read at once anyway).
    const MOST: usize = 8;

    /// The first row where `[from, to]` (plus a gap) touches no label
    /// already placed; takes it.
    fn place(&mut self, from: f64, to: f64) -> usize {
        const GAP: f64 = 6.0;
        let free =
            |row: &Vec<(f64, f64)>| row.iter().all(|&(a, z)| to + GAP <= a || z + GAP <= from);
        let row = self
            .rows
            .iter()
            .position(free)
            .unwrap_or(self.rows.len())
            .min(Self::MOST - 1);
        if row == self.rows.len() {
            self.rows.push(Vec::new());
        }
        self.rows[row].push((from, to));
        row
    }
}

fn axes(out: &mut String, x_label: &str, y_label: &str) {
    let _ = write!(
        out,
        r#"<line x1="{LEFT}" y1="{b}" x2="{r}" y2="{b}" class="axis"/><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{b}" class="axis"/><text x="{cx}" y="{}" class="label" text-anchor="middle">{}</text><text transform="translate(12 {cy}) rotate(-90)" class="label" text-anchor="middle">{}</text>"#,
        HEIGHT - 8.0,
        escape(x_label),
        escape(y_label),
        b = HEIGHT - BOTTOM,
        r = WIDTH - RIGHT,
        cx = (LEFT + WIDTH - RIGHT) / 2.0,
        cy = (TOP + HEIGHT - BOTTOM) / 2.0,
    );
}

/// Small multiples: a grid of small line charts (panels) on one pair of
/// shared axes, so that a line means the same in every panel, with one
/// legend for all. A series' colour and dash are its own: give a series
/// that recurs across panels (a variant) the same name, colour and dash in
/// each, and the legend lists it once.
#[derive(Clone, Debug)]
pub struct SmallMultiples<'a> {
    /// The `id` attribute of the `<svg>`.
    pub id: &'a str,
    /// Title above the grid.
    pub title: &'a str,
    /// Every panel's axes; their labels are written once, below and left
    /// of the grid.
    pub frame: Frame<'a>,
    /// Panels per row (at least 1).
    pub columns: usize,
    /// The panels, left to right, then top to bottom.
    pub panels: Vec<Panel>,
}

/// One panel of [`SmallMultiples`].
#[derive(Clone, Debug)]
pub struct Panel {
    /// Written above the panel's plot.
    pub title: String,
    pub series: Vec<Series>,
}

/// A panel's size in CSS pixels, and its plot's margins within it.
const PANEL_HEIGHT: f64 = 200.0;
const PANEL_LEFT: f64 = 52.0;
const PANEL_RIGHT: f64 = 22.0;
const PANEL_TOP: f64 = 24.0;
const PANEL_BOTTOM: f64 = 26.0;
/// Room left of the grid for the y axis label.
const GRID_LEFT: f64 = 22.0;

/// Renders small multiples: the axes' ranges are those of all panels'
/// points together; each panel is a `<g class="panel">` with its title
/// in `data-panel`.
pub fn small_multiples(chart: &SmallMultiples<'_>) -> String {
    let columns = chart.columns.clamp(1, chart.panels.len().max(1));
    let rows = chart.panels.len().div_ceil(columns);
    let cell_width = (WIDTH - GRID_LEFT) / columns as f64;
    let points = || {
        chart
            .panels
            .iter()
            .flat_map(|p| p.series.iter())
            .flat_map(|s| s.points.iter())
    };
    // The shared ranges; each panel maps them onto its own pixels.
    let x_range = Axis::new(chart.frame.x_scale, points().map(|p| p.0), 0.0, 1.0);
    let y_range = Axis::new(chart.frame.y_scale, points().map(|p| p.1), 0.0, 1.0);
    let grid_bottom = TOP + rows as f64 * PANEL_HEIGHT;
    let mut entries: Vec<(String, usize, bool)> = Vec::new();
    for s in chart.panels.iter().flat_map(|p| p.series.iter()) {
        if !entries.iter().any(|(name, _, _)| *name == s.name) {
            entries.push((s.name.clone(), s.colour, s.dashed));
        }
    }
    let names: Vec<&str> = entries.iter().map(|(name, _, _)| name.as_str()).collect();
    let (legend_at, height) = legend_layout(&names, grid_bottom + 26.0);
    let mut out = String::new();
    open(&mut out, chart.id, chart.title, height);
    for (i, panel) in chart.panels.iter().enumerate() {
        let left = GRID_LEFT + (i % columns) as f64 * cell_width;
        let top = TOP + (i / columns) as f64 * PANEL_HEIGHT;
        let (l, r) = (left + PANEL_LEFT, left + cell_width - PANEL_RIGHT);
        let (t, b) = (top + PANEL_TOP, top + PANEL_HEIGHT - PANEL_BOTTOM);
        let x = Axis::fixed(chart.frame.x_scale, (x_range.lo, x_range.hi), l, r);
        let y = Axis::fixed(chart.frame.y_scale, (y_range.lo, y_range.hi), b, t);
        let _ = write!(
            out,
            r#"<g class="panel" data-panel="{title}"><text x="{l}" y="{:.1}" class="label">{title}</text>"#,
            top + PANEL_TOP - 8.0,
            title = escape(&panel.title),
        );
        grid(&mut out, &x, &y, chart.frame.x_format, chart.frame.y_format);
        let _ = write!(
            out,
            r#"<line x1="{l}" y1="{b}" x2="{r}" y2="{b}" class="axis"/><line x1="{l}" y1="{t}" x2="{l}" y2="{b}" class="axis"/>"#,
        );
        for s in &panel.series {
            polyline(&mut out, s, &x, &y, 1.5);
        }
        out.push_str("</g>");
    }
    let _ = write!(
        out,
        r#"<text x="{:.1}" y="{:.1}" class="label" text-anchor="middle">{}</text><text transform="translate(12 {:.1}) rotate(-90)" class="label" text-anchor="middle">{}</text>"#,
        (GRID_LEFT + WIDTH) / 2.0,
        grid_bottom + 16.0,
        escape(chart.frame.x_label),
        (TOP + grid_bottom) / 2.0,
        escape(chart.frame.y_label),
    );
    legend(&mut out, &entries, &legend_at);
    out.push_str("</svg>");
    out
}

/// Horizontal bars, each split into coloured segments.
#[derive(Clone, Debug)]
pub struct StackedBars<'a> {
    /// The `id` attribute of the `<svg>`.
    pub id: &'a str,
    /// Title above the plot.
    pub title: &'a str,
    /// Label of the value axis.
    pub x_label: &'a str,
    /// How values are written.
    pub x_format: fn(f64) -> String,
    /// Segment names, in stacking order.
    pub segments: Vec<String>,
    /// One bar per entry: its label and one value per segment.
    pub bars: Vec<(String, Vec<f64>)>,
}

/// Renders stacked horizontal bars; the chart grows with the bar count.
pub fn stacked_bars(chart: &StackedBars<'_>) -> String {
    const BAR: f64 = 18.0;
    const GAP: f64 = 8.0;
    const LABELS: f64 = 170.0;
    let height = TOP + 30.0 + chart.bars.len() as f64 * (BAR + GAP) + BOTTOM;
    let total = |v: &[f64]| v.iter().filter(|x| x.is_finite() && **x > 0.0).sum::<f64>();
    let most = chart.bars.iter().map(|(_, v)| total(v)).fold(0.0, f64::max);
    let x = Axis::new(
        Scale::Linear,
        [0.0, most].into_iter(),
        LEFT + LABELS,
        WIDTH - RIGHT,
    );
    let mut out = String::new();
    let _ = write!(
        out,
        r##"<svg id="{}" class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img" aria-label="{}"><rect width="100%" height="100%" fill="#fff"/><text x="{}" y="20" class="title">{}</text>"##,
        escape(chart.id),
        escape(chart.title),
        LEFT,
        escape(chart.title)
    );
    let mut lx = LEFT + LABELS;
    for (i, name) in chart.segments.iter().enumerate() {
        let _ = write!(
            out,
            r#"<rect x="{lx}" y="{}" width="12" height="12" fill="{}"/><text x="{}" y="{}" class="legend">{}</text>"#,
            TOP - 4.0,
            PALETTE[i % PALETTE.len()],
            lx + 16.0,
            TOP + 6.0,
            escape(name)
        );
        lx += 22.0 + 7.0 * name.len() as f64;
    }
    let bottom = height - BOTTOM;
    for t in x.ticks() {
        if let Some(px) = x.pos(t) {
            let _ = write!(
                out,
                r#"<line x1="{px:.1}" y1="{}" x2="{px:.1}" y2="{bottom}" class="grid"/><text x="{px:.1}" y="{}" class="tick" text-anchor="middle">{}</text>"#,
                TOP + 20.0,
                bottom + 16.0,
                escape(&(chart.x_format)(t))
            );
        }
    }
    for (row, (label, values)) in chart.bars.iter().enumerate() {
        let y = TOP + 30.0 + row as f64 * (BAR + GAP);
        let _ = write!(
            out,
            r#"<text x="{}" y="{}" class="tick" text-anchor="end">{}</text>"#,
            LEFT + LABELS - 6.0,
            y + BAR * 0.7,
            escape(label)
        );
        let mut at = 0.0;
        for (i, v) in values.iter().enumerate() {
            let v = if v.is_finite() && *v > 0.0 { *v } else { 0.0 };
            if let (Some(a), Some(b)) = (x.pos(at), x.pos(at + v)) {
                let _ = write!(
                    out,
                    r#"<rect class="segment" x="{a:.1}" y="{y:.1}" width="{:.1}" height="{BAR}" fill="{}"><title>{}: {}</title></rect>"#,
                    (b - a).max(0.0),
                    PALETTE[i % PALETTE.len()],
                    escape(&format!(
                        "{label} {}",
                        chart.segments.get(i).map_or("", String::as_str)
                    )),
                    escape(&(chart.x_format)(v))
                );
            }
            at += v;
        }
    }
    let _ = write!(
        out,
        r#"<text x="{}" y="{}" class="label" text-anchor="middle">{}</text></svg>"#,
        (LEFT + LABELS + WIDTH - RIGHT) / 2.0,
        height - 8.0,
        escape(chart.x_label)
    );
    out
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    fn fmt(v: f64) -> String {
        format!("{v}")
    }

    /// Linear axes "x" and "y", ticks written as they are.
    const LINEAR: Frame<'static> = Frame {
        x_label: "x",
        y_label: "y",
        x_scale: Scale::Linear,
        y_scale: Scale::Linear,
        x_format: fmt,
        y_format: fmt,
    };

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(0.7), 1.0);
        assert_eq!(nice_step(1.3), 2.0);
        assert_eq!(nice_step(3.0), 5.0);
        assert_eq!(nice_step(7.0), 10.0);
        assert_eq!(nice_step(230.0), 500.0);
    }

    #[test]
    fn log_axes_span_whole_decades_and_place_points() {
        let a = Axis::new(Scale::Log, [3.0, 450.0].into_iter(), 0.0, 300.0);
        assert_eq!((a.lo, a.hi), (1.0, 1000.0));
        assert_eq!(a.ticks(), vec![1.0, 10.0, 100.0, 1000.0]);
        assert_eq!(a.pos(10.0).map(|p| p.round()), Some(100.0));
        assert_eq!(a.pos(0.0), None);
    }

    #[test]
    fn a_line_chart_has_one_polyline_per_series_and_escapes_text() {
        let chart = LineChart {
            id: "c1",
            title: "a <b> & c",
            frame: Frame {
                x_label: "x",
                y_label: "y",
                x_scale: Scale::Log,
                y_scale: Scale::Linear,
                x_format: fmt,
                y_format: fmt,
            },
            x_range: None,
            bands: Vec::new(),
            series: vec![
                Series {
                    name: "push".into(),
                    points: vec![(1.0, 1.0), (10.0, 3.0)],
                    dashed: false,
                    colour: 0,
                    intervals: Vec::new(),
                },
                Series {
                    name: "pull".into(),
                    points: vec![(1.0, 2.0), (100.0, 4.0)],
                    dashed: true,
                    colour: 1,
                    intervals: Vec::new(),
                },
            ],
        };
        let svg = line_chart(&chart);
        assert!(svg.starts_with("<svg id=\"c1\"") && svg.ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("a &lt;b&gt; &amp; c"));
        assert!(!svg.contains("a <b>"));
    }

    /// The value of attribute `name` in the tag starting at `tag`.
    fn attr(tag: &str, name: &str) -> Option<f64> {
        let key = format!(" {name}=\"");
        let from = tag.find(&key)? + key.len();
        let len = tag[from..].find('"')?;
        tag[from..from + len].parse().ok()
    }

    /// (left, top, right, bottom) of every `<line>` of `svg` with
    /// `class="{class}"`, as emitted.
    fn lines_of_class(svg: &str, class: &str) -> Vec<(f64, f64, f64, f64)> {
        svg.split("<line")
            .skip(1)
            .filter(|tag| tag.contains(&format!("class=\"{class}\"")))
            .map(|tag| {
                let c = |n| attr(tag, n).unwrap_or_else(|| panic!("no {n} in {tag}"));
                let (x1, y1, x2, y2) = (c("x1"), c("y1"), c("x2"), c("y2"));
                (x1.min(x2), y1.min(y2), x1.max(x2), y1.max(y2))
            })
            .collect()
    }

    fn intersects(a: (f64, f64, f64, f64), b: (f64, f64, f64, f64)) -> bool {
        a.0 < b.2 && b.0 < a.2 && a.1 < b.3 && b.1 < a.3
    }

    #[test]
    fn the_legend_sits_outside_the_plot_and_inside_the_chart() {
        let series = (0..7)
            .map(|i| Series {
                name: format!("variant number {i} with a long name"),
                // Data up to the top right corner, where a legend used to be.
                points: vec![(0.0, 0.0), (10.0, 100.0)],
                dashed: i % 2 == 1,
                colour: i,
                intervals: Vec::new(),
            })
            .collect();
        let chart = LineChart {
            id: "legend",
            title: "t",
            frame: LINEAR,
            x_range: None,
            series,
            bands: Vec::new(),
        };
        let svg = line_chart(&chart);
        // The plot area, from the axes as drawn.
        let axes = lines_of_class(&svg, "axis");
        assert_eq!(axes.len(), 2, "{svg}");
        let plot = axes.iter().fold(
            (
                f64::INFINITY,
                f64::INFINITY,
                f64::NEG_INFINITY,
                f64::NEG_INFINITY,
            ),
            |p, a| (p.0.min(a.0), p.1.min(a.1), p.2.max(a.2), p.3.max(a.3)),
        );
        let at = svg.find("<g class=\"legend\">").expect("a legend group");
        let group = &svg[at..at + svg[at..].find("</g>").expect("the group closes")];
        let mut boxes = Vec::new();
        for tag in group.split('<').filter(|t| t.starts_with("line ")) {
            let c = |n| attr(tag, n).unwrap_or_else(|| panic!("no {n} in {tag}"));
            // The sample line, with its stroke.
            boxes.push((c("x1"), c("y1") - 1.0, c("x2"), c("y2") + 1.0));
        }
        for tag in group.split('<').filter(|t| t.starts_with("text ")) {
            let c = |n| attr(tag, n).unwrap_or_else(|| panic!("no {n} in {tag}"));
            let text = tag.split_once('>').map_or("", |(_, t)| t);
            // 11 px text: ascent above the baseline, descent below, and at
            // most 7 px per character.
            let (x, y) = (c("x"), c("y"));
            boxes.push((x, y - 11.0, x + 7.0 * text.chars().count() as f64, y + 3.0));
        }
        assert_eq!(boxes.len(), 14, "a line and a text per series: {group}");
        let view = svg
            .split_once("viewBox=\"0 0 ")
            .and_then(|(_, rest)| rest.split_once('"'))
            .map(|(wh, _)| {
                wh.split(' ')
                    .filter_map(|v| v.parse::<f64>().ok())
                    .collect::<Vec<_>>()
            })
            .expect("a viewBox");
        for b in &boxes {
            assert!(
                !intersects(*b, plot),
                "legend box {b:?} covers the plot {plot:?}"
            );
            assert!(
                b.0 >= 0.0 && b.1 >= 0.0 && b.2 <= view[0] && b.3 <= view[1],
                "legend box {b:?} outside the chart {view:?}"
            );
        }
        for (i, a) in boxes.iter().enumerate() {
            for b in &boxes[i + 1..] {
                let (a_text, b_text) = (a.3 - a.1 > 2.0, b.3 - b.1 > 2.0);
                assert!(
                    !(a_text && b_text && intersects(*a, *b)),
                    "legend texts {a:?} and {b:?} overlap"
                );
            }
        }
    }

    #[test]
    fn a_band_is_drawn_under_the_lines_and_labelled() {
        let svg = chart_with(
            10.0,
            vec![
                Band {
                    from: 5.0,
                    to: 7.5,
                    label: "hop \"b\" slow".into(),
                    kind: BandKind::Window,
                },
                // Past the axis: clipped to it.
                Band {
                    from: 9.0,
                    to: 20.0,
                    label: "400/s".into(),
                    kind: BandKind::Window,
                },
            ],
        );
        let rects: Vec<&str> = svg.split("<rect class=\"band\"").skip(1).collect();
        assert_eq!(rects.len(), 2, "{svg}");
        let at = |tag: &str, n: &str| attr(tag, n).unwrap_or_else(|| panic!("no {n} in {tag}"));
        // x = 5 and 7.5 on a 0..10 axis from LEFT to WIDTH - RIGHT.
        let px = |v: f64| LEFT + v / 10.0 * (WIDTH - RIGHT - LEFT);
        assert!((at(rects[0], "x") - px(5.0)).abs() < 0.1, "{}", rects[0]);
        assert!((at(rects[0], "width") - (px(7.5) - px(5.0))).abs() < 0.1);
        assert!((at(rects[1], "x") + at(rects[1], "width") - px(10.0)).abs() < 0.1);
        assert!(svg.contains(">hop &quot;b&quot; slow</text>"), "{svg}");
        assert!(svg.contains(">400/s</text>"), "{svg}");
        // Under the lines: drawn before them.
        assert!(svg.find("class=\"band\"") < svg.find("<polyline"));
    }

    /// (x, y, text) of every band label of `svg`.
    fn band_labels_of(svg: &str) -> Vec<(f64, f64, String)> {
        svg.split("<text class=\"tick band-label\"")
            .skip(1)
            .map(|tag| {
                let c = |n| attr(tag, n).unwrap_or_else(|| panic!("no {n} in {tag}"));
                let text = tag
                    .split_once('>')
                    .and_then(|(_, t)| t.split_once("</text>"))
                    .map_or("", |(t, _)| t);
                (c("x"), c("y"), text.to_owned())
            })
            .collect()
    }

    /// A one-line chart over `0..x_max` with `bands`.
    fn chart_with(x_max: f64, bands: Vec<Band>) -> String {
        line_chart(&LineChart {
            id: "bands",
            title: "t",
            frame: LINEAR,
            x_range: Some((0.0, x_max)),
            series: vec![Series {
                name: "p99".into(),
                points: vec![(0.0, 1.0), (x_max, 2.0)],
                dashed: false,
                colour: 0,
                intervals: Vec::new(),
            }],
            bands,
        })
    }

    #[test]
    fn overlapping_bands_stack_their_labels_and_steps_label_the_bottom() {
        let band = |from: f64, to: f64, label: &str, kind: BandKind| Band {
            from,
            to,
            label: label.into(),
            kind,
        };
        let svg = chart_with(
            20.0,
            vec![
                band(0.0, 10.0, "200/s", BandKind::Step),
                band(10.0, 20.0, "400/s", BandKind::Step),
                band(5.0, 12.0, "slow b", BandKind::Window),
                band(6.0, 8.0, "net b/1", BandKind::Window),
                // Far enough right to share the first row.
                band(15.0, 18.0, "error c", BandKind::Window),
                band(12.0, 12.0, "knee", BandKind::Mark),
            ],
        );
        let labels = band_labels_of(&svg);
        let texts: Vec<&str> = labels.iter().map(|l| l.2.as_str()).collect();
        assert_eq!(
            texts,
            ["200/s", "400/s", "slow b", "net b/1", "error c", "knee"],
            "{svg}"
        );
        let y = |i: usize| labels[i].1;
        // Steps at the bottom of the plot, windows and marks at the top.
        assert!(y(0) > HEIGHT - BOTTOM - 20.0 && y(0) == y(1), "{labels:?}");
        assert!(y(2) < TOP + 20.0, "{labels:?}");
        assert_eq!(y(3), y(2) + BAND_ROW, "net b/1 overlaps slow b: a row down");
        assert_eq!(y(4), y(2), "error c is clear of both");
        // The mark's label at 12 fits between "slow b" and "error c".
        assert_eq!(y(5), y(2), "{labels:?}");
        // No two labels in a row overlap.
        for (i, a) in labels.iter().enumerate() {
            for b in &labels[i + 1..] {
                let width = |t: &str| LEGEND_CHAR * t.chars().count() as f64;
                let apart = a.0 + width(&a.2) <= b.0 || b.0 + width(&b.2) <= a.0;
                assert!(a.1 != b.1 || apart, "{a:?} and {b:?} overlap");
            }
        }
        // Two step rects tinted differently, one edge line between them,
        // the mark a dashed line at x = 12.
        let rects: Vec<&str> = svg.split("<rect class=\"band\"").skip(1).collect();
        assert_eq!(rects.len(), 5, "{svg}");
        assert_ne!(
            attr(rects[0], "fill-opacity"),
            attr(rects[1], "fill-opacity")
        );
        assert_eq!(svg.matches("class=\"band-edge\"").count(), 1, "{svg}");
        let mark = lines_of_class(&svg, "band-mark");
        let px = LEFT + 12.0 / 20.0 * (WIDTH - RIGHT - LEFT);
        assert_eq!(mark.len(), 1, "{svg}");
        assert!((mark[0].0 - px).abs() < 0.1 && mark[0].0 == mark[0].2);
        // Labels are written over the lines, shading under them.
        let polyline = svg.find("<polyline").expect("a line");
        assert!(svg.find("class=\"band\"") < Some(polyline));
        assert!(svg.find("band-label") > Some(polyline));
    }

    #[test]
    fn a_label_near_the_right_edge_stays_inside_the_plot() {
        let svg = chart_with(
            20.0,
            vec![Band {
                from: 19.5,
                to: 20.0,
                label: "replica_slow b/2, net b/1".into(),
                kind: BandKind::Window,
            }],
        );
        let labels = band_labels_of(&svg);
        assert_eq!(labels.len(), 1, "{svg}");
        let (x, _, text) = &labels[0];
        assert!(x + LEGEND_CHAR * text.chars().count() as f64 <= WIDTH - RIGHT + 0.1);
    }

    #[test]
    fn a_fixed_x_range_is_the_axis_exactly() {
        let a = Axis::fixed(Scale::Linear, (0.0, 10.0), 0.0, 100.0);
        assert_eq!((a.lo, a.hi), (0.0, 10.0));
        assert_eq!(a.pos(10.0), Some(100.0));
        assert_eq!(a.ticks().last(), Some(&10.0));
        // What is not a range on the scale falls back to the data's.
        let b = Axis::fixed(Scale::Log, (0.0, 10.0), 0.0, 100.0);
        assert!(
            b.lo > 0.0 && b.lo <= 10.0 && b.hi >= 10.0,
            "{} {}",
            b.lo,
            b.hi
        );
    }

    /// Two panels of two series each, "a" and "b" in both.
    fn two_panels() -> SmallMultiples<'static> {
        let series = |name: &str, colour: usize, points: Vec<(f64, f64)>| Series {
            name: name.into(),
            points,
            dashed: false,
            colour,
            intervals: Vec::new(),
        };
        SmallMultiples {
            id: "grid",
            title: "side by side",
            frame: Frame {
                x_label: "latency",
                y_label: "share",
                x_scale: Scale::Log,
                y_scale: Scale::Linear,
                x_format: fmt,
                y_format: fmt,
            },
            columns: 2,
            panels: vec![
                Panel {
                    title: "n = 1".into(),
                    series: vec![
                        series("a", 0, vec![(10.0, 5.0), (100.0, 1.0)]),
                        series("b", 1, vec![(20.0, 2.0), (30.0, 4.0)]),
                    ],
                },
                Panel {
                    title: "n = <2>".into(),
                    series: vec![
                        series("a", 0, vec![(10.0, 5.0), (1000.0, 40.0)]),
                        series("b", 1, vec![(3.0, 1.0)]),
                    ],
                },
            ],
        }
    }

    /// The `points` of the polyline of series `name` in the panel starting
    /// at `panel`, as pixels (the report's tests read its panels too).
    pub(in crate::output) fn panel_points(panel: &str, name: &str) -> Vec<(f64, f64)> {
        let key = format!("data-series=\"{name}\" points=\"");
        let from = panel.find(&key).expect("the series") + key.len();
        let len = panel[from..].find('"').expect("closed");
        panel[from..from + len]
            .split(' ')
            .map(|p| {
                let (x, y) = p.split_once(',').expect("x,y");
                (x.parse().expect("x"), y.parse().expect("y"))
            })
            .collect()
    }

    #[test]
    fn small_multiples_share_their_axes_and_one_legend() {
        let svg = small_multiples(&two_panels());
        assert!(svg.starts_with("<svg id=\"grid\"") && svg.ends_with("</svg>"));
        let panels: Vec<&str> = svg.split("<g class=\"panel\"").skip(1).collect();
        assert_eq!(panels.len(), 2, "{svg}");
        assert!(panels[0].starts_with(" data-panel=\"n = 1\""));
        assert!(panels[1].starts_with(" data-panel=\"n = &lt;2&gt;\""));
        // The same point lies at the same place within each panel: the
        // second is one column to the right, on the same row.
        let first = panel_points(panels[0], "a")[0];
        let second = panel_points(panels[1], "a")[0];
        let column = (WIDTH - GRID_LEFT) / 2.0;
        assert!(
            (second.0 - first.0 - column).abs() < 0.11,
            "{first:?} {second:?}"
        );
        assert_eq!(first.1, second.1);
        // The axes cover every panel's points: the first panel's highest
        // point (5) is well below the top, which the second's 40 reaches.
        let top_of = |p: &[(f64, f64)]| p.iter().map(|q| q.1).fold(f64::INFINITY, f64::min);
        assert!(
            top_of(&panel_points(panels[0], "a")) > top_of(&panel_points(panels[1], "a")) + 50.0
        );
        // Both panels' x ticks run from 1 (b's 3) to 1000.
        for panel in &panels {
            assert!(
                panel.contains(">1</text>") && panel.contains(">1000</text>"),
                "{panel}"
            );
        }
        // One legend entry per series name, not per panel.
        let legend = &svg[svg.find("<g class=\"legend\">").expect("a legend")..];
        assert_eq!(legend.matches("<text").count(), 2, "{legend}");
    }

    #[test]
    fn small_multiples_wrap_into_rows_and_grow() {
        let mut chart = two_panels();
        let one_row = small_multiples(&chart);
        chart.columns = 1;
        let two_rows = small_multiples(&chart);
        let height = |svg: &str| attr(svg, "height").expect("a height");
        assert!(
            (height(&two_rows) - height(&one_row) - PANEL_HEIGHT).abs() < 1e-9,
            "{} {}",
            height(&two_rows),
            height(&one_row)
        );
        // Without panels: an empty grid, still one closed <svg>.
        chart.panels.clear();
        let empty = small_multiples(&chart);
        assert!(empty.ends_with("</svg>") && !empty.contains("class=\"panel\""));
    }

    #[test]
    fn stacked_bars_draw_one_rect_per_positive_segment() {
        let chart = StackedBars {
            id: "bars",
            title: "t",
            x_label: "us",
            x_format: fmt,
            segments: vec!["service".into(), "queue".into()],
            bars: vec![("a".into(), vec![3.0, 1.0]), ("b".into(), vec![2.0, 0.0])],
        };
        let svg = stacked_bars(&chart);
        assert_eq!(svg.matches("class=\"segment\"").count(), 4);
        assert!(svg.contains("<title>a service: 3</title>"), "{svg}");
    }
}
