package controllers

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
	"github.com/liorfranko/istio-adaptive-least-request/internal/textutil"
	"github.com/liorfranko/istio-adaptive-least-request/metrics"
)

func TestQueryErrorReason(t *testing.T) {
	tests := map[string]struct {
		err  error
		want string
	}{
		"too large":      {err: &promsource.ResponseTooLargeError{Limit: 1, Declared: -1}, want: "too_large"},
		"query too long": {err: &promsource.QueryTooLongError{Length: 2, Limit: 1}, want: "query_too_long"},
		"wrapped":        {err: textutil.Error(errors.Join(errors.New("CPU query"), &promsource.ServerError{}), 10), want: "server_error"},
		"credentials":    {err: &promsource.CredentialsError{File: "/token", Err: errors.New("gone")}, want: "credentials"},
		"unknown":        {err: errors.New("x"), want: "other"},
	}
	for name, tc := range tests {
		if got := queryErrorReason(tc.err); got != tc.want {
			t.Errorf("%s: reason %q, want %q", name, got, tc.want)
		}
	}
}

// failingSource fails every query with whatever err holds.
type failingSource struct{ err error }

func (s failingSource) Query(context.Context, string, promsource.Target, time.Time) (promsource.Result, error) {
	return promsource.Result{Query: "q"}, s.err
}

// A backend's raw bytes never reach the status: the cycle's error and the
// engine's message built from it are bounded and printable.
func TestQueryErrorTextReachingStatusIsBounded(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	book := NewWeightBook()
	d := DefaultEngineDefaults()
	key := types.NamespacedName{Namespace: "ns", Name: "web"}
	book.Applied(key, d.Params, clk.Now(), []desired.Endpoint{{Pod: "web-0", Weight: 1000}, {Pod: "web-1", Weight: 1000}})
	garbage := &promsource.ServerError{StatusCode: 500, Message: strings.Repeat("\x00\xff\x1b[0m boom\n", 10000)}
	loop := &WeightLoop{Source: failingSource{garbage}, Book: book, Clock: clk, Metrics: metrics.New(), Wake: make(chan event.GenericEvent, 1)}
	s, _ := settingsFor(optimizerFor("ns", "web"), d)
	loop.cycle(context.Background(), logr.Discard(), key, target{"ns", "web"}, s)
	out := book.Outcome(key)
	if out == nil || out.QueryErr == nil {
		t.Fatalf("outcome %+v, want a query error", out)
	}
	var se *promsource.ServerError
	if !errors.As(out.QueryErr, &se) {
		t.Errorf("the typed error is lost: %T", out.QueryErr)
	}
	for what, text := range map[string]string{"error": out.QueryErr.Error(), "message": out.Result.Message} {
		if len(text) > 2*textutil.StatusLimit {
			t.Errorf("%s is %d bytes", what, len(text))
		}
		for _, r := range text {
			if !unicode.IsPrint(r) && r != ' ' {
				t.Fatalf("%s holds %U: %q", what, r, text)
			}
		}
	}
}
