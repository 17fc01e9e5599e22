// Package textutil makes text from outside (a metrics backend's answer, an
// error built from it) safe to put in a log line or a status message: valid
// UTF-8, no control bytes, and bounded in size.
package textutil

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

const (
	// StatusLimit bounds text from outside in a status condition message.
	StatusLimit = 1024
	// LogLimit bounds text from outside in one log value.
	LogLimit = 4096
)

// Printable returns s as valid UTF-8 without control or non-printing
// characters, cut to at most max bytes. Invalid bytes become U+FFFD, control
// characters (NUL, ESC, line breaks, DEL, C1) a space, so one message stays
// one line. A cut string ends with "… (N more bytes)", N counted in s, and
// the whole result, marker included, fits in max (max < 32 cuts without a
// marker). max <= 0 means no limit.
func Printable(s string, max int) string {
	plain := true
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) && r != ' ' {
			plain = false
			break
		}
	}
	if plain && (max <= 0 || len(s) <= max) {
		return s
	}
	if max <= 0 {
		max = len(s) * utf8.UTFMax
	}
	out, used := clean(s, max)
	if used == len(s) || max < 32 {
		return out
	}
	out, used = clean(s, max-len(marker(len(s))))
	return out + marker(len(s)-used)
}

// clean converts s as Printable does until the output would pass limit
// bytes; it returns the output and how many bytes of s it used.
func clean(s string, limit int) (string, int) {
	var b strings.Builder
	b.Grow(min(len(s), limit))
	i := 0
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r != utf8.RuneError && !unicode.IsPrint(r) && r != ' ' {
			r = ' '
		}
		if b.Len()+utf8.RuneLen(r) > limit {
			break
		}
		b.WriteRune(r)
		i += size
	}
	return b.String(), i
}

func marker(n int) string { return "… (" + strconv.Itoa(n) + " more bytes)" }

// Error wraps err so that its message is Printable and at most max bytes,
// while errors.Is and errors.As still see err. nil stays nil.
func Error(err error, max int) error {
	if err == nil {
		return nil
	}
	return &printableError{err: err, max: max}
}

type printableError struct {
	err error
	max int
}

func (e *printableError) Error() string { return Printable(e.err.Error(), e.max) }
func (e *printableError) Unwrap() error { return e.err }
