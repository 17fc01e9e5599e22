package desired

import (
	"strings"

	"google.golang.org/protobuf/proto"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// UpToDate says whether a live object already has everything the desired one
// asks for: the same spec and the desired labels. Fields other writers added
// (labels, annotations) do not count, so they cause no write.
func UpToDate(desired, live metav1.Object, desiredSpec, liveSpec proto.Message) bool {
	if live == nil {
		return false
	}
	for k, v := range desired.GetLabels() {
		if live.GetLabels()[k] != v {
			return false
		}
	}
	if len(desired.GetOwnerReferences()) > 0 && !hasOwners(live.GetOwnerReferences(), desired.GetOwnerReferences()) {
		return false
	}
	return proto.Equal(desiredSpec, liveSpec)
}

func hasOwners(live, want []metav1.OwnerReference) bool {
	for _, w := range want {
		found := false
		for _, l := range live {
			if l.UID == w.UID {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// ServesHost says whether a VirtualService that applies to sidecars (gateway
// "mesh", or no gateways) routes exactly the Kubernetes host of the Service.
// Short names are resolved in the VirtualService's namespace as Istio does.
// Wildcard hosts are less specific than the exact host, so Istio prefers an
// exact VirtualService over them and they do not conflict.
func ServesHost(vs *istionet.VirtualService, service, namespace, clusterDomain string) bool {
	if len(vs.Spec.Gateways) > 0 {
		mesh := false
		for _, g := range vs.Spec.Gateways {
			if g == "mesh" {
				mesh = true
			}
		}
		if !mesh {
			return false
		}
	}
	fqdn := KubernetesHost(service, namespace, clusterDomain)
	for _, h := range vs.Spec.Hosts {
		h = strings.ToLower(h)
		switch {
		case h == fqdn:
			return true
		case h == service && vs.Namespace == namespace:
			return true
		case h == service+"."+namespace, h == service+"."+namespace+".svc":
			return true
		}
	}
	return false
}

// LiveWeights reads the weights of a live ServiceEntry by endpoint address.
func LiveWeights(se *istionet.ServiceEntry) map[string]uint32 {
	if se == nil {
		return nil
	}
	out := make(map[string]uint32, len(se.Spec.Endpoints))
	for _, ep := range se.Spec.Endpoints {
		if ep != nil && ep.Weight > 0 {
			out[ep.Address] = ep.Weight
		}
	}
	return out
}
