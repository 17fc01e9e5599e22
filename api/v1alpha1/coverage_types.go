package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// TrafficCoverage is the measured share of the Service's requests that went
// through the optimized host, and so through the weights.
type TrafficCoverage struct {
	// ratio is requests sent to the optimized host over requests the
	// Service's pods received, over the window, as a decimal string (0.00 to
	// 1.00).
	// +optional
	Ratio string `json:"ratio,omitempty"`

	// receivedRate is the requests per second the Service's pods received.
	// +optional
	ReceivedRate string `json:"receivedRate,omitempty"`

	// window is the range the rates are taken over.
	// +optional
	Window string `json:"window,omitempty"`

	// measuredTime is when the figure was measured.
	// +optional
	MeasuredTime *metav1.Time `json:"measuredTime,omitempty"`

	// bypassing are the largest sources whose requests reached the pods by
	// another path (a gateway, a client without a sidecar, a client that
	// addresses the pods directly), at most 5.
	// +optional
	// +kubebuilder:validation:MaxItems=5
	Bypassing []BypassingSource `json:"bypassing,omitempty"`

	// message says why there is no figure (the query failed), when there is
	// none.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
}

// BypassingSource is one client workload whose requests skip the weights.
type BypassingSource struct {
	// namespace and workload as Istio reports them (source_workload_namespace,
	// source_workload); "unknown" for clients without a sidecar.
	Namespace string `json:"namespace,omitempty"`
	Workload  string `json:"workload,omitempty"`
	// rate is its requests per second that bypassed, as a decimal string.
	Rate string `json:"rate,omitempty"`
}
