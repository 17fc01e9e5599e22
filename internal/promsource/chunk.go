package promsource

import (
	"text/template"
)

const (
	// DefaultMaxQueryLength bounds one rendered query when
	// Config.MaxQueryLength is zero: under VictoriaMetrics' default
	// -search.maxQueryLen of 16 KiB, with room for URL encoding of the
	// few characters a pod regexp escapes.
	DefaultMaxQueryLength = 12 << 10
	// MinMaxQueryLength is the smallest limit accepted: every template must
	// fit for one pod.
	MinMaxQueryLength = 512
	// MaxConcurrentChunks bounds the requests one chunked query has in
	// flight, so a large optimizer does not crowd out the others.
	MaxConcurrentChunks = 4
)

// renderChunks renders the template for all pods, or, when that is longer
// than the source's limit, for consecutive runs of pods (in Target order)
// whose queries each fit: halves, quarters, ... of the pods, so the chunks
// are few and even. Templates are opaque: whatever uses .Pods, and however
// often, each chunk's query is checked by rendering it.
func (s *Source) renderChunks(tmpl string, t Target) ([]string, error) {
	parsed, err := s.parsed(tmpl)
	if err != nil {
		return nil, err
	}
	return chunkQueries(parsed, tmpl, t, s.maxQuery)
}

// ChunkQueries renders tmpl for t as Source.Query would send it, with queries
// of at most maxLen bytes. It is pure; for tests and capacity planning.
func ChunkQueries(tmpl string, t Target, maxLen int) ([]string, error) {
	parsed, err := parseTemplate(tmpl)
	if err != nil {
		return nil, err
	}
	return chunkQueries(parsed, tmpl, t, maxLen)
}

func chunkQueries(parsed *template.Template, tmpl string, t Target, maxLen int) ([]string, error) {
	q, err := execute(parsed, tmpl, t)
	if err != nil {
		return nil, err
	}
	if len(q) <= maxLen {
		return []string{q}, nil
	}
	if len(t.Pods) == 1 {
		return nil, &QueryTooLongError{Length: len(q), Limit: maxLen}
	}
	// Split into the fewest equal parts that can fit, then halve any part
	// that still does not (pod names differ in length).
	parts := min((len(q)+maxLen-1)/maxLen, len(t.Pods))
	var out []string
	for i := range parts {
		sub := t
		sub.Pods = t.Pods[i*len(t.Pods)/parts : (i+1)*len(t.Pods)/parts]
		qs, err := chunkQueries(parsed, tmpl, sub, maxLen)
		if err != nil {
			return nil, err
		}
		out = append(out, qs...)
	}
	return out, nil
}
