//! The elastic experiment's PNG: throughput over time, one line per run,
//! with a dashed vertical line (and a numbered tag) where each compute node
//! joined (its first successful get), and a solid triangle on the time
//! axis where a compute node's VQPs moved from DC to RC (upgrade events).
//!
//! Drawn with plotters' bitmap backend from primitives (lines, rectangles,
//! pixels) and text from the public-domain 8x8 bitmap font of `font8x8`, so
//! no system font (and no font library) is needed.

use plotters::prelude::*;
use std::path::Path;

/// One line of the plot.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// `(seconds, ops/s)` points.
    pub points: Vec<(f64, f64)>,
    /// Join times in seconds (first successful get of each compute node).
    pub joins: Vec<f64>,
    /// DC->RC upgrade times in seconds (one per counter change of a node).
    pub upgrades: Vec<f64>,
}

/// Why the plot could not be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlotError {
    /// The drawing backend failed.
    #[error("plot: {0}")]
    Draw(String),
}

fn draw_err<E: std::fmt::Debug>(e: E) -> PlotError {
    PlotError::Draw(format!("{e:?}"))
}

const W: i32 = 1100;
const H: i32 = 560;
const LEFT: i32 = 90;
const RIGHT: i32 = 20;
const TOP: i32 = 50;
const BOTTOM: i32 = 70;
const COLORS: [RGBColor; 4] = [
    RGBColor(0, 90, 200),
    RGBColor(210, 60, 20),
    RGBColor(20, 150, 60),
    RGBColor(140, 40, 160),
];

/// A "nice" step (1, 2 or 5 times a power of ten) giving about `n` ticks.
fn nice_step(max: f64, n: f64) -> f64 {
    let raw = (max / n).max(1e-9);
    let p = 10f64.powf(raw.log10().floor());
    let m = raw / p;
    p * if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    }
}

fn text<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    s: &str,
    (x, y): (i32, i32),
    scale: i32,
    color: &RGBColor,
) -> Result<(), PlotError> {
    for (i, ch) in s.chars().enumerate() {
        let glyph = font8x8::legacy::BASIC_LEGACY
            .get(ch as usize)
            .copied()
            .unwrap_or([0; 8]);
        for (row, bits) in glyph.iter().enumerate() {
            for col in 0..8 {
                if bits & (1 << col) != 0 {
                    let px = x + (i as i32 * 8 + col) * scale;
                    let py = y + row as i32 * scale;
                    for dx in 0..scale {
                        for dy in 0..scale {
                            area.draw_pixel((px + dx, py + dy), color)
                                .map_err(draw_err)?;
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

fn fmt_num(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.0}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// Writes the PNG at `path`.
///
/// # Errors
/// [`PlotError`].
pub fn draw(
    path: &Path,
    title: &str,
    notes: &[String],
    series: &[Series],
) -> Result<(), PlotError> {
    let root = BitMapBackend::new(path, (W as u32, H as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err)?;
    let t_max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .fold(1.0f64, f64::max);
    let y_max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(1.0f64, f64::max)
        * 1.15;
    let (x0, x1, y0, y1) = (LEFT, W - RIGHT, H - BOTTOM, TOP);
    let px = |t: f64| x0 + ((t / t_max) * f64::from(x1 - x0)) as i32;
    let py = |v: f64| y0 - ((v / y_max) * f64::from(y0 - y1)) as i32;
    let black = RGBColor(0, 0, 0);
    let grey = RGBColor(200, 200, 200);
    // Grid, ticks and tick labels.
    let ys = nice_step(y_max, 6.0);
    let mut v = 0.0;
    while v <= y_max {
        let y = py(v);
        root.draw(&PathElement::new(vec![(x0, y), (x1, y)], grey))
            .map_err(draw_err)?;
        let s = fmt_num(v);
        text(&root, &s, (x0 - 8 - 8 * s.len() as i32, y - 4), 1, &black)?;
        v += ys;
    }
    let xs = nice_step(t_max, 10.0);
    let mut t = 0.0;
    while t <= t_max + 1e-9 {
        let x = px(t);
        root.draw(&PathElement::new(vec![(x, y0), (x, y0 + 5)], black))
            .map_err(draw_err)?;
        let s = format!("{t:.1}");
        text(&root, &s, (x - 4 * s.len() as i32, y0 + 10), 1, &black)?;
        t += xs;
    }
    root.draw(&PathElement::new(vec![(x0, y1), (x0, y0), (x1, y0)], black))
        .map_err(draw_err)?;
    text(
        &root,
        "time since the first spawn (s)",
        (x0 + (x1 - x0) / 2 - 120, y0 + 26),
        1,
        &black,
    )?;
    text(&root, "ops/s (100 ms buckets)", (8, y1 - 18), 1, &black)?;
    text(&root, title, (x0, 10), 2, &black)?;
    // Series and their join markers.
    for (i, s) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let style = ShapeStyle {
            color: c.to_rgba(),
            filled: false,
            stroke_width: 2,
        };
        let pts: Vec<(i32, i32)> = s.points.iter().map(|&(t, v)| (px(t), py(v))).collect();
        root.draw(&PathElement::new(pts, style)).map_err(draw_err)?;
        for (j, &jt) in s.joins.iter().enumerate() {
            let x = px(jt);
            let mut y = y0;
            while y > y1 {
                root.draw(&PathElement::new(vec![(x, y), (x, (y - 4).max(y1))], c))
                    .map_err(draw_err)?;
                y -= 8;
            }
            let tag = format!("{}", j + 1);
            text(&root, &tag, (x + 2, y1 + 2 + 10 * i as i32), 1, &c)?;
        }
        for &ut in &s.upgrades {
            let x = px(ut);
            let base = y0 - 2 - 12 * i as i32;
            root.draw(&Polygon::new(
                vec![(x - 5, base), (x + 5, base), (x, base - 10)],
                c.filled(),
            ))
            .map_err(draw_err)?;
        }
        // Legend.
        let ly = y1 + 8 + 14 * i as i32;
        root.draw(&Rectangle::new(
            [(x1 - 690, ly), (x1 - 678, ly + 8)],
            c.filled(),
        ))
        .map_err(draw_err)?;
        text(&root, &s.name, (x1 - 672, ly), 1, &black)?;
    }
    for (i, n) in notes.iter().enumerate() {
        text(
            &root,
            n,
            (x0, H - 2 - 12 * (notes.len() - i) as i32),
            1,
            &RGBColor(90, 90, 90),
        )?;
    }
    root.present().map_err(draw_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_png() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.png");
        let s = Series {
            name: "krcore".into(),
            points: (0..50)
                .map(|i| (f64::from(i) * 0.1, f64::from(i * 1000)))
                .collect(),
            joins: vec![0.5, 1.5],
            upgrades: vec![2.0],
        };
        draw(&p, "test", &["a note".into()], &[s]).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        assert_eq!(nice_step(100.0, 10.0), 10.0);
        assert_eq!(nice_step(7.3, 6.0), 2.0);
        assert_eq!(fmt_num(12_500.0), "12k");
    }
}
