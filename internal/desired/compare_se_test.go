package desired

import (
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	networking "istio.io/api/networking/v1alpha3"
)

// TestServiceEntryEqualCoversEveryField: specEqual compares every field
// Istio's ServiceEntry and WorkloadEntry have; a field added by a newer
// istio.io/api fails here until specEqual compares it too.
func TestServiceEntryEqualCoversEveryField(t *testing.T) {
	fields := func(m proto.Message) []string {
		var out []string
		fs := m.ProtoReflect().Descriptor().Fields()
		for i := range fs.Len() {
			out = append(out, string(fs.Get(i).Name()))
		}
		slices.Sort(out)
		return out
	}
	for _, c := range []struct {
		msg  proto.Message
		want []string
	}{
		{&networking.ServiceEntry{}, []string{"addresses", "endpoints", "export_to", "hosts", "location", "ports", "resolution", "subject_alt_names", "workload_selector"}},
		{&networking.WorkloadEntry{}, []string{"address", "labels", "locality", "network", "ports", "service_account", "weight"}},
	} {
		if got := fields(c.msg); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%T has fields %v; specEqual compares %v", c.msg, got, c.want)
		}
	}
}

// TestSpecEqualAgreesWithProtoEqual: over random ServiceEntries and one
// change of any field, specEqual says what proto.Equal says.
func TestSpecEqualAgreesWithProtoEqual(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	pick := func(s ...string) string { return s[r.IntN(len(s))] }
	build := func() *networking.ServiceEntry {
		se := &networking.ServiceEntry{
			Hosts:      []string{pick("a.b.adaptive", "c.d.adaptive")},
			Resolution: networking.ServiceEntry_STATIC, Location: networking.ServiceEntry_MESH_INTERNAL,
			Ports: []*networking.ServicePort{{Number: 80, Name: "http-80", Protocol: pick("HTTP", "TCP"), TargetPort: 8080}},
		}
		for i := range r.IntN(4) {
			se.Endpoints = append(se.Endpoints, &networking.WorkloadEntry{
				Address: pick("10.0.0.1", "10.0.0.2"), Weight: uint32(r.IntN(3)), Locality: pick("", "r/z"),
				Labels: map[string]string{"security.istio.io/tlsMode": pick("istio", "disabled")}, ServiceAccount: pick("", "sa"),
				Ports: map[string]uint32{"http-80": uint32(8080 + i%2)},
			})
		}
		return se
	}
	for range 5000 {
		a := build()
		b := proto.Clone(a).(*networking.ServiceEntry)
		// One random change of b through reflection, any field at any depth.
		mutate(r, b.ProtoReflect())
		if got, want := specEqual(a, b), proto.Equal(a, b); got != want {
			t.Fatalf("specEqual = %v, proto.Equal = %v:\n%v\n%v", got, want, a, b)
		}
		if !specEqual(a, proto.Clone(a)) {
			t.Fatalf("a spec differs from its clone: %v", a)
		}
	}
}

// mutate changes one populated or unpopulated field of m, or of a message
// inside it.
func mutate(r *rand.Rand, m protoreflect.Message) {
	fs := m.Descriptor().Fields()
	f := fs.Get(r.IntN(fs.Len()))
	switch {
	case f.IsList() && f.Message() != nil:
		l := m.Mutable(f).List()
		if l.Len() > 0 && r.IntN(2) == 0 {
			mutate(r, l.Get(r.IntN(l.Len())).Message())
			return
		}
		l.Append(protoreflect.ValueOfMessage(l.NewElement().Message()))
	case f.IsList():
		m.Mutable(f).List().Append(protoreflect.ValueOfString("x"))
	case f.IsMap():
		mp := m.Mutable(f).Map()
		if f.MapValue().Kind() == protoreflect.StringKind {
			mp.Set(protoreflect.ValueOfString("k").MapKey(), protoreflect.ValueOfString("v"))
		} else {
			mp.Set(protoreflect.ValueOfString("k").MapKey(), protoreflect.ValueOfUint32(1))
		}
	case f.Message() != nil:
		m.Set(f, protoreflect.ValueOfMessage(m.NewField(f).Message()))
		mutate(r, m.Mutable(f).Message())
	case f.Kind() == protoreflect.StringKind:
		m.Set(f, protoreflect.ValueOfString(m.Get(f).String()+"x"))
	case f.Kind() == protoreflect.EnumKind:
		m.Set(f, protoreflect.ValueOfEnum(m.Get(f).Enum()+1))
	case f.Kind() == protoreflect.Uint32Kind:
		m.Set(f, protoreflect.ValueOfUint32(uint32(m.Get(f).Uint())+1))
	}
}
