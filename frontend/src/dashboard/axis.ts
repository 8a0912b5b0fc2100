// The dashboard's time axis. uPlot's default puts the date on a second line under the first
// tick and centres every label on its tick, so the first label ran into the y axis's
// numbers at the bottom-left corner. Here every label is one line, ticks are spaced for
// the widest label, and a label that would cross the plot's left or right edge is left
// blank (its tick and grid line stay). uPlot's own steps jump from 1 to 5 minutes, so a
// narrow plot of a 5-minute window got a single tick, often blanked at an edge: the steps
// below are finer, and when every label would be blanked the most central one stays.

const pad = (n: number) => String(n).padStart(2, '0');

/** Approximate width of one character of the axis font (12px sans-serif), in CSS px. */
export const CHAR_PX = 7;
/** Minimum CSS px between two x ticks: room for the widest label ("12/31 23:59") and a gap. */
export const X_TICK_SPACE = 90;

/** One-line label for a tick at `sec` (Unix seconds, local time) on an axis spanning `spanS`. */
export function tickLabel(sec: number, spanS: number): string {
  const d = new Date(sec * 1000);
  const hm = `${pad(d.getHours())}:${pad(d.getMinutes())}`;
  if (spanS > 86400) return `${d.getMonth() + 1}/${d.getDate()} ${hm}`;
  if (spanS <= 600) return `${hm}:${pad(d.getSeconds())}`;
  return hm;
}

/** Tick steps in seconds: the clock's own divisions, finer than uPlot's (2 and 3 minutes
 * keep a label inside a 5-minute window 200 px wide), up to 4 weeks. */
export const X_INCRS = [
  1, 2, 5, 10, 15, 30,
  60, 120, 180, 300, 600, 900, 1200, 1800,
  3600, 7200, 10800, 14400, 21600, 28800, 43200,
  86400, 2 * 86400, 3 * 86400, 7 * 86400, 14 * 86400, 28 * 86400,
];

/** Blank the labels whose text, centred on its tick at `positions[i]` (CSS px from the
 * plot's left edge), would stick out of [0, plotWidth]; but never all of them: an axis
 * without any time on it says less than one label that overhangs a little. */
export function edgeSafeLabels(labels: string[], positions: number[], plotWidth: number, charPx = CHAR_PX): string[] {
  const fits = labels.map((label, i) => {
    const half = (label.length * charPx) / 2;
    return positions[i] - half >= 0 && positions[i] + half <= plotWidth;
  });
  if (labels.length && !fits.some(Boolean)) {
    const off = positions.map((x) => Math.abs(x - plotWidth / 2));
    fits[off.indexOf(Math.min(...off))] = true;
  }
  return labels.map((label, i) => (fits[i] ? label : ''));
}

/** Just what xAxis needs from a uPlot instance (so the tests can pass a stand-in). */
export interface AxisPlot {
  scales: Record<string, { min?: number | null; max?: number | null }>;
  bbox: { width: number };
  valToPos(v: number, scale: string): number;
}

/** uPlot `axes[0]` options for a time x axis whose labels never overlap. */
export function xAxis(stroke: string) {
  return {
    stroke,
    space: X_TICK_SPACE,
    incrs: X_INCRS,
    size: 30,
    values: (u: AxisPlot, splits: number[]): string[] => {
      const span = (u.scales.x?.max ?? 0) - (u.scales.x?.min ?? 0);
      const labels = splits.map((s) => tickLabel(s, span));
      // bbox is in canvas pixels; valToPos(…, 'x') in CSS pixels.
      const width = u.bbox.width / (typeof devicePixelRatio === 'number' ? devicePixelRatio : 1);
      return edgeSafeLabels(labels, splits.map((s) => u.valToPos(s, 'x')), width);
    },
  };
}
