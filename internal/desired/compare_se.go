package desired

import (
	"maps"
	"slices"

	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
)

// specEqual is proto.Equal, by hand for a ServiceEntry: proto.Equal walks
// every endpoint by reflection, and was a fifth of a 4000-pod reconcile.
// TestServiceEntryEqualCoversEveryField fails when Istio adds a field this
// does not compare.
func specEqual(a, b proto.Message) bool {
	sa, ok1 := a.(*networking.ServiceEntry)
	sb, ok2 := b.(*networking.ServiceEntry)
	if !ok1 || !ok2 || sa == nil || sb == nil {
		return proto.Equal(a, b)
	}
	if len(sa.Endpoints) != len(sb.Endpoints) || len(sa.Ports) != len(sb.Ports) {
		return false
	}
	for i := range sa.Endpoints {
		if !workloadEntryEqual(sa.Endpoints[i], sb.Endpoints[i]) {
			return false
		}
	}
	for i := range sa.Ports {
		if !proto.Equal(sa.Ports[i], sb.Ports[i]) {
			return false
		}
	}
	return slices.Equal(sa.Hosts, sb.Hosts) && slices.Equal(sa.Addresses, sb.Addresses) &&
		sa.Location == sb.Location && sa.Resolution == sb.Resolution &&
		proto.Equal(sa.WorkloadSelector, sb.WorkloadSelector) &&
		slices.Equal(sa.ExportTo, sb.ExportTo) && slices.Equal(sa.SubjectAltNames, sb.SubjectAltNames) &&
		slices.Equal(sa.ProtoReflect().GetUnknown(), sb.ProtoReflect().GetUnknown())
}

func workloadEntryEqual(a, b *networking.WorkloadEntry) bool {
	if a == nil || b == nil {
		return proto.Equal(a, b)
	}
	return a.Address == b.Address && a.Weight == b.Weight && a.Locality == b.Locality &&
		a.Network == b.Network && a.ServiceAccount == b.ServiceAccount &&
		maps.Equal(a.Labels, b.Labels) && maps.Equal(a.Ports, b.Ports) &&
		len(a.ProtoReflect().GetUnknown()) == 0 && len(b.ProtoReflect().GetUnknown()) == 0
}
