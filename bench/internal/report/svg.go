package report

import (
	"fmt"
	"math"
	"strings"
)

// Series is one line of a chart.
type Series struct {
	Name   string
	Color  string
	Dashed bool
	Y      []float64 // one per x label; NaN or <= 0 on a log scale: no point
}

// Chart is a line chart over categorical x values, drawn as SVG by hand.
type Chart struct {
	Title  string
	XLabel string
	YLabel string
	X      []string
	LogY   bool
	Series []Series
}

const (
	width, height                = 720, 420
	left, right, top, bottom     = 70, 190, 40, 50
	plotW, plotH                 = width - left - right, height - top - bottom
	fontAttr                     = `font-family="sans-serif"`
	axisColor, gridColor, txtCol = "#444", "#ddd", "#222"
)

// SVG renders c.
func (c Chart) SVG() string {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range c.Series {
		for _, y := range s.Y {
			if math.IsNaN(y) || (c.LogY && y <= 0) {
				continue
			}
			lo, hi = math.Min(lo, y), math.Max(hi, y)
		}
	}
	if math.IsInf(lo, 1) {
		lo, hi = 0, 1
	}
	var ticks []float64
	if c.LogY {
		lo = math.Pow(10, math.Floor(math.Log10(lo)))
		hi = math.Pow(10, math.Ceil(math.Log10(hi)))
		if hi == lo {
			hi *= 10
		}
		for t := lo; t <= hi*1.0001; t *= 10 {
			ticks = append(ticks, t)
		}
	} else {
		lo = 0
		step := niceStep(hi / 5)
		hi = math.Ceil(hi/step) * step
		for t := 0.0; t <= hi*1.0001; t += step {
			ticks = append(ticks, t)
		}
	}
	yPos := func(y float64) float64 {
		f := (y - lo) / (hi - lo)
		if c.LogY {
			f = (math.Log10(y) - math.Log10(lo)) / (math.Log10(hi) - math.Log10(lo))
		}
		return top + plotH*(1-f)
	}
	xPos := func(i int) float64 {
		if len(c.X) == 1 {
			return left + plotW/2
		}
		return left + 20 + float64(i)*(plotW-40)/float64(len(c.X)-1)
	}

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="24" %s font-size="16" fill="%s">%s</text>`+"\n", left, fontAttr, txtCol, esc(c.Title))
	for _, t := range ticks {
		y := yPos(t)
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="%s"/>`+"\n", left, left+plotW, y, y, gridColor)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" %s font-size="11" text-anchor="end" fill="%s">%s</text>`+"\n", left-6, y+4, fontAttr, txtCol, short(t))
	}
	fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s"/>`+"\n", left, left+plotW, top+plotH, top+plotH, axisColor)
	fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s"/>`+"\n", left, left, top, top+plotH, axisColor)
	for i, x := range c.X {
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" %s font-size="11" text-anchor="middle" fill="%s">%s</text>`+"\n", xPos(i), top+plotH+16, fontAttr, txtCol, esc(x))
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" %s font-size="12" text-anchor="middle" fill="%s">%s</text>`+"\n", left+plotW/2, height-12, fontAttr, txtCol, esc(c.XLabel))
	fmt.Fprintf(&b, `<text transform="translate(16 %d) rotate(-90)" %s font-size="12" text-anchor="middle" fill="%s">%s</text>`+"\n", top+plotH/2, fontAttr, txtCol, esc(c.YLabel))
	for k, s := range c.Series {
		dash := ""
		if s.Dashed {
			dash = ` stroke-dasharray="6 4"`
		}
		var pts []string
		for i, y := range s.Y {
			if i >= len(c.X) || math.IsNaN(y) || (c.LogY && y <= 0) {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", xPos(i), yPos(y)))
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", xPos(i), yPos(y), s.Color)
		}
		if len(pts) > 1 {
			fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s/>`+"\n", strings.Join(pts, " "), s.Color, dash)
		}
		ly := top + 10 + 18*k
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`+"\n", left+plotW+12, left+plotW+36, ly, ly, s.Color, dash)
		fmt.Fprintf(&b, `<text x="%d" y="%d" %s font-size="11" fill="%s">%s</text>`+"\n", left+plotW+42, ly+4, fontAttr, txtCol, esc(s.Name))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if raw <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func short(v float64) string {
	switch {
	case v >= 1e6:
		return trim(v/1e6) + "M"
	case v >= 1e3:
		return trim(v/1e3) + "k"
	}
	return trim(v)
}

func trim(v float64) string {
	s := fmt.Sprintf("%.2f", v)
	s = strings.TrimRight(s, "0")
	return strings.TrimSuffix(s, ".")
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
