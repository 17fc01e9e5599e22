package controllers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/liorfranko/istio-adaptive-least-request/metrics"
)

// watchFailingFor is how long after its last list or watch error an
// informer counts as failing. The reflector retries with a backoff that
// stays under 30s, so an informer that keeps failing (an object it cannot
// decode, a revoked permission) reports again well within it.
const watchFailingFor = time.Minute

// WatchHealth records the errors of the manager's informers. Without it an
// informer that cannot list (an object that does not decode, missing RBAC)
// leaves the manager running on a stale cache while /readyz says ok: its
// Check fails /readyz and optimizer_watch_errors_total counts each error.
type WatchHealth struct {
	Clock   clock.PassiveClock
	Metrics *metrics.Metrics

	mu   sync.Mutex
	last map[string]watchError // by the reflector's type
}

type watchError struct {
	at  time.Time
	err string
}

// Handler is a cache.Options.DefaultWatchErrorHandler: it records the error
// and then does what client-go does by default (log it, back off).
func (h *WatchHealth) Handler(ctx context.Context, r *toolscache.Reflector, err error) {
	toolscache.DefaultWatchErrorHandler(ctx, r, err)
	h.Record(r.TypeDescription(), err)
}

// Record counts one error of the informer of resource; the routine ends of
// a watch (expired resource version, closed connection) are not errors.
func (h *WatchHealth) Record(resource string, err error) {
	if err == nil || apierrors.IsResourceExpired(err) || apierrors.IsGone(err) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return
	}
	resource = strings.TrimPrefix(resource, "*")
	if h.Metrics != nil {
		h.Metrics.WatchErrors.WithLabelValues(resource).Inc()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.last == nil {
		h.last = map[string]watchError{}
	}
	msg := err.Error()
	if len(msg) > 512 {
		msg = msg[:512] + "..."
	}
	h.last[resource] = watchError{at: h.Clock.Now(), err: msg}
}

// Check is a readyz check: it fails while an informer keeps failing.
func (h *WatchHealth) Check(*http.Request) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.Clock.Now()
	var failing []string
	for res, e := range h.last {
		if now.Sub(e.at) < watchFailingFor {
			failing = append(failing, fmt.Sprintf("%s: %s", res, e.err))
		}
	}
	if len(failing) == 0 {
		return nil
	}
	sort.Strings(failing)
	return fmt.Errorf("informers failing to list or watch, the cache is stale: %s", strings.Join(failing, "; "))
}
