package chat

import (
	"strconv"
	"strings"
	"time"
)

// strftime formats t with a Python strftime format (C locale). The directives
// @huggingface/jinja's strftime_now knows (%Y %m %d %b %B %H %M %%) give the same text; the other
// common ones (%a %A %y %e %I %p %S %j) follow Python. An unknown directive is kept as written,
// as @huggingface/jinja does.
func strftime(t time.Time, format string) string {
	var b strings.Builder
	b.Grow(len(format) + 16)
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 >= len(format) {
			b.WriteByte(c)
			continue
		}
		i++
		switch format[i] {
		case 'Y':
			b.WriteString(strconv.Itoa(t.Year()))
		case 'y':
			pad(&b, t.Year()%100, 2, '0')
		case 'm':
			pad(&b, int(t.Month()), 2, '0')
		case 'd':
			pad(&b, t.Day(), 2, '0')
		case 'e':
			pad(&b, t.Day(), 2, ' ')
		case 'b':
			b.WriteString(t.Month().String()[:3])
		case 'B':
			b.WriteString(t.Month().String())
		case 'a':
			b.WriteString(t.Weekday().String()[:3])
		case 'A':
			b.WriteString(t.Weekday().String())
		case 'H':
			pad(&b, t.Hour(), 2, '0')
		case 'I':
			h := t.Hour() % 12
			if h == 0 {
				h = 12
			}
			pad(&b, h, 2, '0')
		case 'p':
			if t.Hour() < 12 {
				b.WriteString("AM")
			} else {
				b.WriteString("PM")
			}
		case 'M':
			pad(&b, t.Minute(), 2, '0')
		case 'S':
			pad(&b, t.Second(), 2, '0')
		case 'j':
			pad(&b, t.YearDay(), 3, '0')
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(format[i])
		}
	}
	return b.String()
}

// pad writes n right-aligned in width characters, filled with fill.
func pad(b *strings.Builder, n, width int, fill byte) {
	s := strconv.Itoa(n)
	for i := len(s); i < width; i++ {
		b.WriteByte(fill)
	}
	b.WriteString(s)
}
