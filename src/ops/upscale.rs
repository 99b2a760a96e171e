//! upscale / interpolate on F32 (ggml's ggml_compute_forward_upscale_f32): nearest, bilinear
//! (optionally antialiased), bicubic; align-corners; dims 2 and 3 by nearest index.

use super::NodeCtx;
use crate::error::Result;
use crate::graph::ScaleMode;

pub(crate) fn compute(ctx: &NodeCtx<'_>, ith: usize, mode: ScaleMode) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    let (ne00, ne01) = (a.ne[0] as i64, a.ne[1] as i64);
    let mut sf = [0f32; 4];
    for k in 0..4 {
        sf[k] = d.ne[k] as f32 / a.ne[k] as f32;
    }
    let mut pixel_offset = 0.5f32;
    let align = matches!(
        mode,
        ScaleMode::Bilinear { align_corners: true, .. }
            | ScaleMode::Bicubic { align_corners: true }
    );
    if align {
        pixel_offset = 0.0;
        if d.ne[0] > 1 && a.ne[0] > 1 {
            sf[0] = (d.ne[0] - 1) as f32 / (a.ne[0] - 1) as f32;
        }
        if d.ne[1] > 1 && a.ne[1] > 1 {
            sf[1] = (d.ne[1] - 1) as f32 / (a.ne[1] - 1) as f32;
        }
    }
    let clampi = |v: i64, hi: i64| v.clamp(0, hi - 1);
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        let (i1, i2, i3) = r.i();
        let i02 = clampi((i2 as f32 / sf[2]) as i64, a.ne[2] as i64) as usize;
        let i03 = clampi((i3 as f32 / sf[3]) as i64, a.ne[3] as i64) as usize;
        let px = |x: i64, y: i64| {
            let (x, y) = (clampi(x, ne00), clampi(y, ne01));
            a.get::<f32>(x as usize, y as usize, i02, i03)
        };
        let mut out = rows.out::<f32>(r);
        for i0 in 0..d.ne[0] {
            let val = match mode {
                ScaleMode::Nearest => {
                    let x = clampi((i0 as f32 / sf[0]) as i64, ne00);
                    let y = clampi((i1 as f32 / sf[1]) as i64, ne01);
                    px(x, y)
                }
                ScaleMode::Bilinear { antialias: true, .. } => {
                    let tri = |x: f32| (1.0 - x.abs()).max(0.0);
                    let support1 = (1.0 / sf[1]).max(1.0);
                    let support0 = (1.0 / sf[0]).max(1.0);
                    let y = (i1 as f32 + pixel_offset) / sf[1];
                    let x = (i0 as f32 + pixel_offset) / sf[0];
                    let x_min = ((x - support0 + pixel_offset) as i64).max(0);
                    let x_max = ((x + support0 + pixel_offset) as i64).min(ne00);
                    let y_min = ((y - support1 + pixel_offset) as i64).max(0);
                    let y_max = ((y + support1 + pixel_offset) as i64).min(ne01);
                    let (mut v, mut tw) = (0f32, 0f32);
                    for sy in y_min..y_max {
                        let wy = tri((sy as f32 - y + pixel_offset) / support1);
                        for sx in x_min..x_max {
                            let w = tri((sx as f32 - x + pixel_offset) / support0) * wy;
                            if w <= 0.0 {
                                continue;
                            }
                            v += px(sx, sy) * w;
                            tw += w;
                        }
                    }
                    if tw > 0.0 { v / tw } else { v }
                }
                ScaleMode::Bilinear { .. } => {
                    let y = (i1 as f32 + pixel_offset) / sf[1] - pixel_offset;
                    let x = (i0 as f32 + pixel_offset) / sf[0] - pixel_offset;
                    let (y0, x0) = (y.floor() as i64, x.floor() as i64);
                    let (y0c, y1c) = (clampi(y0, ne01), clampi(y0 + 1, ne01));
                    let (x0c, x1c) = (clampi(x0, ne00), clampi(x0 + 1, ne00));
                    let dy = (y - y0c as f32).clamp(0.0, 1.0);
                    let dx = (x - x0c as f32).clamp(0.0, 1.0);
                    px(x0c, y0c) * (1.0 - dx) * (1.0 - dy)
                        + px(x1c, y0c) * dx * (1.0 - dy)
                        + px(x0c, y1c) * (1.0 - dx) * dy
                        + px(x1c, y1c) * dx * dy
                }
                ScaleMode::Bicubic { .. } => {
                    let al = -0.75f32;
                    let w1 = |x: f32| ((al + 2.0) * x - (al + 3.0)) * x * x + 1.0;
                    let w2 = |x: f32| ((al * x - 5.0 * al) * x + 8.0 * al) * x - 4.0 * al;
                    let cubic = |p: [f32; 4], t: f32| {
                        p[0] * w2(t + 1.0) + p[1] * w1(t) + p[2] * w1(1.0 - t) + p[3] * w2(2.0 - t)
                    };
                    let y = (i1 as f32 + pixel_offset) / sf[1] - pixel_offset;
                    let x = (i0 as f32 + pixel_offset) / sf[0] - pixel_offset;
                    let (y0, x0) = (y.floor() as i64, x.floor() as i64);
                    let (dy, dx) = (y - y0 as f32, x - x0 as f32);
                    let p = |xo: i64, yo: i64| px(clampi(x0 + xo, ne00), clampi(y0 + yo, ne01));
                    let row = |yo: i64| cubic([p(-1, yo), p(0, yo), p(1, yo), p(2, yo)], dx);
                    cubic([row(-1), row(0), row(1), row(2)], dy)
                }
            };
            out.set(i0, val);
        }
    }
    Ok(())
}
