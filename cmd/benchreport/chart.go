package main

import (
	"bytes"
	"fmt"
	"html"
	"math"
	"time"
)

// chart draws throughput and p99 latency against concurrency for each
// HTTP target, side by side, as a self-contained SVG.
func (r *report) chart() []byte {
	const (
		w, h             = 960, 450
		panelW, panelH   = 380, 280
		left0, left1     = 80, 560
		top              = 50
		legendY          = top + panelH + 66
		tickCount        = 5
		fontAttrs        = `font-family="sans-serif" font-size="12"`
		colorKernelEcho  = "#1f77b4"
		colorKernelRead  = "#2ca02c"
		colorOPAServer   = "#d62728"
		colorKernelEval  = "#ff7f0e"
		colorFloor       = "#7f7f7f"
		seriesStrokeSize = 2
	)
	series := []struct{ name, color string }{
		{kernelEcho, colorKernelEcho}, {kernelRead, colorKernelRead}, {kernelEchoEval, colorKernelEval}, {opaServer, colorOPAServer}, {floorTarget, colorFloor},
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d">`+"\n", w, h, w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	panel := func(x0 float64, title, unit string, value func(point) float64) {
		maxV := 0.0
		for _, p := range r.HTTP {
			maxV = math.Max(maxV, value(p))
		}
		maxV = niceCeil(maxV)
		xAt := func(i int) float64 { return x0 + float64(i)*panelW/float64(len(concurrencies)-1) }
		yAt := func(v float64) float64 { return top + panelH - v/maxV*panelH }
		fmt.Fprintf(&b, `<text x="%.0f" y="%d" %s font-weight="bold">%s</text>`+"\n", x0, top-20, fontAttrs, title)
		for i := 0; i <= tickCount; i++ {
			v := maxV * float64(i) / tickCount
			y := yAt(v)
			fmt.Fprintf(&b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#ddd"/>`+"\n", x0, y, x0+panelW, y)
			fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" %s text-anchor="end">%s</text>`+"\n", x0-6, y+4, fontAttrs, num(v))
		}
		for i, c := range concurrencies {
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" %s text-anchor="middle">%d</text>`+"\n", xAt(i), top+panelH+18, fontAttrs, c)
		}
		fmt.Fprintf(&b, `<text x="%.0f" y="%d" %s text-anchor="middle">concurrency (c)</text>`+"\n", x0+panelW/2, top+panelH+36, fontAttrs)
		fmt.Fprintf(&b, `<text x="%.0f" y="%d" %s text-anchor="end">%s</text>`+"\n", x0+panelW, top-20, fontAttrs, unit)
		for _, s := range series {
			var pts bytes.Buffer
			for i, c := range concurrencies {
				if p, ok := r.point(s.name, c); ok {
					fmt.Fprintf(&pts, "%.1f,%.1f ", xAt(i), yAt(value(p)))
					fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", xAt(i), yAt(value(p)), s.color)
				}
			}
			fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="%d"/>`+"\n", bytes.TrimSpace(pts.Bytes()), s.color, seriesStrokeSize)
		}
	}
	panel(left0, "Throughput", "calls/s", point.Rate)
	panel(left1, "p99 latency", "ms", func(p point) float64 { return float64(p.P99) / float64(time.Millisecond) })
	for i, s := range series {
		x, y := left0+i%3*300, legendY+i/3*18
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="14" height="4" fill="%s"/>`+"\n", x, y-4, s.color)
		fmt.Fprintf(&b, `<text x="%d" y="%d" %s>%s</text>`+"\n", x+20, y+2, fontAttrs, s.name)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" %s fill="#555">%s · %d CPUs · %s · OPA %s · %s</text>`+"\n", left0, h-12, fontAttrs, html.EscapeString(r.CPU), r.CPUs, r.GoVersion, r.OPAVersion, r.Began.UTC().Format("2006-01-02"))
	b.WriteString("</svg>\n")
	return b.Bytes()
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten, so axis ticks
// fall on round numbers.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}
