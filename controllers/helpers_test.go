package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

type (
	seT    = *istionet.ServiceEntry
	sliceT = discoveryv1.EndpointSlice
)

func seObj() client.Object { return &istionet.ServiceEntry{} }
func vsObj() client.Object { return &istionet.VirtualService{} }
func drObj() client.Object { return &istionet.DestinationRule{} }

// mustEventuallySE waits until the optimized ServiceEntry of Service web
// satisfies check, and returns it.
func mustEventuallySE(t *testing.T, ns string, check func(seT) error) seT {
	t.Helper()
	var se seT
	eventually(t, waitFor, "ServiceEntry "+ns+"/web-adaptive", func() error {
		var err error
		if se, err = getSE(ns, "web-adaptive"); err != nil {
			return err
		}
		return check(se)
	})
	return se
}

func wantAddrs(addrs ...string) func(seT) error {
	return func(se seT) error {
		got := strings.Join(endpointAddrs(&se.Spec), ",")
		if want := strings.Join(addrs, ","); got != want {
			return fmt.Errorf("endpoints %s, want %s", got, want)
		}
		return nil
	}
}

func updateSlice(t *testing.T, ns, name string, mutate func(*sliceT)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s := &discoveryv1.EndpointSlice{}
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, s); err != nil {
			return err
		}
		mutate(s)
		return k8s.Update(context.Background(), s)
	})
	if err != nil {
		t.Fatalf("update EndpointSlice %s/%s: %v", ns, name, err)
	}
}

func getVS(t *testing.T, ns, name string) *istionet.VirtualService {
	t.Helper()
	vs := &istionet.VirtualService{}
	eventually(t, waitFor, "VirtualService "+ns+"/"+name, func() error {
		return k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, vs)
	})
	return vs
}

func getDR(t *testing.T, ns, name string) *istionet.DestinationRule {
	t.Helper()
	dr := &istionet.DestinationRule{}
	eventually(t, waitFor, "DestinationRule "+ns+"/"+name, func() error {
		return k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, dr)
	})
	return dr
}
