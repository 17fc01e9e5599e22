package promsource

import (
	"io"
	"net/http"
)

// DefaultMaxResponseBytes bounds one answer when Config.MaxResponseBytes is
// zero: 16 MiB holds about 100k series of one value per pod, 25 times the
// 4096 pods a ServiceEntry can hold.
const DefaultMaxResponseBytes int64 = 16 << 20

// limitTransport refuses answers longer than max bytes: an announced
// Content-Length over the limit fails at once, an unannounced one fails
// when the limit is reached while reading. Memory per query stays bounded
// whatever the backend sends (client_golang reads the whole body).
type limitTransport struct {
	next http.RoundTripper
	max  int64
}

func (t *limitTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	if resp.ContentLength > t.max {
		_ = resp.Body.Close()
		return nil, &ResponseTooLargeError{Limit: t.max, Declared: resp.ContentLength}
	}
	resp.Body = &limitedBody{rc: resp.Body, left: t.max, max: t.max}
	return resp, nil
}

func (t *limitTransport) CloseIdleConnections() {
	if c, ok := t.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// limitedBody reads at most max bytes and then fails with a
// *ResponseTooLargeError instead of io.EOF if more follow.
type limitedBody struct {
	rc   io.ReadCloser
	left int64
	max  int64
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// One more byte tells a body of exactly max bytes from a longer one.
		var one [1]byte
		n, err := b.rc.Read(one[:])
		if n > 0 {
			return 0, &ResponseTooLargeError{Limit: b.max, Declared: -1}
		}
		return 0, err
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *limitedBody) Close() error { return b.rc.Close() }
