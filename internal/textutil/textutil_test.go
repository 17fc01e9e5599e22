package textutil

import (
	"errors"
	"io"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestPrintable(t *testing.T) {
	tests := map[string]struct {
		in   string
		max  int
		want string
	}{
		"plain text is kept":              {in: "query failed: bad_data", max: 100, want: "query failed: bad_data"},
		"no limit":                        {in: strings.Repeat("a", 5000), max: 0, want: strings.Repeat("a", 5000)},
		"NUL and 0xFF are replaced":       {in: "a\x00b\xffc", max: 100, want: "a b\uFFFDc"},
		"line breaks become spaces":       {in: "line1\nline2\r\tx", max: 100, want: "line1 line2  x"},
		"escape and DEL":                  {in: "\x1b[31mred\x7f", max: 100, want: " [31mred "},
		"valid multibyte text is kept":    {in: "durée ✓", max: 100, want: "durée ✓"},
		"short limit cuts without marker": {in: "abcdefghij", max: 4, want: "abcd"},
		"cut never splits a rune":         {in: "ééééé", max: 5, want: "éé"},
		"long text is cut with a marker": {in: strings.Repeat("x", 100), max: 40,
			want: strings.Repeat("x", 40-len(marker(100))) + marker(100-(40-len(marker(100))))},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := Printable(tc.in, tc.max)
			if got != tc.want {
				t.Errorf("Printable(%q, %d) = %q, want %q", tc.in, tc.max, got, tc.want)
			}
			if tc.max > 0 && len(got) > tc.max {
				t.Errorf("len %d > max %d", len(got), tc.max)
			}
		})
	}
}

func FuzzPrintable(f *testing.F) {
	f.Add("a\x00\xff\n", 10)
	f.Add(strings.Repeat("é", 100), 33)
	f.Fuzz(func(t *testing.T, s string, max int) {
		max %= 5000
		got := Printable(s, max)
		if !utf8.ValidString(got) {
			t.Fatalf("invalid UTF-8: %q", got)
		}
		for _, r := range got {
			if !unicode.IsPrint(r) && r != ' ' {
				t.Fatalf("non-printing rune %U in %q", r, got)
			}
		}
		if max > 0 && len(got) > max {
			t.Fatalf("len %d > max %d", len(got), max)
		}
	})
}

func TestErrorKeepsTheChain(t *testing.T) {
	err := Error(errors.Join(io.ErrUnexpectedEOF, errors.New(strings.Repeat("\x00", 5000))), StatusLimit)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Error("errors.Is lost the wrapped error")
	}
	if msg := err.Error(); len(msg) > StatusLimit || strings.ContainsRune(msg, 0) {
		t.Errorf("message not bounded/printable: %d bytes", len(msg))
	}
	if Error(nil, 10) != nil {
		t.Error("Error(nil) != nil")
	}
}
