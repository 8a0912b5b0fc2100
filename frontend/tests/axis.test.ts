import { describe, expect, it } from 'vitest';
import { CHAR_PX, edgeSafeLabels, tickLabel, X_INCRS, X_TICK_SPACE, xAxis } from '../src/dashboard/axis';

const at = (h: number, m: number, s = 0) => new Date(2026, 11, 1, h, m, s).getTime() / 1000;

describe('dashboard time axis', () => {
  it('labels every tick on one line, with seconds only for short spans and the date for long ones', () => {
    expect(tickLabel(at(9, 5, 7), 300)).toBe('09:05:07');
    expect(tickLabel(at(9, 5, 7), 3600)).toBe('09:05');
    expect(tickLabel(at(9, 5, 7), 3 * 86400)).toBe('12/1 09:05');
    for (const span of [60, 3600, 86400 * 7]) expect(tickLabel(at(23, 59, 59), span)).not.toContain('\n');
  });

  it('blanks a label that would stick out of the plot on the left or right', () => {
    // "09:05" is ~35 px wide: a tick at 10 px would reach into the y axis.
    expect(edgeSafeLabels(['09:05', '09:10', '09:15'], [10, 150, 295], 300)).toEqual(['', '09:10', '']);
    expect(edgeSafeLabels(['09:05', '09:10'], [20, 150], 300)).toEqual(['09:05', '09:10']);
  });

  it('never blanks every label: the one nearest the middle stays', () => {
    expect(edgeSafeLabels(['09:05:00'], [12], 200)).toEqual(['09:05:00']);
    expect(edgeSafeLabels(['09:05:00', '09:10:00'], [5, 190], 200)).toEqual(['', '09:10:00']);
    expect(edgeSafeLabels([], [], 200)).toEqual([]);
  });

  it('steps finely enough that a narrow 5-minute window gets a label inside the plot', () => {
    // uPlot takes the smallest step at least X_TICK_SPACE px wide.
    for (const width of [200, 250, 300, 400, 600]) {
      const span = 300;
      const step = X_INCRS.find((s) => (s / span) * width >= X_TICK_SPACE)!;
      for (let start = 0; start < step; start += 7) {
        const ticks: number[] = [];
        for (let t = Math.ceil(start / step) * step; t <= start + span; t += step) ticks.push(t);
        const half = ('09:05:00'.length * CHAR_PX) / 2;
        const inside = ticks.filter((t) => {
          const x = ((t - start) / span) * width;
          return x >= half && x <= width - half;
        });
        expect(inside.length, `width ${width}, start ${start}`).toBeGreaterThan(0);
      }
    }
  });

  it('keeps ticks far enough apart for the widest label', () => {
    expect(X_TICK_SPACE).toBeGreaterThan('12/31 23:59'.length * CHAR_PX);
  });

  it('feeds uPlot labels that fit inside the plot', () => {
    const axis = xAxis('#000');
    const splits = [at(9, 0), at(9, 15), at(9, 30), at(9, 45), at(10, 0)];
    const plot = {
      scales: { x: { min: splits[0], max: splits[4] } },
      bbox: { width: 400 * (globalThis.devicePixelRatio || 1) },
      valToPos: (v: number) => ((v - splits[0]) / (splits[4] - splits[0])) * 400,
    };
    expect(axis.values(plot, splits)).toEqual(['', '09:15', '09:30', '09:45', '']);
  });
});
