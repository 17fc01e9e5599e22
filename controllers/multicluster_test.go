package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/controllers"
	. "github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
)

// meshSecretsNamespace stands for istio-system in the suite
// (--istio-namespace).
const meshSecretsNamespace = "mesh-secrets"

// remoteSecret is what istioctl create-remote-secret writes for cluster id.
func remoteSecret(id string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   meshSecretsNamespace,
			Name:        "istio-remote-secret-" + id,
			Labels:      map[string]string{controllers.LabelMultiCluster: "true"},
			Annotations: map[string]string{controllers.AnnotationCluster: id},
		},
		StringData: map[string]string{id: "apiVersion: v1\nkind: Config\n"},
	}
}

// TestMultiClusterMeshStallsAndGivesTrafficBack: a running optimizer whose
// mesh gains a remote cluster stops routing (its VirtualService goes, so
// the Service carries every cluster's endpoints again) and is
// Stalled/MultiClusterEndpointsNotMirrored naming the cluster and the risk;
// a Secret without the label changes nothing; when the remote secret goes,
// routing comes back.
func TestMultiClusterMeshStallsAndGivesTrafficBack(t *testing.T) {
	ctx := context.Background()
	if err := k8s.Get(ctx, clientKey("", meshSecretsNamespace), &corev1.Namespace{}); err != nil {
		mustCreate(t, nsObj(meshSecretsNamespace))
	}
	ns := newNamespace(t)
	webService(t, ns, Ready("web-0", IP(4, 1), "node-a-"+ns))
	mustCreate(t, Optimizer(ns, "web", "web"))
	getVS(t, ns, "web-adaptive")

	// A Secret istiod would not read as a remote cluster.
	other := remoteSecret("not-a-cluster")
	other.Labels = nil
	mustCreate(t, other)
	t.Cleanup(func() { _ = k8s.Delete(ctx, other) })

	secret := remoteSecret("cluster-2")
	mustCreate(t, secret)
	removed := false
	t.Cleanup(func() {
		if !removed {
			_ = k8s.Delete(ctx, secret)
		}
	})
	eventually(t, waitFor, "Stalled/MultiClusterEndpointsNotMirrored and no VirtualService", func() error {
		opt, err := getOpt(ns, "web")
		if err != nil {
			return err
		}
		if got := condition(opt, optv1.ConditionStalled); got != "True/MultiClusterEndpointsNotMirrored" {
			return fmt.Errorf("Stalled %s", got)
		}
		msg := meta.FindStatusCondition(opt.Status.Conditions, optv1.ConditionStalled).Message
		for _, want := range []string{"cluster-2", "cross-cluster failover", "--allow-local-only-routing"} {
			if !strings.Contains(msg, want) {
				return fmt.Errorf("message lacks %q: %s", want, msg)
			}
		}
		if strings.Contains(msg, "not-a-cluster") {
			return fmt.Errorf("message names a Secret without the label: %s", msg)
		}
		if err := k8s.Get(ctx, clientKey(ns, "web-adaptive"), vsObj()); err == nil {
			return fmt.Errorf("the operator's VirtualService still routes the Service to the local-only host")
		}
		return nil
	})

	if err := k8s.Delete(ctx, secret); err != nil {
		t.Fatal(err)
	}
	removed = true
	eventually(t, waitFor, "Ready again with a VirtualService", func() error {
		opt, err := getOpt(ns, "web")
		if err != nil {
			return err
		}
		if got := condition(opt, optv1.ConditionReady); got != "True/Reconciled" {
			return fmt.Errorf("Ready %s", got)
		}
		return k8s.Get(ctx, clientKey(ns, "web-adaptive"), vsObj())
	})
}

func clientKey(ns, name string) client.ObjectKey { return client.ObjectKey{Namespace: ns, Name: name} }
