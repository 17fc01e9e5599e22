package metrics

import (
	"fmt"
	"io"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
)

// BenchmarkScrape10000Pods is one scrape of a manager publishing 200
// Services x 50 pods: what each Prometheus scrape allocates.
func BenchmarkScrape10000Pods(b *testing.B) {
	m := New()
	reg := prometheus.NewRegistry()
	if err := m.Register(reg); err != nil {
		b.Fatal(err)
	}
	for s := range 200 {
		pods := make([]PodSample, 50)
		for i := range pods {
			cpu, rate, capacity := 0.5, 10.0, 1.0
			pods[i] = PodSample{Pod: fmt.Sprintf("checkout-7f9c8d6b5-%05d", i), IP: fmt.Sprintf("10.%d.%d.%d", s/250, s%250, i), Locality: "eu-west/eu-west-1a",
				Weight: 1000, Signals: true, CPU: &cpu, RequestRate: &rate, Capacity: &capacity}
		}
		m.SetPods(fmt.Sprintf("team-%03d", s), "checkout", pods)
	}
	b.ReportAllocs()
	for b.Loop() {
		mfs, err := reg.Gather()
		if err != nil {
			b.Fatal(err)
		}
		enc := expfmt.NewEncoder(io.Discard, expfmt.NewFormat(expfmt.TypeTextPlain))
		for _, mf := range mfs {
			if err := enc.Encode(mf); err != nil {
				b.Fatal(err)
			}
		}
	}
}
