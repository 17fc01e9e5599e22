package promsource

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"text/template"
	"time"

	"github.com/prometheus/common/model"
)

// PartLabel is the label by which the answer of a combined query is split
// back into its parts: each part's expression is wrapped in
// label_replace(<part>, "adaptive_query_part", "<index>", "", ""), and the
// parts are joined with "or". The name is one no exporter sets; a series
// that carried it has it overwritten, which changes nothing here (parts are
// read by their pod label).
const PartLabel = "adaptive_query_part"

// orSeparator joins the wrapped parts of a combined query.
const orSeparator = "\nor\n"

// Part is one query of several sent together: a template rendered for its
// target.
type Part struct {
	Template string
	Target   Target
}

// PartResult is the answer to one Part, as Query would have given it.
type PartResult struct {
	Result Result
	Err    error
}

// QueryParts runs several queries evaluated at the same instant now, in as
// few requests as fit under the source's MaxQueryLength: the parts are
// wrapped in label_replace with their index in PartLabel, joined with "or",
// and each part's series are read back by that label. The answer for each
// part is what Query would return for it alone: the same values, issues,
// missing pods and typed errors (a part that has no series has an
// *EmptyResultError while the others have their values).
//
// A part too long to share a request is sent alone, in chunks of pods as
// Query sends it. When a combined request fails for a reason of the query
// (the backend refused or could not evaluate it, or its answer was not a
// vector or too large) rather than of the backend (unreachable, timed out,
// credentials), each of its parts is sent again alone, so that every part
// gets its own answer and a broken part fails only itself; a template
// outside the package's defaults that broke a combined request is sent
// alone from then on (see alone).
func (s *Source) QueryParts(ctx context.Context, parts []Part, now time.Time) []PartResult {
	out := make([]PartResult, len(parts))
	reqs, rendered := s.planParts(parts, out)
	if len(reqs) == 0 {
		return out
	}
	start := time.Now()
	answers := make([]answer, len(reqs))
	s.fanOut(ctx, len(reqs), func(i int) answer {
		a := s.send(ctx, reqs[i].query, now)
		if a.err != nil && len(reqs[i].pieces) > 1 && partsAtFault(a.err) && ctx.Err() == nil {
			a = s.sendApart(ctx, reqs[i], parts, now)
		}
		return a
	}, func(i int, a answer) { answers[i] = a })
	latency := time.Since(start)

	// Gather each part's series, warnings and first error over its pieces.
	type gathered struct {
		vec      model.Vector
		warnings []string
		err      error
		errQuery string
		chunks   int
	}
	g := make([]gathered, len(parts))
	for r, req := range reqs {
		a := answers[r]
		for _, pc := range req.pieces {
			g[pc.part].chunks++
			g[pc.part].warnings = append(g[pc.part].warnings, a.warnings...)
		}
		if a.err != nil && a.byPiece == nil {
			for _, pc := range req.pieces {
				if g[pc.part].err == nil {
					g[pc.part].err, g[pc.part].errQuery = a.err, pc.query
				}
			}
			continue
		}
		if a.byPiece != nil {
			// Sent again piece by piece.
			for k, pa := range a.byPiece {
				pc := req.pieces[k]
				if pa.err != nil && g[pc.part].err == nil {
					g[pc.part].err, g[pc.part].errQuery = pa.err, pc.query
				}
				g[pc.part].vec = append(g[pc.part].vec, pa.vec...)
			}
			continue
		}
		if len(req.pieces) == 1 {
			g[req.pieces[0].part].vec = append(g[req.pieces[0].part].vec, a.vec...)
			continue
		}
		for _, smp := range a.vec {
			k, err := strconv.Atoi(string(smp.Metric[PartLabel]))
			if err != nil || k < 0 || k >= len(req.pieces) {
				// Not one of ours: nothing says which part it answers.
				continue
			}
			delete(smp.Metric, PartLabel)
			g[req.pieces[k].part].vec = append(g[req.pieces[k].part].vec, smp)
		}
	}
	for i := range parts {
		if out[i].Err != nil {
			continue // not rendered
		}
		res := Result{Query: rendered[i], Chunks: g[i].chunks, Latency: latency, Warnings: dedupe(g[i].warnings)}
		if g[i].err != nil {
			res.Query = g[i].errQuery
		}
		out[i].Result, out[i].Err = finish(res, g[i].vec, parts[i].Target.Pods, g[i].err)
	}
	return out
}

// piece is one request's share of a part: the part's query for all its
// pods or, for a part sent in chunks, for a run of them.
type piece struct {
	part  int
	query string
}

// partRequest is one request of QueryParts: its query and the pieces it
// answers (one: the query is the piece's own; more: they are combined).
type partRequest struct {
	query  string
	pieces []piece
}

// planParts renders the parts and packs them into requests, in part order.
// A part that cannot be rendered gets its error in out. rendered holds each
// part's own query (of its first chunk), for its Result.
func (s *Source) planParts(parts []Part, out []PartResult) ([]partRequest, []string) {
	rendered := make([]string, len(parts))
	var reqs []partRequest
	var cur partRequest
	var curLen int
	flush := func() {
		switch len(cur.pieces) {
		case 0:
			return
		case 1:
			cur.query = cur.pieces[0].query
		default:
			wrapped := make([]string, len(cur.pieces))
			for k, pc := range cur.pieces {
				wrapped[k] = wrapPart(pc.query, k)
			}
			cur.query = strings.Join(wrapped, orSeparator)
		}
		reqs = append(reqs, cur)
		cur, curLen = partRequest{}, 0
	}
	for i, p := range parts {
		parsed, err := s.parsed(p.Template)
		if err != nil {
			out[i].Err = err
			continue
		}
		qs, err := chunkQueries(parsed, p.Template, p.Target, s.maxQuery)
		if err != nil {
			out[i].Err = err
			continue
		}
		rendered[i] = qs[0]
		if len(qs) > 1 || s.alone.has(p.Template) {
			// Chunks fill their requests; a template that broke a
			// combined request spoils no other.
			for _, q := range qs {
				reqs = append(reqs, partRequest{query: q, pieces: []piece{{part: i, query: q}}})
			}
			continue
		}
		// The index a piece gets is its place in the request; the
		// longest it can be is that of the request's last piece.
		add := len(wrapPart(qs[0], len(cur.pieces)))
		if len(cur.pieces) > 0 {
			add += len(orSeparator)
		}
		if len(cur.pieces) > 0 && curLen+add > s.maxQuery {
			flush()
			add = len(wrapPart(qs[0], 0))
		}
		if add > s.maxQuery {
			// Fits alone only unwrapped.
			reqs = append(reqs, partRequest{query: qs[0], pieces: []piece{{part: i, query: qs[0]}}})
			continue
		}
		cur.pieces = append(cur.pieces, piece{part: i, query: qs[0]})
		curLen += add
	}
	flush()
	return reqs, rendered
}

// wrapPart labels a part's series with its index k in the request. The
// part is on lines of its own, so a "#" comment at its end cannot swallow
// the rest.
func wrapPart(q string, k int) string {
	return "label_replace(\n" + q + "\n, \"" + PartLabel + "\", \"" + strconv.Itoa(k) + "\", \"\", \"\")"
}

// CombinedQueries renders parts as Source.QueryParts would send them, with
// queries of at most maxLen bytes. It is pure; for tests and capacity
// planning.
func CombinedQueries(parts []Part, maxLen int) ([]string, error) {
	s := &Source{maxQuery: maxLen}
	out := make([]PartResult, len(parts))
	reqs, _ := s.planParts(parts, out)
	for _, r := range out {
		if r.Err != nil {
			return nil, r.Err
		}
	}
	qs := make([]string, len(reqs))
	for i, r := range reqs {
		qs[i] = r.query
	}
	return qs, nil
}

// partsAtFault reports whether a combined request's failure may come from
// one of its parts (the backend refused or could not evaluate the query, or
// its answer was unusable), so that sending them apart can tell them
// apart; an unreachable backend or refused credentials fail them all alike.
func partsAtFault(err error) bool {
	var (
		unreachable *UnreachableError
		cred        *CredentialsError
		server      *ServerError
	)
	switch {
	case errors.As(err, &unreachable), errors.As(err, &cred):
		return false
	case errors.As(err, &server):
		// Only a query the backend could not take, parse or evaluate (400,
		// 413 and 414 for a request too long for a proxy's limit, 422, or
		// Prometheus' bad_data and execution errors) is a part's fault.
		// Refused credentials (401, 403), a wrong path prefix (404), a
		// proxy (407), throttling (429) and 5xx (overloaded, restarting)
		// fail every part alike: sending the parts apart would only
		// multiply the requests to a backend in trouble.
		switch server.StatusCode {
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusRequestURITooLong, http.StatusUnprocessableEntity:
			return true
		}
		return server.Type == "execution" || server.Type == "bad_data"
	}
	return true
}

// sendApart sends each piece of a failed combined request on its own, and
// remembers which templates broke it (see alone).
func (s *Source) sendApart(ctx context.Context, req partRequest, parts []Part, now time.Time) answer {
	a := answer{byPiece: make([]answer, len(req.pieces))}
	var guilty []string
	allWorked := true
	for k, pc := range req.pieces {
		pa := s.send(ctx, pc.query, now)
		a.byPiece[k] = pa
		a.warnings = append(a.warnings, pa.warnings...)
		allWorked = allWorked && pa.err == nil
		if pa.err != nil && partsAtFault(pa.err) {
			guilty = append(guilty, parts[pc.part].Template)
		}
	}
	if len(guilty) == 0 && allWorked {
		// Each works alone, together they do not: any of the
		// templates outside the defaults may be the cause.
		for _, pc := range req.pieces {
			guilty = append(guilty, parts[pc.part].Template)
		}
	}
	for _, t := range guilty {
		s.alone.add(t)
	}
	return a
}

func (s *Source) parsed(tmpl string) (*template.Template, error) {
	v, ok := s.templates.Load(tmpl)
	if !ok {
		p, err := parseTemplate(tmpl)
		if err != nil {
			return nil, err
		}
		v, _ = s.templates.LoadOrStore(tmpl, p)
	}
	return v.(*template.Template), nil
}

func dedupe(ws []string) []string {
	if len(ws) < 2 {
		return ws
	}
	seen := make(map[string]bool, len(ws))
	out := ws[:0:0]
	for _, w := range ws {
		if !seen[w] {
			seen[w] = true
			out = append(out, w)
		}
	}
	return out
}

// alone is the set of templates sent on their own. The package's default
// templates are never in it: they are known to combine. It holds at most
// maxAlone templates (one per distinct user template; past that, a broken
// combination is sent apart again at each failure, which costs queries,
// not answers).
type alone struct {
	mu  sync.Mutex
	set map[string]bool
}

// maxAlone bounds the memory of templates sent alone: far more distinct
// user templates than one cluster's optimizers write.
const maxAlone = 1024

func (a *alone) add(tmpl string) {
	switch tmpl {
	case DefaultCPUQuery, DefaultRequestQuery, DefaultLatencyQuery, DefaultNodeCPUQuery:
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.set == nil {
		a.set = map[string]bool{}
	}
	if len(a.set) < maxAlone {
		a.set[tmpl] = true
	}
}

func (a *alone) has(tmpl string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.set[tmpl]
}
